//! `pipeline-bench`: tb's built-in engine in one process against the same model split into a
//! 2-stage and a 3-stage pipeline of `tb-shard` processes over loopback TCP, and over 2 and 3
//! tensor-parallel ranks (as far as the model's KV heads allow), side by side in one run. For each: time to first token (TTFT) and decode tokens/s for a fixed prompt and 64
//! generated tokens (greedy), measured through the OpenAI-compatible endpoint with streaming,
//! best of N runs after a warm-up. Each process's CPU kernels get `--threads` threads
//! (`RAYON_NUM_THREADS`), so every configuration computes with the same thread count per stage.
//!
//! ```text
//! cargo build --release -p tb-nodelet --bin tb-shard -p tb-bench --bin pipeline-bench
//! target/release/pipeline-bench [--model FILE] [--tokens 64] [--runs 3] [--threads 1] [--smoke]
//!                               [--llama-bin DIR]
//! ```
//!
//! With `--llama-bin`, llama.cpp's pipelines over its RPC backend (`ggml-rpc-server` processes,
//! `tb_bench::llama_rpc`) are measured after tb's, one per tb pipeline, and printed beside them.
//!
//! `--smoke` runs the same configurations with 8 tokens and one timed run each, and
//! exits non-zero if any configuration does not start or generates nothing.
//!
//! Beside each observed rate the table prints what tb's placement predicts for that split
//! (`tb_core::placement::evaluate`, latency objective: one stream) from the figures a nodelet
//! would report on this machine: the engine's own measurement (`tb-shard --calibrate`, with the
//! same threads) and the loopback round trip measured here; the link's bandwidth is taken as
//! 100 Gb/s (a hop carries 1.2 KB, under a microsecond at any loopback speed). The KV cache a
//! token reads is the one the run has filled: placement is asked for a context of the prompt
//! plus half the generated tokens (the average over the decode), where a service's plan
//! reserves, and predicts for, its whole context.

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
    /// A directory holding llama.cpp's `llama-bench` and `ggml-rpc-server` (built with
    /// -DGGML_RPC=ON): its pipelines over RPC servers are measured beside tb's.
    #[arg(long)]
    llama_bin: Option<PathBuf>,
    /// A check that every part runs, not a measurement: 8 tokens, 1 timed run (unless
    /// --tokens/--runs are given); exits non-zero when a configuration generates nothing.
    #[arg(long)]
    smoke: bool,
}

