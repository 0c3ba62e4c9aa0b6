//! Prometheus metrics: request counts and latencies per gRPC method and code, apply latency,
//! Raft progress and stored objects per kind, served as text on `--metrics-listen`.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::raft::RaftNode;

type Labels = Vec<(String, String)>;

/// One controller's figures (each `RaftNode` has its own registry).
pub struct Metrics {
    registry: Registry,
    requests: Family<Labels, Counter>,
    request_seconds: Family<Labels, Histogram>,
    apply_seconds: Histogram,
    raft: Family<Labels, Gauge>,
    objects: Family<Labels, Gauge>,
}

fn latency_histogram() -> Histogram {
    // 50 µs .. ~13 s
    Histogram::new(exponential_buckets(0.00005, 2.0, 19))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("tb");
        let requests = Family::<Labels, Counter>::default();
        let request_seconds = Family::<Labels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let apply_seconds = latency_histogram();
        let raft = Family::<Labels, Gauge>::default();
        let objects = Family::<Labels, Gauge>::default();
        registry.register(
            "grpc_requests",
            "gRPC requests by method and code",
            requests.clone(),
        );
        registry.register(
            "grpc_request_duration_seconds",
            "gRPC request latency by method",
            request_seconds.clone(),
        );
        registry.register(
            "apply_duration_seconds",
            "Time to apply one batch of committed entries to the store",
            apply_seconds.clone(),
        );
        registry.register("raft", "Raft progress of this controller (term, commit_index, applied_index, last_log_index, is_leader)", raft.clone());
        registry.register("objects", "Stored objects by kind", objects.clone());
        Metrics {
            registry,
            requests,
            request_seconds,
            apply_seconds,
            raft,
            objects,
        }
    }
}

impl Metrics {
    pub fn observe_request(&self, method: &str, code: &str, elapsed: Duration) {
        let m = self;
        m.requests
            .get_or_create(&vec![
                ("method".into(), method.into()),
                ("code".into(), code.into()),
            ])
            .inc();
        m.request_seconds
            .get_or_create(&vec![("method".into(), method.into())])
            .observe(elapsed.as_secs_f64());
    }

    pub fn observe_apply(&self, elapsed: Duration) {
        self.apply_seconds.observe(elapsed.as_secs_f64());
    }

    /// The text exposition, with gauges read fresh from the node.
    pub fn render(&self, node: &RaftNode) -> String {
        let m = self;
        let g = node.gauges();
        for (name, value) in [
            ("term", g.term),
            ("commit_index", g.commit_index),
            ("applied_index", g.applied_index),
            ("last_log_index", g.last_log_index),
            ("is_leader", g.is_leader as u64),
        ] {
            m.raft
                .get_or_create(&vec![("figure".into(), name.into())])
                .set(value as i64);
        }
        {
            let state = node.store().read();
            for kind in tb_api::Kind::ALL {
                let n = state.list(kind.as_str(), "").len();
                m.objects
                    .get_or_create(&vec![("kind".into(), kind.as_str().into())])
                    .set(n as i64);
            }
        }
        let mut out = String::new();
        if encode(&mut out, &m.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Serve `/metrics` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, node: Arc<RaftNode>) -> std::io::Result<()> {
    use axum::routing::get;
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let node = node.clone();
            async move {
                (
                    [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    node.metrics().render(&node),
                )
            }
        }),
    );
    axum::serve(listener, app).await
}
