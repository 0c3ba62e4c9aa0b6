//! The differentiable pieces of the training forward pass that candle 0.11 does not provide
//! with a backward pass, built here so `Tensor::backward` reaches the LoRA parameters.
//!
//! What candle 0.11 has and lacks (checked in its source):
//! - `candle_nn::ops::rms_norm` runs through `apply_op2_no_bwd`: no backward. [`rms_norm`] is
//!   written from primitives (`sqr`, `mean_keepdim`, `sqrt`, `broadcast_div`/`mul`), whose
//!   backward candle has; same formula as the fused kernel the inference engine uses.
//! - `candle_nn::ops::softmax_last_dim` is a custom op without `bwd`. [`softmax_last_dim`] is
//!   `exp(x - max) / sum`, the max detached (it cancels out mathematically, so its gradient
//!   is zero and need not flow).
//! - `candle_nn::rotary_emb::rope_i` / `rope` are custom ops without `bwd`. [`rope`] rotates
//!   pairs with `narrow`, `broadcast_mul` and `cat` (interleaved pairs for llama/mistral
//!   GGUFs, halves for qwen2's NEOX layout), as the kernels do.
//! - `silu`, `matmul`, `gather`, `index_select`, `exp`, `log`, `where_cond` have backward passes
//!   and are used as they are.
//! - [`frozen_linear`]: `x·Wᵀ` for a frozen base weight W. candle's `matmul` backward computes
//!   the gradient of both operands, so a plain matmul would also build the (discarded) gradient
//!   of every base weight — as many flops as the activation gradient and a W-sized tensor per
//!   layer. A custom op that holds W as a constant computes only `dx = dy·W` in its
//!   hand-written backward (CPU; other devices fall back to the plain matmul).
//!
//! Everything works in f32 and f64 (the gradient check runs in f64).

use std::sync::Arc;

use candle_core::op::BackpropOp;
use candle_core::{CpuStorage, CustomOp1, D, DType, Layout, Shape, Storage, Tensor};

/// RMSNorm over the last dimension: `x / sqrt(mean(x²) + eps) · w`.
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    let r = (ms + eps)?.sqrt()?;
    x.broadcast_div(&r)?.broadcast_mul(w)
}

/// Softmax over the last dimension, `exp(x - max(x)) / Σ exp(x - max(x))`.
pub(crate) fn softmax_last_dim(x: &Tensor) -> candle_core::Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    let s = e.sum_keepdim(D::Minus1)?;
    e.broadcast_div(&s)
}

/// `log Σ exp(x)` over the last dimension (kept), stable.
pub(crate) fn log_sum_exp(x: &Tensor) -> candle_core::Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    e.sum_keepdim(D::Minus1)?.log()?.broadcast_add(&max)
}

/// Rotary position embedding of x: [batch, heads, seq, head_dim] at positions 0..seq with
/// tables cos/sin [seq, head_dim / 2]. `neox`: the two halves of each head are the pairs
/// (qwen2); else adjacent elements are (llama.cpp's permuted llama/mistral weights).
pub(crate) fn rope(
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    neox: bool,
) -> candle_core::Result<Tensor> {
    let (b, h, t, d) = x.dims4()?;
    let half = d / 2;
    if neox {
        let x1 = x.narrow(3, 0, half)?;
        let x2 = x.narrow(3, half, half)?;
        let r1 = (x1.broadcast_mul(cos)? - x2.broadcast_mul(sin)?)?;
        let r2 = (x1.broadcast_mul(sin)? + x2.broadcast_mul(cos)?)?;
        Tensor::cat(&[r1, r2], 3)
    } else {
        let pairs = x.reshape((b, h, t, half, 2))?;
        let x0 = pairs.narrow(4, 0, 1)?;
        let x1 = pairs.narrow(4, 1, 1)?;
        let cos = cos.reshape((t, half, 1))?;
        let sin = sin.reshape((t, half, 1))?;
        let r0 = (x0.broadcast_mul(&cos)? - x1.broadcast_mul(&sin)?)?;
        let r1 = (x0.broadcast_mul(&sin)? + x1.broadcast_mul(&cos)?)?;
        Tensor::cat(&[r0, r1], 4)?.reshape((b, h, t, d))
    }
}

