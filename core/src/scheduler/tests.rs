//! The scheduler driven against a real `State` under virtual time: plans are committed through
//! the same store code Raft applies, nodelets are played by status writes.

use serde_json::{Value, json};
use tb_api::specs::{AllocationPhase, Desired, parse_spec};
use tb_api::status::{JobPhase, JobStatus, NodeStatus};
use tb_api::{Kind, Object, ObjectKey, ObjectMeta};

use super::{Clock, reconcile};
use crate::store::{Op, Response};

mod fair_share;
mod priority_policy;

pub(crate) use crate::sim::Sim;

const GI: u64 = 1 << 30;

/// Jobs as a user applies them, and what the store says of them.
impl Sim {
    fn apply_job(&mut self, kind: &str, name: &str, spec: Value) {
        self.apply_job_as(kind, name, spec, "");
    }

    fn apply_job_as(&mut self, kind: &str, name: &str, spec: Value, user: &str) {
        self.apply_job_in("default", kind, name, spec, user);
    }

    fn apply_job_in(&mut self, namespace: &str, kind: &str, name: &str, spec: Value, user: &str) {
        let obj = Object {
            api_version: "tb/v1".into(),
            kind: kind.into(),
            metadata: ObjectMeta {
                name: name.into(),
                namespace: namespace.into(),
                ..Default::default()
            },
            spec,
            status: Value::Null,
        };
        let obj = tb_api::validate_object(&obj).expect("valid job");
        let r = self.commit_as(Op::Apply { objects: vec![obj] }, user);
        assert!(matches!(r, Response::Applied { .. }), "{r:?}");
    }

    fn job(&self, kind: &str, name: &str) -> JobStatus {
        self.job_in("default", kind, name)
    }

    fn job_in(&self, namespace: &str, kind: &str, name: &str) -> JobStatus {
        let key = ObjectKey {
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        };
        JobStatus::from_value(&self.state.get(&key).expect("job exists").status)
    }
}

fn exec_job(ranks: u32, memory: &str) -> Value {
    json!({"command": ["python3", "train.py"], "ranks": ranks, "memory": memory, "backoffLimit": 2})
}

/// Three idle Macs, one with far more memory than the others: a 2-rank exec gang gets two
/// Macs, not two slots on the roomiest one; three ranks get all three.
#[test]
fn exec_ranks_spread_over_idle_macs_whatever_their_free_memory() {
    let mut sim = Sim::new();
    sim.add_node("big", 64);
    sim.add_node("m2", 24);
    sim.add_node("m3", 24);
    sim.apply_job("TrainingJob", "two", exec_job(2, "1Gi"));
    sim.apply_job("TrainingJob", "three", exec_job(3, "1Gi"));
    sim.settle();
    for (job, ranks) in [("two", 2usize), ("three", 3)] {
        let mut nodes: Vec<String> = sim
            .allocs()
            .into_iter()
            .filter(|a| a.1.job.name == job)
            .map(|a| a.1.node)
            .collect();
        assert_eq!(nodes.len(), ranks, "{job}");
        nodes.sort();
        nodes.dedup();
        assert_eq!(nodes.len(), ranks, "{job}: one rank per Mac, got {nodes:?}");
    }
}

#[test]
fn gang_runs_to_completion() {
    let mut sim = Sim::new();
    for n in ["a", "b", "c"] {
        sim.add_node(n, 16);
    }
    sim.apply_job("TrainingJob", "train", exec_job(3, "4Gi"));
    sim.settle();
    let status = sim.job("TrainingJob", "train");
    assert_eq!(status.phase, JobPhase::Scheduled);
    assert_eq!(status.epoch, 1);
    let allocs = sim.allocs();
    assert_eq!(allocs.len(), 3);
    let mut nodes: Vec<_> = allocs.iter().map(|a| a.1.node.clone()).collect();
    nodes.sort();
    assert_eq!(
        nodes,
        ["a", "b", "c"],
        "one rank per Mac while they have room"
    );
    let mlx = allocs[0].1.mlx.clone().unwrap();
    assert_eq!(mlx.hosts.len(), 3);
    assert!(mlx.hosts.iter().all(|h| h.ends_with(":32323")));

    sim.set_phase(|_| true, AllocationPhase::Running, None, "");
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "train").phase, JobPhase::Running);
    sim.set_phase(|_| true, AllocationPhase::Succeeded, Some(0), "Completed");
    sim.settle();
    let status = sim.job("TrainingJob", "train");
    assert_eq!(status.phase, JobPhase::Succeeded);
    assert_eq!(
        status.condition("Complete").map(|c| c.status.as_str()),
        Some("True")
    );
    assert_eq!(sim.settle(), 0, "nothing left to do");
    assert!(sim.events().contains(&"Completed".to_string()));
}

#[test]
fn failed_rank_restarts_the_gang_with_backoff_until_the_limit() {
    let mut sim = Sim::new();
    for n in ["a", "b"] {
        sim.add_node(n, 16);
    }
    sim.apply_job("TrainingJob", "train", exec_job(2, "1Gi"));
    sim.settle();
    for restart in 1..=2u32 {
        sim.set_phase(
            |s| s.desired == Desired::Run,
            AllocationPhase::Running,
            None,
            "",
        );
        sim.set_phase(
            |s| s.rank == 1 && s.desired == Desired::Run,
            AllocationPhase::Failed,
            Some(1),
            "Error",
        );
        sim.settle();
        let status = sim.job("TrainingJob", "train");
        assert_eq!(status.phase, JobPhase::Pending, "restart {restart}");
        assert_eq!(status.reason, "BackOff");
        assert_eq!(status.restarts, restart);
        let epoch = status.epoch;
        // Rank 0 is told to stop too: the gang restarts whole.
        assert!(sim.allocs().iter().all(|a| a.1.epoch != epoch
            || a.1.desired == Desired::Stop
            || a.2.phase.is_terminal()));
        sim.obey_stops();
        let wait = 10 * 2i64.pow(restart - 1);
        sim.run_for(wait - 1);
        sim.settle();
        assert_eq!(
            sim.job("TrainingJob", "train").epoch,
            epoch,
            "still backing off"
        );
        sim.run_for(1);
        sim.settle();
        let status = sim.job("TrainingJob", "train");
        assert_eq!(
            status.epoch,
            epoch + 1,
            "placed again after {wait}s: {status:?}"
        );
        assert_eq!(status.phase, JobPhase::Scheduled);
        assert!(
            sim.allocs().iter().all(|a| a.1.epoch == epoch + 1),
            "old epoch deleted once stopped"
        );
    }
    sim.set_phase(|_| true, AllocationPhase::Failed, Some(1), "Error");
    sim.settle();
    let status = sim.job("TrainingJob", "train");
    assert_eq!(status.phase, JobPhase::Failed);
    assert_eq!(status.reason, "BackoffLimitExceeded");
    assert_eq!(
        status.restarts, 2,
        "restarts counts the restarts that happened"
    );
}

#[test]
fn a_gang_that_ran_healthy_for_the_reset_period_backs_off_from_the_start_again() {
    let mut sim = Sim::new();
    for n in ["a", "b"] {
        sim.add_node(n, 16);
    }
    sim.apply_job(
        "TrainingJob",
        "train",
        json!({"command": ["python3", "train.py"], "ranks": 2, "memory": "1Gi", "backoffLimit": 10}),
    );
    sim.settle();
    // Three quick failures in a row: 10 s, 20 s, 40 s (a service restarts the same way).
    let mut delays = Vec::new();
    for _ in 0..3 {
        sim.set_phase(
            |s| s.desired == Desired::Run,
            AllocationPhase::Running,
            None,
            "",
        );
        sim.settle();
        sim.set_phase(
            |s| s.rank == 1 && s.desired == Desired::Run,
            AllocationPhase::Failed,
            Some(1),
            "Error",
        );
        sim.settle();
        let status = sim.job("TrainingJob", "train");
        delays.push(retry_delay(&sim, &status));
        sim.obey_stops();
        sim.run_for(300);
        sim.settle();
    }
    assert_eq!(delays, [10, 20, 40]);
    // Then it runs well for more than ten minutes before failing: the delay is the first one.
    sim.set_phase(
        |s| s.desired == Desired::Run,
        AllocationPhase::Running,
        None,
        "",
    );
    sim.settle();
    let status = sim.job("TrainingJob", "train");
    assert!(status.running_since.is_some(), "{status:?}");
    sim.run_for(601);
    sim.settle();
    sim.set_phase(
        |s| s.rank == 1 && s.desired == Desired::Run,
        AllocationPhase::Failed,
        Some(1),
        "Error",
    );
    sim.settle();
    let status = sim.job("TrainingJob", "train");
    assert_eq!(retry_delay(&sim, &status), 10, "{status:?}");
    assert_eq!(status.restarts, 4, "restarts still counts every restart");
    assert_eq!(status.failure_streak, 1);
}

