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

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub writes: u64,
    pub clients: Vec<usize>,
    pub failovers: usize,
    /// Parent of every member's data dir and log.
    pub root: PathBuf,
}

/// One load run and what was measured right after it.
#[derive(Debug, Clone)]
pub struct Run {
    pub load: LoadResult,
    /// The leader's RSS after the run (bytes), and every member's.
    pub leader_rss: Option<u64>,
    pub rss: Vec<Option<u64>>,
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

/// Benchmark one system; `start` brings up a 3-member cluster with its files under a dir.
pub async fn system<B: Backend>(
    report: &mut SystemReport,
    plan: &Plan,
    start: impl Fn(&Path) -> anyhow::Result<Cluster<B>>,
) {
    for (k, &clients) in plan.clients.iter().enumerate() {
        let last = k + 1 == plan.clients.len();
        let dir = plan.root.join(format!("{}-c{clients}", report.name));
        let mut cluster = None;
        let result = one_cluster(report, plan, clients, last, &dir, &start, &mut cluster).await;
        if let Some(c) = cluster.as_mut() {
            c.stop().await;
        }
        if let Err(e) = result {
            report.failure = Some(format!("{clients} clients: {e:#}"));
            eprintln!("[{}] stopped: {e:#}", report.name);
            return;
        }
    }
}

async fn one_cluster<B: Backend>(
    report: &mut SystemReport,
    plan: &Plan,
    clients: usize,
    last: bool,
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
    let client = Arc::new(LeaderClient::new(cluster.backend.clone(), ClientOptions::default()));
    client.refresh().await.context("no leader found")?;
    let load = crate::load::run(client, plan.writes, clients, "bench-").await;
    eprintln!(
        "[{name}] {} ok, {} failed in {:.2} s: {:.0} writes/s, p50 {} ms, p99 {} ms",
        load.succeeded(),
        load.failed,
        load.elapsed.as_secs_f64(),
        load.throughput(),
        load.latencies.quantile(0.5).map_or("-".into(), crate::machine::ms),
        load.latencies.quantile(0.99).map_or("-".into(), crate::machine::ms),
    );
    // Let followers finish applying, so memory is measured with every object in every store.
    let leader = cluster.wait_healthy(Duration::from_secs(60), 5).await?;
    let rss = cluster.rss();
    let mut notes = Vec::new();
    if !cluster.metrics.is_empty() {
        notes = crate::tb::metrics::observe(&cluster.metrics, leader, dir).await;
    }
    report.runs.push(Run {
        load,
        leader_rss: rss.get(leader).copied().flatten(),
        rss,
        notes,
    });
    if last && plan.failovers > 0 {
        eprintln!("[{name}] failover: killing the leader {} times", plan.failovers);
        report.failovers = crate::failover::run(cluster, plan.failovers, Duration::from_secs(120)).await?;
        for r in &report.failovers {
            match &r.outcome {
                Ok(d) => eprintln!("[{name}]   killed {}: write ok after {} ms", r.killed, crate::machine::ms(*d)),
                Err(e) => eprintln!("[{name}]   killed {}: no write succeeded: {e}", r.killed),
            }
        }
    }
    Ok(())
}
