//! What is recorded and what is computed from it: the per-second CPU samples, each
//! allocation's life as its Mac saw it, and from those the initial fill, the whole drain,
//! capacity freed → next admission, the contended window's fairness, CPU and memory, and the
//! reconcile passes.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use tb_api::specs::AllocationPhase;

use super::workload::run_time;
use super::{Cpu, GI, RaftResults, RaftSetup};
use crate::member::Memory;
use crate::stats::Latencies;

/// CPU ticks (`utime + stime`) of a process so far.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    crate::procstat::parse_cpu_ticks(&stat)
}

/// Per-second CPU samples of a few processes.
pub(super) struct CpuWatch {
    pub(super) pids: Vec<(String, u32)>,
    pub(super) hz: f64,
    /// (time since t0, ticks per process).
    pub(super) samples: Vec<(Duration, Vec<Option<u64>>)>,
}

impl CpuWatch {
    pub(super) fn sample(&mut self, since_t0: Duration) {
        let ticks = self.pids.iter().map(|(_, p)| cpu_ticks(*p)).collect();
        self.samples.push((since_t0, ticks));
    }

    /// Percent of one core used by process `i` between the samples nearest `from` and `to`.
    pub(super) fn percent(&self, i: usize, from: Duration, to: Duration) -> Option<f64> {
        let at = |t: Duration| {
            self.samples
                .iter()
                .min_by_key(|(s, _)| s.abs_diff(t))
                .and_then(|(s, v)| Some((*s, v.get(i).copied().flatten()?)))
        };
        let ((t1, a), (t2, b)) = (at(from)?, at(to)?);
        let wall = t2.checked_sub(t1)?.as_secs_f64();
        (wall > 0.0).then(|| 100.0 * b.saturating_sub(a) as f64 / self.hz / wall)
    }

    fn peak_second(&self, i: usize) -> Option<f64> {
        self.samples
            .windows(2)
            .filter_map(|w| {
                let (a, b) = (
                    w[0].1.get(i).copied().flatten()?,
                    w[1].1.get(i).copied().flatten()?,
                );
                let wall = w[1].0.checked_sub(w[0].0)?.as_secs_f64();
                (wall >= 0.5).then(|| 100.0 * b.saturating_sub(a) as f64 / self.hz / wall)
            })
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
    }

    fn cpu(&self, i: usize, fill: Option<Duration>, end: Duration) -> Cpu {
        Cpu {
            fill: fill.and_then(|f| self.percent(i, Duration::ZERO, f)),
            run: self.percent(i, Duration::ZERO, end),
            peak_second: self.peak_second(i),
        }
    }
}

/// One allocation's life as the Macs saw it.
pub(super) struct Held {
    pub(super) mac: usize,
    pub(super) queue: String,
    pub(super) admitted: Instant,
    /// When the reconcile pass that admitted it ran (its clock), since t0.
    pub(super) pass: Option<Duration>,
    pub(super) ended: Option<(Instant, AllocationPhase)>,
}

/// Everything `drive` collected, to be turned into results.
pub(super) struct Measured {
    pub(super) held: Vec<Held>,
    pub(super) t0: Instant,
    pub(super) end: Duration,
    pub(super) fill_at: Option<Duration>,
    pub(super) fill_target: usize,
    pub(super) completed: usize,
    pub(super) submitted: usize,
    pub(super) submit_time: Duration,
    pub(super) join_time: Duration,
    pub(super) ready_time: Duration,
    pub(super) date: String,
    pub(super) aborted: Option<String>,
    pub(super) cpu: CpuWatch,
    pub(super) leader: usize,
    pub(super) leader_memory: Option<Memory>,
    pub(super) notes: Vec<String>,
    pub(super) wall: Duration,
}

