//! Attention for CPU shards over a KV cache kept in plain host memory.
//!
//! Run with candle's tensor ops, one sequence's attention in one layer took ~15 ops (RoPE, two
//! cache concatenations that copy the whole cache, two `repeat_kv` copies, two matmuls, mask,
//! softmax, transposes), each with its own allocation and dispatch, and candle's element-wise
//! ops run on rayon, whose spinning threads competed with the matrix kernels' pool for the same
//! cores. Measured (SmolLM2, 30 layers, 2 threads): the step outside the weights' products took
//! ~2 ms for one sequence and ~16 ms for eight; replacing these ops took one sequence's decode
//! from 97 to 165 tokens/s. Here a sequence's keys and values are appended in place
//! ([`HostKv`]), RoPE is applied to the new rows only, and each query head reads its KV head
//! directly (grouped-query attention without copies), the (sequence, head) pairs spread over
//! candle's barrier pool, the one the matrix kernels use. Where the CPU has AVX-512 and heads
//! are 64 or 128 wide, an item runs [`x86`]'s loop (16 positions' scores at once).
//!
//! Each output row is computed from its position's keys and values by the same operations in
//! the same order whatever the chunk or batch it arrives in, so a sequence's tokens do not
//! depend on how its prompt was chunked, whether a prefix came from the prefix cache, or what
//! it was batched with.

use candle_core::{Device, Tensor};
use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::adapter::dot;
use crate::error::Result;

/// One sequence's keys and values for one block, position-major: `[position][kv_head][dim]`.
///
/// Held at f16, as llama.cpp holds its cache and as placement sizes it (2 bytes a value): a
/// decode step reads every position's keys and values, so at f32 eight sequences of a hundred
/// positions read a third as many bytes of cache as SmolLM2's weights. A cache started while
/// the process routes everything through candle ([`crate::use_candle_kernels`]) holds f32, so
/// that the engine still equals candle's reference model there.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostKv {
    keys: Rows,
    values: Rows,
    /// Values per position (`kv_heads * head_dim`); 0 until the first append.
    stride: usize,
}

/// A cache's numbers, in the precision it was started with.
#[derive(Debug, Clone)]
enum Rows {
    Half(Vec<f16>),
    Full(Vec<f32>),
}

impl Default for Rows {
    fn default() -> Self {
        Rows::empty(false)
    }
}

impl Rows {
    fn empty(full: bool) -> Self {
        if full {
            Rows::Full(Vec::new())
        } else {
            Rows::Half(Vec::new())
        }
    }

    fn len(&self) -> usize {
        match self {
            Rows::Half(v) => v.len(),
            Rows::Full(v) => v.len(),
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn append(&mut self, src: &[f32], stride: usize) {
        match self {
            Rows::Half(v) => {
                grow(v, src.len(), stride);
                let at = v.len();
                v.resize(at + src.len(), f16::ZERO);
                v[at..].convert_from_f32_slice(src);
            }
            Rows::Full(v) => {
                grow(v, src.len(), stride);
                v.extend_from_slice(src);
            }
        }
    }

    fn prefix(&self, n: usize) -> Rows {
        match self {
            Rows::Half(v) => Rows::Half(v[..n.min(v.len())].to_vec()),
            Rows::Full(v) => Rows::Full(v[..n.min(v.len())].to_vec()),
        }
    }

    fn to_f32(&self) -> std::borrow::Cow<'_, [f32]> {
        match self {
            Rows::Half(v) => {
                let mut out = vec![0f32; v.len()];
                v.convert_to_f32_slice(&mut out);
                out.into()
            }
            Rows::Full(v) => v.as_slice().into(),
        }
    }

    #[cfg(test)]
    fn capacity(&self) -> usize {
        match self {
            Rows::Half(v) => v.capacity(),
            Rows::Full(v) => v.capacity(),
        }
    }
}

/// A cache's keys and values as the attention loops read them.
pub(crate) enum KvView<'a> {
    Half(&'a [f16], &'a [f16]),
    Full(&'a [f32], &'a [f32]),
}

impl HostKv {
    /// Positions held.
    pub(crate) fn len(&self) -> usize {
        self.keys.len().checked_div(self.stride).unwrap_or(0)
    }

    /// Appends `keys` and `values` of whole positions, `stride` floats each.
    pub(crate) fn append(&mut self, keys: &[f32], values: &[f32], stride: usize) {
        let full = crate::qgemm::candle_kernels_only();
        self.append_in(keys, values, stride, full);
    }

    /// [`HostKv::append`], an empty cache starting in f32 if `full`, f16 otherwise.
    fn append_in(&mut self, keys: &[f32], values: &[f32], stride: usize, full: bool) {
        debug_assert_eq!(keys.len(), values.len());
        debug_assert!(self.stride == 0 || self.stride == stride);
        if self.keys.is_empty() {
            (self.keys, self.values) = (Rows::empty(full), Rows::empty(full));
        }
        self.stride = stride;
        self.keys.append(keys, stride);
        self.values.append(values, stride);
    }