#[test]
fn a_backoff_does_not_last_an_hour_when_the_leaders_clock_goes_back_an_hour() {
    let mut sim = Sim::new();
    for n in ["a", "b"] {
        sim.add_node(n, 16);
    }
    sim.apply_job("TrainingJob", "train", exec_job(2, "1Gi"));
    sim.settle();
    sim.set_phase(|_| true, AllocationPhase::Running, None, "");
    sim.settle();
    sim.set_phase(
        |s| s.rank == 1 && s.desired == Desired::Run,
        AllocationPhase::Failed,
        Some(1),
        "Error",
    );
    sim.settle();
    let status = sim.job("TrainingJob", "train");
    let epoch = status.epoch;
    assert_eq!(retry_delay(&sim, &status), 10, "{status:?}");
    sim.obey_stops();
    sim.settle();
    // The clock goes back an hour: the retry now looks an hour and 10 s away.
    sim.now -= chrono::TimeDelta::hours(1);
    sim.run_for(2);
    sim.settle();
    let status = sim.job("TrainingJob", "train");
    assert_eq!(
        status.epoch,
        epoch + 1,
        "placed again instead of waiting out the jump: {status:?}"
    );
}

#[test]
fn a_gang_is_placed_again_only_once_its_old_ranks_have_stopped() {
    let mut sim = Sim::new();
    for n in ["a", "b", "c"] {
        sim.add_node(n, 16);
    }
    let mut job = exec_job(2, "1Gi");
    job["exclusive"] = json!(true);
    sim.apply_job("TrainingJob", "train", job);
    sim.settle();
    sim.set_phase(|_| true, AllocationPhase::Running, None, "");
    sim.settle();
    let epoch = sim.job("TrainingJob", "train").epoch;
    sim.set_phase(
        |s| s.rank == 1 && s.desired == Desired::Run,
        AllocationPhase::Failed,
        Some(1),
        "Error",
    );
    sim.settle();
    // Rank 0 is told to stop but its nodelet has not said it stopped: the backoff passes, and
    // still no new gang (its rank 0 might land on another Mac while the old one runs).
    sim.run_for(30);
    sim.settle();
    let status = sim.job("TrainingJob", "train");
    assert_eq!(
        status.epoch, epoch,
        "placed beside a running rank: {status:?}"
    );
    let live: Vec<_> = sim
        .allocs()
        .into_iter()
        .filter(|(_, _, st)| !st.phase.is_terminal())
        .map(|(_, spec, _)| (spec.rank, spec.epoch, spec.desired))
        .collect();
    assert_eq!(live, vec![(0, epoch, Desired::Stop)]);
    // Once it has stopped, the gang is placed at once.
    sim.obey_stops();
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "train").epoch, epoch + 1);
}

/// Seconds from now (the failure) to the job's next retry.
fn retry_delay(sim: &Sim, status: &JobStatus) -> i64 {
    let next = status.next_retry_time.as_ref().expect("nextRetryTime").at();
    next.signed_duration_since(sim.now).num_seconds()
}

#[test]
fn a_stage_that_saw_its_peer_go_is_not_blamed_when_the_peers_mac_is_lost() {
    let mut sim = Sim::new();
    for n in ["a", "b", "c"] {
        sim.add_node(n, 16);
    }
    sim.apply_job("TrainingJob", "train", exec_job(2, "4Gi"));
    sim.settle();
    sim.set_phase(|_| true, AllocationPhase::Running, None, "");
    sim.settle();
    let status = sim.job("TrainingJob", "train");
    let (epoch, lost_node) = (status.epoch, status.nodes[1].clone());
    let alive: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|n| n.to_string())
        .filter(|n| *n != lost_node)
        .collect();
    // Rank 1's Mac falls silent; rank 0 notices its peer gone at once.
    sim.set_phase(
        |s| s.rank == 0,
        AllocationPhase::Failed,
        Some(1),
        "PeerLost",
    );
    sim.settle();
    let status = sim.job("TrainingJob", "train");
    assert_eq!(status.epoch, epoch, "waits for the culprit: {status:?}");
    assert_eq!(status.restarts, 0);
    for _ in 0..6 {
        sim.advance(2);
        for n in &alive {
            sim.heartbeat(n);
        }
        sim.settle();
    }
    sim.obey_stops();
    sim.settle();
    let status = sim.job("TrainingJob", "train");
    assert_eq!(status.epoch, epoch + 1, "placed again at once: {status:?}");
    assert_eq!(status.restarts, 0, "a lost Mac uses no retry");
    assert_eq!(status.failure_streak, 0);
    assert!(!status.nodes.contains(&lost_node), "{:?}", status.nodes);
}

#[test]
fn a_peer_lost_with_no_culprit_within_the_grace_counts_as_a_failure() {
    let mut sim = Sim::new();
    for n in ["a", "b"] {
        sim.add_node(n, 16);
    }
    sim.apply_job("TrainingJob", "train", exec_job(2, "1Gi"));
    sim.settle();
    sim.set_phase(|_| true, AllocationPhase::Running, None, "");
    sim.settle();
    sim.set_phase(
        |s| s.rank == 0,
        AllocationPhase::Failed,
        Some(1),
        "PeerLost",
    );
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "train").restarts, 0, "waiting");
    // Every Mac keeps heartbeating and rank 1 says nothing: after the wait (1.5 node graces),
    // rank 0's end is the gang's.
    sim.run_for(14);
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "train").restarts, 0, "still waiting");
    sim.run_for(2);
    sim.settle();
    let status = sim.job("TrainingJob", "train");
    assert_eq!(status.restarts, 1, "{status:?}");
    assert_eq!(status.reason, "BackOff");
}

#[test]
fn missing_command_fails_at_once() {
    let mut sim = Sim::new();
    sim.add_node("a", 16);
    sim.apply_job("TrainingJob", "train", exec_job(1, "1Gi"));
    sim.settle();
    sim.set_phase(|_| true, AllocationPhase::Failed, None, "ExecNotFound");
    sim.settle();
    let status = sim.job("TrainingJob", "train");
    assert_eq!(status.phase, JobPhase::Failed);
    assert_eq!(status.reason, "ExecNotFound");
    assert_eq!(status.restarts, 0);
}

#[test]
fn lost_node_moves_the_gang_without_using_a_retry() {
    let mut sim = Sim::new();
    for n in ["a", "b", "c"] {
        sim.add_node(n, 16);
    }
    sim.apply_job("TrainingJob", "train", exec_job(3, "4Gi"));
    sim.settle();
    sim.set_phase(|_| true, AllocationPhase::Running, None, "");
    sim.settle();
    // b falls silent; a and c keep heartbeating.
    for _ in 0..6 {
        sim.advance(2);
        sim.heartbeat("a");
        sim.heartbeat("c");
        sim.settle();
    }
    assert!(
        !NodeStatus::from_value(&sim.node("b").status).is_ready(),
        "b is NotReady after the grace"
    );
    assert!(NodeStatus::from_value(&sim.node("a").status).is_ready());
    sim.obey_stops();
    sim.settle();
    let status = sim.job("TrainingJob", "train");
    assert_eq!(status.epoch, 2, "{status:?}");
    assert_eq!(status.restarts, 0);
    let live: Vec<_> = sim
        .allocs()
        .into_iter()
        .filter(|a| a.1.epoch == 2)
        .collect();
    assert_eq!(live.len(), 3);
    assert!(
        live.iter().all(|a| a.1.node != "b"),
        "nothing placed on the lost Mac"
    );
    assert!(sim.events().contains(&"NodeNotReady".to_string()));
}

#[test]
fn new_leader_waits_a_grace_before_judging_nodes() {
    let mut sim = Sim::new();
    sim.add_node("a", 16);
    sim.advance(600);
    sim.leader_since = sim.now;
    sim.settle();
    assert!(
        NodeStatus::from_value(&sim.node("a").status).is_ready(),
        "no heartbeat was due to this leader yet"
    );
    sim.advance(11);
    sim.settle();
    assert!(!NodeStatus::from_value(&sim.node("a").status).is_ready());
}

#[test]
fn too_big_stays_pending_with_the_reason() {
    let mut sim = Sim::new();
    sim.add_node("a", 8);
    sim.add_node("b", 8);
    sim.apply_job("TrainingJob", "big", exec_job(2, "12Gi"));
    sim.settle();
    let status = sim.job("TrainingJob", "big");
    assert_eq!(status.phase, JobPhase::Pending);
    assert_eq!(status.reason, "Unschedulable");
    assert!(
        status.message.contains("a has 8Gi free (4Gi short)"),
        "{}",
        status.message
    );
    assert!(sim.allocs().is_empty(), "all or nothing");
    let events = sim
        .events()
        .iter()
        .filter(|r| *r == "FailedScheduling")
        .count();
    sim.settle();
    assert_eq!(
        sim.events()
            .iter()
            .filter(|r| *r == "FailedScheduling")
            .count(),
        events,
        "no repeat while unchanged"
    );
}

#[test]
fn memory_is_never_overcommitted() {
    let mut sim = Sim::new();
    sim.add_node("a", 10);
    sim.apply_job("TrainingJob", "one", exec_job(1, "6Gi"));
    sim.apply_job("TrainingJob", "two", exec_job(1, "6Gi"));
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "one").phase, JobPhase::Scheduled);
    assert_eq!(sim.job("TrainingJob", "two").phase, JobPhase::Pending);
    sim.set_phase(|_| true, AllocationPhase::Succeeded, Some(0), "");
    sim.settle();
    assert_eq!(
        sim.job("TrainingJob", "two").phase,
        JobPhase::Scheduled,
        "placed once the memory was freed"
    );
}

