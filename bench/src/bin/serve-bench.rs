//! `serve-bench`: tb's OpenAI-compatible endpoint under concurrent streams — tb's engine in one
//! process, as a 2-stage pipeline of `tb-shard` processes over loopback TCP and as 2
//! tensor-parallel `tb-shard` ranks (`--tensor-parallel`), and, when
//! `--llama-server PATH` is given, llama.cpp's `llama-server` with the same GGUF, the same
//! threads and continuous batching — each driven by 1, 4, 8 and 16 streaming chat-completion
//! clients started together (temperature 0, a fixed prompt per stream, `--tokens` each), for
//! `--rounds` rounds per stream count after a warm-up. Prints one markdown table: aggregate
//! tokens/s, its ratio to the same configuration's 1-stream figure, inter-token latency p50 and
//! p99 (gaps between consecutive tokens of a stream, over every stream and round), TTFT p50,
//! the rate at which the weights were read (forward passes the server counted — tb's rank 0 at
//! `/health`, llama-server at `/metrics` — × the GGUF's bytes ÷ wall time: one pass reads every
//! weight once for all the sequences it carries, so batching shows as tokens/s rising faster
//! than it), the ratio to llama-server at the same stream count, and the CPU that other processes on the
//! machine used meanwhile (from `/proc/stat`, less the servers' and the bench's own); then the
//! targets.
//!
//! ```text
//! cargo build --release -p tb-nodelet --bin tb-shard -p tb-bench --bin serve-bench
//! target/release/serve-bench [--threads 2] [--rank-threads N] [--streams 1,4,8,16] [--tokens 64] [--rounds 3]
//!                          [--llama-server PATH] [--model FILE] [--shard-bin PATH]
//!                          [--shard-arg ARG]...
//! ```
//!
//! Every server binds to 127.0.0.1 and is killed when its configuration is done, when the
//! bench fails, and when the bench process dies. Every read waits at most 120 s and the run
//! stops adding rounds after `--time-limit-seconds`.
//!
//! `--smoke`: the tb configurations only, 1 and 2 streams, 4 tokens, one round; exits non-zero
//! when any stream gets no tokens.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use serde_json::json;
use tb_bench::openai_load::{
    self, CpuMeter, CpuShare, LlamaServerOptions, Server, Streamed, TbOptions,
};
use tb_bench::stats::Latencies;

#[derive(Debug, Parser)]
#[command(about = "tb's OpenAI endpoint under 1-16 concurrent streams, beside llama-server")]
struct Args {
    /// The GGUF model (default: the checkout's SmolLM2 from scripts/fetch-model.sh).
    #[arg(long)]
    model: Option<PathBuf>,
    /// CPU threads per process (RAYON_NUM_THREADS for tb-shard, -t/-tb for llama-server).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// CPU threads per process of the 2-process configurations (default: --threads). With
    /// `--threads 2 --rank-threads 1` every configuration runs 2 threads in all, as on a
    /// 2-core machine; with one Mac per rank each would have --threads.
    #[arg(long)]
    rank_threads: Option<usize>,
    /// Concurrent streams to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8,16")]
    streams: Vec<usize>,
    /// Tokens each stream asks for (max_tokens).
    #[arg(long, default_value_t = 64)]
    tokens: usize,
    /// Rounds per stream count (all streams of a round start together), after one warm-up.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Tokens of context per sequence (tb-shard --context; llama-server -c is this × slots).
    #[arg(long, default_value_t = 512)]
    context: usize,
    /// The tb-shard binary (default: beside this one).
    #[arg(long)]
    shard_bin: Option<PathBuf>,
    /// One more argument for every tb-shard (repeat for several, e.g.
    /// `--shard-arg=--prefill-per-step --shard-arg=64`).
    #[arg(long, allow_hyphen_values = true)]
    shard_arg: Vec<String>,
    /// llama.cpp's llama-server, to measure beside tb (skipped when absent).
    #[arg(long)]
    llama_server: Option<PathBuf>,
    /// Configurations to run, comma-separated: single (tb in one process), 2-stage (tb as a
    /// 2-stage pipeline), 2-tensor (tb as 2 tensor-parallel ranks), llama-server (needs
    /// --llama-server).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "single,2-stage,2-tensor,llama-server"
    )]
    configs: Vec<String>,
    /// No more rounds are started after this many seconds (each stream count keeps at least one).
    #[arg(long, default_value_t = 1800)]
    time_limit_seconds: u64,
    /// Before each round, wait up to this many seconds for the machine to be quiet (other
    /// processes using under 0.2 cores over 2 s); 0: do not wait.
    #[arg(long, default_value_t = 0)]
    wait_idle_seconds: u64,
    /// A check that every part runs, not a measurement: tb only, 1 and 2 streams, 4 tokens, one
    /// round (unless given); exits non-zero when a stream gets no tokens.
    #[arg(long)]
    smoke: bool,
}

