//! Runs this node's allocations: watches the Allocations assigned to it (a gRPC stream, so a new
//! one starts without polling delay), starts each exactly once, reports how it goes, and stops —
//! fences — any process whose allocation is gone, told to stop, or of another epoch.
//!
//! Each rank runs as its namespace's account (`super::accounts`) in directories laid out by
//! `super::dirs`, and is contained (`crate::exec::contain`): what it leaves behind is killed
//! with it. An allocation's directory is removed when the allocation is deleted, and the
//! oldest finished ones go first when the jobs' disk use passes `--job-disk-limit`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tb_api::proto::UpdateStatusRequest;
use tb_api::specs::{
    AllocationPhase, AllocationSpec, AllocationStatus, Backend, Desired, Executor, allocation,
    parse_spec,
};
use tb_api::{Kind, Object};
use tb_client::informer::{Change, Informer};
use tokio::sync::{Notify, oneshot};

use super::accounts::{Account, Policy};
use super::controllers::{Controllers, retryable};
use super::dirs::{self, AllocDirs};
use crate::builtin::command::{TERMINATION_MESSAGE_ENV, shard_command};
use crate::exec;
use crate::exec::contain::{self, Scope};
use crate::mlx;

/// How often rank 0 of a built-in service is asked whether it is ready.
const READINESS_EVERY: Duration = Duration::from_secs(1);
/// How often the jobs' disk use is measured (also after every allocation ends).
const DISK_EVERY: Duration = Duration::from_secs(30);
/// The most of a termination message read.
const TERMINATION_MESSAGE_LIMIT: u64 = 4096;

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
    stop: Option<oneshot::Sender<()>>,
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
    ended: Notify,
    changed: Notify,
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

    /// Where an allocation keeps its working directory, logs and pid.
    pub fn alloc_dir(data_dir: &Path, namespace: &str, name: &str) -> PathBuf {
        data_dir.join("allocs").join(namespace).join(name)
    }

    /// Processes left by an earlier run of this nodelet cannot be supervised (they are not our
    /// children): kill those it can prove are its own, and report their allocations lost so
    /// their jobs are placed anew. A pid file's process is killed only while its pid, start time
    /// and account still match (a number alone may name a stranger by now); everything under
    /// tb's dynamic uids is tb's own, since nothing of this run has started yet.
    pub fn reap_orphans(&self) -> Vec<(String, String)> {
        let mut reaped = Vec::new();
        let dynamic = self.policy.dynamic_uids();
        for ns in dirs::read_dirs(&self.data_dir.join("allocs")) {
            for a in dirs::read_dirs(&ns) {
                let pid_file = a.join("pid");
                let Ok(text) = std::fs::read_to_string(&pid_file) else {
                    continue;
                };
                match PidFile::parse(&text) {
                    Some(p) if p.is_alive() => {
                        kill_group(p.pid);
                        let killed = Scope::new(p.allocation.clone()).sweep(Some((p.pid, p.start)));
                        tracing::warn!(pid = p.pid, killed, alloc = %a.display(), "killed the processes of an allocation left by an earlier nodelet");
                    }
                    Some(p) => {
                        tracing::info!(pid = p.pid, alloc = %a.display(), "the pid file's process is gone (its pid names another process now, or none): nothing to kill");
                    }
                    None => {
                        tracing::warn!(alloc = %a.display(), "a pid file without the process's start time cannot prove whose the pid is: left alone");
                    }
                }
                let _ = std::fs::remove_file(&pid_file);
                let namespace = ns
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .to_string();
                let name = a
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .to_string();
                reaped.push((namespace, name));
            }
        }
        let killed = contain::sweep_uids(&dynamic);
        if killed > 0 {
            tracing::warn!(
                killed,
                "killed processes of tb's job accounts left by an earlier nodelet"
            );
        }
        reaped
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
                    self.controllers.rotate();
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
        // Fencing first: anything not wanted, or wanted under another epoch, stops.
        {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            for (inc, l) in live.iter_mut() {
                let keep = desired.get(&l.key).is_some_and(|(o, s)| {
                    s.desired == Desired::Run && s.epoch == l.epoch && &incarnation(o) == inc
                });
                let k = &l.key;
                if !keep && let Some(stop) = l.stop.take() {
                    tracing::info!(alloc = %k, "stopping: allocation gone, superseded or told to stop");
                    let _ = stop.send(());
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

    fn remove_dir_if_gone(&self, k: &str) {
        let Some((namespace, name)) = k.split_once('/') else {
            return;
        };
        let wanted = self
            .wanted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(k);
        let running = self
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .any(|l| l.key == k);
        if !wanted && !running {
            dirs::remove_alloc(
                &self.data_dir,
                &Self::alloc_dir(&self.data_dir, namespace, name),
            );
        }
    }

    /// Measures the jobs' disk use (every [`DISK_EVERY`] and after each allocation ends) and,
    /// past `--job-disk-limit`, removes the oldest finished allocations' directories first.
    async fn keep_disk_use(self: Arc<Self>) {
        loop {
            let me = self.clone();
            let _ = tokio::task::spawn_blocking(move || me.measure_and_trim()).await;
            tokio::select! {
                _ = tokio::time::sleep(DISK_EVERY) => {}
                _ = self.ended.notified() => {}
            }
        }
    }

    fn measure_and_trim(&self) {
        // Orphans of ranks that exited on their own (the nodelet adopted them): reap them.
        contain::reap_adopted();
        let allocs = self.data_dir.join("allocs");
        let mut total = dirs::disk_usage(&allocs);
        if total > self.job_disk_limit {
            let running: HashSet<String> = self
                .live
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .map(|l| l.key.clone())
                .collect();
            // Finished (nothing runs in it), oldest first: by when it ended, else last change.
            let mut finished: Vec<(std::time::SystemTime, String, PathBuf)> = Vec::new();
            for ns in dirs::read_dirs(&allocs) {
                for a in dirs::read_dirs(&ns) {
                    let k = format!(
                        "{}/{}",
                        ns.file_name().unwrap_or_default().to_string_lossy(),
                        a.file_name().unwrap_or_default().to_string_lossy()
                    );
                    if running.contains(&k) || a.join("pid").exists() {
                        continue;
                    }
                    let when = std::fs::metadata(a.join("exit.json"))
                        .or_else(|_| std::fs::metadata(&a))
                        .and_then(|m| m.modified())
                        .unwrap_or(std::time::UNIX_EPOCH);
                    finished.push((when, k, a));
                }
            }
            finished.sort();
            for (_, k, dir) in finished {
                if total <= self.job_disk_limit {
                    break;
                }
                let bytes = dirs::disk_usage(&dir);
                tracing::warn!(alloc = %k, bytes, limit = self.job_disk_limit, "jobs use more disk than --job-disk-limit: removing the oldest finished allocation's directory");
                dirs::remove_alloc(&self.data_dir, &dir);
                total = total.saturating_sub(bytes);
            }
        }
        self.job_disk_bytes.store(total, Ordering::Relaxed);
    }

    /// Prepare, start and watch over one allocation's process; returns how it ended.
    async fn supervise(
        self: &Arc<Self>,
        obj: &Object,
        spec: &AllocationSpec,
        account: Option<&Account>,
        stop: oneshot::Receiver<()>,
    ) -> AllocationStatus {
        let (namespace, name) = (&obj.metadata.namespace[..], &obj.metadata.name[..]);
        let dir = Self::alloc_dir(&self.data_dir, namespace, name);
        let failed = |reason: &str, message: String| AllocationStatus {
            phase: AllocationPhase::Failed,
            reason: reason.into(),
            message,
            finished_at: Some(now()),
            ..Default::default()
        };
        // A built-in rank whose node lacks the model file stages its shard first.
        let mut staged_path = None;
        let mut staged_bytes = 0;
        if let Some(b) = spec.builtin.as_ref().filter(|b| !b.sources.is_empty()) {
            match self.stage(namespace, name, spec, b).await {
                Ok((p, bytes)) => {
                    staged_path = Some(p);
                    staged_bytes = bytes;
                }
                Err(e) => return failed("StagingFailed", e),
            }
        }
        if let Some(p) = &staged_path {
            // tb-shard runs as the job's account: the cache must be readable to it.
            let models = self.data_dir.join("models");
            if p.starts_with(&models) {
                dirs::share_tree(&models);
            }
        }
        let inc = incarnation(obj);
        let prepared = prepare(&dir, namespace, spec, staged_path.as_deref(), account, &inc);
        let (mut exec_spec, alloc_dirs) = match prepared {
            Ok(s) => s,
            Err(Prepare::Model(e)) => return failed("ModelNotFound", e),
            Err(Prepare::Other(e)) => return failed("InvalidSpec", format!("{e:#}")),
        };
        exec_spec.scope = Some(self.scope_of(obj, &inc, account));
        let termination = alloc_dirs.termination_message();
        let _ = std::fs::remove_file(&termination);
        let mut running = match exec::spawn(exec_spec) {
            Ok(r) => r,
            Err(e) => return failed(e.reason(), e.to_string()),
        };
        let pid = running.pid();
        let pid_file = PidFile {
            pid: pid as i32,
            start: running.start_time(),
            uid: account.map_or_else(|| nix::unistd::geteuid().as_raw(), |a| a.uid),
            epoch: spec.epoch,
            allocation: inc.clone(),
        };
        if let Err(e) = dirs::write_private(&dir.join("pid"), pid_file.to_string().as_bytes()) {
            tracing::warn!(alloc = %inc, "{e:#}");
        }
        let started_at = now();
        let running_status = AllocationStatus {
            phase: AllocationPhase::Running,
            pid: Some(pid),
            started_at: Some(started_at.clone()),
            staged_bytes,
            stage_bytes: staged_bytes,
            ..Default::default()
        };
        self.report(namespace, name, &running_status).await;
        tracing::info!(alloc = %format!("{namespace}/{name}"), pid, "started");
        // Rank 0 of a built-in service: report its endpoint, and whether it answers.
        let readiness = endpoint_of(spec).map(|(endpoint, health)| {
            tokio::spawn(watch_readiness(
                self.controllers.clone(),
                namespace.to_string(),
                name.to_string(),
                running_status.clone(),
                endpoint,
                health,
            ))
        });

        let grace = Duration::from_secs(spec.stop_grace_seconds);
        let (ended, stopped) = tokio::select! {
            r = running.wait() => (r, false),
            _ = stop => (running.stop(grace).await, true),
        };
        if let Some(task) = readiness {
            task.abort();
        }
        let _ = std::fs::remove_file(dir.join("pid"));
        let mut status = AllocationStatus {
            pid: Some(pid),
            started_at: Some(started_at),
            finished_at: Some(now()),
            ..Default::default()
        };
        match ended {
            Ok(exit) => {
                status.exit_code = exit.code;
                status.signal = exit.signal;
                status.message = exit.to_string();
                (status.phase, status.reason) = if stopped {
                    (AllocationPhase::Stopped, "Stopped".into())
                } else if exit.success() {
                    (AllocationPhase::Succeeded, "Completed".into())
                } else {
                    (AllocationPhase::Failed, "Error".into())
                };
                // A process may say why it failed (tb-shard does): `Reason\nmessage`.
                if status.phase == AllocationPhase::Failed
                    && let Some(text) = dirs::read_job_file(&termination, TERMINATION_MESSAGE_LIMIT)
                {
                    let (reason, message) = text.split_once('\n').unwrap_or(("Error", &text));
                    let reason: String = reason
                        .chars()
                        .filter(char::is_ascii_alphanumeric)
                        .take(64)
                        .collect();
                    if !reason.is_empty() {
                        status.reason = reason;
                    }
                    status.message = format!("{}: {}", status.message, message.trim());
                }
            }
            Err(e) => {
                status.phase = AllocationPhase::Failed;
                status.reason = e.reason().into();
                status.message = e.to_string();
            }
        }
        let _ = dirs::write_private(
            &dir.join("exit.json"),
            status.to_value().to_string().as_bytes(),
        );
        tracing::info!(alloc = %format!("{namespace}/{name}"), phase = ?status.phase, "{}", status.message);
        status
    }

    /// What belongs to an allocation: its marker, its cgroup (Linux, cgroup v2), and its dynamic
    /// uid while no other allocation here runs under it.
    fn scope_of(self: &Arc<Self>, obj: &Object, inc: &str, account: Option<&Account>) -> Scope {
        let exclusive_uid: Option<contain::ExclusiveUid> = account.filter(|a| a.dynamic).map(|a| {
            let (me, uid, inc) = (self.clone(), a.uid, inc.to_string());
            Arc::new(move || {
                let live = me.live.lock().unwrap_or_else(|e| e.into_inner());
                let shared = live
                    .iter()
                    .any(|(k, l)| k != &inc && l.dynamic_uid == Some(uid));
                (!shared).then_some(uid)
            }) as contain::ExclusiveUid
        });
        Scope {
            id: inc.to_string(),
            cgroup: contain::Cgroup::create(&obj.metadata.uid).map(Arc::new),
            exclusive_uid,
        }
    }

    /// Stages a built-in rank's shard from the nodes that hold the model, reporting progress in
    /// the allocation's status (Pending, reason `Staging`) about once a second.
    async fn stage(
        &self,
        namespace: &str,
        name: &str,
        spec: &AllocationSpec,
        b: &tb_api::specs::BuiltinAssignment,
    ) -> Result<(PathBuf, u64), String> {
        let sources: Vec<std::net::SocketAddr> =
            b.sources.iter().filter_map(|s| s.parse().ok()).collect();
        if sources.is_empty() {
            return Err(format!("no usable staging source in {:?}", b.sources));
        }
        let job = crate::staging::fetch::Job {
            sources,
            path: b.model_path.clone(),
            first: spec.layers.map_or(0, |l| l.first as usize),
            count: spec.layers.map(|l| l.count as usize),
            cache_root: self.data_dir.join("models"),
            timeout: Duration::from_secs(3600),
        };
        let progress = Arc::new(Mutex::new(None::<crate::staging::fetch::Progress>));
        let seen = progress.clone();
        let mut work = tokio::task::spawn_blocking(move || {
            crate::staging::fetch::stage(&job, &|p| {
                *seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
            })
        });
        let mut reported = None;
        let outcome = loop {
            tokio::select! {
                r = &mut work => break r,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            let now = *progress.lock().unwrap_or_else(|e| e.into_inner());
            if now != reported
                && let Some(p) = now
            {
                reported = now;
                let status = staging_status(&b.model, p.have, p.need);
                self.report(namespace, name, &status).await;
            }
        };
        match outcome {
            Ok(Ok(s)) => {
                tracing::info!(
                    alloc = %format!("{namespace}/{name}"),
                    fetched = s.fetched,
                    needed = s.needed,
                    file = s.file_len,
                    "model staged"
                );
                self.report(
                    namespace,
                    name,
                    &staging_status(&b.model, s.needed, s.needed),
                )
                .await;
                Ok((s.path, s.needed))
            }
            Ok(Err(e)) => Err(format!("staging {}: {e}", b.model)),
            Err(e) => Err(format!("staging {} stopped: {e}", b.model)),
        }
    }

    /// Write an allocation's status, retrying across controllers until it lands or the
    /// allocation is gone.
    async fn report(&self, namespace: &str, name: &str, status: &AllocationStatus) {
        report(&self.controllers, namespace, name, status).await
    }
}

fn staging_status(model: &str, have: u64, need: u64) -> AllocationStatus {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    AllocationStatus {
        phase: AllocationPhase::Pending,
        reason: "Staging".into(),
        message: format!(
            "staging {model}: {:.1}/{:.1} MiB ({}%)",
            mib(have),
            mib(need),
            (have * 100).checked_div(need).unwrap_or(100)
        ),
        staged_bytes: have,
        stage_bytes: need,
        ..Default::default()
    }
}

/// Reports the endpoint of a running rank 0 of a built-in service, and each change of its
/// readiness (`GET /health`), until aborted when the process ends.
async fn watch_readiness(
    controllers: Arc<Controllers>,
    namespace: String,
    name: String,
    running: AllocationStatus,
    endpoint: String,
    health: String,
) {
    let mut last: Option<bool> = None;
    loop {
        let ready = healthy(&health).await;
        if last != Some(ready) {
            let status = AllocationStatus {
                endpoint: endpoint.clone(),
                ready,
                ..running.clone()
            };
            report(&controllers, &namespace, &name, &status).await;
            tracing::info!(alloc = %format!("{namespace}/{name}"), %endpoint, ready, "endpoint readiness");
            last = Some(ready);
        }
        tokio::time::sleep(READINESS_EVERY).await;
    }
}

/// Write an allocation's status, retrying across controllers until it lands or the allocation
/// is gone.
async fn report(controllers: &Controllers, namespace: &str, name: &str, status: &AllocationStatus) {
    {
        for attempt in 0..60u32 {
            let result = async {
                let mut client = controllers
                    .objects()
                    .await
                    .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
                client
                    .update_status(UpdateStatusRequest {
                        kind: Kind::Allocation.as_str().into(),
                        namespace: namespace.into(),
                        name: name.into(),
                        status_json: status.to_value().to_string(),
                        resource_version: 0,
                        request_id: String::new(),
                    })
                    .await
            }
            .await;
            match result {
                Ok(_) => return,
                Err(s) if s.code() == tonic::Code::NotFound => return,
                Err(s) if retryable(&s) => {
                    controllers.rotate();
                    tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt.min(10) + 1)))
                        .await;
                }
                Err(s) => {
                    tracing::warn!(alloc = %format!("{namespace}/{name}"), "status not accepted: {}", s.message());
                    return;
                }
            }
        }
        tracing::warn!(alloc = %format!("{namespace}/{name}"), "gave up reporting status: no controller answered");
    }
}

/// Why an allocation could not be prepared.
enum Prepare {
    /// The built-in executor's model file is not here.
    Model(String),
    Other(anyhow::Error),
}

impl From<anyhow::Error> for Prepare {
    fn from(e: anyhow::Error) -> Self {
        Prepare::Other(e)
    }
}

impl From<mlx::MlxError> for Prepare {
    fn from(e: mlx::MlxError) -> Self {
        Prepare::Other(e.into())
    }
}

/// The `tb-shard` binary: beside this nodelet's own binary.
fn shard_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("tb-shard")))
        .unwrap_or_else(|| PathBuf::from("tb-shard"))
}

