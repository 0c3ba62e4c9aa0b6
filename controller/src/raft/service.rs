//! The internal `Raft` gRPC service: other controllers' Raft messages, forwarded commands and
//! read-index requests arrive here.

use std::io::Cursor;
use std::sync::Arc;

use openraft::ReadPolicy;
use openraft::errors::RaftError;
use openraft::raft::{SnapshotResponse, TransferLeaderResponse};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tb_api::proto::raft_server::Raft as RaftRpc;
use tb_api::proto::{MemberStatus, MemberStatusRequest, RaftPayload, ReadIndexRequest};
use tonic::{Request, Response as TonicResponse, Status};

use super::{ProposeReply, RaftNode, ReadIndexReply, Snapshot, TypeConfig};
use crate::store::Command;

pub struct RaftService {
    node: Arc<RaftNode>,
}

impl RaftService {
    pub fn new(node: Arc<RaftNode>) -> Self {
        RaftService { node }
    }
}

fn decode<T: DeserializeOwned>(req: Request<RaftPayload>) -> Result<T, Status> {
    serde_json::from_slice(&req.into_inner().data)
        .map_err(|e| Status::invalid_argument(format!("malformed raft message: {e}")))
}

/// A member whose data disk is low refuses what would write to it.
fn disk_full(e: crate::disk_guard::DiskFull) -> Status {
    Status::resource_exhausted(e.to_string())
}

fn encode<T: Serialize>(value: &T) -> Result<TonicResponse<RaftPayload>, Status> {
    serde_json::to_vec(value)
        .map(|data| TonicResponse::new(RaftPayload { data }))
        .map_err(|e| Status::internal(format!("encoding raft message: {e}")))
}

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn append(
        &self,
        req: Request<RaftPayload>,
    ) -> Result<TonicResponse<RaftPayload>, Status> {
        let rpc: openraft::raft::AppendEntriesRequest<TypeConfig> = decode(req)?;
        // Entries would be written to the log, and a vote this member has not seen (a new
        // leader's first heartbeat) would be written before anything else: refused while the
        // disk is low, since a failed write stops the member (the leader retries). Heartbeats
        // of the leader it knows write nothing, still pass and keep it a follower.
        let new_vote = self.node.raft_metrics().vote != rpc.vote;
        if !rpc.entries.is_empty() || new_vote {
            self.node.check_disk().map_err(disk_full)?;
        }
        encode(&self.node.raft.append_entries(rpc).await)
    }

    async fn vote(&self, req: Request<RaftPayload>) -> Result<TonicResponse<RaftPayload>, Status> {
        let rpc = decode(req)?;
        // Granting a vote writes it first.
        self.node.check_disk().map_err(disk_full)?;
        encode(&self.node.raft.vote(rpc).await)
    }

    async fn snapshot(
        &self,
        req: Request<RaftPayload>,
    ) -> Result<TonicResponse<RaftPayload>, Status> {
        let (vote, meta, data): (super::Vote, super::SnapshotMeta, Vec<u8>) = decode(req)?;
        self.node.check_disk().map_err(disk_full)?;
        let snapshot = Snapshot {
            meta,
            snapshot: Cursor::new(data),
        };
        let res: Result<SnapshotResponse<TypeConfig>, RaftError<TypeConfig>> = self
            .node
            .raft
            .install_full_snapshot(vote, snapshot)
            .await
            .map_err(RaftError::Fatal);
        encode(&res)
    }

    async fn transfer_leader(
        &self,
        req: Request<RaftPayload>,
    ) -> Result<TonicResponse<RaftPayload>, Status> {
        let rpc = decode(req)?;
        let res: Result<TransferLeaderResponse<TypeConfig>, RaftError<TypeConfig>> = self
            .node
            .raft
            .handle_transfer_leader(rpc)
            .await
            .map_err(RaftError::Fatal);
        encode(&res)
    }

    async fn propose(
        &self,
        req: Request<RaftPayload>,
    ) -> Result<TonicResponse<RaftPayload>, Status> {
        let cmd: Command = decode(req)?;
        let reply = match self.node.propose_local(cmd).await {
            Ok(r) => r,
            Err(super::Unavailable::DiskFull(e)) => ProposeReply::DiskFull(e),
            Err(e) => ProposeReply::Failed(e.to_string()),
        };
        encode(&reply)
    }

    async fn read_index(
        &self,
        _req: Request<ReadIndexRequest>,
    ) -> Result<TonicResponse<RaftPayload>, Status> {
        let reply: Result<ReadIndexReply, String> = match self
            .node
            .raft
            .get_read_linearizer(ReadPolicy::ReadIndex)
            .await
        {
            Ok(l) => Ok(ReadIndexReply {
                node_id: *l.node_id(),
                read_log_id: *l.read_log_id(),
                applied: l.applied().copied(),
            }),
            Err(e) => Err(e.to_string()),
        };
        encode(&reply)
    }

    async fn member_status(
        &self,
        _req: Request<MemberStatusRequest>,
    ) -> Result<TonicResponse<MemberStatus>, Status> {
        Ok(TonicResponse::new(self.node.member_status()))
    }
}
