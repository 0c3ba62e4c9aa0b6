//! `tbctl snapshot save FILE`: a backup of the whole cluster, checked and written whole.
//!
//! The controller streams a snapshot file (`tb_api::snapshot_file`) taken on the leader after
//! every acknowledged write. tbctl checks it as a restore would (header, length, checksum)
//! before it replaces FILE, and writes it mode 0600 to a temporary file beside FILE that is
//! renamed over it: FILE is either the old backup or the new one, never half of one, and never
//! readable by others — it holds the hashes of every token and credential.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use tb_api::snapshot_file;

use super::Ctx;
use crate::args::SnapshotCommand;
use crate::output::emit;

/// A snapshot larger than this is refused rather than held in memory.
const MAX_SNAPSHOT_BYTES: usize = 8 << 30;

pub async fn run(ctx: &mut Ctx, cmd: SnapshotCommand) -> Result<()> {
    match cmd {
        SnapshotCommand::Save { file } => save(ctx, &file).await,
    }
}

async fn save(ctx: &mut Ctx, file: &Path) -> Result<()> {
    let started = Instant::now();
    let mut stream = ctx.client().save_snapshot().await?;
    let mut bytes = Vec::new();
    while let Some(chunk) = stream
        .message()
        .await
        .map_err(|e| anyhow::anyhow!("receiving the snapshot: {}", e.message()))?
    {
        if bytes.len() + chunk.data.len() > MAX_SNAPSHOT_BYTES {
            bail!("the snapshot is larger than {MAX_SNAPSHOT_BYTES} bytes; not saved");
        }
        bytes.extend_from_slice(&chunk.data);
    }
    let (header, _) = snapshot_file::decode(&bytes)
        .map_err(|e| anyhow::anyhow!("the controller sent a bad snapshot: {e}; not saved"))?;
    write_private_atomically(file, &bytes)?;
    let cluster = if header.cluster_id.is_empty() {
        "the cluster".to_string()
    } else {
        format!("cluster {}", header.cluster_id)
    };
    emit(&format!(
        "saved {cluster} at revision {} to {} ({} bytes, sha256 {}) in {} ms\n",
        header.revision,
        file.display(),
        bytes.len(),
        header.body_sha256,
        started.elapsed().as_millis()
    ))
}

/// Write `bytes` to a 0600 temporary file beside `path`, flush it to disk and rename it over
/// `path`.
pub(crate) fn write_private_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .context("FILE: expected a file name")?;
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts.open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // The rename itself must survive a crash.
        std::fs::File::open(dir)?.sync_all()
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_file_is_private_and_replaced_whole() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("backup.tbsnap");
        std::fs::write(&path, "old").expect("write");
        write_private_atomically(&path, b"new").expect("write");
        assert_eq!(std::fs::read(&path).expect("read"), b"new");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let left: Vec<_> = std::fs::read_dir(tmp.path()).expect("ls").collect();
        assert_eq!(left.len(), 1, "no temporary file left");
    }
}
