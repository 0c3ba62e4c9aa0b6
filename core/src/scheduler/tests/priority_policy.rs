//! Priority as admin policy, under virtual time against the real store: a job's priority is
//! capped at its queue's ceiling when it is ordered and when it preempts (jobs here are
//! committed straight to the store, as a job stored before a ceiling was lowered would be; the
//! objects service refuses them at apply), and a job preempts another namespace's work only
//! where its queue's `preemption` policy says so. Reclaiming borrowed capacity is not limited.

use serde_json::json;
use tb_api::specs::{AllocationPhase, Desired};
use tb_api::status::JobPhase;

use super::{Sim, apply_queue, exec_job};
use crate::scheduler::view::ClusterView;
use crate::scheduler::{order, usage};

/// Two 16Gi Macs, filled by a running 2-rank gang `name` of 12Gi ranks in `namespace`.
fn lab_filled_by(sim: &mut Sim, namespace: &str, name: &str, spec: serde_json::Value) {
    sim.add_node("a", 16);
    sim.add_node("b", 16);
    sim.apply_job_in(namespace, "TrainingJob", name, spec, "");
    sim.settle();
    sim.set_phase(|_| true, AllocationPhase::Running, None, "Started");
    sim.settle();
    assert_eq!(
        sim.job_in(namespace, "TrainingJob", name).phase,
        JobPhase::Running
    );
}

fn job(queue: &str, priority: Option<i32>) -> serde_json::Value {
    let mut spec = exec_job(1, "12Gi");
    spec["queue"] = json!(queue);
    if let Some(p) = priority {
        spec["priority"] = json!(p);
    }
    spec
}

fn stopping(sim: &Sim, job: &str) -> usize {
    sim.allocs()
        .iter()
        .filter(|(_, s, _)| s.job.name == job && s.desired == Desired::Stop)
        .count()
}

#[test]
fn a_priority_above_the_ceiling_is_capped_and_cannot_preempt() {
    let mut sim = Sim::new();
    apply_queue(
        &mut sim,
        "lab",
        json!({"priority": 1, "maxPriority": 5, "namespaces": ["default"]}),
    );
    let mut gang = job("lab", Some(5));
    gang["ranks"] = json!(2);
    lab_filled_by(&mut sim, "default", "running", gang);

    // Asking for i32::MAX counts as 5: no higher than the running gang, so nothing is stopped.
    sim.apply_job("TrainingJob", "fair", job("lab", Some(5)));
    sim.advance(1);
    sim.apply_job("TrainingJob", "greedy", job("lab", Some(i32::MAX)));
    sim.settle();
    assert_eq!(stopping(&sim, "running"), 0);
    assert_eq!(sim.job("TrainingJob", "running").phase, JobPhase::Running);
    assert_eq!(sim.job("TrainingJob", "greedy").reason, "Unschedulable");
    // Ordered at the ceiling too: the older job asking for the ceiling stays ahead of the
    // younger greedy one (by age), and the queue's default priority comes after both.
    sim.advance(1);
    sim.apply_job("TrainingJob", "default-priority", job("lab", None));
    let view = ClusterView::build(&sim.state);
    let shares = usage::fair_shares(&sim.state.usage, &view.queues, sim.now, &sim.cfg);
    let ordered = order::order(sim.state.list("TrainingJob", ""), &view, &shares);
    let names: Vec<&str> = ordered
        .iter()
        .filter(|j| j.metadata.name != "running")
        .map(|j| j.metadata.name.as_str())
        .collect();
    assert_eq!(names, ["fair", "greedy", "default-priority"]);
    let facts =
        |name: &str| view.facts[&("TrainingJob".into(), "default".into(), name.into())].priority;
    assert_eq!(
        (facts("greedy"), facts("fair"), facts("default-priority")),
        (5, 5, 1)
    );

    // The admin raises the ceiling: the same stored job now outranks the gang and preempts it.
    apply_queue(
        &mut sim,
        "lab",
        json!({"priority": 1, "maxPriority": 100, "namespaces": ["default"]}),
    );
    sim.settle();
    assert_eq!(stopping(&sim, "running"), 2, "the whole gang");
    let running = sim.job("TrainingJob", "running");
    assert_eq!(
        (running.phase, running.reason.as_str()),
        (JobPhase::Pending, "Preempted")
    );
    assert!(
        running.message.contains("priority 100 over 5"),
        "the capped figure is what is reported: {}",
        running.message
    );
}

