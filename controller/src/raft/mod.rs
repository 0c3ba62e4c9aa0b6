//! The one place tb meets openraft (pinned to an alpha whose API moves): type configuration,
//! storage, network, and `RaftNode`, the small surface the rest of the controller uses —
//! propose a command, wait for a linearizable read, report and change membership.

mod log_store;
mod memory;
mod network;
mod service;
mod state_machine;
#[cfg(test)]
mod storage_tests;

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::errors::{ClientWriteError, RaftError};
use openraft::raft::linearizable_read::{Linearizer, ReadLogId};
use openraft::{BasicNode, ChangeMembers, ReadPolicy, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tb_api::proto::{ClusterStatusResponse, MemberStatus};

pub use memory::MemoryNetwork;
pub use network::{MAX_MESSAGE, PeerAuth, PeerChannel};
pub use service::RaftService;
pub use state_machine::Shared;

use crate::credentials::Credentials;
use crate::disk_guard::DiskGuard;
use crate::metrics::Metrics;
use crate::store::{Command, Response};
use network::{GrpcPeers, Method, Peers};
use state_machine::StateMachine;

openraft::declare_raft_types!(
    /// tb's Raft types: commands in, store responses out, nodes addressed by `host:port`.
    pub TypeConfig:
        D = Command,
        R = Response,
        Node = BasicNode,
);

pub type NodeId = u64;
type Raft = openraft::Raft<TypeConfig, StateMachine>;
type LogId = openraft::alias::LogIdOf<TypeConfig>;
type Vote = openraft::alias::VoteOf<TypeConfig>;
type Entry = openraft::alias::EntryOf<TypeConfig>;
type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
type Snapshot = openraft::alias::SnapshotOf<TypeConfig, std::io::Cursor<Vec<u8>>>;
type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;

/// redb's page cache.
const REDB_CACHE_BYTES: usize = 16 * 1024 * 1024;

/// Tunables a controller is started with.
#[derive(Debug, Clone)]
pub struct RaftOptions {
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Build a snapshot after this many log entries.
    pub snapshot_every: u64,
    /// Entries kept after a snapshot, for followers slightly behind.
    pub keep_after_snapshot: u64,
    /// Bytes the data disk keeps free: below it this member refuses writes (see `disk_guard`).
    pub min_free_disk: u64,
}

impl Default for RaftOptions {
    fn default() -> Self {
        RaftOptions {
            heartbeat_ms: 50,
            election_timeout_min_ms: 250,
            election_timeout_max_ms: 500,
            snapshot_every: 10_000,
            keep_after_snapshot: 1_000,
            min_free_disk: crate::disk_guard::DEFAULT_MIN_FREE,
        }
    }
}

/// Why a command or read could not be served here and now. Retrying later, or on another
/// controller, may succeed.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    #[error("no leader is elected (is a majority of controllers up?)")]
    NoLeader,
    #[error("the leader could not be reached: {0}")]
    LeaderUnreachable(String),
    #[error("raft stopped: {0}")]
    Fatal(String),
    /// This member (or the leader) has too little room on its data disk to take a write.
    #[error("{0}")]
    DiskFull(String),
    #[error("{0}")]
    Other(String),
}

/// A follower's forwarded command, answered by the leader.
#[derive(Serialize, Deserialize)]
enum ProposeReply {
    Done(Box<Response>),
    /// Not the leader (any more); try there.
    NotLeader(Option<NodeId>),
    Failed(String),
    /// The leader's data disk is (nearly) full: the message says where and how much.
    DiskFull(String),
}

/// What the leader tells a follower that wants to serve a linearizable read.
#[derive(Serialize, Deserialize)]
struct ReadIndexReply {
    node_id: NodeId,
    read_log_id: ReadLogId<TypeConfig>,
    applied: Option<LogId>,
}

/// The member's database in its data dir.
pub const DB_FILE: &str = "tb.redb";

/// The member's database cannot be read whole: redb refused to open it, its checksums do not
/// hold, or its log or snapshot does not decode. Nothing was written to it.
#[derive(Debug, thiserror::Error)]
#[error("{} is damaged: {reason}", path.display())]
pub struct Damaged {
    pub path: std::path::PathBuf,
    pub reason: String,
}

