//! Keeps the controller's data disk from filling: redb treats any failed write as fatal to the
//! open database (every later transaction fails until it is reopened) and openraft stops on a
//! storage error, so a full disk must be noticed *before* a write reaches redb.
//!
//! [`DiskGuard::check`] measures the free space of the data directory's filesystem (statvfs,
//! cheap) and refuses when less than the reserve (`--min-free-disk`) is left. The Raft member
//! asks it before proposing, before accepting replicated entries or a snapshot, and before
//! voting (`raft/mod.rs`); while the disk is low the member also stops campaigning and a leader
//! hands its leadership to another voter. Nothing has to be restarted: once space returns the
//! checks pass and the member catches up.

use std::path::{Path, PathBuf};

/// Default for `--min-free-disk`: room for a snapshot of a large store and the log behind it.
pub const DEFAULT_MIN_FREE: u64 = 64 << 20;

/// Why a write was refused: too little space on the data disk.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "no space left on the controller's data disk: {dir} has {free} free, and the controller \
     keeps at least {reserve} free (--min-free-disk) so that its database is never cut short; \
     free some space there (nothing needs restarting)"
)]
pub struct DiskFull {
    pub dir: String,
    pub free: String,
    pub reserve: String,
}

/// The free-space check of one data directory.
#[derive(Debug, Clone)]
pub struct DiskGuard {
    dir: PathBuf,
    reserve: u64,
}

impl DiskGuard {
    pub fn new(dir: &Path, reserve: u64) -> DiskGuard {
        DiskGuard {
            dir: dir.to_path_buf(),
            reserve,
        }
    }

    /// Bytes available to this process on the data directory's filesystem.
    pub fn free(&self) -> std::io::Result<u64> {
        let s = nix::sys::statvfs::statvfs(&self.dir).map_err(std::io::Error::from)?;
        Ok((s.blocks_available() as u64).saturating_mul(s.fragment_size() as u64))
    }

    /// `Err` when less than the reserve is free. A filesystem that cannot be asked counts as
    /// having room: the write itself then tells.
    pub fn check(&self) -> Result<(), DiskFull> {
        match self.free() {
            Ok(free) if free < self.reserve => Err(DiskFull {
                dir: self.dir.display().to_string(),
                free: human(free),
                reserve: human(self.reserve),
            }),
            _ => Ok(()),
        }
    }
}

/// Bytes as a short human figure (binary units).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserve_larger_than_the_disk_refuses_with_a_clear_message() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(DiskGuard::new(dir.path(), 0).check().is_ok());
        let e = DiskGuard::new(dir.path(), u64::MAX)
            .check()
            .expect_err("no disk has that much room");
        let m = e.to_string();
        assert!(
            m.starts_with("no space left on the controller's data disk"),
            "{m}"
        );
        assert!(m.contains(&dir.path().display().to_string()), "{m}");
    }

    #[test]
    fn sizes_read_as_binary_units() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(64 << 20), "64.0 MiB");
        assert_eq!(human(3 << 29), "1.5 GiB");
    }
}
