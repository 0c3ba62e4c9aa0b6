//! `scheduler-bench`: scheduler throughput and fairness — 64 simulated Macs, 5,000 queued jobs
//! from 10 weighted queues. By default the real `reconcile` and state machine run in virtual
//! time (see `tb_bench::scheduler`); with `--raft` a real 3-member `tb-controller` cluster
//! (Raft, TLS, auth) schedules them in real time onto Macs simulated in-process over gRPC (see
//! `tb_bench::scheduler_raft`). Prints a markdown table; targets are reported, never asserted.
//!
//! `--smoke` runs the same code with 4 Macs and 60 jobs (with `--raft`: jobs of 0.2–1 s, at most
//! 90 s) and exits non-zero unless every job was admitted (and, with `--raft`, completed).
//!
//! Run from the workspace: `cargo run --release -p tb-bench --bin scheduler-bench [-- --raft]
//! [--smoke]`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use tb_bench::scheduler::{Setup, report, run};
use tb_bench::scheduler_raft::{self, RaftSetup};

#[derive(Parser, Debug)]
#[command(
    name = "scheduler-bench",
    about = "scheduler throughput and fair share"
)]
struct Args {
    #[arg(long, default_value_t = 64)]
    macs: usize,
    #[arg(long, default_value_t = 5000)]
    jobs: usize,
    /// Fair-share half-life in minutes (virtual mode; the controllers use their default).
    #[arg(long, default_value_t = 60)]
    half_life_minutes: i64,
    /// Through a real 3-member tb-controller cluster (Raft, TLS) in real time, with the Macs
    /// simulated in-process over gRPC.
    #[arg(long)]
    raft: bool,
    /// --raft: the tb-controller binary to run as it is (default: `cargo build --release -p
    /// tb-controller` first, then target/release/tb-controller).
    #[arg(long)]
    tb_controller: Option<PathBuf>,
    /// --raft: shortest job run time, in real seconds.
    #[arg(long, default_value_t = 2.0)]
    run_min_seconds: f64,
    /// --raft: longest job run time, in real seconds.
    #[arg(long, default_value_t = 10.0)]
    run_max_seconds: f64,
    /// --raft: jobs per Objects.Apply when submitting.
    #[arg(long, default_value_t = 250)]
    apply_batch: usize,
    /// --raft: stop after this many seconds and report what was measured.
    #[arg(long, default_value_t = 600)]
    time_limit_seconds: u64,
    /// --raft: where the temporary dir (data dirs, logs) goes (default: $TMPDIR or /tmp).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// --raft: keep the temporary dir.
    #[arg(long)]
    keep: bool,
    /// --raft: RUST_LOG for the controllers.
    #[arg(long)]
    tb_log: Option<String>,
    /// --raft: every simulated Mac talks to the leader, instead of Mac i to controller
    /// (i mod 3) + 1.
    #[arg(long)]
    macs_on_leader: bool,
    /// A check that every part runs, not a measurement: 4 Macs, 60 jobs, with --raft jobs of
    /// 0.2–1 s and a 90 s limit (unless given on the command line); exits non-zero unless
    /// every job was admitted (--raft: and completed).
    #[arg(long)]
    smoke: bool,
}

/// Smoke sizes, unless given on the command line.
fn smoke_sizes(args: &mut Args, matches: &clap::ArgMatches) {
    let given = |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    if !given("macs") {
        args.macs = 4;
    }
    if !given("jobs") {
        args.jobs = 60;
    }
    if !given("run_min_seconds") {
        args.run_min_seconds = 0.2;
    }
    if !given("run_max_seconds") {
        args.run_max_seconds = 1.0;
    }
    if !given("apply_batch") {
        args.apply_batch = 20;
    }
    if !given("time_limit_seconds") {
        args.time_limit_seconds = 90;
    }
}

/// Fail a smoke run whose `what` is short of `want`.
fn smoke_check(smoke: bool, what: &str, got: usize, want: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        !smoke || got >= want,
        "scheduler-bench --smoke: FAILED: {got} of {want} jobs {what}"
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Args::command().get_matches();
    let mut args = Args::from_arg_matches(&matches)?;
    if args.smoke {
        smoke_sizes(&mut args, &matches);
    }
    if args.raft {
        return run_raft(args);
    }
    let setup = Setup {
        macs: args.macs,
        jobs: args.jobs,
        half_life: chrono::TimeDelta::minutes(args.half_life_minutes),
        ..Setup::default()
    };
    let results = run(setup);
    print!("{}", report(&results));
    smoke_check(args.smoke, "admitted", results.admitted, args.jobs)
}

fn run_raft(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.run_min_seconds > 0.0 && args.run_max_seconds >= args.run_min_seconds,
        "--run-min-seconds must be positive and at most --run-max-seconds"
    );
    let controller = match args.tb_controller {
        Some(p) => p,
        None => {
            let dir = tb_bench::binaries::build_release(&["tb-controller"])?;
            tb_bench::binaries::built(&dir, "tb-controller")?
        }
    };
    let mut setup = RaftSetup::new(controller, args.dir.unwrap_or_else(std::env::temp_dir));
    setup.macs = args.macs;
    setup.jobs = args.jobs;
    setup.run_ms = (
        (args.run_min_seconds * 1000.0) as u64,
        (args.run_max_seconds * 1000.0) as u64,
    );
    setup.apply_batch = args.apply_batch.max(1);
    setup.time_limit = Duration::from_secs(args.time_limit_seconds);
    setup.keep = args.keep;
    setup.rust_log = args.tb_log;
    setup.macs_on_leader = args.macs_on_leader;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let results = runtime.block_on(scheduler_raft::run(setup))?;
    print!("{}", scheduler_raft::report(&results));
    if args.smoke
        && let Some(why) = &results.aborted
    {
        anyhow::bail!("scheduler-bench --smoke: FAILED: the run stopped early: {why}");
    }
    smoke_check(args.smoke, "completed", results.completed, args.jobs)
}
