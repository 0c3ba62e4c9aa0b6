//! The experiment, the same for both systems: bring the cluster up, let it settle, sample it
//! idle, run the job `runs` times one after the other, sample it idle again, then stop every
//! process and kill whatever they left behind.

use std::path::Path;
use std::time::Duration;

use super::slurm::{SlurmCluster, SlurmOptions, SlurmPrograms};
use super::tb::{TbCluster, TbOptions};
use super::{IdleWindow, JobShape, MAX_FAILURES, RunTimes, SystemResult};
use crate::procstat::Watched;

/// What to run on each system.
#[derive(Debug, Clone)]
pub struct Plan {
    pub runs: usize,
    pub shape: JobShape,
    pub idle: Duration,
    /// How long one run may wait for its ranks to run (and, again, to be gone).
    pub run_timeout: Duration,
    /// Quiet time between the end of one run and the next submit (0: back to back).
    pub pause: Duration,
    /// Quiet time after the cluster comes up and after the runs, before an idle window
    /// ([`super::SETTLE`] unless smoke-testing).
    pub settle: Duration,
}

async fn idle_window(
    label: String,
    procs: &[Watched],
    idle: Duration,
) -> anyhow::Result<IdleWindow> {
    eprintln!(
        "  idle window \"{label}\": sampling {} processes for {} s",
        procs.len(),
        idle.as_secs()
    );
    let load_before = crate::machine::load_average();
    let usage = crate::procstat::sample(procs, idle).await?;
    Ok(IdleWindow {
        label,
        seconds: idle.as_secs(),
        load_before,
        usage,
    })
}

/// What each system offers the shared loop.
trait System {
    fn watched(&self) -> anyhow::Result<Vec<Watched>>;
    fn check_alive(&mut self) -> anyhow::Result<()>;
    async fn run_job(
        &mut self,
        name: &str,
        shape: &JobShape,
        timeout: Duration,
    ) -> anyhow::Result<RunTimes>;
    /// Remove whatever a failed run left, so the next starts clean.
    async fn clean_up(&mut self, name: &str) -> anyhow::Result<()>;
}

impl System for TbCluster {
    fn watched(&self) -> anyhow::Result<Vec<Watched>> {
        TbCluster::watched(self)
    }
    fn check_alive(&mut self) -> anyhow::Result<()> {
        TbCluster::check_alive(self)
    }
    async fn run_job(
        &mut self,
        name: &str,
        shape: &JobShape,
        timeout: Duration,
    ) -> anyhow::Result<RunTimes> {
        TbCluster::run_job(self, name, shape, timeout).await
    }
    async fn clean_up(&mut self, name: &str) -> anyhow::Result<()> {
        self.delete(name).await?;
        self.wait_no_allocations(Duration::from_secs(60)).await
    }
}

impl System for SlurmCluster {
    fn watched(&self) -> anyhow::Result<Vec<Watched>> {
        SlurmCluster::watched(self)
    }
    fn check_alive(&mut self) -> anyhow::Result<()> {
        SlurmCluster::check_alive(self)
    }
    async fn run_job(
        &mut self,
        name: &str,
        shape: &JobShape,
        timeout: Duration,
    ) -> anyhow::Result<RunTimes> {
        SlurmCluster::run_job(self, name, shape, timeout).await
    }
    async fn clean_up(&mut self, _name: &str) -> anyhow::Result<()> {
        self.cancel_all(Duration::from_secs(60)).await
    }
}

