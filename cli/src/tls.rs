//! TLS towards the controllers: the cluster CA tbctl verifies them with (`--ca-cert`, else
//! `$TB_CA_CERT`, else the context's `ca-cert`, which `tbctl login --ca-cert` and `tbctl up`
//! set), and failures told in words: a handshake refused for a certificate from another CA names
//! the CA file to check. Without a CA tbctl speaks plain TCP, which only a controller started
//! with `--insecure` accepts.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use tb_api::tls_failure::{TlsFailure, classify};
use tonic::transport::{Certificate, ClientTlsConfig};

/// The CA to verify controllers with, and the file it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trust {
    pub pem: String,
    pub path: PathBuf,
}

impl Trust {
    /// Read a CA certificate (PEM).
    pub fn load(path: &Path) -> Result<Trust> {
        let pem = std::fs::read_to_string(path)
            .with_context(|| format!("reading the CA certificate {}", path.display()))?;
        if !pem.contains("-----BEGIN CERTIFICATE-----") {
            bail!("{}: not a PEM certificate", path.display());
        }
        Ok(Trust {
            pem,
            path: path.to_path_buf(),
        })
    }

    pub fn client_config(&self) -> ClientTlsConfig {
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.pem))
    }
}

/// Whether `message` (from [`explain`]) is a TLS handshake refused for good: a certificate
/// the CA does not vouch for, or a server without TLS.
pub fn is_handshake_failure(message: &str) -> bool {
    message.starts_with("TLS handshake with ")
}

/// Why a connection to `addr` failed, from the error's whole chain (`chain`), in words that say
/// what to check when TLS is the cause.
pub fn explain(addr: &str, chain: &str, trust: Option<&Trust>) -> String {
    match (classify(chain, trust.is_some()), trust) {
        (Some(TlsFailure::UnknownIssuer), Some(t)) => format!(
            "TLS handshake with {addr} failed: certificate not signed by the CA in {} — is \
             --ca-cert this cluster's CA?",
            t.path.display()
        ),
        (Some(TlsFailure::NameMismatch), _) => format!(
            "TLS handshake with {addr} failed: the controller's certificate does not name \
             this address (connect by its --advertise host, or add the name with its \
             --tls-san)"
        ),
        (Some(TlsFailure::Expired), _) => {
            format!("TLS handshake with {addr} failed: a certificate has expired ({chain})")
        }
        (Some(TlsFailure::PeerNotTls), _) => format!(
            "TLS handshake with {addr} failed: the controller does not speak TLS (started \
             with --insecure?); drop --ca-cert/TB_CA_CERT to talk plain TCP"
        ),
        (Some(TlsFailure::PeerWantsTls), _) => format!(
            "{chain} (tbctl has no CA and speaks plain TCP; controllers serve TLS unless \
             --insecure: pass the cluster's CA with --ca-cert FILE, TB_CA_CERT or `tbctl \
             login --ca-cert FILE`)"
        ),
        _ => chain.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_foreign_ca_names_the_file() {
        let t = Trust {
            pem: String::new(),
            path: "/x/ca.pem".into(),
        };
        let m = explain(
            "127.0.0.1:7400",
            "transport error: invalid peer certificate: UnknownIssuer",
            Some(&t),
        );
        assert_eq!(
            m,
            "TLS handshake with 127.0.0.1:7400 failed: certificate not signed by the CA in \
             /x/ca.pem — is --ca-cert this cluster's CA?"
        );
    }

    #[test]
    fn plain_tcp_failures_hint_at_the_ca() {
        let m = explain("h:1", "h2 protocol error: http2 error", None);
        assert!(m.contains("--ca-cert"), "{m}");
        let m = explain(
            "h:1",
            "transport error: Connection refused (os error 111)",
            None,
        );
        assert!(!m.contains("--ca-cert"), "{m}");
    }
}
