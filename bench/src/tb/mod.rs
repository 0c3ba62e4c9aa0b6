//! tb as a system under test: starting a 3-member `tb-controller` cluster with the controller's
//! defaults (TLS from the cluster CA, auth; see [`crate::secure`]), and the `Backend` that
//! writes objects with `Objects.Apply` and finds the leader with `Cluster.Status`, over TLS as
//! the admin.

pub mod metrics;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Backend, Probe, RpcError, Write, with_timeout};
use crate::cluster::Cluster;
use crate::member::Member;
use crate::payload::model_json;
use crate::secure::{AdminChannel, AdminToken};
use anyhow::Context;
use tb_api::proto::cluster_client::ClusterClient;
use tb_api::proto::objects_client::ObjectsClient;
use tb_api::proto::{ApplyRequest, ClusterStatusRequest};

/// How to start tb's members.
#[derive(Debug, Clone)]
pub struct TbOptions {
    pub binary: std::path::PathBuf,
    /// `RUST_LOG` for the controllers (their default when `None`).
    pub rust_log: Option<String>,
    pub payload_bytes: usize,
    /// More `tb-controller` flags (e.g. `--heartbeat-ms 50`), appended to every member's.
    pub extra_args: Vec<String>,
}

/// Member `id`'s data dir under `dir` (what [`start_members`] gives it).
pub fn data_dir(dir: &Path, id: usize) -> std::path::PathBuf {
    dir.join(format!("tb-{id}"))
}

/// Start controllers 1..=3 on fresh loopback ports with data dirs under `dir`, each also
/// serving `/metrics`: the controller's defaults, their data dirs seeded with one cluster CA
/// and cluster secret; the client trusts that CA and takes the admin token from whichever data
/// dir it is written to.
pub fn start(opts: &TbOptions, dir: &Path) -> anyhow::Result<Cluster<TbBackend>> {
    let data_dirs: Vec<_> = (1..=3).map(|id| data_dir(dir, id)).collect();
    let ca_pem = crate::secure::seed_data_dirs(&data_dirs)?;
    let token = AdminToken::from_data_dirs(&data_dirs);
    let (cluster, _) = start_members(
        &opts.binary,
        opts.rust_log.as_deref(),
        &opts.extra_args,
        dir,
        |addrs| TbBackend::new(addrs, &ca_pem, &token, opts.payload_bytes),
    )?;
    Ok(cluster)
}

/// Spawn `binary` as controllers 1..=3 on fresh loopback ports (`--initial-cluster` of the
/// three), data dirs `dir/tb-ID` and logs `dir/tb-ID.log`, each also serving `/metrics` and
/// given `extra_args` after its own; `backend` makes the client from their API addresses.
/// Returns the cluster and those addresses.
pub fn start_members<B: Backend>(
    binary: &Path,
    rust_log: Option<&str>,
    extra_args: &[String],
    dir: &Path,
    backend: impl FnOnce(&[String]) -> anyhow::Result<B>,
) -> anyhow::Result<(Cluster<B>, Vec<String>)> {
    let ports = crate::ports::free_ports(6)?;
    let (api, metrics) = ports.split_at(3);
    let addrs: Vec<String> = api.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let initial = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let mut members = Vec::new();
    let mut metrics_addrs = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let id = i + 1;
        let metrics_addr = format!("127.0.0.1:{}", metrics[i]);
        let data = data_dir(dir, id);
        let mut args = vec![
            "--id".into(),
            id.to_string(),
            "--listen".into(),
            addr.clone(),
            "--data-dir".into(),
            data.display().to_string(),
            "--initial-cluster".into(),
            initial.clone(),
            "--metrics-listen".into(),
            metrics_addr.clone(),
        ];
        args.extend(extra_args.iter().cloned());
        let mut m = Member::new(
            format!("tb-{id}"),
            binary,
            args,
            dir.join(format!("tb-{id}.log")),
        )
        .data_dir(data);
        if let Some(filter) = rust_log {
            m = m.env("RUST_LOG", filter);
        }
        members.push(m);
        metrics_addrs.push(metrics_addr);
    }
    let backend = backend(&addrs)?;
    let mut cluster = Cluster::new(members, Arc::new(backend));
    cluster.metrics = metrics_addrs;
    cluster.spawn_all()?;
    Ok((cluster, addrs))
}

/// A tb client holding one TLS channel per controller, calling as the admin.
pub struct TbBackend {
    objects: Vec<ObjectsClient<AdminChannel>>,
    cluster: Vec<ClusterClient<AdminChannel>>,
    payload_bytes: usize,
}

impl TbBackend {
    pub fn new(
        addrs: &[String],
        ca_pem: &str,
        token: &AdminToken,
        payload_bytes: usize,
    ) -> anyhow::Result<Self> {
        let channels = addrs
            .iter()
            .map(|a| {
                crate::secure::tls_channel(a, ca_pem)
                    .map(|c| crate::secure::as_admin(c, token))
                    .with_context(|| format!("tb endpoint {a}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(TbBackend {
            objects: channels.iter().cloned().map(ObjectsClient::new).collect(),
            cluster: channels.into_iter().map(ClusterClient::new).collect(),
            payload_bytes,
        })
    }
}

/// Controller ids are 1-based endpoint indexes.
fn id_of(endpoint: usize) -> u64 {
    endpoint as u64 + 1
}

impl Backend for TbBackend {
    fn name(&self) -> &'static str {
        "tb"
    }

    fn endpoints(&self) -> usize {
        self.objects.len()
    }

    async fn put(&self, endpoint: usize, write: &Write, timeout: Duration) -> Result<(), RpcError> {
        let mut client = self.objects[endpoint].clone();
        let mut req = tonic::Request::new(ApplyRequest {
            objects_json: vec![model_json(&write.name, self.payload_bytes)],
            dry_run: false,
            request_id: write.request_id.clone(),
        });
        req.set_timeout(timeout);
        with_timeout("Objects/Apply", timeout, async {
            let resp = client
                .apply(req)
                .await
                .map_err(|s| RpcError::from_status("Objects/Apply", &s))?
                .into_inner();
            // A retry of a write that did commit answers from tb's idempotency record, so any
            // outcome counts; the stored-object count is checked after the run instead.
            if resp.results.is_empty() {
                return Err(RpcError {
                    retryable: false,
                    message: format!("Objects/Apply: the answer for {} has no result", write.name),
                });
            }
            Ok(())
        })
        .await
    }

    async fn probe(&self, endpoint: usize, timeout: Duration) -> Result<Probe, RpcError> {
        let mut client = self.cluster[endpoint].clone();
        let mut req = tonic::Request::new(ClusterStatusRequest {});
        req.set_timeout(timeout);
        with_timeout("Cluster/Status", timeout, async {
            let s = client
                .status(req)
                .await
                .map_err(|s| RpcError::from_status("Cluster/Status", &s))?
                .into_inner();
            let id = id_of(endpoint);
            let own = s.members.iter().find(|m| m.id == id);
            Ok(Probe {
                is_leader: s.has_leader && s.leader_id == id,
                has_leader: s.has_leader,
                term: s.term,
                applied: own.map_or(0, |m| m.applied_index),
            })
        })
        .await
    }
}
