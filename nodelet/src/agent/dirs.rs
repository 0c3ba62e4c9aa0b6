//! The data dir's layout and who may read what in it. Modes are set explicitly on every
//! create (whatever the umask), and fixed on start for what an earlier version left:
//!
//! ```text
//! DATA_DIR/                 0711 nodelet   jobs may pass through, not list
//!   credential.json node.key node.pem ca.pem accounts.json   0600 nodelet
//!   models/                 0755 / files 0644   staged model shards, read by tb-shard
//!   allocs/ allocs/NS/      0711 nodelet
//!     NAME/                 0711 nodelet   pid, exit.json 0600 nodelet
//!       hostfile.json ibv_devices.json   0600 job account (the rank reads them)
//!       service.key service.crt service-tls.key   0600 job account (rank 0 of a service)
//!       logs/               0700 nodelet   `tbctl logs` reads them through the nodelet
//!       work/               0700 job account   HOME, the default working directory
//!         .tb/              0700 job account   TMPDIR (tmp/), tb-shard's termination message
//! ```
//!
//! The nodelet (root) never follows a link it did not make in a directory a job can write:
//! ownership changes use `lchown`, and what it reads from there is opened with `O_NOFOLLOW`.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, bail};

use super::accounts::Account;

/// Files of the nodelet's own that no one else may read.
pub const PRIVATE_FILES: &[&str] = &[
    "credential.json",
    "node.key",
    "node.pem",
    "ca.pem",
    "accounts.json",
];
/// Where removed allocation dirs wait to be deleted (a rename is instant).
const TRASH: &str = ".trash";

/// An allocation's directories, made ready for its rank.
#[derive(Debug, Clone)]
pub struct AllocDirs {
    pub root: PathBuf,
    /// `work/`: the job's own (HOME).
    pub work: PathBuf,
    /// `work/.tb/`: tb's files the rank writes (termination message, tmp).
    pub tb: PathBuf,
    pub logs: PathBuf,
}

impl AllocDirs {
    pub fn termination_message(&self) -> PathBuf {
        self.tb.join("termination-message")
    }

    pub fn tmp(&self) -> PathBuf {
        self.tb.join("tmp")
    }
}

/// Creates the data dir (0711) and fixes the modes of what is in it.
pub fn secure_data_dir(data_dir: &Path) -> anyhow::Result<()> {
    ensure_dir(data_dir, 0o711, None)?;
    for name in PRIVATE_FILES {
        let p = data_dir.join(name);
        if p.symlink_metadata().is_ok_and(|m| m.is_file()) {
            set_mode(&p, 0o600)?;
        }
    }
    let allocs = data_dir.join("allocs");
    ensure_dir(&allocs, 0o711, None)?;
    for ns in read_dirs(&allocs) {
        set_mode(&ns, 0o711)?;
        for a in read_dirs(&ns) {
            set_mode(&a, 0o711)?;
            let logs = a.join("logs");
            if logs.is_dir() {
                set_mode(&logs, 0o700)?;
            }
            for f in ["pid", "exit.json"] {
                let p = a.join(f);
                if p.symlink_metadata().is_ok_and(|m| m.is_file()) {
                    set_mode(&p, 0o600)?;
                }
            }
        }
    }
    let models = data_dir.join("models");
    if models.is_dir() {
        share_tree(&models);
    }
    Ok(())
}

/// The first directory above (or at) `dir` that other accounts cannot pass through, if any:
/// a job account could not reach its work dir under it.
pub fn untraversable_ancestor(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .find(|a| {
            std::fs::metadata(a).is_ok_and(|m| m.is_dir() && m.permissions().mode() & 0o001 == 0)
        })
        .map(Path::to_path_buf)
}

