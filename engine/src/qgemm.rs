//! Q8_0 matrix products on x86-64 CPUs, each weight block read once for a tile of input rows.
//!
//! candle's CPU path for a Q8_0 weight (`k_quants::matmul`) computes every output element with a
//! separate per-block dot product, converting both blocks' f16 scales each time, so a batched
//! decode step of 8 sequences costs nearly 8 single steps (measured: 8 rows gave 1.22× the
//! tokens/s of 1). Here the input rows are quantised once, as candle quantises them, and
//! every weight block is loaded, made absolute and its scale converted once, then multiplied
//! with up to 8 input rows (`ROW_TILE`) that stay in L1.
//!
//! Every output element is computed by the same sequence of operations whatever the number of
//! rows or where its row falls in a tile, so a sequence's logits do not depend on what it is
//! batched with. Used where the CPU has AVX2, FMA and F16C and the weight is an in-memory Q8_0
//! matrix; everything else (other types, Metal, other CPUs) goes to candle.

use candle_core::quantized::QMatMul;
use candle_core::{Module, Result, Tensor};

/// Values per Q8_0 block.
#[cfg(target_arch = "x86_64")]
const QK: usize = 32;

/// `W·x` for `x` [.., k] and `W` [n, k]: tb's kernel where it applies, candle's otherwise.
pub(crate) fn forward(w: &QMatMul, x: &Tensor) -> Result<Tensor> {
    #[cfg(target_arch = "x86_64")]
    if let QMatMul::QTensor(q) = w
        && q.dtype() == candle_core::quantized::GgmlDType::Q8_0
        && q.device().is_cpu()
        && x.device().is_cpu()
        && x.dtype() == candle_core::DType::F32
        && x86::available()
    {
        let (n, k) = q.shape().dims2()?;
        if k % QK == 0 && x.dims().last() == Some(&k) {
            let data = q.data()?;
            return x86::matmul(&data, n, k, x);
        }
    }
    w.forward(x)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use candle_core::{Device, Result, Tensor};

    use super::QK;

    /// Bytes of one Q8_0 block: an f16 scale, then 32 signed 8-bit values.
    const BLOCK_BYTES: usize = 2 + QK;
    /// Input rows multiplied with each weight block while it is in registers: 8 accumulators
    /// plus the block and its constants fit the 16 AVX2 registers.
    const ROW_TILE: usize = 8;

    pub(super) fn available() -> bool {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }

    /// The input rows quantised to 8-bit blocks: values row-major, one f32 scale per block.
    struct Quantised {
        values: Vec<i8>,
        scales: Vec<f32>,
    }

    pub(super) fn matmul(weights: &[u8], n: usize, k: usize, x: &Tensor) -> Result<Tensor> {
        let blocks = k / QK;
        if weights.len() < n * blocks * BLOCK_BYTES {
            candle_core::bail!(
                "Q8_0 weight of {n}x{k} holds {} bytes, expected {}",
                weights.len(),
                n * blocks * BLOCK_BYTES
            );
        }
        let mut shape = x.dims().to_vec();
        let rows = x.elem_count() / k;
        let input = x.flatten_all()?.to_vec1::<f32>()?;
        // SAFETY: `available()` was checked by the caller.
        let q = unsafe { quantise(&input, rows, k) };
        let mut out = vec![0f32; rows * n];
        let out_addr = out.as_mut_ptr() as usize;
        candle_core::utils::barrier_pool().execute_chunked(n, |cols| {
            // SAFETY: the features were checked; each column of `out` is written by exactly one
            // work item, and `out` outlives the pool call, which returns when all items are done.
            unsafe { columns(weights, k, &q, rows, n, cols, out_addr as *mut f32) }
        });
        if let Some(last) = shape.last_mut() {
            *last = n;
        }
        Tensor::from_vec(out, shape, &Device::Cpu)
    }

    /// Each block of 32 values as `round(v / d)` with `d = max|v| / 127` stored at f16 precision —
    /// exactly what candle's `BlockQ8_0::from_float` computes, so the products equal candle's.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quantise(input: &[f32], rows: usize, k: usize) -> Quantised {
        let blocks = rows * k / QK;
        let mut values = vec![0i8; rows * k];
        let mut scales = vec![0f32; blocks];
        for ((src, dst), scale) in input
            .chunks_exact(QK)
            .zip(values.chunks_exact_mut(QK))
            .zip(scales.iter_mut())
        {
            let amax = src.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
            *scale = f16_round_trip(d);
            for (q, v) in dst.iter_mut().zip(src) {
                *q = (v * inv).round() as i8;
            }
        }
        Quantised { values, scales }
    }

    /// `v` rounded to the nearest f16 (ties to even) and back.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn f16_round_trip(v: f32) -> f32 {
        let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(v));
        _mm_cvtss_f32(_mm_cvtph_ps(h))
    }

    /// Output columns `cols` for every input row, a tile of rows at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn columns(
        weights: &[u8],
        k: usize,
        q: &Quantised,
        rows: usize,
        n: usize,
        cols: Range<usize>,
        out: *mut f32,
    ) {
        let mut first = 0;
        while first < rows {
            let tile = (rows - first).min(ROW_TILE);
            let args = Tile {
                weights,
                k,
                q,
                first,
                n,
                out,
            };
            // One instance per tile height so the accumulators live in registers.
            unsafe {
                match tile {
                    1 => tile_rows::<1>(&args, cols.clone()),
                    2 => tile_rows::<2>(&args, cols.clone()),
                    3 => tile_rows::<3>(&args, cols.clone()),
                    4 => tile_rows::<4>(&args, cols.clone()),
                    5 => tile_rows::<5>(&args, cols.clone()),
                    6 => tile_rows::<6>(&args, cols.clone()),
                    7 => tile_rows::<7>(&args, cols.clone()),
                    _ => tile_rows::<8>(&args, cols.clone()),
                }
            }
            first += ROW_TILE;
        }
    }

    struct Tile<'a> {
        weights: &'a [u8],
        k: usize,
        q: &'a Quantised,
        first: usize,
        n: usize,
        out: *mut f32,
    }

    /// Rows `first..first + R` times weight rows `cols`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile_rows<const R: usize>(t: &Tile<'_>, cols: Range<usize>) {
        let blocks = t.k / QK;
        let ones = _mm256_set1_epi16(1);
        let values = t.q.values.as_ptr();
        for col in cols {
            let row = unsafe { t.weights.as_ptr().add(col * blocks * BLOCK_BYTES) };
            let mut acc = [_mm256_setzero_ps(); R];
            for b in 0..blocks {
                let block = unsafe { row.add(b * BLOCK_BYTES) };
                let bits = unsafe { block.cast::<u16>().read_unaligned() };
                let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))));
                let w = unsafe { _mm256_loadu_si256(block.add(2).cast()) };
                // maddubs multiplies unsigned by signed: |w| times x carrying w's sign.
                let w_abs = _mm256_sign_epi8(w, w);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let i = t.first + r;
                    let x = unsafe { _mm256_loadu_si256(values.add(i * t.k + b * QK).cast()) };
                    let x_signed = _mm256_sign_epi8(x, w);
                    let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, x_signed), ones);
                    let scale = _mm256_set1_ps(d * t.q.scales[i * blocks + b]);
                    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, *acc);
                }
            }
            for (r, acc) in acc.into_iter().enumerate() {
                unsafe { *t.out.add((t.first + r) * t.n + col) = hsum(acc) };
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn hsum(x: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module, Tensor};

    fn weight(n: usize, k: usize) -> QMatMul {
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.1)
            .collect();
        let w = Tensor::from_vec(w, (n, k), &Device::Cpu).expect("w");
        QMatMul::from_qtensor(QTensor::quantize(&w, GgmlDType::Q8_0).expect("q")).expect("qmm")
    }

    fn input(rows: usize, k: usize, seed: usize) -> Tensor {
        let x: Vec<f32> = (0..rows * k)
            .map(|i| (((i + seed) * 104729 % 2003) as f32 / 1001.0 - 1.0) * 2.0)
            .collect();
        Tensor::from_vec(x, (1, rows, k), &Device::Cpu).expect("x")
    }

    #[test]
    fn equals_candles_per_block_product() {
        // k = 576 (SmolLM2's hidden size) is not a multiple of 256, so candle takes its per-block
        // vec_dot path, which performs the same operations in the same order.
        let (n, k) = (100, 576);
        let w = weight(n, k);
        for rows in [1, 3, 8, 13] {
            let x = input(rows, k, rows);
            let ours = super::forward(&w, &x).expect("ours");
            let theirs = w.forward(&x).expect("candle");
            assert_eq!(ours.dims(), theirs.dims());
            let ours = ours.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let theirs = theirs.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(ours, theirs, "rows {rows}");
        }
    }

    #[test]
    fn a_row_gives_the_same_bits_alone_and_in_any_batch() {
        let (n, k) = (64, 1536);
        let w = weight(n, k);
        let batch = input(11, k, 5);
        let together = super::forward(&w, &batch)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        for r in 0..11 {
            let alone = super::forward(&w, &batch.narrow(1, r, 1).unwrap())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            assert_eq!(alone, together[r * n..(r + 1) * n], "row {r}");
        }
    }
}
