//! The connection to tb's controllers: one client over a list of members that fails over on
//! connect errors and the failures [`crate::retry::is_retryable`] names (no leader, a member
//! going down, deadlines), retries with backoff until the call's timeout, and remembers the
//! member that last answered (the leader, as a rule: followers that cannot serve a call answer
//! UNAVAILABLE and the client moves on). When every member refuses the connection, nothing
//! listens there, and the call fails at once unless the caller asked to wait for restarts
//! ([`crate::retry::Refused`]). With a CA ([`crate::tls`]) it speaks TLS and verifies
//! the controllers with it; every call carries the bearer token ([`crate::auth`]).
//!
//! Retrying a write is safe because every mutating request carries a request id, generated once
//! per logical operation (by the caller, or here when the caller left it empty) and kept across
//! attempts: the server applies a given id once, however many controllers the request reached.
//! (CreateToken has no request id: a retry after a lost answer may mint a second token, which
//! is never shown and expires unused.)

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use tb_api::proto::auth_client::AuthClient;
use tb_api::proto::cluster_client::ClusterClient;
use tb_api::proto::nodes_client::NodesClient;
use tb_api::proto::objects_client::ObjectsClient;
use tb_api::proto::{
    AddMemberRequest, ApplyRequest, ApplyResponse, AuditRequest, AuditResponse, CanIRequest,
    CanIResponse, ClusterStatusRequest, ClusterStatusResponse, CreateTokenRequest,
    CreateTokenResponse, CreateUserRequest, DeleteRequest, DeleteResponse, DeleteUserRequest,
    DeleteUserResponse, GetRequest, GetResponse, HeartbeatRequest, HeartbeatResponse,
    IssueTokenRequest, IssueTokenResponse, JoinRequest, JoinResponse, ListRequest, ListResponse,
    ListUsersRequest, ListUsersResponse, LogLine, LogsRequest, MemberJoinTokenRequest,
    RemoveMemberRequest, RevokeTokenRequest, RevokeTokenResponse, SaveSnapshotRequest,
    ServiceKeyRequest, ServiceKeyResponse, SnapshotChunk, UpdateStatusRequest,
    UpdateStatusResponse, WatchEvent, WatchRequest, WhoAmIRequest, WhoAmIResponse,
};
use tokio::time::Instant;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

use crate::addr::ServerAddr;
use crate::auth::{AuthChannel, Bearer};
use crate::connect::{Dial, error_chain};
use crate::retry::{Backoff, MAX_ATTEMPTS, Refused, is_connection_refused, is_retryable};
use crate::tls::Trust;

/// Largest gRPC message a client sends or accepts.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// How long one address gets to accept a connection before the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The least time one attempt gets when the budget is shared among several servers.
const MIN_ATTEMPT: Duration = Duration::from_secs(2);

/// A failed call: the server's status code and message (shown as is), or why no server answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
// The server's messages are written for users (INVALID_ARGUMENT names the field), so they are
// shown as they are.
#[error("{message}")]
pub struct RpcError {
    pub code: Code,
    pub message: String,
}

impl RpcError {
    /// The status as the user sees it: its message, else the code's description.
    pub fn from_status(s: &Status) -> RpcError {
        let message = if s.message().is_empty() {
            s.code().description().to_string()
        } else {
            s.message().to_string()
        };
        RpcError {
            code: s.code(),
            message,
        }
    }

    /// Whether no controller gave an answer about the request itself (none reachable, no
    /// leader, out of time): trying again later may succeed.
    pub fn is_unanswered(&self) -> bool {
        matches!(
            self.code,
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled
        )
    }
}

/// Why tbctl will not send a token to `addr` without a CA, and where to get one.
pub fn no_ca_message(addr: &str) -> String {
    format!(
        "no CA configured for https://{addr}: pass --ca-cert FILE (a controller's \
         DATA_DIR/ca.pem), set TB_CA_CERT, or `tbctl login --ca-cert FILE`; --insecure sends \
         the token in clear text"
    )
}