    /// The first `len` positions (a shared prefix).
    pub(crate) fn prefix(&self, len: usize) -> HostKv {
        let n = len * self.stride;
        HostKv {
            keys: self.keys.prefix(n),
            values: self.values.prefix(n),
            stride: self.stride,
        }
    }

    /// Keys and values, each `[position][kv_head][dim]`.
    pub(crate) fn view(&self) -> KvView<'_> {
        match (&self.keys, &self.values) {
            (Rows::Half(k), Rows::Half(v)) => KvView::Half(k, v),
            (Rows::Full(k), Rows::Full(v)) => KvView::Full(k, v),
            // `append` starts both alike.
            _ => unreachable!("a cache's keys and values are held alike"),
        }
    }

    /// Keys and values as f32 tensors `[1, kv_heads, positions, head_dim]` (for candle's ops).
    pub(crate) fn tensors(&self, head_dim: usize, device: &Device) -> Result<(Tensor, Tensor)> {
        let kv_heads = self.stride / head_dim.max(1);
        let shape = (1, self.len(), kv_heads, head_dim);
        let k = Tensor::from_slice(&self.keys.to_f32(), shape, device)?.transpose(1, 2)?;
        let v = Tensor::from_slice(&self.values.to_f32(), shape, device)?.transpose(1, 2)?;
        Ok((k.contiguous()?, v.contiguous()?))
    }
}

/// Positions a cache grows by at least when it is full.
const GROW_POSITIONS: usize = 64;

/// Makes room for `more` values: by an eighth of what is held, at least [`GROW_POSITIONS`]
/// positions, rather than `Vec`'s doubling — a cache may then hold up to about 1/8 more than
/// its positions need, not twice (the stage's KV accounting counts positions).
fn grow<T>(v: &mut Vec<T>, more: usize, stride: usize) {
    let need = v.len() + more;
    if need > v.capacity() {
        let step = (v.len() / 8).max(GROW_POSITIONS * stride);
        v.reserve_exact(need.max(v.len() + step) - v.len());
    }
}

