//! One llama-family transformer block (attention + SwiGLU MLP) and the RoPE tables, mirroring the
//! math of candle-transformers' `models/quantized_llama.rs` (0.11) so a shard's output matches the
//! whole model's: pre-norm RMSNorm, q/k/v projections (+ biases for qwen2), RoPE (interleaved
//! `rope_i` for llama/mistral GGUFs, whose q/k weights llama.cpp's converter permuted; NEOX `rope`
//! for qwen2), grouped-query attention with a causal mask, SwiGLU MLP, residuals.
//!
//! A block may carry a LoRA adapter's pairs ([`BlockLora`]): each adapted linear layer then
//! computes `W·x + scale·B·(A·x)` — the low-rank path beside the quantised weight, never a
//! merged matrix, so the quantised weight stays exactly as without the adapter. A block without
//! an adapter pays one `None` check per layer.
//!
//! A block may also be one rank's tensor-parallel slice (built by [`crate::tp`]): the same
//! struct holding that rank's heads and MLP columns, run by [`Block::forward`] with a `reduce`
//! that sums the o and down projections' partial outputs across ranks before each residual add.

use candle_core::quantized::QMatMul;
use candle_core::{DType, Device, Module, Tensor};
use candle_transformers::quantized_nn::RmsNorm;

use crate::adapter::{LoraPair, Target};
use crate::attention::{self, HostKv, Job};
use crate::error::Result;
use crate::tp::AllReduce;

/// Precomputed cos/sin tables, [positions, head_dim / 2].
#[derive(Debug, Clone)]
pub(crate) struct Rope {
    cos: Tensor,
    sin: Tensor,
    /// The same tables in host memory, for CPU attention ([`crate::attention`]).
    cos_host: Vec<f32>,
    sin_host: Vec<f32>,
    neox: bool,
}

impl Rope {
    pub(crate) fn new(
        head_dim: usize,
        theta: f32,
        positions: usize,
        neox: bool,
        device: &Device,
    ) -> Result<Self> {
        let inv: Vec<f32> = (0..head_dim)
            .step_by(2)
            .map(|i| 1f32 / theta.powf(i as f32 / head_dim as f32))
            .collect();
        let inv_len = inv.len();
        let inv = Tensor::from_vec(inv, (1, inv_len), device)?;
        let pos = Tensor::arange(0, positions as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((positions, 1))?;
        let freqs = pos.matmul(&inv)?;
        let (cos, sin) = (freqs.cos()?, freqs.sin()?);
        Ok(Self {
            cos_host: cos.flatten_all()?.to_vec1()?,
            sin_host: sin.flatten_all()?.to_vec1()?,
            cos,
            sin,
            neox,
        })
    }

    /// Rotates x: [batch, heads, seq, head_dim] whose first position is `pos`.
    fn apply(&self, x: &Tensor, pos: usize) -> Result<Tensor> {
        let (_b, _h, seq, _d) = x.dims4()?;
        let cos = self.cos.narrow(0, pos, seq)?;
        let sin = self.sin.narrow(0, pos, seq)?;
        let x = x.contiguous()?;
        Ok(if self.neox {
            candle_nn::rotary_emb::rope(&x, &cos, &sin)?
        } else {
            candle_nn::rotary_emb::rope_i(&x, &cos, &sin)?
        })
    }
}

/// Weights of one block.
#[derive(Debug)]
pub(crate) struct Block {
    pub(crate) attn_norm: RmsNorm,
    pub(crate) wq: QMatMul,
    pub(crate) wk: QMatMul,
    pub(crate) wv: QMatMul,
    pub(crate) wo: QMatMul,
    pub(crate) bq: Option<Tensor>,
    pub(crate) bk: Option<Tensor>,
    pub(crate) bv: Option<Tensor>,
    /// Bias of the o projection (no supported architecture has one; read when present).
    pub(crate) bo: Option<Tensor>,
    pub(crate) ffn_norm: RmsNorm,
    pub(crate) gate: QMatMul,
    pub(crate) up: QMatMul,
    pub(crate) down: QMatMul,
    /// Bias of the down projection (no supported architecture has one; read when present).
    pub(crate) bdown: Option<Tensor>,
    /// Query heads and KV heads of this block (a tensor-parallel slice's own, else the model's).
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    /// The adapter's pairs for this block, if an adapter is loaded and adapts it.
    pub(crate) lora: Option<BlockLora>,
}

/// The partial output `t` of a row-parallel layer summed across the ranks by `reduce`; `t`
/// itself without one.
fn reduced(t: Tensor, reduce: &mut Option<&mut dyn AllReduce>) -> Result<Tensor> {
    let Some(reduce) = reduce.as_mut() else {
        return Ok(t);
    };
    let shape = t.shape().clone();
    let mut data = t.flatten_all()?.to_vec1::<f32>()?;
    reduce.all_reduce_sum(&mut data)?;
    Ok(Tensor::from_vec(data, shape, t.device())?)
}

/// A LoRA adapter's pairs for one block, by target, and the scale applied to them.
#[derive(Debug)]
pub(crate) struct BlockLora {
    pub(crate) scale: f32,
    pairs: [Option<LoraPair>; 7],
}

impl BlockLora {
    /// The pairs of block `layer` in `adapter`; None when the adapter does not adapt it.
    pub(crate) fn of(adapter: &crate::adapter::Adapter, layer: usize) -> Option<BlockLora> {
        let mut pairs: [Option<LoraPair>; 7] = Default::default();
        let mut any = false;
        for (slot, target) in pairs.iter_mut().zip(Target::ALL) {
            *slot = adapter.pair(layer, target).cloned();
            any |= slot.is_some();
        }
        any.then(|| BlockLora {
            scale: adapter.scale(),
            pairs,
        })
    }

