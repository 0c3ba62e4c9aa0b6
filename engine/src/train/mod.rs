//! LoRA fine-tuning of a llama-family GGUF model inside tb-engine.
//!
//! - [`model`]: the training model — base weights dequantised to f32 and frozen, LoRA A/B as
//!   candle `Var`s, a batched forward with the inference engine's math, the summed
//!   cross-entropy loss.
//! - [`ops`]: RMSNorm, softmax, RoPE written from differentiable primitives (candle 0.11's fused
//!   kernels have no backward) and a frozen linear layer with a hand-written backward.
//! - [`optim`]: AdamW, the warm-up + cosine schedule, global-norm clipping.
//! - [`trainer`]: [`LoraTrainer`], model + gradient buffers + optimizer + step, and the
//!   checkpoints of [`checkpoint`].
//! - [`data`]: JSONL datasets (chat `messages`, `prompt`/`completion`, `text`), loss masks,
//!   deterministic batches for data-parallel ranks, the held-out split.
//! - [`Trainer`]: a [`LoraTrainer`] over a GGUF file, with its tokenizer and chat template —
//!   what the nodelet's training runner drives.
//!
//! A step of data-parallel training: every rank calls [`Trainer::accumulate`] on its share of
//! the global batch (once or several times), the ranks all-reduce (sum)
//! [`Trainer::gradients_flat`] and the [`StepLoss`] token counts, each sets the sum back with
//! [`Trainer::set_gradients_flat`], and calls [`Trainer::apply`] with the global token count:
//! losses and gradients are sums, so dividing once by the global count makes the update that
//! of the whole batch on one machine.

pub mod checkpoint;
pub mod data;
pub mod load;
pub mod model;
pub mod ops;
pub mod optim;
pub mod rng;
pub mod trainer;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};

use crate::adapter::{Adapter, LoraConfig};
use crate::chat::ChatTemplate;
use crate::error::EngineError;
use crate::gguf::{GgufIndex, ModelConfig};
use crate::tokenizer::Tokenizer;

pub use model::{BaseWeights, BlockWeights, LoraModel};
pub use trainer::LoraTrainer;

/// Hyper-parameters of a fine-tuning run.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    pub lora: LoraConfig,
    /// Peak learning rate.
    pub learning_rate: f64,
    /// Steps of linear warm-up from lr/warmup_steps to the peak.
    pub warmup_steps: u64,
    /// Steps of the whole run (the cosine decay ends here).
    pub total_steps: u64,
    /// The learning rate decays to `learning_rate · min_lr_ratio`.
    pub min_lr_ratio: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Clip the global gradient norm to this.
    pub grad_clip: Option<f64>,
    /// Seeds A's initialisation and LoRA dropout.
    pub seed: u64,
}

impl TrainConfig {
    /// Common defaults (PEFT/mlx-lm-like) for `lora`: lr 1e-4, no warm-up, 1000 steps, floor
    /// 0.1, weight decay 0, betas (0.9, 0.999), eps 1e-8, clip 1.0, seed 0.
    pub fn new(lora: LoraConfig) -> Self {
        Self {
            lora,
            learning_rate: 1e-4,
            warmup_steps: 0,
            total_steps: 1000,
            min_lr_ratio: 0.1,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            grad_clip: Some(1.0),
            seed: 0,
        }
    }

    /// Checks every field, naming the first that is wrong.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, expected: &str, got: String| {
            Err(TrainError::Config {
                detail: format!("{field} is {got}; expected {expected}"),
            })
        };
        let l = &self.lora;
        if l.rank == 0 || l.rank > crate::adapter::MAX_RANK {
            return bad(
                "lora.rank",
                &format!("1..={}", crate::adapter::MAX_RANK),
                l.rank.to_string(),
            );
        }
        if !(l.alpha.is_finite() && l.alpha > 0.0) {
            return bad("lora.alpha", "a positive number", l.alpha.to_string());
        }
        if !(0.0..1.0).contains(&l.dropout) {
            return bad("lora.dropout", "in [0, 1)", l.dropout.to_string());
        }
        if l.targets.is_empty() {
            return bad("lora.targets", "at least one target", "empty".into());
        }
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0) {
            return bad(
                "learning_rate",
                "a positive number",
                self.learning_rate.to_string(),
            );
        }
        if self.total_steps == 0 {
            return bad("total_steps", "at least 1", "0".into());
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return bad("min_lr_ratio", "in [0, 1]", self.min_lr_ratio.to_string());
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad("weight_decay", ">= 0", self.weight_decay.to_string());
        }
        for (name, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return bad(name, "in [0, 1)", b.to_string());
            }
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return bad("eps", "a positive number", self.eps.to_string());
        }
        if let Some(c) = self.grad_clip
            && !(c.is_finite() && c > 0.0)
        {
            return bad("grad_clip", "a positive number", c.to_string());
        }
        Ok(())
    }
}

