//! The nodelet's TLS: the cluster CA it trusts the controllers with (`--ca-cert`, else the copy
//! kept at join), and the node certificate the controllers issued at join (`node.pem`,
//! `node.key` mode 0600, next to the credential), which its `Nodelet` service is served with.
//! That service accepts only clients presenting a certificate from the same CA: controllers.

use std::path::Path;
use tb_api::tls_failure::{TlsFailure, classify};

use anyhow::Context;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// The CA the nodelet trusts, and where it was read from (for messages): tb-client's, which
/// dials the controllers with it.
pub use tb_client::Trust;

const CA_FILE: &str = "ca.pem";
const CERT_FILE: &str = "node.pem";
const KEY_FILE: &str = "node.key";

fn read_ca(path: &Path) -> anyhow::Result<Trust> {
    let ca_pem = std::fs::read_to_string(path)
        .with_context(|| format!("reading the cluster CA {}", path.display()))?;
    Ok(Trust::from_pem(ca_pem, path)?)
}

/// Why a nodelet without a CA does not start: where to get one, and what `--insecure` means.
pub fn no_ca_message(controllers: &[String]) -> String {
    let first = controllers
        .first()
        .map(String::as_str)
        .unwrap_or("HOST:PORT");
    format!(
        "no CA configured for https://{first}: pass --ca-cert FILE (a controller's \
         DATA_DIR/ca.pem) or set TB_CA_CERT; --insecure sends the join token and the node's \
         credential in clear text"
    )
}

/// The CA to trust: `--ca-cert`, else the one kept in the data dir at join; None: plain TCP.
pub fn trust(ca_cert: Option<&Path>, data_dir: &Path) -> anyhow::Result<Option<Trust>> {
    if let Some(p) = ca_cert {
        return read_ca(p).map(Some);
    }
    let kept = data_dir.join(CA_FILE);
    if kept.exists() {
        return read_ca(&kept).map(Some);
    }
    Ok(None)
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    use std::io::Write;
    let mut f = opts
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// Keep what a join answered: the node's certificate and key, and the CA. Nothing when the
/// controller sent none (it runs without TLS).
pub fn save(data_dir: &Path, cert_pem: &str, key_pem: &str, ca_pem: &str) -> anyhow::Result<()> {
    if cert_pem.is_empty() || key_pem.is_empty() {
        return Ok(());
    }
    write_private(&data_dir.join(KEY_FILE), key_pem)?;
    write_private(&data_dir.join(CERT_FILE), cert_pem)?;
    if !ca_pem.is_empty() {
        write_private(&data_dir.join(CA_FILE), ca_pem)?;
    }
    Ok(())
}

/// How the `Nodelet` service is served: with the node's certificate, to clients with a
/// certificate from `trust`'s CA. None: no certificate was issued (plain TCP).
pub fn server_config(data_dir: &Path, trust: &Trust) -> anyhow::Result<Option<ServerTlsConfig>> {
    let cert_path = data_dir.join(CERT_FILE);
    let key_path = data_dir.join(KEY_FILE);
    let cert = match std::fs::read_to_string(&cert_path) {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", cert_path.display())),
    };
    let key = std::fs::read_to_string(&key_path)
        .with_context(|| format!("reading {}", key_path.display()))?;
    Ok(Some(
        ServerTlsConfig::new()
            .identity(Identity::from_pem(cert, key))
            .client_ca_root(Certificate::from_pem(&trust.pem)),
    ))
}

/// A readable reason for a failed connection to a controller: TLS failures say what to check.
pub fn explain(error: &(dyn std::error::Error + 'static), trust: Option<&Trust>) -> String {
    let chain = tb_client::connect::error_chain(error);
    match (classify(&chain, trust.is_some()), trust) {
        (Some(TlsFailure::UnknownIssuer), Some(t)) => format!(
            "TLS handshake failed: certificate not signed by the CA in {} — is --ca-cert this cluster's CA? ({chain})",
            t.path.display()
        ),
        (Some(TlsFailure::NameMismatch), _) => format!(
            "TLS handshake failed: the controller's certificate does not name the address dialled (see its --advertise and --tls-san) ({chain})"
        ),
        (Some(TlsFailure::PeerNotTls), _) => {
            format!(
                "TLS handshake failed: the controller does not speak TLS (--insecure?) ({chain})"
            )
        }
        (Some(TlsFailure::PeerWantsTls), _) => format!(
            "{chain} (without --ca-cert the nodelet speaks plain TCP; controllers serve TLS unless --insecure)"
        ),
        _ => chain,
    }
}
