//! Staging a built-in rank's model shard from the nodes that hold the model, with progress in
//! the allocation's status.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tb_api::specs::{AllocationPhase, AllocationSpec, AllocationStatus};

use super::Supervisor;

pub(super) fn staging_status(model: &str, have: u64, need: u64) -> AllocationStatus {
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

impl Supervisor {
    /// Stages a built-in rank's shard from the nodes that hold the model, reporting progress in
    /// the allocation's status (Pending, reason `Staging`) about once a second.
    pub(super) async fn stage(
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
            whole: false,
        };
        let whole = b.replicate.then(|| crate::staging::fetch::Job {
            whole: true,
            ..job.clone()
        });
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
                if let Some(whole) = whole {
                    keep_a_whole_copy(whole, s.file_len.saturating_sub(s.needed));
                }
                Ok((s.path, s.needed))
            }
            Ok(Err(e)) => Err(format!("staging {}: {e}", b.model)),
            Err(e) => Err(format!("staging {} stopped: {e}", b.model)),
        }
    }
}

impl Supervisor {
    /// Fetches a rank's LoRA adapter from the node that holds it (`source`, its probe server)
    /// into `DATA_DIR/adapters`, readable by the job's account.
    pub(super) async fn stage_adapter(&self, source: &str, path: &str) -> Result<PathBuf, String> {
        let addr: std::net::SocketAddr = source
            .parse()
            .map_err(|e| format!("builtin.adapter.source {source:?}: {e}"))?;
        let root = self.data_dir.join("adapters");
        let (path_owned, root_owned) = (path.to_string(), root.clone());
        let fetched = tokio::task::spawn_blocking(move || {
            crate::staging::adapter::fetch(addr, &path_owned, &root_owned, Duration::from_secs(600))
        })
        .await
        .map_err(|e| format!("staging the adapter stopped: {e}"))?
        .map_err(|e| format!("staging the adapter {path}: {e}"))?;
        // tb-shard runs as the job's account.
        crate::agent::dirs::share_tree(&root);
        tracing::info!(adapter = %path, %source, dir = %fetched.display(), "adapter staged");
        Ok(fetched)
    }
}

/// Space left free on the cache's disk after a whole copy is made.
const COPY_HEADROOM: u64 = 1 << 30;

/// Fetches the rest of the file in the background (the rank starts at once on its shard) and
/// records the whole copy, which this nodelet then reports and serves; skipped when the disk
/// has no room for `rest` more bytes.
#[allow(clippy::useless_conversion)] // statvfs counts are u32 on macOS, u64 on Linux
fn keep_a_whole_copy(job: crate::staging::fetch::Job, rest: u64) {
    let free = nix::sys::statvfs::statvfs(&job.cache_root)
        .map(|v| u64::from(v.blocks_available()).saturating_mul(u64::from(v.fragment_size())))
        .unwrap_or(0);
    if free < rest.saturating_add(COPY_HEADROOM) {
        tracing::warn!(
            model = %job.path,
            free,
            rest,
            "no room for a whole copy of the model on this node's disk"
        );
        return;
    }
    tokio::task::spawn_blocking(move || match crate::staging::fetch::stage(&job, &|_| {}) {
        Ok(s) => tracing::info!(
            model = %job.path,
            fetched = s.fetched,
            "kept a whole copy of the model; serving it to other nodes"
        ),
        Err(e) => tracing::warn!(model = %job.path, "making a whole copy of the model: {e}"),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn staging_progress_reads_as_a_percentage() {
        let s = staging_status("smollm2", 5 << 20, 20 << 20);
        assert_eq!(s.reason, "Staging");
        assert_eq!(s.message, "staging smollm2: 5.0/20.0 MiB (25%)");
        assert_eq!((s.staged_bytes, s.stage_bytes), (5 << 20, 20 << 20));
    }
}
