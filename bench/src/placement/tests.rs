//! Checks of the bench itself: the enumeration's DP against every composition on tiny
//! clusters, and tb against exo and the optimum on three small suite cases.

use std::collections::BTreeMap;

use tb_core::placement::cost::{Assignment, evaluate};
use tb_core::placement::{ModelShape, Objective, Strategy, Topology, Workload};

use super::brute::{self, Optimum};
use super::compare::{self, OptOutcome};
use super::suite::{self, Cable, Chip, link, mac};

const GIB: u64 = 1 << 30;

fn tiny_model(layers: u32, batch: u32) -> ModelShape {
    ModelShape {
        name: "tiny".into(),
        layers,
        bytes_per_layer: 3 * GIB,
        other_bytes: 2 * GIB,
        hidden_size: 4096,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        context: 8192,
        batch,
        ..ModelShape::default()
    }
}

fn with_free(name: &str, chip: Chip, free_gib: u64) -> tb_core::placement::Mac {
    let mut m = mac(name, chip);
    m.free_bytes = free_gib * GIB;
    m
}

/// Tiny clusters whose best split is not obvious: small free memory, mixed bandwidth, a chain
/// (return hop relayed) and a slow link.
fn tiny_clusters() -> Vec<Topology> {
    let chain = Topology::new(
        vec![
            with_free("a", Chip::Max128, 10),
            with_free("b", Chip::Pro64, 14),
            with_free("c", Chip::Ultra256, 9),
            with_free("d", Chip::Max48, 12),
        ],
        vec![
            link("a", "b", Cable::Tb5Rdma),
            link("b", "c", Cable::Tb4Tcp),
            link("c", "d", Cable::Tb5Rdma),
        ],
    );
    let mesh = Topology::new(
        vec![
            with_free("a", Chip::Pro48, 16),
            with_free("b", Chip::Max36, 12),
            with_free("c", Chip::M2Ultra192, 13),
        ],
        vec![
            link("a", "b", Cable::Tb5Rdma),
            link("b", "c", Cable::Tb5Rdma),
            link("a", "c", Cable::Ethernet10),
        ],
    );
    vec![chain, mesh]
}

/// Every composition of `total` into `parts` positive parts.
fn compositions(total: u32, parts: usize) -> Vec<Vec<u32>> {
    if parts == 1 {
        return vec![vec![total]];
    }
    let mut out = Vec::new();
    for first in 1..=total.saturating_sub(parts as u32 - 1) {
        for mut rest in compositions(total - first, parts - 1) {
            rest.insert(0, first);
            out.push(rest);
        }
    }
    out
}

/// Every ordering of every non-empty subset of `names`.
fn orders(names: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut stack: Vec<Vec<String>> = names.iter().map(|n| vec![n.clone()]).collect();
    while let Some(p) = stack.pop() {
        for n in names {
            if !p.contains(n) {
                let mut q = p.clone();
                q.push(n.clone());
                stack.push(q);
            }
        }
        out.push(p);
    }
    out
}

#[test]
fn dp_matches_full_enumeration() {
    for topology in tiny_clusters() {
        let names: Vec<String> = topology.macs().iter().map(|m| m.name.clone()).collect();
        // Batches of 1, 2 and 4 on up to 3 Macs: a round bound by the path, mixed, and by
        // the slowest stage.
        let cases = [(Objective::Latency, 4), (Objective::Throughput, 1)]
            .into_iter()
            .chain([(Objective::Throughput, 2), (Objective::Throughput, 4)]);
        for (objective, batch) in cases {
            for layers in [5, 7] {
                let workload = Workload {
                    model: tiny_model(layers, batch),
                    strategy: Strategy::Pipeline,
                    objective,
                    min_nodes: 1,
                    max_nodes: None,
                    node_selector: BTreeMap::new(),
                };
                let mut best: Option<f64> = None;
                for order in orders(&names) {
                    if order.len() > layers as usize {
                        continue;
                    }
                    for split in compositions(layers, order.len()) {
                        let a = Assignment {
                            strategy: Strategy::Pipeline,
                            order: order.iter().cloned().zip(split).collect(),
                        };
                        if let Ok(c) = evaluate(&topology, &workload, &a) {
                            best = Some(
                                best.map_or(c.tokens_per_second, |b| b.max(c.tokens_per_second)),
                            );
                        }
                    }
                }
                let found = match brute::optimum(&topology, &workload) {
                    Optimum::Best {
                        assignment,
                        time_us,
                        ..
                    } => {
                        let c = evaluate(&topology, &workload, &assignment)
                            .expect("the optimum is feasible");
                        assert!(
                            (c.time_per_token_us - time_us).abs() < 1e-6 * time_us,
                            "DP {time_us} vs evaluate {}",
                            c.time_per_token_us
                        );
                        Some(c.tokens_per_second)
                    }
                    Optimum::NothingFits => None,
                    Optimum::TooMany(n) => panic!("{n} Macs is enumerable"),
                };
                match (best, found) {
                    (Some(b), Some(f)) => assert!(
                        (b - f).abs() <= 1e-9 * b,
                        "{objective:?} {layers} layers: enumeration {b}, DP {f}"
                    ),
                    (b, f) => assert_eq!(b.is_some(), f.is_some(), "{objective:?} {layers}"),
                }
            }
        }
    }
}

#[test]
fn tb_beats_exo_and_meets_the_optimum_on_small_cases() {
    let wanted = [
        "fast-small-vs-slow-big",
        "llama8b-128k-batch4",
        "mesh4-70b-throughput",
    ];
    let cases: Vec<_> = suite::cases()
        .into_iter()
        .filter(|c| wanted.contains(&c.name))
        .collect();
    assert_eq!(cases.len(), wanted.len());
    for case in &cases {
        let r = compare::run(case);
        let tb = r
            .tb_rate()
            .unwrap_or_else(|| panic!("{}: tb did not place: {:?}", r.name, r.tb));
        if let Some(exo) = r.exo_rate() {
            assert!(tb >= exo * (1.0 - 1e-9), "{}: tb {tb} < exo {exo}", r.name);
        }
        match &r.opt {
            OptOutcome::Best(p) => assert!(
                tb >= p.tokens_per_second * 0.98,
                "{}: tb {tb} vs optimum {}",
                r.name,
                p.tokens_per_second
            ),
            other => panic!("{}: no optimum: {other:?}", r.name),
        }
    }
}

#[test]
fn the_suite_is_large_and_named_once() {
    let cases = suite::cases();
    assert!(cases.len() >= 20);
    let mut names: Vec<_> = cases.iter().map(|c| c.name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), cases.len());
    assert!(cases.iter().all(|c| (1..=16).contains(&c.macs())));
    // Throughput needs sequences in flight to fill the pipeline.
    assert!(
        cases
            .iter()
            .filter(|c| c.workload.objective == Objective::Throughput)
            .all(|c| c.workload.model.batch >= 2)
    );
}
