//! Q4_1 and Q8_0 products with AVX-512 VNNI, sixteen output columns in the lanes of one
//! register.
//!
//! The pairwise kernel ([`super::wide`]) keeps one weight row's blocks across a register, so
//! every block, row and column ends in its own conversion, scale product and FMA: two 512-bit
//! operations per block and row besides the `vpdpbusd`, which bounded a batched decode step
//! (8 rows: 0.65 ns per block and row). Here a block of 16 weight rows is first transposed so
//! that lane j of register g holds bytes 4g..4g+3 of column j's block; each `vpdpbusd` then
//! multiplies 4 values of all 16 columns by 4 input values broadcast from memory, and a
//! block's 32 values end as one exact integer per lane. The conversion, the scale and the FMA
//! are paid once per block and row for 16 columns, and the transposition once per block for
//! all rows (llama.cpp's repacked x86 kernels do the same with a repacked copy of the
//! weights; this one transposes on the fly, so weights stay in ggml's layout and are held
//! once).
//!
//! A block's integer sum is exact whatever its grouping, so each output element is
//! `Σ_b fma(dot_b, d_b · x_b, ·)` (and, for Q4_1, `+ m_b · s_b`) taken block by block in
//! order — the same operations for every row count and every place in a tile, so a row's bits
//! do not depend on its batch. Columns past the last full group of 16 go to [`super::wide`],
//! which is batch-independent too, so a column always takes the same kernel.

use std::arch::x86_64::*;

use super::{Q4_1, Q8_0, QK, ROW_TILE, Tile};

/// Output columns per group: the lanes of a 512-bit register of i32 or f32.
pub(super) const LANES: usize = 16;

/// One block of a group of 16 columns, transposed: register g holds bytes 4g..4g+3 of every
/// column's 32 values as unsigned bytes (Q4_1's nibbles unpacked; Q8_0's offset by 128), then
/// the 16 columns' scales and (Q4_1) minimums as f32.
#[derive(Clone, Copy)]
#[repr(C)]
pub(super) struct PackedBlock {
    w: [__m512i; 8],
    d: __m512,
    m: __m512,
}

/// A group's blocks, reused across the groups one worker computes.
pub(super) type Packed = Vec<PackedBlock>;

thread_local! {
    /// Each thread's [`Packed`], kept across products: allocating and zeroing it per product
    /// (30 KB for a 1536-wide input) was a memset per product on every worker.
    static SCRATCH: std::cell::RefCell<Packed> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's scratch space for [`group`].
pub(super) fn with_scratch<R>(f: impl FnOnce(&mut Packed) -> R) -> R {
    SCRATCH.with_borrow_mut(f)
}

/// Output columns `col..col + 16` for every input row, for weights in format `F`; `packed`
/// is scratch space.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn group<const F: u8>(
    t: &Tile<'_>,
    rows: usize,
    col: usize,
    packed: &mut Packed,
) {
    let blocks = t.k / QK;
    let zero = PackedBlock {
        w: [_mm512_setzero_si512(); 8],
        d: _mm512_setzero_ps(),
        m: _mm512_setzero_ps(),
    };
    // `pack` overwrites every block of the first `blocks`: only growth writes zeros.
    if packed.len() < blocks {
        packed.resize(blocks, zero);
    }
    let packed = &mut packed[..blocks];
    let block_bytes = if F == Q4_1 { 4 + QK / 2 } else { 2 + QK };
    let row_bytes = blocks * block_bytes;
    // The next group's bytes (the worker's next item, as a rule): this group's reads stride
    // over 16 rows, which the hardware prefetchers follow poorly, while the next group is
    // one contiguous span. Its lines are asked for a share per block of work — packing this
    // group, then each tile of rows computing with it — so that they stream in while this
    // group computes rather than in one burst while it packs. (Asked for in proportion to
    // each part's time instead, so mostly while computing a batch, it was 6 % slower.)
    let next = (col + LANES) * row_bytes..((col + 2 * LANES).min(t.n) * row_bytes);
    let lines = next.len().div_ceil(64);
    let prefetch = Prefetch {
        // SAFETY: `next.start` is at most n · row_bytes, the end of the weights.
        start: unsafe { t.weights.as_ptr().add(next.start) },
        lines,
        per_slot: lines.div_ceil(blocks * (1 + rows.div_ceil(ROW_TILE))),
    };
    unsafe { pack::<F>(t, col, packed, &prefetch) };
    let mut first = 0;
    while first < rows {
        let slots = blocks * (1 + first / ROW_TILE);
        unsafe {
            match rows - first {
                1 => compute::<F, 1>(t, first, col, packed, &prefetch, slots),
                2 => compute::<F, 2>(t, first, col, packed, &prefetch, slots),
                3 => compute::<F, 3>(t, first, col, packed, &prefetch, slots),
                4 => compute::<F, 4>(t, first, col, packed, &prefetch, slots),
                5 => compute::<F, 5>(t, first, col, packed, &prefetch, slots),
                6 => compute::<F, 6>(t, first, col, packed, &prefetch, slots),
                7 => compute::<F, 7>(t, first, col, packed, &prefetch, slots),
                _ => compute::<F, ROW_TILE>(t, first, col, packed, &prefetch, slots),
            }
        }
        first += ROW_TILE;
    }
}

