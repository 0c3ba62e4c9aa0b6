//! Tensor parallelism (Megatron-style) for the built-in engine: one [`Shard`] per rank, each
//! holding a slice of every block of the same block range, the ranks summing partial outputs
//! through an [`AllReduce`]. It is meant to split the blocks of a model *within* a pipeline
//! stage across Macs (or processes), beside the pipeline's split *between* stages; this module
//! is the engine side only (a rank runs with any [`AllReduce`]; tb's transport collectives are
//! to implement it).
//!
//! ## The split ([`TpSlice`])
//!
//! - Attention by KV-head groups: a rank gets whole GQA groups, i.e. a contiguous run of KV
//!   heads and the query heads that share them (candle's `repeat_kv` maps query head `h` to KV
//!   head `h / (heads / kv_heads)`). When the KV heads do not divide by the ranks the first
//!   ranks get one more (SmolLM2's 3 KV heads over 2 ranks: 2 + 1, i.e. 6 + 3 query heads), so
//!   there can be at most as many ranks as KV heads.
//! - MLP by columns: a rank gets a contiguous run of the `ffn` intermediate features, cut on
//!   multiples of 32 (the block size of Q4_0/Q4_1/Q8_0), evenly in units of 32.
//! - q, k, v, gate, up are column-parallel: a rank keeps the rows (output features) of its heads
//!   / features, and their biases (qwen2's q/k/v biases). o and down are row-parallel: a rank
//!   keeps the input columns of its heads / features, computes a partial output over them, and
//!   the partial outputs are summed across ranks: one all-reduce after attention and one after
//!   the MLP per block (`Block::forward`). An o/down bias (no supported
//!   architecture has one) is added on rank 0 only, so it is counted once in the sum.
//! - A LoRA adapter is split the same way: for a column-parallel layer a rank keeps its rows of
//!   B (A whole), for a row-parallel one its columns of A (B whole), so the low-rank partial
//!   outputs sum to the whole delta too.
//! - Replicated on every rank: the RMSNorm weights (tiny) and the token embedding. After every
//!   all-reduce each rank holds the same full hidden states (the residual stream is replicated),
//!   and each rank needs the full input rows: a local embedding lookup costs one table in memory
//!   per rank (SmolLM2's is stored Q8_0: 30 MB) but no extra collective per step, while a
//!   rank-0-only table would need a broadcast of every step's rows.
//! - Final norm and output head on rank 0 only: every rank ends the last block with the same
//!   hidden states, so one rank computing logits is enough, and the head is the largest single
//!   matrix (the tied 49152 x 576 table for SmolLM2). The other ranks of a last stage return
//!   [`StageOutput::Hidden`](crate::StageOutput) (the final hidden states, before the norm)
//!   where rank 0 returns logits; in a stage that is not the last, every rank returns the same
//!   hidden states and rank 0's is the stage's output. (A vocab-parallel head with an
//!   all-gather would split the head's compute too; not done.)
//!
//! Each rank thus holds about 1/t of the block weights (KV-group granularity makes it uneven
//! when the KV heads do not divide: 54% / 46% for SmolLM2 over 2 ranks) and 1/t of the KV
//! cache.
//!
//! ## Slicing quantised weights at load
//!
//! A GGUF matrix is stored row by row, each row a run of quantisation blocks. Rows are cut by
//! copying whole rows' bytes; input columns by copying, per row, the blocks of the column range,
//! which needs the range to fall on the stored type's block boundaries (32 for Q4_0/Q4_1/Q8_0,
//! 256 for the K-quants). Both keep the stored blocks bit for bit, and since Q8_0
//! requantisation (the default, [`crate::weights`]) works block by block, requantising the cut
//! gives exactly the blocks of the requantised whole matrix. When a column range does not fall
//! on the stored blocks (e.g. a K-quant's 256 against a 192-column head group) the matrix is
//! dequantised, cut and requantised to Q8_0 (to f32 when the range is not even on 32): correct,
//! but a different rounding than the unsplit model's.
//!
//! ## Numerics
//!
//! Column-parallel outputs are the unsplit model's rows exactly (same blocks, same activation
//! quantisation, same per-row dot products), and attention runs per head as before. The
//! row-parallel o and down projections are where results move: each rank sums its blocks, then
//! the all-reduce adds the partial sums, a different association of the same f32 additions, so
//! results differ from the unsplit model by f32 rounding, and such a difference can move an
//! 8-bit rounding step of the next layer's activation quantisation. Greedy tokens match
//! (`engine/tests/tensor_parallel.rs`); logits are close, not equal.
//!
//! ## The all-reduce
//!
//! [`AllReduce::all_reduce_sum`] must leave the *bit-identical* sum on every rank (e.g. add in
//! rank order everywhere, or reduce each chunk once and broadcast it, as a ring all-reduce
//! does): the ranks' replicated residual streams must not drift apart. Collectives block, so
//! every rank must be given the same batch items in the same order (input checks are
//! deterministic, so an item one rank refuses every rank refuses before any collective).
//! [`InProcessAllReduce`] is an in-process implementation for tests and benches (ranks as
//! threads, channels between every pair). The hidden states cross it as f32 (`hidden` values per
//! row, twice per block), copied off the device and back when the shard runs on Metal.
//!
//! ## Measured
//!
//! `tb-enginebench --tp 2` (SmolLM2-135M Q8_0, 50-token prompt, 64 greedy tokens, best of 3, on
//! the x86_64 dev box's 2 cores shared with other builds, load average 3-7): one process on 2
//! threads 68.2 decode tok/s; one rank on 1 thread 58.7-60.4; 2 ranks on 1 thread each
//! 48.0-52.7. On so small a model the 60 synchronisations per token (and rank 0 computing the
//! head alone) cost more than halving each block's matmuls saves, and on busy cores every
//! all-reduce waits for the slowest rank; tensor parallelism is for models whose blocks are too
//! big for one machine's memory or matmul throughput.

