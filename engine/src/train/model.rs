//! The model being trained: every block of a llama-family model with its base weights as plain
//! (frozen, never differentiated) tensors and a LoRA pair per adapted (block, target) as candle
//! [`Var`]s. [`LoraModel::loss`] runs a padded batch forward and returns the summed next-token
//! cross-entropy, on which `backward()` yields the LoRA gradients.
//!
//! The math is the inference engine's (`block.rs`): pre-norm RMSNorm, q/k/v projections (+ qwen2
//! biases), RoPE (interleaved for llama/mistral, NEOX for qwen2), grouped-query attention with a
//! causal mask, SwiGLU MLP, residuals, final norm and a tied or separate output head. Each
//! adapted projection adds `scale · dropout(x)·Aᵀ·Bᵀ` (PEFT's LoRA; `scale` from
//! [`LoraConfig::scale`]). The non-differentiable candle ops are replaced by [`super::ops`].
//!
//! Sequences of a batch are right-padded to the longest: with a causal mask a real position
//! never attends to a later (padding) one, so no padding mask is needed and padded positions
//! simply carry no loss.
//!
//! A is initialised as PEFT does (`kaiming_uniform_(a=√5)`, i.e. uniform in ±1/√in) from the
//! seed, per (block, target) stream; B is zero, so an untrained adapter changes nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor, Var};

use crate::adapter::{LoraConfig, LoraPair, Target};
use crate::gguf::ModelConfig;

use super::ops::{frozen_linear, log_sum_exp, rms_norm, rope, softmax_last_dim};
use super::rng::SplitMix64;
use super::{Example, TrainError};

/// Base weights of one block, in the GGUF's (engine) layout: matrices are [out, in].
#[derive(Debug, Clone)]
pub struct BlockWeights {
    pub attn_norm: Tensor,
    pub wq: Tensor,
    pub wk: Tensor,
    pub wv: Tensor,
    pub wo: Tensor,
    pub bq: Option<Tensor>,
    pub bk: Option<Tensor>,
    pub bv: Option<Tensor>,
    pub ffn_norm: Tensor,
    pub gate: Tensor,
    pub up: Tensor,
    pub down: Tensor,
}

/// Base weights of a whole model, dequantised. `output` is None when the head is tied to the
/// embedding (SmolLM2).
#[derive(Debug, Clone)]
pub struct BaseWeights {
    /// [vocab, hidden]
    pub embed: Tensor,
    pub blocks: Vec<BlockWeights>,
    pub output_norm: Tensor,
    /// [vocab, hidden]
    pub output: Option<Tensor>,
}

#[derive(Debug)]
struct FrozenBlock {
    attn_norm: Tensor,
    w: BTreeMap<Target, Arc<Tensor>>,
    bq: Option<Tensor>,
    bk: Option<Tensor>,
    bv: Option<Tensor>,
    ffn_norm: Tensor,
}

/// A LoRA pair being trained.
#[derive(Debug)]
pub(crate) struct PairVars {
    pub(crate) a: Var,
    pub(crate) b: Var,
}

/// The training model (see the module doc).
#[derive(Debug)]
pub struct LoraModel {
    config: ModelConfig,
    lora: LoraConfig,
    dtype: DType,
    device: Device,
    embed: Tensor,
    blocks: Vec<FrozenBlock>,
    output_norm: Tensor,
    head: Arc<Tensor>,
    pub(crate) pairs: BTreeMap<(usize, Target), PairVars>,
    neox: bool,
    base_bytes: u64,
}

/// Dropout of the LoRA inputs for one forward pass: masks are drawn from `seed` and `stream`
/// (the trainer passes the optimizer step and the micro-batch number).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DropoutKey {
    pub(crate) seed: u64,
    pub(crate) stream: u64,
}

fn config_err(detail: impl Into<String>) -> TrainError {
    TrainError::Config {
        detail: detail.into(),
    }
}

fn check_shape(name: &str, t: &Tensor, want: &[usize]) -> Result<(), TrainError> {
    if t.dims() != want {
        return Err(config_err(format!(
            "base weight {name} has shape {:?}, expected {want:?}",
            t.dims()
        )));
    }
    Ok(())
}

