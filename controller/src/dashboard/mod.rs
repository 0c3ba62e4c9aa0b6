//! The web dashboard, served at `/ui/` on the services listener (`--services-listen`, the same
//! TLS certificate as the gRPC port): a picture of the lab, services with their placement, jobs
//! and queues, events, logs and model staging, for a user signed in with a tb token.
//!
//! The page is plain HTML, CSS and JavaScript compiled into the binary ([`assets`]); it keeps
//! the token in `sessionStorage` and sends it as `Authorization: Bearer` to the JSON endpoints
//! under `/ui/api/` — no cookies, so no cross-site request can act with it, and the token is
//! never in a URL. What a user sees and may do follows the API's roles ([`rights`]):
//! - [`api`]: reads (lab, jobs, queues, events, models) and the one action, deleting a job;
//! - [`changes`]: one Server-Sent Events stream per page, fed by the store's watch hub and
//!   coalesced, telling the page which kinds changed so it fetches only those again;
//! - [`logs`]: a job's log lines, followed, read from the nodelets as `tbctl logs` does.
//!
//! Every list is bounded, and every response carries security headers ([`security_headers`]):
//! the page runs only its own script (CSP `default-src 'self'`) and may not be framed.

pub mod api;
pub mod assets;
pub mod changes;
pub mod logs;
pub mod rights;

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::Semaphore;

use crate::raft::RaftNode;
use crate::scheduler::SchedulerConfig;

/// Open change streams (pages) one controller serves at once; more are answered 503.
pub const MAX_CHANGE_STREAMS: usize = 64;
/// Open log streams one controller serves at once.
pub const MAX_LOG_STREAMS: usize = 16;

/// What the handlers share.
pub struct Dashboard {
    pub(crate) node: Arc<RaftNode>,
    /// For queue positions: fair shares decay with the configured half-life.
    pub(crate) scheduler: SchedulerConfig,
    pub(crate) change_streams: Arc<Semaphore>,
    pub(crate) log_streams: Arc<Semaphore>,
}

/// The routes under `/ui`.
pub fn router(node: Arc<RaftNode>, scheduler: SchedulerConfig) -> Router {
    let state = Arc::new(Dashboard {
        node,
        scheduler,
        change_streams: Arc::new(Semaphore::new(MAX_CHANGE_STREAMS)),
        log_streams: Arc::new(Semaphore::new(MAX_LOG_STREAMS)),
    });
    use axum::routing::{delete, get};
    Router::new()
        .route(
            "/ui",
            get(|| async { axum::response::Redirect::permanent("/ui/") }),
        )
        .route("/ui/", get(assets::index))
        .route("/ui/app.js", get(assets::script))
        .route("/ui/app.css", get(assets::style))
        .route("/ui/api/whoami", get(api::whoami))
        .route("/ui/api/lab", get(api::lab))
        .route("/ui/api/jobs", get(api::jobs))
        .route("/ui/api/queues", get(api::queues))
        .route("/ui/api/events", get(api::events))
        .route("/ui/api/models", get(api::models))
        .route(
            "/ui/api/jobs/{kind}/{namespace}/{name}",
            delete(api::delete_job),
        )
        .route("/ui/api/logs/{kind}/{namespace}/{name}", get(logs::follow))
        .route("/ui/api/changes", get(changes::stream))
        .route("/ui/api/{*rest}", axum::routing::any(api::not_found))
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(state)
}

/// Headers on every dashboard response: only the page's own files run, nothing frames it,
/// nothing is sniffed, no referrer leaves, and API answers are not cached.
async fn security_headers(request: Request, next: Next) -> Response {
    let api = request.uri().path().starts_with("/ui/api/");
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
             frame-ancestors 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if api {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// A JSON error the page shows as it is: `{"error": MESSAGE}`.
pub fn error(status: StatusCode, message: &str) -> Response {
    (status, json_body(&json!({ "error": message }))).into_response()
}

/// A JSON answer (200).
pub fn json_response(value: &serde_json::Value) -> Response {
    json_body(value).into_response()
}

fn json_body(value: &serde_json::Value) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        value.to_string(),
    )
}
