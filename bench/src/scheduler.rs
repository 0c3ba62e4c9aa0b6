//! `scheduler-bench`: the scheduler's throughput and fairness. 64 simulated Macs (their
//! nodelets played in-process by status and heartbeat commands), 5,000 queued jobs from 10
//! queues of different weights, driven in virtual time through the real `scheduler::reconcile`
//! and the real state machine (`State::apply`, the code every Raft member runs on a committed
//! entry). The Raft log itself (network, redb fsync) is not in the loop: `controller-bench`
//! measures that path separately.
//!
//! Measured: admissions per second of real time spent in the scheduler and the state machine
//! (the initial fill, and the whole drain), the real time from a gang's end being committed to
//! the next job's admission being committed (p50/p99, capacity freed → admitted), and the
//! fairness error: over the time every queue still has a backlog, each queue's share of the
//! memory·time against its weight's share, worst relative error.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::TimeDelta;
use serde_json::{Value, json};
use tb_api::specs::{AllocationPhase, AllocationSpec, AllocationStatus, Desired, parse_spec};
use tb_api::status::{JobPhase, JobStatus, PortRange};
use tb_api::{Kind, Object, ObjectMeta};
use tb_core::scheduler::memo::Memo;
use tb_core::scheduler::{Clock, SchedulerConfig, reconcile_with};
use tb_core::store::{Op, Response, State};

/// Virtual seconds between nodelet reports (and scheduler runs).
const STEP: i64 = 5;

/// What to run.
#[derive(Debug, Clone)]
pub struct Setup {
    pub macs: usize,
    pub mac_memory_gi: u64,
    pub jobs: usize,
    pub job_memory_gi: u64,
    pub weights: Vec<u32>,
    /// Job run time: uniform in [min, max] seconds (deterministic).
    pub run_seconds: (i64, i64),
    pub half_life: TimeDelta,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            macs: 64,
            mac_memory_gi: 32,
            jobs: 5000,
            job_memory_gi: 4,
            weights: vec![1, 1, 2, 2, 3, 3, 4, 4, 5, 5],
            run_seconds: (60, 300),
            half_life: TimeDelta::hours(1),
        }
    }
}

/// What came out.
#[derive(Debug, Clone)]
pub struct Results {
    pub setup: Setup,
    pub initial_fill: usize,
    pub initial_fill_real: Duration,
    pub admitted: usize,
    pub scheduler_real: Duration,
    pub virtual_seconds: i64,
    pub free_to_admit_real: Vec<Duration>,
    /// (queue, weight, memory byte·seconds in the contended window).
    pub shares: Vec<(String, u32, f64)>,
    pub contended_seconds: i64,
}

impl Results {
    pub fn admissions_per_second(&self) -> f64 {
        self.admitted as f64 / self.scheduler_real.as_secs_f64().max(1e-9)
    }

    pub fn fill_per_second(&self) -> f64 {
        self.initial_fill as f64 / self.initial_fill_real.as_secs_f64().max(1e-9)
    }

    pub fn percentile_ms(&self, p: f64) -> f64 {
        let mut v: Vec<f64> = self
            .free_to_admit_real
            .iter()
            .map(|d| d.as_secs_f64() * 1000.0)
            .collect();
        if v.is_empty() {
            return 0.0;
        }
        v.sort_by(f64::total_cmp);
        let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
        v[i.min(v.len() - 1)]
    }

    pub fn fairness_error(&self) -> f64 {
        fairness_error(&self.shares)
    }
}

/// `| queue | weight | wanted | got |`: each queue's share of weight beside its share of the
/// memory·time used, given (queue, weight, memory·time used).
pub fn share_table(shares: &[(String, u32, f64)]) -> String {
    let mut out = String::from("\n| queue | weight | wanted | got |\n|---|--:|--:|--:|\n");
    let total: f64 = shares.iter().map(|x| x.2).sum();
    let weights: f64 = shares.iter().map(|x| f64::from(x.1)).sum();
    for (q, w, used) in shares {
        out.push_str(&format!(
            "| {q} | {w} | {:.1} % | {:.1} % |\n",
            100.0 * f64::from(*w) / weights,
            100.0 * used / total.max(1e-9)
        ));
    }
    out
}

/// Worst |got − wanted| / wanted over queues, given (queue, weight, memory·time used): shares
/// of memory·time against shares of weight. NaN when nothing was used.
pub fn fairness_error(shares: &[(String, u32, f64)]) -> f64 {
    let total: f64 = shares.iter().map(|s| s.2).sum();
    let weights: f64 = shares.iter().map(|s| f64::from(s.1)).sum();
    if total <= 0.0 {
        return f64::NAN;
    }
    shares
        .iter()
        .map(|(_, w, used)| {
            let want = f64::from(*w) / weights;
            ((used / total) - want).abs() / want
        })
        .fold(0.0, f64::max)
}