/// Open `path` (created when missing) and verify every page's checksum before Raft reads it:
/// a member must not vote or acknowledge from a log it cannot fully read. redb repairs what an
/// unclean stop leaves on its own when it opens; what it has to repair in the check is damage
/// (and repairing it could roll back a commit this member acknowledged), so that is refused too.
fn open_checked(path: &Path) -> anyhow::Result<redb::Database> {
    let damaged = |reason: String| {
        anyhow::Error::new(Damaged {
            path: path.to_path_buf(),
            reason,
        })
    };
    let opened = std::panic::catch_unwind(|| {
        // redb caches up to 1 GiB by default; the store keeps its own copy of every object in
        // memory, so a small page cache is enough for the log and snapshots.
        let mut db = redb::Builder::new()
            .set_cache_size(REDB_CACHE_BYTES)
            .create(path)?;
        let clean = db.check_integrity()?;
        Ok::<_, redb::DatabaseError>((db, clean))
    });
    match opened {
        Ok(Ok((db, true))) => Ok(db),
        Ok(Ok((_, false))) => Err(damaged(
            "its checksums did not hold (redb could only repair it by going back to an older commit)"
                .into(),
        )),
        // Not the file's fault: another process has it open, or it may not be read.
        Ok(Err(e @ redb::DatabaseError::DatabaseAlreadyOpen)) => Err(anyhow::anyhow!(
            "opening {}: {e} (is another tb-controller using this data dir?)",
            path.display()
        )),
        Ok(Err(redb::DatabaseError::Storage(redb::StorageError::Io(e))))
            if matches!(
                e.kind(),
                io::ErrorKind::PermissionDenied | io::ErrorKind::NotFound
            ) =>
        {
            Err(anyhow::anyhow!("opening {}: {e}", path.display()))
        }
        Ok(Err(e)) => Err(damaged(e.to_string())),
        Err(_) => Err(damaged("redb failed while reading it".into())),
    }
}

/// The log, the state machine (from the latest snapshot) and the metrics over `db`.
fn load(
    db: redb::Database,
    disk: Option<DiskGuard>,
) -> io::Result<(log_store::LogStore, StateMachine, Arc<Metrics>)> {
    let db = Arc::new(db);
    let log = log_store::LogStore::new(db.clone(), disk)?;
    let metrics = Arc::new(Metrics::default());
    let sm = StateMachine::open(db, metrics.clone())?;
    Ok((log, sm, metrics))
}

/// Write a new single-member store at `path` (which must not hold one) whose state is `state`
/// (the store as JSON) at log index `revision`: member `id` at `addr` is its only voter. The
/// member starts from it as from a snapshot, with an empty log after it.
pub fn write_restored(
    path: &Path,
    id: NodeId,
    addr: &str,
    state: &[u8],
    revision: u64,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let db = redb::Builder::new()
        .set_cache_size(REDB_CACHE_BYTES)
        .create(path)
        .with_context(|| format!("creating {}", path.display()))?;
    // A new cluster: no leader has been elected in it yet, so the entries it starts after
    // carry term 0, as openraft's own first membership entry does.
    let last = LogId::new(
        openraft::impls::leader_id_adv::LeaderId {
            term: 0,
            node_id: 0,
        },
        revision.max(1),
    );
    let membership = openraft::Membership::new(
        vec![BTreeSet::from([id])],
        BTreeMap::from([(
            id,
            BasicNode {
                addr: addr.to_string(),
            },
        )]),
    )
    .map_err(|e| anyhow::anyhow!("the restored membership: {e}"))?;
    let meta = SnapshotMeta {
        last_log_id: Some(last),
        last_membership: StoredMembership::new(Some(last), membership),
    };
    state_machine::write_restored_snapshot(&db, &meta, state)
        .with_context(|| format!("writing the snapshot into {}", path.display()))?;
    log_store::write_restored_floor(&db, &last)
        .with_context(|| format!("writing the log into {}", path.display()))?;
    Ok(())
}

/// A running Raft member with its store.
pub struct RaftNode {
    pub id: NodeId,
    pub addr: String,
    raft: Raft,
    shared: Arc<Shared>,
    peers: Peers,
    credentials: Arc<Credentials>,
    metrics: Arc<Metrics>,
    /// The data disk's free-space check; `None` for an in-memory member.
    disk: Option<DiskGuard>,
}