use std::borrow::Cow;
use std::ops::Range;
use std::path::Path;
use std::sync::mpsc::{Receiver, Sender, channel};

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Tensor};

use crate::adapter::{LoraPair, Target};
use crate::block::{Block, BlockLora};
use crate::error::{EngineError, Result};
use crate::gguf::{GgufIndex, ModelConfig};
use crate::shard::{LoadOptions, Shard, default_device};
use crate::weights::TensorReader;

/// Sums f32 buffers across the ranks of a tensor-parallel group.
pub trait AllReduce: Send {
    /// Replaces `data` on every rank with the element-wise sum of all ranks' `data` (every rank
    /// passes the same length). Every rank must end with bit-identical values (see the module
    /// doc). Blocks until every rank has contributed.
    fn all_reduce_sum(&mut self, data: &mut [f32]) -> Result<()>;
}

/// An [`AllReduce`] between threads of one process, for tests and benches: a channel between
/// every pair of ranks; each rank sends its buffer to every peer and adds all buffers in rank
/// order, so all ranks compute the same sum bit for bit. A rank whose peer has gone (dropped,
/// or its thread panicked) gets an error instead of waiting forever.
#[derive(Debug)]
pub struct InProcessAllReduce {
    rank: usize,
    to: Vec<Option<Sender<Vec<f32>>>>,
    from: Vec<Option<Receiver<Vec<f32>>>>,
}

