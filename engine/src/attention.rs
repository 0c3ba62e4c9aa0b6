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

use crate::adapter::dot;
use crate::error::Result;

/// One sequence's keys and values for one block, position-major: `[position][kv_head][dim]`.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostKv {
    keys: Vec<f32>,
    values: Vec<f32>,
    /// Floats per position (`kv_heads * head_dim`); 0 until the first append.
    stride: usize,
}

impl HostKv {
    /// Positions held.
    pub(crate) fn len(&self) -> usize {
        self.keys.len().checked_div(self.stride).unwrap_or(0)
    }

    /// Appends `keys` and `values` of whole positions, `stride` floats each.
    pub(crate) fn append(&mut self, keys: &[f32], values: &[f32], stride: usize) {
        debug_assert_eq!(keys.len(), values.len());
        debug_assert!(self.stride == 0 || self.stride == stride);
        self.stride = stride;
        grow(&mut self.keys, keys.len(), stride);
        grow(&mut self.values, values.len(), stride);
        self.keys.extend_from_slice(keys);
        self.values.extend_from_slice(values);
    }

    /// The first `len` positions (a shared prefix).
    pub(crate) fn prefix(&self, len: usize) -> HostKv {
        let n = (len * self.stride).min(self.keys.len());
        HostKv {
            keys: self.keys[..n].to_vec(),
            values: self.values[..n].to_vec(),
            stride: self.stride,
        }
    }

    /// Keys and values as tensors `[1, kv_heads, positions, head_dim]` (for candle's ops).
    pub(crate) fn tensors(&self, head_dim: usize, device: &Device) -> Result<(Tensor, Tensor)> {
        let kv_heads = self.stride / head_dim.max(1);
        let shape = (1, self.len(), kv_heads, head_dim);
        let k = Tensor::from_slice(&self.keys, shape, device)?.transpose(1, 2)?;
        let v = Tensor::from_slice(&self.values, shape, device)?.transpose(1, 2)?;
        Ok((k.contiguous()?, v.contiguous()?))
    }
}

/// Positions a cache grows by at least when it is full.
const GROW_POSITIONS: usize = 64;

/// Makes room for `more` floats: by an eighth of what is held, at least [`GROW_POSITIONS`]
/// positions, rather than `Vec`'s doubling — a cache may then hold up to about 1/8 more than
/// its positions need, not twice (the stage's KV accounting counts positions).
fn grow(v: &mut Vec<f32>, more: usize, stride: usize) {
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
        let mut scratch = (Vec::new(), vec![0f32; head_dim]);
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

/// Scores and the weighted sum of values, reused across one worker's items.
type Scratch = (Vec<f32>, Vec<f32>);

/// One (sequence, head) item: every row of the job for query head `head`.
fn head_attention(job: &Job<'_>, head: usize, shape: &Shape, (scores, acc): &mut Scratch) {
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
            let k = &job.cache.keys[t * stride + kv_head * head_dim..][..head_dim];
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
            let v = &job.cache.values[t * stride + kv_head * head_dim..][..head_dim];
            for (a, &v) in acc.iter_mut().zip(v) {
                *a += p * v;
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
        let want = reference(&q, &k, &v, 0, heads, kv, d);

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
