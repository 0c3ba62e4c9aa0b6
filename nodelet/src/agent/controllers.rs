//! Connections to the controllers, failing over among the addresses the nodelet was given, over
//! TLS with the cluster CA when the nodelet has one (`super::tls`). Dialling, the token
//! interceptor and the retry rule are tb-client's; [`Controllers::client`] hands out a
//! [`tb_client::Client`] for the informers (allocations, links).
//! Once the node has its credential, every call carries it (`authorization: Bearer tbnode-…`):
//! the controllers let a node read objects and write only its own statuses.

use std::sync::Mutex;
use std::time::Duration;

use tb_api::proto::nodes_client::NodesClient;
use tb_api::proto::objects_client::ObjectsClient;
use tb_client::connect::Dial;
use tb_client::{AuthChannel, Bearer, MAX_MESSAGE_BYTES};
use tonic::transport::Channel;

/// How long one call of a [`tb_client::Client`] from here may take, retries included.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The controllers, and which one answered last.
pub struct Controllers {
    addresses: Vec<String>,
    preferred: Mutex<usize>,
    /// The node's credential once it has one; shared by every client made here.
    bearer: Bearer,
    /// The CA to verify controllers with; None: plain TCP.
    trust: Option<super::tls::Trust>,
    dial: Dial,
}

impl Controllers {
    pub fn new(addresses: Vec<String>, trust: Option<super::tls::Trust>) -> Controllers {
        Controllers {
            addresses,
            preferred: Mutex::new(0),
            bearer: Bearer::default(),
            trust,
            // A nodelet notices a vanished controller sooner than tbctl: its watches must move
            // on for the node to keep running what it was assigned.
            dial: Dial {
                connect_timeout: Duration::from_millis(800),
                keep_alive_interval: Duration::from_secs(5),
                ..Dial::default()
            },
        }
    }

    /// The credential later calls carry.
    pub fn set_credential(&self, credential: &str) {
        self.bearer.set(Some(credential));
    }

    /// A failed call or connection told in words (TLS failures say what to check).
    pub fn explain(&self, error: &(dyn std::error::Error + 'static)) -> String {
        super::tls::explain(error, self.trust.as_ref())
    }

    pub fn addresses(&self) -> &[String] {
        &self.addresses
    }

    /// A client of the same controllers with the node's credential, starting with the one that
    /// answered last. Whether a token may go in clear text was settled when the nodelet started
    /// (`super::run`), so the client is not asked again.
    pub fn client(&self) -> tb_client::Client {
        let start = *self.preferred.lock().unwrap_or_else(|e| e.into_inner());
        let n = self.addresses.len();
        let servers = (0..n)
            .map(|i| &self.addresses[(start + i) % n])
            .filter_map(|a| match tb_client::parse_server(a) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(address = %a, "skipping a controller address: {e}");
                    None
                }
            })
            .collect();
        // The nodelet outlives controller restarts: a refused connection is waited out.
        tb_client::Client::new(servers, CALL_TIMEOUT)
            .with_refused(tb_client::retry::Refused::Retry)
            .with_trust(self.trust.clone())
            .with_bearer(self.bearer.clone())
            .with_insecure(true)
            .with_dial(self.dial.clone())
    }

    /// A channel to the first controller that accepts a connection, starting with the one that
    /// answered last.
    pub async fn channel(&self) -> anyhow::Result<Channel> {
        let start = *self.preferred.lock().unwrap_or_else(|e| e.into_inner());
        let mut errors = Vec::new();
        for i in 0..self.addresses.len() {
            let idx = (start + i) % self.addresses.len();
            let addr = &self.addresses[idx];
            let endpoint = self.dial.endpoint(addr, self.trust.as_ref())?;
            match endpoint.connect().await {
                Ok(ch) => {
                    *self.preferred.lock().unwrap_or_else(|e| e.into_inner()) = idx;
                    return Ok(ch);
                }
                Err(e) => errors.push(format!(
                    "{addr}: {}",
                    super::tls::explain(&e, self.trust.as_ref())
                )),
            }
        }
        anyhow::bail!("no controller reachable ({})", errors.join("; "))
    }

    /// Move on to the next controller after a failed call.
    pub fn rotate(&self) {
        let mut p = self.preferred.lock().unwrap_or_else(|e| e.into_inner());
        *p = (*p + 1) % self.addresses.len().max(1);
    }

    fn authed(&self, channel: Channel) -> AuthChannel {
        tonic::service::interceptor::InterceptedService::new(channel, self.bearer.clone())
    }

    pub async fn objects(&self) -> anyhow::Result<ObjectsClient<AuthChannel>> {
        Ok(ObjectsClient::new(self.authed(self.channel().await?))
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }

    pub async fn nodes(&self) -> anyhow::Result<NodesClient<AuthChannel>> {
        Ok(NodesClient::new(self.authed(self.channel().await?)))
    }
}

/// Whether a failed call is worth retrying on another controller: tb-client's one rule.
pub use tb_client::is_retryable as retryable;
