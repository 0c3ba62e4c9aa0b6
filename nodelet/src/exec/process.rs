//! One supervised process: started in its own session (so it leads a process group that holds
//! everything it forks), with a clean environment, no stdin, and stdout/stderr pumped into
//! rotating logs. Stopping signals the whole group: SIGTERM, a grace period, then SIGKILL.
//! When the leader exits, whatever it left behind in its group is killed too, as a container
//! runtime does when a container's first process exits — and, with a [`contain::Scope`], also
//! what left the group (`setsid`, double forks). With a [`RunAs`], the process drops to that
//! account (no supplementary groups) before exec.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use super::ExecError;
use super::contain::{self, Scope};
use super::logs::Single;
use super::logs::writer::{RotatingWriter, pump};

/// Default size at which a log file is rotated: 10 MiB.
pub const DEFAULT_LOG_MAX_BYTES: u64 = 10 * 1024 * 1024;
/// Default number of rotated generations kept per stream.
pub const DEFAULT_LOG_KEEP: usize = 3;
/// Variables passed through from the nodelet's own environment; everything else is dropped so
/// a job sees the same environment whoever started the nodelet.
pub const INHERITED_ENV: &[&str] = &["PATH", "HOME", "LANG", "TMPDIR"];
/// PATH when the nodelet itself has none.
const FALLBACK_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin";
/// How long to wait, once the process group is gone, for the last output to reach the logs.
/// Only a process that escaped the group (its own `setsid`) can hold a pipe open past this.
const LOG_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// Program and arguments; the program is looked up on the PATH it is given.
    pub command: Vec<String>,
    /// Variables set on top of [`INHERITED_ENV`] (and overriding them).
    pub env: BTreeMap<String, String>,
    pub working_dir: PathBuf,
    /// Where `stdout.log` and `stderr.log` go; created if missing.
    pub log_dir: PathBuf,
    /// Size at which a log file is rotated.
    pub log_max_bytes: u64,
    /// Rotated generations kept per stream.
    pub log_keep: usize,
    /// The account to run as; None: the nodelet's own.
    pub run_as: Option<RunAs>,
    /// What else belongs to this process and must end with it.
    pub scope: Option<Scope>,
}

/// An account to start a process as: no supplementary groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
}

impl PartialEq for Scope {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}
impl Eq for Scope {}

impl Spec {
    /// A spec with an empty extra environment and the default log limits.
    pub fn new(
        command: Vec<String>,
        working_dir: impl Into<PathBuf>,
        log_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            command,
            env: BTreeMap::new(),
            working_dir: working_dir.into(),
            log_dir: log_dir.into(),
            log_max_bytes: DEFAULT_LOG_MAX_BYTES,
            log_keep: DEFAULT_LOG_KEEP,
            run_as: None,
            scope: None,
        }
    }

    fn check(&self) -> Result<(), ExecError> {
        let invalid = |message: &str| {
            Err(ExecError::InvalidSpec {
                message: message.to_string(),
            })
        };
        match self.command.first() {
            None => return invalid("command is empty"),
            Some(program) if program.is_empty() => {
                return invalid("command[0] (the program) is empty");
            }
            Some(_) => {}
        }
        if self.log_max_bytes == 0 {
            return invalid("log_max_bytes must be greater than 0");
        }
        if let Some(key) = self
            .env
            .keys()
            .find(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
        {
            return Err(ExecError::InvalidSpec {
                message: format!("environment variable name {key:?} is not valid"),
            });
        }
        Ok(())
    }
}

/// How a process ended: its exit code, or the signal that killed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExitStatus {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl ExitStatus {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl From<std::process::ExitStatus> for ExitStatus {
    fn from(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        Self {
            code: status.code(),
            signal: status.signal(),
        }
    }
}

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code, self.signal) {
            (Some(code), _) => write!(f, "exit code {code}"),
            (None, Some(signal)) => match Signal::try_from(signal) {
                Ok(name) => write!(f, "killed by signal {signal} ({name})"),
                Err(_) => write!(f, "killed by signal {signal}"),
            },
            (None, None) => write!(f, "ended without a status"),
        }
    }
}