/// One training sequence: `loss_mask[i]` says token i is a target (predicted from tokens
/// ..i); `loss_mask[0]` is never used. Same length as `tokens`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    pub tokens: Vec<u32>,
    pub loss_mask: Vec<bool>,
}

impl Example {
    /// Targets of this example.
    pub fn target_count(&self) -> usize {
        self.loss_mask.iter().skip(1).filter(|&&m| m).count()
    }
}

/// Summed loss of a batch and how many target tokens it covered.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepLoss {
    pub loss_sum: f64,
    pub tokens: u64,
}

impl StepLoss {
    /// Mean loss per token (0 for no tokens).
    pub fn mean(&self) -> f64 {
        if self.tokens == 0 {
            0.0
        } else {
            self.loss_sum / self.tokens as f64
        }
    }
}

/// What [`Trainer::apply`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Applied {
    /// The learning rate of this step.
    pub lr: f64,
    /// The global gradient norm (of the per-token mean gradient) before clipping.
    pub grad_norm: f64,
}

/// Errors of training.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("training: {detail}")]
    Config { detail: String },
    #[error("checkpoint {path}: {detail}")]
    Checkpoint { path: PathBuf, detail: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Result with [`TrainError`].
pub type Result<T, E = TrainError> = std::result::Result<T, E>;

/// LoRA training of a GGUF model: a [`LoraTrainer`] plus the model's tokenizer and chat template.
#[derive(Debug)]
pub struct Trainer {
    core: LoraTrainer,
    tokenizer: Tokenizer,
    template: ChatTemplate,
}

impl Trainer {
    /// Loads the GGUF at `model` (every block, dequantised to f32 on `device`), its tokenizer
    /// and chat template, and fresh LoRA pairs for `cfg.lora`.
    pub fn load(model: &Path, cfg: TrainConfig, device: &Device) -> Result<Trainer> {
        cfg.validate()?;
        let index = GgufIndex::open(model)?;
        let tokenizer = Tokenizer::from_gguf(index.content())?;
        let template = ChatTemplate::from_gguf(index.content())?;
        let weights = load::base_weights(&index, device)?;
        let mut lora = cfg.lora.clone();
        if lora.base_model.is_empty() {
            lora.base_model = model
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
        }
        let lora_model =
            LoraModel::new(index.config(), weights, &lora, cfg.seed, DType::F32, device)?;
        let core = LoraTrainer::new(lora_model, cfg, &load::model_identity(&index))?;
        Ok(Trainer {
            core,
            tokenizer,
            template,
        })
    }

    pub fn model_config(&self) -> &ModelConfig {
        self.core.model().config()
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The model's chat template (for [`data::load_jsonl`]).
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// The training model (e.g. for greedy decoding through it).
    pub fn model(&self) -> &LoraModel {
        self.core.model()
    }

    /// The model-independent trainer.
    pub fn core(&self) -> &LoraTrainer {
        &self.core
    }

    /// Forward + backward of `batch`; adds its summed gradients to the buffers.
    pub fn accumulate(&mut self, batch: &[Example]) -> Result<StepLoss> {
        self.core.accumulate(batch)
    }

    /// The summed gradients so far, flat in a fixed order (block, target, A then B, row-major).
    pub fn gradients_flat(&self) -> Vec<f32> {
        self.core.gradients_flat()
    }

    /// Replaces the gradient buffers (e.g. with the all-reduced sum).
    pub fn set_gradients_flat(&mut self, g: &[f32]) -> Result<()> {
        self.core.set_gradients_flat(g)
    }

    /// Divides the gradients by `global_tokens`, clips, takes an AdamW step at lr(step),
    /// clears the gradients and advances the step.
    pub fn apply(&mut self, global_tokens: u64) -> Result<Applied> {
        self.core.apply(global_tokens)
    }

    /// Summed loss of `batch` without dropout or gradients.
    pub fn eval_loss(&self, batch: &[Example]) -> Result<StepLoss> {
        self.core.eval_loss(batch)
    }

    /// Optimizer steps taken.
    pub fn step(&self) -> u64 {
        self.core.step()
    }

    /// The adapter as trained so far (engine layout; save it with [`Adapter::save`]).
    pub fn adapter(&self) -> Result<Adapter> {
        self.core.adapter()
    }

    pub fn save_checkpoint(&self, dir: &Path) -> Result<()> {
        self.core.save_checkpoint(dir)
    }

    pub fn load_checkpoint(&mut self, dir: &Path) -> Result<()> {
        self.core.load_checkpoint(dir)
    }

    /// Trainable values.
    pub fn parameter_count(&self) -> usize {
        self.core.parameter_count()
    }

    /// Bytes held: frozen weights plus LoRA parameters, gradients and moments (activations
    /// come on top: see [`LoraTrainer::activation_bytes`]).
    pub fn memory_bytes(&self) -> u64 {
        self.core.memory_bytes()
    }
}
