//! tb's data plane: one [`Transport`] API with two implementations (TCP in [`tcp`], RDMA verbs
//! in `rdma` behind the `rdma` feature), a TCP [`bootstrap`] all-gather that ranks use to
//! exchange addresses and queue-pair info, [`select`] which picks the transport, and
//! [`collectives`] (ring all-reduce, all-gather, broadcast, barrier, point-to-point tensors)
//! written once over `&mut dyn Transport`.
//!
//! The three layers follow MLX / NCCL / UCX: bootstrap (who is where) is separate from the data
//! path (register, post_send, post_recv, poll), which is separate from the algorithms.
//!
//! The crate depends on nothing else in tb: the nodelet (builtin executor, staging, link probes,
//! tb-shard) uses it, and its binary `tb-collbench` benchmarks the collectives on loopback. The
//! `rdma` feature builds the real RDMA providers (`tb-nodelet --features rdma` turns it on).
//!
//! # The contract every transport keeps
//!
//! - Synchronous and single-threaded from the caller's side: a rank drives its transport from one
//!   thread. A transport may use threads inside, or make progress only inside [`Transport::poll`]
//!   and the `post_*` calls (the TCP transport does the latter).
//! - Buffers are registered with, and owned by, the transport (like verbs' registered memory).
//!   Registered buffers are zero-filled, live until the transport is dropped, and their base
//!   address never moves. A buffer (or the range of it) named in a posted send or receive must not
//!   be read or written through [`Transport::buf`] / [`Transport::buf_mut`] until that work
//!   request's [`Completion`] has been returned by `poll`. Several in-flight sends may read the
//!   same buffer; in-flight receives must not overlap each other or any in-flight send's range.
//! - Messages between one pair of ranks are delivered in order, and receives posted for one peer
//!   are matched in the order they were posted: the k-th receive posted for `peer` gets the k-th
//!   message that `peer` sent to this rank. A send may be posted before the peer has posted the
//!   matching receive: the transport buffers or flow-controls (an RDMA transport must therefore
//!   keep credits; it may never drop a message).
//! - A message larger than the receive's capacity is a [`TransportError::Malformed`] completion
//!   naming the peer (never a silent truncation). Zero-length messages are allowed.
//! - Every failure names the peer when one is involved. After a peer failed (closed, malformed
//!   stream, I/O error) every in-flight work request for it completes with an error, and later
//!   posts to it fail at once. Nothing that comes from the network may panic.
//! - `post_send_at` / `post_recv_at` (ranges inside a buffer) are what the collectives use; their
//!   default implementations only accept offset 0, so a transport must override them to run the
//!   collectives (TCP does; RDMA: the work request's SGE address is `mr.addr + offset`).

pub mod bootstrap;
pub mod collectives;
pub mod select;
pub mod tcp;
pub mod wire;

/// RDMA verbs transport (Apple's librdma on macOS, rdma-core on Linux). The protocol is generic
/// and always built; the real providers and `rdma::open` need the `rdma` feature.
pub mod rdma;
/// A software model of the verbs API used to test the RDMA transport without a device.
pub mod verbs_sim;

use std::net::SocketAddr;
use std::time::Duration;

/// A buffer registered with a transport (an index into its table of registered memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufId(pub u32);

/// Which kind of work request completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompletionKind {
    /// A `post_send`/`post_send_at`: the buffer range may be reused.
    Send,
    /// A `post_recv`/`post_recv_at`: `len` bytes have arrived at the start of the range.
    Recv,
}

/// One finished work request, as returned by [`Transport::poll`].
#[derive(Debug)]
pub struct Completion {
    /// The caller's `wr_id` from the post.
    pub wr_id: u64,
    /// The peer rank the work request was for.
    pub peer: usize,
    /// Send or receive.
    pub kind: CompletionKind,
    /// Bytes sent, or bytes received (the message's length).
    pub len: usize,
    /// `Ok` or why the work request failed (the error names the peer).
    pub result: Result<(), TransportError>,
}

