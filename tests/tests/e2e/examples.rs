//! Every file in `manifests/` is an example that works: each is applied, unchanged, to a local
//! cluster (the real controller and nodelets on loopback, the model from `.cache/models`) and
//! must reach the state its comment promises:
//!
//! - `trainingjob-echo.yaml`: Complete, every rank's line in `tbctl logs`;
//! - `model-smollm2.yaml` + `isvc-smollm2.yaml`: the service Ready, split over two nodes, and a
//!   chat completion answers (without a system message the model's template adds its own: the
//!   prompt is as long as transformers makes it); `openai_chat.py` asks it through the OpenAI SDK;
//! - `queues.yaml`: both queues exist and `tbctl top queues` lists them;
//! - `schedule-nightly-finetune.yaml` (cannot run offline: its job fetches a model from the hub,
//!   as its first line says): valid, and `tbctl get schedules` shows its next run, 02:00 Paris;
//! - `schedule-nightly-finetune-builtin.yaml` (+ `data/zorbania.jsonl`, + `model-smollm2.yaml`):
//!   at its slot (02:00 Paris on the controller's test clock) the built-in fine-tune runs to
//!   Succeeded, its loss falls and the adapter is in the nodelet's ~/.cache/tb/adapters;
//! - `model-llama70b.yaml` (needs real Macs, as its first line says): valid for the server
//!   (`--dry-run=server`) and placed by `tbctl plan` on the described lab `labs/mixed.yaml`.
//!
//! `trainingjob-mlx-allreduce.yaml` and `mlx_allreduce.py` are tested by `tests/mlx.rs`.
//! A file added to `manifests/` without a test here fails [`every_manifest_is_covered`].
//!
//! Each test prints (on failure, or with `--nocapture`) the seconds from the lab's start to the
//! promised state.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tb_tests::lab::{self, Lab, LabOptions};
use tb_tests::rank0::Rank0;
use tb_tests::step;

/// Loading the model and connecting the stages on a loaded 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// Each file of `manifests/` (relative to it) and the test that applies it.
const COVERED: &[(&str, &str)] = &[
    (
        "trainingjob-echo.yaml",
        "echo_completes_and_every_rank_logs",
    ),
    ("model-smollm2.yaml", "smollm2_service_is_ready_and_answers"),
    ("isvc-smollm2.yaml", "smollm2_service_is_ready_and_answers"),
    ("openai_chat.py", "smollm2_service_is_ready_and_answers"),
    ("queues.yaml", "queues_schedule_and_llama70b_are_valid"),
    (
        "schedule-nightly-finetune.yaml",
        "queues_schedule_and_llama70b_are_valid",
    ),
    (
        "schedule-nightly-finetune-builtin.yaml",
        "nightly_builtin_finetune_runs_at_its_slot",
    ),
    (
        "data/zorbania.jsonl",
        "nightly_builtin_finetune_runs_at_its_slot",
    ),
    (
        "model-llama70b.yaml",
        "queues_schedule_and_llama70b_are_valid",
    ),
    ("labs/mixed.yaml", "queues_schedule_and_llama70b_are_valid"),
    ("trainingjob-mlx-allreduce.yaml", "tests/mlx.rs"),
    ("mlx_allreduce.py", "tests/mlx.rs"),
];

fn files_under(dir: &Path, prefix: &str, out: &mut Vec<String>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let entry = entry.expect("directory entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if path.is_dir() {
            files_under(&path, &format!("{prefix}{name}/"), out);
        } else if !name.starts_with('.') && name != "__pycache__" {
            out.push(format!("{prefix}{name}"));
        }
    }
}

