//! The cluster under test and the admin's way to it: the credentials every member starts
//! with (CA, admin token, cluster secret), the three TLS controllers, the bearer-token TLS
//! channels, and retrying one call.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use tb_api::proto::cluster_client::ClusterClient;
use tb_api::proto::nodes_client::NodesClient;
use tb_api::proto::objects_client::ObjectsClient;
use tb_api::proto::{ApplyRequest, ClusterStatusRequest};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use super::{ATTEMPTS, RPC_TIMEOUT, RaftSetup};
use crate::backend::{Backend, Probe, RpcError, Write, with_timeout};
use crate::cluster::Cluster;

/// The admin token, cluster secret and CA every member is started with.
pub(super) struct Credentials {
    admin_token: String,
    pub(super) ca_pem: String,
    args: Vec<String>,
}

fn random_hex() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("{text}\n"))
        .with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 600 {}", path.display()))
}

impl Credentials {
    /// `tb-controller init-ca DIR/ca`, a random admin token and cluster secret, in files.
    pub(super) async fn create(controller: &Path, dir: &Path) -> anyhow::Result<Self> {
        let ca_dir = dir.join("ca");
        let out = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::process::Command::new(controller)
                .arg("init-ca")
                .arg(&ca_dir)
                .kill_on_drop(true)
                .output(),
        )
        .await
        .context("tb-controller init-ca took over 30 s")?
        .with_context(|| format!("running {} init-ca", controller.display()))?;
        anyhow::ensure!(
            out.status.success(),
            "tb-controller init-ca failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let (cert, key) = (ca_dir.join("ca.pem"), ca_dir.join("ca.key"));
        let ca_pem = std::fs::read_to_string(&cert)
            .with_context(|| format!("reading {}", cert.display()))?;
        let admin_token = format!("tbuser-{}", random_hex());
        let token_file = dir.join("admin.token");
        let secret_file = dir.join("cluster.secret");
        write_private(&token_file, &admin_token)?;
        write_private(&secret_file, &format!("tbcluster-{}", random_hex()))?;
        let path = |p: &Path| p.display().to_string();
        Ok(Credentials {
            admin_token,
            ca_pem,
            args: vec![
                "--admin-token-file".into(),
                path(&token_file),
                "--cluster-secret-file".into(),
                path(&secret_file),
                "--tls-ca-cert".into(),
                path(&cert),
                "--tls-ca-key".into(),
                path(&key),
            ],
        })
    }
}

/// Adds `authorization: Bearer TOKEN` to every call.
#[derive(Clone)]
pub(super) struct Bearer(MetadataValue<Ascii>);

impl Bearer {
    pub(super) fn new(token: &str) -> anyhow::Result<Self> {
        Ok(Bearer(
            format!("Bearer {token}")
                .parse()
                .context("a token that is not a header value")?,
        ))
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

pub(super) type Authed = InterceptedService<Channel, Bearer>;

/// A lazily connecting TLS channel to `addr` that trusts the cluster CA.
pub(super) fn tls_channel(addr: &str, ca_pem: &str) -> anyhow::Result<Channel> {
    let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem));
    Ok(Endpoint::from_shared(format!("https://{addr}"))
        .with_context(|| format!("endpoint {addr}"))?
        .tls_config(tls)
        .with_context(|| format!("TLS settings for {addr}"))?
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .connect_lazy())
}

/// The admin's client of the three controllers, over TLS, for `Cluster`'s health check.
pub struct TlsTb {
    pub(super) objects: Vec<ObjectsClient<Authed>>,
    cluster: Vec<ClusterClient<Authed>>,
    pub(super) nodes: Vec<NodesClient<Authed>>,
}

impl TlsTb {
    fn new(addrs: &[String], ca_pem: &str, token: &str) -> anyhow::Result<Self> {
        let bearer = Bearer::new(token)?;
        let channels = addrs
            .iter()
            .map(|a| tls_channel(a, ca_pem))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let authed = |c: &Channel| InterceptedService::new(c.clone(), bearer.clone());
        Ok(TlsTb {
            objects: channels
                .iter()
                .map(|c| {
                    ObjectsClient::new(authed(c))
                        .max_decoding_message_size(64 << 20)
                        .max_encoding_message_size(64 << 20)
                })
                .collect(),
            cluster: channels
                .iter()
                .map(|c| ClusterClient::new(authed(c)))
                .collect(),
            nodes: channels
                .iter()
                .map(|c| NodesClient::new(authed(c)))
                .collect(),
        })
    }
}

impl Backend for TlsTb {
    fn name(&self) -> &'static str {
        "tb"
    }

    fn endpoints(&self) -> usize {
        self.objects.len()
    }

    async fn put(&self, endpoint: usize, write: &Write, timeout: Duration) -> Result<(), RpcError> {
        let mut client = self.objects[endpoint].clone();
        let mut req = tonic::Request::new(ApplyRequest {
            objects_json: vec![crate::payload::model_json(&write.name, 256)],
            dry_run: false,
            request_id: write.request_id.clone(),
        });
        req.set_timeout(timeout);
        with_timeout("Objects/Apply", timeout, async {
            client
                .apply(req)
                .await
                .map(|_| ())
                .map_err(|s| RpcError::from_status("Objects/Apply", &s))
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
            let id = endpoint as u64 + 1;
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

/// Controllers 1..=3 on fresh loopback ports, TLS and auth from `creds`, each serving
/// `/metrics`. Returns the cluster and the members' API addresses.
pub(super) fn start_cluster(
    setup: &RaftSetup,
    dir: &Path,
    creds: &Credentials,
) -> anyhow::Result<(Cluster<TlsTb>, Vec<String>)> {
    crate::tb::start_members(
        &setup.controller,
        setup.rust_log.as_deref(),
        &creds.args,
        dir,
        |addrs| TlsTb::new(addrs, &creds.ca_pem, &creds.admin_token),
    )
}

pub(super) fn retryable(s: &tonic::Status) -> bool {
    RpcError::from_status("", s).retryable
}

/// `call` until it succeeds, a final error, or `ATTEMPTS` tries (each bounded by
/// `RPC_TIMEOUT`).
pub(super) async fn retry<T, F, Fut>(what: &str, mut call: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut last = String::new();
    for attempt in 0..ATTEMPTS {
        match tokio::time::timeout(RPC_TIMEOUT, call()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(s)) if retryable(&s) => last = format!("{:?}: {}", s.code(), s.message()),
            Ok(Err(s)) => anyhow::bail!("{what}: {:?}: {}", s.code(), s.message()),
            Err(_) => last = format!("no answer within {RPC_TIMEOUT:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt.min(10) + 1))).await;
    }
    anyhow::bail!("{what}: gave up after {ATTEMPTS} attempts: {last}")
}
