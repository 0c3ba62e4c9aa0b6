//! Following a log as it grows (`tbctl logs -f`): poll the live file every
//! [`POLL_INTERVAL`], yield each new complete line, and move on to the new live file when the
//! writer rotates (the old file is read to its end first, as `tail -F` does).
//!
//! Memory stays bounded: each poll reads at most [`MAX_READ_PER_POLL`] bytes per file and a line
//! longer than [`MAX_LINE`] is yielded in pieces (each with the line's time). The stream ends
//! when dropped, or, with [`follow_until`] and [`follow_stamped`], once its stop future
//! completes and what was written so far is read. [`follow_stamped`] yields each line's time and
//! can skip lines written before a cutoff.

use std::collections::VecDeque;
use std::fs::File;
use std::future::Future;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::{Stream, StreamExt};

use super::{LogStream, Since, Single, StampedLine, decode_line, log_path, split_lines};

/// How often the files are checked for new output.
pub const POLL_INTERVAL: Duration = Duration::from_millis(150);
/// Bytes read from one file per poll.
pub const MAX_READ_PER_POLL: usize = 256 * 1024;
/// The longest line held back waiting for its newline; longer ones are yielded in pieces.
pub const MAX_LINE: usize = 64 * 1024;

/// Where following starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FollowFrom {
    /// Only lines written after following starts.
    End,
    /// The last n lines already written (per stream, across rotated files), then new ones.
    Tail(usize),
}

/// Yields the lines appended to a job's logs after this call returns (plus, with
/// [`FollowFrom::Tail`], the last lines already there). With [`LogStream::Both`], each poll
/// yields stdout's new lines, then stderr's. Files that do not exist yet are waited for and read
/// from their start. The stream never ends by itself; drop it (or use `StreamExt::take_until`
/// with a cancellation future) to stop.
pub async fn follow(
    log_dir: impl Into<PathBuf>,
    stream: LogStream,
    from: FollowFrom,
) -> impl Stream<Item = String> + Send + 'static {
    follow_until(log_dir, stream, from, std::future::pending()).await
}

/// Like [`follow`], but once `stop` completes (say, the process exited) the files are read to
/// their current end and the stream ends, so no line written before the stop is lost.
pub async fn follow_until(
    log_dir: impl Into<PathBuf>,
    stream: LogStream,
    from: FollowFrom,
    stop: impl Future<Output = ()> + Send + 'static,
) -> impl Stream<Item = String> + Send + 'static {
    follow_stamped(log_dir, stream, from, None, stop)
        .await
        .map(|line| line.text)
}

