//! A controller cluster on loopback: N `tb-controller` processes formed with `--initial-cluster`,
//! each with its own port, data directory and log file in one test directory.
//!
//! Questions about the cluster are answered from each member's own view (its entry in its own
//! `Cluster.Status` answer), never from one member's opinion of the others.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tb_api::proto::{AddMemberRequest, ClusterStatusResponse, MemberStatus};
use tonic::Status;

use crate::client::Client;
use crate::controller::{Controller, ControllerConfig};
use crate::workdir::TestDir;

/// How long a member may take to serve after its process starts.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long an election may take (generous: a loaded 2-core CI machine).
pub const ELECTION_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub size: usize,
    pub heartbeat_ms: u64,
    pub snapshot_every: Option<u64>,
    pub keep_after_snapshot: Option<u64>,
    /// More flags for every member (joiners included), after the harness's own.
    pub extra_args: Vec<String>,
    /// Member `i`'s data directory, when given (e.g. on a small filesystem of the test's);
    /// default: one in the test directory.
    pub data_dirs: Vec<PathBuf>,
}

impl ClusterOptions {
    /// `size` members with small Raft timings and the controller's default snapshot policy.
    pub fn new(size: usize) -> ClusterOptions {
        ClusterOptions {
            size,
            heartbeat_ms: 50,
            snapshot_every: None,
            keep_after_snapshot: None,
            extra_args: Vec::new(),
            data_dirs: Vec::new(),
        }
    }

    /// Snapshot every `every` entries, keeping `keep` entries after each.
    pub fn snapshots(mut self, every: u64, keep: u64) -> ClusterOptions {
        self.snapshot_every = Some(every);
        self.keep_after_snapshot = Some(keep);
        self
    }

    /// Pass `args` to every member as well.
    pub fn args<I, S>(mut self, args: I) -> ClusterOptions
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.extra_args.extend(args.into_iter().map(Into::into));
        self
    }
}

pub struct Cluster {
    members: Vec<Controller>,
    client: Arc<Client>,
    opts: ClusterOptions,
    // Declared last so it is dropped after the members: their logs are printed first.
    dir: TestDir,
}

impl Cluster {
    /// Start `opts.size` controllers as one cluster and wait until they agree on a leader.
    pub async fn start(name: &str, opts: ClusterOptions) -> Cluster {
        assert!(opts.size >= 1);
        let dir = TestDir::new(name);
        let configs: Vec<ControllerConfig> = (1..=opts.size as u64)
            .map(|id| {
                let mut c = ControllerConfig::single(dir.path(), id);
                c.heartbeat_ms = opts.heartbeat_ms;
                c.snapshot_every = opts.snapshot_every;
                c.keep_after_snapshot = opts.keep_after_snapshot;
                c.extra_args = opts.extra_args.clone();
                if let Some(d) = opts.data_dirs.get(id as usize - 1) {
                    c.data_dir = d.clone();
                }
                c
            })
            .collect();
        let initial = (opts.size > 1).then(|| {
            configs
                .iter()
                .map(|c| format!("{}={}", c.id, c.addr))
                .collect::<Vec<_>>()
                .join(",")
        });
        let members: Vec<Controller> = configs
            .into_iter()
            .map(|mut c| {
                c.initial_cluster = initial.clone();
                Controller::start(c)
            })
            .collect();
        let client = Arc::new(Client::new(
            members.iter().map(|m| m.addr().to_string()).collect(),
        ));
        let mut cluster = Cluster {
            members,
            client,
            opts,
            dir,
        };
        for m in &mut cluster.members {
            m.wait_serving(START_TIMEOUT).await;
        }
        cluster.wait_for_leader(ELECTION_TIMEOUT).await;
        crate::step!(
            "cluster {name} of {} up in {}",
            cluster.members.len(),
            cluster.dir.path().display()
        );
        cluster
    }

