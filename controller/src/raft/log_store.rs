//! The Raft log and vote, durable in redb.
//!
//! Appends are handed to one writer thread that commits everything queued since its last commit
//! in a single redb transaction with `Durability::Immediate` (group commit), then tells openraft
//! the entries are flushed. Until then the entries are served from memory, so `append` returns
//! at once and Raft replicates to followers while the leader's own fsync is under way.
//! Truncations and purges go through the same queue, so the disk sees every change in order.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex, mpsc};

use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::{LogState, OptionalSend, RaftLogReader};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use super::{Entry, LogId, TypeConfig, Vote};

pub(super) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
pub(super) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");

const VOTE: &str = "vote";
const COMMITTED: &str = "committed";
const LAST_PURGED: &str = "last_purged";

pub(super) fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Run redb work on a blocking thread: commits fsync and must not stall the async runtime.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(io_err)?
}

/// Work for the writer thread, applied in the order it was queued.
enum Job {
    Append {
        seq: u64,
        entries: Vec<(u64, Vec<u8>)>,
        flushed: IOFlushed<TypeConfig>,
    },
    Truncate {
        seq: u64,
        from: u64,
    },
    Purge {
        upto: u64,
        log_id: Vec<u8>,
    },
    Committed(Vec<u8>),
}

/// What openraft has appended but the disk may not hold yet.
#[derive(Default)]
struct Pending {
    /// Index → (the append's sequence number, the entry).
    entries: BTreeMap<u64, (u64, Entry)>,
    /// Entries on disk at or after this index were truncated; hidden until the disk agrees.
    hide_from: Option<(u64, u64)>,
    next_seq: u64,
    last_log_id: Option<LogId>,
    last_purged: Option<LogId>,
}

struct Shared {
    db: Arc<Database>,
    /// Hints (the committed index, purges) are not written while the disk is low.
    disk: Option<crate::disk_guard::DiskGuard>,
    pending: Mutex<Pending>,
    jobs: Mutex<mpsc::Sender<Job>>,
}

#[derive(Clone)]
pub struct LogStore {
    shared: Arc<Shared>,
}

impl LogStore {
    pub fn new(db: Arc<Database>, disk: Option<crate::disk_guard::DiskGuard>) -> io::Result<Self> {
        let tx = db.begin_write().map_err(io_err)?;
        tx.open_table(LOG).map_err(io_err)?;
        tx.open_table(META).map_err(io_err)?;
        tx.commit().map_err(io_err)?;
        let last_purged: Option<LogId> = get_meta(&db, LAST_PURGED)?;
        let last_log_id = {
            let tx = db.begin_read().map_err(io_err)?;
            let table = tx.open_table(LOG).map_err(io_err)?;
            match table.last().map_err(io_err)? {
                Some((_, v)) => Some(
                    serde_json::from_slice::<Entry>(v.value())
                        .map_err(io_err)?
                        .log_id,
                ),
                None => last_purged,
            }
        };
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            db,
            disk,
            pending: Mutex::new(Pending {
                last_log_id,
                last_purged,
                ..Default::default()
            }),
            jobs: Mutex::new(tx),
        });
        let writer = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("tb-raft-log".into())
            .spawn(move || write_loop(writer, rx))
            .map_err(io_err)?;
        Ok(LogStore { shared })
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.shared
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn queue(&self, job: Job) -> io::Result<()> {
        let jobs = self.shared.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.send(job)
            .map_err(|_| io_err("the raft log writer has stopped"))
    }
}

fn get_meta<T: serde::de::DeserializeOwned>(db: &Database, key: &str) -> io::Result<Option<T>> {
    let tx = db.begin_read().map_err(io_err)?;
    let table = tx.open_table(META).map_err(io_err)?;
    match table.get(key).map_err(io_err)? {
        None => Ok(None),
        Some(v) => serde_json::from_slice(v.value()).map(Some).map_err(io_err),
    }
}

