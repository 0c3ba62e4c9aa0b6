//! tb-enginebench: single-process prefill time (TTFT) and decode tokens/s of tb-engine for a
//! fixed chat prompt and 64 greedy tokens, with Q4_x weights as stored vs requantised to Q8_0.
//! Prints a markdown table. Beside tokens/s stands the rate at which the weights are read
//! (weights in memory × decode steps per second): decoding is bound by it on a Mac's unified
//! memory, so it compares with the chip's memory bandwidth and across machines.
//!
//! Threads: candle's CPU kernels run on rayon's global pool, sized by `RAYON_NUM_THREADS`
//! (candle's `utils::get_num_threads` reads the same variable); the bench reports that number.
//! Pin it by running e.g. `RAYON_NUM_THREADS=2 tb-enginebench`.
//!
//! A second table measures batched decoding ([`Shard::forward_batch`]): B sequences (the same
//! prompt) prefilled, then decoded together, one forward pass per step for all of them;
//! aggregate tokens/s for B = 1, 4, 8 (`--batches 1,4,8`), with the weights loaded as the
//! built-in executor loads them (`Requantize::Auto`: Q4_x as stored where tb's kernel runs).
//!
//! A third table measures the prefix cache's saving: time to first token of a question after a
//! long system prompt, the whole prompt prefilled against the system prompt's positions forked
//! from a sequence that ran it ([`Shard::fork_sequence`]).
//!
//! `--adapter DIR` applies a LoRA adapter (a PEFT directory) to every run, to measure its cost.
//!
//! `--tp N` adds a table for tensor parallelism ([`tb_engine::tp`]): decode tok/s of N ranks
//! as threads of one process (in-process all-reduce), each rank on one CPU thread, against one
//! rank on one thread and against the single-process row above. candle's CPU matmul pool is one
//! per process and serves one caller at a time, so the ranks run in a child process with
//! `CANDLE_NUM_THREADS=1` (each rank computes on its own thread, no pool); the weights are
//! loaded as the built-in executor loads them (`Requantize::Auto`).
//!
//! `--tables single,batched,prefix` picks which of the first three tables run (all by default).
//!
//! Usage: `tb-enginebench [MODEL.gguf] [--runs N] [--batches 1,4,8] [--tables LIST] [--adapter DIR] [--tp N] [--smoke]` (model defaults to
//! `$TB_TEST_MODEL` or `.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf`). `--smoke` runs the
//! same code with 8 tokens and one run without a warm-up, and fails if either weight form generates
//! nothing.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Instant;

use tb_engine::sample::argmax;
use tb_engine::{
    BatchItem, ChatMessage, ChatTemplate, Engine, EngineError, GgufIndex, InProcessAllReduce,
    LoadOptions, Requantize, SamplingParams, Shard, StageInput, StageOutput, TensorParallel,
    Tokenizer,
};

const USAGE: &str = "usage: tb-enginebench [MODEL.gguf] [--runs N] [--batches 1,4,8] [--tables single,batched,prefix] [--adapter DIR] [--tp N] [--smoke]";

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
            requantize: if requant {
                Requantize::Always
            } else {
                Requantize::Never
            },
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

/// One TP measurement: ranks, TTFT (ms), decode tok/s, tokens generated (best of the runs).
struct TpRow {
    ranks: usize,
    ttft_ms: f64,
    tok_s: f64,
    generated: usize,
}

