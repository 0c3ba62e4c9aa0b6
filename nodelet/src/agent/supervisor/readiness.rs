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

/// Reports the endpoint of a running rank 0 of a built-in service, and each change of its
/// readiness (`GET /health`), until aborted when the process ends.
pub(super) async fn watch_readiness(
    controllers: Arc<Controllers>,
    namespace: String,
    name: String,
    running: AllocationStatus,
    endpoint: String,
    health: String,
) {
    let mut last: Option<bool> = None;
    loop {
        let ready = healthy(&health).await;
        if last != Some(ready) {
            let status = AllocationStatus {
                endpoint: endpoint.clone(),
                ready,
                ..running.clone()
            };
            report(&controllers, &namespace, &name, &status).await;
            tracing::info!(alloc = %format!("{namespace}/{name}"), %endpoint, ready, "endpoint readiness");
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

/// One `GET /health`: whether it answered 200.
pub(super) async fn healthy(addr: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(format!("GET /health HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await.ok()?;
        Some(head.starts_with(b"HTTP/1.0 200") || head.starts_with(b"HTTP/1.1 200"))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), ask).await,
        Ok(Some(true))
    )
}
