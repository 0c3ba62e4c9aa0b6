//! Assembles a controller: opens the Raft store, serves the gRPC services behind the RPC layer
//! (over TLS with a certificate from the cluster CA, `crate::tls`, unless `--insecure`),
//! serves metrics, and bootstraps a new cluster when asked to (with its first admin user, whose
//! token is written to `<data-dir>/admin.token` once).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tb_api::proto::auth_server::AuthServer;
use tb_api::proto::cluster_server::ClusterServer;
use tb_api::proto::nodes_server::NodesServer;
use tb_api::proto::objects_server::ObjectsServer;
use tb_api::proto::raft_server::RaftServer;

use crate::interceptor::RpcLayer;
use crate::raft::{MAX_MESSAGE, NodeId, RaftNode, RaftOptions, RaftService};
use crate::service::auth::AuthService;
use crate::service::cluster::ClusterService;
use crate::service::nodes::NodesService;
use crate::service::objects::ObjectsService;

/// The largest request a client may send.
pub const MAX_REQUEST: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub id: NodeId,
    pub listen: SocketAddr,
    /// The address other controllers and clients use to reach this one.
    pub advertise: String,
    pub data_dir: PathBuf,
    /// The initial members when forming a new cluster; empty: this controller alone.
    pub initial_cluster: BTreeMap<NodeId, String>,
    /// Wait to be added by `tbctl cluster add-member` instead of forming a cluster.
    pub join: bool,
    /// Join the cluster of the member at this address with its join token (`crate::join`):
    /// fetch the credentials, then be added. Ignored once the data dir holds a cluster.
    pub join_with_token: Option<crate::join::JoinWithToken>,
    pub metrics_listen: Option<SocketAddr>,
    /// Serve InferenceServices at a stable address (`crate::services`).
    pub services: Option<crate::services::ServicesOptions>,
    pub raft: RaftOptions,
    pub scheduler: crate::scheduler::SchedulerConfig,
    /// The time the reconcile loop schedules by: the system clock, unless a test shifts it
    /// (`--test-clock-offset-file`).
    pub scheduler_clock: crate::clock::SchedulerClock,
    /// The secret controllers present to each other; None: `<data-dir>/cluster.secret`,
    /// created when missing. Every controller of a cluster needs the same one.
    pub cluster_secret_file: Option<PathBuf>,
    /// The first admin's token for a new cluster; None: a random one, written to
    /// `<data-dir>/admin.token`.
    pub admin_token_file: Option<PathBuf>,
    pub tls: TlsOptions,
    /// When the database is damaged: move it aside and get the state back from the other
    /// members of `initial_cluster` (`crate::rebuild`) instead of refusing to start.
    pub rebuild_from_peers: bool,
}

/// How a controller does TLS.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// Serve and call plain TCP (debugging only).
    pub insecure: bool,
    /// The cluster CA; default: `<data-dir>/ca.pem` + `ca.key`, created by a controller that
    /// forms a cluster alone.
    pub ca: crate::tls::CaSource,
    /// More names (hosts or IPs) for this controller's certificate besides its advertised host.
    pub extra_names: Vec<String>,
}

pub use tb_api::controller_files::ADMIN_TOKEN_FILE;
/// How long the first admin's token lives: a year.
const ADMIN_TOKEN_TTL: u64 = 365 * 24 * 3600;

/// Parse `1=HOST:PORT,2=HOST:PORT`.
pub fn parse_initial_cluster(s: &str) -> Result<BTreeMap<NodeId, String>, String> {
    let mut members = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?}: expected ID=HOST:PORT"))?;
        let id: NodeId = id
            .parse()
            .ok()
            .filter(|i| *i > 0)
            .ok_or_else(|| format!("{part:?}: the id must be a positive integer"))?;
        if !addr.contains(':') {
            return Err(format!("{part:?}: expected ID=HOST:PORT"));
        }
        if members.insert(id, addr.to_string()).is_some() {
            return Err(format!("controller id {id} appears twice"));
        }
    }
    Ok(members)
}

