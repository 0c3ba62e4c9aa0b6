//! Nothing the bench started may outlive it. Its daemons are its children and are killed by
//! pid; what they start in turn (tb's ranks, Slurm's `slurmstepd` and batch scripts) runs in a
//! working directory under the bench's own temporary dir. So once the daemons are gone, any
//! process whose working directory is under that dir is a leftover of this bench: it is
//! killed by its pid and reported.

use std::path::Path;

/// Processes (other than this one) whose working directory is `root` or below it, as
/// `(pid, command line)`.
pub fn processes_under(root: &Path) -> Vec<(i32, String)> {
    let Ok(root) = root.canonicalize() else {
        return Vec::new();
    };
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cwd) = std::fs::read_link(e.path().join("cwd")) else {
            continue;
        };
        if cwd.starts_with(&root) {
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmdline)
                .split('\0')
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            found.push((pid, cmd));
        }
    }
    found.sort();
    found
}

/// SIGKILL every leftover under `root`; returns what was killed (`pid: command`).
pub fn kill_leftovers(root: &Path) -> Vec<String> {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    processes_under(root)
        .into_iter()
        .map(|(pid, cmd)| {
            let outcome = match kill(Pid::from_raw(pid), Signal::SIGKILL) {
                Ok(()) => "killed".to_string(),
                Err(e) => format!("not killed: {e}"),
            };
            format!("{pid} `{cmd}` ({outcome})")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn finds_and_kills_a_child_by_its_working_directory() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut child = tokio::process::Command::new("sleep")
            .arg("30")
            .current_dir(dir.path())
            .kill_on_drop(true)
            .spawn()
            .expect("spawning sleep");
        let pid = child.id().expect("a pid") as i32;
        assert!(processes_under(dir.path()).iter().any(|(p, _)| *p == pid));
        let killed = kill_leftovers(dir.path());
        assert!(killed.iter().any(|k| k.starts_with(&pid.to_string())));
        let status = child.wait().await.expect("reaping sleep");
        assert!(!status.success());
        assert!(processes_under(dir.path()).is_empty());
    }
}
