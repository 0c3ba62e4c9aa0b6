//! `scheduler-bench --raft`: the scheduler measured through the real controller. A 3-member
//! `tb-controller` cluster (the release binary, TLS and auth on, as a user runs it) schedules
//! 5,000 queued one-rank TrainingJobs from 10 weighted queues onto 64 simulated Macs, in real
//! time: every plan the leader's reconcile loop makes is committed through Raft (redb, fsync)
//! and every status a Mac reports is a gRPC call.
//!
//! The Macs are simulated in this process, over gRPC with tb-api's clients, the way
//! `tb-nodelet` talks to the controllers: each joins with a join token (`Nodes.Join`, Node
//! object with 32 GiB allocatable and a port range) and then calls with its node credential;
//! it heartbeats its Node status every 2 s (the interval the controllers ask for), watches its
//! Allocations (`Objects.Watch`, label `tb/node=NAME`), reports each new one Running, and
//! Succeeded once the job's run time (2–10 s, deterministic per job) has passed since the
//! allocation was seen. No process is started. Each simulated Mac keeps one TLS connection
//! to one controller (Mac i to controller i mod 3; writes to a follower are forwarded to the
//! leader).
//!
//! Sequence: start the cluster and wait until it is healthy; apply the 10 Queues and the
//! 5,000 jobs (batches of `Objects.Apply`); join the 64 Macs with `Ready=False` (a nodelet
//! that has not read its capacity yet) and open their watches; then start the clock (`t0`) and
//! send every Mac's first `Ready=True` heartbeat at once. From there on everything is real time
//! on this machine's clock:
//!
//! - **initial fill**: the first 512 admissions (every slot) ÷ the time from `t0` to the 512th
//!   allocation seen by its Mac's watch;
//! - **whole drain**: all admissions ÷ the time from `t0` to the last one (bounded by the jobs'
//!   run times, so it is compared with the ideal: total run time ÷ slots);
//! - **capacity freed → next admission**: per Mac, from the Succeeded status write being
//!   acknowledged to the next allocation for that Mac seen by its watch (admission `j` on a
//!   Mac of 8 slots is paired with free `j − 8`: the slot it needed);
//! - **fairness error**: over the contended window (`t0` until the first queue has no backlog),
//!   each queue's share of the held memory·time against its weight's share, worst relative
//!   error — the virtual bench's measure (`crate::scheduler::Results::fairness_error`);
//! - the leader's CPU time (`/proc/PID/stat`) and memory, and server-side latencies from its
//!   `/metrics`.
//!
//! Every wait is bounded; the whole run stops after `time_limit` and reports what it has.
//!
//! Layout: `cluster` makes the credentials, starts the three TLS controllers and holds the
//! admin's channels to them; `workload` is the queues and jobs and their submission; `macs` are
//! the simulated nodelets (join, heartbeat, watch, status writes); `drive` is the run's
//! sequence and the recorder of what the Macs see; `measure` turns the record and the CPU
//! samples into `RaftResults`; `notes` reads the store, `/metrics` and the logs at the end;
//! `report` is the markdown table.

mod cluster;
mod drive;
mod macs;
mod measure;
mod notes;
mod report;
mod workload;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::member::Memory;
use crate::stats::Latencies;

pub use cluster::TlsTb;
pub use measure::Passes;
pub use report::report;

const GI: u64 = 1 << 30;
/// How long one RPC may take (a write may wait for an election).
const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts of one write on retryable errors.
const ATTEMPTS: u32 = 20;
/// How long the cluster may take to become healthy.
const STARTUP: Duration = Duration::from_secs(60);
/// Heartbeat interval of the simulated nodelets (the controllers ask for node grace ÷ 5 = 2 s).
const HEARTBEAT: Duration = Duration::from_secs(2);
/// The run is stopped when nothing is admitted and nothing ends for this long.
const STALL: Duration = Duration::from_secs(45);
/// Times a Mac's watch is reopened after it ends.
const WATCH_RECONNECTS: u32 = 50;

/// What to run.
#[derive(Debug, Clone)]
pub struct RaftSetup {
    /// The `tb-controller` binary.
    pub controller: PathBuf,
    /// Parent of the run's temporary dir (data dirs, logs, credentials).
    pub dir: PathBuf,
    /// Keep the temporary dir.
    pub keep: bool,
    /// `RUST_LOG` for the controllers (their default when `None`).
    pub rust_log: Option<String>,
    pub macs: usize,
    pub mac_memory_gi: u64,
    pub jobs: usize,
    pub job_memory_gi: u64,
    pub weights: Vec<u32>,
    /// Job run time: uniform in [min, max] milliseconds (deterministic per job).
    pub run_ms: (u64, u64),
    /// Jobs per `Objects.Apply`.
    pub apply_batch: usize,
    /// The whole run (after the cluster is up) stops after this long, with partial results.
    pub time_limit: Duration,
    /// Every simulated Mac talks to the leader (true), or Mac i to controller i mod 3.
    pub macs_on_leader: bool,
}

