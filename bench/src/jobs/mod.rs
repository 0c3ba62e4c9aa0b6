//! `jobs-bench`: how fast a job's ranks start on tb's nodelets, and what the nodelets cost
//! while idle, beside Slurm doing the same on this machine.
//!
//! Layout: `tb` runs one controller and N nodelets and times apply → all ranks Running;
//! `slurm` runs munged, slurmctld and slurmd and times sbatch → RUNNING; `run` is the
//! experiment both go through (settle, idle window, the runs, idle window) and hands back a
//! [`SystemResult`]. [`crate::procstat`] samples idle memory and CPU, `cleanup` makes sure no
//! process the bench started outlives it, and `report` prints the table.

pub mod cleanup;
pub mod report;
pub mod run;
pub mod slurm;
pub mod tb;

use std::time::Duration;

use crate::procstat::Usage;
use crate::stats::Latencies;

/// The job both systems run: `ranks` processes of `command`, each reserving `memory_mib`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobShape {
    pub ranks: u32,
    pub memory_mib: u64,
    pub command: Vec<String>,
}

/// One run: submit a job, wait until all its ranks run, remove it, wait until it is gone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunTimes {
    /// The submit call alone (tb: the Apply RPC; Slurm: the `sbatch` process).
    pub submit: Duration,
    /// When the scheduler's placement was first seen (tb: the first Allocation event).
    pub placed: Option<Duration>,
    /// When every rank was seen running: the measured figure.
    pub running: Duration,
    /// When the last rank's process actually started, by the process's own clock (tb: the
    /// latest `status.startedAt`, 1 ms resolution; Slurm: the batch script's first command).
    pub started: Option<Duration>,
    /// From the delete (tb) or `scancel` (Slurm) until the system reports the job gone.
    pub teardown: Duration,
    /// Slurm only: how many `squeue` calls the wait for RUNNING made, and how long it took.
    pub polls: Option<(u32, Duration)>,
}

/// One idle window: every watched process's memory and CPU over the same wall-clock time.
#[derive(Debug, Clone)]
pub struct IdleWindow {
    /// `before jobs` or `after N jobs`.
    pub label: String,
    pub seconds: u64,
    pub load_before: String,
    pub usage: Vec<Usage>,
}

impl IdleWindow {
    /// The processes of one role (`agent`, `controller`, ...).
    pub fn role<'a>(&'a self, role: &'a str) -> impl Iterator<Item = &'a Usage> + 'a {
        self.usage.iter().filter(move |u| u.role == role)
    }
}

/// Everything measured on one system.
#[derive(Debug, Clone, Default)]
pub struct SystemResult {
    pub name: String,
    pub version: String,
    pub runs: Vec<RunTimes>,
    /// Runs that failed, with why.
    pub errors: Vec<String>,
    pub idle: Vec<IdleWindow>,
    /// What the system itself reported (tb's `/metrics`), and how it was set up.
    pub notes: Vec<String>,
    /// Why the benchmark of this system stopped early (or could not start).
    pub failure: Option<String>,
    pub load_before: String,
    pub load_after: String,
}

impl SystemResult {
    pub fn new(name: &str, version: String) -> Self {
        SystemResult {
            name: name.into(),
            version,
            load_before: crate::machine::load_average(),
            ..Default::default()
        }
    }

    /// One figure of every run that has it.
    pub fn series(&self, pick: impl Fn(&RunTimes) -> Option<Duration>) -> Latencies {
        Latencies::new(self.runs.iter().filter_map(pick).collect())
    }

    /// The idle window whose label starts with `prefix`.
    pub fn window(&self, prefix: &str) -> Option<&IdleWindow> {
        self.idle.iter().find(|w| w.label.starts_with(prefix))
    }
}

/// Runs that fail in a row before the benchmark of a system gives up.
pub const MAX_FAILURES: usize = 3;

/// Sleep a little after a cluster comes up, so that joining and first heartbeats are over
/// before the first idle window.
pub const SETTLE: Duration = Duration::from_secs(5);
