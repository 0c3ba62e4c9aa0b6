//! gRPC clients for the controllers, and writes that survive a leader change.
//!
//! A [`Client`] knows every member's address and keeps one lazily connected channel per member
//! (a channel reconnects on its own after its member restarts). Writes go through
//! [`Client::apply`] and friends, which retry with the *same* `request_id` on the next member
//! whenever the outcome is unknown (no leader, connection lost, deadline exceeded): the store
//! deduplicates on that id, so the write takes effect once however often it is sent.
//!
//! Every call carries a bearer token: the harness's admin token ([`crate::auth`]) unless the
//! client was made with [`Client::with_token`], over TLS verified with the harness's CA.
//!
//! Dialling, the token interceptor and the retry rule (which failures, what backoff, how many
//! attempts) are tb-client's, as in tbctl and the nodelet. The harness keeps its own loop over
//! members because tests choose the member a write starts at and the budget it gets, and some
//! calls go to one member on purpose (`*_on`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tb_api::proto::cluster_client::ClusterClient;
use tb_api::proto::objects_client::ObjectsClient;
use tb_api::proto::{
    ApplyRequest, ApplyResponse, ClusterStatusRequest, ClusterStatusResponse, DeleteRequest,
    DeleteResponse, GetRequest, ListRequest, ListResponse,
};
use tb_client::connect::Dial;
use tb_client::retry::{Backoff, MAX_ATTEMPTS};
use tb_client::{MAX_MESSAGE_BYTES as MAX_MESSAGE, Trust};
use tonic::Status;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

pub use tb_client::{AuthChannel, Bearer, is_retryable};

/// Per-call deadline: generous, a write may wait for an election on the server.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// An `https` endpoint for `addr` that verifies the server with the harness's CA.
pub fn tls_endpoint(addr: &str) -> Endpoint {
    tls_endpoint_with_ca(addr, &crate::auth::ca_cert_pem())
}

/// An `https` endpoint for `addr` that verifies the server with the CA `ca_pem`.
pub fn tls_endpoint_with_ca(addr: &str, ca_pem: &str) -> Endpoint {
    let trust = Trust {
        pem: ca_pem.to_string(),
        path: "the test CA".into(),
    };
    Dial::default()
        .endpoint(addr, Some(&trust))
        .unwrap_or_else(|e| panic!("bad address or TLS settings for {addr}: {e}"))
}

/// Channels to a fixed set of members.
pub struct Client {
    addrs: Vec<String>,
    channels: Mutex<HashMap<String, Channel>>,
    bearer: Bearer,
}

impl Client {
    pub fn new(addrs: Vec<String>) -> Client {
        assert!(!addrs.is_empty(), "a client needs at least one address");
        Client {
            addrs,
            channels: Mutex::new(HashMap::new()),
            bearer: Bearer::new(Some(crate::auth::admin_token())),
        }
    }

    /// A client of the same members calling with `token` (None: no credentials at all).
    pub fn with_token(addrs: Vec<String>, token: Option<&str>) -> Client {
        let mut c = Client::new(addrs);
        c.bearer = Bearer::new(token);
        c
    }

    /// The channel to `addr`, carrying this client's token.
    pub fn authed(&self, addr: &str) -> AuthChannel {
        InterceptedService::new(self.channel(addr), self.bearer.clone())
    }

    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// The (cached, lazily connected) channel to `addr`.
    pub fn channel(&self, addr: &str) -> Channel {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        channels
            .entry(addr.to_string())
            .or_insert_with(|| tls_endpoint(addr).connect_lazy())
            .clone()
    }

    pub fn objects(&self, addr: &str) -> ObjectsClient<AuthChannel> {
        ObjectsClient::new(self.authed(addr))
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }

    pub fn cluster(&self, addr: &str) -> ClusterClient<AuthChannel> {
        ClusterClient::new(self.authed(addr))
    }

    pub fn auth(&self, addr: &str) -> tb_api::proto::auth_client::AuthClient<AuthChannel> {
        tb_api::proto::auth_client::AuthClient::new(self.authed(addr))
    }

    pub fn nodes(&self, addr: &str) -> tb_api::proto::nodes_client::NodesClient<AuthChannel> {
        tb_api::proto::nodes_client::NodesClient::new(self.authed(addr))
    }

    /// Apply once, on one member.
    pub async fn apply_on(&self, addr: &str, req: ApplyRequest) -> Result<ApplyResponse, Status> {
        let mut c = self.objects(addr);
        call(async move { c.apply(with_timeout(req)).await }).await
    }

    /// Apply `objects` with `request_id`, starting at member `first` and moving on to the next
    /// member on every retryable error until `budget` is spent.
    pub async fn apply(
        &self,
        objects: &[serde_json::Value],
        request_id: &str,
        first: usize,
        budget: Duration,
    ) -> Result<ApplyResponse, Status> {
        let req = ApplyRequest {
            objects_json: objects.iter().map(|o| o.to_string()).collect(),
            dry_run: false,
            request_id: request_id.to_string(),
        };
        self.retrying(first, budget, |addr| {
            let mut c = self.objects(addr);
            let req = req.clone();
            async move { c.apply(with_timeout(req)).await }
        })
        .await
    }