pub async fn run(opts: ServerOptions) -> anyhow::Result<()> {
    if !opts.initial_cluster.is_empty() {
        match opts.initial_cluster.get(&opts.id) {
            None => anyhow::bail!(
                "--initial-cluster does not name this controller's id {}",
                opts.id
            ),
            Some(a) if a != &opts.advertise => anyhow::bail!(
                "--initial-cluster gives controller {} the address {a}, but it listens/advertises {}",
                opts.id,
                opts.advertise
            ),
            Some(_) => {}
        }
    }
    let started = std::time::Instant::now();
    // A joiner gets the cluster's credentials before anything is written: a refused token
    // leaves no trace in the data dir.
    let fetched = match &opts.join_with_token {
        Some(join) if crate::join::holds_credentials(&opts.data_dir) => {
            crate::join::check_pin(&opts.data_dir, &join.token)?;
            None
        }
        Some(join) => {
            tracing::info!(controller = %join.addr, "joining: asking for the cluster's credentials");
            Some(crate::join::fetch(join, opts.id, &opts.advertise).await?)
        }
        None => None,
    };
    // A data dir of a newer format is left untouched.
    crate::datadir::check_format(&opts.data_dir)?;
    // Secrets and state live here: 0700, files 0600, before anything is written.
    for fixed in crate::datadir::prepare(&opts.data_dir, crate::raft::DB_FILE)? {
        tracing::warn!(change = %fixed, "tightened a mode in the data dir");
    }
    crate::datadir::record_format(&opts.data_dir)?;
    if let Some(reply) = &fetched {
        crate::join::write_credentials(&opts.data_dir, reply)?;
        tracing::info!(
            data_dir = %opts.data_dir.display(),
            "joining: kept the cluster CA and secret in the data dir"
        );
    }
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .with_context(|| format!("binding {}", opts.listen))?;
    // Before the Raft node starts: its first calls to peers already use TLS.
    let tls = if opts.tls.insecure {
        tracing::warn!("--insecure: serving and calling plain TCP, without TLS");
        None
    } else {
        // Only a controller forming a cluster alone may make the CA: members of a larger
        // cluster must share one.
        let alone = !opts.join && opts.join_with_token.is_none() && opts.initial_cluster.len() <= 1;
        let ca = crate::tls::load_or_create_ca(&opts.tls.ca, &opts.data_dir, alone)?;
        let cert = ca.issue_controller(opts.id, &opts.advertise, &opts.tls.extra_names)?;
        Some(crate::tls::ControllerTls { ca, cert })
    };
    let server_tls = tls.as_ref().map(crate::tls::ControllerTls::server_config);
    let services_tls = match (&opts.services, &tls) {
        (Some(_), Some(t)) => Some(tb_api::https::server_config(
            &t.cert.cert_pem,
            &t.cert.key_pem,
            "the controller",
        )?),
        _ => None,
    };
    let secret_path = opts
        .cluster_secret_file
        .clone()
        .unwrap_or_else(|| opts.data_dir.join("cluster.secret"));
    let secret = crate::auth::load_or_create_secret(&secret_path)?;
    let credentials = Arc::new(crate::credentials::Credentials::new(tls, secret));
    let (node, rebuilding) = start_raft(&opts, &credentials).await?;
    let admin_token = match &opts.admin_token_file {
        None => None,
        Some(p) => {
            let t = std::fs::read_to_string(p)
                .with_context(|| format!("--admin-token-file {}", p.display()))?
                .trim()
                .to_string();
            if !t.starts_with(crate::auth::USER_TOKEN_PREFIX) {
                anyhow::bail!(
                    "--admin-token-file {}: expected a token starting with {}",
                    p.display(),
                    crate::auth::USER_TOKEN_PREFIX
                );
            }
            Some(t)
        }
    };

    if let Some(addr) = opts.metrics_listen {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding metrics on {addr}"))?;
        tokio::spawn(crate::metrics::serve(l, node.clone()));
    }

    if let Some(services) = &opts.services {
        let l = tokio::net::TcpListener::bind(services.listen)
            .await
            .with_context(|| format!("binding the services listener on {}", services.listen))?;
        tracing::info!(listen = %services.listen, "serving InferenceServices at /services/NAMESPACE/NAME/v1 and the dashboard at /ui/");
        let app = crate::services::router(node.clone(), services.wait).merge(
            crate::dashboard::router(node.clone(), opts.scheduler.clone()),
        );
        tokio::spawn(crate::services::serve(l, services_tls, app));
    }

    // Watches are endless streams; on shutdown they are ended so the server can drain.
    let (stopping_tx, stopping) = tokio::sync::watch::channel(false);
    let objects = ObjectsServer::new(ObjectsService::new(node.clone(), stopping))
        .max_decoding_message_size(MAX_REQUEST)
        .max_encoding_message_size(MAX_MESSAGE);
    let cluster = ClusterServer::new(ClusterService::new(node.clone()));
    // Nodelets heartbeat five times per grace period.
    let heartbeat_ms = (opts.scheduler.node_grace.num_milliseconds() / 5).max(200) as u64;
    let node_grace_ms = opts.scheduler.node_grace.num_milliseconds().max(0) as u64;
    let nodes = NodesServer::new(NodesService::new(node.clone(), heartbeat_ms, node_grace_ms))
        .max_decoding_message_size(MAX_REQUEST);
    let auth = AuthService::new(node.clone(), opts.scheduler.clone());
    let raft = RaftServer::new(RaftService::new(node.clone()))
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    // Serving from our own listener, the builder's tcp_nodelay is not applied: set it here, or
    // every small reply waits on Nagle's algorithm.
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let mut builder = tonic::transport::Server::builder();
    if let Some(config) = server_tls {
        builder = builder
            .tls_config(config)
            .context("setting up TLS with this controller's certificate")?;
    }
    let serve = builder
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .layer(RpcLayer::new(node.clone()))
        .add_service(objects)
        .add_service(AuthServer::new(auth))
        .add_service(cluster)
        .add_service(nodes)
        .add_service(raft)
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown_signal().await;
            let _ = stopping_tx.send(true);
            // A client that never lets go must not keep a stopping controller alive.
            tokio::spawn(async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                tracing::warn!("connections still open 5 s after the stop signal; exiting");
                std::process::exit(0);
            });
        });
    let server = tokio::spawn(serve);

    if let Some(peers) = rebuilding {
        tokio::spawn(rejoin(node.clone(), credentials.clone(), peers));
    } else if let Some(join) = &opts.join_with_token {
        if node.is_initialized().await {
            tracing::info!(
                id = opts.id,
                "--join ignored: the data dir already holds a cluster; starting as its member"
            );
        } else {
            // The member joined through first, then the others it named.
            let mut peers = vec![join.addr.clone()];
            for member in fetched.iter().flat_map(|r| r.members.iter()) {
                if let Some((id, addr)) = member.split_once('=')
                    && id != opts.id.to_string()
                    && !peers.iter().any(|p| p == addr)
                {
                    peers.push(addr.to_string());
                }
            }
            tokio::spawn(crate::join::become_member(
                node.clone(),
                credentials.clone(),
                peers,
                started,
            ));
        }
    } else if !opts.join {
        let members = if opts.initial_cluster.is_empty() {
            BTreeMap::from([(opts.id, opts.advertise.clone())])
        } else {
            opts.initial_cluster.clone()
        };
        node.bootstrap(&members)
            .await
            .context("forming the cluster")?;
        if !node.store().read().bootstrapped {
            tokio::spawn(bootstrap_admin(
                node.clone(),
                opts.data_dir.clone(),
                admin_token,
            ));
        }
    }
    // Whoever adds the next controller finds the token in the data dir, kept current.
    tokio::spawn(crate::join::keep_token_file(
        node.clone(),
        opts.data_dir.clone(),
    ));
    tokio::spawn(crate::reconciler::run(
        node.clone(),
        opts.scheduler.clone(),
        opts.scheduler_clock.clone(),
    ));
    tracing::info!(
        id = opts.id,
        listen = %opts.listen,
        advertise = %opts.advertise,
        tls = !opts.tls.insecure,
        "tb-controller serving"
    );

    let result = server.await.context("server task")?;
    tracing::info!("gRPC server drained");
    node.shutdown().await;
    result.context("gRPC server")?;
    Ok(())
}

