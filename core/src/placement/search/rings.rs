//! Tensor and data parallelism: what each Mac of a group needs and how long a step takes
//! (RingModel), every subset of a pool with its best ring (exact), and the ring itself by
//! branch and bound over Hamiltonian cycles.

use petgraph::graph::NodeIndex;

use super::EXACT_MAX;
use super::context::Ctx;
use crate::placement::cost::{Assignment, hop_batch, read_us, ring_allreduce_us, usable};
use crate::placement::topology::Topology;
use crate::placement::{Objective, Strategy};

/// What every Mac of a tensor or data group of k Macs needs and reads, and the network time of
/// a ring with this slowest latency and bandwidth.
pub(super) struct RingModel<'a> {
    pub(super) ctx: &'a Ctx<'a>,
    pub(super) strategy: Strategy,
}

impl RingModel<'_> {
    /// Sizes allowed: within bounds, and for tensor ≥ 2 Macs that the heads can be given out
    /// to ([`ModelShape::tensor_ranks_ok`](crate::placement::memory::ModelShape::tensor_ranks_ok)).
    pub(super) fn size_ok(&self, k: usize) -> bool {
        let model = &self.ctx.work.model;
        if k < self.ctx.lo || k > self.ctx.hi {
            return false;
        }
        match self.strategy {
            Strategy::Tensor => u32::try_from(k).is_ok_and(|k| model.tensor_ranks_ok(k)),
            _ => true,
        }
    }

    /// (memory each Mac needs, compute time on a Mac of bandwidth bw).
    pub(super) fn need(&self, k: usize) -> u64 {
        let model = &self.ctx.work.model;
        let overhead = model.overhead_bytes();
        match self.strategy {
            Strategy::Tensor => {
                let rank = model.tensor_rank(u32::try_from(k).unwrap_or(u32::MAX));
                rank.weight.saturating_add(rank.kv).saturating_add(overhead)
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
                let rank = model.tensor_rank(u32::try_from(k).unwrap_or(u32::MAX));
                read_us(rank.read.saturating_add(rank.kv), bw)
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
    pub(super) fn best(&self, members: &[usize], budget: usize) -> Option<(f64, Vec<usize>)> {
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
            compute =
                compute.max(self.compute(k, mac.memory_bandwidth_gbs) + mac.token_overhead_us);
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
pub(super) fn rings_exact(
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
