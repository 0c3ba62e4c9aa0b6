//! Forwarding one request to a service's rank 0 and streaming its answer back.
//!
//! The request goes only to the address this controller's store names for that service
//! ([`super::backend`]) — never to a host or URL taken from the request — and the caller's tb
//! token is not passed on: rank 0 is given the service's own API key instead, over HTTPS when
//! rank 0 serves it (with TLS on), and only once it showed the certificate the controllers
//! issued for that service. While the service has no ready backend, or its backend refuses the
//! request (cannot be reached, or answers 503 because a stage is gone), the request waits —
//! up to the listener's bound — for tb to place the service again, and is then sent to the new
//! rank 0: a client's single request rides through a re-placement. The answer's body is passed
//! through frame by frame, so server-sent events arrive as rank 0 writes them.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tb_api::ObjectKey;
use tokio::time::Instant;

use super::backend::{self, Backend, Rank0};
use crate::raft::RaftNode;

/// How often a waiting request looks at the store again.
const POLL: Duration = Duration::from_millis(100);
/// Connecting to rank 0 (on the Macs' network) takes no longer than this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A request to forward (its body kept whole, to be sent again to a new backend).
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub method: Method,
    /// `/v1/...` with the query.
    pub path_and_query: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Why one attempt to forward failed before any answer came.
#[derive(Debug, thiserror::Error)]
enum Attempt {
    #[error("connecting to rank 0 at {0}: {1}")]
    Connect(SocketAddr, String),
    #[error("rank 0 at {0}: {1}")]
    Http(SocketAddr, String),
    #[error("rank 0 at {0} is not ready (503)")]
    Unavailable(SocketAddr),
    #[error("the service moved away from {0} while its answer was awaited")]
    Moved(SocketAddr),
}

/// Forwards `out` to the service's ready rank 0, waiting up to `wait` for one.
pub async fn forward(node: &RaftNode, key: &ObjectKey, wait: Duration, out: Outgoing) -> Response {
    let started = Instant::now();
    let deadline = started + wait;
    let mut last = String::new();
    loop {
        match backend::lookup(node, key) {
            Backend::Gone => {
                return super::error(
                    StatusCode::NOT_FOUND,
                    "service_not_found",
                    &format!(
                        "InferenceService {:?} in namespace {:?} was deleted",
                        key.name, key.namespace
                    ),
                );
            }
            Backend::NotReady(why) => last = format!("it is not ready: {why}"),
            Backend::Ready(rank0) => match attempt(node, key, &rank0, &out).await {
                Ok(response) => {
                    if !last.is_empty() {
                        tracing::info!(
                            service = %format!("{}/{}", key.namespace, key.name),
                            waited_ms = started.elapsed().as_millis() as u64,
                            addr = %rank0.addr,
                            "forwarded after waiting for a ready backend"
                        );
                    }
                    return response;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "forwarding failed; waiting for a backend");
                    last = e.to_string();
                }
            },
        }
        let now = Instant::now();
        if now >= deadline {
            return super::unavailable(&format!(
                "InferenceService {:?} in namespace {:?} has no ready backend after {:.0?}: {last}",
                key.name, key.namespace, wait
            ));
        }
        tokio::time::sleep(POLL.min(deadline - now)).await;
    }
}

/// Hop-by-hop headers, which concern one connection and are not forwarded either way.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn forwardable(name: &HeaderName) -> bool {
    !HOP_BY_HOP.contains(&name.as_str())
        && name != header::HOST
        // The caller's tb token stays with the controller: rank 0 runs on a Mac as a job.
        && name != header::AUTHORIZATION
}

/// One attempt at `addr`: the answer, unless rank 0 could not be reached, failed before
/// answering, answered 503, or the store moved the service elsewhere meanwhile.
async fn attempt(
    node: &RaftNode,
    key: &ObjectKey,
    rank0: &Rank0,
    out: &Outgoing,
) -> Result<Response, Attempt> {
    let addr = rank0.addr;
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| Attempt::Connect(addr, format!("no answer in {CONNECT_TIMEOUT:?}")))?
        .map_err(|e| Attempt::Connect(addr, e.to_string()))?;
    let _ = stream.set_nodelay(true);
    let mut sender = if rank0.https {
        // Rank 0 must show the certificate the controllers issued for this service: a process
        // that took its port after it ended gets neither the key nor the request.
        let name = tb_api::https::service_server_name(&key.namespace, &key.name);
        let config = node
            .credentials()
            .services_client()
            .map_err(|e| Attempt::Connect(addr, e))?
            .ok_or_else(|| {
                Attempt::Connect(
                    addr,
                    "its endpoint is HTTPS but this controller has no CA".into(),
                )
            })?;
        // As bounded as the connect: a Mac lost mid-handshake must not hold the request past
        // the time tb takes to place the service again.
        let tls = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tb_api::https::connect(stream, &name, config),
        )
        .await
        .map_err(|_| Attempt::Connect(addr, format!("no TLS handshake in {CONNECT_TIMEOUT:?}")))?
        .map_err(|e| Attempt::Connect(addr, format!("TLS for {name}: {e}")))?;
        open(TokioIo::new(tls), addr).await?
    } else {
        open(TokioIo::new(stream), addr).await?
    };
    let mut request = http::Request::builder()
        .method(out.method.clone())
        .uri(out.path_and_query.as_str());
    if let Some(headers) = request.headers_mut() {
        for (name, value) in out.headers.iter().filter(|(n, _)| forwardable(n)) {
            headers.append(name.clone(), value.clone());
        }
        if let Ok(host) = HeaderValue::from_str(&addr.to_string()) {
            headers.insert(header::HOST, host);
        }
        // The service's own key (derived, never the caller's token): rank 0 takes no other.
        if let Some(value) = rank0
            .api_key
            .as_ref()
            .and_then(|k| HeaderValue::from_str(&format!("Bearer {k}")).ok())
        {
            headers.insert(header::AUTHORIZATION, value);
        }
    }
    let request = request
        .body(Full::new(out.body.clone()))
        .map_err(|e| Attempt::Http(addr, e.to_string()))?;
    // A Mac that drops off the network leaves the connection silent: stop waiting once the
    // store names another backend (or none).
    let moved = async {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if !matches!(backend::lookup(node, key), Backend::Ready(r) if r.addr == addr) {
                return;
            }
        }
    };
    let answer = tokio::select! {
        r = sender.send_request(request) => r.map_err(|e| Attempt::Http(addr, e.to_string()))?,
        () = moved => return Err(Attempt::Moved(addr)),
    };
    if answer.status() == StatusCode::SERVICE_UNAVAILABLE {
        return Err(Attempt::Unavailable(addr));
    }
    let (mut parts, incoming) = answer.into_parts();
    let names: Vec<HeaderName> = parts.headers.keys().cloned().collect();
    for name in names {
        if HOP_BY_HOP.contains(&name.as_str()) {
            parts.headers.remove(&name);
        }
    }
    Ok(Response::from_parts(parts, Body::new(incoming)))
}

/// An HTTP/1.1 connection over `io` to rank 0 at `addr`; the connection runs in a task of its
/// own, as it carries the answer's body after the request's handler returns.
async fn open<T>(io: TokioIo<T>, addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>, Attempt>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| Attempt::Http(addr, e.to_string()))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(%addr, error = %e, "connection to rank 0 ended");
        }
    });
    Ok(sender)
}
