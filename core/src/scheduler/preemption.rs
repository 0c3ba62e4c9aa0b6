//! Preemption: when a job fits nowhere, whole gangs of lower priority may be stopped to make
//! room — never part of a gang, lowest priority first, then the cheapest (least memory), then
//! the youngest — where the job's queue's `preemption` policy allows it (by default only gangs
//! of the job's own namespace). A job whose queue is under its quota also reclaims what other
//! queues borrowed:
//! gangs of queues over their own quota, of no higher priority, are stopped too (reason
//! Reclaimed). Pure: it picks the victims; the job's reconcile stops them and requeues them
//! (Pending, reason Preempted), and the job is placed on a later pass once their ranks have
//! ended.
//!
//! Ranks already told to stop count as gone, so a job waiting for its victims to end does not
//! pick more.

use std::collections::BTreeSet;
use std::sync::Arc;
use tb_api::reason::Reason;

use tb_api::Object;
use tb_api::specs::Desired;

use super::view::{Alloc, ClusterView, JobFacts};

/// A running gang that may be stopped.
#[derive(Debug, Clone)]
pub struct Victim {
    pub job: Arc<Object>,
    pub priority: i32,
    /// Preempted (lower priority) or Reclaimed (its queue borrowed beyond its quota).
    pub reason: Reason,
    pub allocations: Vec<Alloc>,
    pub memory_bytes: u64,
}

/// What choosing found.
pub enum Choice {
    /// The job fits once ranks already stopping have ended: wait.
    Waiting,
    /// Stop these gangs and the job fits.
    Preempt(Vec<Victim>),
    /// Even stopping every lower-priority gang would not make room.
    Hopeless,
}

/// The queue a rank's job counts against.
fn queue_of<'a>(view: &'a ClusterView, a: &Alloc) -> Option<&'a str> {
    let key = (
        a.spec.job.kind.clone(),
        a.object.metadata.namespace.clone(),
        a.spec.job.name.clone(),
    );
    view.facts.get(&key)?.queue.as_deref()
}

/// A copy of `view` without the resources `allocations` hold, on their Macs and against their
/// queues' quotas.
fn without(view: &ClusterView, allocations: &[&Alloc]) -> ClusterView {
    let mut trial = view.clone();
    trial.unplaceable.borrow_mut().clear();
    let mut queues = BTreeSet::new();
    for a in allocations {
        if let Some(n) = trial.nodes.get_mut(&a.spec.node) {
            n.free_bytes = n.free_bytes.saturating_add(a.spec.memory_bytes);
            for p in a.ports() {
                n.used_ports.remove(&p);
            }
        }
        if let Some(q) = queue_of(view, a)
            && let Some(u) = trial.queues.usage.get_mut(q)
        {
            u.memory_bytes = u.memory_bytes.saturating_sub(a.spec.memory_bytes);
            queues.insert(q);
        }
    }
    // A Mac stays counted while another rank of the queue still holds it.
    let freed = |a: &Alloc| {
        allocations
            .iter()
            .any(|f| Arc::ptr_eq(&f.object, &a.object))
    };
    for q in queues {
        let macs = view
            .allocations
            .iter()
            .filter(|a| a.holds_resources() && !freed(a) && queue_of(view, a) == Some(q))
            .map(|a| a.spec.node.clone())
            .collect();
        if let Some(u) = trial.queues.usage.get_mut(q) {
            u.macs = macs;
        }
    }
    trial
}

/// Whether a job (by its namespace, priority and queue) may be stopped for the one being
/// placed, and under which reason.
pub type Eligible<'a> = dyn Fn(&str, &JobFacts) -> Option<Reason> + 'a;

/// The gangs that run now and `eligible` allows stopping, in the order they would be stopped.
fn candidates(job: &Object, view: &ClusterView, eligible: &Eligible) -> Vec<Victim> {
    let mut out: Vec<Victim> = view
        .gangs
        .iter()
        .filter(|g| g.job.metadata.uid != job.metadata.uid)
        .filter_map(|g| {
            let reason = eligible(&g.job.metadata.namespace, &g.facts)?;
            Some(Victim {
                job: g.job.clone(),
                priority: g.facts.priority,
                reason,
                allocations: g.allocations.clone(),
                memory_bytes: g.memory_bytes,
            })
        })
        .collect();
    out.sort_by(|a, b| {
        a.priority
            .cmp(&b.priority)
            .then(a.memory_bytes.cmp(&b.memory_bytes))
            .then_with(|| {
                b.job
                    .metadata
                    .creation_timestamp
                    .cmp(&a.job.metadata.creation_timestamp)
            })
            .then_with(|| a.job.key().cmp(&b.job.key()))
    });
    out
}

/// Whether `a` belongs to a job `eligible` allows stopping (a job that is gone counts).
fn lower(view: &ClusterView, a: &Alloc, eligible: &Eligible) -> bool {
    let key = (
        a.spec.job.kind.clone(),
        a.object.metadata.namespace.clone(),
        a.spec.job.name.clone(),
    );
    view.facts
        .get(&key)
        .is_none_or(|f| eligible(&key.1, f).is_some())
}

/// Which gangs to stop so that `fits` holds, if any.
pub fn choose(
    job: &Object,
    view: &ClusterView,
    eligible: &Eligible,
    fits: impl Fn(&ClusterView) -> bool,
) -> Choice {
    let stopping: Vec<&Alloc> = view
        .allocations
        .iter()
        .filter(|a| {
            a.holds_resources()
                && a.spec.desired == Desired::Stop
                && a.spec.job.uid != job.metadata.uid
                && lower(view, a, eligible)
        })
        .collect();
    if !stopping.is_empty() && fits(&without(view, &stopping)) {
        return Choice::Waiting;
    }
    let candidates = candidates(job, view, eligible);
    let mut freed = stopping;
    let mut chosen = Vec::new();
    for victim in &candidates {
        freed.extend(victim.allocations.iter());
        chosen.push(victim.clone());
        if fits(&without(view, &freed)) {
            return Choice::Preempt(chosen);
        }
    }
    Choice::Hopeless
}
