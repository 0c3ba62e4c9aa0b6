//! The MLP's activation, `SiLU(gate) · up`, in one pass over host memory.
//!
//! With candle's ops this is two element-wise ops, each with its own allocation, and the SiLU
//! calls libm's `expf` once per value (~4 ns): for a batch of 8 sequences, SmolLM2's 30 blocks
//! take 368,640 of them per step, on the thread the matrix kernels' workers wait for. Where the
//! CPU has AVX-512, [`x86`] takes 16 values at once with a polynomial `exp` (Cephes' `expf`
//! reduction and polynomial, within 2 ulp of libm's); elsewhere, and when the process routes
//! everything through candle ([`crate::use_candle_kernels`]), candle's ops. Each value is
//! computed by the same operations wherever it sits in the batch, so a sequence's bits do not
//! depend on what it is batched with.

use candle_core::{Result, Tensor};

/// `SiLU(gate) · up`, elementwise; `gate` and `up` have the same shape.
pub(crate) fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    #[cfg(target_arch = "x86_64")]
    if gate.device().is_cpu()
        && gate.dtype() == candle_core::DType::F32
        && up.dtype() == candle_core::DType::F32
        && gate.shape() == up.shape()
        && !crate::qgemm::candle_kernels_only()
        && x86::available()
    {
        // SAFETY: `available()` checked the CPU's features.
        let out = crate::host::with_f32(gate, |g| {
            crate::host::with_f32(up, |u| unsafe { x86::swiglu(g, u) })
        })??;
        return Tensor::from_vec(out, gate.shape(), gate.device());
    }
    candle_nn::ops::silu(gate)? * up
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    pub(super) fn available() -> bool {
        static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVAILABLE.get_or_init(|| is_x86_feature_detected!("avx512f"))
    }

    /// `g[i] / (1 + exp(-g[i])) · u[i]` for every i of `g`; `u` is as long.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn swiglu(g: &[f32], u: &[f32]) -> Vec<f32> {
        assert_eq!(g.len(), u.len());
        let n = g.len();
        // Written below, every value once, before its length is set.
        let mut out = Vec::<f32>::with_capacity(n);
        let dst = out.as_mut_ptr();
        let mut i = 0;
        while i < n {
            let live = (n - i).min(16);
            let mask: __mmask16 = if live == 16 {
                0xFFFF
            } else {
                (1u16 << live) - 1
            };
            // SAFETY: lanes past `live` are masked off, so nothing past `n` is read or written.
            unsafe {
                let x = _mm512_maskz_loadu_ps(mask, g.as_ptr().add(i));
                let y = _mm512_maskz_loadu_ps(mask, u.as_ptr().add(i));
                let e = exp(_mm512_sub_ps(_mm512_setzero_ps(), x));
                let silu = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), e));
                _mm512_mask_storeu_ps(dst.add(i), mask, _mm512_mul_ps(silu, y));
            }
            i += 16;
        }
        // SAFETY: the loop wrote all n values.
        unsafe { out.set_len(n) };
        out
    }

    /// `e^x` lane by lane: x = n·ln 2 + r with |r| ≤ ln 2 / 2, e^r by Cephes' `expf`
    /// polynomial, times 2^n by `vscalefps` (which saturates to 0 and infinity itself).
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) fn exp(x: __m512) -> __m512 {
        // Past these e^x is 0 or infinity in f32; clamping keeps n within scalef's reach.
        let x = _mm512_max_ps(
            _mm512_min_ps(x, _mm512_set1_ps(88.8)),
            _mm512_set1_ps(-104.0),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        // ln 2 in two parts, so that n · ln 2 is exact enough for the reduction.
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
        let c = |v: f32| _mm512_set1_ps(v);
        let mut p = c(1.987_569_1e-4);
        p = _mm512_fmadd_ps(p, r, c(1.398_199_9e-3));
        p = _mm512_fmadd_ps(p, r, c(8.333_452e-3));
        p = _mm512_fmadd_ps(p, r, c(4.166_579_6e-2));
        p = _mm512_fmadd_ps(p, r, c(1.666_666_5e-1));
        p = _mm512_fmadd_ps(p, r, c(0.5));
        let r2 = _mm512_mul_ps(r, r);
        let y = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), c(1.0));
        _mm512_scalef_ps(y, n)
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use candle_core::Device;

    fn candle_swiglu(g: &[f32], u: &[f32]) -> Vec<f32> {
        let t = |v: &[f32]| Tensor::from_slice(v, v.len(), &Device::Cpu).expect("tensor");
        (candle_nn::ops::silu(&t(g)).expect("silu") * t(u))
            .and_then(|t| t.to_vec1::<f32>())
            .expect("mul")
    }

    /// [`x86::exp`] of 16 values; `x86::available()` must hold.
    fn exp16(xs: &[f32; 16]) -> [f32; 16] {
        let mut out = [0f32; 16];
        // SAFETY: the caller checked the CPU's features; 16 floats each way.
        unsafe {
            std::arch::x86_64::_mm512_storeu_ps(
                out.as_mut_ptr(),
                x86::exp(std::arch::x86_64::_mm512_loadu_ps(xs.as_ptr())),
            );
        }
        out
    }

    #[test]
    fn exp_is_within_2_ulp_of_libm_and_saturates() {
        if !x86::available() {
            return;
        }
        let ulps = |a: f32, b: f32| (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs();
        let mut worst = 0;
        let mut x = -87.0f32;
        while x < 88.0 {
            let xs: [f32; 16] = std::array::from_fn(|i| x + i as f32 * 1e-3);
            for (x, g) in xs.iter().zip(exp16(&xs)) {
                worst = worst.max(ulps(g, x.exp()));
            }
            x += 0.0371;
        }
        assert!(worst <= 2, "exp is {worst} ulp from libm's");
        let xs = [
            -200.0,
            -104.0,
            -90.0,
            0.0,
            -0.0,
            89.0,
            200.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e-30,
            -1e-30,
            0.5,
            -0.5,
            10.0,
            -10.0,
            1.0,
        ];
        for (x, g) in xs.iter().zip(exp16(&xs)) {
            let want = x.exp();
            assert!(
                ulps(g, want) <= 2 || (want < 1e-38 && g < 1e-38),
                "exp({x}) = {g}, libm {want}"
            );
        }
    }

    #[test]
    fn swiglu_is_close_to_candle_s_and_independent_of_length_and_position() {
        if !x86::available() {
            return;
        }
        let n = 16 * 5 + 7;
        let g: Vec<f32> = (0..n).map(|i| (i as f32 - 40.0) * 0.37).collect();
        let u: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let want = candle_swiglu(&g, &u);
        // SAFETY: `available()` holds.
        let into = |g: &[f32], u: &[f32]| unsafe { x86::swiglu(g, u) };
        let got = into(&g, &u);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                "value {i}: {a} vs candle's {b}"
            );
        }
        // A value's bits do not depend on where it sits: the same values shifted by 3.
        assert_eq!(into(&g[3..], &u[3..]), got[3..]);
        // Through the tensor entry point as well.
        let t = |v: &[f32]| Tensor::from_slice(v, (1, v.len()), &Device::Cpu).expect("tensor");
        let through = swiglu(&t(&g), &t(&u))
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .expect("swiglu");
        assert_eq!(through, got);
    }
}
