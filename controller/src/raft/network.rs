//! Raft messages between controllers, carried by the internal `Raft` gRPC service (over TLS
//! with the cluster CA, `Credentials::endpoint`), or within one process by `super::memory`.
//!
//! Each message is the serde encoding of openraft's own request type; the answer is the serde
//! encoding of `Result<Response, RaftError>`.

use std::collections::HashMap;
use std::future::Future;
use std::io::Cursor;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::errors::{
    NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetworkFactory, v2::RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, OptionalSend};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tb_api::proto::raft_client::RaftClient;
use tb_api::proto::{MemberStatus, MemberStatusRequest, RaftPayload, ReadIndexRequest};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::{NodeId, Snapshot, TypeConfig, Vote};
use crate::credentials::Credentials;

/// The largest message between controllers: a full snapshot travels in one.
pub const MAX_MESSAGE: usize = 512 * 1024 * 1024;

/// Every call to another controller carries the cluster secret (`crate::credentials`).
#[derive(Debug, Clone, Default)]
pub struct PeerAuth {
    header: Option<tonic::metadata::AsciiMetadataValue>,
}

impl PeerAuth {
    pub fn new(cluster_secret: &str) -> Self {
        let header = (!cluster_secret.is_empty())
            .then(|| format!("Bearer {cluster_secret}").parse().ok())
            .flatten();
        PeerAuth { header }
    }
}

impl tonic::service::Interceptor for PeerAuth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.header {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// A channel to another controller that presents the cluster secret.
pub type PeerChannel = InterceptedService<Channel, PeerAuth>;

/// The calls one controller makes to another, whatever carries them.
#[derive(Debug, Clone, Copy)]
pub(super) enum Method {
    Append,
    Vote,
    Snapshot,
    TransferLeader,
    /// A follower's command for the leader.
    Propose,
    /// A follower asking the leader for a read index (the payload is ignored).
    ReadIndex,
}

/// How this member reaches the others: gRPC over TLS between processes, or straight calls
/// between members of one process (`super::memory`, for tests).
#[derive(Clone)]
pub(super) enum Peers {
    Grpc(GrpcPeers),
    Memory(super::memory::MemoryPeer),
}

impl Peers {
    /// Send one serde-encoded message to the controller at `addr` and return its answer.
    pub(super) async fn call(
        &self,
        addr: &str,
        method: Method,
        data: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, tonic::Status> {
        match self {
            Peers::Grpc(grpc) => grpc.call(addr, method, data, timeout).await,
            Peers::Memory(memory) => memory.call(addr, method, data, timeout).await,
        }
    }

    /// Another member's own view of itself.
    pub(super) async fn member_status(
        &self,
        addr: &str,
        timeout: Duration,
    ) -> Result<MemberStatus, tonic::Status> {
        match self {
            Peers::Grpc(grpc) => grpc.member_status(addr, timeout).await,
            Peers::Memory(memory) => memory.member_status(addr, timeout).await,
        }
    }
}

/// Lazily connected channels to other controllers, shared by Raft replication and forwarding.
#[derive(Clone)]
pub(super) struct GrpcPeers {
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    credentials: Arc<Credentials>,
}

impl GrpcPeers {
    pub(super) fn new(credentials: Arc<Credentials>) -> Self {
        GrpcPeers {
            channels: Arc::default(),
            credentials,
        }
    }

    fn client(&self, addr: &str) -> Result<RaftClient<PeerChannel>, tonic::Status> {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        let channel = match channels.get(addr) {
            Some(c) => c.clone(),
            None => {
                let c = self
                    .credentials
                    .endpoint(addr)
                    .map_err(|e| tonic::Status::unavailable(e.to_string()))?
                    .connect_timeout(Duration::from_millis(500))
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(Duration::from_secs(5))
                    .connect_lazy();
                channels.insert(addr.to_string(), c.clone());
                c
            }
        };
        Ok(
            RaftClient::with_interceptor(channel, self.credentials.peer_auth())
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
        )
    }