/// What stream `i` asks (stream i of every round asks the same).
const SUBJECTS: [&str; 16] = [
    "a dragon who lives by the sea",
    "a lighthouse keeper and a storm",
    "a robot learning to paint",
    "a fox who finds a lost key",
    "two friends crossing a desert",
    "a baker who wakes before dawn",
    "a clock that runs backwards",
    "a sailor lost in fog",
    "a garden on the moon",
    "a cat who guards a library",
    "a train that never stops",
    "a girl who talks to rivers",
    "an old map in an attic",
    "a musician in a small town",
    "a bridge built by ants",
    "a winter without snow",
];

/// Stream `i`'s question in round `r`: the round opens it, so that no prompt repeats an
/// earlier one past the chat template's shared start, and neither server's prompt cache
/// (tb's prefix cache, llama-server's slot cache, both left on) answers it whole.
fn prompt(r: usize, i: usize) -> String {
    format!(
        "Story {}: write a long story about {}.",
        r + 1,
        SUBJECTS[i % SUBJECTS.len()]
    )
}

/// A tb configuration: its `--configs` key, its name in the table, its ranks (first block,
/// blocks) and whether they split every block (tensor parallel) rather than pipeline.
type TbConfig = (&'static str, &'static str, Vec<(usize, usize)>, bool);

/// What one (configuration, stream count) cell measured.
struct Cell {
    config: String,
    llama: bool,
    streams: usize,
    rounds: usize,
    /// All tokens generated over all rounds ÷ the rounds' wall time (first request sent → last
    /// stream ended).
    aggregate_tps: f64,
    itl: Latencies,
    ttft: Latencies,
    tokens_per_stream: f64,
    /// Streams that got no token.
    empty: usize,
    /// CPU over the cell's rounds: the servers' and the clients', and everything else's.
    cpu: CpuShare,
    /// The rate at which the weights were read: forward passes over the rounds × the model's
    /// bytes ÷ the rounds' wall time (None when the server does not count its passes).
    weights_gbs: Option<f64>,
}

fn ms(d: Option<Duration>) -> String {
    d.map_or("—".into(), |d| format!("{:.1}", d.as_secs_f64() * 1e3))
}

/// One round (numbered `r` over the whole run): `n` streams started together (a barrier), each
/// reading its whole answer.
fn round(server: &Server, r: usize, n: usize, tokens: usize) -> Result<Vec<Streamed>> {
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let http = server.http.clone();
            let barrier = barrier.clone();
            let body = json!({"model": "bench",
                "messages": [{"role": "user", "content": prompt(r, i)}],
                "max_tokens": tokens, "temperature": 0, "stream": true,
                "stream_options": {"include_usage": true}});
            std::thread::spawn(move || {
                barrier.wait();
                openai_load::stream(
                    &http,
                    "/v1/chat/completions",
                    &body,
                    Duration::from_secs(120),
                )
            })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for (i, h) in handles.into_iter().enumerate() {
        let r = h
            .join()
            .map_err(|_| anyhow::anyhow!("stream {i}'s thread panicked"))?
            .with_context(|| format!("stream {i} of {n}"))?;
        out.push(r);
    }
    Ok(out)
}

