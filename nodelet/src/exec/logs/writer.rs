//! Writes one output stream of a process into its rotating log file, and the task that pumps a
//! pipe into it.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use tokio::io::{AsyncRead, AsyncReadExt};

use super::{Single, log_path};

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
}

impl RotatingWriter {
    /// Opens (appending to) the live file of `stream` in `dir`, so a restarted process continues
    /// its predecessor's log.
    pub(crate) fn open(
        dir: &Path,
        stream: Single,
        max_bytes: u64,
        keep: usize,
    ) -> io::Result<Self> {
        let file = open_append(&log_path(dir, stream, 0))?;
        let size = file.metadata()?.len();
        Ok(Self {
            dir: dir.to_path_buf(),
            stream,
            max_bytes: max_bytes.max(1),
            keep,
            file,
            size,
            at_line_start: true,
        })
    }

    /// Appends `data`, rotating at line boundaries as the size limit requires.
    pub(crate) fn write(&mut self, data: &[u8]) -> io::Result<()> {
        // Consecutive lines that fit go out in one write; a rotation flushes what came before.
        let mut pending = 0..0;
        for line in data.split_inclusive(|&b| b == b'\n') {
            let before = self.size + pending.len() as u64;
            let line_start = if pending.is_empty() {
                self.at_line_start
            } else {
                data[pending.end - 1] == b'\n'
            };
            if before > 0
                && before + line.len() as u64 > self.max_bytes
                && (line_start || before >= self.max_bytes)
            {
                self.flush_range(data, &pending)?;
                self.rotate()?;
                pending = pending.end..pending.end;
            }
            pending.end += line.len();
        }
        self.flush_range(data, &pending)
    }

    fn flush_range(&mut self, data: &[u8], range: &std::ops::Range<usize>) -> io::Result<()> {
        if range.is_empty() {
            return Ok(());
        }
        let bytes = &data[range.clone()];
        self.file.write_all(bytes)?;
        self.size += bytes.len() as u64;
        self.at_line_start = bytes.ends_with(b"\n");
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
