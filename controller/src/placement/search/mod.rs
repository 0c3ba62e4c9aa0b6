//! The search: the assignment [`evaluate`] rates best, the runners-up, and — when nothing fits —
//! a reason a person can act on. Also [`cable_order`], the rank order that follows the cables
//! for jobs whose Macs are already chosen.
//!
//! Up to `Options::exhaustive_limit` eligible Macs (at most [`EXACT_MAX`]) the search is exact:
//! - pipeline, latency: for a set of Macs and its first and last Mac, the compute time does not
//!   depend on the order in between and the best split is a greedy fill (fastest Macs first, up
//!   to their memory, every Mac ≥ 1 layer), while the hops depend only on the order: the best
//!   Hamiltonian path between first and last, by bitmask DP. Every (set, first, last) is tried.
//! - pipeline, throughput: the bottleneck time T* is one of the finitely many stage times
//!   (Mac, layers, outgoing hop); a T is reachable iff some path has, with every stage capped at
//!   T, room for all layers — a max-sum DP over (set, last Mac). Binary search on T, then the
//!   min-max split (greedy: the next layer goes where it finishes soonest) along that path.
//! - tensor and data: every set of Macs (the cost depends on the set and on the ring's slowest
//!   link), with the ring found by branch and bound over Hamiltonian cycles.
//!
//! Above the limit the search is a heuristic: exact solves on neighbourhoods ("pools") grown
//! from every Mac; for pipelines, greedy walks along the cables improved by local search
//! (2-opt, insert, drop); for tensor and data, the fastest Macs of each size with a bounded
//! ring search. Everything is deterministic: Macs are visited by name and ties go to fewer
//! Macs, then names.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use petgraph::graph::NodeIndex;

use super::cost::{
    Assignment, Cost, Infeasible, evaluate, fmt_bytes, hop_batch, hop_us, ineligibility, read_us,
    return_us, ring_allreduce_us, usable,
};
use super::topology::{Mac, Topology};
use super::{Alternative, Objective, Options, Plan, Strategy, Unplaceable, Workload};

/// Exact searches cost O(2^n n³); past this many Macs a set is never searched exactly.
pub const EXACT_MAX: usize = 12;
/// Node expansions allowed to one ring search in the heuristic.
const RING_BUDGET: usize = 50_000;
/// Improvement passes of local search (2-opt, insert, drop) over one order.
const IMPROVE_PASSES: usize = 8;
/// Orders improved by local search per heuristic pipeline search.
const IMPROVED_ORDERS: usize = 4;
/// Candidates each pool contributes in the heuristic.
const PER_POOL: usize = 4;
/// cable_order tries every order up to this many distinct Macs.
const CABLE_EXHAUSTIVE: usize = 8;
/// cable_order weighs links by the time of a message this big (1 MiB): latency and bandwidth.
const CABLE_MESSAGE_BYTES: u64 = 1 << 20;

/// The best assignment for `workload` on `topology`, with its predicted cost and runners-up.
pub fn plan(
    topology: &Topology,
    workload: &Workload,
    options: &Options,
) -> Result<Plan, Unplaceable> {
    let ctx = Ctx::new(topology, workload)?;
    let strategies = match workload.strategy {
        Strategy::Auto => vec![Strategy::Pipeline, Strategy::Tensor],
        s => vec![s],
    };
    let exact = ctx.macs.len() <= options.exhaustive_limit.min(EXACT_MAX);
    let pool_size = options.exhaustive_limit.clamp(1, EXACT_MAX);
    let mut candidates: Vec<Assignment> = Vec::new();
    for &s in &strategies {
        let all: Vec<usize> = (0..ctx.macs.len()).collect();
        let found = match (s, exact) {
            (Strategy::Pipeline, true) => {
                pipeline_exact(&ctx, &PipeData::new(&ctx, all), usize::MAX)
            }
            (Strategy::Pipeline, false) => pipeline_heuristic(&ctx, pool_size),
            (_, true) => rings_exact(&ctx, s, &all, usize::MAX, usize::MAX),
            (_, false) => rings_heuristic(&ctx, s, pool_size),
        };
        candidates.extend(found);
    }
    // Membership only: the order of `found` comes from `candidates`, then from `rank`.
    let mut seen = std::collections::HashSet::new();
    let mut found: Vec<Found> = candidates
        .into_iter()
        .filter(|a| seen.insert(a.clone()))
        .filter_map(|a| {
            evaluate(topology, workload, &a).ok().map(|cost| Found {
                assignment: a,
                cost,
            })
        })
        .collect();
    found.sort_by(rank);
    let Some(best) = found.first() else {
        return Err(unplaceable(&ctx, &strategies));
    };
    let alternatives = alternatives(&ctx, &found, options.keep_alternatives);
    let (assignment, cost) = (&best.assignment, &best.cost);
    Ok(Plan {
        strategy: assignment.strategy,
        objective: workload.objective,
        stages: cost.stages.clone(),
        ring: cost.ring,
        time_per_token_us: cost.time_per_token_us,
        tokens_per_second: cost.tokens_per_second,
        compute_us: cost.compute_us,
        network_us: cost.network_us,
        alternatives,
    })
}

// ---- context: who is eligible, how many Macs ----

struct Ctx<'a> {
    topo: &'a Topology,
    work: &'a Workload,
    /// Eligible Macs, by name.
    macs: Vec<NodeIndex>,
    /// "mac4 cordoned", "mac5 lacks label rack=a".
    excluded: Vec<String>,
    /// Bounds on the Mac count: lo ≥ 1, hi ≤ eligible.
    lo: usize,
    hi: usize,
}

impl<'a> Ctx<'a> {
    fn new(topo: &'a Topology, work: &'a Workload) -> Result<Ctx<'a>, Unplaceable> {
        let mut macs = Vec::new();
        let mut excluded = Vec::new();
        for i in topo.graph.node_indices() {
            let mac = &topo.graph[i];
            match ineligibility(mac, work) {
                Some(why) => excluded.push(format!("{} {why}", mac.name)),
                None => macs.push(i),
            }
        }
        let lo = (work.min_nodes as usize).max(1);
        let hi = work
            .max_nodes
            .map_or(usize::MAX, |m| m as usize)
            .min(macs.len());
        let ctx = Ctx {
            topo,
            work,
            macs,
            excluded,
            lo,
            hi,
        };
        let name = &work.model.name;
        if topo.is_empty() {
            return Err(ctx.refuse(format!("model {name}: the cluster has no Macs"), None));
        }
        if ctx.macs.is_empty() {
            return Err(ctx.refuse(format!("model {name}: no Mac is eligible"), None));
        }
        if work.max_nodes == Some(0) {
            return Err(ctx.refuse(format!("model {name}: nodes.max is 0"), None));
        }
        if lo > ctx.hi {
            let e = ctx.macs.len();
            return Err(ctx.refuse(
                format!(
                    "model {name} asks for at least {lo} Macs; {}",
                    if ctx.hi < e {
                        format!("at most {} allowed", ctx.hi)
                    } else {
                        format!("{e} {} eligible", if e == 1 { "is" } else { "are" })
                    }
                ),
                None,
            ));
        }
        Ok(ctx)
    }

    fn mac(&self, pos: usize) -> &'a Mac {
        &self.topo.graph[self.macs[pos]]
    }

    fn name(&self, pos: usize) -> &'a str {
        &self.mac(pos).name
    }

    /// An Unplaceable with the ineligible Macs appended.
    fn refuse(&self, message: String, short_bytes: Option<u64>) -> Unplaceable {
        let message = if self.excluded.is_empty() {
            message
        } else {
            format!("{message}; not eligible: {}", self.excluded.join(", "))
        };
        Unplaceable {
            message,
            short_bytes,
        }
    }

    fn assignment(&self, strategy: Strategy, order: &[(usize, u32)]) -> Assignment {
        Assignment {
            strategy,
            order: order
                .iter()
                .map(|&(p, l)| (self.name(p).to_string(), l))
                .collect(),
        }
    }
}

