//! Placement: which Macs run a model, in which order, with which layers — a pure function from a
//! topology snapshot and a workload to a plan with predicted tokens/s. The controller calls it on
//! the live cluster; `tbctl plan --cluster FILE` calls it on a described one; the placement
//! benchmark calls it beside exo's algorithm and a brute-force optimum.
//!
//! - [`topology`]: the cluster as a petgraph graph (Macs with free memory and memory bandwidth;
//!   links with bandwidth, latency, RDMA), built from Node/Link objects or from a lab file.
//! - [`memory`]: what a stage needs: weights, KV cache for context × batch, activations, overhead.
//! - [`cost`]: time per token of an assignment, for each strategy and objective.
//! - [`search`]: the best assignment (exhaustive with pruning up to 8 Macs, heuristic above).
//!
//! Units: memory bandwidth in GB/s (10^9 bytes/s, as Apple states it); link bandwidth in Gb/s
//! (10^9 bits/s, as Thunderbolt is sold); latency in microseconds (round trip of a small
//! message, as probes measure it; a one-way hop costs half).

pub mod cost;
pub mod finetune;
pub mod live;
pub mod memory;
pub mod search;
pub mod topology;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::Serialize;

pub use cost::{Cost, evaluate};
pub use memory::ModelShape;
pub use search::{cable_order, plan};
pub use topology::{LinkInfo, Mac, Topology};

/// How the model is split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Contiguous layer ranges along a path (or ring) of Macs.
    Pipeline,
    /// Every layer split across all Macs; needs a mesh (or a ring), and at most one Mac per KV
    /// head (`ModelShape::tensor_ranks_ok`).
    Tensor,
    /// Every Mac holds the whole model (training: gradients are all-reduced).
    Data,
    /// The best of pipeline and tensor.
    Auto,
}

/// What the plan optimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// One stream: the sum of every stage's time and every hop.
    Latency,
    /// A full batch: the slowest stage (with its outgoing hop) bounds the rate.
    Throughput,
}

/// What is to be placed.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub model: ModelShape,
    pub strategy: Strategy,
    pub objective: Objective,
    /// At least this many Macs (1 when the job does not say).
    pub min_nodes: u32,
    /// At most this many (no limit when None).
    pub max_nodes: Option<u32>,
    /// Only Macs with all these labels.
    pub node_selector: BTreeMap<String, String>,
}

/// Knobs of the search, with defaults that hold for the lab sizes tb is built for.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Up to this many eligible Macs the search is exhaustive; above, heuristic.
    pub exhaustive_limit: usize,
    /// How many losing candidates the plan keeps, to explain the choice.
    pub keep_alternatives: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            exhaustive_limit: 8,
            keep_alternatives: 5,
        }
    }
}

/// One rank of a plan: a Mac and the layers it holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stage {
    pub node: String,
    /// First layer held (0-based); tensor and data stages hold all layers.
    pub first_layer: u32,
    pub layers: u32,
    pub weight_bytes: u64,
    pub kv_bytes: u64,
    /// Activations and runtime overhead.
    pub overhead_bytes: u64,
    /// weight + kv + overhead: what the Mac must have free.
    pub memory_bytes: u64,
    /// This stage's share of the time per token (compute only), microseconds.
    pub compute_us: f64,
    /// Its compute figure comes from the engine's measurement on that Mac (else its chip's).
    pub engine_measured: bool,
}

/// A losing candidate and why it lost.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Alternative {
    /// e.g. "pipeline over a,b,c".
    pub description: String,
    /// Its predicted rate, when it was feasible.
    pub tokens_per_second: Option<f64>,
    /// Why it lost: "slower (41.2 vs 55.0 tok/s)", "b: 12Gi short", "no link c–d".
    pub reason: String,
}

/// The result: ordered ranks with layer ranges and the prediction.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// The strategy used (never Auto).
    pub strategy: Strategy,
    pub objective: Objective,
    /// Rank order; for a pipeline, the order activations flow.
    pub stages: Vec<Stage>,
    /// The last Mac is cabled back to the first (a ring), as MLX's ring backend wants.
    pub ring: bool,
    /// Time per token (latency objective: one stream; throughput: per step of the batch).
    pub time_per_token_us: f64,
    /// Predicted tokens/s for the objective.
    pub tokens_per_second: f64,
    /// Of `time_per_token_us`: memory-bound compute, and links.
    pub compute_us: f64,
    pub network_us: f64,
    pub alternatives: Vec<Alternative>,
}

/// Why nothing fits, for a person: how much memory is short and which constraint failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{message}")]
pub struct Unplaceable {
    pub message: String,
    /// Memory missing on the best candidate set, when memory is what failed.
    pub short_bytes: Option<u64>,
}
