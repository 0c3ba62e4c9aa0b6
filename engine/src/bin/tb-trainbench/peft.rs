//! The PyTorch + PEFT row of tb-trainbench: runs `peft_reference.py` (embedded, written to the
//! scratch directory) with a Python that has torch, transformers and peft, on the Hugging Face
//! copy of the model that [`crate::mlx::export_hf`] writes, with tb's batch (the same token
//! ids), LoRA, learning rates, AdamW settings, clipping and thread count.

use std::path::Path;
use std::process::Command;

use serde::Deserialize;
use tb_engine::train::{Example, TrainConfig};

use crate::Options;

type Error = Box<dyn std::error::Error>;

const SCRIPT: &str = include_str!("peft_reference.py");
const INSTALL: &str = "pip install torch transformers peft safetensors";

/// What the reference measured.
#[derive(Debug, Deserialize)]
pub struct Reference {
    pub step_seconds: Vec<f64>,
    /// One per optimizer step, the warm-up's first (when there was one).
    pub losses: Vec<f64>,
    pub tokens_per_s: f64,
    pub threads: usize,
    pub versions: Versions,
}

#[derive(Debug, Deserialize)]
pub struct Versions {
    pub torch: String,
    pub transformers: String,
    pub peft: String,
}

impl Reference {
    /// The fastest timed step in seconds.
    pub fn best_step(&self) -> f64 {
        self.step_seconds
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
    }

    /// The markdown row beside tb's.
    pub fn row(&self, steps: usize) -> String {
        format!(
            "| PyTorch + PEFT (torch {} cpu, f32 HF copy, threads: {}) | train step, best of {steps} | {:.2} | {:.1} | {:.3} |",
            self.versions.torch,
            self.threads,
            self.best_step(),
            self.tokens_per_s,
            self.losses.last().copied().unwrap_or(f64::NAN)
        )
    }
}

/// Trains the reference on `model` (a Hugging Face directory) in `scratch` with tb's `cfg`
/// (rank, alpha, AdamW, clipping, seed) and thread count. `lrs` are the learning rates tb
/// applied, one per optimizer step (the warm-up's first unless `o.smoke`).
pub fn run(
    python: &Path,
    model: &Path,
    scratch: &Path,
    cfg: &TrainConfig,
    batch: &[Example],
    lrs: &[f64],
    o: &Options,
) -> Result<Reference, Error> {
    // The bench's own thread count (rayon's pool, RAYON_NUM_THREADS).
    let threads = candle_core::utils::get_num_threads();
    let script = scratch.join("peft_reference.py");
    std::fs::write(&script, SCRIPT)?;
    let ids: Vec<&[u32]> = batch.iter().map(|e| e.tokens.as_slice()).collect();
    let spec = serde_json::json!({
        "model": model,
        "input_ids": ids,
        "rank": cfg.lora.rank,
        "alpha": cfg.lora.alpha,
        "targets": o.targets.iter().map(|t| t.module()).collect::<Vec<_>>(),
        "lrs": lrs,
        "beta1": cfg.beta1,
        "beta2": cfg.beta2,
        "eps": cfg.eps,
        "weight_decay": cfg.weight_decay,
        "grad_clip": cfg.grad_clip,
        "seed": cfg.seed,
        "threads": threads,
        "warmup": !o.smoke,
    });
    let spec_path = scratch.join("peft_spec.json");
    std::fs::write(&spec_path, spec.to_string())?;
    let out = Command::new(python)
        .arg(&script)
        .arg(&spec_path)
        .env("OMP_NUM_THREADS", threads.to_string())
        .env("TOKENIZERS_PARALLELISM", "false")
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .map_err(|e| {
            format!(
                "cannot run {}: {e} (create a venv with `python3 -m venv DIR && DIR/bin/{INSTALL}` and pass DIR/bin/python)",
                python.display()
            )
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr
            .lines()
            .rev()
            .filter(|l| !l.trim().is_empty())
            .take(3)
            .collect();
        return Err(format!("{} {}: {}", python.display(), out.status, tail.join(" / ")).into());
    }
    parse(&stdout)
}

/// The reference's JSON line: the last line of its output that parses.
fn parse(stdout: &str) -> Result<Reference, Error> {
    stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Reference>(l.trim()).ok())
        .ok_or_else(|| {
            let tail: Vec<&str> = stdout.lines().rev().take(3).collect();
            format!(
                "no result line in the reference's output (last lines: {})",
                tail.join(" / ")
            )
            .into()
        })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_result_line_is_read() {
        let out = "some warning\n{\"step_seconds\": [2.0, 1.5], \"losses\": [3.44, 3.43, 3.41], \"tokens_per_s\": 170.6, \"threads\": 2, \"trainable\": 921600, \"versions\": {\"torch\": \"2.5.0\", \"transformers\": \"4.46\", \"peft\": \"0.13\"}}\n";
        let r = super::parse(out).expect("parsed");
        assert_eq!(r.best_step(), 1.5);
        assert_eq!(r.losses.len(), 3);
        assert!(
            r.row(2).contains("| 1.50 | 170.6 | 3.410 |"),
            "{}",
            r.row(2)
        );
        assert!(super::parse("Traceback\n").is_err());
    }
}
