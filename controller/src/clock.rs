//! The wall clock the leader's reconcile loop runs the scheduler on.
//!
//! In production this is the system clock. For end-to-end tests only, `tb-controller
//! --test-clock-offset-file FILE` shifts it: the time is the system clock plus a signed offset
//! in milliseconds read from FILE (one integer) on every reconcile pass, so a test moves the
//! scheduler's time (to just before a cron slot, or past several) without waiting for real
//! minutes, and every controller of a test shares the same file. Time keeps flowing at the
//! system clock's rate; only the offset jumps. A missing or unparsable file counts as offset 0
//! (with one warning). Nothing else — Raft timers, token expiry, timestamps of API writes —
//! follows this clock, so a test should move it forward only: a Schedule counts its slots from
//! its creationTimestamp (stamped by the API on the system clock), and with a negative offset
//! it would not fire until the shifted time caught up with that.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use chrono::{DateTime, TimeDelta, Utc};

/// The scheduler's time source: the system clock, optionally shifted by a test offset file.
#[derive(Debug, Clone, Default)]
pub struct SchedulerClock {
    /// Where the test offset (ms) is read from; `None`: the plain system clock.
    offset_file: Option<PathBuf>,
    /// Set once a warning about an unusable offset file has been logged.
    warned: Arc<AtomicBool>,
}

impl SchedulerClock {
    /// The system clock.
    pub fn system() -> SchedulerClock {
        SchedulerClock::default()
    }

    /// The system clock plus the offset in `file` (tests only); `None`: the system clock.
    pub fn with_offset_file(file: Option<PathBuf>) -> SchedulerClock {
        SchedulerClock {
            offset_file: file,
            warned: Arc::default(),
        }
    }

    /// The time now: the system clock, plus the test offset if one is configured (the file is
    /// read on every call).
    pub fn now(&self) -> DateTime<Utc> {
        let now = Utc::now();
        match self.offset() {
            Some(offset) => now.checked_add_signed(offset).unwrap_or(now),
            None => now,
        }
    }

    /// The current test offset, if a file is configured (zero when it cannot be read).
    fn offset(&self) -> Option<TimeDelta> {
        let file = self.offset_file.as_deref()?;
        match read_offset_ms(file) {
            Ok(ms) => Some(TimeDelta::try_milliseconds(ms).unwrap_or_default()),
            Err(e) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "test clock: {e:#}; using offset 0 (warned once; later failures are \
                         silent)"
                    );
                }
                Some(TimeDelta::zero())
            }
        }
    }
}

/// The offset in milliseconds written in `file`: one signed integer, surrounding whitespace
/// ignored.
fn read_offset_ms(file: &Path) -> anyhow::Result<i64> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading the offset file {}", file.display()))?;
    text.trim().parse::<i64>().with_context(|| {
        format!(
            "{}: expected a signed integer (milliseconds), found {:?}",
            file.display(),
            text.trim()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_has_no_offset() {
        let before = Utc::now();
        let t = SchedulerClock::system().now();
        assert!(t >= before && t - before < TimeDelta::seconds(5));
    }

    #[test]
    fn offset_file_shifts_time_and_is_reread() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("offset");
        let clock = SchedulerClock::with_offset_file(Some(file.clone()));
        std::fs::write(&file, "3600000\n").expect("write");
        let shift = clock.now() - Utc::now();
        assert!(
            (TimeDelta::minutes(59)..TimeDelta::minutes(61)).contains(&shift),
            "{shift}"
        );
        std::fs::write(&file, "-120000").expect("write");
        let shift = clock.now() - Utc::now();
        assert!(
            (TimeDelta::minutes(-3)..TimeDelta::minutes(-1)).contains(&shift),
            "{shift}"
        );
    }

    #[test]
    fn missing_or_bad_file_means_no_offset() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("offset");
        let clock = SchedulerClock::with_offset_file(Some(file.clone()));
        let shift = clock.now() - Utc::now();
        assert!(shift.abs() < TimeDelta::seconds(5), "{shift}");
        std::fs::write(&file, "soon").expect("write");
        let shift = clock.now() - Utc::now();
        assert!(shift.abs() < TimeDelta::seconds(5), "{shift}");
        assert!(clock.warned.load(Ordering::Relaxed));
    }
}
