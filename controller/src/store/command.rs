//! The commands replicated through the Raft log, and what applying one answers.
//!
//! A command is built by whichever controller received the request (which also stamps the time,
//! so that applying it is deterministic on every member) and carries the client's idempotency
//! key, so a retried write whose outcome was unknown is applied once.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tb_api::{Object, ObjectKey};

/// A write to the object store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Command {
    /// Idempotency key chosen by the client; empty means "no deduplication".
    pub request_id: String,
    /// RFC 3339 time stamped by the proposing controller.
    pub now: String,
    pub op: Op,
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.op {
            Op::Apply { objects } => write!(f, "apply {} object(s)", objects.len()),
            Op::Delete { key, .. } => write!(f, "delete {key}"),
            Op::UpdateStatus { key, .. } => write!(f, "status {key}"),
            Op::RecordEvent { .. } => write!(f, "event"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// Create or update these objects, all or none. Objects are already validated.
    Apply { objects: Vec<Object> },
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
    RecordEvent { event: Object },
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
    Deleted {
        object: Object,
        resource_version: u64,
    },
    Status {
        object: Object,
    },
    Event {
        object: Object,
    },
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
    pub object: Object,
}

/// Why the store refused a command. Deterministic: every member refuses the same way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum StoreError {
    #[error("{0} not found")]
    NotFound(String),
    #[error("conflict on {key}: the object has resourceVersion {current}, the request expected {expected}; re-read it and retry")]
    Conflict {
        key: String,
        expected: u64,
        current: u64,
    },
    #[error("{0}")]
    Invalid(String),
}
