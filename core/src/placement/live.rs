//! The live inputs of placement: the topology from the Nodes and Links in the store, and the
//! workload from a job and its Model. The controller's scheduler and `tbctl plan` both build
//! their inputs here, so the offline and live paths cannot drift apart.

use std::collections::BTreeMap;

use tb_api::specs::{
    InferenceServiceSpec, LinkSpec, LinkStatus, ModelSpec, Parallelism, TrainingJobSpec,
    TrainingParallelism,
};
use tb_api::status::{EngineFigures, PlacedStage, PlacementSummary};

use super::{LinkInfo, Mac, ModelShape, Objective, Plan, Strategy, Topology, Workload};

/// When a link was never measured: what the port negotiated, else a conservative guess.
const UNMEASURED_GBPS: f64 = 10.0;
/// Round trip of a small message when not measured: RDMA over Thunderbolt vs TCP.
const UNMEASURED_RDMA_US: f64 = 10.0;
const UNMEASURED_TCP_US: f64 = 300.0;

/// What placement needs to know of one Node (built from a `ClusterView` node or a Node object).
pub struct NodeFacts<'a> {
    pub name: &'a str,
    pub chip: &'a str,
    pub allocatable_bytes: u64,
    /// Free for new work: allocatable less the allocations that hold memory.
    pub free_bytes: u64,
    pub memory_bandwidth_gbs: Option<f64>,
    /// The built-in engine's own decode figures, when the nodelet measured them.
    pub engine: Option<&'a EngineFigures>,
    pub gpu_cores: Option<u32>,
    pub labels: &'a BTreeMap<String, String>,
    /// Why nothing new may go there (not Ready, cordoned, draining).
    pub unavailable: Option<String>,
}

/// A Mac of unknown chip: a modest bandwidth, so it is used only when it must be.
const UNKNOWN_BANDWIDTH_GBS: f64 = 100.0;

pub fn mac(n: &NodeFacts<'_>) -> Mac {
    // Measured figures win over the chip's: they are of the engine that will run the model.
    let measured = n
        .engine
        .filter(|e| e.weight_gbs.is_finite() && e.weight_gbs > 0.0 && e.token_overhead_us >= 0.0);
    Mac {
        name: n.name.to_string(),
        chip: n.chip.to_string(),
        allocatable_bytes: n.allocatable_bytes,
        free_bytes: n.free_bytes,
        memory_bandwidth_gbs: match measured {
            Some(e) => e.weight_gbs,
            None => n
                .memory_bandwidth_gbs
                .filter(|b| *b > 0.0)
                .unwrap_or(UNKNOWN_BANDWIDTH_GBS),
        },
        token_overhead_us: measured.map_or(0.0, |e| e.token_overhead_us.min(1e6)),
        engine_measured: measured.is_some(),
        gpu_cores: n.gpu_cores.unwrap_or(0),
        labels: n.labels.clone(),
        unavailable: n.unavailable.clone(),
    }
}

/// A Link object as an edge: measured figures when there are some, nominal ones otherwise.
pub fn link_info(spec: &LinkSpec, status: &LinkStatus) -> LinkInfo {
    let measured = status.measured();
    let bandwidth = status
        .bandwidth_gbps
        .filter(|b| *b > 0.0)
        .or(spec.nominal_gbps)
        .unwrap_or(UNMEASURED_GBPS);
    let latency = status.latency_us_p50.unwrap_or(if spec.rdma {
        UNMEASURED_RDMA_US
    } else {
        UNMEASURED_TCP_US
    });
    let mut rdma_devices: BTreeMap<String, Vec<String>> = BTreeMap::new();
    if spec.rdma {
        for end in [&spec.a, &spec.b] {
            if let Some(d) = &end.rdma_device {
                rdma_devices
                    .entry(end.node.clone())
                    .or_default()
                    .push(d.clone());
            }
        }
    }
    LinkInfo {
        bandwidth_gbps: bandwidth,
        latency_us: latency,
        rdma: spec.rdma,
        cables: 1,
        measured,
        rdma_devices,
    }
}

/// The topology from nodes and links.
pub fn topology<'a>(
    nodes: impl IntoIterator<Item = NodeFacts<'a>>,
    links: impl IntoIterator<Item = (&'a LinkSpec, &'a LinkStatus)>,
) -> Topology {
    let macs = nodes.into_iter().map(|n| mac(&n)).collect();
    let links = links
        .into_iter()
        .map(|(spec, status)| {
            (
                spec.a.node.clone(),
                spec.b.node.clone(),
                link_info(spec, status),
            )
        })
        .collect();
    Topology::new(macs, links)
}

