//! The cost model: time per token of one assignment (strategy, Macs in rank order, layers per
//! Mac), and whether it fits at all. The search only proposes; this decides, and a plan's
//! numbers are this function's numbers.
//!
//! Decode is memory-bandwidth bound: each token reads every weight, and the KV cache, once.
//! Memory bandwidth `bw` is in GB/s, link bandwidth `B` in Gb/s, latency `L` is a round trip
//! in µs (one way costs L/2). `act(b)` = hidden × b × 2 bytes, with b = 1 for the latency
//! objective and b = model.batch for throughput. `kv` = the KV cache of one layer for
//! context × batch; `other` = embeddings + output head; `embed` and `head` = other/2 and the
//! rest, or, with tied embeddings (the head is the embedding table), both the whole of other.
//!
//! **Pipeline** over stages 1..n (each ≥ 1 layer, layers summing to the model's, each Mac once):
//! - memory_i = layers_i × (bytes_per_layer + kv) + overhead + embed on the first stage + head
//!   on the last (other when one stage is both); must be ≤ the Mac's free memory.
//! - compute_i = (layers_i × (read_per_layer + kv) + [last] head) / bw_i + the Mac's per-token
//!   overhead, where read_per_layer is bytes_per_layer less the experts a token does not use (MoE).
//! - hop i→i+1 needs a direct link: L/2 + act(b) × 8 / B.
//! - return last→first (the sampled token goes back; n ≥ 2): L/2 of the direct link if any,
//!   else the shortest path by latency (Σ L/2) through available Macs; none → infeasible.
//!   `ring` = n ≥ 2 and last–first are linked.
//! - latency objective: time = Σ compute + Σ hops + return; tokens/s = 1e6 / time.
//! - throughput: the batch's sequences go round in m = min(batch, n) micro-batches (as the
//!   built-in executor splits them), each stage running every micro-batch in turn and reading
//!   its weights once for each: a round takes time = max(m × max_i (compute_i + outgoing
//!   hop_i, the return for the last), Σ compute + Σ hops + return), the second when a
//!   micro-batch waits for the whole path (one sequence on two stages keeps one stage busy at
//!   a time, whatever the split); tokens/s = batch × 1e6 / time. compute_us/network_us are
//!   the bottleneck's (m × the slowest stage's, or the path's). Each hop is costed at the
//!   whole batch's activations, an upper bound for a micro-batch's.
//!
//! **Tensor** over n ≥ 2 Macs: each gets whole KV heads (n ≤ KV heads; with latent attention n
//! must divide heads and KV heads), and the Macs must form a ring in the given order
//! (consecutive and last–first linked; a full mesh is a ring in every order). Every Mac is
//! costed as the first, the busiest in tb's engine: ⌈layers × bytes_per_layer / n⌉ weights
//! (more when n does not divide the KV heads: it has one KV head more), the embedding table
//! (every rank looks tokens up itself) and the output head (which it alone applies), ⌈layers ×
//! kv/n⌉ KV and the overhead; per token it reads its blocks, the head and its KV: compute =
//! max_i read / bw_i
//! ([`ModelShape::tensor_rank`](crate::placement::memory::ModelShape::tensor_rank)). Each layer
//! all-reduces act(b) twice (after attention and after the MLP), as a ring all-reduce:
//! 2(n−1) × (L_max/2 + (act(b)/n) × 8 / B_min), over the slowest latency and bandwidth of the
//! ring's links. time = compute + 2 × layers × all-reduce; throughput multiplies the rate by
//! batch.
//!
//! **Data** (training) over n Macs in a ring (or one Mac): each holds weights + KV for all
//! layers + overhead. A step costs 3 × weight bytes / bw (forward + backward) on the slowest
//! Mac plus a ring all-reduce of the weight bytes (the gradients): 2(n−1) × (L_max/2 +
//! (weights/n) × 8 / B_min); tokens/s = n × batch × 1e6 / step.
//!
//! Every Mac must be eligible (available, carrying the workload's labels) and the Mac count
//! within the workload's bounds.

use petgraph::graph::NodeIndex;

use super::topology::{LinkInfo, Mac, Topology};
use super::{Objective, Stage, Strategy, Workload};

/// Where each rank goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Assignment {
    /// Pipeline, Tensor or Data (never Auto).
    pub strategy: Strategy,
    /// (Mac, layers) in rank order; for Tensor and Data the layers are ignored.
    pub order: Vec<(String, u32)>,
}

