//! `tb-controller restore FILE --data-dir D`: a new data dir from a snapshot file
//! (`tbctl snapshot save`), holding every object, user, token and schedule of the cluster the
//! snapshot was taken of, as a new cluster of one member with a new cluster id. Started on `D`,
//! tb-controller serves them; more members are added with `tbctl cluster add-member`.
//!
//! The file is checked whole (its header: kind, format, length, checksum) before anything is
//! written, and the data dir must be new or empty, so a restore never mixes two stores.

use std::path::{Path, PathBuf};

use anyhow::Context;
use tb_api::snapshot_file;

use crate::raft::NodeId;
use crate::store::State;

/// What a restore wrote, for the message that ends it.
#[derive(Debug)]
pub struct Restored {
    pub data_dir: PathBuf,
    pub from_cluster: String,
    pub cluster_id: String,
    pub revision: u64,
    pub objects: usize,
    pub users: usize,
    pub schedules: usize,
}

/// Read and check `file`, then write a new data dir `data_dir` from it for member `id`, which
/// others will reach at `addr`.
pub fn restore(file: &Path, data_dir: &Path, id: NodeId, addr: &str) -> anyhow::Result<Restored> {
    if id == 0 {
        anyhow::bail!("--id: controller ids start at 1");
    }
    refuse_non_empty(data_dir)?;
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let (header, body) = snapshot_file::decode(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: {e}; nothing was restored", file.display()))?;
    let mut state: State = serde_json::from_slice(body).with_context(|| {
        format!(
            "{}: the snapshot's store does not decode (written by another tb version?)",
            file.display()
        )
    })?;
    // A new cluster: its own id, so that what it writes is never taken for the original's.
    state.cluster_id = uuid::Uuid::new_v4().to_string();
    let data = serde_json::to_vec(&state).context("encoding the restored store")?;
    crate::datadir::prepare(data_dir, crate::raft::DB_FILE)?;
    crate::datadir::record_format(data_dir)?;
    let db = data_dir.join(crate::raft::DB_FILE);
    // `prepare` made the database file empty (mode 0600); redb fills it.
    crate::raft::write_restored(&db, id, addr, &data, header.revision.max(state.revision))?;
    Ok(Restored {
        data_dir: data_dir.to_path_buf(),
        from_cluster: header.cluster_id,
        cluster_id: state.cluster_id.clone(),
        revision: header.revision,
        objects: state.objects.len(),
        users: state.users.len(),
        schedules: state
            .objects
            .keys()
            .filter(|k| k.starts_with("Schedule/"))
            .count(),
    })
}

fn refuse_non_empty(dir: &Path) -> anyhow::Result<()> {
    match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("reading {}", dir.display())),
        Ok(mut entries) => {
            if entries.next().is_some() {
                anyhow::bail!(
                    "data dir {} is not empty: restore writes a new data dir (give a new or empty \
                     directory; a running cluster's data dir is never restored over)",
                    dir.display()
                );
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot_of(state: &State) -> Vec<u8> {
        let body = serde_json::to_vec(state).expect("json");
        let header = snapshot_file::SnapshotHeader::for_body(
            &state.cluster_id,
            state.revision,
            "2026-01-01T00:00:00.000Z",
            &body,
        );
        snapshot_file::encode(&header, &body)
    }

    #[test]
    fn refuses_a_non_empty_dir_and_a_bad_file_and_writes_nothing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let state = State {
            revision: 7,
            cluster_id: "old".into(),
            ..State::default()
        };
        let file = tmp.path().join("s.tbsnap");
        std::fs::write(&file, snapshot_of(&state)).expect("write");
        let full = tmp.path().join("full");
        std::fs::create_dir(&full).expect("mkdir");
        std::fs::write(full.join("x"), "x").expect("write");
        let e = restore(&file, &full, 1, "127.0.0.1:7400").expect_err("non-empty");
        assert!(e.to_string().contains("is not empty"), "{e}");

        let bytes = std::fs::read(&file).expect("read");
        std::fs::write(&file, &bytes[..bytes.len() - 3]).expect("truncate");
        let fresh = tmp.path().join("fresh");
        let e = restore(&file, &fresh, 1, "127.0.0.1:7400").expect_err("truncated");
        assert!(format!("{e:#}").contains("truncated"), "{e:#}");
        assert!(!fresh.exists(), "nothing written for a bad file");

        std::fs::write(&file, &bytes).expect("write");
        let r = restore(&file, &fresh, 1, "127.0.0.1:7400").expect("restore");
        assert_eq!(r.from_cluster, "old");
        assert_ne!(r.cluster_id, "old");
        assert_eq!(r.revision, 7);
        assert!(fresh.join(crate::raft::DB_FILE).exists());
        assert_eq!(
            crate::datadir::check_format(&fresh).expect("format"),
            Some(crate::datadir::FORMAT)
        );
    }
}
