//! One allocation's process from start to end: staging and preparing it, starting it
//! contained (its marker, cgroup and exclusive uid), reporting it running (and, for rank 0 of
//! a built-in service, its endpoint's readiness), and how it ended — by itself, or stopped.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tb_api::Object;
use tb_api::reason::Reason;
use tb_api::specs::{AllocationPhase, AllocationSpec, AllocationStatus, allocation};
use tokio::sync::oneshot;

use super::fence::Stop;
use super::orphans::{self, PidFile};
use super::prepare::{Prepare, Sources, prepare};
use super::readiness::{endpoint_of, watch_readiness};
use super::training::{self, reports_progress, watch_progress};
use super::{Supervisor, incarnation, now};
use crate::agent::accounts::Account;
use crate::agent::dirs;
use crate::exec;
use crate::exec::contain::{self, Scope};

/// The most of a termination message read.
pub(super) const TERMINATION_MESSAGE_LIMIT: u64 = 4096;

impl Supervisor {
    /// Prepare, start and watch over one allocation's process; returns how it ended.
    pub(super) async fn supervise(
        self: &Arc<Self>,
        obj: &Object,
        spec: &AllocationSpec,
        account: Option<&Account>,
        stop: oneshot::Receiver<Stop>,
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
        // An adapter held by another node is fetched here first.
        let mut staged_adapter = None;
        if let Some(a) = spec.builtin.as_ref().and_then(|b| b.adapter.as_ref())
            && let Some(source) = &a.source
        {
            match self.stage_adapter(source, &a.path).await {
                Ok(dir) => staged_adapter = Some(dir),
                Err(e) => return failed("StagingFailed", e),
            }
        }
        // Rank 0 of a service serves the OpenAI API with the key (and certificate) only the
        // controllers give.
        let mut service_credentials = None;
        if super::service_key::serves_openai(spec) {
            match super::service_key::fetch(&self.controllers, namespace, name).await {
                Ok(c) => service_credentials = Some(c),
                Err(e) => return failed("ServiceKeyUnavailable", e),
            }
        }
        // Rank 0 serves HTTPS when it has a certificate and this nodelet the CA to check it by.
        let mut probe_tls = None;
        if let Some(c) = service_credentials.as_mut().filter(|c| c.tls.is_some()) {
            match self
                .controllers
                .trust()
                .map(|t| tb_api::https::client_config(&t.pem))
            {
                Some(Ok(config)) => probe_tls = Some(config),
                Some(Err(e)) => return failed("InvalidSpec", format!("the cluster CA: {e}")),
                None => c.tls = None,
            }
        }
        let inc = incarnation(obj);
        let manifest_dir = obj
            .metadata
            .annotations
            .get(allocation::ANNOTATION_MANIFEST_DIR)
            .map(PathBuf::from);
        let lookup = Sources {
            staged: staged_path.as_deref(),
            staged_adapter: staged_adapter.as_deref(),
            manifest_dir: manifest_dir.as_deref(),
            python: self.ranks.python.as_deref(),
            engine_threads: self.ranks.engine_threads,
            service: service_credentials.as_ref(),
        };
        let prepared = prepare(&dir, namespace, spec, &lookup, account, &inc);
        let (mut exec_spec, alloc_dirs) = match prepared {
            Ok(s) => s,
            Err(Prepare::Model(e)) => return failed("ModelNotFound", e),
            Err(Prepare::Program(e)) => return failed("ExecNotFound", e),
            Err(Prepare::Other(e)) => return failed("InvalidSpec", format!("{e:#}")),
        };
        exec_spec.scope = Some(self.scope_of(obj, &inc, account));
        let termination = alloc_dirs.termination_message();
        let _ = std::fs::remove_file(&termination);
        // Until the pid file exists, this names what a restarted nodelet must sweep should it
        // die between the spawn and the pid file (else that rank would run on unseen, beside
        // the replacement the controllers start).
        let starting = dir.join(orphans::STARTING_FILE);
        if let Err(e) = dirs::write_private(&starting, inc.as_bytes()) {
            tracing::warn!(alloc = %inc, "{e:#}");
        }
        let mut running = match exec::spawn(exec_spec) {
            Ok(r) => r,
            Err(e) => {
                let _ = std::fs::remove_file(&starting);
                return failed(e.reason(), e.to_string());
            }
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
        } else {
            let _ = std::fs::remove_file(&starting);
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
        let readiness = endpoint_of(spec, namespace, probe_tls).map(|(endpoint, probe)| {
            tokio::spawn(watch_readiness(
                self.controllers.clone(),
                namespace.to_string(),
                name.to_string(),
                running_status.clone(),
                endpoint,
                probe,
            ))
        });

        // Rank 0 of a built-in fine-tune: report its progress.
        let progress_path = super::prepare::progress_file(&alloc_dirs);
        let progress = reports_progress(spec).then(|| {
            tokio::spawn(watch_progress(
                self.controllers.clone(),
                namespace.to_string(),
                name.to_string(),
                running_status.clone(),
                progress_path.clone(),
            ))
        });

        let grace = Duration::from_secs(spec.stop_grace_seconds);
        let (ended, stopped) = tokio::select! {
            r = running.wait() => (r, None),
            how = stop => {
                // A dropped sender is a stop as asked.
                let how = how.unwrap_or(Stop::Asked);
                let grace = match how {
                    Stop::Asked => grace,
                    Stop::Fenced { kill_after, .. } => grace.min(kill_after),
                };
                (running.stop(grace).await, Some(how))
            }
        };
        if let Some(task) = readiness {
            task.abort();
        }
        if let Some(task) = progress {
            task.abort();
        }
        let _ = std::fs::remove_file(dir.join("pid"));
        let mut status = AllocationStatus {
            pid: Some(pid),
            started_at: Some(started_at),
            finished_at: Some(now()),
            // The last progress (and where the adapter went) outlives the process.
            training: if reports_progress(spec) {
                training::read(&progress_path)
            } else {
                None
            },
            ..Default::default()
        };
        match ended {
            Ok(exit) => {
                status.exit_code = exit.code;
                status.signal = exit.signal;
                status.message = exit.to_string();
                (status.phase, status.reason) = if let Some(Stop::Fenced { silent, .. }) = stopped {
                    status.message = format!(
                        "{}; stopped by its nodelet: no controller accepted a heartbeat for {:.1}s",
                        status.message,
                        silent.as_secs_f64()
                    );
                    (AllocationPhase::Lost, Reason::Fenced.into())
                } else if stopped.is_some() {
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
    pub(super) fn scope_of(
        self: &Arc<Self>,
        obj: &Object,
        inc: &str,
        account: Option<&Account>,
    ) -> Scope {
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
}