pub(super) fn measure(setup: &RaftSetup, m: Measured) -> RaftResults {
    let t0 = m.t0;
    let since = |i: Instant| i.saturating_duration_since(t0);
    let mut admissions: Vec<Duration> = m.held.iter().map(|h| since(h.admitted)).collect();
    admissions.sort_unstable();

    // Capacity freed → next admission, per Mac: admission j needs slot-free j − slots.
    let per_mac = setup.slots_per_mac();
    let mut free_to_admit = Vec::new();
    let mut free_to_pass = Vec::new();
    let mut early = 0;
    for mac in 0..setup.macs {
        let mut adm: Vec<(Instant, Option<Duration>)> = m
            .held
            .iter()
            .filter(|h| h.mac == mac)
            .map(|h| (h.admitted, h.pass))
            .collect();
        let mut frees: Vec<Instant> = m
            .held
            .iter()
            .filter(|h| h.mac == mac)
            .filter_map(|h| h.ended.map(|e| e.0))
            .collect();
        adm.sort_unstable();
        frees.sort_unstable();
        for (j, (a, pass)) in adm.iter().enumerate().skip(per_mac) {
            let Some(f) = frees.get(j - per_mac) else {
                break;
            };
            if a < f {
                early += 1;
            }
            free_to_admit.push(a.saturating_duration_since(*f));
            if let Some(pass) = pass {
                free_to_pass.push(pass.saturating_sub(since(*f)));
            }
        }
    }

    // The contended window: t0 until the first queue has no job left to admit.
    let queues: Vec<String> = (0..setup.weights.len()).map(|i| format!("q{i}")).collect();
    let per_queue = setup.jobs / queues.len().max(1);
    let mut changes: Vec<(Instant, &str, i64)> = Vec::new();
    for h in &m.held {
        changes.push((h.admitted, &h.queue, 1));
        if let Some((at, AllocationPhase::Stopped)) = h.ended {
            changes.push((at, &h.queue, -1));
        }
    }
    changes.sort_by_key(|c| c.0);
    let mut count: HashMap<&str, i64> = HashMap::new();
    let mut window_end = t0 + m.end;
    for (at, q, d) in changes {
        let n = count.entry(q).or_default();
        *n += d;
        if *n >= per_queue as i64 {
            window_end = at;
            break;
        }
    }
    let contended = window_end.saturating_duration_since(t0);
    let mut window: HashMap<&str, f64> = HashMap::new();
    let bytes = (setup.job_memory_gi * GI) as f64;
    let run_end = t0 + m.end;
    for h in &m.held {
        let from = h.admitted.max(t0);
        let to = h.ended.map_or(run_end, |e| e.0).min(window_end);
        if to > from {
            *window.entry(&h.queue).or_default() += bytes * (to - from).as_secs_f64();
        }
    }
    let shares: Vec<(String, u32, f64)> = queues
        .iter()
        .zip(&setup.weights)
        .map(|(q, w)| {
            (
                q.clone(),
                *w,
                window.get(q.as_str()).copied().unwrap_or(0.0),
            )
        })
        .collect();
    let held_total: f64 = shares.iter().map(|s| s.2).sum();
    let capacity = (setup.macs as u64 * setup.mac_memory_gi * GI) as f64;
    let utilization = held_total / (capacity * contended.as_secs_f64()).max(1e-9);

    let finish = m
        .held
        .iter()
        .filter_map(|h| h.ended.map(|e| since(e.0)))
        .max()
        .filter(|_| m.completed == m.submitted);
    let total_run: Duration = (0..m.submitted as u64)
        .map(|n| run_time(n, setup.run_ms))
        .sum();
    let ideal_finish = total_run / setup.slots().max(1) as u32;

    let passes = pass_stats(&m.held, t0, m.fill_at, free_to_pass, setup.slots());
    let names: Vec<String> = m.cpu.pids.iter().map(|p| p.0.clone()).collect();
    let bench_index = names.len() - 1;
    RaftResults {
        setup: setup.clone(),
        controller: crate::binaries::describe("tb-controller", &setup.controller),
        date: m.date,
        aborted: m.aborted,
        submitted: m.submitted,
        submit_time: m.submit_time,
        join_time: m.join_time,
        ready_time: m.ready_time,
        fill: m.fill_target,
        fill_time: m.fill_at,
        completed: m.completed,
        finish,
        ideal_finish,
        free_to_admit: Latencies::new(free_to_admit),
        early_admissions: early,
        stopped: m
            .held
            .iter()
            .filter(|h| matches!(h.ended, Some((_, AllocationPhase::Stopped))))
            .count(),
        admissions,
        shares,
        contended,
        utilization,
        leader: names[m.leader].clone(),
        leader_cpu: m.cpu.cpu(m.leader, m.fill_at, m.end),
        followers_cpu: (0..bench_index)
            .filter(|i| *i != m.leader)
            .map(|i| (names[i].clone(), m.cpu.cpu(i, m.fill_at, m.end)))
            .collect(),
        bench_cpu: m.cpu.cpu(bench_index, m.fill_at, m.end),
        leader_memory: m.leader_memory,
        notes: m.notes,
        wall: m.wall,
        load: Default::default(),
        passes,
    }
}

