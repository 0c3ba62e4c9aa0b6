//! Placement tests: hand-checked clusters, then properties against brute force on small random
//! clusters (a seeded generator: deterministic, no extra dependency).

use std::collections::BTreeMap;

use super::cost::{Assignment, evaluate};
use super::*;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn mac(name: &str, chip: &str, free: u64, bw: f64) -> Mac {
    Mac {
        name: name.to_string(),
        chip: chip.to_string(),
        allocatable_bytes: free,
        free_bytes: free,
        memory_bandwidth_gbs: bw,
        token_overhead_us: 0.0,
        engine_measured: false,
        gpu_cores: 0,
        labels: BTreeMap::new(),
        unavailable: None,
    }
}

fn ultra(name: &str) -> Mac {
    mac(name, "Apple M3 Ultra", 448 * GIB, 819.0)
}
fn m4max(name: &str) -> Mac {
    mac(name, "Apple M4 Max", 110 * GIB, 546.0)
}
fn m4pro(name: &str) -> Mac {
    mac(name, "Apple M4 Pro", 54 * GIB, 273.0)
}

fn link(a: &str, b: &str, gbps: f64, latency_us: f64) -> (String, String, LinkInfo) {
    (
        a.to_string(),
        b.to_string(),
        LinkInfo {
            bandwidth_gbps: gbps,
            latency_us,
            rdma: true,
            cables: 1,
            measured: true,
            rdma_devices: BTreeMap::new(),
        },
    )
}

fn mesh(names: &[&str], gbps: f64, latency_us: f64) -> Vec<(String, String, LinkInfo)> {
    let mut out = Vec::new();
    for (i, a) in names.iter().enumerate() {
        for b in &names[i + 1..] {
            out.push(link(a, b, gbps, latency_us));
        }
    }
    out
}

/// 80 layers of `per_layer`, no embeddings; 8192 wide, 64 heads, 8 KV heads of 128: the KV
/// cache is 2 × 8 × 128 × context × batch × 2 bytes per layer (16 MiB at 4096 × 1).
fn model(layers: u32, per_layer: u64) -> ModelShape {
    ModelShape {
        name: "m".to_string(),
        layers,
        bytes_per_layer: per_layer,
        other_bytes: 0,
        hidden_size: 8192,
        heads: 64,
        kv_heads: 8,
        head_dim: 128,
        context: 4096,
        batch: 1,
        ..ModelShape::default()
    }
}

fn work(model: ModelShape, strategy: Strategy, objective: Objective) -> Workload {
    Workload {
        model,
        strategy,
        objective,
        min_nodes: 1,
        max_nodes: None,
        node_selector: BTreeMap::new(),
    }
}

fn assignment_of(plan: &Plan) -> Assignment {
    Assignment {
        strategy: plan.strategy,
        order: plan
            .stages
            .iter()
            .map(|s| (s.node.clone(), s.layers))
            .collect(),
    }
}

fn nodes(plan: &Plan) -> Vec<&str> {
    plan.stages.iter().map(|s| s.node.as_str()).collect()
}

fn layers(plan: &Plan) -> Vec<u32> {
    plan.stages.iter().map(|s| s.layers).collect()
}

/// The plan's numbers are evaluate's, its stages fit, its layers are contiguous and complete.
fn check_plan(topo: &Topology, w: &Workload, plan: &Plan) {
    let cost = evaluate(topo, w, &assignment_of(plan)).expect("the plan is feasible");
    assert_eq!(plan.stages, cost.stages);
    assert_eq!(plan.tokens_per_second, cost.tokens_per_second);
    assert_eq!(plan.time_per_token_us, cost.time_per_token_us);
    assert_eq!(plan.compute_us, cost.compute_us);
    assert_eq!(plan.network_us, cost.network_us);
    assert_eq!(plan.ring, cost.ring);
    assert_ne!(plan.strategy, Strategy::Auto);
    for s in &plan.stages {
        let m = topo.mac(&s.node).expect("known Mac");
        assert!(s.memory_bytes <= m.free_bytes, "{} over its memory", s.node);
        assert!(m.unavailable.is_none());
    }
    if plan.strategy == Strategy::Pipeline {
        let mut next = 0;
        for s in &plan.stages {
            assert_eq!(s.first_layer, next);
            assert!(s.layers >= 1);
            next += s.layers;
        }
        assert_eq!(next, w.model.layers);
    }
    for alt in &plan.alternatives {
        if let Some(t) = alt.tokens_per_second {
            assert!(t <= plan.tokens_per_second * (1.0 + 1e-9), "{alt:?}");
        }
    }
}

fn place(topo: &Topology, w: &Workload) -> Plan {
    let plan = plan(topo, w, &Options::default()).expect("placeable");
    check_plan(topo, w, &plan);
    plan
}

#[test]
fn a_model_that_fits_the_ultra_stays_there_for_latency() {
    let topo = Topology::new(
        vec![ultra("ultra"), m4max("max"), m4pro("pro")],
        mesh(&["ultra", "max", "pro"], 80.0, 50.0),
    );
    // 80 × 0.85 GiB = 68 GiB: fits every Mac but the Pro.
    let w = work(model(80, 870 * MIB), Strategy::Pipeline, Objective::Latency);
    let plan = place(&topo, &w);
    assert_eq!(nodes(&plan), ["ultra"]);
    assert_eq!(plan.network_us, 0.0);
    // 80 × (870 + 16) MiB read at 819 GB/s.
    let expect = (80 * 886 * MIB) as f64 / 819e9 * 1e6;
    assert!(
        (plan.time_per_token_us - expect).abs() < 1e-6,
        "{}",
        plan.time_per_token_us
    );
    assert!(
        plan.alternatives
            .iter()
            .any(|a| a.reason.starts_with("slower"))
    );
}

