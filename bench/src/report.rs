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

/// What was asked for: client counts, writes per run, leader kills.
#[derive(Debug, Clone)]
pub struct Shape<'a> {
    pub clients: &'a [usize],
    pub writes: u64,
    pub failovers: usize,
}

/// The whole printout. `tb` is `None` when it was not run; `peers` are the etcd runs (TLS
/// first: the like-for-like comparison the targets are judged against, then plain TCP);
/// `etcd_missing` says why there are none when it is empty.
pub fn render(
    ctx: &Context,
    shape: &Shape,
    tb: Option<&SystemReport>,
    peers: &[&SystemReport],
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
    if peers.is_empty() {
        let _ = writeln!(out, "- etcd: {etcd_missing}; tb's figures are shown alone");
    } else if let Some(first) = peers.first() {
        let _ = writeln!(
            out,
            "- targets and \"met\" compare tb with {} (the first etcd column)",
            first.name
        );
    }
    let _ = writeln!(out);
    let mut header = String::from("| metric | tb |");
    let mut rule = String::from("|---|--:|");
    for p in peers {
        let _ = write!(header, " {} | tb/{} |", p.name, p.name);
        rule.push_str("--:|--:|");
    }
    let _ = writeln!(out, "{header} target | met |");
    let _ = writeln!(out, "{rule}---|---|");
    let tput = |s: Option<&SystemReport>, c: usize| s?.run(c).map(|r| r.load.throughput());
    let q = |s: Option<&SystemReport>, c: usize, p: f64| {
        s?.run(c)?
            .load
            .latencies
            .quantile(p)
            .map(|d| d.as_secs_f64() * 1000.0)
    };
    for &c in clients {
        Row::measure(
            &format!("throughput, {c} clients (writes/s)"),
            tb,
            peers,
            &|s| tput(s, c),
        )
        .write(&mut out)
        .decimals(0)
        .higher_better("≥ etcd");
        Row::measure(&format!("p50 latency, {c} clients (ms)"), tb, peers, &|s| {
            q(s, c, 0.5)
        })
        .write(&mut out)
        .decimals(1)
        .plain();
        Row::measure(&format!("p99 latency, {c} clients (ms)"), tb, peers, &|s| {
            q(s, c, 0.99)
        })
        .write(&mut out)
        .decimals(1)
        .lower_better("≤ etcd", None);
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
        Row::measure(
            &format!(
                "leader kill -9 → first write ok, median of {} (ms)",
                shape.failovers
            ),
            tb,
            peers,
            &fo,
        )
        .write(&mut out)
        .decimals(0)
        .lower_better("≤ 2000 ms", Some(FAILOVER_TARGET.as_secs_f64() * 1000.0));
    }
    for &c in clients {
        let rss = |s: Option<&SystemReport>| s?.run(c)?.leader_rss.map(|b| b as f64 / 1e6);
        Row::measure(
            &format!(
                "leader RSS with {} objects, after {c} clients (MB)",
                thousands(shape.writes)
            ),
            tb,
            peers,
            &rss,
        )
        .write(&mut out)
        .decimals(1)
        .lower_better("≤ 100 MB", Some(RSS_TARGET_BYTES as f64 / 1e6));
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "### Details\n");
    for s in tb.into_iter().chain(peers.iter().copied()) {
        details(&mut out, s);
    }
    out
}

/// One metric: tb's figure and each peer's, written as a table row by one of the finishing
/// methods (which say whether higher or lower is better and what the target is).
struct Row {
    metric: String,
    tb: Option<f64>,
    peers: Vec<Option<f64>>,
}

/// A [`Row`] with its number of decimals, waiting for how it is judged.
struct Pending<'a> {
    out: &'a mut String,
    row: Row,
    decimals: usize,
}

impl Row {
    fn measure(
        metric: &str,
        tb: Option<&SystemReport>,
        peers: &[&SystemReport],
        f: &dyn Fn(Option<&SystemReport>) -> Option<f64>,
    ) -> Row {
        Row {
            metric: metric.to_string(),
            tb: f(tb),
            peers: peers.iter().map(|p| f(Some(p))).collect(),
        }
    }

    fn write(self, out: &mut String) -> Pending<'_> {
        Pending {
            out,
            row: self,
            decimals: 0,
        }
    }
}

impl Pending<'_> {
    fn decimals(mut self, d: usize) -> Self {
        self.decimals = d;
        self
    }

    fn finish(self, target: &str, met: Option<bool>) {
        let r = &self.row;
        let d = self.decimals;
        let mut line = format!("| {} | {} |", r.metric, fmt(r.tb, d));
        for p in &r.peers {
            let _ = write!(line, " {} | {} |", fmt(*p, d), fmt(ratio(r.tb, *p), 2));
        }
        let met = if target.is_empty() { "" } else { yes_no(met) };
        let _ = writeln!(self.out, "{line} {target} | {met} |");
    }

    /// The ratio to the first peer, tb's figure over it.
    fn first_ratio(&self) -> Option<f64> {
        ratio(self.row.tb, self.row.peers.first().copied().flatten())
    }

    fn plain(self) {
        self.finish("", None);
    }

    fn higher_better(self, target: &str) {
        let met = self.first_ratio().map(|r| r >= 1.0);
        self.finish(target, met);
    }

    /// `absolute`: a fixed bound for tb; otherwise tb is held to the first peer's figure.
    fn lower_better(self, target: &str, absolute: Option<f64>) {
        let met = match absolute {
            Some(bound) => self.row.tb.map(|t| t <= bound),
            None => self.first_ratio().map(|r| r <= 1.0),
        };
        self.finish(target, met);
    }
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

    fn row(tb: f64, peers: &[f64]) -> Row {
        Row {
            metric: "m".into(),
            tb: Some(tb),
            peers: peers.iter().map(|&p| Some(p)).collect(),
        }
    }

    #[test]
    fn lower_is_better_against_a_bound() {
        let mut out = String::new();
        row(500.0, &[1500.0])
            .write(&mut out)
            .lower_better("≤ 2000 ms", Some(2000.0));
        assert_eq!(out, "| m | 500 | 1500 | 0.33 | ≤ 2000 ms | yes |\n");
    }

    #[test]
    fn judged_against_the_first_peer_with_every_ratio_shown() {
        let mut out = String::new();
        row(90.0, &[100.0, 75.0])
            .write(&mut out)
            .higher_better("≥ etcd");
        assert_eq!(
            out,
            "| m | 90 | 100 | 0.90 | 75 | 1.20 | ≥ etcd | **no** |\n"
        );
    }
}
