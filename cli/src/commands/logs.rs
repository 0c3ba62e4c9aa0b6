//! `tbctl logs JOB`: the output of a job's ranks, streamed by the controller from the nodelets
//! that run them.
//!
//! Output contract: each line as the program wrote it, on stdout, whether it wrote it to its
//! stdout or its stderr (as kubectl does; `--stream` keeps one of them). When several ranks
//! stream (no `--rank`, a job of more than one rank) every line is prefixed `[rank N] `.
//! Errors (no such job, not placed yet, a bad rank) go to stderr with exit 1. With `-f`, a
//! connection lost to a controller is resumed on the next one with new lines only; what was
//! written in between may be missed, and tbctl says so on stderr.

use std::time::Duration;

use anyhow::Result;
use tb_api::proto::{GetRequest, LogLine, LogsRequest};
use tb_api::status::JobStatus;
use tonic::Status;

use super::{Ctx, parse_job_ref, parse_object};
use crate::args::{LogStream, LogsArgs};
use crate::client::{RpcError, is_failover};
use crate::output::emit;

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

/// A line as printed: `[rank N] ` first when several ranks stream, one newline at the end.
pub fn format_line(line: &LogLine, prefix: bool) -> String {
    let text = line.line.strip_suffix('\n').unwrap_or(&line.line);
    let text = text.strip_suffix('\r').unwrap_or(text);
    if prefix {
        format!("[rank {}] {text}\n", line.rank)
    } else {
        format!("{text}\n")
    }
}

/// Whether a stream ended because the connection broke (not because a server said so).
fn connection_lost(s: &Status) -> bool {
    is_failover(s) && std::error::Error::source(s).is_some()
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
    let mut req = LogsRequest {
        kind: job.kind.as_str().to_string(),
        namespace,
        name: job.name.clone(),
        rank: args
            .rank
            .map_or(-1, |r| i32::try_from(r).unwrap_or(i32::MAX)),
        follow: args.follow,
        tail: args.tail,
        since_seconds: args.since.unwrap_or(0),
        allocation: String::new(),
    };
    loop {
        let mut stream = ctx.client().logs(req.clone()).await?;
        loop {
            match stream.message().await {
                Ok(Some(line)) => {
                    if wanted(&line, args.stream) {
                        emit(&format_line(&line, prefix))?;
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
            rank,
            stream: stream.into(),
            line: text.into(),
        }
    }

    #[test]
    fn lines_are_printed_as_is_or_prefixed() {
        assert_eq!(
            format_line(&line(0, "stdout", "step 1 loss 2.31"), false),
            "step 1 loss 2.31\n"
        );
        assert_eq!(
            format_line(&line(2, "stderr", "warning: x\n"), true),
            "[rank 2] warning: x\n"
        );
        assert_eq!(format_line(&line(1, "stdout", "crlf\r\n"), false), "crlf\n");
        assert_eq!(format_line(&line(1, "stdout", ""), true), "[rank 1] \n");
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
