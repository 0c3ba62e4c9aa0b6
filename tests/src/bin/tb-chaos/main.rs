//! tb-chaos: a long, bounded, Jepsen-style run against the real binaries on loopback.
//!
//! **Controllers.** A three-controller cluster; client tasks write unique values to register
//! objects and read them back (one attempt each, on a random member) while the loop injects a
//! fault after another into a random member — SIGKILL then a restart on the same data dir, or
//! SIGSTOP then SIGCONT (a hung member: it holds its connections and answers nothing). Each
//! fault starts a new round with fresh registers, so every register's history is short. At the
//! end the whole history is checked for linearizability (`tb_tests::linearizability`, the
//! checker the e2e test uses), and a separate writer's acknowledged objects are listed back:
//! an acknowledged write that is missing is a lost write.
//!
//! **Nodelets** (`nodelets.rs`): kills of a nodelet during a gang's start, as a lost Mac or a
//! crashed agent, with a process-table sampler that fails the run if a stale rank ever runs
//! beside its replacement.
//!
//! Prints a table: faults injected, operations, lost acknowledged writes (must be 0),
//! linearizability, the longest time without a successful write, write recovery after a
//! fault. Exits non-zero when a check fails. Not a CI test (it runs for as long as it is
//! told); `--smoke` (a few faults) is what `scripts/bench-smoke.sh` runs.
//!
//!   tb-chaos --faults 1000 --minutes 60 --nodelet-kills 100
//!   tb-chaos --faults 0 --nodelet-kills 100      # the nodelet part alone
//!   tb-chaos --smoke

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod nodelets;

use clap::Parser;
use rand::{Rng, SeedableRng};
use tb_tests::linearizability::{Counts, History, INITIAL, Outcome, check, register_op};
use tb_tests::objects::{self, model, unique_namespace};
use tb_tests::{Client, Cluster, ClusterOptions};

#[derive(Parser, Debug)]
#[command(about = "Inject faults into tb's controllers and nodelets and check what clients saw")]
struct Args {
    /// Controller faults to inject.
    #[arg(long, default_value_t = 1000)]
    faults: usize,
    /// Stop injecting after this many minutes, whatever the count.
    #[arg(long, default_value_t = 60.0)]
    minutes: f64,
    /// Nodelet kills during gang starts (after the controller part).
    #[arg(long, default_value_t = 100)]
    nodelet_kills: usize,
    /// Stop the nodelet part after this many minutes, whatever the count.
    #[arg(long, default_value_t = 30.0)]
    nodelet_minutes: f64,
    /// Concurrent register clients.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Seed of the fault and operation choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// A few faults of each kind: checks that the run works, measures nothing.
    #[arg(long)]
    smoke: bool,
    /// Directory holding tb-controller, tb-nodelet and tbctl (default: this binary's own).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

/// Registers per round.
const KEYS: usize = 3;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args.faults = args.faults.min(6);
        args.minutes = args.minutes.min(5.0);
        args.nodelet_kills = args.nodelet_kills.min(2);
        args.nodelet_minutes = args.nodelet_minutes.min(3.0);
    }
    let bin_dir = match &args.bin_dir {
        Some(d) => d.clone(),
        None => std::env::current_exe()?
            .parent()
            .map(PathBuf::from)
            .ok_or_else(|| anyhow::anyhow!("this binary has no directory"))?,
    };
    // The harness finds the binaries here instead of building them.
    // SAFETY: set before any other thread of ours reads the environment.
    unsafe { std::env::set_var("TB_TEST_BIN_DIR", &bin_dir) };

    let (mut failed, mut rows) = (Vec::new(), Vec::new());
    if args.faults > 0 {
        let report = controller_chaos(&args).await;
        failed.extend(report.failures());
        rows.extend(report.rows());
    }
    if args.nodelet_kills > 0 {
        let report =
            nodelets::nodelet_chaos(args.nodelet_kills, args.nodelet_minutes, args.seed).await;
        failed.extend(report.failures());
        rows.extend(report.rows());
    }
    println!("\n| measure | value |\n|---|---|");
    for (k, v) in rows {
        println!("| {k} | {v} |");
    }
    if failed.is_empty() {
        Ok(())
    } else {
        for f in &failed {
            eprintln!("FAILED: {f}");
        }
        anyhow::bail!("{} check(s) failed", failed.len())
    }
}

/// What the controller part saw.
#[derive(Default)]
struct ControllerReport {
    kills: usize,
    stops: usize,
    leader_faults: usize,
    elapsed: Duration,
    counts: Counts,
    acked: usize,
    lost: Vec<String>,
    /// Why the history is not linearizable (None: it is).
    not_linearizable: Option<String>,
    longest_unavailable: Duration,
    slowest_recovery: Duration,
    recoveries: Vec<Duration>,
    wrong_errors: Vec<String>,
    aborted: Option<String>,
}

