//! Allocation: one rank of a job, placed on one Mac. The scheduler creates allocations (all
//! ranks of a job or none), the nodelet of that Mac runs them and writes their status.
//!
//! An allocation never moves: re-placing a job creates new allocations with a higher `epoch`,
//! and a nodelet stops any process whose allocation is gone or marked `desired: stop` — so a
//! Mac that was cut off and comes back cannot run stale ranks beside their replacements.

use std::collections::BTreeMap;

use crate::timestamp::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{CheckResult, Executor};
use super::training::Backend;
use crate::validate::ValidationError;

/// Labels every allocation carries, so a nodelet can watch its own and a job find its ranks.
pub const LABEL_JOB: &str = "tb/job";
pub const LABEL_JOB_KIND: &str = "tb/job-kind";
pub const LABEL_NODE: &str = "tb/node";

/// The absolute directory of the manifest a job was applied from (`tbctl apply -f FILE` records
/// it), copied onto the job's allocations: a relative program in an exec job's command is looked
/// for there (after the working directory) when that directory exists on the rank's Mac.
pub const ANNOTATION_MANIFEST_DIR: &str = "tb/manifest-dir";

/// What the scheduler wants of the allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Desired {
    #[default]
    Run,
    /// Stop the process (SIGTERM, grace, SIGKILL) and report how it ended.
    Stop,
}

/// The job an allocation belongs to (same namespace).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct JobRef {
    /// TrainingJob or InferenceService.
    pub kind: String,
    /// The job's name (same namespace).
    pub name: String,
    /// The job's uid, telling apart jobs that reused a name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
}

/// How the ranks find each other through MLX's distributed backends.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct MlxAssignment {
    /// ring, jaccl or jaccl-ring.
    pub backend: Backend,
    /// ip:port each rank listens on, in rank order (= ring order).
    pub hosts: Vec<String>,
    /// Rank 0's ip:port for JACCL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinator: Option<String>,
    /// JACCL's device matrix: row i, column j = RDMA device on rank i cabled to rank j.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ibv_devices: Option<Vec<Vec<Option<String>>>>,
}

/// What a rank of the built-in executor runs: its share of a model, and where the other
/// ranks of the pipeline are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct BuiltinAssignment {
    /// The Model object's name (also the model id the endpoint serves).
    pub model: String,
    /// The weights file, as the Model's `source.path` names it.
    pub model_path: String,
    /// Each rank's data-plane IP, in rank order (= pipeline order).
    pub hosts: Vec<String>,
    /// Rank 0's bootstrap coordinator, `ip:port`.
    pub coordinator: String,
    /// The port rank 0 serves the OpenAI-compatible API on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_port: Option<u16>,
    /// Tokens of context each sequence may use (the model's own when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<u32>,
    /// Sequences served at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u32>,
    /// Where to stage the weights from when this node does not hold the file: the probe
    /// servers (`ip:port`) of nodes that do, a node's own first when it keeps a staged copy
    /// (empty: the file is at `modelPath` here).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<String>,
    /// After staging its shard, fetch the rest of the file too and keep the whole copy, which
    /// this node then serves to others: set while fewer than two nodes hold the file, so that
    /// losing one holder does not stop the model from being placed again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replicate: bool,
    /// The ranks are one stage split by tensor parallelism (each loads a slice of every
    /// block) instead of a pipeline.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tensor_parallel: bool,
    /// A built-in TrainingJob's dataset, as its spec names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
    /// Where this rank fetches its examples of `dataset` from (the holder's probe server,
    /// `host:port`), when the job names a `datasetNode` other than this rank's Node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset_source: Option<String>,
    /// A built-in TrainingJob's `finetune` section, as validated (the trainer's settings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finetune: Option<serde_json::Value>,
    /// The LoRA adapter the rank applies to its layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<AdapterAssignment>,
}

/// Where a rank finds its LoRA adapter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct AdapterAssignment {
    /// The PEFT directory, on the holder (or here when `source` is absent).
    pub path: String,
    /// The holder's probe server (`ip:port`) to fetch the adapter from; absent: the rank reads
    /// `path` on its own Mac.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// The model layers a rank holds: `[first, first + count)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct LayerRange {
    /// The first layer held, from 0.
    pub first: u32,
    /// How many consecutive layers.
    pub count: u32,
}

/// One rank of a job placed on one Mac; created by the scheduler, run by that Mac's nodelet.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct AllocationSpec {
    /// The job this rank belongs to.
    pub job: JobRef,
    /// The Node that runs it.
    pub node: String,
    /// This rank, from 0.
    pub rank: u32,
    /// How many ranks the job has.
    pub world_size: u32,
    /// Which placement of the job this is; bumped on every restart or re-placement.
    pub epoch: u64,
    /// run or stop: a nodelet stops processes whose allocation says stop or is gone.
    #[serde(default)]
    pub desired: Desired,
    /// Memory reserved on the node.
    #[serde(default)]
    pub memory_bytes: u64,
    /// builtin or exec.
    pub executor: Executor,
    /// The process to run (exec).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Environment beyond the TB_* and MLX_* variables tb sets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The job's workingDir: absolute, or relative to the allocation's work dir.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// The MLX distributed setup computed by the scheduler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlx: Option<MlxAssignment>,
    /// The model layers this rank holds, when placement split a model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<LayerRange>,
    /// What a rank of the built-in executor runs: the model, its file and the other ranks
    /// (builtin only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub builtin: Option<BuiltinAssignment>,
    /// Seconds between SIGTERM and SIGKILL.
    #[serde(default = "default_grace")]
    pub stop_grace_seconds: u64,
}

