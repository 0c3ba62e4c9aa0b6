//! How fast this machine's engine decodes, measured on the engine itself: the figures placement
//! needs to predict tokens/s (the chip's nominal memory bandwidth overstates what candle's
//! kernels reach by an order of magnitude on a CPU).
//!
//! Decoding one token reads every weight of the blocks once, so a token costs about
//! `overhead + weight bytes / bandwidth`. Two synthetic llama models that differ only in their
//! number of blocks (written as Q4_1 GGUF files, loaded the way a served model is and decoded
//! greedily) give two points on that line: the slope is the
//! bandwidth in bytes *of the file* per second, the intercept the per-token overhead (embedding,
//! head, sampling, the step's bookkeeping). Bytes are counted as the file holds them because the
//! Model spec's sizes are file sizes; a model stored in another type decodes at another rate
//! (stated, not modelled).
//!
//! Both models are larger than a chip's last-level cache share (about 60 and 190 MB): the
//! models a lab serves are gigabytes, read from memory each token. Two models of a few
//! megabytes would sit in the cache and measure twice the rate a served model decodes at.
//! Where a large cache still holds part of the smaller one (a server CPU's shared L3: with 2
//! threads on a 2-core Xeon VM the 60 MB model ran 1.3-1.4× faster per byte than the 190 MB one),
//! the line through the two points starts below zero and its slope understates the rate;
//! then the larger model's own rate stands, with no overhead ([`fit`]).

use std::path::Path;
use std::time::{Duration, Instant};

use candle_core::quantized::ggml_file::qtensor_from_ggml;
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use crate::error::{EngineError, Result};
use crate::shard::{LoadOptions, Shard, StageInput, StageOutput};

/// The synthetic models' shape: a 768-wide llama (a small model's blocks, 6.3 M weights each),
/// a small vocabulary so that the head stays a small share of a token. The whole measurement
/// takes a second or two on an idle Mac or PC.
const HIDDEN: usize = 768;
const HEADS: usize = 12;
const KV_HEADS: usize = 4;
const FFN: usize = 2048;
const VOCAB: usize = 256;
const CONTEXT: usize = 64;
/// Rows of the random tile every matrix repeats; divides every matrix's row count.
const TILE_ROWS: usize = 64;
/// The two block counts measured: 16 and 48 blocks of 3.9 MB.
const SMALL: usize = 16;
const LARGE: usize = 48;
/// Tokens decoded per model and round, after the prompt; the first few are warm-up.
const DECODE: usize = 16;
const WARM_UP: usize = 3;
/// Rounds per model (odd: the median is one of them).
const ROUNDS: u64 = 5;

/// Which measurement this is: raised whenever it changes (models, rounds), so that figures kept
/// from an earlier measurement are measured again. 2: models larger than the cache. 3: the
/// median of five rounds, and no line bent by a cached small model.
pub const METHOD: u32 = 3;

/// What the engine measured of itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// `cpu` or `metal`.
    pub backend: String,
    /// Weight bytes (as stored in a Q4_1 file) decoded per second, in GB/s.
    pub weight_gbs: f64,
    /// Time per token beyond reading the blocks' weights, in µs.
    pub token_overhead_us: f64,
    /// How long the measurement took.
    pub took: Duration,
}

/// Measures this machine's engine on `device`, writing the synthetic models under `scratch`
/// (removed afterwards). Takes a few seconds.
pub fn calibrate(scratch: &Path, device: &Device) -> Result<Calibration> {
    let started = Instant::now();
    let io = |path: &Path, source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(scratch).map_err(|e| io(scratch, e))?;
    let small = scratch.join("calibrate-small.gguf");
    let large = scratch.join("calibrate-large.gguf");
    let result = (|| {
        let small_bytes = write_model(&small, SMALL)?;
        let large_bytes = write_model(&large, LARGE)?;
        let opts = LoadOptions::default();
        let mut small_shard = Shard::load_on(&small, 0, SMALL, &opts, device)?;
        let mut large_shard = Shard::load_on(&large, 0, LARGE, &opts, device)?;
        // Rounds alternate between the models, so that a busy moment of the machine falls on
        // both; the median round of each is kept (a served model decodes at its usual rate,
        // not its best).
        let (mut small_times, mut large_times) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            small_times.push(seconds_per_token(&mut small_shard, round)?);
            large_times.push(seconds_per_token(&mut large_shard, round)?);
        }
        let (bytes_per_second, overhead) = fit(
            (small_bytes as f64, median(&mut small_times)),
            (large_bytes as f64, median(&mut large_times)),
        );
        Ok(Calibration {
            backend: backend(device).into(),
            weight_gbs: bytes_per_second / 1e9,
            token_overhead_us: overhead * 1e6,
            took: started.elapsed(),
        })
    })();
    let _ = std::fs::remove_file(&small);
    let _ = std::fs::remove_file(&large);
    result
}

