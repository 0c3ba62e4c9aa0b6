//! Node lifecycle: a Node whose heartbeats stop is marked NotReady after a grace period, and the
//! allocations it was running are marked Lost, so their jobs are placed again elsewhere.

use chrono::{DateTime, Utc};
use tb_api::Timestamp;
use tb_api::reason::Reason;
use tb_api::specs::AllocationPhase;
use tb_api::status::{NodeStatus, set_condition};

use super::view::ClusterView;
use super::{Clock, SchedulerConfig, event, time_of};
use crate::store::{Plan, PlanWrite};

pub fn reconcile_nodes(view: &ClusterView, clock: &Clock, cfg: &SchedulerConfig) -> Vec<Plan> {
    let mut plans = Vec::new();
    // A new leader gives every node a full grace period: the heartbeats it missed while there
    // was no leader say nothing about the nodes.
    let trusted_since = clock.leader_since + cfg.node_grace;
    for node in view.nodes.values() {
        let mut plan = Plan::default();
        // The leader's monotonic measure when there is one: a node it has not seen yet (just
        // joined) counts as seen now.
        let monotonic_age = clock
            .heartbeat_ages
            .as_ref()
            .map(|ages| ages.get(&node.name).copied().unwrap_or_default());
        let stale = match (monotonic_age, time_of(&node.status.last_heartbeat_time)) {
            (Some(age), _) => age > cfg.node_grace,
            (None, Some(t)) => {
                clock.now.signed_duration_since(t) > cfg.node_grace && clock.now >= trusted_since
            }
            (None, None) => clock.now >= trusted_since,
        };
        let mut ready = node.ready;
        if node.ready && stale {
            ready = false;
            let mut status: NodeStatus = node.status.clone();
            let silent = match monotonic_age {
                Some(age) => format!("{}s", age.num_seconds()),
                None => since(&node.status.last_heartbeat_time, clock.now),
            };
            let message = format!("no heartbeat for {silent}");
            set_condition(
                &mut status.conditions,
                "Ready",
                false,
                Reason::NodeStatusUnknown,
                &message,
                &clock.stamp,
            );
            plan.guards
                .push((node.object.key(), node.object.metadata.resource_version));
            plan.writes.push(PlanWrite::Status {
                key: node.object.key(),
                status: status.to_value(),
            });
            plan.events
                .push(event(&node.object, true, Reason::NodeNotReady, &message));
        }
        if !ready {
            for a in view.allocations.iter().filter(|a| a.spec.node == node.name) {
                if a.status.phase.is_terminal() {
                    continue;
                }
                let mut status = a.status.clone();
                status.phase = AllocationPhase::Lost;
                status.reason = Reason::NodeLost.into();
                status.message = format!("node {} is not Ready", node.name);
                status.finished_at = Some(clock.stamp.clone());
                plan.guards
                    .push((a.object.key(), a.object.metadata.resource_version));
                plan.writes.push(PlanWrite::Status {
                    key: a.object.key(),
                    status: status.to_value(),
                });
            }
        }
        if !plan.is_empty() {
            plans.push(plan);
        }
    }
    plans
}

fn since(stamp: &Option<Timestamp>, now: DateTime<Utc>) -> String {
    match time_of(stamp) {
        Some(t) => format!("{}s", now.signed_duration_since(t).num_seconds()),
        None => "ever".into(),
    }
}
