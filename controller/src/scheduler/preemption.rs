//! Preemption: when a job fits nowhere, whole gangs of lower priority may be stopped to make
//! room — never part of a gang, lowest priority first, then the cheapest (least memory), then
//! the youngest. Pure: it picks the victims; the job's reconcile stops them and requeues them
//! (Pending, reason Preempted), and the job is placed on a later pass once their ranks have
//! ended.
//!
//! Ranks already told to stop count as gone, so a job waiting for its victims to end does not
//! pick more.

use std::collections::BTreeMap;
use std::sync::Arc;

use tb_api::Object;
use tb_api::specs::Desired;

use super::view::{Alloc, ClusterView};

/// A running gang that may be stopped.
#[derive(Debug, Clone)]
pub struct Victim {
    pub job: Arc<Object>,
    pub priority: i32,
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

/// A copy of `view` without the resources `allocations` hold.
fn without(view: &ClusterView, allocations: &[&Alloc]) -> ClusterView {
    let mut trial = view.clone();
    for a in allocations {
        if let Some(n) = trial.nodes.get_mut(&a.spec.node) {
            n.free_bytes = n.free_bytes.saturating_add(a.spec.memory_bytes);
            for p in a.ports() {
                n.used_ports.remove(&p);
            }
        }
    }
    trial
}

/// The gangs of lower priority than `priority` that run now, in the order they would be
/// stopped.
fn candidates(job: &Object, priority: i32, view: &ClusterView) -> Vec<Victim> {
    let mut gangs: BTreeMap<(String, String, String, u64), Vec<Alloc>> = BTreeMap::new();
    for a in &view.allocations {
        if a.holds_resources() && a.spec.desired == Desired::Run {
            let key = (
                a.spec.job.kind.clone(),
                a.object.metadata.namespace.clone(),
                a.spec.job.name.clone(),
                a.spec.epoch,
            );
            gangs.entry(key).or_default().push(a.clone());
        }
    }
    let mut out: Vec<Victim> = gangs
        .into_iter()
        .filter_map(|((kind, ns, name, _), allocations)| {
            let victim = view.jobs.get(&(kind, ns, name))?;
            let same = victim.metadata.uid == job.metadata.uid;
            let p = view.queues.priority_of(victim);
            let ours = allocations
                .iter()
                .all(|a| a.spec.job.uid == victim.metadata.uid);
            (!same && ours && p < priority).then(|| Victim {
                job: victim.clone(),
                priority: p,
                memory_bytes: allocations.iter().map(|a| a.spec.memory_bytes).sum(),
                allocations,
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

/// Whether `a` belongs to a job of lower priority than `priority` (a job that is gone counts as
/// lowest).
fn lower(view: &ClusterView, a: &Alloc, priority: i32) -> bool {
    let key = (
        a.spec.job.kind.clone(),
        a.object.metadata.namespace.clone(),
        a.spec.job.name.clone(),
    );
    view.jobs
        .get(&key)
        .is_none_or(|j| view.queues.priority_of(j) < priority)
}

/// Which gangs to stop so that `fits` holds, if any.
pub fn choose(
    job: &Object,
    priority: i32,
    view: &ClusterView,
    fits: impl Fn(&ClusterView) -> bool,
) -> Choice {
    let stopping: Vec<&Alloc> = view
        .allocations
        .iter()
        .filter(|a| {
            a.holds_resources()
                && a.spec.desired == Desired::Stop
                && a.spec.job.uid != job.metadata.uid
                && lower(view, a, priority)
        })
        .collect();
    if !stopping.is_empty() && fits(&without(view, &stopping)) {
        return Choice::Waiting;
    }
    let candidates = candidates(job, priority, view);
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