impl InProcessAllReduce {
    /// The members of a group of `ranks`, in rank order (move each to its rank's thread).
    pub fn group(ranks: usize) -> Vec<InProcessAllReduce> {
        let mut to: Vec<Vec<Option<Sender<Vec<f32>>>>> = (0..ranks)
            .map(|_| (0..ranks).map(|_| None).collect())
            .collect();
        let mut from: Vec<Vec<Option<Receiver<Vec<f32>>>>> = (0..ranks)
            .map(|_| (0..ranks).map(|_| None).collect())
            .collect();
        for i in 0..ranks {
            for j in 0..ranks {
                if i != j {
                    let (tx, rx) = channel();
                    to[i][j] = Some(tx);
                    from[j][i] = Some(rx);
                }
            }
        }
        to.into_iter()
            .zip(from)
            .enumerate()
            .map(|(rank, (to, from))| InProcessAllReduce { rank, to, from })
            .collect()
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
}

fn collective(detail: impl Into<String>) -> EngineError {
    EngineError::TensorParallel {
        detail: detail.into(),
    }
}

impl AllReduce for InProcessAllReduce {
    fn all_reduce_sum(&mut self, data: &mut [f32]) -> Result<()> {
        let ranks = self.to.len();
        if ranks <= 1 {
            return Ok(());
        }
        for (peer, tx) in self.to.iter().enumerate() {
            if let Some(tx) = tx {
                tx.send(data.to_vec()).map_err(|_| {
                    collective(format!("all-reduce: rank {peer} has left the group"))
                })?;
            }
        }
        let mut parts: Vec<Option<Vec<f32>>> = (0..ranks).map(|_| None).collect();
        for (peer, rx) in self.from.iter().enumerate() {
            if let Some(rx) = rx {
                let part = rx.recv().map_err(|_| {
                    collective(format!("all-reduce: rank {peer} has left the group"))
                })?;
                if part.len() != data.len() {
                    return Err(collective(format!(
                        "all-reduce: rank {peer} sent {} values, rank {} has {}",
                        part.len(),
                        self.rank,
                        data.len()
                    )));
                }
                parts[peer] = Some(part);
            }
        }
        parts[self.rank] = Some(data.to_vec());
        let mut parts = parts.into_iter().flatten();
        if let Some(first) = parts.next() {
            data.copy_from_slice(&first);
        }
        for part in parts {
            for (d, v) in data.iter_mut().zip(&part) {
                *d += v;
            }
        }
        Ok(())
    }
}

/// Rank `rank` of a tensor-parallel group of `ranks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorParallel {
    pub rank: usize,
    pub ranks: usize,
}

/// Multiple of which the MLP's features are split (the block size of Q4_0/Q4_1/Q8_0).
pub const FFN_ALIGN: usize = 32;

/// `n` items in `parts` contiguous runs, the first `n % parts` one longer: run `part`.
fn split(n: usize, parts: usize, part: usize) -> Range<usize> {
    let (base, extra) = (n / parts, n % parts);
    let start = part * base + part.min(extra);
    start..start + base + usize::from(part < extra)
}

impl TensorParallel {
    pub fn new(rank: usize, ranks: usize) -> Result<Self> {
        let tp = Self { rank, ranks };
        tp.check()?;
        Ok(tp)
    }

    /// The fields are public, so [`Self::slice`] checks them again through this.
    fn check(&self) -> Result<()> {
        let Self { rank, ranks } = *self;
        if ranks == 0 || rank >= ranks {
            return Err(collective(format!(
                "rank {rank} of {ranks}: need ranks >= 1 and rank < ranks"
            )));
        }
        Ok(())
    }

    /// What this rank holds of each block of a model with `config`.
    pub fn slice(&self, config: &ModelConfig) -> Result<TpSlice> {
        self.check()?;
        let Self { rank, ranks } = *self;
        if ranks > config.kv_heads {
            return Err(collective(format!(
                "{ranks} ranks but the model has {} KV heads: a rank needs at least one whole \
                 KV-head group",
                config.kv_heads
            )));
        }
        let units = config.ffn.div_ceil(FFN_ALIGN);
        if ranks > units {
            return Err(collective(format!(
                "{ranks} ranks but the MLP has only {} features ({units} runs of {FFN_ALIGN})",
                config.ffn
            )));
        }
        let kv_heads = split(config.kv_heads, ranks, rank);
        let group = config.heads / config.kv_heads;
        let heads = kv_heads.start * group..kv_heads.end * group;
        let u = split(units, ranks, rank);
        let ffn = u.start * FFN_ALIGN..(u.end * FFN_ALIGN).min(config.ffn);
        Ok(TpSlice {
            rank,
            ranks,
            kv_heads,
            heads,
            ffn,
            head_dim: config.head_dim,
        })
    }
}

/// One rank's part of every block: its KV heads, the query heads sharing them, and its MLP
/// features (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpSlice {
    pub rank: usize,
    pub ranks: usize,
    pub kv_heads: Range<usize>,
    pub heads: Range<usize>,
    pub ffn: Range<usize>,
    pub head_dim: usize,
}

impl TpSlice {
    pub fn rank(&self) -> TensorParallel {
        TensorParallel {
            rank: self.rank,
            ranks: self.ranks,
        }
    }