/// What an assignment costs, per [`evaluate`].
#[derive(Debug, Clone, PartialEq)]
pub struct Cost {
    pub time_per_token_us: f64,
    pub tokens_per_second: f64,
    pub compute_us: f64,
    pub network_us: f64,
    pub stages: Vec<Stage>,
    pub ring: bool,
}

/// Why an assignment cannot run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Infeasible {
    pub reason: String,
    /// Memory missing, when memory is the reason (summed over the Macs that are short).
    pub short_bytes: Option<u64>,
}

impl Infeasible {
    fn new(reason: impl Into<String>) -> Infeasible {
        Infeasible {
            reason: reason.into(),
            short_bytes: None,
        }
    }
}

/// Microseconds to read `bytes` at `bw_gbs` GB/s.
pub(crate) fn read_us(bytes: u64, bw_gbs: f64) -> f64 {
    bytes as f64 / (bw_gbs * 1e9) * 1e6
}

/// One-way time of a message of `bytes` over a link: half the round trip + serialisation.
pub(crate) fn hop_us(link: &LinkInfo, bytes: u64) -> f64 {
    link.latency_us / 2.0 + bytes as f64 * 8.0 / (link.bandwidth_gbps * 1e9) * 1e6
}

/// Ring all-reduce of `bytes` over `n` ranks whose slowest link has this latency (round trip)
/// and bandwidth: 2(n−1) steps, each moving a 1/n chunk.
pub(crate) fn ring_allreduce_us(n: usize, latency_us: f64, bandwidth_gbps: f64, bytes: u64) -> f64 {
    if n < 2 {
        return 0.0;
    }
    let chunk = bytes as f64 / n as f64;
    2.0 * (n - 1) as f64 * (latency_us / 2.0 + chunk * 8.0 / (bandwidth_gbps * 1e9) * 1e6)
}

/// The batch a hop carries for this objective.
pub(crate) fn hop_batch(workload: &Workload) -> u32 {
    match workload.objective {
        Objective::Latency => 1,
        Objective::Throughput => workload.model.batch,
    }
}

/// A link placement may use: present, with positive bandwidth and a sane latency.
pub(crate) fn usable(link: Option<&LinkInfo>) -> Option<&LinkInfo> {
    link.filter(|l| {
        l.bandwidth_gbps.is_finite()
            && l.bandwidth_gbps > 0.0
            && l.latency_us.is_finite()
            && l.latency_us >= 0.0
    })
}

/// Why a Mac may not take this workload, if it may not: "cordoned", "lacks label rack=a".
pub(crate) fn ineligibility(mac: &Mac, workload: &Workload) -> Option<String> {
    if let Some(why) = &mac.unavailable {
        return Some(why.clone());
    }
    if let Some((k, v)) = workload
        .node_selector
        .iter()
        .find(|(k, v)| mac.labels.get(*k) != Some(*v))
    {
        return Some(format!("lacks label {k}={v}"));
    }
    if !(mac.memory_bandwidth_gbs.is_finite() && mac.memory_bandwidth_gbs > 0.0) {
        return Some("has no known memory bandwidth".to_string());
    }
    None
}

/// The return hop of a pipeline, last → first: the direct link's one-way latency, else the
/// shortest route by latency.
pub(crate) fn return_us(topology: &Topology, last: NodeIndex, first: NodeIndex) -> Option<f64> {
    match usable(topology.link_at(last, first)) {
        Some(l) => Some(l.latency_us / 2.0),
        None => topology.one_way_latency_us(last, first),
    }
}

/// Bytes as a person reads them: "12Gi", "1.5Gi", "512Mi".
pub(crate) fn fmt_bytes(bytes: u64) -> String {
    const GI: f64 = (1u64 << 30) as f64;
    const MI: f64 = (1u64 << 20) as f64;
    let b = bytes as f64;
    if b >= 100.0 * GI {
        format!("{:.0}Gi", b / GI)
    } else if b >= GI {
        let s = format!("{:.1}", b / GI);
        format!("{}Gi", s.strip_suffix(".0").unwrap_or(&s))
    } else if b >= MI {
        format!("{:.0}Mi", b / MI)
    } else {
        format!("{bytes}B")
    }
}