// ---- ranking ----

struct Found {
    assignment: Assignment,
    cost: Cost,
}

fn strategy_rank(s: Strategy) -> u8 {
    match s {
        Strategy::Pipeline => 0,
        Strategy::Tensor => 1,
        Strategy::Data => 2,
        Strategy::Auto => 3,
    }
}

/// Tokens/s to 11 significant digits: rates that differ only by rounding tie.
fn rate_key(tps: f64) -> i64 {
    if tps > 0.0 {
        (tps.ln() * 1e11).round() as i64
    } else {
        i64::MIN
    }
}

/// Best first: higher rate, then fewer Macs, pipeline before tensor, then names, then split.
fn rank(a: &Found, b: &Found) -> Ordering {
    rate_key(b.cost.tokens_per_second)
        .cmp(&rate_key(a.cost.tokens_per_second))
        .then(a.assignment.order.len().cmp(&b.assignment.order.len()))
        .then(strategy_rank(a.assignment.strategy).cmp(&strategy_rank(b.assignment.strategy)))
        .then_with(|| a.assignment.order.cmp(&b.assignment.order))
}

/// "pipeline over a→b→c", "tensor over a,b".
pub(crate) fn describe(a: &Assignment) -> String {
    let names: Vec<&str> = a.order.iter().map(|(n, _)| n.as_str()).collect();
    match a.strategy {
        Strategy::Pipeline => format!("pipeline over {}", names.join("→")),
        Strategy::Tensor => format!("tensor over {}", names.join(",")),
        Strategy::Data => format!("data over {}", names.join(",")),
        Strategy::Auto => format!("auto over {}", names.join(",")),
    }
}

// ---- alternatives ----

fn alternatives(ctx: &Ctx<'_>, found: &[Found], keep: usize) -> Vec<Alternative> {
    let Some(best) = found.first() else {
        return Vec::new();
    };
    let set = |a: &Assignment| {
        let mut names: Vec<String> = a.order.iter().map(|(n, _)| n.clone()).collect();
        names.sort();
        (strategy_rank(a.strategy), names)
    };
    let best_tps = best.cost.tokens_per_second;
    let mut seen = BTreeSet::from([set(&best.assignment)]);
    let mut feasible = Vec::new();
    for f in &found[1..] {
        if seen.insert(set(&f.assignment)) {
            let tps = f.cost.tokens_per_second;
            let reason = if rate_key(tps) == rate_key(best_tps) {
                format!("as fast ({tps:.1} tok/s); ties go to fewer Macs, then names")
            } else {
                format!("slower: {tps:.1} vs {best_tps:.1} tok/s")
            };
            feasible.push(Alternative {
                description: describe(&f.assignment),
                tokens_per_second: Some(tps),
                reason,
            });
        }
    }
    let notes = infeasible_notes(ctx, found, &mut seen);
    let notes_kept = notes.len().min(2).min(keep);
    feasible.truncate(keep - notes_kept);
    feasible.extend(notes.into_iter().take(notes_kept));
    feasible
}

/// Instructive losers that do not run: tensor over the chosen Macs (when auto found no tensor
/// plan) and the fastest Mac alone (when it is not the plan).
fn infeasible_notes(
    ctx: &Ctx<'_>,
    found: &[Found],
    seen: &mut BTreeSet<(u8, Vec<String>)>,
) -> Vec<Alternative> {
    let mut notes = Vec::new();
    let Some(best) = found.first() else {
        return notes;
    };
    let mut note = |a: Assignment| {
        let mut names: Vec<String> = a.order.iter().map(|(n, _)| n.clone()).collect();
        names.sort();
        if !seen.insert((strategy_rank(a.strategy), names)) {
            return;
        }
        if let Err(e) = evaluate(ctx.topo, ctx.work, &a) {
            notes.push(Alternative {
                description: describe(&a),
                tokens_per_second: None,
                reason: e.reason,
            });
        }
    };
    let by_speed = fastest_first(ctx, &(0..ctx.macs.len()).collect::<Vec<_>>());
    if ctx.work.strategy == Strategy::Auto
        && !found
            .iter()
            .any(|f| f.assignment.strategy == Strategy::Tensor)
    {
        let names: Vec<String> = if best.assignment.order.len() >= 2 {
            best.assignment
                .order
                .iter()
                .map(|(n, _)| n.clone())
                .collect()
        } else {
            by_speed
                .iter()
                .take(2)
                .map(|&p| ctx.name(p).to_string())
                .collect()
        };
        if names.len() >= 2 {
            let (order, _) = cable_order(ctx.topo, &names);
            note(Assignment {
                strategy: Strategy::Tensor,
                order: order
                    .into_iter()
                    .map(|n| (n, ctx.work.model.layers))
                    .collect(),
            });
        }
    }
    if matches!(ctx.work.strategy, Strategy::Auto | Strategy::Pipeline)
        && let Some(&fastest) = by_speed.first()
    {
        note(ctx.assignment(Strategy::Pipeline, &[(fastest, ctx.work.model.layers)]));
    }
    notes
}

/// Positions by memory bandwidth (fastest first), then free memory, then name.
fn fastest_first(ctx: &Ctx<'_>, pos: &[usize]) -> Vec<usize> {
    let mut v = pos.to_vec();
    v.sort_by(|&a, &b| {
        let (x, y) = (ctx.mac(a), ctx.mac(b));
        y.memory_bandwidth_gbs
            .total_cmp(&x.memory_bandwidth_gbs)
            .then(y.free_bytes.cmp(&x.free_bytes))
            .then(a.cmp(&b))
    });
    v
}

// ---- pipeline: per-Mac figures ----

/// Roles of a pipeline stage: they differ in the embeddings/head they hold and read.
const ONLY: usize = 0;
const FIRST: usize = 1;
const MID: usize = 2;
const LAST: usize = 3;

fn role(i: usize, first: usize, last: usize) -> usize {
    match (i == first, i == last) {
        (true, true) => ONLY,
        (true, false) => FIRST,
        (false, true) => LAST,
        (false, false) => MID,
    }
}

/// The figures of a set of Macs for pipeline search; local index i is `pos[i]` in the Ctx.
struct PipeData {
    pos: Vec<usize>,
    bw: Vec<f64>,
    /// Layers each Mac can hold in each role.
    cap: Vec<[u32; 4]>,
    /// One-way hop time i→j (activation of the objective's batch), if linked.
    hop: Vec<Vec<Option<f64>>>,
    /// Return time from i (last) to j (first).
    ret: Vec<Vec<Option<f64>>>,
    /// Local indices, fastest first.
    by_speed: Vec<usize>,
    /// Bytes read per layer (weights + KV).
    per_layer: u64,
    /// Bytes the last stage reads besides its layers (output head).
    head_read: u64,
    layers: u32,
}