/// Start Raft on the data dir's database. A damaged database stops the start with what to do
/// about it, unless `--rebuild-from-peers` asks to move it aside and start on a new one: then
/// this member has first been removed from the cluster, and the peers to rejoin through are
/// returned with the node.
async fn start_raft(
    opts: &ServerOptions,
    credentials: &Arc<crate::credentials::Credentials>,
) -> anyhow::Result<(Arc<RaftNode>, Option<Vec<String>>)> {
    let start = || {
        RaftNode::start(
            opts.id,
            opts.advertise.clone(),
            &opts.data_dir,
            &opts.raft,
            credentials.clone(),
        )
    };
    let damaged = match start().await {
        Ok(node) => return Ok((node, None)),
        Err(e) => match e.downcast::<crate::raft::Damaged>() {
            Ok(d) => d,
            Err(e) => return Err(e),
        },
    };
    let db = damaged.path.clone();
    let peers: Vec<String> = opts
        .initial_cluster
        .iter()
        .filter(|(id, _)| **id != opts.id)
        .map(|(_, addr)| addr.clone())
        .collect();
    if !opts.rebuild_from_peers {
        tracing::error!(file = %db.display(), reason = %damaged.reason, "the database is damaged; not starting");
        anyhow::bail!(
            "{damaged}. This controller cannot start from it. If it is a member of a cluster \
             whose other members are healthy, start it again with --rebuild-from-peers: the file \
             is moved aside and the leader sends this member the cluster's state. Otherwise \
             restore the cluster from a snapshot file: tb-controller restore FILE --data-dir \
             NEW_DIR (docs/backups.md)."
        );
    }
    if peers.is_empty() {
        anyhow::bail!(
            "{damaged}. --rebuild-from-peers needs the other members' addresses: start with the \
             --initial-cluster this member was formed with"
        );
    }
    tracing::warn!(
        file = %db.display(),
        reason = %damaged.reason,
        "the database is damaged; rebuilding this member from its peers"
    );
    crate::rebuild::leave(credentials, &peers, opts.id)
        .await
        .context("rebuilding from peers")?;
    tracing::info!(
        id = opts.id,
        "removed this member from the cluster while it has no state"
    );
    let aside = crate::rebuild::move_aside(&db)?;
    tracing::warn!(damaged = %aside.display(), "moved the damaged database aside");
    // A new, empty database (0600, as `prepare` makes it).
    crate::datadir::prepare(&opts.data_dir, crate::raft::DB_FILE)?;
    let node = start().await?;
    Ok((node, Some(peers)))
}