/// A Mac of the assignment, resolved.
struct Rank<'a> {
    index: NodeIndex,
    mac: &'a Mac,
    layers: u32,
}

/// The cost of `assignment`, or why it cannot run. Pure and deterministic.
pub fn evaluate(
    topology: &Topology,
    workload: &Workload,
    assignment: &Assignment,
) -> Result<Cost, Infeasible> {
    let ranks = resolve(topology, workload, assignment)?;
    match assignment.strategy {
        Strategy::Pipeline => pipeline(topology, workload, &ranks),
        Strategy::Tensor => tensor(topology, workload, &ranks),
        Strategy::Data => data(topology, workload, &ranks),
        Strategy::Auto => Err(Infeasible::new(
            "an assignment is pipeline, tensor or data, not auto",
        )),
    }
}

/// Known, distinct, eligible Macs, as many as the workload allows.
fn resolve<'a>(
    topology: &'a Topology,
    workload: &Workload,
    assignment: &Assignment,
) -> Result<Vec<Rank<'a>>, Infeasible> {
    let n = assignment.order.len();
    if n == 0 {
        return Err(Infeasible::new("no Macs"));
    }
    if n < workload.min_nodes as usize {
        return Err(Infeasible::new(format!(
            "{n} Macs; at least {} wanted",
            workload.min_nodes
        )));
    }
    if let Some(max) = workload.max_nodes
        && n > max as usize
    {
        return Err(Infeasible::new(format!("{n} Macs; at most {max} allowed")));
    }
    let mut ranks: Vec<Rank<'a>> = Vec::with_capacity(n);
    for (name, layers) in &assignment.order {
        let (Some(index), Some(mac)) = (topology.index_of(name), topology.mac(name)) else {
            return Err(Infeasible::new(format!("unknown Mac {name}")));
        };
        if ranks.iter().any(|r| r.index == index) {
            return Err(Infeasible::new(format!("{name} is used twice")));
        }
        if let Some(why) = ineligibility(mac, workload) {
            return Err(Infeasible::new(format!("{name} {why}")));
        }
        ranks.push(Rank {
            index,
            mac,
            layers: *layers,
        });
    }
    Ok(ranks)
}

/// Refuses the stages whose memory exceeds their Mac's free memory.
fn check_memory(stages: &[Stage], topology: &Topology) -> Result<(), Infeasible> {
    let mut reasons = Vec::new();
    let mut short = 0u64;
    for s in stages {
        let free = topology.mac(&s.node).map_or(0, |m| m.free_bytes);
        if s.memory_bytes > free {
            let missing = s.memory_bytes - free;
            short = short.saturating_add(missing);
            reasons.push(format!(
                "{}: {} short (needs {}, {} free)",
                s.node,
                fmt_bytes(missing),
                fmt_bytes(s.memory_bytes),
                fmt_bytes(free)
            ));
        }
    }
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(Infeasible {
            reason: reasons.join("; "),
            short_bytes: Some(short),
        })
    }
}

fn link_or<'a>(
    topology: &'a Topology,
    a: &Rank<'_>,
    b: &Rank<'_>,
) -> Result<&'a LinkInfo, Infeasible> {
    usable(topology.link_at(a.index, b.index))
        .ok_or_else(|| Infeasible::new(format!("no link {}–{}", a.mac.name, b.mac.name)))
}

