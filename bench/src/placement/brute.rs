//! The optimum pipeline by enumeration, independent of the engine's search: every ordered
//! subset of the eligible Macs (consecutive ranks cabled, Mac count within the workload's
//! bounds), and for each order the best integer layer split by an exact dynamic programme over
//! (stage, layers used so far).
//!
//! The stage costs are this module's own implementation of the cost model documented in
//! `tb_core::placement::cost` (memory per stage, memory-bound compute, hop = L/2 +
//! activations × 8 / B, return hop last → first by direct link or the lowest-latency route);
//! the engine's `evaluate` is then run once on the winner, and the two figures are compared.
//!
//! Orders are walked depth-first, so an order's DP row extends its prefix's: for stage j with
//! the next Mac known, `next[u + l] = row[u] + compute_j(l) + hop_j` for the latency objective.
//! A throughput round takes max(Σ stage times, min(batch, n) × the slowest stage), so there
//! each cell keeps every non-dominated (sum, slowest) pair that reaches it — the Pareto front —
//! and the order's best is read from the fronts at the end. A row with no feasible cell, or
//! whose every entry is already no better than the best found, prunes the subtree (sums and
//! maxima only grow along a path).

use tb_core::placement::cost::Assignment;
use tb_core::placement::{Objective, Strategy, Topology, Workload};

/// Above this many eligible Macs the enumeration is not attempted.
pub const LIMIT: usize = 8;

/// What the enumeration found.
#[derive(Debug, Clone, PartialEq)]
pub enum Optimum {
    /// The best assignment and its time per token as this module computes it (µs).
    Best {
        assignment: Assignment,
        time_us: f64,
        /// Orders whose DP was completed (for the curious).
        orders: u64,
    },
    /// No order and split fits.
    NothingFits,
    /// More eligible Macs than [`LIMIT`].
    TooMany(usize),
}

/// One eligible Mac, with what the DP needs.
struct Node {
    name: String,
    free: u64,
    bw: f64,
}

/// The model's per-stage figures.
struct Shape {
    layers: usize,
    per_layer: u64,
    overhead: u64,
    embed: u64,
    head: u64,
    /// What a stage that is first and last holds besides its layers.
    both: u64,
}

/// One non-dominated way to reach a throughput DP cell: the sum and the maximum of the stage
/// times so far, and the cell and entry of the previous row it extends.
#[derive(Debug, Clone, Copy)]
struct Reach {
    sum: f64,
    max: f64,
    from_u: usize,
    from_k: usize,
}

/// A throughput DP row: for each count of layers used, its Pareto front.
type Fronts = Vec<Vec<Reach>>;

/// Adds `r` to `front` unless an entry is at least as good in both; drops the entries it beats.
fn insert(front: &mut Vec<Reach>, r: Reach) {
    if front.iter().any(|e| e.sum <= r.sum && e.max <= r.max) {
        return;
    }
    front.retain(|e| !(r.sum <= e.sum && r.max <= e.max));
    front.push(r);
}

struct Search {
    nodes: Vec<Node>,
    shape: Shape,
    latency: bool,
    /// Sequences decoded together (throughput: micro-batches = min(batch, stages)).
    batch: usize,
    min_nodes: usize,
    max_nodes: usize,
    /// Direct hop cost i → j (µs), None when not cabled.
    hop: Vec<Vec<Option<f64>>>,
    /// Return cost i → j (µs), None when unreachable.
    ret: Vec<Vec<Option<f64>>>,
    best: Option<(f64, Vec<(usize, u32)>)>,
    orders: u64,
}