impl PipeData {
    fn new(ctx: &Ctx<'_>, pos: Vec<usize>) -> PipeData {
        let model = &ctx.work.model;
        let per_layer = model
            .bytes_per_layer
            .saturating_add(model.kv_bytes_per_layer());
        let overhead = model.overhead_bytes();
        let embed = model.other_bytes / 2;
        let head = model.other_bytes - embed;
        let layers = model.layers;
        let cap_of = |free: u64, extra: u64| -> u32 {
            let fixed = overhead.saturating_add(extra);
            if free < fixed {
                return 0;
            }
            // No bytes per layer (a degenerate model): any number fits.
            (free - fixed)
                .checked_div(per_layer)
                .map_or(layers, |c| c.min(u64::from(layers)) as u32)
        };
        let act = model.activation_bytes(hop_batch(ctx.work));
        let macs: Vec<&Mac> = pos.iter().map(|&p| ctx.mac(p)).collect();
        let idx: Vec<NodeIndex> = pos.iter().map(|&p| ctx.macs[p]).collect();
        let m = pos.len();
        let mut hop = vec![vec![None; m]; m];
        let mut ret = vec![vec![None; m]; m];
        for i in 0..m {
            for j in 0..m {
                if i != j {
                    hop[i][j] = usable(ctx.topo.link_at(idx[i], idx[j])).map(|l| hop_us(l, act));
                    ret[i][j] = return_us(ctx.topo, idx[i], idx[j]);
                }
            }
        }
        let local: Vec<usize> = (0..m).collect();
        let mut by_speed = local.clone();
        by_speed.sort_by(|&a, &b| {
            macs[b]
                .memory_bandwidth_gbs
                .total_cmp(&macs[a].memory_bandwidth_gbs)
                .then(pos[a].cmp(&pos[b]))
        });
        PipeData {
            bw: macs.iter().map(|m| m.memory_bandwidth_gbs).collect(),
            cap: macs
                .iter()
                .map(|m| {
                    let f = m.free_bytes;
                    [
                        cap_of(f, model.other_bytes),
                        cap_of(f, embed),
                        cap_of(f, 0),
                        cap_of(f, head),
                    ]
                })
                .collect(),
            hop,
            ret,
            by_speed,
            per_layer,
            head_read: model.other_bytes / 2,
            layers,
            pos,
        }
    }

    /// The figures of a subset (local indices of self), in the given order.
    fn subset(&self, keep: &[usize]) -> PipeData {
        let mut by_speed: Vec<usize> = Vec::with_capacity(keep.len());
        for &i in &self.by_speed {
            if let Some(k) = keep.iter().position(|&x| x == i) {
                by_speed.push(k);
            }
        }
        PipeData {
            pos: keep.iter().map(|&i| self.pos[i]).collect(),
            bw: keep.iter().map(|&i| self.bw[i]).collect(),
            cap: keep.iter().map(|&i| self.cap[i]).collect(),
            hop: keep
                .iter()
                .map(|&i| keep.iter().map(|&j| self.hop[i][j]).collect())
                .collect(),
            ret: keep
                .iter()
                .map(|&i| keep.iter().map(|&j| self.ret[i][j]).collect())
                .collect(),
            by_speed,
            per_layer: self.per_layer,
            head_read: self.head_read,
            layers: self.layers,
        }
    }

    fn len(&self) -> usize {
        self.pos.len()
    }

    /// Compute time of a stage, exactly as `evaluate` computes it.
    fn read(&self, i: usize, layers: u32, role: usize) -> f64 {
        let head = if role == LAST || role == ONLY {
            self.head_read
        } else {
            0
        };
        read_us(
            u64::from(layers)
                .saturating_mul(self.per_layer)
                .saturating_add(head),
            self.bw[i],
        )
    }

    /// Latency objective: the compute-optimal split over the Macs `in_set` (k of them) with
    /// this first and last: everyone 1 layer, the rest to the fastest, up to memory.
    /// Writes layers into `split` (by local index) and returns Σ compute.
    fn greedy(
        &self,
        in_set: impl Fn(usize) -> bool,
        k: usize,
        first: usize,
        last: usize,
        split: &mut [u32],
    ) -> Option<f64> {
        let layers = self.layers as usize;
        if k == 0 || k > layers {
            return None;
        }
        let mut remaining = (layers - k) as u32;
        let mut total = 0.0;
        for &i in &self.by_speed {
            if !in_set(i) {
                continue;
            }
            let r = role(i, first, last);
            let cap = self.cap[i][r];
            if cap == 0 {
                return None;
            }
            let more = (cap - 1).min(remaining);
            remaining -= more;
            split[i] = 1 + more;
            total += self.read(i, 1 + more, r);
        }
        (remaining == 0).then_some(total)
    }

    /// Outgoing time of each stage of `order`: the hop to the next, the return for the last.
    fn outs(&self, order: &[usize]) -> Option<Vec<f64>> {
        let n = order.len();
        let mut outs = Vec::with_capacity(n);
        for w in order.windows(2) {
            outs.push(self.hop[w[0]][w[1]]?);
        }
        outs.push(if n >= 2 {
            self.ret[order[n - 1]][order[0]]?
        } else {
            0.0
        });
        Some(outs)
    }

    /// Throughput objective: the split of `order` minimising the slowest stage (each next layer
    /// goes where it finishes soonest — optimal for increasing stage times). Returns the
    /// bottleneck time and the layers in rank order.
    fn minmax(&self, order: &[usize], outs: &[f64]) -> Option<(f64, Vec<u32>)> {
        let n = order.len();
        if n == 0 || n > self.layers as usize {
            return None;
        }
        let (first, last) = (order[0], order[n - 1]);
        let roles: Vec<usize> = order.iter().map(|&i| role(i, first, last)).collect();
        let caps: Vec<u32> = order
            .iter()
            .zip(&roles)
            .map(|(&i, &r)| self.cap[i][r])
            .collect();
        if caps.contains(&0) {
            return None;
        }
        let time = |r: usize, l: u32| self.read(order[r], l, roles[r]) + outs[r];
        let mut split = vec![1u32; n];
        let mut heap: BinaryHeap<Reverse<(OrdF64, usize)>> = (0..n)
            .filter(|&r| caps[r] > 1)
            .map(|r| Reverse((OrdF64(time(r, 2)), r)))
            .collect();
        for _ in 0..(self.layers as usize - n) {
            let Reverse((_, r)) = heap.pop()?;
            split[r] += 1;
            if split[r] < caps[r] {
                heap.push(Reverse((OrdF64(time(r, split[r] + 1)), r)));
            }
        }
        let worst = (0..n)
            .map(|r| time(r, split[r]))
            .fold(f64::NEG_INFINITY, f64::max);
        Some((worst, split))
    }

    /// The internal cost (lower is better) and split of a fixed order, for the objective.
    fn order_cost(&self, order: &[usize], objective: Objective) -> Option<(f64, Vec<u32>)> {
        let outs = self.outs(order)?;
        match objective {
            Objective::Throughput => self.minmax(order, &outs),
            Objective::Latency => {
                let n = order.len();
                let mut member = vec![false; self.len()];
                for &i in order {
                    member[i] = true;
                }
                let mut split = vec![0u32; self.len()];
                let compute = self.greedy(|i| member[i], n, order[0], order[n - 1], &mut split)?;
                let network: f64 = outs.iter().sum();
                Some((compute + network, order.iter().map(|&i| split[i]).collect()))
            }
        }
    }

