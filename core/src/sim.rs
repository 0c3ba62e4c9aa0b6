//! A simulated cluster for the scheduler's tests and benchmarks: the real store (`State::apply`,
//! the code every Raft member runs on a committed entry) and the real scheduler, driven in
//! virtual time, with nodelets played by join, heartbeat and status commands. No Raft, no
//! network, no clock: a test decides when time passes. It panics when the store refuses what a
//! nodelet would be allowed to do (a bug in the test or in tb).

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::json;
use tb_api::specs::{AllocationPhase, AllocationSpec, AllocationStatus, Desired, parse_spec};
use tb_api::status::{NodeCapacity, NodeStatus, PortRange, set_condition};
use tb_api::{Kind, Object, ObjectKey, ObjectMeta, Timestamp};

use crate::scheduler::{Clock, SchedulerConfig, reconcile, stamp};
use crate::store::{Command, Op, Response, State};

const GI: u64 = 1 << 30;

pub struct Sim {
    /// The store, as every Raft member holds it.
    pub state: State,
    /// The last log index applied.
    pub index: u64,
    /// Virtual time.
    pub now: DateTime<Utc>,
    /// When the simulated leader took office (the scheduler waits a grace before judging nodes).
    pub leader_since: DateTime<Utc>,
    pub cfg: SchedulerConfig,
    /// The ports every simulated node offers.
    pub node_ports: PortRange,
}

impl Default for Sim {
    fn default() -> Self {
        Self::new()
    }
}

impl Sim {
    /// An empty cluster at 2026-06-01T00:00:00Z whose leader took office a minute earlier.
    pub fn new() -> Sim {
        let start = DateTime::parse_from_rfc3339("2026-06-01T00:00:00Z")
            .map(|t| t.with_timezone(&Utc))
            .unwrap();
        Sim {
            state: State::default(),
            index: 0,
            now: start,
            leader_since: start - TimeDelta::seconds(60),
            cfg: SchedulerConfig::default(),
            node_ports: PortRange {
                start: 32323,
                end: 32330,
            },
        }
    }

    pub fn commit(&mut self, op: Op) -> Response {
        self.commit_as(op, "")
    }

    pub fn commit_as(&mut self, op: Op, user: &str) -> Response {
        self.index += 1;
        let cmd = Command {
            request_id: String::new(),
            now: stamp(self.now),
            op,
            user: user.into(),
        };
        self.state.apply(self.index, &cmd).0
    }

    pub fn advance(&mut self, secs: i64) {
        self.now += TimeDelta::seconds(secs);
    }

    /// Let time pass while every node keeps heartbeating.
    pub fn run_for(&mut self, secs: i64) {
        let names: Vec<String> = self
            .state
            .list("Node", "")
            .iter()
            .map(|n| n.metadata.name.clone())
            .collect();
        let mut left = secs;
        while left > 0 {
            let step = left.min(2);
            self.advance(step);
            left -= step;
            for n in &names {
                self.heartbeat(n);
            }
        }
    }

    /// Run the scheduler until it has nothing more to do; returns how many plans it committed.
    pub fn settle(&mut self) -> usize {
        let mut committed = 0;
        for _ in 0..10 {
            let clock = Clock::new(self.now, self.leader_since);
            let plans = reconcile(&self.state, &clock, &self.cfg);
            if plans.is_empty() {
                return committed;
            }
            for plan in plans {
                if let Response::Planned { .. } = self.commit(Op::Plan(plan)) {
                    committed += 1;
                }
            }
        }
        panic!("the scheduler did not settle in 10 passes");
    }

    pub fn add_node(&mut self, name: &str, allocatable_gi: u64) {
        let mut status = NodeStatus {
            address: format!("10.0.0.{}:7600", self.index + 1),
            capacity: NodeCapacity {
                memory_bytes: allocatable_gi * GI,
                allocatable_bytes: allocatable_gi * GI,
                ..Default::default()
            },
            port_range: self.node_ports,
            ..Default::default()
        };
        set_condition(
            &mut status.conditions,
            "Ready",
            true,
            "NodeletReady",
            "",
            &Timestamp::from_datetime(self.now),
        );
        let node = Object {
            api_version: "tb/v1".into(),
            kind: "Node".into(),
            metadata: ObjectMeta {
                name: name.into(),
                ..Default::default()
            },
            spec: json!({}),
            status: status.to_value(),
        };
        // A token for this node: it may join, and join again.
        self.commit(Op::CreateToken {
            token_hash: format!("t-{name}"),
            expires_at: "2099-01-01T00:00:00.000Z".into(),
            description: String::new(),
            uses: Some(1),
            node: name.into(),
        });
        let r = self.commit(Op::Join {
            token_hash: format!("t-{name}"),
            node,
            credential_hash: format!("c-{name}"),
        });
        assert!(matches!(r, Response::Status { .. }), "{r:?}");
    }

    pub fn heartbeat(&mut self, name: &str) {
        let status = self.node(name).status.clone();
        let r = self.commit(Op::Heartbeat {
            node: name.into(),
            credential_hash: format!("c-{name}"),
            status,
        });
        assert!(matches!(r, Response::Status { .. }), "{r:?}");
    }

    /// Every node heartbeats once (its status as stored).
    pub fn heartbeat_all(&mut self) {
        let names: Vec<String> = self
            .state
            .list(Kind::Node.as_str(), "")
            .iter()
            .map(|n| n.metadata.name.clone())
            .collect();
        for name in names {
            self.heartbeat(&name);
        }
    }

    /// Validate `obj` as the API would and apply it.
    pub fn apply(&mut self, obj: Object) -> Response {
        let obj = tb_api::validate_object(&obj).expect("a valid object");
        self.commit(Op::Apply { objects: vec![obj] })
    }

    pub fn node(&self, name: &str) -> Object {
        let key = ObjectKey {
            kind: "Node".into(),
            namespace: String::new(),
            name: name.into(),
        };
        (**self.state.get(&key).unwrap()).clone()
    }

    pub fn allocs(&self) -> Vec<(Object, AllocationSpec, AllocationStatus)> {
        self.state
            .list(Kind::Allocation.as_str(), "")
            .into_iter()
            .map(|o| {
                let spec = parse_spec::<AllocationSpec>(&o.spec).unwrap();
                let status = AllocationStatus::from_value(&o.status);
                ((*o).clone(), spec, status)
            })
            .collect()
    }

    /// Play the nodelets: set the phase of every allocation matching `pick`.
    pub fn set_phase(
        &mut self,
        pick: impl Fn(&AllocationSpec) -> bool,
        phase: AllocationPhase,
        exit: Option<i32>,
        reason: &str,
    ) {
        for (obj, spec, mut status) in self.allocs() {
            if !pick(&spec) {
                continue;
            }
            status.phase = phase;
            status.exit_code = exit;
            status.reason = reason.into();
            if phase.is_terminal() && status.finished_at.is_none() {
                status.finished_at = Some(tb_api::Timestamp::from_datetime(self.now));
            }
            let r = self.commit(Op::UpdateStatus {
                key: obj.key(),
                status: status.to_value(),
                resource_version: 0,
            });
            assert!(matches!(r, Response::Status { .. }));
        }
    }

    /// Nodelets stop what they are told to stop.
    pub fn obey_stops(&mut self) {
        self.set_phase(
            |s| s.desired == Desired::Stop,
            AllocationPhase::Stopped,
            None,
            "Stopped",
        );
    }

    pub fn events(&self) -> Vec<String> {
        self.state
            .events
            .iter()
            .map(|e| e.spec["reason"].as_str().unwrap_or("").to_string())
            .collect()
    }
}
