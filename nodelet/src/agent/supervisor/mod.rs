//! Runs this node's allocations: watches the Allocations assigned to it (a gRPC stream, so a new
//! one starts without polling delay), starts each exactly once, reports how it goes, and stops —
//! fences — any process whose allocation is gone, told to stop, or of another epoch.
//!
//! Each rank runs as its namespace's account (`super::accounts`) in directories laid out by
//! `super::dirs`, and is contained (`crate::exec::contain`): what it leaves behind is killed
//! with it. An allocation's directory is removed when the allocation is deleted, and the
//! oldest finished ones go first when the jobs' disk use passes `--job-disk-limit`.
//!
//! The parts: [`process`] runs one allocation's process from start to end, after [`staging`]
//! (a built-in rank's shard) and [`prepare`] (directories, program, environment, checkpoint);
//! [`readiness`] follows a built-in service's endpoint; [`report`] writes statuses;
//! [`orphans`] deals with what an earlier run left; [`disk`] keeps the jobs' disk in bounds;
//! [`fence`] stops every rank when no controller has accepted a heartbeat for most of the node
//! grace period.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tb_api::specs::{
    AllocationPhase, AllocationSpec, AllocationStatus, Desired, allocation, parse_spec,
};
use tb_api::{Kind, Object};
use tb_client::informer::{Change, Informer};
use tokio::sync::{Notify, oneshot};

use super::accounts::Policy;
use super::controllers::Controllers;
use super::dirs;
use crate::exec;

mod disk;
pub mod fence;
mod orphans;
mod prepare;
pub(crate) use prepare::shard_binary;
mod process;
mod readiness;
mod report;
mod service_key;
mod staging;
mod training;

/// What the heartbeat reports about the work here.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    pub allocated_bytes: u64,
    pub allocations: Vec<String>,
    /// Bytes on disk under `allocs/` at the last measurement.
    pub job_disk_bytes: u64,
}

/// One allocation's process, while it lives.
struct Live {
    /// `namespace/name` of its allocation.
    key: String,
    epoch: u64,
    memory_bytes: u64,
    /// The dynamic uid it runs as, if any: no sweep kills by uid while another runs under it.
    dynamic_uid: Option<u32>,
    stop: Option<oneshot::Sender<fence::Stop>>,
}

pub struct Supervisor {
    node: String,
    data_dir: PathBuf,
    allocatable_bytes: u64,
    controllers: Arc<Controllers>,
    policy: Arc<Policy>,
    live: Mutex<HashMap<String, Live>>,
    /// Allocations this nodelet started (or refused) once: never started again.
    seen: Mutex<HashSet<String>>,
    /// `namespace/name` of every allocation the controllers list for this node now.
    wanted: Mutex<HashSet<String>>,
    /// Whether the dirs of allocations deleted while the nodelet was away have been removed.
    tidied: AtomicBool,
    job_disk_bytes: AtomicU64,
    job_disk_limit: u64,
    /// What the ranks' processes are given beside their specs.
    ranks: RankSettings,
    /// The heartbeat lease: when it runs out, every rank here is fenced.
    lease: fence::Lease,
    ended: Notify,
    changed: Notify,
}

/// The nodelet's settings for the processes of its ranks.
#[derive(Debug, Clone, Default)]
pub struct RankSettings {
    /// `--python`: what exec jobs' `python` and `python3` run.
    pub python: Option<PathBuf>,
    /// `--engine-threads`: the CPU threads of each built-in rank (None: every core).
    pub engine_threads: Option<u32>,
}

/// Where an allocation lives: names are reused when a job is deleted and created again.
fn key(o: &Object) -> String {
    format!("{}/{}", o.metadata.namespace, o.metadata.name)
}

/// One incarnation of an allocation: a process belongs to exactly one.
fn incarnation(o: &Object) -> String {
    format!(
        "{}/{}/{}",
        o.metadata.namespace, o.metadata.name, o.metadata.uid
    )
}

impl Supervisor {
    pub fn new(
        node: String,
        data_dir: PathBuf,
        allocatable_bytes: u64,
        controllers: Arc<Controllers>,
        policy: Arc<Policy>,
        job_disk_limit: u64,
        ranks: RankSettings,
    ) -> Arc<Self> {
        Arc::new(Supervisor {
            node,
            data_dir,
            allocatable_bytes,
            controllers,
            policy,
            live: Mutex::new(HashMap::new()),
            seen: Mutex::new(HashSet::new()),
            wanted: Mutex::new(HashSet::new()),
            tidied: AtomicBool::new(false),
            job_disk_bytes: AtomicU64::new(0),
            job_disk_limit,
            ranks,
            lease: fence::Lease::default(),
            ended: Notify::new(),
            changed: Notify::new(),
        })
    }

