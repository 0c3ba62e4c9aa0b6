//! The commands replicated through the Raft log, and what applying one answers.
//!
//! A command is built by whichever controller received the request (which also stamps the time,
//! so that applying it is deterministic on every member) and carries the client's idempotency
//! key, so a retried write whose outcome was unknown is applied once.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tb_api::{Object, ObjectKey};

use super::users::{AuditRecord, Role, TokenRecord};

/// A write to the object store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Command {
    /// Idempotency key chosen by the client; empty means "no deduplication".
    pub request_id: String,
    /// RFC 3339 time stamped by the proposing controller.
    pub now: String,
    pub op: Op,
    /// The user on whose behalf the command runs, for the audit log; empty for tb itself
    /// (reconcilers, nodelets), whose writes are not audited.
    #[serde(default)]
    pub user: String,
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.op {
            Op::Apply { objects } => write!(f, "apply {} object(s)", objects.len()),
            Op::Delete { key, .. } => write!(f, "delete {key}"),
            Op::UpdateStatus { key, .. } => write!(f, "status {key}"),
            Op::RecordEvent { .. } => write!(f, "event"),
            Op::CreateToken { .. } => write!(f, "create join token"),
            Op::Join { node, .. } => write!(f, "join {}", node.metadata.name),
            Op::Heartbeat { node, .. } => write!(f, "heartbeat {node}"),
            Op::Plan(p) => write!(f, "plan of {} write(s)", p.writes.len()),
            Op::CreateUser { name, .. } => write!(f, "create user {name}"),
            Op::DeleteUser { name } => write!(f, "delete user {name}"),
            Op::IssueToken { token, .. } => write!(f, "issue token {}", token.id),
            Op::RevokeToken { id } => write!(f, "revoke token {id}"),
            Op::BootstrapAdmin { .. } => write!(f, "bootstrap admin"),
            Op::RecordAudit { record } => write!(f, "audit {} {}", record.verb, record.kind),
            Op::RotateMemberJoinToken { .. } => write!(f, "rotate the controller join token"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// Create or update these objects, all or none. Objects are already validated.
    Apply {
        objects: Vec<Object>,
    },
    Delete {
        key: ObjectKey,
        /// 0: whatever is stored.
        resource_version: u64,
    },
    UpdateStatus {
        key: ObjectKey,
        status: Value,
        /// 0: whatever is stored.
        resource_version: u64,
    },
    /// Record an Event (kind Event); repeats of the latest identical event bump its count.
    RecordEvent {
        event: Object,
    },
    /// Keep a join token (its hash only) until `expires_at` (RFC 3339, UTC).
    CreateToken {
        token_hash: String,
        expires_at: String,
        description: String,
        /// How many joins it allows. None: an entry written before tokens had uses (applied as
        /// it was then: any number of joins, replacing nodes).
        #[serde(default)]
        uses: Option<u32>,
        /// The only node it joins as (and may replace); empty: any node not yet joined.
        #[serde(default)]
        node: String,
    },
    /// A nodelet joins with a token: its Node is registered and its credential kept (hashed).
    Join {
        token_hash: String,
        node: Object,
        credential_hash: String,
    },
    /// A nodelet reports its status; the store stamps the heartbeat time.
    Heartbeat {
        node: String,
        credential_hash: String,
        status: Value,
    },
    /// A reconciler's plan: applied whole, and only if every object it read is unchanged
    /// (as Nomad's plan applier checks a scheduler's plan against the state it was made from).
    Plan(Plan),
    /// A user (its role and the namespaces a member may write in).
    CreateUser {
        name: String,
        role: Role,
        namespaces: Vec<String>,
    },
    /// Remove a user and every token it has.
    DeleteUser {
        name: String,
    },
    /// Keep a user's bearer token (its hash only) until `token.expires_at`.
    IssueToken {
        token_hash: String,
        token: TokenRecord,
    },
    RevokeToken {
        id: String,
    },
    /// The first admin and its token, made by the controller that forms the cluster; applied
    /// once per cluster.
    BootstrapAdmin {
        token_hash: String,
        token: TokenRecord,
        /// The new cluster's id (random, chosen by the member that proposes this); the first
        /// to commit wins. Absent from commands logged before clusters had ids.
        #[serde(default)]
        cluster_id: String,
    },
    /// Record a refusal that never reached the store (a denied mutation).
    RecordAudit {
        record: AuditRecord,
    },
    /// A new salt for the controller join token: the token every member derives from the
    /// cluster secret changes, and the old one stops working (`tbctl cluster join-token
    /// --rotate`). The salt alone tells nothing about the token.
    RotateMemberJoinToken {
        salt: String,
    },
}

/// What a reconciler computed from one snapshot of the store.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Objects the plan depends on, with the resourceVersion seen (0: must not exist).
    pub guards: Vec<(ObjectKey, u64)>,
    pub writes: Vec<PlanWrite>,
    /// Events to record with the plan.
    pub events: Vec<Object>,
    /// Only refreshes why a waiting job still waits (same reason, new details): the leader
    /// may leave it to a later pass when a pass has many, so that placements never queue
    /// behind thousands of them. Not replicated.
    #[serde(skip)]
    pub deferrable: bool,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.events.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum PlanWrite {
    /// Create, or replace metadata labels/annotations, spec and status of, an object.
    Put(Object),
    /// Replace only the status.
    Status {
        key: ObjectKey,
        status: Value,
    },
    Delete {
        key: ObjectKey,
    },
    /// Account usage up to a time (see `store::usage`).
    Usage(super::usage::UsageTick),
}

/// What applying a command produced, returned to the client that proposed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Response {
    /// No command (blank or membership entries).
    None,
    Applied {
        results: Vec<ApplyResult>,
        resource_version: u64,
    },
    // Objects are shared with the store: the idempotency table keeps answers whole at the cost
    // of a pointer, not a copy.
    Deleted {
        object: Arc<Object>,
        resource_version: u64,
    },
    Status {
        object: Arc<Object>,
    },
    Event {
        object: Arc<Object>,
    },
    Planned {
        resource_version: u64,
    },
    TokenCreated,
    /// A command with nothing to answer succeeded.
    Done,
    Rejected(StoreError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Created,
    Configured,
    Unchanged,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Configured => "configured",
            Outcome::Unchanged => "unchanged",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApplyResult {
    pub outcome: Outcome,
    pub object: Arc<Object>,
}

/// Why the store refused a command. Deterministic: every member refuses the same way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum StoreError {
    #[error("{0} not found")]
    NotFound(String),
    #[error(
        "conflict on {key}: the object has resourceVersion {current}, the request expected {expected}; re-read it and retry"
    )]
    Conflict {
        key: String,
        expected: u64,
        current: u64,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    PermissionDenied(String),
}
