//! The printed result: a header describing when and where the numbers were taken, the
//! markdown table (tb, etcd, tb/etcd, target, met?), and details (every failover round, every
//! member's memory, errors and retries, tb's own metrics).

use std::fmt::Write as _;
use std::time::Duration;

use crate::bench::SystemReport;
use crate::machine::{Machine, ms};
use crate::stats::median;

/// The targets tb is held to.
pub const FAILOVER_TARGET: Duration = Duration::from_secs(2);
pub const RSS_TARGET_BYTES: u64 = 100_000_000;

/// Where and when the numbers were taken.
#[derive(Debug, Clone)]
pub struct Context {
    pub date: String,
    pub machine: Machine,
    pub load_before: String,
    pub load_after: String,
    pub workload: String,
    pub binaries: Vec<String>,
}

/// `Some(system's report)` for etcd when it ran; `None` when it was not found.
/// What was asked for: client counts, writes per run, leader kills.
#[derive(Debug, Clone)]
pub struct Shape<'a> {
    pub clients: &'a [usize],
    pub writes: u64,
    pub failovers: usize,
}

/// The whole printout. `tb` is `None` when it was not run; `etcd` is `None` when it was not
/// run or not found (`etcd_missing` says which).
pub fn render(
    ctx: &Context,
    shape: &Shape,
    tb: Option<&SystemReport>,
    etcd: Option<&SystemReport>,
    etcd_missing: &str,
) -> String {
    let clients = shape.clients;
    let mut out = String::new();
    let m = &ctx.machine;
    let _ = writeln!(out, "## tb controller vs etcd: replicated writes\n");
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
    let _ = writeln!(out, "- workload: {}", ctx.workload);
    for b in &ctx.binaries {
        let _ = writeln!(out, "- {b}");
    }
    if tb.is_none() {
        let _ = writeln!(out, "- tb: not run (--systems)");
    }
    if etcd.is_none() {
        let _ = writeln!(out, "- etcd: {etcd_missing}; tb's figures are shown alone");
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "| metric | tb | etcd | tb/etcd | target | met |");
    let _ = writeln!(out, "|---|--:|--:|--:|---|---|");
    for &c in clients {
        let t = tb.and_then(|t| t.run(c)).map(|r| &r.load);
        let e = etcd.and_then(|e| e.run(c)).map(|r| &r.load);
        let tput = |l: Option<&crate::load::LoadResult>| l.map(|l| l.throughput());
        row_higher_better(
            &mut out,
            &format!("throughput, {c} clients (writes/s)"),
            tput(t),
            tput(e),
            0,
            "≥ etcd",
        );
        let q = |l: Option<&crate::load::LoadResult>, p: f64| {
            l.and_then(|l| l.latencies.quantile(p))
                .map(|d| d.as_secs_f64() * 1000.0)
        };
        row_plain(
            &mut out,
            &format!("p50 latency, {c} clients (ms)"),
            q(t, 0.5),
            q(e, 0.5),
            1,
        );
        row_lower_better(
            &mut out,
            &format!("p99 latency, {c} clients (ms)"),
            q(t, 0.99),
            q(e, 0.99),
            1,
            "≤ etcd",
            None,
        );
    }
    // A round in which no write succeeded counts as infinitely long.
    let fo = |s: Option<&SystemReport>| {
        let rounds: Vec<Duration> = s?
            .failovers
            .iter()
            .map(|r| r.outcome.clone().unwrap_or(Duration::MAX))
            .collect();
        median(&rounds).map(|d| {
            if d == Duration::MAX {
                f64::INFINITY
            } else {
                d.as_secs_f64() * 1000.0
            }
        })
    };
    if shape.failovers > 0 {
        row_lower_better(
            &mut out,
            &format!(
                "leader kill -9 → first write ok, median of {} (ms)",
                shape.failovers
            ),
            fo(tb),
            fo(etcd),
            0,
            "≤ 2000 ms",
            Some(FAILOVER_TARGET.as_secs_f64() * 1000.0),
        );
    }
    for &c in clients {
        let rss = |s: Option<&SystemReport>| s?.run(c)?.leader_rss.map(|b| b as f64 / 1e6);
        row_lower_better(
            &mut out,
            &format!(
                "leader RSS with {} objects, after {c} clients (MB)",
                thousands(shape.writes)
            ),
            rss(tb),
            rss(etcd),
            1,
            "≤ 100 MB",
            Some(RSS_TARGET_BYTES as f64 / 1e6),
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "### Details\n");
    for s in tb.into_iter().chain(etcd) {
        details(&mut out, s);
    }
    out
}

/// A figure with `decimals` places; `—` when missing, `failed` when infinite.
pub fn fmt(v: Option<f64>, decimals: usize) -> String {
    match v {
        None => "—".into(),
        Some(v) if !v.is_finite() => "failed".into(),
        Some(v) => format!("{v:.decimals$}"),
    }
}

/// `t / e` when both are known and `e` is positive.
pub fn ratio(t: Option<f64>, e: Option<f64>) -> Option<f64> {
    match (t, e) {
        (Some(t), Some(e)) if e > 0.0 => Some(t / e),
        _ => None,
    }
}

/// `yes`, a bold `no`, or `—` when it cannot be told.
pub fn yes_no(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "—",
    }
}