    fn to_assignment(&self, ctx: &Ctx<'_>, order: &[usize], split: &[u32]) -> Assignment {
        let ranks: Vec<(usize, u32)> = order
            .iter()
            .zip(split)
            .map(|(&i, &l)| (self.pos[i], l))
            .collect();
        ctx.assignment(Strategy::Pipeline, &ranks)
    }
}

/// f64 with a total order, for heaps.
#[derive(Clone, Copy, PartialEq)]
struct OrdF64(f64);
impl Eq for OrdF64 {}
impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrdF64 {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

// ---- pipeline: exact ----

/// Cheapest Hamiltonian paths from a fixed start over every subset: cost[mask][v].
struct PathDp {
    m: usize,
    cost: Vec<f64>,
    parent: Vec<u8>,
}

impl PathDp {
    fn run(hop: &[Vec<Option<f64>>], start: usize) -> PathDp {
        let m = hop.len();
        let full = 1usize << m;
        let mut cost = vec![f64::INFINITY; full * m];
        let mut parent = vec![u8::MAX; full * m];
        cost[(1 << start) * m + start] = 0.0;
        for mask in 0..full {
            if mask & (1 << start) == 0 {
                continue;
            }
            for v in 0..m {
                let d = cost[mask * m + v];
                if mask & (1 << v) == 0 || !d.is_finite() {
                    continue;
                }
                for (w, h) in hop[v].iter().enumerate() {
                    if let Some(h) = h
                        && mask & (1 << w) == 0
                    {
                        let at = (mask | 1 << w) * m + w;
                        if d + h < cost[at] {
                            cost[at] = d + h;
                            parent[at] = v as u8;
                        }
                    }
                }
            }
        }
        PathDp { m, cost, parent }
    }

    fn get(&self, mask: usize, v: usize) -> f64 {
        self.cost[mask * self.m + v]
    }

    /// The path ending at v over mask, start first.
    fn path(&self, mut mask: usize, mut v: usize) -> Vec<usize> {
        let mut out = vec![v];
        while self.parent[mask * self.m + v] != u8::MAX {
            let u = self.parent[mask * self.m + v] as usize;
            mask &= !(1 << v);
            v = u;
            out.push(v);
        }
        out.reverse();
        out
    }
}

/// The best pipeline of each subset of `pd`'s Macs (exact for the latency objective, and the
/// global optimum exact for throughput), best first, at most `keep` of them.
fn pipeline_exact(ctx: &Ctx<'_>, pd: &PipeData, keep: usize) -> Vec<Assignment> {
    let m = pd.len();
    if m == 0 || m > EXACT_MAX {
        return Vec::new();
    }
    let lo = ctx.lo;
    let hi = ctx.hi.min(m).min(pd.layers as usize);
    // Best per subset: (cost, order, split by rank).
    let mut best: BTreeMap<usize, (f64, Vec<usize>, Vec<u32>)> = BTreeMap::new();
    let objective = ctx.work.objective;
    let mut split = vec![0u32; m];
    for s in 0..m {
        // Single Mac.
        if lo <= 1 && pd.cap[s][ONLY] >= pd.layers {
            let t = pd.read(s, pd.layers, ONLY);
            offer(&mut best, 1 << s, t, vec![s], vec![pd.layers]);
        }
        let dp = PathDp::run(&pd.hop, s);
        for mask in 0..(1usize << m) {
            let k = mask.count_ones() as usize;
            if mask & (1 << s) == 0 || k < lo.max(2) || k > hi {
                continue;
            }
            for l in 0..m {
                if l == s || mask & (1 << l) == 0 {
                    continue;
                }
                let path = dp.get(mask, l);
                let Some(back) = pd.ret[l][s] else { continue };
                if !path.is_finite() {
                    continue;
                }
                match objective {
                    Objective::Latency => {
                        let Some(compute) =
                            pd.greedy(|i| mask & (1 << i) != 0, k, s, l, &mut split)
                        else {
                            continue;
                        };
                        let t = compute + path + back;
                        if best.get(&mask).is_none_or(|b| t < b.0) {
                            let order = dp.path(mask, l);
                            let layers = order.iter().map(|&i| split[i]).collect();
                            best.insert(mask, (t, order, layers));
                        }
                    }
                    Objective::Throughput => {
                        // Runners-up: the cheapest path of each subset, split min-max.
                        let key = path + back;
                        if best.get(&mask).is_none_or(|b| key < b.0) {
                            best.insert(mask, (key, dp.path(mask, l), Vec::new()));
                        }
                    }
                }
            }
        }
    }
    let mut ranked: Vec<(f64, Vec<usize>, Vec<u32>)> = match objective {
        Objective::Latency => best.into_values().collect(),
        Objective::Throughput => {
            let mut v: Vec<_> = best
                .into_values()
                .filter_map(|(_, order, layers)| {
                    if order.len() == 1 {
                        let t = pd.read(order[0], pd.layers, ONLY);
                        return Some((t, order, layers));
                    }
                    let (t, split) = pd.minmax(&order, &pd.outs(&order)?)?;
                    Some((t, order, split))
                })
                .collect();
            if let Some((t, order, split)) = throughput_optimum(pd, lo, hi) {
                v.push((t, order, split));
            }
            v
        }
    };
    ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.len().cmp(&b.1.len())));
    ranked
        .into_iter()
        .take(keep)
        .map(|(_, order, split)| pd.to_assignment(ctx, &order, &split))
        .collect()
}

fn offer(
    best: &mut BTreeMap<usize, (f64, Vec<usize>, Vec<u32>)>,
    mask: usize,
    t: f64,
    order: Vec<usize>,
    split: Vec<u32>,
) {
    if best.get(&mask).is_none_or(|b| t < b.0) {
        best.insert(mask, (t, order, split));
    }
}

/// Throughput: the least bottleneck over every ordered subset, by binary search on the
/// bottleneck T over the stage times that can occur.
fn throughput_optimum(pd: &PipeData, lo: usize, hi: usize) -> Option<(f64, Vec<usize>, Vec<u32>)> {
    let m = pd.len();
    let mut ts = Vec::new();
    for i in 0..m {
        if lo <= 1 && pd.cap[i][ONLY] >= pd.layers {
            ts.push(pd.read(i, pd.layers, ONLY));
        }
        for j in 0..m {
            for (r, out) in [
                (FIRST, pd.hop[i][j]),
                (MID, pd.hop[i][j]),
                (LAST, pd.ret[i][j]),
            ] {
                let Some(out) = out else { continue };
                for k in 1..=pd.cap[i][r] {
                    ts.push(pd.read(i, k, r) + out);
                }
            }
        }
    }
    ts.sort_by(f64::total_cmp);
    ts.dedup();
    let top = *ts.last()?;
    reachable(pd, top, lo, hi)?;
    let (mut a, mut b) = (0usize, ts.len() - 1); // ts[b] is reachable
    while a < b {
        let mid = (a + b) / 2;
        if reachable(pd, ts[mid], lo, hi).is_some() {
            b = mid;
        } else {
            a = mid + 1;
        }
    }
    let order = reachable(pd, ts[b], lo, hi)?;
    let (t, split) = if order.len() == 1 {
        (pd.read(order[0], pd.layers, ONLY), vec![pd.layers])
    } else {
        pd.minmax(&order, &pd.outs(&order)?)?
    };
    Some((t, order, split))
}

