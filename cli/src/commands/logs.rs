//! `tbctl logs JOB`: the output of a job's ranks, streamed by the controller from the nodelets
//! that run them.
//!
//! Output contract: each line as the program wrote it, on stdout, whether it wrote it to its
//! stdout or its stderr (as kubectl does; `--stream` keeps one of them). When several ranks
//! stream (no `--rank`, a job of more than one rank) every line is prefixed `[rank N] `. With
//! `--timestamps`, the time the line was written (RFC 3339 UTC with milliseconds,
//! `2026-12-02T13:21:14.798Z`) and a space come next; a line whose time is unknown (logged by an
//! older nodelet) has none. `--since 10m` leaves out the lines written more than ten minutes
//! ago (lines of unknown time are kept). Errors (no such job, not placed yet, a bad rank) go to
//! stderr with exit 1. With `-f`, a connection lost to a controller is resumed on the next one
//! with new lines only; what was written in between may be missed, and tbctl says so on stderr.

use std::time::Duration;

use anyhow::Result;
use tb_api::proto::{GetRequest, LogLine, LogsRequest};
use tb_api::status::JobStatus;
use tonic::Status;

use super::{Ctx, parse_job_ref, parse_object};
use crate::args::{LogStream, LogsArgs};
use crate::client::RpcError;
use crate::output::emit;
use tb_client::is_retryable;

/// Pause before reconnecting a followed stream.
const RECONNECT_DELAY: Duration = Duration::from_millis(500);

/// Whether a line passes `--stream`.
pub fn wanted(line: &LogLine, only: Option<LogStream>) -> bool {
    match only {
        None => true,
        Some(LogStream::Stdout) => line.stream == "stdout",
        Some(LogStream::Stderr) => line.stream == "stderr",
    }
}

/// A line as printed: `[rank N] ` first when several ranks stream, then with `timestamps` the
/// line's time and a space (if the time is known), one newline at the end.
#[cfg(test)]
fn format_line(line: &LogLine, prefix: bool, timestamps: bool) -> String {
    Pieces::default().format(line, prefix, timestamps)
}

/// Joins the pieces of a line sent in parts (`LogLine.partial`: a line longer than a message):
/// the rank prefix and the time come before the first piece, the newline after the last.
#[derive(Debug, Default)]
pub struct Pieces {
    /// (rank, stream) of the lines whose last piece has not come yet.
    open: std::collections::HashSet<(u32, String)>,
}

impl Pieces {
    /// The text to print for `line`, given the pieces printed before it.
    pub fn format(&mut self, line: &LogLine, prefix: bool, timestamps: bool) -> String {
        let key = (line.rank, line.stream.clone());
        let continuing = if line.partial {
            !self.open.insert(key)
        } else {
            self.open.remove(&key)
        };
        let text = if line.partial {
            line.line.as_str()
        } else {
            let text = line.line.strip_suffix('\n').unwrap_or(&line.line);
            text.strip_suffix('\r').unwrap_or(text)
        };
        let mut out = String::with_capacity(text.len() + line.time.len() + 16);
        if !continuing {
            if prefix {
                out.push_str(&format!("[rank {}] ", line.rank));
            }
            if timestamps && !line.time.is_empty() {
                out.push_str(&line.time);
                out.push(' ');
            }
        }
        out.push_str(text);
        if !line.partial {
            out.push('\n');
        }
        out
    }
}

/// The request for a job's logs as `args` ask for them (`rank` -1: every rank).
fn logs_request(kind: &str, namespace: String, name: String, args: &LogsArgs) -> LogsRequest {
    LogsRequest {
        kind: kind.to_string(),
        namespace,
        name,
        rank: args
            .rank
            .map_or(-1, |r| i32::try_from(r).unwrap_or(i32::MAX)),
        follow: args.follow,
        tail: args.tail,
        since_seconds: args.since.unwrap_or(0),
        allocation: String::new(),
        timestamps: args.timestamps,
    }
}

/// Whether a stream ended because the connection broke (not because a server said so).
fn connection_lost(s: &Status) -> bool {
    is_retryable(s) && std::error::Error::source(s).is_some()
}

