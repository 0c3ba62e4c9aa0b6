//! The Raft log and vote, durable in redb.
//!
//! Every append is one redb write transaction committed with `Durability::Immediate` on a
//! blocking thread; openraft is told the entries are flushed only after that commit returns.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::{LogState, OptionalSend, RaftLogReader};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use super::{Entry, LogId, TypeConfig, Vote};

pub(super) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
pub(super) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");

const VOTE: &str = "vote";
const COMMITTED: &str = "committed";
const LAST_PURGED: &str = "last_purged";

#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
}

pub(super) fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

impl LogStore {
    pub fn new(db: Arc<Database>) -> io::Result<Self> {
        let tx = db.begin_write().map_err(io_err)?;
        tx.open_table(LOG).map_err(io_err)?;
        tx.open_table(META).map_err(io_err)?;
        tx.commit().map_err(io_err)?;
        Ok(LogStore { db })
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, key: &str) -> io::Result<Option<T>> {
        let tx = self.db.begin_read().map_err(io_err)?;
        let table = tx.open_table(META).map_err(io_err)?;
        match table.get(key).map_err(io_err)? {
            None => Ok(None),
            Some(v) => serde_json::from_slice(v.value()).map(Some).map_err(io_err),
        }
    }

    /// Write one metadata value, durably when `durable`.
    async fn put_meta<T: serde::Serialize>(&self, key: &'static str, value: &T, durable: bool) -> io::Result<()> {
        let bytes = serde_json::to_vec(value).map_err(io_err)?;
        let db = self.db.clone();
        blocking(move || {
            let mut tx = db.begin_write().map_err(io_err)?;
            if !durable {
                tx.set_durability(Durability::None).map_err(io_err)?;
            }
            {
                let mut table = tx.open_table(META).map_err(io_err)?;
                table.insert(key, bytes.as_slice()).map_err(io_err)?;
            }
            tx.commit().map_err(io_err)
        })
        .await
    }
}

/// Run redb work on a blocking thread: commits fsync and must not stall the async runtime.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(io_err)?
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
        let tx = self.db.begin_read().map_err(io_err)?;
        let table = tx.open_table(LOG).map_err(io_err)?;
        let mut entries = Vec::new();
        for item in table.range::<u64>((Bound::Included(start), end)).map_err(io_err)? {
            let (_, v) = item.map_err(io_err)?;
            entries.push(serde_json::from_slice(v.value()).map_err(io_err)?);
        }
        Ok(entries)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        self.get_meta(VOTE)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let last_purged: Option<LogId> = self.get_meta(LAST_PURGED)?;
        let tx = self.db.begin_read().map_err(io_err)?;
        let table = tx.open_table(LOG).map_err(io_err)?;
        let last = match table.last().map_err(io_err)? {
            Some((_, v)) => {
                let e: Entry = serde_json::from_slice(v.value()).map_err(io_err)?;
                Some(e.log_id)
            }
            None => last_purged,
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        self.put_meta(VOTE, vote, true).await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        // Only a hint for replay after restart; the next durable append flushes it.
        self.put_meta(COMMITTED, &committed, false).await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.get_meta::<Option<LogId>>(COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut encoded = Vec::new();
        for e in entries {
            encoded.push((e.log_id.index, serde_json::to_vec(&e).map_err(io_err)?));
        }
        let db = self.db.clone();
        let res = blocking(move || {
            let tx = db.begin_write().map_err(io_err)?;
            {
                let mut table = tx.open_table(LOG).map_err(io_err)?;
                for (index, bytes) in &encoded {
                    table.insert(*index, bytes.as_slice()).map_err(io_err)?;
                }
            }
            tx.commit().map_err(io_err)
        })
        .await;
        match res {
            Ok(()) => {
                callback.io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.io_completed(Err(io_err(&e)));
                Err(e)
            }
        }
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = last_log_id.map(|l| l.index + 1).unwrap_or(0);
        let db = self.db.clone();
        blocking(move || {
            let tx = db.begin_write().map_err(io_err)?;
            {
                let mut table = tx.open_table(LOG).map_err(io_err)?;
                table.retain_in::<u64, _>(from.., |_, _| false).map_err(io_err)?;
            }
            tx.commit().map_err(io_err)
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        let upto = log_id.index;
        let bytes = serde_json::to_vec(&log_id).map_err(io_err)?;
        let db = self.db.clone();
        blocking(move || {
            let mut tx = db.begin_write().map_err(io_err)?;
            // Purged entries are covered by a durable snapshot; losing this write on a crash
            // only means purging them again.
            tx.set_durability(Durability::None).map_err(io_err)?;
            {
                let mut meta = tx.open_table(META).map_err(io_err)?;
                meta.insert(LAST_PURGED, bytes.as_slice()).map_err(io_err)?;
                let mut table = tx.open_table(LOG).map_err(io_err)?;
                table.retain_in::<u64, _>(..=upto, |_, _| false).map_err(io_err)?;
            }
            tx.commit().map_err(io_err)
        })
        .await
    }
}