fn default_grace() -> u64 {
    10
}

impl AllocationSpec {
    pub(crate) fn check(&self) -> CheckResult {
        if self.world_size == 0 {
            return Err(ValidationError::new("worldSize", "must be at least 1"));
        }
        if self.rank >= self.world_size {
            return Err(ValidationError::new(
                "rank",
                format!("{} is not below worldSize {}", self.rank, self.world_size),
            ));
        }
        if self.node.trim().is_empty() {
            return Err(ValidationError::new("node", "must name a Node"));
        }
        if self.executor == Executor::Builtin && self.builtin.is_none() {
            return Err(ValidationError::new(
                "builtin",
                "the built-in executor needs its model assignment",
            ));
        }
        if self.executor == Executor::Exec && self.command.is_empty() {
            return Err(ValidationError::new(
                "command",
                "the exec executor needs a command",
            ));
        }
        Ok(())
    }
}

/// Where an allocation's process is in its life. Written by the nodelet, and by the
/// controller only for `Lost` (the node stopped answering).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AllocationPhase {
    #[default]
    Pending,
    Running,
    Succeeded,
    Failed,
    /// Stopped on request (`desired: stop`).
    Stopped,
    /// Its node stopped answering; the process may still exist, fenced by the epoch.
    Lost,
}

impl AllocationPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            AllocationPhase::Pending => "Pending",
            AllocationPhase::Running => "Running",
            AllocationPhase::Succeeded => "Succeeded",
            AllocationPhase::Failed => "Failed",
            AllocationPhase::Stopped => "Stopped",
            AllocationPhase::Lost => "Lost",
        }
    }

    pub fn is_terminal(self) -> bool {
        !matches!(self, AllocationPhase::Pending | AllocationPhase::Running)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocationStatus {
    #[serde(default)]
    pub phase: AllocationPhase,
    /// CamelCase cause, e.g. `ExecNotFound`, `Error`, `NodeLost`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(
        default,
        with = "crate::timestamp::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub started_at: Option<Timestamp>,
    #[serde(
        default,
        with = "crate::timestamp::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub finished_at: Option<Timestamp>,
    /// Where the rank serves requests (rank 0 of a built-in service), e.g. `http://ip:port/v1`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub endpoint: String,
    /// The endpoint has answered a request end to end through every stage.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ready: bool,
    /// Model staging: bytes of this rank's shard present and verified, of `stageBytes`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub staged_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stage_bytes: u64,
    /// Rank 0 of a built-in service: decode tokens/s its streams have seen of late.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_tokens_per_second: Option<f64>,
    /// Rank 0 of a built-in service: tokens its streams held in context, on average, while
    /// decoding at that rate (prompt plus half the generated tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_context_tokens: Option<u32>,
    /// Rank 0 of a built-in fine-tune: its progress (bounded; at most every few seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<crate::status::TrainingProgress>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl AllocationStatus {
    /// Reads a stored status; anything unreadable counts as Pending.
    pub fn from_value(v: &serde_json::Value) -> AllocationStatus {
        Self::deserialize(v).unwrap_or_default()
    }

    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// An allocation's name: job, epoch and rank, kept within DNS-1123's 253 characters.
pub fn allocation_name(job: &str, epoch: u64, rank: u32) -> String {
    let suffix = format!("-e{epoch}-r{rank}");
    let keep = 253usize.saturating_sub(suffix.len()).min(job.len());
    format!("{}{suffix}", &job[..keep])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_and_sort_by_epoch_then_rank() {
        assert_eq!(allocation_name("train", 3, 1), "train-e3-r1");
        assert!(allocation_name(&"a".repeat(300), 1, 0).len() <= 253);
    }

    #[test]
    fn status_round_trips_and_unknown_reads_as_pending() {
        let s = AllocationStatus {
            phase: AllocationPhase::Failed,
            exit_code: Some(1),
            reason: "Error".into(),
            ..Default::default()
        };
        assert_eq!(AllocationStatus::from_value(&s.to_value()), s);
        assert_eq!(
            AllocationStatus::from_value(&serde_json::json!("junk")).phase,
            AllocationPhase::Pending
        );
        assert!(AllocationPhase::Lost.is_terminal());
        assert!(!AllocationPhase::Running.is_terminal());
    }

    #[test]
    fn rank_must_be_below_world_size() {
        let spec = AllocationSpec {
            job: JobRef {
                kind: "TrainingJob".into(),
                name: "j".into(),
                uid: String::new(),
            },
            node: "mac1".into(),
            rank: 2,
            world_size: 2,
            epoch: 1,
            executor: Executor::Exec,
            command: vec!["true".into()],
            ..Default::default()
        };
        assert_eq!(spec.check().unwrap_err().path, "rank");
    }
}