/// The next group's lines, `per_slot` of them per block of work (a slot).
struct Prefetch {
    start: *const u8,
    lines: usize,
    per_slot: usize,
}

impl Prefetch {
    /// Asks for slot `slot`'s lines.
    #[inline(always)]
    fn slot(&self, slot: usize) {
        for line in slot * self.per_slot..((slot + 1) * self.per_slot).min(self.lines) {
            // SAFETY: `line < lines`, which end at the end of the weights.
            let at = unsafe { self.start.add(line * 64) };
            // SAFETY: a prefetch reads nothing and does not fault.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(at.cast()) };
        }
    }
}

/// Transposes columns `col..col + 16` of the weights into `packed`, block by block.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vl,avx2,fma,f16c")]
unsafe fn pack<const F: u8>(
    t: &Tile<'_>,
    col: usize,
    packed: &mut [PackedBlock],
    prefetch: &Prefetch,
) {
    let (block_bytes, values_at) = if F == Q4_1 {
        (4 + QK / 2, 4)
    } else {
        (2 + QK, 2)
    };
    let blocks = t.k / QK;
    let row_bytes = blocks * block_bytes;
    let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    // Byte offsets of the 16 columns' rows; a group spans 16 · row_bytes, far below 2^31.
    let offsets = _mm512_mullo_epi32(lanes, _mm512_set1_epi32(row_bytes as i32));
    let low_nibbles = _mm512_set1_epi8(0x0F);
    let offset = _mm512_set1_epi8(-128);
    // SAFETY (whole body): the caller checked that the weights hold n · row_bytes bytes and
    // that `col + 16 <= n`; every read below is inside columns col..col + 16.
    let group = unsafe { t.weights.as_ptr().add(col * row_bytes) };
    for (b, out) in packed.iter_mut().enumerate() {
        prefetch.slot(b);
        let block = unsafe { group.add(b * block_bytes) };
        // Each column's first 4 bytes: the f16 scale, then (Q4_1) the f16 minimum.
        let head = unsafe { _mm512_i32gather_epi32::<1>(offsets, block.cast()) };
        out.d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
        if F == Q4_1 {
            out.m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(head)));
            let g = unsafe { transpose(block.add(values_at), row_bytes) };
            for (i, g) in g.iter().enumerate() {
                // ggml's order: byte j holds value j in its low nibble and value 16 + j in
                // its high one, so bytes 4g.. give values 4g.. and 16 + 4g...
                out.w[i] = _mm512_and_si512(*g, low_nibbles);
                out.w[4 + i] = _mm512_and_si512(_mm512_srli_epi16::<4>(*g), low_nibbles);
            }
        } else {
            for half in 0..2 {
                let g = unsafe { transpose(block.add(values_at + 16 * half), row_bytes) };
                for (i, g) in g.iter().enumerate() {
                    out.w[4 * half + i] = _mm512_xor_si512(*g, offset);
                }
            }
        }
    }
}