/// Runs the enumeration.
pub fn optimum(topology: &Topology, workload: &Workload) -> Optimum {
    let all = topology.macs();
    let model = &workload.model;
    let eligible: Vec<usize> = (0..all.len())
        .filter(|&i| {
            let m = all[i];
            m.unavailable.is_none()
                && m.memory_bandwidth_gbs.is_finite()
                && m.memory_bandwidth_gbs > 0.0
                && workload
                    .node_selector
                    .iter()
                    .all(|(k, v)| m.labels.get(k) == Some(v))
        })
        .collect();
    if eligible.len() > LIMIT {
        return Optimum::TooMany(eligible.len());
    }
    let relay = one_way_routes(topology);
    let hop_batch = match workload.objective {
        Objective::Latency => 1,
        Objective::Throughput => model.batch,
    };
    let act = u64::from(model.hidden_size) * u64::from(hop_batch) * 2;
    let nodes: Vec<Node> = eligible
        .iter()
        .map(|&i| Node {
            name: all[i].name.clone(),
            free: all[i].free_bytes,
            bw: all[i].memory_bandwidth_gbs,
        })
        .collect();
    let n = nodes.len();
    let mut hop = vec![vec![None; n]; n];
    let mut ret = vec![vec![None; n]; n];
    for a in 0..n {
        for b in 0..n {
            if a == b {
                continue;
            }
            let link = topology.link(&nodes[a].name, &nodes[b].name).filter(|l| {
                l.bandwidth_gbps.is_finite()
                    && l.bandwidth_gbps > 0.0
                    && l.latency_us.is_finite()
                    && l.latency_us >= 0.0
            });
            hop[a][b] =
                link.map(|l| l.latency_us / 2.0 + act as f64 * 8.0 / (l.bandwidth_gbps * 1e3));
            ret[a][b] = match link {
                Some(l) => Some(l.latency_us / 2.0),
                None => relay[eligible[a]][eligible[b]],
            };
        }
    }
    let kv = 2
        * u64::from(model.kv_heads)
        * u64::from(model.head_dim)
        * u64::from(model.context)
        * u64::from(model.batch)
        * 2;
    let tokens = u64::from(model.context).min(2048) * u64::from(model.batch);
    let shape = Shape {
        layers: model.layers as usize,
        per_layer: model.bytes_per_layer + kv,
        overhead: (512 << 20) + 4 * u64::from(model.hidden_size) * tokens * 2,
        embed: model.embed_bytes(),
        head: model.head_bytes(),
        both: model.embed_and_head_bytes(),
    };
    let mut search = Search {
        nodes,
        shape,
        latency: workload.objective == Objective::Latency,
        batch: (model.batch as usize).max(1),
        min_nodes: (workload.min_nodes as usize).max(1),
        max_nodes: workload.max_nodes.map_or(usize::MAX, |m| m as usize),
        hop,
        ret,
        best: None,
        orders: 0,
    };
    for first in 0..n {
        let mut path = vec![first];
        if search.latency {
            let mut row = vec![f64::INFINITY; search.shape.layers + 1];
            row[0] = 0.0;
            let mut back: Vec<Vec<usize>> = Vec::new();
            search.walk(&mut path, &row, &mut back);
        } else {
            let mut row: Fronts = vec![Vec::new(); search.shape.layers + 1];
            row[0].push(Reach {
                sum: 0.0,
                max: 0.0,
                from_u: usize::MAX,
                from_k: usize::MAX,
            });
            let mut rows = vec![row];
            search.walk_throughput(&mut path, &mut rows);
        }
    }
    match search.best {
        Some((time_us, order)) => Optimum::Best {
            assignment: Assignment {
                strategy: Strategy::Pipeline,
                order: order
                    .into_iter()
                    .map(|(i, l)| (search.nodes[i].name.clone(), l))
                    .collect(),
            },
            time_us,
            orders: search.orders,
        },
        None => Optimum::NothingFits,
    }
}

impl Search {
    /// Most layers node `i` holds as a stage that is first and/or last.
    fn max_layers(&self, i: usize, first: bool, last: bool) -> usize {
        let s = &self.shape;
        let fixed = s.overhead
            + match (first, last) {
                (true, true) => s.both,
                (true, false) => s.embed,
                (false, true) => s.head,
                (false, false) => 0,
            };
        match self.nodes[i].free.checked_sub(fixed) {
            Some(room) if s.per_layer > 0 => ((room / s.per_layer) as usize).min(s.layers),
            Some(_) => s.layers,
            None => 0,
        }
    }

    /// Memory-bound compute of `l` layers on node `i` (µs).
    fn compute(&self, i: usize, l: usize, last: bool) -> f64 {
        let s = &self.shape;
        let read = l as u64 * s.per_layer + if last { s.head } else { 0 };
        read as f64 / (self.nodes[i].bw * 1e3)
    }

