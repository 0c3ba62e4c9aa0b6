//! Ranking of candidates: best first by rate (equal to 11 significant digits counts as a tie),
//! then fewer Macs, pipeline before tensor, then names — so the search is deterministic. Also
//! the one-line description of an assignment used in alternatives and messages.

use std::cmp::Ordering;

use crate::placement::Strategy;
use crate::placement::cost::{Assignment, Cost};

pub(super) struct Found {
    pub(super) assignment: Assignment,
    pub(super) cost: Cost,
}

pub(super) fn strategy_rank(s: Strategy) -> u8 {
    match s {
        Strategy::Pipeline => 0,
        Strategy::Tensor => 1,
        Strategy::Data => 2,
        Strategy::Auto => 3,
    }
}

/// Tokens/s to 11 significant digits: rates that differ only by rounding tie.
pub(super) fn rate_key(tps: f64) -> i64 {
    if tps > 0.0 {
        (tps.ln() * 1e11).round() as i64
    } else {
        i64::MIN
    }
}

/// Best first: higher rate, then fewer Macs, pipeline before tensor, then names, then split.
pub(super) fn rank(a: &Found, b: &Found) -> Ordering {
    rate_key(b.cost.tokens_per_second)
        .cmp(&rate_key(a.cost.tokens_per_second))
        .then(a.assignment.order.len().cmp(&b.assignment.order.len()))
        .then(strategy_rank(a.assignment.strategy).cmp(&strategy_rank(b.assignment.strategy)))
        .then_with(|| a.assignment.order.cmp(&b.assignment.order))
}

/// "pipeline over a→b→c", "tensor over a,b".
pub(super) fn describe(a: &Assignment) -> String {
    let names: Vec<&str> = a.order.iter().map(|(n, _)| n.as_str()).collect();
    match a.strategy {
        Strategy::Pipeline => format!("pipeline over {}", names.join("→")),
        Strategy::Tensor => format!("tensor over {}", names.join(",")),
        Strategy::Data => format!("data over {}", names.join(",")),
        Strategy::Auto => format!("auto over {}", names.join(",")),
    }
}
