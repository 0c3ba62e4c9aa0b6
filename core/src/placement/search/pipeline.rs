//! Exact pipeline search over at most EXACT_MAX Macs. Latency: for every (set, first, last)
//! the greedy compute split plus the cheapest Hamiltonian path by bitmask DP. Throughput: binary
//! search on the bottleneck time over the stage times that can occur, each tested by a max-sum
//! DP over (set, last Mac), then the min-max split along the path found.

use std::collections::BTreeMap;

use super::EXACT_MAX;
use super::context::Ctx;
use super::pipe_data::{FIRST, LAST, MID, ONLY, PipeData};
use crate::placement::Objective;
use crate::placement::cost::Assignment;

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

/// The best pipeline of each subset of `pd`'s Macs, best first, at most `keep` of them.
/// Latency: exact per subset. Throughput (see the cost module: a round takes the whole path,
/// or min(batch, n) × the slowest stage, whichever is longer): one sequence is the latency
/// problem, so its per-subset optima are exact; on n ≤ batch Macs a round is n × the slowest
/// stage, so the least bottleneck of each size is exact; on more Macs than sequences, every
/// (subset, first, last)'s cheapest path split exactly ([`PipeData::throughput_split`]), beside
/// those (exact on 3,000 random clusters against enumeration; in theory an order with dearer
/// hops could win by a hop's difference).
pub(super) fn pipeline_exact(ctx: &Ctx<'_>, pd: &PipeData, keep: usize) -> Vec<Assignment> {
    let m = pd.len();
    if m == 0 || m > EXACT_MAX {
        return Vec::new();
    }
    let lo = ctx.lo;
    let hi = ctx.hi.min(m).min(pd.layers as usize);
    let throughput = ctx.work.objective == Objective::Throughput;
    // Sizes at which some sequence waits for the whole path: the latency split may win.
    let latency_splits = !throughput || (pd.batch as usize) < hi;
    // Best per subset: (cost, order, split by rank), for the latency split and (throughput)
    // the cheapest path.
    let mut best: BTreeMap<usize, (f64, Vec<usize>, Vec<u32>)> = BTreeMap::new();
    let mut paths: BTreeMap<usize, (f64, Vec<usize>, Vec<u32>)> = BTreeMap::new();
    let mut mixed: BTreeMap<usize, (f64, Vec<usize>, Vec<u32>)> = BTreeMap::new();
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
                if latency_splits
                    && let Some(compute) = pd.greedy(|i| mask & (1 << i) != 0, k, s, l, &mut split)
                {
                    let t = compute + path + back;
                    if best.get(&mask).is_none_or(|b| t < b.0) {
                        let order = dp.path(mask, l);
                        let layers = order.iter().map(|&i| split[i]).collect();
                        best.insert(mask, (t, order, layers));
                    }
                }
                if throughput && pd.batch > 1 && k > pd.batch as usize {
                    // More stages than sequences: the round may be the path or the slowest
                    // stage; the cheapest path from s to l, split exactly.
                    let order = dp.path(mask, l);
                    if let Some((t, split)) = pd
                        .outs(&order)
                        .and_then(|outs| pd.throughput_split(&order, &outs))
                    {
                        offer(&mut mixed, mask, t, order, split);
                    }
                }
                if throughput {
                    // Runners-up: the cheapest path of each subset, split min-max.
                    let key = path + back;
                    if paths.get(&mask).is_none_or(|b| key < b.0) {
                        paths.insert(mask, (key, dp.path(mask, l), Vec::new()));
                    }
                }
            }
        }
    }
    let mut ranked: Vec<(f64, Vec<usize>, Vec<u32>)> = if throughput {
        // Orders with more stages than sequences (mixed rounds) get their exact split.
        let round = |order: Vec<usize>, split: Vec<u32>| {
            let outs = pd.outs(&order)?;
            if pd.batch > 1 && order.len() > pd.batch as usize {
                let (t, split) = pd.throughput_split(&order, &outs)?;
                return Some((t, order, split));
            }
            Some((pd.round_time(&order, &outs, &split), order, split))
        };
        let mut v: Vec<_> = best
            .into_values()
            .filter_map(|(_, order, split)| round(order, split))
            .collect();
        v.extend(paths.into_values().filter_map(|(_, order, _)| {
            let split = pd.minmax(&order, &pd.outs(&order)?)?.1;
            round(order, split)
        }));
        v.extend(mixed.into_values());
        // The least bottleneck of each size (a round of a full batch is n × it; a mixed
        // round often is B × it).
        let sizes = (lo.max(1)..=hi).map(|n| (n, n));
        for (a, b) in std::iter::once((lo, hi)).chain(sizes) {
            if let Some((_, order, split)) = throughput_optimum(pd, a, b) {
                v.extend(round(order, split));
            }
        }
        v
    } else {
        best.into_values().collect()
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

/// An order (fewest Macs first) whose stages, each within T, have room for every layer.
fn reachable(pd: &PipeData, t: f64, lo: usize, hi: usize) -> Option<Vec<usize>> {
    let m = pd.len();
    let need = pd.layers as i32;
    let within = |r: usize, outs: &Vec<Vec<Option<f64>>>| -> Vec<Vec<i32>> {
        (0..m)
            .map(|i| {
                (0..m)
                    .map(|j| outs[i][j].map_or(0, |o| pd.layers_within(i, r, o, t) as i32))
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
        if lo <= 1 && pd.layers_within(s, ONLY, 0.0, t) >= pd.layers {
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
