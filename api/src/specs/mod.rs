//! Typed specs, one module per kind. The store keeps specs as JSON; these types say what each
//! kind accepts (unknown fields are errors), fill in defaults, and run the checks serde cannot.

pub mod allocation;
mod common;
pub mod event;
pub mod finetune;
pub mod inference;
pub mod link;
pub mod model;
pub mod node;
pub mod queue;
pub mod schedule;
pub mod training;

use serde::de::DeserializeOwned;
use serde_json::Value;

pub use allocation::{
    AdapterAssignment, AllocationPhase, AllocationSpec, AllocationStatus, BuiltinAssignment,
    Desired, JobRef, LayerRange, MlxAssignment,
};
pub use common::Executor;
pub use event::{EventSpec, EventType, ObjectRef};
pub use finetune::{FineTuneMethod, FineTuneSpec, LoraSpec, LoraTarget, LrSchedule};
pub use inference::{
    AdapterRef, Endpoint, InferenceServiceSpec, NodeRange, Objective, Parallelism,
};
pub use link::{LinkEnd, LinkSpec, LinkStatus, link_name};
pub use model::{ModelFormat, ModelSource, ModelSpec};
pub use node::NodeSpec;
pub use queue::{
    PreemptionPolicy, QueuePreemption, QueueQuota, QueueSpec, QueueStatus, UNQUEUED_MAX_PRIORITY,
};
pub use schedule::{
    ANNOTATION_SCHEDULE_UID, ANNOTATION_SCHEDULED_TIME, ConcurrencyPolicy, JobTemplate,
    LABEL_SCHEDULE, ScheduleSpec, ScheduleStatus, TemplateMetadata, job_from_template,
};
pub use training::{Backend, Checkpoints, TrainingJobSpec, TrainingParallelism};

use crate::kind::Kind;
use crate::validate::ValidationError;

/// A spec type together with its kind and its semantic checks.
pub trait Spec: serde::Serialize + DeserializeOwned {
    const KIND: Kind;
    /// Checks beyond types; error paths are relative to the spec (`nodes.min`).
    fn check(&self) -> Result<(), ValidationError>;
}

macro_rules! impl_spec {
    ($($ty:ty => $kind:ident),* $(,)?) => {$(
        impl Spec for $ty {
            const KIND: Kind = Kind::$kind;
            fn check(&self) -> Result<(), ValidationError> {
                <$ty>::check(self)
            }
        }
    )*};
}

impl_spec! {
    ModelSpec => Model,
    InferenceServiceSpec => InferenceService,
    TrainingJobSpec => TrainingJob,
    ScheduleSpec => Schedule,
    QueueSpec => Queue,
    NodeSpec => Node,
    LinkSpec => Link,
    EventSpec => Event,
    AllocationSpec => Allocation,
}

/// Reads and checks a stored or submitted spec; error paths start with `spec`. A missing spec
/// reads as an empty mapping, so a kind with required fields says which one is missing.
pub fn parse_spec<T: Spec>(spec: &Value) -> Result<T, ValidationError> {
    let empty = Value::Object(Default::default());
    let spec = if spec.is_null() { &empty } else { spec };
    let typed: T = crate::serde_util::from_value(spec).map_err(|e| e.under("spec"))?;
    typed.check().map_err(|e| e.under("spec"))?;
    Ok(typed)
}

/// Any kind's spec, typed.
#[derive(Debug, Clone, PartialEq)]
pub enum TypedSpec {
    Model(ModelSpec),
    InferenceService(InferenceServiceSpec),
    TrainingJob(TrainingJobSpec),
    Schedule(ScheduleSpec),
    Queue(QueueSpec),
    Node(NodeSpec),
    Link(LinkSpec),
    Event(EventSpec),
    Allocation(AllocationSpec),
}

impl TypedSpec {
    /// Reads and checks the spec of a `kind` object (see [`parse_spec`]).
    pub fn from_value(kind: Kind, spec: &Value) -> Result<TypedSpec, ValidationError> {
        Ok(match kind {
            Kind::Model => TypedSpec::Model(parse_spec(spec)?),
            Kind::InferenceService => TypedSpec::InferenceService(parse_spec(spec)?),
            Kind::TrainingJob => TypedSpec::TrainingJob(parse_spec(spec)?),
            Kind::Schedule => TypedSpec::Schedule(parse_spec(spec)?),
            Kind::Queue => TypedSpec::Queue(parse_spec(spec)?),
            Kind::Node => TypedSpec::Node(parse_spec(spec)?),
            Kind::Link => TypedSpec::Link(parse_spec(spec)?),
            Kind::Event => TypedSpec::Event(parse_spec(spec)?),
            Kind::Allocation => TypedSpec::Allocation(parse_spec(spec)?),
        })
    }

    /// The spec as JSON, with every default written out.
    pub fn to_value(&self) -> Value {
        // These types hold only strings, numbers, string-keyed maps and JSON values, which
        // always serialise; Null is unreachable but keeps this total.
        let result = match self {
            TypedSpec::Model(s) => serde_json::to_value(s),
            TypedSpec::InferenceService(s) => serde_json::to_value(s),
            TypedSpec::TrainingJob(s) => serde_json::to_value(s),
            TypedSpec::Schedule(s) => serde_json::to_value(s),
            TypedSpec::Queue(s) => serde_json::to_value(s),
            TypedSpec::Node(s) => serde_json::to_value(s),
            TypedSpec::Link(s) => serde_json::to_value(s),
            TypedSpec::Event(s) => serde_json::to_value(s),
            TypedSpec::Allocation(s) => serde_json::to_value(s),
        };
        result.unwrap_or(Value::Null)
    }

    pub fn kind(&self) -> Kind {
        match self {
            TypedSpec::Model(_) => Kind::Model,
            TypedSpec::InferenceService(_) => Kind::InferenceService,
            TypedSpec::TrainingJob(_) => Kind::TrainingJob,
            TypedSpec::Schedule(_) => Kind::Schedule,
            TypedSpec::Queue(_) => Kind::Queue,
            TypedSpec::Node(_) => Kind::Node,
            TypedSpec::Link(_) => Kind::Link,
            TypedSpec::Event(_) => Kind::Event,
            TypedSpec::Allocation(_) => Kind::Allocation,
        }
    }
}