#[test]
fn deleted_job_has_its_allocations_stopped_then_removed() {
    let mut sim = Sim::new();
    sim.add_node("a", 10);
    sim.apply_job("TrainingJob", "gone", exec_job(1, "1Gi"));
    sim.settle();
    let key = ObjectKey {
        kind: "TrainingJob".into(),
        namespace: "default".into(),
        name: "gone".into(),
    };
    sim.commit(Op::Delete {
        key,
        resource_version: 0,
    });
    sim.settle();
    assert!(sim.allocs().iter().all(|a| a.1.desired == Desired::Stop));
    sim.obey_stops();
    sim.settle();
    assert!(sim.allocs().is_empty());
}

#[test]
fn ttl_deletes_a_finished_job() {
    let mut sim = Sim::new();
    sim.add_node("a", 10);
    let mut spec = exec_job(1, "1Gi");
    spec["ttlSecondsAfterFinished"] = json!(30);
    sim.apply_job("TrainingJob", "short", spec);
    sim.settle();
    sim.set_phase(|_| true, AllocationPhase::Succeeded, Some(0), "");
    sim.settle();
    sim.advance(31);
    sim.settle();
    let key = ObjectKey {
        kind: "TrainingJob".into(),
        namespace: "default".into(),
        name: "short".into(),
    };
    assert!(sim.state.get(&key).is_none());
    assert!(sim.allocs().is_empty());
}

#[test]
fn draining_a_node_moves_its_work() {
    let mut sim = Sim::new();
    sim.add_node("a", 16);
    sim.add_node("b", 16);
    sim.apply_job("TrainingJob", "train", exec_job(1, "1Gi"));
    sim.settle();
    sim.set_phase(|_| true, AllocationPhase::Running, None, "");
    sim.settle();
    let on = sim.allocs()[0].1.node.clone();
    let mut node = sim.node(&on);
    node.spec = json!({"unschedulable": true, "taints": ["tb/drain=true:NoExecute"]});
    let r = sim.commit(Op::Apply {
        objects: vec![tb_api::validate_object(&node).unwrap()],
    });
    assert!(matches!(r, Response::Applied { .. }), "{r:?}");
    sim.settle();
    sim.obey_stops();
    sim.settle();
    let status = sim.job("TrainingJob", "train");
    assert_eq!(status.epoch, 2);
    assert_eq!(status.restarts, 0);
    assert!(
        sim.allocs()
            .iter()
            .filter(|a| a.1.epoch == 2)
            .all(|a| a.1.node != on)
    );
}

// ---- topology: links joined from ports, models placed along them ----

/// Cable `x/px` to `y/py` by giving both nodes a port that names the other.
fn cable(sim: &mut Sim, x: &str, px: &str, y: &str, py: &str) {
    use tb_api::status::PortStatus;
    for (here, port, there, peer) in [(x, px, y, py), (y, py, x, px)] {
        let mut status = NodeStatus::from_value(&sim.node(here).status);
        status.capacity.memory_bandwidth_gbps = Some(546.0);
        status.ports.push(PortStatus {
            name: port.into(),
            address: Some(format!("10.9.{}.1", status.ports.len())),
            uuid: format!("{here}/{port}"),
            peer_uuid: Some(format!("{there}/{peer}")),
            speed_gbps: Some(80.0),
            ..Default::default()
        });
        let r = sim.commit(Op::Heartbeat {
            node: here.into(),
            credential_hash: format!("c-{here}"),
            status: status.to_value(),
        });
        assert!(matches!(r, Response::Status { .. }), "{r:?}");
    }
}

/// Play the probing nodelet: record measured figures on the Link between `x` and `y`.
fn measure(sim: &mut Sim, x: &str, y: &str, gbps: f64, latency_us: f64) {
    let links = sim.state.list(Kind::Link.as_str(), "");
    let link = links
        .iter()
        .find(|l| {
            let spec: tb_api::specs::LinkSpec = parse_spec(&l.spec).unwrap();
            let nodes = [spec.a.node.as_str(), spec.b.node.as_str()];
            nodes == [x, y] || nodes == [y, x]
        })
        .expect("the link exists");
    let status = tb_api::specs::LinkStatus {
        bandwidth_gbps: Some(gbps),
        latency_us_p50: Some(latency_us),
        latency_us_p99: Some(latency_us * 2.0),
        round_trips: 200,
        streams: 4,
        ..Default::default()
    };
    let r = sim.commit(Op::UpdateStatus {
        key: link.key(),
        status: status.to_value(),
        resource_version: 0,
    });
    assert!(matches!(r, Response::Status { .. }), "{r:?}");
}

fn apply_model(sim: &mut Sim, name: &str, layers: u32, bytes_per_layer: &str) {
    let obj = Object {
        api_version: "tb/v1".into(),
        kind: "Model".into(),
        metadata: ObjectMeta {
            name: name.into(),
            namespace: "default".into(),
            ..Default::default()
        },
        spec: json!({"format": "gguf", "source": {"path": "/models/m.gguf"}, "layers": layers,
                     "bytesPerLayer": bytes_per_layer, "hiddenSize": 4096, "heads": 32,
                     "kvHeads": 8, "contextLength": 4096}),
        status: Value::Null,
    };
    let obj = tb_api::validate_object(&obj).expect("valid model");
    let r = sim.commit(Op::Apply { objects: vec![obj] });
    assert!(matches!(r, Response::Applied { .. }), "{r:?}");
}

/// Four Macs cabled as a fast ring a–b–c–d–a, plus two slow diagonals a–c and b–d.
fn ring_with_slow_diagonals() -> Sim {
    let mut sim = Sim::new();
    for n in ["a", "b", "c", "d"] {
        sim.add_node(n, 40);
    }
    cable(&mut sim, "a", "tb1", "b", "tb1");
    cable(&mut sim, "b", "tb2", "c", "tb1");
    cable(&mut sim, "c", "tb2", "d", "tb1");
    cable(&mut sim, "d", "tb2", "a", "tb2");
    cable(&mut sim, "a", "tb3", "c", "tb3");
    cable(&mut sim, "b", "tb3", "d", "tb3");
    sim.settle();
    for (x, y) in [("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")] {
        measure(&mut sim, x, y, 80.0, 10.0);
    }
    for (x, y) in [("a", "c"), ("b", "d")] {
        measure(&mut sim, x, y, 1.0, 2000.0);
    }
    sim
}

#[test]
fn links_are_joined_from_ports() {
    let sim = ring_with_slow_diagonals();
    let mut names: Vec<String> = sim
        .state
        .list(Kind::Link.as_str(), "")
        .iter()
        .map(|l| l.metadata.name.clone())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "a.tb1.b.tb1",
            "a.tb2.d.tb2",
            "a.tb3.c.tb3",
            "b.tb2.c.tb1",
            "b.tb3.d.tb3",
            "c.tb2.d.tb1"
        ]
    );
}

#[test]
fn a_model_too_big_for_three_macs_is_pipelined_along_the_fast_ring() {
    let mut sim = ring_with_slow_diagonals();
    // 80 layers × 1.5Gi = 120Gi: more than three 40Gi Macs hold.
    apply_model(&mut sim, "big", 80, "1.5Gi");
    sim.apply_job(
        "InferenceService",
        "serve",
        json!({"model": "big", "executor": "exec", "command": ["python3", "serve.py"],
               "parallelism": "pipeline", "context": 1024}),
    );
    sim.settle();
    let status = sim.job("InferenceService", "serve");
    assert_eq!(status.phase, JobPhase::Scheduled, "{}", status.message);
    let order = status.nodes.clone();
    assert_eq!(order.len(), 4, "{order:?}");
    let fast = |x: &str, y: &str| {
        matches!(
            (x, y),
            ("a", "b")
                | ("b", "c")
                | ("c", "d")
                | ("d", "a")
                | ("b", "a")
                | ("c", "b")
                | ("d", "c")
                | ("a", "d")
        )
    };
    for w in order.windows(2) {
        assert!(
            fast(&w[0], &w[1]),
            "hop {}→{} is a slow diagonal: {order:?}",
            w[0],
            w[1]
        );
    }
    let placed = status.model_placement.expect("the placement is shown");
    assert!(placed.ring && placed.predicted_tokens_per_second > 0.0);
    // Every layer once, in rank order, and the ranks are told theirs.
    let mut allocs = sim.allocs();
    allocs.sort_by_key(|a| a.1.rank);
    let mut next = 0;
    for (_, spec, _) in &allocs {
        let layers = spec.layers.expect("layer range");
        assert_eq!(layers.first, next);
        assert_eq!(spec.env["TB_LAYER_FIRST"], layers.first.to_string());
        assert_eq!(spec.world_size, 4);
        assert!(spec.memory_bytes <= 40 * GI);
        next += layers.count;
    }
    assert_eq!(next, 80);
}

#[test]
fn a_service_waits_for_its_model_and_says_what_is_short() {
    let mut sim = ring_with_slow_diagonals();
    sim.apply_job(
        "InferenceService",
        "serve",
        json!({"model": "huge", "executor": "exec", "command": ["serve"]}),
    );
    sim.settle();
    let status = sim.job("InferenceService", "serve");
    assert_eq!(
        (status.phase, status.reason.as_str()),
        (JobPhase::Pending, "ModelNotFound")
    );
    // 200 layers × 1Gi cannot fit on 160Gi of Macs: Unschedulable, with how much is short.
    apply_model(&mut sim, "huge", 200, "1Gi");
    sim.settle();
    let status = sim.job("InferenceService", "serve");
    assert_eq!(status.reason, "Unschedulable");
    assert!(status.message.contains("short"), "{}", status.message);
    assert!(sim.allocs().is_empty());
}