/// Start a restored member's log after `last`, the snapshot it starts from: nothing to replay,
/// and `last` counts as committed (it was, in the cluster the snapshot was taken of).
pub(super) fn write_restored_floor(db: &Database, last: &LogId) -> io::Result<()> {
    let purged = serde_json::to_vec(last).map_err(io_err)?;
    let committed = serde_json::to_vec(&Some(*last)).map_err(io_err)?;
    let tx = db.begin_write().map_err(io_err)?;
    {
        tx.open_table(LOG).map_err(io_err)?;
        let mut meta = tx.open_table(META).map_err(io_err)?;
        meta.insert(LAST_PURGED, purged.as_slice())
            .map_err(io_err)?;
        meta.insert(COMMITTED, committed.as_slice())
            .map_err(io_err)?;
    }
    tx.commit().map_err(io_err)
}

/// The writer thread: take every queued job, apply them in one transaction, commit, report.
fn write_loop(shared: std::sync::Weak<Shared>, rx: mpsc::Receiver<Job>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        batch.extend(rx.try_iter());
        let Some(shared) = shared.upgrade() else {
            return;
        };
        // A batch of hints only may be dropped (the committed index is recomputed after a
        // restart, a purge is repeated): while the disk is low, skipping it keeps a full disk
        // from ever failing a redb write, which would leave the database unusable until
        // reopened. Appends are refused earlier (`disk_guard`).
        let hints_only = !batch
            .iter()
            .any(|j| matches!(j, Job::Append { .. } | Job::Truncate { .. }));
        if hints_only
            && let Some(disk) = &shared.disk
            && disk.check().is_err()
        {
            continue;
        }
        let result = commit_batch(&shared.db, &batch);
        let mut pending = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
        for job in batch {
            match job {
                Job::Append {
                    seq,
                    entries,
                    flushed,
                } => {
                    if result.is_ok() {
                        for (index, _) in &entries {
                            // A later append may have replaced the entry; keep that one.
                            if pending.entries.get(index).is_some_and(|(s, _)| *s == seq) {
                                pending.entries.remove(index);
                            }
                        }
                    }
                    flushed.io_completed(result.as_ref().map(|_| ()).map_err(io_err));
                }
                Job::Truncate { seq, .. } => {
                    if result.is_ok() && pending.hide_from.is_some_and(|(_, s)| s == seq) {
                        pending.hide_from = None;
                    }
                }
                Job::Purge { .. } | Job::Committed(_) => {}
            }
        }
        if let Err(e) = result {
            tracing::error!("raft log write failed: {e}");
        }
    }
}