    pub fn dir(&self) -> &TestDir {
        &self.dir
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn member(&self, i: usize) -> &Controller {
        &self.members[i]
    }

    pub fn member_mut(&mut self, i: usize) -> &mut Controller {
        &mut self.members[i]
    }

    /// Every member's address, running or not, in member order.
    pub fn addrs(&self) -> Vec<String> {
        self.members.iter().map(|m| m.addr().to_string()).collect()
    }

    pub fn addr(&self, i: usize) -> String {
        self.members[i].addr().to_string()
    }

    /// A client over every member (shared; cheap to clone).
    pub fn client(&self) -> Arc<Client> {
        self.client.clone()
    }

    /// Indices of the members whose process is alive.
    pub fn running(&mut self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| self.members[i].is_running())
            .collect()
    }

    /// Member `i`'s view of itself.
    pub async fn member_view(&self, i: usize) -> Result<MemberStatus, Status> {
        let status = self.client.status_on(self.members[i].addr()).await?;
        let id = self.members[i].id();
        status
            .members
            .into_iter()
            .find(|m| m.id == id)
            .ok_or_else(|| {
                Status::internal(format!(
                    "member {id} does not list itself in Cluster.Status"
                ))
            })
    }

    /// Views of every running member (in member order), or the first error.
    async fn running_views(&mut self) -> Result<Vec<(usize, MemberStatus)>, String> {
        let running = self.running();
        let mut views = Vec::with_capacity(running.len());
        for i in running {
            let v = self.member_view(i).await.map_err(|e| {
                format!(
                    "member {}: {}: {}",
                    self.members[i].id(),
                    e.code(),
                    e.message()
                )
            })?;
            views.push((i, v));
        }
        Ok(views)
    }

    /// Wait until every running member names the same leader and that leader says it leads;
    /// returns the leader's index.
    pub async fn wait_for_leader(&mut self, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = String::from("no check ran");
        while tokio::time::Instant::now() < deadline {
            match self.running_views().await {
                Ok(views) => match agreed_leader(&views) {
                    Ok(id) => {
                        if let Some(i) = self.index_of(id) {
                            return i;
                        }
                        last = format!("leader {id} is not a member this test started");
                    }
                    Err(e) => last = e,
                },
                Err(e) => last = e,
            }
            tokio::time::sleep(crate::wait::POLL).await;
        }
        panic!("no agreed leader after {timeout:?}: {last}");
    }

    /// The current leader's index (waiting for an election if there is none).
    pub async fn leader_index(&mut self) -> usize {
        self.wait_for_leader(ELECTION_TIMEOUT).await
    }

    pub fn index_of(&self, id: u64) -> Option<usize> {
        self.members.iter().position(|m| m.id() == id)
    }

    /// Wait until every running member has applied the same log index and it is the highest
    /// commit index any of them knows; returns that index.
    pub async fn wait_converged(&mut self, timeout: Duration) -> u64 {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = String::from("no check ran");
        while tokio::time::Instant::now() < deadline {
            match self.running_views().await {
                Ok(views) => {
                    let applied: Vec<u64> = views.iter().map(|(_, v)| v.applied_index).collect();
                    let committed = views.iter().map(|(_, v)| v.commit_index).max().unwrap_or(0);
                    let min = applied.iter().copied().min().unwrap_or(0);
                    let max = applied.iter().copied().max().unwrap_or(0);
                    if min == max && max >= committed && views.iter().all(|(_, v)| v.has_leader) {
                        return max;
                    }
                    last = format!(
                        "applied {:?}, highest commit {committed}",
                        views
                            .iter()
                            .map(|(i, v)| (self.members[*i].id(), v.applied_index))
                            .collect::<Vec<_>>()
                    );
                }
                Err(e) => last = e,
            }
            tokio::time::sleep(crate::wait::POLL).await;
        }
        panic!("members did not converge within {timeout:?}: {last}");
    }

    /// SIGKILL member `i`.
    pub fn kill(&mut self, i: usize) {
        crate::step!("SIGKILL controller {}", self.members[i].id());
        self.members[i].kill();
    }

    /// Start member `i` again on its data directory and wait until it serves.
    pub async fn restart(&mut self, i: usize) {
        crate::step!("restarting controller {}", self.members[i].id());
        self.members[i].restart();
        self.members[i].wait_serving(START_TIMEOUT).await;
    }

    pub fn kill_all(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }

    /// Start every stopped member (all at once, so a majority can form) and wait until each serves.
    pub async fn restart_all(&mut self) {
        for i in 0..self.members.len() {
            if !self.members[i].is_running() {
                crate::step!("restarting controller {}", self.members[i].id());
                self.members[i].restart();
            }
        }
        for m in &mut self.members {
            m.wait_serving(START_TIMEOUT).await;
        }
    }

    /// Start a new empty controller with `--join` (not yet a member) and wait until it serves.
    /// Returns its index; add it with [`Cluster::add_member`] or `tbctl cluster add-member`.
    pub async fn start_joiner(&mut self) -> usize {
        let id = self.members.iter().map(Controller::id).max().unwrap_or(0) + 1;
        let mut config = ControllerConfig::single(self.dir.path(), id);
        config.join = true;
        config.heartbeat_ms = self.opts.heartbeat_ms;
        config.snapshot_every = self.opts.snapshot_every;
        config.keep_after_snapshot = self.opts.keep_after_snapshot;
        config.extra_args = self.opts.extra_args.clone();
        crate::step!("starting controller {id} with --join at {}", config.addr);
        let mut joiner = Controller::start(config);
        joiner.wait_serving(START_TIMEOUT).await;
        self.members.push(joiner);
        self.client = Arc::new(Client::new(self.addrs()));
        self.members.len() - 1
    }

    /// Add the joiner at index `i` with `Cluster.AddMember`, sent to the members that were
    /// there before it (a follower passes it to the leader). The call returns once openraft has
    /// caught the learner up and promoted it.
    pub async fn add_member(&mut self, i: usize, timeout: Duration) {
        let (id, address) = (self.members[i].id(), self.addr(i));
        let others: Vec<String> = (0..self.members.len())
            .filter(|&j| j != i)
            .map(|j| self.addr(j))
            .collect();
        let client = Client::new(others);
        let req = AddMemberRequest { id, address };
        client
            .retrying(0, timeout, |a| {
                let mut c = client.cluster(a);
                let mut r = tonic::Request::new(req.clone());
                r.set_timeout(timeout);
                async move { c.add_member(r).await }
            })
            .await
            .unwrap_or_else(|e| panic!("AddMember({id}) failed: {}: {}", e.code(), e.message()));
        crate::step!("controller {id} added");
    }

    /// `Cluster.Status` from the first running member that answers.
    pub async fn status(&mut self) -> ClusterStatusResponse {
        let running = self.running();
        let mut errors = Vec::new();
        for i in running {
            match self.client.status_on(self.members[i].addr()).await {
                Ok(s) => return s,
                Err(e) => errors.push(format!(
                    "{}: {}: {}",
                    self.members[i].id(),
                    e.code(),
                    e.message()
                )),
            }
        }
        panic!("no member answered Cluster.Status: {errors:?}");
    }

    /// A stale (local) list of `kind` in `namespace` from member `i`, parsed.
    pub async fn stale_list(
        &self,
        i: usize,
        kind: &str,
        namespace: &str,
    ) -> Vec<serde_json::Value> {
        let resp = self
            .client
            .list_on(self.members[i].addr(), kind, namespace, true)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "stale list on member {}: {}: {}",
                    self.members[i].id(),
                    e.code(),
                    e.message()
                )
            });
        resp.objects_json
            .iter()
            .map(|j| {
                serde_json::from_str(j)
                    .unwrap_or_else(|e| panic!("invalid JSON from the server ({e}): {j}"))
            })
            .collect()
    }
}

/// The leader every view agrees on, if its own view says it leads.
fn agreed_leader(views: &[(usize, MemberStatus)]) -> Result<u64, String> {
    let leaders: Vec<Option<u64>> = views
        .iter()
        .map(|(_, v)| v.has_leader.then_some(v.leader_id))
        .collect();
    let Some(Some(leader)) = leaders.first().copied() else {
        return Err(format!("no leader known: {leaders:?}"));
    };
    if leaders.iter().any(|l| *l != Some(leader)) {
        return Err(format!("members disagree on the leader: {leaders:?}"));
    }
    match views.iter().find(|(_, v)| v.id == leader) {
        Some((_, v)) if v.state == "leader" => Ok(leader),
        Some((_, v)) => Err(format!(
            "{leader} is named leader but says it is {}",
            v.state
        )),
        None => Err(format!("leader {leader} is not running")),
    }
}