/// Starts the process described by `spec`. Must be called within a tokio runtime.
pub fn spawn(spec: Spec) -> Result<Running, ExecError> {
    spec.check()?;
    let program = spec.command[0].clone();
    check_working_dir(&spec.working_dir)?;

    let log_error = |source| ExecError::LogDir {
        path: spec.log_dir.clone(),
        source,
    };
    std::fs::create_dir_all(&spec.log_dir).map_err(log_error)?;
    let stdout_log = RotatingWriter::open(
        &spec.log_dir,
        Single::Stdout,
        spec.log_max_bytes,
        spec.log_keep,
    )
    .map_err(log_error)?;
    let stderr_log = RotatingWriter::open(
        &spec.log_dir,
        Single::Stderr,
        spec.log_max_bytes,
        spec.log_keep,
    )
    .map_err(log_error)?;

    let mut command = tokio::process::Command::new(&program);
    command
        .args(&spec.command[1..])
        .current_dir(&spec.working_dir)
        .env_clear()
        .envs(inherited_env())
        .envs(&spec.env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The cgroup's procs file, opened here: the child only writes to it.
    let cgroup_procs = match spec.scope.as_ref().and_then(|s| s.cgroup.as_ref()) {
        Some(cg) => Some(cg.procs_for_writing().map_err(|source| ExecError::Spawn {
            command: program.clone(),
            source,
        })?),
        None => None,
    };
    let cgroup_fd = cgroup_procs.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
    let run_as = spec.run_as;
    // SAFETY: the closure runs in the forked child before exec and makes only
    // async-signal-safe system calls (setsid, write, setgroups, setgid, setuid) on values
    // prepared before the fork; it allocates nothing and touches no locks.
    unsafe {
        command.pre_exec(move || {
            // Its own session, hence its own process group: killpg reaches everything it forks
            // and nothing of the nodelet's.
            nix::unistd::setsid().map_err(io::Error::from)?;
            if let Some(fd) = cgroup_fd {
                // "0" moves the writer itself into the cgroup, before it can fork.
                if nix::libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some(a) = run_as
                && (nix::libc::setgroups(0, std::ptr::null()) != 0
                    || nix::libc::setgid(a.gid) != 0
                    || nix::libc::setuid(a.uid) != 0)
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // Listed as a leader before anything could see it as an adopted zombie.
    let mut leaders = contain::leaders();
    let mut child = command.spawn().map_err(|err| spawn_error(&program, err))?;
    if let Some(pid) = child.id() {
        leaders.insert(pid as i32);
    }
    drop(leaders);
    drop(cgroup_procs);
    let Some(pid) = child.id() else {
        // Only possible if the child was already reaped, which nothing here has done.
        return Err(ExecError::Spawn {
            command: program,
            source: io::Error::other("process has no pid right after spawn"),
        });
    };

    let mut pumps = Vec::with_capacity(2);
    if let Some(stdout) = child.stdout.take() {
        pumps.push(tokio::spawn(pump(stdout, stdout_log, pid)));
    }
    if let Some(stderr) = child.stderr.take() {
        pumps.push(tokio::spawn(pump(stderr, stderr_log, pid)));
    }
    let start_time = contain::start_time(pid as i32).unwrap_or_default();
    tracing::info!(pid, command = ?spec.command, dir = %spec.working_dir.display(), uid = ?run_as.map(|a| a.uid), "process started");
    Ok(Running {
        child,
        pid,
        start_time,
        pumps,
        status: None,
        scope: spec.scope,
    })
}

fn check_working_dir(dir: &Path) -> Result<(), ExecError> {
    // Checked up front: a missing directory would otherwise fail the exec with ENOENT and be
    // misreported as a missing command.
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(ExecError::WorkingDir {
            path: dir.to_path_buf(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "not a directory"),
        }),
        Err(source) => Err(ExecError::WorkingDir {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

/// The PATH a process gets unless its spec sets one: the nodelet's own, else a fallback.
pub fn inherited_path() -> std::ffi::OsString {
    std::env::var_os("PATH").unwrap_or_else(|| FALLBACK_PATH.into())
}

fn inherited_env() -> Vec<(&'static str, std::ffi::OsString)> {
    INHERITED_ENV
        .iter()
        .filter_map(|&name| match std::env::var_os(name) {
            Some(value) => Some((name, value)),
            None if name == "PATH" => Some((name, FALLBACK_PATH.into())),
            None => None,
        })
        .collect()
}

fn spawn_error(program: &str, err: io::Error) -> ExecError {
    let command = program.to_string();
    match err.kind() {
        io::ErrorKind::NotFound => ExecError::NotFound {
            command,
            message: err.to_string(),
        },
        io::ErrorKind::PermissionDenied => ExecError::PermissionDenied {
            command,
            message: err.to_string(),
        },
        _ => ExecError::Spawn {
            command,
            source: err,
        },
    }
}

/// A started process. Dropping it without waiting kills its process group.
#[derive(Debug)]
pub struct Running {
    child: tokio::process::Child,
    pid: u32,
    /// The leader's start time: with the pid, what names it in a pid file.
    start_time: u64,
    pumps: Vec<JoinHandle<()>>,
    /// Set once the leader has been reaped; its pid (and group id) may then be reused, so no
    /// signal is sent after this.
    status: Option<ExitStatus>,
    scope: Option<Scope>,
}

impl Running {
    /// The leader's start time (see [`contain::ProcInfo::start`]); 0 if it could not be read.
    pub fn start_time(&self) -> u64 {
        self.start_time
    }

    /// The leader's pid, which is also its process group id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// How the process ended, if it has been waited for.
    pub fn status(&self) -> Option<ExitStatus> {
        self.status
    }

    /// Waits for the process to exit, then kills anything it left in its group and lets the
    /// logs catch up. Cancel-safe; once it has returned, it returns the same status again.
    pub async fn wait(&mut self) -> Result<ExitStatus, ExecError> {
        if let Some(status) = self.status {
            // A cancelled earlier call may have left output to drain.
            self.drain_logs().await;
            return Ok(status);
        }
        let status = self.child.wait().await.map_err(|source| ExecError::Wait {
            pid: self.pid,
            source,
        })?;
        contain::leaders().remove(&(self.pid as i32));
        Ok(self.finish(status.into()).await)
    }

    /// Stops the process: SIGTERM to its group, up to `grace` for it to exit, then SIGKILL to the
    /// group. Returns how the leader ended (an exit code if it handled SIGTERM, signal 15 or 9 if
    /// a signal ended it).
    pub async fn stop(&mut self, grace: Duration) -> Result<ExitStatus, ExecError> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        self.signal_group(Signal::SIGTERM)?;
        // What left the group gets the same notice.
        if let Some(scope) = self.scope.clone() {
            let leader = Some((self.pid as i32, self.start_time));
            let _ = tokio::task::spawn_blocking(move || scope.signal_once(leader, Signal::SIGTERM))
                .await;
        }
        let status = match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(waited) => waited,
            Err(_elapsed) => {
                tracing::info!(
                    pid = self.pid,
                    ?grace,
                    "still running after the grace period; killing"
                );
                self.signal_group(Signal::SIGKILL)?;
                self.child.wait().await
            }
        }
        .map_err(|source| ExecError::Wait {
            pid: self.pid,
            source,
        })?;
        contain::leaders().remove(&(self.pid as i32));
        Ok(self.finish(status.into()).await)
    }

    /// Sends SIGKILL to the whole group at once, without waiting. A no-op once the process has
    /// been waited for. Call [`Running::wait`] afterwards to reap it.
    pub fn kill_group_now(&self) -> Result<(), ExecError> {
        if self.status.is_some() {
            return Ok(());
        }
        self.signal_group(Signal::SIGKILL)
    }

    /// Signals the group; a group that is already gone is not an error.
    fn signal_group(&self, signal: Signal) -> Result<(), ExecError> {
        match killpg(self.pgid(), signal) {
            Ok(()) | Err(Errno::ESRCH) => Ok(()),
            Err(source) => Err(ExecError::Signal {
                pgid: self.pid,
                signal: signal.as_str(),
                source,
            }),
        }
    }

    fn pgid(&self) -> Pid {
        // pids fit in pid_t; a u32 above i32::MAX cannot come from the kernel.
        Pid::from_raw(i32::try_from(self.pid).unwrap_or(i32::MAX))
    }

    /// After the leader is reaped: kill what is left of its group, let the log pumps drain,
    /// remember the status.
    async fn finish(&mut self, status: ExitStatus) -> ExitStatus {
        // The group outlives its leader while members remain, and the kernel does not reuse an
        // id that still names a group, so this reaches only the leader's descendants (unless
        // the group is already empty and the id was recycled within these microseconds).
        if let Err(err) = self.signal_group(Signal::SIGKILL) {
            tracing::warn!(pid = self.pid, %err, "cannot kill what the process left behind");
        }
        // Then what left the group; before draining, as an escaped process may hold the pipes.
        if let Some(scope) = self.scope.clone() {
            let _ = tokio::task::spawn_blocking(move || scope.sweep(None)).await;
        }
        self.status = Some(status);
        self.drain_logs().await;
        tracing::info!(pid = self.pid, %status, "process ended");
        status
    }

    /// Waits (bounded) for the pumps to copy the last output; aborts any still held open by a
    /// process that escaped the group.
    async fn drain_logs(&mut self) {
        let deadline = tokio::time::Instant::now() + LOG_DRAIN_TIMEOUT;
        for pump in &mut self.pumps {
            if tokio::time::timeout_at(deadline, &mut *pump).await.is_err() {
                tracing::warn!(
                    pid = self.pid,
                    "output still open after the process ended; no longer logging it"
                );
                pump.abort();
            }
        }
        self.pumps.clear();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.status.is_none() {
            // Best effort: nobody will stop it otherwise. Tokio reaps the dropped child.
            if let Err(err) = self.signal_group(Signal::SIGKILL) {
                tracing::warn!(pid = self.pid, %err, "cannot kill dropped process group");
            }
            if let Some(scope) = self.scope.take() {
                std::thread::spawn(move || scope.sweep(None));
            }
        }
        for pump in &self.pumps {
            pump.abort();
        }
    }
}
