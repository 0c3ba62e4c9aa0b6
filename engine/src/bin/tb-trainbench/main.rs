//! tb-trainbench: LoRA training throughput of tb-engine — tokens/s of a training step (forward,
//! backward, AdamW) and of a forward-only loss evaluation, for SmolLM2 (or any llama-family
//! GGUF) at LoRA rank 8 on q, k, v, o, sequences of 128 tokens, batches of 4, every token a
//! target. Prints a markdown table.
//!
//! Threads: candle's CPU kernels run on rayon's global pool (`RAYON_NUM_THREADS`); the bench
//! reports the number. Every run is deterministic for a fixed thread count.
//!
//! Data-parallel scaling (1 rank against N rank processes, each on its share of the same global
//! batch, gradients all-reduced over tb-transport) is `tb-trainbench-dp` in tb-nodelet, beside
//! `tb-train`, whose step it runs: tb-engine does not depend on the transport.
//!
//! With `--mlx PYTHON` (a Python with `mlx_lm`), the same model is written as a Hugging Face
//! directory (f32 safetensors dequantised from the GGUF with q/k rows back in HF order,
//! config.json, tokenizer.json, the chat template) and `mlx_lm.lora` trains the same LoRA
//! (rank, targets, all blocks, scale alpha/rank) on the same batch size and sequence length for
//! the same number of steps; its reported tokens/s forms a second row.
//!
//! With `--peft PYTHON` (a Python with torch, transformers and peft), `peft_reference.py` trains
//! the same LoRA with PyTorch + PEFT on that directory: tb's token ids, learning rate at every
//! step, AdamW settings, clipping and thread count (`torch.set_num_threads`), one untimed
//! warm-up step, then the timed ones. It forms a third row, and the loss at every step is printed
//! beside tb's (the first step's loss is the base model's in both: B starts at zero).
//!
//! Usage: `tb-trainbench [MODEL.gguf] [--seq N] [--batch N] [--rank N] [--steps N]
//! [--targets q,k,v,o] [--mlx PYTHON] [--peft PYTHON] [--smoke]`. `--smoke` runs one step of 2
//! sequences of 16 tokens without a warm-up (CI checks that the bench runs; it measures nothing)
//! and fails if the loss is not finite.

mod mlx;
mod peft;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use candle_core::Device;
use tb_engine::adapter::{LoraConfig, Target};
use tb_engine::train::{Example, StepLoss, TrainConfig, Trainer};

const TEXT: &str = "The quick brown fox jumps over the lazy dog. Training a small language \
model on a laptop is a good way to learn how attention, normalisation and low-rank adapters \
fit together, one gradient step at a time. ";

struct Options {
    path: PathBuf,
    seq: usize,
    batch: usize,
    rank: usize,
    steps: usize,
    targets: Vec<Target>,
    smoke: bool,
    /// Python with mlx_lm for the comparison column (None: skipped).
    mlx_python: Option<PathBuf>,
    /// Python with torch, transformers and peft for the PyTorch + PEFT row (None: skipped).
    peft_python: Option<PathBuf>,
}

fn parse() -> Result<Options, String> {
    let mut o = Options {
        path: tb_engine::test_model_path(),
        seq: 128,
        batch: 4,
        rank: 8,
        steps: 3,
        targets: vec![Target::Q, Target::K, Target::V, Target::O],
        smoke: false,
        mlx_python: None,
        peft_python: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |name: &str| -> Result<usize, String> {
            args.next()
                .and_then(|v| v.parse().ok())
                .filter(|&v: &usize| v > 0)
                .ok_or_else(|| format!("{name} needs a positive number"))
        };
        match a.as_str() {
            "--seq" => o.seq = num("--seq")?,
            "--batch" => o.batch = num("--batch")?,
            "--rank" => o.rank = num("--rank")?,
            "--steps" => o.steps = num("--steps")?,
            "--smoke" => o.smoke = true,
            "--mlx" => {
                o.mlx_python = Some(PathBuf::from(
                    args.next()
                        .ok_or("--mlx needs the path of a python with mlx_lm")?,
                ))
            }
            "--peft" => {
                o.peft_python = Some(PathBuf::from(args.next().ok_or(
                    "--peft needs the path of a python with torch, transformers and peft",
                )?))
            }
            "--targets" => {
                let list = args.next().unwrap_or_default();
                o.targets = list
                    .split(',')
                    .map(|t| Target::parse(t.trim()).ok_or_else(|| format!("unknown target {t:?}")))
                    .collect::<Result<_, _>>()?;
            }
            other if other.starts_with("--") => return Err(format!("unknown flag {other}")),
            path => o.path = PathBuf::from(path),
        }
    }
    if o.smoke {
        o.seq = 16;
        o.batch = 2;
        o.steps = 1;
    }
    Ok(o)
}

