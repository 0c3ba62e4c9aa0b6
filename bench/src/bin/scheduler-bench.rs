//! `scheduler-bench`: scheduler throughput and fairness — 64 simulated Macs, 5,000 queued jobs
//! from 10 weighted queues, the real `reconcile` and state machine in virtual time (see
//! `tb_bench::scheduler`). Prints a markdown table; targets are reported, never asserted.
//!
//! Run from the workspace: `cargo run --release -p tb-bench --bin scheduler-bench`.

use clap::Parser;
use tb_bench::scheduler::{Setup, report, run};

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
    /// Fair-share half-life in minutes.
    #[arg(long, default_value_t = 60)]
    half_life_minutes: i64,
}

fn main() {
    let args = Args::parse();
    let setup = Setup {
        macs: args.macs,
        jobs: args.jobs,
        half_life: chrono::TimeDelta::minutes(args.half_life_minutes),
        ..Setup::default()
    };
    let results = run(setup);
    print!("{}", report(&results));
}