#[test]
fn every_manifest_is_covered() {
    let mut files = Vec::new();
    files_under(&lab::workspace_root().join("manifests"), "", &mut files);
    files.sort();
    let uncovered: Vec<&String> = files
        .iter()
        .filter(|f| !COVERED.iter().any(|(c, _)| c == f))
        .collect();
    assert!(
        uncovered.is_empty(),
        "manifests/ holds examples no test applies: {uncovered:?}; add a test to \
         tests/tests/e2e/examples.rs and list the file in COVERED"
    );
    let gone: Vec<&str> = COVERED
        .iter()
        .map(|(c, _)| *c)
        .filter(|c| !files.iter().any(|f| f == c))
        .collect();
    assert!(
        gone.is_empty(),
        "COVERED lists files that are gone: {gone:?}"
    );
    // The examples that cannot run here say so first.
    for (file, says) in [
        ("model-llama70b.yaml", "# Needs real Macs"),
        ("schedule-nightly-finetune.yaml", "# Cannot run offline"),
    ] {
        let text = std::fs::read_to_string(lab::manifest(file)).expect("manifest");
        assert!(
            text.starts_with(says),
            "manifests/{file} must say in its first line why it is only checked, starting {says:?}"
        );
    }
}

fn manifest_arg(name: &str) -> String {
    lab::manifest(name).display().to_string()
}

fn minutes(since: Instant) -> String {
    let s = since.elapsed().as_secs_f64();
    format!("{s:.1}s ({:.2} min)", s / 60.0)
}

#[tokio::test]
async fn echo_completes_and_every_rank_logs() {
    let started = Instant::now();
    let lab = Lab::start("example-echo", 3).await;
    lab.tbctl_ok(&["apply", "-f", &manifest_arg("trainingjob-echo.yaml")])
        .await;
    let wait = lab
        .tbctl_ok(&[
            "wait",
            "tj/echo",
            "--for=condition=Complete",
            "--timeout",
            "25s",
        ])
        .await;
    assert!(wait.stdout.contains("condition met"), "{wait}");
    step!(
        "example trainingjob-echo.yaml: Complete {} after a fresh start",
        minutes(started)
    );
    let logs = lab.tbctl_ok(&["logs", "echo"]).await;
    for rank in 0..3 {
        assert!(
            logs.stdout.contains(&format!("rank {rank} of 3")),
            "rank {rank}'s line: {logs}"
        );
    }
}