/// The shared simulated cluster (`tb_core::sim`), plus what the bench keeps: the leader's parse
/// cache between passes and the real time spent in the scheduler and the state machine.
struct Sim {
    sim: tb_core::sim::Sim,
    /// What the leader keeps parsed between passes.
    memo: Memo,
    /// Real time spent in reconcile + apply of plans.
    busy: Duration,
}

impl std::ops::Deref for Sim {
    type Target = tb_core::sim::Sim;
    fn deref(&self) -> &Self::Target {
        &self.sim
    }
}

impl std::ops::DerefMut for Sim {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.sim
    }
}

impl Sim {
    /// Reconcile and commit until nothing is left to do (at most 20 passes); returns jobs
    /// admitted. Timed, with the leader's memo, unlike the tests' `settle`.
    fn settle(&mut self) -> usize {
        let mut admitted = 0;
        for _ in 0..20 {
            let started = Instant::now();
            let clock = Clock::new(self.sim.now, self.sim.leader_since);
            let plans = reconcile_with(&self.sim.state, &clock, &self.sim.cfg, &mut self.memo);
            if plans.is_empty() {
                self.busy += started.elapsed();
                return admitted;
            }
            for plan in plans {
                let creates = plan
                    .events
                    .iter()
                    .filter(|e| e.spec["reason"] == "Scheduled")
                    .count();
                if let Response::Planned { .. } = self.sim.commit(Op::Plan(plan)) {
                    admitted += creates;
                }
            }
            self.busy += started.elapsed();
        }
        admitted
    }
}

fn queue_object(name: &str, weight: u32) -> Object {
    Object {
        api_version: "tb/v1".into(),
        kind: "Queue".into(),
        metadata: ObjectMeta {
            name: name.into(),
            ..Default::default()
        },
        spec: json!({"weight": weight}),
        status: Value::Null,
    }
}

fn job_object(name: &str, queue: &str, memory_gi: u64) -> Object {
    Object {
        api_version: "tb/v1".into(),
        kind: "TrainingJob".into(),
        metadata: ObjectMeta {
            name: name.into(),
            namespace: "default".into(),
            ..Default::default()
        },
        spec: json!({"command": ["python3", "train.py"], "ranks": 1,
                     "memory": format!("{memory_gi}Gi"), "queue": queue,
                     "ttlSecondsAfterFinished": 0}),
        status: Value::Null,
    }
}

/// A deterministic run time per job number.
fn run_time(n: u64, (lo, hi): (i64, i64)) -> i64 {
    let x = n
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    lo + ((x >> 33) % (hi - lo + 1) as u64) as i64
}

