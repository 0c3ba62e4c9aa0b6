//! The exec executor: runs a job's program (an MLX script, `mlx_lm.server`, a training run) as a
//! supervised process group on this machine, captures its output into rotating log files, and
//! stops it (with its children) on request.
//!
//! - [`process`]: spawn, wait, stop; the child leads its own session so the whole group can be
//!   signalled.
//! - [`logs`]: the rotating `stdout.log`/`stderr.log` files and the readers behind `tbctl logs`.
//! - [`guard`]: the memory admission check made before starting anything.
//! - [`contain`]: finding and stopping what a process left behind, even outside its group.

pub mod contain;
pub mod guard;
pub mod logs;
pub mod process;

#[cfg(test)]
mod tests;

use std::path::PathBuf;

pub use guard::fits;
pub use logs::{FollowFrom, LogError, LogStream, follow, follow_until, read_tail};
pub use process::{ExitStatus, RunAs, Running, Spec, spawn};

/// Why a process could not be started or supervised.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("invalid exec spec: {message}")]
    InvalidSpec { message: String },
    #[error("command {command:?} not found: {message}")]
    NotFound { command: String, message: String },
    #[error("command {command:?} is not executable: {message}")]
    PermissionDenied { command: String, message: String },
    #[error("working directory {}: {source}", path.display())]
    WorkingDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("log directory {}: {source}", path.display())]
    LogDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start {command:?}: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot wait for process {pid}: {source}")]
    Wait {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot send {signal} to process group {pgid}: {source}")]
    Signal {
        pgid: u32,
        signal: &'static str,
        #[source]
        source: nix::Error,
    },
}

impl ExecError {
    /// The reason tb reports in the job's condition when this error stops it from running.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidSpec { .. } => "ExecInvalidSpec",
            Self::NotFound { .. } => "ExecNotFound",
            Self::PermissionDenied { .. } => "ExecPermissionDenied",
            Self::WorkingDir { .. } => "ExecWorkingDirError",
            Self::LogDir { .. } => "ExecLogDirError",
            Self::Spawn { .. } => "ExecStartError",
            Self::Wait { .. } | Self::Signal { .. } => "ExecSupervisionError",
        }
    }
}