#[tokio::test]
async fn queues_schedule_and_llama70b_are_valid() {
    let started = Instant::now();
    let lab = Lab::start("example-policy", 1).await;

    // queues.yaml: two queues, as `tbctl top queues` shows them.
    lab.tbctl_ok(&["apply", "-f", &manifest_arg("queues.yaml")])
        .await;
    let queues = lab.tbctl_ok(&["get", "queues", "-o", "name"]).await;
    for q in ["research", "batch"] {
        assert!(queues.stdout.contains(q), "{queues}");
    }
    let top = lab.tbctl_ok(&["top", "queues"]).await;
    assert!(
        top.stdout.contains("research") && top.stdout.contains("batch"),
        "{top}"
    );
    step!("example queues.yaml: both queues {}", minutes(started));

    // schedule-nightly-finetune.yaml: accepted; the next run is the next 02:00 in Paris (01:00
    // UTC in winter, 00:00 in summer), within a day.
    let before = Utc::now();
    lab.tbctl_ok(&[
        "apply",
        "-f",
        &manifest_arg("schedule-nightly-finetune.yaml"),
    ])
    .await;
    let row = lab
        .tbctl_ok(&["get", "schedules", "nightly-finetune"])
        .await;
    let header: Vec<&str> = row
        .stdout
        .lines()
        .next()
        .unwrap_or("")
        .split("  ")
        .collect();
    assert!(header.iter().any(|h| h.trim() == "NEXT SCHEDULE"), "{row}");
    let next = row
        .stdout
        .split_whitespace()
        .filter_map(|w| DateTime::parse_from_rfc3339(w).ok())
        .map(|t| t.with_timezone(&Utc))
        .next()
        .unwrap_or_else(|| panic!("no next run in {row}"));
    let stamp = next.to_rfc3339();
    assert!(
        stamp.contains("T01:00:00") || stamp.contains("T00:00:00"),
        "02:00 Paris is 01:00 or 00:00 UTC, not {stamp}"
    );
    assert!(
        next > before && next <= before + chrono::TimeDelta::hours(24),
        "{stamp} is not the next night after {before}"
    );
    // Nothing ran, and the scheduler found nothing wrong with it.
    let jobs = lab.list("TrainingJob", "default").await.expect("jobs");
    assert!(jobs.is_empty(), "{jobs:?}");
    let events = lab
        .tbctl_ok(&["events", "--for", "schedule/nightly-finetune"])
        .await;
    assert!(!events.stdout.contains("Warning"), "{events}");
    step!(
        "example schedule-nightly-finetune.yaml: next run {stamp}, {}",
        minutes(started)
    );

    // model-llama70b.yaml: the server accepts it (and stores nothing), and tbctl plan places it
    // on the described lab: several stages, every layer placed once.
    let dry = lab
        .tbctl_ok(&[
            "apply",
            "--dry-run=server",
            "-f",
            &manifest_arg("model-llama70b.yaml"),
        ])
        .await;
    assert!(dry.stdout.contains("llama-70b"), "{dry}");
    let models = lab.list("Model", "default").await.expect("models");
    assert!(models.is_empty(), "a dry run stores nothing: {models:?}");
    let plan = lab
        .tbctl_ok(&[
            "plan",
            "--cluster",
            &manifest_arg("labs/mixed.yaml"),
            "-f",
            &manifest_arg("model-llama70b.yaml"),
            "-o",
            "json",
        ])
        .await;
    let plan = plan.json();
    let stages = find_stages(&plan).unwrap_or_else(|| panic!("no stages in {plan:#}"));
    let layers: u64 = stages
        .iter()
        .map(|s| {
            s["layers"]
                .as_u64()
                .or_else(|| s["layerCount"].as_u64())
                .unwrap_or(0)
        })
        .sum();
    assert!(!stages.is_empty(), "{plan:#}");
    assert_eq!(layers, 80, "every layer placed once: {plan:#}");
    step!(
        "example model-llama70b.yaml: {} stage(s) planned, {}",
        stages.len(),
        minutes(started)
    );
}

/// The `stages` array of a plan, wherever `tbctl plan -o json` nests it.
fn find_stages(v: &Value) -> Option<&Vec<Value>> {
    match v {
        Value::Object(map) => map
            .get("stages")
            .and_then(Value::as_array)
            .or_else(|| map.values().find_map(find_stages)),
        Value::Array(items) => items.iter().find_map(find_stages),
        _ => None,
    }
}

