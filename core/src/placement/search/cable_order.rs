//! The rank order for jobs whose Macs are already chosen (exec jobs): the order that follows
//! the cables best, and whether it closes into a ring.

use std::collections::BTreeMap;

use super::IMPROVE_PASSES;
use crate::placement::cost::{hop_us, usable};
use crate::placement::topology::Topology;

/// cable_order tries every order up to this many distinct Macs.
const CABLE_EXHAUSTIVE: usize = 8;
/// cable_order weighs links by the time of a message this big (1 MiB): latency and bandwidth.
const CABLE_MESSAGE_BYTES: u64 = 1 << 20;

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
