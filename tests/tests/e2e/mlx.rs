//! Real MLX through tb: distributed MLX programs whose ranks find each other only through what
//! tb hands them (MLX_RANK and the ring hostfile in MLX_HOSTFILE), with no mlx.launch and no
//! ssh; the shipped example `manifests/trainingjob-mlx-allreduce.yaml` applied as written; and
//! `tbctl hostfile`, whose output mlx.launch itself accepts, running the example's script.
//!
//! The Python comes from `$TB_TEST_PYTHON`, else `<workspace>/.venv/bin/python`, and must be
//! able to `import mlx.core` (`pip install 'mlx[cpu]'` works on Linux x86-64); when it cannot,
//! these tests fail and say how to make one.
//!
//! About mlx.launch on one machine: MLX 0.32's `launch.py` runs a rank through ssh unless the
//! hostfile entry's `ssh` host is exactly `127.0.0.1`, in which case it runs the rank locally
//! with bash. tb's hostfile names each Mac by its nodelet's host, which in these tests is
//! `127.0.0.1`, so mlx.launch runs every rank here without ssh. (mlx.launch picks the ring
//! ports itself, from `--starting-port`, and uses only the `ips` of tb's hostfile.)

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tb_tests::lab::{self, Lab, LabOptions, port_block};
use tb_tests::step;

/// Python processes importing MLX on a loaded 2-core machine take a while.
const MLX_TIMEOUT: Duration = Duration::from_secs(90);

/// A TrainingJob of `ranks` ranks running `mlx_allreduce.py` over MLX's ring backend.
fn allreduce_job(name: &str, ranks: u32, python: &Path) -> String {
    let command = json!([
        python.display().to_string(),
        lab::manifest("mlx_allreduce.py").display().to_string()
    ]);
    format!(
        "apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: {name}
spec:
  ranks: {ranks}
  memory: 256Mi
  backend: ring
  backoffLimit: 0
  activeDeadlineSeconds: 120
  command: {command}
"
    )
}

/// `mlx_allreduce.py` sums rank+1 over 2 and over 3 ranks and checks the result; every rank
/// says `ok`. The ranks connect over the ports tb assigned, read from tb's hostfile alone.
#[tokio::test]
async fn allreduce_runs_over_the_ring_tb_sets_up() {
    let python = lab::mlx_python();
    assert!(lab::manifest("mlx_allreduce.py").is_file());
    let lab = Lab::start("mlx-allreduce", 3).await;
    // One job at a time: five Python processes importing MLX at once would only make a loaded
    // machine slower.
    for (name, ranks) in [("allreduce-2", 2u32), ("allreduce-3", 3)] {
        lab.apply_yaml(&allreduce_job(name, ranks, &python)).await;
        let status = lab.wait_job_phase(name, "Succeeded", MLX_TIMEOUT).await;
        step!("{name}: {status}");
        assert_eq!(status["epoch"], 1, "no restart: {status:#}");
        let allocs = lab.allocations(name).await;
        assert_eq!(allocs.len(), ranks as usize);
        let hosts = allocs[0]["spec"]["mlx"]["hosts"]
            .as_array()
            .expect("mlx.hosts")
            .clone();
        assert_eq!(hosts.len(), ranks as usize, "{hosts:?}");
        let expected = f64::from(ranks * (ranks + 1) / 2);
        for rank in 0..ranks {
            let out = lab
                .tbctl_ok(&["logs", name, "--rank", &rank.to_string()])
                .await;
            let want =
                format!("rank {rank} of {ranks}: all_sum = {expected}, expected {expected}: ok");
            assert!(
                out.stdout.lines().any(|l| l == want),
                "rank {rank} of {name} should print {want:?}: {out}"
            );
            // The environment MLX read: tb's ring hostfile for this job.
            let a = &allocs[rank as usize];
            assert_eq!(a["status"]["exitCode"], 0, "{a:#}");
            let node = lab.nodelet(lab.index_of(a["spec"]["node"].as_str().expect("node")));
            let file = node.alloc_dir("default", a["metadata"]["name"].as_str().expect("name"));
            let ring: Value = serde_json::from_str(
                &std::fs::read_to_string(file.join("hostfile.json")).expect("hostfile.json"),
            )
            .expect("JSON");
            let want_ring: Vec<Vec<Value>> = hosts.iter().map(|h| vec![h.clone()]).collect();
            assert_eq!(ring, json!(want_ring));
        }
    }
}