#[test]
fn a_model_needing_two_macs_puts_more_layers_on_the_faster() {
    let topo = Topology::new(
        vec![ultra("ultra"), m4max("max"), m4pro("pro")],
        mesh(&["ultra", "max", "pro"], 80.0, 50.0),
    );
    // 80 × 6 GiB = 480 GiB. A layer with its KV cache is 6160 MiB; the overhead is 640 MiB
    // (512 runtime + 4 × 8192 × 2048 × 2 workspace). The Ultra holds
    // ⌊(458752 − 640) / 6160⌋ = 74 layers; the rest go to the Max, faster than the Pro.
    let w = work(model(80, 6 * GIB), Strategy::Pipeline, Objective::Latency);
    assert_eq!(w.model.overhead_bytes(), 640 * MIB);
    assert_eq!(w.model.kv_bytes_per_layer(), 16 * MIB);
    let plan = place(&topo, &w);
    let mut got: Vec<(&str, u32)> = nodes(&plan).into_iter().zip(layers(&plan)).collect();
    got.sort();
    assert_eq!(got, [("max", 6), ("ultra", 74)]);
    assert!(plan.ring, "two linked Macs close the ring");
    // One hop of 8192 × 2 bytes at 80 Gb/s and 25 µs, and 25 µs back.
    let hop = 25.0 + 16384.0 * 8.0 / 80e9 * 1e6;
    assert!(
        (plan.network_us - (hop + 25.0)).abs() < 1e-9,
        "{}",
        plan.network_us
    );
}

#[test]
fn throughput_balances_the_stages() {
    let topo = Topology::new(
        vec![m4max("a"), m4max("b")],
        vec![link("a", "b", 80.0, 50.0)],
    );
    let mut w = work(model(80, GIB), Strategy::Pipeline, Objective::Throughput);
    w.min_nodes = 2;
    w.model.batch = 2;
    let plan = place(&topo, &w);
    // Equal Macs: an even split.
    assert_eq!(layers(&plan), [40, 40]);
    // Two sequences, one per stage: a round is two turns of the slowest stage, so the pair
    // of Macs decodes the batch no faster than one Mac alone would (weights are read once per
    // sequence either way), not twice as fast.
    let stage = plan.stages[0].compute_us;
    assert!(
        (plan.time_per_token_us - 2.0 * (stage + plan.network_us / 2.0)).abs() < 1e-6,
        "{plan:?}"
    );
    assert!(plan.tokens_per_second < 1.01 * 1e6 / stage, "{plan:?}");
}

/// One sequence at a time keeps one stage of a pipeline busy: its throughput is its latency's
/// rate, whatever the split, and a stage's worth of speed is not promised.
#[test]
fn one_sequence_through_a_pipeline_is_as_fast_as_its_path() {
    let topo = Topology::new(
        vec![m4max("a"), m4pro("b")],
        vec![link("a", "b", 80.0, 50.0)],
    );
    let mut w = work(model(40, GIB), Strategy::Pipeline, Objective::Throughput);
    w.min_nodes = 2;
    let throughput = place(&topo, &w);
    w.objective = Objective::Latency;
    let latency = place(&topo, &w);
    assert!(
        (throughput.tokens_per_second - latency.tokens_per_second).abs()
            < 1e-9 * latency.tokens_per_second,
        "{throughput:?}\n{latency:?}"
    );
    // The faster Mac takes all the layers it can: the sum of the stages is what counts.
    assert_eq!(layers(&throughput), layers(&latency));
}

#[test]
fn a_partial_mesh_is_followed() {
    // A chain a–b–c–d: only this order (or its reverse) links every hop.
    let names = ["a", "b", "c", "d"];
    let topo = Topology::new(
        names.iter().map(|n| m4pro(n)).collect(),
        vec![
            link("a", "b", 80.0, 50.0),
            link("b", "c", 80.0, 50.0),
            link("c", "d", 80.0, 50.0),
        ],
    );
    // 80 × 2 GiB needs three Pros at least; force all four.
    let mut w = work(model(80, 2 * GIB), Strategy::Pipeline, Objective::Latency);
    w.min_nodes = 4;
    let plan = place(&topo, &w);
    assert!(nodes(&plan) == ["a", "b", "c", "d"] || nodes(&plan) == ["d", "c", "b", "a"]);
    assert!(!plan.ring);
    // Three hops, and the token back over three links (3 × 25 µs).
    let hop = 25.0 + 16384.0 * 8.0 / 80e9 * 1e6;
    assert!((plan.network_us - (3.0 * hop + 75.0)).abs() < 1e-9);
    // A tensor plan needs a ring or a mesh.
    let t = Assignment {
        strategy: Strategy::Tensor,
        order: names.iter().map(|n| (n.to_string(), 80)).collect(),
    };
    let err = evaluate(&topo, &w, &t).expect_err("no ring");
    assert!(err.reason.contains("no link d–a"), "{}", err.reason);
}

