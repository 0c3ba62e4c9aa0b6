//! Assembles a controller: opens the Raft store, serves the gRPC services behind the RPC layer,
//! serves metrics, and bootstraps a new cluster when asked to.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use tb_api::proto::cluster_server::ClusterServer;
use tb_api::proto::nodes_server::NodesServer;
use tb_api::proto::objects_server::ObjectsServer;
use tb_api::proto::raft_server::RaftServer;

use crate::interceptor::RpcLayer;
use crate::raft::{MAX_MESSAGE, NodeId, RaftNode, RaftOptions, RaftService};
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
    pub metrics_listen: Option<SocketAddr>,
    pub raft: RaftOptions,
    pub scheduler: crate::scheduler::SchedulerConfig,
}

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
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .with_context(|| format!("binding {}", opts.listen))?;
    let node = RaftNode::start(opts.id, opts.advertise.clone(), &opts.data_dir, &opts.raft).await?;

    if let Some(addr) = opts.metrics_listen {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding metrics on {addr}"))?;
        tokio::spawn(crate::metrics::serve(l, node.clone()));
    }

    // Watches are endless streams; on shutdown they are ended so the server can drain.
    let (stopping_tx, stopping) = tokio::sync::watch::channel(false);
    let objects = ObjectsServer::new(ObjectsService::new(node.clone(), stopping))
        .max_decoding_message_size(MAX_REQUEST)
        .max_encoding_message_size(MAX_MESSAGE);
    let cluster = ClusterServer::new(ClusterService::new(node.clone()));
    // Nodelets heartbeat five times per grace period.
    let heartbeat_ms = (opts.scheduler.node_grace.num_milliseconds() / 5).max(200) as u64;
    let nodes = NodesServer::new(NodesService::new(node.clone(), heartbeat_ms))
        .max_decoding_message_size(MAX_REQUEST);
    let raft = RaftServer::new(RaftService::new(node.clone()))
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    // Serving from our own listener, the builder's tcp_nodelay is not applied: set it here, or
    // every small reply waits on Nagle's algorithm.
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let serve = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .layer(RpcLayer)
        .add_service(objects)
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

    if !opts.join {
        let members = if opts.initial_cluster.is_empty() {
            BTreeMap::from([(opts.id, opts.advertise.clone())])
        } else {
            opts.initial_cluster.clone()
        };
        node.bootstrap(&members)
            .await
            .context("forming the cluster")?;
    }
    tokio::spawn(crate::reconciler::run(node.clone(), opts.scheduler.clone()));
    tracing::info!(id = opts.id, listen = %opts.listen, advertise = %opts.advertise, "tb-controller serving");

    let result = server.await.context("server task")?;
    tracing::info!("gRPC server drained");
    node.shutdown().await;
    result.context("gRPC server")?;
    Ok(())
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
