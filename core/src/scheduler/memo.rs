//! Parsed jobs and allocations carried from one reconcile pass to the next.
//!
//! A pass looks at every job, and parsing thousands of JSON specs and statuses was most of its
//! cost. A stored object never changes under its resourceVersion, so what was parsed from it
//! is kept under (key, resourceVersion) and reused until the object moves on. The memo changes
//! no result: `reconcile` with a fresh memo and with a warm one plan the same.

use std::collections::HashMap;
use std::sync::Arc;

use tb_api::Object;
use tb_api::specs::{AllocationSpec, AllocationStatus, parse_spec};
use tb_api::status::JobStatus;

use super::SchedulerConfig;
use super::jobs::{JobShape, shape};
use super::queues::{JobFields, job_fields};

/// What the scheduler reads of a TrainingJob or InferenceService.
#[derive(Debug)]
pub struct ParsedJob {
    pub fields: JobFields,
    pub status: JobStatus,
    /// None when the spec does not parse (the job is left alone).
    pub(super) shape: Option<JobShape>,
}

impl ParsedJob {
    pub fn parse(job: &Object, cfg: &SchedulerConfig) -> ParsedJob {
        ParsedJob {
            fields: job_fields(job),
            status: JobStatus::from_value(&job.status),
            shape: shape(job, cfg),
        }
    }
}

/// An allocation's spec and status; None when its spec does not parse.
pub type ParsedAllocation = Option<Arc<(AllocationSpec, AllocationStatus)>>;

struct Kept<T> {
    resource_version: u64,
    /// The pass that last asked for it: entries not asked for in a pass are dropped after it.
    pass: u64,
    value: T,
}

/// Parsed objects by storage key.
#[derive(Default)]
pub struct Memo {
    pass: u64,
    jobs: HashMap<String, Kept<Arc<ParsedJob>>>,
    allocations: HashMap<String, Kept<ParsedAllocation>>,
}

fn remember<T: Clone>(
    map: &mut HashMap<String, Kept<T>>,
    pass: u64,
    obj: &Object,
    parse: impl FnOnce() -> T,
) -> T {
    let key = obj.key().storage_key();
    let rv = obj.metadata.resource_version;
    if let Some(kept) = map.get_mut(&key)
        && kept.resource_version == rv
        && rv != 0
    {
        kept.pass = pass;
        return kept.value.clone();
    }
    let value = parse();
    map.insert(
        key,
        Kept {
            resource_version: rv,
            pass,
            value: value.clone(),
        },
    );
    value
}

impl Memo {
    /// Start a pass.
    pub fn begin(&mut self) {
        self.pass += 1;
    }

    /// Forget what the pass just ended did not ask for (deleted objects, old versions).
    pub fn end(&mut self) {
        let pass = self.pass;
        self.jobs.retain(|_, k| k.pass == pass);
        self.allocations.retain(|_, k| k.pass == pass);
    }

    pub fn job(&mut self, job: &Object, cfg: &SchedulerConfig) -> Arc<ParsedJob> {
        remember(&mut self.jobs, self.pass, job, || {
            Arc::new(ParsedJob::parse(job, cfg))
        })
    }

    pub fn allocation(&mut self, alloc: &Object) -> ParsedAllocation {
        remember(&mut self.allocations, self.pass, alloc, || {
            let spec = parse_spec::<AllocationSpec>(&alloc.spec).ok()?;
            Some(Arc::new((
                spec,
                AllocationStatus::from_value(&alloc.status),
            )))
        })
    }
}