#[test]
fn a_slow_link_is_avoided_when_a_ring_of_fast_links_exists() {
    let names = ["a", "b", "c", "d"];
    let mut links: Vec<_> = [("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")]
        .iter()
        .map(|(x, y)| link(x, y, 80.0, 50.0))
        .collect();
    links.push(link("a", "c", 1.0, 1000.0));
    let topo = Topology::new(names.iter().map(|n| m4pro(n)).collect(), links);
    for objective in [Objective::Latency, Objective::Throughput] {
        let mut w = work(model(80, 2 * GIB), Strategy::Pipeline, objective);
        w.min_nodes = 4;
        let plan = place(&topo, &w);
        let order = nodes(&plan);
        for i in 0..4 {
            let pair = [order[i], order[(i + 1) % 4]];
            assert!(pair != ["a", "c"] && pair != ["c", "a"], "{order:?}");
        }
        assert!(plan.ring);
    }
}

#[test]
fn the_kv_cache_reserve_pushes_a_layer_off_a_nearly_full_mac() {
    let topo = Topology::new(
        vec![
            mac("fast", "Apple M3 Ultra", 41 * GIB, 819.0),
            m4max("slow"),
        ],
        vec![link("fast", "slow", 80.0, 50.0)],
    );
    // 20 layers of 2 GiB: with 4096 tokens of context (16 MiB/layer) the fast Mac holds
    // ⌊(41984 − 640) / 2064⌋ = 20 layers: all of them.
    let short = work(model(20, 2 * GIB), Strategy::Pipeline, Objective::Latency);
    let plan = place(&topo, &short);
    assert_eq!(nodes(&plan), ["fast"]);
    // At 32768 tokens a layer's KV cache is 128 MiB and the overhead unchanged:
    // ⌊(41984 − 640) / 2176⌋ = 19 layers fit; one goes to the other Mac.
    let mut long = short.clone();
    long.model.context = 32768;
    assert_eq!(long.model.kv_bytes_per_layer(), 128 * MIB);
    let plan = place(&topo, &long);
    let mut got: Vec<(&str, u32)> = nodes(&plan).into_iter().zip(layers(&plan)).collect();
    got.sort();
    assert_eq!(got, [("fast", 19), ("slow", 1)]);
    assert!(
        plan.alternatives
            .iter()
            .any(|a| a.description == "pipeline over fast" && a.reason.contains("short")),
        "{:?}",
        plan.alternatives
    );
}

#[test]
fn tensor_over_three_macs_with_eight_kv_heads_costs_the_busiest_rank() {
    // tb's engine gives the first two ranks 3 KV heads and the third 2: placed, every Mac
    // costed as one with 3 of the 8.
    let names = ["a", "b", "c"];
    let topo = Topology::new(
        names.iter().map(|n| ultra(n)).collect(),
        mesh(&names, 80.0, 50.0),
    );
    let mut w = work(model(80, GIB), Strategy::Tensor, Objective::Latency);
    w.min_nodes = 3;
    w.max_nodes = Some(3);
    let p = plan(&topo, &w, &Options::default()).expect("3 Macs over 8 KV heads");
    assert_eq!(p.stages.len(), 3);
    let rank = w.model.tensor_rank(3);
    let even = (80 * GIB).div_ceil(3);
    assert!(
        rank.weight > even && rank.weight < 80 * GIB * 3 / 8,
        "the busiest rank holds more than a third of the blocks and less than 3/8: {rank:?}"
    );
    assert!(p.stages.iter().all(|s| s.weight_bytes == rank.weight));
    let a = Assignment {
        strategy: Strategy::Tensor,
        order: names.iter().map(|n| (n.to_string(), 80)).collect(),
    };
    let cost = evaluate(&topo, &w, &a).expect("3 Macs over 8 KV heads");
    assert!((cost.tokens_per_second - p.tokens_per_second).abs() < 1e-9 * p.tokens_per_second);
}

#[test]
fn smollm2_splits_over_two_macs_as_the_engine_does() {
    // 3 KV heads over 2 Macs: 2 + 1, which the divisibility rule refused.
    let names = ["a", "b"];
    let topo = Topology::new(
        names.iter().map(|n| m4pro(n)).collect(),
        mesh(&names, 80.0, 10.0),
    );
    let smollm2 = ModelShape {
        context: 2048,
        ..super::memory::tests::smollm2()
    };
    let mut w = work(smollm2, Strategy::Tensor, Objective::Latency);
    w.min_nodes = 2;
    let p = place(&topo, &w);
    assert_eq!(p.stages.len(), 2);
    let rank = w.model.tensor_rank(2);
    assert!(
        p.stages.iter().all(|s| s.weight_bytes == rank.weight),
        "{p:?}"
    );
}

