//! The `finetune:` section of a built-in TrainingJob: what tb's own trainer (`tb-train`) does
//! with the Model and the dataset — LoRA, its optimiser, its schedule, evaluation and where the
//! adapter goes. Defaults follow `mlx_lm.lora` where it has one.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::CheckResult;
use crate::validate::ValidationError;

/// LoRA rank above this is a typo: it would be a full fine-tune of most layers.
pub const MAX_LORA_RANK: u32 = 1024;
/// More optimiser steps than this is a typo, not a job.
pub const MAX_STEPS: u64 = 10_000_000;
/// More passes over the dataset than this is a typo.
pub const MAX_EPOCHS: u32 = 100_000;
/// Examples per optimiser step, over all ranks.
pub const MAX_BATCH_SIZE: u32 = 65_536;
/// Tokens per example.
pub const MAX_SEQUENCE_LENGTH: u32 = 1 << 20;
/// Micro-batches per step and rank.
pub const MAX_ACCUMULATION: u32 = 4096;

/// Steps when neither `steps` nor `epochs` is given (mlx_lm.lora's `--iters`).
pub const DEFAULT_STEPS: u64 = 1000;

/// How the model is fine-tuned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FineTuneMethod {
    /// Low-rank adapters on the chosen projections; the base weights stay frozen.
    #[default]
    Lora,
}

/// A projection of each transformer block that LoRA adapts.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum LoraTarget {
    /// Attention query.
    Q,
    /// Attention key.
    K,
    /// Attention value.
    V,
    /// Attention output.
    O,
    /// MLP gate.
    Gate,
    /// MLP up.
    Up,
    /// MLP down.
    Down,
}

impl LoraTarget {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Q => "q",
            Self::K => "k",
            Self::V => "v",
            Self::O => "o",
            Self::Gate => "gate",
            Self::Up => "up",
            Self::Down => "down",
        }
    }
}

/// How the learning rate moves over the run (after the warm-up).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LrSchedule {
    /// Stays at learningRate.
    #[default]
    Constant,
    /// Falls from learningRate to zero along half a cosine.
    Cosine,
}

fn default_rank() -> u32 {
    8
}
fn default_alpha() -> f64 {
    16.0
}
fn default_targets() -> Vec<LoraTarget> {
    vec![LoraTarget::Q, LoraTarget::V]
}
fn default_batch_size() -> u32 {
    4
}
fn default_sequence_length() -> u32 {
    2048
}
fn default_learning_rate() -> f64 {
    1e-5
}
fn default_accumulation() -> u32 {
    1
}
fn default_eval_every() -> u64 {
    200
}
fn default_eval_fraction() -> f64 {
    0.1
}

/// The low-rank adapters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct LoraSpec {
    /// Rank of each adapter (the inner width of B·A), 1 to 1024.
    #[serde(default = "default_rank")]
    #[schemars(extend("default" = 8))]
    pub rank: u32,
    /// Scale numerator: the update is (alpha / rank)·B·A.
    #[serde(default = "default_alpha")]
    #[schemars(extend("default" = 16.0))]
    pub alpha: f64,
    /// Dropout on the adapters' input while training, from 0 to below 1.
    #[serde(default)]
    pub dropout: f64,
    /// Projections adapted in every block: q, k, v, o, gate, up, down.
    #[serde(default = "default_targets")]
    #[schemars(extend("x-explain-note" = "default: [q, v]"))]
    pub targets: Vec<LoraTarget>,
}

impl Default for LoraSpec {
    fn default() -> Self {
        LoraSpec {
            rank: default_rank(),
            alpha: default_alpha(),
            dropout: 0.0,
            targets: default_targets(),
        }
    }
}