    async fn call(
        &self,
        addr: &str,
        method: Method,
        data: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, tonic::Status> {
        let mut client = self.client(addr)?;
        let mut req = tonic::Request::new(RaftPayload { data });
        req.set_timeout(timeout);
        let reply = match method {
            Method::Append => client.append(req).await?,
            Method::Vote => client.vote(req).await?,
            Method::Snapshot => client.snapshot(req).await?,
            Method::TransferLeader => client.transfer_leader(req).await?,
            Method::Propose => client.propose(req).await?,
            Method::ReadIndex => {
                let mut req = tonic::Request::new(ReadIndexRequest {});
                req.set_timeout(timeout);
                client.read_index(req).await?
            }
        };
        Ok(reply.into_inner().data)
    }

    async fn member_status(
        &self,
        addr: &str,
        timeout: Duration,
    ) -> Result<MemberStatus, tonic::Status> {
        let mut client = self.client(addr)?;
        let mut req = tonic::Request::new(MemberStatusRequest {});
        req.set_timeout(timeout);
        Ok(client.member_status(req).await?.into_inner())
    }
}

impl RaftNetworkFactory<TypeConfig> for Peers {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        PeerClient {
            target,
            addr: node.addr.clone(),
            peers: self.clone(),
        }
    }
}

pub struct PeerClient {
    target: NodeId,
    addr: String,
    peers: Peers,
}

#[derive(Debug, thiserror::Error)]
#[error("controller {target} at {addr}: {message}")]
struct PeerError {
    target: NodeId,
    addr: String,
    message: String,
}

impl PeerClient {
    fn error(&self, message: impl std::fmt::Display) -> PeerError {
        PeerError {
            target: self.target,
            addr: self.addr.clone(),
            message: message.to_string(),
        }
    }

    async fn call<Req, Resp>(
        &self,
        method: Method,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp, RPCError<TypeConfig>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        let data = serde_json::to_vec(req)
            .map_err(|e| RPCError::Network(NetworkError::new(&self.error(e))))?;
        let reply = self
            .peers
            .call(&self.addr, method, data, timeout)
            .await
            .map_err(|status| {
                let err = self.error(format!("{}: {}", status.code(), status.message()));
                match status.code() {
                    tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Cancelled => RPCError::Unreachable(Unreachable::new(&err)),
                    _ => RPCError::Network(NetworkError::new(&err)),
                }
            })?;
        let result: Result<Resp, RaftError<TypeConfig>> = serde_json::from_slice(&reply)
            .map_err(|e| RPCError::Network(NetworkError::new(&self.error(e))))?;
        result.map_err(|e| RPCError::Unreachable(Unreachable::new(&self.error(e))))
    }
}

/// The least time an append with entries is given.
const APPEND_TIMEOUT_FLOOR: Duration = Duration::from_secs(1);

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        // openraft allows an append one heartbeat interval (50 ms); a batch of a few hundred
        // plans plus the follower's fsync takes longer on a loaded machine, and each timeout
        // restarts the follower's replication stream from scratch. Heartbeats are sent
        // by their own worker (empty appends, which keep the short deadline), so a longer wait
        // here does not delay failure detection.
        let timeout = if rpc.entries.is_empty() {
            option.hard_ttl()
        } else {
            option.hard_ttl().max(APPEND_TIMEOUT_FLOOR)
        };
        self.call(Method::Append, &rpc, timeout).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(Method::Vote, &rpc, option.hard_ttl()).await
    }

    async fn full_snapshot(
        &mut self,
        vote_: Vote,
        snapshot_: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let req = (vote_, snapshot_.meta, snapshot_.snapshot.into_inner());
        tokio::pin!(cancel);
        tokio::select! {
            closed = &mut cancel => Err(StreamingError::Closed(closed)),
            // A snapshot can be large; allow it far longer than a heartbeat.
            res = self.call(Method::Snapshot, &req, Duration::from_secs(120)) => Ok(res?),
        }
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(Method::TransferLeader, &req, option.hard_ttl())
            .await
    }
}
