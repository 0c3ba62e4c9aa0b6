//! tb-controller: the replicated control plane. The Raft store (`raft`, `store`) holds every
//! object (its state machine, the scheduler and placement are pure, in `tb-core`); `service` serves the gRPC API through one `interceptor`, which identifies callers
//! for `auth`; `member_token` and `join` let a new controller join with a token; `tls` holds
//! the cluster CA and the certificates it signs; `services` serves InferenceServices at a
//! stable address and `dashboard` the web dashboard beside them; `server` assembles them.

pub mod auth;
pub mod clock;
pub mod credentials;
pub mod dashboard;
pub mod datadir;
pub mod disk_guard;
pub mod heartbeat_ages;
pub mod interceptor;
pub mod join;
pub mod member_token;
pub mod metrics;
pub mod raft;
pub mod rebuild;
pub mod reconciler;
pub mod restore;
pub mod server;
pub mod service;
pub mod services;
pub mod store;
pub mod tls;

// The pure parts live in tb-core; re-exported so the controller's paths read as before.
pub use tb_core::{placement, scheduler};
