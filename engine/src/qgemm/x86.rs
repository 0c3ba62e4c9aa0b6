//! The x86-64 kernels (AVX2, FMA, F16C; Q4_1 with AVX-512 VNNI where the CPU has it).

use std::arch::x86_64::*;
use std::ops::Range;

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Result, Tensor};

use super::QK;

pub(super) mod lanes;
pub(super) mod wide;

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
    /// For the AVX-512 kernel ([`wide`]): each row's block scales two blocks at a time, each
    /// repeated over 8 lanes (the second zero past an odd last block), so one load gives a
    /// pair's scales in the lanes its products land in.
    pair_scales: Vec<f32>,
    /// For [`lanes`]' Q8_0 products: each block's Σ values, row-major.
    int_sums: Vec<i32>,
}

/// One product, with the AVX-512 kernel for Q4_1 and Q8_0 (`wide`, which the caller has
/// checked the CPU for) or without it.
#[cfg(test)]
pub(super) fn matmul_with(
    format: Format,
    weights: &[u8],
    n: usize,
    k: usize,
    x: &Tensor,
    wide: bool,
) -> Result<Tensor> {
    let mut out = matmul_many(format, &[(weights, n)], k, x, wide)?;
    out.pop()
        .ok_or_else(|| candle_core::Error::Msg("no product".into()))
}

/// Several `(weights, n)` of one format times the same input (a layer's q, k and v; gate and
/// up): the input is quantised once and every product runs in one call of the thread pool,
/// each output element computed exactly as it is alone.
pub(super) fn matmul_many(
    format: Format,
    parts: &[(&[u8], usize)],
    k: usize,
    x: &Tensor,
    wide: bool,
) -> Result<Vec<Tensor>> {
    let blocks = k / QK;
    for &(weights, n) in parts {
        let expected = n * blocks * format.block_bytes();
        if weights.len() < expected {
            candle_core::bail!(
                "{format:?} weight of {n}x{k} holds {} bytes, expected {expected}",
                weights.len(),
            );
        }
    }
    let rows = x.elem_count() / k;
    let wide = wide && wide::covers(format);
    // The pairs' scales serve only `wide`'s last few columns of a product, when one has them.
    let pairs = wide && parts.iter().any(|&(_, n)| n % lanes::LANES != 0);
    // SAFETY: `available()` was checked by the caller.
    let q = crate::host::with_f32(x, |input| unsafe {
        quantise(
            input,
            rows,
            k,
            format == Format::Q4_1,
            pairs,
            wide && format == Format::Q8_0,
        )
    })?;
    // Not zeroed: the kernels write every element (a batch's logits are 1.5 MB that memset
    // would fill on the thread the workers wait for); the lengths are set once they have.
    let mut outs: Vec<Vec<f32>> = parts
        .iter()
        .map(|&(_, n)| Vec::with_capacity(rows * n))
        .collect();
    let out_addrs: Vec<usize> = outs.iter_mut().map(|o| o.as_mut_ptr() as usize).collect();
    let tile = |part: usize| Tile {
        weights: parts[part].0,
        k,
        q: &q,
        first: 0,
        n: parts[part].1,
        out: out_addrs[part] as *mut f32,
    };
    if wide {
        // Work items of 16 columns ([`lanes`]), and each product's last few columns
        // ([`wide`]); a column takes the same kernel whatever the rows.
        let items: Vec<(usize, Range<usize>)> = parts
            .iter()
            .enumerate()
            .flat_map(|(part, &(_, n))| {
                let full = n / lanes::LANES * lanes::LANES;
                (0..full)
                    .step_by(lanes::LANES)
                    .map(move |c| (part, c..c + lanes::LANES))
                    .chain((full < n).then_some((part, full..n)))
            })
            .collect();
        candle_core::utils::barrier_pool().execute_chunked(items.len(), |range| {
            lanes::with_scratch(|packed| {
                for (part, cols) in &items[range] {
                    let t = tile(*part);
                    // SAFETY: the features were checked; each column of each output is written
                    // by exactly one work item, and the outputs outlive the pool call, which
                    // returns when all items are done.
                    unsafe {
                        match (format, cols.len() == lanes::LANES) {
                            (Format::Q4_1, true) => {
                                lanes::group::<Q4_1>(&t, rows, cols.start, packed)
                            }
                            (Format::Q8_0, true) => {
                                lanes::group::<Q8_0>(&t, rows, cols.start, packed)
                            }
                            (Format::Q4_1, false) => wide::columns::<Q4_1>(t, rows, cols.clone()),
                            _ => wide::columns::<Q8_0>(t, rows, cols.clone()),
                        }
                    }
                }
            });
        });
    } else {
        let total: usize = parts.iter().map(|&(_, n)| n).sum();
        candle_core::utils::barrier_pool().execute_chunked(total, |cols| {
            let mut first = 0;
            for (part, &(_, n)) in parts.iter().enumerate() {
                let mine = cols.start.max(first)..cols.end.min(first + n);
                if !mine.is_empty() {
                    let cols = mine.start - first..mine.end - first;
                    // SAFETY: as above.
                    unsafe {
                        match format {
                            Format::Q8_0 => columns::<Q8_0>(tile(part), rows, cols),
                            Format::Q4_0 => columns::<Q4_0>(tile(part), rows, cols),
                            Format::Q4_1 => columns::<Q4_1>(tile(part), rows, cols),
                        }
                    }
                }
                first += n;
            }
        });
    }
    for (out, &(_, n)) in outs.iter_mut().zip(parts) {
        // SAFETY: the pool call has returned, and every row's columns 0..n were written by
        // exactly one work item: the groups of 16 and the last few columns above, or the
        // column ranges of the AVX2 path, cover 0..n.
        unsafe { out.set_len(rows * n) };
    }
    parts
        .iter()
        .zip(outs)
        .map(|(&(_, n), out)| {
            let mut shape = x.dims().to_vec();
            if let Some(last) = shape.last_mut() {
                *last = n;
            }
            Tensor::from_vec(out, shape, &Device::Cpu)
        })
        .collect()
}

