//! The `Nodelet` gRPC service: a rank's logs, read from the files its process wrote here, for
//! the controllers to pass on to `tbctl logs`. `since_seconds` skips the lines stamped earlier
//! than that long ago; `timestamps` fills each line's time.

use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use futures::{Stream, StreamExt};
use tb_api::proto::nodelet_server::Nodelet;
use tb_api::proto::{LogLine, LogsRequest};
use tonic::{Request, Response, Status};

use super::supervisor::Supervisor;
use crate::exec::logs::{StampedLine, follow_stamped, read_tail_stamped};
use crate::exec::{FollowFrom, LogStream};

pub struct LogsService {
    data_dir: PathBuf,
}

impl LogsService {
    pub fn new(data_dir: PathBuf) -> Self {
        LogsService { data_dir }
    }
}

type Lines = Pin<Box<dyn Stream<Item = Result<LogLine, Status>> + Send>>;

fn checked(part: &str, what: &str) -> Result<(), Status> {
    // Names become path components: refuse anything that could leave the data dir.
    if part.is_empty() || part.contains('/') || part.contains("..") {
        return Err(Status::invalid_argument(format!(
            "{what}: {part:?} is not a valid name"
        )));
    }
    Ok(())
}

/// The cutoff for `since_seconds` (0: none) counted back from `now`. A span reaching past the
/// earliest representable time is no cutoff at all.
fn since_cutoff(since_seconds: u64, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    if since_seconds == 0 {
        return None;
    }
    i64::try_from(since_seconds)
        .ok()
        .and_then(TimeDelta::try_seconds)
        .and_then(|span| now.checked_sub_signed(span))
}

/// The most text one LogLine carries: a gRPC message is at most 4 MiB by default, so a longer
/// line is sent in pieces, every one but the last marked `partial`.
pub const MAX_PIECE: usize = 1024 * 1024;

/// A stored line as sent: its time only when asked for (empty when unknown), in pieces of at
/// most [`MAX_PIECE`] bytes (cut at character boundaries).
fn log_line(rank: u32, stream: &str, line: StampedLine, timestamps: bool) -> Vec<LogLine> {
    let time = if timestamps {
        line.time.unwrap_or_default()
    } else {
        String::new()
    };
    let mut text = line.text.as_str();
    let mut pieces = Vec::with_capacity(text.len() / MAX_PIECE + 1);
    loop {
        let mut cut = text.len().min(MAX_PIECE);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let (piece, rest) = text.split_at(cut);
        pieces.push(LogLine {
            rank,
            stream: stream.into(),
            line: piece.to_string(),
            time: time.clone(),
            partial: !rest.is_empty(),
        });
        if rest.is_empty() {
            return pieces;
        }
        text = rest;
    }
}

#[tonic::async_trait]
impl Nodelet for LogsService {
    type LogsStream = Lines;

