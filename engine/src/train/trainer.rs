//! [`LoraTrainer`]: a [`LoraModel`] with its gradient buffers, AdamW state and step counter —
//! everything of training that does not need a tokenizer, so tests can drive a tiny model
//! built from tensors exactly as [`super::Trainer`] drives a GGUF.
//!
//! Gradients are summed (not averaged) over every target token passed to
//! [`LoraTrainer::accumulate`]; [`LoraTrainer::apply`] divides by the global token count, so
//! micro-batches and data-parallel ranks add up to the same update as one big batch. The flat
//! order of parameters and gradients is the pairs' (block, target) order, A then B, row-major.
//!
//! Dropout masks (when `lora.dropout > 0`) are drawn from (seed, step, micro-batch number
//! within the step), so they are reproducible for a fixed split of the batch; with dropout,
//! a different split gives different (equally valid) masks.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{DType, Tensor};
use sha2::{Digest, Sha256};

use crate::adapter::Adapter;

use super::model::{DropoutKey, LoraModel};
use super::optim::{AdamW, AdamWParams, global_norm, learning_rate};
use super::{Applied, Example, Result, StepLoss, TrainConfig, TrainError};

/// Training state of a [`LoraModel`] (see the module doc).
#[derive(Debug)]
pub struct LoraTrainer {
    model: LoraModel,
    cfg: TrainConfig,
    grads: Vec<f32>,
    /// `accumulate` calls since the last `apply`.
    micro: u64,
    opt: AdamW,
    step: u64,
    fingerprint: String,
}

impl LoraTrainer {
    /// A trainer at step 0. `model_identity` names the base weights (a digest of the GGUF's
    /// tensor table) for the checkpoint fingerprint.
    pub fn new(model: LoraModel, cfg: TrainConfig, model_identity: &str) -> Result<Self> {
        cfg.validate()?;
        if model.lora().rank != cfg.lora.rank || model.lora().targets != cfg.lora.targets {
            return Err(TrainError::Config {
                detail: "the model's LoRA config differs from the training config".into(),
            });
        }
        let n = model.parameter_count();
        let fingerprint = fingerprint(&model, &cfg, model_identity);
        Ok(Self {
            model,
            cfg,
            grads: vec![0.0; n],
            micro: 0,
            opt: AdamW::new(n),
            step: 0,
            fingerprint,
        })
    }