/// Each block of 32 values as `round(v / d)` with `d = max|v| / 127` stored at f16 precision —
/// exactly what candle's `BlockQ8_0::from_float` (and `BlockQ8_1`'s) computes, so the
/// products equal candle's. With `sums`, also Q8_1's `s = f16(f16(Σq) · d)`; with `pairs`, the
/// scales laid out for [`wide`]; with `int_sums`, each block's Σq for [`lanes`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantise(
    input: &[f32],
    rows: usize,
    k: usize,
    sums: bool,
    pairs: bool,
    int_sums: bool,
) -> Quantised {
    let blocks = rows * k / QK;
    let mut values = vec![0i8; rows * k];
    let mut scales = vec![0f32; blocks];
    let mut block_int_sums = vec![0i32; blocks];
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
        // SAFETY: `src` and `dst` are blocks of QK values.
        block_int_sums[b] = unsafe { quantise_block(src, dst, scale) };
    }
    // The f16 roundings eight blocks at a time: one at a time, their conversions' latency
    // made this the larger part of quantising, on the thread the kernel's workers wait for.
    // SAFETY (here and below): the caller checked the CPU's features.
    unsafe { f16_round_trip_all(&mut scales) };
    if sums {
        let mut s: Vec<f32> = block_int_sums.iter().map(|&s| s as f32).collect();
        unsafe { f16_round_trip_all(&mut s) };
        for (s, scale) in s.iter_mut().zip(&scales) {
            *s *= scale;
        }
        unsafe { f16_round_trip_all(&mut s) };
        for (row, s) in s.chunks_exact(per_row).enumerate() {
            let first = row / ROW_TILE * per_row * ROW_TILE + row % ROW_TILE;
            for (block, s) in s.iter().enumerate() {
                block_sums[first + block * ROW_TILE] = *s;
            }
        }
    }
    let pair_scales = if pairs {
        wide::pair_scales(&scales, rows, per_row)
    } else {
        Vec::new()
    };
    Quantised {
        values,
        scales,
        sums: block_sums,
        pair_scales,
        int_sums: if int_sums { block_int_sums } else { Vec::new() },
    }
}

