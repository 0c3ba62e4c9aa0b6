//! The emulated lab, end to end: four "Macs" (Linux network namespaces, see
//! `tb_tests::netns`) cabled as a full mesh whose ring mac1–mac3–mac2–mac4–mac1 is fast
//! (1 Gbit/s) and whose two diagonals mac1–mac2 and mac3–mac4 are slow (50 Mbit/s, 2 ms added
//! each way). The ring is deliberately not the Macs' name order: a placement that ignored the
//! measurements (every port states the same nominal 80 Gb/s) and took the Macs by name would
//! cross both slow cables. A real controller runs in the hub namespace and one real nodelet per
//! Mac, each given the lab's topology file and a probe port.
//!
//! What must come out of it:
//! - the controller joins the ports the nodelets report into six Links, and the nodelets'
//!   probes measure each one as it was shaped: every fast link faster (more than 3×) and
//!   nearer (lower round-trip p50) than every slow one, the fast ones near 1 Gbit/s;
//! - a pipeline too large for three Macs (80 layers × 2.5Gi = 200Gi; each Mac may use 56Gi)
//!   is placed on all four, in ring order: every hop, and the hop from the last Mac back to
//!   the first, is a fast cable, never a diagonal.
//!
//! Needs root, iproute2 and /dev/net/tun; anywhere else it says why and passes without running.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::Value;
use tb_tests::netns::{EmulatedLab, MacSpec, Shape};
use tb_tests::step;

/// The nodelets' `--probe-port`.
const PROBE_PORT: u16 = 7700;
/// How long the links may take to be joined and measured.
const LINKS_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the service may take to be placed.
const PLACE_TIMEOUT: Duration = Duration::from_secs(60);
/// The whole test, setup included, ends within this.
const TEST_BUDGET: Duration = Duration::from_secs(170);

const MACS: [&str; 4] = ["mac1", "mac2", "mac3", "mac4"];
/// The fast ring, not in name order (see the module documentation).
const RING: [(&str, &str); 4] = [
    ("mac1", "mac3"),
    ("mac3", "mac2"),
    ("mac2", "mac4"),
    ("mac4", "mac1"),
];
/// The slow cables: the ring's diagonals, which name order would take.
const DIAGONALS: [(&str, &str); 2] = [("mac1", "mac2"), ("mac3", "mac4")];

fn fast() -> Shape {
    Shape::mbit(1000)
}

fn slow() -> Shape {
    Shape::mbit(50).with_delay(Duration::from_millis(2))
}

/// A measured link.
#[derive(Debug, Clone)]
struct Measured {
    name: String,
    a: String,
    b: String,
    fast: bool,
    gbps: f64,
    p50_us: f64,
    p99_us: f64,
}

fn f64_of(v: &Value, what: &str) -> f64 {
    v.as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"))
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v}"))
}

