//! `tb-shard`: one rank of a built-in inference service — its layers of a GGUF model, its
//! stage of the pipeline, and on rank 0 the OpenAI-compatible endpoint. The nodelet starts it
//! for built-in allocations (see `tb_nodelet::builtin`); it can also be run by hand:
//!
//! ```text
//! tb-shard --model m.gguf --model-name m --rank 0 --hosts 127.0.0.1 \
//!          --coordinator 127.0.0.1:7101 --http 127.0.0.1:8080
//! ```
//!
//! `tb-shard --calibrate` measures this machine's engine as a nodelet does at start (the
//! figures placement predicts tokens/s from) and prints them as one JSON object.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tb_nodelet::agent::engine_figures;
use tb_nodelet::builtin::{self, ShardOptions, command::TERMINATION_MESSAGE_ENV};
use tb_transport::Preference;

#[derive(Debug, Parser)]
#[command(
    name = "tb-shard",
    version,
    about = "One rank of a tb built-in inference service"
)]
struct Args {
    /// Measure this machine's engine (decode GB/s of weights and per-token overhead, as a
    /// nodelet does at start), print it as JSON and exit.
    #[arg(long, exclusive = true)]
    calibrate: bool,
    /// The GGUF file.
    #[arg(long, required = true)]
    model: Option<PathBuf>,
    /// The model id the endpoint serves.
    #[arg(long, required = true)]
    model_name: Option<String>,
    /// A LoRA adapter to apply: a PEFT directory (adapter_config.json +
    /// adapter_model.safetensors); this rank loads the pairs of its own blocks.
    #[arg(long)]
    adapter: Option<PathBuf>,
    /// This rank (0 serves the endpoint).
    #[arg(long, default_value_t = 0)]
    rank: usize,
    /// Every rank's data-plane IP, comma-separated, in pipeline order.
    #[arg(long, value_delimiter = ',', required = true)]
    hosts: Vec<IpAddr>,
    /// Rank 0's bootstrap address, ip:port.
    #[arg(long, required = true)]
    coordinator: Option<SocketAddr>,
    /// First block this rank holds.
    #[arg(long, default_value_t = 0)]
    first: usize,
    /// Blocks this rank holds (to the last when absent).
    #[arg(long)]
    count: Option<usize>,
    /// Where rank 0 serves HTTP, ip:port.
    #[arg(long)]
    http: Option<SocketAddr>,
    /// A file holding the API key rank 0's `/v1` endpoints take (`Authorization: Bearer`);
    /// without it they take any caller. `/health` takes none.
    #[arg(long)]
    api_key_file: Option<PathBuf>,
    /// Rank 0 serves HTTPS with this certificate (PEM; with --tls-key-file) instead of HTTP.
    #[arg(long, requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert-file.
    #[arg(long, requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,
    /// Tokens of context per sequence (the model's own when absent).
    #[arg(long)]
    context: Option<usize>,
    /// Sequences served at once.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Bytes this rank may use (its allocation's memory); a shard whose weights need more
    /// fails at load with reason ShardTooBig.
    #[arg(long)]
    memory_limit: Option<u64>,
    /// Seconds the ranks may take to find each other.
    #[arg(long, default_value_t = 600)]
    connect_timeout: u64,
    /// Seconds one step may take in the later stages.
    #[arg(long, default_value_t = 300)]
    step_timeout: u64,
    /// tcp, rdma or auto (`TB_TRANSPORT` overrides).
    #[arg(long, default_value = "auto", env = "TB_TRANSPORT")]
    transport: String,
    /// The ranks are one stage split by tensor parallelism (each holds a slice of every block
    /// in --first/--count; at most as many ranks as the model has KV heads) instead of a
    /// pipeline.
    #[arg(long)]
    tensor_parallel: bool,
    /// Recent prompts kept (their KV cache, in every stage) so that requests starting like one
    /// of them — a shared system prompt — prefill only the rest; 0 turns it off.
    #[arg(long, default_value_t = 4)]
    prefix_cache: usize,
    /// Prompt tokens one step prefills at most, across the sequences joining (each prompt
    /// gives at most 256 per step; the streams already decoding wait at most this much work).
    #[arg(long, default_value_t = builtin::driver::PREFILL_PER_STEP,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=65536))]
    prefill_per_step: usize,
}

/// How long an idle worker of candle's CPU kernel pool spins before it sleeps, in spin-loop
/// hints, unless `CANDLE_BARRIER_POOL_SPIN_LIMIT` says otherwise. candle's default (25,000)
/// keeps a worker spinning for about a millisecond after each product; between the products of
/// one step that saves a wake-up, but after the step's last one it burns a core the next stage
/// or the other ranks on the same cores need. This limit still covers the gaps inside a step.
const POOL_SPIN_LIMIT: &str = "2000";

fn main() -> ExitCode {
    if std::env::var_os("CANDLE_BARRIER_POOL_SPIN_LIMIT").is_none() {
        // SAFETY: nothing else runs yet (no runtime, no pool): no thread reads the environment
        // while it is written.
        unsafe { std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", POOL_SPIN_LIMIT) };
    }
    match tokio::runtime::Runtime::new() {
        Ok(rt) => rt.block_on(serve()),
        Err(e) => {
            eprintln!("tb-shard: starting the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if args.calibrate {
        return calibrate();
    }
    let (Some(model_path), Some(model_name), Some(coordinator)) =
        (args.model, args.model_name, args.coordinator)
    else {
        // clap requires them unless --calibrate is given.
        eprintln!("tb-shard: --model, --model-name and --coordinator are required");
        return ExitCode::from(2);
    };
    let transport = match Preference::parse(&args.transport) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("tb-shard: --transport: {e}");
            return ExitCode::from(2);
        }
    };
    let opts = ShardOptions {
        model_path,
        adapter: args.adapter,
        model_name,
        first: args.first,
        count: args.count,
        rank: args.rank,
        hosts: args.hosts,
        coordinator,
        http: args.http,
        api_key_file: args.api_key_file,
        // clap takes both or neither.
        tls_files: args.tls_cert_file.zip(args.tls_key_file),
        context: args.context,
        batch: args.batch,
        memory_limit: args.memory_limit,
        connect_timeout: Duration::from_secs(args.connect_timeout),
        step_timeout: Duration::from_secs(args.step_timeout),
        transport,
        tensor_parallel: args.tensor_parallel,
        prefix_cache: args.prefix_cache,
        prefill_per_step: args.prefill_per_step,
    };
    match builtin::run(opts).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let message = format!("{:#}", e.error);
            tracing::error!(reason = e.reason, "{message}");
            if let Some(path) = std::env::var_os(TERMINATION_MESSAGE_ENV) {
                let _ = std::fs::write(path, format!("{}\n{message}", e.reason));
            }
            ExitCode::FAILURE
        }
    }
}

/// `--calibrate`: the engine's figures on this machine's default device, as JSON on stdout.
fn calibrate() -> ExitCode {
    // The synthetic models are written here and removed again.
    let scratch = std::env::temp_dir().join(format!("tb-shard-calibrate-{}", std::process::id()));
    match engine_figures::measure_here(&scratch)
        .and_then(|m| serde_json::to_string(&m).map_err(|e| e.to_string()))
    {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tb-shard --calibrate: measuring the engine: {e}");
            ExitCode::FAILURE
        }
    }
}