    pub fn model(&self) -> &LoraModel {
        &self.model
    }

    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }

    /// A digest of everything a checkpoint must agree with: base model, model config, LoRA
    /// config, hyper-parameters, seed and dtype.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    pub fn step(&self) -> u64 {
        self.step
    }

    pub fn parameter_count(&self) -> usize {
        self.grads.len()
    }

    /// Frozen weights plus, per trainable value, the value, its gradient (f32) and two f64
    /// moments.
    pub fn memory_bytes(&self) -> u64 {
        let per = self.model.dtype().size_in_bytes() + 4 + 16;
        self.model.base_bytes() + (self.parameter_count() * per) as u64
    }

    /// A rough upper bound on the activation memory of a micro-batch of `tokens` padded
    /// positions whose `targets` carry loss (kept for backward: about 24 hidden-sized and 6
    /// ffn-sized values per position per block, attention probabilities, and the logits of the
    /// targets a few times over).
    pub fn activation_bytes(&self, tokens: usize, seq_len: usize, targets: usize) -> u64 {
        let c = self.model.config();
        let el = self.model.dtype().size_in_bytes();
        let per_block = tokens * (24 * c.hidden + 6 * c.ffn) + 4 * tokens * seq_len * c.heads;
        (el * (c.n_layers * per_block + 4 * targets * c.vocab)) as u64
    }

    fn dropout_key(&self) -> Option<DropoutKey> {
        (self.model.lora().dropout > 0.0).then_some(DropoutKey {
            seed: self.cfg.seed,
            stream: (self.step << 20) ^ self.micro,
        })
    }

    /// Loss and gradients of `batch` in f64, flat (None when it has no targets).
    pub(crate) fn loss_and_grads(
        &self,
        batch: &[Example],
        dropout: Option<DropoutKey>,
    ) -> Result<Option<(f64, u64, Vec<f64>)>> {
        let Some((loss, tokens)) = self.model.loss(batch, dropout)? else {
            return Ok(None);
        };
        let store = loss.backward()?;
        let mut flat = Vec::with_capacity(self.grads.len());
        for p in self.model.pairs.values() {
            for v in [&p.a, &p.b] {
                match store.get(v.as_tensor()) {
                    Some(g) => flat.extend(super::ops::to_f64_vec(g)?),
                    None => flat.extend(std::iter::repeat_n(0.0, v.elem_count())),
                }
            }
        }
        let loss = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        Ok(Some((loss, tokens, flat)))
    }

    /// Forward + backward of `batch`; adds its summed gradients to the buffers.
    pub fn accumulate(&mut self, batch: &[Example]) -> Result<StepLoss> {
        let out = self.loss_and_grads(batch, self.dropout_key())?;
        self.micro += 1;
        let Some((loss_sum, tokens, grads)) = out else {
            return Ok(StepLoss::default());
        };
        for (acc, g) in self.grads.iter_mut().zip(grads) {
            *acc += g as f32;
        }
        Ok(StepLoss { loss_sum, tokens })
    }

    pub fn gradients_flat(&self) -> Vec<f32> {
        self.grads.clone()
    }

    pub fn set_gradients_flat(&mut self, g: &[f32]) -> Result<()> {
        if g.len() != self.grads.len() {
            return Err(TrainError::Config {
                detail: format!(
                    "{} gradient values for {} parameters",
                    g.len(),
                    self.grads.len()
                ),
            });
        }
        self.grads.copy_from_slice(g);
        self.micro = self.micro.max(1);
        Ok(())
    }

    /// The parameters, flat, as f64.
    pub(crate) fn params_flat(&self) -> Result<Vec<f64>> {
        let mut out = Vec::with_capacity(self.grads.len());
        for p in self.model.pairs.values() {
            out.extend(super::ops::to_f64_vec(p.a.as_tensor())?);
            out.extend(super::ops::to_f64_vec(p.b.as_tensor())?);
        }
        Ok(out)
    }

    /// Sets the parameters from a flat f64 vector (rounded to the model's dtype).
    pub(crate) fn set_params_flat(&mut self, flat: &[f64]) -> Result<()> {
        let dtype = self.model.dtype();
        let device = self.model.device().clone();
        let mut at = 0;
        for p in self.model.pairs.values() {
            for v in [&p.a, &p.b] {
                let n = v.elem_count();
                let t =
                    Tensor::from_slice(&flat[at..at + n], v.shape(), &device)?.to_dtype(dtype)?;
                v.set(&t)?;
                at += n;
            }
        }
        Ok(())
    }

    /// Divides the gradients by `global_tokens`, clips them to `grad_clip`, takes an AdamW
    /// step at lr(step), clears them and advances the step.
    pub fn apply(&mut self, global_tokens: u64) -> Result<Applied> {
        if global_tokens == 0 {
            return Err(TrainError::Config {
                detail: "apply with 0 target tokens: the batch had nothing to learn from".into(),
            });
        }
        let mut g: Vec<f64> = self
            .grads
            .iter()
            .map(|&x| f64::from(x) / global_tokens as f64)
            .collect();
        let grad_norm = g.iter().map(|x| x * x).sum::<f64>().sqrt();
        if !grad_norm.is_finite() {
            return Err(TrainError::Config {
                detail: format!("the gradient norm is {grad_norm} at step {}", self.step),
            });
        }
        if let Some(clip) = self.cfg.grad_clip
            && grad_norm > clip
        {
            let f = clip / grad_norm;
            g.iter_mut().for_each(|x| *x *= f);
        }
        let c = &self.cfg;
        let lr = learning_rate(
            c.learning_rate,
            c.warmup_steps,
            c.total_steps,
            c.min_lr_ratio,
            self.step,
        );
        let h = AdamWParams {
            beta1: c.beta1,
            beta2: c.beta2,
            eps: c.eps,
            weight_decay: c.weight_decay,
        };
        let mut params = self.params_flat()?;
        self.opt.update(0, &mut params, &g, self.step + 1, lr, &h);
        self.set_params_flat(&params)?;
        self.grads.iter_mut().for_each(|x| *x = 0.0);
        self.micro = 0;
        self.step += 1;
        Ok(Applied { lr, grad_norm })
    }

    /// Summed loss of `batch` (no dropout, no gradients kept).
    pub fn eval_loss(&self, batch: &[Example]) -> Result<StepLoss> {
        Ok(match self.model.loss(batch, None)? {
            Some((loss, tokens)) => StepLoss {
                loss_sum: loss.to_dtype(DType::F64)?.to_scalar::<f64>()?,
                tokens,
            },
            None => StepLoss::default(),
        })
    }

    /// The adapter as trained so far.
    pub fn adapter(&self) -> Result<Adapter> {
        Ok(Adapter {
            config: self.model.lora().clone(),
            pairs: self.model.pairs()?,
        })
    }

    pub fn save_checkpoint(&self, dir: &Path) -> Result<()> {
        if self.grads.iter().any(|&g| g != 0.0) {
            return Err(TrainError::Checkpoint {
                path: dir.to_path_buf(),
                detail: "gradients were accumulated but not applied; checkpoint after apply".into(),
            });
        }
        super::checkpoint::save(dir, self)
    }

    pub fn load_checkpoint(&mut self, dir: &Path) -> Result<()> {
        let state = super::checkpoint::load(dir, &self.fingerprint, self.grads.len())?;
        self.set_params_exact(&state.params)?;
        self.opt = state.opt;
        self.step = state.step;
        self.grads.iter_mut().for_each(|x| *x = 0.0);
        self.micro = 0;
        Ok(())
    }

    /// The parameter tensors by name, for the checkpoint (exact values, model dtype).
    pub(crate) fn param_tensors(&self) -> BTreeMap<String, Tensor> {
        let mut out = BTreeMap::new();
        for ((layer, target), p) in &self.model.pairs {
            out.insert(
                format!("{layer}.{}.lora_A", target.module()),
                p.a.as_tensor().clone(),
            );
            out.insert(
                format!("{layer}.{}.lora_B", target.module()),
                p.b.as_tensor().clone(),
            );
        }
        out
    }

    fn set_params_exact(&mut self, params: &BTreeMap<String, Tensor>) -> Result<()> {
        for ((layer, target), p) in &self.model.pairs {
            for (v, which) in [(&p.a, 'A'), (&p.b, 'B')] {
                let name = format!("{layer}.{}.lora_{which}", target.module());
                let t = params.get(&name).ok_or_else(|| TrainError::Config {
                    detail: format!("checkpoint lacks {name}"),
                })?;
                if t.dims() != v.dims() || t.dtype() != v.dtype() {
                    return Err(TrainError::Config {
                        detail: format!(
                            "checkpoint {name} is {:?} {:?}, expected {:?} {:?}",
                            t.dtype(),
                            t.dims(),
                            v.dtype(),
                            v.dims()
                        ),
                    });
                }
                v.set(&t.to_device(self.model.device())?)?;
            }
        }
        Ok(())
    }

    pub(crate) fn optimizer(&self) -> &AdamW {
        &self.opt
    }

    /// Global norm of the current (summed) gradient buffers.
    pub fn gradient_norm(&self) -> f64 {
        global_norm(&self.grads)
    }
}

fn fingerprint(model: &LoraModel, cfg: &TrainConfig, identity: &str) -> String {
    let l = &cfg.lora;
    let mut h = Sha256::new();
    h.update(identity);
    h.update(format!("{:?}|{:?}", model.config(), model.dtype()));
    h.update(format!(
        "r={} alpha={} dropout={} rslora={} targets={:?}",
        l.rank,
        l.alpha.to_bits(),
        l.dropout.to_bits(),
        l.rslora,
        l.targets
    ));
    h.update(format!(
        "lr={} warmup={} total={} min={} wd={} b1={} b2={} eps={} clip={:?} seed={}",
        cfg.learning_rate.to_bits(),
        cfg.warmup_steps,
        cfg.total_steps,
        cfg.min_lr_ratio.to_bits(),
        cfg.weight_decay.to_bits(),
        cfg.beta1.to_bits(),
        cfg.beta2.to_bits(),
        cfg.eps.to_bits(),
        cfg.grad_clip.map(f64::to_bits),
        cfg.seed
    ));
    super::load::hex(&h.finalize())
}
