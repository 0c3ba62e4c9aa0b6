//! `jobs-bench`: how fast tb starts a job's ranks on its nodelets, and what the nodelets cost
//! while idle, beside Slurm where it is installed. tb first (one controller, four nodelets),
//! then Slurm (munged, slurmctld, slurmd), never both at once; then a markdown table on stdout
//! (progress goes to stderr).
//!
//! tb runs with its defaults: the controller makes its cluster CA and admin token in its data
//! dir, the bench calls it over TLS with that token, the nodelets trust that CA and join with a
//! token from a 0600 file.
//!
//! `--smoke` runs the same code with 2 nodelets, 2-rank jobs, 3 runs and 2 s idle windows, and
//! exits non-zero when a system could not be run (Slurm missing counts: CI installs it; only
//! a bench that is not root, which cannot run Slurm's daemons, skips it, saying so) or a run
//! failed.
//!
//! Run from the workspace: `cargo run --release -p tb-bench --bin jobs-bench -- [--runs 50]
//! [--idle-seconds 60] [--systems tb,slurm] [--smoke]`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use tb_bench::binaries;
use tb_bench::jobs::report;
use tb_bench::jobs::run::Plan;
use tb_bench::jobs::slurm::{SlurmOptions, SlurmPrograms};
use tb_bench::jobs::tb::TbOptions;
use tb_bench::jobs::{JobShape, SystemResult};
use tb_bench::machine::{Machine, load_average};

#[derive(Parser, Debug)]
#[command(
    name = "jobs-bench",
    about = "tb's nodelets against Slurm: submit → all ranks running, and idle memory and CPU"
)]
struct Args {
    /// Jobs run one after the other on each system.
    #[arg(long, default_value_t = 50)]
    runs: usize,
    /// Ranks (Slurm: tasks) per job.
    #[arg(long, default_value_t = 4)]
    ranks: u32,
    /// Memory per rank, MiB.
    #[arg(long, default_value_t = 64)]
    memory_mib: u64,
    /// tb nodelets on this machine.
    #[arg(long, default_value_t = 4)]
    nodelets: usize,
    /// Length of each idle window, seconds.
    #[arg(long, default_value_t = 60)]
    idle_seconds: u64,
    /// Milliseconds between two `squeue` polls.
    #[arg(long, default_value_t = 10)]
    poll_ms: u64,
    /// How long one run may wait for its ranks to run, seconds.
    #[arg(long, default_value_t = 30)]
    run_timeout_seconds: u64,
    /// Milliseconds to wait after a run before the next submit (0: back to back). Slurm
    /// schedules a batch job at once only if its last scheduling pass is `batch_sched_delay`
    /// (3 s) old; a pause of 4000 shows its latency for a job submitted to a quiet cluster.
    #[arg(long, default_value_t = 0)]
    pause_ms: u64,
    /// Benchmark only these systems.
    #[arg(long, value_delimiter = ',', default_value = "tb,slurm", value_parser = ["tb", "slurm"])]
    systems: Vec<String>,
    /// The tb-controller binary. Default: build it and tb-nodelet (`cargo build --release -p
    /// tb-controller -p tb-nodelet`) and use target/release/.
    #[arg(long, requires = "tb_nodelet")]
    tb_controller: Option<PathBuf>,
    /// The tb-nodelet binary (with --tb-controller).
    #[arg(long, requires = "tb_controller")]
    tb_nodelet: Option<PathBuf>,
    /// First port of the nodelets' rank port ranges (100 ports each).
    #[arg(long, default_value_t = 42000)]
    port_range_base: u16,
    /// RUST_LOG for the controller and nodelets; their default otherwise.
    #[arg(long)]
    tb_log: Option<String>,
    /// `SchedulerParameters=` for slurm.conf (e.g. `batch_sched_delay=0`); Slurm's defaults
    /// otherwise. The header says when it is set.
    #[arg(long)]
    slurm_scheduler_parameters: Option<String>,
    /// Directory under which the temporary data dirs and logs are made.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the data dirs, logs and scraped metrics instead of deleting them.
    #[arg(long)]
    keep: bool,
    /// A check that every part runs, not a measurement: 3 runs of a 2-rank job on 2 nodelets,
    /// 2 s idle windows, 1 s settle (unless given on the command line); exits non-zero when a
    /// system cannot be run or a run fails.
    #[arg(long)]
    smoke: bool,
}