/// The workload of an InferenceService serving `model`.
pub fn service_workload(
    spec: &InferenceServiceSpec,
    model_name: &str,
    model: &ModelSpec,
) -> Result<Workload, String> {
    Ok(Workload {
        model: ModelShape::from_spec(model_name, model, spec.context, spec.batch)?,
        strategy: match spec.parallelism {
            Parallelism::Pipeline => Strategy::Pipeline,
            Parallelism::Tensor => Strategy::Tensor,
            Parallelism::Auto => Strategy::Auto,
        },
        objective: match spec.objective {
            tb_api::specs::Objective::Latency => Objective::Latency,
            tb_api::specs::Objective::Throughput => Objective::Throughput,
        },
        min_nodes: spec.nodes.min,
        max_nodes: spec.nodes.max,
        node_selector: spec.node_selector.clone(),
    })
}

/// The workload of a TrainingJob that names a Model: data parallel over exactly `ranks` Macs,
/// or a pipeline over up to `ranks`.
pub fn training_workload(
    spec: &TrainingJobSpec,
    model_name: &str,
    model: &ModelSpec,
) -> Result<Workload, String> {
    let strategy = match spec.parallelism {
        TrainingParallelism::Data => Strategy::Data,
        TrainingParallelism::Pipeline => Strategy::Pipeline,
        TrainingParallelism::Auto => Strategy::Auto,
    };
    Ok(Workload {
        model: ModelShape::from_spec(model_name, model, None, None)?,
        strategy,
        objective: Objective::Throughput,
        min_nodes: if strategy == Strategy::Data {
            spec.ranks
        } else {
            1
        },
        max_nodes: Some(spec.ranks),
        node_selector: spec.node_selector.clone(),
    })
}

/// Why a job's workload cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
    #[error("{0}")]
    ModelNotFound(String),
    #[error("{0}")]
    ModelIncomplete(String),
}

/// The workload of a job (InferenceService, or TrainingJob naming a Model without saying how
/// much memory each rank takes), given the Models by (namespace, name). `Ok(None)`: the job is
/// sized by `ranks` × `memory`, not by a Model.
pub fn workload_for(
    job: &tb_api::Object,
    models: &BTreeMap<(String, String), ModelSpec>,
) -> Result<Option<Workload>, WorkloadError> {
    use tb_api::specs::parse_spec;
    let ns = &job.metadata.namespace;
    let lookup = |name: &str| {
        models.get(&(ns.clone(), name.to_string())).ok_or_else(|| {
            WorkloadError::ModelNotFound(format!(
                "Model {ns}/{name} does not exist (apply it first)"
            ))
        })
    };
    match job.kind() {
        Some(tb_api::Kind::InferenceService) => {
            let spec: InferenceServiceSpec =
                parse_spec(&job.spec).map_err(|e| WorkloadError::ModelIncomplete(e.to_string()))?;
            let model = lookup(&spec.model)?;
            service_workload(&spec, &spec.model, model)
                .map(Some)
                .map_err(WorkloadError::ModelIncomplete)
        }
        Some(tb_api::Kind::TrainingJob) => {
            let spec: TrainingJobSpec =
                parse_spec(&job.spec).map_err(|e| WorkloadError::ModelIncomplete(e.to_string()))?;
            match (&spec.model, &spec.memory) {
                (Some(name), None) => {
                    let model = lookup(name)?;
                    training_workload(&spec, name, model)
                        .map(Some)
                        .map_err(WorkloadError::ModelIncomplete)
                }
                _ => Ok(None),
            }
        }
        _ => Ok(None),
    }
}

/// The plan as a job's status shows it.
pub fn summary(plan: &Plan) -> PlacementSummary {
    PlacementSummary {
        strategy: strategy_name(plan.strategy).into(),
        objective: match plan.objective {
            Objective::Latency => "latency",
            Objective::Throughput => "throughput",
        }
        .into(),
        ring: plan.ring,
        predicted_tokens_per_second: (plan.tokens_per_second * 10.0).round() / 10.0,
        figures: figures_of(plan.stages.iter().map(|s| s.engine_measured)).into(),
        observed_tokens_per_second: None,
        observed_context_tokens: None,
        predicted_at_observed_tokens_per_second: None,
        stages: plan
            .stages
            .iter()
            .map(|s| PlacedStage {
                node: s.node.clone(),
                first_layer: s.first_layer,
                layers: s.layers,
                memory_bytes: s.memory_bytes,
                weight_bytes: s.weight_bytes,
                kv_bytes: s.kv_bytes,
            })
            .collect(),
        alternatives: plan
            .alternatives
            .iter()
            .map(|a| format!("{}: {}", a.description, a.reason))
            .collect(),
        note: String::new(),
    }
}