/// Settle, idle window, the runs, idle window: the part that is the same for both systems.
async fn measure<S: System>(
    sys: &mut S,
    plan: &Plan,
    result: &mut SystemResult,
) -> anyhow::Result<()> {
    let who = result.name.clone();
    tokio::time::sleep(plan.settle).await;
    sys.check_alive()?;
    let procs = sys.watched()?;
    result
        .idle
        .push(idle_window("before jobs".into(), &procs, plan.idle).await?);
    eprintln!("[{who}] {} runs", plan.runs);
    let mut in_a_row = 0;
    for i in 0..plan.runs {
        if i > 0 {
            tokio::time::sleep(plan.pause).await;
        }
        sys.check_alive()?;
        let name = format!("bench-{i:03}");
        match sys.run_job(&name, &plan.shape, plan.run_timeout).await {
            Ok(t) => {
                in_a_row = 0;
                if i % 10 == 0 || i + 1 == plan.runs {
                    eprintln!(
                        "[{who}]   run {i}: running after {} ms, gone {} ms after removal",
                        crate::machine::ms(t.running),
                        crate::machine::ms(t.teardown)
                    );
                }
                result.runs.push(t);
            }
            Err(e) => {
                eprintln!("[{who}]   run {i} failed: {e:#}");
                result.errors.push(format!("{name}: {e:#}"));
                in_a_row += 1;
                sys.clean_up(&name).await?;
                anyhow::ensure!(
                    in_a_row < MAX_FAILURES,
                    "{MAX_FAILURES} runs in a row failed"
                );
            }
        }
    }
    tokio::time::sleep(plan.settle).await;
    sys.check_alive()?;
    let procs = sys.watched()?;
    let label = format!("after {} jobs", result.runs.len());
    result
        .idle
        .push(idle_window(label, &procs, plan.idle).await?);
    Ok(())
}

/// tb: one controller and `opts.nodelets` nodelets under `dir`.
pub async fn tb(opts: &TbOptions, plan: &Plan, dir: &Path) -> SystemResult {
    let mut result = SystemResult::new("tb", "tb-controller + tb-nodelet".into());
    eprintln!(
        "[tb] starting 1 controller and {} nodelets under {}",
        opts.nodelets,
        dir.display()
    );
    let outcome = async {
        std::fs::create_dir_all(dir)?;
        let mut cluster = TbCluster::start(opts, dir).await?;
        let r = async {
            cluster.ready().await?;
            eprintln!("[tb] {} nodes Ready", opts.nodelets);
            measure(&mut cluster, plan, &mut result).await?;
            result.notes.extend(cluster.metrics_notes().await);
            anyhow::Ok(())
        }
        .await;
        cluster.stop().await;
        r
    }
    .await;
    finish(&mut result, outcome, dir);
    result
}

/// Slurm: munged, slurmctld and one slurmd under `dir`.
pub async fn slurm(
    programs: &SlurmPrograms,
    opts: &SlurmOptions,
    plan: &Plan,
    dir: &Path,
) -> SystemResult {
    let mut result = SystemResult::new("slurm", programs.version());
    eprintln!(
        "[slurm] starting munged, slurmctld and slurmd under {}",
        dir.display()
    );
    let outcome = async {
        let mut cluster = SlurmCluster::start(programs, opts, dir, plan.shape.ranks)?;
        let r = async {
            cluster.ready(Duration::from_secs(60)).await?;
            eprintln!("[slurm] node idle");
            let m = measure(&mut cluster, plan, &mut result).await;
            // Every job ends before the daemons stop, so no slurmstepd outlives them.
            let c = cluster.cancel_all(Duration::from_secs(60)).await;
            m.and(c)
        }
        .await;
        result.notes.append(&mut cluster.notes);
        result.notes.extend(cluster.scheduler_note());
        if let Err(e) = &r {
            for m in &cluster.members {
                let tail = m.log_tail(5);
                if !tail.is_empty() {
                    result.notes.push(format!(
                        "{} log tail: `{}`",
                        m.name,
                        tail.replace('\n', " ⏎ ")
                    ));
                }
            }
            eprintln!("[slurm] {e:#}");
        }
        cluster.stop().await;
        r
    }
    .await;
    finish(&mut result, outcome, dir);
    result
}

/// Record how it ended and kill anything left running under `dir`.
fn finish(result: &mut SystemResult, outcome: anyhow::Result<()>, dir: &Path) {
    if let Err(e) = outcome {
        eprintln!("[{}] stopped: {e:#}", result.name);
        result.failure = Some(format!("{e:#}"));
    }
    let left = super::cleanup::kill_leftovers(dir);
    if !left.is_empty() {
        result
            .notes
            .push(format!("killed after the stop: {}", left.join("; ")));
    }
    result.load_after = crate::machine::load_average();
}
