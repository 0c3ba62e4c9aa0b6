//! The local cluster `tbctl up` starts and `tbctl down` stops: where it keeps its state, where
//! its binaries are found, and the pids file that names its processes.
//!
//! The data directory (`--data-dir`, else `$XDG_DATA_HOME/tb`, else `~/.local/share/tb`) holds
//! `controller/`, `nodelet-N/`, one `<name>.log` per process and `pids`, one `name pid` line per
//! process in the order they were started:
//!
//! ```text
//! controller 41200
//! node-1 41213
//! node-2 41215
//! ```

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The pids file's name inside the data directory.
pub const PIDS_FILE: &str = "pids";
/// The context `up` writes and makes current.
pub const CONTEXT: &str = "local";

/// One process of the local cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proc {
    /// `controller` or `node-N`.
    pub name: String,
    pub pid: i32,
}

/// The data directory: the flag, else `$XDG_DATA_HOME/tb`, else `~/.local/share/tb`.
pub fn data_dir(flag: Option<&Path>) -> Result<PathBuf> {
    let dir = data_dir_from(flag, |k| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })?;
    // The processes started from here, and the ranks they run, need paths that do not depend
    // on the working directory.
    Ok(std::path::absolute(&dir)?)
}

fn data_dir_from(flag: Option<&Path>, env: impl Fn(&str) -> Option<PathBuf>) -> Result<PathBuf> {
    if let Some(d) = flag {
        return Ok(d.to_path_buf());
    }
    if let Some(xdg) = env("XDG_DATA_HOME") {
        return Ok(xdg.join("tb"));
    }
    match env("HOME") {
        Some(home) => Ok(home.join(".local").join("share").join("tb")),
        None => bail!("cannot choose a data directory: set --data-dir, XDG_DATA_HOME or HOME"),
    }
}

/// Find a binary next to tbctl's own executable, else on `PATH`.
pub fn find_binary(name: &str, exe_dir: Option<&Path>, path: Option<&OsStr>) -> Option<PathBuf> {
    let beside = exe_dir.map(|d| d.join(name));
    let on_path = path
        .into_iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(name));
    beside.into_iter().chain(on_path).find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// [`find_binary`] for this process, with an error that says where it looked.
pub fn locate(name: &str) -> Result<PathBuf> {
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf));
    let path = std::env::var_os("PATH");
    find_binary(name, exe_dir.as_deref(), path.as_deref()).ok_or_else(|| {
        let beside = exe_dir
            .map(|d| d.display().to_string())
            .unwrap_or_else(|| "<unknown>".into());
        anyhow::anyhow!(
            "cannot find {name}: it is neither next to tbctl (in {beside}) nor on PATH; \
             build it (cargo build --workspace) or install it beside tbctl"
        )
    })
}

/// Parse the pids file. Blank lines and `#` comments are skipped; anything else must be
/// `NAME PID` with PID above 1 (never a process group or init).
pub fn parse_pids(text: &str) -> Result<Vec<Proc>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, pid] = fields[..] else {
            bail!("line {}: expected `NAME PID`, got {line:?}", i + 1);
        };
        let pid: i32 = match pid.parse() {
            Ok(p) if p > 1 => p,
            _ => bail!("line {}: {pid:?} is not a process id", i + 1),
        };
        out.push(Proc {
            name: name.to_string(),
            pid,
        });
    }
    Ok(out)
}

pub fn format_pids(procs: &[Proc]) -> String {
    procs
        .iter()
        .map(|p| format!("{} {}\n", p.name, p.pid))
        .collect()
}

