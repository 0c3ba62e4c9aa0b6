//! The joining side of `tb-controller --join https://HOST:PORT` with a join token
//! (`crate::member_token`): get the cluster's credentials from a member, keep them in the data
//! dir, and, once serving, be added by the leader — as a learner that catches up, then a voter.
//!
//! The token is only ever sent to a controller whose CA has the hash the token pins: the CA
//! certificate is first fetched over a TLS connection that checks nothing but the handshake
//! (`Cluster.ClusterCa`, public), compared with the pin, and only then trusted — alone — for
//! the connection that carries the token (`Cluster.JoinCluster`).
//!
//! Restarting with the same command is safe at every step: a data dir that already holds the
//! credentials is not fetched for again (its CA must be the pinned one), and one whose store
//! already holds a cluster ignores `--join`.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tb_api::proto::cluster_client::ClusterClient;
use tb_api::proto::{ClusterCaRequest, JoinClusterRequest, JoinClusterResponse};
use tokio_rustls::rustls;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use crate::member_token::{MemberToken, ca_hash};
use crate::raft::{NodeId, RaftNode};
use crate::tls::{CA_CERT_FILE, CA_KEY_FILE};

/// The cluster secret's file in a joined controller's data dir.
pub const CLUSTER_SECRET_FILE: &str = "cluster.secret";
/// How long a joiner keeps trying to reach the controller it joins through.
pub const REACH_BUDGET: Duration = Duration::from_secs(60);
/// The environment variable a joiner's token may come from.
pub const TOKEN_ENV: &str = "TB_JOIN_TOKEN";

/// Where to join and with what.
#[derive(Clone)]
pub struct JoinWithToken {
    /// `HOST:PORT` of a member.
    pub addr: String,
    pub token: MemberToken,
}

impl std::fmt::Debug for JoinWithToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinWithToken")
            .field("addr", &self.addr)
            .field("token", &self.token)
            .finish()
    }
}

/// `https://HOST:PORT` (or `HOST:PORT`) → `HOST:PORT`.
pub fn parse_url(url: &str) -> anyhow::Result<String> {
    let rest = if let Some(rest) = url.strip_prefix("https://") {
        rest
    } else if url.starts_with("http://") {
        anyhow::bail!(
            "--join {url}: joining hands over the cluster's keys, so it needs TLS: https://HOST:PORT"
        );
    } else {
        url
    };
    let rest = rest.trim_end_matches('/');
    let ok = rest
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if !ok || rest.contains('/') {
        anyhow::bail!("--join {url}: expected https://HOST:PORT of a controller of the cluster");
    }
    Ok(rest.to_string())
}

/// The token from `file` (`-`: standard input), else from `TB_JOIN_TOKEN`.
pub fn read_token(file: Option<&Path>) -> anyhow::Result<MemberToken> {
    let (text, from) = match file {
        Some(p) if p == Path::new("-") => {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                .context("reading the join token from standard input")?;
            (s, "standard input".to_string())
        }
        Some(p) => (
            std::fs::read_to_string(p).with_context(|| format!("--token-file {}", p.display()))?,
            format!("--token-file {}", p.display()),
        ),
        None => match std::env::var(TOKEN_ENV) {
            Ok(s) => (s, TOKEN_ENV.to_string()),
            Err(_) => anyhow::bail!(
                "--join URL needs the cluster's join token: --token-file FILE (`-` for standard \
                 input) or {TOKEN_ENV}; an admin prints it with `tbctl cluster join-token`, and \
                 the first controller keeps it in DATA_DIR/{}",
                crate::member_token::TOKEN_FILE
            ),
        },
    };
    MemberToken::parse(&text).with_context(|| format!("the join token from {from}"))
}

/// Whether the data dir already holds a joined member's credentials.
pub fn holds_credentials(data_dir: &Path) -> bool {
    [CA_CERT_FILE, CA_KEY_FILE, CLUSTER_SECRET_FILE]
        .iter()
        .all(|f| data_dir.join(f).exists())
}

/// A data dir with credentials must hold the CA the token pins (else it is another cluster's).
pub fn check_pin(data_dir: &Path, token: &MemberToken) -> anyhow::Result<()> {
    let path = data_dir.join(CA_CERT_FILE);
    let pem =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let hash = ca_hash(&pem).with_context(|| path.display().to_string())?;
    if hash != token.ca_hash {
        anyhow::bail!(
            "{} holds a CA whose hash is {hash}, but the join token pins {}: this data dir \
             belongs to another cluster; use a new --data-dir to join this one",
            path.display(),
            token.ca_hash
        );
    }
    Ok(())
}