/// Makes an allocation's directories (see the module doc): the work dir (and `working_dir`
/// under it when relative) belongs to `account`.
pub fn prepare_alloc(
    root: &Path,
    account: Option<&Account>,
    working_dir: Option<&str>,
) -> anyhow::Result<(AllocDirs, PathBuf)> {
    let owner = account.map(|a| (a.uid, a.gid));
    if let Some(parent) = root.parent() {
        ensure_dir(parent, 0o711, None)?;
    }
    ensure_dir(root, 0o711, None)?;
    let dirs = AllocDirs {
        root: root.to_path_buf(),
        work: root.join("work"),
        tb: root.join("work").join(".tb"),
        logs: root.join("logs"),
    };
    ensure_dir(&dirs.logs, 0o700, None)?;
    ensure_dir(&dirs.work, 0o700, owner)?;
    ensure_dir(&dirs.tb, 0o700, owner)?;
    ensure_dir(&dirs.tmp(), 0o700, owner)?;
    let cwd = match working_dir {
        Some(w) if Path::new(w).is_absolute() => {
            let w = PathBuf::from(w);
            // Made by root anywhere it is asked, a directory would be a gift to a job: an
            // account's job must use a directory that exists and that it may enter.
            if account.is_none() {
                std::fs::create_dir_all(&w).with_context(|| format!("creating {}", w.display()))?;
            }
            w
        }
        Some(w) => {
            let mut at = dirs.work.clone();
            for c in Path::new(w).components() {
                match c {
                    Component::Normal(part) => {
                        at.push(part);
                        ensure_dir(&at, 0o700, owner)?;
                    }
                    Component::CurDir => {}
                    _ => bail!("workingDir {w:?}: a relative path may not leave the work dir"),
                }
            }
            at
        }
        None => dirs.work.clone(),
    };
    Ok((dirs, cwd))
}

/// Hands a file the nodelet wrote for the rank to its account, readable by it alone.
pub fn give_file(path: &Path, account: Option<&Account>) -> anyhow::Result<()> {
    if let Some(a) = account {
        std::os::unix::fs::lchown(path, Some(a.uid), Some(a.gid))
            .with_context(|| format!("giving {} to uid {}", path.display(), a.uid))?;
    }
    set_mode(path, 0o600)
}

/// Makes `dir` a real directory with `mode` (and `owner`), replacing a link or file in its
/// place.
pub fn ensure_dir(dir: &Path, mode: u32, owner: Option<(u32, u32)>) -> anyhow::Result<()> {
    match dir.symlink_metadata() {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            std::fs::remove_file(dir).with_context(|| format!("replacing {}", dir.display()))?;
            create_dir(dir, mode)?;
        }
        Err(_) => {
            if let Some(parent) = dir.parent()
                && !parent.as_os_str().is_empty()
                && !parent.exists()
            {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("creating {}", parent.display()))?;
            }
            create_dir(dir, mode)?;
        }
    }
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::lchown(dir, Some(uid), Some(gid))
            .with_context(|| format!("giving {} to uid {uid}", dir.display()))?;
    }
    set_mode(dir, mode)
}

fn create_dir(dir: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating {}", dir.display())),
    }
}

fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting mode {mode:o} on {}", path.display()))
}

/// Writes `bytes` to `path` (0600) through a temporary file and a rename.
pub fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// Reads at most `limit` bytes of a regular file in a directory a job can write, never through
/// a link (the job could point one at a secret for the nodelet to read).
pub fn read_job_file(path: &Path, limit: u64) -> Option<String> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    f.take(limit).read_to_string(&mut text).ok()?;
    Some(text)
}

/// Lets job accounts read a staged model: directories 0755 and files 0644 under `dir`.
pub fn share_tree(dir: &Path) {
    let Ok(meta) = dir.symlink_metadata() else {
        return;
    };
    if meta.is_dir() {
        let _ = set_mode(dir, 0o755);
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            share_tree(&e.path());
        }
    } else if meta.is_file() {
        let _ = set_mode(dir, 0o644);
    }
}

/// Removes an allocation's directory: renamed out of the way at once (a new allocation of the
/// same name gets a fresh one), deleted in the background.
pub fn remove_alloc(data_dir: &Path, dir: &Path) {
    if dir.symlink_metadata().is_err() {
        return;
    }
    let trash = data_dir.join("allocs").join(TRASH);
    let _ = ensure_dir(&trash, 0o700, None);
    let unique = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    );
    let target = trash.join(unique);
    match std::fs::rename(dir, &target) {
        Ok(()) => {
            tracing::info!(dir = %dir.display(), "allocation dir removed");
            std::thread::spawn(move || {
                let _ = std::fs::remove_dir_all(&target);
            });
        }
        Err(e) => tracing::warn!(dir = %dir.display(), %e, "cannot remove the allocation dir"),
    }
}

