//! tb-enginebench: single-process prefill time (TTFT) and decode tokens/s of tb-engine for a
//! fixed chat prompt and 64 greedy tokens, with Q4_x weights as stored vs requantised to Q8_0.
//! Prints a markdown table.
//!
//! Threads: candle's CPU kernels run on rayon's global pool, sized by `RAYON_NUM_THREADS`
//! (candle's `utils::get_num_threads` reads the same variable); the bench reports that number.
//! Pin it by running e.g. `RAYON_NUM_THREADS=2 tb-enginebench`.
//!
//! Usage: `tb-enginebench [MODEL.gguf] [--runs N] [--smoke]` (model defaults to
//! `$TB_TEST_MODEL` or `.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf`). `--smoke` runs the
//! same code with 8 tokens and one run without a warm-up, and fails if either weight form generates
//! nothing.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use tb_engine::{ChatMessage, Engine, LoadOptions, SamplingParams};

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

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut path = tb_engine::test_model_path();
    let mut runs = None;
    let mut smoke = false;
    while let Some(a) = args.next() {
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
        match run(&path, requant, runs, tokens, !smoke) {
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
    ExitCode::SUCCESS
}
