//! etcd as the yardstick: starting a 3-member etcd cluster with its defaults (fsync on,
//! 100 ms heartbeat, 1 s election timeout), in plain TCP or with TLS on its client and peer
//! links (certificates from a CA made in the bench's temp dir; with `--trusted-ca-file` etcd
//! verifies every client's and peer's certificate, so the bench's client presents one too —
//! etcd's counterpart of tb's bearer token), and the `Backend` that writes with `KV.Put` and
//! finds the leader with `Maintenance.Status`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tonic::transport::Channel;

use crate::backend::{Backend, Probe, RpcError, Write, channel, with_timeout};
use crate::cluster::Cluster;
use crate::etcdserverpb::kv_client::KvClient;
use crate::etcdserverpb::maintenance_client::MaintenanceClient;
use crate::etcdserverpb::{PutRequest, StatusRequest};
use crate::member::Member;
use crate::payload::{etcd_key, model_json};

/// `etcd` on the PATH, if there is one.
pub fn find_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("etcd"))
        .find(|p| p.is_file())
}

/// `etcd --version`'s first line.
pub fn version(binary: &Path) -> String {
    std::process::Command::new(binary)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_else(|| "unknown version".into())
}

/// Whether etcd's client and peer links use TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Plain,
    Tls,
}

impl Transport {
    /// The system's name in the report: `etcd-tls` or `etcd-plain`.
    pub fn system_name(self) -> &'static str {
        match self {
            Transport::Plain => "etcd-plain",
            Transport::Tls => "etcd-tls",
        }
    }

    fn scheme(self) -> &'static str {
        match self {
            Transport::Plain => "http",
            Transport::Tls => "https",
        }
    }
}

/// What the bench's client needs to call an etcd with TLS: the CA to trust and its own
/// certificate.
pub struct ClientTls {
    pub ca_pem: String,
    pub identity: tb_controller::tls::CertifiedKey,
}

/// A CA and one certificate per member (for 127.0.0.1, serving and calling) in `dir/certs`:
/// each member's flags for them, and what the client needs.
fn certificates(dir: &Path, members: usize) -> anyhow::Result<(Vec<Vec<String>>, ClientTls)> {
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).with_context(|| format!("creating {}", certs.display()))?;
    let ca = tb_controller::tls::Ca::create()?;
    let ca_file = certs.join("ca.pem");
    crate::secure::write_private(&ca_file, ca.cert_pem())?;
    let mut flags = Vec::new();
    for i in 1..=members {
        let issued = ca.issue_controller(i as u64, "127.0.0.1:0", &[])?;
        let cert = certs.join(format!("m{i}.pem"));
        let key = certs.join(format!("m{i}.key"));
        crate::secure::write_private(&cert, &issued.cert_pem)?;
        crate::secure::write_private(&key, &issued.key_pem)?;
        let (cert, key, ca) = (cert.display(), key.display(), ca_file.display());
        flags.push(vec![
            format!("--cert-file={cert}"),
            format!("--key-file={key}"),
            format!("--trusted-ca-file={ca}"),
            format!("--peer-cert-file={cert}"),
            format!("--peer-key-file={key}"),
            format!("--peer-trusted-ca-file={ca}"),
            "--peer-client-cert-auth".into(),
        ]);
    }
    let client = ClientTls {
        ca_pem: ca.cert_pem().to_string(),
        identity: ca.issue_controller(0, "127.0.0.1:0", &[])?,
    };
    Ok((flags, client))
}