#[test]
fn tensor_is_refused_over_more_macs_than_kv_heads() {
    let names = ["a", "b", "c"];
    let topo = Topology::new(
        names.iter().map(|n| ultra(n)).collect(),
        mesh(&names, 80.0, 50.0),
    );
    let mut m = model(80, GIB);
    (m.heads, m.kv_heads) = (16, 2);
    let mut w = work(m, Strategy::Tensor, Objective::Latency);
    w.min_nodes = 3;
    w.max_nodes = Some(3);
    let err = plan(&topo, &w, &Options::default()).expect_err("3 Macs, 2 KV heads");
    assert!(
        err.message.contains("more than the model's 2 KV heads"),
        "{}",
        err.message
    );
    let a = Assignment {
        strategy: Strategy::Tensor,
        order: names.iter().map(|n| (n.to_string(), 80)).collect(),
    };
    let e = evaluate(&topo, &w, &a).expect_err("3 Macs, 2 KV heads");
    assert!(e.reason.contains("2 KV heads"), "{}", e.reason);
    // Auto on three Macs says why tensor lost.
    w.strategy = Strategy::Auto;
    let auto = place(&topo, &w);
    assert_eq!(auto.strategy, Strategy::Pipeline);
    assert!(
        auto.alternatives
            .iter()
            .any(|a| a.description.starts_with("tensor") && a.reason.contains("2 KV heads")),
        "{:?}",
        auto.alternatives
    );
    // Latent attention has no KV heads to give out: the Macs must divide the heads.
    let mut m = model(80, GIB);
    m.latent_kv = 576;
    w.model = m;
    w.strategy = Strategy::Tensor;
    let err = plan(&topo, &w, &Options::default()).expect_err("3 ∤ 64 heads");
    assert!(
        err.message.contains("divide") && err.message.contains("KV heads (8)"),
        "{}",
        err.message
    );
}

#[test]
fn tensor_wins_on_two_fast_macs_when_links_are_fast() {
    let topo = Topology::new(
        vec![ultra("a"), ultra("b")],
        vec![link("a", "b", 80.0, 10.0)],
    );
    let w = work(model(80, GIB), Strategy::Auto, Objective::Latency);
    let plan = place(&topo, &w);
    // Pipeline on one Ultra: 80 GiB + KV at 819 GB/s ≈ 106 ms; tensor halves the reads for
    // 2 × 80 all-reduces of 2 × (5 µs + ...) ≈ 1.6 ms.
    assert_eq!(plan.strategy, Strategy::Tensor);
    assert!(plan.ring);
    assert_eq!(plan.stages.len(), 2);
}

#[test]
fn data_parallel_training_uses_every_replica_that_fits() {
    let names = ["a", "b", "c"];
    let mut macs: Vec<Mac> = names.iter().map(|n| m4max(n)).collect();
    macs.push(m4pro("small"));
    let topo = Topology::new(macs, mesh(&["a", "b", "c", "small"], 80.0, 50.0));
    // 60 GiB of weights: the Pro (54 GiB) cannot hold a replica. (Left to itself the model
    // keeps one replica: all-reducing 60 GiB of gradients over Thunderbolt costs more than the
    // step; three replicas are asked for here.)
    let mut w = work(model(60, GIB), Strategy::Data, Objective::Throughput);
    assert_eq!(place(&topo, &w).stages.len(), 1);
    w.min_nodes = 3;
    let plan = place(&topo, &w);
    assert_eq!(plan.strategy, Strategy::Data);
    let mut got = nodes(&plan);
    got.sort();
    assert_eq!(got, ["a", "b", "c"]);
    assert!(plan.ring);
}

#[test]
fn ineligible_macs_are_named_in_the_refusal() {
    let mut cordoned = ultra("mac4");
    cordoned.unavailable = Some("cordoned".to_string());
    let mut unlabelled = ultra("mac5");
    unlabelled.labels.insert("rack".into(), "b".into());
    let mut small = m4pro("mac1");
    small.labels.insert("rack".into(), "a".into());
    let topo = Topology::new(
        vec![small, cordoned, unlabelled],
        mesh(&["mac1", "mac4", "mac5"], 80.0, 50.0),
    );
    let mut w = work(model(80, GIB), Strategy::Auto, Objective::Latency);
    w.model.name = "llama".to_string();
    w.node_selector.insert("rack".into(), "a".into());
    let err = plan(&topo, &w, &Options::default()).expect_err("too big for mac1");
    assert!(
        err.message
            .starts_with("model llama needs 80Gi for weights + 1.2Gi KV cache"),
        "{}",
        err.message
    );
    assert!(
        err.message
            .ends_with("not eligible: mac4 cordoned, mac5 lacks label rack=a"),
        "{}",
        err.message
    );
    // 80 GiB + 1.25 GiB + 640 MiB needed, 54 GiB free.
    assert_eq!(
        err.short_bytes,
        Some(80 * GIB + 1280 * MIB + 640 * MIB - 54 * GIB)
    );
    let a = Assignment {
        strategy: Strategy::Pipeline,
        order: vec![("mac4".into(), 80)],
    };
    let e = evaluate(&topo, &w, &a).expect_err("cordoned");
    assert_eq!(e.reason, "mac4 cordoned");
}

#[test]
fn memory_short_on_a_set_is_reported() {
    let topo = Topology::new(vec![m4pro("a")], vec![]);
    let w = work(model(80, GIB), Strategy::Pipeline, Objective::Latency);
    let a = Assignment {
        strategy: Strategy::Pipeline,
        order: vec![("a".into(), 80)],
    };
    let e = evaluate(&topo, &w, &a).expect_err("short");
    // 80 × 1040 MiB + 640 MiB = 83840 MiB; 55296 MiB free.
    assert_eq!(e.short_bytes, Some((83840 - 55296) * MIB));
    assert!(e.reason.starts_with("a: 27.9Gi short"), "{}", e.reason);
}