    fn pair(&self, target: Target) -> Option<&LoraPair> {
        let i = Target::ALL.iter().position(|t| *t == target)?;
        self.pairs[i].as_ref()
    }

    /// Replaces every pair by `f(target, pair)` (a tensor-parallel rank keeps its slice).
    pub(crate) fn map_pairs(
        &mut self,
        mut f: impl FnMut(Target, &LoraPair) -> Result<LoraPair>,
    ) -> Result<()> {
        for (slot, target) in self.pairs.iter_mut().zip(Target::ALL) {
            if let Some(pair) = slot.as_ref() {
                *slot = Some(f(target, pair)?);
            }
        }
        Ok(())
    }

    /// Bytes the pairs hold (f32).
    pub(crate) fn bytes(&self) -> u64 {
        self.pairs
            .iter()
            .flatten()
            .map(|p| ((p.a.elem_count() + p.b.elem_count()) * 4) as u64)
            .sum()
    }
}

/// One sequence's KV cache for one block.
#[derive(Debug, Clone, Default)]
pub(crate) struct KvCache {
    /// CPU shards: keys and values in host memory.
    pub(crate) host: HostKv,
    /// Other devices: keys and values [1, kv_heads, positions, head_dim].
    pub(crate) device: Option<(Tensor, Tensor)>,
}

impl KvCache {
    /// The first `len` positions (a shared prefix).
    pub(crate) fn prefix(&self, len: usize) -> Result<KvCache> {
        Ok(KvCache {
            host: self.host.prefix(len),
            device: match &self.device {
                Some((k, v)) => Some((k.narrow(2, 0, len)?, v.narrow(2, 0, len)?)),
                None => None,
            },
        })
    }
}

/// One sequence's rows in a batched step: rows `start..start + len` of the batch are its
/// positions `pos..pos + len`; `mask` (u8, 1 = masked) when `len > 1`.
pub(crate) struct Segment {
    pub(crate) start: usize,
    pub(crate) len: usize,
    pub(crate) pos: usize,
    pub(crate) mask: Option<Tensor>,
}

impl Block {
    /// x: [1, rows, hidden], the rows of every sequence of the batch one after another (see
    /// [`Segment`]); `caches[i]` is the KV cache of `segments[i]`'s sequence for this block.
    /// Every weight multiplies all rows at once; only attention runs per sequence. A
    /// tensor-parallel slice passes `reduce`, which sums the partial outputs of the o
    /// projection and of the down projection across the ranks (one all-reduce each) before the
    /// residual adds; a whole block passes `None`.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        rope: &Rope,
        segments: &[Segment],
        caches: &mut [&mut KvCache],
        mut reduce: Option<&mut dyn AllReduce>,
    ) -> Result<Tensor> {
        let residual = x;
        let h = self.attn_norm.forward(x)?;
        let attn = self.attention(&h, rope, segments, caches)?;
        let attn = reduced(attn, &mut reduce)?;
        let x = (attn + residual)?;
        let residual = &x;
        let h = self.ffn_norm.forward(&x)?;
        let [gate, up] = self.linears([Target::Gate, Target::Up], &h)?;
        let mlp = self.linear(Target::Down, &crate::swiglu::swiglu(&gate, &up)?)?;
        let mlp = reduced(mlp, &mut reduce)?;
        Ok((mlp + residual)?)
    }

