//! Rank 0 of a built-in service: its endpoint, and whether it answers (`GET /health`),
//! reported in the allocation's status whenever that changes.

use std::sync::Arc;
use std::time::Duration;

use tb_api::https::service_server_name;
use tb_api::specs::{AllocationSpec, AllocationStatus, Executor};
use tokio_rustls::rustls::ClientConfig;

use super::report::report;
use crate::agent::controllers::Controllers;

/// How often rank 0 of a built-in service is asked whether it is ready.
pub(super) const READINESS_EVERY: Duration = Duration::from_secs(1);
/// How often while it is not: a service placed again after a lost Mac is waited for by its
/// clients, so its readiness is noticed within a tenth of a second (a loopback GET).
const NOT_READY_EVERY: Duration = Duration::from_millis(100);

/// How the nodelet asks rank 0 `GET /health`: at its address, over TLS checking the service's
/// certificate when rank 0 serves HTTPS.
pub(super) struct Probe {
    addr: String,
    tls: Option<(String, Arc<ClientConfig>)>,
}

/// Rank 0 of a built-in service: (endpoint URL, its health probe). `tls`: the client
/// configuration when rank 0 serves HTTPS with the service's certificate.
pub(super) fn endpoint_of(
    spec: &AllocationSpec,
    namespace: &str,
    tls: Option<Arc<ClientConfig>>,
) -> Option<(String, Probe)> {
    let b = spec.builtin.as_ref()?;
    if spec.executor != Executor::Builtin || spec.rank != 0 {
        return None;
    }
    let host = b.hosts.first()?;
    let port = b.endpoint_port?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let probe = Probe {
        addr: format!("{host}:{port}"),
        tls: tls.map(|c| (service_server_name(namespace, &spec.job.name), c)),
    };
    Some((format!("{scheme}://{host}:{port}/v1"), probe))
}

/// How much the observed decode speed must move before it is reported again, and how often at
/// most: the status is a Raft write.
const OBSERVED_CHANGE: f64 = 0.1;
const OBSERVED_EVERY: Duration = Duration::from_secs(30);

/// Reports the endpoint of a running rank 0 of a built-in service, each change of its
/// readiness (`GET /health`), and its observed decode speed (with the context it was seen at)
/// when that moved by a tenth (at most every 30 s), until aborted when the process ends.
pub(super) async fn watch_readiness(
    controllers: Arc<Controllers>,
    namespace: String,
    name: String,
    running: AllocationStatus,
    endpoint: String,
    probe: Probe,
) {
    let mut last: Option<bool> = None;
    let mut reported: Option<Seen> = None;
    let mut rate_reported_at = tokio::time::Instant::now();
    loop {
        let (ready, seen) = match check(&probe).await {
            Some(h) => (true, h),
            None => (false, None),
        };
        let rate_moved = match (seen, reported) {
            (Some(new), Some(old)) => {
                (new.rate - old.rate).abs() > OBSERVED_CHANGE * old.rate
                    && rate_reported_at.elapsed() >= OBSERVED_EVERY
            }
            (Some(_), None) => true,
            _ => false,
        };
        if last != Some(ready) || rate_moved {
            if rate_moved {
                reported = seen;
                rate_reported_at = tokio::time::Instant::now();
            }
            let status = AllocationStatus {
                endpoint: endpoint.clone(),
                ready,
                observed_tokens_per_second: reported.map(|s| s.rate),
                observed_context_tokens: reported.and_then(|s| s.context_tokens),
                ..running.clone()
            };
            report(&controllers, &namespace, &name, &status).await;
            if last != Some(ready) {
                tracing::info!(alloc = %format!("{namespace}/{name}"), %endpoint, ready, "endpoint readiness");
            }
            last = Some(ready);
        }
        let every = if ready {
            READINESS_EVERY
        } else {
            NOT_READY_EVERY
        };
        tokio::time::sleep(every).await;
    }
}

/// What rank 0 reports of its streams: decode tokens/s, and the context they held.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Seen {
    rate: f64,
    context_tokens: Option<u32>,
}

/// One `GET /health`: `Some` when it answered 200, with what it observed.
async fn check(probe: &Probe) -> Option<Option<Seen>> {
    let ask = async {
        let tcp = tokio::net::TcpStream::connect(&probe.addr).await.ok()?;
        match &probe.tls {
            Some((name, config)) => {
                let tls = tb_api::https::connect(tcp, name, config.clone())
                    .await
                    .ok()?;
                health(tls, &probe.addr).await
            }
            None => health(tcp, &probe.addr).await,
        }
    };
    tokio::time::timeout(Duration::from_secs(2), ask)
        .await
        .ok()
        .flatten()
}

async fn health<S>(mut s: S, addr: &str) -> Option<Option<Seen>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(format!("GET /health HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    // The answer is small; more than this is not rank 0's. A peer that closes TLS without
    // saying so ends the read with an error after the answer: what came is kept.
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    while reply.len() < 16 * 1024 {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => reply.extend_from_slice(&chunk[..n]),
        }
    }
    if !(reply.starts_with(b"HTTP/1.0 200") || reply.starts_with(b"HTTP/1.1 200")) {
        return None;
    }
    Some(observed(&reply))
}

/// `decodeTokensPerSecond` of a `/health` reply's JSON body, if it has a sane one, with its
/// `decodeContextTokens` if that is a token count.
fn observed(reply: &[u8]) -> Option<Seen> {
    let at = reply.windows(4).position(|w| w == b"\r\n\r\n")?;
    let body: serde_json::Value = serde_json::from_slice(&reply[at + 4..]).ok()?;
    let rate = body
        .get("decodeTokensPerSecond")?
        .as_f64()
        .filter(|r| r.is_finite() && *r > 0.0 && *r < 1e7)?;
    let context_tokens = body
        .get("decodeContextTokens")
        .and_then(serde_json::Value::as_u64)
        .and_then(|c| u32::try_from(c).ok());
    Some(Seen {
        rate,
        context_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::{Seen, observed};

    #[test]
    fn the_observed_rate_is_read_from_the_health_reply() {
        let reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"status\":\"ok\",\"decodeTokensPerSecond\":41.5,\"decodeContextTokens\":180}";
        let seen = |rate, context_tokens| {
            Some(Seen {
                rate,
                context_tokens,
            })
        };
        assert_eq!(observed(reply), seen(41.5, Some(180)));
        let older = b"HTTP/1.1 200 OK\r\n\r\n{\"decodeTokensPerSecond\":41.5}";
        assert_eq!(observed(older), seen(41.5, None));
        let none = b"HTTP/1.1 200 OK\r\n\r\n{\"status\":\"ok\"}";
        assert_eq!(observed(none), None);
        let hostile = b"HTTP/1.1 200 OK\r\n\r\n{\"decodeTokensPerSecond\":1e300}";
        assert_eq!(observed(hostile), None);
        let huge =
            b"HTTP/1.1 200 OK\r\n\r\n{\"decodeTokensPerSecond\":9,\"decodeContextTokens\":1e12}";
        assert_eq!(observed(huge), seen(9.0, None));
        let wide = b"HTTP/1.1 200 OK\r\n\r\n{\"decodeTokensPerSecond\":9,\"decodeContextTokens\":99999999999}";
        assert_eq!(observed(wide), seen(9.0, None));
    }
}
