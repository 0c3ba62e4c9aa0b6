//! `controller-bench`: tb's controller against etcd on this machine. For each client count
//! (16, then 64) it starts a fresh 3-member tb cluster (the controller's defaults: TLS from
//! the cluster CA, every call with the admin's token), then a fresh 3-member etcd cluster with
//! TLS on its client and peer links, then one in plain TCP (never two at once), writes the same
//! ~1 KiB objects to each, and on the last ones kills each one's leader a few times; then it
//! prints a markdown table to stdout (progress goes to stderr).
//!
//! `--smoke` runs the same code with a few hundred writes, 4 clients and one leader kill, in
//! seconds, and exits non-zero when any system could not be run or any write failed.
//!
//! Run from the workspace: `cargo run --release -p tb-bench --bin controller-bench --
//! [--writes 10000] [--clients 16,64] [--smoke]`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;
use tb_bench::bench::{Plan, SystemReport};
use tb_bench::etcd::Transport;
use tb_bench::machine::{Machine, load_average};
use tb_bench::report;
use tb_bench::tb::TbOptions;

#[derive(Parser, Debug)]
#[command(
    name = "controller-bench",
    about = "tb's controller against etcd: throughput, latency, failover, memory"
)]
struct Args {
    /// Writes per run (each creates one object).
    #[arg(long, default_value_t = 10_000)]
    writes: u64,
    /// Concurrent clients, one run (on a fresh cluster) per value.
    #[arg(long, value_delimiter = ',', default_value = "16,64")]
    clients: Vec<usize>,
    /// Leader kills on the last cluster of each system.
    #[arg(long, default_value_t = 3)]
    failovers: usize,
    /// Size of each object's JSON in bytes.
    #[arg(long, default_value_t = 1024)]
    payload_bytes: usize,
    /// The tb-controller binary. Default: build it (`cargo build --release -p tb-controller`)
    /// and use target/release/tb-controller.
    #[arg(long)]
    tb_controller: Option<PathBuf>,
    /// The etcd binary. Default: `etcd` on the PATH.
    #[arg(long)]
    etcd: Option<PathBuf>,
    /// Benchmark only these systems.
    #[arg(long, value_delimiter = ',', default_value = "tb,etcd", value_parser = ["tb", "etcd"])]
    systems: Vec<String>,
    /// etcd's links: with TLS (`tls`, compared with tb like for like), plain TCP (`plain`), or
    /// both, each a cluster of its own.
    #[arg(long, value_delimiter = ',', default_value = "tls,plain", value_parser = ["tls", "plain"])]
    etcd_transports: Vec<String>,
    /// A check that every part runs, not a measurement: 300 writes, 4 clients, one leader
    /// kill, a 1 s settle (unless --writes/--clients/--failovers say otherwise); exits
    /// non-zero when a system cannot be run or a write fails.
    #[arg(long)]
    smoke: bool,
    /// Directory under which the temporary data dirs and logs are made (one disk for all).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the data dirs, logs and scraped metrics instead of deleting them.
    #[arg(long)]
    keep: bool,
    /// RUST_LOG for the tb controllers (e.g. `debug`); their default otherwise.
    #[arg(long)]
    tb_log: Option<String>,
    /// An extra tb-controller flag for every member (repeatable), e.g.
    /// `--tb-arg=--heartbeat-ms --tb-arg=50`. The table is then not tb's defaults: say so.
    #[arg(long, allow_hyphen_values = true)]
    tb_arg: Vec<String>,
}

/// Build tb-controller in release mode and return its path.
fn build_tb_controller() -> anyhow::Result<PathBuf> {
    let dir = tb_bench::binaries::build_release(&["tb-controller"])?;
    tb_bench::binaries::built(&dir, "tb-controller")
}

/// Smoke sizes, unless given on the command line.
fn smoke_sizes(args: &mut Args, matches: &clap::ArgMatches) {
    let given = |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    if !given("writes") {
        args.writes = 300;
    }
    if !given("clients") {
        args.clients = vec![4];
    }
    if !given("failovers") {
        args.failovers = 1;
    }
}

