//! The seam between the benchmark's client and a system under test: how to write one object to
//! one member, and how to ask one member what it knows about the leader. tb and etcd implement
//! it; everything else (leader seeking, failover, load, timing) is shared, so both systems are
//! measured by exactly the same code path.

use std::future::Future;
use std::time::Duration;

/// One logical write: an object with a unique name. Retries of the same write reuse
/// `request_id`, which tb uses as its idempotency key.
#[derive(Debug, Clone)]
pub struct Write {
    pub name: String,
    pub request_id: String,
}

impl Write {
    pub fn new(name: String) -> Self {
        Write {
            name,
            request_id: uuid::Uuid::new_v4().to_string(),
        }
    }
}

/// What one member says about itself and the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// This member believes it is the leader.
    pub is_leader: bool,
    /// This member knows of some leader (itself or another).
    pub has_leader: bool,
    pub term: u64,
    /// How far this member has applied the replicated log (compared across members to tell
    /// whether a restarted member has caught up).
    pub applied: u64,
}

/// A failed RPC, classified the way a careful client must: may another attempt (perhaps on
/// another member) succeed?
#[derive(Debug, Clone)]
pub struct RpcError {
    pub retryable: bool,
    pub message: String,
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl RpcError {
    /// Classify a gRPC status. Codes that mean "not here / not now" are retried: no leader,
    /// leader changed, member down or overloaded, attempt timed out.
    pub fn from_status(what: &str, status: &tonic::Status) -> Self {
        use tonic::Code;
        let retryable = matches!(
            status.code(),
            Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Cancelled
                | Code::Unknown
                | Code::ResourceExhausted
        );
        RpcError {
            retryable,
            message: format!("{what}: {:?}: {}", status.code(), status.message()),
        }
    }

    pub fn timeout(what: &str, after: Duration) -> Self {
        RpcError {
            retryable: true,
            message: format!("{what}: no answer within {after:?}"),
        }
    }
}

/// A client for one system: a fixed list of members (endpoints 0..n), each reachable by index.
pub trait Backend: Send + Sync + 'static {
    /// "tb" or "etcd".
    fn name(&self) -> &'static str;

    fn endpoints(&self) -> usize;

    /// Store `write` through member `endpoint`, giving up after `timeout`.
    fn put(
        &self,
        endpoint: usize,
        write: &Write,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), RpcError>> + Send;

    /// Ask member `endpoint` about itself and the leader, giving up after `timeout`.
    fn probe(
        &self,
        endpoint: usize,
        timeout: Duration,
    ) -> impl Future<Output = Result<Probe, RpcError>> + Send;
}

/// Run `fut` with a deadline, mapping a timeout to a retryable error.
pub async fn with_timeout<T>(
    what: &str,
    timeout: Duration,
    fut: impl Future<Output = Result<T, RpcError>>,
) -> Result<T, RpcError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(RpcError::timeout(what, timeout)),
    }
}

/// A lazily connecting plaintext HTTP/2 channel to `addr` (`host:port`); both systems'
/// clients use the same settings.
pub fn channel(addr: &str) -> anyhow::Result<tonic::transport::Channel> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_millis(500))
        .tcp_nodelay(true);
    Ok(endpoint.connect_lazy())
}
