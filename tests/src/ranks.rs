//! Which ranks of a job run right now, read from the process table: every rank tb starts
//! carries `TB_JOB`, `TB_RANK` and `TB_EPOCH` in its environment. A sampler thread reads it every
//! few milliseconds and keeps every sample in which one rank ran under two epochs (a stale rank
//! beside its replacement) or as two processes of one epoch — what fencing must prevent. Linux
//! only (`/proc`); the reader must be allowed to read the ranks' environments (root in the tests).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the rank sampler reads the process table.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(25);

/// When a rank of one epoch was seen running, by the sampler.
#[derive(Debug, Clone, Copy)]
pub struct Seen {
    pub first: Instant,
    pub last: Instant,
}

/// A sample in which one rank ran under several epochs: when, the rank, (epoch, pid) each.
pub type Overlap = (Instant, u32, Vec<(u64, i32)>);

#[derive(Debug, Default)]
pub struct RankLog {
    /// (rank, epoch) → when seen.
    pub seen: BTreeMap<(u32, u64), Seen>,
    /// Samples in which two epochs of one rank ran: (when, rank, epochs with their pids).
    pub overlaps: Vec<Overlap>,
    /// Samples in which one rank of one epoch ran as two processes: (when, rank, epoch, pids).
    pub duplicates: Vec<(Instant, u32, u64, Vec<i32>)>,
    pub samples: u64,
}

/// Reads every process's environment every [`SAMPLE_EVERY`] (the test runs as root and shares
/// the process namespace with the labs' Macs): each process whose `TB_JOB` names `job` is a
/// rank (`TB_RANK`) of an epoch (`TB_EPOCH`). Notes when each was seen, and every sample where
/// one rank ran under two epochs.
pub struct RankSampler {
    log: Arc<Mutex<RankLog>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RankSampler {
    pub fn start(job: &str) -> RankSampler {
        let log = Arc::new(Mutex::new(RankLog::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s, job) = (log.clone(), stop.clone(), job.to_string());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let now = Instant::now();
                let ranks = ranks_of(&job);
                let mut by_rank: BTreeMap<u32, BTreeMap<u64, i32>> = BTreeMap::new();
                let mut pids: BTreeMap<(u32, u64), Vec<i32>> = BTreeMap::new();
                for &(pid, rank, epoch) in &ranks {
                    by_rank.entry(rank).or_default().insert(epoch, pid);
                    // A rank's children inherit its environment: count only the process at
                    // the top of each rank's tree.
                    let child = parent_of(pid).is_some_and(|ppid| {
                        ranks
                            .iter()
                            .any(|&(p, r, e)| p == ppid && r == rank && e == epoch)
                    });
                    if !child {
                        pids.entry((rank, epoch)).or_default().push(pid);
                    }
                }
                let mut log = l.lock().unwrap_or_else(|e| e.into_inner());
                log.samples += 1;
                for ((rank, epoch), pids) in pids {
                    if pids.len() > 1 {
                        log.duplicates.push((now, rank, epoch, pids));
                    }
                }
                for (rank, epochs) in by_rank {
                    for &epoch in epochs.keys() {
                        log.seen
                            .entry((rank, epoch))
                            .and_modify(|s| s.last = now)
                            .or_insert(Seen {
                                first: now,
                                last: now,
                            });
                    }
                    if epochs.len() > 1 {
                        log.overlaps.push((now, rank, epochs.into_iter().collect()));
                    }
                }
                drop(log);
                std::thread::sleep(SAMPLE_EVERY);
            }
        });
        RankSampler {
            log,
            stop,
            thread: Some(thread),
        }
    }

    /// When (rank, epoch) was seen, if ever.
    pub fn seen(&self, rank: u32, epoch: u64) -> Option<Seen> {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .seen
            .get(&(rank, epoch))
            .copied()
    }

    /// Stops sampling; returns the log.
    pub fn finish(mut self) -> RankLog {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.log.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for RankSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// `(pid, rank, epoch)` of every live process whose `TB_JOB` ends with `/job` or is `job`.
pub fn ranks_of(job: &str) -> Vec<(i32, u32, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // Zombies have no environment left; a process gone meanwhile cannot be read.
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let mut vars: BTreeMap<&[u8], &[u8]> = BTreeMap::new();
        for kv in env.split(|b| *b == 0) {
            if let Some(eq) = kv.iter().position(|b| *b == b'=') {
                vars.insert(&kv[..eq], &kv[eq + 1..]);
            }
        }
        let text = |k: &str| {
            vars.get(k.as_bytes())
                .and_then(|v| std::str::from_utf8(v).ok())
        };
        let Some(j) = text("TB_JOB") else { continue };
        if j != job && !j.ends_with(&format!("/{job}")) {
            continue;
        }
        if let (Some(rank), Some(epoch)) = (
            text("TB_RANK").and_then(|r| r.parse().ok()),
            text("TB_EPOCH").and_then(|e| e.parse().ok()),
        ) {
            out.push((pid, rank, epoch));
        }
    }
    out
}

/// The parent of `pid`, from `/proc/PID/stat` (the field after the command name in parentheses).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}