#[test]
fn exec_ranks_follow_the_cables_and_jaccl_gets_the_device_matrix() {
    let mut sim = Sim::new();
    for n in ["a", "b", "c"] {
        sim.add_node(n, 16);
    }
    // A daisy chain b – a – c: rank order must follow it.
    cable(&mut sim, "b", "tb1", "a", "tb1");
    cable(&mut sim, "a", "tb2", "c", "tb1");
    sim.settle();
    sim.apply_job("TrainingJob", "train", exec_job(3, "4Gi"));
    sim.settle();
    let order = sim.job("TrainingJob", "train").nodes;
    assert_eq!(
        order[1], "a",
        "the middle of the chain is the middle rank: {order:?}"
    );
    // JACCL needs RDMA devices on the cables; these ports have none.
    let mut spec = exec_job(2, "4Gi");
    spec["backend"] = json!("jaccl");
    sim.apply_job("TrainingJob", "rdma", spec);
    sim.settle();
    let status = sim.job("TrainingJob", "rdma");
    assert_eq!(status.reason, "Unschedulable");
    assert!(
        status.message.contains("needs an RDMA cable"),
        "{}",
        status.message
    );
}

// ---- schedules: cron runs committed with the slot they answer ----

fn apply_schedule(sim: &mut Sim, name: &str, extra: Value) {
    let mut spec = json!({"schedule": "* * * * *",
        "jobTemplate": {"spec": {"command": ["python3", "tune.py"], "memory": "1Gi"}}});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    sim.apply_job("Schedule", name, spec);
}

fn schedule_runs(sim: &Sim, name: &str) -> Vec<String> {
    let mut names: Vec<String> = sim
        .state
        .list("TrainingJob", "default")
        .iter()
        .filter(|j| j.metadata.labels.get("tb/schedule").map(String::as_str) == Some(name))
        .map(|j| j.metadata.name.clone())
        .collect();
    names.sort();
    names
}

/// Play the nodelets for a schedule's runs: mark every allocation of `job` Succeeded.
fn finish_job(sim: &mut Sim, job: &str) {
    let job = job.to_string();
    sim.set_phase(
        |s| s.job.name == job,
        AllocationPhase::Succeeded,
        Some(0),
        "Completed",
    );
    sim.settle();
}

#[test]
fn a_schedule_runs_each_slot_once() {
    let mut sim = Sim::new();
    sim.add_node("a", 16);
    apply_schedule(&mut sim, "tune", json!({}));
    sim.settle();
    assert!(
        schedule_runs(&sim, "tune").is_empty(),
        "no slot has passed yet"
    );
    sim.run_for(60);
    sim.settle();
    sim.run_for(60);
    sim.settle();
    let runs = schedule_runs(&sim, "tune");
    assert_eq!(runs.len(), 2, "{runs:?}");
    // Settling again at the same time starts nothing more.
    sim.settle();
    assert_eq!(schedule_runs(&sim, "tune").len(), 2);
    assert!(sim.events().contains(&"SuccessfulCreate".to_string()));
}

#[test]
fn forbid_skips_while_a_run_is_active_and_replace_replaces_it() {
    let mut sim = Sim::new();
    sim.add_node("a", 16);
    apply_schedule(&mut sim, "forbid", json!({"concurrencyPolicy": "Forbid"}));
    apply_schedule(&mut sim, "replace", json!({"concurrencyPolicy": "Replace"}));
    sim.run_for(60);
    sim.settle();
    let first_forbid = schedule_runs(&sim, "forbid");
    let first_replace = schedule_runs(&sim, "replace");
    assert_eq!((first_forbid.len(), first_replace.len()), (1, 1));
    sim.run_for(60);
    sim.settle();
    sim.obey_stops();
    sim.settle();
    assert_eq!(
        schedule_runs(&sim, "forbid"),
        first_forbid,
        "Forbid: still one run"
    );
    assert!(sim.events().contains(&"JobSkipped".to_string()));
    let replaced = schedule_runs(&sim, "replace");
    assert_eq!(replaced.len(), 1);
    assert_ne!(replaced, first_replace, "Replace: the old run gave way");
    // Once the Forbid run finishes, the next slot runs.
    finish_job(&mut sim, &first_forbid[0]);
    sim.run_for(60);
    sim.settle();
    assert_eq!(schedule_runs(&sim, "forbid").len(), 2);
}

#[test]
fn downtime_runs_the_latest_missed_slot_once_and_reports_the_rest() {
    let mut sim = Sim::new();
    sim.add_node("a", 16);
    apply_schedule(&mut sim, "tune", json!({}));
    sim.settle();
    // The controllers are down for three slots and a half: nothing reconciles.
    sim.advance(210);
    sim.leader_since = sim.now;
    sim.settle();
    let runs = schedule_runs(&sim, "tune");
    assert_eq!(runs.len(), 1, "one catch-up run: {runs:?}");
    assert!(sim.events().contains(&"MissedSchedule".to_string()));
    let key = ObjectKey {
        kind: "Schedule".into(),
        namespace: "default".into(),
        name: "tune".into(),
    };
    let status = tb_api::specs::ScheduleStatus::from_value(&sim.state.get(&key).unwrap().status);
    assert_eq!(status.active, runs);
    assert!(
        status
            .last_schedule_time
            .as_ref()
            .is_some_and(|t| t.as_str().ends_with(":03:00.000Z")),
        "{status:?}"
    );
}

#[test]
fn a_slot_past_its_starting_deadline_is_skipped() {
    let mut sim = Sim::new();
    sim.add_node("a", 16);
    apply_schedule(&mut sim, "tune", json!({"startingDeadlineSeconds": 20}));
    sim.settle();
    sim.advance(90); // the 1-minute slot is 30 s old
    sim.settle();
    assert!(schedule_runs(&sim, "tune").is_empty());
    assert!(sim.events().contains(&"MissedSchedule".to_string()));
}

#[test]
fn two_leaders_planning_the_same_slot_start_one_job() {
    let mut sim = Sim::new();
    sim.add_node("a", 16);
    apply_schedule(&mut sim, "tune", json!({}));
    sim.settle();
    sim.run_for(60);
    // The old leader and the new one both plan from the same state; Raft commits both plans in
    // turn. The second must fail its guards.
    let clock = Clock::new(sim.now, sim.leader_since);
    let first = super::schedules::reconcile_schedules(&sim.state, &clock);
    let second = super::schedules::reconcile_schedules(&sim.state, &clock);
    assert_eq!((first.len(), second.len()), (1, 1));
    for plan in first.into_iter().chain(second) {
        sim.commit(Op::Plan(plan));
    }
    assert_eq!(schedule_runs(&sim, "tune").len(), 1);
}

#[test]
fn finished_runs_beyond_the_history_limits_are_deleted() {
    let mut sim = Sim::new();
    sim.add_node("a", 16);
    apply_schedule(&mut sim, "tune", json!({"successfulJobsHistoryLimit": 1}));
    sim.settle();
    for _ in 0..3 {
        sim.run_for(60);
        sim.settle();
        for run in schedule_runs(&sim, "tune") {
            finish_job(&mut sim, &run);
        }
    }
    sim.settle();
    let runs = schedule_runs(&sim, "tune");
    assert_eq!(runs.len(), 1, "only the latest success is kept: {runs:?}");
}

// ---- queues: quota admission and priority order ----

fn apply_queue(sim: &mut Sim, name: &str, spec: Value) {
    let obj = Object {
        api_version: "tb/v1".into(),
        kind: "Queue".into(),
        metadata: ObjectMeta {
            name: name.into(),
            ..Default::default()
        },
        spec,
        status: Value::Null,
    };
    let obj = tb_api::validate_object(&obj).expect("valid queue");
    let r = sim.commit(Op::Apply { objects: vec![obj] });
    assert!(matches!(r, Response::Applied { .. }), "{r:?}");
}

#[test]
fn a_queue_quota_holds_jobs_until_its_work_ends() {
    let mut sim = Sim::new();
    for n in ["a", "b", "c"] {
        sim.add_node(n, 16);
    }
    apply_queue(
        &mut sim,
        "research",
        json!({"quota": {"memory": "8Gi"}, "namespaces": ["default"]}),
    );
    sim.apply_job("TrainingJob", "first", exec_job(2, "3Gi"));
    sim.settle();
    sim.apply_job("TrainingJob", "second", exec_job(2, "3Gi"));
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "first").phase, JobPhase::Scheduled);
    let held = sim.job("TrainingJob", "second");
    assert_eq!(
        (held.phase, held.reason.as_str()),
        (JobPhase::Pending, "QuotaExceeded")
    );
    assert!(
        held.message
            .contains("queue research: 6Gi of 8Gi memory in use")
            && held.message.contains("4Gi over"),
        "{}",
        held.message
    );
    // The first job ends: its memory returns to the queue and the second starts.
    sim.set_phase(
        |s| s.job.name == "first",
        AllocationPhase::Succeeded,
        Some(0),
        "Completed",
    );
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "second").phase, JobPhase::Scheduled);
}