    /// Rows of q (and of its bias), = input columns of o.
    pub fn q_rows(&self) -> Range<usize> {
        self.heads.start * self.head_dim..self.heads.end * self.head_dim
    }

    /// Rows of k and v (and of their biases).
    pub fn kv_rows(&self) -> Range<usize> {
        self.kv_heads.start * self.head_dim..self.kv_heads.end * self.head_dim
    }
}

/// A rank's state inside its [`Shard`].
pub(crate) struct TpState {
    pub(crate) slice: TpSlice,
    pub(crate) reduce: Box<dyn AllReduce>,
}

impl std::fmt::Debug for TpState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TpState")
            .field("slice", &self.slice)
            .finish_non_exhaustive()
    }
}

/// Which part of a weight matrix [rows = output features, columns = input features] a rank
/// keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part {
    /// Column-parallel: these output features.
    Rows(Range<usize>),
    /// Row-parallel: these input features.
    Cols(Range<usize>),
}

fn from_raw(
    bytes: Vec<u8>,
    dtype: GgmlDType,
    shape: (usize, usize),
    device: &Device,
) -> Result<QTensor> {
    // Like candle's GGUF reader, this hands a byte vector to `from_data`, which views it as
    // blocks (the allocator's alignment suffices; candle checks it).
    let storage = QStorage::from_data(Cow::Owned(bytes), device, dtype)?;
    Ok(QTensor::new(storage, shape)?)
}

/// `part` of the matrix `t` (named `name` in errors), on `device` (see the module doc: whole
/// stored blocks are copied when the cut falls on them, else dequantise-cut-requantise).
pub(crate) fn slice_matrix(
    name: &str,
    t: &QTensor,
    part: &Part,
    device: &Device,
) -> Result<QTensor> {
    let (rows, cols) = t.shape().dims2()?;
    let dtype = t.dtype();
    let (block, type_size) = (dtype.block_size(), dtype.type_size());
    let (range, limit) = match part {
        Part::Rows(r) => (r, rows),
        Part::Cols(c) => (c, cols),
    };
    if range.is_empty() || range.end > limit || !cols.is_multiple_of(block) {
        return Err(collective(format!(
            "{name} [{rows}, {cols}] ({dtype:?}): cannot take {part:?}"
        )));
    }
    let row_bytes = cols / block * type_size;
    match part {
        Part::Rows(r) => {
            let data = t.data()?;
            let bytes = data[r.start * row_bytes..r.end * row_bytes].to_vec();
            from_raw(bytes, dtype, (r.len(), cols), device)
        }
        Part::Cols(c) if c.start.is_multiple_of(block) && c.end.is_multiple_of(block) => {
            let data = t.data()?;
            let (b0, b1) = (c.start / block * type_size, c.end / block * type_size);
            let mut bytes = Vec::with_capacity(rows * (b1 - b0));
            for row in data.chunks_exact(row_bytes) {
                bytes.extend_from_slice(&row[b0..b1]);
            }
            from_raw(bytes, dtype, (rows, c.len()), device)
        }
        Part::Cols(c) => {
            let f = t
                .dequantize(&Device::Cpu)?
                .narrow(1, c.start, c.len())?
                .contiguous()?;
            let to = if c.start.is_multiple_of(32) && c.len().is_multiple_of(32) {
                GgmlDType::Q8_0
            } else {
                GgmlDType::F32
            };
            tracing::debug!(
                name,
                ?dtype,
                ?to,
                ?c,
                "requantised a cut off the stored blocks"
            );
            Ok(QTensor::quantize_onto(&f, to, device)?)
        }
    }
}

