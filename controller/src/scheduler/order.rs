//! The cluster-wide order jobs are considered in: priority (a job's own, else its queue's)
//! highest first, then weighted fair share (the queue's decayed usage ÷ its weight) lowest
//! first, then services before batch work, then age. Pure, and shared with `tbctl`, which
//! numbers pending jobs by it (the POSITION column) instead of the scheduler writing positions
//! into every status on every change.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Arc;

use tb_api::status::{JobPhase, JobStatus};
use tb_api::{Kind, Object};

use super::queues::Queues;
use super::view::ClusterView;

/// A queue's decayed usage divided by its weight; 0 for unqueued jobs.
pub fn share_per_weight(queues: &Queues, shares: &BTreeMap<String, f64>, queue: &str) -> f64 {
    let weight = queues.specs.get(queue).map_or(1, |q| q.weight.max(1));
    shares.get(queue).copied().unwrap_or(0.0) / f64::from(weight)
}

/// `jobs` (TrainingJobs and InferenceServices) in the order the scheduler considers them
/// (priorities and queues as `view` parsed them).
pub fn order(
    jobs: Vec<Arc<Object>>,
    view: &ClusterView,
    shares: &BTreeMap<String, f64>,
) -> Vec<Arc<Object>> {
    let queues = &view.queues;
    let mut keyed: Vec<_> = jobs
        .into_iter()
        .map(|j| {
            let key = (
                j.kind.clone(),
                j.metadata.namespace.clone(),
                j.metadata.name.clone(),
            );
            let (priority, queue) = match view.facts.get(&key) {
                Some(f) => (f.priority, f.queue.clone()),
                None => (queues.priority_of(&j), queues.queue_of(&j).ok().flatten()),
            };
            let share = queue.map_or(0.0, |q| share_per_weight(queues, shares, &q));
            let service = j.kind() == Some(Kind::InferenceService);
            ((Reverse(priority), share, !service), j)
        })
        .collect();
    keyed.sort_by(|((pa, fa, sa), a), ((pb, fb, sb), b)| {
        pa.cmp(pb)
            .then(fa.total_cmp(fb))
            .then(sa.cmp(sb))
            .then_with(|| {
                a.metadata
                    .creation_timestamp
                    .cmp(&b.metadata.creation_timestamp)
            })
            .then_with(|| a.key().cmp(&b.key()))
    });
    keyed.into_iter().map(|(_, j)| j).collect()
}

/// 1-based positions of the pending jobs in `ordered`, by (kind, namespace, name).
pub fn positions(ordered: &[Arc<Object>]) -> BTreeMap<(String, String, String), usize> {
    ordered
        .iter()
        .filter(|j| JobStatus::from_value(&j.status).phase == JobPhase::Pending)
        .enumerate()
        .map(|(i, j)| {
            (
                (
                    j.kind.clone(),
                    j.metadata.namespace.clone(),
                    j.metadata.name.clone(),
                ),
                i + 1,
            )
        })
        .collect()
}
