//! Writes one output stream of a process into its rotating log file, and the task that pumps a
//! pipe into it.
//!
//! Each line is stored with the time its first byte was written in front of it
//! (`2026-12-02T13:21:14.798Z hello`, see [`super::split_stamp`]): a line that arrives in
//! several chunks is stamped once, when its first chunk arrives. The size limit counts the
//! stamps.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::{Single, format_stamp, log_path};

/// How much of a pipe is read at once.
const CHUNK: usize = 64 * 1024;

/// The live log file of one stream, rotated when it would pass `max_bytes`.
#[derive(Debug)]
pub(crate) struct RotatingWriter {
    dir: PathBuf,
    stream: Single,
    max_bytes: u64,
    keep: usize,
    file: File,
    size: u64,
    /// Whether the last byte written ended a line: rotation waits for a line boundary so a line
    /// is not split across files, unless a single line outgrows the limit.
    at_line_start: bool,
    /// The stamp (with its space) of the last line begun: when rotation cuts an overlong line,
    /// its rest starts the new file under the same stamp, so every file starts with one.
    line_stamp: Vec<u8>,
    /// The bytes of one write as they go to the file, stamps included; kept to reuse.
    staged: Vec<u8>,
    /// The file was opened after an unterminated last line (its process died mid-line): the
    /// next write ends that line first.
    end_orphan_line: bool,
}

impl RotatingWriter {
    /// Opens (appending to) the live file of `stream` in `dir`, so a restarted process continues
    /// its predecessor's log. A last line the predecessor left unterminated is ended by the first
    /// write: the new process's output starts a line of its own.
    pub(crate) fn open(
        dir: &Path,
        stream: Single,
        max_bytes: u64,
        keep: usize,
    ) -> io::Result<Self> {
        let path = log_path(dir, stream, 0);
        let file = open_append(&path)?;
        let size = file.metadata()?.len();
        // Unreadable is taken as ended: not a reason to refuse to log.
        let end_orphan_line = size > 0 && !ends_with_newline(&path).unwrap_or(true);
        Ok(Self {
            dir: dir.to_path_buf(),
            stream,
            max_bytes: max_bytes.max(1),
            keep,
            file,
            size,
            at_line_start: true,
            line_stamp: Vec::new(),
            staged: Vec::new(),
            end_orphan_line,
        })
    }

    /// Appends `data`, stamping the lines it begins with the current time and rotating at line
    /// boundaries as the size limit requires.
    pub(crate) fn write(&mut self, data: &[u8]) -> io::Result<()> {
        self.write_at(data, Utc::now())
    }

    /// [`Self::write`] with the time to stamp the lines begun in `data` with.
    pub(crate) fn write_at(&mut self, data: &[u8], now: DateTime<Utc>) -> io::Result<()> {
        let mut stamp = format_stamp(now).into_bytes();
        stamp.push(b' ');
        // Consecutive lines that fit go out in one write; a rotation flushes what came before.
        self.staged.clear();
        if self.end_orphan_line {
            self.staged.push(b'\n');
        }
        // Whether the staged bytes end a line (so the next piece begins one).
        let mut line_start = self.at_line_start;
        for piece in data.split_inclusive(|&b| b == b'\n') {
            let stamp_len = if line_start { stamp.len() } else { 0 };
            let before = self.size + self.staged.len() as u64;
            if before > 0
                && before + (stamp_len + piece.len()) as u64 > self.max_bytes
                && (line_start || before >= self.max_bytes)
            {
                self.flush_staged()?;
                self.rotate()?;
                if !line_start {
                    // The rest of an overlong line: the new file starts with its stamp.
                    self.staged.extend_from_slice(&self.line_stamp);
                }
            }
            if line_start {
                self.line_stamp.clone_from(&stamp);
                self.staged.extend_from_slice(&stamp);
            }
            self.staged.extend_from_slice(piece);
            line_start = piece.ends_with(b"\n");
        }
        self.flush_staged()
    }

    /// Writes the staged bytes to the live file.
    fn flush_staged(&mut self) -> io::Result<()> {
        if self.staged.is_empty() {
            return Ok(());
        }
        self.file.write_all(&self.staged)?;
        self.size += self.staged.len() as u64;
        self.at_line_start = self.staged.ends_with(b"\n");
        self.end_orphan_line = false;
        self.staged.clear();
        Ok(())
    }

    /// Shifts `.n` to `.n+1` (dropping the oldest), moves the live file to `.1` and starts a new
    /// live file. With `keep == 0` the live file is simply started afresh.
    fn rotate(&mut self) -> io::Result<()> {
        let live = log_path(&self.dir, self.stream, 0);
        if self.keep == 0 {
            remove_if_exists(&live)?;
        } else {
            remove_if_exists(&log_path(&self.dir, self.stream, self.keep))?;
            for generation in (1..self.keep).rev() {
                rename_if_exists(
                    &log_path(&self.dir, self.stream, generation),
                    &log_path(&self.dir, self.stream, generation + 1),
                )?;
            }
            rename_if_exists(&live, &log_path(&self.dir, self.stream, 1))?;
        }
        self.file = open_append(&live)?;
        self.size = 0;
        self.at_line_start = true;
        Ok(())
    }
}

/// Whether the (non-empty) file at `path` ends with a newline.
fn ends_with_newline(path: &Path) -> io::Result<bool> {
    let mut file = File::open(path)?;
    file.seek(SeekFrom::End(-1))?;
    let mut last = [0u8; 1];
    file.read_exact(&mut last)?;
    Ok(last[0] == b'\n')
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

fn remove_if_exists(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}

fn rename_if_exists(from: &Path, to: &Path) -> io::Result<()> {
    match std::fs::rename(from, to) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}

/// Copies a pipe into its log until the pipe closes. A failing disk does not stop the copy:
/// the process must never block on a full pipe, so output that cannot be written is dropped
/// (and the failure logged once until writes succeed again).
pub(crate) async fn pump<R: AsyncRead + Unpin>(mut pipe: R, mut writer: RotatingWriter, pid: u32) {
    let stream = writer.stream.file_name();
    let mut buf = vec![0u8; CHUNK];
    let mut failing = false;
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) => {
                tracing::warn!(pid, stream, %err, "reading the process's output failed");
                break;
            }
        };
        // File writes block; keep them off the async workers.
        let joined = tokio::task::spawn_blocking(move || {
            let result = writer.write(&buf[..n]);
            (writer, buf, result)
        })
        .await;
        let result;
        (writer, buf, result) = match joined {
            Ok(parts) => parts,
            Err(err) => {
                tracing::error!(pid, stream, %err, "log writer task failed; output is no longer logged");
                return;
            }
        };
        match result {
            Ok(()) if failing => {
                tracing::info!(pid, stream, "writing the log works again");
                failing = false;
            }
            Ok(()) => {}
            Err(err) if !failing => {
                tracing::warn!(pid, stream, dir = %writer.dir.display(), %err, "cannot write log; dropping output");
                failing = true;
            }
            Err(_) => {}
        }
    }
    tracing::debug!(pid, stream, "output closed");
}