/// Rank `s`'s slice of block `i`.
pub(crate) fn load_block(
    r: &mut TensorReader<'_>,
    c: &ModelConfig,
    i: usize,
    s: &TpSlice,
) -> Result<Block> {
    let n = |x: &str| format!("blk.{i}.{x}");
    let (q, kv, ffn) = (s.q_rows(), s.kv_rows(), s.ffn.clone());
    let rank0 = s.rank == 0;
    Ok(Block {
        attn_norm: r.norm(&n("attn_norm.weight"), c.rms_eps)?,
        wq: r.matrix_part(&n("attn_q.weight"), &Part::Rows(q.clone()))?,
        wk: r.matrix_part(&n("attn_k.weight"), &Part::Rows(kv.clone()))?,
        wv: r.matrix_part(&n("attn_v.weight"), &Part::Rows(kv.clone()))?,
        wo: r.matrix_part(&n("attn_output.weight"), &Part::Cols(q.clone()))?,
        bq: r.optional_vector_part(&n("attn_q.bias"), q)?,
        bk: r.optional_vector_part(&n("attn_k.bias"), kv.clone())?,
        bv: r.optional_vector_part(&n("attn_v.bias"), kv)?,
        bo: match rank0 {
            true => r.optional_vector(&n("attn_output.bias"))?,
            false => None,
        },
        ffn_norm: r.norm(&n("ffn_norm.weight"), c.rms_eps)?,
        gate: r.matrix_part(&n("ffn_gate.weight"), &Part::Rows(ffn.clone()))?,
        up: r.matrix_part(&n("ffn_up.weight"), &Part::Rows(ffn.clone()))?,
        down: r.matrix_part(&n("ffn_down.weight"), &Part::Cols(ffn))?,
        bdown: match rank0 {
            true => r.optional_vector(&n("ffn_down.bias"))?,
            false => None,
        },
        heads: s.heads.len(),
        kv_heads: s.kv_heads.len(),
        head_dim: c.head_dim,
        lora: None,
    })
}

/// Keeps rank `s`'s part of a block's LoRA pairs: rows of B for column-parallel layers,
/// columns of A for row-parallel ones (A is [rank, in], B [out, rank]).
pub(crate) fn slice_lora(lora: &mut BlockLora, s: &TpSlice) -> Result<()> {
    let rows = |t: &Tensor, r: Range<usize>| -> Result<Tensor> {
        Ok(t.narrow(0, r.start, r.len())?.force_contiguous()?)
    };
    let cols = |t: &Tensor, c: Range<usize>| -> Result<Tensor> {
        Ok(t.narrow(1, c.start, c.len())?.force_contiguous()?)
    };
    lora.map_pairs(|target, pair| {
        let (a, b) = match target {
            Target::Q => (pair.a.clone(), rows(&pair.b, s.q_rows())?),
            Target::K | Target::V => (pair.a.clone(), rows(&pair.b, s.kv_rows())?),
            Target::Gate | Target::Up => (pair.a.clone(), rows(&pair.b, s.ffn.clone())?),
            Target::O => (cols(&pair.a, s.q_rows())?, pair.b.clone()),
            Target::Down => (cols(&pair.a, s.ffn.clone())?, pair.b.clone()),
        };
        Ok(LoraPair { a, b })
    })
}

impl Shard {
    /// Rank `tp` of a tensor-parallel group over blocks [first, first+count) of the GGUF at
    /// `path`, on [`default_device`], summing with its peers through `reduce` (see the module
    /// doc for what a rank holds and returns).
    pub fn tensor_parallel_load(
        path: &Path,
        first: usize,
        count: usize,
        opts: &LoadOptions,
        tp: TensorParallel,
        reduce: Box<dyn AllReduce>,
    ) -> Result<Shard> {
        let index = GgufIndex::open(path)?;
        Self::tensor_parallel_from_index(&index, first, count, opts, &default_device(), tp, reduce)
    }

