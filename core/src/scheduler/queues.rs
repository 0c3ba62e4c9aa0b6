//! Queues: which queue a job belongs to, what each queue's running work holds, and whether a
//! job's placement fits the queue's quota (plus what it may borrow). Pure; the scheduler asks
//! before it creates a gang and counts the gang once created.
//!
//! A job names its queue (`spec.queue`); without one it goes to the queue that lists its
//! namespace (the first by name), and without such a queue it is unqueued: no quota applies.
//! A queue's usage is what the allocations of its jobs hold now (memory summed over ranks; Macs
//! counted once each), so it falls as soon as a rank ends.
//!
//! Priority is admin policy: a job is ordered and preempts by its own priority (else its
//! queue's) capped at its queue's ceiling (`maxPriority`, else the queue's `priority`; 0 for
//! unqueued work). The objects service refuses a job asking for more at apply
//! ([`Queues::priority_refusal`]); the cap here holds for jobs stored before a ceiling was
//! lowered or whose queue changed since.

use std::collections::{BTreeMap, BTreeSet};
use tb_api::reason::Reason;

use tb_api::specs::{
    InferenceServiceSpec, QueueSpec, TrainingJobSpec, UNQUEUED_MAX_PRIORITY, parse_spec,
};
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
    pub reason: Reason,
    pub message: String,
}

/// What a job says of its queue, its priority and how much memory its gang asks for, from one
/// parse of its spec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobFields {
    pub queue: Option<String>,
    pub priority: Option<i32>,
    /// Ranks × memory per rank (the scheduler's default where the job names none; built-in
    /// services, sized from their Model at placement, count as one default rank here).
    pub demand_bytes: u64,
}