impl LoraModel {
    /// Builds the model from base weights (converted to `dtype`, f32 or f64) and fresh LoRA
    /// pairs for `lora.targets` on every block, A drawn from `seed`.
    pub fn new(
        config: &ModelConfig,
        weights: BaseWeights,
        lora: &LoraConfig,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self, TrainError> {
        if !matches!(dtype, DType::F32 | DType::F64) {
            return Err(config_err(format!(
                "training runs in f32 or f64, not {dtype:?}"
            )));
        }
        if weights.blocks.len() != config.n_layers {
            return Err(config_err(format!(
                "{} blocks of weights for a model of {} blocks",
                weights.blocks.len(),
                config.n_layers
            )));
        }
        let c = config;
        let (q, kv) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        check_shape("token_embd", &weights.embed, &[c.vocab, c.hidden])?;
        check_shape("output_norm", &weights.output_norm, &[c.hidden])?;
        let mut base_bytes = 0u64;
        let mut conv = |t: &Tensor| -> Result<Tensor, TrainError> {
            base_bytes += (t.elem_count() * dtype.size_in_bytes()) as u64;
            Ok(t.to_dtype(dtype)?.to_device(device)?.contiguous()?)
        };
        let embed = conv(&weights.embed)?;
        let head = match &weights.output {
            Some(o) => {
                check_shape("output", o, &[c.vocab, c.hidden])?;
                Arc::new(conv(o)?)
            }
            None => Arc::new(embed.clone()),
        };
        let output_norm = conv(&weights.output_norm)?;
        let mut blocks = Vec::with_capacity(c.n_layers);
        for (i, b) in weights.blocks.iter().enumerate() {
            let shapes: [(&str, &Tensor, [usize; 2]); 7] = [
                ("attn_q", &b.wq, [q, c.hidden]),
                ("attn_k", &b.wk, [kv, c.hidden]),
                ("attn_v", &b.wv, [kv, c.hidden]),
                ("attn_output", &b.wo, [c.hidden, q]),
                ("ffn_gate", &b.gate, [c.ffn, c.hidden]),
                ("ffn_up", &b.up, [c.ffn, c.hidden]),
                ("ffn_down", &b.down, [c.hidden, c.ffn]),
            ];
            let mut w = BTreeMap::new();
            for ((name, t, shape), target) in shapes.into_iter().zip(Target::ALL) {
                check_shape(&format!("blk.{i}.{name}"), t, &shape)?;
                w.insert(target, Arc::new(conv(t)?));
            }
            check_shape(&format!("blk.{i}.attn_norm"), &b.attn_norm, &[c.hidden])?;
            check_shape(&format!("blk.{i}.ffn_norm"), &b.ffn_norm, &[c.hidden])?;
            let mut bias = |t: &Option<Tensor>, n: usize, name: &str| match t {
                Some(t) => {
                    check_shape(&format!("blk.{i}.{name}"), t, &[n])?;
                    conv(t).map(Some)
                }
                None => Ok(None),
            };
            let bq = bias(&b.bq, q, "attn_q.bias")?;
            let bk = bias(&b.bk, kv, "attn_k.bias")?;
            let bv = bias(&b.bv, kv, "attn_v.bias")?;
            blocks.push(FrozenBlock {
                attn_norm: conv(&b.attn_norm)?,
                w,
                bq,
                bk,
                bv,
                ffn_norm: conv(&b.ffn_norm)?,
            });
        }
        let mut pairs = BTreeMap::new();
        for layer in 0..c.n_layers {
            for &target in &lora.targets {
                let (inp, out) = target.shape(c);
                let mut rng = SplitMix64::derive(seed, &[layer as u64, target as u64]);
                let bound = 1.0 / (inp as f64).sqrt();
                let a: Vec<f64> = (0..lora.rank * inp)
                    .map(|_| (rng.next_f64() * 2.0 - 1.0) * bound)
                    .collect();
                let a = Tensor::from_vec(a, (lora.rank, inp), device)?.to_dtype(dtype)?;
                let b = Tensor::zeros((out, lora.rank), dtype, device)?;
                pairs.insert(
                    (layer, target),
                    PairVars {
                        a: Var::from_tensor(&a)?,
                        b: Var::from_tensor(&b)?,
                    },
                );
            }
        }
        Ok(Self {
            config: c.clone(),
            lora: lora.clone(),
            dtype,
            device: device.clone(),
            embed,
            blocks,
            output_norm,
            head,
            pairs,
            neox: c.architecture == "qwen2",
            base_bytes,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn lora(&self) -> &LoraConfig {
        &self.lora
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Bytes of the frozen base weights in memory.
    pub fn base_bytes(&self) -> u64 {
        self.base_bytes
    }

    /// Number of trainable values.
    pub fn parameter_count(&self) -> usize {
        self.pairs
            .values()
            .map(|p| p.a.elem_count() + p.b.elem_count())
            .sum()
    }

    /// The current pairs (copies), in engine layout.
    pub fn pairs(&self) -> Result<BTreeMap<(usize, Target), LoraPair>, TrainError> {
        self.pairs
            .iter()
            .map(|(k, p)| {
                Ok((
                    *k,
                    LoraPair {
                        a: p.a.as_tensor().to_dtype(DType::F32)?.copy()?,
                        b: p.b.as_tensor().to_dtype(DType::F32)?.copy()?,
                    },
                ))
            })
            .collect()
    }

    /// Hidden states after the last block for right-padded `seqs`: [batch · len, hidden]
    /// (row `b · len + t` is position t of sequence b) and the padded length.
    fn hidden(
        &self,
        seqs: &[&[u32]],
        dropout: Option<DropoutKey>,
    ) -> Result<(Tensor, usize), TrainError> {
        let c = &self.config;
        let len = seqs.iter().map(|s| s.len()).max().unwrap_or(0);
        if len == 0 {
            return Err(config_err("empty batch"));
        }
        if len > c.context {
            return Err(config_err(format!(
                "a sequence of {len} tokens exceeds the model's context of {}",
                c.context
            )));
        }
        let batch = seqs.len();
        let mut ids = Vec::with_capacity(batch * len);
        for s in seqs {
            if let Some(&id) = s.iter().find(|&&id| id as usize >= c.vocab) {
                return Err(config_err(format!(
                    "token id {id} is outside the vocabulary of {}",
                    c.vocab
                )));
            }
            ids.extend_from_slice(s);
            ids.extend(std::iter::repeat_n(0u32, len - s.len()));
        }
        let ids = Tensor::from_vec(ids, batch * len, &self.device)?;
        let mut x = self.embed.index_select(&ids, 0)?;
        let (cos, sin) = self.rope_tables(len)?;
        let mask = self.causal_mask(len)?;
        for (layer, block) in self.blocks.iter().enumerate() {
            x = self.block(layer, block, &x, batch, len, &cos, &sin, &mask, dropout)?;
        }
        Ok((x, len))
    }

    fn rope_tables(&self, len: usize) -> Result<(Tensor, Tensor), TrainError> {
        let d = self.config.head_dim;
        let theta = f64::from(self.config.rope_theta);
        // The same f32 computation as the inference engine's table, then widened.
        let inv: Vec<f32> = (0..d)
            .step_by(2)
            .map(|i| 1f32 / (theta as f32).powf(i as f32 / d as f32))
            .collect();
        let half = inv.len();
        let inv = Tensor::from_vec(inv, (1, half), &self.device)?;
        let pos = Tensor::arange(0, len as u32, &self.device)?
            .to_dtype(DType::F32)?
            .reshape((len, 1))?;
        let freqs = pos.matmul(&inv)?;
        Ok((
            freqs.cos()?.to_dtype(self.dtype)?,
            freqs.sin()?.to_dtype(self.dtype)?,
        ))
    }

    /// [len, len]: 0 where a position may attend, -inf above the diagonal.
    fn causal_mask(&self, len: usize) -> Result<Tensor, TrainError> {
        let m: Vec<f64> = (0..len)
            .flat_map(|i| (0..len).map(move |j| if j > i { f64::NEG_INFINITY } else { 0.0 }))
            .collect();
        Ok(Tensor::from_vec(m, (len, len), &self.device)?.to_dtype(self.dtype)?)
    }

    /// `x·Wᵀ (+ bias) + scale · dropout(x)·Aᵀ·Bᵀ` for x [rows, in].
    fn linear(
        &self,
        layer: usize,
        block: &FrozenBlock,
        target: Target,
        x: &Tensor,
        bias: Option<&Tensor>,
        dropout: Option<DropoutKey>,
    ) -> Result<Tensor, TrainError> {
        let w = block
            .w
            .get(&target)
            .ok_or_else(|| config_err(format!("block {layer} has no {target:?} weight")))?;
        let mut y = frozen_linear(x, w)?;
        if let Some(b) = bias {
            y = y.broadcast_add(b)?;
        }
        if let Some(p) = self.pairs.get(&(layer, target)) {
            let x = match dropout {
                Some(key) if self.lora.dropout > 0.0 => self.dropout(x, key, layer, target)?,
                _ => x.clone(),
            };
            let h = x.matmul(&p.a.as_tensor().t()?)?;
            let d = h.matmul(&p.b.as_tensor().t()?)?;
            y = (y + (d * f64::from(self.lora.scale()))?)?;
        }
        Ok(y)
    }

    /// Inverted dropout: zero each element with probability p, scale the rest by 1/(1-p).
    fn dropout(
        &self,
        x: &Tensor,
        key: DropoutKey,
        layer: usize,
        target: Target,
    ) -> Result<Tensor, TrainError> {
        let p = f64::from(self.lora.dropout);
        let mut rng =
            SplitMix64::derive(key.seed, &[0xD80, key.stream, layer as u64, target as u64]);
        let keep = 1.0 / (1.0 - p);
        let m: Vec<f64> = (0..x.elem_count())
            .map(|_| if rng.next_f64() < p { 0.0 } else { keep })
            .collect();
        let m = Tensor::from_vec(m, x.shape(), &self.device)?.to_dtype(self.dtype)?;
        Ok((x * m)?)
    }

    #[allow(clippy::too_many_arguments)]
    fn block(
        &self,
        layer: usize,
        block: &FrozenBlock,
        x: &Tensor,
        batch: usize,
        len: usize,
        cos: &Tensor,
        sin: &Tensor,
        mask: &Tensor,
        dropout: Option<DropoutKey>,
    ) -> Result<Tensor, TrainError> {
        let c = &self.config;
        let eps = c.rms_eps;
        let (heads, kv_heads, hd) = (c.heads, c.kv_heads, c.head_dim);
        let h = rms_norm(x, &block.attn_norm, eps)?;
        let q = self.linear(layer, block, Target::Q, &h, block.bq.as_ref(), dropout)?;
        let k = self.linear(layer, block, Target::K, &h, block.bk.as_ref(), dropout)?;
        let v = self.linear(layer, block, Target::V, &h, block.bv.as_ref(), dropout)?;
        let split = |t: Tensor, n: usize| -> candle_core::Result<Tensor> {
            t.reshape((batch, len, n, hd))?
                .transpose(1, 2)?
                .contiguous()
        };
        let q = rope(&split(q, heads)?, cos, sin, self.neox)?;
        let k = rope(&split(k, kv_heads)?, cos, sin, self.neox)?;
        let v = split(v, kv_heads)?;
        let n_rep = heads / kv_heads;
        let k = candle_transformers::utils::repeat_kv(k, n_rep)?.contiguous()?;
        let v = candle_transformers::utils::repeat_kv(v, n_rep)?.contiguous()?;
        let att = (q.contiguous()?.matmul(&k.t()?)? / (hd as f64).sqrt())?;
        let att = att.broadcast_add(mask)?;
        let p = softmax_last_dim(&att)?;
        let y = p.matmul(&v)?;
        let y = y.transpose(1, 2)?.reshape((batch * len, heads * hd))?;
        let o = self.linear(layer, block, Target::O, &y, None, dropout)?;
        let x = (x + o)?;
        let h = rms_norm(&x, &block.ffn_norm, eps)?;
        let gate = self.linear(layer, block, Target::Gate, &h, None, dropout)?;
        let up = self.linear(layer, block, Target::Up, &h, None, dropout)?;
        let act = (gate.silu()? * up)?;
        let down = self.linear(layer, block, Target::Down, &act, None, dropout)?;
        Ok((x + down)?)
    }

    /// Summed cross-entropy of the batch's target tokens (token i of an example is a target
    /// when `loss_mask[i]`, predicted from tokens ..i) and how many targets there were. A
    /// batch without targets gives `None`.
    pub(crate) fn loss(
        &self,
        batch: &[Example],
        dropout: Option<DropoutKey>,
    ) -> Result<Option<(Tensor, u64)>, TrainError> {
        for (i, ex) in batch.iter().enumerate() {
            if ex.tokens.len() != ex.loss_mask.len() {
                return Err(config_err(format!(
                    "example {i} of the batch has {} tokens but {} loss-mask entries",
                    ex.tokens.len(),
                    ex.loss_mask.len()
                )));
            }
        }
        let mut rows = Vec::new();
        let mut targets = Vec::new();
        let len = batch.iter().map(|e| e.tokens.len()).max().unwrap_or(0);
        for (b, ex) in batch.iter().enumerate() {
            for i in 1..ex.tokens.len() {
                if ex.loss_mask[i] {
                    rows.push((b * len + i - 1) as u32);
                    targets.push(ex.tokens[i]);
                }
            }
        }
        if targets.is_empty() {
            return Ok(None);
        }
        let seqs: Vec<&[u32]> = batch.iter().map(|e| e.tokens.as_slice()).collect();
        let (x, _) = self.hidden(&seqs, dropout)?;
        let n = targets.len();
        let rows = Tensor::from_vec(rows, n, &self.device)?;
        let h = x.index_select(&rows, 0)?;
        let logits = self.head(&h)?;
        let targets = Tensor::from_vec(targets, (n, 1), &self.device)?;
        let picked = logits.gather(&targets, 1)?;
        let nll = (log_sum_exp(&logits)? - picked)?;
        Ok(Some((nll.sum_all()?, n as u64)))
    }

    fn head(&self, h: &Tensor) -> Result<Tensor, TrainError> {
        let h = rms_norm(h, &self.output_norm, self.config.rms_eps)?;
        Ok(frozen_linear(&h, &self.head)?)
    }

    /// Logits [len, vocab] of every position of one sequence (no dropout).
    pub fn logits(&self, tokens: &[u32]) -> Result<Tensor, TrainError> {
        let (x, _) = self.hidden(&[tokens], None)?;
        self.head(&x)
    }

    /// Greedy continuation of `prompt` (no KV cache: every step re-runs the whole sequence,
    /// which is what a check after training needs, not a server).
    pub fn greedy(
        &self,
        prompt: &[u32],
        max_tokens: usize,
        stop: &[u32],
    ) -> Result<Vec<u32>, TrainError> {
        let mut seq = prompt.to_vec();
        let mut out = Vec::new();
        for _ in 0..max_tokens {
            let logits = self.logits(&seq)?;
            let last = logits
                .get(seq.len() - 1)?
                .to_dtype(DType::F32)?
                .to_vec1::<f32>()?;
            let next = crate::sample::argmax(&last);
            if stop.contains(&next) {
                break;
            }
            out.push(next);
            seq.push(next);
        }
        Ok(out)
    }
}

/// Random base weights for `config` (matrices uniform in ±1/√in, norms near 1, qwen2 biases
/// small), drawn from `seed`: a model to test training on without a GGUF.
pub fn random_weights(
    config: &ModelConfig,
    seed: u64,
    device: &Device,
) -> Result<BaseWeights, TrainError> {
    let mut stream = 0u64;
    let mut draw = |shape: &[usize], center: f64, spread: f64| -> Result<Tensor, TrainError> {
        stream += 1;
        let mut rng = SplitMix64::derive(seed, &[0xBA5E, stream]);
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| (center + (rng.next_f64() * 2.0 - 1.0) * spread) as f32)
            .collect();
        Ok(Tensor::from_vec(v, shape, device)?)
    };
    let c = config;
    let (q, kv) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
    let mat = |out: usize, inp: usize| (vec![out, inp], 1.0 / (inp as f64).sqrt());
    let qwen = c.architecture == "qwen2";
    let mut blocks = Vec::with_capacity(c.n_layers);
    for _ in 0..c.n_layers {
        let mut m = |(shape, s): (Vec<usize>, f64)| draw(&shape, 0.0, s);
        let wq = m(mat(q, c.hidden))?;
        let wk = m(mat(kv, c.hidden))?;
        let wv = m(mat(kv, c.hidden))?;
        let wo = m(mat(c.hidden, q))?;
        let gate = m(mat(c.ffn, c.hidden))?;
        let up = m(mat(c.ffn, c.hidden))?;
        let down = m(mat(c.hidden, c.ffn))?;
        let (bq, bk, bv) = if qwen {
            (
                Some(draw(&[q], 0.0, 0.1)?),
                Some(draw(&[kv], 0.0, 0.1)?),
                Some(draw(&[kv], 0.0, 0.1)?),
            )
        } else {
            (None, None, None)
        };
        blocks.push(BlockWeights {
            attn_norm: draw(&[c.hidden], 1.0, 0.2)?,
            wq,
            wk,
            wv,
            wo,
            bq,
            bk,
            bv,
            ffn_norm: draw(&[c.hidden], 1.0, 0.2)?,
            gate,
            up,
            down,
        });
    }
    Ok(BaseWeights {
        embed: draw(&[c.vocab, c.hidden], 0.0, 1.0)?,
        blocks,
        output_norm: draw(&[c.hidden], 1.0, 0.2)?,
        output: if qwen {
            Some(draw(
                &[c.vocab, c.hidden],
                0.0,
                1.0 / (c.hidden as f64).sqrt(),
            )?)
        } else {
            None
        },
    })
}