/// The `path:` of the Model's source in `model-smollm2.yaml`, `~/` expanded to `home`.
/// The built-in nightly fine-tune, applied unchanged after the model: the controller's clock is
/// moved to just before the next 02:00 in Paris, and the run it starts goes to Succeeded.
#[tokio::test]
async fn nightly_builtin_finetune_runs_at_its_slot() {
    let model = tb_engine::test_model_path();
    assert!(
        model.is_file(),
        "{} is missing: run scripts/fetch-model.sh",
        model.display()
    );
    let model = model.canonicalize().unwrap_or(model);
    let started = Instant::now();
    let scratch = tempfile::tempdir().expect("temp dir");
    let home = scratch.path().join("home");
    let target = model_source_path(&home);
    std::fs::create_dir_all(target.parent().expect("a directory")).expect("model dir");
    std::os::unix::fs::symlink(&model, &target).expect("model link");
    let clock_dir = tb_tests::TestDir::new("example-nightly-clock");
    let mut clock = crate::cron::TestClock::new(&clock_dir);
    let mut opts = LabOptions::new(1);
    opts.nodelet_env = vec![("HOME".into(), home.display().to_string())];
    opts.controller_args = clock.controller_args().to_vec();
    let lab = Lab::start_with("example-nightly", opts).await;
    lab.tbctl_ok(&[
        "apply",
        "-f",
        &manifest_arg("model-smollm2.yaml"),
        "-f",
        &manifest_arg("schedule-nightly-finetune-builtin.yaml"),
    ])
    .await;
    let row = lab
        .tbctl_ok(&["get", "schedules", "nightly-finetune-builtin"])
        .await;
    let next = row
        .stdout
        .split_whitespace()
        .filter_map(|w| DateTime::parse_from_rfc3339(w).ok())
        .map(|t| t.with_timezone(&Utc))
        .next()
        .unwrap_or_else(|| panic!("no next run in {row}"));
    let slot = next.timestamp_millis();
    clock.set_now(slot - crate::cron::LEAD_MS);
    clock.sleep_until(slot).await;
    let name = format!("nightly-finetune-builtin-{}", slot.div_euclid(60_000));
    let status = lab
        .wait_job_phase(&name, "Succeeded", Duration::from_secs(1200))
        .await;
    step!(
        "example schedule-nightly-finetune-builtin.yaml: {name} Succeeded {} after a fresh start: {}",
        minutes(started),
        status["training"]
    );
    let curve: Vec<f64> = status["training"]["lossCurve"]
        .as_array()
        .expect("lossCurve")
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    assert_eq!(status["training"]["step"], 20, "{status:#}");
    assert!(curve.last() < curve.first(), "the loss falls: {curve:?}");
    let adapter = home.join(".cache/tb/adapters/nightly-finetune");
    assert_eq!(
        status["training"]["adapter"]["path"],
        adapter.display().to_string(),
        "{status:#}"
    );
    assert!(adapter.join("adapter_model.safetensors").is_file());
    assert!(adapter.join("adapter_config.json").is_file());
}

fn model_source_path(home: &Path) -> PathBuf {
    let text = std::fs::read_to_string(lab::manifest("model-smollm2.yaml")).expect("manifest");
    let path = text
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("path:"))
        .map(|p| p.trim().trim_matches('"'))
        .expect("model-smollm2.yaml names a path");
    match path.strip_prefix("~/") {
        Some(rest) => home.join(rest),
        None => PathBuf::from(path),
    }
}