fn main() -> ExitCode {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("tb-trainbench: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tb-trainbench: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(o: &Options) -> Result<(), Box<dyn std::error::Error>> {
    let lora = LoraConfig {
        rank: o.rank,
        alpha: 2.0 * o.rank as f32,
        dropout: 0.0,
        rslora: false,
        targets: o.targets.clone(),
        base_model: String::new(),
    };
    let cfg = TrainConfig {
        learning_rate: 1e-4,
        total_steps: (o.steps + 1) as u64,
        ..TrainConfig::new(lora)
    };
    let t = Instant::now();
    let mut trainer = Trainer::load(&o.path, cfg.clone(), &Device::Cpu)?;
    let load_s = t.elapsed().as_secs_f64();
    let text_tokens = trainer
        .tokenizer()
        .encode(&TEXT.repeat(1 + o.seq * o.batch / 20))?;
    let batch: Vec<Example> = (0..o.batch)
        .map(|b| {
            let start = (b * 7) % 16;
            let tokens = text_tokens[start..start + o.seq].to_vec();
            Example {
                loss_mask: vec![true; tokens.len()],
                tokens,
            }
        })
        .collect();
    let tokens = o.seq * o.batch;
    let threads = candle_core::utils::get_num_threads();
    let file = o
        .path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    println!(
        "model: {file}; device: cpu; threads: {threads} (RAYON_NUM_THREADS={}); LoRA rank {} on {}; {} parameters; batch {} x {} tokens; load {load_s:.1} s; memory {:.0} MB + activations{}\n",
        std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "unset".into()),
        o.rank,
        o.targets
            .iter()
            .map(|t| t.module())
            .collect::<Vec<_>>()
            .join(","),
        trainer.parameter_count(),
        o.batch,
        o.seq,
        trainer.memory_bytes() as f64 / 1e6,
        if o.smoke {
            " (smoke run: one step, too small to measure anything)"
        } else {
            ""
        }
    );
    // Loss and learning rate of every optimizer step, the warm-up's first.
    let mut losses = Vec::new();
    let mut lrs = Vec::new();
    let mut step = |trainer: &mut Trainer| -> Result<StepLoss, Box<dyn std::error::Error>> {
        let l = trainer.accumulate(&batch)?;
        lrs.push(trainer.apply(l.tokens)?.lr);
        losses.push(l.mean());
        Ok(l)
    };
    if !o.smoke {
        // Warm-up: first-touch allocations, thread pool start.
        step(&mut trainer)?;
    }
    let mut best_step = f64::INFINITY;
    let mut loss = 0.0;
    for _ in 0..o.steps {
        let t = Instant::now();
        let l = step(&mut trainer)?;
        best_step = best_step.min(t.elapsed().as_secs_f64());
        loss = l.mean();
    }
    if !loss.is_finite() {
        return Err(format!("the loss is {loss}").into());
    }
    let t = Instant::now();
    let eval = trainer.eval_loss(&batch)?;
    let eval_s = t.elapsed().as_secs_f64();
    let estimate = tb_engine::train::estimate_memory_bytes(
        trainer.model_config(),
        &trainer.model().lora().clone(),
        o.batch,
        o.seq,
    );
    println!(
        "memory: peak resident {} MB; estimate (train::estimate_memory_bytes) {:.0} MB\n",
        peak_rss_mb().map_or_else(|| "n/a".to_string(), |m| format!("{m:.0}")),
        estimate as f64 / 1e6
    );
    println!("| engine | pass | s per step | tokens/s | loss |");
    println!("|---|---|---|---|---|");
    println!(
        "| tb-engine (candle, f32) | train step (fwd + bwd + AdamW), best of {} | {best_step:.2} | {:.1} | {loss:.3} |",
        o.steps,
        tokens as f64 / best_step
    );
    println!(
        "| tb-engine (candle, f32) | forward only (eval loss) | {eval_s:.2} | {:.1} | {:.3} |",
        tokens as f64 / eval_s,
        eval.mean()
    );
    if o.mlx_python.is_none() && o.peft_python.is_none() {
        return Ok(());
    }
    let tb_tps = tokens as f64 / best_step;
    let scratch = mlx::ScratchDir::new()?;
    let model = scratch.path().join("model");
    let exported = mlx::export_hf(&o.path, &trainer, &model).map_err(|e| e.to_string());
    let mut ratios = Vec::new();
    if let Some(python) = &o.mlx_python {
        let r = exported.clone().and_then(|()| {
            mlx::run(python, &model, scratch.path(), &trainer, &batch, o).map_err(|e| e.to_string())
        });
        match r {
            Ok((row, tps)) => {
                println!("{row}");
                ratios.push(format!("tb/mlx_lm.lora {:.1}×", tb_tps / tps));
            }
            Err(e) => println!("| mlx_lm.lora | train step | failed: {e} | | |"),
        }
    }
    let mut reference = None;
    if let Some(python) = &o.peft_python {
        let r = exported.clone().and_then(|()| {
            peft::run(python, &model, scratch.path(), &cfg, &batch, &lrs, o)
                .map_err(|e| e.to_string())
        });
        match r {
            Ok(r) => {
                println!("{}", r.row(o.steps));
                ratios.push(format!("tb/PEFT {:.2}×", tb_tps / r.tokens_per_s));
                reference = Some(r);
            }
            Err(e) => println!("| PyTorch + PEFT | train step | failed: {e} | | |"),
        }
    }
    if !ratios.is_empty() {
        println!("\ntokens/s ratios: {}", ratios.join("; "));
    }
    if let Some(r) = reference {
        println!(
            "\n{}",
            loss_comparison(&losses, &r.losses, !o.smoke, &r.versions)
        );
    }
    Ok(())
}

/// tb's and the reference's loss at every step, and the largest relative difference.
fn loss_comparison(tb: &[f64], reference: &[f64], warmup: bool, v: &peft::Versions) -> String {
    let fmt = |l: &[f64]| {
        l.iter()
            .map(|x| format!("{x:.4}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let worst = tb
        .iter()
        .zip(reference)
        .map(|(a, b)| ((a - b) / b).abs())
        .fold(0.0, f64::max);
    format!(
        "loss by step{}: tb {}; PyTorch + PEFT {}; largest difference {:.2} % (torch {}, transformers {}, peft {})",
        if warmup {
            " (the first is the warm-up)"
        } else {
            ""
        },
        fmt(tb),
        fmt(reference),
        100.0 * worst,
        v.torch,
        v.transformers,
        v.peft
    )
}

/// Peak resident set size of this process (Linux: VmHWM in /proc/self/status).
fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1e3)
}
