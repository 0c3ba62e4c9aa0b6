//! The `Nodelet` gRPC service: a rank's logs, read from the files its process wrote here, for
//! the controllers to pass on to `tbctl logs`.

use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tb_api::proto::nodelet_server::Nodelet;
use tb_api::proto::{LogLine, LogsRequest};
use tonic::{Request, Response, Status};

use super::supervisor::Supervisor;
use crate::exec::{self, FollowFrom, LogStream};

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
        if req.since_seconds > 0 {
            // The log files hold the lines as the process wrote them, without times.
            return Err(Status::unimplemented(
                "--since is not supported yet: log lines are stored without timestamps; use --tail",
            ));
        }
        let rank = req.rank.max(0) as u32;
        let tail = usize::try_from(req.tail).ok();
        if !req.follow {
            let mut lines = Vec::new();
            for (stream, name) in [(LogStream::Stdout, "stdout"), (LogStream::Stderr, "stderr")] {
                let read = exec::read_tail(&logs, stream, tail)
                    .map_err(|e| Status::internal(e.to_string()))?;
                lines.extend(read.into_iter().map(|line| LogLine {
                    rank,
                    stream: name.into(),
                    line,
                }));
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
        let lines = exec::follow_until(logs, LogStream::Both, from, ended).await;
        let stream = lines.map(move |line| {
            Ok(LogLine {
                rank,
                stream: "stdout".into(),
                line,
            })
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