#[test]
fn a_job_in_no_queue_is_capped_at_zero() {
    let mut sim = Sim::new();
    let mut gang = exec_job(2, "12Gi");
    gang["priority"] = json!(0);
    lab_filled_by(&mut sim, "default", "running", gang);
    let mut high = exec_job(1, "12Gi");
    high["priority"] = json!(1000);
    sim.apply_job("TrainingJob", "unqueued", high);
    sim.settle();
    assert_eq!(stopping(&sim, "running"), 0);
    assert_eq!(sim.job("TrainingJob", "unqueued").reason, "Unschedulable");
}

#[test]
fn preemption_across_namespaces_only_where_the_queue_allows_it() {
    let mut sim = Sim::new();
    apply_queue(&mut sim, "research", json!({"namespaces": ["research"]}));
    apply_queue(
        &mut sim,
        "urgent",
        json!({"priority": 10, "namespaces": ["vision"]}),
    );
    let mut gang = job("research", None);
    gang["ranks"] = json!(2);
    lab_filled_by(&mut sim, "research", "running", gang);

    // Higher priority, but another namespace's work and the default policy: nothing stops.
    sim.apply_job_in("vision", "TrainingJob", "urgent", job("urgent", None), "");
    sim.settle();
    assert_eq!(stopping(&sim, "running"), 0);
    assert_eq!(
        sim.job_in("research", "TrainingJob", "running").phase,
        JobPhase::Running
    );
    assert_eq!(
        sim.job_in("vision", "TrainingJob", "urgent").reason,
        "Unschedulable"
    );

    // The admin allows it for the urgent queue: the gang is preempted.
    apply_queue(
        &mut sim,
        "urgent",
        json!({"priority": 10, "namespaces": ["vision"],
               "preemption": {"otherNamespaces": "LowerPriority"}}),
    );
    sim.settle();
    assert_eq!(stopping(&sim, "running"), 2);
    let running = sim.job_in("research", "TrainingJob", "running");
    assert_eq!(
        (running.phase, running.reason.as_str()),
        (JobPhase::Pending, "Preempted")
    );
    sim.obey_stops();
    sim.settle();
    assert_eq!(
        sim.job_in("vision", "TrainingJob", "urgent").phase,
        JobPhase::Scheduled
    );
}

#[test]
fn within_a_namespace_preemption_is_as_before_unless_the_queue_says_never() {
    for (policy, preempts) in [
        (json!({}), true),
        (json!({"withinNamespace": "Never"}), false),
    ] {
        let mut sim = Sim::new();
        apply_queue(&mut sim, "batch", json!({"namespaces": ["default"]}));
        apply_queue(
            &mut sim,
            "urgent",
            json!({"priority": 10, "preemption": policy}),
        );
        let mut gang = job("batch", None);
        gang["ranks"] = json!(2);
        lab_filled_by(&mut sim, "default", "running", gang);
        sim.apply_job("TrainingJob", "urgent", job("urgent", None));
        sim.settle();
        let running = sim.job("TrainingJob", "running");
        if preempts {
            assert_eq!(stopping(&sim, "running"), 2, "{policy}");
            assert_eq!(running.reason, "Preempted", "{policy}");
        } else {
            assert_eq!(stopping(&sim, "running"), 0, "{policy}");
            assert_eq!(running.phase, JobPhase::Running, "{policy}");
            assert_eq!(sim.job("TrainingJob", "urgent").reason, "Unschedulable");
        }
    }
}

#[test]
fn borrowed_capacity_is_reclaimed_across_namespaces_whatever_the_policy() {
    let mut sim = Sim::new();
    apply_queue(
        &mut sim,
        "owner",
        json!({"quota": {"memory": "16Gi"}, "namespaces": ["research"],
               "preemption": {"withinNamespace": "Never"}}),
    );
    apply_queue(
        &mut sim,
        "borrower",
        json!({"quota": {"memory": "8Gi"}, "borrowingLimit": {"memory": "24Gi"},
               "namespaces": ["batch"]}),
    );
    let mut gang = job("borrower", None);
    gang["ranks"] = json!(2);
    lab_filled_by(&mut sim, "batch", "borrowing", gang);
    sim.apply_job_in("research", "TrainingJob", "mine", job("owner", None), "");
    sim.settle();
    let borrowing = sim.job_in("batch", "TrainingJob", "borrowing");
    assert_eq!(
        (borrowing.phase, borrowing.reason.as_str()),
        (JobPhase::Pending, "Reclaimed")
    );
    assert_eq!(stopping(&sim, "borrowing"), 2);
}