    pub fn usage(&self) -> Usage {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let mut allocations: Vec<String> = live
            .values()
            .map(|l| l.key.rsplit('/').next().unwrap_or(&l.key).to_string())
            .collect();
        allocations.sort();
        Usage {
            allocated_bytes: live.values().map(|l| l.memory_bytes).sum(),
            allocations,
            job_disk_bytes: self.job_disk_bytes.load(Ordering::Relaxed),
        }
    }

    /// The heartbeat lease, renewed by the heartbeat loop.
    pub fn lease(&self) -> &fence::Lease {
        &self.lease
    }

    /// Stop every rank here whenever the heartbeat lease runs out (see [`fence`]), until the
    /// process ends.
    pub async fn fence_when_cut_off(self: Arc<Self>) {
        loop {
            tokio::time::sleep(self.lease.check_every()).await;
            let Some(how) = self.lease.expired(Instant::now()) else {
                continue;
            };
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            for l in live.values_mut() {
                if let Some(stop) = l.stop.take() {
                    tracing::warn!(alloc = %l.key, ?how, "fencing: no controller accepted a heartbeat for most of the node grace period; stopping");
                    let _ = stop.send(how);
                }
            }
        }
    }

    /// Where an allocation keeps its working directory, logs and pid.
    pub fn alloc_dir(data_dir: &Path, namespace: &str, name: &str) -> PathBuf {
        data_dir.join("allocs").join(namespace).join(name)
    }

