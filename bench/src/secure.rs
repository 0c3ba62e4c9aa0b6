//! How the benchmarks reach a tb cluster the way every client does: over TLS, trusting the
//! cluster CA, with the admin's bearer token on every call. The clusters run the controller's
//! defaults: a lone controller makes its CA (`DATA_DIR/ca.pem`) and writes the admin token to
//! `DATA_DIR/admin.token`; the members of a 3-member cluster are given, in their data dirs, the
//! same CA and cluster secret (what an admin copies from `tb-controller init-ca`), and the member
//! that bootstraps the admin writes `admin.token` in its own. No token goes on a command line
//! or over plain TCP.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// The file a new cluster's admin token is written to, in the data dir.
pub const ADMIN_TOKEN_FILE: &str = tb_controller::server::ADMIN_TOKEN_FILE;
/// The cluster CA's certificate, in the data dir.
pub const CA_CERT_FILE: &str = tb_controller::tls::CA_CERT_FILE;
/// The cluster secret controllers present to each other, in the data dir.
pub const CLUSTER_SECRET_FILE: &str = "cluster.secret";

/// Write a file only its owner may read (0600).
pub fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 600 {}", path.display()))
}

/// Give every one of `data_dirs` (created 0700 when missing) the same new cluster CA (`ca.pem`,
/// `ca.key`) and cluster secret, as an admin does for the members of a new cluster. Returns the
/// CA certificate (PEM).
pub fn seed_data_dirs(data_dirs: &[PathBuf]) -> anyhow::Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let ca = tb_controller::tls::Ca::create()?;
    let secret = tb_controller::auth::secret(tb_controller::auth::CLUSTER_SECRET_PREFIX);
    for dir in data_dirs {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("chmod 700 {}", dir.display()))?;
        ca.save(dir)?;
        write_private(&dir.join(CLUSTER_SECRET_FILE), &format!("{secret}\n"))?;
    }
    Ok(ca.cert_pem().to_string())
}

/// A lazily connecting TLS channel to `addr` (`HOST:PORT`) that trusts the CA `ca_pem`, with
/// the same settings as the plain [`crate::backend::channel`] (so TLS is the only difference).
pub fn tls_channel(addr: &str, ca_pem: &str) -> anyhow::Result<Channel> {
    tls_channel_as(addr, ca_pem, None)
}

/// [`tls_channel`], presenting the client certificate `identity` (certificate and key, PEM)
/// when given.
pub fn tls_channel_as(
    addr: &str,
    ca_pem: &str,
    identity: Option<&tb_controller::tls::CertifiedKey>,
) -> anyhow::Result<Channel> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem));
    if let Some(id) = identity {
        tls = tls.identity(tonic::transport::Identity::from_pem(
            &id.cert_pem,
            &id.key_pem,
        ));
    }
    Ok(Endpoint::from_shared(format!("https://{addr}"))
        .with_context(|| format!("endpoint {addr}"))?
        .tls_config(tls)
        .with_context(|| format!("TLS settings for {addr}"))?
        .connect_timeout(Duration::from_millis(500))
        .tcp_nodelay(true)
        .connect_lazy())
}

/// Read `dir/ca.pem` once it exists (a lone controller writes it at start), up to `timeout`.
pub async fn wait_for_ca(dir: &Path, timeout: Duration) -> anyhow::Result<String> {
    let path = dir.join(CA_CERT_FILE);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Ok(pem) = std::fs::read_to_string(&path)
            && pem.contains("END CERTIFICATE")
        {
            return Ok(pem);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{} did not appear within {timeout:?}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The admin's token, read from whichever of the members' data dirs holds `admin.token` (the
/// member that bootstrapped the admin writes it once the cluster has a leader). Until it is
/// found, calls go without one (and the controller refuses them as unauthenticated, which the
/// benchmarks' health checks treat as "not ready yet").
#[derive(Clone)]
pub struct AdminToken {
    value: Arc<OnceLock<MetadataValue<Ascii>>>,
    files: Arc<Vec<PathBuf>>,
}

impl AdminToken {
    /// The token in `DIR/admin.token` for the first of `data_dirs` that has one.
    pub fn from_data_dirs(data_dirs: &[PathBuf]) -> Self {
        AdminToken {
            value: Arc::new(OnceLock::new()),
            files: Arc::new(data_dirs.iter().map(|d| d.join(ADMIN_TOKEN_FILE)).collect()),
        }
    }

    /// The `authorization` header value, once the token file has been found.
    pub fn header(&self) -> Option<&MetadataValue<Ascii>> {
        if let Some(v) = self.value.get() {
            return Some(v);
        }
        let token = self.files.iter().find_map(|f| {
            let t = std::fs::read_to_string(f).ok()?;
            let t = t.trim();
            t.starts_with(tb_controller::auth::USER_TOKEN_PREFIX)
                .then(|| t.to_string())
        })?;
        let value = format!("Bearer {token}").parse().ok()?;
        Some(self.value.get_or_init(|| value))
    }

    /// Wait until the token file is there, up to `timeout`.
    pub async fn wait(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.header().is_none() {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "no admin token in {:?} within {timeout:?}",
                self.files
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
}

impl tonic::service::Interceptor for AdminToken {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = self.header() {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// A channel that adds the admin's token to every call.
pub type AdminChannel = InterceptedService<Channel, AdminToken>;

/// `channel` with the admin's token on every call.
pub fn as_admin(channel: Channel, token: &AdminToken) -> AdminChannel {
    InterceptedService::new(channel, token.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_read_from_whichever_data_dir_has_it() {
        let tmp = tempfile::tempdir().expect("a temp dir");
        let dirs: Vec<PathBuf> = (1..=3).map(|i| tmp.path().join(format!("m{i}"))).collect();
        let ca = seed_data_dirs(&dirs).expect("seeded");
        assert!(ca.contains("BEGIN CERTIFICATE"));
        let secrets: Vec<String> = dirs
            .iter()
            .map(|d| std::fs::read_to_string(d.join(CLUSTER_SECRET_FILE)).expect("a secret"))
            .collect();
        assert!(
            secrets.iter().all(|s| s == &secrets[0]),
            "one secret for all"
        );
        let token = AdminToken::from_data_dirs(&dirs);
        assert!(token.header().is_none(), "no token file yet");
        std::fs::write(dirs[2].join(ADMIN_TOKEN_FILE), "tbuser-abc\n").expect("written");
        assert_eq!(
            token
                .header()
                .map(|v| v.to_str().unwrap_or_default().to_string()),
            Some("Bearer tbuser-abc".to_string())
        );
    }
}