/// Ask to be added back once serving (the leader reaches this member to catch it up), and say
/// how it went: the member serves as a voter again, or stays out of the cluster.
async fn rejoin(
    node: Arc<RaftNode>,
    credentials: Arc<crate::credentials::Credentials>,
    peers: Vec<String>,
) {
    match crate::rebuild::rejoin(&credentials, &peers, node.id, &node.addr).await {
        Ok(()) => {
            // Promotion does not wait for the snapshot to be installed here: a read-index
            // barrier does (every write committed so far is applied on this member).
            let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
            while let Err(e) = node.linearize().await {
                if tokio::time::Instant::now() >= deadline {
                    tracing::error!(error = %e, "rebuilding from peers: added back, but not caught up");
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let status = node.member_status();
            tracing::info!(
                id = node.id,
                applied = status.applied_index,
                "rebuilt from peers: caught up by the leader and a voter again"
            );
        }
        Err(e) => tracing::error!(
            error = %format!("{e:#}"),
            "rebuilding from peers: not added back; add it with `tbctl cluster add-member`"
        ),
    }
}

/// Make the first admin user of a new cluster, once: every member that forms the cluster
/// proposes it, the first to commit wins, and only the winner writes its token (when it made
/// one) to `<data-dir>/admin.token`, mode 0600.
async fn bootstrap_admin(node: Arc<RaftNode>, data_dir: PathBuf, given: Option<String>) {
    use crate::store::{Op, Response, StoreError, TokenRecord};
    let generated = given.is_none();
    let token = given.unwrap_or_else(|| crate::auth::secret(crate::auth::USER_TOKEN_PREFIX));
    let expires_at = match crate::service::auth::expires_at(ADMIN_TOKEN_TTL) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e.message(), "bootstrapping the admin user");
            return;
        }
    };
    let op = Op::BootstrapAdmin {
        token_hash: crate::auth::hash_secret(&token),
        token: TokenRecord {
            id: crate::auth::short_id(),
            user: crate::store::users::ADMIN_USER.into(),
            expires_at,
            created_at: String::new(),
            description: "made with the cluster".into(),
        },
        cluster_id: uuid::Uuid::new_v4().to_string(),
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let cmd = crate::store::Command {
            request_id: String::new(),
            now: crate::service::now(),
            op: op.clone(),
            user: String::new(),
        };
        match node.propose(cmd).await {
            Ok(Response::Rejected(StoreError::AlreadyExists(_))) => return,
            Ok(Response::Rejected(e)) => {
                tracing::error!(error = %e, "bootstrapping the admin user");
                return;
            }
            Ok(_) => break,
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "bootstrapping the admin user: retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                tracing::error!(error = %e, "bootstrapping the admin user: giving up");
                return;
            }
        }
    }
    if !generated {
        tracing::info!("created user admin with the token from --admin-token-file");
        return;
    }
    let path = data_dir.join(ADMIN_TOKEN_FILE);
    match crate::auth::write_private(&path, &format!("{token}\n")) {
        Ok(()) => tracing::info!(
            path = %path.display(),
            "created user admin; its token is in this file (shown nowhere else)"
        ),
        Err(e) => tracing::error!(error = %format!("{e:#}"), "writing the admin token"),
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return ctrl_c.await.unwrap_or(()),
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down");
}
