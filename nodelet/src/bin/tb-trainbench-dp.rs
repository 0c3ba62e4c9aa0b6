//! tb-trainbench-dp: data-parallel scaling of tb's built-in LoRA training — tokens/s of one rank
//! on the whole global batch against N ranks on their shares of it, and the all-reduce's share
//! of the step time. `tb-trainbench` (tb-engine) measures one in-process trainer; this bench
//! lives beside `tb-train` because it runs the same step: every rank is a separate process
//! (this binary, `RAYON_NUM_THREADS` = `--threads`, 1 by default) running
//! [`train::train_step`] — its share of the global batch (items rank, rank + world, ... as
//! [`Batches::rank_batch`] deals them), forward and backward, the gradients, loss and token
//! counts summed by [`Group`]'s bucketed ring all-reduce over tb-transport (TCP on 127.0.0.1),
//! then the same AdamW update on every rank.
//!
//! Each rank count runs in turn in the same invocation (1 rank first), on the same model,
//! sequences and steps: an untimed warm-up step, then `--steps` timed steps. Prints a markdown
//! table: ranks, threads per rank, seconds and tokens/s per step (the slowest rank's wall time),
//! speed-up over one rank, all-reduce ms per step (mean over ranks; waiting for the slowest
//! rank's backward is part of it) and its share of the step, and the same all-reduce alone (the
//! fastest of 3 started together after a barrier: the transfer without the wait). The bench fails if the ranks of a
//! group end with adapters that are not bit-for-bit identical; the largest difference from the
//! one-rank adapter (the same sums in another order) is printed for information.
//!
//! Usage: `tb-trainbench-dp [MODEL.gguf] [--ranks 2[,4...]] [--threads 1] [--seq 128]
//! [--batch 4] [--lora-rank 8] [--steps 3] [--targets q,k,v,o] [--smoke]`. `--smoke` runs one
//! step of 2 ranks on 2 sequences of 16 tokens without a warm-up (CI checks that the bench runs;
//! it measures nothing).

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use serde::{Deserialize, Serialize};
use tb_engine::adapter::{LoraConfig, Target};
use tb_engine::shard::default_device;
use tb_engine::train::data::Batches;
use tb_engine::train::{Example, TrainConfig, Trainer};
use tb_nodelet::builtin::StartError;
use tb_nodelet::builtin::train::{self, StepDone, group::Group};
use tb_transport::Preference;

/// The text the sequences are cut from (the same as tb-trainbench's).
const TEXT: &str = "The quick brown fox jumps over the lazy dog. Training a small language \
model on a laptop is a good way to learn how attention, normalisation and low-rank adapters \
fit together, one gradient step at a time. ";

/// A rank's line on stdout: this prefix, then [`RankResult`] as JSON.
const RESULT: &str = "RESULT ";

#[derive(Debug, Parser)]
#[command(
    name = "tb-trainbench-dp",
    about = "Data-parallel scaling of tb's LoRA training: 1 rank vs N ranks over tb-transport",
    // The launcher passes its own flags on to the ranks and appends the rank's.
    args_override_self = true
)]
struct Args {
    /// The GGUF file (default: SmolLM2 under .cache/models, or TB_TEST_MODEL).
    model: Option<PathBuf>,
    /// Rank counts to measure besides 1, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "2")]
    ranks: Vec<usize>,
    /// CPU threads per rank (RAYON_NUM_THREADS of each rank process).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 128)]
    seq: usize,
    /// Sequences per global batch (split over the ranks).
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// LoRA rank.
    #[arg(long, default_value_t = 8)]
    lora_rank: usize,
    /// Timed steps (after one untimed warm-up step).
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Adapted modules, comma-separated.
    #[arg(long, default_value = "q,k,v,o")]
    targets: String,
    /// One step of 2 ranks on 2 sequences of 16 tokens, no warm-up: checks that the bench runs.
    #[arg(long)]
    smoke: bool,
    /// Internal: run as this rank.
    #[arg(long, hide = true)]
    worker_rank: Option<usize>,
    /// Internal: the rank's group size.
    #[arg(long, hide = true, default_value_t = 1)]
    world: usize,
    /// Internal: rank 0's bootstrap address.
    #[arg(long, hide = true)]
    coordinator: Option<SocketAddr>,
    /// Internal: where the rank writes its adapter.
    #[arg(long, hide = true)]
    out: Option<PathBuf>,
}