/// A placed model's prediction costed again with the figures its Macs report now: a service
/// placed before its nodelets had measured their engine keeps the chips' figures until this.
/// The memory the gang holds is its own, so it counts as free here. The summary's stages,
/// strategy and alternatives stay as placed; None when the placement no longer costs (a Mac
/// gone or unavailable) or its strategy is not one the cost model knows.
pub fn recost(
    topology: &Topology,
    workload: &Workload,
    placed: &PlacementSummary,
) -> Option<PlacementSummary> {
    let strategy = [Strategy::Pipeline, Strategy::Tensor, Strategy::Data]
        .into_iter()
        .find(|s| strategy_name(*s) == placed.strategy)?;
    let mut own = topology.clone();
    for stage in &placed.stages {
        let index = own.index_of(&stage.node)?;
        let mac = own.graph.node_weight_mut(index)?;
        mac.free_bytes = mac
            .free_bytes
            .saturating_add(stage.memory_bytes)
            .min(mac.allocatable_bytes.max(mac.free_bytes));
    }
    let assignment = super::cost::Assignment {
        strategy,
        order: placed
            .stages
            .iter()
            .map(|s| (s.node.clone(), s.layers))
            .collect(),
    };
    let cost = super::evaluate(&own, workload, &assignment).ok()?;
    Some(PlacementSummary {
        predicted_tokens_per_second: (cost.tokens_per_second * 10.0).round() / 10.0,
        figures: figures_of(cost.stages.iter().map(|s| s.engine_measured)).into(),
        ring: cost.ring,
        ..placed.clone()
    })
}

/// What the placed assignment predicts for ONE stream holding `context` tokens (the context
/// its streams were observed at): a plan predicts for its objective at the whole reserved
/// context, which every token would read in full, while a conversation reads what it holds.
/// The gang's own memory counts as free, as in [`recost`].
pub fn predict_for_stream(
    topology: &Topology,
    workload: &Workload,
    placed: &PlacementSummary,
    context: u32,
) -> Option<f64> {
    let mut one = workload.clone();
    one.objective = Objective::Latency;
    one.model.batch = 1;
    one.model.context = context.clamp(1, workload.model.context.max(1));
    recost(topology, &one, placed).map(|p| p.predicted_tokens_per_second)
}

/// Which figures a prediction rests on, from whether each stage's Mac measured its engine.
fn figures_of(mut measured: impl Iterator<Item = bool> + Clone) -> &'static str {
    match (measured.clone().all(|m| m), measured.any(|m| m)) {
        (true, _) => "engine",
        (false, true) => "mixed",
        (false, false) => "chip",
    }
}

pub fn strategy_name(s: Strategy) -> &'static str {
    match s {
        Strategy::Pipeline => "pipeline",
        Strategy::Tensor => "tensor",
        Strategy::Data => "data",
        Strategy::Auto => "auto",
    }
}

