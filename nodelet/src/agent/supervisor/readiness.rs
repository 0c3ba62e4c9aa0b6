//! Rank 0 of a built-in service: its endpoint, and whether it answers (`GET /health`),
//! reported in the allocation's status whenever that changes.

use std::sync::Arc;
use std::time::Duration;

use tb_api::specs::{AllocationSpec, AllocationStatus, Executor};

use super::report::report;
use crate::agent::controllers::Controllers;

/// How often rank 0 of a built-in service is asked whether it is ready.
pub(super) const READINESS_EVERY: Duration = Duration::from_secs(1);
/// How often while it is not: a service placed again after a lost Mac is waited for by its
/// clients, so its readiness is noticed within a tenth of a second (a loopback GET).
const NOT_READY_EVERY: Duration = Duration::from_millis(100);

/// Rank 0 of a built-in service: (endpoint URL, health address).
pub(super) fn endpoint_of(spec: &AllocationSpec) -> Option<(String, String)> {
    let b = spec.builtin.as_ref()?;
    if spec.executor != Executor::Builtin || spec.rank != 0 {
        return None;
    }
    let host = b.hosts.first()?;
    let port = b.endpoint_port?;
    Some((format!("http://{host}:{port}/v1"), format!("{host}:{port}")))
}

/// How much the observed decode speed must move before it is reported again, and how often at
/// most: the status is a Raft write.
const OBSERVED_CHANGE: f64 = 0.1;
const OBSERVED_EVERY: Duration = Duration::from_secs(30);

/// Reports the endpoint of a running rank 0 of a built-in service, each change of its
/// readiness (`GET /health`), and its observed decode speed when that moved by a tenth (at
/// most every 30 s), until aborted when the process ends.
pub(super) async fn watch_readiness(
    controllers: Arc<Controllers>,
    namespace: String,
    name: String,
    running: AllocationStatus,
    endpoint: String,
    health: String,
) {
    let mut last: Option<bool> = None;
    let mut reported_rate: Option<f64> = None;
    let mut rate_reported_at = tokio::time::Instant::now();
    loop {
        let (ready, rate) = match check(&health).await {
            Some(h) => (true, h),
            None => (false, None),
        };
        let rate_moved = match (rate, reported_rate) {
            (Some(new), Some(old)) => {
                (new - old).abs() > OBSERVED_CHANGE * old
                    && rate_reported_at.elapsed() >= OBSERVED_EVERY
            }
            (Some(_), None) => true,
            _ => false,
        };
        if last != Some(ready) || rate_moved {
            if rate_moved {
                reported_rate = rate;
                rate_reported_at = tokio::time::Instant::now();
            }
            let status = AllocationStatus {
                endpoint: endpoint.clone(),
                ready,
                observed_tokens_per_second: reported_rate,
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

/// One `GET /health`: `Some` when it answered 200, with the decode tokens/s it reported.
async fn check(addr: &str) -> Option<Option<f64>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(format!("GET /health HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .ok()?;
        // The answer is small; more than this is not rank 0's.
        let mut reply = Vec::new();
        s.take(16 * 1024).read_to_end(&mut reply).await.ok()?;
        if !(reply.starts_with(b"HTTP/1.0 200") || reply.starts_with(b"HTTP/1.1 200")) {
            return None;
        }
        Some(observed_rate(&reply))
    };
    tokio::time::timeout(Duration::from_secs(2), ask)
        .await
        .ok()
        .flatten()
}

/// `decodeTokensPerSecond` of a `/health` reply's JSON body, if it has a sane one.
fn observed_rate(reply: &[u8]) -> Option<f64> {
    let at = reply.windows(4).position(|w| w == b"\r\n\r\n")?;
    let body: serde_json::Value = serde_json::from_slice(&reply[at + 4..]).ok()?;
    body.get("decodeTokensPerSecond")?
        .as_f64()
        .filter(|r| r.is_finite() && *r > 0.0 && *r < 1e7)
}

#[cfg(test)]
mod tests {
    use super::observed_rate;

    #[test]
    fn the_observed_rate_is_read_from_the_health_reply() {
        let reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"status\":\"ok\",\"decodeTokensPerSecond\":41.5}";
        assert_eq!(observed_rate(reply), Some(41.5));
        let none = b"HTTP/1.1 200 OK\r\n\r\n{\"status\":\"ok\"}";
        assert_eq!(observed_rate(none), None);
        let hostile = b"HTTP/1.1 200 OK\r\n\r\n{\"decodeTokensPerSecond\":1e300}";
        assert_eq!(observed_rate(hostile), None);
    }
}
