//! What a process costs while it idles: resident memory (`VmRSS` in `/proc/PID/status`) and CPU
//! time (`utime + stime` in `/proc/PID/stat`, in clock ticks of `sysconf(_SC_CLK_TCK)`, 100 per
//! second on Linux), sampled over a window of wall-clock time.

use std::time::{Duration, Instant};

use anyhow::Context;

/// How often memory is read during a window.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// One process to watch: who it is (for the report) and its pid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    /// `nodelet`, `controller`, `slurmd`, `slurmctld`, `munged`: the row it feeds.
    pub role: String,
    /// Its own name (`node-1`, `tb-controller`, ...).
    pub name: String,
    pub pid: u32,
}

/// One process over one window.
#[derive(Debug, Clone, PartialEq)]
pub struct Usage {
    pub role: String,
    pub name: String,
    /// Mean of the `VmRSS` samples, bytes.
    pub mean_rss: u64,
    pub max_rss: u64,
    /// CPU time used in the window over the window's wall-clock time, in percent of one core.
    pub cpu_percent: f64,
}

/// `utime + stime` (fields 14 and 15) from the text of `/proc/PID/stat`, in clock ticks. The
/// command name (field 2) is in parentheses and may hold spaces, so fields are counted after
/// the last `)`.
pub fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After ")": field 3 (state) is index 0, so field N is index N - 3.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second for `/proc/PID/stat`'s times (`sysconf(_SC_CLK_TCK)`).
pub fn clock_ticks_per_second() -> anyhow::Result<u64> {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .context("sysconf(_SC_CLK_TCK)")?
        .context("sysconf(_SC_CLK_TCK) has no value")?;
    u64::try_from(ticks)
        .ok()
        .filter(|t| *t > 0)
        .with_context(|| format!("sysconf(_SC_CLK_TCK) = {ticks}"))
}

/// CPU ticks used so far and resident bytes now, of one process.
fn read(pid: u32) -> anyhow::Result<(u64, u64)> {
    let stat_path = format!("/proc/{pid}/stat");
    let stat =
        std::fs::read_to_string(&stat_path).with_context(|| format!("reading {stat_path}"))?;
    let ticks = parse_cpu_ticks(&stat).with_context(|| format!("no CPU times in {stat_path}"))?;
    let status_path = format!("/proc/{pid}/status");
    let status =
        std::fs::read_to_string(&status_path).with_context(|| format!("reading {status_path}"))?;
    let rss = crate::machine::parse_vm_rss(&status)
        .with_context(|| format!("no VmRSS line in {status_path}"))?;
    Ok((ticks, rss))
}

/// Watch `procs` for `window`: memory every `SAMPLE_EVERY`, CPU time at both ends. Fails if a
/// process disappears (a crashed process would otherwise look cheap).
pub async fn sample(procs: &[Watched], window: Duration) -> anyhow::Result<Vec<Usage>> {
    let ticks_per_second = clock_ticks_per_second()? as f64;
    let start = Instant::now();
    let first = procs
        .iter()
        .map(|p| read(p.pid).with_context(|| format!("{} (pid {})", p.name, p.pid)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut rss: Vec<Vec<u64>> = first.iter().map(|(_, r)| vec![*r]).collect();
    let mut last: Vec<u64> = first.iter().map(|(t, _)| *t).collect();
    let mut next = tokio::time::Instant::now();
    while start.elapsed() < window {
        next += SAMPLE_EVERY;
        let remaining = window.saturating_sub(start.elapsed());
        tokio::time::sleep_until(next.min(tokio::time::Instant::now() + remaining)).await;
        for (i, p) in procs.iter().enumerate() {
            let (ticks, now_rss) =
                read(p.pid).with_context(|| format!("{} (pid {})", p.name, p.pid))?;
            rss[i].push(now_rss);
            last[i] = ticks;
        }
    }
    let wall = start.elapsed().as_secs_f64();
    Ok(procs
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let samples = &rss[i];
            let used = last[i].saturating_sub(first[i].0) as f64 / ticks_per_second;
            Usage {
                role: p.role.clone(),
                name: p.name.clone(),
                mean_rss: samples.iter().sum::<u64>() / samples.len().max(1) as u64,
                max_rss: samples.iter().copied().max().unwrap_or(0),
                cpu_percent: used / wall * 100.0,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_after_the_command_name() {
        // A command name with spaces and a ')' must not shift the fields.
        let stat = "4242 (tb nodelet) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 \
                    123 45 0 0 20 0 9 0 100 200000000 3000 18446744073709551615";
        assert_eq!(parse_cpu_ticks(stat), Some(168));
        assert_eq!(parse_cpu_ticks("4242 (short) S 1"), None);
        assert_eq!(parse_cpu_ticks("no parenthesis"), None);
    }

    #[test]
    fn clock_ticks_are_positive() {
        assert!(clock_ticks_per_second().is_ok_and(|t| t > 0));
    }

    #[tokio::test]
    async fn samples_this_process() {
        let me = Watched {
            role: "test".into(),
            name: "self".into(),
            pid: std::process::id(),
        };
        let usage = sample(&[me], Duration::from_millis(50)).await;
        let usage = usage.expect("own /proc entry");
        assert!(usage[0].mean_rss > 0 && usage[0].max_rss >= usage[0].mean_rss);
        assert!(usage[0].cpu_percent >= 0.0);
    }
}