/// JACCL's device matrix for ranks on `nodes` (in rank order): row i, column j = the RDMA
/// device(s) on rank i's Mac cabled to rank j's Mac; None where no RDMA cable joins them.
pub fn ibv_matrix(topology: &Topology, nodes: &[String]) -> Vec<Vec<Option<String>>> {
    nodes
        .iter()
        .enumerate()
        .map(|(i, a)| {
            nodes
                .iter()
                .enumerate()
                .map(|(j, b)| {
                    if i == j || a == b {
                        return None;
                    }
                    let link = topology.link(a, b).filter(|l| l.rdma)?;
                    link.rdma_devices.get(a)?.first().cloned()
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tb_api::specs::LinkEnd;

    fn facts<'a>(name: &'a str, labels: &'a BTreeMap<String, String>) -> NodeFacts<'a> {
        NodeFacts {
            name,
            chip: "Apple M4 Max",
            allocatable_bytes: 100 << 30,
            free_bytes: 100 << 30,
            memory_bandwidth_gbs: Some(546.0),
            engine: None,
            gpu_cores: Some(40),
            labels,
            unavailable: None,
        }
    }

    fn rdma_link(a: &str, b: &str) -> LinkSpec {
        let end = |node: &str, dev: &str| LinkEnd {
            node: node.into(),
            port: "tb1".into(),
            rdma_device: Some(dev.into()),
            ..Default::default()
        };
        LinkSpec {
            a: end(a, &format!("rdma_{a}")),
            b: end(b, &format!("rdma_{b}")),
            nominal_gbps: Some(80.0),
            rdma: true,
            probe_request: 0,
        }
    }

    #[test]
    fn the_engines_own_figures_win_over_the_chips() {
        let labels = BTreeMap::new();
        let chip = mac(&facts("m1", &labels));
        assert_eq!(
            (chip.memory_bandwidth_gbs, chip.token_overhead_us),
            (546.0, 0.0)
        );
        assert!(!chip.engine_measured);
        let figures = EngineFigures {
            backend: "cpu".into(),
            weight_gbs: 2.5,
            token_overhead_us: 400.0,
            measured_at: None,
            threads: None,
        };
        let measured = mac(&NodeFacts {
            engine: Some(&figures),
            ..facts("m1", &labels)
        });
        assert_eq!(
            (measured.memory_bandwidth_gbs, measured.token_overhead_us),
            (2.5, 400.0)
        );
        assert!(measured.engine_measured);
        // Nonsense figures are not used.
        let broken = EngineFigures {
            weight_gbs: f64::NAN,
            ..figures.clone()
        };
        let ignored = mac(&NodeFacts {
            engine: Some(&broken),
            ..facts("m1", &labels)
        });
        assert!(!ignored.engine_measured);

        // A 10-layer model of 100 MB per layer on the measured Mac: 1 GB at 2.5 GB/s is 400 ms,
        // plus 0.4 ms per token; the status says the figures are the engine's.
        let topo = Topology::new(vec![measured], vec![]);
        let model = ModelShape {
            name: "m".into(),
            layers: 10,
            bytes_per_layer: 100_000_000,
            hidden_size: 1024,
            heads: 8,
            kv_heads: 8,
            head_dim: 128,
            context: 1,
            batch: 1,
            ..ModelShape::default()
        };
        let work = Workload {
            model,
            strategy: Strategy::Pipeline,
            objective: Objective::Latency,
            min_nodes: 1,
            max_nodes: Some(1),
            node_selector: BTreeMap::new(),
        };
        let plan = super::super::plan(&topo, &work, &Default::default()).expect("placeable");
        // Each layer also reads its KV cache: 2 × 8 heads × 128 × 1 token × 2 bytes.
        let expected_us = 10.0 * (100_000_000.0 + 4096.0) / 2.5e9 * 1e6 + 400.0;
        assert!(
            (plan.time_per_token_us - expected_us).abs() / expected_us < 0.01,
            "{} µs, expected about {expected_us}",
            plan.time_per_token_us
        );
        assert_eq!(summary(&plan).figures, "engine");
    }

    #[test]
    fn unmeasured_links_use_nominal_figures_and_measured_ones_win() {
        let spec = rdma_link("m1", "m2");
        let info = link_info(&spec, &LinkStatus::default());
        assert_eq!(info.bandwidth_gbps, 80.0);
        assert_eq!(info.latency_us, UNMEASURED_RDMA_US);
        assert!(!info.measured);
        let measured = LinkStatus {
            bandwidth_gbps: Some(61.5),
            latency_us_p50: Some(7.0),
            ..Default::default()
        };
        let info = link_info(&spec, &measured);
        assert_eq!((info.bandwidth_gbps, info.latency_us), (61.5, 7.0));
        assert!(info.measured);
    }

    #[test]
    fn device_matrix_follows_the_cables() {
        let labels = BTreeMap::new();
        let l12 = rdma_link("m1", "m2");
        let l23 = rdma_link("m2", "m3");
        let none = LinkStatus::default();
        let t = topology(
            [
                facts("m1", &labels),
                facts("m2", &labels),
                facts("m3", &labels),
            ],
            [(&l12, &none), (&l23, &none)],
        );
        let nodes: Vec<String> = ["m1", "m2", "m3"].map(String::from).to_vec();
        let m = ibv_matrix(&t, &nodes);
        assert_eq!(m[0], [None, Some("rdma_m1".into()), None]);
        assert_eq!(m[1], [Some("rdma_m2".into()), None, Some("rdma_m2".into())]);
        assert_eq!(m[2][0], None, "no cable m3–m1");
    }
}
