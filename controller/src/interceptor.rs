//! The one layer every gRPC call passes through, before any handler: it identifies the caller
//! (the place where TLS client identities and bearer tokens are checked), and records the
//! method, the resulting code and the latency. Handlers never repeat any of this.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Request, Response};
use tower::{Layer, Service};

/// Who is calling. Until authentication is switched on every caller is anonymous; handlers
/// read this from the request's extensions, so adding tokens changes no handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Anonymous,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct RpcLayer;

impl<S> Layer<S> for RpcLayer {
    type Service = RpcService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RpcService { inner }
    }
}

#[derive(Debug, Clone)]
pub struct RpcService<S> {
    inner: S,
}

impl<S, B, RB> Service<Request<B>> for RpcService<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let method = req.uri().path().to_string();
        req.extensions_mut().insert(Caller::Anonymous);
        // Take the service that was driven to readiness, leave a fresh clone in its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let started = Instant::now();
        Box::pin(async move {
            let result = inner.call(req).await;
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
            let short = method.trim_start_matches("/tb.v1.");
            crate::metrics::observe_request(short, &code, started.elapsed());
            if code != "Ok" {
                tracing::debug!(method = %method, code = %code, "request refused");
            }
            result
        })
    }
}
