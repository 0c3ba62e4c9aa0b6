//! The leader's reconcile loop: on every change to the store (and on a steady tick, since time
//! alone moves things — heartbeats age, backoffs end) it runs the scheduler on a snapshot and
//! commits the plans through Raft. Followers do nothing here.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::broadcast::error::RecvError;

use crate::clock::SchedulerClock;
use crate::heartbeat_ages::HeartbeatAges;
use crate::raft::RaftNode;
use crate::scheduler::{self, Clock, SchedulerConfig};
use crate::store::{Command, Op, Response, StoreError};

/// How often the loop runs when nothing changes.
const TICK: Duration = Duration::from_millis(500);
/// Plans of one pass proposed at once.
const PLANS_IN_FLIGHT: usize = 256;
/// Most "why it still waits" refreshes committed per pass.
const REFRESHES_PER_PASS: usize = 256;

/// The loop; `time` is the clock the scheduler runs on (the system clock outside tests).
pub async fn run(node: Arc<RaftNode>, cfg: SchedulerConfig, time: SchedulerClock) {
    let mut changes = node.store().hub.subscribe();
    let mut leader_since = None;
    let mut memo = scheduler::memo::Memo::default();
    let mut heartbeats = HeartbeatAges::default();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            r = changes.recv() => match r {
                Ok(_) | Err(RecvError::Lagged(_)) => {
                    // Let a burst of changes land before looking.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    while changes.try_recv().is_ok() {}
                }
                // A snapshot was installed: follow the new feed.
                Err(RecvError::Closed) => changes = node.store().hub.subscribe(),
            },
        }
        if !node.is_leader() {
            leader_since = None;
            heartbeats.reset();
            continue;
        }
        let since = *leader_since.get_or_insert_with(|| time.now());
        let (plans, stamp) = {
            let state = node.store().read();
            let clock =
                Clock::new(time.now(), since).with_heartbeat_ages(heartbeats.observe(&state));
            let plans = scheduler::reconcile_with(&state, &clock, &cfg, &mut memo);
            (plans, clock.stamp)
        };
        // Placements and state changes first; of the refreshed "why it waits" messages only a
        // bounded number per pass (the rest are computed again on the next one).
        let (mut plans, refreshes): (Vec<_>, Vec<_>) =
            plans.into_iter().partition(|p| !p.deferrable);
        plans.extend(refreshes.into_iter().take(REFRESHES_PER_PASS));
        // Plans are independent (each guards what it read), so they are proposed together and
        // Raft batches them into few log appends instead of one fsync round per plan.
        let mut outcomes = futures::stream::iter(plans.into_iter().map(|plan| {
            let cmd = Command {
                request_id: String::new(),
                now: stamp.to_string(),
                op: Op::Plan(plan),
                user: String::new(),
            };
            node.propose(cmd)
        }))
        .buffer_unordered(PLANS_IN_FLIGHT);
        while let Some(outcome) = outcomes.next().await {
            match outcome {
                Ok(Response::Rejected(StoreError::Conflict { key, .. })) => {
                    tracing::debug!(%key, "plan raced with another write; recomputing");
                }
                Ok(Response::Rejected(e)) => tracing::warn!("plan rejected: {e}"),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!("plan not committed: {e}");
                    break;
                }
            }
        }
    }
}
