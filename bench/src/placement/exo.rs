//! exo's placement, re-implemented from exo's source (exo-explore/exo,
//! `src/exo/master/placement.py`, `placement_utils.py`, `src/exo/shared/topology.py`):
//!
//! 1. Candidates are the simple cycles of the topology (exo's graph is directed with an edge
//!    each way per connection, so every cabled pair is a 2-cycle) plus every single Mac, with
//!    at least `min_nodes` Macs.
//! 2. Keep those whose Macs' available memory sums to at least the model's weights
//!    (`storage_size`; no KV cache, no overhead).
//! 3. Keep the smallest (fewest Macs); of these prefer RDMA cycles (every cabled pair in the
//!    set has an RDMA link), as exo does when it places over JACCL.
//! 4. Take the one with most total available memory (then one with a leaf Mac; then the first).
//! 5. Split layers in proportion to each Mac's available memory (largest remainder, every Mac
//!    at least one layer) and check each Mac holds its share of the weights; rank order is the
//!    cycle order.
//!
//! Differences, all immaterial to the plan's cost: exo enumerates every simple cycle with
//! rustworkx (exponential on a mesh) and keeps the first maximum in that order; this walks Mac
//! subsets by size and takes the first Hamiltonian cycle of each subset in name order, which
//! gives the same sets and sizes. Download progress (exo's first key) is taken as equal.

use tb_core::placement::cost::Assignment;
use tb_core::placement::{Strategy, Topology, Workload};

/// What exo decides.
#[derive(Debug, Clone, PartialEq)]
pub enum ExoPlan {
    /// A cycle with a layer split, in rank order.
    Placed(Assignment),
    /// exo raises: no cycle with enough memory (or the split does not hold).
    NoPlan(String),
}

/// exo's placement for a pipeline of this workload.
pub fn place(topology: &Topology, workload: &Workload) -> ExoPlan {
    let macs: Vec<_> = topology
        .macs()
        .into_iter()
        .filter(|m| m.unavailable.is_none())
        .collect();
    let n = macs.len();
    let linked = |i: usize, j: usize| topology.link(&macs[i].name, &macs[j].name).is_some();
    let rdma = |i: usize, j: usize| {
        topology
            .link(&macs[i].name, &macs[j].name)
            .is_some_and(|l| l.rdma)
    };
    let degree = |i: usize| (0..n).filter(|&j| j != i && linked(i, j)).count();
    let required = workload.model.weight_bytes();
    let min = workload.min_nodes.max(1) as usize;

    // Smallest cycles with enough memory: walk sizes upwards, stop at the first that has any.
    let mut smallest: Vec<Vec<usize>> = Vec::new();
    for k in min..=n {
        for subset in combinations(n, k) {
            let memory: u64 = subset.iter().map(|&i| macs[i].free_bytes).sum();
            if memory < required {
                continue;
            }
            if let Some(cycle) = hamiltonian_cycle(&subset, &linked) {
                smallest.push(cycle);
            }
        }
        if !smallest.is_empty() {
            break;
        }
    }
    if smallest.is_empty() {
        return ExoPlan::NoPlan("no cycle with enough memory".into());
    }

    let is_rdma = |cycle: &[usize]| {
        cycle
            .iter()
            .all(|&i| cycle.iter().all(|&j| i == j || !linked(i, j) || rdma(i, j)))
    };
    let rdma_cycles: Vec<_> = smallest.iter().filter(|c| is_rdma(c)).cloned().collect();
    let pool = if rdma_cycles.is_empty() {
        smallest
    } else {
        rdma_cycles
    };
    let key = |cycle: &Vec<usize>| {
        let memory: u64 = cycle.iter().map(|&i| macs[i].free_bytes).sum();
        let leaf = cycle.iter().any(|&i| degree(i) <= 1);
        (memory, leaf)
    };
    // Python's max keeps the first of equal keys.
    let mut selected = &pool[0];
    for cycle in &pool[1..] {
        if key(cycle) > key(selected) {
            selected = cycle;
        }
    }

    let memory: Vec<u64> = selected.iter().map(|&i| macs[i].free_bytes).collect();
    let total_memory: u64 = memory.iter().sum();
    if total_memory == 0 {
        return ExoPlan::NoPlan("total available memory is 0".into());
    }
    let layers = workload.model.layers;
    let fractions: Vec<f64> = memory
        .iter()
        .map(|&m| m as f64 / total_memory as f64)
        .collect();
    let split = match allocate_layers_proportionally(layers, &fractions) {
        Ok(s) => s,
        Err(e) => return ExoPlan::NoPlan(e),
    };
    for (pos, (&i, &l)) in selected.iter().zip(&split).enumerate() {
        let need = (required as u128 * l as u128 / layers as u128) as u64;
        if need > macs[i].free_bytes {
            return ExoPlan::NoPlan(format!(
                "node {pos} ({}) has insufficient memory for {l} layers",
                macs[i].name
            ));
        }
    }
    ExoPlan::Placed(Assignment {
        strategy: Strategy::Pipeline,
        order: selected
            .iter()
            .zip(split)
            .map(|(&i, l)| (macs[i].name.clone(), l))
            .collect(),
    })
}

