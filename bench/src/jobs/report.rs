//! `jobs-bench`'s printout: when and where the numbers were taken, the markdown table (tb,
//! Slurm, Slurm/tb, target, met) and the details behind it (latency breakdowns, every
//! process's idle cost, the controller's own metrics, failures).

use std::fmt::Write as _;
use std::time::Duration;

use super::{IdleWindow, SystemResult};
use crate::machine::{Machine, ms};
use crate::report::{fmt, ratio, yes_no};
use crate::stats::Latencies;

/// The targets the issue holds tb to.
pub const START_P50_TARGET: Duration = Duration::from_millis(300);
pub const AGENT_RSS_TARGET_MB: f64 = 15.0;
pub const AGENT_CPU_TARGET_PERCENT: f64 = 0.5;

/// Where, when and what.
#[derive(Debug, Clone)]
pub struct Context {
    pub date: String,
    pub machine: Machine,
    pub load_before: String,
    pub load_after: String,
    pub workload: Vec<String>,
    pub binaries: Vec<String>,
    pub runs: usize,
    pub ranks: u32,
    pub idle_seconds: u64,
    pub poll_ms: u64,
    /// Processes the final check found and killed.
    pub leftovers: Vec<String>,
}

/// The whole printout. `slurm` is `Err(why)` when it was not run or could not start at all.
pub fn render(
    ctx: &Context,
    tb: Option<&SystemResult>,
    slurm: Result<&SystemResult, &str>,
) -> String {
    let mut out = String::new();
    let m = &ctx.machine;
    let _ = writeln!(
        out,
        "### tb jobs on nodelets vs Slurm: start latency and idle cost\n"
    );
    let _ = writeln!(out, "- date: {}", ctx.date);
    let _ = writeln!(
        out,
        "- machine: {} CPUs ({}), {} RAM, Linux {}",
        m.nproc, m.cpu_model, m.mem_total, m.kernel
    );
    let _ = writeln!(
        out,
        "- load average (1/5/15 min): before {}, after {}",
        ctx.load_before, ctx.load_after
    );
    for w in &ctx.workload {
        let _ = writeln!(out, "- {w}");
    }
    for b in &ctx.binaries {
        let _ = writeln!(out, "- {b}");
    }
    match (tb, &slurm) {
        (None, _) => {
            let _ = writeln!(out, "- tb: not run (--systems)");
        }
        (Some(t), _) if t.failure.is_some() => {
            let _ = writeln!(
                out,
                "- tb: **stopped early**: `{}`",
                t.failure.as_deref().unwrap_or_default()
            );
        }
        _ => {}
    }
    match &slurm {
        Err(why) => {
            let _ = writeln!(out, "- Slurm: not run: {why}; tb's figures are shown alone");
        }
        Ok(s) if s.failure.is_some() => {
            let _ = writeln!(
                out,
                "- Slurm: **stopped early**: `{}`",
                s.failure.as_deref().unwrap_or_default()
            );
        }
        Ok(_) => {}
    }
    if ctx.leftovers.is_empty() {
        let _ = writeln!(out, "- processes left at the end: none");
    } else {
        let _ = writeln!(
            out,
            "- **processes left at the end** (killed): {}",
            ctx.leftovers.join("; ")
        );
    }
    let _ = writeln!(out);

    let s = slurm.ok();
    let slurm_ran = s.is_some();
    let _ = writeln!(out, "| metric | tb | slurm | slurm/tb | target | met |");
    let _ = writeln!(out, "|---|--:|--:|--:|---|---|");
    let q = |r: Option<&SystemResult>, pick: fn(&super::RunTimes) -> Option<Duration>, p: f64| {
        r.and_then(|r| r.series(pick).quantile(p))
            .map(|d| d.as_secs_f64() * 1000.0)
    };
    let running: fn(&super::RunTimes) -> Option<Duration> = |r| Some(r.running);
    let started: fn(&super::RunTimes) -> Option<Duration> = |r| r.started;
    let teardown: fn(&super::RunTimes) -> Option<Duration> = |r| Some(r.teardown);
    let n = ctx.ranks;
    let runs = ctx.runs;
    let mut row = |metric: &str,
                   t: Option<f64>,
                   sl: Option<f64>,
                   d: usize,
                   target: &str,
                   met: Option<bool>| {
        let slurm_cell = if slurm_ran { fmt(sl, d) } else { "n/a".into() };
        let _ = writeln!(
            out,
            "| {metric} | {} | {slurm_cell} | {} | {target} | {} |",
            fmt(t, d),
            fmt(ratio(sl, t), 2),
            if target.is_empty() { "" } else { yes_no(met) }
        );
    };
    let tb50 = q(tb, running, 0.5);
    row(
        &format!("submit → all {n} ranks running, p50 of {runs} (ms)"),
        tb50,
        q(s, running, 0.5),
        1,
        "≤ 300 ms",
        tb50.map(|v| v <= START_P50_TARGET.as_secs_f64() * 1000.0),
    );
    row(
        &format!("submit → all {n} ranks running, p99 of {runs} (ms)"),
        q(tb, running, 0.99),
        q(s, running, 0.99),
        1,
        "",
        None,
    );
    row(
        "submit → last rank's process started (Slurm: the batch script), p50 (ms)",
        q(tb, started, 0.5),
        q(s, started, 0.5),
        1,
        "",
        None,
    );
    row(
        "delete → job's ranks gone, p50 (ms)",
        q(tb, teardown, 0.5),
        q(s, teardown, 0.5),
        1,
        "",
        None,
    );
    for window in ["before", "after"] {
        let label =
            |r: Option<&SystemResult>| r.and_then(|r| r.window(window)).map(|w| w.label.clone());
        let when = label(tb)
            .or_else(|| label(s))
            .unwrap_or_else(|| window.to_string());
        let tw = tb.and_then(|r| r.window(window));
        let sw = s.and_then(|r| r.window(window));
        let largest = match count(tw, "agent") {
            n if n > 1 => format!(", largest of {n}"),
            _ => String::new(),
        };
        let rss = worst(tw, "agent", |u| u.mean_rss as f64 / 1e6);
        row(
            &format!("nodelet (slurmd) idle RSS, {when}{largest} (MB)"),
            rss,
            worst(sw, "agent", |u| u.mean_rss as f64 / 1e6),
            1,
            "≤ 15 MB",
            rss.map(|v| v <= AGENT_RSS_TARGET_MB),
        );
        let cpu = worst(tw, "agent", |u| u.cpu_percent);
        row(
            &format!("nodelet (slurmd) idle CPU, {when}{largest} (% of a core)"),
            cpu,
            worst(sw, "agent", |u| u.cpu_percent),
            2,
            "≤ 0.5 %",
            cpu.map(|v| v <= AGENT_CPU_TARGET_PERCENT),
        );
        row(
            &format!("controller (slurmctld) idle RSS, {when} (MB)"),
            worst(tw, "controller", |u| u.mean_rss as f64 / 1e6),
            worst(sw, "controller", |u| u.mean_rss as f64 / 1e6),
            1,
            "",
            None,
        );
        row(
            &format!("controller (slurmctld) idle CPU, {when} (% of a core)"),
            worst(tw, "controller", |u| u.cpu_percent),
            worst(sw, "controller", |u| u.cpu_percent),
            2,
            "",
            None,
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "#### Details\n");
    if let Some(t) = tb {
        details(&mut out, t, ctx);
    }
    if let Some(s) = s {
        details(&mut out, s, ctx);
    }
    out
}

/// The largest figure among a window's processes of `role`.
fn worst(
    w: Option<&IdleWindow>,
    role: &str,
    f: impl Fn(&crate::procstat::Usage) -> f64,
) -> Option<f64> {
    w?.role(role).map(f).reduce(f64::max)
}

fn count(w: Option<&IdleWindow>, role: &str) -> usize {
    w.map_or(0, |w| w.role(role).count())
}

fn quantiles(l: &Latencies) -> String {
    let q = |p: f64| l.quantile(p).map_or("—".into(), ms);
    format!(
        "p50 {} / p90 {} / p99 {} / max {} ms",
        q(0.5),
        q(0.9),
        q(0.99),
        l.max().map_or("—".into(), ms)
    )
}

fn median_ms(l: &Latencies) -> String {
    l.quantile(0.5).map_or("—".into(), ms)
}

fn details(out: &mut String, r: &SystemResult, ctx: &Context) {
    let _ = writeln!(out, "**{}** ({})", r.name, r.version);
    let _ = writeln!(
        out,
        "- load average: before {}, after {}",
        r.load_before, r.load_after
    );
    let ok = r.runs.len();
    let _ = writeln!(
        out,
        "- {ok} of {} runs ok; submit → all ranks running: {}",
        ok + r.errors.len(),
        quantiles(&r.series(|x| Some(x.running)))
    );
    let submit = r.series(|x| Some(x.submit));
    let placed = r.series(|x| x.placed);
    let started = r.series(|x| x.started);
    let teardown = r.series(|x| Some(x.teardown));
    if r.name == "tb" {
        let _ = writeln!(
            out,
            "- medians: Apply RPC returned {} ms; first Allocation event (placement committed) {} ms; \
             every rank's process started (latest `startedAt`, 1 ms resolution) {} ms; every rank \
             Running seen on the watch {} ms; delete → allocations gone {}",
            median_ms(&submit),
            median_ms(&placed),
            median_ms(&started),
            median_ms(&r.series(|x| Some(x.running))),
            quantiles(&teardown)
        );
    } else {
        let (polls, poll_time) = r
            .runs
            .iter()
            .filter_map(|x| x.polls)
            .fold((0u64, Duration::ZERO), |(n, t), (p, d)| {
                (n + u64::from(p), t + d)
            });
        let period = (polls > 0).then(|| poll_time / polls as u32);
        let _ = writeln!(
            out,
            "- medians: `sbatch` returned {} ms; batch script's first command (its own `date +%s%N`) \
             {} ms; RUNNING seen by `squeue` {} ms; `scancel` → job gone {}",
            median_ms(&submit),
            median_ms(&started),
            median_ms(&r.series(|x| Some(x.running))),
            quantiles(&teardown)
        );
        let _ = writeln!(
            out,
            "- polling: `squeue -h -j ID -o %T` with {} ms between calls; {} calls in all, one every {} ms \
             on average (each call is a process and an RPC to slurmctld), so RUNNING is seen up to one \
             period late",
            ctx.poll_ms,
            polls,
            period.map_or("—".into(), ms)
        );
    }
    for e in &r.errors {
        let _ = writeln!(out, "  - failed run: `{e}`");
    }
    for w in &r.idle {
        let procs: Vec<String> = w
            .usage
            .iter()
            .map(|u| {
                format!(
                    "{} {:.1} MB (max {:.1}), {:.2} %",
                    u.name,
                    u.mean_rss as f64 / 1e6,
                    u.max_rss as f64 / 1e6,
                    u.cpu_percent
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "- idle {} ({} s, load before {}): {}",
            w.label,
            w.seconds,
            w.load_before,
            procs.join("; ")
        );
    }
    for n in &r.notes {
        let _ = writeln!(out, "- {n}");
    }
    let _ = writeln!(out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::RunTimes;
    use crate::procstat::Usage;

    fn result(name: &str, running_ms: &[u64], rss_mb: f64) -> SystemResult {
        let mut r = SystemResult::new(name, "v".into());
        r.runs = running_ms
            .iter()
            .map(|&v| RunTimes {
                running: Duration::from_millis(v),
                teardown: Duration::from_millis(v),
                ..Default::default()
            })
            .collect();
        r.idle.push(IdleWindow {
            label: "before jobs".into(),
            seconds: 60,
            load_before: "0 0 0".into(),
            usage: vec![
                Usage {
                    role: "agent".into(),
                    name: "a".into(),
                    mean_rss: (rss_mb * 1e6) as u64,
                    max_rss: (rss_mb * 1e6) as u64,
                    cpu_percent: 0.1,
                },
                Usage {
                    role: "agent".into(),
                    name: "b".into(),
                    mean_rss: (rss_mb * 1e6) as u64 / 2,
                    max_rss: (rss_mb * 1e6) as u64 / 2,
                    cpu_percent: 0.2,
                },
            ],
        });
        r
    }

    fn ctx() -> Context {
        Context {
            date: "d".into(),
            machine: Machine::describe(),
            load_before: "1".into(),
            load_after: "2".into(),
            workload: vec![],
            binaries: vec![],
            runs: 3,
            ranks: 4,
            idle_seconds: 60,
            poll_ms: 10,
            leftovers: vec![],
        }
    }

    #[test]
    fn table_has_ratios_and_targets() {
        let tb = result("tb", &[100, 200, 300], 10.0);
        let slurm = result("slurm", &[1000, 2000, 3000], 20.0);
        let text = render(&ctx(), Some(&tb), Ok(&slurm));
        assert!(
            text.contains("| submit → all 4 ranks running, p50 of 3 (ms) | 200.0 | 2000.0 | 10.00 | ≤ 300 ms | yes |"),
            "{text}"
        );
        assert!(text.contains(
            "| nodelet (slurmd) idle RSS, before jobs, largest of 2 (MB) | 10.0 | 20.0 | 2.00 | ≤ 15 MB | yes |"
        ));
    }

    #[test]
    fn without_slurm_its_column_says_na() {
        let tb = result("tb", &[400], 16.0);
        let text = render(&ctx(), Some(&tb), Err("not installed"));
        assert!(text.contains("- Slurm: not run: not installed"));
        assert!(
            text.contains("| 400.0 | n/a | — | ≤ 300 ms | **no** |"),
            "{text}"
        );
        assert!(text.contains(
            "| nodelet (slurmd) idle CPU, before jobs, largest of 2 (% of a core) | 0.20 | n/a | — | ≤ 0.5 % | yes |"
        ));
        assert!(
            text.contains("| nodelet (slurmd) idle RSS, after (MB) | — | n/a | — | ≤ 15 MB | — |"),
            "{text}"
        );
    }
}
