//! Rank 0's progress file: after each step it writes a small JSON [`TrainingProgress`] (step,
//! loss, eval loss, tokens/s, ETA, a loss curve of at most 64 points) beside its termination
//! message; the nodelet reads it and passes it on, at most every few seconds, in the
//! allocation's status. Written by rename, so the nodelet never reads half a file.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tb_api::status::{AdapterLocation, LossCurve, TrainingProgress};

/// Environment variable naming the progress file (set by the nodelet for rank 0).
pub const PROGRESS_FILE_ENV: &str = "TB_PROGRESS_FILE";

/// Weight of the newest step in the smoothed step time.
const NEWEST: f64 = 0.2;
/// Written at most this often, except for the last step and the adapter.
const WRITE_EVERY: Duration = Duration::from_millis(500);

/// Rank 0's view of the run, and where it writes it.
#[derive(Debug)]
pub struct Progress {
    path: Option<PathBuf>,
    total_steps: u64,
    curve: LossCurve,
    /// Smoothed seconds per step and tokens per second.
    step_seconds: Option<f64>,
    tokens_per_second: Option<f64>,
    last: TrainingProgress,
    written_at: Option<Instant>,
}

impl Progress {
    pub fn new(path: Option<PathBuf>, total_steps: u64) -> Progress {
        Progress {
            path,
            total_steps,
            curve: LossCurve::default(),
            step_seconds: None,
            tokens_per_second: None,
            last: TrainingProgress {
                total_steps,
                ..Default::default()
            },
            written_at: None,
        }
    }

    /// Where a resumed run starts.
    pub fn resumed(&mut self, step: u64) {
        self.last.step = step;
        self.write(true);
    }

    /// One step done: its mean loss, the tokens all ranks processed, the time it took.
    pub fn step(&mut self, step: u64, loss: f64, tokens: u64, took: Duration) {
        self.curve.push(loss);
        let secs = took.as_secs_f64().max(1e-9);
        let smooth = |old: Option<f64>, new: f64| {
            Some(old.map_or(new, |o| o * (1.0 - NEWEST) + new * NEWEST))
        };
        self.step_seconds = smooth(self.step_seconds, secs);
        self.tokens_per_second = smooth(self.tokens_per_second, tokens as f64 / secs);
        self.last.step = step;
        self.last.loss = Some(loss);
        self.last.loss_curve = self.curve.points();
        self.last.curve_stride = self.curve.stride();
        self.last.tokens_per_second = self.tokens_per_second.map(|r| (r * 10.0).round() / 10.0);
        self.last.eta_seconds = self
            .step_seconds
            .map(|s| (s * self.total_steps.saturating_sub(step) as f64).round() as u64);
        self.write(step >= self.total_steps);
    }

    pub fn eval(&mut self, loss: f64) {
        self.last.eval_loss = Some(loss);
        self.write(true);
    }

    pub fn adapter(&mut self, path: String) {
        self.last.adapter = Some(AdapterLocation {
            node: String::new(),
            path,
        });
        self.write(true);
    }

    /// The progress as last recorded.
    pub fn current(&self) -> &TrainingProgress {
        &self.last
    }

    fn write(&mut self, now: bool) {
        let Some(path) = &self.path else { return };
        if !now && self.written_at.is_some_and(|t| t.elapsed() < WRITE_EVERY) {
            return;
        }
        self.written_at = Some(Instant::now());
        let Ok(json) = serde_json::to_vec(&self.last) else {
            return;
        };
        let mut tmp = path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        if let Err(e) = std::fs::write(&tmp, json).and_then(|()| std::fs::rename(&tmp, path)) {
            tracing::warn!(path = %path.display(), "cannot write the progress file: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_holds_the_latest_step_eta_and_adapter() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("progress.json");
        let mut p = Progress::new(Some(path.clone()), 10);
        for step in 1..=10 {
            p.step(
                step,
                5.0 - step as f64 / 10.0,
                100,
                Duration::from_millis(100),
            );
        }
        p.eval(4.2);
        p.adapter("/tmp/adapter".into());
        let read: TrainingProgress =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
        assert_eq!(read.step, 10);
        assert_eq!(read.total_steps, 10);
        assert_eq!(read.eta_seconds, Some(0));
        assert_eq!(read.eval_loss, Some(4.2));
        assert_eq!(read.loss_curve.len(), 10);
        assert!((read.tokens_per_second.expect("rate") - 1000.0).abs() < 1.0);
        assert_eq!(read.adapter.expect("adapter").path, "/tmp/adapter");
    }
}