/// Start members m1..m3 on fresh loopback ports with data dirs under `dir`.
pub fn start(
    binary: &Path,
    dir: &Path,
    payload_bytes: usize,
    transport: Transport,
) -> anyhow::Result<Cluster<EtcdBackend>> {
    let ports = crate::ports::free_ports(6)?;
    let (client, peer) = ports.split_at(3);
    let scheme = transport.scheme();
    let client_urls: Vec<String> = client
        .iter()
        .map(|p| format!("{scheme}://127.0.0.1:{p}"))
        .collect();
    let peer_urls: Vec<String> = peer
        .iter()
        .map(|p| format!("{scheme}://127.0.0.1:{p}"))
        .collect();
    let (tls_flags, client_tls) = match transport {
        Transport::Tls => {
            let (flags, ca) = certificates(dir, 3)?;
            (flags, Some(ca))
        }
        Transport::Plain => (vec![Vec::new(); 3], None),
    };
    let initial = peer_urls
        .iter()
        .enumerate()
        .map(|(i, u)| format!("m{}={u}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let token = format!("tb-bench-{}", uuid::Uuid::new_v4().simple());
    let members = (0..3)
        .map(|i| {
            let name = format!("m{}", i + 1);
            let args = vec![
                format!("--name={name}"),
                format!("--data-dir={}", dir.join(format!("etcd-{name}")).display()),
                format!("--listen-client-urls={}", client_urls[i]),
                format!("--advertise-client-urls={}", client_urls[i]),
                format!("--listen-peer-urls={}", peer_urls[i]),
                format!("--initial-advertise-peer-urls={}", peer_urls[i]),
                format!("--initial-cluster={initial}"),
                "--initial-cluster-state=new".into(),
                format!("--initial-cluster-token={token}"),
                "--logger=zap".into(),
                "--log-outputs=stderr".into(),
            ];
            let args = [args, tls_flags[i].clone()].concat();
            Member::new(
                format!("etcd-{name}"),
                binary,
                args,
                dir.join(format!("etcd-{name}.log")),
            )
            .data_dir(dir.join(format!("etcd-{name}")))
        })
        .collect();
    let addrs: Vec<String> = client.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let backend = EtcdBackend::new(&addrs, client_tls.as_ref(), payload_bytes)?;
    let mut cluster = Cluster::new(members, Arc::new(backend));
    cluster.spawn_all()?;
    Ok(cluster)
}

/// An etcd client holding one channel per member.
pub struct EtcdBackend {
    kv: Vec<KvClient<Channel>>,
    maintenance: Vec<MaintenanceClient<Channel>>,
    payload_bytes: usize,
}

impl EtcdBackend {
    /// Plain channels, or TLS ones when `tls` is given.
    pub fn new(
        addrs: &[String],
        tls: Option<&ClientTls>,
        payload_bytes: usize,
    ) -> anyhow::Result<Self> {
        let channels = addrs
            .iter()
            .map(|a| {
                match tls {
                    Some(t) => crate::secure::tls_channel_as(a, &t.ca_pem, Some(&t.identity)),
                    None => channel(a),
                }
                .with_context(|| format!("etcd endpoint {a}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(EtcdBackend {
            kv: channels.iter().cloned().map(KvClient::new).collect(),
            maintenance: channels.into_iter().map(MaintenanceClient::new).collect(),
            payload_bytes,
        })
    }
}

impl Backend for EtcdBackend {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn endpoints(&self) -> usize {
        self.kv.len()
    }

    async fn put(&self, endpoint: usize, write: &Write, timeout: Duration) -> Result<(), RpcError> {
        let mut client = self.kv[endpoint].clone();
        let mut req = tonic::Request::new(PutRequest {
            key: etcd_key(&write.name),
            value: model_json(&write.name, self.payload_bytes).into_bytes(),
            ..Default::default()
        });
        req.set_timeout(timeout);
        with_timeout("KV/Put", timeout, async {
            client
                .put(req)
                .await
                .map(|_| ())
                .map_err(|s| RpcError::from_status("KV/Put", &s))
        })
        .await
    }

    async fn probe(&self, endpoint: usize, timeout: Duration) -> Result<Probe, RpcError> {
        let mut client = self.maintenance[endpoint].clone();
        let mut req = tonic::Request::new(StatusRequest {});
        req.set_timeout(timeout);
        with_timeout("Maintenance/Status", timeout, async {
            let s = client
                .status(req)
                .await
                .map_err(|s| RpcError::from_status("Maintenance/Status", &s))?
                .into_inner();
            let me = s.header.map_or(0, |h| h.member_id);
            Ok(Probe {
                is_leader: s.leader != 0 && s.leader == me,
                has_leader: s.leader != 0,
                term: s.raft_term,
                applied: if s.raft_applied_index > 0 {
                    s.raft_applied_index
                } else {
                    s.raft_index
                },
            })
        })
        .await
    }
}
