//! The `Nodes` gRPC service: join tokens, nodelets joining and heartbeating, and job logs
//! streamed from the nodelets that run the ranks.
//!
//! Secrets (tokens, credentials) are random, shown once, and stored only as SHA-256 hashes.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tb_api::proto::nodelet_client::NodeletClient;
use tb_api::proto::nodes_server::Nodes;
use tb_api::proto::{
    CreateTokenRequest, CreateTokenResponse, HeartbeatRequest, HeartbeatResponse, JoinRequest,
    JoinResponse, LogLine, LogsRequest, ServiceKeyRequest, ServiceKeyResponse,
};
use tb_api::status::{JobStatus, NodeStatus};
use tb_api::{Kind, Object, ObjectKey};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response as TonicResponse, Status};

use super::{caller, check};
use crate::auth::authorize::JOIN_TOKEN;
use crate::auth::{Access, Caller, NODE_CREDENTIAL_PREFIX, Verb, hash_secret, secret};
use crate::credentials::Credentials;
use crate::raft::RaftNode;
use crate::store::join_tokens::MAX_TOKEN_USES;
use crate::store::{Op, Response};

/// How long a join token lives when the request does not say.
const DEFAULT_TOKEN_TTL: u64 = 24 * 3600;
/// The longest note kept with a join token.
const MAX_DESCRIPTION: usize = 1024;

