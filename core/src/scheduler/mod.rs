//! The scheduler: pure functions from a snapshot of the store and the time to plans — which
//! Node is NotReady, which allocations are Lost, where each job's gang goes and how its status
//! moves. The reconciler loop commits the plans through Raft; nodelets act on them.

pub mod jobs;
pub mod links;
pub mod memo;
pub mod nodes;
pub mod order;
pub mod placement;
pub mod preemption;
pub mod queue_status;
pub mod queues;
pub mod schedules;
pub mod usage;
pub mod view;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::json;
use tb_api::reason::Reason;
use tb_api::specs::Desired;
use tb_api::{Kind, Object, ObjectMeta, Timestamp};

use crate::store::{Plan, PlanWrite, State};
use memo::Memo;
use view::ClusterView;

/// Scheduler settings (shortened in tests).
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// A Node without heartbeats this long is NotReady, and its allocations Lost.
    pub node_grace: TimeDelta,
    /// First gang-restart delay; doubles per restart up to `backoff_cap`.
    pub backoff_base: TimeDelta,
    pub backoff_cap: TimeDelta,
    /// A gang that ran this long before failing starts its backoff from `backoff_base` again.
    pub backoff_reset: TimeDelta,
    /// Memory reserved per rank when a job does not say.
    pub default_memory_bytes: u64,
    /// How quickly a queue's past usage is forgotten in fair-share ordering, unless the queue
    /// sets `fairShareHalfLife`.
    pub fair_share_half_life: TimeDelta,
    /// While anything runs, usage is accounted at least this often (and whenever what is held
    /// changes).
    pub usage_interval: TimeDelta,
    /// The base of InferenceServices' stable URLs (`https://HOST:PORT`, the controllers'
    /// services listener): each service's `status.url` is `BASE/services/NAMESPACE/NAME/v1`.
    /// None: no controller serves them, and statuses have no url.
    pub services_base: Option<String>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            node_grace: TimeDelta::seconds(10),
            backoff_base: TimeDelta::seconds(10),
            backoff_cap: TimeDelta::seconds(300),
            backoff_reset: TimeDelta::minutes(10),
            default_memory_bytes: 512 << 20,
            fair_share_half_life: TimeDelta::hours(1),
            usage_interval: TimeDelta::seconds(30),
            services_base: None,
        }
    }
}

/// The time of a reconcile pass.
#[derive(Debug, Clone)]
pub struct Clock {
    pub now: DateTime<Utc>,
    /// `now` as stored in statuses.
    pub stamp: Timestamp,
    /// When this controller became leader.
    pub leader_since: DateTime<Utc>,
    /// How long ago each node's latest heartbeat reached the store, measured by the leader on
    /// its monotonic clock from when it saw the heartbeat (a new leader has seen every node
    /// just now). When set, node grace uses these ages and not the wall clock, so a jump of
    /// the leader's clock neither loses every node nor hides a lost one. `None` (the
    /// simulator): ages from `now` and the heartbeat stamps.
    pub heartbeat_ages: Option<BTreeMap<String, TimeDelta>>,
}

impl Clock {
    pub fn new(now: DateTime<Utc>, leader_since: DateTime<Utc>) -> Clock {
        Clock {
            now,
            stamp: Timestamp::from_datetime(now),
            leader_since,
            heartbeat_ages: None,
        }
    }

    /// The same pass, with node heartbeat ages measured on the leader's monotonic clock.
    pub fn with_heartbeat_ages(mut self, ages: BTreeMap<String, TimeDelta>) -> Clock {
        self.heartbeat_ages = Some(ages);
        self
    }
}

/// RFC 3339, UTC, milliseconds: the one time format in the store (as [`Timestamp`] writes it),
/// for the times kept in strings (annotations, messages, the usage ledger).
pub fn stamp(t: DateTime<Utc>) -> String {
    Timestamp::from_datetime(t).to_string()
}

/// The instant of an optional timestamp field.
pub fn time_of(t: &Option<Timestamp>) -> Option<DateTime<Utc>> {
    t.as_ref().map(Timestamp::at)
}

pub fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// Everything the scheduler wants done, as independent plans (one per node, one per job), so
/// that a conflict on one does not hold back the others.
pub fn reconcile(state: &State, clock: &Clock, cfg: &SchedulerConfig) -> Vec<Plan> {
    reconcile_with(state, clock, cfg, &mut Memo::default())
}

