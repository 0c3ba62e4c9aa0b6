//! Q4_1 and Q8_0 products with AVX-512 VNNI: two weight blocks per 512-bit register. Since
//! [`super::lanes`] takes whole groups of 16 columns, this kernel computes the columns past a
//! product's last group (a weight whose row count is not a multiple of 16).
//!
//! With several input rows per weight block (batched decoding, prefill) the AVX2 kernel is
//! bound by arithmetic, not by reading weights: per block and row it issues maddubs, madd, a
//! conversion, a scale product and an FMA on 256-bit registers. Here one `vpdpbusd` replaces
//! maddubs + madd and each instruction covers two blocks, so a block and row costs four
//! 512-bit operations per two blocks instead of five 256-bit ones per block. Measured on this
//! machine's CPU (a Xeon with AVX-512), 1536×576 Q4_1 alone: 0.65 against 1.18 ns per block
//! and row for 8 rows; no slower for one.
//!
//! The integer sums are the AVX2 kernel's (no intermediate saturates: 4-bit weights are
//! unsigned, and Q8_0's are offset by 128 with `128 · Σx` taken off), grouped differently:
//! even blocks in the low 8 lanes, odd ones in the high 8, the halves added at the end. Every
//! output element goes through the same operations whatever the rows around it, so a row's
//! bits do not depend on its batch (tested in `super::super`).

use std::arch::x86_64::*;
use std::ops::Range;

use super::{Format, Q4_1, Q8_0, QK, ROW_TILE, Tile, f16_table, hsum};

/// Floats per pair of blocks in `Quantised::pair_scales`: 8 lanes for each block.
const PAIR_LANES: usize = 16;

/// Whether the kernel takes `format`'s weights.
pub(super) fn covers(format: Format) -> bool {
    matches!(format, Format::Q4_1 | Format::Q8_0)
}

/// Whether this CPU runs the kernel (Intel since Ice Lake, AMD since Zen 4) and
/// `TB_NO_AVX512` is unset (set, it keeps a process on the AVX2 kernel, to compare the two).
pub(in crate::qgemm) fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        super::available()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
            && std::env::var_os("TB_NO_AVX512").is_none()
    })
}

/// Each row's block scales as the kernel loads them: per pair of blocks, the first block's
/// scale in 8 lanes and the second's (zero past an odd last block) in the next 8.
pub(super) fn pair_scales(scales: &[f32], rows: usize, blocks: usize) -> Vec<f32> {
    let pairs = blocks.div_ceil(2);
    let mut out = vec![0f32; rows * pairs * PAIR_LANES];
    for (src, dst) in scales
        .chunks_exact(blocks)
        .zip(out.chunks_exact_mut(pairs * PAIR_LANES))
    {
        for (b, scale) in src.iter().enumerate() {
            let at = b / 2 * PAIR_LANES + b % 2 * 8;
            dst[at..at + 8].fill(*scale);
        }
    }
    out
}

/// Output columns `cols` for every input row, a tile of rows at a time, for weights in format
/// `F` (Q4_1 or Q8_0).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn columns<const F: u8>(mut t: Tile<'_>, rows: usize, cols: Range<usize>) {
    while t.first < rows {
        // 32 registers: up to 16 accumulators plus the blocks, their scales and the input.
        unsafe {
            match rows - t.first {
                1 => tile::<F, 1, 4>(&t, cols.clone()),
                2 => tile::<F, 2, 4>(&t, cols.clone()),
                3 => tile::<F, 3, 4>(&t, cols.clone()),
                4 => tile::<F, 4, 2>(&t, cols.clone()),
                5 => tile::<F, 5, 2>(&t, cols.clone()),
                6 => tile::<F, 6, 2>(&t, cols.clone()),
                7 => tile::<F, 7, 2>(&t, cols.clone()),
                _ => tile::<F, ROW_TILE, 2>(&t, cols.clone()),
            }
        }
        t.first += ROW_TILE;
    }
}

/// Rows `first..first + R` times weight rows `cols`, `C` weight rows at a time.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx2,fma,f16c")]
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

