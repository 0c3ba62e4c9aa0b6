//! InferenceService: serve a Model on one or more Macs, with an OpenAI-compatible endpoint.
//! Long-running: tb re-places it when a Mac fails.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{self, CheckResult, Executor};
use crate::quantity::Quantity;
use crate::validate::ValidationError;

/// How the model is split across Macs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Parallelism {
    /// Consecutive layers on consecutive Macs; activations flow along the chain.
    Pipeline,
    /// Every layer split across all Macs; needs fast (RDMA) links.
    Tensor,
    /// Let placement choose from the links and the model.
    #[default]
    Auto,
}

/// What placement optimises when it has a choice of Macs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    #[default]
    Latency,
    Throughput,
}

/// How many Macs the service may span.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct NodeRange {
    /// The fewest Macs to use.
    #[serde(default = "common::one")]
    pub min: u32,
    /// The most Macs to use (no limit when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
}

impl Default for NodeRange {
    fn default() -> Self {
        NodeRange { min: 1, max: None }
    }
}

impl NodeRange {
    pub(crate) fn check(&self) -> CheckResult {
        if self.min == 0 {
            return Err(ValidationError::new("min", "must be at least 1"));
        }
        match self.max {
            Some(max) if max < self.min => Err(ValidationError::new(
                "max",
                format!("must be at least min ({}), got {max}", self.min),
            )),
            _ => Ok(()),
        }
    }
}

/// Where the service listens.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct Endpoint {
    /// TCP port of the OpenAI-compatible endpoint, 1-65535 (tb picks one when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

/// A LoRA adapter the built-in engine applies to the model: a PEFT directory
/// (`adapter_config.json` + `adapter_model.safetensors`) given by `path`, or the adapter a
/// finished built-in fine-tune wrote, given by `trainingJob`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct AdapterRef {
    /// Absolute path of a PEFT adapter directory; each rank reads it as the job's account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The Node that holds `path`: ranks on other Macs fetch the adapter from it (it must be
    /// readable by every account there). When absent every Mac reads `path` itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// A finished built-in fine-tune (TrainingJob) in the same namespace whose adapter to serve,
    /// instead of `path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training_job: Option<String>,
}

impl AdapterRef {
    pub(crate) fn check(&self) -> CheckResult {
        match (&self.path, &self.training_job) {
            (None, None) => {
                return Err(ValidationError::new(
                    "path",
                    "required: a PEFT adapter directory (or give trainingJob instead)",
                ));
            }
            (Some(_), Some(_)) => {
                return Err(ValidationError::new(
                    "trainingJob",
                    "give path or trainingJob, not both",
                ));
            }
            _ => {}
        }
        if let Some(path) = &self.path {
            crate::validate::validate_manifest_dir(path)
                .map_err(|m| ValidationError::new("path", m))?;
        }
        if self.node.is_some() && self.path.is_none() {
            return Err(ValidationError::new(
                "node",
                "only used with path (a fine-tune's adapter is found where it was written)",
            ));
        }
        common::optional_object_name("node", self.node.as_deref())?;
        common::optional_object_name("trainingJob", self.training_job.as_deref())
    }
}

fn builtin() -> Executor {
    Executor::Builtin
}

/// Serves a Model on one or more Macs behind an OpenAI-compatible endpoint; re-placed when a Mac
/// fails.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct InferenceServiceSpec {
    /// Name of the Model to serve, in the same namespace.
    pub model: String,
    /// pipeline (layers split along a chain of Macs), tensor (every layer split; needs RDMA) or
    /// auto.
    #[serde(default)]
    pub parallelism: Parallelism,
    /// How many Macs the service may span.
    #[serde(default)]
    pub nodes: NodeRange,
    /// Tokens of context to reserve KV-cache memory for (the model's full context when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<u32>,
    /// Concurrent sequences to reserve KV-cache memory for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u32>,
    /// builtin (tb's engine runs the model) or exec (tb runs command).
    #[serde(default = "builtin")]
    pub executor: Executor,
    /// Program and arguments to run on each Mac (exec only); found as a TrainingJob's command is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-explain-note" = "required with exec"))]
    pub command: Vec<String>,
    /// Extra environment variables; TB_* are set by tb.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Memory each rank needs (exec only; built-in services are sized from the Model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// Where the service listens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<Endpoint>,
    /// Only place on Nodes carrying all these labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// The Queue whose quota this service counts against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Order within the queue; higher first, may preempt lower. At most the queue's maxPriority (0
    /// outside a queue); a higher value is refused at apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-explain-note" = "default: the queue's priority"))]
    pub priority: Option<i32>,
    /// What placement optimises: latency or throughput.
    #[serde(default)]
    pub objective: Objective,
    /// A LoRA adapter applied to the model (builtin only): {path: DIR} or {trainingJob: NAME}.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<AdapterRef>,
}

impl Default for InferenceServiceSpec {
    fn default() -> Self {
        InferenceServiceSpec {
            model: String::new(),
            parallelism: Parallelism::default(),
            nodes: NodeRange::default(),
            context: None,
            batch: None,
            executor: builtin(),
            command: Vec::new(),
            env: BTreeMap::new(),
            memory: None,
            endpoint: None,
            node_selector: BTreeMap::new(),
            queue: None,
            priority: None,
            objective: Objective::default(),
            adapter: None,
        }
    }
}

impl InferenceServiceSpec {
    pub(crate) fn check(&self) -> CheckResult {
        common::object_name("model", &self.model)?;
        self.nodes.check().map_err(|e| e.under("nodes"))?;
        common::at_least_one("context", self.context)?;
        common::at_least_one("batch", self.batch)?;
        common::command("command", self.executor, &self.command)?;
        common::env("env", &self.env)?;
        common::non_zero_quantity("memory", self.memory.as_ref())?;
        if let Some(Endpoint { port: Some(0) }) = self.endpoint {
            return Err(ValidationError::new(
                "endpoint.port",
                "must be between 1 and 65535 (leave it out to let tb choose)",
            ));
        }
        common::node_selector("nodeSelector", &self.node_selector)?;
        common::optional_object_name("queue", self.queue.as_deref())?;
        if let Some(adapter) = &self.adapter {
            if self.executor != Executor::Builtin {
                return Err(ValidationError::new(
                    "adapter",
                    "only the builtin executor applies adapters; an exec service loads its own",
                ));
            }
            adapter.check().map_err(|e| e.under("adapter"))?;
        }
        Ok(())
    }
}