/// The example as shipped: `tbctl apply -f manifests/trainingjob-mlx-allreduce.yaml` on nodelets
/// started with `--python` (the venv with MLX). `python3` runs that Python, the relative
/// `mlx_allreduce.py` is found beside the manifest, the two ranks land on two Macs, and both
/// check the all-reduce.
#[tokio::test]
async fn the_shipped_example_runs_as_written() {
    let python = lab::mlx_python();
    let manifest = lab::manifest("trainingjob-mlx-allreduce.yaml");
    let text = std::fs::read_to_string(&manifest).expect("the example");
    assert!(
        text.contains(r#"command: ["python3", "mlx_allreduce.py"]"#),
        "the test runs the example as users read it:\n{text}"
    );
    let opts = LabOptions {
        nodelet_args: vec!["--python".into(), python.display().to_string()],
        ..LabOptions::new(2)
    };
    let lab = Lab::start_with("mlx-example", opts).await;
    lab.tbctl_ok(&["apply", "-f", &manifest.display().to_string()])
        .await;
    let status = lab
        .wait_job_phase("mlx-allreduce", "Succeeded", MLX_TIMEOUT)
        .await;
    step!("mlx-allreduce: {status}");
    assert_eq!(status["epoch"], 1, "no restart: {status:#}");
    let allocs = lab.allocations("mlx-allreduce").await;
    let mut nodes: Vec<&str> = allocs
        .iter()
        .map(|a| a["spec"]["node"].as_str().expect("node"))
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    assert_eq!(nodes.len(), 2, "two ranks on two Macs: {allocs:#?}");
    let out = lab.tbctl_ok(&["logs", "mlx-allreduce"]).await;
    for rank in 0..2 {
        let want = format!("rank {rank} of 2: all_sum = 3, expected 3: ok");
        assert!(
            lab::rank_lines(&out.stdout, rank).contains(&want),
            "rank {rank} should print {want:?}: {out}"
        );
    }
}

/// `tbctl hostfile JOB` for a placed 2-rank job: the JSON mlx.launch reads (backend, envs,
/// hosts with ssh/ips/rdma) in rank order, consistent with the ring hostfile the ranks got; MLX's
/// own hostfile parser reads it; and `mlx.launch --hostfile` runs the example's
/// `mlx_allreduce.py` from it on this machine, the group size coming from MLX alone (no
/// TB_WORLD_SIZE).
#[tokio::test]
async fn tbctl_hostfile_drives_mlx_launch() {
    let python = lab::mlx_python();
    let mlx_launch = python.with_file_name("mlx.launch");
    assert!(
        mlx_launch.is_file(),
        "{} is missing: the venv's MLX should install it next to {}",
        mlx_launch.display(),
        python.display()
    );
    let lab = Lab::start("mlx-hostfile", 2).await;
    lab.apply_yaml(
        "apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: placed
spec:
  ranks: 2
  memory: 64Mi
  backend: ring
  command: [\"sleep\", \"60\"]
",
    )
    .await;
    let status = lab
        .wait_job_phase("placed", "Running", Duration::from_secs(30))
        .await;
    let allocs = lab.allocations("placed").await;
    let hosts: Vec<String> = allocs[0]["spec"]["mlx"]["hosts"]
        .as_array()
        .expect("hosts")
        .iter()
        .map(|h| h.as_str().expect("host").to_string())
        .collect();
    step!("placed: {status}; ring {hosts:?}");

    // mlx.launch's JSON, to a file.
    let file = lab.dir().join("hostfile.json");
    let file_arg = file.display().to_string();
    lab.tbctl_ok(&["hostfile", "placed", "-o", &file_arg]).await;
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).expect("hostfile"))
        .expect("the hostfile is JSON");
    let ips: Vec<Value> = hosts
        .iter()
        .map(|h| json!([h.rsplit_once(':').expect("ip:port").0]))
        .collect();
    assert_eq!(doc["backend"], "ring", "{doc:#}");
    assert_eq!(doc["envs"], json!([]), "{doc:#}");
    let entries = doc["hosts"].as_array().expect("hosts");
    assert_eq!(entries.len(), 2, "{doc:#}");
    for (rank, h) in entries.iter().enumerate() {
        assert_eq!(h["ssh"], "127.0.0.1", "the nodelet's host: {doc:#}");
        assert_eq!(h["ips"], ips[rank], "rank {rank} listens there: {doc:#}");
        assert_eq!(h["rdma"], json!([]), "no RDMA for the ring: {doc:#}");
    }
    // The ring form is exactly what each rank got as MLX_HOSTFILE.
    let ring = lab
        .tbctl_ok(&["hostfile", "placed", "--format", "ring"])
        .await;
    let ring: Value = serde_json::from_str(ring.stdout.trim()).expect("ring JSON");
    assert_eq!(
        ring,
        json!(hosts.iter().map(|h| vec![h]).collect::<Vec<_>>())
    );
    for a in &allocs {
        let node = lab.nodelet(lab.index_of(a["spec"]["node"].as_str().expect("node")));
        let dir = node.alloc_dir("default", a["metadata"]["name"].as_str().expect("name"));
        let given: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("hostfile.json")).expect("the rank's hostfile"),
        )
        .expect("JSON");
        assert_eq!(given, ring, "rank {} got another ring", a["spec"]["rank"]);
    }

    // MLX's own parser (what mlx.launch calls) reads it back unchanged.
    let parsed = tokio::process::Command::new(&python)
        .args([
            "-c",
            "import json, sys\n\
             from mlx._distributed_utils.common import Hostfile\n\
             print(json.dumps(Hostfile.from_file(sys.argv[1]).to_json()))",
            &file_arg,
        ])
        .output()
        .await
        .expect("python");
    assert!(
        parsed.status.success(),
        "MLX's Hostfile.from_file rejected tb's hostfile: {}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    let parsed: Value = serde_json::from_slice(&parsed.stdout).expect("JSON");
    assert_eq!(parsed, doc, "MLX reads tb's hostfile as written");

    // mlx.launch runs the example's script over a 2-rank ring from it, locally (ssh host
    // 127.0.0.1), on ports of its own, in the script's directory as its docstring says.
    let (port, _) = port_block(2);
    let python_arg = python.display().to_string();
    let port_arg = port.to_string();
    let mut launch = tokio::process::Command::new(&mlx_launch);
    launch
        .args([
            "--hostfile",
            &file_arg,
            "--backend",
            "ring",
            "--starting-port",
            &port_arg,
            "--",
            &python_arg,
            "mlx_allreduce.py",
        ])
        .current_dir(lab::manifest("."))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TB_") {
            launch.env_remove(k);
        }
    }
    let launch = launch.output();
    let out = tokio::time::timeout(MLX_TIMEOUT, launch)
        .await
        .unwrap_or_else(|_| panic!("mlx.launch did not finish within {MLX_TIMEOUT:?}"))
        .expect("running mlx.launch");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    step!("mlx.launch exited {}:\n{stdout}{stderr}", out.status);
    assert!(
        out.status.success(),
        "mlx.launch failed:\n{stdout}\n{stderr}"
    );
    for rank in 0..2 {
        let want = format!("rank {rank} of 2: all_sum = 3, expected 3: ok");
        assert!(
            stdout.lines().any(|l| l.trim() == want),
            "missing {want:?} in mlx.launch's output:\n{stdout}\n{stderr}"
        );
    }
}