    /// Follow this node's allocations until the process ends.
    pub async fn run(self: Arc<Self>) {
        dirs::empty_trash(&self.data_dir);
        let me = self.clone();
        let orphans = tokio::task::spawn_blocking(move || me.reap_orphans())
            .await
            .unwrap_or_default();
        tokio::spawn(self.clone().keep_disk_use());
        for (namespace, name) in orphans {
            let status = AllocationStatus {
                phase: AllocationPhase::Lost,
                reason: "NodeletRestarted".into(),
                message: format!(
                    "the nodelet on {} restarted and killed the process it could no longer supervise",
                    self.node
                ),
                finished_at: Some(now()),
                ..Default::default()
            };
            self.report(&namespace, &name, &status).await;
        }
        // tb-client's informer lists this node's allocations, watches from there, resumes on
        // another controller when the stream breaks and lists again when it falls behind;
        // `desired` follows its changes.
        let mut desired: BTreeMap<String, (Object, AllocationSpec)> = BTreeMap::new();
        let mut client = self.controllers.client();
        let mut informer = Informer::new(tb_client::Scope {
            kind: Kind::Allocation,
            namespace: String::new(),
            selector: format!("{}={}", allocation::LABEL_NODE, self.node),
        });
        loop {
            match informer.next(&mut client).await {
                // A list's changes come in one batch: reconcile once after it, not per ADDED.
                Ok(batch) => {
                    for change in &batch.changes {
                        self.absorb(&mut desired, change);
                    }
                    self.reconcile(&desired);
                }
                Err(e) => {
                    tracing::warn!("watching allocations: {e}; reconnecting");
                    client.fail_over();
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }
    }

    fn absorb(&self, desired: &mut BTreeMap<String, (Object, AllocationSpec)>, change: &Change) {
        let obj = &change.object;
        let k = key(obj);
        if change.type_ == "DELETED" {
            desired.remove(&k);
            return;
        }
        match parse_spec::<AllocationSpec>(&obj.spec) {
            Ok(spec) if spec.node == self.node => {
                desired.insert(k, (obj.clone(), spec));
            }
            Ok(_) => {
                desired.remove(&k);
            }
            Err(e) => tracing::warn!(alloc = %k, "ignoring an allocation with a bad spec: {e}"),
        }
    }

    /// Start what should run and is not running; stop what runs and should not; remove the
    /// directories of allocations that are gone.
    fn reconcile(self: &Arc<Self>, desired: &BTreeMap<String, (Object, AllocationSpec)>) {
        self.forget_gone(desired);
        // Fencing first: anything not wanted, wanted under another epoch, or given up by the
        // controllers (Lost: they place it again elsewhere) stops.
        {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            for (inc, l) in live.iter_mut() {
                let keep = desired.get(&l.key).is_some_and(|(o, s)| {
                    s.desired == Desired::Run
                        && s.epoch == l.epoch
                        && &incarnation(o) == inc
                        && !AllocationStatus::from_value(&o.status).phase.is_terminal()
                });
                let k = &l.key;
                if !keep && let Some(stop) = l.stop.take() {
                    tracing::info!(alloc = %k, "stopping: allocation gone, superseded or told to stop");
                    let _ = stop.send(fence::Stop::Asked);
                }
            }
        }
        for (obj, spec) in desired.values() {
            if spec.desired != Desired::Run {
                continue;
            }
            let phase = AllocationStatus::from_value(&obj.status).phase;
            if phase.is_terminal() {
                continue;
            }
            let first_time = self
                .seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(incarnation(obj));
            if !first_time {
                continue;
            }
            let me = self.clone();
            let (obj, spec) = (obj.clone(), spec.clone());
            tokio::spawn(async move { me.run_allocation(obj, spec).await });
        }
        self.changed.notify_waiters();
    }

    async fn run_allocation(self: Arc<Self>, obj: Object, spec: AllocationSpec) {
        let k = incarnation(&obj);
        let (namespace, name) = (obj.metadata.namespace.clone(), obj.metadata.name.clone());
        let (stop_tx, stop_rx) = oneshot::channel();
        let account = match self.policy.account_for(&namespace) {
            Ok(a) => a,
            Err(message) => {
                let status = AllocationStatus {
                    phase: AllocationPhase::Failed,
                    reason: "NoJobAccount".into(),
                    message,
                    finished_at: Some(now()),
                    ..Default::default()
                };
                self.report(&namespace, &name, &status).await;
                return;
            }
        };
        // Resource guard: what runs here never exceeds what the node may hand out.
        let refused = {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            let used: Vec<u64> = live.values().map(|l| l.memory_bytes).collect();
            if exec::fits(self.allocatable_bytes, &used, spec.memory_bytes) {
                live.insert(
                    k.clone(),
                    Live {
                        key: key(&obj),
                        epoch: spec.epoch,
                        memory_bytes: spec.memory_bytes,
                        dynamic_uid: account.as_ref().filter(|a| a.dynamic).map(|a| a.uid),
                        stop: Some(stop_tx),
                    },
                );
                None
            } else {
                Some(AllocationStatus {
                    phase: AllocationPhase::Failed,
                    reason: "OutOfMemory".into(),
                    message: format!(
                        "{} bytes requested, but this node's allocations already use {} of {}",
                        spec.memory_bytes,
                        used.iter().sum::<u64>(),
                        self.allocatable_bytes
                    ),
                    finished_at: Some(now()),
                    ..Default::default()
                })
            }
        };
        if let Some(status) = refused {
            self.report(&namespace, &name, &status).await;
            return;
        }
        let status = self.supervise(&obj, &spec, account.as_ref(), stop_rx).await;
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&k);
        self.report(&namespace, &name, &status).await;
        // Deleted while it ran: its directory goes now that nothing runs in it.
        self.remove_dir_if_gone(&key(&obj));
        self.ended.notify_one();
        self.changed.notify_waiters();
    }

    /// Removes the directories of allocations no longer listed for this node (deleted: by
    /// their job's deletion, ttl, or a retired epoch), unless a process still runs in them.
    /// After the first full listing also those deleted while this nodelet was away.
    fn forget_gone(&self, desired: &BTreeMap<String, (Object, AllocationSpec)>) {
        let now: HashSet<String> = desired.keys().cloned().collect();
        let gone: Vec<String> = {
            let mut wanted = self.wanted.lock().unwrap_or_else(|e| e.into_inner());
            let gone = wanted.difference(&now).cloned().collect();
            *wanted = now;
            gone
        };
        for k in gone {
            self.remove_dir_if_gone(&k);
        }
        if !self.tidied.swap(true, Ordering::Relaxed) {
            for ns in dirs::read_dirs(&self.data_dir.join("allocs")) {
                for a in dirs::read_dirs(&ns) {
                    let k = format!(
                        "{}/{}",
                        ns.file_name().unwrap_or_default().to_string_lossy(),
                        a.file_name().unwrap_or_default().to_string_lossy()
                    );
                    self.remove_dir_if_gone(&k);
                }
            }
        }
    }
}

/// The current time, as statuses carry it.
pub fn now() -> tb_api::Timestamp {
    tb_api::Timestamp::now()
}