impl RaftNode {
    /// Open (or create) the member's redb database in `data_dir` and start Raft; other
    /// controllers are reached over gRPC. A database that cannot be read whole is reported as
    /// [`Damaged`] (downcast the error), so the caller can say what to do about it.
    pub async fn start(
        id: NodeId,
        addr: String,
        data_dir: &Path,
        opts: &RaftOptions,
        credentials: impl Into<Arc<Credentials>>,
    ) -> anyhow::Result<Arc<RaftNode>> {
        use anyhow::Context;
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("creating data dir {}", data_dir.display()))?;
        // Opening the database writes to it: on a full disk that would fail (and a service
        // manager would restart this process again and again). Wait for room instead.
        let disk = DiskGuard::new(data_dir, opts.min_free_disk);
        let mut waited = 0u64;
        while let Err(e) = disk.check() {
            if waited.is_multiple_of(30) {
                tracing::error!("{e}; waiting for room before opening the database");
            }
            waited += 1;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let path = data_dir.join(DB_FILE);
        let db = open_checked(&path)?;
        let credentials = credentials.into();
        let peers = Peers::Grpc(GrpcPeers::new(credentials.clone()));
        let damaged = |e: io::Error| Damaged {
            path: path.clone(),
            reason: e.to_string(),
        };
        let (log, sm, metrics) = load(db, Some(disk.clone())).map_err(damaged)?;
        let node = Self::start_with(
            id,
            addr,
            log,
            sm,
            metrics,
            opts,
            peers,
            credentials,
            Some(disk),
        )
        .await?;
        tokio::spawn(watch_disk(Arc::downgrade(&node)));
        Ok(node)
    }

    /// Start a member of an in-process cluster: its log and state in memory, its peers
    /// reached through `net` (see `MemoryNetwork`).
    pub async fn start_in_memory(
        id: NodeId,
        addr: String,
        opts: &RaftOptions,
        net: &MemoryNetwork,
    ) -> anyhow::Result<Arc<RaftNode>> {
        use anyhow::Context;
        let db = redb::Builder::new()
            .set_cache_size(REDB_CACHE_BYTES)
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .context("creating an in-memory database")?;
        let peers = Peers::Memory(memory::MemoryPeer {
            own: addr.clone(),
            net: net.clone(),
        });
        let credentials = Arc::new(Credentials::none());
        let (log, sm, metrics) = load(db, None).context("loading the in-memory store")?;
        let node =
            Self::start_with(id, addr, log, sm, metrics, opts, peers, credentials, None).await?;
        net.register(&node);
        Ok(node)
    }

    #[allow(clippy::too_many_arguments)]
    async fn start_with(
        id: NodeId,
        addr: String,
        log: log_store::LogStore,
        sm: StateMachine,
        metrics: Arc<Metrics>,
        opts: &RaftOptions,
        peers: Peers,
        credentials: Arc<Credentials>,
        disk: Option<DiskGuard>,
    ) -> anyhow::Result<Arc<RaftNode>> {
        use anyhow::Context;
        let shared = sm.shared();
        let config = openraft::Config {
            cluster_name: "tb".into(),
            heartbeat_interval: opts.heartbeat_ms,
            election_timeout_min: opts.election_timeout_min_ms,
            election_timeout_max: opts.election_timeout_max_ms,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(opts.snapshot_every),
            max_in_snapshot_log_to_keep: opts.keep_after_snapshot,
            install_snapshot_timeout: 120_000,
            ..Default::default()
        }
        .validate()
        .context("raft configuration")?;
        let raft = Raft::new(id, Arc::new(config), peers.clone(), log, sm)
            .await
            .context("starting raft")?;
        Ok(Arc::new(RaftNode {
            id,
            addr,
            raft,
            shared,
            peers,
            credentials,
            metrics,
            disk,
        }))
    }

    /// `Err` while this member's data disk has less than the reserve free (see `disk_guard`).
    pub fn check_disk(&self) -> Result<(), crate::disk_guard::DiskFull> {
        self.disk.as_ref().map_or(Ok(()), DiskGuard::check)
    }

