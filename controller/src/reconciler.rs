//! The leader's reconcile loop: on every change to the store (and on a steady tick, since time
//! alone moves things — heartbeats age, backoffs end) it runs the scheduler on a snapshot and
//! commits the plans through Raft. Followers do nothing here.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::broadcast::error::RecvError;

use crate::raft::RaftNode;
use crate::scheduler::{self, Clock, SchedulerConfig};
use crate::store::{Command, Op, Response, StoreError};

/// How often the loop runs when nothing changes.
const TICK: Duration = Duration::from_millis(500);

pub async fn run(node: Arc<RaftNode>, cfg: SchedulerConfig) {
    let mut changes = node.store().hub.subscribe();
    let mut leader_since = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            r = changes.recv() => match r {
                Ok(_) | Err(RecvError::Lagged(_)) => {
                    // Let a burst of changes land before looking.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    while changes.try_recv().is_ok() {}
                }
                Err(RecvError::Closed) => return,
            },
        }
        if !node.is_leader() {
            leader_since = None;
            continue;
        }
        let since = *leader_since.get_or_insert_with(Utc::now);
        let clock = Clock::new(Utc::now(), since);
        let plans = {
            let state = node.store().read();
            scheduler::reconcile(&state, &clock, &cfg)
        };
        for plan in plans {
            let cmd = Command {
                request_id: String::new(),
                now: clock.stamp.clone(),
                op: Op::Plan(plan),
                user: String::new(),
            };
            match node.propose(cmd).await {
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
