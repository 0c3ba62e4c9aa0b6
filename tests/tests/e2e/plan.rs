//! `tbctl plan --cluster FILE`: placement against a described lab, through the real binary and
//! with no server — the same placement function the scheduler runs.

use serde_json::Value;
use tb_tests::{Tbctl, TestDir};

/// Four Macs of 64Gi (56Gi allocatable each): a fast ring m1–m2–m3–m4–m1 and two slow
/// diagonals m1–m3, m2–m4.
fn lab(macs: usize) -> String {
    let mut text = String::from("macs:\n");
    for i in 1..=macs {
        text.push_str(&format!(
            "  - {{name: m{i}, chip: Apple M4 Max, gpuCores: 40, memory: 64Gi, \
             ports: [{{name: p1}}, {{name: p2}}, {{name: p3}}]}}\n"
        ));
    }
    text.push_str("links:\n");
    let fast = [(1, 2), (2, 3), (3, 4), (4, 1)];
    for (a, b) in fast.iter().filter(|(a, b)| *a <= macs && *b <= macs) {
        text.push_str(&format!(
            "  - {{between: [m{a}/p1, m{b}/p2], bandwidthGbps: 80, latencyUs: 10, rdma: true}}\n"
        ));
    }
    for (a, b) in [(1, 3), (2, 4)]
        .iter()
        .filter(|(a, b)| *a <= macs && *b <= macs)
    {
        text.push_str(&format!(
            "  - {{between: [m{a}/p3, m{b}/p3], bandwidthGbps: 1, latencyUs: 2000}}\n"
        ));
    }
    text
}

/// 80 layers × 2.5Gi = 200Gi: more than three of these Macs hold.
const JOB: &str = "apiVersion: tb/v1
kind: Model
metadata: {name: big}
spec: {format: mlx, source: {path: /models/big}, layers: 80, bytesPerLayer: 2.5Gi,
       hiddenSize: 8192, heads: 64, kvHeads: 8, contextLength: 8192}
---
apiVersion: tb/v1
kind: InferenceService
metadata: {name: big}
spec: {model: big, executor: exec, command: [serve], parallelism: pipeline, context: 1024}
";

fn tbctl(dir: &TestDir) -> Tbctl {
    // Offline planning contacts no server; this one does not exist.
    Tbctl::new(&["127.0.0.1:1".to_string()], &dir.sub("home"))
}

fn fast(a: &str, b: &str) -> bool {
    let n = |s: &str| s.trim_start_matches('m').parse::<i32>().unwrap_or(0);
    let d = (n(a) - n(b)).abs();
    d == 1 || d == 3
}

#[tokio::test]
async fn plans_a_pipeline_along_the_fast_ring_of_a_described_lab() {
    let dir = TestDir::new("plan-ring");
    let lab = dir.write("lab.yaml", &lab(4));
    let job = dir.write("job.yaml", JOB);
    let out = tbctl(&dir)
        .run(&[
            "plan",
            "--cluster",
            lab.to_str().unwrap(),
            "-f",
            job.to_str().unwrap(),
            "-o",
            "json",
        ])
        .await;
    assert!(out.success(), "{}\n{}", out.stdout, out.stderr);
    let plans: Value = serde_json::from_str(&out.stdout).expect("json");
    let plan = &plans[0]["plan"];
    let stages = plan["stages"].as_array().expect("stages");
    let order: Vec<&str> = stages
        .iter()
        .map(|s| s["node"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(order.len(), 4, "all four Macs are needed: {order:?}");
    for w in order.windows(2) {
        assert!(
            fast(w[0], w[1]),
            "{}→{} is a slow diagonal: {order:?}",
            w[0],
            w[1]
        );
    }
    assert!(
        fast(order[3], order[0]),
        "the ring closes on a fast link: {order:?}"
    );
    assert_eq!(plan["ring"], true);
    let mut next = 0;
    for s in stages {
        assert_eq!(s["firstLayer"].as_u64(), Some(next), "{stages:?}");
        next += s["layers"].as_u64().unwrap_or(0);
        assert!(s["memoryBytes"].as_u64().unwrap_or(u64::MAX) <= 56 << 30);
    }
    assert_eq!(next, 80, "every layer placed once");
    assert!(plan["tokensPerSecond"].as_f64().unwrap_or(0.0) > 0.0);

    // The table says the same for people, with the links it uses.
    let out = tbctl(&dir)
        .run(&[
            "plan",
            "--cluster",
            lab.to_str().unwrap(),
            "-f",
            job.to_str().unwrap(),
        ])
        .await;
    assert!(out.success(), "{}", out.stderr);
    assert!(
        out.stdout.contains("pipeline over 4 Mac(s)"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("tokens/s"), "{}", out.stdout);
}

#[tokio::test]
async fn what_if_we_add_a_mac() {
    let dir = TestDir::new("plan-what-if");
    let three = dir.write("three.yaml", &lab(3));
    let four = dir.write("four.yaml", &lab(4));
    let job = dir.write("job.yaml", JOB);
    let out = tbctl(&dir)
        .run(&[
            "plan",
            "--cluster",
            three.to_str().unwrap(),
            "-f",
            job.to_str().unwrap(),
        ])
        .await;
    assert_eq!(out.code, Some(1), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("cannot be placed") && out.stdout.contains("short"),
        "{}",
        out.stdout
    );
    let out = tbctl(&dir)
        .run(&[
            "plan",
            "--cluster",
            four.to_str().unwrap(),
            "-f",
            job.to_str().unwrap(),
        ])
        .await;
    assert!(out.success(), "{}\n{}", out.stdout, out.stderr);
}

#[tokio::test]
async fn a_bad_lab_file_is_refused_with_file_line_and_field() {
    let dir = TestDir::new("plan-bad-lab");
    let bad = lab(2).replace("m2/p2]", "m2/p9]");
    let lab = dir.write("lab.yaml", &bad);
    let job = dir.write("job.yaml", JOB);
    let out = tbctl(&dir)
        .run(&[
            "plan",
            "--cluster",
            lab.to_str().unwrap(),
            "-f",
            job.to_str().unwrap(),
        ])
        .await;
    assert_eq!(out.code, Some(1));
    let expected = format!("{}:5:", lab.display());
    assert!(
        out.stderr.contains(&expected)
            && out
                .stderr
                .contains("links[0].between[1]: unknown port \"p9\" on m2"),
        "{}",
        out.stderr
    );
}
