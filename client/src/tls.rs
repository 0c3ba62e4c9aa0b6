//! TLS towards the controllers: the cluster CA a client verifies them with, and failures told
//! in words: a handshake refused for a certificate from another CA names the CA file to check.
//! Without a CA a client speaks plain TCP, which only a controller started with `--insecure`
//! accepts; a bearer token then goes nowhere unless the user said `--insecure` too
//! ([`token_refused_in_clear`]).

use std::path::{Path, PathBuf};

use tb_api::tls_failure::{TlsFailure, classify};
use tonic::transport::{Certificate, ClientTlsConfig};

/// A CA certificate that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("reading the CA certificate {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a PEM certificate", path.display())]
    NotPem { path: PathBuf },
}

/// The one rule for secrets over plain TCP: a client holding a token (a user's, a join token,
/// a node's credential) and no CA to verify the controllers with sends nothing unless it was
/// told `--insecure`. tbctl checks it before every call; the nodelet before it starts.
pub fn token_refused_in_clear(has_token: bool, has_ca: bool, insecure: bool) -> bool {
    has_token && !has_ca && !insecure
}

/// The CA to verify controllers with, and the file it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trust {
    pub pem: String,
    pub path: PathBuf,
}

impl Trust {
    /// Read a CA certificate (PEM).
    pub fn load(path: &Path) -> Result<Trust, TrustError> {
        let pem = std::fs::read_to_string(path).map_err(|source| TrustError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Trust::from_pem(pem, path)
    }

    /// A CA certificate already read from `path` (named in messages).
    pub fn from_pem(pem: String, path: &Path) -> Result<Trust, TrustError> {
        if !pem.contains("-----BEGIN CERTIFICATE-----") {
            return Err(TrustError::NotPem {
                path: path.to_path_buf(),
            });
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
    fn a_token_goes_in_clear_only_when_insecure() {
        assert!(token_refused_in_clear(true, false, false));
        assert!(!token_refused_in_clear(true, false, true));
        assert!(!token_refused_in_clear(true, true, false));
        assert!(!token_refused_in_clear(false, false, false));
    }

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
