//! The object store: the deterministic state every controller replicates, and the watch hub
//! that turns applied changes into watch streams.

pub mod command;
pub mod join_tokens;
pub mod state;
pub mod usage;
pub mod users;
pub mod watch;

pub use command::{ApplyResult, Command, Op, Outcome, Plan, PlanWrite, Response, StoreError};
pub use join_tokens::JoinToken;
pub use state::{Change, ChangeKind, State};
pub use usage::{Ledger, UsageTick};
pub use users::{AuditRecord, Role, TokenRecord, User};
pub use watch::WatchHub;