/// Empties the trash (what an earlier run did not finish deleting).
pub fn empty_trash(data_dir: &Path) {
    let _ = std::fs::remove_dir_all(data_dir.join("allocs").join(TRASH));
}

/// Bytes on disk under `path` (like `du`), not following links.
pub fn disk_usage(path: &Path) -> u64 {
    let Ok(meta) = path.symlink_metadata() else {
        return 0;
    };
    let own = meta.blocks() * 512;
    if !meta.is_dir() {
        return own;
    }
    own + std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| disk_usage(&e.path()))
        .sum::<u64>()
}

/// The sub-directories of `dir` (not links), skipping tb's trash.
pub fn read_dirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()) && e.file_name() != TRASH)
        .map(|e| e.path())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p)
            .expect("exists")
            .permissions()
            .mode()
            & 0o7777
    }

    #[test]
    fn modes_are_set_whatever_the_umask_and_fixed_at_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        std::fs::create_dir(&data).expect("mkdir");
        std::fs::write(data.join("credential.json"), "{}").expect("write");
        set_mode(&data.join("credential.json"), 0o644).expect("chmod");
        set_mode(&data, 0o755).expect("chmod");
        let alloc = data.join("allocs").join("default").join("a-e1-r0");
        let (dirs, cwd) = prepare_alloc(&alloc, None, Some("sub/dir")).expect("prepare");
        assert_eq!(cwd, dirs.work.join("sub").join("dir"));
        set_mode(&dirs.logs, 0o755).expect("chmod");
        secure_data_dir(&data).expect("secure");
        assert_eq!(mode(&data), 0o711);
        assert_eq!(mode(&data.join("credential.json")), 0o600);
        assert_eq!(mode(&alloc), 0o711);
        assert_eq!(mode(&dirs.logs), 0o700, "fixed at start");
        assert_eq!(mode(&dirs.work), 0o700);
        assert_eq!(mode(&dirs.tb), 0o700);
        assert_eq!(mode(&cwd), 0o700);
        write_private(&alloc.join("pid"), b"1 2 3 4").expect("pid");
        assert_eq!(mode(&alloc.join("pid")), 0o600);
    }

    #[test]
    fn a_relative_working_dir_stays_inside_and_links_are_replaced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let alloc = dir.path().join("allocs").join("ns").join("a");
        let err = prepare_alloc(&alloc, None, Some("../../x")).expect_err("escapes");
        assert!(format!("{err:#}").contains("may not leave"), "{err:#}");
        // A link planted where tb's dir goes is replaced by a real directory.
        prepare_alloc(&alloc, None, None).expect("prepare");
        std::fs::remove_dir_all(alloc.join("work").join(".tb")).expect("rm");
        std::os::unix::fs::symlink("/etc", alloc.join("work").join(".tb")).expect("symlink");
        let (dirs, _) = prepare_alloc(&alloc, None, None).expect("prepare");
        assert!(dirs.tb.symlink_metadata().expect("tb").is_dir());
        // Reading a job's file never follows a link.
        std::os::unix::fs::symlink("/etc/hostname", dirs.termination_message()).expect("link");
        assert_eq!(read_job_file(&dirs.termination_message(), 100), None);
        std::fs::remove_file(dirs.termination_message()).expect("rm");
        std::fs::write(dirs.termination_message(), "Reason\nlong message").expect("write");
        assert_eq!(
            read_job_file(&dirs.termination_message(), 8).as_deref(),
            Some("Reason\nl")
        );
    }

    #[test]
    fn removed_dirs_vanish_and_usage_counts_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path();
        let alloc = data.join("allocs").join("ns").join("a");
        let (dirs, _) = prepare_alloc(&alloc, None, None).expect("prepare");
        std::fs::write(dirs.work.join("blob"), vec![7u8; 100_000]).expect("write");
        assert!(disk_usage(&data.join("allocs")) >= 100_000);
        remove_alloc(data, &alloc);
        assert!(!alloc.exists());
        empty_trash(data);
        assert!(disk_usage(&data.join("allocs")) < 100_000);
        assert_eq!(
            read_dirs(&data.join("allocs").join("ns")),
            Vec::<PathBuf>::new()
        );
    }
}