/// exo's `allocate_layers_proportionally`: floor each share, hand out the remainder by largest
/// fractional part (stable), then give every Mac with none one layer from the largest.
pub fn allocate_layers_proportionally(total: u32, fractions: &[f64]) -> Result<Vec<u32>, String> {
    let n = fractions.len();
    if n == 0 {
        return Err("cannot allocate layers to an empty node list".into());
    }
    if (total as usize) < n {
        return Err(format!("cannot distribute {total} layers across {n} nodes"));
    }
    let raw: Vec<f64> = fractions.iter().map(|f| f * total as f64).collect();
    let mut result: Vec<u32> = raw.iter().map(|r| r.floor() as u32).collect();
    let mut by_remainder: Vec<usize> = (0..n).collect();
    // Stable sort, descending remainder: equal remainders keep index order, as Python's
    // sorted(reverse=True) does.
    by_remainder.sort_by(|&a, &b| {
        let (ra, rb) = (raw[a] - result[a] as f64, raw[b] - result[b] as f64);
        rb.partial_cmp(&ra).unwrap_or(std::cmp::Ordering::Equal)
    });
    let assigned: u32 = result.iter().sum();
    for k in 0..total.saturating_sub(assigned) as usize {
        result[by_remainder[k % n]] += 1;
    }
    for i in 0..n {
        if result[i] == 0 {
            let mut max_idx = 0;
            for j in 1..n {
                if result[j] > result[max_idx] {
                    max_idx = j;
                }
            }
            if result[max_idx] <= 1 {
                return Err("no layer to move to an empty node".into());
            }
            result[max_idx] -= 1;
            result[i] = 1;
        }
    }
    Ok(result)
}

/// Every k-subset of 0..n, in lexicographic order.
fn combinations(n: usize, k: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    if k == 0 || k > n {
        return out;
    }
    let mut idx: Vec<usize> = (0..k).collect();
    loop {
        out.push(idx.clone());
        let mut i = k;
        while i > 0 && idx[i - 1] == n - k + i - 1 {
            i -= 1;
        }
        if i == 0 {
            return out;
        }
        idx[i - 1] += 1;
        for j in i..k {
            idx[j] = idx[j - 1] + 1;
        }
    }
}

/// A cycle through every Mac of `subset` (a single Mac is one; two cabled Macs are one), found
/// by depth-first search from the subset's first Mac in index order.
fn hamiltonian_cycle(
    subset: &[usize],
    linked: &impl Fn(usize, usize) -> bool,
) -> Option<Vec<usize>> {
    match subset.len() {
        0 => None,
        1 => Some(subset.to_vec()),
        2 => linked(subset[0], subset[1]).then(|| subset.to_vec()),
        _ => {
            let mut path = vec![subset[0]];
            let mut used = vec![false; subset.len()];
            used[0] = true;
            extend(subset, linked, &mut path, &mut used).then_some(path)
        }
    }
}

fn extend(
    subset: &[usize],
    linked: &impl Fn(usize, usize) -> bool,
    path: &mut Vec<usize>,
    used: &mut [bool],
) -> bool {
    let last = path[path.len() - 1];
    if path.len() == subset.len() {
        return linked(last, path[0]);
    }
    for (pos, &v) in subset.iter().enumerate() {
        if used[pos] || !linked(last, v) {
            continue;
        }
        used[pos] = true;
        path.push(v);
        if extend(subset, linked, path, used) {
            return true;
        }
        path.pop();
        used[pos] = false;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proportional_split_matches_exo() {
        // exo's own test: 3 nodes at 1/6, 2/6, 3/6 of 12 layers.
        let s = allocate_layers_proportionally(12, &[1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0]);
        assert_eq!(s, Ok(vec![2, 4, 6]));
        // A tiny share still gets one layer, taken from the largest.
        let s = allocate_layers_proportionally(10, &[0.01, 0.99]);
        assert_eq!(s, Ok(vec![1, 9]));
        assert!(allocate_layers_proportionally(2, &[0.3, 0.3, 0.4]).is_err());
    }

    #[test]
    fn cycles_of_a_chain_are_pairs() {
        let linked = |a: usize, b: usize| a.abs_diff(b) == 1;
        assert_eq!(hamiltonian_cycle(&[0, 1], &linked), Some(vec![0, 1]));
        assert_eq!(hamiltonian_cycle(&[0, 1, 2], &linked), None);
        let ring = |a: usize, b: usize| a.abs_diff(b) == 1 || a.abs_diff(b) == 3;
        assert_eq!(
            hamiltonian_cycle(&[0, 1, 2, 3], &ring),
            Some(vec![0, 1, 2, 3])
        );
        assert_eq!(combinations(4, 2).len(), 6);
    }
}