/// Why one attempt failed: worth another try, or not.
enum Attempt {
    Retry(String),
    Fatal(anyhow::Error),
}

/// Get the cluster's credentials from the member at `join.addr`, retrying for up to
/// [`REACH_BUDGET`] while it cannot be reached; a wrong CA or a refused token ends it at once.
pub async fn fetch(
    join: &JoinWithToken,
    id: NodeId,
    advertise: &str,
) -> anyhow::Result<JoinClusterResponse> {
    let deadline = Instant::now() + REACH_BUDGET;
    loop {
        match attempt(join, id, advertise).await {
            Ok(r) => return Ok(r),
            Err(Attempt::Fatal(e)) => return Err(e),
            Err(Attempt::Retry(why)) if Instant::now() < deadline => {
                tracing::warn!(controller = %join.addr, error = %why, "joining: retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(Attempt::Retry(why)) => anyhow::bail!(
                "--join: could not reach the controller at {} within {} s (last: {why}); is it \
                 running, and is the address right?",
                join.addr,
                REACH_BUDGET.as_secs()
            ),
        }
    }
}

async fn attempt(
    join: &JoinWithToken,
    id: NodeId,
    advertise: &str,
) -> Result<JoinClusterResponse, Attempt> {
    let addr = &join.addr;
    let ca_pem = fetch_ca(addr).await?;
    let presented = ca_hash(&ca_pem).map_err(Attempt::Fatal)?;
    if presented != join.token.ca_hash {
        return Err(Attempt::Fatal(anyhow::anyhow!(
            "the controller at {addr} presents a CA whose hash is {presented}, the token pins \
             {}: it is not the cluster the token is for (or someone is in between); nothing was \
             sent or written",
            join.token.ca_hash
        )));
    }
    // From here on, only that CA is trusted.
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .map_err(|e| Attempt::Fatal(e.into()))?
        .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca_pem)))
        .map_err(|e| Attempt::Fatal(e.into()))?
        .connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(30))
        .connect()
        .await
        .map_err(|e| Attempt::Retry(format!("{addr}: {e}")))?;
    let reply = ClusterClient::new(channel)
        .join_cluster(JoinClusterRequest {
            token: join.token.to_string(),
            id,
            address: advertise.to_string(),
        })
        .await;
    let reply = match reply {
        Ok(r) => r.into_inner(),
        Err(e) if e.code() == tonic::Code::Unavailable => {
            return Err(Attempt::Retry(format!("{addr}: {}", e.message())));
        }
        Err(e) => {
            return Err(Attempt::Fatal(anyhow::anyhow!(
                "the controller at {addr} refused to let controller {id} ({advertise}) join: {}; \
                 nothing was written",
                e.message()
            )));
        }
    };
    check_reply(&reply, &join.token).map_err(Attempt::Fatal)?;
    Ok(reply)
}

/// What came back must be the pinned CA, with its key, and a cluster secret.
fn check_reply(reply: &JoinClusterResponse, token: &MemberToken) -> anyhow::Result<()> {
    let hash = ca_hash(&reply.ca_cert_pem).context("the CA certificate handed over")?;
    if hash != token.ca_hash {
        anyhow::bail!("the CA certificate handed over is not the pinned one");
    }
    crate::tls::Ca::from_pem(&reply.ca_cert_pem, &reply.ca_key_pem)
        .context("the CA handed over")?;
    if !reply
        .cluster_secret
        .starts_with(crate::auth::CLUSTER_SECRET_PREFIX)
    {
        anyhow::bail!("the cluster secret handed over is not one");
    }
    Ok(())
}

/// Keep the credentials in the data dir (0600 files in the 0700 dir `datadir::prepare` made).
pub fn write_credentials(data_dir: &Path, reply: &JoinClusterResponse) -> anyhow::Result<()> {
    replace_private(&data_dir.join(CA_CERT_FILE), &reply.ca_cert_pem)?;
    replace_private(&data_dir.join(CA_KEY_FILE), &reply.ca_key_pem)?;
    // Last: its presence says the set is whole (`holds_credentials`).
    replace_private(
        &data_dir.join(CLUSTER_SECRET_FILE),
        &format!("{}\n", reply.cluster_secret),
    )
}

