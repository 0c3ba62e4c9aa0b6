//! A cgroup v2 per allocation (`/sys/fs/cgroup/tb/<allocation uid>`), used when
//! `/sys/fs/cgroup` is a cgroup2 mount this process may write: the rank joins it before exec,
//! everything it forks stays in it whatever it does with sessions or parents, and stopping
//! writes `cgroup.kill` (Linux 5.14+) or kills what `cgroup.procs` lists.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

const ROOT: &str = "/sys/fs/cgroup";

#[derive(Debug)]
pub struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    /// Creates (or reuses) the allocation's cgroup; None where cgroup v2 is not available.
    pub fn create(id: &str) -> Option<Cgroup> {
        // Only the root of a cgroup2 mount has cgroup.controllers.
        if !Path::new(ROOT).join("cgroup.controllers").exists() || id.is_empty() {
            return None;
        }
        let id: String = id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .take(200)
            .collect();
        let path = Path::new(ROOT).join("tb").join(id);
        match std::fs::create_dir_all(&path) {
            Ok(()) => Some(Cgroup { path }),
            Err(e) => {
                tracing::debug!(path = %path.display(), %e, "no cgroup for the allocation");
                None
            }
        }
    }

    /// `cgroup.procs`, open for writing: the child writes "0" to it to move itself in.
    pub fn procs_for_writing(&self) -> std::io::Result<OwnedFd> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(self.path.join("cgroup.procs"))?;
        Ok(file.into())
    }

    /// The pids in the cgroup now.
    pub fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Kills everything in the cgroup (cgroup.kill where the kernel has it).
    pub fn kill(&self) {
        let killed = std::fs::OpenOptions::new()
            .write(true)
            .open(self.path.join("cgroup.kill"))
            .and_then(|mut f| f.write_all(b"1"));
        if killed.is_err() {
            for pid in self.pids() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }

    /// Removes the (empty) cgroup.
    pub fn remove(&self) {
        if let Err(e) = std::fs::remove_dir(&self.path) {
            tracing::debug!(path = %self.path.display(), %e, "cgroup not removed");
        }
    }
}
