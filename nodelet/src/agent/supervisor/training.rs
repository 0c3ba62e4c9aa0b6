//! Rank 0 of a built-in fine-tune: its progress file (written by `tb-train`, see
//! `crate::builtin::train::progress`) read every second and reported in the allocation's status
//! when it moved — at most every [`REPORT_EVERY`], or at once when the adapter appears — so a
//! run of many steps is a few Raft writes a minute, not one a step. What the file says is outside
//! input: read through `read_job_file` (no symlinks, bounded) and bounded again.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tb_api::specs::{AllocationSpec, AllocationStatus, Executor};
use tb_api::status::TrainingProgress;

use super::report::report;
use crate::agent::controllers::Controllers;
use crate::agent::dirs;

/// How often the file is read.
const READ_EVERY: Duration = Duration::from_secs(1);
/// The least time between two reports of mere progress.
pub(super) const REPORT_EVERY: Duration = Duration::from_secs(5);
/// The most of the file read.
const FILE_LIMIT: u64 = 64 * 1024;

/// Whether this allocation is rank 0 of a built-in TrainingJob.
pub(super) fn reports_progress(spec: &AllocationSpec) -> bool {
    spec.executor == Executor::Builtin
        && spec.rank == 0
        && spec.job.kind == tb_api::Kind::TrainingJob.as_str()
}

/// The progress in `path`, if it holds a sane one.
pub(super) fn read(path: &std::path::Path) -> Option<TrainingProgress> {
    let text = dirs::read_job_file(path, FILE_LIMIT)?;
    let p: TrainingProgress = serde_json::from_str(&text).ok()?;
    Some(p.bounded())
}

/// Reports the progress of a running rank 0 until aborted when the process ends.
pub(super) async fn watch_progress(
    controllers: Arc<Controllers>,
    namespace: String,
    name: String,
    running: AllocationStatus,
    path: PathBuf,
) {
    let mut reported: Option<TrainingProgress> = None;
    let mut reported_at: Option<tokio::time::Instant> = None;
    loop {
        tokio::time::sleep(READ_EVERY).await;
        let Some(now) = read(&path) else { continue };
        if reported.as_ref() == Some(&now) {
            continue;
        }
        let adapter_new =
            now.adapter.is_some() && reported.as_ref().is_none_or(|r| r.adapter != now.adapter);
        let due = reported_at.is_none_or(|t| t.elapsed() >= REPORT_EVERY);
        if !(due || adapter_new) {
            continue;
        }
        let status = AllocationStatus {
            training: Some(now.clone()),
            ..running.clone()
        };
        report(&controllers, &namespace, &name, &status).await;
        reported = Some(now);
        reported_at = Some(tokio::time::Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_files_are_bounded_or_ignored() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("progress.json");
        assert_eq!(read(&path), None);
        std::fs::write(&path, b"not json").expect("write");
        assert_eq!(read(&path), None);
        let big = serde_json::json!({"step": 3, "totalSteps": 9, "loss": 1.5,
            "lossCurve": vec![1.0; 500]});
        std::fs::write(&path, big.to_string()).expect("write");
        let p = read(&path).expect("progress");
        assert_eq!((p.step, p.total_steps, p.loss), (3, 9, Some(1.5)));
        assert_eq!(p.loss_curve.len(), tb_api::status::LOSS_CURVE_POINTS);
        std::fs::write(&path, vec![b' '; 100_000]).expect("write");
        assert_eq!(
            read(&path),
            None,
            "more than the limit is cut and unreadable"
        );
    }
}
