//! tb-enginebench: single-process prefill time (TTFT) and decode tokens/s of tb-engine for a
//! fixed chat prompt and 64 greedy tokens, with Q4_x weights as stored vs requantised to Q8_0.
//! Prints a markdown table.
//!
//! Threads: candle's CPU kernels run on rayon's global pool, sized by `RAYON_NUM_THREADS`
//! (candle's `utils::get_num_threads` reads the same variable); the bench reports that number.
//! Pin it by running e.g. `RAYON_NUM_THREADS=2 tb-enginebench`.
//!
//! A second table measures batched decoding ([`Shard::forward_batch`]): B sequences (the same
//! prompt) prefilled, then decoded together, one forward pass per step for all of them;
//! aggregate tokens/s for B = 1, 4, 8 (`--batches 1,4,8`).
//!
//! `--adapter DIR` applies a LoRA adapter (a PEFT directory) to every run, to measure its cost.
//!
//! Usage: `tb-enginebench [MODEL.gguf] [--runs N] [--batches 1,4,8] [--adapter DIR] [--smoke]` (model defaults to
//! `$TB_TEST_MODEL` or `.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf`). `--smoke` runs the
//! same code with 8 tokens and one run without a warm-up, and fails if either weight form generates
//! nothing.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use tb_engine::sample::argmax;
use tb_engine::{
    BatchItem, ChatMessage, Engine, LoadOptions, SamplingParams, StageInput, StageOutput,
};

const PROMPT: &str =
    "Write a short paragraph about why the sky is blue, for a curious ten-year-old.";
/// Tokens generated per run.
const TOKENS: usize = 64;
/// Tokens generated per run with `--smoke`.
const SMOKE_TOKENS: usize = 8;

struct Row {
    label: &'static str,
    load_s: f64,
    weight_mb: f64,
    prompt_tokens: usize,
    ttft_ms: f64,
    tok_s: f64,
    generated: usize,
}

fn run(
    path: &std::path::Path,
    adapter: Option<&std::path::Path>,
    requant: bool,
    runs: usize,
    tokens: usize,
    warm_up: bool,
) -> Result<Row, tb_engine::EngineError> {
    let t = Instant::now();
    let mut engine = Engine::load(
        path,
        &LoadOptions {
            requantize_to_q8_0: requant,
            max_context: Some(2048),
            adapter: adapter.map(std::path::Path::to_path_buf),
        },
    )?;
    let load_s = t.elapsed().as_secs_f64();
    let prompt = engine.chat_prompt(&[ChatMessage::new("user", PROMPT)])?;
    let params = SamplingParams {
        max_tokens: tokens,
        ..Default::default()
    };
    // Warm-up (not in a smoke run, which measures nothing), then best of `runs`.
    if warm_up {
        engine.generate(&prompt, &params)?;
    }
    let mut best: Option<(f64, f64, usize)> = None;
    for _ in 0..runs {
        let g = engine.generate(&prompt, &params)?;
        let ttft = g.ttft.as_secs_f64() * 1e3;
        best = Some(match best {
            None => (ttft, g.decode_tokens_per_s, g.tokens.len()),
            Some((b_ttft, b_tps, n)) => (
                b_ttft.min(ttft),
                b_tps.max(g.decode_tokens_per_s),
                n.max(g.tokens.len()),
            ),
        });
    }
    let (ttft_ms, tok_s, generated) = best.unwrap_or_default();
    Ok(Row {
        label: if requant {
            "requantised Q8_0"
        } else {
            "as stored"
        },
        load_s,
        weight_mb: engine.shard().weight_bytes() as f64 / 1e6,
        prompt_tokens: prompt.len(),
        ttft_ms,
        tok_s,
        generated,
    })
}

