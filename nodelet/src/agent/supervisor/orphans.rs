//! What an earlier run of this nodelet left running: pid files that prove whose a process is
//! (pid, start time, account, epoch, allocation), and the sweep at start that kills the
//! processes this nodelet can prove are its own and reports their allocations lost. A rank
//! whose pid file was never written (the nodelet died between the spawn and the write) is found
//! by the allocation id a `starting` file names, which its processes carry in their environment.

use super::Supervisor;
use crate::agent::dirs;
use crate::exec::contain::{self, Scope};

/// Written with the allocation id before a rank is spawned, removed once its pid file exists.
pub(super) const STARTING_FILE: &str = "starting";

/// What a pid file records: enough to prove, after a restart, that a pid still names the
/// process tb started (pid, start time, account), and the allocation it ran for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PidFile {
    pub(super) pid: i32,
    pub(super) start: u64,
    pub(super) uid: u32,
    pub(super) epoch: u64,
    pub(super) allocation: String,
}

impl std::fmt::Display for PidFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} {} {} {} {}",
            self.pid, self.start, self.uid, self.epoch, self.allocation
        )
    }
}

impl PidFile {
    /// `PID START UID EPOCH ALLOCATION`; None for anything else (an older `PID EPOCH` file
    /// included: a number alone proves nothing).
    pub(super) fn parse(text: &str) -> Option<PidFile> {
        let mut f = text.split_whitespace();
        let p = PidFile {
            pid: f.next()?.parse().ok()?,
            start: f.next()?.parse().ok()?,
            uid: f.next()?.parse().ok()?,
            epoch: f.next()?.parse().ok()?,
            allocation: f.next()?.to_string(),
        };
        (f.next().is_none() && p.pid > 1 && p.start > 0).then_some(p)
    }

    /// Whether the recorded process still runs: same pid, start time and account.
    pub(super) fn is_alive(&self) -> bool {
        contain::is_same_process(self.pid, self.start)
            && contain::uid_of(self.pid) == Some(self.uid)
    }
}

/// (namespace, allocation) of the allocation directory `alloc` under namespace directory `ns`.
fn names_of(ns: &std::path::Path, alloc: &std::path::Path) -> (String, String) {
    let name = |p: &std::path::Path| {
        p.file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string()
    };
    (name(ns), name(alloc))
}

pub(super) fn kill_group(pid: i32) {
    use nix::sys::signal::{Signal, killpg};
    use nix::unistd::Pid;
    if pid > 1 {
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

/// Kills what an earlier nodelet left running for the allocation directory `a` (see
/// [`Supervisor::reap_orphans`]); true when `a` had a rank to report lost.
fn reap_allocation(a: &std::path::Path) -> bool {
    let pid_file = a.join("pid");
    let starting = a.join(STARTING_FILE);
    let Ok(text) = std::fs::read_to_string(&pid_file) else {
        // Spawned, perhaps, but never recorded: its processes carry the id.
        let Ok(id) = std::fs::read_to_string(&starting) else {
            return false;
        };
        let id = id.trim();
        if !id.is_empty() {
            let killed = Scope::new(id.to_string()).sweep(None);
            tracing::warn!(killed, alloc = %a.display(), "a rank was being started when an earlier nodelet stopped: swept its processes");
        }
        let _ = std::fs::remove_file(&starting);
        return true;
    };
    let _ = std::fs::remove_file(&starting);
    match PidFile::parse(&text) {
        Some(p) if p.is_alive() => {
            kill_group(p.pid);
            let killed = Scope::new(p.allocation.clone()).sweep(Some((p.pid, p.start)));
            tracing::warn!(pid = p.pid, killed, alloc = %a.display(), "killed the processes of an allocation left by an earlier nodelet");
        }
        Some(p) => {
            tracing::info!(pid = p.pid, alloc = %a.display(), "the pid file's process is gone (its pid names another process now, or none): nothing to kill");
        }
        None => {
            tracing::warn!(alloc = %a.display(), "a pid file without the process's start time cannot prove whose the pid is: left alone");
        }
    }
    let _ = std::fs::remove_file(&pid_file);
    true
}

impl Supervisor {
    /// Processes left by an earlier run of this nodelet cannot be supervised (they are not our
    /// children): kill those it can prove are its own, and report their allocations lost so
    /// their jobs are placed anew. A pid file's process is killed only while its pid, start time
    /// and account still match (a number alone may name a stranger by now); everything under
    /// tb's dynamic uids is tb's own, since nothing of this run has started yet.
    pub fn reap_orphans(&self) -> Vec<(String, String)> {
        let mut reaped = Vec::new();
        let dynamic = self.policy.dynamic_uids();
        for ns in dirs::read_dirs(&self.data_dir.join("allocs")) {
            for a in dirs::read_dirs(&ns) {
                if reap_allocation(&a) {
                    reaped.push(names_of(&ns, &a));
                }
            }
        }
        let killed = contain::sweep_uids(&dynamic);
        if killed > 0 {
            tracing::warn!(
                killed,
                "killed processes of tb's job accounts left by an earlier nodelet"
            );
        }
        reaped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn a_pid_file_proves_its_process_by_start_time_and_account() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = child.id() as i32;
        let start = contain::start_time(pid).expect("start time");
        let me = nix::unistd::geteuid().as_raw();
        let file = PidFile {
            pid,
            start,
            uid: me,
            epoch: 3,
            allocation: "default/a-e3-r0/u1".into(),
        };
        let text = file.to_string();
        assert_eq!(PidFile::parse(&text), Some(file.clone()));
        assert!(file.is_alive());
        // A recycled pid: same number, another start time or account.
        assert!(
            !PidFile {
                start: start + 1,
                ..file.clone()
            }
            .is_alive()
        );
        assert!(
            !PidFile {
                uid: me + 1,
                ..file.clone()
            }
            .is_alive()
        );
        // The old format (pid, epoch) proves nothing; nor do garbage and pid 1.
        assert_eq!(PidFile::parse(&format!("{pid} 3\n")), None);
        assert_eq!(PidFile::parse("1 5 0 1 x"), None);
        assert_eq!(PidFile::parse("x y z"), None);
        let _ = child.kill();
        let _ = child.wait();
        assert!(!file.is_alive(), "gone");
    }

    #[cfg(target_os = "linux")]
    #[test]
    pub(super) fn a_rank_started_but_never_recorded_is_swept_by_its_allocation_id() {
        let dir = tempfile::tempdir().expect("tempdir");
        let id = format!("default/starting-e1-r0/{}", std::process::id());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env(contain::MARKER_ENV, &id)
            .spawn()
            .expect("sleep");
        let pid = child.id() as i32;
        let start = contain::start_time(pid).expect("start time");
        std::fs::write(dir.path().join(STARTING_FILE), &id).expect("starting");
        assert!(reap_allocation(dir.path()), "an allocation to report lost");
        // Killed, and reaped by the sweep or exited: either way not the same process.
        let gone = !matches!(child.try_wait(), Ok(None)) || !contain::is_same_process(pid, start);
        assert!(gone, "the unrecorded rank still runs");
        assert!(!dir.path().join(STARTING_FILE).exists());
        // Nothing recorded at all: not an allocation of an earlier run.
        assert!(!reap_allocation(dir.path()));
        let _ = child.kill();
        let _ = child.wait();
    }
}