#[test]
fn a_quota_lowered_below_usage_warns_and_stops_nothing() {
    let mut sim = Sim::new();
    for n in ["a", "b"] {
        sim.add_node(n, 16);
    }
    let queue = |memory: &str| json!({"quota": {"memory": memory}, "namespaces": ["default"]});
    apply_queue(&mut sim, "research", queue("16Gi"));
    sim.apply_job("TrainingJob", "big", exec_job(2, "6Gi"));
    sim.settle();
    sim.set_phase(|_| true, AllocationPhase::Running, None, "Started");
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "big").phase, JobPhase::Running);
    let status = |sim: &Sim| {
        let key = tb_api::ObjectKey {
            kind: "Queue".into(),
            namespace: String::new(),
            name: "research".into(),
        };
        let q = sim.state.get(&key).expect("queue");
        (
            q.metadata.generation,
            tb_api::specs::QueueStatus::from_value(&q.status),
        )
    };
    let (generation, first) = status(&sim);
    assert_eq!(first.observed_generation, generation);
    assert!(!sim.events().iter().any(|e| e == "QuotaBelowUsage"));

    // 4Gi is below the 12Gi held: accepted, warned about, and the running gang keeps running.
    apply_queue(&mut sim, "research", queue("4Gi"));
    sim.settle();
    let (generation, lowered) = status(&sim);
    assert_eq!((generation, lowered.observed_generation), (2, 2));
    let condition = lowered
        .conditions
        .iter()
        .find(|c| c.type_ == "QuotaBelowUsage")
        .expect("condition");
    assert_eq!(condition.status, "True");
    assert!(
        condition
            .message
            .contains("memory quota 4Gi is below the 12Gi its running work holds"),
        "{}",
        condition.message
    );
    let warnings: Vec<_> = sim
        .state
        .events
        .iter()
        .filter(|e| e.spec["reason"] == "QuotaBelowUsage")
        .collect();
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].spec["type"], "Warning");
    assert_eq!(warnings[0].spec["involvedObject"]["name"], "research");
    let big = sim.job("TrainingJob", "big");
    assert_eq!(big.phase, JobPhase::Running);
    assert!(
        sim.allocs()
            .iter()
            .all(|(_, s, _)| s.desired == Desired::Run)
    );
    // New work waits on the quota; more passes warn no more.
    sim.apply_job("TrainingJob", "small", exec_job(1, "1Gi"));
    sim.run_for(30);
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "small").reason, "QuotaExceeded");
    assert_eq!(
        sim.state
            .events
            .iter()
            .filter(|e| e.spec["reason"] == "QuotaBelowUsage")
            .map(|e| e.spec["count"].as_u64().unwrap_or(1))
            .sum::<u64>(),
        1
    );

    // Raised again: the condition clears.
    apply_queue(&mut sim, "research", queue("32Gi"));
    sim.settle();
    let (_, raised) = status(&sim);
    assert!(
        raised
            .conditions
            .iter()
            .any(|c| c.type_ == "QuotaBelowUsage" && c.status == "False")
    );
}

#[test]
fn checkpointed_jobs_tell_their_ranks_where_to_save_and_resume() {
    let mut sim = Sim::new();
    sim.add_node("a", 16);
    let mut spec = exec_job(2, "2Gi");
    spec["checkpoints"] = json!({"dir": "/Volumes/lab/ckpt/tune", "everySteps": 500});
    spec["env"] = json!({"SEED": "7"});
    sim.apply_job("TrainingJob", "tune", spec);
    sim.apply_job("TrainingJob", "plain", exec_job(1, "1Gi"));
    sim.settle();
    let allocs = sim.allocs();
    let env_of = |job: &str| -> Vec<_> {
        allocs
            .iter()
            .filter(|(_, s, _)| s.job.name == job)
            .map(|(_, s, _)| s.env.clone())
            .collect()
    };
    let tune = env_of("tune");
    assert_eq!(tune.len(), 2);
    for env in &tune {
        assert_eq!(env["TB_CHECKPOINT_DIR"], "/Volumes/lab/ckpt/tune");
        assert_eq!(env["TB_CHECKPOINT_EVERY_STEPS"], "500");
        assert_eq!(env["SEED"], "7");
    }
    assert!(
        env_of("plain")
            .iter()
            .all(|e| !e.contains_key("TB_CHECKPOINT_DIR"))
    );
}

#[test]
fn a_job_its_own_quota_holds_back_preempts_nothing() {
    let mut sim = Sim::new();
    for n in ["a", "b"] {
        sim.add_node(n, 16);
    }
    apply_queue(
        &mut sim,
        "urgent",
        json!({"priority": 10, "quota": {"memory": "1Gi"}}),
    );
    // Unqueued, priority 0, filling most of both Macs.
    sim.apply_job("TrainingJob", "low", exec_job(2, "10Gi"));
    sim.settle();
    sim.set_phase(|_| true, AllocationPhase::Running, None, "Started");
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "low").phase, JobPhase::Running);
    let mut big = exec_job(1, "13Gi");
    big["queue"] = json!("urgent");
    sim.apply_job("TrainingJob", "big", big);
    for _ in 0..5 {
        sim.settle();
        sim.obey_stops();
        sim.advance(1);
    }
    let low = sim.job("TrainingJob", "low");
    assert_eq!((low.epoch, low.phase), (1, JobPhase::Running), "{low:?}");
    assert!(
        sim.allocs()
            .iter()
            .all(|(_, s, _)| s.desired == Desired::Run)
    );
    let big = sim.job("TrainingJob", "big");
    assert_eq!(big.reason, "QuotaExceeded", "{big:?}");
    assert!(big.message.contains("queue urgent"), "{}", big.message);
}

#[test]
fn a_mac_quota_packs_a_queues_ranks_onto_the_macs_it_may_use() {
    let mut sim = Sim::new();
    for n in ["a", "b", "c"] {
        sim.add_node(n, 16);
    }
    apply_queue(
        &mut sim,
        "one-mac",
        json!({"quota": {"macs": 1}, "namespaces": ["default"]}),
    );
    // Two ranks would spread over two Macs; the quota allows one, where both fit.
    sim.apply_job("TrainingJob", "pair", exec_job(2, "2Gi"));
    sim.settle();
    let nodes_of = |sim: &Sim, job: &str| -> std::collections::BTreeSet<String> {
        sim.allocs()
            .into_iter()
            .filter(|(_, s, _)| s.job.name == job)
            .map(|(_, s, _)| s.node)
            .collect()
    };
    assert_eq!(sim.job("TrainingJob", "pair").phase, JobPhase::Scheduled);
    let held = nodes_of(&sim, "pair");
    assert_eq!(held.len(), 1, "{held:?}");
    // More work of the queue goes to the Mac it holds, though the others are emptier.
    sim.apply_job("TrainingJob", "more", exec_job(1, "2Gi"));
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "more").phase, JobPhase::Scheduled);
    assert_eq!(nodes_of(&sim, "more"), held);
    // What cannot fit on that Mac waits, naming the Mac quota.
    sim.apply_job("TrainingJob", "huge", exec_job(1, "14Gi"));
    sim.settle();
    let huge = sim.job("TrainingJob", "huge");
    assert_eq!(huge.reason, "QuotaExceeded", "{huge:?}");
    assert!(
        huge.message.contains("1 of 1 Macs in use"),
        "{}",
        huge.message
    );
}

#[test]
fn borrowing_lets_a_queue_go_past_its_quota_up_to_the_limit() {
    let mut sim = Sim::new();
    sim.add_node("a", 64);
    apply_queue(
        &mut sim,
        "q",
        json!({"quota": {"memory": "8Gi"}, "borrowingLimit": {"memory": "4Gi"},
               "namespaces": ["default"]}),
    );
    sim.apply_job("TrainingJob", "twelve", exec_job(1, "12Gi"));
    sim.advance(1);
    sim.apply_job("TrainingJob", "one-more", exec_job(1, "1Gi"));
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "twelve").phase, JobPhase::Scheduled);
    assert_eq!(sim.job("TrainingJob", "one-more").reason, "QuotaExceeded");
}

#[test]
fn higher_priority_jobs_take_capacity_first_and_bad_queues_are_named() {
    let mut sim = Sim::new();
    sim.add_node("a", 8);
    // Priorities above 0 need a queue that allows them.
    apply_queue(
        &mut sim,
        "lab",
        json!({"maxPriority": 10, "namespaces": ["default"]}),
    );
    let mut low = exec_job(1, "6Gi");
    low["priority"] = json!(1);
    let mut high = exec_job(1, "6Gi");
    high["priority"] = json!(10);
    // Applied in the same pass, the later but higher-priority job wins the only room.
    sim.apply_job("TrainingJob", "low", low);
    sim.advance(1);
    sim.apply_job("TrainingJob", "high", high);
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "high").phase, JobPhase::Scheduled);
    assert_eq!(sim.job("TrainingJob", "low").reason, "Unschedulable");

    apply_queue(&mut sim, "vision", json!({"namespaces": ["vision"]}));
    let mut job = exec_job(1, "1Gi");
    job["queue"] = json!("nope");
    sim.apply_job("TrainingJob", "lost", job);
    let mut job = exec_job(1, "1Gi");
    job["queue"] = json!("vision");
    sim.apply_job("TrainingJob", "trespass", job);
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "lost").reason, "QueueNotFound");
    let t = sim.job("TrainingJob", "trespass");
    assert_eq!(t.reason, "QueueForbidden");
    assert!(t.message.contains("not default"), "{}", t.message);
}

