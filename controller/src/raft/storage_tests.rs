//! openraft's own storage conformance suite, run against the redb log store and the state
//! machine: every guarantee openraft relies on (log state, truncation, purge, vote, membership
//! from log and snapshot, snapshot install) is checked on the real storage code.

use std::sync::Arc;

use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::type_config::TypeConfigExt;

use super::TypeConfig;
use super::log_store::LogStore;
use super::state_machine::StateMachine;

struct RedbBuilder;

fn storage_error(e: impl std::error::Error + 'static) -> StorageError<TypeConfig> {
    StorageError::read(TypeConfig::err_from_error(&e))
}

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for RedbBuilder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().map_err(storage_error)?;
        let db = redb::Database::create(dir.path().join("tb.redb")).map_err(storage_error)?;
        let db = Arc::new(db);
        let log = LogStore::new(db.clone(), None).map_err(storage_error)?;
        let sm = StateMachine::open(db, Default::default()).map_err(storage_error)?;
        Ok((dir, log, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_storage_passes_openraft_suite() {
    Suite::test_all(RedbBuilder).await.expect("storage suite");
}