/// At most 1 KiB of a message quoted back to a caller.
fn truncate_for_message(s: &str) -> String {
    const MAX: usize = 1024;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

pub struct NodesService {
    node: Arc<RaftNode>,
    heartbeat_interval_ms: u64,
    /// Told to every nodelet, which fences itself within it (see `HeartbeatResponse`).
    node_grace_ms: u64,
}

impl NodesService {
    pub fn new(node: Arc<RaftNode>, heartbeat_interval_ms: u64, node_grace_ms: u64) -> Self {
        NodesService {
            node,
            heartbeat_interval_ms,
            node_grace_ms,
        }
    }

    async fn commit(&self, caller: &Caller, op: Op) -> Result<Response, Status> {
        super::commit(&self.node, String::new(), caller.user(), op).await
    }
}

type LogStream = Pin<Box<dyn Stream<Item = Result<LogLine, Status>> + Send>>;

#[tonic::async_trait]
impl Nodes for NodesService {
    async fn create_token(
        &self,
        req: Request<CreateTokenRequest>,
    ) -> Result<TonicResponse<CreateTokenResponse>, Status> {
        let caller = caller(&req);
        check(
            &self.node,
            &caller,
            &Access::new(Verb::Create, JOIN_TOKEN, "", ""),
        )?;
        let req = req.into_inner();
        let ttl = if req.ttl_seconds == 0 {
            DEFAULT_TOKEN_TTL
        } else {
            req.ttl_seconds
        };
        let ttl =
            i64::try_from(ttl).map_err(|_| Status::invalid_argument("ttlSeconds: too large"))?;
        let expires = chrono::Utc::now()
            .checked_add_signed(chrono::TimeDelta::seconds(ttl))
            .ok_or_else(|| Status::invalid_argument("ttlSeconds: too large"))?;
        let expires_at = crate::scheduler::stamp(expires);
        // Single use unless asked otherwise; the store checks the bounds again.
        let uses = req.uses.max(1);
        if uses > MAX_TOKEN_USES {
            return Err(Status::invalid_argument(format!(
                "uses: expected 1 to {MAX_TOKEN_USES}, got {uses}"
            )));
        }
        if !req.node.is_empty()
            && let Err(e) = tb_api::name::validate_name(&req.node)
        {
            return Err(Status::invalid_argument(format!(
                "node: {}",
                truncate_for_message(&e.to_string())
            )));
        }
        if req.description.len() > MAX_DESCRIPTION {
            return Err(Status::invalid_argument(format!(
                "description: at most {MAX_DESCRIPTION} bytes, got {}",
                req.description.len()
            )));
        }
        let token = secret("tbjoin-");
        self.commit(
            &caller,
            Op::CreateToken {
                token_hash: hash_secret(&token),
                expires_at: expires_at.clone(),
                description: req.description,
                uses: Some(uses),
                node: req.node.clone(),
            },
        )
        .await?;
        Ok(TonicResponse::new(CreateTokenResponse {
            token,
            expires_at,
            uses,
            node: req.node,
        }))
    }

    async fn join(&self, req: Request<JoinRequest>) -> Result<TonicResponse<JoinResponse>, Status> {
        let req = req.into_inner();
        tb_api::version::check_nodelet(req.protocol_version)
            .map_err(Status::failed_precondition)?;
        if req.token.is_empty() {
            return Err(Status::unauthenticated(
                "a join token is required (tbctl token create)",
            ));
        }
        let node = tb_api::load::parse_object_json(&req.node_json)
            .map_err(|e| Status::invalid_argument(format!("node: {e}")))?;
        if node.kind != Kind::Node.as_str() {
            return Err(Status::invalid_argument("node: kind: expected Node"));
        }
        tb_api::validate::validate_status(Kind::Node, &node.status)
            .map_err(|e| Status::invalid_argument(format!("node: {e}")))?;
        let credential = secret(NODE_CREDENTIAL_PREFIX);
        let op = Op::Join {
            token_hash: hash_secret(&req.token),
            node,
            credential_hash: hash_secret(&credential),
        };
        match self.commit(&Caller::Anonymous, op).await? {
            Response::Status { object } => {
                // Issued once the join committed: only a node that joined gets a certificate.
                let (node_cert_pem, node_key_pem, ca_cert_pem) =
                    node_certificate(self.node.credentials(), &object)?;
                Ok(TonicResponse::new(JoinResponse {
                    credential,
                    node_json: object.to_json(),
                    node_cert_pem,
                    node_key_pem,
                    ca_cert_pem,
                }))
            }
            r => Err(Status::internal(format!("unexpected store response {r:?}"))),
        }
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<TonicResponse<HeartbeatResponse>, Status> {
        let req = req.into_inner();
        tb_api::name::validate_name(&req.node)
            .map_err(|m| Status::invalid_argument(format!("node: {m}")))?;
        // Checked at every beat too: a nodelet upgraded in place keeps its credential.
        tb_api::version::check_nodelet(req.protocol_version)
            .map_err(Status::failed_precondition)?;
        // Strict and bounded like any status: the heartbeat is proposed before the store
        // checks its credential.
        let status = tb_api::load::parse_status_json(Kind::Node, &req.status_json)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.commit(
            &Caller::Anonymous,
            Op::Heartbeat {
                node: req.node,
                credential_hash: hash_secret(&req.credential),
                status,
            },
        )
        .await?;
        Ok(TonicResponse::new(HeartbeatResponse {
            heartbeat_interval_ms: self.heartbeat_interval_ms,
            node_grace_ms: self.node_grace_ms,
        }))
    }

    type LogsStream = LogStream;

    async fn service_key(
        &self,
        req: Request<ServiceKeyRequest>,
    ) -> Result<TonicResponse<ServiceKeyResponse>, Status> {
        let caller = caller(&req);
        let req = req.into_inner();
        let service = service_of_rank_0(&self.node, &caller, &req.namespace, &req.allocation)?;
        let credentials = self.node.credentials();
        let key = credentials.service_key(
            &req.namespace,
            &service.metadata.name,
            &service.metadata.uid,
        );
        let cert = credentials
            .service_certificate(&req.namespace, &service.metadata.name)
            .map_err(|e| Status::internal(format!("issuing the service's certificate: {e:#}")))?;
        let (cert_pem, key_pem) = cert.map(|c| (c.cert_pem, c.key_pem)).unwrap_or_default();
        Ok(TonicResponse::new(ServiceKeyResponse {
            key: key.unwrap_or_default(),
            cert_pem,
            key_pem,
        }))
    }

    async fn logs(
        &self,
        req: Request<LogsRequest>,
    ) -> Result<TonicResponse<Self::LogsStream>, Status> {
        let caller = caller(&req);
        let rx = open_logs(&self.node, &caller, req.into_inner())?;
        Ok(TonicResponse::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// The InferenceService whose rank 0 is allocation `namespace/allocation`, when the caller is
/// the node that runs that rank 0 — the only one given the service's key and certificate,
/// which its nodelet writes where rank 0 reads them. Read from this controller's replica, which
/// may not have the allocation yet: the nodelet asks again on NOT_FOUND.
fn service_of_rank_0(
    node: &RaftNode,
    caller: &Caller,
    namespace: &str,
    allocation: &str,
) -> Result<Object, Status> {
    let Caller::Node { name: caller_node } = caller else {
        return Err(Status::permission_denied(format!(
            "{caller} may not read service keys: only the node that runs a service's rank 0 may"
        )));
    };
    tb_api::name::validate_namespace(namespace)
        .map_err(|m| Status::invalid_argument(format!("namespace: {m}")))?;
    tb_api::name::validate_name(allocation)
        .map_err(|m| Status::invalid_argument(format!("allocation: {m}")))?;
    let state = node.store().read();
    let alloc_key = ObjectKey {
        kind: Kind::Allocation.as_str().into(),
        namespace: namespace.into(),
        name: allocation.into(),
    };
    let alloc = state
        .get(&alloc_key)
        .ok_or_else(|| Status::not_found(format!("{alloc_key} not found")))?;
    let spec: tb_api::specs::AllocationSpec = tb_api::specs::parse_spec(&alloc.spec)
        .map_err(|e| Status::internal(format!("{alloc_key}: {e}")))?;
    let is_rank_0_of_a_service = spec.rank == 0
        && spec.executor == tb_api::specs::Executor::Builtin
        && spec.job.kind == Kind::InferenceService.as_str();
    if !is_rank_0_of_a_service || &spec.node != caller_node {
        return Err(Status::permission_denied(format!(
            "{alloc_key} is not rank 0 of a built-in InferenceService on node {caller_node:?}"
        )));
    }
    let service_key = ObjectKey {
        kind: Kind::InferenceService.as_str().into(),
        namespace: namespace.into(),
        name: spec.job.name.clone(),
    };
    let service = state
        .get(&service_key)
        .ok_or_else(|| Status::not_found(format!("{service_key} not found")))?;
    if !spec.job.uid.is_empty() && spec.job.uid != service.metadata.uid {
        return Err(Status::failed_precondition(format!(
            "{alloc_key} belongs to an earlier {service_key} of the same name"
        )));
    }
    Ok(Object::clone(service))
}

/// The lines of a job's ranks, read from the nodelets that ran them, for `caller` (who must
/// be allowed to get the job): `tbctl logs` and the dashboard both read logs through here.
pub(crate) fn open_logs(
    node: &Arc<RaftNode>,
    caller: &Caller,
    req: LogsRequest,
) -> Result<tokio::sync::mpsc::Receiver<Result<LogLine, Status>>, Status> {
    let kind = Kind::parse(&req.kind)
        .filter(|k| matches!(k, Kind::TrainingJob | Kind::InferenceService))
        .ok_or_else(|| {
            Status::invalid_argument("kind: expected TrainingJob or InferenceService")
        })?;
    let namespace = if req.namespace.is_empty() {
        "default".to_string()
    } else {
        req.namespace.clone()
    };
    tb_api::name::validate_name(&req.name)
        .map_err(|m| Status::invalid_argument(format!("name: {m}")))?;
    tb_api::name::validate_namespace(&namespace)
        .map_err(|m| Status::invalid_argument(format!("namespace: {m}")))?;
    let key = ObjectKey {
        kind: kind.as_str().into(),
        namespace: namespace.clone(),
        name: req.name.clone(),
    };
    check(
        node,
        caller,
        &Access::new(Verb::Get, &key.kind, &key.namespace, &key.name),
    )?;
    // Where each rank ran: the job's placement, and the nodelets' addresses.
    let targets: Vec<(u32, String, String)> = {
        let state = node.store().read();
        let job = state
            .get(&key)
            .ok_or_else(|| Status::not_found(format!("{key} not found")))?;
        let status = JobStatus::from_value(&job.status);
        if status.placement.is_empty() {
            return Err(Status::failed_precondition(format!(
                "{key} has not been placed yet ({}): no logs",
                if status.reason.is_empty() {
                    "Pending"
                } else {
                    &status.reason
                }
            )));
        }
        if req.rank >= 0 && !status.placement.iter().any(|p| p.rank as i32 == req.rank) {
            return Err(Status::invalid_argument(format!(
                "rank: {key} has ranks 0..{}, not {}",
                status.placement.len(),
                req.rank
            )));
        }
        status
            .placement
            .iter()
            .filter(|p| req.rank < 0 || p.rank as i32 == req.rank)
            .map(|p| {
                let address = node_address(
                    &state
                        .get(&ObjectKey {
                            kind: Kind::Node.as_str().into(),
                            namespace: String::new(),
                            name: p.node.clone(),
                        })
                        .map(|o| (**o).clone()),
                );
                (p.rank, p.allocation.clone(), address)
            })
            .collect()
    };
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    for (rank, allocation, address) in targets {
        let tx = tx.clone();
        let mut ask = req.clone();
        ask.namespace = namespace.clone();
        ask.allocation = allocation;
        ask.rank = rank as i32;
        let node = node.clone();
        tokio::spawn(async move {
            if let Err(status) = forward_logs(node.credentials(), &address, ask, &tx).await {
                let _ = tx
                    .send(Err(Status::unavailable(format!(
                        "rank {rank}: logs from nodelet at {address}: {}",
                        status.message()
                    ))))
                    .await;
            }
        });
    }
    Ok(rx)
}

/// A joined node's certificate, key and the CA (PEM), for the host of the address it registered;
/// all empty when TLS is off.
fn node_certificate(
    credentials: &Credentials,
    node: &Object,
) -> Result<(String, String, String), Status> {
    let address = NodeStatus::from_value(&node.status).address;
    match credentials.issue_node_cert(&node.metadata.name, &address) {
        Ok(Some((cert, ca))) => Ok((cert.cert_pem, cert.key_pem, ca)),
        Ok(None) => Ok(Default::default()),
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), node = %node.metadata.name, "issuing a node certificate");
            Err(Status::internal("issuing the node's certificate failed"))
        }
    }
}

fn node_address(node: &Option<Object>) -> String {
    node.as_ref()
        .map(|n| NodeStatus::from_value(&n.status).address)
        .unwrap_or_default()
}

async fn forward_logs(
    credentials: &Credentials,
    address: &str,
    req: LogsRequest,
    tx: &tokio::sync::mpsc::Sender<Result<LogLine, Status>>,
) -> Result<(), Status> {
    if address.is_empty() {
        return Err(Status::unavailable("the node has no address"));
    }
    let channel = credentials
        .endpoint(address)
        .map_err(|e| Status::internal(e.to_string()))?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let mut stream = NodeletClient::new(channel).logs(req).await?.into_inner();
    while let Some(line) = stream.message().await? {
        if tx.send(Ok(line)).await.is_err() {
            break;
        }
    }
    Ok(())
}