/// Largest layer count Mac i can take in role r with outgoing time `out` within T.
fn layers_within(pd: &PipeData, i: usize, r: usize, out: f64, t: f64) -> u32 {
    let (mut a, mut b) = (0u32, pd.cap[i][r]);
    while a < b {
        let mid = b - (b - a) / 2;
        if pd.read(i, mid, r) + out <= t {
            a = mid;
        } else {
            b = mid - 1;
        }
    }
    a
}

/// An order (fewest Macs first) whose stages, each within T, have room for every layer.
fn reachable(pd: &PipeData, t: f64, lo: usize, hi: usize) -> Option<Vec<usize>> {
    let m = pd.len();
    let need = pd.layers as i32;
    let within = |r: usize, outs: &Vec<Vec<Option<f64>>>| -> Vec<Vec<i32>> {
        (0..m)
            .map(|i| {
                (0..m)
                    .map(|j| outs[i][j].map_or(0, |o| layers_within(pd, i, r, o, t) as i32))
                    .collect()
            })
            .collect()
    };
    let (k_first, k_mid, k_last) = (
        within(FIRST, &pd.hop),
        within(MID, &pd.hop),
        within(LAST, &pd.ret),
    );
    let mut found: Option<(usize, Vec<usize>)> = None;
    for s in 0..m {
        if lo <= 1 && layers_within(pd, s, ONLY, 0.0, t) >= pd.layers {
            return Some(vec![s]);
        }
    }
    let full = 1usize << m;
    let mut best = vec![-1i32; full * m];
    let mut parent = vec![u8::MAX; full * m];
    for s in 0..m {
        best.fill(-1);
        parent.fill(u8::MAX);
        best[(1 << s) * m + s] = 0;
        for mask in 0..full {
            if mask & (1 << s) == 0 {
                continue;
            }
            let k = mask.count_ones() as usize;
            for v in 0..m {
                let have = best[mask * m + v];
                if have < 0 || mask & (1 << v) == 0 {
                    continue;
                }
                // Close here: v is the last stage.
                if v != s && k >= lo.max(2) && k <= hi && found.as_ref().is_none_or(|f| k < f.0) {
                    let kl = k_last[v][s];
                    if kl >= 1 && have + kl >= need {
                        let mut order = vec![v];
                        let (mut mk, mut x) = (mask, v);
                        while parent[mk * m + x] != u8::MAX {
                            let u = parent[mk * m + x] as usize;
                            mk &= !(1 << x);
                            x = u;
                            order.push(x);
                        }
                        order.reverse();
                        found = Some((k, order));
                    }
                }
                if k >= hi {
                    continue;
                }
                let caps = if v == s { &k_first[v] } else { &k_mid[v] };
                for (w, &c) in caps.iter().enumerate() {
                    if c < 1 || mask & (1 << w) != 0 || pd.hop[v][w].is_none() {
                        continue;
                    }
                    let at = (mask | 1 << w) * m + w;
                    let nb = (have + c).min(need);
                    if nb > best[at] {
                        best[at] = nb;
                        parent[at] = v as u8;
                    }
                }
            }
        }
    }
    found.map(|(_, order)| order)
}

// ---- pipeline: heuristic ----

fn pipeline_heuristic(ctx: &Ctx<'_>, pool_size: usize) -> Vec<Assignment> {
    let all = PipeData::new(ctx, (0..ctx.macs.len()).collect());
    let objective = ctx.work.objective;
    let mut out = Vec::new();
    // Exact solves on neighbourhoods.
    for pool in pools(ctx, &all, pool_size) {
        let total: u64 = pool.iter().map(|&i| u64::from(all.cap[i][MID])).sum();
        if total < u64::from(all.layers) {
            continue;
        }
        out.extend(pipeline_exact(ctx, &all.subset(&pool), PER_POOL));
    }
    // Walks along the cables, for sets larger than a pool.
    let mut walks: Vec<(f64, Vec<usize>, Vec<u32>)> = Vec::new();
    for seed in 0..all.len() {
        for policy in [Walk::Fast, Walk::Roomy, Walk::Near] {
            let mut order = vec![seed];
            let mut used = vec![false; all.len()];
            used[seed] = true;
            loop {
                if order.len() >= ctx.lo
                    && let Some((c, split)) = all.order_cost(&order, objective)
                {
                    walks.push((c, order.clone(), split));
                }
                if order.len() >= ctx.hi {
                    break;
                }
                let end = order[order.len() - 1];
                let next = (0..all.len())
                    .filter(|&j| !used[j] && all.hop[end][j].is_some())
                    .min_by(|&a, &b| policy.cmp(ctx, &all, end, a, b));
                let Some(next) = next else { break };
                used[next] = true;
                order.push(next);
            }
        }
    }
    walks.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    walks.dedup_by(|a, b| a.1 == b.1);
    for (i, (_, order, split)) in walks.into_iter().take(2 * IMPROVED_ORDERS).enumerate() {
        out.push(all.to_assignment(ctx, &order, &split));
        if i < IMPROVED_ORDERS
            && let Some((order, split)) = improve(&all, order, objective, (ctx.lo, ctx.hi))
        {
            out.push(all.to_assignment(ctx, &order, &split));
        }
    }
    out
}

#[derive(Clone, Copy)]
enum Walk {
    /// Fastest memory first.
    Fast,
    /// Most free memory first (models that need many Macs).
    Roomy,
    /// Nearest by hop time.
    Near,
}

impl Walk {
    /// Less = preferred next Mac after `end`.
    fn cmp(self, ctx: &Ctx<'_>, pd: &PipeData, end: usize, a: usize, b: usize) -> Ordering {
        let (x, y) = (ctx.mac(pd.pos[a]), ctx.mac(pd.pos[b]));
        let hop = |j: usize| pd.hop[end][j].unwrap_or(f64::INFINITY);
        let by_bw = y.memory_bandwidth_gbs.total_cmp(&x.memory_bandwidth_gbs);
        let by_free = y.free_bytes.cmp(&x.free_bytes);
        let by_hop = hop(a).total_cmp(&hop(b));
        match self {
            Walk::Fast => by_bw.then(by_free).then(by_hop),
            Walk::Roomy => by_free.then(by_bw).then(by_hop),
            Walk::Near => by_hop.then(by_bw).then(by_free),
        }
        .then(a.cmp(&b))
    }
}

