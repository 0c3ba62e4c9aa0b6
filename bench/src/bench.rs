//! Runs the whole comparison for one system: for each client count a fresh 3-member cluster
//! (so every run stores exactly `writes` new objects), the load run, memory and (for tb) the
//! controllers' own metrics afterwards, and on the last cluster the failover rounds.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::backend::Backend;
use crate::client::{ClientOptions, LeaderClient};
use crate::cluster::Cluster;
use crate::failover::Round;
use crate::load::LoadResult;
use crate::member::Memory;

/// Quiet time after a run before memory is read: background work a write burst starts (tb
/// builds a Raft snapshot every 10,000 entries, etcd compacts) gets to finish.
pub const SETTLE: Duration = Duration::from_secs(5);

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub writes: u64,
    pub clients: Vec<usize>,
    pub failovers: usize,
    /// Parent of every member's data dir and log.
    pub root: PathBuf,
    /// Quiet time after a run before memory is read ([`SETTLE`] unless smoke-testing).
    pub settle: Duration,
}

/// One load run and what was measured right after it.
#[derive(Debug, Clone)]
pub struct Run {
    pub load: LoadResult,
    /// The leader's RSS once the cluster settled after the run (bytes), and every member's
    /// memory (settled and peak).
    pub leader_rss: Option<u64>,
    pub memory: Vec<Option<Memory>>,
    /// Every member's data dir on disk after the run (bytes).
    pub disk: Vec<Option<u64>>,
    /// `/proc/loadavg` just before the run.
    pub load_before: String,
    /// What the servers themselves reported (tb's `/metrics`).
    pub notes: Vec<String>,
}

/// Everything measured for one system.
#[derive(Debug, Clone)]
pub struct SystemReport {
    pub name: String,
    pub version: String,
    pub runs: Vec<Run>,
    pub failovers: Vec<Round>,
    /// Why the benchmark of this system stopped early, if it did.
    pub failure: Option<String>,
}

impl SystemReport {
    pub fn new(name: &str, version: String) -> Self {
        SystemReport {
            name: name.into(),
            version,
            runs: Vec::new(),
            failovers: Vec::new(),
            failure: None,
        }
    }

    pub fn run(&self, clients: usize) -> Option<&Run> {
        self.runs.iter().find(|r| r.load.clients == clients)
    }
}

/// One run of one system: a fresh 3-member cluster (`start` brings it up with its files under
/// a dir), `clients` writers, memory and metrics afterwards, and the failover rounds when
/// `with_failover`. The caller alternates systems per client count, so each pair of runs being
/// compared is taken minutes apart at most, under the same background load. Skipped once a
/// run of this system has failed.
pub async fn run<B: Backend>(
    report: &mut SystemReport,
    plan: &Plan,
    clients: usize,
    with_failover: bool,
    start: impl Fn(&Path) -> anyhow::Result<Cluster<B>>,
) {
    if report.failure.is_some() {
        return;
    }
    let dir = plan.root.join(format!("{}-c{clients}", report.name));
    let mut cluster = None;
    let result = one_cluster(
        report,
        plan,
        clients,
        with_failover,
        &dir,
        &start,
        &mut cluster,
    )
    .await;
    if let Some(c) = cluster.as_mut() {
        c.stop().await;
    }
    if let Err(e) = result {
        report.failure = Some(format!("{clients} clients: {e:#}"));
        eprintln!("[{}] stopped: {e:#}", report.name);
    }
}

async fn one_cluster<B: Backend>(
    report: &mut SystemReport,
    plan: &Plan,
    clients: usize,
    with_failover: bool,
    dir: &Path,
    start: &impl Fn(&Path) -> anyhow::Result<Cluster<B>>,
    slot: &mut Option<Cluster<B>>,
) -> anyhow::Result<()> {
    let name = report.name.clone();
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let cluster = slot.insert(start(dir)?);
    let leader = cluster.wait_healthy(Duration::from_secs(60), 5).await?;
    eprintln!(
        "[{name}] cluster up (leader {}); {} writes from {clients} clients",
        cluster.members[leader].name, plan.writes
    );
    let client = Arc::new(LeaderClient::new(
        cluster.backend.clone(),
        ClientOptions::default(),
    ));
    client.refresh().await.context("no leader found")?;
    let load_before = crate::machine::load_average();
    let load = crate::load::run(client, plan.writes, clients, "bench-").await;
    eprintln!(
        "[{name}] {} ok, {} failed in {:.2} s: {:.0} writes/s, p50 {} ms, p99 {} ms",
        load.succeeded(),
        load.failed,
        load.elapsed.as_secs_f64(),
        load.throughput(),
        load.latencies
            .quantile(0.5)
            .map_or("-".into(), crate::machine::ms),
        load.latencies
            .quantile(0.99)
            .map_or("-".into(), crate::machine::ms),
    );
    // Let followers finish applying and background work finish, so memory is measured with
    // every object in every store, at rest.
    cluster.wait_healthy(Duration::from_secs(60), 5).await?;
    tokio::time::sleep(plan.settle).await;
    let leader = cluster.wait_healthy(Duration::from_secs(60), 5).await?;
    let memory = cluster.memory();
    let mut notes = Vec::new();
    if !cluster.metrics.is_empty() {
        notes = crate::tb::metrics::observe(&cluster.metrics, leader, dir).await;
    }
    report.runs.push(Run {
        load,
        leader_rss: memory.get(leader).copied().flatten().map(|m| m.rss),
        memory,
        disk: cluster.disk(),
        load_before,
        notes,
    });
    if with_failover && plan.failovers > 0 {
        eprintln!(
            "[{name}] failover: killing the leader {} times",
            plan.failovers
        );
        let outcome = crate::failover::run(
            &mut report.failovers,
            cluster,
            plan.failovers,
            Duration::from_secs(120),
        )
        .await;
        for r in &report.failovers {
            match &r.outcome {
                Ok(d) => eprintln!(
                    "[{name}]   killed {}: write ok after {} ms",
                    r.killed,
                    crate::machine::ms(*d)
                ),
                Err(e) => eprintln!("[{name}]   killed {}: no write succeeded: {e}", r.killed),
            }
        }
        outcome?;
    }
    Ok(())
}
