//! tb-controller: the replicated control plane. The Raft store (`raft`, `store`) holds every
//! object; `service` serves the gRPC API through one `interceptor`, which identifies callers
//! for `auth`; `tls` holds the cluster CA and the certificates it signs; `server` assembles
//! them.

pub mod auth;
pub mod clock;
pub mod datadir;
pub mod interceptor;
pub mod metrics;
pub mod placement;
pub mod raft;
pub mod reconciler;
pub mod scheduler;
pub mod server;
pub mod service;
pub mod store;
pub mod tls;