impl RaftSetup {
    pub fn new(controller: PathBuf, dir: PathBuf) -> Self {
        RaftSetup {
            controller,
            dir,
            keep: false,
            rust_log: None,
            macs: 64,
            mac_memory_gi: 32,
            jobs: 5000,
            job_memory_gi: 4,
            weights: vec![1, 1, 2, 2, 3, 3, 4, 4, 5, 5],
            run_ms: (2000, 10_000),
            apply_batch: 250,
            time_limit: Duration::from_secs(600),
            macs_on_leader: false,
        }
    }

    fn slots_per_mac(&self) -> usize {
        (self.mac_memory_gi / self.job_memory_gi.max(1)) as usize
    }

    fn slots(&self) -> usize {
        self.macs * self.slots_per_mac()
    }
}

/// CPU use of one process over a window, in percent of one core.
#[derive(Debug, Clone, Default)]
pub struct Cpu {
    pub fill: Option<f64>,
    pub run: Option<f64>,
    /// The busiest whole second of the run.
    pub peak_second: Option<f64>,
}

/// What came out.
#[derive(Debug, Clone)]
pub struct RaftResults {
    pub setup: RaftSetup,
    pub controller: String,
    pub date: String,
    /// Why the run stopped early, if it did.
    pub aborted: Option<String>,
    pub submitted: usize,
    pub submit_time: Duration,
    pub join_time: Duration,
    /// `t0` → the last of the Macs' first Ready heartbeats acknowledged.
    pub ready_time: Duration,
    /// Admission times since `t0`, sorted.
    pub admissions: Vec<Duration>,
    pub fill: usize,
    pub fill_time: Option<Duration>,
    pub completed: usize,
    /// `t0` → the last Succeeded acknowledged.
    pub finish: Option<Duration>,
    /// Total run time ÷ slots: the shortest possible drain.
    pub ideal_finish: Duration,
    pub free_to_admit: Latencies,
    /// Pairs where the allocation was seen before the freeing write's answer (counted as 0).
    pub early_admissions: usize,
    pub stopped: usize,
    /// (queue, weight, memory byte·seconds in the contended window).
    pub shares: Vec<(String, u32, f64)>,
    pub contended: Duration,
    /// Held memory·time ÷ (capacity × contended window).
    pub utilization: f64,
    pub leader: String,
    pub leader_cpu: Cpu,
    pub followers_cpu: Vec<(String, Cpu)>,
    pub bench_cpu: Cpu,
    pub leader_memory: Option<Memory>,
    pub notes: Vec<String>,
    pub wall: Duration,
    /// `/proc/loadavg` before the cluster started and after the run.
    pub load: (String, String),
    pub passes: Passes,
}

impl RaftResults {
    pub fn fill_per_second(&self) -> Option<f64> {
        self.fill_time
            .map(|t| self.fill as f64 / t.as_secs_f64().max(1e-9))
    }

    pub fn drain_per_second(&self) -> Option<f64> {
        let last = self.admissions.last()?;
        Some(self.admissions.len() as f64 / last.as_secs_f64().max(1e-9))
    }

    /// Admissions/s a perfect scheduler would sustain once the backlog is the only limit:
    /// slots ÷ mean run time.
    pub fn ideal_drain_per_second(&self) -> f64 {
        let (lo, hi) = self.setup.run_ms;
        self.setup.slots() as f64 / ((lo + hi) as f64 / 2000.0)
    }

    /// Worst |got − wanted| / wanted over queues (the virtual bench's measure).
    pub fn fairness_error(&self) -> f64 {
        crate::scheduler::fairness_error(&self.shares)
    }
}

/// Run the benchmark: start the cluster, submit, join, drain, measure, stop.
pub async fn run(setup: RaftSetup) -> anyhow::Result<RaftResults> {
    let tmp = tempfile::Builder::new()
        .prefix("tb-scheduler-raft-")
        .tempdir_in(&setup.dir)
        .with_context(|| format!("making a temporary dir under {}", setup.dir.display()))?;
    let dir = tmp.path().to_path_buf();
    eprintln!("scheduler-bench --raft: working in {}", dir.display());
    let load_before = crate::machine::load_average();
    let creds = cluster::Credentials::create(&setup.controller, &dir).await?;
    let (mut cluster, addrs) = cluster::start_cluster(&setup, &dir, &creds)?;
    let mut outcome = drive::drive(&setup, &mut cluster, &addrs, &creds).await;
    cluster.stop().await;
    if let Ok(r) = &mut outcome {
        r.load = (load_before, crate::machine::load_average());
    }
    if setup.keep {
        let kept = tmp.keep();
        eprintln!("kept {}", kept.display());
    }
    outcome
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::workload::{queue_of, run_time};

    #[test]
    fn run_times_are_deterministic_and_in_range() {
        for n in 0..1000 {
            let t = run_time(n, (2000, 10_000));
            assert!(t >= Duration::from_secs(2) && t <= Duration::from_secs(10));
            assert_eq!(t, run_time(n, (2000, 10_000)));
        }
        assert_eq!(queue_of("q3-17"), "q3");
    }
}