/// Rank 0 of a built-in service: (endpoint URL, health address).
fn endpoint_of(spec: &AllocationSpec) -> Option<(String, String)> {
    let b = spec.builtin.as_ref()?;
    if spec.executor != Executor::Builtin || spec.rank != 0 {
        return None;
    }
    let host = b.hosts.first()?;
    let port = b.endpoint_port?;
    Some((format!("http://{host}:{port}/v1"), format!("{host}:{port}")))
}

/// The most recently modified entry of `dir` (a checkpoint file or directory), if any.
fn newest_entry(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .max()
        .map(|(_, p)| p)
}

/// One `GET /health`: whether it answered 200.
async fn healthy(addr: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(format!("GET /health HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await.ok()?;
        Some(head.starts_with(b"HTTP/1.0 200") || head.starts_with(b"HTTP/1.1 200"))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), ask).await,
        Ok(Some(true))
    )
}

/// The process to start: its directories, the MLX files and environment, the command, the
/// account.
fn prepare(
    dir: &Path,
    namespace: &str,
    spec: &AllocationSpec,
    staged: Option<&Path>,
    account: Option<&Account>,
    incarnation: &str,
) -> Result<(exec::Spec, AllocDirs), Prepare> {
    let (alloc_dirs, work) = dirs::prepare_alloc(dir, account, spec.working_dir.as_deref())?;
    let logs = alloc_dirs.logs.clone();
    let mut env = spec.env.clone();
    let job = if namespace == "default" {
        spec.job.name.clone()
    } else {
        format!("{namespace}/{}", spec.job.name)
    };
    let mut files = mlx::MlxFiles::default();
    let mut coordinator = None;
    let backend = spec.mlx.as_ref().map_or(Backend::Ring, |m| m.backend);
    if let Some(m) = &spec.mlx {
        let ranks = m
            .hosts
            .iter()
            .map(|h| mlx::parse_address(h))
            .collect::<Result<Vec<_>, _>>()
            .context("the allocation's MLX hosts")?;
        let hostfile = dir.join("hostfile.json");
        mlx::write_atomic(&hostfile, &mlx::ring_hostfile(&ranks)?)?;
        dirs::give_file(&hostfile, account)?;
        files.hostfile_path = Some(hostfile);
        if let Some(matrix) = &m.ibv_devices {
            let matrix: Vec<Vec<Vec<String>>> = matrix
                .iter()
                .map(|row| row.iter().map(|c| c.iter().cloned().collect()).collect())
                .collect();
            let devices = dir.join("ibv_devices.json");
            mlx::write_atomic(&devices, &mlx::ibv_devices(&matrix)?)?;
            dirs::give_file(&devices, account)?;
            files.ibv_devices_path = Some(devices);
        }
        coordinator = m.coordinator.clone();
    }
    let mlx_ready = match backend {
        Backend::Ring => files.hostfile_path.is_some(),
        _ => files.ibv_devices_path.is_some(),
    };
    let tb_env = if mlx_ready {
        mlx::env_for_rank(
            &job,
            spec.rank,
            spec.world_size,
            backend,
            &files,
            coordinator,
        )?
    } else {
        // No MLX setup, or JACCL without a device matrix (no RDMA topology known yet): tb's own
        // variables only.
        BTreeMap::from([
            ("TB_JOB".to_string(), job.clone()),
            ("TB_RANK".to_string(), spec.rank.to_string()),
            ("TB_WORLD_SIZE".to_string(), spec.world_size.to_string()),
            ("MLX_RANK".to_string(), spec.rank.to_string()),
        ])
    };
    env.extend(tb_env);
    env.insert("TB_EPOCH".into(), spec.epoch.to_string());
    // A job that keeps checkpoints resumes from the newest one after a restart or preemption.
    if let Some(newest) = env
        .get("TB_CHECKPOINT_DIR")
        .and_then(|d| newest_entry(Path::new(d)))
    {
        env.insert("TB_RESUME_FROM".into(), newest.display().to_string());
    }
    env.insert("TB_ALLOCATION_DIR".into(), dir.display().to_string());
    env.insert(contain::MARKER_ENV.into(), incarnation.to_string());
    if let Some(a) = account {
        // The nodelet's HOME and TMPDIR are not the job's to use.
        env.entry("HOME".into())
            .or_insert_with(|| alloc_dirs.work.display().to_string());
        env.entry("TMPDIR".into())
            .or_insert_with(|| alloc_dirs.tmp().display().to_string());
        if let Some(name) = &a.name {
            env.insert("USER".into(), name.clone());
            env.insert("LOGNAME".into(), name.clone());
        }
    }
    let command = if spec.executor == Executor::Builtin {
        env.insert(
            TERMINATION_MESSAGE_ENV.into(),
            alloc_dirs.termination_message().display().to_string(),
        );
        shard_command(&shard_binary(), spec, staged).map_err(Prepare::Model)?
    } else {
        spec.command.clone()
    };
    let mut s = exec::Spec::new(command, work, logs);
    s.env = env;
    s.run_as = account.map(Account::run_as);
    Ok((s, alloc_dirs))
}

