//! Per-Mac figures of pipeline search (layer capacity in each role, stage compute time, hop
//! and return times) and the cost of a fixed order: the greedy latency split and the min-max
//! throughput split. Shared by the exact and the heuristic pipeline searches.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use petgraph::graph::NodeIndex;

use super::context::Ctx;
use crate::placement::cost::{Assignment, hop_batch, hop_us, read_us, return_us, usable};
use crate::placement::topology::Mac;
use crate::placement::{Objective, Strategy};

/// Roles of a pipeline stage: they differ in the embeddings/head they hold and read.
pub(super) const ONLY: usize = 0;
pub(super) const FIRST: usize = 1;
pub(super) const MID: usize = 2;
pub(super) const LAST: usize = 3;

fn role(i: usize, first: usize, last: usize) -> usize {
    match (i == first, i == last) {
        (true, true) => ONLY,
        (true, false) => FIRST,
        (false, true) => LAST,
        (false, false) => MID,
    }
}

/// The figures of a set of Macs for pipeline search; local index i is `pos[i]` in the Ctx.
pub(super) struct PipeData {
    pub(super) pos: Vec<usize>,
    bw: Vec<f64>,
    /// Per-token overhead of each Mac, µs.
    overhead: Vec<f64>,
    /// Layers each Mac can hold in each role.
    pub(super) cap: Vec<[u32; 4]>,
    /// One-way hop time i→j (activation of the objective's batch), if linked.
    pub(super) hop: Vec<Vec<Option<f64>>>,
    /// Return time from i (last) to j (first).
    pub(super) ret: Vec<Vec<Option<f64>>>,
    /// Local indices, fastest first.
    by_speed: Vec<usize>,
    /// Bytes read per layer (weights + KV).
    per_layer: u64,
    /// Bytes one token reads per layer (a MoE model's unused experts left out) + KV.
    read_per_layer: u64,
    /// Bytes the last stage reads besides its layers (output head).
    head_read: u64,
    pub(super) layers: u32,
    /// Sequences decoded together (at least 1).
    pub(super) batch: u32,
}