/// One client of the controllers. Cloning it is cheap; clones share the token.
#[derive(Clone)]
pub struct Client {
    servers: Vec<ServerAddr>,
    bearer: Bearer,
    /// Index of the server to try first: the one that last answered.
    current: usize,
    channel: Option<(usize, Channel)>,
    timeout: Duration,
    /// The CA to verify controllers with; None: plain TCP.
    trust: Option<Trust>,
    /// The token may go over plain TCP (`--insecure`); else a token without a CA is refused
    /// before anything is sent.
    insecure: bool,
    dial: Dial,
    /// Whether a round of refused connections ends the call.
    refused: Refused,
}

/// Why a connection to one member failed, and whether it was refused (nothing listens).
struct ConnectFailure {
    message: String,
    refused: bool,
}

impl ConnectFailure {
    fn other(message: String) -> ConnectFailure {
        ConnectFailure {
            message,
            refused: false,
        }
    }
}

impl Client {
    /// `servers` must not be empty; `timeout` bounds each call including its retries.
    pub fn new(servers: Vec<ServerAddr>, timeout: Duration) -> Client {
        Client {
            servers,
            bearer: Bearer::default(),
            current: 0,
            channel: None,
            timeout,
            trust: None,
            insecure: false,
            dial: Dial::default(),
            refused: Refused::default(),
        }
    }

    /// What to do when every member refuses the connection: fail at once (the default) or
    /// keep trying until the timeout (a caller that outlives controller restarts).
    pub fn with_refused(mut self, refused: Refused) -> Client {
        self.refused = refused;
        self
    }

    /// Allow the token over plain TCP when there is no CA.
    pub fn with_insecure(mut self, insecure: bool) -> Client {
        self.insecure = insecure;
        self
    }

    /// Why this client may not call at all: a token, no CA, and no `--insecure`.
    fn clear_text_refusal(&self) -> Option<RpcError> {
        if !crate::tls::token_refused_in_clear(
            self.bearer.has_token(),
            self.trust.is_some(),
            self.insecure,
        ) {
            return None;
        }
        let addr = self
            .servers
            .get(self.current)
            .map(|s| s.to_string())
            .unwrap_or_default();
        Some(RpcError {
            code: Code::FailedPrecondition,
            message: no_ca_message(&addr),
        })
    }

    /// Speak TLS, verifying the controllers with this CA (None: plain TCP).
    pub fn with_trust(mut self, trust: Option<Trust>) -> Client {
        self.trust = trust;
        self.channel = None;
        self
    }

    /// Authenticate every call with this bearer token.
    pub fn with_token(mut self, token: Option<&str>) -> Client {
        self.bearer = Bearer::new(token);
        self
    }

    /// Authenticate every call with `bearer`'s token, as it is at the time of each call.
    pub fn with_bearer(mut self, bearer: Bearer) -> Client {
        self.bearer = bearer;
        self
    }

    /// Dial members this way (connect and keep-alive timing).
    pub fn with_dial(mut self, dial: Dial) -> Client {
        self.dial = dial;
        self.channel = None;
        self
    }

    /// The bearer whose token every call carries.
    pub fn bearer(&self) -> &Bearer {
        &self.bearer
    }

    /// The server the next call goes to first.
    pub fn current_server(&self) -> Option<&ServerAddr> {
        self.servers.get(self.current)
    }

    /// Give up on the current server: the next call starts with the following one.
    pub fn fail_over(&mut self) {
        self.channel = None;
        if !self.servers.is_empty() {
            self.current = (self.current + 1) % self.servers.len();
        }
    }