/// What a transport can do; collectives size their chunks from this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// `"tcp"` or `"rdma"`.
    pub name: &'static str,
    /// The largest message one `post_send` may carry.
    pub max_message: usize,
    /// Whether RDMA WRITE with immediate is available (never on Apple's UC-only verbs).
    pub write_with_immediate: bool,
    /// Parallel links (sockets or queue pairs) per peer that one message is striped over.
    pub rails: usize,
}

/// Why a transport operation failed. Every variant that involves a peer names it.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The peer closed its end (the process died or dropped its transport).
    #[error("rank {peer} closed the connection")]
    PeerClosed {
        /// The peer's rank.
        peer: usize,
    },
    /// Nothing arrived in time.
    #[error("timed out {}during {step}", peer.map(|p| format!("waiting for rank {p} ")).unwrap_or_default())]
    Timeout {
        /// The peer waited for, when one is known.
        peer: Option<usize>,
        /// What was being done (e.g. `all_reduce reduce-scatter step 2`).
        step: String,
    },
    /// The peer sent something that breaks the wire format or the expected sizes.
    #[error("malformed message from rank {peer}: {what}")]
    Malformed {
        /// The peer's rank.
        peer: usize,
        /// What was wrong, with expected and found values.
        what: String,
    },
    /// An operating-system error.
    #[error("I/O error{}: {source}", peer.map(|p| format!(" with rank {p}")).unwrap_or_default())]
    Io {
        /// The peer's rank, when the error is on its connection.
        peer: Option<usize>,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The transport cannot do this (no device, feature off, unsupported operation).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The caller broke the API contract (unknown buffer, range out of bounds, bad rank).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The rank-0 all-gather that exchanges addresses failed.
    #[error("bootstrap: {0}")]
    Bootstrap(String),
    /// A step of a collective failed because of a peer; `source` says how.
    #[error("{step}: {source}")]
    Collective {
        /// The collective and its step (e.g. `all_reduce(ring) all-gather step 1 chunk 3`).
        step: String,
        /// The transport error behind it.
        #[source]
        source: Box<TransportError>,
    },
}

impl TransportError {
    /// The peer rank the error is about, if any (looks through [`TransportError::Collective`]).
    pub fn peer(&self) -> Option<usize> {
        match self {
            TransportError::PeerClosed { peer } | TransportError::Malformed { peer, .. } => {
                Some(*peer)
            }
            TransportError::Timeout { peer, .. } | TransportError::Io { peer, .. } => *peer,
            TransportError::Collective { source, .. } => source.peer(),
            _ => None,
        }
    }

    /// Whether a peer went away (closed, silent, or its connection broke), as opposed to a
    /// peer that answered wrongly or a local mistake: the sign of a dead process or Mac.
    pub fn is_peer_loss(&self) -> bool {
        match self {
            TransportError::PeerClosed { .. } | TransportError::Timeout { .. } => true,
            TransportError::Io { peer, .. } => peer.is_some(),
            TransportError::Collective { source, .. } => source.is_peer_loss(),
            _ => false,
        }
    }

    /// An I/O error on the connection with `peer`.
    pub fn io(peer: usize, source: std::io::Error) -> Self {
        TransportError::Io {
            peer: Some(peer),
            source,
        }
    }
}