/// The processes named in `dir`'s pids file; `None` when there is no such file.
pub fn read_pids(dir: &Path) -> Result<Option<Vec<Proc>>> {
    let path = dir.join(PIDS_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => parse_pids(&text)
            .with_context(|| path.display().to_string())
            .map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Write the pids file whole (a temporary file renamed over it).
pub fn write_pids(dir: &Path, procs: &[Proc]) -> Result<()> {
    let path = dir.join(PIDS_FILE);
    let tmp = dir.join(format!(".{PIDS_FILE}.tmp.{}", std::process::id()));
    std::fs::write(&tmp, format_pids(procs))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .with_context(|| format!("writing {}", path.display()))
}

pub fn remove_pids(dir: &Path) -> Result<()> {
    let path = dir.join(PIDS_FILE);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}

/// Whether the process exists (a process owned by someone else exists too).
pub fn is_alive(pid: i32) -> bool {
    pid > 1 && matches!(kill(Pid::from_raw(pid), None), Ok(()) | Err(Errno::EPERM))
}

/// Whether a live pid still is the process `up` started, as far as can be told: `up` starts
/// each in a session of its own, so it leads its session; a pid reused by an unrelated
/// process almost never does. (Where the system will not say, it is given the benefit of the
/// doubt.)
pub fn is_ours(pid: i32) -> bool {
    if !is_alive(pid) {
        return false;
    }
    match nix::unistd::getsid(Some(Pid::from_raw(pid))) {
        Ok(sid) => sid.as_raw() == pid,
        Err(_) => true,
    }
}

/// How stopping one process went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// Ended after SIGTERM.
    Terminated,
    /// Still there after the grace period: SIGKILLed.
    Killed,
    /// Not running (or its pid now belongs to another process, left alone).
    NotRunning,
}

/// SIGTERM every process (last started first), wait up to `grace` for all to end, SIGKILL the
/// rest.
pub async fn stop(procs: &[Proc], grace: Duration) -> Vec<(Proc, Stopped)> {
    let mut outcome: Vec<(Proc, Stopped)> = Vec::new();
    let mut waiting: Vec<Proc> = Vec::new();
    for p in procs.iter().rev() {
        if is_ours(p.pid) && kill(Pid::from_raw(p.pid), Signal::SIGTERM).is_ok() {
            waiting.push(p.clone());
        } else {
            outcome.push((p.clone(), Stopped::NotRunning));
        }
    }
    let deadline = tokio::time::Instant::now() + grace;
    while !waiting.is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        waiting.retain(|p| {
            let alive = is_alive(p.pid);
            if !alive {
                outcome.push((p.clone(), Stopped::Terminated));
            }
            alive
        });
    }
    for p in waiting {
        let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
        outcome.push((p, Stopped::Killed));
    }
    // Report in the order of the pids file.
    outcome.sort_by_key(|(p, _)| procs.iter().position(|q| q == p));
    outcome
}

/// Refuse to delete a directory that does not look like a local cluster's (a mistyped
/// `--data-dir` must not cost a home directory).
pub fn check_purgeable(dir: &Path) -> Result<()> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    if canonical.parent().is_none()
        || home.is_some_and(|h| h.canonicalize().unwrap_or(h) == canonical)
    {
        bail!("refusing to delete {}", dir.display());
    }
    let looks_like_ours = dir.join("controller").is_dir()
        || dir.join(PIDS_FILE).is_file()
        || std::fs::read_dir(dir).is_ok_and(|mut entries| {
            entries
                .any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("nodelet-")))
        });
    if !looks_like_ours {
        bail!(
            "{} does not look like a tb local cluster's data directory (no controller/ or pids); not deleting it",
            dir.display()
        );
    }
    Ok(())
}

