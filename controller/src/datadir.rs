//! The controller's data directory holds the Raft log and state (`tb.redb`), the cluster CA's
//! key, the cluster secret and the first admin's token: the directory is kept 0700 and every
//! file in it 0600, set when they are made and corrected at every start for a directory made by
//! an older version (or by hand) with looser modes.
//!
//! It also holds its format version (`format-version`): what a tb-controller must understand
//! to read the directory. A directory without one is of format 1 (made before the record was
//! written) and gets one; a directory of a newer format than this build reads is refused
//! before anything in it is opened, so an older tb-controller never misreads or rewrites what a
//! newer one wrote.

use std::path::Path;

use anyhow::Context;

/// The directory's mode: the service's account only.
pub const DIR_MODE: u32 = 0o700;
/// Every file's mode.
pub const FILE_MODE: u32 = 0o600;

/// The file that holds the data dir's format version.
pub const FORMAT_FILE: &str = "format-version";
/// The newest data dir format this build reads (and the one it writes).
pub const FORMAT: u32 = 1;

/// Refuse a data dir of a newer format than this build reads (or whose record is unreadable);
/// returns the directory's format, None for a directory without a record (new, or of format
/// 1 made before the record was written).
pub fn check_format(dir: &Path) -> anyhow::Result<Option<u32>> {
    let path = dir.join(FORMAT_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let version: u32 = text.trim().parse().map_err(|_| {
        anyhow::anyhow!(
            "{}: expected a format version (a number), found \"{}\"",
            path.display(),
            tb_api::bounds::Quoted(text.trim())
        )
    })?;
    if version > FORMAT {
        anyhow::bail!(
            "data dir {} has format version {version}; this tb-controller reads up to {FORMAT} \
             — upgrade tb-controller",
            dir.display()
        );
    }
    Ok(Some(version))
}

/// Record this build's format in `dir` when it has no record yet (0600, written whole).
pub fn record_format(dir: &Path) -> anyhow::Result<()> {
    if check_format(dir)?.is_some() {
        return Ok(());
    }
    crate::auth::write_private(&dir.join(FORMAT_FILE), &format!("{FORMAT}\n"))
        .with_context(|| format!("writing {}", dir.join(FORMAT_FILE).display()))
}

/// Create `dir` (0700) or tighten it and its files; `db_file` (in `dir`) is created empty with
/// mode 0600 when missing, so the database never exists with the default mode. Returns what was
/// corrected, for the log.
pub fn prepare(dir: &Path, db_file: &str) -> anyhow::Result<Vec<String>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating data dir {}", dir.display()))?;
    let mut fixed = Vec::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        tighten(dir, DIR_MODE, &mut fixed)?;
        let db = dir.join(db_file);
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(FILE_MODE)
            .open(&db)
            .with_context(|| format!("creating {}", db.display()))?;
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
            let meta = entry
                .metadata()
                .with_context(|| format!("reading {}", entry.path().display()))?;
            let want = if meta.is_dir() { DIR_MODE } else { FILE_MODE };
            // Symlinks are left alone: their targets are not ours to change.
            if meta.is_dir() || meta.is_file() {
                tighten(&entry.path(), want, &mut fixed)?;
            }
        }
    }
    Ok(fixed)
}

/// Set `path` to mode `want` unless it has it already.
#[cfg(unix)]
fn tighten(path: &Path, want: u32, fixed: &mut Vec<String>) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode != want {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(want))
            .with_context(|| format!("chmod {want:o} {}", path.display()))?;
        fixed.push(format!("{} {mode:o} -> {want:o}", path.display()));
    }
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).expect("stat").permissions().mode() & 0o7777
    }

    #[test]
    fn a_new_dir_is_private_and_so_is_its_database() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("data");
        prepare(&dir, "tb.redb").expect("prepare");
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("tb.redb")), 0o600);
    }

    #[test]
    fn a_dir_without_a_format_is_version_1_and_a_newer_one_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("data");
        prepare(&dir, "tb.redb").expect("prepare");
        assert_eq!(check_format(&dir).expect("no record"), None);
        record_format(&dir).expect("record");
        assert_eq!(check_format(&dir).expect("recorded"), Some(FORMAT));
        assert_eq!(mode(&dir.join(FORMAT_FILE)), 0o600);
        std::fs::write(dir.join(FORMAT_FILE), format!("{}\n", FORMAT + 1)).expect("write");
        let e = check_format(&dir).expect_err("newer").to_string();
        assert!(
            e.contains(&format!("has format version {}", FORMAT + 1))
                && e.contains(&format!("reads up to {FORMAT}"))
                && e.contains("upgrade tb-controller"),
            "{e}"
        );
        assert!(
            record_format(&dir).is_err(),
            "a newer record is never overwritten"
        );
        std::fs::write(dir.join(FORMAT_FILE), "banana\n").expect("write");
        let e = check_format(&dir).expect_err("garbage").to_string();
        assert!(e.contains("expected a format version"), "{e}");
    }

    #[test]
    fn loose_modes_are_corrected_and_contents_kept() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("data");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let db = dir.join("tb.redb");
        std::fs::write(&db, b"data").expect("write");
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let key = dir.join("ca.key");
        std::fs::write(&key, b"key").expect("write");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        let fixed = prepare(&dir, "tb.redb").expect("prepare");
        assert_eq!(fixed.len(), 3, "{fixed:?}");
        assert_eq!((mode(&dir), mode(&db), mode(&key)), (0o700, 0o600, 0o600));
        assert_eq!(std::fs::read(&db).expect("read"), b"data", "not truncated");
        assert!(prepare(&dir, "tb.redb").expect("again").is_empty());
    }
}