fn commit_batch(db: &Database, batch: &[Job]) -> io::Result<()> {
    let mut tx = db.begin_write().map_err(io_err)?;
    // Only appends must be durable before they are acknowledged; the rest can ride along with
    // the next durable commit.
    if !batch.iter().any(|j| matches!(j, Job::Append { .. })) {
        tx.set_durability(Durability::None).map_err(io_err)?;
    }
    {
        let mut log = tx.open_table(LOG).map_err(io_err)?;
        let mut meta = tx.open_table(META).map_err(io_err)?;
        for job in batch {
            match job {
                Job::Append { entries, .. } => {
                    for (index, bytes) in entries {
                        log.insert(*index, bytes.as_slice()).map_err(io_err)?;
                    }
                }
                Job::Truncate { from, .. } => {
                    log.retain_in::<u64, _>(*from.., |_, _| false)
                        .map_err(io_err)?;
                }
                Job::Purge { upto, log_id } => {
                    meta.insert(LAST_PURGED, log_id.as_slice())
                        .map_err(io_err)?;
                    log.retain_in::<u64, _>(..=*upto, |_, _| false)
                        .map_err(io_err)?;
                }
                Job::Committed(bytes) => {
                    meta.insert(COMMITTED, bytes.as_slice()).map_err(io_err)?;
                }
            }
        }
    }
    tx.commit().map_err(io_err)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let start = match range.start_bound() {
            Bound::Included(x) => *x,
            Bound::Excluded(x) => x.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(x) => Bound::Included(*x),
            Bound::Excluded(x) => Bound::Excluded(*x),
            Bound::Unbounded => Bound::Unbounded,
        };
        // Memory first: whatever the writer commits meanwhile is then in both, and memory wins.
        let (mut found, hide_from): (BTreeMap<u64, Entry>, Option<u64>) = {
            let p = self.pending();
            let found = p
                .entries
                .range((Bound::Included(start), end))
                .map(|(i, (_, e))| (*i, e.clone()))
                .collect();
            (found, p.hide_from.map(|(from, _)| from))
        };
        let tx = self.shared.db.begin_read().map_err(io_err)?;
        let table = tx.open_table(LOG).map_err(io_err)?;
        for item in table
            .range::<u64>((Bound::Included(start), end))
            .map_err(io_err)?
        {
            let (k, v) = item.map_err(io_err)?;
            let index = k.value();
            if hide_from.is_some_and(|h| index >= h) || found.contains_key(&index) {
                continue;
            }
            found.insert(index, serde_json::from_slice(v.value()).map_err(io_err)?);
        }
        Ok(found.into_values().collect())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        get_meta(&self.shared.db, VOTE)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let p = self.pending();
        Ok(LogState {
            last_purged_log_id: p.last_purged,
            last_log_id: p.last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let bytes = serde_json::to_vec(vote).map_err(io_err)?;
        let db = self.shared.db.clone();
        // A vote must be on disk before it is acted on.
        blocking(move || {
            let tx = db.begin_write().map_err(io_err)?;
            {
                let mut meta = tx.open_table(META).map_err(io_err)?;
                meta.insert(VOTE, bytes.as_slice()).map_err(io_err)?;
            }
            tx.commit().map_err(io_err)
        })
        .await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        // Only a hint for replay after a restart: written with the next batch.
        let bytes = serde_json::to_vec(&committed).map_err(io_err)?;
        self.queue(Job::Committed(bytes))
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(get_meta::<Option<LogId>>(&self.shared.db, COMMITTED)?.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut encoded = Vec::new();
        let mut kept = Vec::new();
        for e in entries {
            encoded.push((e.log_id.index, serde_json::to_vec(&e).map_err(io_err)?));
            kept.push(e);
        }
        let seq = {
            let mut p = self.pending();
            p.next_seq += 1;
            let seq = p.next_seq;
            if let Some(last) = kept.last() {
                p.last_log_id = Some(last.log_id);
            }
            for e in kept {
                p.entries.insert(e.log_id.index, (seq, e));
            }
            seq
        };
        self.queue(Job::Append {
            seq,
            entries: encoded,
            flushed: callback,
        })
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = last_log_id.map(|l| l.index + 1).unwrap_or(0);
        let seq = {
            let mut p = self.pending();
            p.next_seq += 1;
            let seq = p.next_seq;
            p.entries.retain(|i, _| *i < from);
            let hide = p.hide_from.map_or(from, |(h, _)| h.min(from));
            p.hide_from = Some((hide, seq));
            // Truncating after an index past the end removes nothing.
            if p.last_log_id.is_some_and(|l| l.index >= from) {
                p.last_log_id = last_log_id.or(p.last_purged);
            }
            seq
        };
        self.queue(Job::Truncate { seq, from })
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        {
            let mut p = self.pending();
            p.entries.retain(|i, _| *i > log_id.index);
            p.last_purged = Some(log_id);
            if p.last_log_id.is_none_or(|l| l.index < log_id.index) {
                p.last_log_id = Some(log_id);
            }
        }
        tracing::info!(upto = log_id.index, "log purged");
        // Purged entries are covered by a durable snapshot; losing this on a crash only means
        // purging them again.
        self.queue(Job::Purge {
            upto: log_id.index,
            log_id: serde_json::to_vec(&log_id).map_err(io_err)?,
        })
    }
}