/// The time left of `own`, within the test's overall budget.
fn within(started: Instant, own: Duration) -> Duration {
    own.min(TEST_BUDGET.saturating_sub(started.elapsed()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_rank_the_shaped_cables_and_a_pipeline_takes_the_fast_ring() {
    if let Some(why) = EmulatedLab::unavailable() {
        eprintln!("SKIPPED: the emulated lab cannot run here: {why}");
        return;
    }
    let started = Instant::now();
    let mut builder = EmulatedLab::builder("emulated-lab");
    for m in MACS {
        builder = builder.mac(MacSpec::new(m).memory("64Gi"));
    }
    for (a, b) in RING {
        builder = builder.cable(a, b, fast());
    }
    for (a, b) in DIAGONALS {
        builder = builder.cable(a, b, slow());
    }
    let mut lab = builder.build();
    let topology = lab.write_topology();
    step!(
        "topology file {}:\n{}",
        topology.display(),
        lab.topology_yaml()
    );

    lab.start_controller().await;
    let token = lab.create_token().await;
    lab.start_nodelets(&token, &topology, PROBE_PORT);
    lab.wait_nodes_ready(within(started, Duration::from_secs(30)))
        .await;

    // --- the links, joined and measured ------------------------------------------------------
    let links_deadline = Instant::now() + within(started, LINKS_TIMEOUT);
    let links: Vec<Value> = loop {
        let why = match lab.list("links").await {
            Ok(links) => {
                let measured = links
                    .iter()
                    .filter(|l| l["status"]["bandwidthGbps"].is_number())
                    .count();
                if links.len() == 6 && measured == 6 {
                    break links;
                }
                let errors: Vec<String> = links
                    .iter()
                    .filter_map(|l| {
                        l["status"]["error"]
                            .as_str()
                            .filter(|e| !e.is_empty())
                            .map(|e| format!("{}: {e}", l["metadata"]["name"]))
                    })
                    .collect();
                format!(
                    "{} links, {measured} measured; errors: {errors:?}",
                    links.len()
                )
            }
            Err(e) => e,
        };
        if Instant::now() > links_deadline {
            let topo = lab.tbctl(&["topology"]).await;
            panic!(
                "the 6 links were not all measured in time: {why}\n$ tbctl topology\n{}{}",
                topo.stdout, topo.stderr
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let topo = lab.tbctl_ok(&["topology"]).await;
    println!(
        "$ tbctl topology  (after {:.1}s)\n{}",
        started.elapsed().as_secs_f64(),
        topo.stdout
    );

    let mut measured = Vec::new();
    for l in &links {
        let name = str_of(&l["metadata"]["name"], "metadata.name").to_string();
        let spec = &l["spec"];
        let a = str_of(&spec["a"]["node"], "spec.a.node").to_string();
        let b = str_of(&spec["b"]["node"], "spec.b.node").to_string();
        let cable = lab
            .cable_between(&a, &b)
            .unwrap_or_else(|| panic!("link {name} joins {a} and {b}, which are not cabled"))
            .clone();
        // The Link is the cable: the ports and addresses the file gives for its two ends.
        let ends = [&cable.a, &cable.b];
        for end in ["a", "b"] {
            let node = str_of(&spec[end]["node"], "node");
            let e = ends
                .iter()
                .find(|e| e.mac == node)
                .unwrap_or_else(|| panic!("link {name}: end {end} is on {node}"));
            assert_eq!(
                spec[end]["port"],
                e.port.as_str(),
                "link {name} end {end}: {l:#}"
            );
            assert_eq!(
                spec[end]["address"],
                e.address.as_str(),
                "link {name} end {end}: {l:#}"
            );
        }
        let status = &l["status"];
        measured.push(Measured {
            name,
            a,
            b,
            fast: cable.shape == fast(),
            gbps: f64_of(&status["bandwidthGbps"], "status.bandwidthGbps"),
            p50_us: f64_of(&status["latencyUsP50"], "status.latencyUsP50"),
            p99_us: f64_of(&status["latencyUsP99"], "status.latencyUsP99"),
        });
    }
    measured.sort_by(|x, y| (!x.fast, &x.name).cmp(&(!y.fast, &y.name)));
    println!("measured links:");
    for m in &measured {
        println!(
            "  {:<5} {:<4}–{:<4} {:>7.3} Gbit/s  p50 {:>8.1} µs  p99 {:>8.1} µs  ({})",
            if m.fast { "fast" } else { "slow" },
            m.a,
            m.b,
            m.gbps,
            m.p50_us,
            m.p99_us,
            m.name
        );
    }
    let (fast_links, slow_links): (Vec<&Measured>, Vec<&Measured>) =
        measured.iter().partition(|m| m.fast);
    assert_eq!(fast_links.len(), 4, "{measured:#?}");
    assert_eq!(slow_links.len(), 2, "{measured:#?}");
    for f in &fast_links {
        assert!(
            (0.3..=1.5).contains(&f.gbps),
            "fast link {} (shaped to 1 Gbit/s) measured {} Gbit/s; all: {measured:#?}",
            f.name,
            f.gbps
        );
        for s in &slow_links {
            assert!(
                f.gbps > 3.0 * s.gbps,
                "fast link {} ({} Gbit/s) is not more than 3× slow link {} ({} Gbit/s); \
                 all: {measured:#?}",
                f.name,
                f.gbps,
                s.name,
                s.gbps
            );
            assert!(
                s.p50_us > f.p50_us,
                "slow link {} (p50 {} µs, 2 ms added each way) is not farther than fast link \
                 {} (p50 {} µs); all: {measured:#?}",
                s.name,
                s.p50_us,
                f.name,
                f.p50_us
            );
        }
    }
    for s in &slow_links {
        assert!(
            s.gbps > 0.0 && s.gbps < 0.1,
            "slow link {} (shaped to 50 Mbit/s) measured {} Gbit/s; all: {measured:#?}",
            s.name,
            s.gbps
        );
    }
    step!("links ranked as shaped");

    // --- a pipeline on the fast ring ---------------------------------------------------------
    lab.apply_yaml(
        r#"apiVersion: tb/v1
kind: Model
metadata:
  name: big
spec:
  format: gguf
  source:
    path: /models/big.gguf
  layers: 80
  bytesPerLayer: 2.5Gi
  hiddenSize: 8192
  heads: 64
  kvHeads: 8
  contextLength: 8192
---
apiVersion: tb/v1
kind: InferenceService
metadata:
  name: big
spec:
  model: big
  executor: exec
  command: [sleep, "600"]
  parallelism: pipeline
  context: 1024
"#,
    )
    .await;
    let place_deadline = Instant::now() + within(started, PLACE_TIMEOUT);
    let status = loop {
        let out = lab.tbctl(&["get", "isvc", "big", "-o", "json"]).await;
        let last = if out.success() {
            let status = out.json()["status"].clone();
            if matches!(status["phase"].as_str(), Some("Scheduled" | "Running")) {
                break status;
            }
            format!("status: {status:#}")
        } else {
            out.to_string()
        };
        if Instant::now() > place_deadline {
            panic!("isvc/big was not placed in time; last: {last}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let placement = &status["modelPlacement"];
    println!(
        "isvc/big: phase {}, nodes {}, placement {placement:#}",
        status["phase"], status["nodes"]
    );
    let nodes: Vec<String> = status["nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("no status.nodes in {status:#}"))
        .iter()
        .map(|n| str_of(n, "status.nodes[]").to_string())
        .collect();
    assert_eq!(
        nodes.len(),
        4,
        "200Gi of layers need all four Macs (56Gi each): {status:#}"
    );
    assert_eq!(
        nodes.iter().collect::<BTreeSet<_>>().len(),
        4,
        "four different Macs: {nodes:?}"
    );
    for i in 0..nodes.len() {
        let (x, y) = (&nodes[i], &nodes[(i + 1) % nodes.len()]);
        let cable = lab
            .cable_between(x, y)
            .unwrap_or_else(|| panic!("{x} and {y} are neighbours in {nodes:?} but not cabled"));
        assert!(
            cable.shape == fast(),
            "the pipeline {nodes:?} crosses the slow diagonal {x}–{y} ({} Mbit/s); placement: \
             {placement:#}",
            cable.shape.rate_mbit
        );
    }
    assert_eq!(placement["strategy"], "pipeline", "{placement:#}");
    assert_eq!(
        placement["ring"], true,
        "the last Mac is cabled back to the first: {placement:#}"
    );
    let stages = placement["stages"]
        .as_array()
        .unwrap_or_else(|| panic!("no stages in {placement:#}"));
    let stage_nodes: Vec<&str> = stages
        .iter()
        .map(|s| str_of(&s["node"], "stages[].node"))
        .collect();
    assert_eq!(
        stage_nodes, nodes,
        "stages follow the rank order: {placement:#}"
    );
    let layers: u64 = stages.iter().filter_map(|s| s["layers"].as_u64()).sum();
    assert_eq!(layers, 80, "every layer placed once: {placement:#}");
    step!(
        "pipeline placed on the fast ring {nodes:?} in {:.1}s",
        started.elapsed().as_secs_f64()
    );

    // --- the same function as a dry run, and the picture ------------------------------------
    // A second service of the same model: `tbctl plan` answers from the live cluster, where the
    // first service holds the memory, and stores nothing.
    let half = lab.write_file(
        "half.yaml",
        "apiVersion: tb/v1\nkind: InferenceService\nmetadata: {name: half}\n\
         spec: {model: big, executor: exec, command: [sleep, \"600\"], parallelism: pipeline, \
         context: 1024}\n",
    );
    let half = half.to_string_lossy().into_owned();
    let out = lab.tbctl(&["plan", "-f", &half, "-o", "json"]).await;
    // Every Mac is nearly full with the first service: the dry run refuses, saying so.
    assert_eq!(out.code, Some(1), "{out}");
    assert!(out.stdout.contains("short"), "{out}");
    let out = lab.tbctl(&["get", "isvc", "half"]).await;
    assert!(!out.success(), "a plan stores nothing: {out}");
    let out = lab.tbctl_ok(&["topology"]).await;
    for cable in lab.cables() {
        assert!(
            out.stdout.contains(&cable.a.uuid()) && out.stdout.contains(&cable.b.uuid()),
            "{out}"
        );
    }
    let out = lab.tbctl_ok(&["topology", "-o", "dot"]).await;
    assert_eq!(out.stdout.matches(" -- ").count(), 6, "{out}");
    step!("tbctl plan and topology agree");

    // --- probing again on request ---------------------------------------------------------
    let out = lab
        .tbctl_ok(&["topology", "probe", "--wait", "--timeout", "60s"])
        .await;
    assert_eq!(out.stdout.matches("probe requested").count(), 6, "{out}");
    let links = lab.tbctl_ok(&["get", "links", "-o", "json"]).await.json();
    for link in links["items"].as_array().into_iter().flatten() {
        assert_eq!(link["spec"]["probeRequest"], 1, "{link:#}");
        assert_eq!(
            link["status"]["probeRequest"], 1,
            "measured again: {link:#}"
        );
        assert!(
            link["status"]["bandwidthGbps"].as_f64().is_some(),
            "{link:#}"
        );
    }
    step!("tbctl topology probe --wait measured every link again");
    assert!(
        started.elapsed() < TEST_BUDGET,
        "the test took {:?}",
        started.elapsed()
    );
}