pub async fn run(ctx: &mut Ctx, args: &LogsArgs) -> Result<()> {
    let job = parse_job_ref(&args.job)?;
    let namespace = ctx.namespace_for(job.kind);
    // The placement says how many ranks stream, hence whether lines need a prefix.
    let get = GetRequest {
        kind: job.kind.as_str().to_string(),
        namespace: namespace.clone(),
        name: job.name.clone(),
        stale: false,
    };
    let object = parse_object(&ctx.client().get(get).await?.object_json)?;
    let ranks = JobStatus::from_value(&object.status).placement.len();
    let prefix = args.rank.is_none() && ranks > 1;
    let mut req = logs_request(job.kind.as_str(), namespace, job.name.clone(), args);
    let mut pieces = Pieces::default();
    loop {
        let mut stream = ctx.client().logs(req.clone()).await?;
        loop {
            match stream.message().await {
                Ok(Some(line)) => {
                    if wanted(&line, args.stream) {
                        emit(&pieces.format(&line, prefix, args.timestamps))?;
                    }
                }
                Ok(None) => return Ok(()),
                Err(s) if args.follow && connection_lost(&s) => {
                    let server = ctx
                        .client()
                        .current_server()
                        .map(ToString::to_string)
                        .unwrap_or_default();
                    eprintln!(
                        "warning: lost the log stream from {server} ({}); resuming with new lines, some may be missed",
                        s.message()
                    );
                    ctx.client().fail_over();
                    // Only what is written from now on: what was printed is not repeated.
                    req.tail = 0;
                    req.since_seconds = 0;
                    tokio::time::sleep(RECONNECT_DELAY).await;
                    break;
                }
                Err(s) => {
                    return Err(RpcError {
                        code: s.code(),
                        message: s.message().to_string(),
                    }
                    .into());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(rank: u32, stream: &str, text: &str) -> LogLine {
        LogLine {
            partial: false,
            rank,
            stream: stream.into(),
            line: text.into(),
            time: String::new(),
        }
    }

    fn timed(rank: u32, time: &str, text: &str) -> LogLine {
        LogLine {
            time: time.into(),
            ..line(rank, "stdout", text)
        }
    }

    #[test]
    fn a_line_sent_in_pieces_is_printed_whole() {
        let piece = |rank: u32, text: &str, partial: bool| LogLine {
            partial,
            time: "T".into(),
            ..line(rank, "stdout", text)
        };
        let mut pieces = Pieces::default();
        let printed: String = [
            piece(0, "aaa", true),
            piece(1, "other", false),
            piece(0, "bbb", true),
            piece(0, "ccc\n", false),
            piece(0, "next", false),
        ]
        .iter()
        .map(|l| pieces.format(l, true, true))
        .collect();
        assert_eq!(
            printed,
            "[rank 0] T aaa[rank 1] T other\nbbbccc\n[rank 0] T next\n"
        );
    }

    #[test]
    fn lines_are_printed_as_is_or_prefixed() {
        assert_eq!(
            format_line(&line(0, "stdout", "step 1 loss 2.31"), false, false),
            "step 1 loss 2.31\n"
        );
        assert_eq!(
            format_line(&line(2, "stderr", "warning: x\n"), true, false),
            "[rank 2] warning: x\n"
        );
        assert_eq!(
            format_line(&line(1, "stdout", "crlf\r\n"), false, false),
            "crlf\n"
        );
        assert_eq!(
            format_line(&line(1, "stdout", ""), true, false),
            "[rank 1] \n"
        );
    }

    #[test]
    fn timestamps_follow_the_rank_prefix() {
        let stamped = timed(3, "2026-12-02T13:21:14.798Z", "step 1\n");
        assert_eq!(
            format_line(&stamped, false, true),
            "2026-12-02T13:21:14.798Z step 1\n"
        );
        assert_eq!(
            format_line(&stamped, true, true),
            "[rank 3] 2026-12-02T13:21:14.798Z step 1\n"
        );
        // Not asked for: not printed, even when sent.
        assert_eq!(format_line(&stamped, true, false), "[rank 3] step 1\n");
        // Unknown time: the line alone.
        assert_eq!(
            format_line(&timed(3, "", "legacy"), true, true),
            "[rank 3] legacy\n"
        );
    }

    #[test]
    fn since_and_timestamps_are_sent() {
        use clap::Parser;

        use crate::args::{Cli, Command};

        let parse = |argv: &[&str]| match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Command::Logs(args)) => args,
            other => panic!("{argv:?}: {other:?}"),
        };
        let args = parse(&["tbctl", "logs", "x", "--since", "10m", "--timestamps"]);
        let req = logs_request("TrainingJob", "ns".into(), "x".into(), &args);
        assert_eq!((req.since_seconds, req.timestamps), (600, true));
        assert_eq!((req.rank, req.tail, req.follow), (-1, -1, false));
        assert_eq!(
            (req.kind.as_str(), req.namespace.as_str()),
            ("TrainingJob", "ns")
        );
        let args = parse(&["tbctl", "logs", "x", "--rank", "1", "-f", "--tail", "5"]);
        let req = logs_request("InferenceService", "ns".into(), "x".into(), &args);
        assert_eq!((req.since_seconds, req.timestamps), (0, false));
        assert_eq!((req.rank, req.tail, req.follow), (1, 5, true));
    }

    #[test]
    fn stream_filter() {
        let out = line(0, "stdout", "a");
        let err = line(0, "stderr", "b");
        assert!(wanted(&out, None) && wanted(&err, None));
        assert!(wanted(&out, Some(LogStream::Stdout)) && !wanted(&err, Some(LogStream::Stdout)));
        assert!(!wanted(&out, Some(LogStream::Stderr)) && wanted(&err, Some(LogStream::Stderr)));
    }

    #[test]
    fn server_errors_do_not_look_like_lost_connections() {
        assert!(!connection_lost(&Status::unavailable(
            "rank 1: logs from nodelet at mac2:7601: refused"
        )));
        assert!(!connection_lost(&Status::not_found(
            "TrainingJob/default/x not found"
        )));
    }
}