/// Why a smoke run failed: a system that stopped early or did not run, or a failed write.
fn smoke_failures(
    tb: Option<&SystemReport>,
    peers: &[&SystemReport],
    etcd_missing: &str,
    want_etcd: bool,
) -> Vec<String> {
    let mut why = Vec::new();
    if want_etcd && peers.is_empty() {
        why.push(format!("etcd: {etcd_missing}"));
    }
    for s in tb.into_iter().chain(peers.iter().copied()) {
        if let Some(f) = &s.failure {
            why.push(format!("{}: {f}", s.name));
        }
        if s.runs.is_empty() {
            why.push(format!("{}: no run completed", s.name));
        }
        for r in &s.runs {
            if r.load.failed > 0 {
                why.push(format!(
                    "{}: {} of {} writes failed",
                    s.name, r.load.failed, r.load.writes
                ));
            }
        }
        if let Some(r) = s.failovers.iter().find(|r| r.outcome.is_err()) {
            why.push(format!("{}: no write after killing {}", s.name, r.killed));
        }
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
    anyhow::ensure!(args.writes > 0, "--writes must be at least 1");
    anyhow::ensure!(
        !args.clients.is_empty() && args.clients.iter().all(|&c| c > 0),
        "--clients: give one or more positive counts"
    );
    let want_tb = args.systems.iter().any(|s| s == "tb");
    let want_etcd = args.systems.iter().any(|s| s == "etcd");

    let tb_binary = match (&args.tb_controller, want_tb) {
        (_, false) => None,
        (Some(p), true) => Some(p.clone()),
        (None, true) => Some(build_tb_controller()?),
    };
    let etcd_binary = args.etcd.clone().or_else(tb_bench::etcd::find_binary);
    let etcd_missing = match (&etcd_binary, want_etcd) {
        (_, false) => "not run (--systems)".to_string(),
        (None, true) => {
            "not found (install Debian's etcd-server package, or pass --etcd PATH)".to_string()
        }
        (Some(p), true) if !p.is_file() => format!("{} not found", p.display()),
        _ => String::new(),
    };
    let etcd_binary = etcd_binary.filter(|p| want_etcd && p.is_file());

    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    let tmp = tempfile::Builder::new()
        .prefix("tb-controller-bench-")
        .tempdir_in(&base)
        .with_context(|| format!("making a temporary dir under {}", base.display()))?;
    let plan = Plan {
        writes: args.writes,
        clients: args.clients.clone(),
        failovers: args.failovers,
        root: tmp.path().to_path_buf(),
        settle: if args.smoke {
            std::time::Duration::from_secs(1)
        } else {
            tb_bench::bench::SETTLE
        },
    };
    eprintln!("data dirs and logs under {}", plan.root.display());

    let machine = Machine::describe();
    let load_before = load_average();
    let date = chrono::Utc::now()
        .format("%Y-%m-%d %H:%M:%S UTC")
        .to_string();

    // Alternate the systems per client count (never both at once), so the two runs compared
    // in each row of the table are taken close together.
    let tb_opts = tb_binary.as_ref().map(|bin| TbOptions {
        binary: bin.clone(),
        rust_log: args.tb_log.clone(),
        payload_bytes: args.payload_bytes,
        extra_args: args.tb_arg.clone(),
    });
    let mut tb_report = tb_opts
        .as_ref()
        .map(|_| SystemReport::new("tb", "tb-controller".into()));
    // TLS first: the column the targets are judged against.
    let transports: Vec<Transport> = [("tls", Transport::Tls), ("plain", Transport::Plain)]
        .into_iter()
        .filter(|(name, _)| args.etcd_transports.iter().any(|t| t == name))
        .map(|(_, t)| t)
        .collect();
    let mut etcd_reports: Vec<(Transport, SystemReport)> = match &etcd_binary {
        Some(bin) => transports
            .iter()
            .map(|&t| {
                (
                    t,
                    SystemReport::new(t.system_name(), tb_bench::etcd::version(bin)),
                )
            })
            .collect(),
        None => Vec::new(),
    };
    for (k, &clients) in plan.clients.iter().enumerate() {
        let last = k + 1 == plan.clients.len();
        if let (Some(opts), Some(r)) = (&tb_opts, tb_report.as_mut()) {
            tb_bench::bench::run(r, &plan, clients, last, |dir| {
                tb_bench::tb::start(opts, dir)
            })
            .await;
        }
        if let Some(bin) = &etcd_binary {
            for (transport, r) in &mut etcd_reports {
                let t = *transport;
                let start = |dir: &Path| tb_bench::etcd::start(bin, dir, args.payload_bytes, t);
                tb_bench::bench::run(r, &plan, clients, last, start).await;
            }
        }
    }
    let peers: Vec<&SystemReport> = etcd_reports.iter().map(|(_, r)| r).collect();

    let mut binaries = Vec::new();
    if let Some(b) = &tb_binary {
        binaries.push(tb_bench::binaries::describe("tb-controller", b));
        if !args.tb_arg.is_empty() {
            binaries.push(format!(
                "tb-controller extra flags (not its defaults): `{}`",
                args.tb_arg.join(" ")
            ));
        }
    }
    if let Some(b) = &etcd_binary {
        binaries.push(tb_bench::binaries::describe("etcd", b));
    }
    let ctx = report::Context {
        date,
        machine,
        load_before,
        load_after: load_average(),
        workload: format!(
            "{} writes of {}-byte objects per run, each creating a distinct object; a fresh 3-member cluster \
             per client count; one HTTP/2 connection per member; writes go to the leader; loopback; data dirs \
             on one disk under {}; fsync on (etcd default, tb redb Durability::Immediate); tb with its \
             defaults: TLS on client and controller links (cluster CA), every call authenticated with the \
             admin's bearer token; etcd-tls: TLS on client and peer links, every client and peer \
             presenting a certificate of the CA (etcd's `--trusted-ca-file`), etcd's own auth off; etcd-plain: plain TCP; defaults otherwise{}",
            args.writes,
            args.payload_bytes,
            base.display(),
            if args.smoke {
                " — **smoke run: sizes too small to measure anything**"
            } else {
                ""
            }
        ),
        binaries,
    };
    let shape = report::Shape {
        clients: &plan.clients,
        writes: plan.writes,
        failovers: plan.failovers,
    };
    println!(
        "{}",
        report::render(&ctx, &shape, tb_report.as_ref(), &peers, &etcd_missing)
    );

    let failures = if args.smoke {
        smoke_failures(tb_report.as_ref(), &peers, &etcd_missing, want_etcd)
    } else {
        Vec::new()
    };
    if args.keep || !failures.is_empty() {
        let kept = tmp.keep();
        eprintln!("kept data dirs, logs and metrics in {}", kept.display());
    }
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("controller-bench --smoke: FAILED: {f}");
        }
        std::process::exit(1);
    }
    Ok(())
}
