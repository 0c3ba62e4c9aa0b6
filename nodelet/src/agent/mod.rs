//! The running nodelet: joins (or reuses its credential), serves its logs (over TLS with the node
//! certificate from its join, `tls`), heartbeats (with its ports, from discovery or a topology
//! file), serves and runs link probes, and supervises the allocations the controllers assign to
//! it — each rank under its namespace's account (`accounts`), in a data dir whose modes keep
//! tb's credentials from the jobs (`dirs`).

pub mod accounts;
pub mod controllers;
pub mod dirs;
pub mod engine_figures;
pub mod heartbeat;
pub mod identity;
pub mod logs;
pub mod program;
pub mod supervisor;
pub mod tls;
pub mod uid_claim;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tb_api::proto::nodelet_server::NodeletServer;
use tb_api::status::PortRange;

use controllers::Controllers;
use heartbeat::{Links, NodeInfo};
use supervisor::Supervisor;

use crate::discovery::{Discovery, Source};
use crate::probe::ProbeConfig;
use crate::probe::server::ProbeServer;
use crate::probe::watch::Prober;
use crate::topology::Topology;

/// How a nodelet is started.
#[derive(Debug, Clone)]
pub struct Config {
    pub controllers: Vec<String>,
    pub name: String,
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    /// The address controllers and peers use, when it differs from `listen`.
    pub advertise: Option<String>,
    /// Where the join token is, read only when the node has not joined yet.
    pub join_token: Option<identity::JoinTokenSource>,
    /// The cluster CA to trust controllers with; None: the one kept at join, else plain TCP
    /// (only with `insecure`).
    pub ca_cert: Option<PathBuf>,
    /// Plain TCP to the controllers is allowed when no CA is configured (`--insecure`).
    pub insecure: bool,
    pub labels: BTreeMap<String, String>,
    pub port_range: PortRange,
    pub heartbeat: Duration,
    /// Memory kept back from tb; None: the default reserve.
    pub reserve_bytes: Option<u64>,
    /// A described lab: ports (and, when it gives memory, capacity) from the file instead of
    /// from this machine.
    pub topology: Option<Arc<Topology>>,
    /// The link-probe server's TCP port on every port address; 0: let the OS pick one.
    pub probe_port: u16,
    /// How much each link probe measures.
    pub probe: ProbeConfig,
    /// Which accounts jobs run as.
    pub isolation: accounts::IsolationConfig,
    /// Past this many bytes under `allocs/`, the oldest finished allocations' dirs are removed.
    pub job_disk_limit: u64,
    /// What exec jobs' `python` and `python3` run (`--python`); None: the PATH decides.
    pub python: Option<PathBuf>,
    /// Measure the built-in engine's decode speed after start (`--engine-calibration on`).
    pub engine_calibration: bool,
    /// CPU threads each built-in rank and the engine's measurement run with
    /// (`--engine-threads`); None: what the engine takes by itself (every core).
    pub engine_threads: Option<u32>,
    /// The protocol version sent with the join and every heartbeat (tb_api::version::PROTOCOL;
    /// another only in tests).
    pub protocol_version: u32,
}

/// The default `--job-disk-limit`: 10 GiB.
pub const DEFAULT_JOB_DISK_LIMIT: u64 = 10 << 30;

