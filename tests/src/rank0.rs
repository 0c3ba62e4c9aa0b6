//! Requests to rank 0 of a built-in service at its own endpoint (`status.endpoint`), made as
//! the controllers' forwarder makes them: over HTTPS checking the certificate the controllers
//! issued for that service (with the harness's CA) when the endpoint is `https`, and with the
//! service's API key when one is given. One HTTP/1.0 request per connection.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How long one request may take: a debug build decoding on a machine running every other test
/// at once has taken minutes for a batch of answers. A guard, not a measurement.
const REQUEST_BOUND: Duration = Duration::from_secs(300);

/// A client of one service's rank 0.
#[derive(Clone)]
pub struct Rank0 {
    addr: String,
    tls: Option<(String, Arc<tokio_rustls::rustls::ClientConfig>)>,
    key: Option<String>,
}

impl Rank0 {
    /// Rank 0 of InferenceService `namespace/service` at `endpoint` (`http(s)://IP:PORT/v1`),
    /// with no key.
    pub fn new(endpoint: &str, namespace: &str, service: &str) -> Rank0 {
        let (rest, https) = match endpoint.strip_prefix("https://") {
            Some(rest) => (rest, true),
            None => (
                endpoint
                    .strip_prefix("http://")
                    .unwrap_or_else(|| panic!("{endpoint:?} is not an http(s) URL")),
                false,
            ),
        };
        let addr = rest.trim_end_matches("/v1").to_string();
        let tls = https.then(|| {
            let config =
                tb_api::https::client_config(&crate::auth::ca_cert_pem()).expect("the harness CA");
            (
                tb_api::https::service_server_name(namespace, service),
                config,
            )
        });
        Rank0 {
            addr,
            tls,
            key: None,
        }
    }

    /// The same rank 0, asked with `key` (or none).
    pub fn with_key(&self, key: Option<&str>) -> Rank0 {
        Rank0 {
            key: key.map(str::to_string),
            ..self.clone()
        }
    }

    /// `IP:PORT`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether the endpoint is HTTPS.
    pub fn is_https(&self) -> bool {
        self.tls.is_some()
    }

    /// One request: (status, body), or why there is none.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> std::io::Result<(u16, String)> {
        let body = body.map(Value::to_string).unwrap_or_default();
        let authorization = self
            .key
            .as_ref()
            .map_or_else(String::new, |k| format!("Authorization: Bearer {k}\r\n"));
        let head = format!(
            "{method} {path} HTTP/1.0\r\nHost: {}\r\n{authorization}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.addr,
            body.len()
        );
        let exchange = async {
            let tcp = tokio::net::TcpStream::connect(&self.addr).await?;
            let raw = match &self.tls {
                Some((name, config)) => {
                    let tls = tb_api::https::connect(tcp, name, config.clone()).await?;
                    exchange(tls, &head, &body).await?
                }
                None => exchange(tcp, &head, &body).await?,
            };
            Ok(split_response(&raw))
        };
        tokio::time::timeout(REQUEST_BOUND, exchange)
            .await
            .unwrap_or_else(|_| {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer from {} in {REQUEST_BOUND:?}", self.addr),
                ))
            })
    }
}

/// An HTTP/1.x answer's status code (0 when there is none) and body.
pub fn split_response(raw: &str) -> (u16, String) {
    let status = raw.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = raw.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
    (status, body)
}

/// Writes the request and reads the answer to its end. A server that closes TLS without
/// saying so ends the read with an error after the answer: what came is kept.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    head: &str,
    body: &str,
) -> std::io::Result<String> {
    s.write_all(head.as_bytes()).await?;
    s.write_all(body.as_bytes()).await?;
    s.flush().await?;
    let mut raw = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match s.read(&mut chunk).await {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => break,
            Err(e) => return Err(e),
        }
    }
    Ok(String::from_utf8_lossy(&raw).into_owned())
}
