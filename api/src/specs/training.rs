//! TrainingJob: a gang-scheduled run to completion (fine-tuning, evaluation, any MLX program).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::common::{self, CheckResult, Executor};
use super::finetune::FineTuneSpec;
use crate::quantity::Quantity;
use crate::validate::ValidationError;

/// More ranks than this is a typo, not a job: no lab has that many Macs.
pub const MAX_RANKS: u32 = 1024;

/// What `backoffLimit` means when it is left out.
pub const DEFAULT_BACKOFF_LIMIT: u32 = 3;

/// The MLX distributed backend the ranks talk over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// TCP ring; works on any network.
    #[default]
    Ring,
    /// RDMA over Thunderbolt, fully connected.
    Jaccl,
    /// RDMA over Thunderbolt along a ring of links.
    JacclRing,
}

impl Backend {
    /// The name MLX uses ("ring", "jaccl", "jaccl-ring").
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ring => "ring",
            Self::Jaccl => "jaccl",
            Self::JacclRing => "jaccl-ring",
        }
    }

    /// RDMA over Thunderbolt, in either shape.
    pub fn is_jaccl(self) -> bool {
        matches!(self, Self::Jaccl | Self::JacclRing)
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the ranks share the work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TrainingParallelism {
    /// Every rank holds the whole model and all-reduces gradients.
    #[default]
    Data,
    /// Ranks hold consecutive layers.
    Pipeline,
    Auto,
}

/// Where and how often a job saves its progress, so a retry resumes instead of restarting.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct Checkpoints {
    /// Directory the job saves checkpoints in and resumes from.
    pub dir: String,
    /// Save every this many steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_steps: Option<u64>,
}

fn exec() -> Executor {
    Executor::Exec
}

/// Runs ranks of a program together to completion (fine-tuning); all ranks or none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct TrainingJobSpec {
    /// Name of the Model to train, in the same namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-explain-note" = "required with builtin"))]
    pub model: Option<String>,
    /// A path or URL the program understands. builtin: a JSONL file on the ranks' Macs; a
    /// relative path is looked for in the directory of the applied manifest (annotation
    /// tb/manifest-dir), then the rank's working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
    /// builtin: the Node that holds `dataset` (an absolute path there). A rank on that Node
    /// reads the file; a rank on another Mac fetches from that Node's nodelet only the
    /// examples it trains and evaluates on. Absent: every rank reads `dataset` on its own Mac.
    /// The file must be readable by every account on the holder (o+r, directories o+x).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset_node: Option<String>,
    /// Passed to the program (builtin: learning rate, steps, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hyperparameters: BTreeMap<String, Value>,
    /// builtin (tb's engine runs the model) or exec (tb runs command).
    #[serde(default = "exec")]
    pub executor: Executor,
    /// Program and arguments each rank runs. `python` and `python3` run the nodelet's --python
    /// (TB_PYTHON) when it has one, else the first on the PATH (env.PATH, else the nodelet's).
    /// A relative program or script (`python3 train.py`) is looked for in the working
    /// directory, then in the directory of the manifest `tbctl apply -f` read (annotation
    /// tb/manifest-dir) if the Mac has that directory; a rank that finds it nowhere fails with
    /// ExecNotFound, listing every path tried.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-explain-note" = "required with exec"))]
    pub command: Vec<String>,
    /// Extra environment variables; TB_RANK, TB_WORLD_SIZE and the other TB_* are set by tb.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Directory the command runs in, and the first place a relative program or script is
    /// looked for. Absolute: used as is (a single-user nodelet makes it; under per-namespace
    /// accounts it must exist and be enterable by the job's account). Relative: made under the
    /// rank's own work dir (no '..'). Default: that work dir (the rank's HOME) under the
    /// nodelet's data dir.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// Processes started together, all or none (gang scheduling).
    #[serde(default = "common::one")]
    pub ranks: u32,
    /// Memory each rank needs, e.g. 48Gi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// MLX distributed backend: ring (TCP), jaccl (RDMA, fully connected) or jaccl-ring (RDMA
    /// ring).
    #[serde(default)]
    pub backend: Backend,
    /// data (each rank holds the model), pipeline (ranks hold consecutive layers) or auto.
    #[serde(default)]
    pub parallelism: TrainingParallelism,
    /// Retries before the job is marked Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = DEFAULT_BACKOFF_LIMIT))]
    pub backoff_limit: Option<u32>,
    /// Stop the job and mark it Failed after this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<u64>,
    /// Delete the finished job after this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<u64>,
    /// Where and how often the job saves progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoints: Option<Checkpoints>,
    /// Only place ranks on Nodes carrying all these labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// The Queue whose quota this job counts against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Order within the queue; higher first, may preempt lower. At most the queue's maxPriority (0
    /// outside a queue); a higher value is refused at apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-explain-note" = "default: the queue's priority"))]
    pub priority: Option<i32>,
    /// Give each rank a Mac of its own.
    #[serde(default)]
    pub exclusive: bool,
    /// What tb's built-in trainer does (LoRA, optimiser, steps, evaluation, output); required
    /// with executor builtin, refused with exec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-explain-note" = "required with builtin"))]
    pub finetune: Option<FineTuneSpec>,
}