impl ControllerReport {
    fn failures(&self) -> Vec<String> {
        let mut f = Vec::new();
        if !self.lost.is_empty() {
            f.push(format!(
                "{} acknowledged write(s) lost: {:?}",
                self.lost.len(),
                self.lost
            ));
        }
        f.extend(self.not_linearizable.clone());
        f.extend(self.wrong_errors.iter().take(5).cloned());
        f.extend(self.aborted.clone());
        f
    }

    fn rows(&self) -> Vec<(String, String)> {
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
                "controller faults injected".into(),
                format!(
                    "{} ({} SIGKILL+restart, {} SIGSTOP+SIGCONT; {} hit the leader) in {:.0} s",
                    self.kills + self.stops,
                    self.kills,
                    self.stops,
                    self.leader_faults,
                    self.elapsed.as_secs_f64()
                ),
            ),
            (
                "register operations".into(),
                format!(
                    "{} returned, {} of unknown outcome, {} failed without effect",
                    self.counts.returned, self.counts.unknown, self.counts.dropped
                ),
            ),
            (
                "acknowledged writes lost".into(),
                format!("{} of {}", self.lost.len(), self.acked),
            ),
            (
                "linearizable".into(),
                match &self.not_linearizable {
                    None => "yes".into(),
                    Some(_) => "NO".into(),
                },
            ),
            (
                "errors not about availability".into(),
                self.wrong_errors.len().to_string(),
            ),
            (
                "longest time without a successful write".into(),
                format!("{:.2} s", self.longest_unavailable.as_secs_f64()),
            ),
            (
                "write recovery after a fault (p50 / p99 / max)".into(),
                format!(
                    "{} / {} / {:.2} s",
                    pct(0.5),
                    pct(0.99),
                    self.slowest_recovery.as_secs_f64()
                ),
            ),
        ]
    }
}

/// Shared between the fault loop and the client tasks.
struct Run {
    client: Arc<Client>,
    ns: String,
    history: History,
    /// Registers of this round are `r<round>-<k>`.
    round: AtomicUsize,
    stop: AtomicBool,
    /// When each successful write returned (any client).
    write_times: Mutex<Vec<Instant>>,
    /// Names of acknowledged objects of the ack writer.
    acked: Mutex<Vec<String>>,
    wrong_errors: Mutex<Vec<String>>,
}

impl Run {
    fn wrote(&self) {
        self.write_times
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Instant::now());
    }

    fn wrong(&self, e: String) {
        eprintln!("error not about availability: {e}");
        self.wrong_errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(e);
    }
}

async fn register_client(run: Arc<Run>, c: usize, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 1000 + c as u64);
    let members = run.client.addrs().to_vec();
    let mut incarnation = 0;
    let mut i = 0usize;
    while !run.stop.load(Ordering::SeqCst) {
        i += 1;
        let round = run.round.load(Ordering::SeqCst);
        let k = rng.random_range(0..KEYS);
        let key = round * KEYS + k;
        let name = format!("r{round}-{k}");
        let addr = &members[rng.random_range(0..members.len())];
        let write = rng.random_bool(0.5).then(|| format!("c{c}-{i}"));
        let is_write = write.is_some();
        match register_op(
            &run.client,
            addr,
            &run.ns,
            &name,
            key,
            (c, incarnation),
            write,
            &run.history,
        )
        .await
        {
            Ok(Outcome::Done) if is_write => run.wrote(),
            Ok(Outcome::Done) | Ok(Outcome::Dropped(_)) => {}
            Ok(Outcome::Unknown(_)) => incarnation += 1,
            Err(e) => {
                run.wrong(e);
                // The outcome of a write that failed so is unknown too.
                incarnation += 1;
            }
        }
    }
}

/// Writes new objects (one attempt each, random member) and remembers the acknowledged ones.
async fn ack_writer(run: Arc<Run>, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 7777);
    let members = run.client.addrs().to_vec();
    let mut n = 0usize;
    while !run.stop.load(Ordering::SeqCst) {
        n += 1;
        let name = format!("ack-{n}");
        let addr = &members[rng.random_range(0..members.len())];
        let req = tb_api::proto::ApplyRequest {
            objects_json: vec![model(&run.ns, &name, "acked").to_string()],
            dry_run: false,
            request_id: objects::request_id(),
        };
        match run.client.apply_on(addr, req).await {
            Ok(_) => {
                run.wrote();
                run.acked
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(name);
            }
            Err(e) if tb_tests::is_retryable(&e) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => run.wrong(format!("ack write {name} on {addr}: {e:?}")),
        }
    }
}