/// 16 bytes of each of 16 columns `row_bytes` apart, from `p`: register i holds every
/// column's bytes 4i..4i+3, column j in lane j.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2")]
#[inline]
unsafe fn transpose(p: *const u8, row_bytes: usize) -> [__m512i; 4] {
    let load = |c: usize| unsafe { _mm_loadu_si128(p.add(c * row_bytes).cast()) };
    // r[k]'s 128-bit lane L holds column 4L + k.
    let r: [__m512i; 4] = std::array::from_fn(|k| {
        let v = _mm512_castsi128_si512(load(k));
        let v = _mm512_inserti32x4::<1>(v, load(k + 4));
        let v = _mm512_inserti32x4::<2>(v, load(k + 8));
        _mm512_inserti32x4::<3>(v, load(k + 12))
    });
    // A 4 × 4 transpose of dwords in each 128-bit lane: lane L of the result i then holds
    // columns 4L..4L + 3's dword i, so its 16 dwords are columns 0..15 in order.
    let t0 = _mm512_unpacklo_epi32(r[0], r[1]);
    let t1 = _mm512_unpackhi_epi32(r[0], r[1]);
    let t2 = _mm512_unpacklo_epi32(r[2], r[3]);
    let t3 = _mm512_unpackhi_epi32(r[2], r[3]);
    [
        _mm512_unpacklo_epi64(t0, t2),
        _mm512_unpackhi_epi64(t0, t2),
        _mm512_unpacklo_epi64(t1, t3),
        _mm512_unpackhi_epi64(t1, t3),
    ]
}

/// Rows `first..first + R` times the packed group at `col`.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn compute<const F: u8, const R: usize>(
    t: &Tile<'_>,
    first: usize,
    col: usize,
    packed: &[PackedBlock],
    prefetch: &Prefetch,
    slots: usize,
) {
    let blocks = t.k / QK;
    let zero = _mm512_setzero_si512();
    // SAFETY (whole body): `first + R <= rows`, for which the input was quantised: values,
    // scales, block sums and (Q4_1) tile sums hold every index read below.
    let values: [*const i8; R] =
        std::array::from_fn(|r| unsafe { t.q.values.as_ptr().add((first + r) * t.k) });
    let scales: [*const f32; R] =
        std::array::from_fn(|r| unsafe { t.q.scales.as_ptr().add((first + r) * blocks) });
    let int_sums: [*const i32; R] = std::array::from_fn(|r| {
        if F == Q8_0 {
            unsafe { t.q.int_sums.as_ptr().add((first + r) * blocks) }
        } else {
            std::ptr::null()
        }
    });
    let tile_sums = if F == Q4_1 {
        unsafe { t.q.sums.as_ptr().add(first / ROW_TILE * blocks * ROW_TILE) }
    } else {
        std::ptr::null()
    };
    let mut acc = [_mm512_setzero_ps(); R];
    for (b, block) in packed.iter().enumerate() {
        prefetch.slot(slots + b);
        for r in 0..R {
            let x = unsafe { values[r].add(b * QK).cast::<i32>() };
            let input = |g: usize| _mm512_set1_epi32(unsafe { x.add(g).read_unaligned() });
            // Q8_0's weights are offset by 128: start from −128 · Σx.
            let start = if F == Q8_0 {
                _mm512_set1_epi32(-128 * unsafe { *int_sums[r].add(b) })
            } else {
                zero
            };
            // Two chains, so one row's block does not wait out eight dependent latencies.
            let mut even = start;
            let mut odd = zero;
            for g in (0..8).step_by(2) {
                even = _mm512_dpbusd_epi32(even, block.w[g], input(g));
                odd = _mm512_dpbusd_epi32(odd, block.w[g + 1], input(g + 1));
            }
            let dot = _mm512_cvtepi32_ps(_mm512_add_epi32(even, odd));
            let scale = _mm512_mul_ps(block.d, _mm512_set1_ps(unsafe { *scales[r].add(b) }));
            acc[r] = _mm512_fmadd_ps(dot, scale, acc[r]);
            if F == Q4_1 {
                let sum = unsafe { *tile_sums.add(b * ROW_TILE + r) };
                acc[r] = _mm512_fmadd_ps(block.m, _mm512_set1_ps(sum), acc[r]);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        // SAFETY: row first + r's columns col..col + 16 are this call's alone.
        unsafe { _mm512_storeu_ps(t.out.add((first + r) * t.n + col), *acc) };
    }
}