async fn wait_isvc_ready(lab: &Lab, name: &str) -> Value {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let out = lab.tbctl_ok(&["get", "isvc", name, "-o", "json"]).await;
        let status = out.json()["status"].clone();
        let ready = status["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        if ready {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "isvc/{name} not Ready in {READY_TIMEOUT:?}: {status:#}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn smollm2_service_is_ready_and_answers() {
    let model = tb_engine::test_model_path();
    assert!(
        model.is_file(),
        "{} is missing: run scripts/fetch-model.sh",
        model.display()
    );
    let model = model.canonicalize().unwrap_or(model);
    let python = lab::mlx_python();
    let started = Instant::now();
    // The nodelets' home, where the manifest's `~/...` path points: the model is put there as a
    // user following the example would.
    let scratch = tempfile::tempdir().expect("temp dir");
    let home = scratch.path().join("home");
    let target = model_source_path(&home);
    if !target.is_file() {
        std::fs::create_dir_all(target.parent().expect("a directory")).expect("model dir");
        std::os::unix::fs::symlink(&model, &target).expect("model link");
    }
    // Two nodelets "cabled" by loopback addresses, as `tbctl up` describes them.
    let topology = scratch.path().join("lab.yaml");
    std::fs::write(
        &topology,
        "macs:
  - {name: node-1, ports: [{name: lo, address: 127.0.4.1}]}
  - {name: node-2, ports: [{name: lo, address: 127.0.4.2}]}
links:
  - {between: [node-1/lo, node-2/lo], bandwidthGbps: 40, latencyUs: 20}
",
    )
    .expect("topology");
    let mut opts = LabOptions::new(2);
    opts.topology = Some(topology);
    opts.nodelet_env = vec![("HOME".into(), home.display().to_string())];
    let lab = Lab::start_with("example-smollm2", opts).await;
    lab.tbctl_ok(&[
        "apply",
        "-f",
        &manifest_arg("model-smollm2.yaml"),
        "-f",
        &manifest_arg("isvc-smollm2.yaml"),
    ])
    .await;
    let status = wait_isvc_ready(&lab, "smollm2").await;
    step!(
        "example model-smollm2.yaml + isvc-smollm2.yaml: Ready {} after a fresh start: {status}",
        minutes(started)
    );
    let nodes = status["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 2, "split over two nodes: {status:#}");
    let endpoint = status["endpoint"].as_str().expect("endpoint").to_string();

    // Balanced stages, as the service's comment promises, every layer placed once.
    let layers: Vec<u64> = status["modelPlacement"]["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .map(|s| s["layers"].as_u64().expect("layers"))
        .collect();
    assert_eq!(layers.iter().sum::<u64>(), 30, "{status:#}");
    assert!(
        layers.iter().all(|&l| (10..=20).contains(&l)),
        "unbalanced stages {layers:?}: {status:#}"
    );

    // Without a system message SmolLM2's template adds its default one: the prompt has 42
    // tokens, the 37 transformers' apply_chat_template gives for the bare question
    // (engine/tests/fixtures) and 5 for " Answer in one sentence.".
    let key = lab.service_key("smollm2").await;
    let rank0 = Rank0::new(&endpoint, "default", "smollm2").with_key(Some(&key));
    let ask = async |messages: Value| {
        let (code, body) = rank0
            .request(
                "POST",
                "/v1/chat/completions",
                Some(&json!({"model": "smollm2", "max_tokens": 24, "temperature": 0, "messages": messages})),
            )
            .await
            .expect("POST /v1/chat/completions");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str::<Value>(&body).expect("JSON answer")
    };
    let question = json!({"role": "user", "content": "What is the capital of France? Answer in one sentence."});
    let answer = ask(json!([question])).await;
    assert_eq!(answer["usage"]["prompt_tokens"], 42, "{answer:#}");
    let text = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("");
    assert!(!text.trim().is_empty(), "{answer:#}");
    step!("without a system message {}: {text:?}", minutes(started));
    // With one, the answer the example promises.
    let answer = ask(json!([
        {"role": "system", "content": "You are a helpful assistant."},
        question
    ]))
    .await;
    let text = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("");
    step!("with a system message {}: {text:?}", minutes(started));
    assert!(text.contains("Paris"), "{answer:#}");

    // The OpenAI SDK script of the example, plain and streamed, as docs/first-hour.md runs it:
    // at the service's stable URL, with a member's tb token as the key.
    let url = status["url"].as_str().expect("url").to_string();
    let me = lab
        .tbctl_ok(&[
            "admin", "user", "create", "me", "--role", "member", "-n", "default",
        ])
        .await;
    let out = tokio::process::Command::new(&python)
        .arg(lab::manifest("openai_chat.py"))
        .args([
            &url,
            "smollm2",
            "What is the capital of France? Answer in one sentence.",
        ])
        .env("OPENAI_API_KEY", me.stdout.trim())
        .env("TB_CA_CERT", tb_tests::auth::ca_cert())
        .stdin(Stdio::null())
        .output()
        .await
        .expect("python");
    assert!(
        out.status.success(),
        "openai_chat.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON from openai_chat.py");
    step!("openai_chat.py: {v}");
    assert!(
        v["text"].as_str().is_some_and(|t| t.contains("Paris")),
        "{v:#}"
    );
    assert_eq!(v["text"], v["stream_text"], "greedy: streamed = plain");
}
