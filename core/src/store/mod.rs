//! The object store's deterministic state: what every controller replicates, the commands that
//! change it, and the records it keeps (users, tokens, join tokens, usage).

pub mod command;
pub mod join_tokens;
pub mod state;
pub mod usage;
pub mod users;

pub use command::{ApplyResult, Command, Op, Outcome, Plan, PlanWrite, Response, StoreError};
pub use join_tokens::JoinToken;
pub use state::{Change, ChangeKind, State};
pub use usage::{Ledger, UsageTick};
pub use users::{AuditRecord, Role, TokenRecord, User};