/// Aggregate decode tokens/s of `batch` sequences decoded together for `tokens` steps (best
/// of `runs`), after prefilling each.
fn run_batched(
    engine: &mut Engine,
    prompt: &[u32],
    batch: usize,
    tokens: usize,
    runs: usize,
) -> Result<f64, tb_engine::EngineError> {
    let mut best: f64 = 0.0;
    for _ in 0..runs {
        let shard = engine.shard_mut();
        let mut next = Vec::with_capacity(batch);
        for seq in 0..batch as u64 {
            match shard.forward(seq, StageInput::Tokens(prompt.to_vec()), 0)? {
                StageOutput::Logits(l) => next.push(argmax(&l)),
                StageOutput::Hidden(_) => unreachable!("a whole model returns logits"),
            }
        }
        let t = Instant::now();
        for step in 0..tokens {
            let items = next
                .iter()
                .enumerate()
                .map(|(seq, &tok)| BatchItem {
                    seq: seq as u64,
                    input: StageInput::Tokens(vec![tok]),
                    pos: prompt.len() + step,
                })
                .collect();
            for (slot, out) in next.iter_mut().zip(shard.forward_batch(items)) {
                if let StageOutput::Logits(l) = out? {
                    *slot = argmax(&l);
                }
            }
        }
        best = best.max((batch * tokens) as f64 / t.elapsed().as_secs_f64().max(1e-9));
        for seq in 0..batch as u64 {
            shard.drop_sequence(seq);
        }
    }
    Ok(best)
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut path = tb_engine::test_model_path();
    let mut runs = None;
    let mut smoke = false;
    let mut batches = vec![1usize, 4, 8];
    let mut adapter: Option<PathBuf> = None;
    while let Some(a) = args.next() {
        if a == "--adapter" {
            adapter = args.next().map(PathBuf::from);
            continue;
        }
        if a == "--batches" {
            batches = args
                .next()
                .unwrap_or_default()
                .split(',')
                .filter_map(|b| b.trim().parse().ok())
                .filter(|&b| b > 0)
                .collect();
            continue;
        }
        if a == "--runs" {
            runs = Some(args.next().and_then(|n| n.parse().ok()).unwrap_or(3));
        } else if a == "--smoke" {
            smoke = true;
        } else {
            path = PathBuf::from(a);
        }
    }
    let runs = runs.unwrap_or(if smoke { 1 } else { 3 });
    let tokens = if smoke { SMOKE_TOKENS } else { TOKENS };
    let threads = candle_core::utils::get_num_threads();
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Some(a) = &adapter {
        println!("adapter: {}", a.display());
    }
    println!(
        "model: {file}; device: cpu; threads: {threads} (RAYON_NUM_THREADS={}); best of {runs} runs{}; greedy, {tokens} tokens{}\n",
        std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "unset".into()),
        if smoke { "" } else { " after a warm-up" },
        if smoke {
            " (smoke run: too small to measure anything)"
        } else {
            ""
        }
    );
    println!(
        "| weights | load (s) | weights in memory (MB) | prompt tokens | TTFT (ms) | decode tok/s | generated |"
    );
    println!("|---|---|---|---|---|---|---|");
    for requant in [false, true] {
        match run(&path, adapter.as_deref(), requant, runs, tokens, !smoke) {
            Ok(r) if smoke && r.generated == 0 => {
                eprintln!(
                    "tb-enginebench --smoke: FAILED: {} generated no tokens",
                    r.label
                );
                return ExitCode::FAILURE;
            }
            Ok(r) => println!(
                "| {} | {:.2} | {:.1} | {} | {:.1} | {:.1} | {} |",
                r.label, r.load_s, r.weight_mb, r.prompt_tokens, r.ttft_ms, r.tok_s, r.generated
            ),
            Err(e) => {
                eprintln!("tb-enginebench: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    // Batched decoding, with the weights as stored.
    let batched = Engine::load(
        &path,
        &LoadOptions {
            requantize_to_q8_0: false,
            max_context: Some(2048),
            adapter: adapter.clone(),
        },
    )
    .and_then(|mut engine| {
        let prompt = engine.chat_prompt(&[ChatMessage::new("user", PROMPT)])?;
        let mut rows = Vec::new();
        for &b in &batches {
            rows.push((b, run_batched(&mut engine, &prompt, b, tokens, runs)?));
        }
        Ok(rows)
    });
    match batched {
        Ok(rows) => {
            println!("\nbatched decoding (weights as stored), {tokens} steps per sequence:\n");
            println!("| batch | aggregate decode tok/s | per sequence tok/s | vs batch 1 |");
            println!("|---|---|---|---|");
            let one = rows.first().map_or(0.0, |r| r.1 / r.0 as f64);
            for (b, tps) in rows {
                println!(
                    "| {b} | {tps:.1} | {:.1} | {:.2}x |",
                    tps / b as f64,
                    if one > 0.0 { tps / one } else { 0.0 }
                );
            }
        }
        Err(e) => {
            eprintln!("tb-enginebench: batched: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
