//! The gRPC services a controller serves to users, nodelets and other controllers.

pub mod auth;
pub mod cluster;
mod member_join;
pub mod nodes;
pub mod objects;
mod priority;
pub mod usage;

use std::sync::Arc;

use tonic::Status;

use crate::auth::{Access, Caller, authorize};
use crate::raft::{RaftNode, Unavailable};
use crate::store::{AuditRecord, Command, Op, Response, StoreError};

/// Who sent `req`, as the RPC layer identified them.
pub(crate) fn caller<T>(req: &tonic::Request<T>) -> Caller {
    req.extensions()
        .get::<Caller>()
        .cloned()
        .unwrap_or(Caller::Anonymous)
}

/// Ask `authorize`; a refusal is PERMISSION_DENIED naming the verb and kind, and a refused
/// mutation is recorded in the audit log (best effort, through Raft, without waiting).
pub(crate) fn check(
    node: &Arc<RaftNode>,
    caller: &Caller,
    access: &Access<'_>,
) -> Result<(), Status> {
    let Err(denied) = authorize(caller, access) else {
        return Ok(());
    };
    tracing::info!(caller = %caller.audit_name(), refusal = %denied, "permission denied");
    if access.verb.is_some_and(|v| !v.is_read()) {
        // Cut before it is proposed: a refused call puts at most a few KiB into Raft.
        let record = AuditRecord {
            time: now(),
            user: caller.audit_name(),
            verb: denied.verb.clone(),
            kind: access.kind.to_string(),
            namespace: access.namespace.to_string(),
            name: access.name.to_string(),
            result: "PermissionDenied".into(),
        }
        .bounded();
        let node = node.clone();
        tokio::spawn(async move {
            if let Err(e) = commit(
                &node,
                String::new(),
                String::new(),
                Op::RecordAudit { record },
            )
            .await
            {
                tracing::debug!(error = %e, "recording a refusal in the audit log");
            }
        });
    }
    Err(Status::permission_denied(denied.to_string()))
}

/// Commit one write through Raft, stamped now, on behalf of `user` (empty: tb itself); a
/// refusal by the store becomes its gRPC status.
pub(crate) async fn commit(
    node: &RaftNode,
    request_id: String,
    user: String,
    op: Op,
) -> Result<Response, Status> {
    let cmd = Command {
        request_id,
        now: now(),
        op,
        user,
    };
    match node.propose(cmd).await.map_err(unavailable)? {
        Response::Rejected(e) => Err(store_error(e)),
        r => Ok(r),
    }
}

/// The time a command is stamped with: RFC 3339, UTC, milliseconds — one format everywhere, so
/// that the store may compare timestamps as strings.
pub(crate) fn now() -> String {
    tb_api::Timestamp::now().to_string()
}

pub(crate) fn unavailable(e: Unavailable) -> Status {
    match e {
        // Not retryable as such: it lasts until someone frees space, and says where.
        Unavailable::DiskFull(m) => Status::resource_exhausted(m),
        e => Status::unavailable(e.to_string()),
    }
}

pub(crate) fn store_error(e: StoreError) -> Status {
    match e {
        StoreError::NotFound(_) => Status::not_found(e.to_string()),
        StoreError::Conflict { .. } => Status::aborted(e.to_string()),
        StoreError::Invalid(_) => Status::invalid_argument(e.to_string()),
        StoreError::Unauthenticated(_) => Status::unauthenticated(e.to_string()),
        StoreError::AlreadyExists(_) => Status::already_exists(e.to_string()),
        StoreError::PermissionDenied(_) => Status::permission_denied(e.to_string()),
    }
}