    async fn connect(&mut self, limit: Duration) -> Result<Channel, ConnectFailure> {
        if let Some((i, ch)) = &self.channel
            && *i == self.current
        {
            return Ok(ch.clone());
        }
        let addr = &self.servers[self.current];
        let dial = Dial {
            connect_timeout: limit,
            handshake_timeout: limit,
            ..self.dial.clone()
        };
        let endpoint = dial
            .endpoint(addr.as_ref(), self.trust.as_ref())
            .map_err(|e| ConnectFailure::other(format!("bad address: {}", error_chain(&e))))?;
        let ch = match tokio::time::timeout(limit, endpoint.connect()).await {
            Ok(Ok(ch)) => ch,
            Ok(Err(e)) => {
                return Err(ConnectFailure {
                    refused: is_connection_refused(&e),
                    message: crate::tls::explain(
                        addr.as_ref(),
                        &error_chain(&e),
                        self.trust.as_ref(),
                    ),
                });
            }
            Err(_) => {
                return Err(ConnectFailure::other(format!(
                    "no connection within {}",
                    fmt_duration(limit)
                )));
            }
        };
        tracing::debug!(server = %addr, "connected");
        self.channel = Some((self.current, ch.clone()));
        Ok(ch)
    }

    /// How long one attempt may take: all that is left with one server, a share of the
    /// timeout with several, so one unresponsive controller cannot use the whole budget.
    fn attempt_budget(&self, left: Duration) -> Duration {
        let n = self.servers.len().max(1) as u32;
        if n == 1 {
            left
        } else {
            left.min((self.timeout / n).max(MIN_ATTEMPT))
        }
    }

    /// Run `call` against the servers in turn until one answers, a non-retryable error comes
    /// back, or the timeout passes. `call` gets a channel and the time the attempt may take.
    async fn call<T, F, Fut>(&mut self, rpc: &str, mut call: F) -> Result<T, RpcError>
    where
        F: FnMut(AuthChannel, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        if self.servers.is_empty() {
            return Err(RpcError {
                code: Code::InvalidArgument,
                message: "no server to talk to".into(),
            });
        }
        // Checked before any connection: a token never leaves in clear text by default.
        if let Some(refusal) = self.clear_text_refusal() {
            return Err(refusal);
        }
        let deadline = Instant::now() + self.timeout;
        let mut backoff = Backoff::default();
        let mut attempts = 0usize;
        // The last failure per server, for the final message.
        let mut failures: BTreeMap<usize, String> = BTreeMap::new();
        let mut code = Code::Unavailable;
        loop {
            // Whether every member of this round refused the connection.
            let mut all_refused = true;
            for _ in 0..self.servers.len() {
                let now = Instant::now();
                attempts += 1;
                if now >= deadline || attempts > MAX_ATTEMPTS {
                    return Err(self.exhausted(rpc, code, &failures));
                }
                let budget = self.attempt_budget(deadline - now);
                let idx = self.current;
                let ch = match self.connect(budget.min(CONNECT_TIMEOUT)).await {
                    Ok(ch) => ch,
                    Err(e) if crate::tls::is_handshake_failure(&e.message) => {
                        // A certificate the CA does not vouch for stays so: no retrying.
                        return Err(RpcError {
                            code: Code::Unavailable,
                            message: e.message,
                        });
                    }
                    Err(e) => {
                        tracing::debug!(server = %self.servers[idx], error = %e.message, "connect failed");
                        all_refused &= e.refused;
                        failures.insert(idx, e.message);
                        self.fail_over();
                        continue;
                    }
                };
                all_refused = false;
                let ch = InterceptedService::new(ch, self.bearer.clone());
                match tokio::time::timeout(budget, call(ch, budget)).await {
                    Ok(Ok(resp)) => return Ok(resp.into_inner()),
                    Ok(Err(s)) if is_retryable(&s) => {
                        tracing::debug!(server = %self.servers[idx], rpc, code = ?s.code(), message = s.message(), "failing over");
                        code = s.code();
                        let why = if s.message().is_empty() {
                            s.code().description()
                        } else {
                            s.message()
                        };
                        let why = crate::tls::explain(
                            self.servers[idx].as_ref(),
                            why,
                            self.trust.as_ref(),
                        );
                        failures.insert(idx, why);
                        self.fail_over();
                    }
                    Ok(Err(s)) => return Err(RpcError::from_status(&s)),
                    Err(_) => {
                        tracing::debug!(server = %self.servers[idx], rpc, "attempt timed out");
                        code = Code::DeadlineExceeded;
                        failures.insert(idx, format!("no answer within {}", fmt_duration(budget)));
                        self.fail_over();
                    }
                }
            }
            if all_refused && self.refused == Refused::Final {
                return Err(self.refused_everywhere(rpc, &failures));
            }
            // Every server failed once: a leader election or a restart may be under way.
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep(backoff.next_pause().min(left)).await;
        }
    }

