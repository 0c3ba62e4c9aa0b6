//! Connections to the controllers, failing over among the addresses the nodelet was given.

use std::sync::Mutex;
use std::time::Duration;

use tb_api::proto::nodes_client::NodesClient;
use tb_api::proto::objects_client::ObjectsClient;
use tonic::transport::{Channel, Endpoint};

/// The controllers, and which one answered last.
pub struct Controllers {
    addresses: Vec<String>,
    preferred: Mutex<usize>,
}

const MAX_MESSAGE: usize = 64 * 1024 * 1024;

impl Controllers {
    pub fn new(addresses: Vec<String>) -> Controllers {
        Controllers {
            addresses,
            preferred: Mutex::new(0),
        }
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
            let endpoint = Endpoint::from_shared(format!("http://{addr}"))?
                .connect_timeout(Duration::from_millis(800))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(5))
                .keep_alive_timeout(Duration::from_secs(5));
            match endpoint.connect().await {
                Ok(ch) => {
                    *self.preferred.lock().unwrap_or_else(|e| e.into_inner()) = idx;
                    return Ok(ch);
                }
                Err(e) => errors.push(format!("{addr}: {e}")),
            }
        }
        anyhow::bail!("no controller reachable ({})", errors.join("; "))
    }

    /// Move on to the next controller after a failed call.
    pub fn rotate(&self) {
        let mut p = self.preferred.lock().unwrap_or_else(|e| e.into_inner());
        *p = (*p + 1) % self.addresses.len().max(1);
    }

    pub async fn objects(&self) -> anyhow::Result<ObjectsClient<Channel>> {
        Ok(ObjectsClient::new(self.channel().await?)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE))
    }

    pub async fn nodes(&self) -> anyhow::Result<NodesClient<Channel>> {
        Ok(NodesClient::new(self.channel().await?))
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