/// [`reconcile`], reusing what `memo` parsed in earlier passes (the leader keeps one).
pub fn reconcile_with(
    state: &State,
    clock: &Clock,
    cfg: &SchedulerConfig,
    memo: &mut Memo,
) -> Vec<Plan> {
    memo.begin();
    let mut view = ClusterView::build_with(state, cfg, memo);
    memo.end();
    let mut plans = nodes::reconcile_nodes(&view, clock, cfg);
    plans.extend(links::reconcile_links(&view, &view.links));
    plans.extend(orphans(state, &view));
    plans.extend(queue_status::reconcile_queues(
        &state.list(Kind::Queue.as_str(), ""),
        &view.queues,
        clock,
    ));
    plans.extend(schedules::reconcile_schedules(state, clock));
    plans.extend(usage::tick(state, &view, clock, cfg));
    // Priority, then weighted fair share, then services before batch work, then age.
    let shares = usage::fair_shares(&state.usage, &view.queues, clock.now, cfg);
    let jobs: Vec<_> = state
        .list(Kind::TrainingJob.as_str(), "")
        .into_iter()
        .chain(state.list(Kind::InferenceService.as_str(), ""))
        .collect();
    let jobs = order::order(jobs, &view, &shares);
    for job in jobs {
        if let Some(plan) = jobs::reconcile_job(&job, &mut view, clock, cfg) {
            plans.push(plan);
        }
    }
    without_fresh_events(state, clock, plans)
}

/// The plans without the events the store would not record (an identical one was recorded
/// less than a minute ago), and without plans left with nothing to write: an object the
/// scheduler cannot act on (a Schedule in an unknown zone, a job that fits nowhere) says so
/// once, its event's count is bumped at most once a minute, and no pass proposes anything for
/// it in between.
fn without_fresh_events(state: &State, clock: &Clock, plans: Vec<Plan>) -> Vec<Plan> {
    plans
        .into_iter()
        .filter_map(|mut plan| {
            plan.events
                .retain(|e| !state.event_is_fresh(e, clock.stamp.as_str()));
            (!plan.writes.is_empty() || !plan.events.is_empty()).then_some(plan)
        })
        .collect()
}

/// Allocations whose job is gone (deleted, or replaced by one with the same name): stopped,
/// then deleted once ended.
fn orphans(state: &State, view: &ClusterView) -> Vec<Plan> {
    let mut plans = Vec::new();
    for a in &view.allocations {
        let key = tb_api::ObjectKey {
            kind: a.spec.job.kind.clone(),
            namespace: a.object.metadata.namespace.clone(),
            name: a.spec.job.name.clone(),
        };
        let alive = state
            .get(&key)
            .is_some_and(|j| j.metadata.uid == a.spec.job.uid);
        if alive {
            continue;
        }
        let mut plan = Plan::default();
        plan.guards
            .push((a.object.key(), a.object.metadata.resource_version));
        if a.status.phase.is_terminal() {
            plan.writes.push(PlanWrite::Delete {
                key: a.object.key(),
            });
        } else if a.spec.desired == Desired::Run {
            let mut obj = (*a.object).clone();
            let mut spec = a.spec.clone();
            spec.desired = Desired::Stop;
            obj.spec = serde_json::to_value(&spec).unwrap_or_default();
            plan.writes.push(PlanWrite::Put(obj));
        } else {
            continue;
        }
        plans.push(plan);
    }
    plans
}

/// The one report about a stored object whose spec no longer passes the API's checks (stored
/// before a check existed): tb does not act on it, and says why. Throttled like every event.
pub fn invalid_spec(involved: &Object, error: &tb_api::ValidationError) -> Plan {
    let mut plan = Plan::default();
    plan.events.push(event(
        involved,
        true,
        Reason::InvalidSpec,
        &format!(
            "the stored spec no longer passes the API's checks ({error}); tb does not act on \
             this {} until it is applied again with the fix",
            involved.kind
        ),
    ));
    plan
}

/// An Event about `involved`, recorded with a plan.
pub fn event(involved: &Object, warning: bool, reason: impl AsRef<str>, message: &str) -> Object {
    Object {
        api_version: tb_api::API_VERSION.into(),
        kind: Kind::Event.as_str().into(),
        metadata: ObjectMeta {
            name: String::new(),
            namespace: if involved.metadata.namespace.is_empty() {
                "default".into()
            } else {
                involved.metadata.namespace.clone()
            },
            ..Default::default()
        },
        spec: json!({
            "type": if warning { "Warning" } else { "Normal" },
            "reason": reason.as_ref(),
            "message": message,
            "involvedObject": {
                "kind": involved.kind,
                "namespace": involved.metadata.namespace,
                "name": involved.metadata.name,
                "uid": involved.metadata.uid,
            },
            "source": "scheduler",
        }),
        status: serde_json::Value::Null,
    }
}