    fn combine(&self, a: f64, b: f64) -> f64 {
        a + b
    }

    /// A throughput round's time with `stages` stages whose times sum to `sum`, the slowest
    /// taking `max`; also a lower bound for every longer path from a prefix with these.
    fn round(&self, stages: usize, sum: f64, max: f64) -> f64 {
        sum.max(self.batch.min(stages) as f64 * max)
    }

    /// The throughput walk: `rows[j - 1]` is the DP row of `path` (length j), its stages
    /// before the last Mac.
    fn walk_throughput(&mut self, path: &mut Vec<usize>, rows: &mut Vec<Fronts>) {
        let j = path.len();
        let cur = path[j - 1];
        let layers = self.shape.layers;
        if j >= self.min_nodes {
            self.orders += 1;
            self.finish_throughput(path, rows);
        }
        if j + 1 > self.max_nodes || j >= layers {
            return;
        }
        let cap = self.max_layers(cur, j == 1, false);
        for next in 0..self.nodes.len() {
            if path.contains(&next) {
                continue;
            }
            let Some(hop) = self.hop[cur][next] else {
                continue;
            };
            let best = self.best.as_ref().map_or(f64::INFINITY, |b| b.0);
            let mut new: Fronts = vec![Vec::new(); layers + 1];
            let row = &rows[j - 1];
            for (u, front) in row.iter().enumerate() {
                // Leave at least one layer for the next stage.
                let top = cap.min(layers.saturating_sub(u + 1));
                for (k, e) in front.iter().enumerate() {
                    for l in 1..=top {
                        let t = self.compute(cur, l, false) + hop;
                        let r = Reach {
                            sum: e.sum + t,
                            max: e.max.max(t),
                            from_u: u,
                            from_k: k,
                        };
                        if self.round(j, r.sum, r.max) < best {
                            insert(&mut new[u + l], r);
                        }
                    }
                }
            }
            if new.iter().all(Vec::is_empty) {
                continue;
            }
            path.push(next);
            rows.push(new);
            self.walk_throughput(path, rows);
            rows.pop();
            path.pop();
        }
    }

    /// Closes the order at `path`'s last Mac (throughput).
    fn finish_throughput(&mut self, path: &[usize], rows: &[Fronts]) {
        let j = path.len();
        let layers = self.shape.layers;
        let Some((cur, ret, cap)) = self.closing(path) else {
            return;
        };
        let mut best_here: Option<(f64, usize, usize)> = None;
        for (u, front) in rows[j - 1].iter().enumerate() {
            let l = layers - u;
            if l == 0 || l > cap {
                continue;
            }
            let t = self.compute(cur, l, true) + ret;
            for (k, e) in front.iter().enumerate() {
                let c = self.round(j, e.sum + t, e.max.max(t));
                if best_here.is_none_or(|(b, _, _)| c < b) {
                    best_here = Some((c, u, k));
                }
            }
        }
        let Some((time, u, k)) = best_here else {
            return;
        };
        if self.best.as_ref().is_some_and(|(b, _)| time >= *b) {
            return;
        }
        // Stage j − 1 holds layers − u; each entry names the cell of the row before it.
        let mut split = vec![0u32; j];
        split[j - 1] = (layers - u) as u32;
        let (mut u, mut k) = (u, k);
        for stage in (0..j - 1).rev() {
            let e = rows[stage + 1][u][k];
            split[stage] = (u - e.from_u) as u32;
            (u, k) = (e.from_u, e.from_k);
        }
        let order = path.iter().copied().zip(split).collect();
        self.best = Some((time, order));
    }