/// Rotates `rows` rows of `heads` heads of `head_dim` values (`x`, row-major) whose first row
/// is at position `pos`: interleaved pairs `(2i, 2i+1)` (llama.cpp's llama/mistral layout), or
/// NEOX halves `(i, i + head_dim/2)` (qwen2). `cos`/`sin` are `[position][head_dim / 2]`.
pub(crate) fn rope(
    x: &mut [f32],
    heads: usize,
    head_dim: usize,
    pos: usize,
    neox: bool,
    cos: &[f32],
    sin: &[f32],
) {
    let half = head_dim / 2;
    for (r, row) in x.chunks_exact_mut(heads * head_dim).enumerate() {
        let at = (pos + r) * half;
        let (cos, sin) = (&cos[at..at + half], &sin[at..at + half]);
        for head in row.chunks_exact_mut(head_dim) {
            for i in 0..half {
                let (a, b) = if neox {
                    (i, i + half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos[i] - x1 * sin[i];
                head[b] = x0 * sin[i] + x1 * cos[i];
            }
        }
    }
}

/// One sequence's part of a batched attention: its query rows (`[row][head][dim]`, already
/// rotated), the first row's position, and its cache (already holding these rows' keys).
pub(crate) struct Job<'a> {
    pub(crate) queries: &'a [f32],
    pub(crate) pos: usize,
    pub(crate) cache: &'a HostKv,
    /// Where its output rows (`[row][head][dim]`) start in the output.
    pub(crate) out_row: usize,
}

/// Causal attention of every job's rows; returns `[row][head][dim]` for all rows.
pub(crate) fn attend(
    jobs: &[Job<'_>],
    rows: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
) -> Vec<f32> {
    let width = heads * head_dim;
    let mut out = vec![0f32; rows * width];
    let shape = Shape {
        heads,
        kv_heads,
        head_dim,
        out: out.as_mut_ptr() as usize,
    };
    #[cfg(target_arch = "x86_64")]
    let wide = x86::covers(head_dim);
    candle_core::utils::barrier_pool().execute_chunked(jobs.len() * heads, |items| {
        let mut scratch = (Vec::new(), vec![0f32; head_dim], vec![0f32; head_dim]);
        for item in items {
            let (job, head) = (&jobs[item / heads], item % heads);
            #[cfg(target_arch = "x86_64")]
            if wide {
                x86::head(job, head, &shape, &mut scratch);
                continue;
            }
            head_attention(job, head, &shape, &mut scratch);
        }
    });
    out
}

#[cfg(target_arch = "x86_64")]
mod x86;

/// The sizes every work item of one [`attend`] shares, and where its output starts.
struct Shape {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    out: usize,
}

impl Shape {
    /// Floats per query (and output) row: every head's.
    fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// The KV head query head `head` reads (grouped-query attention).
    fn kv_head(&self, head: usize) -> usize {
        let kv_heads = self.kv_heads.max(1);
        (head / (self.heads / kv_heads)).min(kv_heads - 1)
    }
}

/// Scores, the weighted sum of values and one key row as f32, reused across one worker's items.
type Scratch = (Vec<f32>, Vec<f32>, Vec<f32>);

/// One (sequence, head) item: every row of the job for query head `head`.
fn head_attention(job: &Job<'_>, head: usize, shape: &Shape, scratch: &mut Scratch) {
    match job.cache.view() {
        KvView::Half(keys, values) => head_rows(job, keys, values, head, shape, scratch),
        KvView::Full(keys, values) => head_rows(job, keys, values, head, shape, scratch),
    }
}

/// [`head_attention`] over a cache of `T`s.
fn head_rows<T: Copy>(
    job: &Job<'_>,
    keys: &[T],
    values: &[T],
    head: usize,
    shape: &Shape,
    (scores, acc, k): &mut Scratch,
) where
    f32: From<T>,
{
    let (head_dim, out) = (shape.head_dim, shape.out);
    let width = shape.width();
    let scale = 1.0 / (head_dim as f32).sqrt();
    let kv_head = shape.kv_head(head);
    let stride = job.cache.stride;
    let job_rows = job.queries.len() / width;
    for r in 0..job_rows {
        let q = &job.queries[r * width + head * head_dim..][..head_dim];
        // Positions 0..=pos + r: everything before this row and itself.
        let seen = job.pos + r + 1;
        scores.clear();
        scores.extend((0..seen).map(|t| {
            let row = &keys[t * stride + kv_head * head_dim..][..head_dim];
            for (k, &x) in k.iter_mut().zip(row) {
                *k = f32::from(x);
            }
            dot(q, k) * scale
        }));
        let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        let mut total = 0f32;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            total += *s;
        }
        for s in scores.iter_mut() {
            *s /= total;
        }
        acc.fill(0.0);
        for (t, &p) in scores.iter().enumerate() {
            let v = &values[t * stride + kv_head * head_dim..][..head_dim];
            for (a, &v) in acc.iter_mut().zip(v) {
                *a += p * f32::from(v);
            }
        }
        let at = (job.out_row + r) * width + head * head_dim;
        for (i, a) in acc.iter().enumerate() {
            // SAFETY: each (row, head) slice of `out` is written by exactly one work item,
            // and `out` outlives the pool call, which returns when all are done.
            unsafe { *(out as *mut f32).add(at + i) = *a };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache filled a position at a time holds at most an eighth more than it needs (plus
    /// one growth step), not the twice `Vec`'s doubling may.
    #[test]
    fn a_growing_cache_holds_little_more_than_its_positions() {
        let stride = 192;
        let row = vec![0.5f32; stride];
        let mut kv = HostKv::default();
        for n in 1..=3000 {
            kv.append(&row, &row, stride);
            let held = kv.keys.capacity().max(kv.values.capacity());
            let bound = n * stride + (n * stride / 8).max(GROW_POSITIONS * stride);
            assert!(
                held <= bound,
                "{n} positions: {held} floats held, bound {bound}"
            );
        }
        assert_eq!(kv.len(), 3000);
    }

    /// Attention computed the plain way, in f64, for comparison.
    fn reference(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        pos: usize,
        heads: usize,
        kv: usize,
        d: usize,
    ) -> Vec<f32> {
        let rows = q.len() / (heads * d);
        let mut out = vec![0f32; q.len()];
        for r in 0..rows {
            for h in 0..heads {
                let g = h / (heads / kv);
                let qv = &q[(r * heads + h) * d..][..d];
                let seen = pos + r + 1;
                let s: Vec<f64> = (0..seen)
                    .map(|t| {
                        let kv_ = &k[(t * kv + g) * d..][..d];
                        qv.iter()
                            .zip(kv_)
                            .map(|(a, b)| f64::from(a * b))
                            .sum::<f64>()
                            / (d as f64).sqrt()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for i in 0..d {
                    let y: f64 = (0..seen)
                        .map(|t| e[t] * f64::from(v[(t * kv + g) * d + i]))
                        .sum();
                    out[(r * heads + h) * d + i] = (y / z) as f32;
                }
            }
        }
        out
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 / 1000.0
                    - 1.0
            })
            .collect()
    }

    #[test]
    fn matches_plain_attention_and_does_not_depend_on_chunking() {
        // Head sizes 64 and 128 take the AVX-512 loop where the CPU has it; 16 the portable one.
        for (heads, kv, d, len) in [(6, 2, 16, 11), (9, 3, 64, 37), (4, 1, 128, 20)] {
            attention_case(heads, kv, d, len);
        }
    }

    fn attention_case(heads: usize, kv: usize, d: usize, len: usize) {
        let stride = kv * d;
        let (q, k, v) = (
            values(len * heads * d, 1),
            values(len * stride, 2),
            values(len * stride, 3),
        );
        // The cache holds keys and values at f16: the reference reads them as rounded.
        let half =
            |x: &[f32]| -> Vec<f32> { x.iter().map(|&x| f16::from_f32(x).to_f32()).collect() };
        let want = reference(&q, &half(&k), &half(&v), 0, heads, kv, d);

        // All rows at once.
        let mut cache = HostKv::default();
        cache.append(&k, &v, stride);
        let whole = attend(
            &[Job {
                queries: &q,
                pos: 0,
                cache: &cache,
                out_row: 0,
            }],
            len,
            heads,
            kv,
            d,
        );
        for (a, b) in whole.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }

        // The same rows in chunks of 4, 1, 6: the same bits.
        let mut cache = HostKv::default();
        let mut chunked = Vec::new();
        let mut at = 0;
        for n in [4, 1, len - 5] {
            cache.append(
                &k[at * stride..(at + n) * stride],
                &v[at * stride..(at + n) * stride],
                stride,
            );
            let qs = &q[at * heads * d..(at + n) * heads * d];
            chunked.extend(attend(
                &[Job {
                    queries: qs,
                    pos: at,
                    cache: &cache,
                    out_row: 0,
                }],
                n,
                heads,
                kv,
                d,
            ));
            at += n;
        }
        assert_eq!(chunked, whole);
        assert_eq!(cache.len(), len);
        assert_eq!(cache.prefix(4).len(), 4);
    }

    /// A cache holds f16 (half the bytes, as placement sizes it) unless it was started while
    /// everything runs through candle, when it holds f32 to equal candle's reference model
    /// (and keeps it); its tensors give back what the attention loops read.
    #[test]
    fn a_cache_holds_f16_unless_started_for_candle_s_ops() {
        let (k, v) = (values(2 * 8, 5), values(2 * 8, 6));
        let mut half = HostKv::default();
        half.append(&k, &v, 8);
        let KvView::Half(hk, _) = half.view() else {
            panic!("a cache holds f16 by default");
        };
        let read: Vec<f32> = hk.iter().map(|x| x.to_f32()).collect();
        let (tk, _) = half.tensors(4, &Device::Cpu).expect("tensors");
        // [1, kv_heads, positions, head_dim] from [position][kv_head][dim].
        let tk = tk
            .transpose(1, 2)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>());
        assert_eq!(tk.expect("to_vec"), read);
        assert_ne!(read, k, "these values are not all exact at f16");

        let mut full = HostKv::default();
        full.append_in(&k, &v, 8, true);
        let KvView::Full(fk, fv) = full.view() else {
            panic!("a cache started for candle's ops holds f32");
        };
        assert_eq!((fk, fv), (k.as_slice(), v.as_slice()));
        // Appending later keeps the precision it started with.
        full.append_in(&k[..8], &v[..8], 8, false);
        assert!(matches!(full.view(), KvView::Full(..)));
        assert_eq!(full.len(), 3);
    }

    #[test]
    fn rope_rotates_pairs_by_position() {
        // head_dim 4: two pairs; position 1 rotates pair i by angle (i + 1) * 0.1.
        let half = 2;
        let angles = [[0.0f32, 0.0], [0.1, 0.2]];
        let cos: Vec<f32> = angles.iter().flatten().map(|a| a.cos()).collect();
        let sin: Vec<f32> = angles.iter().flatten().map(|a| a.sin()).collect();
        let mut x = vec![1.0, 0.0, 0.0, 1.0];
        rope(&mut x, 1, 2 * half, 1, false, &cos, &sin);
        let want = [0.1f32.cos(), 0.1f32.sin(), -(0.2f32.sin()), 0.2f32.cos()];
        for (a, b) in x.iter().zip(want) {
            assert!((a - b).abs() < 1e-6);
        }
        let mut y = vec![1.0, 0.0, 0.0, 1.0];
        rope(&mut y, 1, 2 * half, 1, true, &cos, &sin);
        // NEOX pairs (0, 2) and (1, 3).
        let want = [0.1f32.cos(), -(0.2f32.sin()), 0.1f32.sin(), 0.2f32.cos()];
        for (a, b) in y.iter().zip(want) {
            assert!((a - b).abs() < 1e-6);
        }
    }
}