    /// The weight (and bias) of `target`.
    pub(crate) fn weight(&self, target: Target) -> (&QMatMul, Option<&Tensor>) {
        match target {
            Target::Q => (&self.wq, self.bq.as_ref()),
            Target::K => (&self.wk, self.bk.as_ref()),
            Target::V => (&self.wv, self.bv.as_ref()),
            Target::O => (&self.wo, self.bo.as_ref()),
            Target::Gate => (&self.gate, None),
            Target::Up => (&self.up, None),
            Target::Down => (&self.down, self.bdown.as_ref()),
        }
    }

    /// The linear layer `target` applied to x: `W·x (+ bias) (+ scale·B·A·x)`.
    pub(crate) fn linear(&self, target: Target, x: &Tensor) -> Result<Tensor> {
        let [y] = self.linears([target], x)?;
        Ok(y)
    }

    /// Several linear layers applied to the same x (q, k, v; gate, up): the weights' products
    /// in one pass of the kernel (`qgemm::forward_many`), each result as [`Self::linear`]'s.
    pub(crate) fn linears<const N: usize>(
        &self,
        targets: [Target; N],
        x: &Tensor,
    ) -> Result<[Tensor; N]> {
        let ws = targets.map(|t| self.weight(t).0);
        let products = crate::qgemm::forward_many(&ws, x)?;
        let mut out = Vec::with_capacity(N);
        for (target, y) in targets.into_iter().zip(products) {
            let y = match self.weight(target).1 {
                Some(b) => y.broadcast_add(b)?,
                None => y,
            };
            out.push(
                match self
                    .lora
                    .as_ref()
                    .and_then(|l| Some((l.pair(target)?, l.scale)))
                {
                    Some((pair, scale)) => (y + pair.delta(x, scale)?)?,
                    None => y,
                },
            );
        }
        out.try_into()
            .map_err(|_| candle_core::Error::Msg("a product per target".into()).into())
    }

    fn attention(
        &self,
        x: &Tensor,
        rope: &Rope,
        segments: &[Segment],
        caches: &mut [&mut KvCache],
    ) -> Result<Tensor> {
        let [q, k, v] = self.linears([Target::Q, Target::K, Target::V], x)?;
        if x.device().is_cpu() {
            let y = self.attention_host(q, k, v, rope, segments, caches)?;
            return self.linear(Target::O, &y);
        }
        let mut ys = Vec::with_capacity(segments.len());
        for (seg, cache) in segments.iter().zip(caches.iter_mut()) {
            let rows = |t: &Tensor, heads: usize| -> Result<Tensor> {
                Ok(t.narrow(1, seg.start, seg.len)?
                    .contiguous()?
                    .reshape((1, seg.len, heads, self.head_dim))?
                    .transpose(1, 2)?)
            };
            let q = rope.apply(&rows(&q, self.heads)?, seg.pos)?;
            let k = rope.apply(&rows(&k, self.kv_heads)?, seg.pos)?;
            let v = rows(&v, self.kv_heads)?.contiguous()?;
            let (k, v) = match cache.device.as_ref() {
                Some((kc, vc)) if seg.pos > 0 => {
                    (Tensor::cat(&[kc, &k], 2)?, Tensor::cat(&[vc, &v], 2)?)
                }
                _ => (k, v),
            };
            cache.device = Some((k.clone(), v.clone()));
            ys.push(self.attend(q, k, v, seg)?);
        }
        let y = if ys.len() == 1 {
            ys.pop().expect("one segment")
        } else {
            Tensor::cat(&ys, 1)?
        };
        self.linear(Target::O, &y)
    }