/// Local search on a pipeline order: reverse a segment (2-opt), insert an unused Mac, drop a
/// Mac — whatever lowers the cost, until nothing does (or a few passes).
fn improve(
    pd: &PipeData,
    mut order: Vec<usize>,
    objective: Objective,
    (lo, hi): (usize, usize),
) -> Option<(Vec<usize>, Vec<u32>)> {
    let (mut cost, mut split) = pd.order_cost(&order, objective)?;
    let accept = |order: &[usize], cost: &mut f64, split: &mut Vec<u32>| match pd
        .order_cost(order, objective)
    {
        Some((c, s)) if c < *cost * (1.0 - 1e-12) => {
            *cost = c;
            *split = s;
            true
        }
        _ => false,
    };
    for _ in 0..IMPROVE_PASSES {
        let mut improved = false;
        let n = order.len();
        for i in 0..n {
            for j in i + 1..n {
                order[i..=j].reverse();
                if accept(&order, &mut cost, &mut split) {
                    improved = true;
                } else {
                    order[i..=j].reverse();
                }
            }
        }
        if order.len() < hi {
            for u in 0..pd.len() {
                if order.contains(&u) {
                    continue;
                }
                for at in 0..=order.len() {
                    order.insert(at, u);
                    if accept(&order, &mut cost, &mut split) {
                        improved = true;
                        break;
                    }
                    order.remove(at);
                }
                if order.len() >= hi {
                    break;
                }
            }
        }
        let mut at = 0;
        while order.len() > lo.max(1) && at < order.len() {
            let u = order.remove(at);
            if accept(&order, &mut cost, &mut split) {
                improved = true;
            } else {
                order.insert(at, u);
                at += 1;
            }
        }
        if !improved {
            break;
        }
    }
    Some((order, split))
}

/// Neighbourhoods of `size` Macs grown from every Mac along the cables: by speed and by room.
fn pools(ctx: &Ctx<'_>, pd: &PipeData, size: usize) -> Vec<Vec<usize>> {
    let e = pd.len();
    let mut out = BTreeSet::new();
    for seed in 0..e {
        for policy in [Walk::Fast, Walk::Roomy] {
            let mut pool = vec![seed];
            let mut used = vec![false; e];
            used[seed] = true;
            while pool.len() < size {
                // Among Macs cabled to the pool, prefer by the policy (as if after the seed).
                let next = (0..e)
                    .filter(|&j| !used[j] && pool.iter().any(|&p| pd.hop[p][j].is_some()))
                    .min_by(|&a, &b| policy.cmp(ctx, pd, seed, a, b));
                let Some(next) = next else { break };
                used[next] = true;
                pool.push(next);
            }
            pool.sort_unstable();
            out.insert(pool);
        }
    }
    out.into_iter().collect()
}

// ---- tensor and data: rings ----

/// What every Mac of a tensor or data group of k Macs needs and reads, and the network time of
/// a ring with this slowest latency and bandwidth.
struct RingModel<'a> {
    ctx: &'a Ctx<'a>,
    strategy: Strategy,
}

impl RingModel<'_> {
    /// Sizes allowed: within bounds, and for tensor ≥ 2 and dividing the heads.
    fn size_ok(&self, k: usize) -> bool {
        let model = &self.ctx.work.model;
        if k < self.ctx.lo || k > self.ctx.hi {
            return false;
        }
        match self.strategy {
            Strategy::Tensor => {
                k >= 2
                    && model.heads.is_multiple_of(k as u32)
                    && model.kv_heads.is_multiple_of(k as u32)
            }
            _ => true,
        }
    }

    /// (memory each Mac needs, compute time on a Mac of bandwidth bw).
    fn need(&self, k: usize) -> u64 {
        let model = &self.ctx.work.model;
        let overhead = model.overhead_bytes();
        match self.strategy {
            Strategy::Tensor => {
                let k = k as u64;
                let w = (u64::from(model.layers).saturating_mul(model.bytes_per_layer))
                    .saturating_add(model.other_bytes)
                    .div_ceil(k);
                w.saturating_add(model.kv_bytes().div_ceil(k))
                    .saturating_add(overhead)
            }
            _ => model
                .weight_bytes()
                .saturating_add(model.kv_bytes())
                .saturating_add(overhead),
        }
    }

    fn compute(&self, k: usize, bw: f64) -> f64 {
        let model = &self.ctx.work.model;
        match self.strategy {
            Strategy::Tensor => {
                let k = k as u64;
                let w = (u64::from(model.layers).saturating_mul(model.bytes_per_layer))
                    .saturating_add(model.other_bytes)
                    .div_ceil(k);
                read_us(w.saturating_add(model.kv_bytes().div_ceil(k)), bw)
            }
            _ => 3.0 * read_us(model.weight_bytes(), bw),
        }
    }

    fn network(&self, k: usize, lat: f64, bw: f64) -> f64 {
        let model = &self.ctx.work.model;
        match self.strategy {
            Strategy::Tensor => {
                2.0 * f64::from(model.layers)
                    * ring_allreduce_us(
                        k,
                        lat,
                        bw,
                        model.activation_bytes(hop_batch(self.ctx.work)),
                    )
            }
            _ => ring_allreduce_us(k, lat, bw, model.weight_bytes()),
        }
    }

    /// Tokens per time unit (for ranking): tensor scales by batch, data by k × batch.
    fn per_step(&self, k: usize) -> f64 {
        let model = &self.ctx.work.model;
        match (self.strategy, self.ctx.work.objective) {
            (Strategy::Tensor, Objective::Latency) => 1.0,
            (Strategy::Tensor, Objective::Throughput) => f64::from(model.batch),
            _ => k as f64 * f64::from(model.batch),
        }
    }

    /// Best ring over `members` (positions), with its rate; None when it does not fit or no ring.
    fn best(&self, members: &[usize], budget: usize) -> Option<(f64, Vec<usize>)> {
        let k = members.len();
        if !self.size_ok(k) {
            return None;
        }
        let need = self.need(k);
        let mut compute = 0.0f64;
        for &p in members {
            let mac = self.ctx.mac(p);
            if mac.free_bytes < need {
                return None;
            }
            compute = compute.max(self.compute(k, mac.memory_bandwidth_gbs));
        }
        let (order, network) = if k == 1 {
            (members.to_vec(), 0.0)
        } else {
            let idx: Vec<NodeIndex> = members.iter().map(|&p| self.ctx.macs[p]).collect();
            let (ring, net) = best_ring(self.ctx.topo, &idx, |l, b| self.network(k, l, b), budget)?;
            (ring.into_iter().map(|i| members[i]).collect(), net)
        };
        let time = compute + network;
        Some((self.per_step(k) / time, order))
    }
}

/// Every subset of `pool` (positions; at most EXACT_MAX) with its best ring, best rate first.
fn rings_exact(
    ctx: &Ctx<'_>,
    strategy: Strategy,
    pool: &[usize],
    budget: usize,
    keep: usize,
) -> Vec<Assignment> {
    let m = pool.len();
    if m == 0 || m > EXACT_MAX {
        return Vec::new();
    }
    let model = RingModel { ctx, strategy };
    let mut ranked: Vec<(f64, Vec<usize>)> = Vec::new();
    for mask in 1..(1usize << m) {
        if !model.size_ok(mask.count_ones() as usize) {
            continue;
        }
        let members: Vec<usize> = (0..m)
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| pool[i])
            .collect();
        if let Some(r) = model.best(&members, budget) {
            ranked.push(r);
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.len().cmp(&b.1.len())));
    ranked
        .into_iter()
        .take(keep)
        .map(|(_, order)| {
            let ranks: Vec<(usize, u32)> =
                order.iter().map(|&p| (p, ctx.work.model.layers)).collect();
            ctx.assignment(strategy, &ranks)
        })
        .collect()
}