    /// Every member refused the connection: say so, and what usually causes it.
    fn refused_everywhere(&self, rpc: &str, failures: &BTreeMap<usize, String>) -> RpcError {
        let addrs: Vec<String> = self.servers.iter().map(ToString::to_string).collect();
        let detail: Vec<&str> = failures.values().map(String::as_str).collect();
        RpcError {
            code: Code::Unavailable,
            message: format!(
                "cannot send {rpc}: nothing listens at {} (connection refused); is the \
                 controller running there? Check --server, TB_SERVER or the context \
                 (`tbctl config current-context`); `tbctl up` starts a local cluster ({})",
                addrs.join(", "),
                detail.join("; ")
            ),
        }
    }

    fn exhausted(&self, rpc: &str, code: Code, failures: &BTreeMap<usize, String>) -> RpcError {
        let detail: Vec<String> = failures
            .iter()
            .map(|(i, why)| format!("{}: {why}", self.servers[*i]))
            .collect();
        RpcError {
            code,
            message: format!(
                "no tb controller answered {rpc} within {} ({})",
                fmt_duration(self.timeout),
                detail.join("; ")
            ),
        }
    }

    /// Apply objects; an empty request id is filled in once, so every attempt carries the same.
    pub async fn apply(&mut self, mut req: ApplyRequest) -> Result<ApplyResponse, RpcError> {
        fill_request_id(&mut req.request_id);
        self.call("Apply", |ch, t| {
            let req = timed(req.clone(), t);
            async move { objects(ch).apply(req).await }
        })
        .await
    }

    pub async fn get(&mut self, req: GetRequest) -> Result<GetResponse, RpcError> {
        self.call("Get", |ch, t| {
            let req = timed(req.clone(), t);
            async move { objects(ch).get(req).await }
        })
        .await
    }

    pub async fn list(&mut self, req: ListRequest) -> Result<ListResponse, RpcError> {
        self.call("List", |ch, t| {
            let req = timed(req.clone(), t);
            async move { objects(ch).list(req).await }
        })
        .await
    }

    /// Delete an object; an empty request id is filled in once, as for [`Client::apply`].
    pub async fn delete(&mut self, mut req: DeleteRequest) -> Result<DeleteResponse, RpcError> {
        fill_request_id(&mut req.request_id);
        self.call("Delete", |ch, t| {
            let req = timed(req.clone(), t);
            async move { objects(ch).delete(req).await }
        })
        .await
    }

    /// Write an object's status; an empty request id is filled in once, as for
    /// [`Client::apply`].
    pub async fn update_status(
        &mut self,
        mut req: UpdateStatusRequest,
    ) -> Result<UpdateStatusResponse, RpcError> {
        fill_request_id(&mut req.request_id);
        self.call("UpdateStatus", |ch, t| {
            let req = timed(req.clone(), t);
            async move { objects(ch).update_status(req).await }
        })
        .await
    }

    /// Open a watch. Only opening it is bounded by the timeout; the stream lasts until the
    /// server or connection ends it.
    pub async fn watch(&mut self, req: WatchRequest) -> Result<Streaming<WatchEvent>, RpcError> {
        self.call("Watch", |ch, _| {
            let req = req.clone();
            async move { objects(ch).watch(req).await }
        })
        .await
    }