/// Bytes per second and the per-token overhead in seconds of the line through two measured
/// points (bytes of weights, seconds per token). A line through them that would start below
/// zero means the smaller model ran faster per byte than the larger one — partly from a cache
/// — and would understate the memory-bound rate the slope stands for: then the larger model's
/// own rate is taken, with no overhead. So it is when the larger model was measured no slower
/// than the smaller (a disturbed measurement: the line would claim an unbounded rate).
fn fit(small: (f64, f64), large: (f64, f64)) -> (f64, f64) {
    let own_rate = (large.0 / large.1.max(1e-12), 0.0);
    if large.1 <= small.1 || large.0 <= small.0 {
        return own_rate;
    }
    let slope = (large.1 - small.1) / (large.0 - small.0);
    let overhead = small.1 - small.0 * slope;
    if overhead >= 0.0 {
        (1.0 / slope, overhead)
    } else {
        own_rate
    }
}

fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    times.get(times.len() / 2).copied().unwrap_or(f64::INFINITY)
}

pub fn backend(device: &Device) -> &'static str {
    match device {
        Device::Cpu => "cpu",
        Device::Metal(_) => "metal",
        Device::Cuda(_) => "cuda",
    }
}

/// Median seconds per decoded token, after a one-token prompt and a warm-up.
fn seconds_per_token(shard: &mut Shard, round: u64) -> Result<f64> {
    let seq = round;
    let mut token = 1u32;
    let mut times = Vec::with_capacity(DECODE);
    for pos in 0..=DECODE {
        let start = Instant::now();
        let out = shard.forward(seq, StageInput::Tokens(vec![token]), pos)?;
        let elapsed = start.elapsed().as_secs_f64();
        let StageOutput::Logits(logits) = out else {
            return Err(EngineError::BadInput {
                detail: "a whole model gave hidden states".into(),
            });
        };
        token = crate::sample::argmax(&logits) % VOCAB as u32;
        if pos > WARM_UP {
            times.push(elapsed);
        }
    }
    shard.drop_sequence(seq);
    Ok(median(&mut times))
}

