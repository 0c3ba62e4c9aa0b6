//! Quantised matrix products (Q8_0, Q4_0, Q4_1 weights) on x86-64 CPUs, each weight block read
//! once for a tile of input rows.
//!
//! candle's CPU path for a quantised weight (`k_quants::matmul`) computes every output element
//! with a separate per-block dot product, converting both blocks' f16 scales each time, so a
//! batched decode step of 8 sequences costs nearly 8 single steps (measured on Q8_0: 8 rows gave
//! 1.22× the tokens/s of 1); for Q4_1 its dot product is scalar code (measured: 26 tokens/s where
//! Q8_0 gave 71). Here the input rows are quantised once, as candle quantises them, and every
//! weight block is loaded, unpacked and its scale converted once, then multiplied with up to 8
//! input rows (`ROW_TILE`) that stay in L1.
//!
//! Q8_0 and Q4_0 products are bit-identical to candle's per-block AVX ones (candle's repacked
//! path, taken when k is a multiple of 256, sums in another order). Q4_1's differ from candle's
//! scalar order in the last bits: the block's `min · sum(x)` term is summed apart from the
//! scaled dot products, as llama.cpp does, so a block costs one vector FMA instead of a
//! horizontal sum. Since each layer's input is requantised to 8 bits, such last-bit
//! differences can move a rounding step and grow through the layers; [`use_candle_kernels`]
//! turns tb's kernels off to compare the engine with candle's reference model exactly.
//!
//! Every output element is computed by the same sequence of operations whatever the number of
//! rows or where its row falls in a tile, so a sequence's logits do not depend on what it is
//! batched with. Used where the CPU has AVX2, FMA and F16C and the weight is an in-memory
//! matrix of one of these types; everything else (other types, Metal, other CPUs) goes to candle.

use candle_core::quantized::{GgmlDType, QMatMul};
use candle_core::{Module, Result, Tensor};

/// Values per block, in all three formats.
#[cfg(target_arch = "x86_64")]
const QK: usize = 32;

/// Whether tb's kernel runs `dtype` weights on this machine's CPU: where it does, 4-bit weights
/// are best served as stored; where it does not, candle's Q8_0 path beats its scalar Q4_1 one.
pub fn has_cpu_kernel(dtype: GgmlDType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        x86::Format::of(dtype).is_some() && x86::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = dtype;
        false
    }
}

static CANDLE_ONLY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Routes every quantised product and every attention of this process through candle's ops
/// (`true`) or back to tb's where they apply (`false`, the default). For checking the engine's
/// math against candle-transformers' reference model, which sums in candle's order.
pub fn use_candle_kernels(only: bool) {
    CANDLE_ONLY.store(only, std::sync::atomic::Ordering::Relaxed);
}

/// Whether [`use_candle_kernels`] routed everything through candle.
pub(crate) fn candle_kernels_only() -> bool {
    CANDLE_ONLY.load(std::sync::atomic::Ordering::Relaxed)
}

