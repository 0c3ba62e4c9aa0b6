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
    tx: broadcast::Sender<Arc<Change>>,
}

struct History {
    changes: VecDeque<Arc<Change>>,
    /// Watches may resume from any version ≥ floor; older ones must re-list.
    floor: u64,
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

impl WatchHub {
    pub fn new(floor: u64) -> Self {
        let (tx, _) = broadcast::channel(8192);
        WatchHub {
            inner: Mutex::new(History {
                changes: VecDeque::new(),
                floor,
            }),
            tx,
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
            let _ = self.tx.send(c);
        }
        while h.changes.len() > HISTORY {
            if let Some(old) = h.changes.pop_front() {
                h.floor = h.floor.max(old.resource_version);
            }
        }
    }

    /// After a snapshot is installed nothing before it can be replayed.
    pub fn reset(&self, floor: u64) {
        let mut h = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        h.changes.clear();
        h.floor = floor;
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
            live: self.tx.subscribe(),
        })
    }

    /// The live feed alone, for a watch that starts with a full listing.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        let _h = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        self.tx.subscribe()
    }
}