    async fn logs(&self, req: Request<LogsRequest>) -> Result<Response<Self::LogsStream>, Status> {
        let req = req.into_inner();
        let namespace = if req.namespace.is_empty() {
            "default".to_string()
        } else {
            req.namespace.clone()
        };
        checked(&namespace, "namespace")?;
        checked(&req.allocation, "allocation")?;
        let dir = Supervisor::alloc_dir(&self.data_dir, &namespace, &req.allocation);
        let logs = dir.join("logs");
        if !logs.exists() {
            return Err(Status::not_found(format!(
                "no logs for allocation {namespace}/{} on this node (it has not started here)",
                req.allocation
            )));
        }
        let since = since_cutoff(req.since_seconds, Utc::now());
        let timestamps = req.timestamps;
        let rank = req.rank.max(0) as u32;
        let tail = usize::try_from(req.tail).ok();
        if !req.follow {
            let mut lines = Vec::new();
            for (stream, name) in [(LogStream::Stdout, "stdout"), (LogStream::Stderr, "stderr")] {
                let read = read_tail_stamped(&logs, stream, tail, since)
                    .map_err(|e| Status::internal(e.to_string()))?;
                lines.extend(
                    read.into_iter()
                        .flat_map(|line| log_line(rank, name, line, timestamps)),
                );
            }
            return Ok(Response::new(Box::pin(futures::stream::iter(
                lines.into_iter().map(Ok),
            ))));
        }
        let from = match tail {
            Some(n) => FollowFrom::Tail(n),
            None => FollowFrom::Tail(usize::MAX),
        };
        // Follow until the process has ended (its exit record appears), then drain and stop.
        let exit_file = dir.join("exit.json");
        let ended = async move {
            while !exit_file.exists() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        let lines = follow_stamped(logs, LogStream::Both, from, since, ended).await;
        let stream = lines.flat_map(move |line| {
            futures::stream::iter(
                log_line(rank, "stdout", line, timestamps)
                    .into_iter()
                    .map(Ok),
            )
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::logs::format_stamp;

    /// A data dir with allocation `default/a1`, whose stdout log holds a line from two hours
    /// ago, a line from before lines were stamped, and a line from a minute ago (returned, with
    /// its stamp).
    fn data_dir() -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().expect("tempdir");
        let logs = Supervisor::alloc_dir(dir.path(), "default", "a1").join("logs");
        std::fs::create_dir_all(&logs).expect("mkdir");
        let now = Utc::now();
        let old = format_stamp(now - TimeDelta::hours(2));
        let recent = format_stamp(now - TimeDelta::minutes(1));
        let log = format!("{old} old\nlegacy\n{recent} recent\n");
        std::fs::write(logs.join("stdout.log"), log).expect("write");
        std::fs::write(logs.join("stderr.log"), format!("{recent} oops\n")).expect("write");
        (dir, recent)
    }

    fn request(since_seconds: u64, timestamps: bool, follow: bool) -> LogsRequest {
        LogsRequest {
            allocation: "a1".into(),
            rank: 2,
            tail: -1,
            since_seconds,
            timestamps,
            follow,
            ..Default::default()
        }
    }

    async fn lines(data_dir: &std::path::Path, req: LogsRequest) -> Vec<(String, String, String)> {
        let service = LogsService::new(data_dir.to_path_buf());
        let stream = service
            .logs(Request::new(req))
            .await
            .expect("logs")
            .into_inner();
        let got: Vec<Result<LogLine, Status>> =
            tokio::time::timeout(Duration::from_secs(10), stream.collect())
                .await
                .expect("the stream ends");
        got.into_iter()
            .map(|line| {
                let line = line.expect("line");
                assert_eq!(line.rank, 2);
                (line.stream, line.time, line.line)
            })
            .collect()
    }

    fn line(stream: &str, time: &str, text: &str) -> (String, String, String) {
        (stream.into(), time.into(), text.into())
    }

    #[tokio::test]
    async fn since_skips_older_lines_and_timestamps_are_sent_when_asked() {
        let (dir, recent) = data_dir();
        assert_eq!(
            lines(dir.path(), request(600, true, false)).await,
            [
                line("stdout", "", "legacy"),
                line("stdout", &recent, "recent"),
                line("stderr", &recent, "oops"),
            ]
        );
        assert_eq!(
            lines(dir.path(), request(600, false, false)).await,
            [
                line("stdout", "", "legacy"),
                line("stdout", "", "recent"),
                line("stderr", "", "oops"),
            ]
        );
        // No cutoff: every line, the old one too.
        let all = lines(dir.path(), request(0, false, false)).await;
        assert_eq!(all.len(), 4);
        assert_eq!(all[0], line("stdout", "", "old"));
    }

    #[tokio::test]
    async fn following_honours_since_and_timestamps() {
        let (dir, recent) = data_dir();
        // The process has ended: the follower drains the files and stops.
        let alloc = Supervisor::alloc_dir(dir.path(), "default", "a1");
        std::fs::write(alloc.join("exit.json"), "{}").expect("write");
        assert_eq!(
            lines(dir.path(), request(600, true, true)).await,
            [
                line("stdout", "", "legacy"),
                line("stdout", &recent, "recent"),
                line("stdout", &recent, "oops"),
            ]
        );
    }

    #[test]
    fn the_cutoff_counts_back_from_now_and_survives_absurd_spans() {
        let now = Utc::now();
        assert_eq!(since_cutoff(0, now), None);
        assert_eq!(since_cutoff(600, now), Some(now - TimeDelta::minutes(10)));
        for absurd in [u64::MAX, i64::MAX as u64, 1 << 60] {
            assert_eq!(since_cutoff(absurd, now), None, "{absurd}");
        }
    }
}
