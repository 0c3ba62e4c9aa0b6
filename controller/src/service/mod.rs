//! The gRPC services a controller serves to users, nodelets and other controllers.

pub mod cluster;
pub mod nodes;
pub mod objects;

use tonic::Status;

use crate::raft::{RaftNode, Unavailable};
use crate::store::{Command, Op, Response, StoreError};

/// Commit one write through Raft, stamped now; a refusal by the store becomes its gRPC status.
pub(crate) async fn commit(
    node: &RaftNode,
    request_id: String,
    op: Op,
) -> Result<Response, Status> {
    let cmd = Command {
        request_id,
        now: now(),
        op,
    };
    match node.propose(cmd).await.map_err(unavailable)? {
        Response::Rejected(e) => Err(store_error(e)),
        r => Ok(r),
    }
}

/// The time a command is stamped with: RFC 3339, UTC, milliseconds — one format everywhere, so
/// that the store may compare timestamps as strings.
pub(crate) fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

pub(crate) fn unavailable(e: Unavailable) -> Status {
    Status::unavailable(e.to_string())
}

pub(crate) fn store_error(e: StoreError) -> Status {
    match e {
        StoreError::NotFound(_) => Status::not_found(e.to_string()),
        StoreError::Conflict { .. } => Status::aborted(e.to_string()),
        StoreError::Invalid(_) => Status::invalid_argument(e.to_string()),
        StoreError::Unauthenticated(_) => Status::unauthenticated(e.to_string()),
    }
}
