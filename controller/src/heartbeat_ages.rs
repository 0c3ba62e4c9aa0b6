//! Node heartbeat ages on the leader's monotonic clock, for node grace.
//!
//! A heartbeat is stamped (`lastHeartbeatTime`) with the wall clock of whichever controller
//! received it, and the leader's scheduler runs on its own wall clock: comparing the two breaks
//! when a clock jumps (+1 h on the leader: every node looks an hour silent and is lost; −1 h: a
//! dead node looks fresh for an hour) or when members' clocks disagree. So the leader notes,
//! with `Instant`, when it *sees* each node's stamp change, and grace is measured from there.
//! A new leader starts with every node seen just now — a full grace for each, as the heartbeats
//! it did not watch say nothing.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use chrono::TimeDelta;
use tb_api::Kind;
use tb_api::status::NodeStatus;

use crate::store::State;

#[derive(Default)]
pub struct HeartbeatAges {
    /// Node → (the latest stamp seen, when this leader saw it change).
    seen: HashMap<String, (Option<String>, Instant)>,
}

impl HeartbeatAges {
    /// Forget everything (this controller stopped leading).
    pub fn reset(&mut self) {
        self.seen.clear();
    }

    /// Note the nodes' current stamps and return each node's heartbeat age.
    pub fn observe(&mut self, state: &State) -> BTreeMap<String, TimeDelta> {
        self.observe_at(state, Instant::now())
    }

    fn observe_at(&mut self, state: &State, now: Instant) -> BTreeMap<String, TimeDelta> {
        let mut ages = BTreeMap::new();
        let mut present = std::collections::HashSet::new();
        for node in state.list(Kind::Node.as_str(), "") {
            let name = node.metadata.name.clone();
            let stamp = NodeStatus::from_value(&node.status)
                .last_heartbeat_time
                .map(|t| t.to_string());
            let entry = self
                .seen
                .entry(name.clone())
                .or_insert_with(|| (stamp.clone(), now));
            if entry.0 != stamp {
                *entry = (stamp, now);
            }
            let age = TimeDelta::from_std(now.saturating_duration_since(entry.1))
                .unwrap_or(TimeDelta::MAX);
            ages.insert(name.clone(), age);
            present.insert(name);
        }
        self.seen.retain(|n, _| present.contains(n));
        ages
    }
}
