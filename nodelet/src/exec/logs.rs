//! A process's log files and the readers behind `tbctl logs`.
//!
//! Each stream has its own file in the job's log directory, `stdout.log` and `stderr.log`.
//! When a file would grow past its size limit it is rotated: `stdout.log` becomes
//! `stdout.log.1`, `.1` becomes `.2`, and so on, keeping `keep` old generations (like
//! logrotate's `rotate N`). [`read_tail`] reads across the generations, oldest first;
//! [`follow`] yields lines as they are appended, across rotations.

mod follow;
pub(crate) mod writer;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

pub use follow::{FollowFrom, follow, follow_until};

/// Which output to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogStream {
    Stdout,
    Stderr,
    /// Both: stdout's lines, then stderr's (the files carry no timestamps to interleave by).
    Both,
}

impl LogStream {
    /// The single streams this selection covers, in reading order.
    pub(crate) fn files(self) -> &'static [Single] {
        match self {
            Self::Stdout => &[Single::Stdout],
            Self::Stderr => &[Single::Stderr],
            Self::Both => &[Single::Stdout, Single::Stderr],
        }
    }
}

/// One output stream, which has one file (plus its rotated generations).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Single {
    Stdout,
    Stderr,
}

impl Single {
    pub(crate) fn file_name(self) -> &'static str {
        match self {
            Self::Stdout => "stdout.log",
            Self::Stderr => "stderr.log",
        }
    }
}

/// The path of one generation of a stream's log: 0 is the live file, n is `<file>.n`.
pub(crate) fn log_path(dir: &Path, stream: Single, generation: usize) -> PathBuf {
    match generation {
        0 => dir.join(stream.file_name()),
        n => dir.join(format!("{}.{n}", stream.file_name())),
    }
}

/// Why logs could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("no logs in {}: {source}", dir.display())]
    NoLogs {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read log file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The last `tail_lines` lines of a job's logs (all lines when `None`), oldest first, read across
/// rotated files. With [`LogStream::Both`] the limit applies to each stream: stdout's last lines,
/// then stderr's. Missing files (a stream that never wrote) read as empty.
pub fn read_tail(
    log_dir: &Path,
    stream: LogStream,
    tail_lines: Option<usize>,
) -> Result<Vec<String>, LogError> {
    std::fs::metadata(log_dir).map_err(|source| LogError::NoLogs {
        dir: log_dir.to_path_buf(),
        source,
    })?;
    let mut out = Vec::new();
    for &single in stream.files() {
        out.extend(tail_of_stream(log_dir, single, tail_lines)?);
    }
    Ok(out)
}

/// The last lines of one stream: newest file first, stopping once enough lines are in hand so
/// a short tail does not read every rotated generation.
fn tail_of_stream(
    dir: &Path,
    stream: Single,
    tail_lines: Option<usize>,
) -> Result<VecDeque<String>, LogError> {
    let mut lines = VecDeque::new();
    for generation in 0.. {
        if tail_lines.is_some_and(|n| lines.len() >= n) {
            break;
        }
        let path = log_path(dir, stream, generation);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            // The live file may not exist yet; past it, the first gap ends the generations.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                if generation == 0 {
                    continue;
                }
                break;
            }
            Err(source) => return Err(LogError::Read { path, source }),
        };
        let (complete, partial) = split_lines(&bytes);
        // A rotated file's unterminated last line is a line of its own (the writer only cuts
        // mid-line when one line outgrows the limit).
        for line in partial.into_iter().rev().chain(complete.into_iter().rev()) {
            if tail_lines.is_some_and(|n| lines.len() >= n) {
                break;
            }
            lines.push_front(line);
        }
    }
    Ok(lines)
}

/// Splits bytes into complete lines (without their `\n` or `\r\n`) and a trailing unterminated
/// remainder. Invalid UTF-8 is replaced, never an error: a program's output is not ours to judge.
pub(crate) fn split_lines(bytes: &[u8]) -> (Vec<String>, Option<String>) {
    let mut complete = Vec::new();
    let mut rest = bytes;
    while let Some(end) = rest.iter().position(|&b| b == b'\n') {
        complete.push(decode_line(&rest[..end]));
        rest = &rest[end + 1..];
    }
    let partial = (!rest.is_empty()).then(|| decode_line(rest));
    (complete, partial)
}

/// One line's bytes as text, without a trailing `\r`.
pub(crate) fn decode_line(bytes: &[u8]) -> String {
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests;
