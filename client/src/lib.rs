//! tb's controller client, shared by tbctl, the nodelet and the test harness.
//!
//! - [`Client`]: a list of controller members, failover to the next member on UNAVAILABLE and
//!   broken connections, one retry rule ([`retry`]), TLS with the cluster CA ([`tls`]) and the
//!   bearer token through one interceptor ([`auth`]), and no token over plain TCP unless the
//!   user said `--insecure` ([`tls::token_refused_in_clear`]).
//! - [`Informer`]: list, then watch from the list's resourceVersion, list again when the watch
//!   is too old or breaks, with a local copy of the objects and the changes as they come.

pub mod addr;
pub mod auth;
pub mod client;
pub mod connect;
pub mod informer;
pub mod retry;
pub mod tls;

pub use addr::{AddrError, ServerAddr, parse_server, parse_server_list};
pub use auth::{AuthChannel, Bearer};
pub use client::{Client, MAX_MESSAGE_BYTES, RpcError, fmt_duration, request_id};
pub use informer::{Change, Informer, Key, Position, Scope, key};
pub use retry::is_retryable;
pub use tls::Trust;