    pub async fn create_token(
        &mut self,
        req: CreateTokenRequest,
    ) -> Result<CreateTokenResponse, RpcError> {
        self.call("CreateToken", |ch, t| {
            let req = timed(req.clone(), t);
            async move { nodes(ch).create_token(req).await }
        })
        .await
    }

    /// Join the cluster with a join token (a nodelet's first call). The token is single use
    /// by default, so a retry after an answer lost on the way back fails as spent: the caller
    /// says so rather than retrying forever.
    pub async fn join(&mut self, req: JoinRequest) -> Result<JoinResponse, RpcError> {
        self.call("Join", |ch, t| {
            let req = timed(req.clone(), t);
            async move { nodes(ch).join(req).await }
        })
        .await
    }

    /// A nodelet's heartbeat: the node's observed status.
    pub async fn heartbeat(
        &mut self,
        req: HeartbeatRequest,
    ) -> Result<HeartbeatResponse, RpcError> {
        self.call("Heartbeat", |ch, t| {
            let req = timed(req.clone(), t);
            async move { nodes(ch).heartbeat(req).await }
        })
        .await
    }

    /// The API key of the service whose rank 0 is the caller's allocation (a nodelet's call).
    pub async fn service_key(
        &mut self,
        req: ServiceKeyRequest,
    ) -> Result<ServiceKeyResponse, RpcError> {
        self.call("ServiceKey", |ch, t| {
            let req = timed(req.clone(), t);
            async move { nodes(ch).service_key(req).await }
        })
        .await
    }

    /// Open a job's log stream. As with `watch`, only opening it is bounded by the timeout.
    pub async fn logs(&mut self, req: LogsRequest) -> Result<Streaming<LogLine>, RpcError> {
        self.call("Logs", |ch, _| {
            let req = req.clone();
            async move { nodes(ch).logs(req).await }
        })
        .await
    }

    pub async fn create_user(
        &mut self,
        req: CreateUserRequest,
    ) -> Result<IssueTokenResponse, RpcError> {
        self.call("CreateUser", |ch, t| {
            let req = timed(req.clone(), t);
            async move { auth(ch).create_user(req).await }
        })
        .await
    }

    pub async fn list_users(&mut self) -> Result<ListUsersResponse, RpcError> {
        self.call("ListUsers", |ch, t| {
            let req = timed(ListUsersRequest {}, t);
            async move { auth(ch).list_users(req).await }
        })
        .await
    }

    pub async fn delete_user(&mut self, name: &str) -> Result<DeleteUserResponse, RpcError> {
        self.call("DeleteUser", |ch, t| {
            let req = timed(DeleteUserRequest { name: name.into() }, t);
            async move { auth(ch).delete_user(req).await }
        })
        .await
    }

    pub async fn issue_token(
        &mut self,
        req: IssueTokenRequest,
    ) -> Result<IssueTokenResponse, RpcError> {
        self.call("IssueToken", |ch, t| {
            let req = timed(req.clone(), t);
            async move { auth(ch).issue_token(req).await }
        })
        .await
    }

    pub async fn revoke_token(&mut self, id: &str) -> Result<RevokeTokenResponse, RpcError> {
        self.call("RevokeToken", |ch, t| {
            let req = timed(RevokeTokenRequest { id: id.into() }, t);
            async move { auth(ch).revoke_token(req).await }
        })
        .await
    }

    pub async fn who_am_i(&mut self) -> Result<WhoAmIResponse, RpcError> {
        self.call("WhoAmI", |ch, t| {
            let req = timed(WhoAmIRequest {}, t);
            async move { auth(ch).who_am_i(req).await }
        })
        .await
    }