impl Default for TrainingJobSpec {
    fn default() -> Self {
        TrainingJobSpec {
            model: None,
            dataset: None,
            dataset_node: None,
            hyperparameters: BTreeMap::new(),
            executor: exec(),
            command: Vec::new(),
            env: BTreeMap::new(),
            working_dir: None,
            ranks: 1,
            memory: None,
            backend: Backend::default(),
            parallelism: TrainingParallelism::default(),
            backoff_limit: None,
            active_deadline_seconds: None,
            ttl_seconds_after_finished: None,
            checkpoints: None,
            node_selector: BTreeMap::new(),
            queue: None,
            priority: None,
            exclusive: false,
            finetune: None,
        }
    }
}

impl TrainingJobSpec {
    /// Retries allowed, with the default filled in.
    pub fn backoff_limit(&self) -> u32 {
        self.backoff_limit.unwrap_or(DEFAULT_BACKOFF_LIMIT)
    }

    pub(crate) fn check(&self) -> CheckResult {
        common::optional_object_name("model", self.model.as_deref())?;
        if self.executor == Executor::Builtin && self.model.is_none() {
            return Err(ValidationError::new(
                "model",
                "required when executor is builtin: the Model to fine-tune",
            ));
        }
        common::not_blank("dataset", self.dataset.as_deref())?;
        if let Some(node) = &self.dataset_node {
            common::optional_object_name("datasetNode", Some(node))?;
            if self.executor != Executor::Builtin {
                return Err(ValidationError::new(
                    "datasetNode",
                    "only used when executor is builtin (an exec job's program reads its own data)",
                ));
            }
            if !self.dataset.as_deref().is_some_and(|d| d.starts_with('/')) {
                return Err(ValidationError::new(
                    "dataset",
                    "must be an absolute path on datasetNode when datasetNode is set",
                ));
            }
        }
        common::command("command", self.executor, &self.command)?;
        common::env("env", &self.env)?;
        common::not_blank("workingDir", self.working_dir.as_deref())?;
        if self.ranks == 0 {
            return Err(ValidationError::new("ranks", "must be at least 1"));
        }
        if self.ranks > MAX_RANKS {
            return Err(ValidationError::new(
                "ranks",
                format!("must be at most {MAX_RANKS}, got {}", self.ranks),
            ));
        }
        common::non_zero_quantity("memory", self.memory.as_ref())?;
        common::at_least_one("activeDeadlineSeconds", self.active_deadline_seconds)?;
        if let Some(checkpoints) = &self.checkpoints {
            if checkpoints.dir.trim().is_empty() {
                return Err(ValidationError::new(
                    "checkpoints.dir",
                    "must not be empty: the directory to save checkpoints in",
                ));
            }
            common::at_least_one("checkpoints.everySteps", checkpoints.every_steps)?;
        }
        common::node_selector("nodeSelector", &self.node_selector)?;
        common::optional_object_name("queue", self.queue.as_deref())?;
        match (self.executor, &self.finetune) {
            (Executor::Builtin, None) => Err(ValidationError::new(
                "finetune",
                "required when executor is builtin: what to train (e.g. finetune: {method: lora, \
                 steps: 100})",
            )),
            (Executor::Exec, Some(_)) => Err(ValidationError::new(
                "finetune",
                "only used when executor is builtin; remove it or set executor: builtin",
            )),
            (Executor::Builtin, Some(f)) => {
                if self.dataset.is_none() {
                    return Err(ValidationError::new(
                        "dataset",
                        "required when executor is builtin: the JSONL file to train on",
                    ));
                }
                if self.parallelism == TrainingParallelism::Pipeline {
                    return Err(ValidationError::new(
                        "parallelism",
                        "the built-in trainer is data parallel: every rank holds the whole model \
                         (use data)",
                    ));
                }
                f.check("finetune", self.ranks)
            }
            (Executor::Exec, None) => Ok(()),
        }
    }
}
