//! `placement-bench`: tb's placement beside exo's algorithm and a brute-force optimum on a
//! constant suite of Mac clusters, all priced by the engine's `evaluate`; then `plan`'s solve
//! time at 4, 8, 16 and 64 Macs. Prints a table (markdown with `--markdown`), summary lines and
//! the solve-time table; `--json FILE` writes everything as JSON. Targets are reported (MISSED),
//! never asserted: the exit code is 0 whenever the bench ran.
//!
//! `--smoke` runs the same code on the suite's cases of at most 4 Macs and times `plan` once at
//! 4 and 8 Macs, in seconds; it exits non-zero if a case's comparison or a timing is missing.
//!
//! Run from the workspace: `cargo run --release -p tb-bench --bin placement-bench -- --markdown
//! [--smoke]`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use tb_bench::placement::{compare, report, suite, timing};

#[derive(Parser, Debug)]
#[command(
    name = "placement-bench",
    about = "tb's placement vs exo's and the brute-force optimum, and plan's solve time"
)]
struct Args {
    /// Print markdown tables.
    #[arg(long)]
    markdown: bool,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Runs of `plan` per cluster size for the solve time (the median is reported).
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Cluster sizes for the solve time.
    #[arg(long, value_delimiter = ',', default_value = "4,8,16,64")]
    sizes: Vec<usize>,
    /// Only the cases whose name contains this.
    #[arg(long)]
    case: Option<String>,
    /// Also list every placement (Mac:layers in rank order) under the table.
    #[arg(long)]
    placements: bool,
    /// A check that every part runs, not a measurement: only the cases of at most 4 Macs, and
    /// one `plan` per size at 4 and 8 Macs (unless --runs/--sizes are given); exits non-zero
    /// when a case or a size yields nothing.
    #[arg(long)]
    smoke: bool,
}

/// The most Macs a smoke run's cases have.
const SMOKE_MAX_MACS: usize = 4;

fn main() -> anyhow::Result<()> {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Args::command().get_matches();
    let mut args = Args::from_arg_matches(&matches)?;
    let given = |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    if args.smoke {
        if !given("runs") {
            args.runs = 1;
        }
        if !given("sizes") {
            args.sizes = vec![4, 8];
        }
    }
    let cases: Vec<_> = suite::cases()
        .into_iter()
        .filter(|c| {
            args.case
                .as_ref()
                .is_none_or(|f| c.name.contains(f.as_str()))
        })
        .filter(|c| !args.smoke || c.macs() <= SMOKE_MAX_MACS)
        .collect();
    let mut results = Vec::with_capacity(cases.len());
    for case in &cases {
        let n = case.macs();
        let plural = if n == 1 { "" } else { "s" };
        eprintln!("placement-bench: {} ({n} Mac{plural})", case.name);
        let r = compare::run(case);
        eprintln!(
            "  tb plan {:.2} ms, enumeration {:.0} ms",
            r.tb_ms, r.opt_ms
        );
        results.push(r);
    }
    eprintln!("placement-bench: solve time at {:?} Macs", args.sizes);
    let times = timing::measure(&args.sizes, args.runs);
    let summary = report::summarize(&results);

    let md = args.markdown;
    let heading = |s: &str| {
        if md {
            format!("### {s}\n")
        } else {
            format!("{s}\n")
        }
    };
    println!(
        "{}",
        heading("Placement: tb vs exo vs the optimum (tok/s by tb's cost model)")
    );
    let (header, rows) = report::case_rows(&results);
    print!("{}", report::table(&header, &rows, md));
    println!();
    for line in report::summary_lines(&summary) {
        if md {
            println!("- {line}");
        } else {
            println!("{line}");
        }
    }
    if args.placements {
        println!();
        println!("{}", heading("Placements (Mac:layers in rank order)"));
        for line in report::placements(&results) {
            if md {
                println!("- {line}");
            } else {
                println!("{line}");
            }
        }
    }
    println!();
    println!(
        "{}",
        heading("Solve time of tb's plan (random seeded partial meshes)")
    );
    let (header, rows) = report::solve_rows(&times);
    print!("{}", report::table(&header, &rows, md));

    if let Some(path) = &args.json {
        let value = report::to_json(&results, &summary, &times);
        let text = serde_json::to_string_pretty(&value).context("serialising the results")?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("placement-bench: wrote {}", path.display());
    }
    if args.smoke {
        anyhow::ensure!(
            !results.is_empty(),
            "placement-bench --smoke: FAILED: no case of at most {SMOKE_MAX_MACS} Macs"
        );
        anyhow::ensure!(
            times.len() == args.sizes.len(),
            "placement-bench --smoke: FAILED: solve times for {} of {} sizes",
            times.len(),
            args.sizes.len()
        );
    }
    Ok(())
}