    /// Delete with retries, as [`Client::apply`].
    pub async fn delete(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
        request_id: &str,
        first: usize,
        budget: Duration,
    ) -> Result<DeleteResponse, Status> {
        let req = DeleteRequest {
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
            resource_version: 0,
            request_id: request_id.into(),
        };
        self.retrying(first, budget, |addr| {
            let mut c = self.objects(addr);
            let req = req.clone();
            async move { c.delete(with_timeout(req)).await }
        })
        .await
    }

    /// Get one object's JSON from one member.
    pub async fn get_on(
        &self,
        addr: &str,
        kind: &str,
        namespace: &str,
        name: &str,
        stale: bool,
    ) -> Result<String, Status> {
        let mut c = self.objects(addr);
        let req = GetRequest {
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
            stale,
        };
        call(async move { c.get(with_timeout(req)).await })
            .await
            .map(|r| r.object_json)
    }

    /// List from one member.
    pub async fn list_on(
        &self,
        addr: &str,
        kind: &str,
        namespace: &str,
        stale: bool,
    ) -> Result<ListResponse, Status> {
        let mut c = self.objects(addr);
        let req = ListRequest {
            kind: kind.into(),
            namespace: namespace.into(),
            label_selector: String::new(),
            stale,
        };
        call(async move { c.list(with_timeout(req)).await }).await
    }

    /// A linearizable list from whichever member answers first (in order from `first`).
    pub async fn list(
        &self,
        kind: &str,
        namespace: &str,
        first: usize,
        budget: Duration,
    ) -> Result<ListResponse, Status> {
        self.retrying(first, budget, |addr| {
            let mut c = self.objects(addr);
            let req = ListRequest {
                kind: kind.into(),
                namespace: namespace.into(),
                label_selector: String::new(),
                stale: false,
            };
            async move { c.list(with_timeout(req)).await }
        })
        .await
    }

    /// [`Client::list`], each object parsed as JSON; errors as text for test messages.
    pub async fn list_values(
        &self,
        kind: &str,
        namespace: &str,
        budget: Duration,
    ) -> Result<Vec<serde_json::Value>, String> {
        let resp = self
            .list(kind, namespace, 0, budget)
            .await
            .map_err(|e| format!("list {kind}: {}: {}", e.code(), e.message()))?;
        resp.objects_json
            .iter()
            .map(|j| serde_json::from_str(j).map_err(|e| format!("invalid JSON ({e}): {j}")))
            .collect()
    }

    /// `Cluster.Status` as one member sees it.
    pub async fn status_on(&self, addr: &str) -> Result<ClusterStatusResponse, Status> {
        let mut c = self.cluster(addr);
        call(async move { c.status(with_timeout(ClusterStatusRequest {})).await }).await
    }

    /// Run `attempt` against members in turn, from `first`, until it succeeds, fails with a
    /// final error, or `budget` is spent (then the last retryable error is returned).
    pub async fn retrying<T, F, Fut>(
        &self,
        first: usize,
        budget: Duration,
        mut attempt: F,
    ) -> Result<T, Status>
    where
        F: FnMut(&str) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let deadline = tokio::time::Instant::now() + budget;
        let n = self.addrs.len();
        let mut backoff = Backoff::default();
        // Bounded by the deadline; the count is a second guard against a zero-time error loop.
        for i in 0..MAX_ATTEMPTS {
            let addr = &self.addrs[(first + i) % n];
            let result = match tokio::time::timeout_at(deadline, call(attempt(addr))).await {
                Ok(r) => r,
                Err(_) => Err(Status::deadline_exceeded(format!(
                    "retry budget of {budget:?} spent"
                ))),
            };
            match result {
                Ok(v) => return Ok(v),
                Err(e) if is_retryable(&e) && tokio::time::Instant::now() < deadline => {
                    // Shown only if the test fails: the story of every failover.
                    crate::step!("retrying after {addr}: {}: {}", e.code(), e.message());
                    // Back off once every member has been tried.
                    if (i + 1) % n == 0 {
                        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                        tokio::time::sleep(backoff.next_pause().min(left)).await;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(Status::deadline_exceeded("too many attempts"))
    }
}

/// Attach the per-call deadline for the server.
fn with_timeout<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(CALL_TIMEOUT);
    req
}

/// Await a call with a client-side deadline too (a stopped server may never answer).
async fn call<T, Fut>(fut: Fut) -> Result<T, Status>
where
    Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
{
    match tokio::time::timeout(CALL_TIMEOUT + Duration::from_secs(1), fut).await {
        Ok(r) => r.map(tonic::Response::into_inner),
        Err(_) => Err(Status::deadline_exceeded(
            "no answer within the client deadline",
        )),
    }
}
