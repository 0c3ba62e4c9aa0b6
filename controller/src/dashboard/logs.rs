//! `/ui/api/logs/{kind}/{namespace}/{name}?tail=N`: a job's log lines, the last `tail` of each
//! rank and then new ones as they are written, as Server-Sent Events (`line`, then `end` once
//! every rank's stream ended, or `failed` with why). Lines are read from the nodelets through
//! the same path as `tbctl logs -f` (`service::nodes::open_logs`), with the same rights: who may
//! get the job may read its logs, and a member sees only its namespaces here.
//!
//! Bounded: at most [`MAX_TAIL`] lines back, [`MAX_LINE`] bytes of a line, [`MAX_FOLLOW`] of
//! following, and [`super::MAX_LOG_STREAMS`] streams at once; the token is checked again every
//! [`RECHECK`].

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::Uri;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tb_api::proto::LogsRequest;
use tokio_stream::wrappers::ReceiverStream;

use super::api::from_status;
use super::rights::sign_in;
use super::{Dashboard, error};

/// Most lines back a page may ask for, per rank.
pub const MAX_TAIL: i64 = 500;
/// Longer lines are cut (the page shows logs, it does not archive them).
pub const MAX_LINE: usize = 4096;
/// A followed stream ends after this long; the page may open it again.
pub const MAX_FOLLOW: Duration = Duration::from_secs(30 * 60);
/// How often a followed stream checks that its token still signs in.
pub const RECHECK: Duration = Duration::from_secs(10);

pub async fn follow(
    State(d): State<Arc<Dashboard>>,
    headers: HeaderMap,
    Path((kind, namespace, name)): Path<(String, String, String)>,
    uri: Uri,
) -> Response {
    let viewer = match sign_in(&d, &headers) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    if !viewer.sees(&namespace) {
        return error(
            StatusCode::FORBIDDEN,
            &format!(
                "{} works in other namespaces than {:?}",
                viewer.caller,
                tb_api::bounds::excerpt(&namespace)
            ),
        );
    }
    let tail = uri
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|pair| pair.strip_prefix("tail="));
    let tail = match tail.map(|t| t.parse::<i64>()) {
        None => 100,
        Some(Ok(t)) if (0..=MAX_TAIL).contains(&t) => t,
        Some(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("tail: expected a number of lines from 0 to {MAX_TAIL}"),
            );
        }
    };
    let Ok(permit) = d.log_streams.clone().try_acquire_owned() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many log streams are open on this controller; try again later",
        );
    };
    let request = LogsRequest {
        kind,
        namespace,
        name,
        rank: -1,
        follow: true,
        tail,
        since_seconds: 0,
        allocation: String::new(),
        timestamps: true,
    };
    let mut lines = match crate::service::nodes::open_logs(&d.node, &viewer.caller, request) {
        Ok(rx) => rx,
        Err(status) => return from_status(&status),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, Infallible>>(64);
    tokio::spawn(async move {
        let _permit = permit;
        let started = Instant::now();
        let mut checked = Instant::now();
        let ending = tokio::time::sleep(MAX_FOLLOW);
        tokio::pin!(ending);
        loop {
            let next = tokio::select! {
                l = lines.recv() => l,
                _ = &mut ending => None,
                _ = tx.closed() => return,
            };
            if checked.elapsed() >= RECHECK {
                if sign_in(&d, &headers).is_err() {
                    let _ = tx.send(Ok(failed("signed out"))).await;
                    return;
                }
                checked = Instant::now();
            }
            let event = match next {
                Some(Ok(l)) => {
                    let mut text = l.line;
                    if text.len() > MAX_LINE {
                        let mut cut = MAX_LINE;
                        while !text.is_char_boundary(cut) {
                            cut -= 1;
                        }
                        text.truncate(cut);
                        text.push('…');
                    }
                    Event::default().event("line").data(
                        json!({"rank": l.rank, "stream": l.stream, "line": text, "time": l.time})
                            .to_string(),
                    )
                }
                Some(Err(status)) => failed(status.message()),
                None => {
                    let why = if started.elapsed() >= MAX_FOLLOW {
                        "followed for the longest a stream lasts; open it again"
                    } else {
                        "every rank's log ended"
                    };
                    let _ = tx
                        .send(Ok(Event::default()
                            .event("end")
                            .data(json!({ "why": why }).to_string())))
                        .await;
                    return;
                }
            };
            if tx.send(Ok(event)).await.is_err() {
                return;
            }
        }
    });
    Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::new().interval(super::changes::KEEP_ALIVE))
        .into_response()
}

fn failed(why: &str) -> Event {
    Event::default()
        .event("failed")
        .data(json!({ "error": why }).to_string())
}
