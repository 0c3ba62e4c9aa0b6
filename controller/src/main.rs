//! `tb-controller`: one member of tb's replicated control plane.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use chrono::TimeDelta;
use clap::Parser;
use tb_controller::clock::SchedulerClock;
use tb_controller::raft::RaftOptions;
use tb_controller::scheduler::SchedulerConfig;
use tb_controller::server::{ServerOptions, TlsOptions, parse_initial_cluster, run};
use tb_controller::tls::CaSource;

#[derive(Parser, Debug)]
#[command(
    name = "tb-controller",
    version,
    about = "tb's replicated controller",
    subcommand_negates_reqs = true
)]
struct Args {
    #[command(subcommand)]
    command: Option<Sub>,
    /// This controller's id in the cluster (a positive integer, unique).
    #[arg(long, default_value_t = 1)]
    id: u64,
    /// Address to serve the gRPC API (and controller-to-controller traffic) on.
    #[arg(long, default_value = "127.0.0.1:7400")]
    listen: SocketAddr,
    /// Address others reach this controller at, when it differs from --listen.
    #[arg(long)]
    advertise: Option<String>,
    /// Where the Raft log, snapshots and state live (and the cluster CA, ca.pem + ca.key, unless
    /// --tls-ca-cert/--tls-ca-key name it).
    #[arg(long, required = true)]
    data_dir: Option<PathBuf>,
    /// Members of a new cluster: 1=HOST:PORT,2=HOST:PORT,3=HOST:PORT. Ignored once the data dir
    /// holds a cluster. Without it, a lone controller forms a cluster of one.
    #[arg(long, value_parser = parse_initial_cluster)]
    initial_cluster: Option<std::collections::BTreeMap<u64, String>>,
    /// Join the cluster of the controller at https://HOST:PORT: with the cluster's join token
    /// (--token-file or TB_JOIN_TOKEN), get the cluster CA and secret from it (trusting it only
    /// if its CA has the hash the token pins), then be added as a learner, caught up and made a
    /// voter. Ignored once the data dir holds a cluster, so the same command restarts it.
    /// Without URL: form no cluster and wait to be added with `tbctl cluster add-member`.
    #[arg(long, value_name = "URL", num_args = 0..=1)]
    join: Option<Option<String>>,
    /// The file holding the cluster's join token (`tbctl cluster join-token`, or
    /// DATA_DIR/join.token of a member), for --join URL; `-` reads standard input. Default:
    /// the TB_JOIN_TOKEN environment variable.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Refused: a token on the command line is visible to every user of the machine.
    #[arg(long, hide = true, value_name = "TOKEN")]
    token: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Serve InferenceServices at a stable address: https://ADDR/services/NAMESPACE/NAME/v1
    /// (the OpenAI API, with a tb user token as the API key), forwarded to each service's
    /// current rank 0. Any controller of the cluster may serve it.
    #[arg(long, value_name = "ADDR")]
    services_listen: Option<SocketAddr>,
    /// The base URL clients reach the services listener at, shown in each InferenceService's
    /// `status.url` (e.g. a name every controller answers to). Default: https://HOST:PORT from
    /// --advertise's host and --services-listen's port.
    #[arg(long, value_name = "URL", requires = "services_listen")]
    services_advertise: Option<String>,
    /// How long (ms) a request to a service without a ready rank 0 waits for one (while tb
    /// places it again) before it is answered 503 with Retry-After.
    #[arg(long, default_value_t = 20_000)]
    services_wait_ms: u64,
    /// Log format.
    #[arg(long, value_parser = ["text", "json"], default_value = "text")]
    log_format: String,
    /// Build a Raft snapshot after this many log entries.
    #[arg(long, default_value_t = 10_000)]
    snapshot_every: u64,
    /// Log entries kept after a snapshot for followers slightly behind.
    #[arg(long, default_value_t = 1_000)]
    keep_after_snapshot: u64,
    /// Space the data disk keeps free (bytes; K, M, G, Ki, Mi, Gi suffixes): with less, this
    /// controller refuses writes with "no space left on the controller's data disk", stops
    /// campaigning and hands leadership to another controller, so that its database is never
    /// cut short by a full disk. It takes writes again once there is room (no restart).
    #[arg(long, default_value = "64Mi", value_parser = parse_bytes)]
    min_free_disk: u64,
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
    /// How quickly (ms) a queue's past usage is forgotten in fair-share ordering: usage this
    /// old counts half. A Queue's `fairShareHalfLife` overrides it.
    #[arg(long, default_value_t = 3_600_000, value_parser = clap::value_parser!(u64).range(1..))]
    fair_share_half_life_ms: u64,
    /// For tests only: the scheduler's clock is the system clock plus the signed offset in
    /// milliseconds written in FILE (re-read on every reconcile pass; missing or unparsable
    /// means 0).
    #[arg(long, value_name = "FILE", hide = true)]
    test_clock_offset_file: Option<PathBuf>,
    /// The secret controllers of this cluster present to each other (`tbcluster-…`); every
    /// controller needs the same one. Default: DATA_DIR/cluster.secret, created when missing.
    #[arg(long)]
    cluster_secret_file: Option<PathBuf>,
    /// The first admin's token (`tbuser-…`) when this controller forms a new cluster. Default:
    /// a random one, written once to DATA_DIR/admin.token (mode 0600).
    #[arg(long)]
    admin_token_file: Option<PathBuf>,
    /// The cluster CA's certificate (PEM). Every controller of a cluster of several needs the
    /// same CA (`tb-controller init-ca DIR` makes one). Default: DATA_DIR/ca.pem, created with
    /// its key when this controller forms a cluster alone.
    #[arg(long, value_name = "FILE", requires = "tls_ca_key")]
    tls_ca_cert: Option<PathBuf>,
    /// The cluster CA's private key (PEM, PKCS#8), kept mode 0600. Default: DATA_DIR/ca.key.
    #[arg(long, value_name = "FILE", requires = "tls_ca_cert")]
    tls_ca_key: Option<PathBuf>,
    /// Another name (host or IP) clients reach this controller by, for its certificate
    /// (repeatable); its --advertise host, 127.0.0.1, ::1 and localhost are always in it.
    #[arg(long, value_name = "NAME")]
    tls_san: Vec<String>,
    /// Serve and call plain TCP, without TLS. For debugging only: tokens then cross the network
    /// in the clear.
    #[arg(long, conflicts_with_all = ["tls_ca_cert", "tls_ca_key", "tls_san"])]
    insecure: bool,
    /// When this member's database (DATA_DIR/tb.redb) is damaged: move it aside, have the
    /// cluster remove this member, start empty and be added back, caught up by the leader.
    /// Needs the other members' addresses from --initial-cluster and a majority of them up.
    /// Without it, a damaged database stops the start with what to do.
    #[arg(long)]
    rebuild_from_peers: bool,
}

