//! The `Auth.Usage` call: usage accounting and fair-share figures read from the replicated
//! ledger (`store::usage`), for `tbctl usage`, `tbctl top queues` and `tbctl describe queue`.

use chrono::{DateTime, Utc};
use tb_api::proto::{QueueShare, UsageResponse, UsageRow};
use tonic::Status;

use crate::scheduler::view::ClusterView;
use crate::scheduler::{SchedulerConfig, order, usage};
use crate::store::State;

/// The answer for usage since `since` (RFC 3339, empty: all kept), with shares as of `now`.
pub fn usage_response(
    state: &State,
    since: &str,
    now: DateTime<Utc>,
    cfg: &SchedulerConfig,
) -> Result<UsageResponse, Status> {
    let since = if since.is_empty() {
        i64::MIN / 2
    } else {
        DateTime::parse_from_rfc3339(since)
            .map_err(|e| Status::invalid_argument(format!("since: not an RFC 3339 time: {e}")))?
            .timestamp()
    };
    let rows = state
        .usage
        .totals_since(since)
        .into_iter()
        .map(|(k, a)| UsageRow {
            queue: k.queue,
            namespace: k.namespace,
            user: k.user,
            memory_byte_seconds: a.memory_byte_seconds,
            mac_milliseconds: a.mac_milliseconds,
        })
        .collect();
    let view = ClusterView::build(state);
    let shares = usage::shares_at(&state.usage, &view.queues, now, cfg);
    let shares = shares
        .iter()
        .map(|(q, s)| QueueShare {
            queue: q.clone(),
            decayed_memory_byte_seconds: *s,
            share_per_weight: order::share_per_weight(&view.queues, &shares, q),
            half_life_seconds: usage::half_life_seconds(&view.queues, q, cfg),
        })
        .collect();
    Ok(UsageResponse {
        rows,
        shares,
        accounted_until: state.usage.until.clone(),
    })
}
