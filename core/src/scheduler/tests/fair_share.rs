//! Fair share, usage accounting, reclaiming borrowed capacity and queue positions, under
//! virtual time against the real store.

use std::collections::BTreeMap;

use serde_json::json;
use tb_api::specs::{AllocationPhase, Desired};
use tb_api::status::JobPhase;

use super::{GI, Sim, apply_queue, exec_job};
use crate::scheduler::view::ClusterView;
use crate::scheduler::{order, time_of, usage};
use crate::store::usage::Amount;

/// Nodelets run what they are given and end each rank once it has run `duration(job)`.
fn play_nodelets(sim: &mut Sim, duration: impl Fn(&str) -> i64) {
    let now = sim.now;
    let mut start = Vec::new();
    let mut end = Vec::new();
    for (obj, spec, status) in sim.allocs() {
        if spec.desired != Desired::Run || status.phase.is_terminal() {
            continue;
        }
        let born = time_of(&obj.metadata.creation_timestamp).unwrap_or(now);
        if (now - born).num_seconds() >= duration(&spec.job.name) {
            end.push(spec.job.name.clone());
        } else if status.phase == AllocationPhase::Pending {
            start.push(spec.job.name.clone());
        }
    }
    let live = |s: &tb_api::specs::AllocationSpec| s.desired == Desired::Run;
    sim.set_phase(
        |s| live(s) && start.contains(&s.job.name),
        AllocationPhase::Running,
        None,
        "Started",
    );
    sim.set_phase(
        |s| live(s) && end.contains(&s.job.name),
        AllocationPhase::Succeeded,
        Some(0),
        "Completed",
    );
}

fn queued_job(queue: &str, memory: &str) -> serde_json::Value {
    let mut job = exec_job(1, memory);
    job["queue"] = json!(queue);
    job["ttlSecondsAfterFinished"] = json!(0);
    job
}

fn pending(sim: &Sim, prefix: &str) -> usize {
    sim.state
        .list("TrainingJob", "default")
        .iter()
        .filter(|j| j.metadata.name.starts_with(prefix))
        .filter(|j| tb_api::status::JobStatus::from_value(&j.status).phase == JobPhase::Pending)
        .count()
}

/// Memory·seconds per queue accounted in the ledger.
fn by_queue(sim: &Sim) -> BTreeMap<String, Amount> {
    let mut out: BTreeMap<String, Amount> = BTreeMap::new();
    for (key, amount) in sim.state.usage.totals_since(i64::MIN / 2) {
        out.entry(key.queue).or_default().add(amount);
    }
    out
}

#[test]
fn two_queues_weighted_one_to_two_get_one_to_two_of_the_memory_time() {
    let mut sim = Sim::new();
    for n in ["m1", "m2", "m3", "m4"] {
        sim.add_node(n, 16);
    }
    apply_queue(&mut sim, "light", json!({"weight": 1}));
    apply_queue(&mut sim, "heavy", json!({"weight": 2}));
    // Deterministic, varied run times (40–160 s) so that gangs do not end in lockstep.
    let duration = |name: &str| {
        let n: i64 = name
            .rsplit('-')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        40 + (n * 37) % 121
    };
    let mut next = 0u32;
    // Four virtual hours, both queues always holding a backlog.
    for _ in 0..(4 * 360) {
        for q in ["light", "heavy"] {
            while pending(&sim, q) < 12 {
                next += 1;
                sim.apply_job("TrainingJob", &format!("{q}-{next}"), queued_job(q, "4Gi"));
            }
        }
        sim.settle();
        sim.run_for(10);
        play_nodelets(&mut sim, duration);
    }
    sim.settle();
    let used = by_queue(&sim);
    let light = used["light"].memory_byte_seconds as f64;
    let heavy = used["heavy"].memory_byte_seconds as f64;
    let ratio = heavy / light;
    assert!(
        (ratio - 2.0).abs() / 2.0 <= 0.10,
        "heavy/light memory·time = {ratio:.3} (light {:.1} GiB·h, heavy {:.1} GiB·h)",
        used["light"].memory_gib_hours(),
        used["heavy"].memory_gib_hours()
    );
    // The cluster was kept busy: 64Gi for four hours, less the first pass.
    let total = (light + heavy) / (64 * GI) as f64 / 3600.0;
    assert!(total > 3.8, "cluster busy for {total:.2} of 4 hours");
    eprintln!("heavy/light memory·time = {ratio:.3} over {total:.2} busy hours");
}

