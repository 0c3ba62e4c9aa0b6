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

/// Which measurement this is: raised whenever it changes (models, rounds), so that figures kept
/// from an earlier measurement are measured again. 2: models larger than the cache.
pub const METHOD: u32 = 2;

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
        // Best of three rounds, alternating, so a busy moment hurts neither model alone.
        let (mut t_small, mut t_large) = (f64::INFINITY, f64::INFINITY);
        for round in 0..3 {
            t_small = t_small.min(seconds_per_token(&mut small_shard, round)?);
            t_large = t_large.min(seconds_per_token(&mut large_shard, round)?);
        }
        let extra_bytes = (large_bytes - small_bytes) as f64;
        let extra_time = (t_large - t_small).max(1e-9);
        let bytes_per_second = extra_bytes / extra_time;
        let overhead = (t_small - small_bytes as f64 / bytes_per_second).max(0.0);
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
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
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
