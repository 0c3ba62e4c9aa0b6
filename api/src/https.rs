//! HTTPS with the cluster CA (feature `https`): TLS on accepted connections for axum — the
//! controllers' services listener and rank 0 of a built-in service serve through it — and the
//! client side, which trusts the cluster CA alone and checks the name the server's certificate
//! must carry ([`service_server_name`] for a service's rank 0).
//!
//! Accepted connections are handshaken in tasks of their own (a slow or silent client holds up
//! no one) and handed to axum once TLS is up.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_rustls::{TlsAcceptor, TlsConnector, client, rustls};

/// A client has this long to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for axum to take them.
const BACKLOG: usize = 64;

/// What went wrong setting TLS up.
#[derive(Debug, thiserror::Error)]
pub enum HttpsError {
    #[error("{what}: {detail}")]
    Pem { what: String, detail: String },
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
}

/// The DNS name the certificate of rank 0 of InferenceService `namespace/name` carries, and
/// the only one its callers accept: a certificate for one service cannot serve as another's,
/// even on the same Mac. A hash, since a name and namespace together may exceed DNS's limits.
pub fn service_server_name(namespace: &str, name: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{namespace}/{name}").as_bytes());
    format!("s{}.isvc.tb", hex::encode(&digest[..10]))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server configuration for a certificate chain and key (PEM), HTTP/1.1 only; `what` names
/// them in errors.
pub fn server_config(
    cert_pem: &str,
    key_pem: &str,
    what: &str,
) -> Result<Arc<ServerConfig>, HttpsError> {
    let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| HttpsError::Pem {
            what: format!("{what}'s certificate"),
            detail: e.to_string(),
        })?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| HttpsError::Pem {
        what: format!("{what}'s key"),
        detail: e.to_string(),
    })?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A client configuration that trusts the CA certificate(s) in `ca_pem` alone.
pub fn client_config(ca_pem: &str) -> Result<Arc<ClientConfig>, HttpsError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| HttpsError::Pem {
            what: "the cluster CA".into(),
            detail: e.to_string(),
        })?;
        roots.add(cert)?;
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// TLS over `tcp`, verified with `config` for `server_name`.
pub async fn connect(
    tcp: TcpStream,
    server_name: &str,
    config: Arc<ClientConfig>,
) -> std::io::Result<client::TlsStream<TcpStream>> {
    let name = ServerName::try_from(server_name.to_string())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        TlsConnector::from(config).connect(name, tcp),
    )
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out"))?
}

/// Connections with TLS up, for `axum::serve`.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: std::io::Result<SocketAddr>,
}

impl TlsListener {
    /// Starts accepting on `listener` (until the process ends).
    pub fn new(listener: TcpListener, config: Arc<ServerConfig>) -> TlsListener {
        let local = listener.local_addr();
        let (tx, ready) = mpsc::channel(BACKLOG);
        let acceptor = TlsAcceptor::from(config);
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of descriptors and the like: wait, as axum's own listener does.
                        tracing::warn!(error = %e, "HTTPS listener: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        TlsListener { ready, local }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accepting task ended (never, while the process runs): serve nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        match &self.local {
            Ok(a) => Ok(*a),
            Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_are_dns_names_and_differ_by_service() {
        let a = service_server_name("default", "chat");
        assert!(ServerName::try_from(a.clone()).is_ok(), "{a}");
        assert_eq!(a, service_server_name("default", "chat"));
        assert_ne!(a, service_server_name("team", "chat"));
        assert_ne!(a, service_server_name("default", "chat2"));
        let long = "a".repeat(63);
        let longest = format!("{long}.{long}.{long}.{}", "b".repeat(61));
        let n = service_server_name(&long, &longest);
        assert!(ServerName::try_from(n.clone()).is_ok(), "{n}");
    }
}