/// Writes a random llama of `layers` blocks as GGUF (matrices Q4_1, norms F32); returns the
/// bytes of its blocks as stored.
fn write_model(path: &Path, layers: usize) -> Result<u64> {
    let cpu = Device::Cpu;
    // Quantising a hundred megabytes of random weights would take longer than the measurement:
    // each matrix repeats one quantised random tile. What is read per token (and from where) is
    // the same; the values only need to stay finite.
    let tile = |cols: usize| -> Result<Vec<u8>> {
        let t = (Tensor::randn(0f32, 1.0, (TILE_ROWS, cols), &cpu)? * 0.02)?;
        Ok(QTensor::quantize(&t, GgmlDType::Q4_1)?.data()?.into_owned())
    };
    let (tile_hidden, tile_ffn) = (tile(HIDDEN)?, tile(FFN)?);
    let matrix = |rows: usize, cols: usize| -> Result<QTensor> {
        let tile = if cols == FFN { &tile_ffn } else { &tile_hidden };
        let raw = tile.repeat(rows / TILE_ROWS);
        Ok(qtensor_from_ggml(
            GgmlDType::Q4_1,
            &raw,
            vec![rows, cols],
            &cpu,
        )?)
    };
    let norm = || -> Result<QTensor> {
        Ok(QTensor::quantize(
            &Tensor::ones(HIDDEN, candle_core::DType::F32, &cpu)?,
            GgmlDType::F32,
        )?)
    };
    let head_dim = HIDDEN / HEADS;
    let mut tensors: Vec<(String, QTensor)> = vec![
        ("token_embd.weight".into(), matrix(VOCAB, HIDDEN)?),
        ("output_norm.weight".into(), norm()?),
        ("output.weight".into(), matrix(VOCAB, HIDDEN)?),
    ];
    let mut block_bytes = 0u64;
    for i in 0..layers {
        let block = [
            ("attn_norm.weight", norm()?),
            ("attn_q.weight", matrix(HIDDEN, HIDDEN)?),
            ("attn_k.weight", matrix(KV_HEADS * head_dim, HIDDEN)?),
            ("attn_v.weight", matrix(KV_HEADS * head_dim, HIDDEN)?),
            ("attn_output.weight", matrix(HIDDEN, HIDDEN)?),
            ("ffn_norm.weight", norm()?),
            ("ffn_gate.weight", matrix(FFN, HIDDEN)?),
            ("ffn_up.weight", matrix(FFN, HIDDEN)?),
            ("ffn_down.weight", matrix(HIDDEN, FFN)?),
        ];
        for (name, t) in block {
            block_bytes += t.storage_size_in_bytes() as u64;
            tensors.push((format!("blk.{i}.{name}"), t));
        }
    }
    let u32v = |n: usize| Value::U32(n as u32);
    let metadata: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.block_count", u32v(layers)),
        ("llama.embedding_length", u32v(HIDDEN)),
        ("llama.attention.head_count", u32v(HEADS)),
        ("llama.attention.head_count_kv", u32v(KV_HEADS)),
        ("llama.feed_forward_length", u32v(FFN)),
        ("llama.context_length", u32v(CONTEXT)),
        ("llama.vocab_size", u32v(VOCAB)),
    ];
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let mut file = std::fs::File::create(path).map_err(|source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    gguf_file::write(&mut file, &metadata, &tensors)?;
    Ok(block_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_points_on_a_line_give_its_slope_and_intercept() {
        // 1 GB/s and 100 µs per token: 10 MB take 10.1 ms, 30 MB 30.1 ms.
        let (bps, overhead) = fit((10e6, 10.1e-3), (30e6, 30.1e-3));
        assert!((bps - 1e9).abs() < 1e3, "{bps}");
        assert!((overhead - 100e-6).abs() < 1e-9, "{overhead}");
    }

    #[test]
    fn a_small_model_faster_per_byte_does_not_bend_the_line() {
        // The small model at 2 GB/s (cached), the large at 1 GB/s: the line through them would
        // start at -15 ms and claim 0.8 GB/s; the large model's own rate is what holds.
        let (bps, overhead) = fit((20e6, 10e-3), (60e6, 60e-3));
        assert!((bps - 1e9).abs() < 1e3, "{bps}");
        assert_eq!(overhead, 0.0);
    }

    #[test]
    fn a_large_model_measured_no_slower_gives_its_own_rate() {
        // The line would be flat: an unbounded rate. The large model's own rate stands.
        for large_time in [10e-3, 9e-3] {
            let (bps, overhead) = fit((20e6, 10e-3), (60e6, large_time));
            assert!((bps - 60e6 / large_time).abs() < 1e3, "{bps}");
            assert_eq!(overhead, 0.0);
        }
    }

    #[test]
    fn the_median_round_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 100.0, 2.0, 2.5]), 2.5);
        assert_eq!(median(&mut []), f64::INFINITY);
    }

    #[test]
    fn the_engine_measures_a_positive_bandwidth_and_overhead() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = calibrate(dir.path(), &Device::Cpu).expect("calibrates");
        assert_eq!(c.backend, "cpu");
        assert!(c.weight_gbs > 0.0 && c.weight_gbs.is_finite(), "{c:?}");
        assert!(c.token_overhead_us >= 0.0, "{c:?}");
        // The scratch models are gone.
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);
        println!("{c:?}");
    }
}