#[derive(clap::Subcommand, Debug)]
enum Sub {
    /// Make a cluster CA (DIR/ca.pem, DIR/ca.key mode 0600) to hand every controller of a new
    /// cluster with --tls-ca-cert DIR/ca.pem --tls-ca-key DIR/ca.key.
    InitCa {
        /// Where to write ca.pem and ca.key (neither may exist).
        dir: PathBuf,
    },
    /// Make a new data dir from a snapshot file (`tbctl snapshot save`): a cluster of one
    /// member with every object, user, token and schedule the snapshot holds, and a new
    /// cluster id. Then start tb-controller on it with the same --id and --data-dir.
    Restore {
        /// The snapshot file.
        file: PathBuf,
        /// The new data dir (must be new or empty).
        #[arg(long)]
        data_dir: PathBuf,
        /// The id the restored member will start with (its --id).
        #[arg(long, default_value_t = 1)]
        id: u64,
        /// The address the restored member will be reached at (its --advertise, or --listen).
        #[arg(long, default_value = "127.0.0.1:7400")]
        advertise: String,
    },
}

/// Where and with what to join, for `--join URL`; refuses the flags that would give this
/// controller its credentials another way.
fn join_with_token(args: &Args) -> anyhow::Result<Option<tb_controller::join::JoinWithToken>> {
    let Some(Some(url)) = &args.join else {
        if args.token_file.is_some() {
            anyhow::bail!("--token-file is for --join URL");
        }
        return Ok(None);
    };
    let conflicts = [
        (args.insecure, "--insecure (the token pins the cluster CA)"),
        (args.initial_cluster.is_some(), "--initial-cluster"),
        (args.cluster_secret_file.is_some(), "--cluster-secret-file"),
        (args.tls_ca_cert.is_some(), "--tls-ca-cert/--tls-ca-key"),
        (args.rebuild_from_peers, "--rebuild-from-peers"),
    ];
    for (given, flag) in conflicts {
        if given {
            anyhow::bail!(
                "--join URL gets the cluster CA and secret with the join token; drop {flag}"
            );
        }
    }
    let addr = tb_controller::join::parse_url(url)?;
    let token = tb_controller::join::read_token(args.token_file.as_deref())?;
    Ok(Some(tb_controller::join::JoinWithToken { addr, token }))
}