/// A write through any member, retried until `timeout`: the cluster serves writes again.
async fn wait_writable(run: &Run, timeout: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    let obj = model(&run.ns, "probe", "probe");
    run.client
        .apply(&[obj], &objects::request_id(), 0, timeout)
        .await
        .map(|_| start.elapsed())
        .map_err(|e| {
            format!(
                "no write succeeded within {timeout:?}: {}: {}",
                e.code(),
                e.message()
            )
        })
}

async fn controller_chaos(args: &Args) -> ControllerReport {
    let mut report = ControllerReport::default();
    let bound = Duration::from_secs_f64(args.minutes * 60.0);
    let mut cluster = Cluster::start("chaos", ClusterOptions::new(3)).await;
    let run = Arc::new(Run {
        client: cluster.client(),
        ns: unique_namespace("chaos"),
        history: History::default(),
        round: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        write_times: Mutex::default(),
        acked: Mutex::default(),
        wrong_errors: Mutex::default(),
    });
    if let Err(e) = wait_writable(&run, Duration::from_secs(30)).await {
        report.aborted = Some(format!("the cluster never served a write: {e}"));
        return report;
    }
    let mut tasks: Vec<_> = (0..args.clients)
        .map(|c| tokio::spawn(register_client(run.clone(), c, args.seed)))
        .collect();
    tasks.push(tokio::spawn(ack_writer(run.clone(), args.seed)));

    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let started = Instant::now();
    for f in 0..args.faults {
        if started.elapsed() > bound {
            eprintln!("time bound reached after {f} faults");
            break;
        }
        // Let the clients work a little between faults.
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..800))).await;
        let leader = match tokio::time::timeout(
            Duration::from_secs(30),
            cluster.wait_for_leader(Duration::from_secs(25)),
        )
        .await
        {
            Ok(l) => l,
            Err(_) => {
                report.aborted = Some(format!("no leader after fault {f}"));
                break;
            }
        };
        let target = if rng.random_bool(0.5) {
            leader
        } else {
            rng.random_range(0..cluster.len())
        };
        if target == leader {
            report.leader_faults += 1;
        }
        let injected = Instant::now();
        if rng.random_bool(0.6) {
            report.kills += 1;
            cluster.kill(target);
            tokio::time::sleep(Duration::from_millis(rng.random_range(100..1500))).await;
            run.round.fetch_add(1, Ordering::SeqCst);
            cluster.restart(target).await;
        } else {
            report.stops += 1;
            let pid = cluster.member(target).pid().unwrap_or(0) as libc::pid_t;
            tb_tests::step!("SIGSTOP controller {}", target + 1);
            // SAFETY: signalling our own unreaped child.
            unsafe { libc::kill(pid, libc::SIGSTOP) };
            tokio::time::sleep(Duration::from_millis(rng.random_range(300..2500))).await;
            run.round.fetch_add(1, Ordering::SeqCst);
            tb_tests::step!("SIGCONT controller {}", target + 1);
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
        match wait_writable(&run, Duration::from_secs(30)).await {
            Ok(_) => {
                let recovery = injected.elapsed();
                report.recoveries.push(recovery);
                report.slowest_recovery = report.slowest_recovery.max(recovery);
            }
            Err(e) => {
                report.aborted = Some(format!("after fault {f}: {e}"));
                break;
            }
        }
        if (f + 1) % 50 == 0 {
            eprintln!(
                "{} faults in {:.0} s; {} acknowledged objects",
                f + 1,
                started.elapsed().as_secs_f64(),
                run.acked.lock().map(|a| a.len()).unwrap_or(0)
            );
        }
    }
    report.elapsed = started.elapsed();
    run.stop.store(true, Ordering::SeqCst);
    for t in tasks {
        let _ = t.await;
    }

    // Every acknowledged object must be there.
    let acked: Vec<String> = run.acked.lock().unwrap_or_else(|p| p.into_inner()).clone();
    report.acked = acked.len();
    match run
        .client
        .list_values("Model", &run.ns, Duration::from_secs(30))
        .await
    {
        Ok(list) => {
            let present: BTreeSet<String> = list
                .iter()
                .filter_map(|v| v["metadata"]["name"].as_str().map(str::to_string))
                .collect();
            report.lost = acked.into_iter().filter(|n| !present.contains(n)).collect();
        }
        Err(e) => report.aborted = Some(format!("listing the acknowledged objects: {e}")),
    }
    let mut times = run
        .write_times
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    times.sort();
    report.longest_unavailable = times
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    report.wrong_errors = run
        .wrong_errors
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let events = run.history.events();
    report.counts = Counts::of(&events);
    eprintln!(
        "checking {} events for linearizability",
        report.counts.returned + report.counts.unknown
    );
    report.not_linearizable = tokio::task::spawn_blocking(move || check(&events, INITIAL))
        .await
        .unwrap_or_else(|e| Err(format!("checker task: {e}")))
        .err();
    report
}