    /// `row[u]`: best cost of stages before `path`'s last with `u` layers used.
    /// `back[j][v]`: the `u` that row j+1's cell `v` came from.
    fn walk(&mut self, path: &mut Vec<usize>, row: &[f64], back: &mut Vec<Vec<usize>>) {
        let j = path.len();
        let cur = path[j - 1];
        let layers = self.shape.layers;
        if j >= self.min_nodes {
            self.orders += 1;
            self.finish(path, row, back);
        }
        if j + 1 > self.max_nodes || j >= layers {
            return;
        }
        let cap = self.max_layers(cur, j == 1, false);
        for next in 0..self.nodes.len() {
            if path.contains(&next) {
                continue;
            }
            let Some(hop) = self.hop[cur][next] else {
                continue;
            };
            let mut new = vec![f64::INFINITY; layers + 1];
            let mut from = vec![usize::MAX; layers + 1];
            for (u, &base) in row.iter().enumerate() {
                if !base.is_finite() {
                    continue;
                }
                // Leave at least one layer for the next stage.
                let top = cap.min(layers.saturating_sub(u + 1));
                for l in 1..=top {
                    let c = self.combine(base, self.compute(cur, l, false) + hop);
                    if c < new[u + l] {
                        new[u + l] = c;
                        from[u + l] = u;
                    }
                }
            }
            if new.iter().all(|c| !c.is_finite()) {
                continue;
            }
            if let Some((best, _)) = &self.best
                && new.iter().copied().fold(f64::INFINITY, f64::min) >= *best
            {
                // Latency only grows along a path.
                continue;
            }
            path.push(next);
            back.push(from);
            self.walk(path, &new, back);
            back.pop();
            path.pop();
        }
    }

    /// The last Mac of `path` as its last stage: the Mac, the return to the first, and the most
    /// layers it holds there; None when nothing leads back.
    fn closing(&self, path: &[usize]) -> Option<(usize, f64, usize)> {
        let cur = path[path.len() - 1];
        let ret = if path.len() == 1 {
            0.0
        } else {
            self.ret[cur][path[0]]?
        };
        Some((cur, ret, self.max_layers(cur, path.len() == 1, true)))
    }

    /// Closes the order at `path`'s last Mac.
    fn finish(&mut self, path: &[usize], row: &[f64], back: &[Vec<usize>]) {
        let j = path.len();
        let layers = self.shape.layers;
        let Some((cur, ret, cap)) = self.closing(path) else {
            return;
        };
        let mut best_here: Option<(f64, usize)> = None;
        for (u, &base) in row.iter().enumerate() {
            let l = layers - u;
            if !base.is_finite() || l == 0 || l > cap {
                continue;
            }
            let c = self.combine(base, self.compute(cur, l, true) + ret);
            if best_here.is_none_or(|(b, _)| c < b) {
                best_here = Some((c, u));
            }
        }
        let Some((time, u)) = best_here else {
            return;
        };
        if self.best.as_ref().is_some_and(|(b, _)| time >= *b) {
            return;
        }
        // Walk the back pointers: stage j holds layers − u; stage k holds u_k − u_{k−1}.
        let mut split = vec![0u32; j];
        split[j - 1] = (layers - u) as u32;
        let mut v = u;
        for k in (0..j - 1).rev() {
            let prev = back[k][v];
            split[k] = (v - prev) as u32;
            v = prev;
        }
        let order = path.iter().copied().zip(split).collect();
        self.best = Some((time, order));
    }
}

impl Optimum {
    /// tokens/s of a time per token as the cost model converts it.
    pub fn rate(time_us: f64, workload: &Workload) -> f64 {
        let per_step = match workload.objective {
            Objective::Latency => 1.0,
            Objective::Throughput => f64::from(workload.model.batch),
        };
        per_step * 1e6 / time_us
    }
}

/// Lowest one-way latency (Σ L/2) between every two Macs (indices into `topology.macs()`),
/// relaying only through available Macs; None when unreachable.
fn one_way_routes(topology: &Topology) -> Vec<Vec<Option<f64>>> {
    let macs = topology.macs();
    let n = macs.len();
    let mut d = vec![vec![f64::INFINITY; n]; n];
    for a in 0..n {
        d[a][a] = 0.0;
        for b in 0..n {
            if a != b
                && let Some(l) = topology.link(&macs[a].name, &macs[b].name)
            {
                d[a][b] = l.latency_us / 2.0;
            }
        }
    }
    for k in 0..n {
        if macs[k].unavailable.is_some() {
            continue;
        }
        for a in 0..n {
            for b in 0..n {
                let via = d[a][k] + d[k][b];
                if via < d[a][b] {
                    d[a][b] = via;
                }
            }
        }
    }
    d.into_iter()
        .map(|row| {
            row.into_iter()
                .map(|x| x.is_finite().then_some(x))
                .collect()
        })
        .collect()
}