/// A byte count such as `64Mi`, `1G` or `500000`.
fn parse_bytes(s: &str) -> Result<u64, String> {
    tb_api::quantity::Quantity::parse(s)
        .map(|q| q.bytes())
        .map_err(|e| format!("expected bytes such as 64Mi or 1G: {e}"))
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
    if let Some(Sub::InitCa { dir }) = &args.command {
        let ca = tb_controller::tls::Ca::create()?;
        ca.save(dir)?;
        println!("{}", dir.join(tb_controller::tls::CA_CERT_FILE).display());
        return Ok(());
    }
    if let Some(Sub::Restore {
        file,
        data_dir,
        id,
        advertise,
    }) = &args.command
    {
        let started = std::time::Instant::now();
        let r = tb_controller::restore::restore(file, data_dir, *id, advertise)
            .context("tb-controller restore")?;
        let from = if r.from_cluster.is_empty() {
            "a cluster without an id".to_string()
        } else {
            format!("cluster {}", r.from_cluster)
        };
        println!(
            "restored {} objects ({} schedules) and {} users at revision {} of {from} into {} \
             in {} ms: new cluster {}, member {id} at {advertise}\n\
             start it with: tb-controller --data-dir {} --id {id} --listen {advertise}",
            r.objects,
            r.schedules,
            r.users,
            r.revision,
            r.data_dir.display(),
            started.elapsed().as_millis(),
            r.cluster_id,
            r.data_dir.display(),
        );
        return Ok(());
    }
    if args.token.is_some() {
        anyhow::bail!(
            "--token: a token on the command line is visible to every user of this machine \
             (ps, shell history); pass --token-file FILE (0600; `-` for standard input) or set \
             TB_JOIN_TOKEN"
        );
    }
    let join_with_token = join_with_token(&args)?;
    let Some(data_dir) = args.data_dir.clone() else {
        anyhow::bail!("--data-dir is required");
    };
    if args.id == 0 {
        anyhow::bail!("--id: controller ids start at 1");
    }
    let half_life = i64::try_from(args.fair_share_half_life_ms)
        .ok()
        .and_then(TimeDelta::try_milliseconds)
        .context("--fair-share-half-life-ms: too large")?;
    let advertise = args
        .advertise
        .clone()
        .unwrap_or_else(|| args.listen.to_string());
    let services_base = args.services_listen.map(|listen| {
        args.services_advertise.clone().unwrap_or_else(|| {
            let scheme = if args.insecure { "http" } else { "https" };
            let host = tb_controller::tls::host_of(&advertise);
            let host = if host.contains(':') && !host.starts_with('[') {
                format!("[{host}]")
            } else {
                host.to_string()
            };
            format!("{scheme}://{host}:{}", listen.port())
        })
    });
    let services = args
        .services_listen
        .map(|listen| tb_controller::services::ServicesOptions {
            listen,
            wait: std::time::Duration::from_millis(args.services_wait_ms),
        });
    let opts = ServerOptions {
        id: args.id,
        listen: args.listen,
        advertise,
        data_dir,
        initial_cluster: args.initial_cluster.unwrap_or_default(),
        join: matches!(args.join, Some(None)),
        join_with_token,
        metrics_listen: args.metrics_listen,
        services,
        raft: RaftOptions {
            heartbeat_ms: args.heartbeat_ms,
            election_timeout_min_ms: args.heartbeat_ms * 5,
            election_timeout_max_ms: args.heartbeat_ms * 10,
            snapshot_every: args.snapshot_every,
            keep_after_snapshot: args.keep_after_snapshot,
            min_free_disk: args.min_free_disk,
        },
        scheduler: SchedulerConfig {
            node_grace: TimeDelta::milliseconds(args.node_grace_ms as i64),
            backoff_base: TimeDelta::milliseconds(args.backoff_base_ms as i64),
            backoff_cap: TimeDelta::milliseconds(args.backoff_cap_ms as i64),
            fair_share_half_life: half_life,
            services_base,
            ..SchedulerConfig::default()
        },
        scheduler_clock: SchedulerClock::with_offset_file(args.test_clock_offset_file),
        cluster_secret_file: args.cluster_secret_file,
        admin_token_file: args.admin_token_file,
        tls: TlsOptions {
            insecure: args.insecure,
            ca: CaSource {
                files: args.tls_ca_cert.zip(args.tls_ca_key),
            },
            extra_names: args.tls_san,
        },
        rebuild_from_peers: args.rebuild_from_peers,
    };
    run(opts).await.context("tb-controller")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Args {
        Args::try_parse_from([&["tb-controller", "--data-dir", "d"], args].concat())
            .expect("valid arguments")
    }

    #[test]
    fn join_alone_waits_to_be_added_and_join_url_joins_with_a_token() {
        assert_eq!(parse(&[]).join, None);
        // The old meaning, also before another flag.
        assert_eq!(parse(&["--join"]).join, Some(None));
        let a = parse(&["--join", "--id", "2"]);
        assert_eq!((a.join, a.id), (Some(None), 2));
        let a = parse(&["--join", "https://10.0.0.1:7400", "--token-file", "t"]);
        assert_eq!(a.join, Some(Some("https://10.0.0.1:7400".into())));
        assert_eq!(a.token_file, Some(PathBuf::from("t")));
    }

    #[test]
    fn join_url_refuses_other_sources_of_credentials() {
        for flag in [
            &["--insecure"][..],
            &["--cluster-secret-file", "s"],
            &["--tls-ca-cert", "c", "--tls-ca-key", "k"],
            &["--initial-cluster", "1=a:1,2=b:2"],
        ] {
            let a = parse(&[&["--join", "https://h:1", "--token-file", "t"], flag].concat());
            let e = join_with_token(&a).expect_err("a conflict").to_string();
            assert!(e.contains("drop"), "{flag:?}: {e}");
        }
        let a = parse(&["--token-file", "t"]);
        assert!(
            join_with_token(&a).is_err(),
            "--token-file without --join URL"
        );
    }
}
