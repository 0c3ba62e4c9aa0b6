//! One owner per dynamic uid on a host: a root nodelet claims its `--job-uid-range` for as long
//! as it runs, and does not start while another live nodelet on the same host holds a range
//! that overlaps it. Two nodelets handing out the same uids would run two namespaces' jobs as
//! one account (each could read the other's files), and each would kill the other's jobs as
//! strays when it starts.
//!
//! A claim is an exclusive `flock` held on `uids-START-END.lock` in a root-only directory
//! ([`CLAIM_DIR`]); the kernel drops it when the nodelet exits, however it exits, so a claim
//! file whose lock can be taken is a dead nodelet's, and is removed. A directory lock makes the
//! look-and-claim one step for nodelets starting together.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use nix::fcntl::{Flock, FlockArg};

use super::accounts::UidRange;

/// Where root nodelets keep their claims (`/var/run` is `/run` on Linux and exists on macOS).
pub const CLAIM_DIR: &str = "/var/run/tb-nodelet";

/// A held claim; dropping it releases the range.
#[derive(Debug)]
pub struct UidClaim {
    _lock: Flock<File>,
    path: PathBuf,
}

impl UidClaim {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Claims `range` in `dir` (created 0700 when missing), or says which live claim overlaps it.
pub fn claim(dir: &Path, range: UidRange) -> anyhow::Result<UidClaim> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("making {} private", dir.display()))?;
    let guard = Flock::lock(open(&dir.join(".lock"))?, FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .with_context(|| format!("locking {}", dir.display()))?;
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(held) = name.to_str().and_then(parse_name) else {
            continue;
        };
        let path = entry.path();
        match Flock::lock(open(&path)?, FlockArg::LockExclusiveNonblock) {
            // A dead nodelet's claim (any range: the directory keeps only live ones).
            Ok(stale) => {
                drop(stale);
                let _ = std::fs::remove_file(&path);
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) if !held.overlaps(&range) => {}
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                let owner = std::fs::read_to_string(&path).unwrap_or_default();
                bail!(
                    "--job-uid-range {}-{} overlaps {}-{}, which another tb-nodelet on this host \
                     holds{} ({}): nodelets sharing a host need ranges of their own",
                    range.start,
                    range.end,
                    held.start,
                    held.end,
                    match owner.trim() {
                        "" => String::new(),
                        pid => format!(" (pid {pid})"),
                    },
                    path.display()
                );
            }
            Err((_, e)) => {
                return Err(e).with_context(|| format!("checking {}", path.display()));
            }
        }
    }
    let path = dir.join(file_name(range));
    let mut lock = Flock::lock(open(&path)?, FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| e)
        .with_context(|| format!("locking {}", path.display()))?;
    lock.set_len(0)?;
    write!(lock, "{}", std::process::id())?;
    drop(guard);
    Ok(UidClaim { _lock: lock, path })
}

fn open(path: &Path) -> anyhow::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .read(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))
}

fn file_name(range: UidRange) -> String {
    format!("uids-{}-{}.lock", range.start, range.end)
}

fn parse_name(name: &str) -> Option<UidRange> {
    let range = name.strip_prefix("uids-")?.strip_suffix(".lock")?;
    let (a, b) = range.split_once('-')?;
    Some(UidRange {
        start: a.parse().ok()?,
        end: b.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: u32, end: u32) -> UidRange {
        UidRange { start, end }
    }

    #[test]
    fn an_overlapping_range_is_refused_while_its_owner_lives() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dir = dir.path().join("claims");
        let a = claim(&dir, range(61184, 61439)).expect("the first claim");
        let mode = std::fs::metadata(&dir).expect("dir").permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(
            std::fs::read_to_string(a.path()).expect("claim"),
            std::process::id().to_string()
        );
        for (s, e) in [
            (61184, 61439),
            (61000, 61184),
            (61439, 62000),
            (61300, 61310),
        ] {
            let err = claim(&dir, range(s, e)).expect_err("overlaps");
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("--job-uid-range {s}-{e} overlaps 61184-61439"))
                    && msg.contains("need ranges of their own"),
                "{msg}"
            );
        }
        let b = claim(&dir, range(62000, 62255)).expect("a range of its own");
        drop(a);
        // The owner gone, its claim is stale: an overlapping range may take over.
        let c = claim(&dir, range(61000, 61300)).expect("after the owner left");
        assert!(!dir.join("uids-61184-61439.lock").exists());
        // Stale claims of any range are cleared; live ones stay.
        drop(c);
        let d = claim(&dir, range(70000, 70003)).expect("another range");
        assert!(!dir.join("uids-61000-61300.lock").exists());
        assert!(dir.join("uids-62000-62255.lock").exists());
        drop((b, d));
    }

    #[test]
    fn claim_file_names_parse_back() {
        assert_eq!(
            parse_name(&file_name(range(1000, 2000))),
            Some(range(1000, 2000))
        );
        assert_eq!(parse_name(".lock"), None);
        assert_eq!(parse_name("uids-x-2.lock"), None);
    }
}
