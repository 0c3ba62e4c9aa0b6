//! `tb-train`: one rank of a tb built-in fine-tune (a TrainingJob with `executor: builtin`).
//! The nodelet starts it for such allocations (see `tb_nodelet::builtin::train`); it can also
//! be run by hand:
//!
//! ```text
//! tb-train --model m.gguf --model-name m --rank 0 --hosts 127.0.0.1 \
//!          --coordinator 127.0.0.1:7101 --dataset facts.jsonl --output adapter \
//!          --finetune '{"steps": 20, "batchSize": 2, "sequenceLength": 64}'
//! ```

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tb_api::specs::FineTuneSpec;
use tb_nodelet::builtin::command::TERMINATION_MESSAGE_ENV;
use tb_nodelet::builtin::train::{self, TrainOptions, progress::PROGRESS_FILE_ENV};
use tb_transport::Preference;

#[derive(Debug, Parser)]
#[command(
    name = "tb-train",
    version,
    about = "One rank of a tb built-in fine-tune"
)]
struct Args {
    /// The GGUF file.
    #[arg(long)]
    model: PathBuf,
    /// The Model's name (recorded in the adapter).
    #[arg(long)]
    model_name: String,
    /// This rank (0 writes the adapter and the progress).
    #[arg(long, default_value_t = 0)]
    rank: usize,
    /// Every rank's data-plane IP, comma-separated, in rank order.
    #[arg(long, value_delimiter = ',', required = true)]
    hosts: Vec<IpAddr>,
    /// Rank 0's bootstrap address, ip:port.
    #[arg(long)]
    coordinator: SocketAddr,
    /// The JSONL dataset (with --dataset-source: its path on the holder).
    #[arg(long)]
    dataset: PathBuf,
    /// Fetch this rank's examples from the nodelet holding the dataset (its staging address,
    /// ip:port) instead of reading the file here.
    #[arg(long)]
    dataset_source: Option<SocketAddr>,
    /// The TrainingJob's `finetune` section, as JSON.
    #[arg(long)]
    finetune: String,
    /// Where rank 0 writes the PEFT adapter.
    #[arg(long)]
    output: PathBuf,
    /// Where checkpoints go (the job's checkpoints.dir).
    #[arg(long, env = "TB_CHECKPOINT_DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// Save a checkpoint every this many steps.
    #[arg(long, env = "TB_CHECKPOINT_EVERY_STEPS")]
    checkpoint_every: Option<u64>,
    /// The checkpoint to resume from (rank 0's is every rank's).
    #[arg(long, env = "TB_RESUME_FROM")]
    resume_from: Option<PathBuf>,
    /// Rank 0's progress file, read by the nodelet.
    #[arg(long, env = PROGRESS_FILE_ENV)]
    progress: Option<PathBuf>,
    /// Bytes this rank may use (its allocation's memory).
    #[arg(long)]
    memory_limit: Option<u64>,
    /// Seconds the ranks may take to find each other.
    #[arg(long, default_value_t = 600)]
    connect_timeout: u64,
    /// Seconds a collective waits for the slowest rank's step.
    #[arg(long, default_value_t = 600)]
    step_timeout: u64,
    /// tcp, rdma or auto (`TB_TRANSPORT` overrides).
    #[arg(long, default_value = "auto", env = "TB_TRANSPORT")]
    transport: String,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Logs go to files `tbctl logs` reads: colour only on a terminal.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    let transport = match Preference::parse(&args.transport) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("tb-train: --transport: {e}");
            return ExitCode::from(2);
        }
    };
    let finetune: FineTuneSpec = match serde_json::from_str(&args.finetune) {
        Ok(f) => f,
        Err(e) => {
            return report("InvalidSpec", &format!("--finetune: {e}"));
        }
    };
    let opts = TrainOptions {
        model_path: args.model,
        model_name: args.model_name,
        rank: args.rank,
        hosts: args.hosts,
        coordinator: args.coordinator,
        dataset: args.dataset,
        dataset_source: args.dataset_source,
        finetune,
        output: args.output,
        checkpoint_dir: args.checkpoint_dir,
        checkpoint_every: args.checkpoint_every,
        resume_from: args.resume_from,
        progress: args.progress,
        memory_limit: args.memory_limit,
        connect_timeout: Duration::from_secs(args.connect_timeout),
        step_timeout: Duration::from_secs(args.step_timeout),
        transport,
    };
    match train::run(opts) {
        Ok(done) => {
            tracing::info!(
                steps = done.steps,
                loss = ?done.loss,
                eval_loss = ?done.eval_loss,
                seconds = format!("{:.1}", done.seconds),
                "training finished"
            );
            ExitCode::SUCCESS
        }
        Err(e) => report(e.reason, &format!("{:#}", e.error)),
    }
}

/// Says why in the log and, for the nodelet, in the termination message: `Reason\nmessage`.
fn report(reason: &str, message: &str) -> ExitCode {
    tracing::error!(reason, "{message}");
    if let Some(path) = std::env::var_os(TERMINATION_MESSAGE_ENV) {
        let _ = std::fs::write(path, format!("{reason}\n{message}"));
    }
    ExitCode::FAILURE
}