#[test]
fn a_higher_priority_job_preempts_a_whole_lower_gang_which_is_requeued() {
    let mut sim = Sim::new();
    sim.add_node("a", 16);
    sim.add_node("b", 16);
    apply_queue(
        &mut sim,
        "lab",
        json!({"maxPriority": 10, "namespaces": ["default"]}),
    );
    let mut low = exec_job(2, "12Gi");
    low["priority"] = json!(1);
    sim.apply_job("TrainingJob", "low", low);
    sim.settle();
    sim.set_phase(
        |s| s.job.name == "low",
        AllocationPhase::Running,
        None,
        "Started",
    );
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "low").phase, JobPhase::Running);

    // Same priority: no preemption, the newcomer waits.
    let mut peer = exec_job(1, "12Gi");
    peer["priority"] = json!(1);
    sim.apply_job("TrainingJob", "peer", peer);
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "peer").reason, "Unschedulable");
    assert_eq!(sim.job("TrainingJob", "low").phase, JobPhase::Running);

    // Higher priority needing one Mac: the whole two-rank gang is stopped, not one rank.
    let mut high = exec_job(1, "12Gi");
    high["priority"] = json!(10);
    sim.apply_job("TrainingJob", "high", high);
    sim.settle();
    let low = sim.job("TrainingJob", "low");
    assert_eq!(
        (low.phase, low.reason.as_str()),
        (JobPhase::Pending, "Preempted")
    );
    assert!(
        low.message.contains("preempted by TrainingJob/high"),
        "{}",
        low.message
    );
    let stopping = sim
        .allocs()
        .iter()
        .filter(|(_, s, _)| s.job.name == "low" && s.desired == Desired::Stop)
        .count();
    assert_eq!(stopping, 2, "every rank of the gang");
    assert_eq!(
        sim.job("TrainingJob", "high").reason,
        "WaitingForPreemption"
    );
    // Settling again while the ranks stop picks no further victims.
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "peer").reason, "Unschedulable");

    sim.obey_stops();
    sim.settle();
    assert_eq!(sim.job("TrainingJob", "high").phase, JobPhase::Scheduled);
    let low = sim.job("TrainingJob", "low");
    assert_eq!(low.phase, JobPhase::Pending, "requeued, not failed");
    assert_eq!(low.restarts, 0, "preemption uses no retry");
    assert!(sim.events().contains(&"Preempted".to_string()));
}

#[test]
fn a_builtin_service_gets_its_pipeline_and_is_ready_when_rank_0_answers() {
    let mut sim = ring_with_slow_diagonals();
    apply_model(&mut sim, "big", 80, "1.5Gi");
    sim.apply_job(
        "InferenceService",
        "chat",
        json!({"model": "big", "parallelism": "pipeline", "context": 1024, "batch": 2}),
    );
    sim.settle();
    let status = sim.job("InferenceService", "chat");
    assert_eq!(status.phase, JobPhase::Scheduled, "{}", status.message);
    let mut allocs = sim.allocs();
    allocs.sort_by_key(|a| a.1.rank);
    assert_eq!(allocs.len(), 4);
    let hosts: Vec<String> = allocs
        .iter()
        .map(|(_, s, _)| s.builtin.as_ref().expect("assignment").hosts.clone())
        .next()
        .expect("rank 0");
    for (_, spec, _) in &allocs {
        assert_eq!(spec.executor, tb_api::specs::Executor::Builtin);
        assert!(spec.command.is_empty() && spec.mlx.is_none());
        let b = spec.builtin.as_ref().expect("built-in assignment");
        assert_eq!(
            (b.model.as_str(), b.model_path.as_str()),
            ("big", "/models/m.gguf")
        );
        assert_eq!(b.hosts, hosts, "every rank sees the same pipeline");
        assert_eq!((b.context, b.batch), (Some(1024), Some(2)));
        assert!(spec.layers.is_some());
        // Only rank 0 serves the API, on a port other than its coordinator's.
        assert_eq!(b.endpoint_port.is_some(), spec.rank == 0);
        if let Some(p) = b.endpoint_port {
            assert!(!b.coordinator.ends_with(&format!(":{p}")), "{b:?}");
        }
    }
    // Running is not Ready: the endpoint must answer first.
    sim.set_phase(|_| true, AllocationPhase::Running, None, "");
    sim.settle();
    let status = sim.job("InferenceService", "chat");
    assert_eq!(status.phase, JobPhase::Running);
    let ready = |s: &JobStatus| s.condition("Ready").map(|c| c.status.clone());
    assert_eq!(ready(&status).as_deref(), Some("False"));
    // Rank 0's nodelet reports the endpoint answering.
    let (obj, spec, mut st) = sim
        .allocs()
        .into_iter()
        .find(|a| a.1.rank == 0)
        .expect("rank 0");
    st.endpoint = format!(
        "http://{}:{}/v1",
        hosts[0],
        spec.builtin.expect("b").endpoint_port.expect("port")
    );
    st.ready = true;
    let r = sim.commit(Op::UpdateStatus {
        key: obj.key(),
        status: st.to_value(),
        resource_version: 0,
    });
    assert!(matches!(r, Response::Status { .. }));
    sim.settle();
    let status = sim.job("InferenceService", "chat");
    assert_eq!(ready(&status).as_deref(), Some("True"));
    assert_eq!(status.endpoint, st.endpoint);
    // A stage dies: not ready, no endpoint, and the gang is placed again after the backoff.
    sim.set_phase(
        |s| s.rank == 2,
        AllocationPhase::Failed,
        Some(1),
        "StageFailed",
    );
    sim.settle();
    let status = sim.job("InferenceService", "chat");
    assert_eq!(ready(&status).as_deref(), Some("False"));
    assert!(status.endpoint.is_empty());
    assert_eq!(status.reason, "BackOff");
    sim.obey_stops();
    sim.run_for(11);
    sim.settle();
    let status = sim.job("InferenceService", "chat");
    assert_eq!(status.epoch, 2, "{}", status.message);
}

/// A service placed before its nodelets measured their engine is costed again when the
/// figures arrive: the prediction says which figures it rests on, the gang stays where it is,
/// and the change is written once.
#[test]
fn a_service_placed_on_chip_figures_is_costed_again_when_engine_figures_arrive() {
    let mut sim = ring_with_slow_diagonals();
    apply_model(&mut sim, "small", 32, "64Mi");
    sim.apply_job(
        "InferenceService",
        "chat",
        json!({"model": "small", "parallelism": "pipeline", "context": 1024}),
    );
    sim.settle();
    let before = sim.job("InferenceService", "chat");
    let placed = before.model_placement.clone().expect("a prediction");
    assert_eq!(placed.figures, "chip");
    // Every stage's nodelet reports what it measured on the engine.
    for node in placed.stages.iter().map(|s| s.node.clone()) {
        let mut obj = sim.node(&node);
        let mut status = NodeStatus::from_value(&obj.status);
        status.capacity.engine = Some(tb_api::status::EngineFigures {
            backend: "cpu".into(),
            weight_gbs: 20.0,
            token_overhead_us: 500.0,
            measured_at: None,
            threads: None,
        });
        obj.status = status.to_value();
        let r = sim.commit(Op::Heartbeat {
            node: node.clone(),
            credential_hash: format!("c-{node}"),
            status: obj.status.clone(),
        });
        assert!(matches!(r, Response::Status { .. }), "{r:?}");
    }
    sim.settle();
    let after = sim.job("InferenceService", "chat");
    let costed = after.model_placement.clone().expect("a prediction");
    assert_eq!(costed.figures, "engine");
    assert_eq!(costed.stages, placed.stages, "the gang is not moved");
    assert_eq!(after.epoch, before.epoch);
    // 32 layers of 64 MiB read at 20 GB/s, plus the KV cache and a per-token overhead.
    let expected = 1e6 / (32.0 * 64.0 * (1 << 20) as f64 / 20e9 * 1e6);
    assert!(
        costed.predicted_tokens_per_second < expected
            && costed.predicted_tokens_per_second > expected * 0.8,
        "{} tok/s predicted, ~{expected:.2} expected",
        costed.predicted_tokens_per_second
    );
    assert!(costed.predicted_tokens_per_second < placed.predicted_tokens_per_second);
    assert_eq!(sim.settle(), 0, "nothing more to write");

    // Rank 0 reports what its streams saw, and at what context: the prediction for one
    // stream there stands beside it (higher: a short conversation reads less KV cache).
    sim.set_phase(|_| true, AllocationPhase::Running, None, "");
    let (obj, _, mut st) = sim
        .allocs()
        .into_iter()
        .find(|a| a.1.rank == 0)
        .expect("rank 0");
    st.observed_tokens_per_second = Some(3.0);
    st.observed_context_tokens = Some(200);
    let r = sim.commit(Op::UpdateStatus {
        key: obj.key(),
        status: st.to_value(),
        resource_version: 0,
    });
    assert!(matches!(r, Response::Status { .. }), "{r:?}");
    sim.settle();
    let seen = sim
        .job("InferenceService", "chat")
        .model_placement
        .expect("a prediction");
    assert_eq!(seen.observed_tokens_per_second, Some(3.0));
    assert_eq!(seen.observed_context_tokens, Some(200));
    let there = seen
        .predicted_at_observed_tokens_per_second
        .expect("a prediction at the observed context");
    assert!(
        there > costed.predicted_tokens_per_second
            && there < costed.predicted_tokens_per_second * 1.1,
        "{there} at 200 tokens vs {} at 1024",
        costed.predicted_tokens_per_second
    );
    assert_eq!(
        seen.predicted_tokens_per_second,
        costed.predicted_tokens_per_second
    );
    assert_eq!(sim.settle(), 0, "nothing more to write");
}