/// `x·Wᵀ` for x [rows, in] and a frozen W [out, in]: no gradient for W is ever built.
pub(crate) fn frozen_linear(x: &Tensor, w: &Arc<Tensor>) -> candle_core::Result<Tensor> {
    if !x.device().is_cpu() || !x.track_op() {
        return x.matmul(&w.t()?);
    }
    x.contiguous()?.apply_op1(FrozenLinear { w: w.clone() })
}

/// The custom op behind [`frozen_linear`].
struct FrozenLinear {
    w: Arc<Tensor>,
}

impl CustomOp1 for FrozenLinear {
    fn name(&self) -> &'static str {
        "frozen-linear"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        if !layout.is_contiguous() || layout.start_offset() != 0 {
            candle_core::bail!("frozen-linear needs a contiguous input at offset 0");
        }
        let elems = layout.shape().elem_count();
        let data = match storage {
            CpuStorage::F32(v) => CpuStorage::F32(v[..elems].to_vec()),
            CpuStorage::F64(v) => CpuStorage::F64(v[..elems].to_vec()),
            _ => candle_core::bail!("frozen-linear runs in f32 or f64"),
        };
        let x = Tensor::from_storage(
            Storage::Cpu(data),
            layout.shape().clone(),
            BackpropOp::none(),
            false,
        );
        let y = x.matmul(&self.w.t()?)?.contiguous()?;
        let shape = y.shape().clone();
        let (s, l) = y.storage_and_layout();
        let out = match &*s {
            Storage::Cpu(CpuStorage::F32(v)) => {
                CpuStorage::F32(v[l.start_offset()..l.start_offset() + shape.elem_count()].to_vec())
            }
            Storage::Cpu(CpuStorage::F64(v)) => {
                CpuStorage::F64(v[l.start_offset()..l.start_offset() + shape.elem_count()].to_vec())
            }
            _ => candle_core::bail!("frozen-linear: unexpected output storage"),
        };
        Ok((out, shape))
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(grad_res.matmul(&self.w)?))
    }
}

/// A tensor's values as f64, whatever its float dtype.
pub(crate) fn to_f64_vec(t: &Tensor) -> candle_core::Result<Vec<f64>> {
    t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn close(a: &Tensor, b: &Tensor, tol: f64) {
        let a = to_f64_vec(a).expect("a");
        let b = to_f64_vec(b).expect("b");
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!((x - y).abs() <= tol, "element {i}: {x} vs {y}");
        }
    }

    fn seq(shape: &[usize], scale: f32) -> Tensor {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 23) as f32 - 11.0) * scale)
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).expect("tensor")
    }

    #[test]
    fn primitives_match_candles_fused_kernels() {
        let x = seq(&[2, 3, 4, 8], 0.1);
        let w = seq(&[8], 0.05);
        close(
            &rms_norm(&x, &w, 1e-5).expect("ours"),
            &candle_nn::ops::rms_norm(&x, &w, 1e-5).expect("candle"),
            1e-5,
        );
        close(
            &softmax_last_dim(&x).expect("ours"),
            &candle_nn::ops::softmax_last_dim(&x).expect("candle"),
            1e-6,
        );
        let cos = seq(&[4, 4], 0.03).cos().expect("cos");
        let sin = seq(&[4, 4], 0.03).sin().expect("sin");
        close(
            &rope(&x, &cos, &sin, false).expect("ours"),
            &candle_nn::rotary_emb::rope_i(&x, &cos, &sin).expect("candle"),
            1e-6,
        );
        close(
            &rope(&x, &cos, &sin, true).expect("ours"),
            &candle_nn::rotary_emb::rope(&x, &cos, &sin).expect("candle"),
            1e-6,
        );
        let w = Arc::new(seq(&[5, 8], 0.1));
        let x2 = candle_core::Var::from_tensor(&seq(&[6, 8], 0.2)).expect("var");
        let y = frozen_linear(x2.as_tensor(), &w).expect("ours");
        close(
            &y,
            &x2.as_tensor().matmul(&w.t().expect("t")).expect("mm"),
            1e-5,
        );
        let g = y
            .sqr()
            .expect("sqr")
            .sum_all()
            .expect("sum")
            .backward()
            .expect("bwd");
        let ours = g.get(x2.as_tensor()).expect("grad").clone();
        let y = x2.as_tensor().matmul(&w.t().expect("t")).expect("mm");
        let g = y
            .sqr()
            .expect("sqr")
            .sum_all()
            .expect("sum")
            .backward()
            .expect("bwd");
        close(&ours, g.get(x2.as_tensor()).expect("grad"), 1e-4);
    }
}