/// Smoke sizes, unless given on the command line.
fn smoke_sizes(args: &mut Args, matches: &clap::ArgMatches) {
    let given = |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    if !given("runs") {
        args.runs = 3;
    }
    if !given("ranks") {
        args.ranks = 2;
    }
    if !given("nodelets") {
        args.nodelets = 2;
    }
    if !given("idle_seconds") {
        args.idle_seconds = 2;
    }
    if !given("run_timeout_seconds") {
        args.run_timeout_seconds = 20;
    }
}

/// Why a smoke run failed: a system that stopped, did not run, or had a failed run.
fn smoke_failures(tb: Option<&SystemResult>, slurm: Result<&SystemResult, &str>) -> Vec<String> {
    let mut why = Vec::new();
    let mut check = |s: &SystemResult| {
        if let Some(f) = &s.failure {
            why.push(format!("{}: {f}", s.name));
        }
        if s.runs.is_empty() {
            why.push(format!("{}: no run completed", s.name));
        }
        for e in &s.errors {
            why.push(format!("{}: {e}", s.name));
        }
    };
    if let Some(t) = tb {
        check(t);
    }
    match slurm {
        Ok(s) => check(s),
        Err(w) if w.starts_with("not run (--systems)") => {}
        Err(w) if tb_bench::jobs::slurm::cannot_run().is_some() => {
            eprintln!("jobs-bench --smoke: Slurm skipped: {w}");
        }
        Err(w) => why.push(format!("slurm: {w}")),
    }
    why
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Args::command().get_matches();
    let mut args = Args::from_arg_matches(&matches)?;
    if args.smoke {
        smoke_sizes(&mut args, &matches);
    }
    anyhow::ensure!(args.runs > 0, "--runs must be at least 1");
    anyhow::ensure!(args.ranks > 0, "--ranks must be at least 1");
    anyhow::ensure!(args.nodelets > 0, "--nodelets must be at least 1");
    anyhow::ensure!(args.idle_seconds > 0, "--idle-seconds must be at least 1");
    let want_tb = args.systems.iter().any(|s| s == "tb");
    let want_slurm = args.systems.iter().any(|s| s == "slurm");

    let tb_bins = match (want_tb, &args.tb_controller, &args.tb_nodelet) {
        (false, _, _) => None,
        (true, Some(c), Some(n)) => Some((c.clone(), n.clone())),
        _ => {
            let dir = binaries::build_release(&["tb-controller", "tb-nodelet"])?;
            Some((
                binaries::built(&dir, "tb-controller")?,
                binaries::built(&dir, "tb-nodelet")?,
            ))
        }
    };
    let slurm_programs: Result<SlurmPrograms, String> = if want_slurm {
        SlurmPrograms::find().and_then(|p| match tb_bench::jobs::slurm::cannot_run() {
            Some(why) => Err(why),
            None => Ok(p),
        })
    } else {
        Err("not run (--systems)".into())
    };

    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    let tmp = tempfile::Builder::new()
        .prefix("tb-jobs-bench-")
        .tempdir_in(&base)
        .with_context(|| format!("making a temporary dir under {}", base.display()))?;
    {
        // munged wants every directory above its socket searchable by everyone.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("chmod 755 {}", tmp.path().display()))?;
    }
    eprintln!("data dirs and logs under {}", tmp.path().display());

    let shape = JobShape {
        ranks: args.ranks,
        memory_mib: args.memory_mib,
        command: vec!["sleep".into(), "30".into()],
    };
    let plan = Plan {
        runs: args.runs,
        shape: shape.clone(),
        idle: Duration::from_secs(args.idle_seconds),
        run_timeout: Duration::from_secs(args.run_timeout_seconds),
        pause: Duration::from_millis(args.pause_ms),
        settle: if args.smoke {
            Duration::from_secs(1)
        } else {
            tb_bench::jobs::SETTLE
        },
    };
    let machine = Machine::describe();
    let load_before = load_average();
    let date = chrono::Utc::now()
        .format("%Y-%m-%d %H:%M:%S UTC")
        .to_string();

    let tb_result: Option<SystemResult> = match &tb_bins {
        Some((controller, nodelet)) => {
            let opts = TbOptions {
                controller: controller.clone(),
                nodelet: nodelet.clone(),
                nodelets: args.nodelets,
                port_range_base: args.port_range_base,
                rust_log: args.tb_log.clone(),
            };
            Some(tb_bench::jobs::run::tb(&opts, &plan, &tmp.path().join("tb")).await)
        }
        None => None,
    };
    let slurm_opts = SlurmOptions {
        scheduler_parameters: args.slurm_scheduler_parameters.clone(),
        poll_every: Duration::from_millis(args.poll_ms),
    };
    let slurm_result: Result<SystemResult, String> = match &slurm_programs {
        Ok(programs) => {
            Ok(
                tb_bench::jobs::run::slurm(programs, &slurm_opts, &plan, &tmp.path().join("slurm"))
                    .await,
            )
        }
        Err(why) => Err(why.clone()),
    };
    let leftovers = tb_bench::jobs::cleanup::kill_leftovers(tmp.path());

    let mut bins = Vec::new();
    if let Some((c, n)) = &tb_bins {
        bins.push(binaries::describe("tb-controller", c));
        bins.push(binaries::describe("tb-nodelet", n));
    }
    if let Ok(p) = &slurm_programs {
        bins.push(binaries::describe("slurmctld", &p.slurmctld));
        bins.push(binaries::describe("slurmd", &p.slurmd));
    }
    let command = shape.command.join(" ");
    let workload = vec![
        format!(
            "job: {} ranks of `{command}`, {} MiB each; {} runs one after the other, each job removed and \
             gone before the next is submitted{}",
            args.ranks,
            args.memory_mib,
            args.runs,
            if args.pause_ms > 0 {
                format!(
                    ", after a pause of {} ms (**not back to back**)",
                    args.pause_ms
                )
            } else {
                " (back to back)".into()
            }
        ),
        format!(
            "tb: 1 controller (`--id 1`, a cluster of one, defaults otherwise: TLS with the CA it makes, \
             every call with the admin token it writes) and {} nodelets on loopback (joined with a token \
             file, trusting that CA{}); \
             submit = `Objects.Apply` of a TrainingJob; running = `Objects.Watch` (kind Allocation, label \
             `tb/job=<name>`, from the apply's resourceVersion) shows every rank's `status.phase: Running`; \
             removal = `Objects.Delete` of the job, gone = every Allocation DELETED",
            args.nodelets,
            if tb_bench::jobs::slurm::cannot_run().is_none() {
                "; as root, each runs jobs under uids of its own `--job-uid-range`"
            } else {
                ""
            }
        ),
        format!(
            "Slurm: munged, slurmctld and slurmd (one node, `localhost`) as root in the foreground, \
             proctrack/linuxproc, task/none, select/cons_tres; submit = `sbatch --ntasks={} \
             --mem-per-cpu={}M --wrap`; running = `squeue -h -j ID -o %T` says RUNNING (polled every {} ms \
             plus squeue's own run time); removal = `scancel`, gone = no longer listed; SchedulerParameters: {}",
            args.ranks,
            args.memory_mib,
            args.poll_ms,
            args.slurm_scheduler_parameters
                .as_deref()
                .map_or("Slurm's defaults".to_string(), |p| format!(
                    "`{p}` (**not the defaults**)"
                ))
        ),
        format!(
            "idle: every process's VmRSS (/proc/PID/status) once a second and utime+stime (/proc/PID/stat, \
             {} ticks/s) over {} s with no job, once before the runs and once after; CPU is in percent \
             of one core",
            tb_bench::procstat::clock_ticks_per_second().map_or("?".into(), |t| t.to_string()),
            args.idle_seconds
        ),
    ];
    let ctx = report::Context {
        date,
        machine,
        load_before,
        load_after: load_average(),
        workload,
        binaries: bins,
        runs: args.runs,
        ranks: args.ranks,
        idle_seconds: args.idle_seconds,
        poll_ms: args.poll_ms,
        leftovers,
    };
    let mut table = report::render(
        &ctx,
        tb_result.as_ref(),
        slurm_result.as_ref().map_err(String::as_str),
    );
    if args.smoke {
        table = table.replacen(
            "\n- date:",
            "\n- **smoke run: sizes too small to measure anything**\n- date:",
            1,
        );
    }
    println!("{table}");

    let failures = if args.smoke {
        smoke_failures(
            tb_result.as_ref(),
            slurm_result.as_ref().map_err(String::as_str),
        )
    } else {
        Vec::new()
    };
    if args.keep || !failures.is_empty() {
        let kept = tmp.keep();
        eprintln!("kept data dirs, logs and metrics in {}", kept.display());
    }
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("jobs-bench --smoke: FAILED: {f}");
        }
        std::process::exit(1);
    }
    Ok(())
}