#[test]
fn topology_merges_cables_and_ignores_bad_links() {
    let mut one = link("a", "b", 80.0, 40.0);
    one.2
        .rdma_devices
        .insert("a".into(), vec!["rdma_en3".into()]);
    let mut two = link("b", "a", 80.0, 30.0);
    two.2.rdma = false;
    two.2.measured = false;
    two.2
        .rdma_devices
        .insert("a".into(), vec!["rdma_en4".into()]);
    let topo = Topology::new(
        vec![m4pro("b"), m4pro("a")],
        vec![
            one,
            two,
            link("a", "zz", 80.0, 5.0),
            link("a", "a", 80.0, 5.0),
        ],
    );
    assert_eq!(topo.len(), 2);
    assert_eq!(topo.graph.edge_count(), 1);
    let l = topo.link("b", "a").expect("merged link");
    assert_eq!(l.bandwidth_gbps, 160.0);
    assert_eq!(l.latency_us, 30.0);
    assert!(!l.rdma && !l.measured);
    assert_eq!(l.cables, 2);
    assert_eq!(l.rdma_devices["a"], ["rdma_en3", "rdma_en4"]);
    let names: Vec<&str> = topo.macs().iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
}

#[test]
fn topology_from_a_lab_file() {
    let lab = tb_api::lab::LabFile::parse(
        "lab.yaml",
        "\
macs:
  - name: s1
    chip: Apple M3 Ultra
    memory: 512Gi
    ports:
      - {name: tb1, rdmaDevice: rdma_en3, speedGbps: 80}
      - {name: tb2, rdmaDevice: rdma_en4}
  - name: s2
    chip: Apple M4 Max
    gpuCores: 40
    memory: 128Gi
    free: 100Gi
    unschedulable: true
    labels: {rack: a}
    ports:
      - {name: tb1, rdmaDevice: rdma_en5, speedGbps: 120}
      - {name: tb2}
links:
  - {between: [s1/tb1, s2/tb1], rdma: true}
  - {between: [s1/tb2, s2/tb2], bandwidthGbps: 40, latencyUs: 200}
",
    )
    .expect("valid lab");
    let topo = Topology::from_lab(&lab);
    let s1 = topo.mac("s1").expect("s1");
    assert_eq!(s1.memory_bandwidth_gbs, 819.0);
    assert_eq!(s1.free_bytes, 448 * GIB);
    let s2 = topo.mac("s2").expect("s2");
    assert_eq!(s2.unavailable.as_deref(), Some("cordoned"));
    assert_eq!(s2.free_bytes, 100 * GIB);
    assert_eq!(s2.memory_bandwidth_gbs, 546.0);
    assert_eq!(s2.labels["rack"], "a");
    let l = topo.link("s1", "s2").expect("linked");
    // 80 (the slower port) + 40; latency min(50 default for RDMA, 200).
    assert_eq!(l.bandwidth_gbps, 120.0);
    assert_eq!(l.latency_us, 50.0);
    assert_eq!(l.cables, 2);
    assert!(!l.rdma && !l.measured);
    assert_eq!(l.rdma_devices["s1"], ["rdma_en3"]);
    assert_eq!(l.rdma_devices["s2"], ["rdma_en5"]);
}

#[test]
fn model_shape_from_spec() {
    use tb_api::Quantity;
    use tb_api::specs::ModelSpec;
    let q = |s: &str| Some(Quantity::parse(s).expect("quantity"));
    let spec = ModelSpec {
        layers: Some(80),
        bytes_per_layer: q("1Gi"),
        total_bytes: q("82Gi"),
        hidden_size: Some(8192),
        heads: Some(64),
        kv_heads: Some(8),
        context_length: Some(8192),
        ..ModelSpec::default()
    };
    let m = ModelShape::from_spec("llama", &spec, None, Some(2)).expect("shape");
    assert_eq!(
        (m.other_bytes, m.head_dim, m.context, m.batch),
        (2 * GIB, 128, 8192, 2)
    );
    assert_eq!(m.weight_bytes(), 82 * GIB);
    assert_eq!(m.kv_bytes_per_layer(), 2 * 8 * 128 * 8192 * 2 * 2);
    assert_eq!(m.activation_bytes(4), 8192 * 4 * 2);
    // Only the total: embeddings estimated from the vocabulary, the rest split over layers.
    let only_total = ModelSpec {
        layers: Some(10),
        total_bytes: q("10Gi"),
        vocab_size: Some(32768),
        hidden_size: Some(4096),
        ..ModelSpec::default()
    };
    let m = ModelShape::from_spec("x", &only_total, Some(1024), None).expect("shape");
    assert_eq!(m.other_bytes, 2 * 32768 * 4096 * 2);
    assert_eq!(m.bytes_per_layer, (10 * GIB - m.other_bytes) / 10);
    assert_eq!((m.heads, m.kv_heads, m.context), (32, 32, 1024));
    let no_layers = ModelSpec {
        total_bytes: q("10Gi"),
        ..ModelSpec::default()
    };
    assert_eq!(
        ModelShape::from_spec("llama", &no_layers, None, None),
        Err("model llama: spec.layers is required to place it".to_string())
    );
    let no_size = ModelSpec {
        layers: Some(4),
        ..ModelSpec::default()
    };
    let err = ModelShape::from_spec("llama", &no_size, None, None).expect_err("no size");
    assert!(
        err.contains("bytesPerLayer") && err.contains("totalBytes"),
        "{err}"
    );
}

