//! A process's log files and the readers behind `tbctl logs`.
//!
//! Each stream has its own file in the job's log directory, `stdout.log` and `stderr.log`.
//! When a file would grow past its size limit it is rotated: `stdout.log` becomes
//! `stdout.log.1`, `.1` becomes `.2`, and so on, keeping `keep` old generations (like
//! logrotate's `rotate N`). [`read_tail`] reads across the generations, oldest first;
//! [`follow()`] yields lines as they are appended, across rotations.
//!
//! Every stored line starts with the time its first byte was written, RFC 3339 UTC with
//! milliseconds, and a space: `2026-12-02T13:21:14.798Z hello`. [`split_stamp`] takes it off
//! again. [`read_tail`] and [`follow()`] return the lines as the program wrote them;
//! [`read_tail_stamped`] and [`follow_stamped`] also return each line's time and can skip lines
//! written before a cutoff (`tbctl logs --since`). Logs written before lines were stamped read
//! as lines of unknown time, which a cutoff never skips.

mod follow;
pub(crate) mod writer;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use chrono::{DateTime, SecondsFormat, SubsecRound, Utc};

pub use follow::{FollowFrom, follow, follow_stamped, follow_until};

/// Which output to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogStream {
    Stdout,
    Stderr,
    /// Both: stdout's lines, then stderr's (not interleaved by time).
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

/// A stored line, its stamp taken off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StampedLine {
    /// When the line's first byte was written, RFC 3339 UTC with milliseconds
    /// (`2026-12-02T13:21:14.798Z`); `None` for a line written before lines were stamped.
    pub time: Option<String>,
    /// The line as the program wrote it, without its newline.
    pub text: String,
}

/// The length of a stamp, `2026-12-02T13:21:14.798Z`, without the space that follows it.
pub(crate) const STAMP_LEN: usize = 24;

/// The stamp of a line begun at `at`: RFC 3339 UTC with milliseconds.
/// Appends `text` to the stderr log in `dir` as tb's own lines (stamped like a process's), for
/// why a process could not be started: `tbctl logs` then shows it where the program's output
/// would have been.
pub fn note_stderr(dir: &Path, text: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut w = writer::RotatingWriter::open(
        dir,
        Single::Stderr,
        super::process::DEFAULT_LOG_MAX_BYTES,
        super::process::DEFAULT_LOG_KEEP,
    )?;
    let mut line = text.trim_end().to_string();
    line.push('\n');
    w.write(line.as_bytes())
}

pub(crate) fn format_stamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Splits a stored line into its stamp and the line as written: `(Some(time), line)` when it
/// starts with exactly a stamp (`YYYY-MM-DDTHH:MM:SS.mmmZ`, a valid UTC time) and a space,
/// else `(None, stored)`, as for lines written before lines were stamped. (A line from before
/// stamps that itself began with such a time reads as stamped; every line written since starts
/// with the writer's own stamp, so only old logs are ambiguous.)
pub fn split_stamp(stored: &str) -> (Option<&str>, &str) {
    match parse_stamp(stored) {
        Some((time, _)) => (Some(time), &stored[STAMP_LEN + 1..]),
        None => (None, stored),
    }
}

/// The stamp at the start of `stored`, as text and as a time.
fn parse_stamp(stored: &str) -> Option<(&str, DateTime<Utc>)> {
    const SHAPE: &[u8; STAMP_LEN + 1] = b"dddd-dd-ddTdd:dd:dd.dddZ ";
    let head = stored.as_bytes().get(..=STAMP_LEN)?;
    let shaped = head.iter().zip(SHAPE).all(|(&b, &want)| match want {
        b'd' => b.is_ascii_digit(),
        _ => b == want,
    });
    if !shaped {
        return None;
    }
    // All ASCII, so slicing at STAMP_LEN is on a char boundary.
    let time = &stored[..STAMP_LEN];
    let at = DateTime::parse_from_rfc3339(time).ok()?.with_timezone(&Utc);
    Some((time, at))
}

/// Which lines a reader returns: those of unknown time, and those written at or after the
/// cutoff (compared at the stamps' millisecond resolution).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Since(Option<DateTime<Utc>>);

impl Since {
    pub(crate) fn new(cutoff: Option<DateTime<Utc>>) -> Self {
        // A line stamped .798 may have been begun at .7985: a cutoff at .7983 must keep it.
        Self(cutoff.map(|at| at.trunc_subsecs(3)))
    }

    /// The stored line, decoded, if it passes.
    pub(crate) fn admit(self, stored: String) -> Option<StampedLine> {
        let Some((_, at)) = parse_stamp(&stored) else {
            return Some(StampedLine {
                time: None,
                text: stored,
            });
        };
        if self.0.is_some_and(|cutoff| at < cutoff) {
            return None;
        }
        let mut text = stored;
        let time = text[..STAMP_LEN].to_string();
        text.replace_range(..=STAMP_LEN, "");
        Some(StampedLine {
            time: Some(time),
            text,
        })
    }
}

/// The last `tail_lines` lines of a job's logs (all lines when `None`), oldest first, read across
/// rotated files, as the program wrote them (without stamps). With [`LogStream::Both`] the limit
/// applies to each stream: stdout's last lines, then stderr's. Missing files (a stream that
/// never wrote) read as empty.
pub fn read_tail(
    log_dir: &Path,
    stream: LogStream,
    tail_lines: Option<usize>,
) -> Result<Vec<String>, LogError> {
    let lines = read_tail_stamped(log_dir, stream, tail_lines, None)?;
    Ok(lines.into_iter().map(|line| line.text).collect())
}

/// Like [`read_tail`], with each line's time, and without the lines stamped before `since`
/// (when given): the cutoff applies first, then the tail, so `tail_lines` counts lines at or
/// after it. Lines of unknown time are always kept.
pub fn read_tail_stamped(
    log_dir: &Path,
    stream: LogStream,
    tail_lines: Option<usize>,
    since: Option<DateTime<Utc>>,
) -> Result<Vec<StampedLine>, LogError> {
    std::fs::metadata(log_dir).map_err(|source| LogError::NoLogs {
        dir: log_dir.to_path_buf(),
        source,
    })?;
    let since = Since::new(since);
    let mut out = Vec::new();
    for &single in stream.files() {
        out.extend(tail_of_stream(log_dir, single, tail_lines, since)?);
    }
    Ok(out)
}

/// The last lines of one stream that `since` admits: newest file first, stopping once enough
/// lines are in hand so a short tail does not read every rotated generation.
fn tail_of_stream(
    dir: &Path,
    stream: Single,
    tail_lines: Option<usize>,
    since: Since,
) -> Result<VecDeque<StampedLine>, LogError> {
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
            if let Some(line) = since.admit(line) {
                lines.push_front(line);
            }
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
