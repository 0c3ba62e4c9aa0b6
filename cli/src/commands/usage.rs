//! `tbctl usage`, and what `top queues`, `describe queue` and the QUEUE/POSITION columns of
//! `get` share: a snapshot of queues, jobs and allocations put through the scheduler's own
//! code (`Queues`, `order`), with the fair-share figures from the controller's usage ledger.
//!
//! `tbctl usage [--since 30d] [--by user|namespace|queue]`: `NAME MEMORY·H MAC·H`, memory in
//! GiB·hours, sorted by memory·hours, largest first.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Result, anyhow};
use tb_api::proto::{ListRequest, UsageRequest, UsageResponse, UsageRow};
use tb_api::specs::{AllocationSpec, QueueSpec, parse_spec};
use tb_api::status::{JobPhase, JobStatus};
use tb_api::{Kind, Object};
use tb_core::scheduler::order;
use tb_core::scheduler::queues::Queues;
use tb_core::scheduler::usage::user_of;
use tb_core::scheduler::view::ClusterView;
use tb_core::store::State;

use super::{Ctx, parse_object};
use crate::args::{UsageArgs, UsageBy};
use crate::columns::human_bytes;
use crate::output::{Table, emit};

const GIB_SECONDS_PER_GIB_HOUR: f64 = (1u64 << 30) as f64 * 3600.0;

pub async fn run(ctx: &mut Ctx, args: &UsageArgs) -> Result<()> {
    let since = since_stamp(args.since, chrono::Utc::now())?;
    let resp = ctx.client().usage(UsageRequest { since }).await?;
    if resp.rows.is_empty() {
        eprintln!("No usage recorded");
        return Ok(());
    }
    emit(&usage_table(&resp.rows, args.by).render())
}