/// What a pid file records: enough to prove, after a restart, that a pid still names the
/// process tb started (pid, start time, account), and the allocation it ran for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PidFile {
    pid: i32,
    start: u64,
    uid: u32,
    epoch: u64,
    allocation: String,
}

impl std::fmt::Display for PidFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} {} {} {} {}",
            self.pid, self.start, self.uid, self.epoch, self.allocation
        )
    }
}

impl PidFile {
    /// `PID START UID EPOCH ALLOCATION`; None for anything else (an older `PID EPOCH` file
    /// included: a number alone proves nothing).
    fn parse(text: &str) -> Option<PidFile> {
        let mut f = text.split_whitespace();
        let p = PidFile {
            pid: f.next()?.parse().ok()?,
            start: f.next()?.parse().ok()?,
            uid: f.next()?.parse().ok()?,
            epoch: f.next()?.parse().ok()?,
            allocation: f.next()?.to_string(),
        };
        (f.next().is_none() && p.pid > 1 && p.start > 0).then_some(p)
    }

    /// Whether the recorded process still runs: same pid, start time and account.
    fn is_alive(&self) -> bool {
        contain::is_same_process(self.pid, self.start)
            && contain::uid_of(self.pid) == Some(self.uid)
    }
}

fn kill_group(pid: i32) {
    use nix::sys::signal::{Signal, killpg};
    use nix::unistd::Pid;
    if pid > 1 {
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

/// The current time, as statuses carry it.
pub fn now() -> tb_api::Timestamp {
    tb_api::Timestamp::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restarted_rank_resumes_from_the_newest_checkpoint() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(newest_entry(dir.path()), None, "no checkpoint yet");
        for (i, name) in ["step-100", "step-200", ".partial"].iter().enumerate() {
            std::fs::create_dir(dir.path().join(name)).expect("mkdir");
            let t = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000 + i as u64);
            let f = std::fs::File::open(dir.path().join(name)).expect("open");
            f.set_modified(t).expect("mtime");
        }
        assert_eq!(newest_entry(dir.path()), Some(dir.path().join("step-200")));
        assert_eq!(newest_entry(&dir.path().join("missing")), None);
    }

    #[test]
    fn a_pid_file_proves_its_process_by_start_time_and_account() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = child.id() as i32;
        let start = contain::start_time(pid).expect("start time");
        let me = nix::unistd::geteuid().as_raw();
        let file = PidFile {
            pid,
            start,
            uid: me,
            epoch: 3,
            allocation: "default/a-e3-r0/u1".into(),
        };
        let text = file.to_string();
        assert_eq!(PidFile::parse(&text), Some(file.clone()));
        assert!(file.is_alive());
        // A recycled pid: same number, another start time or account.
        assert!(
            !PidFile {
                start: start + 1,
                ..file.clone()
            }
            .is_alive()
        );
        assert!(
            !PidFile {
                uid: me + 1,
                ..file.clone()
            }
            .is_alive()
        );
        // The old format (pid, epoch) proves nothing; nor do garbage and pid 1.
        assert_eq!(PidFile::parse(&format!("{pid} 3\n")), None);
        assert_eq!(PidFile::parse("1 5 0 1 x"), None);
        assert_eq!(PidFile::parse("x y z"), None);
        let _ = child.kill();
        let _ = child.wait();
        assert!(!file.is_alive(), "gone");
    }

    #[test]
    fn staging_progress_reads_as_a_percentage() {
        let s = staging_status("smollm2", 5 << 20, 20 << 20);
        assert_eq!(s.reason, "Staging");
        assert_eq!(s.message, "staging smollm2: 5.0/20.0 MiB (25%)");
        assert_eq!((s.staged_bytes, s.stage_bytes), (5 << 20, 20 << 20));
    }
}