/// What the built-in trainer does: `dataset` is a JSONL file on the ranks' Macs (a relative
/// path is looked for in the manifest's directory, then the working directory); each line is
/// `{"messages": [...]}` (chat, loss on the assistant turns), `{"prompt": ..., "completion":
/// ...}` (loss on the completion) or `{"text": ...}` (loss on all of it). The last
/// `evalFraction` of the lines is held out for evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct FineTuneSpec {
    /// lora (the only method so far).
    #[serde(default)]
    pub method: FineTuneMethod,
    /// The adapters: rank, alpha, dropout, targets.
    #[serde(default)]
    pub lora: LoraSpec,
    /// Optimiser steps to run (default 1000 when epochs is not given either).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u64>,
    /// Passes over the training split instead of steps: steps = ceil(epochs × examples /
    /// batchSize).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs: Option<u32>,
    /// Examples per optimiser step over all ranks (the global batch); each rank takes every
    /// ranks-th of them. At least ranks.
    #[serde(default = "default_batch_size")]
    #[schemars(extend("default" = 4))]
    pub batch_size: u32,
    /// Most tokens per example; a longer example fails the job, naming its line.
    #[serde(default = "default_sequence_length")]
    #[schemars(extend("default" = 2048))]
    pub sequence_length: u32,
    /// Peak learning rate of AdamW.
    #[serde(default = "default_learning_rate")]
    #[schemars(extend("default" = 1e-5))]
    pub learning_rate: f64,
    /// Steps over which the learning rate rises linearly from zero.
    #[serde(default)]
    pub warmup_steps: u64,
    /// constant or cosine (to zero at the last step).
    #[serde(default)]
    pub schedule: LrSchedule,
    /// AdamW's decoupled weight decay.
    #[serde(default)]
    pub weight_decay: f64,
    /// Clip the gradients' global norm to this (no clipping when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_clip: Option<f64>,
    /// Micro-batches each rank splits its share of a step into (less memory, same result).
    #[serde(default = "default_accumulation")]
    #[schemars(extend("default" = 1))]
    pub accumulation: u32,
    /// Seeds the adapters' initialisation and the batches' order: the same seed, data and
    /// global batch give the same adapter on any number of ranks.
    #[serde(default)]
    pub seed: u64,
    /// Evaluate on the held-out split every this many steps (and at the end).
    #[serde(default = "default_eval_every")]
    #[schemars(extend("default" = 200))]
    pub eval_every: u64,
    /// Share of the dataset's lines (the last ones) held out for evaluation, 0 to 0.5.
    #[serde(default = "default_eval_fraction")]
    #[schemars(extend("default" = 0.1))]
    pub eval_fraction: f64,
    /// Directory rank 0 writes the PEFT adapter to (adapter_config.json,
    /// adapter_model.safetensors); relative to the rank's working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-explain-note" = "default: adapter"))]
    pub output: Option<String>,
}

impl Default for FineTuneSpec {
    fn default() -> Self {
        FineTuneSpec {
            method: FineTuneMethod::default(),
            lora: LoraSpec::default(),
            steps: None,
            epochs: None,
            batch_size: default_batch_size(),
            sequence_length: default_sequence_length(),
            learning_rate: default_learning_rate(),
            warmup_steps: 0,
            schedule: LrSchedule::default(),
            weight_decay: 0.0,
            grad_clip: None,
            accumulation: default_accumulation(),
            seed: 0,
            eval_every: default_eval_every(),
            eval_fraction: default_eval_fraction(),
            output: None,
        }
    }
}

/// Where the adapter goes when `output` is left out (under the rank's working directory).
pub const DEFAULT_OUTPUT: &str = "adapter";

impl FineTuneSpec {
    /// The output directory, with the default filled in.
    pub fn output(&self) -> &str {
        self.output.as_deref().unwrap_or(DEFAULT_OUTPUT)
    }

    /// Fixed steps (None: computed from epochs once the dataset is read).
    pub fn fixed_steps(&self) -> Option<u64> {
        match (self.steps, self.epochs) {
            (Some(s), _) => Some(s),
            (None, Some(_)) => None,
            (None, None) => Some(DEFAULT_STEPS),
        }
    }