pub async fn run(mut cfg: Config) -> anyhow::Result<()> {
    tb_api::name::validate_name(&cfg.name).map_err(|e| anyhow::anyhow!("--name: {e}"))?;
    let python = match &cfg.python {
        // Checked at start: every python job would fail on a wrong one.
        Some(p) => {
            let p = std::path::absolute(p).with_context(|| format!("--python {}", p.display()))?;
            anyhow::ensure!(
                p.is_file(),
                "--python {}: no such file (give the interpreter, e.g. VENV/bin/python)",
                p.display()
            );
            Some(p)
        }
        None => None,
    };
    // Ranks run in their own working directories: every path handed to them must be absolute.
    cfg.data_dir = std::path::absolute(&cfg.data_dir)
        .with_context(|| format!("--data-dir {}", cfg.data_dir.display()))?;
    dirs::secure_data_dir(&cfg.data_dir)
        .with_context(|| format!("preparing --data-dir {}", cfg.data_dir.display()))?;
    let policy = Arc::new(accounts::Policy::load(&cfg.isolation, &cfg.data_dir)?);
    match policy.single_user() {
        Some(accounts::SingleUser::NotRoot) => tracing::warn!(
            "not running as root: every job runs as this nodelet's own account and can read              its credential (single-user; the Node says JobIsolation=False)"
        ),
        Some(accounts::SingleUser::Asked) => tracing::warn!(
            "--single-user: every job runs as this nodelet's own account (a development cluster)"
        ),
        None => {
            if let Some(dir) = dirs::untraversable_ancestor(&cfg.data_dir) {
                tracing::warn!(
                    "{} is closed to other accounts: jobs cannot reach their work dirs under {}                      (give it o+x, or choose another --data-dir)",
                    dir.display(),
                    cfg.data_dir.display()
                );
            }
        }
    }
    if let Err(e) = crate::exec::contain::become_subreaper() {
        tracing::info!("{e}");
    }
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("binding {}", cfg.listen))?;
    let address = cfg
        .advertise
        .clone()
        .unwrap_or_else(|| cfg.listen.to_string());
    let trust = tls::trust(cfg.ca_cert.as_deref(), &cfg.data_dir)?;
    // Every call carries the join token or the node's credential: never in clear text
    // unless the admin said so (tb-client's rule, which tbctl follows too).
    if tb_client::tls::token_refused_in_clear(true, trust.is_some(), cfg.insecure) {
        anyhow::bail!("{}", tls::no_ca_message(&cfg.controllers));
    }
    if trust.is_none() {
        tracing::warn!(
            "--insecure and no CA: talking plain TCP to the controllers; the join token and \
             this node's credential cross the network in clear text"
        );
    }
    let controllers = Arc::new(Controllers::new(cfg.controllers.clone(), trust.clone()));
    let info = NodeInfo {
        address: address.clone(),
        port_range: cfg.port_range,
        reserve_bytes: cfg.reserve_bytes,
        topology: cfg.topology.clone(),
        isolation: policy.condition(),
        engine: match cfg.engine_calibration {
            true => engine_figures::start(
                &cfg.data_dir,
                &supervisor::shard_binary(),
                engine_figures::engine_threads(cfg.engine_threads),
            ),
            false => Default::default(),
        },
    };
    let source = match &cfg.topology {
        Some(t) => Source::Static(t.clone()),
        None => Source::Local,
    };
    let links = Links {
        discovery: Discovery::new(source),
        probe_server: ProbeServer::new(cfg.probe_port),
        // Model staging reaches this Mac at its own address, on the probe server's port.
        node_ip: address
            .rsplit_once(':')
            .and_then(|(h, _)| h.trim_matches(['[', ']']).parse().ok()),
    };
    let (ports, probe_port) = links.refresh().await;
    let first = heartbeat::observe(&info, None, ports, probe_port);
    let allocatable = first.capacity.allocatable_bytes;
    let joining = heartbeat::joining(&first).to_value();
    let node = identity::node_object(&cfg.name, cfg.labels.clone(), &address, joining);
    let credential = identity::establish(
        &controllers,
        &cfg.data_dir,
        &cfg.name,
        cfg.join_token.as_ref(),
        node,
        cfg.protocol_version,
    )
    .await?;
    controllers.set_credential(&credential.credential);

    // Logs are served with the node certificate from the join, to controllers only.
    let server_tls = match &trust {
        Some(t) => {
            let config = tls::server_config(&cfg.data_dir, t)?;
            if config.is_none() {
                anyhow::bail!(
                    "{} holds no node certificate (node.pem): this node joined a controller \
                     without TLS; remove {} and join again with a join token (--join-token-file)",
                    cfg.data_dir.display(),
                    cfg.data_dir.join("credential.json").display()
                );
            }
            config
        }
        None => None,
    };
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let mut builder = tonic::transport::Server::builder();
    if let Some(config) = server_tls {
        builder = builder
            .tls_config(config)
            .context("serving logs with the node certificate")?;
    }
    let server = builder
        .add_service(NodeletServer::new(logs::LogsService::new(
            cfg.data_dir.clone(),
        )))
        .serve_with_incoming_shutdown(incoming, shutdown_signal());

    // Whole model copies kept there are served like original files, and reported.
    crate::staging::copies::set_root(cfg.data_dir.join("models"));
    let supervisor = Supervisor::new(
        cfg.name.clone(),
        cfg.data_dir.clone(),
        allocatable,
        controllers.clone(),
        policy,
        cfg.job_disk_limit,
        supervisor::RankSettings {
            python,
            engine_threads: cfg.engine_threads,
        },
    );
    tokio::spawn(supervisor.clone().run());
    tokio::spawn(supervisor.clone().fence_when_cut_off());
    tokio::spawn(heartbeat::run(
        controllers.clone(),
        credential,
        info,
        links,
        supervisor,
        cfg.heartbeat,
        cfg.protocol_version,
    ));
    tokio::spawn(Prober::new(cfg.name.clone(), controllers.clone(), cfg.probe).run());
    tracing::info!(node = %cfg.name, listen = %cfg.listen, "tb-nodelet running");
    server.await.context("serving logs")?;
    // Processes are left running on a stop: a restarted nodelet reaps them, and the
    // controllers place the work again.
    Ok(())
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    engine_figures::stop();
}