/// Waits (at most `limit`) until other processes use under 0.2 cores over 2 s.
fn wait_for_quiet(server: &Server, limit: Duration) {
    let start = Instant::now();
    while start.elapsed() < limit {
        let m = CpuMeter::start(server.pids());
        std::thread::sleep(Duration::from_secs(2));
        if m.finish().others < 0.2 {
            return;
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn measure(
    server: &mut Server,
    llama: bool,
    streams: &[usize],
    tokens: usize,
    rounds: usize,
    deadline: Instant,
    warmup_tokens: usize,
    wait_idle: Duration,
    weight_bytes: u64,
) -> Result<Vec<Cell>> {
    // Round numbers: the warm-up is 0, then every round of every cell its own.
    round(server, 0, 1, warmup_tokens).context("the warm-up")?;
    let mut numbered = 1;
    let mut cells = Vec::new();
    for &n in streams {
        let (mut wall, mut generated, mut done) = (Duration::ZERO, 0usize, 0usize);
        let (mut gaps, mut ttfts, mut empty) = (Vec::new(), Vec::new(), 0usize);
        // CPU over the rounds only (not the waits for a quiet machine), weighted by their time.
        let mut cpu = CpuShare::default();
        let mut passes = Some(0u64);
        while done < rounds && (done == 0 || Instant::now() < deadline) {
            wait_for_quiet(server, wait_idle);
            let steps_before = openai_load::steps_run(&server.http, llama);
            let meter = CpuMeter::start(server.pids());
            let rs = round(server, numbered, n, tokens)?;
            let used = meter.finish();
            let steps_after = openai_load::steps_run(&server.http, llama);
            passes = match (passes, steps_before, steps_after) {
                (Some(p), Some(b), Some(a)) => Some(p + a.saturating_sub(b)),
                _ => None,
            };
            numbered += 1;
            let start = rs.iter().map(|r| r.started).min().context("no streams")?;
            let end = rs.iter().map(|r| r.ended).max().context("no streams")?;
            let took = end.duration_since(start);
            let before = wall.as_secs_f64();
            wall += took;
            let after = wall.as_secs_f64().max(1e-9);
            let (a, b) = (before / after, took.as_secs_f64() / after);
            cpu.ours = cpu.ours * a + used.ours * b;
            cpu.others = cpu.others * a + used.others * b;
            for r in &rs {
                generated += r.tokens();
                gaps.extend(r.gaps());
                ttfts.extend(r.ttft());
                if r.arrivals.is_empty() {
                    empty += 1;
                }
            }
            done += 1;
        }
        server.check_alive()?;
        let cell = Cell {
            config: server.name.clone(),
            llama,
            streams: n,
            rounds: done,
            aggregate_tps: generated as f64 / wall.as_secs_f64().max(1e-9),
            itl: Latencies::new(gaps),
            ttft: Latencies::new(ttfts),
            tokens_per_stream: generated as f64 / (n * done).max(1) as f64,
            empty,
            cpu,
            weights_gbs: passes
                .map(|p| p as f64 * weight_bytes as f64 / 1e9 / wall.as_secs_f64().max(1e-9)),
        };
        eprintln!(
            "serve-bench: {} × {n}: {:.1} tok/s, ITL p50 {} p99 {} ms, TTFT p50 {} ms \
             ({} rounds; CPU: ours {:.2}, others {:.2} cores)",
            cell.config,
            cell.aggregate_tps,
            ms(cell.itl.quantile(0.5)),
            ms(cell.itl.quantile(0.99)),
            ms(cell.ttft.quantile(0.5)),
            done,
            cell.cpu.ours,
            cell.cpu.others
        );
        cells.push(cell);
    }
    Ok(cells)
}

/// `llama-server --version`'s line ("version: N (hash)").
fn llama_version(bin: &Path) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            text.lines()
                .find(|l| l.starts_with("version:"))
                .map(|l| l.trim_start_matches("version:").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() -> Result<()> {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Args::command().get_matches();
    let mut args = Args::from_arg_matches(&matches)?;
    let given = |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    if args.smoke {
        if !given("tokens") {
            args.tokens = 4;
        }
        if !given("rounds") {
            args.rounds = 1;
        }
        if !given("streams") {
            args.streams = vec![1, 2];
        }
        args.llama_server = None;
    }
    if args.streams.is_empty() || args.streams.contains(&0) {
        bail!("--streams: give counts of 1 or more");
    }
    if let Some(c) = args
        .configs
        .iter()
        .find(|c| !["single", "2-stage", "2-tensor", "llama-server"].contains(&c.as_str()))
    {
        bail!("--configs: {c:?} is none of single, 2-stage, 2-tensor, llama-server");
    }
    if args.rounds == 0 || args.tokens == 0 || args.threads == 0 || args.rank_threads == Some(0) {
        bail!("--rounds, --tokens, --threads and --rank-threads must be at least 1");
    }
    let model = args.model.clone().unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    if !model.is_file() {
        bail!("{} is missing: run scripts/fetch-model.sh", model.display());
    }
    // What a forward pass reads: the GGUF's tensors (its header and metadata are kilobytes).
    let weight_bytes = std::fs::metadata(&model)
        .with_context(|| format!("reading {}", model.display()))?
        .len();
    let bin = match &args.shard_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("no directory for this binary")?
            .join("tb-shard"),
    };
    let max_streams = *args.streams.iter().max().context("no stream counts")?;
    let deadline = Instant::now() + Duration::from_secs(args.time_limit_seconds);
    let warmup = args.tokens.min(8);
    let logs = tempfile::tempdir()?;

    let started_at = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC");
    let load_before = load();
    let llama_version = args.llama_server.as_deref().map(llama_version);
    println!(
        "model {}, {} thread(s) per process ({} per process of a 2-process configuration), {} tokens per stream (temperature 0, a \
         prompt per stream and round), {} round(s) per stream count after a warm-up, {} \
         tokens of context per sequence, {started_at}, load {load_before} before",
        model.display(),
        args.threads,
        args.rank_threads.unwrap_or(args.threads),
        args.tokens,
        args.rounds,
        args.context
    );
    if let Some(v) = &llama_version {
        println!("llama-server: version {v}");
    }

    let mut cells = Vec::new();
    let tb_configs: [TbConfig; 3] = [
        (
            "single",
            "tb, single process (30 blocks)",
            vec![(0, 30)],
            false,
        ),
        (
            "2-stage",
            "tb, 2-stage pipeline (15 + 15)",
            vec![(0, 15), (15, 15)],
            false,
        ),
        (
            "2-tensor",
            "tb, 2 tensor-parallel ranks (KV heads 2 + 1)",
            vec![(0, 30), (0, 30)],
            true,
        ),
    ];
    let wanted = |key: &str| args.configs.iter().any(|c| c == key);
    for (key, name, splits, tensor) in &tb_configs {
        if !wanted(key) {
            continue;
        }
        let mut server = openai_load::start_tb(
            name,
            &TbOptions {
                bin: &bin,
                model: &model,
                splits,
                threads: if splits.len() > 1 {
                    args.rank_threads.unwrap_or(args.threads)
                } else {
                    args.threads
                },
                batch: max_streams,
                context: Some(args.context),
                tensor: *tensor,
                shard_args: &args.shard_arg,
            },
        )?;
        cells.extend(measure(
            &mut server,
            false,
            &args.streams,
            args.tokens,
            args.rounds,
            deadline,
            warmup,
            Duration::from_secs(args.wait_idle_seconds),
            weight_bytes,
        )?);
    }
    if let Some(llama) = args
        .llama_server
        .as_ref()
        .filter(|_| wanted("llama-server"))
    {
        let log = logs.path().join("llama-server.log");
        let started = openai_load::start_llama_server(
            "llama.cpp llama-server",
            &LlamaServerOptions {
                bin: llama,
                model: &model,
                threads: args.threads,
                parallel: max_streams,
                context: args.context,
                log: Some(&log),
            },
        );
        let mut server = match started {
            Ok(s) => s,
            Err(e) => {
                let tail = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = tail.lines().rev().take(20).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                return Err(e.context(format!("llama-server's log:\n{}", tail.join("\n"))));
            }
        };
        cells.extend(measure(
            &mut server,
            true,
            &args.streams,
            args.tokens,
            args.rounds,
            deadline,
            warmup,
            Duration::from_secs(args.wait_idle_seconds),
            weight_bytes,
        )?);
    }

    println!();
    println!(
        "| configuration | streams | aggregate tok/s | vs 1 stream | ITL p50 (ms) | ITL p99 (ms) \
         | TTFT p50 (ms) | weights read (GB/s) | tokens/stream | rounds | others' CPU (cores) \
         | vs llama-server |"
    );
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for c in &cells {
        let one = cells
            .iter()
            .find(|o| o.config == c.config && o.streams == 1)
            .map_or("—".into(), |o| {
                format!("{:.2}×", c.aggregate_tps / o.aggregate_tps)
            });
        let vs_llama = cells
            .iter()
            .find(|o| o.llama && o.streams == c.streams)
            .filter(|_| !c.llama)
            .map_or("—".into(), |o| {
                format!("{:.2}×", c.aggregate_tps / o.aggregate_tps)
            });
        println!(
            "| {} | {} | {:.1} | {one} | {} | {} | {} | {} | {:.1} | {} | {:.2} | {vs_llama} |",
            c.config,
            c.streams,
            c.aggregate_tps,
            ms(c.itl.quantile(0.5)),
            ms(c.itl.quantile(0.99)),
            ms(c.ttft.quantile(0.5)),
            c.weights_gbs.map_or("—".into(), |g| format!("{g:.2}")),
            c.tokens_per_stream,
            c.rounds,
            c.cpu.others
        );
    }
    println!();
    println!("load {} after", load());

    // The targets, for each tb configuration at 8 streams (when measured).
    let get = |config: &str, n: usize| cells.iter().find(|c| c.config == config && c.streams == n);
    let llama = |n: usize| cells.iter().find(|c| c.llama && c.streams == n);
    let met = |ok: bool| if ok { "met" } else { "not met" };
    for (_, name, _, _) in &tb_configs {
        let (Some(one), Some(eight)) = (get(name, 1), get(name, 8)) else {
            continue;
        };
        let ratio = eight.aggregate_tps / one.aggregate_tps;
        if let (Some(l1), Some(l8)) = (llama(1), llama(8)) {
            let lratio = l8.aggregate_tps / l1.aggregate_tps;
            println!(
                "{name}: aggregate at 8 streams {:.1} vs llama-server {:.1} tok/s (target ≥): {}",
                eight.aggregate_tps,
                l8.aggregate_tps,
                met(eight.aggregate_tps >= l8.aggregate_tps)
            );
            println!(
                "{name}: 8-vs-1 ratio {ratio:.2}× vs llama-server {lratio:.2}× (target ≥): {}",
                met(ratio >= lratio)
            );
        }
        if let (Some(p1), Some(p8)) = (one.itl.quantile(0.99), eight.itl.quantile(0.99)) {
            println!(
                "{name}: ITL p99 at 8 streams {} ms vs 2 × {} ms at 1 stream (target ≤): {}",
                ms(Some(p8)),
                ms(Some(p1)),
                met(p8 <= p1 * 2)
            );
        }
    }

    if args.smoke {
        let empty: usize = cells.iter().map(|c| c.empty).sum();
        if empty > 0 {
            bail!("serve-bench --smoke: FAILED: {empty} stream(s) got no tokens");
        }
        println!("serve-bench --smoke: every stream got tokens");
    }
    Ok(())
}