/// `ranks` tensor-parallel ranks of the whole model in threads: greedy generation of up to
/// `tokens` tokens (stopping at an end-of-sequence token), best of `runs`.
fn tp_run(
    path: &Path,
    ranks: usize,
    prompt: &[u32],
    eos: &[u32],
    runs: usize,
    tokens: usize,
    warm_up: bool,
) -> Result<TpRow, EngineError> {
    type Reply = Result<Option<Vec<f32>>, String>;
    let layers = GgufIndex::open(path)?.config().n_layers;
    let opts = LoadOptions {
        max_context: Some(2048),
        ..Default::default()
    };
    let mut cmds: Vec<Sender<(Vec<u32>, usize)>> = Vec::new();
    let mut replies: Vec<Receiver<Reply>> = Vec::new();
    let mut threads = Vec::new();
    for (rank, reduce) in InProcessAllReduce::group(ranks).into_iter().enumerate() {
        let (cmd_tx, cmd_rx) = channel::<(Vec<u32>, usize)>();
        let (reply_tx, reply_rx) = channel::<Reply>();
        let (path, opts) = (path.to_path_buf(), opts.clone());
        threads.push(std::thread::spawn(move || {
            let tp = TensorParallel { rank, ranks };
            let mut shard =
                match Shard::tensor_parallel_load(&path, 0, layers, &opts, tp, Box::new(reduce)) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = reply_tx.send(Err(e.to_string()));
                        return;
                    }
                };
            let _ = reply_tx.send(Ok(None));
            while let Ok((tokens, pos)) = cmd_rx.recv() {
                let reply = match shard.forward(0, StageInput::Tokens(tokens), pos) {
                    Ok(StageOutput::Logits(l)) => Ok(Some(l)),
                    Ok(StageOutput::Hidden(_)) => Ok(None),
                    Err(e) => Err(e.to_string()),
                };
                if reply_tx.send(reply).is_err() {
                    break;
                }
            }
        }));
        cmds.push(cmd_tx);
        replies.push(reply_rx);
    }
    let failed = |detail: String| EngineError::TensorParallel { detail };
    let collect = |replies: &[Receiver<Reply>]| -> Result<Option<Vec<f32>>, EngineError> {
        let mut logits = None;
        for r in replies {
            let reply = r.recv().map_err(|_| failed("a rank died".into()))?;
            if let Some(l) = reply.map_err(failed)? {
                logits = Some(l);
            }
        }
        Ok(logits)
    };
    collect(&replies)?; // every rank loaded
    let step = |tokens: Vec<u32>, pos: usize| -> Result<Vec<f32>, EngineError> {
        for c in &cmds {
            c.send((tokens.clone(), pos))
                .map_err(|_| failed("a rank died".into()))?;
        }
        collect(&replies)?.ok_or_else(|| failed("rank 0 returned no logits".into()))
    };
    let mut best: Option<TpRow> = None;
    for run in 0..runs + usize::from(warm_up) {
        let started = Instant::now();
        let mut next = argmax(&step(prompt.to_vec(), 0)?);
        let ttft_ms = started.elapsed().as_secs_f64() * 1e3;
        let first_at = Instant::now();
        let mut generated = 0;
        let mut pos = prompt.len();
        while generated < tokens && !eos.contains(&next) {
            generated += 1;
            if generated == tokens {
                break;
            }
            next = argmax(&step(vec![next], pos)?);
            pos += 1;
        }
        let tok_s = if generated > 1 {
            (generated - 1) as f64 / first_at.elapsed().as_secs_f64().max(1e-9)
        } else {
            0.0
        };
        if warm_up && run == 0 {
            continue;
        }
        best = Some(match best {
            None => TpRow {
                ranks,
                ttft_ms,
                tok_s,
                generated,
            },
            Some(b) => TpRow {
                ranks,
                ttft_ms: b.ttft_ms.min(ttft_ms),
                tok_s: b.tok_s.max(tok_s),
                generated: b.generated.max(generated),
            },
        });
    }
    drop(cmds);
    for t in threads {
        let _ = t.join();
    }
    best.ok_or_else(|| failed("no runs".into()))
}

