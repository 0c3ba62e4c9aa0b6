//! The one layer every gRPC call passes through, before any handler: it identifies the caller
//! from its bearer token (`crate::auth::authenticate`, against this member's applied state),
//! refuses unknown, expired or revoked credentials with UNAUTHENTICATED and no detail, keeps
//! the controller-to-controller `Raft` service to controllers, and records the method, the
//! resulting code and the latency. Handlers never repeat any of this; they read the
//! [`Caller`] from the request's extensions and ask `crate::auth::authorize`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use std::sync::Arc;

use http::{Request, Response};
use tower::{Layer, Service};

pub use crate::auth::Caller;
use crate::auth::{UNAUTHENTICATED, authenticate};
use crate::raft::RaftNode;

/// Methods served without credentials: they carry their own (a join token, a node credential),
/// or answer what is public (the CA certificate a joining controller checks against its token).
const ANONYMOUS_METHODS: [&str; 4] = [
    "/tb.v1.Nodes/Join",
    "/tb.v1.Nodes/Heartbeat",
    "/tb.v1.Cluster/ClusterCa",
    "/tb.v1.Cluster/JoinCluster",
];
/// Served to other controllers only.
const CONTROLLER_SERVICE: &str = "/tb.v1.Raft/";

#[derive(Clone)]
pub struct RpcLayer {
    node: Arc<RaftNode>,
}

impl RpcLayer {
    /// Tokens are looked up in the node's applied state; the cluster secret in its credentials.
    pub fn new(node: Arc<RaftNode>) -> RpcLayer {
        RpcLayer { node }
    }
}

impl<S> Layer<S> for RpcLayer {
    type Service = RpcService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RpcService {
            inner,
            node: self.node.clone(),
        }
    }
}

#[derive(Clone)]
pub struct RpcService<S> {
    inner: S,
    node: Arc<RaftNode>,
}

/// Who `req` comes from, or the refusal to answer with.
fn identify<B>(node: &RaftNode, method: &str, req: &Request<B>) -> Result<Caller, tonic::Status> {
    let header = match req.headers().get(http::header::AUTHORIZATION) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .map_err(|_| tonic::Status::unauthenticated(UNAUTHENTICATED))?,
        ),
    };
    let now = crate::service::now();
    let caller = authenticate(&node.store().read(), node.credentials(), header, &now)
        .map_err(|()| tonic::Status::unauthenticated(UNAUTHENTICATED))?;
    if method.starts_with(CONTROLLER_SERVICE) {
        return match caller {
            Caller::Controller => Ok(caller),
            Caller::Anonymous => Err(tonic::Status::unauthenticated(UNAUTHENTICATED)),
            other => Err(tonic::Status::permission_denied(format!(
                "{other} may not call {method}: it is for controllers of this cluster"
            ))),
        };
    }
    if caller == Caller::Anonymous && !ANONYMOUS_METHODS.contains(&method) {
        return Err(tonic::Status::unauthenticated(UNAUTHENTICATED));
    }
    Ok(caller)
}

/// A request tonic cannot decode (a string field that is not UTF-8, a truncated message) is the
/// client's fault, but prost's decode errors come back as INTERNAL: answer INVALID_ARGUMENT, as
/// for any other bad input. Decode errors are answered before a body, so the code is in the
/// headers.
fn client_fault_is_invalid_argument<RB>(resp: &mut Response<RB>) {
    let headers = resp.headers_mut();
    let internal = headers
        .get("grpc-status")
        .is_some_and(|v| v.as_bytes() == b"13");
    let decode = headers.get("grpc-message").is_some_and(|m| {
        let m = m.as_bytes();
        [
            &b"failed to decode Protobuf message"[..],
            b"failed%20to%20decode%20Protobuf%20message",
        ]
        .iter()
        .any(|p| m.starts_with(p))
    });
    if internal && decode {
        headers.insert(
            "grpc-status",
            http::HeaderValue::from_static("3"), // INVALID_ARGUMENT
        );
    }
}

impl<S, B, RB> Service<Request<B>> for RpcService<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
    RB: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let method = req.uri().path().to_string();
        let short = method.trim_start_matches("/tb.v1.").to_string();
        let started = Instant::now();
        match identify(&self.node, &method, &req) {
            Ok(caller) => {
                req.extensions_mut().insert(caller);
            }
            Err(status) => {
                let code = format!("{:?}", status.code());
                self.node
                    .metrics()
                    .observe_request(&short, &code, started.elapsed());
                tracing::debug!(method = %method, code = %code, "request refused before its handler");
                return Box::pin(async move { Ok(status.into_http()) });
            }
        }
        // Take the service that was driven to readiness, leave a fresh clone in its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let node = self.node.clone();
        Box::pin(async move {
            let mut result = inner.call(req).await;
            if let Ok(resp) = &mut result {
                client_fault_is_invalid_argument(resp);
            }
            let code = match &result {
                // Errors answered before a body ("trailers-only") carry grpc-status in the
                // headers; a successful unary call carries it in trailers, and is OK.
                Ok(resp) => resp
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<i32>().ok())
                    .map(|c| format!("{:?}", tonic::Code::from_i32(c)))
                    .unwrap_or_else(|| "Ok".into()),
                Err(_) => "TransportError".into(),
            };
            node.metrics()
                .observe_request(&short, &code, started.elapsed());
            if code != "Ok" {
                tracing::debug!(method = %method, code = %code, "request refused");
            }
            result
        })
    }
}