    /// Checks every field; `at` is the section's path (`finetune`), `ranks` the job's.
    pub(crate) fn check(&self, at: &str, ranks: u32) -> CheckResult {
        let err = |field: &str, message: String| {
            Err(ValidationError::new(format!("{at}.{field}"), message))
        };
        let l = &self.lora;
        if l.rank == 0 || l.rank > MAX_LORA_RANK {
            return err(
                "lora.rank",
                format!("must be from 1 to {MAX_LORA_RANK}, got {}", l.rank),
            );
        }
        if !(l.alpha.is_finite() && l.alpha > 0.0 && l.alpha <= 1e6) {
            return err(
                "lora.alpha",
                format!("must be above 0 and at most 1e6, got {}", l.alpha),
            );
        }
        if !(l.dropout.is_finite() && (0.0..1.0).contains(&l.dropout)) {
            return err(
                "lora.dropout",
                format!("must be from 0 to below 1, got {}", l.dropout),
            );
        }
        if l.targets.is_empty() {
            return err(
                "lora.targets",
                "must name at least one of q, k, v, o, gate, up, down".into(),
            );
        }
        for (i, t) in l.targets.iter().enumerate() {
            if l.targets[..i].contains(t) {
                return err(
                    &format!("lora.targets[{i}]"),
                    format!("{} is listed twice", t.as_str()),
                );
            }
        }
        match (self.steps, self.epochs) {
            (Some(_), Some(_)) => {
                return err("epochs", "give steps or epochs, not both".into());
            }
            (Some(s), None) if s == 0 || s > MAX_STEPS => {
                return err("steps", format!("must be from 1 to {MAX_STEPS}, got {s}"));
            }
            (None, Some(e)) if e == 0 || e > MAX_EPOCHS => {
                return err("epochs", format!("must be from 1 to {MAX_EPOCHS}, got {e}"));
            }
            _ => {}
        }
        if self.batch_size == 0 || self.batch_size > MAX_BATCH_SIZE {
            return err(
                "batchSize",
                format!(
                    "must be from 1 to {MAX_BATCH_SIZE}, got {}",
                    self.batch_size
                ),
            );
        }
        if self.batch_size < ranks {
            return err(
                "batchSize",
                format!(
                    "is the global batch and must be at least ranks ({ranks}), got {}: every \
                     rank takes a share",
                    self.batch_size
                ),
            );
        }
        if self.sequence_length < 2 || self.sequence_length > MAX_SEQUENCE_LENGTH {
            return err(
                "sequenceLength",
                format!(
                    "must be from 2 to {MAX_SEQUENCE_LENGTH} tokens, got {}",
                    self.sequence_length
                ),
            );
        }
        if !(self.learning_rate.is_finite()
            && self.learning_rate > 0.0
            && self.learning_rate <= 1.0)
        {
            return err(
                "learningRate",
                format!("must be above 0 and at most 1, got {}", self.learning_rate),
            );
        }
        if let Some(steps) = self.fixed_steps()
            && self.warmup_steps > steps
        {
            return err(
                "warmupSteps",
                format!(
                    "must be at most the steps ({steps}), got {}",
                    self.warmup_steps
                ),
            );
        }
        if self.warmup_steps > MAX_STEPS {
            return err(
                "warmupSteps",
                format!("must be at most {MAX_STEPS}, got {}", self.warmup_steps),
            );
        }
        if !(self.weight_decay.is_finite() && (0.0..=1.0).contains(&self.weight_decay)) {
            return err(
                "weightDecay",
                format!("must be from 0 to 1, got {}", self.weight_decay),
            );
        }
        if let Some(c) = self.grad_clip
            && !(c.is_finite() && c > 0.0 && c <= 1e6)
        {
            return err(
                "gradClip",
                format!("must be above 0 and at most 1e6, got {c}"),
            );
        }
        if self.accumulation == 0 || self.accumulation > MAX_ACCUMULATION {
            return err(
                "accumulation",
                format!(
                    "must be from 1 to {MAX_ACCUMULATION}, got {}",
                    self.accumulation
                ),
            );
        }
        if self.eval_every == 0 || self.eval_every > MAX_STEPS {
            return err(
                "evalEvery",
                format!("must be from 1 to {MAX_STEPS}, got {}", self.eval_every),
            );
        }
        if !(self.eval_fraction.is_finite() && (0.0..=0.5).contains(&self.eval_fraction)) {
            return err(
                "evalFraction",
                format!("must be from 0 to 0.5, got {}", self.eval_fraction),
            );
        }
        if let Some(o) = &self.output {
            if o.trim().is_empty() {
                return err(
                    "output",
                    "must not be empty (leave it out for the default)".into(),
                );
            }
            if o.contains('\0') || o.len() > 4096 {
                return err("output", "must be a path of at most 4096 bytes".into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path_of(spec: &FineTuneSpec, ranks: u32) -> String {
        spec.check("finetune", ranks).unwrap_err().path
    }

    #[test]
    fn every_bound_names_its_field() {
        let ok = FineTuneSpec::default();
        assert!(ok.check("finetune", 1).is_ok());
        let mut s = ok.clone();
        s.lora.rank = 2048;
        assert_eq!(path_of(&s, 1), "finetune.lora.rank");
        let mut s = ok.clone();
        s.lora.targets = vec![LoraTarget::Q, LoraTarget::Q];
        assert_eq!(path_of(&s, 1), "finetune.lora.targets[1]");
        let mut s = ok.clone();
        s.steps = Some(MAX_STEPS + 1);
        assert_eq!(path_of(&s, 1), "finetune.steps");
        let mut s = ok.clone();
        s.steps = Some(10);
        s.epochs = Some(1);
        assert_eq!(path_of(&s, 1), "finetune.epochs");
        let mut s = ok.clone();
        s.batch_size = 2;
        assert_eq!(path_of(&s, 4), "finetune.batchSize");
        let mut s = ok.clone();
        s.learning_rate = f64::NAN;
        assert_eq!(path_of(&s, 1), "finetune.learningRate");
        let mut s = ok.clone();
        s.steps = Some(10);
        s.warmup_steps = 11;
        assert_eq!(path_of(&s, 1), "finetune.warmupSteps");
        let mut s = ok.clone();
        s.eval_fraction = 0.9;
        assert_eq!(path_of(&s, 1), "finetune.evalFraction");
        let mut s = ok.clone();
        s.grad_clip = Some(0.0);
        assert_eq!(path_of(&s, 1), "finetune.gradClip");
        let mut s = ok;
        s.output = Some(" ".into());
        assert_eq!(path_of(&s, 1), "finetune.output");
    }

    #[test]
    fn steps_default_unless_epochs_are_given() {
        let mut s = FineTuneSpec::default();
        assert_eq!(s.fixed_steps(), Some(DEFAULT_STEPS));
        s.epochs = Some(2);
        assert_eq!(s.fixed_steps(), None);
        assert_eq!(s.output(), DEFAULT_OUTPUT);
    }
}