/// Write `text` to `path` (mode 0600) through a temporary file renamed over it, so a crash
/// leaves the old file or the new one, never half of one.
pub fn replace_private(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    crate::auth::write_private(&tmp, text)?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

/// Keep `DATA_DIR/join.token` holding this cluster's join token (mode 0600), for whoever adds
/// the next controller. Every member may write it: each already holds the cluster secret and
/// the CA key the token leads to.
pub fn write_token_file(data_dir: &Path, token: &MemberToken) -> anyhow::Result<()> {
    let path = data_dir.join(crate::member_token::TOKEN_FILE);
    let text = format!("{token}\n");
    if std::fs::read_to_string(&path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    replace_private(&path, &text)?;
    tracing::info!(
        path = %path.display(),
        "wrote the controller join token (tb-controller --join URL --token-file FILE)"
    );
    Ok(())
}

/// Keep `DATA_DIR/join.token` current while the controller runs: written at start, and again
/// within a second of the token's rotation being applied here. Nothing without TLS.
pub async fn keep_token_file(node: Arc<RaftNode>, data_dir: std::path::PathBuf) {
    let mut last = None;
    loop {
        let salt = node.store().read().member_join_salt.clone();
        if last.as_ref() != Some(&salt) {
            match node.credentials().member_token(&salt) {
                Ok(None) => return,
                Ok(Some(token)) => match write_token_file(&data_dir, &token) {
                    Ok(()) => last = Some(salt),
                    Err(e) => tracing::warn!(error = %format!("{e:#}"), "writing join.token"),
                },
                Err(e) => tracing::warn!(error = %format!("{e:#}"), "making the join token"),
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Once serving: have the leader (through any of `peers`) add this controller as a learner,
/// catch it up and promote it, then wait until it has applied every committed write. A
/// controller that cannot become a member stops: it serves nothing useful.
pub async fn become_member(
    node: Arc<RaftNode>,
    credentials: Arc<crate::credentials::Credentials>,
    peers: Vec<String>,
    started: Instant,
) {
    let added =
        crate::rebuild::ask_to_add(&credentials, &peers, node.id, &node.addr, "joining").await;
    if let Err(e) = added {
        tracing::error!(error = %format!("{e:#}"), "joining the cluster failed");
        std::process::exit(1);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while let Err(e) = node.linearize().await {
        if tokio::time::Instant::now() >= deadline {
            tracing::error!(error = %e, "joined, but not caught up after 300 s");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tracing::info!(
        id = node.id,
        ms = started.elapsed().as_millis() as u64,
        applied = node.member_status().applied_index,
        "joined the cluster: caught up and a voter"
    );
}

/// The CA certificate the controller at `addr` serves (`Cluster.ClusterCa`), over a TLS
/// connection whose certificate is not checked: the answer is only used if its hash is the
/// token's, and nothing secret is sent on it.
async fn fetch_ca(addr: &str) -> Result<String, Attempt> {
    let config = Arc::new(unverified_client_config().map_err(Attempt::Fatal)?);
    let host = crate::tls::host_of(addr).to_string();
    let target = addr.to_string();
    let connector = tower::service_fn(move |_: http::Uri| {
        let (config, host, target) = (config.clone(), host.clone(), target.clone());
        async move {
            let tcp = tokio::net::TcpStream::connect(&target).await?;
            tcp.set_nodelay(true)?;
            let name = rustls::pki_types::ServerName::try_from(host)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
        }
    });
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| Attempt::Fatal(e.into()))?
        .connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(10))
        .connect_with_connector(connector)
        .await
        .map_err(|e| Attempt::Retry(format!("{addr}: {}", error_chain(&e))))?;
    match ClusterClient::new(channel)
        .cluster_ca(ClusterCaRequest {})
        .await
    {
        Ok(r) => Ok(r.into_inner().ca_cert_pem),
        Err(e) if e.code() == tonic::Code::Unavailable => {
            Err(Attempt::Retry(format!("{addr}: {}", e.message())))
        }
        Err(e) => Err(Attempt::Fatal(anyhow::anyhow!(
            "the controller at {addr} did not give its CA certificate: {}",
            e.message()
        ))),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// A TLS client that checks the handshake's signatures but not who signed the certificate.
fn unverified_client_config() -> anyhow::Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_urls() {
        assert_eq!(parse_url("https://10.0.0.1:7400").unwrap(), "10.0.0.1:7400");
        assert_eq!(parse_url("https://a.lan:7400/").unwrap(), "a.lan:7400");
        assert_eq!(parse_url("127.0.0.1:7400").unwrap(), "127.0.0.1:7400");
        assert_eq!(parse_url("https://[::1]:7400").unwrap(), "[::1]:7400");
        let e = parse_url("http://10.0.0.1:7400").unwrap_err().to_string();
        assert!(e.contains("needs TLS"), "{e}");
        for bad in [
            "https://host",
            "https://:7400",
            "https://h:0",
            "https://h:1/x",
            "",
        ] {
            assert!(parse_url(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn credentials_are_replaced_whole_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x");
        replace_private(&path, "one").unwrap();
        replace_private(&path, "two").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(!path.with_extension("tmp").exists());
    }
}
