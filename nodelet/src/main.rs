//! `tb-nodelet`: the agent on each Mac. It joins the cluster, reports the Mac's capacity and
//! Thunderbolt ports, heartbeats, measures the links it is end `a` of, serves the link probes of
//! its peers, and runs the allocations the controllers assign to it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tb_api::status::PortRange;
use tb_nodelet::agent::accounts::{IsolationConfig, UidRange};
use tb_nodelet::agent::identity::JoinTokenSource;
use tb_nodelet::agent::{Config, run};
use tb_nodelet::probe::{DEFAULT_PORT, ProbeConfig};
use tb_nodelet::topology::Topology;

#[derive(Parser, Debug)]
#[command(name = "tb-nodelet", version, about = "tb's agent on each Mac")]
struct Args {
    /// Controllers to talk to: HOST:PORT[,HOST:PORT..].
    #[arg(long, value_delimiter = ',', required = true)]
    controller: Vec<String>,
    /// This node's name (lower-case letters, digits, '-' and '.').
    #[arg(long)]
    name: String,
    /// Where the credential, allocations' working directories and logs live.
    #[arg(long)]
    data_dir: PathBuf,
    /// Address to serve logs on (the controllers connect here).
    #[arg(long, default_value = "127.0.0.1:7600")]
    listen: SocketAddr,
    /// Address others reach this node at, when it differs from --listen.
    #[arg(long)]
    advertise: Option<String>,
    /// The cluster CA (PEM) to verify the controllers with: a controller's DATA_DIR/ca.pem.
    /// Needed to join; later the copy kept in --data-dir serves. Without any the nodelet does
    /// not start unless --insecure (plain TCP, for controllers started with --insecure).
    #[arg(long, env = "TB_CA_CERT", value_name = "FILE")]
    ca_cert: Option<PathBuf>,
    /// A file holding the join token from `tbctl token create` (`-`: read it from stdin);
    /// needed only the first time. Else the token is taken from $TB_JOIN_TOKEN. Never on the
    /// command line, where every local user could read it.
    #[arg(long, value_name = "FILE")]
    join_token_file: Option<PathBuf>,
    /// Removed: a token on the command line is readable by every local user (`ps`).
    #[arg(long, hide = true, value_name = "TOKEN")]
    join_token: Option<String>,
    /// For tests only: claim this protocol version (tb_api::version) instead of this build's,
    /// to check how controllers treat nodelets of other versions.
    #[arg(long, hide = true, value_name = "N")]
    test_protocol_version: Option<u32>,
    /// Talk plain TCP to the controllers when no CA is configured: the join token and the
    /// node's credential then cross the network in clear text. Only for controllers started
    /// with --insecure. A CA, when there is one, is always used.
    #[arg(long)]
    insecure: bool,
    /// Labels for the Node: k=v,k=v.
    #[arg(long, value_parser = parse_labels)]
    labels: Option<BTreeMap<String, String>>,
    /// Ports handed to ranks (MLX ring listeners): START-END.
    #[arg(long, default_value = "32323-32422", value_parser = parse_port_range)]
    port_range: PortRange,
    /// Heartbeat interval in milliseconds.
    #[arg(long, default_value_t = 2000)]
    heartbeat_ms: u64,
    /// Memory kept back from tb (e.g. 8Gi); default: 4Gi or 10 %, whichever is smaller.
    #[arg(long)]
    reserve: Option<tb_api::Quantity>,
    /// A described lab (YAML: macs with chip, memory, ports; links between mac/port ends), for
    /// labs whose links are not Thunderbolt and for emulated labs. This node's ports come from
    /// the file instead of discovery, and when the file gives this Mac's memory the heartbeat
    /// reports the file's capacity (memory, allocatable, free, chip, gpuCores,
    /// memoryBandwidth) instead of the measured one. This node (--name) must be in the file.
    #[arg(long, value_name = "FILE")]
    topology: Option<PathBuf>,
    /// TCP port of the link-probe server, on every port address (0: let the OS pick one).
    #[arg(long, default_value_t = DEFAULT_PORT)]
    probe_port: u16,
    /// Log format.
    #[arg(long, value_parser = ["text", "json"], default_value = "text")]
    log_format: String,
    /// Run every job as this nodelet's own account (a single-user development cluster; jobs
    /// can then read the node's credential). A nodelet that is not root always does.
    #[arg(long)]
    single_user: bool,
    /// Run namespace NS's jobs as the existing local ACCOUNT (name or uid): NS=ACCOUNT,
    /// repeatable or comma-separated. Other namespaces get a dynamic uid of their own.
    #[arg(long, value_name = "NS=ACCOUNT", value_delimiter = ',', value_parser = parse_run_as)]
    run_as: Vec<(String, String)>,
    /// The uids handed out to namespaces without --run-as (one per namespace, kept in
    /// DATA_DIR/accounts.json): START-END. No other account may use them.
    #[arg(long, value_name = "START-END", default_value = "61184-61439")]
    job_uid_range: UidRange,
    /// Disk the allocations' directories (work dirs, logs) may use; past it, the oldest
    /// finished allocations' directories are removed first.
    #[arg(long, default_value = "10Gi")]
    job_disk_limit: tb_api::Quantity,
    /// The Python that exec jobs' `python` and `python3` run (e.g. a venv's bin/python with
    /// MLX). Unset: `python3` is looked up on the PATH, the job's `env.PATH` else the
    /// nodelet's own (a nodelet started from an activated venv gives the venv's).
    #[arg(long, env = "TB_PYTHON", value_name = "FILE")]
    python: Option<PathBuf>,
    /// Measure how fast tb's built-in engine decodes here (a few seconds of CPU or GPU once,
    /// in the background after start; kept in DATA_DIR/engine-figures.json), so that placement
    /// predicts tokens/s from this Mac's own figures rather than its chip's
    #[arg(long, env = "TB_ENGINE_CALIBRATION", value_name = "on|off", default_value = "on", value_parser = ["on", "off"])]
    engine_calibration: String,
    /// CPU threads each of tb's built-in ranks (model shards, fine-tunes) and the engine's
    /// measurement run with, unless a rank's spec sets RAYON_NUM_THREADS in its env. Default:
    /// every core. Nodelets that share one machine (`tbctl up`) each take a share, so that
    /// ranks placed side by side do not run more threads than there are cores.
    #[arg(long, env = "TB_ENGINE_THREADS", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    engine_threads: Option<u32>,
}