/// The child process of `--tp N`: one rank on one thread, then N ranks; one `tp-result` line
/// each.
fn tp_child(path: &Path, ranks: usize, runs: usize, tokens: usize, warm_up: bool) -> ExitCode {
    let result = (|| -> Result<Vec<TpRow>, EngineError> {
        let index = GgufIndex::open(path)?;
        let tokenizer = Tokenizer::from_gguf(index.content())?;
        let template = ChatTemplate::from_gguf(index.content())?;
        let text = template.render(&[ChatMessage::new("user", PROMPT)], true)?;
        let prompt = tokenizer.encode(&text)?;
        let eos = tokenizer.eos_ids().to_vec();
        let mut rows = Vec::new();
        for n in [1, ranks] {
            rows.push(tp_run(path, n, &prompt, &eos, runs, tokens, warm_up)?);
        }
        Ok(rows)
    })();
    match result {
        Ok(rows) => {
            for r in rows {
                println!(
                    "tp-result {} {} {} {}",
                    r.ranks, r.ttft_ms, r.tok_s, r.generated
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tb-enginebench --tp-child: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the `--tp N` child and parses its rows.
fn tp_table(path: &Path, ranks: usize, runs: usize, smoke: bool) -> Result<Vec<TpRow>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg(path)
        .args([
            "--tp-child",
            &ranks.to_string(),
            "--runs",
            &runs.to_string(),
        ])
        .env("CANDLE_NUM_THREADS", "1")
        .env("RAYON_NUM_THREADS", "1");
    if smoke {
        cmd.arg("--smoke");
    }
    let out = cmd.output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    let rows: Vec<TpRow> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.strip_prefix("tp-result ")?.split(' ').collect();
            Some(TpRow {
                ranks: f.first()?.parse().ok()?,
                ttft_ms: f.get(1)?.parse().ok()?,
                tok_s: f.get(2)?.parse().ok()?,
                generated: f.get(3)?.parse().ok()?,
            })
        })
        .collect();
    if rows.len() != 2 {
        return Err("the --tp child printed no results".into());
    }
    Ok(rows)
}

struct PrefixRow {
    shared: usize,
    rest: usize,
    whole_ms: f64,
    forked_ms: f64,
}

/// TTFT of a question after a system prompt of about 128 and 512 tokens (32 and 64 with
/// `smoke`): the whole prompt prefilled, against forking the system prompt's positions from a
/// sequence that ran it and prefilling the rest. Best of `runs`.
fn prefix_table(path: &Path, runs: usize, smoke: bool) -> Result<Vec<PrefixRow>, EngineError> {
    let mut shard = Shard::load(
        path,
        0,
        GgufIndex::open(path)?.config().n_layers,
        &LoadOptions {
            max_context: Some(2048),
            ..LoadOptions::default()
        },
    )?;
    let tok = Tokenizer::from_file(path)?;
    let sentence = "The lab's Macs share models, data and work over Thunderbolt cables. ";
    let question = tok.encode(
        "<|im_start|>user\nWhich Mac holds the model file?<|im_end|>\n<|im_start|>assistant\n",
    )?;
    let sizes: &[usize] = if smoke { &[32, 64] } else { &[128, 512] };
    let mut rows = Vec::new();
    for &want in sizes {
        let mut system = tok.encode("<|im_start|>system\n")?;
        let unit = tok.encode(sentence)?;
        while system.len() < want {
            system.extend_from_slice(&unit);
        }
        system.truncate(want);
        let mut prompt = system.clone();
        prompt.extend_from_slice(&question);
        let (mut whole_ms, mut forked_ms) = (f64::MAX, f64::MAX);
        for run in 0..runs + usize::from(!smoke) {
            let t = Instant::now();
            shard.forward(1, StageInput::Tokens(prompt.clone()), 0)?;
            let whole = t.elapsed().as_secs_f64() * 1e3;
            shard.drop_sequence(1);
            shard.forward(2, StageInput::Tokens(system.clone()), 0)?;
            let t = Instant::now();
            shard.fork_sequence(2, 3, system.len())?;
            shard.forward(3, StageInput::Tokens(question.clone()), system.len())?;
            let forked = t.elapsed().as_secs_f64() * 1e3;
            shard.drop_sequence(2);
            shard.drop_sequence(3);
            // The first of a non-smoke run warms up.
            if smoke || run > 0 {
                whole_ms = whole_ms.min(whole);
                forked_ms = forked_ms.min(forked);
            }
        }
        rows.push(PrefixRow {
            shared: system.len(),
            rest: question.len(),
            whole_ms,
            forked_ms,
        });
    }
    Ok(rows)
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut path = tb_engine::test_model_path();
    let mut runs = None;
    let mut smoke = false;
    let mut batches = vec![1usize, 4, 8];
    let mut adapter: Option<PathBuf> = None;
    let mut tp: Option<usize> = None;
    let mut tp_child_ranks: Option<usize> = None;
    let mut tables: Vec<String> = ["single", "batched", "prefix"].map(String::from).to_vec();
    while let Some(a) = args.next() {
        if a == "--tables" {
            tables = args
                .next()
                .unwrap_or_default()
                .split(',')
                .map(|t| t.trim().to_string())
                .collect();
            if let Some(bad) = tables
                .iter()
                .find(|t| !["single", "batched", "prefix"].contains(&t.as_str()))
            {
                eprintln!(
                    "tb-enginebench: --tables: unknown table {bad:?} (expected single, batched, prefix)"
                );
                return ExitCode::FAILURE;
            }
            continue;
        }
        if a == "--tp" || a == "--tp-child" {
            let n = args.next().and_then(|n| n.parse().ok()).filter(|&n| n > 0);
            if a == "--tp" {
                tp = n;
            } else {
                tp_child_ranks = n;
            }
            continue;
        }
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
        } else if a == "--help" || a == "-h" {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        } else if a.starts_with('-') {
            eprintln!("tb-enginebench: unknown flag {a:?}\n{USAGE}");
            return ExitCode::from(2);
        } else {
            path = PathBuf::from(a);
        }
    }
    let runs = runs.unwrap_or(if smoke { 1 } else { 3 });
    let tokens = if smoke { SMOKE_TOKENS } else { TOKENS };
    if let Some(ranks) = tp_child_ranks {
        return tp_child(&path, ranks, runs, tokens, !smoke);
    }
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
    let want = |t: &str| tables.iter().any(|x| x == t);
    if want("single") {
        println!(
            "| weights | load (s) | weights in memory (MB) | prompt tokens | TTFT (ms) | decode tok/s | weights read (GB/s) | generated |"
        );
        println!("|---|---|---|---|---|---|---|---|");
    }
    let mut single_tok_s = 0.0;
    for requant in [false, true].into_iter().filter(|_| want("single")) {
        match run(&path, adapter.as_deref(), requant, runs, tokens, !smoke) {
            Ok(r) if smoke && r.generated == 0 => {
                eprintln!(
                    "tb-enginebench --smoke: FAILED: {} generated no tokens",
                    r.label
                );
                return ExitCode::FAILURE;
            }
            Ok(r) => {
                if requant {
                    single_tok_s = r.tok_s;
                }
                println!(
                    "| {} | {:.2} | {:.1} | {} | {:.1} | {:.1} | {:.2} | {} |",
                    r.label,
                    r.load_s,
                    r.weight_mb,
                    r.prompt_tokens,
                    r.ttft_ms,
                    r.tok_s,
                    // Every weight is read once per decoded token.
                    r.weight_mb * r.tok_s / 1e3,
                    r.generated
                )
            }
            Err(e) => {
                eprintln!("tb-enginebench: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    // Batched decoding, with the weights loaded as the built-in executor loads them.
    let batched = if !want("batched") {
        Ok(Vec::new())
    } else {
        Engine::load(
            &path,
            &LoadOptions {
                requantize: Requantize::Auto,
                max_context: Some(2048),
                adapter: adapter.clone(),
            },
        )
        .and_then(|mut engine| {
            let prompt = engine.chat_prompt(&[ChatMessage::new("user", PROMPT)])?;
            let weight_mb = engine.shard().weight_bytes() as f64 / 1e6;
            let mut rows = Vec::new();
            for &b in &batches {
                rows.push((
                    b,
                    run_batched(&mut engine, &prompt, b, tokens, runs)?,
                    weight_mb,
                ));
            }
            Ok(rows)
        })
    };
    match batched {
        Ok(rows) if rows.is_empty() => {}
        Ok(rows) => {
            println!(
                "\nbatched decoding (weights as the built-in executor serves them), {tokens} steps per sequence:\n"
            );
            println!(
                "| batch | aggregate decode tok/s | per sequence tok/s | vs batch 1 | weights read (GB/s) |"
            );
            println!("|---|---|---|---|---|");
            let one = rows.first().map_or(0.0, |r| r.1 / r.0 as f64);
            for (b, tps, weight_mb) in rows {
                let steps_per_second = tps / b as f64;
                println!(
                    "| {b} | {tps:.1} | {steps_per_second:.1} | {:.2}x | {:.2} |",
                    if one > 0.0 { tps / one } else { 0.0 },
                    // One step reads every weight once for the whole batch.
                    weight_mb * steps_per_second / 1e3
                );
            }
        }
        Err(e) => {
            eprintln!("tb-enginebench: batched: {e}");
            return ExitCode::FAILURE;
        }
    }
    // A shared system prompt: the whole prompt prefilled vs only what follows a kept prefix.
    match if want("prefix") {
        prefix_table(&path, runs, smoke)
    } else {
        Ok(Vec::new())
    } {
        Ok(rows) if rows.is_empty() => {}
        Ok(rows) => {
            println!(
                "\nshared prefix: time to first token of a question after a long system prompt, prefilled whole vs from a kept prefix (`Shard::fork_sequence`):\n"
            );
            println!(
                "| system prompt tokens | question tokens | TTFT whole (ms) | TTFT from the kept prefix (ms) | whole / kept |"
            );
            println!("|---|---|---|---|---|");
            for r in rows {
                println!(
                    "| {} | {} | {:.1} | {:.1} | {:.1}x |",
                    r.shared,
                    r.rest,
                    r.whole_ms,
                    r.forked_ms,
                    r.whole_ms / r.forked_ms.max(1e-9)
                );
            }
        }
        Err(e) => {
            eprintln!("tb-enginebench: shared prefix: {e}");
            return ExitCode::FAILURE;
        }
    }
    if let Some(ranks) = tp {
        if adapter.is_some() {
            println!("\n(the tensor-parallel table runs without the adapter)");
        }
        match tp_table(&path, ranks, runs, smoke) {
            Ok(rows) if smoke && rows.iter().any(|r| r.generated == 0) => {
                eprintln!("tb-enginebench --smoke: FAILED: tensor parallel generated no tokens");
                return ExitCode::FAILURE;
            }
            Ok(rows) => {
                println!(
                    "\ntensor parallel, ranks as threads of one process, in-process all-reduce:\n"
                );
                println!(
                    "| setup | CPU threads | TTFT (ms) | decode tok/s | vs 1 process | generated |"
                );
                println!("|---|---|---|---|---|---|");
                println!(
                    "| 1 process (second row above) | {threads} | | {single_tok_s:.1} | 1.00x | |"
                );
                for r in rows {
                    let label = if r.ranks == 1 {
                        "1 rank".to_string()
                    } else {
                        format!("{} ranks", r.ranks)
                    };
                    println!(
                        "| {label} | {} x 1 | {:.1} | {:.1} | {:.2}x | {} |",
                        r.ranks,
                        r.ttft_ms,
                        r.tok_s,
                        if single_tok_s > 0.0 {
                            r.tok_s / single_tok_s
                        } else {
                            0.0
                        },
                        r.generated
                    );
                }
            }
            Err(e) => {
                eprintln!("tb-enginebench: tensor parallel: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