/// A configuration: its name, each rank's (first block, blocks), and whether the ranks are
/// one tensor-parallel stage.
type Config = (String, Vec<(usize, usize)>, bool);

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
    if let Some(dir) = &args.llama_bin {
        tb_bench::llama_rpc::check_binaries(dir)?;
    }
    let figures = Figures::measure(&bin, args.threads)?;
    let spec = model_spec(&model)?;
    let layers = spec
        .layers
        .context("the model's header gives no block count")? as usize;
    if layers < 3 {
        bail!(
            "{}: {layers} blocks; a 3-stage pipeline needs 3",
            model.display()
        );
    }
    let mut configs: Vec<Config> = (1..=3)
        .map(|stages| {
            let splits: Vec<(usize, usize)> = (0..stages)
                .map(|i| {
                    let start = layers * i / stages;
                    (start, layers * (i + 1) / stages - start)
                })
                .collect();
            let counts: Vec<String> = splits.iter().map(|(_, n)| n.to_string()).collect();
            let name = match stages {
                1 => format!("single process ({layers} blocks)"),
                n => format!("{n}-stage pipeline ({})", counts.join(" + ")),
            };
            (name, splits, false)
        })
        .collect();
    // Every block split over 2 and 3 tensor-parallel ranks, as far as the KV heads go (each
    // rank takes whole KV heads, the first ones one more when they do not divide).
    let kv_heads = spec.kv_heads.unwrap_or(0) as usize;
    for ranks in (2..=3).filter(|&r| r <= kv_heads) {
        let heads: Vec<String> = (0..ranks)
            .map(|r| (kv_heads / ranks + usize::from(r < kv_heads % ranks)).to_string())
            .collect();
        configs.push((
            format!(
                "{ranks} tensor-parallel ranks (KV heads {})",
                heads.join(" + ")
            ),
            vec![(0, layers); ranks],
            true,
        ));
    }
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
    println!(
        "engine figures (tb-shard --calibrate, {} thread(s)): {:.2} GB/s of weights, {:.0} µs \
         per token; loopback round trip {:.1} µs",
        args.threads, figures.weight_gbs, figures.token_overhead_us, figures.rtt_us
    );
    println!();
    println!(
        "| configuration | TTFT (ms) | decode tok/s | vs single | predicted tok/s | observed ÷ predicted | tokens |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut single = None;
    // Each pipeline's stage count and decode rate, for the comparison with llama.cpp.
    let mut pipelines: Vec<(usize, f64)> = Vec::new();
    for (name, splits, tensor) in &configs {
        let p = openai_load::start_tb(
            name,
            &TbOptions {
                bin: &bin,
                model: &model,
                splits,
                threads: args.threads,
                batch: 1,
                context: None,
                tensor: *tensor,
                shard_args: &[],
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
        // The average position over the decode: the KV cache a token reads on average.
        let context = b.prompt_tokens.unwrap_or(0) + b.tokens() / 2;
        let predicted = figures.predict(&spec, splits, *tensor, context)?;
        if !*tensor {
            pipelines.push((splits.len(), b.decode_tps()));
        }
        println!(
            "| {name} | {:.1} | {:.1} | {:.2} | {:.1} | {:.2} | {} |",
            b.ttft().unwrap_or_default().as_secs_f64() * 1e3,
            b.decode_tps(),
            b.decode_tps() / base,
            predicted,
            b.decode_tps() / predicted,
            b.tokens()
        );
        drop(p);
    }
    println!();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (name, splits, tensor) in &configs {
        if *tensor && splits.len() * args.threads > cores {
            // Tensor-parallel ranks all compute at once (a pipeline's stages take turns with
            // one stream), so the prediction, for one Mac per rank, does not hold here.
            println!(
                "note: {name}: {} threads computing at once on {cores} cores; the prediction is \
                 for one Mac per rank",
                splits.len() * args.threads
            );
        }
    }
    match &args.llama_bin {
        Some(dir) => compare_with_llama(&args, dir, &model, &pipelines)?,
        None => println!(
            "llama.cpp over RPC: not measured (--llama-bin DIR: a llama.cpp build with \
             -DGGML_RPC=ON holding llama-bench and ggml-rpc-server)"
        ),
    }
    Ok(())
}

/// llama.cpp's pipelines beside tb's: the model's layers split evenly over as many
/// `ggml-rpc-server` processes as tb has stages (none for the single process), every process
/// with the same threads.
fn compare_with_llama(
    args: &Args,
    dir: &Path,
    model: &Path,
    pipelines: &[(usize, f64)],
) -> Result<()> {
    let logs = tempfile::tempdir()?;
    let llama = tb_bench::llama_rpc::LlamaRpc {
        bin_dir: dir,
        model,
        threads: args.threads,
        tokens: args.tokens,
        runs: args.runs,
        log_dir: logs.path(),
    };
    println!();
    println!(
        "llama.cpp over RPC ({}): llama-bench -p 0 -n {} -r {} -t {}, layers split evenly \
         over ggml-rpc-server processes on loopback (-ngl 99 -ts 1/1/…), each with -t {}; best \
         run. llama-bench decodes from an empty context, tb after the prompt.",
        dir.display(),
        args.tokens,
        args.runs,
        args.threads,
        args.threads
    );
    println!();
    println!("| stages | llama.cpp | llama.cpp decode tok/s | tb decode tok/s | tb ÷ llama.cpp |");
    println!("|---|---|---|---|---|");
    for &(stages, tb) in pipelines {
        let (what, servers) = match stages {
            1 => ("one process, no RPC".to_string(), 0),
            n => (format!("{n} RPC servers"), n),
        };
        let theirs = llama
            .decode_tps(servers)
            .with_context(|| format!("llama.cpp with {what}"))?;
        if args.smoke && theirs <= 0.0 {
            bail!("pipeline-bench --smoke: FAILED: llama.cpp with {what} decoded nothing");
        }
        println!(
            "| {stages} | {what} | {theirs:.1} | {tb:.1} | {:.2} |",
            tb / theirs
        );
    }
    Ok(())
}

/// What placement would know of this machine: the engine's measured figures and the loopback
/// link's round trip.
struct Figures {
    weight_gbs: f64,
    token_overhead_us: f64,
    rtt_us: f64,
}

impl Figures {
    fn measure(shard_bin: &Path, threads: usize) -> Result<Figures> {
        let out = std::process::Command::new(shard_bin)
            .arg("--calibrate")
            .env("RAYON_NUM_THREADS", threads.to_string())
            .env("RUST_LOG", "warn")
            .output()
            .with_context(|| format!("running {} --calibrate", shard_bin.display()))?;
        if !out.status.success() {
            bail!(
                "{} --calibrate failed: {}",
                shard_bin.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let c: tb_api::status::EngineCalibration = serde_json::from_slice(&out.stdout)
            .with_context(|| {
                format!(
                    "{} --calibrate printed {:?}",
                    shard_bin.display(),
                    String::from_utf8_lossy(&out.stdout)
                )
            })?;
        Ok(Figures {
            weight_gbs: c.weight_gbs,
            token_overhead_us: c.token_overhead_us,
            rtt_us: loopback_rtt_us()?,
        })
    }

    /// Placement's tokens/s for one stream over `splits` (one identical Mac per stage, or per
    /// rank of one tensor-parallel stage).
    fn predict(
        &self,
        model: &tb_api::specs::model::ModelSpec,
        splits: &[(usize, usize)],
        tensor: bool,
        context: usize,
    ) -> Result<f64> {
        use tb_core::placement::cost::Assignment;
        use tb_core::placement::memory::ModelShape;
        use tb_core::placement::{
            LinkInfo, Mac, Objective, Strategy, Topology, Workload, evaluate,
        };
        let strategy = if tensor {
            Strategy::Tensor
        } else {
            Strategy::Pipeline
        };
        let names: Vec<String> = (1..=splits.len()).map(|i| format!("stage-{i}")).collect();
        let macs = names
            .iter()
            .map(|name| Mac {
                name: name.clone(),
                chip: "this machine".into(),
                allocatable_bytes: 64 << 30,
                free_bytes: 64 << 30,
                memory_bandwidth_gbs: self.weight_gbs,
                token_overhead_us: self.token_overhead_us,
                engine_measured: true,
                gpu_cores: 0,
                labels: Default::default(),
                unavailable: None,
            })
            .collect();
        let link = LinkInfo {
            bandwidth_gbps: 100.0,
            latency_us: self.rtt_us,
            rdma: false,
            cables: 1,
            measured: true,
            rdma_devices: Default::default(),
        };
        let mut links = Vec::new();
        for (i, a) in names.iter().enumerate() {
            for b in &names[i + 1..] {
                links.push((a.clone(), b.clone(), link.clone()));
            }
        }
        let workload = Workload {
            model: ModelShape::from_spec("model", model, Some(context.max(1) as u32), Some(1))
                .map_err(anyhow::Error::msg)?,
            strategy,
            objective: Objective::Latency,
            min_nodes: 1,
            max_nodes: None,
            node_selector: Default::default(),
        };
        let assignment = Assignment {
            strategy,
            order: names
                .iter()
                .zip(splits)
                .map(|(n, (_, count))| (n.clone(), *count as u32))
                .collect(),
        };
        let cost = evaluate(&Topology::new(macs, links), &workload, &assignment)
            .map_err(|e| anyhow::anyhow!("placement refused the split: {}", e.reason))?;
        Ok(cost.tokens_per_second)
    }
}

/// The Model spec `tbctl model inspect` makes of the GGUF file: what placement would know.
fn model_spec(path: &Path) -> Result<tb_api::specs::model::ModelSpec> {
    let header = tb_api::gguf::GgufHeader::read(path)?;
    Ok(header
        .model_facts()
        .model_spec(&path.display().to_string(), header.file_bytes))
}

/// Median round trip of a 64-byte message over loopback TCP (Nagle off), µs: what a nodelet's
/// link probe measures between two Macs.
fn loopback_rtt_us() -> Result<f64> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    const ROUNDS: usize = 2000;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let mut buf = [0u8; 64];
        for _ in 0..ROUNDS {
            s.read_exact(&mut buf)?;
            s.write_all(&buf)?;
        }
        Ok(())
    });
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut buf = [0u8; 64];
    let mut times = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = std::time::Instant::now();
        s.write_all(&buf)?;
        s.read_exact(&mut buf)?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    echo.join()
        .map_err(|_| anyhow::anyhow!("the echo thread panicked"))??;
    times.sort_by(f64::total_cmp);
    Ok(times[ROUNDS / 2])
}
