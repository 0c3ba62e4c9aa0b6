//! Recent changes kept in memory, so a watch can resume from a resourceVersion, and a broadcast
//! of new ones.
//!
//! History is per member and starts where this member's process started applying; the log
//! indices are the same on every member, so a client may resume on any of them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use super::state::Change;

/// How many changes a member remembers for watches that resume.
pub const HISTORY: usize = 20_000;

pub struct WatchHub {
    inner: Mutex<History>,
}

struct History {
    changes: VecDeque<Arc<Change>>,
    /// Watches may resume from any version ≥ floor; older ones must re-list.
    floor: u64,
    /// The live feed. Replaced when a snapshot is installed: the feeds handed out before it are
    /// closed, since the changes the snapshot covered are never published to them.
    tx: broadcast::Sender<Arc<Change>>,
}

/// A resumed watch: the changes after the requested version, then the live feed.
pub struct Resume {
    pub backlog: Vec<Arc<Change>>,
    pub live: broadcast::Receiver<Arc<Change>>,
}

#[derive(Debug, thiserror::Error)]
#[error(
    "resourceVersion {requested} is too old (this controller keeps changes after {floor}); re-list and watch from the list's resourceVersion"
)]
pub struct TooOld {
    pub requested: u64,
    pub floor: u64,
}

fn feed() -> broadcast::Sender<Arc<Change>> {
    broadcast::channel(8192).0
}

impl WatchHub {
    pub fn new(floor: u64) -> Self {
        WatchHub {
            inner: Mutex::new(History {
                changes: VecDeque::new(),
                floor,
                tx: feed(),
            }),
        }
    }

    /// Record changes just applied and tell live watchers.
    pub fn publish(&self, changes: Vec<Change>) {
        if changes.is_empty() {
            return;
        }
        let mut h = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for c in changes {
            let c = Arc::new(c);
            h.changes.push_back(c.clone());
            // Sent under the lock so a resuming watcher sees each change exactly once.
            let _ = h.tx.send(c);
        }
        while h.changes.len() > HISTORY {
            if let Some(old) = h.changes.pop_front() {
                h.floor = h.floor.max(old.resource_version);
            }
        }
    }

    /// After a snapshot is installed nothing before it can be replayed, and every live feed
    /// ends (its receivers see `Closed`): a watcher must re-list, or it would never hear of
    /// what the snapshot changed.
    pub fn reset(&self, floor: u64) {
        let mut h = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        h.changes.clear();
        h.floor = floor;
        h.tx = feed();
    }

    /// Changes strictly after `from`, then everything new.
    pub fn resume(&self, from: u64) -> Result<Resume, TooOld> {
        let h = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if from < h.floor {
            return Err(TooOld {
                requested: from,
                floor: h.floor,
            });
        }
        let backlog = h
            .changes
            .iter()
            .filter(|c| c.resource_version > from)
            .cloned()
            .collect();
        Ok(Resume {
            backlog,
            live: h.tx.subscribe(),
        })
    }

    /// The live feed alone, for a watch that starts with a full listing.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        let h = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        h.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::state::ChangeKind;
    use tokio::sync::broadcast::error::TryRecvError;

    fn change(rv: u64) -> Change {
        Change {
            kind: ChangeKind::Added,
            object: Arc::new(tb_api::Object {
                api_version: tb_api::API_VERSION.into(),
                kind: "Model".into(),
                metadata: tb_api::ObjectMeta::default(),
                spec: serde_json::Value::Null,
                status: serde_json::Value::Null,
            }),
            resource_version: rv,
        }
    }

    #[test]
    fn a_snapshot_ends_every_live_feed_and_history_before_it() {
        let hub = WatchHub::new(0);
        hub.publish(vec![change(1), change(2)]);
        let mut listing = hub.subscribe();
        let mut resumed = hub.resume(1).expect("resume").live;
        hub.publish(vec![change(3)]);
        hub.reset(10);
        for feed in [&mut listing, &mut resumed] {
            assert_eq!(feed.try_recv().map(|c| c.resource_version), Ok(3));
            assert!(matches!(feed.try_recv(), Err(TryRecvError::Closed)));
        }
        assert!(hub.resume(5).is_err(), "covered by the snapshot");
        let mut after = hub.resume(10).expect("resume at the snapshot");
        assert!(after.backlog.is_empty());
        hub.publish(vec![change(11)]);
        assert_eq!(after.live.try_recv().map(|c| c.resource_version), Ok(11));
    }
}
