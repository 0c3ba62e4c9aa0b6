//! One server process (a tb controller or an etcd member): started from a fixed command line
//! with stdout/stderr appended to a log file, killed with SIGKILL, restarted with the same
//! command (and so the same data dir), and measured through `/proc`.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::Context;
use tokio::process::{Child, Command};

/// A process's resident memory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    pub rss: u64,
    /// The most it has been resident since it started.
    pub peak: u64,
}

pub struct Member {
    pub name: String,
    program: PathBuf,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    log: PathBuf,
    data_dir: Option<PathBuf>,
    current_dir: Option<PathBuf>,
    child: Option<Child>,
}

impl Member {
    pub fn new(name: impl Into<String>, program: &Path, args: Vec<String>, log: PathBuf) -> Self {
        Member {
            name: name.into(),
            program: program.to_path_buf(),
            args,
            envs: Vec::new(),
            log,
            data_dir: None,
            current_dir: None,
            child: None,
        }
    }

    /// Where the member keeps its data, to report its size on disk.
    pub fn data_dir(mut self, dir: PathBuf) -> Self {
        self.data_dir = Some(dir);
        self
    }

    /// Bytes the member's data dir occupies on disk (allocated blocks, so preallocated but
    /// unused space in sparse files is not counted).
    pub fn disk_bytes(&self) -> Option<u64> {
        self.data_dir.as_deref().map(disk_usage)
    }

    /// Start the process in `dir` (the bench's own dir otherwise), so that what it leaves
    /// behind can be found by its working directory.
    pub fn current_dir(mut self, dir: PathBuf) -> Self {
        self.current_dir = Some(dir);
        self
    }

    /// Append more arguments to the command line.
    pub fn args<I: IntoIterator<Item = String>>(mut self, more: I) -> Self {
        self.args.extend(more);
        self
    }

    /// Set an environment variable for the process (e.g. `RUST_LOG`).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Start the process; it is killed when the `Member` is dropped.
    pub fn spawn(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.child.is_none(), "{} is already running", self.name);
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)
                .with_context(|| format!("opening log file {}", self.log.display()))
        };
        let (out, err) = (open()?, open()?);
        let mut command = Command::new(&self.program);
        if let Some(dir) = &self.current_dir {
            command.current_dir(dir);
        }
        let child = command
            .args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} ({})", self.name, self.program.display()))?;
        self.child = Some(child);
        Ok(())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL the process (`kill -9`) and reap it.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            child
                .start_kill()
                .with_context(|| format!("killing {}", self.name))?;
            child
                .wait()
                .await
                .with_context(|| format!("reaping {}", self.name))?;
        }
        Ok(())
    }

    /// If the process has exited on its own, say so (with its status) and forget it.
    pub fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                self.child = None;
                Some(format!(
                    "{} exited: {status} (log: {})",
                    self.name,
                    self.log.display()
                ))
            }
            Ok(None) => None,
            Err(e) => Some(format!("{}: {e}", self.name)),
        }
    }

    /// Resident memory now and at its peak, in bytes: `VmRSS` and `VmHWM` in `/proc/PID/status`.
    pub fn memory(&self) -> anyhow::Result<Memory> {
        let pid = self
            .pid()
            .with_context(|| format!("{} is not running", self.name))?;
        let path = format!("/proc/{pid}/status");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        Ok(Memory {
            rss: crate::machine::parse_vm_rss(&text)
                .with_context(|| format!("no VmRSS line in {path}"))?,
            peak: crate::machine::parse_vm_hwm(&text)
                .with_context(|| format!("no VmHWM line in {path}"))?,
        })
    }

    /// The last `n` lines of the log, to show why a member misbehaved.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// Allocated bytes under `path` (like `du -s`), ignoring what cannot be read.
fn disk_usage(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    let own = meta.blocks() * 512;
    if !meta.is_dir() {
        return own;
    }
    let children = std::fs::read_dir(path)
        .map(|entries| entries.flatten().map(|e| disk_usage(&e.path())).sum())
        .unwrap_or(0);
    own + children
}