/// One block: `dst[i] = round(src[i] · (1 / d))` (halves away from zero, saturating, NaN to 0, as
/// Rust's `f32::round() as i8`), `d = max|src| / 127`, `scale` = d (the caller rounds it to f16
/// precision, [`f16_round_trip_all`]); returns Σ dst. The scalar form of this took 6 % of a
/// batched decode step, on the thread that the kernel's other workers wait for.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantise_block(src: &[f32], dst: &mut [i8], scale: &mut f32) -> i32 {
    debug_assert!(src.len() == QK && dst.len() == QK);
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let v: [__m256; 4] =
        std::array::from_fn(|i| unsafe { _mm256_loadu_ps(src.as_ptr().add(8 * i)) });
    // `max_ps(a, m)` keeps m where a is NaN, as `f32::max` does.
    let mut m = _mm256_setzero_ps();
    for x in v {
        m = _mm256_max_ps(_mm256_and_ps(x, abs), m);
    }
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    let d = amax / 127.0;
    let inv = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
    *scale = d;
    let sign = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN));
    let (one, half) = (_mm256_set1_ps(1.0), _mm256_set1_ps(0.5));
    let (low, high) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
    let q: [__m256i; 4] = std::array::from_fn(|i| {
        let t = _mm256_mul_ps(v[i], inv);
        let whole = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(t);
        // t − trunc(t) is exact; a fraction of at least a half rounds away from zero.
        let up = _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_and_ps(_mm256_sub_ps(t, whole), abs), half);
        let away = _mm256_and_ps(up, _mm256_or_ps(_mm256_and_ps(t, sign), one));
        let r = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(whole, away), low), high);
        let not_nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_ORD_Q>(t, t));
        _mm256_and_si256(_mm256_cvttps_epi32(r), not_nan)
    });
    let words = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    // The packs interleave 128-bit lanes; put the values back in order.
    let bytes = _mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), bytes) };
    let total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    let total = _mm_add_epi32(
        _mm256_castsi256_si128(total),
        _mm256_extracti128_si256::<1>(total),
    );
    let total = _mm_add_epi32(total, _mm_shuffle_epi32::<0b01_00_11_10>(total));
    let total = _mm_add_epi32(total, _mm_shuffle_epi32::<0b10_11_00_01>(total));
    _mm_cvtsi128_si32(total)
}

/// Every value of `v` rounded to the nearest f16 (ties to even) and back, as
/// [`f16_round_trip`] does one.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_round_trip_all(v: &mut [f32]) {
    let mut eights = v.chunks_exact_mut(8);
    for e in &mut eights {
        // SAFETY: `e` holds 8 values.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(e.as_ptr()));
            _mm256_storeu_ps(e.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
    for x in eights.into_remainder() {
        *x = f16_round_trip(*x);
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

#[cfg(test)]
mod tests {
    use super::QK;

    /// What candle's `BlockQ8_0::from_float` computes for one block.
    fn scalar(src: &[f32]) -> (Vec<i8>, f32, i32) {
        let amax = src.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q: Vec<i8> = src.iter().map(|v| (v * inv).round() as i8).collect();
        let sum = q.iter().map(|&q| i32::from(q)).sum();
        // SAFETY: `available()` was checked by the caller.
        (q, unsafe { super::f16_round_trip(d) }, sum)
    }

    #[test]
    fn a_block_quantises_as_the_scalar_form_does() {
        if !super::available() {
            return;
        }
        let mut blocks: Vec<Vec<f32>> = (0..200)
            .map(|b| {
                (0..QK)
                    .map(|i| {
                        (((b * 31 + i) * 104729 % 2003) as f32 / 1001.0 - 1.0) * (b as f32 + 0.5)
                    })
                    .collect()
            })
            .collect();
        // Ties: with max 127 the scale is 1, so x.5 values round away from zero.
        blocks.push(
            (0..QK)
                .map(|i| if i == 0 { 127.0 } else { i as f32 - 16.5 })
                .collect(),
        );
        blocks.push(vec![0.0; QK]);
        blocks.push(
            (0..QK)
                .map(|i| if i == 3 { f32::NAN } else { i as f32 - 9.5 })
                .collect(),
        );
        blocks.push(
            (0..QK)
                .map(|i| if i == 5 { f32::INFINITY } else { -(i as f32) })
                .collect(),
        );
        blocks.push((0..QK).map(|i| (i as f32 - 16.0) * 1e-42).collect());
        for (n, src) in blocks.iter().enumerate() {
            let mut dst = [0i8; QK];
            let mut scale = 0f32;
            // SAFETY: `available()` holds; both are QK long.
            let sum = unsafe { super::quantise_block(src, &mut dst, &mut scale) };
            let mut rounded = [scale; 9];
            // SAFETY: as above.
            unsafe { super::f16_round_trip_all(&mut rounded) };
            assert!(rounded.iter().all(|r| r.to_bits() == rounded[0].to_bits()));
            let scale = rounded[0];
            let (q, d, s) = scalar(src);
            assert_eq!(dst.to_vec(), q, "block {n}");
            assert_eq!((scale.to_bits(), sum), (d.to_bits(), s), "block {n}");
        }
    }
}
