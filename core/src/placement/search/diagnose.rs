//! Explanations: the runners-up a plan keeps (slower candidates, and instructive ones that do
//! not run), and — when nothing fits — an Unplaceable message a person can act on, with the
//! bytes missing when memory is the cause.

use std::collections::BTreeSet;

use super::cable_order;
use super::context::{Ctx, fastest_first};
use super::rank::{Found, describe, rate_key, strategy_rank};
use super::rings::RingModel;
use crate::placement::cost::{Assignment, Infeasible, evaluate, fmt_bytes};
use crate::placement::topology::Mac;
use crate::placement::{Alternative, Strategy, Unplaceable};

// ---- alternatives ----

pub(super) fn alternatives(ctx: &Ctx<'_>, found: &[Found], keep: usize) -> Vec<Alternative> {
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
                // Three significant digits, so that close rates still read as different.
                format!(
                    "slower: {} vs {} tok/s ({:.1} % less)",
                    sig3(tps),
                    sig3(best_tps),
                    (1.0 - tps / best_tps) * 100.0
                )
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

// ---- when nothing fits ----

pub(super) fn unplaceable(ctx: &Ctx<'_>, strategies: &[Strategy]) -> Unplaceable {
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
                let k = u32::try_from(ctx.lo.max(2)).unwrap_or(u32::MAX);
                format!(
                    "model {name}: {}; {} Macs are allowed (pipeline or auto would place it)",
                    crate::placement::cost::tensor_refusal(model, k),
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

/// A rate with three significant digits: 0.123, 1.85, 41.2, 512.
fn sig3(x: f64) -> String {
    let digits = if x >= 100.0 {
        0
    } else if x >= 10.0 {
        1
    } else if x >= 1.0 {
        2
    } else {
        3
    };
    format!("{x:.digits$}")
}
