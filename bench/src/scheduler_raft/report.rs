//! The markdown table `scheduler-bench --raft` prints, with the targets beside the
//! measurements, and the notes under it.

use std::time::Duration;

use super::RaftResults;
use crate::stats::Latencies;

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

fn pct(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.0} %"))
}

/// The markdown table.
pub fn report(r: &RaftResults) -> String {
    let s = &r.setup;
    let yes = |b: bool| if b { "yes" } else { "no" };
    let mut out = String::new();
    out.push_str(&format!(
        "### scheduler-bench --raft: through the real controller (3 members, Raft, TLS)\n\n\
         - date: {}\n- machine: {} CPUs ({}), load average (1/5/15 min) before {}, after {}\n- {}\n\
         - workload: {} simulated Macs × {} Gi, {} jobs × {} Gi from {} queues (weights {:?}), \
         run {}–{} s real time, {} slots\n\
         - submitted in {:.2} s ({} jobs per Objects.Apply); {} Macs joined in {:.2} s; \
         their first Ready heartbeats acknowledged {} ms after t0; each Mac keeps one TLS connection to {}\n",
        r.date,
        crate::machine::Machine::describe().nproc,
        crate::machine::Machine::describe().cpu_model,
        r.load.0,
        r.load.1,
        r.controller,
        s.macs,
        s.mac_memory_gi,
        s.jobs,
        s.job_memory_gi,
        s.weights.len(),
        s.weights,
        s.run_ms.0 as f64 / 1000.0,
        s.run_ms.1 as f64 / 1000.0,
        s.slots(),
        r.submit_time.as_secs_f64(),
        s.apply_batch,
        s.macs,
        r.join_time.as_secs_f64(),
        ms(r.ready_time),
        if s.macs_on_leader {
            "the leader"
        } else {
            "controller (i mod 3) + 1"
        },
    ));
    if let Some(why) = &r.aborted {
        out.push_str(&format!("- **stopped early: {why}** (partial results)\n"));
    }
    out.push_str("\n| metric | value | target | met |\n|---|--:|---|---|\n");
    match (r.fill_per_second(), r.fill_time) {
        (Some(rate), Some(t)) => out.push_str(&format!(
            "| initial fill: {} admissions from a {}-job backlog, t0 → {}th allocation seen (admissions/s) | {rate:.0} ({:.2} s) | ≥ 1,000 | {} |\n",
            r.fill,
            r.submitted,
            r.fill,
            t.as_secs_f64(),
            yes(rate >= 1000.0)
        )),
        _ => out.push_str(&format!(
            "| initial fill: {} admissions (admissions/s) | not reached ({} admitted) | ≥ 1,000 | no |\n",
            r.fill,
            r.admissions.len()
        )),
    }
    if let Some(rate) = r.drain_per_second() {
        out.push_str(&format!(
            "| whole drain: {} admissions, t0 → last admission (admissions/s; capacity-bound, ideal {:.0}/s) | {rate:.0} | ≥ 90 % of ideal | {} |\n",
            r.admissions.len(),
            r.ideal_drain_per_second(),
            yes(rate >= 0.9 * r.ideal_drain_per_second())
        ));
    }
    out.push_str(&format!(
        "| all {} jobs Succeeded, t0 → last (s; ideal: total run time ÷ slots = {:.1} s) | {} | | |\n",
        r.submitted,
        r.ideal_finish.as_secs_f64(),
        r.finish
            .map_or(format!("{} done", r.completed), |f| format!("{:.1}", f.as_secs_f64()))
    ));
    let q = |p: f64| r.free_to_admit.quantile(p).map_or("–".into(), ms);
    out.push_str(&format!(
        "| capacity freed → next admission on that Mac, p50 (ms; {} pairs) | {} | | |\n",
        r.free_to_admit.len(),
        q(0.5)
    ));
    out.push_str(&format!(
        "| capacity freed → next admission on that Mac, p99 (ms) | {} | | |\n",
        q(0.99)
    ));
    let err = r.fairness_error() * 100.0;
    out.push_str(&format!(
        "| fairness error, worst queue, memory·time over the {:.1} s every queue had a backlog (%) | {err:.1} | ≤ 5 % | {} |\n",
        r.contended.as_secs_f64(),
        yes(err <= 5.0)
    ));
    out.push_str(&format!(
        "| slots held over that window (memory·time ÷ capacity·time) | {:.1} % | | |\n",
        r.utilization * 100.0
    ));
    out.push_str(&format!(
        "| leader ({}) CPU, fill / whole run / busiest second (% of one core) | {} / {} / {} | | |\n",
        r.leader,
        pct(r.leader_cpu.fill),
        pct(r.leader_cpu.run),
        pct(r.leader_cpu.peak_second)
    ));
    if let Some(mem) = r.leader_memory {
        out.push_str(&format!(
            "| leader RSS at the end / peak (MB) | {:.1} / {:.1} | | |\n",
            mem.rss as f64 / 1e6,
            mem.peak as f64 / 1e6
        ));
    }
    out.push_str(&crate::scheduler::share_table(&r.shares));
    out.push_str("\nDetails:\n");
    for (name, c) in &r.followers_cpu {
        out.push_str(&format!(
            "- {name} (follower) CPU fill / run / busiest second: {} / {} / {}\n",
            pct(c.fill),
            pct(c.run),
            pct(c.peak_second)
        ));
    }
    out.push_str(&format!(
        "- the bench process itself (64 simulated Macs) CPU fill / run / busiest second: {} / {} / {}\n",
        pct(r.bench_cpu.fill),
        pct(r.bench_cpu.run),
        pct(r.bench_cpu.peak_second)
    ));
    let p = &r.passes;
    let q2 = |l: &Latencies, x: f64| l.quantile(x).map_or("–".into(), ms);
    out.push_str(&format!(
        "- reconcile passes that admitted (grouped by the allocations' creationTimestamp, the pass's clock): {} in all, {} up to the initial fill; admissions per pass median {}, most {}\n",
        p.admitting, p.admitting_in_fill, p.per_pass_median, p.per_pass_max
    ));
    out.push_str(&format!(
        "- gaps between admitting passes during the fill (ms): {}\n",
        p.fill_gaps
            .iter()
            .map(|g| ms(*g))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    out.push_str(&format!(
        "- admissions seen per second after t0 (first 10 s): {:?}; t0 → {}\n",
        p.fill_timeline,
        p.fill_milestones
            .iter()
            .map(|(n, t)| format!(
                "{n}th admission {}",
                t.map_or("–".into(), |t| format!("{:.2} s", t.as_secs_f64()))
            ))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    out.push_str(&format!(
        "- pass clock → allocation seen by its Mac (pass compute + Raft commit + watch), p50 / p99 (ms): {} / {}\n",
        q2(&p.pass_to_seen, 0.5),
        q2(&p.pass_to_seen, 0.99)
    ));
    out.push_str(&format!(
        "- capacity freed (write answered) → clock of the pass that refilled it, p50 / p99 (ms): {} / {}\n",
        q2(&p.free_to_pass, 0.5),
        q2(&p.free_to_pass, 0.99)
    ));
    if r.early_admissions > 0 {
        out.push_str(&format!(
            "- {} admissions were seen before the freeing status write's answer (counted as 0 ms)\n",
            r.early_admissions
        ));
    }
    if r.stopped > 0 {
        out.push_str(&format!(
            "- {} allocations were stopped (preempted) before their run time\n",
            r.stopped
        ));
    }
    for n in &r.notes {
        out.push_str(&format!("- {n}\n"));
    }
    out.push_str(&format!(
        "- whole bench wall time (cluster up → report): {:.1} s\n",
        r.wall.as_secs_f64()
    ));
    out
}