/// `now - secs` as the server takes it; empty for "everything kept".
pub fn since_stamp(secs: Option<u64>, now: chrono::DateTime<chrono::Utc>) -> Result<String> {
    let Some(secs) = secs else {
        return Ok(String::new());
    };
    let too_long = || anyhow!("--since: too long");
    let delta = i64::try_from(secs)
        .ok()
        .and_then(chrono::TimeDelta::try_seconds)
        .ok_or_else(too_long)?;
    let at = now.checked_sub_signed(delta).ok_or_else(too_long)?;
    Ok(at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

/// Rows summed by user, namespace or queue.
pub fn usage_table(rows: &[UsageRow], by: UsageBy) -> Table {
    let mut sums: BTreeMap<String, (u128, u128)> = BTreeMap::new();
    for r in rows {
        let name = match by {
            UsageBy::User => r.user.clone(),
            UsageBy::Namespace => r.namespace.clone(),
            UsageBy::Queue if r.queue.is_empty() => "<none>".into(),
            UsageBy::Queue => r.queue.clone(),
        };
        let s = sums.entry(name).or_default();
        s.0 += u128::from(r.memory_byte_seconds);
        s.1 += u128::from(r.mac_milliseconds);
    }
    let mut sums: Vec<_> = sums.into_iter().collect();
    sums.sort_by(|a, b| b.1.0.cmp(&a.1.0).then_with(|| a.0.cmp(&b.0)));
    let head = match by {
        UsageBy::User => "USER",
        UsageBy::Namespace => "NAMESPACE",
        UsageBy::Queue => "QUEUE",
    };
    let mut t = Table::new([head, "MEMORY·H", "MAC·H"]);
    for (name, (mem, mac)) in sums {
        t.push(vec![
            name,
            format!("{:.1}Gi·h", mem as f64 / GIB_SECONDS_PER_GIB_HOUR),
            format!("{:.1}", mac as f64 / 3_600_000.0),
        ]);
    }
    t
}

/// Queues, jobs and allocations as the scheduler sees them, and the ledger's fair shares.
pub struct Snapshot {
    pub state: State,
    pub usage: Option<UsageResponse>,
}

impl Snapshot {
    /// Read everything the queue views need; the usage call is optional (an older controller
    /// lacks it: shares are then taken as equal).
    pub async fn fetch(ctx: &mut Ctx) -> Result<Snapshot> {
        let mut state = State::default();
        for kind in [
            Kind::Queue,
            Kind::TrainingJob,
            Kind::InferenceService,
            Kind::Allocation,
        ] {
            let req = ListRequest {
                kind: kind.as_str().to_string(),
                namespace: String::new(),
                label_selector: String::new(),
                stale: false,
            };
            for j in ctx.client().list(req).await?.objects_json {
                let o = parse_object(&j)?;
                state.objects.insert(o.key().storage_key(), Arc::new(o));
            }
        }
        let usage = ctx.client().usage(UsageRequest::default()).await.ok();
        Ok(Snapshot { state, usage })
    }

    #[cfg(test)]
    pub fn from_objects(objects: Vec<Object>, usage: Option<UsageResponse>) -> Snapshot {
        let mut state = State::default();
        for o in objects {
            state.objects.insert(o.key().storage_key(), Arc::new(o));
        }
        Snapshot { state, usage }
    }

    /// Queues with what their running work holds, as the scheduler counts it.
    pub fn queues(&self) -> Queues {
        ClusterView::build(&self.state).queues
    }

    pub fn shares(&self) -> order::FairShares {
        let shares = || self.usage.iter().flat_map(|u| &u.shares);
        order::FairShares {
            decayed: shares()
                .map(|s| (s.queue.clone(), s.decayed_memory_byte_seconds))
                .collect(),
            half_life_seconds: shares()
                .map(|s| (s.queue.clone(), s.half_life_seconds))
                .collect(),
        }
    }

    fn jobs(&self) -> Vec<Arc<Object>> {
        let mut jobs = self.state.list(Kind::TrainingJob.as_str(), "");
        jobs.extend(self.state.list(Kind::InferenceService.as_str(), ""));
        jobs
    }

    /// Each job's queue ("" when unqueued or refused) and, when Pending, its 1-based place in
    /// the cluster-wide order.
    pub fn placements(&self) -> BTreeMap<(String, String, String), (String, Option<usize>)> {
        let view = ClusterView::build(&self.state);
        let queues = &view.queues;
        let ordered = order::order(self.jobs(), &view, &self.shares());
        let positions = order::positions(&ordered);
        ordered
            .iter()
            .map(|j| {
                let key = (
                    j.kind.clone(),
                    j.metadata.namespace.clone(),
                    j.metadata.name.clone(),
                );
                let queue = queues.queue_of(j).ok().flatten().unwrap_or_default();
                let position = positions.get(&key).copied();
                (key, (queue, position))
            })
            .collect()
    }

    /// Pending jobs per queue.
    fn pending(&self, queues: &Queues) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for j in self.jobs() {
            if JobStatus::from_value(&j.status).phase == JobPhase::Pending
                && let Ok(Some(q)) = queues.queue_of(&j)
            {
                *out.entry(q).or_default() += 1;
            }
        }
        out
    }

    /// The jobs holding capacity in `queue`: (namespace/kind/name, user, memory, Macs).
    fn holders(&self, queues: &Queues, queue: &str) -> Vec<(String, String, u64, usize)> {
        let mut held: BTreeMap<String, (String, u64, std::collections::BTreeSet<String>)> =
            BTreeMap::new();
        for a in self.state.list(Kind::Allocation.as_str(), "") {
            let Ok(spec) = parse_spec::<AllocationSpec>(&a.spec) else {
                continue;
            };
            let status = tb_api::specs::AllocationStatus::from_value(&a.status);
            if status.phase.is_terminal() {
                continue;
            }
            let key = tb_api::ObjectKey {
                kind: spec.job.kind.clone(),
                namespace: a.metadata.namespace.clone(),
                name: spec.job.name.clone(),
            };
            let Some(job) = self.state.get(&key) else {
                continue;
            };
            if queues.queue_of(job).ok().flatten().as_deref() != Some(queue) {
                continue;
            }
            let name = format!("{}/{}/{}", key.namespace, key.kind, key.name);
            let h = held
                .entry(name)
                .or_insert_with(|| (user_of(job), 0, Default::default()));
            h.1 += spec.memory_bytes;
            h.2.insert(spec.node);
        }
        held.into_iter()
            .map(|(name, (user, mem, macs))| (name, user, mem, macs.len()))
            .collect()
    }
}

fn share_of(usage: &Option<UsageResponse>, queue: &str) -> Option<(f64, f64, f64)> {
    usage
        .as_ref()?
        .shares
        .iter()
        .find(|s| s.queue == queue)
        .map(|s| {
            (
                s.decayed_memory_byte_seconds,
                s.share_per_weight,
                s.half_life_seconds,
            )
        })
}

/// `1h`, `90m`, `45s`.
fn half_life(seconds: f64) -> String {
    let s = seconds.round() as u64;
    if s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

fn gib_hours(byte_seconds: f64) -> String {
    format!("{:.1}Gi·h", byte_seconds / GIB_SECONDS_PER_GIB_HOUR)
}

/// `used/quota`, or `used` without a quota.
fn against(used: String, quota: Option<String>) -> String {
    match quota {
        Some(q) => format!("{used}/{q}"),
        None => used,
    }
}

/// What `queue` holds beyond its quota, or "-".
fn borrowed(spec: &QueueSpec, mem: u64, macs: usize) -> String {
    let mut parts = Vec::new();
    if let Some(q) = &spec.quota.memory
        && mem > q.bytes()
    {
        parts.push(human_bytes(mem - q.bytes()));
    }
    if let Some(q) = spec.quota.macs
        && macs as u32 > q
    {
        parts.push(format!("{} Macs", macs as u32 - q));
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

/// `tbctl top queues`: one line per queue.
pub fn queues_table(snap: &Snapshot) -> Table {
    let queues = snap.queues();
    let pending = snap.pending(&queues);
    let mut t = Table::new([
        "NAME",
        "PRIORITY",
        "WEIGHT",
        "MEMORY",
        "MACS",
        "BORROWED",
        "PENDING",
        "FAIR-SHARE",
    ]);
    for (name, spec) in &queues.specs {
        let used = queues.usage.get(name).cloned().unwrap_or_default();
        t.push(vec![
            name.clone(),
            spec.priority.to_string(),
            spec.weight.to_string(),
            against(
                human_bytes(used.memory_bytes),
                spec.quota.memory.as_ref().map(|q| human_bytes(q.bytes())),
            ),
            against(
                used.macs.len().to_string(),
                spec.quota.macs.map(|m| m.to_string()),
            ),
            borrowed(spec, used.memory_bytes, used.macs.len()),
            pending.get(name).copied().unwrap_or(0).to_string(),
            share_of(&snap.usage, name).map_or_else(|| "-".into(), |(_, w, _)| gib_hours(w)),
        ]);
    }
    t
}

/// The queue section of `tbctl describe queue NAME`.
pub fn queue_detail(snap: &Snapshot, name: &str) -> String {
    let queues = snap.queues();
    let Some(spec) = queues.specs.get(name) else {
        return String::new();
    };
    let used = queues.usage.get(name).cloned().unwrap_or_default();
    let mut out = String::new();
    let mut field = |k: &str, v: String| out.push_str(&format!("{:<18}{v}\n", format!("{k}:")));
    let quota = |q: &tb_api::specs::QueueQuota| {
        let mut parts = Vec::new();
        if let Some(m) = &q.memory {
            parts.push(format!("memory {}", human_bytes(m.bytes())));
        }
        if let Some(m) = q.macs {
            parts.push(format!("{m} Macs"));
        }
        if parts.is_empty() {
            "none".to_string()
        } else {
            parts.join(", ")
        }
    };
    field("Quota", quota(&spec.quota));
    field(
        "Borrowing Limit",
        spec.borrowing_limit.as_ref().map_or("none".into(), quota),
    );
    field(
        "Usage",
        format!(
            "memory {}, {} Macs",
            human_bytes(used.memory_bytes),
            used.macs.len()
        ),
    );
    field(
        "Borrowed",
        borrowed(spec, used.memory_bytes, used.macs.len()),
    );
    field("Priority", spec.priority.to_string());
    field("Weight", spec.weight.to_string());
    field(
        "Fair Share",
        share_of(&snap.usage, name).map_or_else(
            || "unknown (the controller did not answer Usage)".into(),
            |(d, w, h)| {
                format!(
                    "decayed usage {}, {} per weight (half-life {})",
                    gib_hours(d),
                    gib_hours(w),
                    half_life(h)
                )
            },
        ),
    );
    field(
        "Pending",
        snap.pending(&queues)
            .get(name)
            .copied()
            .unwrap_or(0)
            .to_string(),
    );
    let holders = snap.holders(&queues, name);
    if holders.is_empty() {
        out.push_str("Holding:          <none>\n");
    } else {
        out.push_str("Holding:\n");
        let mut t = Table::new(["JOB", "USER", "MEMORY", "MACS"]);
        for (job, user, mem, macs) in holders {
            t.push(vec![job, user, human_bytes(mem), macs.to_string()]);
        }
        for line in t.render().lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tb_api::proto::QueueShare;

    fn row(queue: &str, ns: &str, user: &str, gib_hours: u64, mac_hours: u64) -> UsageRow {
        UsageRow {
            queue: queue.into(),
            namespace: ns.into(),
            user: user.into(),
            memory_byte_seconds: gib_hours * (1 << 30) * 3600,
            mac_milliseconds: mac_hours * 3_600_000,
        }
    }

    #[test]
    fn usage_sums_by_the_chosen_column_largest_first() {
        let rows = [
            row("a", "ml", "ana", 10, 1),
            row("b", "ml", "bo", 30, 2),
            row("", "web", "ana", 5, 1),
        ];
        let t = usage_table(&rows, UsageBy::User);
        assert_eq!(t.headers, ["USER", "MEMORY·H", "MAC·H"]);
        assert_eq!(t.rows[0], ["bo", "30.0Gi·h", "2.0"]);
        assert_eq!(t.rows[1], ["ana", "15.0Gi·h", "2.0"]);
        let t = usage_table(&rows, UsageBy::Queue);
        assert_eq!(t.rows[2][0], "<none>");
        let t = usage_table(&rows, UsageBy::Namespace);
        assert_eq!(t.rows[0], ["ml", "40.0Gi·h", "3.0"]);
    }

    #[test]
    fn since_is_an_rfc3339_time_back_from_now() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-06-30T00:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        assert_eq!(
            since_stamp(Some(30 * 86400), now).unwrap(),
            "2026-05-31T00:00:00.000Z"
        );
        assert_eq!(since_stamp(None, now).unwrap(), "");
    }

    fn obj(v: serde_json::Value) -> Object {
        serde_json::from_value(v).unwrap()
    }

    fn snapshot() -> Snapshot {
        let objects = vec![
            obj(
                json!({"apiVersion": "tb/v1", "kind": "Queue", "metadata": {"name": "research"},
                       "spec": {"quota": {"memory": "8Gi"}, "weight": 2,
                                "borrowingLimit": {"memory": "8Gi"}}}),
            ),
            obj(
                json!({"apiVersion": "tb/v1", "kind": "Queue", "metadata": {"name": "web"},
                       "spec": {}}),
            ),
            obj(json!({"apiVersion": "tb/v1", "kind": "TrainingJob",
                       "metadata": {"name": "big", "namespace": "ml", "uid": "u1",
                                    "annotations": {"tb/created-by": "ana"},
                                    "creationTimestamp": "2026-06-01T00:00:00.000Z"},
                       "spec": {"command": ["x"], "queue": "research"},
                       "status": {"phase": "Running"}})),
            obj(json!({"apiVersion": "tb/v1", "kind": "TrainingJob",
                       "metadata": {"name": "next", "namespace": "ml",
                                    "creationTimestamp": "2026-06-01T00:00:01.000Z"},
                       "spec": {"command": ["x"], "queue": "research"},
                       "status": {"phase": "Pending", "reason": "QuotaExceeded"}})),
            obj(json!({"apiVersion": "tb/v1", "kind": "TrainingJob",
                       "metadata": {"name": "site", "namespace": "ml",
                                    "creationTimestamp": "2026-06-01T00:00:02.000Z"},
                       "spec": {"command": ["x"], "queue": "web"},
                       "status": {"phase": "Pending"}})),
            obj(json!({"apiVersion": "tb/v1", "kind": "Allocation",
                       "metadata": {"name": "big-1-0", "namespace": "ml"},
                       "spec": {"job": {"kind": "TrainingJob", "name": "big", "uid": "u1"},
                                "node": "m1", "rank": 0, "worldSize": 1, "epoch": 1,
                                "memoryBytes": 12u64 << 30, "command": ["x"], "executor": "exec"},
                       "status": {"phase": "Running"}})),
        ];
        let usage = UsageResponse {
            shares: vec![
                QueueShare {
                    queue: "research".into(),
                    decayed_memory_byte_seconds: 4.0 * GIB_SECONDS_PER_GIB_HOUR,
                    share_per_weight: 2.0 * GIB_SECONDS_PER_GIB_HOUR,
                    half_life_seconds: 3600.0,
                },
                QueueShare {
                    queue: "web".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        Snapshot::from_objects(objects, Some(usage))
    }

    #[test]
    fn top_queues_shows_usage_against_quota_borrowing_pending_and_share() {
        let t = queues_table(&snapshot());
        assert_eq!(
            t.rows[0],
            ["research", "0", "2", "12Gi/8Gi", "1", "4Gi", "1", "2.0Gi·h"]
        );
        assert_eq!(t.rows[1][0], "web");
        assert_eq!(t.rows[1][6], "1");
    }

    #[test]
    fn positions_put_the_lesser_fair_share_first() {
        let p = snapshot().placements();
        let at = |n: &str| p[&("TrainingJob".into(), "ml".into(), n.into())].clone();
        assert_eq!(at("site"), ("web".into(), Some(1)));
        assert_eq!(at("next"), ("research".into(), Some(2)));
        assert_eq!(at("big"), ("research".into(), None));
    }

    #[test]
    fn describe_queue_names_who_holds_what() {
        let d = queue_detail(&snapshot(), "research");
        assert!(d.contains("Borrowed:         4Gi"), "{d}");
        assert!(d.contains("ml/TrainingJob/big"), "{d}");
        assert!(d.contains("ana"), "{d}");
        assert!(d.contains("half-life 1h"), "{d}");
    }
}