    pub async fn can_i(&mut self, req: CanIRequest) -> Result<CanIResponse, RpcError> {
        self.call("CanI", |ch, t| {
            let req = timed(req.clone(), t);
            async move { auth(ch).can_i(req).await }
        })
        .await
    }

    pub async fn audit(&mut self, req: AuditRequest) -> Result<AuditResponse, RpcError> {
        self.call("Audit", |ch, t| {
            let req = timed(req.clone(), t);
            async move { auth(ch).audit(req).await }
        })
        .await
    }

    pub async fn usage(
        &mut self,
        req: tb_api::proto::UsageRequest,
    ) -> Result<tb_api::proto::UsageResponse, RpcError> {
        self.call("Usage", |ch, t| {
            let req = timed(req.clone(), t);
            async move { auth(ch).usage(req).await }
        })
        .await
    }

    pub async fn cluster_status(&mut self) -> Result<ClusterStatusResponse, RpcError> {
        self.call("Status", |ch, t| {
            let req = timed(ClusterStatusRequest {}, t);
            async move { cluster(ch).status(req).await }
        })
        .await
    }

    pub async fn add_member(
        &mut self,
        req: AddMemberRequest,
    ) -> Result<Option<ClusterStatusResponse>, RpcError> {
        self.call("AddMember", |ch, t| {
            let req = timed(req.clone(), t);
            async move { cluster(ch).add_member(req).await }
        })
        .await
        .map(|r| r.status)
    }

    /// The controller join token (`tbctl cluster join-token`; admins only).
    /// With `rotate`, a new one first (the old one stops working).
    pub async fn member_join_token(&mut self, rotate: bool) -> Result<String, RpcError> {
        self.call("MemberJoinToken", |ch, t| {
            let req = timed(MemberJoinTokenRequest { rotate }, t);
            async move { cluster(ch).member_join_token(req).await }
        })
        .await
        .map(|r| r.token)
    }

    /// A snapshot file of the whole store, streamed in pieces (`tbctl snapshot save`).
    pub async fn save_snapshot(&mut self) -> Result<Streaming<SnapshotChunk>, RpcError> {
        self.call("SaveSnapshot", |ch, _| async move {
            cluster(ch).save_snapshot(SaveSnapshotRequest {}).await
        })
        .await
    }

    pub async fn remove_member(
        &mut self,
        req: RemoveMemberRequest,
    ) -> Result<Option<ClusterStatusResponse>, RpcError> {
        self.call("RemoveMember", |ch, t| {
            let req = timed(req, t);
            async move { cluster(ch).remove_member(req).await }
        })
        .await
        .map(|r| r.status)
    }
}