fn row_plain(out: &mut String, metric: &str, t: Option<f64>, e: Option<f64>, d: usize) {
    let r = ratio(t, e);
    let _ = writeln!(
        out,
        "| {metric} | {} | {} | {} | | |",
        fmt(t, d),
        fmt(e, d),
        fmt(r, 2)
    );
}

fn row_higher_better(
    out: &mut String,
    metric: &str,
    t: Option<f64>,
    e: Option<f64>,
    d: usize,
    target: &str,
) {
    let r = ratio(t, e);
    let met = r.map(|r| r >= 1.0);
    let _ = writeln!(
        out,
        "| {metric} | {} | {} | {} | {target} | {} |",
        fmt(t, d),
        fmt(e, d),
        fmt(r, 2),
        yes_no(met)
    );
}

/// `absolute`: a fixed bound for tb; otherwise tb is held to etcd's figure.
fn row_lower_better(
    out: &mut String,
    metric: &str,
    t: Option<f64>,
    e: Option<f64>,
    d: usize,
    target: &str,
    absolute: Option<f64>,
) {
    let r = ratio(t, e);
    let met = match absolute {
        Some(bound) => t.map(|t| t <= bound),
        None => r.map(|r| r <= 1.0),
    };
    let _ = writeln!(
        out,
        "| {metric} | {} | {} | {} | {target} | {} |",
        fmt(t, d),
        fmt(e, d),
        fmt(r, 2),
        yes_no(met)
    );
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// Sizes in MB, one per member.
fn mbs(sizes: &[Option<u64>]) -> String {
    sizes
        .iter()
        .map(|b| b.map_or("—".into(), |b| format!("{:.1}", b as f64 / 1e6)))
        .collect::<Vec<_>>()
        .join(" / ")
        + " MB"
}

fn details(out: &mut String, s: &SystemReport) {
    let _ = writeln!(out, "**{}** ({})", s.name, s.version);
    for r in &s.runs {
        let l = &r.load;
        let rss: Vec<String> = r
            .memory
            .iter()
            .map(|m| {
                m.map_or("—".into(), |m| {
                    format!(
                        "{:.1} (peak {:.1})",
                        m.rss as f64 / 1e6,
                        m.peak as f64 / 1e6
                    )
                })
            })
            .collect();
        let _ = writeln!(
            out,
            "- {} clients (load average before: {}): {} of {} writes ok in {:.2} s, {} failed, {} retries; p50 {} / p90 {} / p99 {} / max {} ms; RSS per member {} MB; data dir on disk {}",
            l.clients,
            r.load_before,
            l.succeeded(),
            l.writes,
            l.elapsed.as_secs_f64(),
            l.failed,
            l.retries,
            l.latencies.quantile(0.5).map_or("—".into(), ms),
            l.latencies.quantile(0.9).map_or("—".into(), ms),
            l.latencies.quantile(0.99).map_or("—".into(), ms),
            l.latencies.max().map_or("—".into(), ms),
            rss.join(" / "),
            mbs(&r.disk),
        );
        for e in &l.errors {
            let _ = writeln!(out, "  - error: `{e}`");
        }
        for n in &r.notes {
            let _ = writeln!(out, "  - {n}");
        }
    }
    if !s.failovers.is_empty() {
        let rounds: Vec<String> = s
            .failovers
            .iter()
            .map(|r| match &r.outcome {
                Ok(d) => format!(
                    "killed {} → {} ms ({} attempts)",
                    r.killed,
                    ms(*d),
                    r.attempts
                ),
                Err(e) => format!(
                    "killed {} → no write succeeded ({} attempts): `{e}`",
                    r.killed, r.attempts
                ),
            })
            .collect();
        let _ = writeln!(out, "- failover rounds: {}", rounds.join("; "));
    }
    if let Some(f) = &s.failure {
        let _ = writeln!(out, "- **stopped early**: `{f}`");
    }
    let _ = writeln!(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(10000), "10,000");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1234567), "1,234,567");
    }

    #[test]
    fn lower_is_better_against_a_bound() {
        let mut out = String::new();
        row_lower_better(
            &mut out,
            "m",
            Some(500.0),
            Some(1500.0),
            0,
            "≤ 2000 ms",
            Some(2000.0),
        );
        assert_eq!(out, "| m | 500 | 1500 | 0.33 | ≤ 2000 ms | yes |\n");
    }
}
