//! The stable address of InferenceServices (`--services-listen`): every controller, leader or
//! follower, serves `/services/{namespace}/{name}/v1/...` over HTTPS (the certificate of its
//! gRPC port) and forwards each request to the service's current rank 0, as read from its own
//! store replica — so a client keeps one `base_url` while tb places the service again on other
//! Macs. The OpenAI `api_key` is a tb user token (`Authorization: Bearer`).
//!
//! - [`access`]: who may use a service (a pure decision, beside `auth::authorize`);
//! - [`backend`]: the ready rank 0 endpoint the store names, waited for a bounded time;
//! - [`proxy`]: forwarding one request and streaming the answer back (SSE chunk by chunk);
//!
//! TLS on accepted connections is `tb_api::https`'s, as on rank 0's own endpoint.

pub mod access;
pub mod backend;
pub mod proxy;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::raft::RaftNode;

/// The largest request body forwarded (it is kept to be sent again if the backend moves).
pub const MAX_BODY: usize = 16 * 1024 * 1024;

/// How the services listener behaves.
#[derive(Debug, Clone)]
pub struct ServicesOptions {
    pub listen: SocketAddr,
    /// How long a request waits for its service to have a ready backend (and for a backend
    /// that failed it to be replaced) before it is answered 503.
    pub wait: Duration,
}

/// What the handlers share.
pub struct Services {
    node: Arc<RaftNode>,
    wait: Duration,
}

/// The router: everything under `/services/{namespace}/{name}/`.
pub fn router(node: Arc<RaftNode>, wait: Duration) -> Router {
    let state = Arc::new(Services { node, wait });
    Router::new()
        .route(
            "/services/{namespace}/{name}/{*rest}",
            axum::routing::any(forward),
        )
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "not_found",
                "tb serves InferenceServices at /services/NAMESPACE/NAME/v1/... and its dashboard at /ui/",
            )
        })
        .with_state(state)
}

/// Serves `app` (this module's [`router`], with the dashboard's beside it) on `listener` until
/// the process ends: over TLS with `tls`, else plain HTTP (`--insecure`).
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    app: Router,
) -> std::io::Result<()> {
    match tls {
        Some(config) => axum::serve(tb_api::https::TlsListener::new(listener, config), app).await,
        None => axum::serve(listener, app).await,
    }
}

/// An OpenAI-style error: `{"error": {"message", "type", "param", "code"}}`.
pub fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let kind = match status {
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "invalid_request_error",
        StatusCode::SERVICE_UNAVAILABLE => "service_unavailable",
        _ => "invalid_request_error",
    };
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response()
}

async fn forward(
    State(services): State<Arc<Services>>,
    Path((namespace, name, rest)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    let caller = {
        let header = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let now = crate::service::now();
        let state = services.node.store().read();
        crate::auth::authenticate(&state, services.node.credentials(), header, &now)
    };
    let caller = match caller {
        Ok(crate::auth::Caller::Anonymous) | Err(()) => {
            return error(
                StatusCode::UNAUTHORIZED,
                "invalid_api_key",
                "give a tb user token as the API key (Authorization: Bearer tbuser-...)",
            );
        }
        Ok(c) => c,
    };
    if let Err(why) = access::may_use(&caller, &namespace) {
        return error(StatusCode::FORBIDDEN, "permission_denied", &why);
    }
    // Only the OpenAI API of the service is forwarded, never another path of its rank 0.
    if rest != "v1" && !rest.starts_with("v1/") {
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("{rest:?}: services answer under /services/{namespace}/{name}/v1/"),
        );
    }
    let key = backend::service_key(&namespace, &name);
    if services.node.store().read().get(&key).is_none() {
        return error(
            StatusCode::NOT_FOUND,
            "service_not_found",
            &format!("no InferenceService {name:?} in namespace {namespace:?}"),
        );
    }
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                &format!("reading the request body (at most {MAX_BODY} bytes): {e}"),
            );
        }
    };
    let path_and_query = match parts.uri.query() {
        Some(q) => format!("/{rest}?{q}"),
        None => format!("/{rest}"),
    };
    let outgoing = proxy::Outgoing {
        method: parts.method,
        path_and_query,
        headers: parts.headers,
        body,
    };
    proxy::forward(&services.node, &key, services.wait, outgoing).await
}

/// 503 while a service has no ready backend: the client may try again after a while.
pub fn unavailable(message: &str) -> Response {
    let mut r = error(
        StatusCode::SERVICE_UNAVAILABLE,
        "service_unavailable",
        message,
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    r
}
