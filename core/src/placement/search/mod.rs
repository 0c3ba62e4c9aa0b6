//! The search: the assignment [`evaluate`] rates best, the runners-up, and — when nothing fits —
//! a reason a person can act on. Also [`cable_order`], the rank order that follows the cables
//! for jobs whose Macs are already chosen.
//!
//! Up to `Options::exhaustive_limit` eligible Macs (at most [`EXACT_MAX`]) the search is exact:
//! - pipeline, latency: for a set of Macs and its first and last Mac, the compute time does not
//!   depend on the order in between and the best split is a greedy fill (fastest Macs first, up
//!   to their memory, every Mac ≥ 1 layer), while the hops depend only on the order: the best
//!   Hamiltonian path between first and last, by bitmask DP. Every (set, first, last) is tried.
//! - pipeline, throughput: a round is min(batch, n) × the slowest stage or the whole path,
//!   whichever is longer. With one sequence that is the latency problem. With n ≤ batch it is
//!   n × the bottleneck, and the least bottleneck T* of each size n is one of the finitely many
//!   stage times (Mac, layers, outgoing hop); a T is reachable iff some path of n Macs has, with
//!   every stage capped at T, room for all layers — a max-sum DP over (set, last Mac). Binary
//!   search on T, then the min-max split (greedy: the next layer goes where it finishes
//!   soonest) along that path. With more stages than sequences, each (set, first, last)'s
//!   cheapest path is split exactly by a search over stage-time caps.
//! - tensor and data: every set of Macs (the cost depends on the set and on the ring's slowest
//!   link), with the ring found by branch and bound over Hamiltonian cycles.
//!
//! Above the limit the search is a heuristic: exact solves on neighbourhoods ("pools") grown
//! from every Mac; for pipelines, greedy walks along the cables improved by local search
//! (2-opt, insert, drop); for tensor and data, the fastest Macs of each size with a bounded
//! ring search. Everything is deterministic: Macs are visited by name and ties go to fewer
//! Macs, then names.
//!
//! Files: `context` (the eligible Macs and the count bounds), `rank` (which candidate wins),
//! `pipe_data` (per-Mac figures of pipeline search), `pipeline` (exact pipeline search),
//! `rings` (tensor and data rings), `heuristic` (above the exhaustive limit), `diagnose`
//! (runners-up and refusals), `cable_order` (rank order of chosen Macs).

mod cable_order;
mod context;
mod diagnose;
mod heuristic;
mod pipe_data;
mod pipeline;
mod rank;
mod rings;

use super::cost::{Assignment, evaluate};
use super::topology::Topology;
use super::{Options, Plan, Strategy, Unplaceable, Workload};

pub use self::cable_order::cable_order;
use context::Ctx;
use diagnose::{alternatives, unplaceable};
use heuristic::{pipeline_heuristic, rings_heuristic};
use pipe_data::PipeData;
use pipeline::pipeline_exact;
use rank::{Found, rank};
use rings::rings_exact;

/// Exact searches cost O(2^n n³); past this many Macs a set is never searched exactly.
pub const EXACT_MAX: usize = 12;
/// Improvement passes of local search (2-opt, insert, drop) over one order.
const IMPROVE_PASSES: usize = 8;

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