pub fn run(setup: Setup) -> Results {
    let mut sim = Sim {
        sim: tb_core::sim::Sim::new(),
        memo: Memo::default(),
        busy: Duration::ZERO,
    };
    sim.cfg = SchedulerConfig {
        fair_share_half_life: setup.half_life,
        ..Default::default()
    };
    sim.node_ports = PortRange {
        start: 32323,
        end: 32623,
    };
    for i in 0..setup.macs {
        sim.add_node(&format!("mac{i:02}"), setup.mac_memory_gi);
    }
    let queues: Vec<String> = (0..setup.weights.len()).map(|i| format!("q{i}")).collect();
    for (q, w) in queues.iter().zip(&setup.weights) {
        sim.apply(queue_object(q, *w));
    }
    // Every queue submits its share of the backlog, interleaved (so age favours no queue).
    let mut runs: BTreeMap<String, i64> = BTreeMap::new();
    let per_queue = setup.jobs / queues.len();
    for n in 0..per_queue {
        for q in &queues {
            let name = format!("{q}-{n}");
            runs.insert(name.clone(), run_time(runs.len() as u64, setup.run_seconds));
            sim.apply(job_object(&name, q, setup.job_memory_gi));
            // One millisecond apart, as submissions are: age orders them.
            sim.now += TimeDelta::milliseconds(1);
        }
    }
    sim.busy = Duration::ZERO;
    let initial_fill = sim.settle();
    let initial_fill_real = sim.busy;
    eprintln!("initial fill: {initial_fill} in {initial_fill_real:?}");
    let mut admitted = initial_fill;
    let mut free_to_admit = Vec::new();
    let mut contended: Option<i64> = None;
    let mut window: BTreeMap<String, f64> = BTreeMap::new();
    let mut t = 0i64;
    while admitted < per_queue * queues.len() || !sim.state.list("Allocation", "").is_empty() {
        // Nodelets report every STEP seconds of virtual time; the scheduler runs after each.
        t += STEP;
        sim.now += TimeDelta::seconds(STEP);
        sim.heartbeat_all();
        // The nodelets: start what was placed, end what has run its time.
        let mut ended = 0;
        let allocations = sim.state.list(Kind::Allocation.as_str(), "");
        let mut held: BTreeMap<String, f64> = BTreeMap::new();
        for o in allocations {
            let (Ok(spec), status) = (
                parse_spec::<AllocationSpec>(&o.spec),
                AllocationStatus::from_value(&o.status),
            ) else {
                continue;
            };
            if spec.desired != Desired::Run || status.phase.is_terminal() {
                continue;
            }
            let queue = spec.job.name.split('-').next().unwrap_or("").to_string();
            *held.entry(queue).or_default() += spec.memory_bytes as f64;
            let born =
                tb_core::scheduler::time_of(&o.metadata.creation_timestamp).unwrap_or(sim.now);
            let due = runs.get(&spec.job.name).copied().unwrap_or(60);
            let mut next = status.clone();
            if (sim.now - born).num_seconds() >= due {
                next.phase = AllocationPhase::Succeeded;
                next.exit_code = Some(0);
                next.reason = "Completed".into();
                ended += 1;
            } else if status.phase == AllocationPhase::Pending {
                next.phase = AllocationPhase::Running;
                next.reason = "Started".into();
            } else {
                continue;
            }
            sim.commit(Op::UpdateStatus {
                key: o.key(),
                status: next.to_value(),
                resource_version: 0,
            });
        }
        // Memory·time while every queue still has a backlog.
        let backlog = pending_by_queue(&sim.state);
        if contended.is_none()
            && queues
                .iter()
                .all(|q| backlog.get(q).copied().unwrap_or(0) > 0)
        {
            for (q, bytes) in held {
                *window.entry(q).or_default() += bytes * STEP as f64;
            }
        } else if contended.is_none() {
            contended = Some(t);
        }
        let freed_at = Instant::now();
        let n = sim.settle();
        if ended > 0 && n > 0 {
            let took = freed_at.elapsed();
            free_to_admit.extend(std::iter::repeat_n(took, n));
        }
        admitted += n;
        if t % 300 == 0 {
            eprintln!(
                "t={t}s admitted={admitted} allocations={} real busy={:?}",
                sim.state.list(Kind::Allocation.as_str(), "").len(),
                sim.busy
            );
        }
        if t > 24 * 3600 {
            break;
        }
    }
    Results {
        shares: queues
            .iter()
            .zip(&setup.weights)
            .map(|(q, w)| (q.clone(), *w, window.get(q).copied().unwrap_or(0.0)))
            .collect(),
        contended_seconds: contended.unwrap_or(t),
        setup,
        initial_fill,
        initial_fill_real,
        admitted,
        scheduler_real: sim.busy,
        virtual_seconds: t,
        free_to_admit_real: free_to_admit,
    }
}

fn pending_by_queue(state: &State) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for j in state.list(Kind::TrainingJob.as_str(), "") {
        if JobStatus::from_value(&j.status).phase == JobPhase::Pending {
            let q = j.metadata.name.split('-').next().unwrap_or("").to_string();
            *out.entry(q).or_default() += 1;
        }
    }
    out
}

/// The markdown table.
pub fn report(r: &Results) -> String {
    let s = &r.setup;
    let mut out = String::new();
    out.push_str(&format!(
        "{} Macs × {}Gi, {} jobs × {}Gi from {} queues (weights {:?}), run {}–{} s, half-life {} min\n\n",
        s.macs,
        s.mac_memory_gi,
        s.jobs,
        s.job_memory_gi,
        s.weights.len(),
        s.weights,
        s.run_seconds.0,
        s.run_seconds.1,
        s.half_life.num_minutes()
    ));
    out.push_str("| metric | value | target | met |\n|---|--:|---|---|\n");
    let fill = r.fill_per_second();
    let drain = r.admissions_per_second();
    let p99 = r.percentile_ms(99.0);
    let err = r.fairness_error() * 100.0;
    let yes = |b: bool| if b { "yes" } else { "no" };
    out.push_str(&format!(
        "| initial fill: {} admissions from a {}-job backlog (admissions/s, real) | {fill:.0} | ≥ 1,000 | {} |\n",
        r.initial_fill,
        s.jobs,
        yes(fill >= 1000.0)
    ));
    out.push_str(&format!(
        "| whole drain: {} admissions over {} virtual s (admissions/s of scheduler + state-machine time) | {drain:.0} | ≥ 1,000 | {} |\n",
        r.admitted,
        r.virtual_seconds,
        yes(drain >= 1000.0)
    ));
    out.push_str(&format!(
        "| capacity freed → next job admitted, p50 (ms, real; virtual: same pass) | {:.2} | | |\n",
        r.percentile_ms(50.0)
    ));
    out.push_str(&format!(
        "| capacity freed → next job admitted, p99 (ms, real) | {p99:.2} | | |\n"
    ));
    out.push_str(&format!(
        "| fairness error, worst queue, memory·time over the {} s every queue had a backlog (%) | {err:.1} | ≤ 5 % | {} |\n",
        r.contended_seconds,
        yes(err <= 5.0)
    ));
    out.push_str(&share_table(&r.shares));
    out
}