fn objects(ch: AuthChannel) -> ObjectsClient<AuthChannel> {
    ObjectsClient::new(ch)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

fn nodes(ch: AuthChannel) -> NodesClient<AuthChannel> {
    NodesClient::new(ch)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

fn auth(ch: AuthChannel) -> AuthClient<AuthChannel> {
    AuthClient::new(ch)
}

fn cluster(ch: AuthChannel) -> ClusterClient<AuthChannel> {
    ClusterClient::new(ch)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

/// A request carrying its deadline, so the server stops working on it when tbctl stops waiting.
fn timed<T>(msg: T, t: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(t);
    r
}

/// A fresh idempotency key for one logical write.
pub fn request_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn fill_request_id(id: &mut String) {
    if id.is_empty() {
        *id = request_id();
    }
}

/// A duration as tb's messages write it: `3s`, `400ms`.
pub fn fmt_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::parse_server_list;

    #[test]
    fn a_token_without_a_ca_needs_insecure() {
        let servers = parse_server_list("mac1:7400").expect("servers");
        let plain = Client::new(servers.clone(), Duration::from_secs(1));
        assert!(
            plain.clear_text_refusal().is_none(),
            "no token: nothing secret"
        );
        let with_token = Client::new(servers, Duration::from_secs(1)).with_token(Some("tbuser-x"));
        let refusal = with_token.clear_text_refusal().expect("refused");
        assert!(
            refusal
                .message
                .starts_with("no CA configured for https://mac1:7400: pass --ca-cert FILE"),
            "{}",
            refusal.message
        );
        assert!(
            with_token
                .with_insecure(true)
                .clear_text_refusal()
                .is_none()
        );
    }

    #[test]
    fn a_write_keeps_its_request_id_and_gets_one_when_it_has_none() {
        let mut given = "op-1".to_string();
        fill_request_id(&mut given);
        assert_eq!(given, "op-1");
        let mut empty = String::new();
        fill_request_id(&mut empty);
        assert_eq!(empty.len(), 36, "{empty}");
    }

    #[test]
    fn rpc_error_shows_the_server_message_as_is() {
        let e = RpcError::from_status(&Status::invalid_argument(
            "spec.nodes.min: expected at least 1",
        ));
        assert_eq!(e.to_string(), "spec.nodes.min: expected at least 1");
        assert_eq!(e.code, Code::InvalidArgument);
        let e = RpcError::from_status(&Status::new(Code::NotFound, ""));
        assert!(!e.to_string().is_empty());
    }

    #[test]
    fn attempts_share_the_budget_among_servers() {
        let one = Client::new(
            parse_server_list("a:1").expect("list"),
            Duration::from_secs(10),
        );
        assert_eq!(
            one.attempt_budget(Duration::from_secs(7)),
            Duration::from_secs(7)
        );
        let three = Client::new(
            parse_server_list("a:1,b:1,c:1").expect("list"),
            Duration::from_secs(30),
        );
        assert_eq!(
            three.attempt_budget(Duration::from_secs(30)),
            Duration::from_secs(10)
        );
        assert_eq!(
            three.attempt_budget(Duration::from_secs(1)),
            Duration::from_secs(1)
        );
        let short = Client::new(
            parse_server_list("a:1,b:1,c:1").expect("list"),
            Duration::from_secs(3),
        );
        assert_eq!(short.attempt_budget(Duration::from_secs(3)), MIN_ATTEMPT);
    }

    #[test]
    fn fail_over_cycles_through_servers() {
        let mut c = Client::new(
            parse_server_list("a:1,b:1").expect("list"),
            Duration::from_secs(1),
        );
        assert_eq!(c.current_server().map(AsRef::as_ref), Some("a:1"));
        c.fail_over();
        assert_eq!(c.current_server().map(AsRef::as_ref), Some("b:1"));
        c.fail_over();
        assert_eq!(c.current_server().map(AsRef::as_ref), Some("a:1"));
    }

    #[tokio::test]
    async fn unreachable_servers_are_reported_by_address() {
        // Port 1 on localhost refuses connections.
        let servers = parse_server_list("127.0.0.1:1,[::1]:1").expect("list");
        let mut c = Client::new(servers, Duration::from_millis(400)).with_refused(Refused::Retry);
        let e = c
            .list(ListRequest::default())
            .await
            .expect_err("nothing listens");
        assert_eq!(e.code, Code::Unavailable);
        assert!(e.message.contains("127.0.0.1:1"), "{}", e.message);
        assert!(e.message.contains("within 400ms"), "{}", e.message);
    }

    #[tokio::test]
    async fn refused_everywhere_fails_at_once_by_default() {
        let servers = parse_server_list("127.0.0.1:1,127.0.0.1:2").expect("list");
        let mut c = Client::new(servers, Duration::from_secs(10));
        let started = std::time::Instant::now();
        let e = c
            .list(ListRequest::default())
            .await
            .expect_err("nothing listens");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "took {:?}",
            started.elapsed()
        );
        assert_eq!(e.code, Code::Unavailable);
        for want in ["127.0.0.1:1", "127.0.0.1:2", "connection refused"] {
            assert!(e.message.contains(want), "{want}: {}", e.message);
        }
    }
}
