//! Prometheus metrics: request counts and latencies per gRPC method and code, apply latency,
//! Raft progress and stored objects per kind, and the lab as the store sees it (Macs ready and
//! their memory, jobs per phase, restarts, predicted tokens/s, measured links), served as text on
//! `--metrics-listen`. `docs/grafana/tb.json` is a dashboard for them.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use tb_api::Kind;
use tb_api::specs::link::LinkStatus;
use tb_api::status::{JobPhase, JobStatus, NodeStatus};
use tb_core::store::State;

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
    lab: LabFigures,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// Figures read from the store at each scrape. Label sets of objects that went away are
/// dropped by clearing each family before it is filled again.
#[derive(Default)]
struct LabFigures {
    /// Serialises scrapes: one clears and refills while no other reads half of it.
    filling: std::sync::Mutex<()>,
    node_ready: Family<Labels, Gauge>,
    node_memory: Family<Labels, Gauge>,
    jobs: Family<Labels, Gauge>,
    job_restarts: Family<Labels, Gauge>,
    predicted_tokens: Family<Labels, FloatGauge>,
    observed_tokens: Family<Labels, FloatGauge>,
    predicted_at_observed: Family<Labels, FloatGauge>,
    training_step: Family<Labels, Gauge>,
    training_loss: Family<Labels, FloatGauge>,
    link_bandwidth: Family<Labels, FloatGauge>,
    link_latency: Family<Labels, FloatGauge>,
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl LabFigures {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "node_ready",
            "1 when the Mac's nodelet heartbeats (Ready), else 0",
            self.node_ready.clone(),
        );
        registry.register(
            "node_memory_bytes",
            "A Mac's memory: capacity, allocatable (after the reserve), allocated (to tb's work), free",
            self.node_memory.clone(),
        );
        registry.register(
            "jobs",
            "TrainingJobs and InferenceServices per phase",
            self.jobs.clone(),
        );
        registry.register(
            "job_restarts",
            "How often a job's gang was restarted",
            self.job_restarts.clone(),
        );
        registry.register(
            "service_predicted_tokens_per_second",
            "The placement's prediction for an InferenceService",
            self.predicted_tokens.clone(),
        );
        registry.register(
            "service_observed_tokens_per_second",
            "Decode tokens/s an InferenceService's streams have seen of late",
            self.observed_tokens.clone(),
        );
        registry.register(
            "service_predicted_at_observed_tokens_per_second",
            "What the placement's figures predict for one stream at the context an \
             InferenceService's streams were observed at",
            self.predicted_at_observed.clone(),
        );
        registry.register(
            "training_step",
            "Optimiser steps a built-in fine-tune has done",
            self.training_step.clone(),
        );
        registry.register(
            "training_loss",
            "A built-in fine-tune's training loss per token at its latest step",
            self.training_loss.clone(),
        );
        registry.register(
            "link_bandwidth_gbps",
            "A cable's measured throughput (Gb/s)",
            self.link_bandwidth.clone(),
        );
        registry.register(
            "link_latency_seconds",
            "A cable's measured small-message round trip",
            self.link_latency.clone(),
        );
    }

    fn fill(&self, state: &State) {
        let _one_at_a_time = self.filling.lock().unwrap_or_else(|e| e.into_inner());
        for family in [
            &self.node_ready,
            &self.node_memory,
            &self.jobs,
            &self.job_restarts,
            &self.training_step,
        ] {
            family.clear();
        }
        for family in [
            &self.predicted_tokens,
            &self.observed_tokens,
            &self.predicted_at_observed,
            &self.training_loss,
            &self.link_bandwidth,
            &self.link_latency,
        ] {
            family.clear();
        }
        for node in state.list(Kind::Node.as_str(), "") {
            let name = node.metadata.name.as_str();
            let status = NodeStatus::from_value(&node.status);
            self.node_ready
                .get_or_create(&labels(&[("node", name)]))
                .set(i64::from(status.is_ready()));
            for (figure, bytes) in [
                ("capacity", status.capacity.memory_bytes),
                ("allocatable", status.capacity.allocatable_bytes),
                ("allocated", status.allocated_bytes),
                ("free", status.free_bytes),
            ] {
                self.node_memory
                    .get_or_create(&labels(&[("node", name), ("figure", figure)]))
                    .set(i64::try_from(bytes).unwrap_or(i64::MAX));
            }
        }
        for kind in [Kind::TrainingJob, Kind::InferenceService] {
            for phase in [
                JobPhase::Pending,
                JobPhase::Scheduled,
                JobPhase::Running,
                JobPhase::Succeeded,
                JobPhase::Failed,
            ] {
                // Every phase is present, zero or not, so a graph has no gaps.
                self.jobs
                    .get_or_create(&labels(&[
                        ("kind", kind.as_str()),
                        ("phase", phase.as_str()),
                    ]))
                    .set(0);
            }
            for job in state.list(kind.as_str(), "") {
                let status = JobStatus::from_value(&job.status);
                let (namespace, name) =
                    (job.metadata.namespace.as_str(), job.metadata.name.as_str());
                self.jobs
                    .get_or_create(&labels(&[
                        ("kind", kind.as_str()),
                        ("phase", status.phase.as_str()),
                    ]))
                    .inc();
                let object = [
                    ("kind", kind.as_str()),
                    ("namespace", namespace),
                    ("name", name),
                ];
                self.job_restarts
                    .get_or_create(&labels(&object))
                    .set(i64::from(status.restarts));
                if let Some(t) = status.training.as_ref() {
                    self.training_step
                        .get_or_create(&labels(&object[1..]))
                        .set(i64::try_from(t.step).unwrap_or(i64::MAX));
                    if let Some(loss) = t.loss {
                        self.training_loss
                            .get_or_create(&labels(&object[1..]))
                            .set(loss);
                    }
                }
                if let Some(placement) = status.model_placement.as_ref() {
                    self.predicted_tokens
                        .get_or_create(&labels(&object[1..]))
                        .set(placement.predicted_tokens_per_second);
                    if let Some(observed) = placement.observed_tokens_per_second {
                        self.observed_tokens
                            .get_or_create(&labels(&object[1..]))
                            .set(observed);
                    }
                    if let Some(there) = placement.predicted_at_observed_tokens_per_second {
                        self.predicted_at_observed
                            .get_or_create(&labels(&object[1..]))
                            .set(there);
                    }
                }
            }
        }
        for link in state.list(Kind::Link.as_str(), "") {
            let Ok(status) = serde_json::from_value::<LinkStatus>(link.status.clone()) else {
                continue;
            };
            let name = link.metadata.name.as_str();
            if let Some(gbps) = status.bandwidth_gbps {
                let transport = if status.transport.is_empty() {
                    "tcp"
                } else {
                    &status.transport
                };
                self.link_bandwidth
                    .get_or_create(&labels(&[("link", name), ("transport", transport)]))
                    .set(gbps);
            }
            for (quantile, us) in [
                ("0.5", status.latency_us_p50),
                ("0.99", status.latency_us_p99),
            ] {
                if let Some(us) = us {
                    self.link_latency
                        .get_or_create(&labels(&[("link", name), ("quantile", quantile)]))
                        .set(us / 1e6);
                }
            }
        }
    }
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
        let lab = LabFigures::default();
        lab.register(&mut registry);
        Metrics {
            registry,
            requests,
            request_seconds,
            apply_seconds,
            raft,
            objects,
            lab,
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
            m.lab.fill(&state);
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

#[cfg(test)]
mod tests {
    use super::*;
    use tb_core::sim::Sim;

    fn exposition(figures: &LabFigures) -> String {
        let mut registry = Registry::with_prefix("tb");
        figures.register(&mut registry);
        let mut out = String::new();
        encode(&mut out, &registry).expect("encodes");
        out
    }

    #[test]
    fn the_lab_is_read_from_the_store_and_gone_objects_leave() {
        let mut sim = Sim::new();
        sim.add_node("mac1", 64);
        sim.add_node("mac2", 32);
        let yaml = "kind: TrainingJob\napiVersion: tb/v1\nmetadata: {name: echo, namespace: team}\n\
                    spec: {executor: exec, ranks: 2, memory: 1Gi, command: [\"true\"]}\n";
        let job = tb_api::load::load_str("job.yaml", yaml).expect("loads");
        sim.apply(job[0].object.clone());
        sim.settle();

        let figures = LabFigures::default();
        figures.fill(&sim.state);
        let text = exposition(&figures);
        for line in [
            "tb_node_ready{node=\"mac1\"} 1",
            "tb_node_memory_bytes{node=\"mac2\",figure=\"allocatable\"} 34359738368",
            "tb_jobs{kind=\"TrainingJob\",phase=\"Scheduled\"} 1",
            "tb_jobs{kind=\"TrainingJob\",phase=\"Failed\"} 0",
            "tb_jobs{kind=\"InferenceService\",phase=\"Running\"} 0",
            "tb_job_restarts{kind=\"TrainingJob\",namespace=\"team\",name=\"echo\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }

        // A node that went away leaves no figures behind.
        let mut emptier = Sim::new();
        emptier.add_node("mac1", 64);
        figures.fill(&emptier.state);
        let text = exposition(&figures);
        assert!(!text.contains("mac2"), "{text}");
        assert!(!text.contains("name=\"echo\""), "{text}");
    }

    #[test]
    fn the_grafana_dashboard_queries_only_metrics_that_exist() {
        let metrics = Metrics::default();
        // A family is exported once it has a member: give every one of them one.
        let mut sim = Sim::new();
        sim.add_node("mac1", 64);
        metrics.lab.fill(&sim.state);
        let one = labels(&[("x", "y")]);
        metrics.lab.job_restarts.get_or_create(&one).set(1);
        metrics.lab.predicted_tokens.get_or_create(&one).set(1.0);
        metrics.lab.observed_tokens.get_or_create(&one).set(1.0);
        metrics
            .lab
            .predicted_at_observed
            .get_or_create(&one)
            .set(1.0);
        metrics.lab.link_bandwidth.get_or_create(&one).set(1.0);
        metrics.lab.link_latency.get_or_create(&one).set(1.0);
        metrics.raft.get_or_create(&one).set(1);
        metrics.objects.get_or_create(&one).set(1);
        metrics.observe_request("m", "OK", std::time::Duration::from_millis(1));
        metrics.observe_apply(std::time::Duration::from_millis(1));
        let mut exposition = String::new();
        encode(&mut exposition, &metrics.registry).expect("encodes");
        // `# TYPE name kind` → the sample names Prometheus stores for it.
        let mut samples = Vec::new();
        for line in exposition.lines() {
            let mut words = line.split_whitespace();
            if let (Some("#"), Some("TYPE"), Some(name), Some(kind)) =
                (words.next(), words.next(), words.next(), words.next())
            {
                match kind {
                    "counter" => samples.push(format!("{name}_total")),
                    "histogram" => {
                        for suffix in ["bucket", "sum", "count"] {
                            samples.push(format!("{name}_{suffix}"));
                        }
                    }
                    _ => samples.push(name.to_string()),
                }
            }
        }
        let dashboard: serde_json::Value =
            serde_json::from_str(include_str!("../../docs/grafana/tb.json")).expect("valid JSON");
        let panels = dashboard["panels"].as_array().expect("panels");
        let mut queried = 0;
        for panel in panels {
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().expect("an expr");
                let names = expr
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .filter(|word| word.starts_with("tb_"));
                for name in names {
                    assert!(
                        samples.iter().any(|s| s == name),
                        "panel {:?} queries {name}, which tb-controller does not export",
                        panel["title"]
                    );
                    queried += 1;
                }
            }
        }
        assert!(queried >= 12, "the dashboard queries {queried} series");
    }
}