/// Rows `first..first + R` times weight rows `col..col + C`.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn block_tile<const F: u8, const R: usize, const C: usize>(t: &Tile<'_>, col: usize) {
    // Q4_1: f16 scale, f16 minimum, 16 bytes of nibbles; Q8_0: f16 scale, 32 signed bytes.
    let (block_bytes, values_at) = if F == Q4_1 {
        (4 + QK / 2, 4)
    } else {
        (2 + QK, 2)
    };
    let blocks = t.k / QK;
    // Q8_0's weights as unsigned bytes are w + 128 (`vpdpbusd` multiplies unsigned by signed).
    let offset = _mm512_set1_epi8(-128);
    let pairs = blocks.div_ceil(2);
    let low_nibbles = _mm512_set1_epi8(0x0F);
    // Each 128-bit lane holds a block's 16 bytes; the upper lane of each block's pair of
    // lanes shifted by 4 gives its high nibbles (ggml's order: low nibbles first).
    let shifts = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4);
    let zero = _mm512_setzero_si512();
    let f16s = f16_table();
    let weight_rows: [*const u8; C] = std::array::from_fn(|c| unsafe {
        t.weights.as_ptr().add((col + c) * blocks * block_bytes)
    });
    // Row r's blocks start at `values[r]`, its pair scales at `scales[r]` (bounds were checked
    // when the input was quantised: `first + R <= rows`).
    let values: [*const i8; R] =
        std::array::from_fn(|r| unsafe { t.q.values.as_ptr().add((t.first + r) * t.k) });
    let scales: [*const f32; R] = std::array::from_fn(|r| unsafe {
        t.q.pair_scales
            .as_ptr()
            .add((t.first + r) * pairs * PAIR_LANES)
    });
    let tile_sums = if F == Q4_1 {
        unsafe {
            t.q.sums
                .as_ptr()
                .add(t.first / ROW_TILE * blocks * ROW_TILE)
        }
    } else {
        std::ptr::null()
    };
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    // Lane r holds row r's Σ min · sum, block by block as the AVX2 kernel sums it.
    let mut min_terms = [_mm256_setzero_ps(); C];
    let scale_of = |p: *const u8| unsafe {
        _mm256_broadcast_ss(&*f16s.add(usize::from(p.cast::<u16>().read_unaligned())))
    };
    // One pair of blocks; `$second` is whether block `b + 1` exists (false only for an odd
    // count's last block). A macro, so that `$second` is a constant in each expansion and the
    // loop over full pairs tests nothing per row.
    macro_rules! pair {
        ($p:expr, $second:expr) => {{
            let b = 2 * $p;
            let mut w = [zero; C];
            let mut d = [_mm512_setzero_ps(); C];
            for c in 0..C {
                let first = unsafe { weight_rows[c].add(b * block_bytes) };
                let next = unsafe { first.add(block_bytes) };
                if F == Q4_1 {
                    let lo = _mm256_broadcastsi128_si256(unsafe {
                        _mm_loadu_si128(first.add(values_at).cast())
                    });
                    let bytes = if $second {
                        let hi = _mm256_broadcastsi128_si256(unsafe {
                            _mm_loadu_si128(next.add(values_at).cast())
                        });
                        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
                    } else {
                        _mm512_zextsi256_si512(lo)
                    };
                    w[c] = _mm512_and_si512(_mm512_srlv_epi32(bytes, shifts), low_nibbles);
                } else {
                    let lo = unsafe { _mm256_loadu_si256(first.add(values_at).cast()) };
                    // Past an odd last block the input is zero, so these lanes add nothing.
                    let bytes = if $second {
                        let hi = unsafe { _mm256_loadu_si256(next.add(values_at).cast()) };
                        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
                    } else {
                        _mm512_zextsi256_si512(lo)
                    };
                    w[c] = _mm512_xor_si512(bytes, offset);
                }
                d[c] = if $second {
                    _mm512_insertf32x8::<1>(_mm512_castps256_ps512(scale_of(first)), scale_of(next))
                } else {
                    _mm512_zextps256_ps512(scale_of(first))
                };
            }
            for r in 0..R {
                let at = unsafe { values[r].add(b * QK) };
                let x = if $second {
                    unsafe { _mm512_loadu_si512(at.cast()) }
                } else {
                    unsafe { _mm512_maskz_loadu_epi8(0xFFFF_FFFF, at) }
                };
                let x_scale = unsafe { _mm512_loadu_ps(scales[r].add($p * PAIR_LANES)) };
                // Q8_0: each lane starts at -128 · (its 4 inputs' sum), which the offset adds.
                let start = if F == Q8_0 {
                    _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, offset, x))
                } else {
                    zero
                };
                for c in 0..C {
                    let dot = _mm512_dpbusd_epi32(start, w[c], x);
                    let scale = _mm512_mul_ps(d[c], x_scale);
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r][c]);
                }
            }
            for block in (b..b + 1 + usize::from($second)).filter(|_| F == Q4_1) {
                let sums = unsafe { _mm256_loadu_ps(tile_sums.add(block * ROW_TILE)) };
                for c in 0..C {
                    let m = scale_of(unsafe { weight_rows[c].add(block * block_bytes + 2) });
                    min_terms[c] = _mm256_fmadd_ps(m, sums, min_terms[c]);
                }
            }
        }};
    }
    for p in 0..blocks / 2 {
        pair!(p, true);
    }
    if blocks % 2 == 1 {
        pair!(blocks / 2, false);
    }
    let mut mins = [[0f32; ROW_TILE]; C];
    if F == Q4_1 {
        for c in 0..C {
            unsafe { _mm256_storeu_ps(mins[c].as_mut_ptr(), min_terms[c]) };
        }
    }
    for r in 0..R {
        for c in 0..C {
            let halves = _mm256_add_ps(
                _mm512_castps512_ps256(acc[r][c]),
                _mm512_extractf32x8_ps::<1>(acc[r][c]),
            );
            let v = hsum(halves) + mins[c][r];
            unsafe { *t.out.add((t.first + r) * t.n + col + c) = v };
        }
    }
}
