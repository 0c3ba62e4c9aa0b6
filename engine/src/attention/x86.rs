//! One (sequence, head) item of [`super::attend`] with AVX-512, for head sizes of 64 and 128.
//!
//! The portable loop sums a position's q·k in one chain of 8-float operations and adds each
//! value row to the output one position after another; with 8 sequences of a hundred-odd
//! positions that took ~20 % of a decode step on this machine's CPU. Here the keys of 16
//! positions are multiplied with the query at once (`V` registers per head) and the 16 sums
//! reduced together by one transposing tree, and the values are summed in two interleaved
//! chains. Every output row is computed from its position's keys and values by the same
//! operations whatever the chunk or batch it arrives in, as the portable loop's are; the two
//! loops sum in different orders, and a process uses one of them for all its items.

use std::arch::x86_64::*;

use half::f16;

use super::{Job, KvView, Scratch, Shape};

/// Whether this CPU runs [`head`] and the head size is one it is built for.
pub(super) fn covers(head_dim: usize) -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    matches!(head_dim, 64 | 128)
        && *AVAILABLE.get_or_init(|| {
            is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512dq")
        })
}

/// Every row of `job` for query head `head`; `covers(shape.head_dim)` must hold.
pub(super) fn head(job: &Job<'_>, head: usize, shape: &Shape, scratch: &mut Scratch) {
    // SAFETY: `covers` checked the CPU's features and the head size.
    unsafe {
        match (shape.head_dim, job.cache.view()) {
            (64, KvView::Half(k, v)) => head_v::<4, f16>(job, k, v, head, shape, scratch),
            (64, KvView::Full(k, v)) => head_v::<4, f32>(job, k, v, head, shape, scratch),
            (_, KvView::Half(k, v)) => head_v::<8, f16>(job, k, v, head, shape, scratch),
            (_, KvView::Full(k, v)) => head_v::<8, f32>(job, k, v, head, shape, scratch),
        }
    }
}

/// A cache element type the loop reads 16 of at a time.
trait Element: Copy {
    /// f16, converted on load (exactly), rather than f32.
    const HALF: bool;
}

impl Element for f32 {
    const HALF: bool = false;
}

impl Element for f16 {
    const HALF: bool = true;
}

/// The 16 values at `p` as f32.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load<T: Element>(p: *const T) -> __m512 {
    if T::HALF {
        _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.cast()) })
    } else {
        unsafe { _mm512_loadu_ps(p.cast()) }
    }
}

/// [`head`] for a head of `V` registers of 16 floats.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
unsafe fn head_v<const V: usize, T: Element>(
    job: &Job<'_>,
    keys: &[T],
    values: &[T],
    head: usize,
    shape: &Shape,
    (scores, _, _): &mut Scratch,
) {
    let (head_dim, out) = (shape.head_dim, shape.out);
    debug_assert_eq!(head_dim, 16 * V);
    let width = shape.width();
    let scale = _mm512_set1_ps(1.0 / (head_dim as f32).sqrt());
    let kv_head = shape.kv_head(head);
    let stride = job.cache.stride;
    let job_rows = job.queries.len() / width;
    let (key_count, value_count) = (keys.len(), values.len());
    let (keys, values) = (keys.as_ptr(), values.as_ptr());
    for r in 0..job_rows {
        let q_at = r * width + head * head_dim;
        assert!(q_at + head_dim <= job.queries.len());
        // SAFETY: checked just above.
        let q: [__m512; V] = std::array::from_fn(|v| unsafe {
            _mm512_loadu_ps(job.queries.as_ptr().add(q_at + 16 * v))
        });
        // Positions 0..=pos + r: everything before this row and itself.
        let seen = job.pos + r + 1;
        assert!(seen * stride <= key_count && seen * stride <= value_count);
        assert!(kv_head * head_dim + head_dim <= stride);
        scores.clear();
        scores.resize(seen.next_multiple_of(16), 0.0);
        let mut max = _mm512_set1_ps(f32::NEG_INFINITY);
        for t0 in (0..seen).step_by(16) {
            let n = (seen - t0).min(16);
            let mut products = [_mm512_setzero_ps(); 16];
            for (j, p) in products.iter_mut().enumerate().take(n) {
                // SAFETY: position t0 + j < seen, whose keys the assertion above bounds.
                let k = unsafe { keys.add((t0 + j) * stride + kv_head * head_dim) };
                let mut s = _mm512_mul_ps(q[0], unsafe { load(k) });
                for (v, q) in q.iter().enumerate().skip(1) {
                    s = _mm512_fmadd_ps(*q, unsafe { load(k.add(16 * v)) }, s);
                }
                *p = s;
            }
            let s = _mm512_mul_ps(sum_each(&products), scale);
            let live = if n == 16 { 0xFFFF } else { (1u16 << n) - 1 };
            max = _mm512_mask_max_ps(max, live, max, s);
            // SAFETY: `scores` holds a multiple of 16 floats past t0.
            unsafe { _mm512_storeu_ps(scores.as_mut_ptr().add(t0), s) };
        }
        let max = _mm512_reduce_max_ps(max);
        let mut total = 0f32;
        for s in scores.iter_mut().take(seen) {
            *s = (*s - max).exp();
            total += *s;
        }
        let inv = _mm512_set1_ps(1.0 / total);
        // Two chains (even and odd positions), added at the end.
        let mut acc = [[_mm512_setzero_ps(); V]; 2];
        for (t, &p) in scores.iter().enumerate().take(seen) {
            let p = _mm512_set1_ps(p);
            // SAFETY: t < seen, whose values the assertion above bounds.
            let v_row = unsafe { values.add(t * stride + kv_head * head_dim) };
            let chain = &mut acc[t % 2];
            for (v, a) in chain.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(p, unsafe { load(v_row.add(16 * v)) }, *a);
            }
        }
        let at = (job.out_row + r) * width + head * head_dim;
        for (v, (even, odd)) in acc[0].iter().zip(&acc[1]).enumerate() {
            let sum = _mm512_mul_ps(_mm512_add_ps(*even, *odd), inv);
            // SAFETY: each (row, head) slice of `out` is written by exactly one work item,
            // and `out` outlives the pool call, which returns when all are done.
            unsafe { _mm512_storeu_ps((out as *mut f32).add(at + 16 * v), sum) };
        }
    }
}

/// The sums of 16 registers, lane j holding register j's: a tree of 128-bit-lane shuffles
/// and adds (45 operations, where 16 horizontal sums take ~100).
#[target_feature(enable = "avx512f,avx512dq")]
#[inline]
fn sum_each(x: &[__m512; 16]) -> __m512 {
    // Pairs: per 128-bit lane, [a0 + a2, b0 + b2, a1 + a3, b1 + b3].
    let pairs: [__m512; 8] = std::array::from_fn(|i| {
        let (a, b) = (x[2 * i], x[2 * i + 1]);
        _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b))
    });
    // Quads: per 128-bit lane, the partial sums of 4 registers in order.
    let quads: [__m512; 4] = std::array::from_fn(|i| {
        let (a, b) = (
            _mm512_castps_pd(pairs[2 * i]),
            _mm512_castps_pd(pairs[2 * i + 1]),
        );
        _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
        )
    });
    // Fold the four 128-bit lanes: quads[i]'s total lands in lane i.
    let fold = |a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
        )
    };
    fold(fold(quads[0], quads[1]), fold(quads[2], quads[3]))
}
