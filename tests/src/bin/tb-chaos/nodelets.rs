//! Nodelet kills during gang starts, with an epoch check.
//!
//! One controller and three nodelets. Each round applies a fresh two-rank exec TrainingJob
//! (`exclusive`, so its ranks are on two of the three Macs), waits a random 0–1.5 s into its
//! start, and SIGKILLs the nodelet of one of its ranks, either as a **lost Mac** (the nodelet and
//! its ranks die; it comes back 0.5–5 s later, after or before the node grace) or as a **nodelet
//! crash** (only the nodelet dies; its ranks run on; it restarts within half the grace, before
//! the controllers could call the Mac lost). The round ends when every rank of the job runs
//! again; the job is then deleted.
//!
//! A sampler reads the process table every 25 ms: every rank tb starts carries `TB_JOB`,
//! `TB_RANK` and `TB_EPOCH`. A sample in which one rank runs under two epochs (a stale rank
//! beside its replacement) or as two processes of one epoch (a restarted nodelet starting a rank
//! that still runs) fails the run.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tb_tests::lab::{self, Lab, LabOptions};
use tb_tests::ranks::{RankLog, RankSampler};

/// How long one round may take before the run is aborted.
const ROUND_BOUND: Duration = Duration::from_secs(120);

/// What the nodelet part saw.
#[derive(Default)]
pub struct NodeletReport {
    pub mac_losses: usize,
    pub crashes: usize,
    pub elapsed: Duration,
    /// Rounds whose job was placed again under a newer epoch.
    pub replaced: usize,
    pub samples: u64,
    /// (round, rank, epochs with pids) of samples where one rank ran under two epochs.
    pub overlaps: Vec<String>,
    /// (round, rank, epoch, pids) of samples where one rank of one epoch ran twice.
    pub duplicates: Vec<String>,
    /// From the kill to every rank of the job running again.
    pub recoveries: Vec<Duration>,
    pub aborted: Option<String>,
}

impl NodeletReport {
    pub fn failures(&self) -> Vec<String> {
        let mut f = Vec::new();
        if !self.overlaps.is_empty() {
            f.push(format!(
                "{} sample(s) with two epochs of one rank running: {:?}",
                self.overlaps.len(),
                &self.overlaps[..self.overlaps.len().min(5)]
            ));
        }
        if !self.duplicates.is_empty() {
            f.push(format!(
                "{} sample(s) with one rank of one epoch running twice: {:?}",
                self.duplicates.len(),
                &self.duplicates[..self.duplicates.len().min(5)]
            ));
        }
        f.extend(self.aborted.clone());
        f
    }

    pub fn rows(&self) -> Vec<(String, String)> {
        let mut sorted = self.recoveries.clone();
        sorted.sort();
        let pct = |p: f64| {
            sorted
                .get(((sorted.len() as f64 - 1.0) * p).round() as usize)
                .map(|d| format!("{:.2} s", d.as_secs_f64()))
                .unwrap_or_else(|| "-".into())
        };
        vec![
            (
                "nodelet kills during gang starts".into(),
                format!(
                    "{} ({} lost Macs, {} nodelet crashes) in {:.0} s",
                    self.mac_losses + self.crashes,
                    self.mac_losses,
                    self.crashes,
                    self.elapsed.as_secs_f64()
                ),
            ),
            (
                "gangs placed again under a new epoch".into(),
                self.replaced.to_string(),
            ),
            (
                "samples with a stale rank beside its replacement".into(),
                format!("{} of {}", self.overlaps.len(), self.samples),
            ),
            (
                "samples with one rank running twice".into(),
                format!("{} of {}", self.duplicates.len(), self.samples),
            ),
            (
                "gang running again after the kill (p50 / p99 / max)".into(),
                format!("{} / {} / {}", pct(0.5), pct(0.99), pct(1.0)),
            ),
        ]
    }
}

