//! Connections to the controllers, failing over among the addresses the nodelet was given, over
//! TLS with the cluster CA when the nodelet has one (`super::tls`).
//! Once the node has its credential, every call carries it (`authorization: Bearer tbnode-…`):
//! the controllers let a node read objects and write only its own statuses.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tb_api::proto::nodes_client::NodesClient;
use tb_api::proto::objects_client::ObjectsClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// The controllers, and which one answered last.
pub struct Controllers {
    addresses: Vec<String>,
    preferred: Mutex<usize>,
    credential: Arc<RwLock<Option<String>>>,
    /// The CA to verify controllers with; None: plain TCP.
    trust: Option<super::tls::Trust>,
}

/// Adds the node's credential to every call, once it has one.
#[derive(Clone)]
pub struct NodeAuth {
    credential: Arc<RwLock<Option<String>>>,
}

impl tonic::service::Interceptor for NodeAuth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let credential = self.credential.read().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = credential.as_deref()
            && let Ok(v) = format!("Bearer {c}").parse()
        {
            req.metadata_mut().insert("authorization", v);
        }
        Ok(req)
    }
}

/// A channel to a controller that presents the node's credential.
pub type AuthChannel = InterceptedService<Channel, NodeAuth>;

const MAX_MESSAGE: usize = 64 * 1024 * 1024;

impl Controllers {
    pub fn new(addresses: Vec<String>, trust: Option<super::tls::Trust>) -> Controllers {
        Controllers {
            addresses,
            preferred: Mutex::new(0),
            credential: Arc::new(RwLock::new(None)),
            trust,
        }
    }

    /// The credential later calls carry.
    pub fn set_credential(&self, credential: &str) {
        *self.credential.write().unwrap_or_else(|e| e.into_inner()) = Some(credential.to_string());
    }

    fn auth(&self) -> NodeAuth {
        NodeAuth {
            credential: self.credential.clone(),
        }
    }

    /// A failed call or connection told in words (TLS failures say what to check).
    pub fn explain(&self, error: &(dyn std::error::Error + 'static)) -> String {
        super::tls::explain(error, self.trust.as_ref())
    }

    pub fn addresses(&self) -> &[String] {
        &self.addresses
    }

    /// A channel to the first controller that accepts a connection, starting with the one that
    /// answered last.
    pub async fn channel(&self) -> anyhow::Result<Channel> {
        let start = *self.preferred.lock().unwrap_or_else(|e| e.into_inner());
        let mut errors = Vec::new();
        for i in 0..self.addresses.len() {
            let idx = (start + i) % self.addresses.len();
            let addr = &self.addresses[idx];
            let endpoint = match &self.trust {
                Some(t) => Endpoint::from_shared(format!("https://{addr}"))?
                    .tls_config(t.client_config().timeout(Duration::from_secs(5)))?,
                None => Endpoint::from_shared(format!("http://{addr}"))?,
            };
            let endpoint = endpoint
                .connect_timeout(Duration::from_millis(800))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(5))
                .keep_alive_timeout(Duration::from_secs(5));
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

    pub async fn objects(&self) -> anyhow::Result<ObjectsClient<AuthChannel>> {
        Ok(
            ObjectsClient::with_interceptor(self.channel().await?, self.auth())
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
        )
    }

    pub async fn nodes(&self) -> anyhow::Result<NodesClient<AuthChannel>> {
        Ok(NodesClient::with_interceptor(
            self.channel().await?,
            self.auth(),
        ))
    }
}

/// Whether a failed call is worth retrying on another controller.
pub fn retryable(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Unknown
            | tonic::Code::Cancelled
    )
}