/// A Schedule stored before the API checked zones and crons, as an old store may hold it.
fn plant_unchecked_schedule(sim: &mut Sim, name: &str, spec: Value) {
    let obj = Object {
        api_version: "tb/v1".into(),
        kind: "Schedule".into(),
        metadata: ObjectMeta {
            name: name.into(),
            namespace: "default".into(),
            ..Default::default()
        },
        spec,
        status: Value::Null,
    };
    assert!(
        tb_api::validate_object(&obj).is_err(),
        "the API refuses it now"
    );
    let r = sim.commit(Op::Apply { objects: vec![obj] });
    assert!(matches!(r, Response::Applied { .. }), "{r:?}");
}

#[test]
fn objects_the_scheduler_cannot_act_on_report_once_a_minute_and_plan_nothing_between() {
    let mut sim = Sim::new();
    sim.add_node("a", 8);
    let template = json!({"spec": {"command": ["python3", "tune.py"], "memory": "1Gi"}});
    plant_unchecked_schedule(
        &mut sim,
        "mars",
        json!({"schedule": "* * * * *", "timeZone": "Mars/Olympus", "jobTemplate": template}),
    );
    plant_unchecked_schedule(
        &mut sim,
        "never",
        json!({"schedule": "0 0 31 2 *", "jobTemplate": template}),
    );
    sim.apply_job("TrainingJob", "big", exec_job(1, "64Gi"));
    // The first pass says what is wrong: one event each.
    assert!(sim.settle() > 0);
    let count = |sim: &Sim, reason: &str| -> Vec<u64> {
        sim.state
            .events
            .iter()
            .filter(|e| e.spec["reason"] == reason)
            .map(|e| e.spec["count"].as_u64().unwrap_or(1))
            .collect()
    };
    // Both Schedules no longer pass the API's checks (the zone, the never-firing cron).
    assert_eq!(count(&sim, "InvalidSpec"), [1, 1], "{:?}", sim.events());
    assert_eq!(count(&sim, "FailedScheduling"), [1], "{:?}", sim.events());
    // Passes within the minute plan nothing at all (no Raft write).
    for _ in 0..5 {
        sim.run_for(10);
        let plans = reconcile(&sim.state, &Clock::new(sim.now, sim.leader_since), &sim.cfg);
        assert!(plans.is_empty(), "{plans:?}");
    }
    // After a minute the event's count is bumped, once.
    sim.run_for(11);
    assert_eq!(sim.settle(), 2);
    assert_eq!(count(&sim, "InvalidSpec"), [2, 2]);
    let message = sim
        .state
        .events
        .iter()
        .find(|e| e.spec["involvedObject"]["name"] == "mars")
        .map(|e| e.spec["message"].to_string())
        .unwrap_or_default();
    assert!(message.contains("Mars/Olympus"), "{message}");
    assert_eq!(sim.settle(), 0);
    assert!(schedule_runs(&sim, "never").is_empty());
    assert!(schedule_runs(&sim, "mars").is_empty());
}

/// Changes node `name`'s status and heartbeats it.
fn set_node_status(sim: &mut Sim, name: &str, change: impl FnOnce(&mut NodeStatus)) {
    let mut status = NodeStatus::from_value(&sim.node(name).status);
    change(&mut status);
    let r = sim.commit(Op::Heartbeat {
        node: name.into(),
        credential_hash: format!("c-{name}"),
        status: status.to_value(),
    });
    assert!(matches!(r, Response::Status { .. }), "{r:?}");
}

/// Each rank's node, staging sources and whether it keeps a whole copy, for `epoch`.
fn staging_of(sim: &Sim, epoch: u64) -> Vec<(String, Vec<String>, bool)> {
    let mut allocs: Vec<_> = sim
        .allocs()
        .into_iter()
        .filter(|a| a.1.epoch == epoch)
        .collect();
    allocs.sort_by_key(|a| a.1.rank);
    allocs
        .into_iter()
        .map(|(_, s, _)| {
            let b = s.builtin.expect("built-in");
            (s.node, b.sources, b.replicate)
        })
        .collect()
}

#[test]
fn a_model_one_node_holds_gets_a_second_holder_which_serves_once_the_first_is_lost() {
    let mut sim = Sim::new();
    sim.cfg.services_base = Some("https://10.0.0.9:7401/".into());
    for (i, n) in ["a", "b", "c"].into_iter().enumerate() {
        sim.add_node(n, 40);
        set_node_status(&mut sim, n, |s| s.probe_port = 7700 + i as u16);
    }
    // A triangle: any two of them can run a pipeline.
    cable(&mut sim, "a", "tb1", "b", "tb1");
    cable(&mut sim, "b", "tb2", "c", "tb1");
    cable(&mut sim, "c", "tb2", "a", "tb2");
    let model = Object {
        api_version: "tb/v1".into(),
        kind: "Model".into(),
        metadata: ObjectMeta {
            name: "m".into(),
            namespace: "default".into(),
            ..Default::default()
        },
        spec: json!({"format": "gguf", "source": {"path": "/models/m.gguf", "nodes": ["a"]},
                     "layers": 40, "bytesPerLayer": "1Gi", "hiddenSize": 4096, "heads": 32,
                     "kvHeads": 8, "contextLength": 4096}),
        status: Value::Null,
    };
    let model = tb_api::validate_object(&model).expect("valid model");
    assert!(matches!(
        sim.commit(Op::Apply {
            objects: vec![model]
        }),
        Response::Applied { .. }
    ));
    sim.apply_job(
        "InferenceService",
        "chat",
        json!({"model": "m", "parallelism": "pipeline", "nodes": {"min": 2, "max": 2}}),
    );
    sim.settle();
    let status = sim.job("InferenceService", "chat");
    assert_eq!(
        status.url, "https://10.0.0.9:7401/services/default/chat/v1",
        "the stable URL"
    );
    // One holder: a rank elsewhere stages from it and keeps a whole copy; a rank on the
    // holder reads the file at its path.
    let first = staging_of(&sim, 1);
    assert_eq!(first.len(), 2, "{first:?}");
    for (node, sources, _) in &first {
        if node == "a" {
            assert!(sources.is_empty(), "{first:?}");
        } else {
            assert_eq!(sources, &["10.0.0.1:7700".to_string()], "{first:?}");
        }
    }
    assert_eq!(
        first.iter().filter(|(_, _, r)| *r).count(),
        1,
        "one more copy makes two holders: {first:?}"
    );
    let (copier, _, _) = first.iter().find(|(_, _, r)| *r).expect("a copier").clone();
    assert_ne!(copier, "a");
    sim.set_phase(|_| true, AllocationPhase::Running, None, "");
    set_node_status(&mut sim, &copier, |s| {
        s.models = vec!["/models/m.gguf".into()]
    });
    sim.settle();

    // The first holder falls silent: the service is placed again from the copy.
    let silent = "a";
    let others: Vec<&str> = ["a", "b", "c"]
        .into_iter()
        .filter(|n| *n != silent)
        .collect();
    for _ in 0..6 {
        sim.advance(2);
        for n in &others {
            sim.heartbeat(n);
        }
        sim.settle();
    }
    sim.obey_stops();
    sim.settle();
    let status = sim.job("InferenceService", "chat");
    let epoch = status.epoch;
    let again = staging_of(&sim, epoch);
    assert!(
        again.iter().all(|(n, _, _)| n != silent),
        "{again:?} ({})",
        status.message
    );
    let copier_port = if copier == "b" { 7701 } else { 7702 };
    let copier_host = NodeStatus::from_value(&sim.node(&copier).status)
        .host()
        .to_string();
    for (node, sources, replicate) in &again {
        assert_eq!(
            sources,
            &[format!("{copier_host}:{copier_port}")],
            "only the copy is left to stage from: {again:?}"
        );
        // The node without a copy makes one: two holders again.
        assert_eq!(*replicate, node != &copier, "{again:?}");
    }
}

