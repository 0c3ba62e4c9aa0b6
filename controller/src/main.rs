//! `tb-controller`: one member of tb's replicated control plane.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use chrono::TimeDelta;
use clap::Parser;
use tb_controller::raft::RaftOptions;
use tb_controller::scheduler::SchedulerConfig;
use tb_controller::server::{ServerOptions, parse_initial_cluster, run};

#[derive(Parser, Debug)]
#[command(name = "tb-controller", version, about = "tb's replicated controller")]
struct Args {
    /// This controller's id in the cluster (a positive integer, unique).
    #[arg(long, default_value_t = 1)]
    id: u64,
    /// Address to serve the gRPC API (and controller-to-controller traffic) on.
    #[arg(long, default_value = "127.0.0.1:7400")]
    listen: SocketAddr,
    /// Address others reach this controller at, when it differs from --listen.
    #[arg(long)]
    advertise: Option<String>,
    /// Where the Raft log, snapshots and state live.
    #[arg(long)]
    data_dir: PathBuf,
    /// Members of a new cluster: 1=HOST:PORT,2=HOST:PORT,3=HOST:PORT. Ignored once the data dir
    /// holds a cluster. Without it, a lone controller forms a cluster of one.
    #[arg(long, value_parser = parse_initial_cluster)]
    initial_cluster: Option<std::collections::BTreeMap<u64, String>>,
    /// Form no cluster: wait to be added with `tbctl cluster add-member`.
    #[arg(long)]
    join: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Log format.
    #[arg(long, value_parser = ["text", "json"], default_value = "text")]
    log_format: String,
    /// Build a Raft snapshot after this many log entries.
    #[arg(long, default_value_t = 10_000)]
    snapshot_every: u64,
    /// Log entries kept after a snapshot for followers slightly behind.
    #[arg(long, default_value_t = 1_000)]
    keep_after_snapshot: u64,
    /// Raft heartbeat interval in milliseconds. Elections time out after 5–10 heartbeats, and a
    /// new leader is elected about 15–20 heartbeats after the old one dies.
    #[arg(long, default_value_t = 50)]
    heartbeat_ms: u64,
    /// A Node without heartbeats this long (ms) is NotReady and its allocations Lost.
    #[arg(long, default_value_t = 10_000)]
    node_grace_ms: u64,
    /// First delay (ms) before a failed gang is restarted; doubles per restart.
    #[arg(long, default_value_t = 10_000)]
    backoff_base_ms: u64,
    /// Longest delay (ms) between gang restarts.
    #[arg(long, default_value_t = 300_000)]
    backoff_cap_ms: u64,
    /// The secret controllers of this cluster present to each other (`tbcluster-…`); every
    /// controller needs the same one. Default: DATA_DIR/cluster.secret, created when missing.
    #[arg(long)]
    cluster_secret_file: Option<PathBuf>,
    /// The first admin's token (`tbuser-…`) when this controller forms a new cluster. Default:
    /// a random one, written once to DATA_DIR/admin.token (mode 0600).
    #[arg(long)]
    admin_token_file: Option<PathBuf>,
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_logging(&args.log_format);
    if args.id == 0 {
        anyhow::bail!("--id: controller ids start at 1");
    }
    let advertise = args
        .advertise
        .clone()
        .unwrap_or_else(|| args.listen.to_string());
    let opts = ServerOptions {
        id: args.id,
        listen: args.listen,
        advertise,
        data_dir: args.data_dir,
        initial_cluster: args.initial_cluster.unwrap_or_default(),
        join: args.join,
        metrics_listen: args.metrics_listen,
        raft: RaftOptions {
            heartbeat_ms: args.heartbeat_ms,
            election_timeout_min_ms: args.heartbeat_ms * 5,
            election_timeout_max_ms: args.heartbeat_ms * 10,
            snapshot_every: args.snapshot_every,
            keep_after_snapshot: args.keep_after_snapshot,
        },
        scheduler: SchedulerConfig {
            node_grace: TimeDelta::milliseconds(args.node_grace_ms as i64),
            backoff_base: TimeDelta::milliseconds(args.backoff_base_ms as i64),
            backoff_cap: TimeDelta::milliseconds(args.backoff_cap_ms as i64),
            ..SchedulerConfig::default()
        },
        cluster_secret_file: args.cluster_secret_file,
        admin_token_file: args.admin_token_file,
    };
    run(opts).await.context("tb-controller")
}