/// The last `n` lines of a log file, for an error message.
pub fn log_tail(path: &Path, n: usize) -> String {
    let Ok(bytes) = std::fs::read(path) else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_file_round_trips() {
        let procs = vec![
            Proc {
                name: "controller".into(),
                pid: 41200,
            },
            Proc {
                name: "node-1".into(),
                pid: 41213,
            },
        ];
        let text = format_pids(&procs);
        assert_eq!(text, "controller 41200\nnode-1 41213\n");
        assert_eq!(parse_pids(&text).expect("parse"), procs);
        assert_eq!(
            parse_pids("# started by tbctl up\n\n  controller   41200  \n").expect("lenient"),
            procs[..1]
        );
        assert!(parse_pids("").expect("empty").is_empty());
    }

    #[test]
    fn pids_file_errors_name_the_line() {
        for (bad, line) in [
            ("controller\n", "line 1"),
            ("controller 1 2\n", "line 1"),
            ("controller 41200\nnode-1 abc\n", "line 2"),
            ("node-1 -5\n", "line 1"),
            ("node-1 0\n", "line 1"),
            ("node-1 1\n", "line 1"),
        ] {
            let e = parse_pids(bad).expect_err(bad).to_string();
            assert!(e.starts_with(line), "{bad:?}: {e}");
        }
    }

    #[test]
    fn pids_file_on_disk() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(read_pids(dir.path()).expect("missing"), None);
        let procs = vec![Proc {
            name: "controller".into(),
            pid: 12345,
        }];
        write_pids(dir.path(), &procs).expect("write");
        assert_eq!(read_pids(dir.path()).expect("read"), Some(procs));
        remove_pids(dir.path()).expect("remove");
        remove_pids(dir.path()).expect("remove twice");
        assert_eq!(read_pids(dir.path()).expect("gone"), None);
    }

    #[test]
    fn data_dir_precedence() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| PathBuf::from(v))
            }
        };
        let flag = Path::new("/x/tb");
        assert_eq!(
            data_dir_from(Some(flag), env(&[("HOME", "/h")])).expect("flag"),
            flag
        );
        assert_eq!(
            data_dir_from(None, env(&[("XDG_DATA_HOME", "/xdg"), ("HOME", "/h")])).expect("xdg"),
            Path::new("/xdg/tb")
        );
        assert_eq!(
            data_dir_from(None, env(&[("HOME", "/h")])).expect("home"),
            Path::new("/h/.local/share/tb")
        );
        assert!(data_dir_from(None, env(&[])).is_err());
    }

    #[test]
    fn binaries_beside_tbctl_come_first() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let (beside, on_path) = (dir.path().join("bin"), dir.path().join("path"));
        for d in [&beside, &on_path] {
            std::fs::create_dir_all(d).expect("mkdir");
            let f = d.join("tb-controller");
            std::fs::write(&f, "#!/bin/sh\n").expect("write");
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        // Not executable: skipped.
        std::fs::write(on_path.join("tb-nodelet"), "").expect("write");
        let path = std::env::join_paths([&on_path]).expect("PATH");
        assert_eq!(
            find_binary("tb-controller", Some(&beside), Some(&path)),
            Some(beside.join("tb-controller"))
        );
        assert_eq!(
            find_binary("tb-controller", None, Some(&path)),
            Some(on_path.join("tb-controller"))
        );
        assert_eq!(find_binary("tb-nodelet", Some(&beside), Some(&path)), None);
    }

    #[test]
    fn processes_are_seen_alive_or_not() {
        assert!(is_alive(std::process::id() as i32));
        assert!(!is_alive(0) && !is_alive(1) && !is_alive(-5));
    }

    #[test]
    fn purge_guard() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(
            check_purgeable(dir.path()).is_err(),
            "an unrelated directory"
        );
        std::fs::create_dir(dir.path().join("nodelet-1")).expect("mkdir");
        assert!(check_purgeable(dir.path()).is_ok());
        assert!(check_purgeable(Path::new("/")).is_err());
    }

    #[test]
    fn log_tails() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("x.log");
        std::fs::write(&f, "a\nb\nc\n").expect("write");
        assert_eq!(log_tail(&f, 2), "b\nc");
        assert_eq!(log_tail(&f, 10), "a\nb\nc");
        assert_eq!(log_tail(&dir.path().join("missing"), 2), "");
    }
}