fn parse_run_as(s: &str) -> Result<(String, String), String> {
    let (ns, account) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NS=ACCOUNT"))?;
    let (ns, account) = (ns.trim(), account.trim());
    if ns.is_empty() || account.is_empty() {
        return Err(format!("{s:?}: expected NS=ACCOUNT"));
    }
    Ok((ns.to_string(), account.to_string()))
}

fn parse_labels(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?}: expected key=value"))?;
        tb_api::name::validate_label_key(k)?;
        tb_api::name::validate_label_value(v)?;
        labels.insert(k.to_string(), v.to_string());
    }
    Ok(labels)
}

fn parse_port_range(s: &str) -> Result<PortRange, String> {
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| format!("{s:?}: expected START-END"))?;
    let start: u16 = a
        .trim()
        .parse()
        .map_err(|_| format!("{a:?} is not a port"))?;
    let end: u16 = b
        .trim()
        .parse()
        .map_err(|_| format!("{b:?} is not a port"))?;
    if start == 0 || end < start {
        return Err(format!("{s:?}: expected 1 <= START <= END"));
    }
    Ok(PortRange { start, end })
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
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
    if args.join_token.is_some() {
        eprintln!(
            "tb-nodelet: --join-token is not accepted: a token on the command line is readable by \
             every local user (ps); pass it with --join-token-file FILE, --join-token-file - \
             (stdin) or the environment variable TB_JOIN_TOKEN"
        );
        std::process::exit(2);
    }
    let join_token = match (args.join_token_file, std::env::var("TB_JOIN_TOKEN")) {
        (Some(path), _) if path.as_os_str() == "-" => Some(JoinTokenSource::Stdin),
        (Some(path), _) => Some(JoinTokenSource::File(path)),
        (None, Ok(token)) if !token.trim().is_empty() => Some(JoinTokenSource::Env(token)),
        (None, _) => None,
    };
    let topology = match &args.topology {
        Some(path) => match Topology::load(path, &args.name) {
            Ok(t) => Some(Arc::new(t)),
            Err(e) => {
                // A startup mistake in the file: say where, without a backtrace.
                eprintln!("tb-nodelet: {e}");
                std::process::exit(2);
            }
        },
        None => None,
    };
    // The file's labels for this Mac, under those given with --labels.
    let mut labels = topology
        .as_ref()
        .and_then(|t| t.mac())
        .map(|m| m.labels.clone())
        .unwrap_or_default();
    labels.extend(args.labels.unwrap_or_default());
    let cfg = Config {
        controllers: args.controller,
        name: args.name,
        data_dir: args.data_dir,
        listen: args.listen,
        advertise: args.advertise,
        join_token,
        ca_cert: args.ca_cert,
        insecure: args.insecure,
        labels,
        port_range: args.port_range,
        heartbeat: Duration::from_millis(args.heartbeat_ms.max(50)),
        reserve_bytes: args.reserve.map(|q| q.bytes()),
        topology,
        probe_port: args.probe_port,
        probe: ProbeConfig::default(),
        isolation: IsolationConfig {
            single_user: args.single_user,
            run_as: args.run_as,
            uid_range: args.job_uid_range,
        },
        job_disk_limit: args.job_disk_limit.bytes(),
        python: args.python,
        engine_calibration: args.engine_calibration == "on",
        engine_threads: args.engine_threads,
        protocol_version: args
            .test_protocol_version
            .unwrap_or(tb_api::version::PROTOCOL),
    };
    run(cfg).await
}
