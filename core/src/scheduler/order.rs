//! The cluster-wide order jobs are considered in: priority (a job's own, else its queue's)
//! highest first, then weighted fair share lowest first, then services before batch work, then
//! age. Pure, and shared with `tbctl`, which numbers pending jobs by it (the POSITION column)
//! instead of the scheduler writing positions into every status on every change.
//!
//! A queue's fair share is its decayed memory usage plus what it holds now and what the order
//! has already put ahead of it, projected over the half-life's time constant, divided by its
//! weight. The projection is what makes one pass fair: a backlog arriving at an idle cluster
//! is interleaved by weight (two queues 1:2 get one gang, then two, …) instead of going to
//! whichever queue's jobs are oldest until the ledger catches up; a queue that had the lab to
//! itself for hours still waits behind the others until its decayed usage has faded.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::f64::consts::LN_2;
use std::sync::Arc;

use tb_api::status::{JobPhase, JobStatus};
use tb_api::{Kind, Object};

use super::queues::Queues;
use super::view::{ClusterView, JobFacts};

/// Each queue's standing for fair-share ordering.
#[derive(Debug, Clone, Default)]
pub struct FairShares {
    /// Decayed memory usage (byte·seconds) now.
    pub decayed: BTreeMap<String, f64>,
    /// The queue's half-life (seconds); usage held now is projected over half-life ÷ ln 2.
    pub half_life_seconds: BTreeMap<String, f64>,
}

impl FairShares {
    /// Seconds over which memory held now counts towards the queue's share.
    fn horizon(&self, queue: &str) -> f64 {
        self.half_life_seconds.get(queue).copied().unwrap_or(3600.0) / LN_2
    }
}

fn weight(queues: &Queues, queue: &str) -> f64 {
    f64::from(queues.specs.get(queue).map_or(1, |q| q.weight.max(1)))
}

/// A queue's decayed usage divided by its weight; 0 for unqueued jobs.
pub fn share_per_weight(queues: &Queues, shares: &BTreeMap<String, f64>, queue: &str) -> f64 {
    shares.get(queue).copied().unwrap_or(0.0) / weight(queues, queue)
}

/// Whether a job waits to be placed (and so adds to its queue's projected share when ordered).
fn waiting(job: &Object) -> bool {
    JobStatus::from_value(&job.status).phase == JobPhase::Pending
}

/// One job with its place among its queue's jobs.
struct Entry {
    job: Arc<Object>,
    priority: i32,
    service: bool,
    demand_bytes: u64,
}

impl Entry {
    /// Order inside one queue: priority, services first, age.
    fn cmp_within(&self, other: &Entry) -> Ordering {
        Reverse(self.priority)
            .cmp(&Reverse(other.priority))
            .then(other.service.cmp(&self.service))
            .then_with(|| {
                self.job
                    .metadata
                    .creation_timestamp
                    .cmp(&other.job.metadata.creation_timestamp)
            })
            .then_with(|| self.job.key().cmp(&other.job.key()))
    }
}

/// A queue's next job, keyed for the cluster-wide choice (a max-heap: the greatest goes next).
struct Head {
    share: f64,
    group: usize,
    entry: Entry,
}

impl Head {
    fn cmp_next(&self, other: &Head) -> Ordering {
        Reverse(self.entry.priority)
            .cmp(&Reverse(other.entry.priority))
            .then(self.share.total_cmp(&other.share))
            .then(other.entry.service.cmp(&self.entry.service))
            .then_with(|| {
                self.entry
                    .job
                    .metadata
                    .creation_timestamp
                    .cmp(&other.entry.job.metadata.creation_timestamp)
            })
            .then_with(|| self.entry.job.key().cmp(&other.entry.job.key()))
    }
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Head {}
impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Head {
    fn cmp(&self, other: &Self) -> Ordering {
        other.cmp_next(self)
    }
}

/// `jobs` (TrainingJobs and InferenceServices) in the order the scheduler considers them
/// (priorities and queues as `view` parsed them).
pub fn order(jobs: Vec<Arc<Object>>, view: &ClusterView, shares: &FairShares) -> Vec<Arc<Object>> {
    let queues = &view.queues;
    // Jobs grouped by queue (None: unqueued, whose share stays 0), each group in its own order.
    let mut groups: BTreeMap<Option<String>, Vec<Entry>> = BTreeMap::new();
    let total = jobs.len();
    for j in jobs {
        let key = (
            j.kind.clone(),
            j.metadata.namespace.clone(),
            j.metadata.name.clone(),
        );
        let facts = match view.facts.get(&key) {
            Some(f) => f.clone(),
            None => queues.facts(&j),
        };
        let JobFacts {
            priority,
            queue,
            demand_bytes,
        } = facts;
        let pending = match view.parsed.get(&key) {
            Some(p) => p.status.phase == JobPhase::Pending,
            None => waiting(&j),
        };
        let entry = Entry {
            service: j.kind() == Some(Kind::InferenceService),
            demand_bytes: if pending { demand_bytes } else { 0 },
            priority,
            job: j,
        };
        groups.entry(queue).or_default().push(entry);
    }
    let mut names = Vec::with_capacity(groups.len());
    let mut pending: Vec<VecDeque<Entry>> = Vec::with_capacity(groups.len());
    let mut projected: Vec<f64> = Vec::with_capacity(groups.len());
    for (queue, mut entries) in groups {
        entries.sort_by(Entry::cmp_within);
        projected.push(queue.as_deref().map_or(0.0, |q| {
            let held = queues.usage.get(q).map_or(0, |u| u.memory_bytes) as f64;
            shares.decayed.get(q).copied().unwrap_or(0.0) + held * shares.horizon(q)
        }));
        names.push(queue);
        pending.push(entries.into());
    }
    let share_of = |group: usize, projected: &[f64]| {
        names[group]
            .as_deref()
            .map_or(0.0, |q| projected[group] / weight(queues, q))
    };
    let mut heads = BinaryHeap::new();
    for (group, entries) in pending.iter_mut().enumerate() {
        if let Some(entry) = entries.pop_front() {
            let share = share_of(group, &projected);
            heads.push(Head {
                share,
                group,
                entry,
            });
        }
    }
    let mut ordered = Vec::with_capacity(total);
    while let Some(Head { group, entry, .. }) = heads.pop() {
        if let Some(q) = names[group].as_deref() {
            projected[group] += entry.demand_bytes as f64 * shares.horizon(q);
        }
        ordered.push(entry.job);
        if let Some(next) = pending[group].pop_front() {
            let share = share_of(group, &projected);
            heads.push(Head {
                share,
                group,
                entry: next,
            });
        }
    }
    ordered
}

/// 1-based positions of the pending jobs in `ordered`, by (kind, namespace, name).
pub fn positions(ordered: &[Arc<Object>]) -> BTreeMap<(String, String, String), usize> {
    ordered
        .iter()
        .filter(|j| waiting(j))
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
