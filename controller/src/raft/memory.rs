//! An in-process network of controllers, for tests: Raft messages, forwarded commands and
//! read-index requests go straight to the receiving member's handlers (`RaftService`, the same
//! code the gRPC service runs, serde encoding included), with no sockets, TLS or secrets. Links
//! can be cut one way or both, so a test can partition a cluster and heal it.
//!
//! Members keep their log and state machine in redb's in-memory backend: a member removed
//! from the network is gone for good (restarts and durability are tested with real processes).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tb_api::proto::raft_server::Raft as _;
use tb_api::proto::{MemberStatus, MemberStatusRequest, RaftPayload, ReadIndexRequest};

use super::network::Method;
use super::{RaftNode, RaftService};

/// The members of one in-process cluster and the links between them.
#[derive(Clone, Default)]
pub struct MemoryNetwork {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    /// Weak: a member's network handle must not keep the member alive.
    members: HashMap<String, Weak<RaftNode>>,
    /// Directed links that drop everything (from, to).
    cut: BTreeSet<(String, String)>,
}

impl MemoryNetwork {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn register(&self, node: &Arc<RaftNode>) {
        self.lock()
            .members
            .insert(node.addr.clone(), Arc::downgrade(node));
    }

    /// Take a member off the network (as if its machine died): nothing reaches it any more.
    pub fn remove(&self, addr: &str) {
        self.lock().members.remove(addr);
    }

    /// Drop every message from `from` to `to` (one direction only).
    pub fn cut(&self, from: &str, to: &str) {
        self.lock().cut.insert((from.to_string(), to.to_string()));
    }

    /// Cut every link between the two groups, both ways.
    pub fn partition(&self, a: &[&str], b: &[&str]) {
        for x in a {
            for y in b {
                self.cut(x, y);
                self.cut(y, x);
            }
        }
    }

    /// Restore every cut link.
    pub fn heal(&self) {
        self.lock().cut.clear();
    }

    fn reach(&self, from: &str, to: &str) -> Result<Arc<RaftNode>, tonic::Status> {
        let inner = self.lock();
        if inner.cut.contains(&(from.to_string(), to.to_string())) {
            return Err(tonic::Status::unavailable(format!(
                "the link {from} → {to} is cut"
            )));
        }
        inner
            .members
            .get(to)
            .and_then(Weak::upgrade)
            .ok_or_else(|| tonic::Status::unavailable(format!("no member at {to}")))
    }

    fn replies(&self, from: &str, to: &str) -> bool {
        !self
            .lock()
            .cut
            .contains(&(to.to_string(), from.to_string()))
    }
}

/// One member's end of a `MemoryNetwork`.
#[derive(Clone)]
pub(super) struct MemoryPeer {
    pub(super) own: String,
    pub(super) net: MemoryNetwork,
}

impl MemoryPeer {
    pub(super) async fn call(
        &self,
        addr: &str,
        method: Method,
        data: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, tonic::Status> {
        let service = RaftService::new(self.net.reach(&self.own, addr)?);
        let req = || tonic::Request::new(RaftPayload { data: data.clone() });
        let handled = async {
            match method {
                Method::Append => service.append(req()).await,
                Method::Vote => service.vote(req()).await,
                Method::Snapshot => service.snapshot(req()).await,
                Method::TransferLeader => service.transfer_leader(req()).await,
                Method::Propose => service.propose(req()).await,
                Method::ReadIndex => {
                    service
                        .read_index(tonic::Request::new(ReadIndexRequest {}))
                        .await
                }
            }
        };
        let reply = tokio::time::timeout(timeout, handled)
            .await
            .map_err(|_| tonic::Status::deadline_exceeded(format!("{addr} did not answer")))??;
        // The receiver acted; only its answer is lost on a link cut the other way.
        if !self.net.replies(&self.own, addr) {
            return Err(tonic::Status::unavailable(format!(
                "the link {addr} → {} is cut",
                self.own
            )));
        }
        Ok(reply.into_inner().data)
    }

    pub(super) async fn member_status(
        &self,
        addr: &str,
        timeout: Duration,
    ) -> Result<MemberStatus, tonic::Status> {
        let service = RaftService::new(self.net.reach(&self.own, addr)?);
        let reply = tokio::time::timeout(
            timeout,
            service.member_status(tonic::Request::new(MemberStatusRequest {})),
        )
        .await
        .map_err(|_| tonic::Status::deadline_exceeded(format!("{addr} did not answer")))??;
        Ok(reply.into_inner())
    }
}