/// Like [`follow_until`], with each line's time, and without the lines stamped before `since`
/// (when given), in the starting tail as in what follows. With [`FollowFrom::Tail`] the cutoff
/// applies first, so the tail counts lines at or after it. Lines of unknown time are always
/// yielded.
pub async fn follow_stamped(
    log_dir: impl Into<PathBuf>,
    stream: LogStream,
    from: FollowFrom,
    since: Option<DateTime<Utc>>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> impl Stream<Item = StampedLine> + Send + 'static {
    let dir: PathBuf = log_dir.into();
    let since = Since::new(since);
    let tailers: Vec<Tailer> = stream
        .files()
        .iter()
        .map(|&s| Tailer::new(&dir, s, from, since))
        .collect();
    // Position the files now, so "after this call" means what it says even if the stream is
    // first polled later.
    let started = tokio::task::spawn_blocking(move || {
        let mut tailers = tailers;
        let mut lines = VecDeque::new();
        for tailer in &mut tailers {
            tailer.start(&mut lines);
        }
        (tailers, lines)
    })
    .await;
    let (tailers, pending) = started.unwrap_or_else(|err| {
        tracing::error!(%err, "positioning the log follower failed; following from the next poll");
        let tailers = stream
            .files()
            .iter()
            .map(|&s| Tailer::new(&dir, s, FollowFrom::End, since))
            .collect();
        (tailers, VecDeque::new())
    });
    let state = State {
        tailers,
        pending,
        stop: Box::pin(stop),
        phase: Phase::Starting,
    };
    futures::stream::unfold(state, |mut state| async move {
        loop {
            if let Some(line) = state.pending.pop_front() {
                return Some((line, state));
            }
            match state.phase {
                Phase::Done => return None,
                Phase::Starting => state.phase = Phase::Following,
                Phase::Following => {
                    tokio::select! {
                        () = tokio::time::sleep(POLL_INTERVAL) => {}
                        () = &mut state.stop => state.phase = Phase::Draining,
                    }
                }
                // Read on without pausing until the files are exhausted.
                Phase::Draining => {}
            }
            let tailers = std::mem::take(&mut state.tailers);
            let polled = tokio::task::spawn_blocking(move || {
                let mut tailers = tailers;
                let mut lines = VecDeque::new();
                let mut progressed = false;
                for tailer in &mut tailers {
                    progressed |= tailer.poll(&mut lines);
                }
                (tailers, lines, progressed)
            })
            .await;
            let Ok((tailers, lines, progressed)) = polled else {
                tracing::error!("log follower task failed; ending the stream");
                return None;
            };
            state.tailers = tailers;
            state.pending = lines;
            if state.phase == Phase::Draining && !progressed {
                state.phase = Phase::Done;
            }
        }
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The first poll happens at once.
    Starting,
    Following,
    /// Stop was requested: read what is left, then end.
    Draining,
    Done,
}

struct State {
    tailers: Vec<Tailer>,
    pending: VecDeque<StampedLine>,
    stop: Pin<Box<dyn Future<Output = ()> + Send>>,
    phase: Phase,
}

/// What became of the first piece of a line too long to hold.
enum CutLine {
    /// Written before the cutoff: the rest is skipped too.
    Skipped,
    /// Yielded, with this time: so are the rest.
    Kept(Option<String>),
}

/// Follows one stream's live file across rotations.
struct Tailer {
    dir: PathBuf,
    stream: Single,
    path: PathBuf,
    /// Where to start; consumed by [`Tailer::start`] (or the first poll, if start never ran).
    from: Option<FollowFrom>,
    /// Which lines to yield.
    since: Since,
    /// The open file and its inode (to notice rotation: the path then names another inode).
    file: Option<(File, u64)>,
    /// An unterminated line waiting for its newline.
    partial: Vec<u8>,
    /// While an overlong line is yielded in pieces: what became of its first piece, for the
    /// pieces after it, which do not start with a stamp.
    cut_line: Option<CutLine>,
    /// Read buffer, allocated on first use and kept.
    buf: Vec<u8>,
}

impl Tailer {
    fn new(dir: &Path, stream: Single, from: FollowFrom, since: Since) -> Self {
        Self {
            dir: dir.to_path_buf(),
            stream,
            path: log_path(dir, stream, 0),
            from: Some(from),
            since,
            file: None,
            partial: Vec::new(),
            cut_line: None,
            buf: Vec::new(),
        }
    }

    /// Reads what was appended since the last poll into `out`. Returns whether anything was
    /// read or the file changed, so a drain knows when it is done.
    fn poll(&mut self, out: &mut VecDeque<StampedLine>) -> bool {
        self.start(out);
        if self.file.is_none() {
            // Not there yet (or gone): a file that appears later is read from its start.
            match open(&self.path) {
                Ok(opened) => self.file = Some(opened),
                Err(_) => return false,
            }
        }
        let read = self.read_available(out);
        if read > 0 {
            return true;
        }
        self.check_rotation(out)
    }

    /// Positions the file where following starts, yielding the tail if asked for one. Runs
    /// once; a file that does not exist yet will be read from its start when it appears.
    fn start(&mut self, out: &mut VecDeque<StampedLine>) {
        let Some(from) = self.from.take() else {
            return;
        };
        let Ok((mut file, inode)) = open(&self.path) else {
            return;
        };
        let result = match from {
            FollowFrom::End => file.seek(SeekFrom::End(0)).map(drop),
            FollowFrom::Tail(n) => self.read_tail(&mut file, n, out),
        };
        match result {
            Ok(()) => self.file = Some((file, inode)),
            Err(err) => {
                tracing::warn!(path = %self.path.display(), %err, "cannot position log file")
            }
        }
    }

    /// Yields the last `n` lines that `since` admits: the live file's complete lines up to its
    /// current end, topped up from rotated generations. A trailing partial line is kept to be
    /// completed later.
    fn read_tail(
        &mut self,
        file: &mut File,
        n: usize,
        out: &mut VecDeque<StampedLine>,
    ) -> io::Result<()> {
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let (complete, partial) = split_lines(&bytes);
        if let Some(partial) = partial {
            self.partial = partial.into_bytes();
        }
        let mut lines: VecDeque<StampedLine> = complete
            .into_iter()
            .filter_map(|line| self.since.admit(line))
            .collect();
        while lines.len() > n {
            lines.pop_front();
        }
        for generation in 1.. {
            if lines.len() >= n {
                break;
            }
            let Ok(bytes) = std::fs::read(log_path(&self.dir, self.stream, generation)) else {
                break;
            };
            let (complete, partial) = split_lines(&bytes);
            for line in partial.into_iter().rev().chain(complete.into_iter().rev()) {
                if lines.len() >= n {
                    break;
                }
                if let Some(line) = self.since.admit(line) {
                    lines.push_front(line);
                }
            }
        }
        out.extend(lines);
        Ok(())
    }

    /// Reads up to [`MAX_READ_PER_POLL`] new bytes and emits the complete lines. Returns the
    /// number of bytes read.
    fn read_available(&mut self, out: &mut VecDeque<StampedLine>) -> usize {
        let Some((file, _)) = self.file.as_mut() else {
            return 0;
        };
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(MAX_READ_PER_POLL, 0);
        let mut total = 0;
        while total < buf.len() {
            match file.read(&mut buf[total..]) {
                Ok(0) => break,
                Ok(n) => total += n,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => {
                    tracing::warn!(path = %self.path.display(), %err, "cannot read log file");
                    break;
                }
            }
        }
        self.push_bytes(&buf[..total], out);
        self.buf = buf;
        total
    }

    fn push_bytes(&mut self, mut bytes: &[u8], out: &mut VecDeque<StampedLine>) {
        while let Some(end) = bytes.iter().position(|&b| b == b'\n') {
            self.partial.extend_from_slice(&bytes[..end]);
            self.emit_partial(true, out);
            bytes = &bytes[end + 1..];
        }
        self.partial.extend_from_slice(bytes);
        while self.partial.len() >= MAX_LINE {
            let rest = self.partial.split_off(MAX_LINE);
            self.emit_partial(false, out);
            self.partial = rest;
        }
    }

    /// Yields the held bytes (a line, or with `ends_line` false the first piece of an overlong
    /// one) if `since` admits the line, and clears them.
    fn emit_partial(&mut self, ends_line: bool, out: &mut VecDeque<StampedLine>) {
        let stored = decode_line(&self.partial);
        self.partial.clear();
        let line = match self.cut_line.take() {
            // A later piece of a cut line: no stamp of its own, the line's time and fate.
            Some(CutLine::Skipped) => None,
            Some(CutLine::Kept(time)) => Some(StampedLine { time, text: stored }),
            None => self.since.admit(stored),
        };
        if !ends_line {
            self.cut_line = Some(match &line {
                Some(line) => CutLine::Kept(line.time.clone()),
                None => CutLine::Skipped,
            });
        }
        out.extend(line);
    }

    /// At the end of the open file: if the path now names a new file (rotated), finish the old
    /// one's last line and switch; if the file shrank (truncated), start over from its start.
    fn check_rotation(&mut self, out: &mut VecDeque<StampedLine>) -> bool {
        let Some((file, inode)) = self.file.as_mut() else {
            return false;
        };
        let Ok(meta) = std::fs::metadata(&self.path) else {
            return false;
        };
        if meta.ino() != *inode {
            self.file = open(&self.path).ok();
            self.flush_partial(out);
            return true;
        }
        let position = file.stream_position().unwrap_or(0);
        if meta.len() >= position {
            return false;
        }
        if let Err(err) = file.seek(SeekFrom::Start(0)) {
            tracing::warn!(path = %self.path.display(), %err, "cannot rewind truncated log file");
        }
        self.flush_partial(out);
        true
    }

    /// Ends the held line where it is (its file was rotated away or truncated).
    fn flush_partial(&mut self, out: &mut VecDeque<StampedLine>) {
        if self.partial.is_empty() {
            self.cut_line = None;
        } else {
            self.emit_partial(true, out);
        }
    }
}

fn open(path: &Path) -> io::Result<(File, u64)> {
    let file = File::open(path)?;
    let inode = file.metadata()?.ino();
    Ok((file, inode))
}