/// `W·x` for `x` [.., k] and `W` [n, k]: tb's kernel where it applies, candle's otherwise.
pub(crate) fn forward(w: &QMatMul, x: &Tensor) -> Result<Tensor> {
    #[cfg(target_arch = "x86_64")]
    if !candle_kernels_only()
        && let QMatMul::QTensor(q) = w
        && let Some(format) = x86::Format::of(q.dtype())
        && q.device().is_cpu()
        && x.device().is_cpu()
        && x.dtype() == candle_core::DType::F32
        && x86::available()
    {
        let (n, k) = q.shape().dims2()?;
        if k % QK == 0 && x.dims().last() == Some(&k) {
            let data = q.data()?;
            return x86::matmul(format, &data, n, k, x);
        }
    }
    w.forward(x)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use candle_core::quantized::GgmlDType;
    use candle_core::{Device, Result, Tensor};

    use super::QK;

    /// Input rows multiplied with each weight block while it is in registers: 8 accumulators
    /// plus the block and its constants fit the 16 AVX2 registers.
    const ROW_TILE: usize = 8;

    /// The weight formats the kernel reads, as const-generic tags so each tile instance is
    /// compiled for one format.
    const Q8_0: u8 = 0;
    const Q4_0: u8 = 1;
    const Q4_1: u8 = 2;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(super) enum Format {
        /// f16 scale, then 32 signed bytes.
        Q8_0,
        /// f16 scale, then 32 nibbles standing for -8..=7.
        Q4_0,
        /// f16 scale, f16 minimum, then 32 nibbles standing for 0..=15.
        Q4_1,
    }

    impl Format {
        pub(super) fn of(dtype: GgmlDType) -> Option<Self> {
            match dtype {
                GgmlDType::Q8_0 => Some(Self::Q8_0),
                GgmlDType::Q4_0 => Some(Self::Q4_0),
                GgmlDType::Q4_1 => Some(Self::Q4_1),
                _ => None,
            }
        }

        fn block_bytes(self) -> usize {
            match self {
                Self::Q8_0 => 2 + QK,
                Self::Q4_0 => 2 + QK / 2,
                Self::Q4_1 => 4 + QK / 2,
            }
        }
    }

    pub(super) fn available() -> bool {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }

    /// The input rows quantised to 8-bit blocks: values row-major, one f32 scale per block, and
    /// (for Q4_1 weights, whose minimum multiplies the block's sum) the f16-rounded scaled sum,
    /// laid out for the tiles (see `quantise`).
    struct Quantised {
        values: Vec<i8>,
        scales: Vec<f32>,
        sums: Vec<f32>,
    }

    pub(super) fn matmul(
        format: Format,
        weights: &[u8],
        n: usize,
        k: usize,
        x: &Tensor,
    ) -> Result<Tensor> {
        let blocks = k / QK;
        let expected = n * blocks * format.block_bytes();
        if weights.len() < expected {
            candle_core::bail!(
                "{format:?} weight of {n}x{k} holds {} bytes, expected {expected}",
                weights.len(),
            );
        }
        let mut shape = x.dims().to_vec();
        let rows = x.elem_count() / k;
        let input = x.flatten_all()?.to_vec1::<f32>()?;
        // SAFETY: `available()` was checked by the caller.
        let q = unsafe { quantise(&input, rows, k, format == Format::Q4_1) };
        let mut out = vec![0f32; rows * n];
        let out_addr = out.as_mut_ptr() as usize;
        candle_core::utils::barrier_pool().execute_chunked(n, |cols| {
            let t = Tile {
                weights,
                k,
                q: &q,
                first: 0,
                n,
                out: out_addr as *mut f32,
            };
            // SAFETY: the features were checked; each column of `out` is written by exactly one
            // work item, and `out` outlives the pool call, which returns when all items are done.
            unsafe {
                match format {
                    Format::Q8_0 => columns::<Q8_0>(t, rows, cols),
                    Format::Q4_0 => columns::<Q4_0>(t, rows, cols),
                    Format::Q4_1 => columns::<Q4_1>(t, rows, cols),
                }
            }
        });
        if let Some(last) = shape.last_mut() {
            *last = n;
        }
        Tensor::from_vec(out, shape, &Device::Cpu)
    }

    /// Each block of 32 values as `round(v / d)` with `d = max|v| / 127` stored at f16 precision —
    /// exactly what candle's `BlockQ8_0::from_float` (and `BlockQ8_1`'s) computes, so the
    /// products equal candle's. With `sums`, also Q8_1's `s = f16(f16(Σq) · d)`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quantise(input: &[f32], rows: usize, k: usize, sums: bool) -> Quantised {
        let blocks = rows * k / QK;
        let mut values = vec![0i8; rows * k];
        let mut scales = vec![0f32; blocks];
        let per_row = k / QK;
        // Laid out tile by tile, block by block, with the tile's rows side by side (zero
        // padded), so one vector load gives a block's sums for every row of a tile.
        let mut block_sums = vec![
            0f32;
            if sums {
                rows.div_ceil(ROW_TILE) * per_row * ROW_TILE
            } else {
                0
            }
        ];
        for (b, ((src, dst), scale)) in input
            .chunks_exact(QK)
            .zip(values.chunks_exact_mut(QK))
            .zip(scales.iter_mut())
            .enumerate()
        {
            let amax = src.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
            *scale = f16_round_trip(d);
            let mut sum = 0i32;
            for (q, v) in dst.iter_mut().zip(src) {
                *q = (v * inv).round() as i8;
                sum += i32::from(*q);
            }
            if sums {
                let (row, block) = (b / per_row, b % per_row);
                let at = ((row / ROW_TILE * per_row) + block) * ROW_TILE + row % ROW_TILE;
                block_sums[at] = f16_round_trip(f16_round_trip(sum as f32) * *scale);
            }
        }
        Quantised {
            values,
            scales,
            sums: block_sums,
        }
    }

    /// `v` rounded to the nearest f16 (ties to even) and back.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn f16_round_trip(v: f32) -> f32 {
        let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(v));
        _mm_cvtss_f32(_mm_cvtph_ps(h))
    }

    /// Every f16 bit pattern's f32 value. A weight block's scales are looked up here and
    /// broadcast straight from memory: converting them with F16C and broadcasting the result
    /// takes shuffle-port operations, which bounded the single-row product at ~9 cycles a block.
    fn f16_table() -> *const f32 {
        static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
        TABLE
            .get_or_init(|| {
                (0..=u16::MAX)
                    .map(|bits| {
                        // SAFETY: only reached where `available()` holds (the kernel's caller).
                        unsafe { f16_to_f32(bits) }
                    })
                    .collect()
            })
            .as_ptr()
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn f16_to_f32(bits: u16) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
    }

    /// The f16 at `p` as f32 in all 8 lanes.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn f16_broadcast(table: *const f32, p: *const u8) -> __m256 {
        let bits = unsafe { p.cast::<u16>().read_unaligned() };
        unsafe { _mm256_broadcast_ss(&*table.add(usize::from(bits))) }
    }

    /// Output columns `cols` for every input row, a tile of rows at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn columns<const F: u8>(mut t: Tile<'_>, rows: usize, cols: Range<usize>) {
        while t.first < rows {
            // One instance per tile shape so the accumulators live in registers. Few rows take
            // several weight rows at once: their independent FMA chains hide each other's
            // latency, which one chain per block cannot.
            unsafe {
                match rows - t.first {
                    1 => tile::<F, 1, 4>(&t, cols.clone()),
                    2 => tile::<F, 2, 2>(&t, cols.clone()),
                    3 => tile::<F, 3, 2>(&t, cols.clone()),
                    4 => tile::<F, 4, 2>(&t, cols.clone()),
                    5 => tile::<F, 5, 1>(&t, cols.clone()),
                    6 => tile::<F, 6, 1>(&t, cols.clone()),
                    7 => tile::<F, 7, 1>(&t, cols.clone()),
                    _ => tile::<F, ROW_TILE, 1>(&t, cols.clone()),
                }
            }
            t.first += ROW_TILE;
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

    /// Rows `first..first + R` times weight rows `cols`, `C` weight rows at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const F: u8, const R: usize, const C: usize>(t: &Tile<'_>, cols: Range<usize>) {
        let mut col = cols.start;
        while col + C <= cols.end {
            unsafe { block_tile::<F, R, C>(t, col) };
            col += C;
        }
        while col < cols.end {
            unsafe { block_tile::<F, R, 1>(t, col) };
            col += 1;
        }
    }

    /// Rows `first..first + R` times weight rows `col..col + C`, for weights in format `F`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn block_tile<const F: u8, const R: usize, const C: usize>(t: &Tile<'_>, col: usize) {
        let block_bytes = match F {
            Q8_0 => 2 + QK,
            Q4_0 => 2 + QK / 2,
            _ => 4 + QK / 2,
        };
        let blocks = t.k / QK;
        let ones = _mm256_set1_epi16(1);
        let low_nibbles = _mm256_set1_epi8(0x0F);
        let eight = _mm256_set1_epi8(8);
        let f16s = f16_table();
        let weight_rows: [*const u8; C] = std::array::from_fn(|c| unsafe {
            t.weights.as_ptr().add((col + c) * blocks * block_bytes)
        });
        // Row r's blocks start at `values[r]` and its scales at `scales[r]` (bounds were
        // checked when the input was quantised: `first + R <= rows`).
        let values: [*const i8; R] =
            std::array::from_fn(|r| unsafe { t.q.values.as_ptr().add((t.first + r) * t.k) });
        let scales: [*const f32; R] =
            std::array::from_fn(|r| unsafe { t.q.scales.as_ptr().add((t.first + r) * blocks) });
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        // Lane r holds row r's Σ min · sum (Q4_1 only).
        let mut min_terms = [_mm256_setzero_ps(); C];
        let tile_sums = if F == Q4_1 {
            unsafe {
                t.q.sums
                    .as_ptr()
                    .add(t.first / ROW_TILE * blocks * ROW_TILE)
            }
        } else {
            std::ptr::null()
        };
        for b in 0..blocks {
            // `w` is the multiplicand maddubs takes as unsigned; for signed formats `signs`
            // holds the signs that are moved onto the input instead.
            let mut w = [_mm256_setzero_si256(); C];
            let mut signs = [_mm256_setzero_si256(); C];
            let mut d = [_mm256_setzero_ps(); C];
            for c in 0..C {
                let block = unsafe { weight_rows[c].add(b * block_bytes) };
                d[c] = unsafe { f16_broadcast(f16s, block) };
                match F {
                    Q8_0 => {
                        signs[c] = unsafe { _mm256_loadu_si256(block.add(2).cast()) };
                        w[c] = _mm256_sign_epi8(signs[c], signs[c]);
                    }
                    Q4_0 => {
                        let v = unsafe { nibbles(block.add(2), low_nibbles) };
                        signs[c] = _mm256_sub_epi8(v, eight);
                        w[c] = _mm256_sign_epi8(signs[c], signs[c]);
                    }
                    _ => w[c] = unsafe { nibbles(block.add(4), low_nibbles) },
                }
            }
            for r in 0..R {
                let x = unsafe { _mm256_loadu_si256(values[r].add(b * QK).cast()) };
                let x_scale = unsafe { _mm256_broadcast_ss(&*scales[r].add(b)) };
                for c in 0..C {
                    let x = if F == Q4_1 {
                        x
                    } else {
                        _mm256_sign_epi8(x, signs[c])
                    };
                    let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(w[c], x), ones);
                    let scale = _mm256_mul_ps(d[c], x_scale);
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[r][c]);
                }
            }
            if F == Q4_1 {
                let sums = unsafe { _mm256_loadu_ps(tile_sums.add(b * ROW_TILE)) };
                for c in 0..C {
                    let m = unsafe { f16_broadcast(f16s, weight_rows[c].add(b * block_bytes + 2)) };
                    min_terms[c] = _mm256_fmadd_ps(m, sums, min_terms[c]);
                }
            }
        }
        let mut mins = [[0f32; ROW_TILE]; C];
        if F == Q4_1 {
            for c in 0..C {
                unsafe { _mm256_storeu_ps(mins[c].as_mut_ptr(), min_terms[c]) };
            }
        }
        for r in 0..R {
            for c in 0..C {
                let v = hsum(acc[r][c]) + mins[c][r];
                unsafe { *t.out.add((t.first + r) * t.n + col + c) = v };
            }
        }
    }

    /// 16 bytes of packed nibbles as 32 bytes: low nibbles first, then high ones (the order
    /// ggml stores a 4-bit block's values in). The bytes are broadcast to both halves by the
    /// load and the upper half shifted by 4, which keeps the shuffle port free.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn nibbles(p: *const u8, mask: __m256i) -> __m256i {
        let both = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(p.cast()) });
        let shifted = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
        _mm256_and_si256(shifted, mask)
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

    const FORMATS: [GgmlDType; 3] = [GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q4_1];

    fn weight(n: usize, k: usize, dtype: GgmlDType) -> QMatMul {
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.1 + (i / k) as f32 * 1e-3)
            .collect();
        let w = Tensor::from_vec(w, (n, k), &Device::Cpu).expect("w");
        QMatMul::from_qtensor(QTensor::quantize(&w, dtype).expect("q")).expect("qmm")
    }

    fn input(rows: usize, k: usize, seed: usize) -> Tensor {
        let x: Vec<f32> = (0..rows * k)
            .map(|i| (((i + seed) * 104729 % 2003) as f32 / 1001.0 - 1.0) * 2.0)
            .collect();
        Tensor::from_vec(x, (1, rows, k), &Device::Cpu).expect("x")
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    #[test]
    fn equals_candles_product() {
        // k = 576 (SmolLM2's hidden size) is not a multiple of 256, so candle takes its per-block
        // vec_dot path. For Q8_0 and Q4_0 that performs the same operations in the same order;
        // for Q4_1 candle's is scalar and sums in another order, so only the last bits agree.
        let (n, k) = (100, 576);
        for dtype in FORMATS {
            let w = weight(n, k, dtype);
            for rows in [1, 3, 8, 13] {
                let x = input(rows, k, rows);
                let ours = super::forward(&w, &x).expect("ours");
                let theirs = w.forward(&x).expect("candle");
                assert_eq!(ours.dims(), theirs.dims());
                let (ours, theirs) = (values(&ours), values(&theirs));
                if dtype == GgmlDType::Q4_1 {
                    let scale = theirs.iter().fold(0f32, |m, v| m.max(v.abs()));
                    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
                        assert!(
                            (a - b).abs() <= 1e-5 * scale,
                            "{dtype:?} rows {rows} element {i}: {a} vs candle's {b}"
                        );
                    }
                } else {
                    assert_eq!(ours, theirs, "{dtype:?} rows {rows}");
                }
            }
        }
    }

    #[test]
    fn a_row_gives_the_same_bits_alone_and_in_any_batch() {
        let (n, k) = (64, 1536);
        for dtype in FORMATS {
            let w = weight(n, k, dtype);
            let batch = input(11, k, 5);
            let together = values(&super::forward(&w, &batch).unwrap());
            for r in 0..11 {
                let alone = values(&super::forward(&w, &batch.narrow(1, r, 1).unwrap()).unwrap());
                assert_eq!(alone, together[r * n..(r + 1) * n], "{dtype:?} row {r}");
            }
        }
    }

    #[test]
    fn the_kernel_covers_the_formats_it_claims() {
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            for dtype in FORMATS {
                assert!(super::has_cpu_kernel(dtype), "{dtype:?}");
            }
        }
        assert!(!super::has_cpu_kernel(GgmlDType::Q6K));
    }
}