fn job_yaml(name: &str) -> String {
    format!(
        "apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: {name}
spec:
  command: [sleep, \"3600\"]
  ranks: 2
  memory: 64Mi
  exclusive: true
  backoffLimit: 50
"
    )
}

/// Every rank of `job` Running under one epoch (at least `min_epoch`): that epoch and the
/// ranks' nodes, in rank order.
fn running_gang(allocs: &[Value], min_epoch: u64) -> Option<(u64, Vec<String>)> {
    let mut by_epoch: std::collections::BTreeMap<u64, Vec<(u64, String)>> = Default::default();
    for a in allocs {
        let epoch = a["spec"]["epoch"].as_u64().unwrap_or(0);
        if epoch >= min_epoch && a["status"]["phase"] == "Running" {
            by_epoch.entry(epoch).or_default().push((
                a["spec"]["rank"].as_u64().unwrap_or(0),
                a["spec"]["node"].as_str().unwrap_or("").to_string(),
            ));
        }
    }
    by_epoch.into_iter().rev().find_map(|(epoch, mut ranks)| {
        ranks.sort();
        ranks.dedup_by_key(|r| r.0);
        (ranks.len() == 2).then(|| (epoch, ranks.into_iter().map(|r| r.1).collect()))
    })
}

fn record(report: &mut NodeletReport, round: usize, log: RankLog) {
    report.samples += log.samples;
    for (_, rank, epochs) in log.overlaps {
        report
            .overlaps
            .push(format!("round {round} rank {rank}: {epochs:?}"));
    }
    for (_, rank, epoch, pids) in log.duplicates {
        report.duplicates.push(format!(
            "round {round} rank {rank} epoch {epoch}: pids {pids:?}"
        ));
    }
}

pub async fn nodelet_chaos(kills: usize, minutes: f64, seed: u64) -> NodeletReport {
    let mut report = NodeletReport::default();
    let mut rng = StdRng::seed_from_u64(seed ^ 0x6e6f_6465);
    let mut lab = Lab::start_with("chaos-nodelets", LabOptions::new(3)).await;
    let grace = lab::NODE_GRACE;
    for i in 0..lab.nodelets().len() {
        let name = lab.nodelet(i).name.clone();
        lab.wait_node_ready(&name, true, Duration::from_secs(30))
            .await;
    }
    let started = Instant::now();
    let budget = Duration::from_secs_f64(minutes * 60.0);
    for round in 0..kills {
        if started.elapsed() > budget {
            break;
        }
        let job = format!("gang-{round}");
        let sampler = RankSampler::start(&job);
        lab.apply_yaml(&job_yaml(&job)).await;
        // Into the gang's start: its allocations exist, its ranks are being started.
        let deadline = Instant::now() + ROUND_BOUND;
        let nodes = loop {
            let allocs = lab.allocations(&job).await;
            let nodes: Vec<String> = allocs
                .iter()
                .filter_map(|a| a["spec"]["node"].as_str().map(str::to_string))
                .collect();
            if nodes.len() == 2 {
                break nodes;
            }
            if Instant::now() > deadline {
                report.aborted = Some(format!("round {round}: {job} was never placed"));
                record(&mut report, round, sampler.finish());
                report.elapsed = started.elapsed();
                return report;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..1500))).await;
        let victim = lab.index_of(&nodes[rng.random_range(0..nodes.len())]);
        let killed_at = Instant::now();
        if rng.random_bool(0.5) {
            report.mac_losses += 1;
            lab.kill_nodelet(victim);
            lab::kill_leftover_ranks(&lab.nodelet(victim).data_dir);
            tokio::time::sleep(Duration::from_millis(rng.random_range(500..5000))).await;
        } else {
            report.crashes += 1;
            lab.kill_nodelet(victim);
            let half = grace.as_millis() as u64 / 2;
            tokio::time::sleep(Duration::from_millis(rng.random_range(100..half))).await;
        }
        lab.restart_nodelet(victim);
        // The round ends with the whole gang running again.
        let deadline = Instant::now() + ROUND_BOUND;
        let epoch = loop {
            // Running in the store (which may still say so of a rank that died with its
            // Mac) and both ranks of that epoch alive in the process table.
            if let Some((epoch, _)) = running_gang(&lab.allocations(&job).await, 1) {
                let alive = tb_tests::ranks::ranks_of(&job);
                if (0..2).all(|r| alive.iter().any(|&(_, rank, e)| rank == r && e == epoch)) {
                    break epoch;
                }
            }
            if Instant::now() > deadline {
                report.aborted = Some(format!(
                    "round {round}: {job} was not running again {ROUND_BOUND:?} after the kill"
                ));
                record(&mut report, round, sampler.finish());
                report.elapsed = started.elapsed();
                return report;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        report.recoveries.push(killed_at.elapsed());
        if epoch > 1 {
            report.replaced += 1;
        }
        // A little of the running gang, so a stale rank started late is still seen.
        tokio::time::sleep(Duration::from_millis(500)).await;
        lab.tbctl_ok(&["delete", "trainingjob", &job]).await;
        let deadline = Instant::now() + ROUND_BOUND;
        while !tb_tests::ranks::ranks_of(&job).is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        record(&mut report, round, sampler.finish());
        println!(
            "round {round}: gang running again {:.2} s after the kill (epoch {epoch})",
            report.recoveries.last().map_or(0.0, Duration::as_secs_f64)
        );
    }
    report.elapsed = started.elapsed();
    report
}
