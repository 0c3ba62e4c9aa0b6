//! openraft's state machine over tb's object store.
//!
//! Applying is pure and in memory (`store::State`); durability comes from the redb log plus
//! snapshots that are written to redb with `Durability::Immediate` before openraft may purge
//! the log they cover. On start the latest snapshot is loaded and openraft replays the
//! committed log after it.

use std::io::{self, Cursor};
use std::sync::{Arc, RwLock};

use futures::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use redb::{Database, ReadableDatabase, TableDefinition};

use super::log_store::{blocking, io_err};
use super::{LogId, Snapshot, SnapshotMeta, StoredMembership, TypeConfig};
use crate::metrics::Metrics;
use crate::store::{Response, State, WatchHub};

const SNAPSHOT: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshot");
/// The snapshot's metadata (JSON) and its data (the store as JSON), kept apart so the data is
/// written as it is rather than encoded a second time.
const META: &str = "meta";
const DATA: &str = "data";

/// The store as the API sees it: the state to read and the hub to watch.
pub struct Shared {
    pub state: RwLock<State>,
    pub hub: WatchHub,
}

impl Shared {
    pub fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }
}

struct StoredSnapshot {
    meta: SnapshotMeta,
    data: Vec<u8>,
}

pub struct StateMachine {
    db: Arc<Database>,
    shared: Arc<Shared>,
    applied: Option<LogId>,
    membership: StoredMembership,
    metrics: Arc<Metrics>,
}

impl StateMachine {
    /// Open the state machine from the latest durable snapshot, if any.
    pub fn open(db: Arc<Database>, metrics: Arc<Metrics>) -> io::Result<Self> {
        let tx = db.begin_write().map_err(io_err)?;
        tx.open_table(SNAPSHOT).map_err(io_err)?;
        tx.commit().map_err(io_err)?;
        let (state, applied, membership) = match read_snapshot(&db)? {
            Some(s) => {
                let state: State = serde_json::from_slice(&s.data).map_err(io_err)?;
                (state, s.meta.last_log_id, s.meta.last_membership)
            }
            None => (State::default(), None, StoredMembership::default()),
        };
        let floor = applied.map(|l| l.index).unwrap_or(0);
        Ok(StateMachine {
            db,
            shared: Arc::new(Shared {
                state: RwLock::new(state),
                hub: WatchHub::new(floor),
            }),
            applied,
            membership,
            metrics,
        })
    }

    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }
}

fn read_snapshot(db: &Database) -> io::Result<Option<StoredSnapshot>> {
    let tx = db.begin_read().map_err(io_err)?;
    let table = tx.open_table(SNAPSHOT).map_err(io_err)?;
    let (Some(meta), Some(data)) = (
        redb::ReadableTable::get(&table, META).map_err(io_err)?,
        redb::ReadableTable::get(&table, DATA).map_err(io_err)?,
    ) else {
        return Ok(None);
    };
    Ok(Some(StoredSnapshot {
        meta: serde_json::from_slice(meta.value()).map_err(io_err)?,
        data: data.value().to_vec(),
    }))
}

/// Write a snapshot durably; the data buffer is handed back for the caller to use.
async fn write_snapshot(
    db: Arc<Database>,
    meta: &SnapshotMeta,
    data: Vec<u8>,
) -> io::Result<Vec<u8>> {
    let meta = serde_json::to_vec(meta).map_err(io_err)?;
    blocking(move || {
        let tx = db.begin_write().map_err(io_err)?;
        {
            let mut table = tx.open_table(SNAPSHOT).map_err(io_err)?;
            table.insert(META, meta.as_slice()).map_err(io_err)?;
            table.insert(DATA, data.as_slice()).map_err(io_err)?;
        }
        tx.commit().map_err(io_err)?;
        Ok(data)
    })
    .await
}

/// Write the snapshot a restored member starts from.
pub(super) fn write_restored_snapshot(
    db: &Database,
    meta: &SnapshotMeta,
    data: &[u8],
) -> io::Result<()> {
    let meta = serde_json::to_vec(meta).map_err(io_err)?;
    let tx = db.begin_write().map_err(io_err)?;
    {
        let mut table = tx.open_table(SNAPSHOT).map_err(io_err)?;
        table.insert(META, meta.as_slice()).map_err(io_err)?;
        table.insert(DATA, data).map_err(io_err)?;
    }
    tx.commit().map_err(io_err)
}

/// Builds a snapshot from a copy of the state taken when the build was requested.
pub struct SnapshotBuilder {
    db: Arc<Database>,
    state: State,
    meta: SnapshotMeta,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = Cursor<Vec<u8>>;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let state = std::mem::take(&mut self.state);
        let data = blocking(move || serde_json::to_vec(&state).map_err(io_err)).await?;
        let data = write_snapshot(self.db.clone(), &self.meta, data).await?;
        tracing::info!(last = ?self.meta.last_log_id, bytes = data.len(), "snapshot built");
        Ok(Snapshot {
            meta: self.meta.clone(),
            snapshot: Cursor::new(data),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = Cursor<Vec<u8>>;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        Ok((self.applied, self.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        // Gather first: the state lock must not be held across an await.
        let mut batch = Vec::new();
        while let Some(item) = entries.try_next().await? {
            batch.push(item);
        }
        let started = std::time::Instant::now();
        let mut replies = Vec::with_capacity(batch.len());
        {
            let mut state = self.shared.state.write().unwrap_or_else(|e| e.into_inner());
            for (entry, responder) in batch {
                let index = entry.log_id.index;
                self.applied = Some(entry.log_id);
                let response = match entry.payload {
                    EntryPayload::Normal(cmd) => {
                        let (response, changes) = state.apply(index, &cmd);
                        // Published under the state lock: a watcher that lists and subscribes
                        // under the read lock sees every change once.
                        self.shared.hub.publish(changes);
                        response
                    }
                    EntryPayload::Membership(m) => {
                        self.membership = StoredMembership::new(Some(entry.log_id), m);
                        state.skip(index);
                        Response::None
                    }
                    EntryPayload::Blank => {
                        state.skip(index);
                        Response::None
                    }
                };
                if let Some(r) = responder {
                    replies.push((r, response));
                }
            }
        }
        self.metrics.observe_apply(started.elapsed());
        for (r, response) in replies {
            r.send(response);
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            db: self.db.clone(),
            state: self.shared.read().clone(),
            meta: SnapshotMeta {
                last_log_id: self.applied,
                last_membership: self.membership.clone(),
            },
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Self::SnapshotData,
    ) -> Result<(), io::Error> {
        let data = snapshot.into_inner();
        let (state, data) = blocking(move || {
            let state: State = serde_json::from_slice(&data).map_err(io_err)?;
            Ok((state, data))
        })
        .await?;
        write_snapshot(self.db.clone(), meta, data).await?;
        let floor = meta.last_log_id.map(|l| l.index).unwrap_or(0);
        {
            let mut current = self.shared.state.write().unwrap_or_else(|e| e.into_inner());
            *current = state;
            self.shared.hub.reset(floor);
        }
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        tracing::info!(last = ?meta.last_log_id, "snapshot installed");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let db = self.db.clone();
        let stored = blocking(move || read_snapshot(&db)).await?;
        Ok(stored.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Cursor::new(s.data),
        }))
    }
}