#[test]
fn usage_is_accounted_per_queue_namespace_and_user_in_hourly_buckets() {
    let mut sim = Sim::new();
    sim.add_node("a", 16);
    sim.add_node("b", 16);
    apply_queue(
        &mut sim,
        "research",
        json!({"namespaces": ["default"], "weight": 3}),
    );
    sim.run_for(1800); // start at 00:30 so the run spans two buckets
    sim.apply_job_as("TrainingJob", "train", exec_job(2, "3Gi"), "ana");
    sim.settle();
    sim.run_for(5400);
    sim.settle();
    sim.set_phase(|_| true, AllocationPhase::Succeeded, Some(0), "Completed");
    sim.settle();
    let totals = sim.state.usage.totals_since(0);
    assert_eq!(totals.len(), 1, "{totals:?}");
    let (key, amount) = totals.iter().next().unwrap();
    assert_eq!(
        (
            key.queue.as_str(),
            key.namespace.as_str(),
            key.user.as_str()
        ),
        ("research", "default", "ana")
    );
    assert_eq!(amount.memory_byte_seconds, 6 * GI * 5400);
    assert_eq!(amount.mac_milliseconds, 2 * 5_400_000);
    let buckets: Vec<i64> = sim.state.usage.buckets.keys().map(|(b, _)| *b).collect();
    assert_eq!(buckets.len(), 2, "00:30–02:00 is two hourly buckets");
    // Nothing runs now: no further ticks, and the decayed usage keeps falling.
    assert!(sim.state.usage.rates.is_empty());
    let view = ClusterView::build(&sim.state);
    let before = usage::shares_at(&sim.state.usage, &view.queues, sim.now, &sim.cfg)["research"];
    sim.run_for(3600);
    assert_eq!(sim.settle(), 0, "an idle cluster writes no usage");
    let later = usage::shares_at(&sim.state.usage, &view.queues, sim.now, &sim.cfg)["research"];
    assert!(
        (later - before / 2.0).abs() / before < 0.01,
        "{before} → {later}"
    );
}

#[test]
fn an_owner_under_its_quota_reclaims_what_another_queue_borrowed() {
    let mut sim = Sim::new();
    sim.add_node("a", 16);
    sim.add_node("b", 16);
    apply_queue(&mut sim, "owner", json!({"quota": {"memory": "16Gi"}}));
    apply_queue(
        &mut sim,
        "borrower",
        json!({"quota": {"memory": "8Gi"}, "borrowingLimit": {"memory": "24Gi"}}),
    );
    // The owner is idle: the borrower takes both Macs, 16Gi beyond its quota.
    sim.apply_job("TrainingJob", "big", queued_job("borrower", "12Gi"));
    sim.advance(1);
    sim.apply_job("TrainingJob", "small", queued_job("borrower", "10Gi"));
    sim.settle();
    sim.set_phase(|_| true, AllocationPhase::Running, None, "Started");
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "small").phase, JobPhase::Running);

    // The owner needs 12Gi of its own quota, at the same priority: the cheapest borrowed gang
    // that makes room is stopped and requeued.
    sim.apply_job("TrainingJob", "mine", queued_job("owner", "12Gi"));
    sim.settle();
    let small = sim.job("TrainingJob", "small");
    assert_eq!(
        (small.phase, small.reason.as_str()),
        (JobPhase::Pending, "Reclaimed")
    );
    assert!(small.message.contains("queue owner"), "{}", small.message);
    assert_eq!(sim.job("TrainingJob", "big").phase, JobPhase::Running);
    assert_eq!(
        sim.job("TrainingJob", "mine").reason,
        "WaitingForPreemption"
    );
    sim.obey_stops();
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "mine").phase, JobPhase::Scheduled);
    assert!(sim.events().contains(&"Reclaimed".to_string()));

    // A queue within its quota is not reclaimed from: a second owner job waits.
    sim.apply_job("TrainingJob", "more", queued_job("owner", "4Gi"));
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "big").phase, JobPhase::Running);
}

#[test]
fn positions_follow_priority_then_fair_share_then_age() {
    let mut sim = Sim::new();
    sim.add_node("a", 8);
    apply_queue(&mut sim, "busy", json!({}));
    apply_queue(&mut sim, "idle", json!({}));
    apply_queue(&mut sim, "vip", json!({"priority": 5}));
    sim.apply_job("TrainingJob", "running", queued_job("busy", "8Gi"));
    sim.settle();
    sim.set_phase(|_| true, AllocationPhase::Running, None, "Started");
    sim.run_for(600);
    sim.settle();
    // Queued oldest first; the cluster is full.
    for (name, queue) in [("busy-1", "busy"), ("idle-1", "idle"), ("vip-1", "vip")] {
        sim.apply_job("TrainingJob", name, queued_job(queue, "8Gi"));
        sim.advance(1);
    }
    sim.settle();
    let view = ClusterView::build(&sim.state);
    let shares = usage::shares_at(&sim.state.usage, &view.queues, sim.now, &sim.cfg);
    assert!(shares["busy"] > 0.0 && shares["idle"] == 0.0, "{shares:?}");
    let jobs = sim.state.list("TrainingJob", "");
    let fair = usage::fair_shares(&sim.state.usage, &view.queues, sim.now, &sim.cfg);
    let ordered = order::order(jobs, &view, &fair);
    let positions = order::positions(&ordered);
    let at = |name: &str| positions[&("TrainingJob".into(), "default".into(), name.into())];
    // vip-1 preempted the running job (lower priority), which waits again in its queue's
    // place: behind the idle queue, ahead of its younger queue-mate.
    assert_eq!(sim.job("TrainingJob", "running").reason, "Preempted");
    assert_eq!(
        (at("vip-1"), at("idle-1"), at("running"), at("busy-1")),
        (1, 2, 3, 4),
        "{positions:?}"
    );
}
