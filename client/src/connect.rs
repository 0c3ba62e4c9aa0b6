//! How every tb client dials a controller: `https` verified with the cluster CA when there is
//! one, plain `http` otherwise, no Nagle, and HTTP/2 keep-alives so that a controller that stops
//! answering (a frozen machine, a pulled cable) ends a watch, which then resumes elsewhere.

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::tls::Trust;

/// How long a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The keep-alive ping interval tbctl uses; a long-lived watcher (the nodelet) pings more often.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// How long a keep-alive ping may go unanswered before the connection is dropped.
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// How to dial one controller.
#[derive(Debug, Clone)]
pub struct Dial {
    pub connect_timeout: Duration,
    pub handshake_timeout: Duration,
    pub keep_alive_interval: Duration,
}

impl Default for Dial {
    fn default() -> Dial {
        Dial {
            connect_timeout: Duration::from_secs(1),
            handshake_timeout: HANDSHAKE_TIMEOUT,
            keep_alive_interval: KEEP_ALIVE_INTERVAL,
        }
    }
}

impl Dial {
    /// The endpoint for `addr` (`HOST:PORT`), TLS with `trust`'s CA when given.
    pub fn endpoint(
        &self,
        addr: &str,
        trust: Option<&Trust>,
    ) -> Result<Endpoint, tonic::transport::Error> {
        let scheme = if trust.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))?;
        if let Some(t) = trust {
            endpoint = endpoint.tls_config(t.client_config().timeout(self.handshake_timeout))?;
        }
        Ok(endpoint
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(self.keep_alive_interval)
            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .keep_alive_while_idle(true))
    }

    /// A channel to `addr` that connects on first use (and reconnects after its member
    /// restarts).
    pub fn lazy(
        &self,
        addr: &str,
        trust: Option<&Trust>,
    ) -> Result<Channel, tonic::transport::Error> {
        Ok(self.endpoint(addr, trust)?.connect_lazy())
    }
}

/// An error and its causes on one line: tonic's transport errors say little at the top level.
/// A `Status` at the top is shown by its message alone.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let first = match e.downcast_ref::<tonic::Status>() {
        Some(s) => s.message().to_string(),
        None => e.to_string(),
    };
    let mut parts: Vec<String> = vec![first];
    let mut cur = e.source();
    while let Some(c) = cur {
        let s = c.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
        cur = c.source();
    }
    parts.join(": ")
}
