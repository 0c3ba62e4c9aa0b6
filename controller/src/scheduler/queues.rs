//! Queues: which queue a job belongs to, what each queue's running work holds, and whether a
//! job's placement fits the queue's quota (plus what it may borrow). Pure; the scheduler asks
//! before it creates a gang and counts the gang once created.
//!
//! A job names its queue (`spec.queue`); without one it goes to the queue that lists its
//! namespace (the first by name), and without such a queue it is unqueued: no quota applies.
//! A queue's usage is what the allocations of its jobs hold now (memory summed over ranks; Macs
//! counted once each), so it falls as soon as a rank ends.

use std::collections::{BTreeMap, BTreeSet};

use tb_api::specs::{InferenceServiceSpec, QueueSpec, TrainingJobSpec, parse_spec};
use tb_api::{Kind, Object};

use super::placement::human;

/// What a queue's running work holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub memory_bytes: u64,
    pub macs: BTreeSet<String>,
}

/// The queues and their usage, for one reconcile pass.
#[derive(Debug, Clone, Default)]
pub struct Queues {
    pub specs: BTreeMap<String, QueueSpec>,
    pub usage: BTreeMap<String, Usage>,
}

/// Why a job may not start (yet) under its queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub reason: &'static str,
    pub message: String,
}

/// What a job says of its queue and priority.
pub fn job_queue_fields(job: &Object) -> (Option<String>, Option<i32>) {
    match job.kind() {
        Some(Kind::TrainingJob) => parse_spec::<TrainingJobSpec>(&job.spec)
            .map(|s| (s.queue, s.priority))
            .unwrap_or_default(),
        Some(Kind::InferenceService) => parse_spec::<InferenceServiceSpec>(&job.spec)
            .map(|s| (s.queue, s.priority))
            .unwrap_or_default(),
        _ => (None, None),
    }
}

impl Queues {
    pub fn new(queue_objects: &[std::sync::Arc<Object>]) -> Queues {
        let specs = queue_objects
            .iter()
            .filter_map(|o| {
                Some((
                    o.metadata.name.clone(),
                    parse_spec::<QueueSpec>(&o.spec).ok()?,
                ))
            })
            .collect();
        Queues {
            specs,
            usage: BTreeMap::new(),
        }
    }

    /// The queue a job belongs to: Ok(None) when it is unqueued, Err when it names a queue it
    /// may not use.
    pub fn queue_of(&self, job: &Object) -> Result<Option<String>, Held> {
        let ns = &job.metadata.namespace;
        match job_queue_fields(job).0 {
            Some(name) => match self.specs.get(&name) {
                None => Err(Held {
                    reason: "QueueNotFound",
                    message: format!("queue {name} does not exist"),
                }),
                Some(q) if !q.namespaces.is_empty() && !q.namespaces.contains(ns) => Err(Held {
                    reason: "QueueForbidden",
                    message: format!(
                        "queue {name} takes work from namespaces {}, not {ns}",
                        q.namespaces.join(", ")
                    ),
                }),
                Some(_) => Ok(Some(name)),
            },
            None => Ok(self
                .specs
                .iter()
                .find(|(_, q)| q.namespaces.contains(ns))
                .map(|(name, _)| name.clone())),
        }
    }

    /// The priority a job is ordered by: its own, else its queue's.
    pub fn priority_of(&self, job: &Object) -> i32 {
        let (_, own) = job_queue_fields(job);
        own.unwrap_or_else(|| {
            self.queue_of(job)
                .ok()
                .flatten()
                .and_then(|q| self.specs.get(&q))
                .map_or(0, |q| q.priority)
        })
    }

    /// Count a gang (its memory, its Macs) against its queue.
    pub fn charge(
        &mut self,
        queue: &str,
        memory_bytes: u64,
        macs: impl IntoIterator<Item = String>,
    ) {
        let u = self.usage.entry(queue.to_string()).or_default();
        u.memory_bytes = u.memory_bytes.saturating_add(memory_bytes);
        u.macs.extend(macs);
    }

    /// Whether a gang of `memory_bytes` on `macs` fits `queue`'s quota plus its borrowing limit.
    pub fn admit(
        &self,
        queue: &str,
        memory_bytes: u64,
        macs: &BTreeSet<String>,
    ) -> Result<(), Held> {
        let Some(spec) = self.specs.get(queue) else {
            return Ok(());
        };
        let used = self.usage.get(queue).cloned().unwrap_or_default();
        let borrow = spec.borrowing_limit.clone().unwrap_or_default();
        if let Some(quota) = &spec.quota.memory {
            let limit = quota.bytes() + borrow.memory.as_ref().map_or(0, |b| b.bytes());
            let wanted = used.memory_bytes.saturating_add(memory_bytes);
            if wanted > limit {
                return Err(Held {
                    reason: "QuotaExceeded",
                    message: format!(
                        "queue {queue}: {} of {} memory in use{}; this job needs {} more ({} over)",
                        human(used.memory_bytes),
                        human(quota.bytes()),
                        borrow
                            .memory
                            .as_ref()
                            .map(|b| format!(" (may borrow {b})"))
                            .unwrap_or_default(),
                        human(memory_bytes),
                        human(wanted - limit)
                    ),
                });
            }
        }
        if let Some(quota) = spec.quota.macs {
            let limit = quota + borrow.macs.unwrap_or(0);
            let all: BTreeSet<&String> = used.macs.iter().chain(macs).collect();
            if all.len() as u32 > limit {
                return Err(Held {
                    reason: "QuotaExceeded",
                    message: format!(
                        "queue {queue}: {} of {quota} Macs in use; this job would bring it to {}",
                        used.macs.len(),
                        all.len()
                    ),
                });
            }
        }
        Ok(())
    }
}