    /// [`Self::tensor_parallel_load`] from an already parsed header, on `device`.
    pub fn tensor_parallel_from_index(
        index: &GgufIndex,
        first: usize,
        count: usize,
        opts: &LoadOptions,
        device: &Device,
        tp: TensorParallel,
        reduce: Box<dyn AllReduce>,
    ) -> Result<Shard> {
        let slice = tp.slice(index.config())?;
        Shard::build(
            index,
            first,
            count,
            opts,
            device,
            Some(TpState { slice, reduce }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smollm() -> ModelConfig {
        ModelConfig {
            architecture: "llama".into(),
            n_layers: 30,
            hidden: 576,
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            ffn: 1536,
            vocab: 49152,
            context: 8192,
            rope_theta: 100_000.0,
            rms_eps: 1e-5,
        }
    }

    #[test]
    fn slices_cover_whole_groups_and_features() {
        let c = smollm();
        let s = |rank, ranks| TensorParallel { rank, ranks }.slice(&c).expect("slice");
        // 3 KV heads over 2 ranks: 2 + 1 groups of 3 query heads.
        assert_eq!((s(0, 2).kv_heads, s(0, 2).heads), (0..2, 0..6));
        assert_eq!((s(1, 2).kv_heads, s(1, 2).heads), (2..3, 6..9));
        assert_eq!((s(0, 2).q_rows(), s(1, 2).kv_rows()), (0..384, 128..192));
        assert_eq!((s(0, 2).ffn, s(1, 2).ffn), (0..768, 768..1536));
        let three: Vec<_> = (0..3).map(|r| s(r, 3)).collect();
        assert_eq!(
            three.iter().map(|s| s.ffn.clone()).collect::<Vec<_>>(),
            [0..512, 512..1024, 1024..1536]
        );
        assert_eq!(
            three.iter().map(|s| s.heads.clone()).collect::<Vec<_>>(),
            [0..3, 3..6, 6..9]
        );
        // Uneven MLP units: 5 runs of 32 over 2 ranks = 3 + 2; the end is the last feature.
        let odd = ModelConfig {
            ffn: 150,
            ..c.clone()
        };
        let t = |rank| {
            TensorParallel { rank, ranks: 2 }
                .slice(&odd)
                .expect("odd")
                .ffn
        };
        assert_eq!((t(0), t(1)), (0..96, 96..150));
        assert!(TensorParallel { rank: 0, ranks: 4 }.slice(&c).is_err());
        assert!(TensorParallel::new(2, 2).is_err());
        assert!(TensorParallel::new(0, 0).is_err());
    }

    #[test]
    fn in_process_all_reduce_sums_the_same_bits_everywhere() {
        let group = InProcessAllReduce::group(3);
        let handles: Vec<_> = group
            .into_iter()
            .map(|mut g| {
                std::thread::spawn(move || {
                    let r = g.rank() as f32;
                    let mut out = Vec::new();
                    for round in 0..20 {
                        let mut data: Vec<f32> = (0..7)
                            .map(|i| 0.1 * (i as f32 + r) + round as f32)
                            .collect();
                        g.all_reduce_sum(&mut data).expect("all-reduce");
                        out.push(data);
                    }
                    out
                })
            })
            .collect();
        let outs: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("join"))
            .collect();
        for (round, want) in outs[0].iter().enumerate() {
            for (i, v) in want.iter().enumerate() {
                let sum: f32 = (0..3)
                    .map(|r| 0.1 * (i as f32 + r as f32) + round as f32)
                    .sum();
                assert!((v - sum).abs() < 1e-4);
            }
            for other in &outs[1..] {
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&other[round]), bits(want));
            }
        }
        // A peer that has gone is an error, not a hang.
        let mut group = InProcessAllReduce::group(2);
        drop(group.pop());
        assert!(group[0].all_reduce_sum(&mut [1.0]).is_err());
    }

    #[test]
    fn cuts_keep_the_stored_blocks() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (8, 256), &dev).expect("w");
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0, GgmlDType::Q4K] {
            let q = QTensor::quantize(&w, dtype).expect("quantize");
            let whole = q.dequantize(&dev).expect("dequantize");
            let same = |part: Part, want: Tensor| {
                let cut = slice_matrix("w", &q, &part, &dev).expect("cut");
                let got = cut.dequantize(&dev).expect("dequantize");
                let off = (got - want)
                    .expect("sub")
                    .abs()
                    .expect("abs")
                    .max_all()
                    .expect("max")
                    .to_scalar::<f32>()
                    .expect("scalar");
                (cut.dtype(), off)
            };
            let rows = same(Part::Rows(2..5), whole.narrow(0, 2, 3).expect("rows"));
            assert_eq!(rows, (dtype, 0.0), "{dtype:?} rows");
            let cols = same(Part::Cols(64..192), whole.narrow(1, 64, 128).expect("cols"));
            if dtype == GgmlDType::Q4K {
                // Off its 256 blocks: requantised to Q8_0, close but not exact.
                assert_eq!(cols.0, GgmlDType::Q8_0);
                assert!(cols.1 < 0.05, "{dtype:?} cols {}", cols.1);
            } else {
                assert_eq!(cols, (dtype, 0.0), "{dtype:?} cols");
            }
        }
    }
}