/// `io::Error` is not `Clone`; a clone keeps its kind and message (used to fail every in-flight
/// work request of a broken peer with the same error).
impl Clone for TransportError {
    fn clone(&self) -> Self {
        match self {
            TransportError::PeerClosed { peer } => TransportError::PeerClosed { peer: *peer },
            TransportError::Timeout { peer, step } => TransportError::Timeout {
                peer: *peer,
                step: step.clone(),
            },
            TransportError::Malformed { peer, what } => TransportError::Malformed {
                peer: *peer,
                what: what.clone(),
            },
            TransportError::Io { peer, source } => TransportError::Io {
                peer: *peer,
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            TransportError::Unsupported(s) => TransportError::Unsupported(s.clone()),
            TransportError::Invalid(s) => TransportError::Invalid(s.clone()),
            TransportError::Bootstrap(s) => TransportError::Bootstrap(s.clone()),
            TransportError::Collective { step, source } => TransportError::Collective {
                step: step.clone(),
                source: source.clone(),
            },
        }
    }
}

/// Where the ranks of one job are: what [`select::open`] and the transports' `open` functions
/// take.
#[derive(Debug, Clone)]
pub struct Endpoints {
    /// This rank, `0..world`.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// Data-plane address of every rank, indexed by rank. The TCP transport listens on
    /// `peers[rank]` (port 0 = any free port; the actual addresses are exchanged by bootstrap).
    /// The RDMA transport may use the IPs to pick the device / GID of each link.
    pub peers: Vec<SocketAddr>,
    /// Rank 0's bootstrap address (rank 0 listens there, every rank connects).
    pub coordinator: SocketAddr,
    /// How long connection set-up may take in total.
    pub connect_timeout: Duration,
}

/// The data path: registered buffers, two-sided send/receive, completion polling.
///
/// See the module documentation for the contract (ordering, buffer ownership, errors).
pub trait Transport: Send {
    /// This rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world(&self) -> usize;
    /// What this transport can do.
    fn capabilities(&self) -> Capabilities;
    /// Registers a zero-filled buffer of `len` bytes (8-byte aligned where possible).
    fn register(&mut self, len: usize) -> Result<BufId, TransportError>;
    /// The bytes of a registered buffer. Panics on an unknown id (a programming error).
    fn buf(&self, id: BufId) -> &[u8];
    /// The bytes of a registered buffer, writable. Panics on an unknown id.
    fn buf_mut(&mut self, id: BufId) -> &mut [u8];
    /// Send `len` bytes of `id` to `peer`; the buffer must not be touched until the Send completion.
    fn post_send(
        &mut self,
        peer: usize,
        id: BufId,
        len: usize,
        wr_id: u64,
    ) -> Result<(), TransportError>;
    /// Receive the next message from `peer` into `id` (messages from one peer arrive in order).
    fn post_recv(&mut self, peer: usize, id: BufId, wr_id: u64) -> Result<(), TransportError>;
    /// Completions so far, waiting up to `timeout` for at least one.
    fn poll(
        &mut self,
        out: &mut Vec<Completion>,
        timeout: std::time::Duration,
    ) -> Result<usize, TransportError>;

    /// Send bytes `offset..offset + len` of `id` to `peer`. Transports must override this to run
    /// the collectives; the default accepts only offset 0.
    fn post_send_at(
        &mut self,
        peer: usize,
        id: BufId,
        offset: usize,
        len: usize,
        wr_id: u64,
    ) -> Result<(), TransportError> {
        if offset == 0 {
            self.post_send(peer, id, len, wr_id)
        } else {
            Err(TransportError::Unsupported(format!(
                "{} transport: post_send_at with offset {offset}",
                self.capabilities().name
            )))
        }
    }

    /// Receive the next message from `peer` into bytes `offset..offset + max_len` of `id`.
    /// Transports must override this to run the collectives; the default accepts only a whole
    /// buffer (offset 0 and `max_len` = the buffer's length).
    fn post_recv_at(
        &mut self,
        peer: usize,
        id: BufId,
        offset: usize,
        max_len: usize,
        wr_id: u64,
    ) -> Result<(), TransportError> {
        if offset == 0 && max_len == self.buf(id).len() {
            self.post_recv(peer, id, wr_id)
        } else {
            Err(TransportError::Unsupported(format!(
                "{} transport: post_recv_at with offset {offset} and max_len {max_len}",
                self.capabilities().name
            )))
        }
    }
}

pub use select::{Preference, open};