    /// Form a new cluster from `members` (id → address) if this member has never been part of
    /// one. Every initial member may call this with the same list.
    pub async fn bootstrap(&self, members: &BTreeMap<NodeId, String>) -> anyhow::Result<()> {
        if self.raft.is_initialized().await? {
            return Ok(());
        }
        let nodes: BTreeMap<NodeId, BasicNode> = members
            .iter()
            .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
            .collect();
        match self.raft.initialize(nodes).await {
            Ok(()) => Ok(()),
            // Another member's bootstrap reached us first: the same cluster, nothing to do.
            Err(RaftError::APIError(e)) => {
                tracing::info!("bootstrap skipped: {e}");
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    pub fn store(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// What this member presents to and checks of others (TLS, the cluster secret).
    pub fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    /// This member's Prometheus figures.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    fn raft_metrics(&self) -> openraft::RaftMetrics<TypeConfig> {
        self.raft.metrics().borrow_watched().clone()
    }

    /// The leader's id and address, as this member knows it.
    pub fn leader(&self) -> Option<(NodeId, String)> {
        let m = self.raft_metrics();
        let id = m.current_leader?;
        let addr = m.membership_config.membership().get_node(&id)?.addr.clone();
        Some((id, addr))
    }

    async fn wait_for_leader(&self, timeout: Duration) -> Option<(NodeId, String)> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(l) = self.leader() {
                return Some(l);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Commit a command through the leader (this member or another) and return what applying
    /// it answered. Retries across leader changes; the command's idempotency key makes a retry
    /// of a write that did commit harmless.
    pub async fn propose(&self, cmd: Command) -> Result<Response, Unavailable> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut last_err = Unavailable::NoLeader;
        while tokio::time::Instant::now() < deadline {
            let Some((leader, addr)) = self.wait_for_leader(Duration::from_secs(3)).await else {
                return Err(Unavailable::NoLeader);
            };
            let result = if leader == self.id {
                self.propose_local(cmd.clone()).await
            } else {
                self.forward(&addr, &cmd).await
            };
            match result {
                Ok(ProposeReply::Done(r)) => return Ok(*r),
                Ok(ProposeReply::Failed(e)) => return Err(Unavailable::Other(e)),
                Ok(ProposeReply::DiskFull(e)) => return Err(Unavailable::DiskFull(e)),
                Ok(ProposeReply::NotLeader(_)) => {}
                Err(e) => last_err = e,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(last_err)
    }

    async fn propose_local(&self, cmd: Command) -> Result<ProposeReply, Unavailable> {
        // The leader's own log write must not hit a full disk (redb would be unusable until
        // reopened): refuse before appending.
        if let Err(e) = self.check_disk() {
            return Ok(ProposeReply::DiskFull(e.to_string()));
        }
        match self.raft.client_write(cmd).await {
            Ok(resp) => Ok(ProposeReply::Done(Box::new(resp.data))),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))
            | Err(RaftError::APIError(ClientWriteError::LogEntryDiscarded(f))) => {
                Ok(ProposeReply::NotLeader(f.leader_id))
            }
            Err(RaftError::APIError(e)) => Ok(ProposeReply::Failed(e.to_string())),
            Err(RaftError::Fatal(e)) => Err(Unavailable::Fatal(e.to_string())),
        }
    }

    async fn forward(&self, addr: &str, cmd: &Command) -> Result<ProposeReply, Unavailable> {
        let unreachable =
            |e: &dyn std::fmt::Display| Unavailable::LeaderUnreachable(format!("{addr}: {e}"));
        let data = serde_json::to_vec(cmd).map_err(|e| Unavailable::Other(e.to_string()))?;
        let reply = self
            .peers
            .call(addr, Method::Propose, data, Duration::from_secs(5))
            .await
            .map_err(|e| unreachable(&e.message()))?;
        serde_json::from_slice(&reply).map_err(|e| unreachable(&e))
    }

    /// Wait until this member's store reflects every write committed before the call (ReadIndex).
    pub async fn linearize(&self) -> Result<(), Unavailable> {
        let Some((leader, addr)) = self.wait_for_leader(Duration::from_secs(3)).await else {
            return Err(Unavailable::NoLeader);
        };
        let linearizer = if leader == self.id {
            self.raft
                .get_read_linearizer(ReadPolicy::ReadIndex)
                .await
                .map_err(|e| Unavailable::Other(format!("read index: {e}")))?
        } else {
            let reply = self
                .peers
                .call(&addr, Method::ReadIndex, Vec::new(), Duration::from_secs(3))
                .await
                .map_err(|e| Unavailable::LeaderUnreachable(format!("{addr}: {}", e.message())))?;
            let r: Result<ReadIndexReply, String> =
                serde_json::from_slice(&reply).map_err(|e| Unavailable::Other(e.to_string()))?;
            let r = r.map_err(Unavailable::Other)?;
            Linearizer::new(r.node_id, r.read_log_id, r.applied)
        };
        tokio::time::timeout(Duration::from_secs(5), linearizer.await_ready(&self.raft))
            .await
            .map_err(|_| {
                Unavailable::Other("timed out waiting for this controller to catch up".into())
            })?
            .map_err(|e| Unavailable::Fatal(e.to_string()))?;
        Ok(())
    }

    /// This member's own view, as `tbctl cluster status` shows it.
    pub fn member_status(&self) -> MemberStatus {
        let m = self.raft_metrics();
        let membership = m.membership_config.membership();
        let is_voter = membership.voter_ids().any(|v| v == self.id);
        MemberStatus {
            id: self.id,
            address: self.addr.clone(),
            role: if is_voter { "voter" } else { "learner" }.into(),
            state: match m.state {
                ServerState::Leader => "leader",
                ServerState::Follower => "follower",
                ServerState::Candidate => "candidate",
                ServerState::Learner => "learner",
                ServerState::Shutdown => "shutdown",
            }
            .into(),
            term: m.current_term,
            commit_index: m.local_committed.map(|l| l.index).unwrap_or(0),
            applied_index: m.last_applied.map(|l| l.index).unwrap_or(0),
            last_log_index: m.last_log_index.unwrap_or(0),
            leader_id: m.current_leader.unwrap_or(0),
            has_leader: m.current_leader.is_some(),
            error: String::new(),
        }
    }

    /// The members as this member knows them: id, address, and whether it votes.
    pub fn members(&self) -> Vec<(NodeId, String, bool)> {
        let m = self.raft_metrics();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        membership
            .nodes()
            .map(|(id, node)| (*id, node.addr.clone(), voters.contains(id)))
            .collect()
    }

    /// Whether this member's store holds a cluster (a membership, from a bootstrap or from a
    /// leader that added it), as opposed to a new data dir waiting to be added.
    pub async fn is_initialized(&self) -> bool {
        self.raft.is_initialized().await.unwrap_or(false)
    }

    /// Every member's own view, asked of each (a member that does not answer is shown so).
    pub async fn cluster_status(&self) -> ClusterStatusResponse {
        let m = self.raft_metrics();
        let membership = m.membership_config.membership().clone();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let mut members = Vec::new();
        let mut asks = Vec::new();
        for (id, node) in membership.nodes() {
            if *id == self.id {
                members.push(self.member_status());
                continue;
            }
            let (id, addr, peers) = (*id, node.addr.clone(), self.peers.clone());
            let role = if voters.contains(&id) {
                "voter"
            } else {
                "learner"
            };
            asks.push(async move {
                let mut status = MemberStatus {
                    id,
                    address: addr.clone(),
                    role: role.into(),
                    state: "unreachable".into(),
                    ..Default::default()
                };
                let answer = peers
                    .member_status(&addr, Duration::from_millis(800))
                    .await
                    .map_err(|e| e.message().to_string());
                match answer {
                    Ok(r) => {
                        status = r;
                        status.role = role.into();
                    }
                    Err(e) => status.error = e,
                }
                status
            });
        }
        members.extend(futures::future::join_all(asks).await);
        members.sort_by_key(|s| s.id);
        ClusterStatusResponse {
            leader_id: m.current_leader.unwrap_or(0),
            has_leader: m.current_leader.is_some(),
            term: m.current_term,
            members,
        }
    }

    /// Add a controller: first as a learner that catches up (by snapshot if the log was purged),
    /// then as a voter. Must run on the leader.
    pub async fn add_member(&self, id: NodeId, addr: String) -> anyhow::Result<()> {
        // One id, one address: adding a known id at another address would leave the member
        // where it was (the learner call keeps the first address) while saying it was added.
        if let Some((_, known, _)) = self.members().into_iter().find(|(m, _, _)| *m == id)
            && known != addr
        {
            anyhow::bail!(
                "controller id {id} is already a member at {known}; pick another --id for \
                 {addr}, or remove member {id} first (tbctl cluster remove-member {id})"
            );
        }
        self.raft
            .add_learner(id, BasicNode { addr }, true)
            .await
            .map_err(|e| anyhow::anyhow!("adding controller {id} as a learner: {e}"))?;
        self.raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            .await
            .map_err(|e| anyhow::anyhow!("promoting controller {id} to voter: {e}"))?;
        Ok(())
    }

    /// Remove a controller from the cluster. Must run on the leader.
    pub async fn remove_member(&self, id: NodeId) -> anyhow::Result<()> {
        let m = self.raft_metrics();
        let membership = m.membership_config.membership();
        if membership.get_node(&id).is_none() {
            anyhow::bail!("controller {id} is not a member");
        }
        let is_voter = membership.voter_ids().any(|v| v == id);
        let change = if is_voter {
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        };
        self.raft
            .change_membership(change, false)
            .await
            .map_err(|e| anyhow::anyhow!("removing controller {id}: {e}"))?;
        Ok(())
    }

    pub fn is_leader(&self) -> bool {
        self.raft_metrics().current_leader == Some(self.id)
    }

    /// Figures for `/metrics`.
    pub fn gauges(&self) -> RaftGauges {
        let m = self.raft_metrics();
        RaftGauges {
            term: m.current_term,
            commit_index: m.local_committed.map(|l| l.index).unwrap_or(0),
            applied_index: m.last_applied.map(|l| l.index).unwrap_or(0),
            last_log_index: m.last_log_index.unwrap_or(0),
            is_leader: m.current_leader == Some(self.id),
        }
    }

    pub async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
    }
}

/// How often the data disk's free space is measured in the background.
const DISK_WATCH_EVERY: Duration = Duration::from_secs(1);

/// While the data disk is low: stop campaigning (a vote and a new leader's first entry are
/// writes) and, as leader, hand leadership to another voter so the cluster keeps taking writes.
/// Everything comes back on its own when space returns.
async fn watch_disk(node: std::sync::Weak<RaftNode>) {
    let mut low = false;
    loop {
        tokio::time::sleep(DISK_WATCH_EVERY).await;
        let Some(node) = node.upgrade() else {
            return;
        };
        match node.check_disk() {
            Err(e) => {
                if !low {
                    tracing::error!("{e}; refusing writes and elections until there is room");
                    node.raft.runtime_config().elect(false);
                    low = true;
                }
                if node.is_leader() {
                    node.hand_over_leadership().await;
                }
            }
            Ok(()) if low => {
                tracing::info!("the data disk has room again; taking writes and elections");
                node.raft.runtime_config().elect(true);
                low = false;
            }
            Ok(()) => {}
        }
    }
}

impl RaftNode {
    /// Ask the most up-to-date other voter to take over (a leader whose disk is low).
    async fn hand_over_leadership(&self) {
        let m = self.raft_metrics();
        let Some(replication) = &m.replication else {
            return;
        };
        let voters: BTreeSet<NodeId> = m.membership_config.membership().voter_ids().collect();
        let best = replication
            .iter()
            .filter(|(id, _)| **id != self.id && voters.contains(id))
            .max_by_key(|(_, matched)| matched.map(|l| l.index))
            .map(|(id, _)| *id);
        if let Some(to) = best {
            tracing::warn!(to, "data disk low: handing leadership over");
            if let Err(e) = self.raft.trigger().transfer_leader(to).await {
                tracing::warn!("handing leadership to {to}: {e}");
            }
        }
    }
}

/// Raft figures exported as Prometheus gauges.
pub struct RaftGauges {
    pub term: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub last_log_index: u64,
    pub is_leader: bool,
}