impl PipeData {
    pub(super) fn new(ctx: &Ctx<'_>, pos: Vec<usize>) -> PipeData {
        let model = &ctx.work.model;
        let per_layer = model
            .bytes_per_layer
            .saturating_add(model.kv_bytes_per_layer());
        let overhead = model.overhead_bytes();
        let (embed, head) = (model.embed_bytes(), model.head_bytes());
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
            overhead: macs.iter().map(|m| m.token_overhead_us).collect(),
            cap: macs
                .iter()
                .map(|m| {
                    let f = m.free_bytes;
                    [
                        cap_of(f, model.embed_and_head_bytes()),
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
            read_per_layer: model
                .read_bytes_per_layer()
                .saturating_add(model.kv_bytes_per_layer()),
            head_read: head,
            layers,
            batch: model.batch.max(1),
            pos,
        }
    }

    /// The figures of a subset (local indices of self), in the given order.
    pub(super) fn subset(&self, keep: &[usize]) -> PipeData {
        let mut by_speed: Vec<usize> = Vec::with_capacity(keep.len());
        for &i in &self.by_speed {
            if let Some(k) = keep.iter().position(|&x| x == i) {
                by_speed.push(k);
            }
        }
        PipeData {
            pos: keep.iter().map(|&i| self.pos[i]).collect(),
            bw: keep.iter().map(|&i| self.bw[i]).collect(),
            overhead: keep.iter().map(|&i| self.overhead[i]).collect(),
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
            read_per_layer: self.read_per_layer,
            head_read: self.head_read,
            layers: self.layers,
            batch: self.batch,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.pos.len()
    }

    /// Compute time of a stage, exactly as `evaluate` computes it.
    pub(super) fn read(&self, i: usize, layers: u32, role: usize) -> f64 {
        let head = if role == LAST || role == ONLY {
            self.head_read
        } else {
            0
        };
        read_us(
            u64::from(layers)
                .saturating_mul(self.read_per_layer)
                .saturating_add(head),
            self.bw[i],
        ) + self.overhead[i]
    }

    /// Latency objective: the compute-optimal split over the Macs `in_set` (k of them) with
    /// this first and last: everyone 1 layer, the rest to the fastest, up to memory.
    /// Writes layers into `split` (by local index) and returns Σ compute.
    pub(super) fn greedy(
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
    pub(super) fn outs(&self, order: &[usize]) -> Option<Vec<f64>> {
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

    /// Each stage's role and the most layers its Mac holds in it, along `order`; None when the
    /// order is empty, longer than the layers, or a Mac cannot hold a single layer.
    fn stages(&self, order: &[usize]) -> Option<(Vec<usize>, Vec<u32>)> {
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
        (!caps.contains(&0)).then_some((roles, caps))
    }

    /// The most layers Mac `i` takes in role `r` with outgoing time `out` within `t`.
    pub(super) fn layers_within(&self, i: usize, r: usize, out: f64, t: f64) -> u32 {
        let (mut a, mut b) = (0u32, self.cap[i][r]);
        while a < b {
            let mid = b - (b - a) / 2;
            if self.read(i, mid, r) + out <= t {
                a = mid;
            } else {
                b = mid - 1;
            }
        }
        a
    }

    /// Throughput objective: the split of `order` minimising the slowest stage (each next layer
    /// goes where it finishes soonest — optimal for increasing stage times). Returns the
    /// bottleneck time and the layers in rank order.
    pub(super) fn minmax(&self, order: &[usize], outs: &[f64]) -> Option<(f64, Vec<u32>)> {
        let n = order.len();
        let (roles, caps) = self.stages(order)?;
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

    /// Throughput objective: the time of one round along `order` split as `split` (layers in
    /// rank order) — every micro-batch once through every stage, exactly as `evaluate` computes
    /// it: the whole path, or each stage running each of min(batch, n) micro-batches in turn,
    /// whichever is longer.
    pub(super) fn round_time(&self, order: &[usize], outs: &[f64], split: &[u32]) -> f64 {
        let n = order.len();
        let (first, last) = (order[0], order[n - 1]);
        let (mut path, mut worst) = (0.0, f64::NEG_INFINITY);
        for (r, &i) in order.iter().enumerate() {
            let t = self.read(i, split[r], role(i, first, last)) + outs[r];
            path += t;
            worst = f64::max(worst, t);
        }
        let micro = f64::from(self.batch.min(n as u32).max(1));
        f64::max(path, micro * worst)
    }

    /// Latency objective: the compute-optimal split of a fixed order (greedy) and its time.
    pub(super) fn latency_split(&self, order: &[usize], outs: &[f64]) -> Option<(f64, Vec<u32>)> {
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

    /// Throughput objective: the best split of a fixed order, exactly. Hold every stage within
    /// a cap T: the least sum of stage times S(T) then gives the extra layers to the fastest
    /// Macs first (a layer costs the same on a Mac wherever its stage falls). With T the best
    /// split's slowest stage, max(S(T), micro × T) is no more than the best round, and never
    /// less than a round; S falls and micro × T rises with T, so the best T is where they cross,
    /// found by binary search over the stage times that can occur.
    pub(super) fn throughput_split(
        &self,
        order: &[usize],
        outs: &[f64],
    ) -> Option<(f64, Vec<u32>)> {
        let n = order.len();
        let (roles, caps) = self.stages(order)?;
        let time = |r: usize, l: u32| self.read(order[r], l, roles[r]) + outs[r];
        let mut fastest: Vec<usize> = (0..n).collect();
        fastest.sort_by(|&a, &b| {
            self.bw[order[b]]
                .total_cmp(&self.bw[order[a]])
                .then(a.cmp(&b))
        });
        let mut caps_t: Vec<f64> = (0..n)
            .flat_map(|r| (1..=caps[r]).map(move |l| (r, l)))
            .map(|(r, l)| time(r, l))
            .collect();
        caps_t.sort_by(f64::total_cmp);
        caps_t.dedup();
        let micro = f64::from(self.batch.min(n as u32).max(1));
        // The split of least sum within cap t, and that sum; None if t is too tight.
        let within = |t: f64| -> Option<(f64, Vec<u32>)> {
            let room: Vec<u32> = (0..n)
                .map(|r| self.layers_within(order[r], roles[r], outs[r], t))
                .collect();
            let total: u64 = room.iter().map(|&w| u64::from(w)).sum();
            if room.contains(&0) || total < u64::from(self.layers) {
                return None;
            }
            let mut split = vec![1u32; n];
            let mut rest = self.layers - n as u32;
            for &r in &fastest {
                let more = (room[r] - 1).min(rest);
                split[r] += more;
                rest -= more;
            }
            let sum = split.iter().enumerate().map(|(r, &l)| time(r, l)).sum();
            Some((sum, split))
        };
        // The first cap at which micro × t reaches S(t) (infeasible caps count as below).
        let (mut a, mut b) = (0usize, caps_t.len());
        while a < b {
            let mid = (a + b) / 2;
            match within(caps_t[mid]) {
                Some((sum, _)) if micro * caps_t[mid] >= sum => b = mid,
                _ => a = mid + 1,
            }
        }
        [a.checked_sub(1), Some(a)]
            .into_iter()
            .flatten()
            .filter_map(|i| caps_t.get(i))
            .filter_map(|&t| within(t))
            .map(|(_, split)| (self.round_time(order, outs, &split), split))
            .min_by(|x, y| x.0.total_cmp(&y.0))
    }

    /// The internal cost (lower is better) and split of a fixed order, for the objective.
    pub(super) fn order_cost(
        &self,
        order: &[usize],
        objective: Objective,
    ) -> Option<(f64, Vec<u32>)> {
        let outs = self.outs(order)?;
        match objective {
            Objective::Latency => self.latency_split(order, &outs),
            // One sequence: the latency split; a micro-batch on every stage: the min-max one
            // (a round is then n × the slowest stage); in between, the exact search of caps.
            Objective::Throughput => {
                let n = order.len();
                let (_, split) = if self.batch <= 1 {
                    self.latency_split(order, &outs)?
                } else if n <= self.batch as usize {
                    self.minmax(order, &outs)?
                } else {
                    return self.throughput_split(order, &outs);
                };
                Some((self.round_time(order, &outs, &split), split))
            }
        }
    }

    pub(super) fn to_assignment(
        &self,
        ctx: &Ctx<'_>,
        order: &[usize],
        split: &[u32],
    ) -> Assignment {
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