fn pipeline(
    topology: &Topology,
    workload: &Workload,
    ranks: &[Rank<'_>],
) -> Result<Cost, Infeasible> {
    let model = &workload.model;
    let n = ranks.len();
    if let Some(r) = ranks.iter().find(|r| r.layers == 0) {
        return Err(Infeasible::new(format!("{} holds no layer", r.mac.name)));
    }
    let total: u64 = ranks.iter().map(|r| u64::from(r.layers)).sum();
    if total != u64::from(model.layers) {
        return Err(Infeasible::new(format!(
            "the stages hold {total} layers; the model has {}",
            model.layers
        )));
    }
    let kv = model.kv_bytes_per_layer();
    let overhead = model.overhead_bytes();
    // Memory: the first stage holds the embeddings, the last the head. Time: the last stage
    // reads the output head per token; the embedding table is only indexed.
    let (embed, head) = (model.embed_bytes(), model.head_bytes());
    let mut stages = Vec::with_capacity(n);
    let mut first_layer = 0u32;
    for (i, r) in ranks.iter().enumerate() {
        let (first, last) = (i == 0, i == n - 1);
        let l = u64::from(r.layers);
        let extra = match (first, last) {
            (true, true) => model.embed_and_head_bytes(),
            (true, false) => embed,
            (false, true) => head,
            (false, false) => 0,
        };
        let weight = l
            .saturating_mul(model.bytes_per_layer)
            .saturating_add(extra);
        let kv_bytes = l.saturating_mul(kv);
        let read = l
            .saturating_mul(model.read_bytes_per_layer().saturating_add(kv))
            .saturating_add(if last { head } else { 0 });
        stages.push(Stage {
            node: r.mac.name.clone(),
            first_layer,
            layers: r.layers,
            weight_bytes: weight,
            kv_bytes,
            overhead_bytes: overhead,
            memory_bytes: weight.saturating_add(kv_bytes).saturating_add(overhead),
            compute_us: read_us(read, r.mac.memory_bandwidth_gbs) + r.mac.token_overhead_us,
            engine_measured: r.mac.engine_measured,
        });
        first_layer += r.layers;
    }
    check_memory(&stages, topology)?;
    let act = model.activation_bytes(hop_batch(workload));
    let mut out = Vec::with_capacity(n);
    for w in ranks.windows(2) {
        out.push(hop_us(link_or(topology, &w[0], &w[1])?, act));
    }
    let mut ring = false;
    if n >= 2 {
        let (last, first) = (&ranks[n - 1], &ranks[0]);
        ring = usable(topology.link_at(last.index, first.index)).is_some();
        let back = return_us(topology, last.index, first.index).ok_or_else(|| {
            Infeasible::new(format!(
                "no route from {} back to {}",
                last.mac.name, first.mac.name
            ))
        })?;
        out.push(back);
    } else {
        out.push(0.0);
    }
    let (time, compute, network, rate_batch) = match workload.objective {
        Objective::Latency => {
            let compute: f64 = stages.iter().map(|s| s.compute_us).sum();
            let network: f64 = out.iter().sum();
            (compute + network, compute, network, 1)
        }
        Objective::Throughput => {
            let mut worst = (f64::NEG_INFINITY, 0.0, 0.0);
            for (s, o) in stages.iter().zip(&out) {
                let t = s.compute_us + o;
                if t > worst.0 {
                    worst = (t, s.compute_us, *o);
                }
            }
            // The batch goes round in min(batch, n) micro-batches (a stage reads its weights
            // once per micro-batch), and no micro-batch comes round faster than the path.
            let micro = f64::from(model.batch.max(1).min(n as u32));
            let compute: f64 = stages.iter().map(|s| s.compute_us).sum();
            let network: f64 = out.iter().sum();
            if compute + network > micro * worst.0 {
                (compute + network, compute, network, model.batch)
            } else {
                (
                    micro * worst.0,
                    micro * worst.1,
                    micro * worst.2,
                    model.batch,
                )
            }
        }
    };
    Ok(finish(
        time,
        compute,
        network,
        f64::from(rate_batch),
        stages,
        ring,
    ))
}

fn finish(
    time: f64,
    compute: f64,
    network: f64,
    tokens_per_step: f64,
    stages: Vec<Stage>,
    ring: bool,
) -> Cost {
    Cost {
        time_per_token_us: time,
        tokens_per_second: if time > 0.0 {
            tokens_per_step * 1e6 / time
        } else {
            f64::INFINITY
        },
        compute_us: compute,
        network_us: network,
        stages,
        ring,
    }
}

/// The slowest latency and bandwidth among the ring's links (consecutive ranks and last–first).
fn ring_links(
    topology: &Topology,
    ranks: &[Rank<'_>],
    what: &str,
) -> Result<(f64, f64), Infeasible> {
    let n = ranks.len();
    let (mut lat, mut bw) = (0.0f64, f64::INFINITY);
    for i in 0..n {
        let (a, b) = (&ranks[i], &ranks[(i + 1) % n]);
        let link = link_or(topology, a, b).map_err(|e| {
            Infeasible::new(format!(
                "{} ({what} needs the Macs cabled in a ring or a mesh)",
                e.reason
            ))
        })?;
        lat = lat.max(link.latency_us);
        bw = bw.min(link.bandwidth_gbps);
    }
    Ok((lat, bw))
}

/// Stages that each hold all the layers (tensor: a 1/n share of each), reading `read` bytes
/// `passes` times per step.
struct Whole {
    layers: u32,
    weight: u64,
    kv: u64,
    overhead: u64,
    read: u64,
    passes: f64,
}

fn whole_stages(ranks: &[Rank<'_>], w: &Whole) -> Vec<Stage> {
    ranks
        .iter()
        .map(|r| Stage {
            node: r.mac.name.clone(),
            first_layer: 0,
            layers: w.layers,
            weight_bytes: w.weight,
            kv_bytes: w.kv,
            overhead_bytes: w.overhead,
            memory_bytes: w.weight.saturating_add(w.kv).saturating_add(w.overhead),
            compute_us: w.passes * read_us(w.read, r.mac.memory_bandwidth_gbs)
                + r.mac.token_overhead_us,
            engine_measured: r.mac.engine_measured,
        })
        .collect()
}

fn tensor(
    topology: &Topology,
    workload: &Workload,
    ranks: &[Rank<'_>],
) -> Result<Cost, Infeasible> {
    let model = &workload.model;
    let n = ranks.len();
    if n < 2 {
        return Err(Infeasible::new("tensor parallelism needs at least 2 Macs"));
    }
    let n32 = u32::try_from(n).unwrap_or(u32::MAX);
    if !model.tensor_ranks_ok(n32) {
        return Err(Infeasible::new(tensor_refusal(model, n32)));
    }
    // Every rank is costed as the busiest one (the first, when the KV heads do not divide).
    let rank = model.tensor_rank(n32);
    let whole = Whole {
        layers: model.layers,
        weight: rank.weight,
        kv: rank.kv,
        overhead: model.overhead_bytes(),
        read: rank.read.saturating_add(rank.kv),
        passes: 1.0,
    };
    let stages = whole_stages(ranks, &whole);
    check_memory(&stages, topology)?;
    let (lat, bw) = ring_links(topology, ranks, "tensor parallelism")?;
    let compute = stages.iter().map(|s| s.compute_us).fold(0.0, f64::max);
    let allreduce = ring_allreduce_us(n, lat, bw, model.activation_bytes(hop_batch(workload)));
    let network = 2.0 * f64::from(model.layers) * allreduce;
    let per_step = match workload.objective {
        Objective::Latency => 1.0,
        Objective::Throughput => f64::from(model.batch),
    };
    Ok(finish(
        compute + network,
        compute,
        network,
        per_step,
        stages,
        true,
    ))
}

/// Why tensor parallelism over `n` Macs is refused for these heads.
pub(crate) fn tensor_refusal(model: &crate::placement::memory::ModelShape, n: u32) -> String {
    if model.heads_in_kv_groups() {
        return format!(
            "tensor parallelism gives each of its Macs whole KV heads: {n} Macs are more than \
             the model's {} KV heads",
            model.kv_heads
        );
    }
    tensor_divisibility(model.heads, model.kv_heads, n)
}

/// The rule for models whose heads cannot be given out by KV head (exo #1015 applies it to
/// every model).
fn tensor_divisibility(heads: u32, kv_heads: u32, n: u32) -> String {
    format!(
        "tensor parallelism over {n} Macs needs {n} to divide the attention heads ({heads}) and \
         the KV heads ({kv_heads})"
    )
}

fn data(topology: &Topology, workload: &Workload, ranks: &[Rank<'_>]) -> Result<Cost, Infeasible> {
    let model = &workload.model;
    let n = ranks.len();
    let weight = model.weight_bytes();
    // Forward and backward read the weights about three times; the KV cache is not read.
    let whole = Whole {
        layers: model.layers,
        weight,
        kv: model.kv_bytes(),
        overhead: model.overhead_bytes(),
        read: weight,
        passes: 3.0,
    };
    let stages = whole_stages(ranks, &whole);
    check_memory(&stages, topology)?;
    let (network, ring) = if n >= 2 {
        let (lat, bw) = ring_links(topology, ranks, "data parallelism")?;
        (ring_allreduce_us(n, lat, bw, weight), true)
    } else {
        (0.0, false)
    };
    let compute = stages.iter().map(|s| s.compute_us).fold(0.0, f64::max);
    let per_step = n as f64 * f64::from(model.batch);
    Ok(finish(
        compute + network,
        compute,
        network,
        per_step,
        stages,
        ring,
    ))
}