#[test]
fn head_size_latent_attention_windows_and_experts_size_the_model() {
    use tb_api::Quantity;
    use tb_api::specs::ModelSpec;
    let q = |s: &str| Some(Quantity::parse(s).expect("quantity"));
    // Qwen3-32B: 64 heads of 128 in a 5120-wide model (not 5120 / 64 = 80).
    let qwen = ModelSpec {
        layers: Some(64),
        total_bytes: q("61Gi"),
        hidden_size: Some(5120),
        heads: Some(64),
        kv_heads: Some(8),
        head_dim: Some(128),
        ..ModelSpec::default()
    };
    let m = ModelShape::from_spec("qwen3", &qwen, Some(1000), None).expect("shape");
    assert_eq!(m.kv_bytes_per_layer(), 2 * 8 * 128 * 1000 * 2);
    // DeepSeek-V3: one latent of 512 + 64 per token and layer, whatever its 128 heads.
    let deepseek = ModelSpec {
        layers: Some(61),
        total_bytes: q("640Gi"),
        hidden_size: Some(7168),
        heads: Some(128),
        kv_heads: Some(128),
        kv_lora_rank: Some(512),
        qk_rope_head_dim: Some(64),
        experts: Some(256),
        experts_per_token: Some(8),
        active_bytes: q("32Gi"),
        ..ModelSpec::default()
    };
    let m = ModelShape::from_spec("deepseek", &deepseek, Some(1000), None).expect("shape");
    assert_eq!(m.kv_bytes_per_layer(), 576 * 1000 * 2);
    // A token reads 32/640 of the weights.
    let read = m.read_bytes_per_layer() as f64 / m.bytes_per_layer as f64;
    assert!((read - 0.05).abs() < 0.001, "{read}");
    // gpt-oss: 18 of 36 layers cache 128 tokens, the others the whole 4096.
    let gpt_oss = ModelSpec {
        layers: Some(36),
        total_bytes: q("60Gi"),
        hidden_size: Some(2880),
        heads: Some(64),
        kv_heads: Some(8),
        head_dim: Some(64),
        sliding_window: Some(128),
        sliding_window_layers: Some(18),
        ..ModelSpec::default()
    };
    let m = ModelShape::from_spec("gpt-oss", &gpt_oss, Some(4096), None).expect("shape");
    assert_eq!(m.kv_bytes_per_layer(), 2 * 8 * 64 * ((4096 + 128) / 2) * 2);
    assert_eq!(m.read_bytes_per_layer(), m.bytes_per_layer);
}

#[test]
fn a_mixture_of_experts_decodes_at_the_speed_of_its_active_weights() {
    let dense = model(8, 4 * GIB);
    let moe = ModelShape {
        active_bytes_per_layer: Some(GIB),
        ..model(8, 4 * GIB)
    };
    let topo = Topology::new(vec![m4pro("a")], vec![]);
    let predict = |m: ModelShape| {
        place(&topo, &work(m, Strategy::Pipeline, Objective::Latency)).tokens_per_second
    };
    let (d, e) = (predict(dense), predict(moe));
    assert!(e > 3.0 * d, "dense {d} tokens/s, MoE {e}");
}