/// The reconcile passes as the allocations' creationTimestamps show them.
#[derive(Debug, Clone, Default)]
pub struct Passes {
    /// Passes that admitted something, in all and up to the initial fill.
    pub admitting: usize,
    pub admitting_in_fill: usize,
    /// Admissions per admitting pass, median and most.
    pub per_pass_median: usize,
    pub per_pass_max: usize,
    /// Time between consecutive admitting passes (their clocks) during the fill.
    pub fill_gaps: Vec<Duration>,
    /// A pass's clock → the allocation seen by its Mac's watch (the pass's own compute after
    /// reading the clock, the Raft commit, replication to the Mac's member, the watch).
    pub pass_to_seen: Latencies,
    /// Freeing status write answered → the clock of the pass that refilled the slot.
    pub free_to_pass: Latencies,
    /// Admissions seen in each second after t0, the first 10.
    pub fill_timeline: Vec<usize>,
    /// t0 → the allocation that filled half, 90 % and all of the slots, seen.
    pub fill_milestones: Vec<(usize, Option<Duration>)>,
}

fn pass_stats(
    held: &[Held],
    t0: Instant,
    fill_at: Option<Duration>,
    free_to_pass: Vec<Duration>,
    slots: usize,
) -> Passes {
    let mut seen: Vec<Duration> = held
        .iter()
        .map(|h| h.admitted.saturating_duration_since(t0))
        .collect();
    seen.sort_unstable();
    let fill_milestones = [slots / 2, slots * 9 / 10, slots]
        .into_iter()
        .map(|n| (n, n.checked_sub(1).and_then(|i| seen.get(i).copied())))
        .collect();
    let mut by_pass: BTreeMap<Duration, usize> = BTreeMap::new();
    let mut pass_to_seen = Vec::new();
    let mut timeline = vec![0usize; 10];
    for h in held {
        let seen = h.admitted.saturating_duration_since(t0);
        if let Some(slot) = timeline.get_mut(seen.as_secs() as usize) {
            *slot += 1;
        }
        if let Some(p) = h.pass {
            *by_pass.entry(p).or_default() += 1;
            pass_to_seen.push(seen.saturating_sub(p));
        }
    }
    let mut counts: Vec<usize> = by_pass.values().copied().collect();
    counts.sort_unstable();
    let fill_end = fill_at.unwrap_or(Duration::MAX);
    let fill_passes: Vec<Duration> = by_pass.keys().copied().filter(|p| *p <= fill_end).collect();
    Passes {
        admitting: by_pass.len(),
        admitting_in_fill: fill_passes.len(),
        per_pass_median: counts.get(counts.len() / 2).copied().unwrap_or(0),
        per_pass_max: counts.last().copied().unwrap_or(0),
        fill_gaps: fill_passes.windows(2).map(|w| w[1] - w[0]).collect(),
        pass_to_seen: Latencies::new(pass_to_seen),
        free_to_pass: Latencies::new(free_to_pass),
        fill_timeline: timeline,
        fill_milestones,
    }
}