fn rings_heuristic(ctx: &Ctx<'_>, strategy: Strategy, pool_size: usize) -> Vec<Assignment> {
    let all = PipeData::new(ctx, (0..ctx.macs.len()).collect());
    let mut out = Vec::new();
    for pool in pools(ctx, &all, pool_size) {
        let pos: Vec<usize> = pool.iter().map(|&i| all.pos[i]).collect();
        out.extend(rings_exact(ctx, strategy, &pos, RING_BUDGET, PER_POOL));
    }
    // Each size: the fastest Macs that can hold their share.
    let model = RingModel { ctx, strategy };
    let by_speed = fastest_first(ctx, &(0..ctx.macs.len()).collect::<Vec<_>>());
    for k in 1..=ctx.hi {
        if !model.size_ok(k) {
            continue;
        }
        let need = model.need(k);
        let members: Vec<usize> = by_speed
            .iter()
            .copied()
            .filter(|&p| ctx.mac(p).free_bytes >= need)
            .take(k)
            .collect();
        if members.len() == k
            && let Some((_, order)) = model.best(&members, RING_BUDGET)
        {
            let ranks: Vec<(usize, u32)> =
                order.iter().map(|&p| (p, ctx.work.model.layers)).collect();
            out.push(ctx.assignment(strategy, &ranks));
        }
    }
    out
}

/// The ring over `members` minimising `cost(slowest latency, slowest bandwidth)`: depth-first
/// over Hamiltonian cycles from members[0], best links first, pruned by the best found (a
/// longer path only has a slower slowest link). At most `budget` expansions.
fn best_ring(
    topo: &Topology,
    members: &[NodeIndex],
    cost: impl Fn(f64, f64) -> f64,
    budget: usize,
) -> Option<(Vec<usize>, f64)> {
    let k = members.len();
    let links: Vec<Vec<Option<(f64, f64)>>> = (0..k)
        .map(|i| {
            (0..k)
                .map(|j| {
                    (i != j)
                        .then(|| usable(topo.link_at(members[i], members[j])))
                        .flatten()
                        .map(|l| (l.latency_us, l.bandwidth_gbps))
                })
                .collect()
        })
        .collect();
    if k == 2 {
        let (l, b) = links[0][1]?;
        return Some((vec![0, 1], cost(l, b)));
    }
    let neighbours: Vec<Vec<usize>> = (0..k)
        .map(|i| {
            let mut v: Vec<usize> = (0..k).filter(|&j| links[i][j].is_some()).collect();
            v.sort_by(|&a, &b| {
                let c = |j: usize| links[i][j].map_or(f64::INFINITY, |(l, b)| cost(l, b));
                c(a).total_cmp(&c(b)).then(a.cmp(&b))
            });
            v
        })
        .collect();
    struct Search<'a, F> {
        links: &'a [Vec<Option<(f64, f64)>>],
        neighbours: &'a [Vec<usize>],
        cost: F,
        path: Vec<usize>,
        used: Vec<bool>,
        best: Option<(Vec<usize>, f64)>,
        left: usize,
    }
    impl<F: Fn(f64, f64) -> f64> Search<'_, F> {
        fn go(&mut self, v: usize, lat: f64, bw: f64) {
            if self.left == 0 {
                return;
            }
            self.left -= 1;
            let bound = self.best.as_ref().map_or(f64::INFINITY, |b| b.1);
            if self.path.len() == self.used.len() {
                if let Some((l, b)) = self.links[v][0] {
                    let c = (self.cost)(lat.max(l), bw.min(b));
                    if c < bound {
                        self.best = Some((self.path.clone(), c));
                    }
                }
                return;
            }
            for &w in &self.neighbours[v] {
                if self.used[w] {
                    continue;
                }
                let Some((l, b)) = self.links[v][w] else {
                    continue;
                };
                let (l2, b2) = (lat.max(l), bw.min(b));
                let bound = self.best.as_ref().map_or(f64::INFINITY, |b| b.1);
                if (self.cost)(l2, b2) >= bound {
                    continue;
                }
                self.used[w] = true;
                self.path.push(w);
                self.go(w, l2, b2);
                self.path.pop();
                self.used[w] = false;
            }
        }
    }
    let mut search = Search {
        links: &links,
        neighbours: &neighbours,
        cost,
        path: vec![0],
        used: vec![false; k],
        best: None,
        left: budget,
    };
    search.used[0] = true;
    search.go(0, 0.0, f64::INFINITY);
    search.best
}

// ---- when nothing fits ----

fn unplaceable(ctx: &Ctx<'_>, strategies: &[Strategy]) -> Unplaceable {
    let model = &ctx.work.model;
    let name = &model.name;
    let primary = strategies.first().copied().unwrap_or(Strategy::Pipeline);
    if primary == Strategy::Tensor {
        let ring = RingModel {
            ctx,
            strategy: Strategy::Tensor,
        };
        if !(2..=ctx.hi).any(|k| ring.size_ok(k)) {
            let tried: Vec<String> = (ctx.lo.max(2)..=ctx.hi).map(|k| k.to_string()).collect();
            let message = if tried.is_empty() {
                format!(
                    "model {name}: tensor parallelism needs at least 2 Macs; {} allowed",
                    ctx.hi
                )
            } else {
                format!(
                    "model {name}: tensor parallelism needs the number of Macs to divide the \
                     attention heads ({}) and the KV heads ({}); {} Macs are allowed and none of \
                     these counts does (pipeline or auto would place it)",
                    model.heads,
                    model.kv_heads,
                    or_list(&tried),
                )
            };
            return ctx.refuse(message, None);
        }
    }
    let fixed = model.weight_bytes().saturating_add(model.kv_bytes());
    let overhead = model.overhead_bytes();
    let kv_words = format!(
        "{} for weights + {} KV cache (context {} × batch {})",
        fmt_bytes(model.weight_bytes()),
        fmt_bytes(model.kv_bytes()),
        model.context,
        model.batch
    );
    let mut by_room: Vec<&Mac> = (0..ctx.macs.len()).map(|p| ctx.mac(p)).collect();
    by_room.sort_by(|a, b| b.free_bytes.cmp(&a.free_bytes).then(a.name.cmp(&b.name)));
    let e = ctx.macs.len();
    match primary {
        Strategy::Data => {
            let need = fixed.saturating_add(overhead);
            if let Some(top) = by_room.first()
                && top.free_bytes < need
            {
                let short = need - top.free_bytes;
                return ctx.refuse(
                    format!(
                        "model {name} needs {} on every Mac for data parallelism ({kv_words} + {} \
                         runtime); the most free on an eligible Mac is {} on {} ({} short)",
                        fmt_bytes(need),
                        fmt_bytes(overhead),
                        fmt_bytes(top.free_bytes),
                        top.name,
                        fmt_bytes(short)
                    ),
                    Some(short),
                );
            }
        }
        _ => {
            let k = ctx.hi;
            let have: u64 = by_room.iter().take(k).map(|m| m.free_bytes).sum();
            let need = fixed.saturating_add(overhead.saturating_mul(k as u64));
            if have < need {
                let short = need - have;
                let macs = if k == e {
                    format!(
                        "the {e} eligible Mac{}",
                        if e == 1 { " has" } else { "s have" }
                    )
                } else {
                    format!("the {k} roomiest of the {e} eligible Macs have")
                };
                return ctx.refuse(
                    format!(
                        "model {name} needs {kv_words} + {} runtime on each Mac; {macs} {} free \
                         in all ({} short)",
                        fmt_bytes(overhead),
                        fmt_bytes(have),
                        fmt_bytes(short)
                    ),
                    Some(short),
                );
            }
            if primary == Strategy::Pipeline && (model.layers as usize) < ctx.lo {
                return ctx.refuse(
                    format!(
                        "model {name} has {} layers; a pipeline over at least {} Macs needs one \
                         on each",
                        model.layers, ctx.lo
                    ),
                    None,
                );
            }
        }
    }
    // Memory suffices in total: show why the most natural assignment fails.
    let example = example(ctx, primary, &by_room);
    let (reason, short) = match evaluate(ctx.topo, ctx.work, &example) {
        Err(Infeasible {
            reason,
            short_bytes,
        }) => (reason, short_bytes),
        Ok(_) => ("no candidate found".to_string(), None),
    };
    ctx.refuse(
        format!(
            "model {name} ({kv_words}) fits in the free memory of the eligible Macs in total, but \
             no {} placement works; e.g. {}: {reason}",
            match primary {
                Strategy::Tensor => "tensor",
                Strategy::Data => "data-parallel",
                _ => "pipeline",
            },
            describe(&example)
        ),
        short,
    )
}