#[test]
fn cable_order_follows_the_cables() {
    let names = ["a", "b", "c", "d", "e"];
    // The ring a–c–e–b–d–a.
    let links = [("a", "c"), ("c", "e"), ("e", "b"), ("b", "d"), ("d", "a")]
        .iter()
        .map(|(x, y)| link(x, y, 80.0, 50.0))
        .collect();
    let topo = Topology::new(names.iter().map(|n| m4pro(n)).collect(), links);
    let given: Vec<String> = ["e", "d", "c", "b", "a", "a"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let (order, ring) = cable_order(&topo, &given);
    assert!(ring);
    assert_eq!(order, ["a", "a", "c", "e", "b", "d"]);
    // Nine Macs on a ring, given shuffled: the heuristic finds the ring.
    let n = 9;
    let names: Vec<String> = (0..n).map(|i| format!("m{i}")).collect();
    let links = (0..n)
        .map(|i| link(&names[i], &names[(i + 4) % n], 80.0, 50.0))
        .collect();
    let topo = Topology::new(names.iter().map(|n| m4pro(n)).collect(), links);
    let (order, ring) = cable_order(&topo, &names);
    assert!(ring, "{order:?}");
    for i in 0..n {
        assert!(
            topo.link(&order[i], &order[(i + 1) % n]).is_some(),
            "{order:?}"
        );
    }
}

// ---- properties against brute force ----

/// xorshift64*: deterministic test data without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn random_case(rng: &mut Rng) -> (Topology, Workload) {
    let n = 2 + rng.below(4).max(rng.below(4)) as usize; // 2..=5 Macs, mostly 4 or 5
    let layers = if n == 5 {
        3 + rng.below(6)
    } else {
        3 + rng.below(10)
    } as u32;
    let names: Vec<String> = (0..n).map(|i| format!("m{i}")).collect();
    let macs = names
        .iter()
        .map(|name| {
            let roomy = rng.below(2);
            let mut m = mac(
                name,
                "",
                (2 + rng.below(14 + 16 * roomy)) * GIB,
                rng.pick(&[120.0, 273.0, 546.0, 819.0]),
            );
            if rng.chance(8) {
                m.unavailable = Some("not Ready".into());
            }
            if rng.chance(85) {
                m.labels.insert("pool".into(), "a".into());
            }
            m
        })
        .collect();
    let mut links = Vec::new();
    for i in 0..n {
        for j in i + 1..n {
            if rng.chance(65) {
                links.push(link(
                    &names[i],
                    &names[j],
                    rng.pick(&[1.0, 10.0, 40.0, 80.0]),
                    rng.pick(&[5.0, 50.0, 300.0, 1000.0]),
                ));
            }
        }
    }
    let heads = rng.pick(&[8, 12, 16]);
    let model = ModelShape {
        name: "r".into(),
        layers,
        bytes_per_layer: (1 + rng.below(8)) * GIB / 2,
        other_bytes: rng.below(3) * GIB,
        hidden_size: heads * 128,
        heads,
        kv_heads: rng.pick(&[1, 2, 4, heads]),
        head_dim: 128,
        context: rng.pick(&[512, 4096, 32768]),
        batch: rng.pick(&[1, 2, 4]),
        ..ModelShape::default()
    };
    let mut w = work(
        model,
        rng.pick(&[
            Strategy::Auto,
            Strategy::Pipeline,
            Strategy::Tensor,
            Strategy::Data,
        ]),
        rng.pick(&[Objective::Latency, Objective::Throughput]),
    );
    w.min_nodes = rng.pick(&[1, 1, 2, 3]);
    w.max_nodes = rng.pick(&[None, None, Some(2), Some(3)]);
    if rng.chance(20) {
        w.node_selector.insert("pool".into(), "a".into());
    }
    (topo_of(macs, links), w)
}

fn topo_of(macs: Vec<Mac>, links: Vec<(String, String, LinkInfo)>) -> Topology {
    Topology::new(macs, links)
}

/// Every composition of `total` into `parts` positive parts.
fn compositions(total: u32, parts: usize, out: &mut Vec<Vec<u32>>, cur: &mut Vec<u32>) {
    if parts == 1 {
        cur.push(total);
        out.push(cur.clone());
        cur.pop();
        return;
    }
    for first in 1..=total.saturating_sub(parts as u32 - 1) {
        cur.push(first);
        compositions(total - first, parts - 1, out, cur);
        cur.pop();
    }
}

/// Every ordered subset of `names`.
fn arrangements(names: &[String], cur: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    if !cur.is_empty() {
        out.push(cur.clone());
    }
    for n in names {
        if !cur.contains(n) {
            cur.push(n.clone());
            arrangements(names, cur, out);
            cur.pop();
        }
    }
}

/// The best rate over every assignment `evaluate` accepts.
fn brute_force(topo: &Topology, w: &Workload) -> Option<f64> {
    let names: Vec<String> = topo.macs().iter().map(|m| m.name.clone()).collect();
    let mut orders = Vec::new();
    arrangements(&names, &mut Vec::new(), &mut orders);
    let strategies = match w.strategy {
        Strategy::Auto => vec![Strategy::Pipeline, Strategy::Tensor],
        s => vec![s],
    };
    let mut best: Option<f64> = None;
    for order in &orders {
        for &s in &strategies {
            let splits = if s == Strategy::Pipeline {
                let mut out = Vec::new();
                if order.len() <= w.model.layers as usize {
                    compositions(w.model.layers, order.len(), &mut out, &mut Vec::new());
                }
                out
            } else {
                vec![vec![w.model.layers; order.len()]]
            };
            for split in splits {
                let a = Assignment {
                    strategy: s,
                    order: order.iter().cloned().zip(split).collect(),
                };
                if let Ok(c) = evaluate(topo, w, &a) {
                    best =
                        Some(best.map_or(c.tokens_per_second, |b: f64| b.max(c.tokens_per_second)));
                }
            }
        }
    }
    best
}

#[test]
fn plans_are_optimal_and_consistent_on_small_random_clusters() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (mut placed, mut refused) = (0, 0);
    for case in 0..300 {
        let (topo, w) = random_case(&mut rng);
        let brute = brute_force(&topo, &w);
        match (plan(&topo, &w, &Options::default()), brute) {
            (Ok(p), Some(b)) => {
                check_plan(&topo, &w, &p);
                assert!(
                    p.tokens_per_second >= b * (1.0 - 1e-9),
                    "case {case}: plan {} tok/s < brute force {b} tok/s\n{w:?}\n{p:?}",
                    p.tokens_per_second
                );
                placed += 1;
            }
            (Err(e), None) => {
                assert!(!e.message.is_empty());
                refused += 1;
            }
            (Ok(p), None) => panic!("case {case}: plan found but brute force did not: {p:?}"),
            (Err(e), Some(b)) => panic!(
                "case {case}: refused ({}) but {b} tok/s exists\n{w:?}",
                e.message
            ),
        }
        // The heuristic (forced) yields valid plans, never better than the optimum.
        let heuristic = Options {
            exhaustive_limit: case % 3,
            keep_alternatives: 3,
        };
        if let Ok(p) = plan(&topo, &w, &heuristic) {
            check_plan(&topo, &w, &p);
            let b = brute.expect("a feasible plan exists");
            assert!(p.tokens_per_second <= b * (1.0 + 1e-9));
        }
    }
    // The generator must exercise both outcomes.
    assert!(
        placed > 20 && refused > 5,
        "placed {placed}, refused {refused}"
    );
}

