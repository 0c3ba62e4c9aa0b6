//! The jobs' disk: an allocation's directory removed once it is neither wanted nor running,
//! and the oldest finished ones removed first when the jobs' use passes `--job-disk-limit`.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Supervisor;
use crate::agent::dirs;
use crate::exec::contain;

/// How often the jobs' disk use is measured (also after every allocation ends).
pub(super) const DISK_EVERY: Duration = Duration::from_secs(30);

impl Supervisor {
    pub(super) fn remove_dir_if_gone(&self, k: &str) {
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
    pub(super) async fn keep_disk_use(self: Arc<Self>) {
        loop {
            let me = self.clone();
            let _ = tokio::task::spawn_blocking(move || me.measure_and_trim()).await;
            tokio::select! {
                _ = tokio::time::sleep(DISK_EVERY) => {}
                _ = self.ended.notified() => {}
            }
        }
    }

    pub(super) fn measure_and_trim(&self) {
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
}