/// What a rank measured.
#[derive(Debug, Serialize, Deserialize)]
struct RankResult {
    rank: usize,
    world: usize,
    /// Candle's CPU threads in this rank.
    threads: usize,
    /// Whether the trainer ran on the CPU (else a GPU).
    cpu: bool,
    load_seconds: f64,
    /// Examples of this rank's share of the last step.
    examples: usize,
    /// Timed steps and their wall time.
    steps: usize,
    seconds: f64,
    /// Time in the gradient all-reduce over the timed steps.
    all_reduce_seconds: f64,
    /// The fastest of 3 all-reduces of the same size started together (after a barrier).
    all_reduce_alone_seconds: f64,
    /// Tokens of the global batch per step (summed over the ranks).
    tokens: u64,
    /// Mean loss per target token of the last step's global batch.
    loss: f64,
    /// Values all-reduced per step (gradients plus loss and token counts).
    reduced_values: usize,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let mut args = Args::parse();
    if args.smoke {
        args.ranks = vec![2];
        args.seq = 16;
        args.batch = 2;
        args.steps = 1;
    }
    let outcome = match args.worker_rank {
        Some(rank) => worker(&args, rank),
        None => launch(&args),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("tb-trainbench-dp: FAILED: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn model_path(a: &Args) -> PathBuf {
    a.model.clone().unwrap_or_else(tb_engine::test_model_path)
}

fn targets(a: &Args) -> Result<Vec<Target>> {
    a.targets
        .split(',')
        .map(|t| Target::parse(t.trim()).ok_or_else(|| anyhow!("unknown target {t:?}")))
        .collect()
}

fn train_config(a: &Args) -> Result<TrainConfig> {
    let lora = LoraConfig {
        rank: a.lora_rank,
        alpha: 2.0 * a.lora_rank as f32,
        dropout: 0.0,
        rslora: false,
        targets: targets(a)?,
        base_model: String::new(),
    };
    Ok(TrainConfig {
        learning_rate: 1e-4,
        total_steps: (a.steps + 1) as u64,
        ..TrainConfig::new(lora)
    })
}

/// `batch` sequences of `seq` tokens of [`TEXT`], each target-only, starting at different
/// offsets.
fn examples(trainer: &Trainer, seq: usize, batch: usize) -> Result<Vec<Example>> {
    let text = trainer
        .tokenizer()
        .encode(&TEXT.repeat(1 + seq * batch / 20))?;
    (0..batch)
        .map(|b| {
            let start = (b * 7) % 16;
            let tokens = text
                .get(start..start + seq)
                .ok_or_else(|| anyhow!("the text is shorter than {seq} tokens"))?
                .to_vec();
            Ok(Example {
                loss_mask: vec![true; tokens.len()],
                tokens,
            })
        })
        .collect()
}

fn step_error(e: StartError) -> anyhow::Error {
    e.error.context(e.reason)
}

/// One rank: loads the model, joins the group, trains, writes its adapter to `--out` and its
/// [`RankResult`] to stdout.
fn worker(a: &Args, rank: usize) -> Result<()> {
    let world = a.world;
    let coordinator = a.coordinator.context("--coordinator is missing")?;
    let out = a.out.as_deref().context("--out is missing")?;
    let path = model_path(a);
    let t = Instant::now();
    let device = default_device();
    let mut trainer = Trainer::load(&path, train_config(a)?, &device)
        .with_context(|| format!("loading {}", path.display()))?;
    let load_seconds = t.elapsed().as_secs_f64();
    let examples = examples(&trainer, a.seq, a.batch)?;
    tracing::info!(rank, world, load_seconds, "model loaded");
    let hosts = vec![IpAddr::V4(Ipv4Addr::LOCALHOST); world];
    let mut group = Group::connect(
        rank,
        &hosts,
        coordinator,
        Preference::Tcp,
        Duration::from_secs(300),
        Duration::from_secs(600),
    )
    .context("connecting the ranks")?;
    let batches = Batches::new(examples.len(), a.batch, 0);
    let run_step = |trainer: &mut Trainer, group: &mut Group| -> Result<(StepDone, usize)> {
        let share: Vec<Example> = batches
            .rank_batch(trainer.step(), rank, world)
            .into_iter()
            .map(|i| examples[i].clone())
            .collect();
        let done = train::train_step(trainer, group, &share, share.len()).map_err(step_error)?;
        Ok((done, share.len()))
    };
    if !a.smoke {
        run_step(&mut trainer, &mut group)?;
    }
    group
        .barrier()
        .context("the barrier before the timed steps")?;
    let mut all_reduce = Duration::ZERO;
    let mut last = None;
    let t = Instant::now();
    for _ in 0..a.steps {
        let (done, share) = run_step(&mut trainer, &mut group)?;
        all_reduce += done.all_reduce;
        last = Some((done, share));
    }
    let seconds = t.elapsed().as_secs_f64();
    let (done, share) = last.context("no timed steps")?;
    let reduced_values = trainer.parameter_count() + 3;
    // The same all-reduce with every rank ready (after a barrier): the transfer alone, without
    // the wait for the slowest rank's backward that the in-step time includes.
    let mut probe = vec![0f32; reduced_values];
    let mut alone = Duration::MAX;
    for _ in 0..3 {
        group
            .barrier()
            .context("the barrier before the all-reduce probe")?;
        let t = Instant::now();
        group
            .all_reduce(&mut probe)
            .context("the all-reduce probe")?;
        alone = alone.min(t.elapsed());
    }
    let adapter = adapter_bytes(&trainer)?;
    let file = out.join(adapter_file(world, rank));
    std::fs::write(&file, adapter).with_context(|| format!("writing {}", file.display()))?;
    group.barrier().context("the last barrier")?;
    let result = RankResult {
        rank,
        world,
        threads: tb_engine::cpu_threads(),
        cpu: device.is_cpu(),
        load_seconds,
        examples: share,
        steps: a.steps,
        seconds,
        all_reduce_seconds: all_reduce.as_secs_f64(),
        all_reduce_alone_seconds: if world > 1 { alone.as_secs_f64() } else { 0.0 },
        tokens: done.tokens,
        loss: done.loss_sum / done.targets.max(1) as f64,
        reduced_values,
    };
    println!("{RESULT}{}", serde_json::to_string(&result)?);
    Ok(())
}

fn adapter_file(world: usize, rank: usize) -> String {
    format!("adapter-w{world}-r{rank}.f32")
}

/// The trained adapter's values (every pair, A then B, in key order) as little-endian f32.
fn adapter_bytes(trainer: &Trainer) -> Result<Vec<u8>> {
    let adapter = trainer.adapter()?;
    let mut bytes = Vec::new();
    for pair in adapter.pairs.values() {
        for t in [&pair.a, &pair.b] {
            let values: Vec<f32> = t.flatten_all()?.to_vec1()?;
            bytes.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        }
    }
    Ok(bytes)
}

fn f32s(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// A directory under the system temp dir, removed on drop.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new() -> Result<Self> {
        let p = std::env::temp_dir().join(format!("tb-trainbench-dp-{}", std::process::id()));
        std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(Self(p))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One row of the table.
struct Row {
    world: usize,
    threads: usize,
    examples: usize,
    step_seconds: f64,
    tokens_per_second: f64,
    all_reduce_ms: f64,
    /// The all-reduce with every rank ready, ms.
    alone_ms: f64,
    loss: f64,
    /// The ranks' adapters agree bit for bit.
    identical: bool,
    /// Largest |difference| from the one-rank adapter.
    max_diff: f64,
}

/// Runs every rank count in turn and prints the table.
fn launch(a: &Args) -> Result<()> {
    targets(a)?;
    if a.threads == 0 || a.seq == 0 || a.batch == 0 || a.steps == 0 || a.lora_rank == 0 {
        bail!("--threads, --seq, --batch, --steps and --lora-rank must be positive");
    }
    let mut worlds = vec![1];
    worlds.extend(a.ranks.iter().copied().filter(|&n| n > 1));
    worlds.sort_unstable();
    worlds.dedup();
    if let Some(&n) = worlds.iter().find(|&&n| n > a.batch) {
        bail!("{n} ranks need a global batch of at least {n} sequences (--batch)");
    }
    let scratch = ScratchDir::new()?;
    let mut results = Vec::new();
    for &world in &worlds {
        tracing::info!(ranks = world, threads = a.threads, "measuring");
        results.push(run_group(a, world, &scratch.0)?);
    }
    let reference = std::fs::read(scratch.0.join(adapter_file(1, 0)))?;
    let mut rows = Vec::new();
    for ranks in &results {
        let world = ranks.len();
        let mut identical = true;
        let mut max_diff = 0f64;
        let first = std::fs::read(scratch.0.join(adapter_file(world, 0)))?;
        for r in 1..world {
            identical &= std::fs::read(scratch.0.join(adapter_file(world, r)))? == first;
        }
        for (x, y) in f32s(&first).zip(f32s(&reference)) {
            max_diff = max_diff.max(f64::from((x - y).abs()));
        }
        let slowest = ranks.iter().map(|r| r.seconds).fold(0.0, f64::max);
        let steps = ranks[0].steps as f64;
        let all_reduce =
            ranks.iter().map(|r| r.all_reduce_seconds).sum::<f64>() / world as f64 / steps;
        rows.push(Row {
            world,
            threads: ranks[0].threads,
            examples: ranks.iter().map(|r| r.examples).max().unwrap_or(0),
            step_seconds: slowest / steps,
            tokens_per_second: ranks[0].tokens as f64 * steps / slowest,
            all_reduce_ms: all_reduce * 1e3,
            alone_ms: ranks
                .iter()
                .map(|r| r.all_reduce_alone_seconds)
                .sum::<f64>()
                / world as f64
                * 1e3,
            loss: ranks[0].loss,
            identical,
            max_diff,
        });
    }
    print_table(a, &results, &rows);
    if let Some(r) = rows.iter().find(|r| !r.loss.is_finite()) {
        bail!("the {}-rank run's loss is {}", r.world, r.loss);
    }
    let split: Vec<String> = rows
        .iter()
        .filter(|r| !r.identical)
        .map(|r| r.world.to_string())
        .collect();
    if !split.is_empty() {
        bail!(
            "the ranks of the {}-rank run(s) ended with different adapters",
            split.join(", ")
        );
    }
    Ok(())
}

/// Starts `world` rank processes, waits for them and reads their results (in rank order).
fn run_group(a: &Args, world: usize, out: &Path) -> Result<Vec<RankResult>> {
    let coordinator = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let exe = std::env::current_exe()?;
    let mut children = Vec::with_capacity(world);
    for rank in 0..world {
        let mut cmd = Command::new(&exe);
        cmd.args(std::env::args_os().skip(1))
            .arg("--worker-rank")
            .arg(rank.to_string())
            .arg("--world")
            .arg(world.to_string())
            .arg("--coordinator")
            .arg(coordinator.to_string())
            .arg("--out")
            .arg(out)
            .env("RAYON_NUM_THREADS", a.threads.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        match cmd.spawn() {
            Ok(child) => children.push(child),
            Err(e) => {
                // The ranks already started would wait for this one until their timeouts.
                for mut c in children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(e).with_context(|| format!("starting rank {rank} of {world}"));
            }
        }
    }
    let readers: Vec<_> = children
        .iter_mut()
        .map(|c| {
            let stdout = c.stdout.take();
            std::thread::spawn(move || -> Vec<String> {
                stdout
                    .map(|s| BufReader::new(s).lines().map_while(|l| l.ok()).collect())
                    .unwrap_or_default()
            })
        })
        .collect();
    let outputs: Vec<Vec<String>> = readers
        .into_iter()
        .map(|h| h.join().unwrap_or_default())
        .collect();
    let mut failed = Vec::new();
    for (rank, mut c) in children.into_iter().enumerate() {
        let status = c.wait()?;
        if !status.success() {
            failed.push(format!("rank {rank}: {status}"));
        }
    }
    if !failed.is_empty() {
        bail!("{world} ranks: {}", failed.join("; "));
    }
    let mut results = Vec::with_capacity(world);
    for (rank, lines) in outputs.iter().enumerate() {
        let line = lines
            .iter()
            .find_map(|l| l.strip_prefix(RESULT))
            .with_context(|| format!("rank {rank} of {world} printed no result"))?;
        let r: RankResult = serde_json::from_str(line)
            .with_context(|| format!("rank {rank} of {world}'s result"))?;
        if r.rank != rank || r.world != world {
            bail!(
                "rank {rank} of {world} reported rank {} of {}",
                r.rank,
                r.world
            );
        }
        results.push(r);
    }
    Ok(results)
}

fn print_table(a: &Args, results: &[Vec<RankResult>], rows: &[Row]) {
    let path = model_path(a);
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let first = &results[0][0];
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "n/a".into());
    println!(
        "\nmodel: {file}; device: {}; LoRA rank {} on {}; global batch {} x {} tokens; {} timed \
         step(s){}; gradient all-reduce of {} f32 ({:.1} MB) per step over tb-transport TCP on \
         127.0.0.1; load {:.1} s per rank; load average {load}{}\n",
        if first.cpu { "cpu" } else { "gpu" },
        a.lora_rank,
        a.targets,
        a.batch,
        a.seq,
        a.steps,
        if a.smoke { "" } else { " after a warm-up step" },
        first.reduced_values,
        first.reduced_values as f64 * 4.0 / 1e6,
        first.load_seconds,
        if a.smoke {
            " (smoke run: too small to measure anything)"
        } else {
            ""
        }
    );
    println!(
        "| ranks | threads per rank | sequences per rank | s per step | tokens/s | speed-up vs 1 rank | all-reduce ms per step | all-reduce share of step | all-reduce alone ms | loss | adapters |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let base = rows[0].tokens_per_second;
    for r in rows {
        let adapters = if r.world == 1 {
            "reference".to_string()
        } else {
            format!(
                "{} on every rank; max abs diff vs 1 rank {:.1e}",
                if r.identical {
                    "identical"
                } else {
                    "DIFFERENT"
                },
                r.max_diff
            )
        };
        println!(
            "| {} | {} | {} | {:.2} | {:.1} | {:.2}x | {:.1} | {:.1} % | {:.1} | {:.3} | {adapters} |",
            r.world,
            r.threads,
            r.examples,
            r.step_seconds,
            r.tokens_per_second,
            r.tokens_per_second / base,
            r.all_reduce_ms,
            100.0 * r.all_reduce_ms / 1e3 / r.step_seconds,
            r.alone_ms,
            r.loss,
        );
    }
    if let Some(two) = rows.iter().find(|r| r.world == 2)
        && !a.smoke
    {
        let ratio = two.tokens_per_second / base;
        println!(
            "\n2 ranks / 1 rank: {ratio:.2}x (target >= 1.7x: {})",
            if ratio >= 1.7 { "met" } else { "not met" }
        );
    }
}