pub fn job_fields(job: &Object) -> JobFields {
    let default = super::SchedulerConfig::default().default_memory_bytes;
    let memory = |q: Option<&tb_api::Quantity>| q.map_or(default, |q| q.bytes());
    match job.kind() {
        Some(Kind::TrainingJob) => parse_spec::<TrainingJobSpec>(&job.spec)
            .map(|s| JobFields {
                demand_bytes: memory(s.memory.as_ref()).saturating_mul(u64::from(s.ranks.max(1))),
                queue: s.queue,
                priority: s.priority,
            })
            .unwrap_or_default(),
        Some(Kind::InferenceService) => parse_spec::<InferenceServiceSpec>(&job.spec)
            .map(|s| JobFields {
                demand_bytes: memory(s.memory.as_ref()),
                queue: s.queue,
                priority: s.priority,
            })
            .unwrap_or_default(),
        _ => JobFields::default(),
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

    /// A job's priority and queue (None when unqueued or refused), from one parse of its spec.
    pub fn facts(&self, job: &Object) -> super::view::JobFacts {
        self.facts_of(&job.metadata.namespace, &job_fields(job))
    }

    /// The facts of a job in namespace `ns` that says `fields`. Its priority is its own, else
    /// its queue's, and never above its queue's ceiling (the one place priority is computed).
    pub fn facts_of(&self, ns: &str, fields: &JobFields) -> super::view::JobFacts {
        let queue = self.resolve(ns, fields.queue.clone()).ok().flatten();
        let spec = queue.as_ref().and_then(|q| self.specs.get(q));
        let asked = fields
            .priority
            .unwrap_or_else(|| spec.map_or(0, |q| q.priority));
        super::view::JobFacts {
            priority: asked.min(self.ceiling(queue.as_deref())),
            queue,
            demand_bytes: fields.demand_bytes,
        }
    }

    /// The highest priority a job of `queue` (None: unqueued) may ask for and is ordered by.
    pub fn ceiling(&self, queue: Option<&str>) -> i32 {
        queue
            .and_then(|q| self.specs.get(q))
            .map_or(UNQUEUED_MAX_PRIORITY, QueueSpec::ceiling)
    }

    /// Why work in namespace `ns` naming queue `named` may not ask for `priority`: it is above
    /// the ceiling of the queue it resolves to (None when it is not, or names no priority, or
    /// names a queue it cannot use — the scheduler holds that job with QueueNotFound or
    /// QueueForbidden, and caps it should the queue appear).
    pub fn priority_refusal(
        &self,
        ns: &str,
        named: Option<String>,
        priority: Option<i32>,
    ) -> Option<String> {
        let priority = priority?;
        let queue = self.resolve(ns, named).ok()?;
        let ceiling = self.ceiling(queue.as_deref());
        if priority <= ceiling {
            return None;
        }
        Some(match queue.as_deref().map(|q| (q, self.specs.get(q))) {
            Some((q, Some(spec))) if spec.max_priority.is_some() => {
                format!("{priority} is above queue {q:?}'s maxPriority {ceiling}")
            }
            Some((q, _)) => format!(
                "{priority} is above queue {q:?}'s maxPriority {ceiling} (its priority; the queue \
                 sets no maxPriority)"
            ),
            None => format!(
                "{priority} is above {ceiling}, the most a job in no queue may ask for \
                 (no queue lists namespace {ns:?}; name a queue in spec.queue)"
            ),
        })
    }

    /// The queue a job belongs to: Ok(None) when it is unqueued, Err when it names a queue it
    /// may not use.
    pub fn queue_of(&self, job: &Object) -> Result<Option<String>, Held> {
        self.resolve(&job.metadata.namespace, job_fields(job).queue)
    }

    /// The queue for work in namespace `ns` that names `named` (or none).
    pub fn resolve(&self, ns: &str, named: Option<String>) -> Result<Option<String>, Held> {
        match named {
            Some(name) => match self.specs.get(&name) {
                None => Err(Held {
                    reason: Reason::QueueNotFound,
                    message: format!("queue {name} does not exist"),
                }),
                Some(q) if !q.namespaces.is_empty() && !q.namespaces.iter().any(|n| n == ns) => {
                    Err(Held {
                        reason: Reason::QueueForbidden,
                        message: format!(
                            "queue {name} takes work from namespaces {}, not {ns}",
                            q.namespaces.join(", ")
                        ),
                    })
                }
                Some(_) => Ok(Some(name)),
            },
            None => Ok(self
                .specs
                .iter()
                .find(|(_, q)| q.namespaces.iter().any(|n| n == ns))
                .map(|(name, _)| name.clone())),
        }
    }

    /// The priority a job is ordered by: its own, else its queue's, capped at the ceiling.
    pub fn priority_of(&self, job: &Object) -> i32 {
        self.facts(job).priority
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

    /// Whether `queue` holds more than its own quota (memory or Macs): it is borrowing, and
    /// what it borrowed may be reclaimed.
    pub fn borrowing(&self, queue: &str) -> bool {
        let (Some(spec), Some(used)) = (self.specs.get(queue), self.usage.get(queue)) else {
            return false;
        };
        spec.quota
            .memory
            .as_ref()
            .is_some_and(|q| used.memory_bytes > q.bytes())
            || spec.quota.macs.is_some_and(|q| used.macs.len() as u32 > q)
    }

    /// Whether `queue` has a quota and a gang of `memory_bytes` on up to `macs` more Macs stays
    /// within it, without borrowing.
    pub fn within_quota(&self, queue: &str, memory_bytes: u64, macs: u32) -> bool {
        let Some(spec) = self.specs.get(queue) else {
            return false;
        };
        if spec.quota.memory.is_none() && spec.quota.macs.is_none() {
            return false;
        }
        let used = self.usage.get(queue).cloned().unwrap_or_default();
        let memory_ok = spec
            .quota
            .memory
            .as_ref()
            .is_none_or(|q| used.memory_bytes.saturating_add(memory_bytes) <= q.bytes());
        let macs_ok = spec
            .quota
            .macs
            .is_none_or(|q| used.macs.len() as u32 + macs <= q);
        memory_ok && macs_ok
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
                    reason: Reason::QuotaExceeded,
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
                    reason: Reason::QuotaExceeded,
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