#[test]
fn plans_are_deterministic() {
    let mut rng = Rng(7);
    for _ in 0..10 {
        let (topo, w) = random_case(&mut rng);
        let a = plan(&topo, &w, &Options::default());
        let b = plan(&topo, &w, &Options::default());
        assert_eq!(a, b);
    }
}

// ---- scale ----

/// 64 Macs of three kinds, each cabled to the next, the one after, and the one 8 further (a
/// Thunderbolt Mac has ~6 ports).
fn big_cluster(n: usize) -> Topology {
    let names: Vec<String> = (0..n).map(|i| format!("mac{i:02}")).collect();
    let macs = names
        .iter()
        .enumerate()
        .map(|(i, name)| match i % 3 {
            0 => ultra(name),
            1 => m4max(name),
            _ => m4pro(name),
        })
        .collect();
    let mut links = Vec::new();
    for i in 0..n {
        for step in [1, 2, 8] {
            if step < n {
                let j = (i + step) % n;
                links.push(link(
                    &names[i],
                    &names[j],
                    80.0,
                    5.0 + (i % 7) as f64 * 10.0,
                ));
            }
        }
    }
    Topology::new(macs, links)
}

/// 80 layers of 12 GiB: ~960 GiB, several Macs needed.
fn big_model() -> ModelShape {
    model(80, 12 * GIB)
}

#[test]
fn sixty_four_macs_get_a_valid_plan() {
    let topo = big_cluster(64);
    for objective in [Objective::Latency, Objective::Throughput] {
        let w = work(big_model(), Strategy::Auto, objective);
        let plan = place(&topo, &w);
        assert!(plan.stages.len() >= 3, "{:?}", nodes(&plan));
    }
}

#[test]
#[ignore = "timing: run with --release -- --ignored --nocapture"]
fn solve_time_at_8_and_64_macs() {
    for (n, full_mesh) in [(8, false), (8, true), (64, false)] {
        let mut topo = big_cluster(n);
        if full_mesh {
            let names: Vec<String> = topo.macs().iter().map(|m| m.name.clone()).collect();
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let macs = topo.macs().into_iter().cloned().collect();
            topo = Topology::new(macs, mesh(&refs, 80.0, 20.0));
        }
        for objective in [Objective::Latency, Objective::Throughput] {
            for strategy in [Strategy::Pipeline, Strategy::Auto] {
                let w = work(big_model(), strategy, objective);
                let start = std::time::Instant::now();
                let plan = place(&topo, &w);
                let took = start.elapsed();
                println!(
                    "{n} Macs{}, {strategy:?} {objective:?}: {:.2} ms, {} stages, {:.2} tok/s",
                    if full_mesh { " (mesh)" } else { "" },
                    took.as_secs_f64() * 1e3,
                    plan.stages.len(),
                    plan.tokens_per_second
                );
            }
        }
    }
}

#[test]
fn a_tied_head_is_held_by_both_ends_and_read_whole() {
    let topo = Topology::new(vec![ultra("a"), ultra("b")], mesh(&["a", "b"], 80.0, 50.0));
    let shaped = |tied: bool| {
        let mut m = model(10, GIB);
        m.other_bytes = 2 * GIB;
        m.tied_embeddings = tied;
        work(m, Strategy::Pipeline, Objective::Latency)
    };
    let split = |order: &[(&str, u32)]| Assignment {
        strategy: Strategy::Pipeline,
        order: order.iter().map(|(n, l)| (n.to_string(), *l)).collect(),
    };
    let layers_and_kv = |l: u64| l * (GIB + 16 * MIB);
    for (tied, embed, head) in [(false, GIB, GIB), (true, 2 * GIB, 2 * GIB)] {
        let w = shaped(tied);
        // One Mac holds the table (and head) once, and reads the head per token.
        let one = evaluate(&topo, &w, &split(&[("a", 10)])).expect("fits");
        assert_eq!(
            one.stages[0].weight_bytes,
            10 * GIB + 2 * GIB,
            "tied {tied}"
        );
        let read = (layers_and_kv(10) + head) as f64 / 819e9 * 1e6;
        assert!(
            (one.compute_us - read).abs() < 1e-6,
            "tied {tied}: {}",
            one.compute_us
        );
        // Two: the first holds the embeddings, the last the head (tied: each the whole table).
        let two = evaluate(&topo, &w, &split(&[("a", 5), ("b", 5)])).expect("fits");
        let held: Vec<u64> = two.stages.iter().map(|s| s.weight_bytes).collect();
        assert_eq!(held, [5 * GIB + embed, 5 * GIB + head], "tied {tied}");
        let last = (layers_and_kv(5) + head) as f64 / 819e9 * 1e6;
        assert!(
            (two.stages[1].compute_us - last).abs() < 1e-6,
            "tied {tied}"
        );
    }
}
