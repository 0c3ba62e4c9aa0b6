//! The search above the exhaustive limit: exact solves on neighbourhoods ("pools") grown from
//! every Mac along the cables; for pipelines, greedy walks improved by local search (2-opt,
//! insert, drop); for tensor and data, the fastest Macs of each size with a bounded ring search.

use std::cmp::Ordering;
use std::collections::BTreeSet;

use super::IMPROVE_PASSES;
use super::context::{Ctx, fastest_first};
use super::pipe_data::{MID, PipeData};
use super::pipeline::pipeline_exact;
use super::rings::{RingModel, rings_exact};
use crate::placement::cost::Assignment;
use crate::placement::{Objective, Strategy};

/// Node expansions allowed to one ring search in the heuristic.
const RING_BUDGET: usize = 50_000;
/// Orders improved by local search per heuristic pipeline search.
const IMPROVED_ORDERS: usize = 4;
/// Candidates each pool contributes in the heuristic.
const PER_POOL: usize = 4;

// ---- pipeline ----

pub(super) fn pipeline_heuristic(ctx: &Ctx<'_>, pool_size: usize) -> Vec<Assignment> {
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

// ---- tensor and data ----

pub(super) fn rings_heuristic(
    ctx: &Ctx<'_>,
    strategy: Strategy,
    pool_size: usize,
) -> Vec<Assignment> {
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
