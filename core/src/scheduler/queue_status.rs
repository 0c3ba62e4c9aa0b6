//! Queue status: which generation of each queue's spec the scheduler has checked, and a
//! warning when a new quota is below what the queue's running work already holds. Such a
//! quota is accepted as written: running work keeps running (only preemption stops work), and
//! new work of the queue waits until its usage is back under the quota.

use std::sync::Arc;
use tb_api::reason::Reason;

use tb_api::Object;
use tb_api::specs::QueueStatus;
use tb_api::status::set_condition;

use super::placement::human;
use super::queues::Queues;
use super::{Clock, event};
use crate::store::{Plan, PlanWrite};

/// The condition a queue carries while its quota is below its usage at the last spec change.
pub const QUOTA_BELOW_USAGE: Reason = Reason::QuotaBelowUsage;

/// Why queue `name`'s quota is below what its running work holds, if it is (the warning
/// `tbctl apply` prints and the event says).
pub fn below_usage(queues: &Queues, name: &str) -> Option<String> {
    let spec = queues.specs.get(name)?;
    let used = queues.usage.get(name).cloned().unwrap_or_default();
    let mut short = Vec::new();
    if let Some(quota) = &spec.quota.memory
        && used.memory_bytes > quota.bytes()
    {
        short.push(format!(
            "memory quota {} is below the {} its running work holds",
            human(quota.bytes()),
            human(used.memory_bytes)
        ));
    }
    if let Some(quota) = spec.quota.macs
        && used.macs.len() as u32 > quota
    {
        short.push(format!(
            "Macs quota {quota} is below the {} Macs its running work uses",
            used.macs.len()
        ));
    }
    (!short.is_empty()).then(|| {
        format!(
            "queue {name}: {}; running work keeps running, new work waits until usage is under the quota",
            short.join(", ")
        )
    })
}

/// Plans for queues whose spec changed since the scheduler last looked.
pub fn reconcile_queues(
    queue_objects: &[Arc<Object>],
    queues: &Queues,
    clock: &Clock,
) -> Vec<Plan> {
    let mut plans = Vec::new();
    for q in queue_objects {
        let mut status = QueueStatus::from_value(&q.status);
        if status.observed_generation == q.metadata.generation {
            continue;
        }
        let below = below_usage(queues, &q.metadata.name);
        status.observed_generation = q.metadata.generation;
        let mut plan = Plan::default();
        plan.guards.push((q.key(), q.metadata.resource_version));
        match &below {
            Some(message) => {
                set_condition(
                    &mut status.conditions,
                    QUOTA_BELOW_USAGE.as_str(),
                    true,
                    QUOTA_BELOW_USAGE,
                    message,
                    &clock.stamp,
                );
                plan.events.push(event(q, true, QUOTA_BELOW_USAGE, message));
            }
            None => set_condition(
                &mut status.conditions,
                QUOTA_BELOW_USAGE.as_str(),
                false,
                Reason::WithinQuota,
                "",
                &clock.stamp,
            ),
        }
        plan.writes.push(PlanWrite::Status {
            key: q.key(),
            status: status.to_value(),
        });
        plans.push(plan);
    }
    plans
}