#[test]
fn a_builtin_fine_tune_gets_data_parallel_ranks_sized_from_its_model_and_reports_progress() {
    let mut sim = Sim::new();
    sim.add_node("mac1", 64);
    sim.add_node("mac2", 64);
    apply_model(&mut sim, "small", 8, "100Mi");
    sim.apply_job(
        "TrainingJob",
        "facts",
        json!({"model": "small", "executor": "builtin", "ranks": 2, "dataset": "facts.jsonl",
               "finetune": {"steps": 10, "batchSize": 4, "sequenceLength": 256}}),
    );
    sim.settle();
    let status = sim.job("TrainingJob", "facts");
    assert_eq!(status.phase, JobPhase::Scheduled, "{}", status.message);
    let placement = status.model_placement.clone().expect("the prediction");
    assert_eq!(placement.strategy, "data");
    assert!(
        placement.note.contains("f32 base weights"),
        "{}",
        placement.note
    );
    let mut allocs = sim.allocs();
    allocs.sort_by_key(|a| a.1.rank);
    assert_eq!(allocs.len(), 2);
    for (_, spec, _) in &allocs {
        assert_eq!(spec.executor, tb_api::specs::Executor::Builtin);
        assert!(spec.layers.is_none(), "data parallel: the whole model");
        assert!(spec.mlx.is_none() && spec.command.is_empty());
        let b = spec.builtin.as_ref().expect("built-in assignment");
        assert_eq!(b.model_path, "/models/m.gguf");
        assert_eq!(b.dataset.as_deref(), Some("facts.jsonl"));
        assert_eq!(b.finetune.as_ref().expect("finetune")["steps"], 10);
        assert_eq!(b.endpoint_port, None);
        assert_eq!(b.hosts.len(), 2);
        // 8 blocks of 4096 wide in f32 and more: gigabytes, not the job's default memory.
        assert_eq!(spec.memory_bytes, placement.stages[0].memory_bytes);
        assert!(spec.memory_bytes > 2 << 30, "{}", spec.memory_bytes);
    }
    // Rank 0's progress lands in the job's status, with the adapter's Mac filled in.
    sim.set_phase(|_| true, AllocationPhase::Running, None, "");
    let (obj, spec, mut st) = sim
        .allocs()
        .into_iter()
        .find(|a| a.1.rank == 0)
        .expect("rank 0");
    st.training = Some(tb_api::status::TrainingProgress {
        step: 4,
        total_steps: 10,
        loss: Some(1.5),
        loss_curve: vec![2.0, 1.8, 1.6, 1.5],
        adapter: Some(tb_api::status::AdapterLocation {
            node: "forged".into(),
            path: "/w/adapter".into(),
        }),
        ..Default::default()
    });
    let r = sim.commit(Op::UpdateStatus {
        key: obj.key(),
        status: st.to_value(),
        resource_version: 0,
    });
    assert!(matches!(r, Response::Status { .. }));
    sim.settle();
    let status = sim.job("TrainingJob", "facts");
    let t = status.training.expect("progress");
    assert_eq!((t.step, t.total_steps, t.loss), (4, 10, Some(1.5)));
    assert_eq!(t.adapter.expect("adapter").node, spec.node);
}

/// Each rank's node and adapter assignment, for `epoch`.
fn adapters_of(sim: &Sim, epoch: u64) -> Vec<(String, Option<tb_api::specs::AdapterAssignment>)> {
    let mut allocs: Vec<_> = sim
        .allocs()
        .into_iter()
        .filter(|a| a.1.epoch == epoch)
        .collect();
    allocs.sort_by_key(|a| a.1.rank);
    allocs
        .into_iter()
        .map(|(_, s, _)| (s.node, s.builtin.expect("built-in").adapter))
        .collect()
}

fn triangle_with_probe_ports() -> Sim {
    let mut sim = Sim::new();
    for (i, n) in ["a", "b", "c"].into_iter().enumerate() {
        sim.add_node(n, 40);
        set_node_status(&mut sim, n, |s| s.probe_port = 7700 + i as u16);
    }
    cable(&mut sim, "a", "tb1", "b", "tb1");
    cable(&mut sim, "b", "tb2", "c", "tb1");
    cable(&mut sim, "c", "tb2", "a", "tb2");
    apply_model(&mut sim, "m", 40, "1Gi");
    sim
}

#[test]
fn every_rank_gets_the_adapter_and_ranks_off_its_node_fetch_it_from_there() {
    let mut sim = triangle_with_probe_ports();
    sim.apply_job(
        "InferenceService",
        "tuned",
        json!({"model": "m", "parallelism": "pipeline", "nodes": {"min": 2, "max": 2},
               "adapter": {"path": "/adapters/z", "node": "a"}}),
    );
    sim.settle();
    let status = sim.job("InferenceService", "tuned");
    assert_eq!(status.phase, JobPhase::Scheduled, "{}", status.message);
    let ranks = adapters_of(&sim, 1);
    assert_eq!(ranks.len(), 2);
    for (node, adapter) in &ranks {
        let a = adapter.as_ref().expect("every rank has the adapter");
        assert_eq!(a.path, "/adapters/z");
        if node == "a" {
            assert_eq!(a.source, None, "{ranks:?}");
        } else {
            assert_eq!(a.source.as_deref(), Some("10.0.0.1:7700"), "{ranks:?}");
        }
    }
}

#[test]
fn a_fine_tunes_adapter_is_served_once_the_fine_tune_succeeded() {
    let mut sim = triangle_with_probe_ports();
    sim.apply_job(
        "InferenceService",
        "tuned",
        json!({"model": "m", "parallelism": "pipeline", "nodes": {"min": 2, "max": 2},
               "adapter": {"trainingJob": "tune"}}),
    );
    sim.settle();
    let status = sim.job("InferenceService", "tuned");
    assert_eq!(status.phase, JobPhase::Pending);
    assert_eq!(status.reason, "AdapterNotReady", "{}", status.message);
    assert!(status.message.contains("tune"), "{}", status.message);
    // A fine-tune that cannot be placed, then reported finished with its adapter on "b".
    sim.apply_job(
        "TrainingJob",
        "tune",
        json!({"command": ["x"], "nodeSelector": {"nowhere": "x"}}),
    );
    sim.settle();
    assert_eq!(
        sim.job("InferenceService", "tuned").reason,
        "AdapterNotReady"
    );
    let key = ObjectKey {
        kind: "TrainingJob".into(),
        namespace: "default".into(),
        name: "tune".into(),
    };
    let r = sim.commit(Op::UpdateStatus {
        key,
        status: json!({"phase": "Succeeded", "training": {"step": 10, "totalSteps": 10,
                       "adapter": {"node": "b", "path": "/var/tb/allocs/default/tune/work/adapter"}}}),
        resource_version: 0,
    });
    assert!(matches!(r, Response::Status { .. }), "{r:?}");
    sim.settle();
    let status = sim.job("InferenceService", "tuned");
    assert_eq!(status.phase, JobPhase::Scheduled, "{}", status.message);
    for (node, adapter) in adapters_of(&sim, 1) {
        let a = adapter.expect("adapter");
        assert_eq!(a.path, "/var/tb/allocs/default/tune/work/adapter");
        assert_eq!(a.source.is_some(), node != "b", "{node}: {a:?}");
    }
}

#[test]
fn a_fine_tunes_ranks_off_the_dataset_node_fetch_their_examples_from_it() {
    let mut sim = triangle_with_probe_ports();
    let spec = |node: &str| {
        json!({"model": "m", "executor": "builtin", "ranks": 3, "memory": "1Gi",
               "dataset": "/data/facts.jsonl", "datasetNode": node,
               "finetune": {"steps": 10, "batchSize": 3, "sequenceLength": 64}})
    };
    // A holder that does not exist (or cannot serve) keeps the job waiting, saying why.
    sim.apply_job("TrainingJob", "tune", spec("d"));
    sim.settle();
    let status = sim.job("TrainingJob", "tune");
    assert_eq!(status.phase, JobPhase::Pending);
    assert_eq!(status.reason, "DatasetNotReady", "{}", status.message);
    assert!(status.message.contains("Node d"), "{}", status.message);
    assert!(sim.allocs().is_empty());

    sim.apply_job("TrainingJob", "tune", spec("a"));
    sim.settle();
    let status = sim.job("TrainingJob", "tune");
    assert_eq!(status.phase, JobPhase::Scheduled, "{}", status.message);
    let allocs = sim.allocs();
    assert_eq!(allocs.len(), 3);
    for (_, s, _) in &allocs {
        let b = s.builtin.as_ref().expect("built-in");
        assert_eq!(b.dataset.as_deref(), Some("/data/facts.jsonl"));
        let expected = (s.node != "a").then(|| "10.0.0.1:7700".to_string());
        assert_eq!(b.dataset_source, expected, "rank {} on {}", s.rank, s.node);
    }
}

#[test]
fn a_tensor_parallel_builtin_service_loads_every_block_on_every_rank_split() {
    let mut sim = ring_with_slow_diagonals();
    apply_model(&mut sim, "m", 32, "1Gi");
    sim.apply_job(
        "InferenceService",
        "chat",
        json!({"model": "m", "parallelism": "tensor", "nodes": {"min": 4, "max": 4}}),
    );
    sim.settle();
    let status = sim.job("InferenceService", "chat");
    assert_eq!(status.phase, JobPhase::Scheduled, "{}", status.message);
    let placement = status.model_placement.clone().expect("placement");
    assert_eq!(placement.strategy, "tensor");
    let allocs = sim.allocs();
    assert_eq!(allocs.len(), 4);
    for (_, spec, _) in &allocs {
        let b = spec.builtin.as_ref().expect("built-in");
        assert!(b.tensor_parallel, "rank {}", spec.rank);
        assert!(spec.layers.is_none(), "every rank a slice of every block");
        assert_eq!(b.endpoint_port.is_some(), spec.rank == 0);
    }
    // A pipeline is not tensor parallel.
    sim.apply_job(
        "InferenceService",
        "piped",
        json!({"model": "m", "parallelism": "pipeline", "nodes": {"min": 2, "max": 2}}),
    );
    sim.settle();
    let piped: Vec<_> = sim
        .allocs()
        .into_iter()
        .filter(|a| a.1.job.name == "piped")
        .collect();
    assert_eq!(piped.len(), 2);
    assert!(
        piped
            .iter()
            .all(|a| !a.1.builtin.as_ref().expect("built-in").tensor_parallel)
    );
}