    /// Attention on a CPU shard: the new rows rotated and appended to each sequence's host
    /// cache, then [`attention::attend`] (or candle's ops, when the process routes everything
    /// through candle to compare with its reference model). → [1, rows, heads * head_dim].
    fn attention_host(
        &self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        rope: &Rope,
        segments: &[Segment],
        caches: &mut [&mut KvCache],
    ) -> Result<Tensor> {
        let (heads, kv_heads, dim) = (self.heads, self.kv_heads, self.head_dim);
        let rows = q.dim(1)?;
        let mut qs = q.flatten_all()?.to_vec1::<f32>()?;
        let mut ks = k.flatten_all()?.to_vec1::<f32>()?;
        let vs = v.flatten_all()?.to_vec1::<f32>()?;
        let (q_width, kv_width) = (heads * dim, kv_heads * dim);
        for (seg, cache) in segments.iter().zip(caches.iter_mut()) {
            let q_rows = seg.start * q_width..(seg.start + seg.len) * q_width;
            let kv_rows = seg.start * kv_width..(seg.start + seg.len) * kv_width;
            let (cos, sin) = (&rope.cos_host, &rope.sin_host);
            attention::rope(&mut qs[q_rows], heads, dim, seg.pos, rope.neox, cos, sin);
            attention::rope(
                &mut ks[kv_rows.clone()],
                kv_heads,
                dim,
                seg.pos,
                rope.neox,
                cos,
                sin,
            );
            if seg.pos == 0 {
                cache.host = HostKv::default();
            }
            cache
                .host
                .append(&ks[kv_rows.clone()], &vs[kv_rows], kv_width);
        }
        let device = q.device();
        if crate::qgemm::candle_kernels_only() {
            let mut ys = Vec::with_capacity(segments.len());
            for (seg, cache) in segments.iter().zip(caches.iter()) {
                let q = Tensor::from_slice(
                    &qs[seg.start * q_width..(seg.start + seg.len) * q_width],
                    (1, seg.len, heads, dim),
                    device,
                )?
                .transpose(1, 2)?
                .contiguous()?;
                let (k, v) = cache.host.tensors(dim, device)?;
                ys.push(self.attend(q, k, v, seg)?);
            }
            return Ok(Tensor::cat(&ys, 1)?);
        }
        let jobs: Vec<Job<'_>> = segments
            .iter()
            .zip(caches.iter())
            .map(|(seg, cache)| Job {
                queries: &qs[seg.start * q_width..(seg.start + seg.len) * q_width],
                pos: seg.pos,
                cache: &cache.host,
                out_row: seg.start,
            })
            .collect();
        let out = attention::attend(&jobs, rows, heads, kv_heads, dim);
        Ok(Tensor::from_vec(out, (1, rows, q_width), device)?)
    }

    /// Attention of one sequence with candle's ops: q [1, heads, len, head_dim] (rotated),
    /// k/v [1, kv_heads, positions, head_dim] (the whole cache, these rows included) →
    /// [1, len, heads * head_dim].
    fn attend(&self, q: Tensor, k: Tensor, v: Tensor, seg: &Segment) -> Result<Tensor> {
        let seq = seg.len;
        let n_rep = self.heads / self.kv_heads;
        let k = candle_transformers::utils::repeat_kv(k, n_rep)?;
        let v = candle_transformers::utils::repeat_kv(v, n_rep)?;
        let att = (q.matmul(&k.t()?)? / (self.head_dim as f64).sqrt())?;
        let att = match seg.mask.as_ref() {
            None => att,
            Some(mask) => {
                let mask = mask.broadcast_as(att.shape())?;
                let neg_inf =
                    Tensor::new(f32::NEG_INFINITY, att.device())?.broadcast_as(att.shape())?;
                mask.where_cond(&neg_inf, &att)?
            }
        };
        let att = candle_nn::ops::softmax_last_dim(&att)?;
        let y = att.matmul(&v.contiguous()?)?;
        Ok(y.transpose(1, 2)?
            .reshape((1, seq, self.heads * self.head_dim))?)
    }
}