/// "2", "2 or 3", "2, 3 or 4".
fn or_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// The assignment a person would try first: the roomiest allowed Macs in cable order, layers
/// in proportion to free memory.
fn example(ctx: &Ctx<'_>, strategy: Strategy, by_room: &[&Mac]) -> Assignment {
    let model = &ctx.work.model;
    let ring = RingModel { ctx, strategy };
    let k = match strategy {
        Strategy::Tensor => (2..=ctx.hi)
            .rev()
            .find(|&k| ring.size_ok(k))
            .unwrap_or(ctx.hi),
        _ => ctx.hi.min(model.layers as usize).max(ctx.lo.min(ctx.hi)),
    };
    let names: Vec<String> = by_room.iter().take(k).map(|m| m.name.clone()).collect();
    let (order, _) = cable_order(ctx.topo, &names);
    let frees: Vec<u64> = order
        .iter()
        .map(|n| ctx.topo.mac(n).map_or(0, |m| m.free_bytes))
        .collect();
    let split = proportional(model.layers, &frees);
    Assignment {
        strategy,
        order: order.into_iter().zip(split).collect(),
    }
}

/// `layers` in proportion to `weights`, each ≥ 1 when there are enough layers.
fn proportional(layers: u32, weights: &[u64]) -> Vec<u32> {
    let n = weights.len();
    if n == 0 {
        return Vec::new();
    }
    let total: u128 = weights.iter().map(|&w| u128::from(w)).sum::<u128>().max(1);
    let mut split: Vec<u32> = weights
        .iter()
        .map(|&w| ((u128::from(w) * u128::from(layers)) / total) as u32)
        .map(|l| l.max(1))
        .collect();
    // Fix the rounding: add to or take from the largest weights first.
    let mut i = 0;
    while split.iter().sum::<u32>() < layers {
        split[i % n] += 1;
        i += 1;
    }
    while split.iter().sum::<u32>() > layers && split.iter().any(|&l| l > 1) {
        if let Some(j) = (0..n).filter(|&j| split[j] > 1).max_by_key(|&j| split[j]) {
            split[j] -= 1;
        }
    }
    split
}

// ---- cable order for exec jobs ----

/// The order of `nodes` that follows the cables best, and whether the ring closes: first the
/// fewest consecutive pairs without a link, then a closing last–first link, then the least
/// total hop time (latency/2 + a 1 MiB message). Exhaustive up to 8 distinct Macs, nearest
/// neighbour + 2-opt above; ties by name. Repeated nodes (several ranks on one Mac) stay
/// together.
pub fn cable_order(topology: &Topology, nodes: &[String]) -> (Vec<String>, bool) {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for n in nodes {
        *counts.entry(n.as_str()).or_default() += 1;
    }
    let names: Vec<&str> = counts.keys().copied().collect();
    let k = names.len();
    let expand = |order: &[usize]| -> Vec<String> {
        order
            .iter()
            .flat_map(|&i| std::iter::repeat_n(names[i].to_string(), counts[names[i]]))
            .collect()
    };
    if k <= 1 {
        return (nodes.to_vec(), false);
    }
    let cost: Vec<Vec<Option<f64>>> = (0..k)
        .map(|i| {
            (0..k)
                .map(|j| {
                    (i != j)
                        .then(|| usable(topology.link(names[i], names[j])))
                        .flatten()
                        .map(|l| hop_us(l, CABLE_MESSAGE_BYTES))
                })
                .collect()
        })
        .collect();
    let key = |order: &[usize]| -> (usize, bool, f64) {
        let mut missing = 0;
        let mut total = 0.0;
        for w in order.windows(2) {
            match cost[w[0]][w[1]] {
                Some(c) => total += c,
                None => missing += 1,
            }
        }
        let closes = cost[order[k - 1]][order[0]].is_some();
        (missing, !closes, total)
    };
    let better = |a: &(usize, bool, f64), b: &(usize, bool, f64)| -> bool {
        (a.0, a.1) < (b.0, b.1) || ((a.0, a.1) == (b.0, b.1) && a.2 < b.2 * (1.0 - 1e-12))
    };
    let mut best: Option<(Vec<usize>, (usize, bool, f64))> = None;
    let mut consider = |order: &[usize]| {
        let kk = key(order);
        if best.as_ref().is_none_or(|(_, b)| better(&kk, b)) {
            best = Some((order.to_vec(), kk));
        }
    };
    if k <= CABLE_EXHAUSTIVE {
        // Lexicographic order of permutations, so the first best is the first by name.
        let mut perm: Vec<usize> = (0..k).collect();
        loop {
            consider(&perm);
            if !next_permutation(&mut perm) {
                break;
            }
        }
    } else {
        for start in 0..k {
            let mut order = vec![start];
            let mut used = vec![false; k];
            used[start] = true;
            while order.len() < k {
                let end = order[order.len() - 1];
                let next = (0..k).filter(|&j| !used[j]).min_by(|&a, &b| {
                    let c = |j: usize| cost[end][j].unwrap_or(f64::INFINITY);
                    c(a).total_cmp(&c(b)).then(a.cmp(&b))
                });
                let Some(next) = next else { break };
                used[next] = true;
                order.push(next);
            }
            // 2-opt on the key.
            let mut current = key(&order);
            for _ in 0..IMPROVE_PASSES {
                let mut improved = false;
                for i in 0..k {
                    for j in i + 1..k {
                        order[i..=j].reverse();
                        let kk = key(&order);
                        if better(&kk, &current) {
                            current = kk;
                            improved = true;
                        } else {
                            order[i..=j].reverse();
                        }
                    }
                }
                if !improved {
                    break;
                }
            }
            consider(&order);
        }
    }
    match best {
        Some((order, (_, open, _))) => (expand(&order), !open),
        None => (nodes.to_vec(), false),
    }
}

/// Steps `v` to the next permutation in lexicographic order; false after the last.
fn next_permutation(v: &mut [usize]) -> bool {
    let n = v.len();
    if n < 2 {
        return false;
    }
    let mut i = n - 1;
    while i > 0 && v[i - 1] >= v[i] {
        i -= 1;
    }
    if i == 0 {
        return false;
    }
    let mut j = n - 1;
    while v[j] <= v[i - 1] {
        j -= 1;
    }
    v.swap(i - 1, j);
    v[i..].reverse();
    true
}
