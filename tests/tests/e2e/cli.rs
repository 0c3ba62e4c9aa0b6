//! tbctl against real controllers, as a user runs it: what it prints, how it exits, and what it
//! leaves in the store (checked independently over gRPC).

use std::path::PathBuf;
use std::time::Duration;

use tb_tests::objects::{model_value, parse};
use tb_tests::{Cluster, ClusterOptions, Tbctl};

/// A Model and a Queue; `path` is the Model's weights path.
fn manifest(path: &str) -> String {
    format!(
        "apiVersion: tb/v1
kind: Model
metadata:
  name: llama
spec:
  format: gguf
  source:
    path: {path}
---
apiVersion: tb/v1
kind: Queue
metadata:
  name: research
spec: {{}}
"
    )
}

/// A valid Model followed by one whose `spec.layers` (line 18) is not a number.
const BAD_FIELD: &str = "apiVersion: tb/v1
kind: Model
metadata:
  name: good
spec:
  format: gguf
  source:
    path: /models/good.gguf
---
apiVersion: tb/v1
kind: Model
metadata:
  name: bad
spec:
  format: gguf
  source:
    path: /models/bad.gguf
  layers: zero
";

/// A valid Model followed by text that is not YAML (an unclosed list on line 14).
const BAD_SYNTAX: &str = "apiVersion: tb/v1
kind: Model
metadata:
  name: fine
spec:
  format: gguf
  source:
    path: /models/fine.gguf
---
apiVersion: tb/v1
kind: Model
metadata:
  name: broken
spec: [
";

/// A controller (or three) and a tbctl pointed at all of them.
struct Setup {
    cluster: Cluster,
    tbctl: Tbctl,
}

impl Setup {
    async fn new(name: &str, size: usize) -> Setup {
        let cluster = Cluster::start(name, ClusterOptions::new(size)).await;
        let tbctl = Tbctl::new(&cluster.addrs(), &cluster.dir().sub("home"));
        Setup { cluster, tbctl }
    }

    fn write(&self, name: &str, contents: &str) -> PathBuf {
        self.cluster.dir().write(name, contents)
    }

    /// Model names in the default namespace, read over gRPC.
    async fn models(&self) -> Vec<String> {
        let list = self
            .cluster
            .client()
            .list("Model", "default", 0, Duration::from_secs(20))
            .await
            .unwrap_or_else(|e| panic!("list: {e:?}"));
        list.objects_json
            .iter()
            .map(|j| parse(j).metadata.name)
            .collect()
    }

    /// The stored llama's weights path, read over gRPC.
    async fn llama_value(&self) -> Option<String> {
        let client = self.cluster.client();
        match client
            .get_on(&self.cluster.addr(0), "Model", "default", "llama", false)
            .await
        {
            Ok(json) => model_value(&parse(&json)),
            Err(e) if e.code() == tonic::Code::NotFound => None,
            Err(e) => panic!("get: {e:?}"),
        }
    }
}

fn lines(s: &str) -> Vec<&str> {
    s.lines().map(str::trim).filter(|l| !l.is_empty()).collect()
}

#[tokio::test]
async fn apply_reports_created_then_unchanged_then_configured() {
    let s = Setup::new("cli-apply", 1).await;
    let file = s.write("llama.yaml", &manifest("/models/a.gguf"));
    let file = file.to_str().expect("utf-8 path");

    let out = s.tbctl.run(&["apply", "-f", file]).await;
    out.expect_code(0);
    assert_eq!(
        lines(&out.stdout),
        ["model/llama created", "queue/research created"],
        "{out}"
    );

    let out = s.tbctl.run(&["apply", "-f", file]).await;
    out.expect_code(0);
    assert_eq!(
        lines(&out.stdout),
        ["model/llama unchanged", "queue/research unchanged"],
        "{out}"
    );

    s.write("llama.yaml", &manifest("/models/b.gguf"));
    let out = s.tbctl.run(&["apply", "-f", file]).await;
    out.expect_code(0);
    assert_eq!(
        lines(&out.stdout),
        ["model/llama configured", "queue/research unchanged"],
        "{out}"
    );
    assert_eq!(
        s.llama_value().await.as_deref(),
        Some("b"),
        "the configured value was not stored"
    );
}

#[tokio::test]
async fn server_side_dry_run_stores_nothing() {
    let s = Setup::new("cli-dry-run", 1).await;
    let file = s.write("llama.yaml", &manifest("/models/a.gguf"));
    let file = file.to_str().expect("utf-8 path");

    let out = s
        .tbctl
        .run(&["apply", "-f", file, "--dry-run=server"])
        .await;
    out.expect_code(0);
    let printed = lines(&out.stdout);
    assert_eq!(printed.len(), 2, "{out}");
    assert!(printed[0].starts_with("model/llama created"), "{out}");
    assert!(s.models().await.is_empty(), "a dry run stored objects");

    s.tbctl.run(&["apply", "-f", file]).await.expect_code(0);
    s.write("llama.yaml", &manifest("/models/b.gguf"));
    let out = s
        .tbctl
        .run(&["apply", "-f", file, "--dry-run=server"])
        .await;
    out.expect_code(0);
    assert!(
        lines(&out.stdout)[0].starts_with("model/llama configured"),
        "{out}"
    );
    assert_eq!(
        s.llama_value().await.as_deref(),
        Some("a"),
        "a dry run changed the object"
    );
}

#[tokio::test]
async fn diff_exits_0_without_changes_and_1_with_changes() {
    let s = Setup::new("cli-diff", 1).await;
    let file = s.write("llama.yaml", &manifest("/models/a.gguf"));
    let file = file.to_str().expect("utf-8 path");

    // Nothing stored yet: everything is a change.
    s.tbctl.run(&["diff", "-f", file]).await.expect_code(1);
    s.tbctl.run(&["apply", "-f", file]).await.expect_code(0);

    let out = s.tbctl.run(&["diff", "-f", file]).await;
    out.expect_code(0);
    assert!(
        out.stdout.trim().is_empty(),
        "no changes, but diff printed some: {out}"
    );

    s.write("llama.yaml", &manifest("/models/b.gguf"));
    let out = s.tbctl.run(&["diff", "-f", file]).await;
    out.expect_code(1);
    assert!(
        out.stdout.contains("/models/a.gguf") && out.stdout.contains("/models/b.gguf"),
        "{out}"
    );
    assert_eq!(
        s.llama_value().await.as_deref(),
        Some("a"),
        "diff changed the object"
    );

    // An error is neither "same" nor "different".
    let out = s.tbctl.run(&["diff", "-f", "/nonexistent/file.yaml"]).await;
    out.expect_code(2);
}

#[tokio::test]
async fn get_json_has_items_for_lists_and_an_object_for_a_name() {
    let s = Setup::new("cli-get", 1).await;
    let empty = s.tbctl.run(&["get", "models", "-o", "json"]).await;
    empty.expect_code(0);
    assert_eq!(empty.json(), serde_json::json!({"items": []}), "{empty}");

    let file = s.write("llama.yaml", &manifest("/models/a.gguf"));
    s.tbctl
        .run(&["apply", "-f", file.to_str().expect("utf-8 path")])
        .await
        .expect_code(0);

    let out = s.tbctl.run(&["get", "models", "-o", "json"]).await;
    out.expect_code(0);
    let list = out.json();
    let items = list["items"]
        .as_array()
        .unwrap_or_else(|| panic!("no items list: {out}"));
    assert_eq!(items.len(), 1, "{out}");
    let obj = parse(&items[0].to_string());
    assert_eq!(
        (obj.kind.as_str(), obj.metadata.name.as_str()),
        ("Model", "llama")
    );
    assert!(
        obj.metadata.resource_version > 0 && obj.metadata.generation == 1,
        "{out}"
    );

    let out = s.tbctl.run(&["get", "model", "llama", "-o", "json"]).await;
    out.expect_code(0);
    let one = parse(&out.json().to_string());
    assert_eq!(one, obj, "get by name and list disagree");

    let out = s
        .tbctl
        .run(&["get", "queue", "research", "-o", "json"])
        .await;
    out.expect_code(0);
    assert_eq!(out.json()["metadata"]["name"], "research", "{out}");
    assert!(
        out.json()["metadata"].get("namespace").is_none(),
        "a Queue has no namespace: {out}"
    );

    let out = s
        .tbctl
        .run(&["get", "model", "missing", "-o", "json"])
        .await;
    out.expect_code(1);
    assert!(out.stderr.contains("not found"), "{out}");
}

#[tokio::test]
async fn bad_yaml_reports_file_line_and_field_and_stores_nothing() {
    let s = Setup::new("cli-bad-yaml", 1).await;
    let file = s.write("bad.yaml", BAD_FIELD);
    let file = file.to_str().expect("utf-8 path");
    let out = s.tbctl.run(&["apply", "-f", file]).await;
    out.expect_code(1);
    let at =
        located(&out.stderr, file).unwrap_or_else(|| panic!("no FILE:LINE:COL in stderr: {out}"));
    assert_eq!(at.line, 18, "the error should point at `layers:`: {out}");
    assert!(
        at.rest.starts_with("spec.layers: "),
        "the error should name the field: {out}"
    );
    assert!(
        out.stdout.trim().is_empty(),
        "nothing should be reported as applied: {out}"
    );

    let file = s.write("broken.yaml", BAD_SYNTAX);
    let file = file.to_str().expect("utf-8 path");
    let out = s.tbctl.run(&["apply", "-f", file]).await;
    out.expect_code(1);
    let at =
        located(&out.stderr, file).unwrap_or_else(|| panic!("no FILE:LINE:COL in stderr: {out}"));
    assert!(
        (13..=15).contains(&at.line),
        "the error should point at the unclosed list: {out}"
    );

    assert!(
        s.models().await.is_empty(),
        "objects from a rejected file were stored"
    );
}

/// `FILE:LINE:COL: rest` found in `stderr`.
struct Located {
    line: u32,
    rest: String,
}

fn located(stderr: &str, file: &str) -> Option<Located> {
    let start = stderr.find(&format!("{file}:"))? + file.len() + 1;
    let mut parts = stderr[start..].splitn(3, ':');
    let line = parts.next()?.parse().ok()?;
    let _col: u32 = parts.next()?.parse().ok()?;
    let rest = parts.next()?.trim_start().lines().next()?.to_string();
    Some(Located { line, rest })
}

#[tokio::test]
async fn delete_removes_the_object_and_fails_on_a_missing_one() {
    let s = Setup::new("cli-delete", 1).await;
    let file = s.write("llama.yaml", &manifest("/models/a.gguf"));
    s.tbctl
        .run(&["apply", "-f", file.to_str().expect("utf-8 path")])
        .await
        .expect_code(0);

    let out = s.tbctl.run(&["delete", "model", "llama"]).await;
    out.expect_code(0);
    assert_eq!(lines(&out.stdout), ["model/llama deleted"], "{out}");
    assert!(s.models().await.is_empty(), "the model is still stored");

    let out = s.tbctl.run(&["delete", "model", "llama"]).await;
    out.expect_code(1);
    assert!(out.stderr.contains("not found"), "{out}");
}

#[tokio::test]
async fn cluster_status_json_names_the_leader() {
    let mut s = Setup::new("cli-status", 3).await;
    let leader = s.cluster.leader_index().await;
    let leader_id = s.cluster.member(leader).id();

    let out = s.tbctl.run(&["cluster", "status", "-o", "json"]).await;
    out.expect_code(0);
    let status = out.json();
    assert_eq!(status["leader"], leader_id, "{out}");
    let members = status["members"]
        .as_array()
        .unwrap_or_else(|| panic!("no members: {out}"));
    assert_eq!(members.len(), 3, "{out}");
    let leading: Vec<&serde_json::Value> =
        members.iter().filter(|m| m["state"] == "leader").collect();
    assert_eq!(leading.len(), 1, "exactly one member should lead: {out}");
    assert_eq!(leading[0]["id"], leader_id, "{out}");
    assert!(members.iter().all(|m| m["role"] == "voter"), "{out}");
}

#[tokio::test]
async fn tbctl_fails_over_when_the_first_server_is_dead() {
    let mut s = Setup::new("cli-failover", 3).await;
    // The first server tbctl tries is down: the leader, so failing over is also a leader change.
    let leader = s.cluster.leader_index().await;
    s.cluster.kill(leader);
    let mut servers = vec![s.cluster.addr(leader)];
    servers.extend((0..3).filter(|&i| i != leader).map(|i| s.cluster.addr(i)));
    let tbctl = Tbctl::new(&servers, &s.cluster.dir().sub("home2"));

    let file = s.write("llama.yaml", &manifest("/models/a.gguf"));
    let started = std::time::Instant::now();
    let out = tbctl
        .run(&["apply", "-f", file.to_str().expect("utf-8 path")])
        .await;
    out.expect_code(0);
    assert_eq!(
        lines(&out.stdout),
        ["model/llama created", "queue/research created"],
        "{out}"
    );
    let out = tbctl.run(&["get", "model", "llama", "-o", "json"]).await;
    out.expect_code(0);
    assert_eq!(out.json()["metadata"]["name"], "llama", "{out}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "failing over took {:?}; a dead server should be skipped quickly",
        started.elapsed()
    );

    // A server list where nothing answers fails with a clear error, within the timeout.
    let dead = Tbctl::new(&[s.cluster.addr(leader)], &s.cluster.dir().sub("home3"));
    let out = dead.run(&["--timeout", "2s", "get", "models"]).await;
    out.expect_code(1);
    assert!(
        out.stderr.contains(&s.cluster.addr(leader)),
        "the error should name the server: {out}"
    );
}

#[tokio::test]
async fn cluster_add_member_adds_a_joining_controller() {
    let mut s = Setup::new("cli-add-member", 1).await;
    let file = s.write("llama.yaml", &manifest("/models/a.gguf"));
    s.tbctl
        .run(&["apply", "-f", file.to_str().expect("utf-8 path")])
        .await
        .expect_code(0);
    let joiner = s.cluster.start_joiner().await;
    let (id, addr) = (s.cluster.member(joiner).id(), s.cluster.addr(joiner));

    let out = s
        .tbctl
        .run(&["cluster", "add-member", &id.to_string(), &addr])
        .await;
    out.expect_code(0);

    let out = s.tbctl.run(&["cluster", "status", "-o", "json"]).await;
    out.expect_code(0);
    let status = out.json();
    let members = status["members"]
        .as_array()
        .unwrap_or_else(|| panic!("no members: {out}"));
    let ids: Vec<&serde_json::Value> = members.iter().map(|m| &m["id"]).collect();
    assert_eq!(ids, [1, id], "{out}");
    assert!(members.iter().all(|m| m["role"] == "voter"), "{out}");

    // The new member has the data: read from it alone, locally.
    s.cluster.wait_converged(Duration::from_secs(20)).await;
    let on_joiner = s.cluster.stale_list(joiner, "Model", "default").await;
    assert_eq!(on_joiner.len(), 1, "{on_joiner:?}");

    // A bad address is refused, naming it.
    let out = s
        .tbctl
        .run(&["cluster", "add-member", "9", "not-an-address"])
        .await;
    out.expect_code(1);
    assert!(out.stderr.contains("not-an-address"), "{out}");
}

#[tokio::test]
async fn create_job_from_a_schedule_runs_its_template_now() {
    let s = Setup::new("cli-create-job", 1).await;
    let file = s.write(
        "nightly.yaml",
        "apiVersion: tb/v1
kind: Schedule
metadata:
  name: nightly
spec:
  schedule: \"0 2 * * *\"
  timeZone: Europe/Paris
  jobTemplate:
    metadata:
      labels: {team: vision}
    spec:
      command: [python3, tune.py]
      memory: 1Gi
",
    );
    s.tbctl
        .run(&["apply", "-f", file.to_str().expect("utf-8 path")])
        .await
        .expect_code(0);
    let out = s
        .tbctl
        .run(&["create", "job", "now", "--from", "schedule/nightly"])
        .await;
    out.expect_code(0);
    assert_eq!(lines(&out.stdout), ["trainingjob/now created"], "{out}");
    let out = s.tbctl.run(&["get", "tj", "now", "-o", "json"]).await;
    out.expect_code(0);
    let job = out.json();
    assert_eq!(job["metadata"]["labels"]["tb/schedule"], "nightly");
    assert_eq!(job["metadata"]["labels"]["team"], "vision");
    assert_eq!(job["spec"]["command"][1], "tune.py");

    let out = s
        .tbctl
        .run(&["create", "job", "--from", "schedule/missing"])
        .await;
    out.expect_code(1);
    assert!(out.stderr.contains("not found"), "{out}");
    let out = s.tbctl.run(&["create", "job", "--from", "nightly"]).await;
    assert!(out.stderr.contains("expected schedule/NAME"), "{out}");
}

/// A Model and a service that cannot be placed: the cluster has no nodelet.
const UNPLACEABLE: &str = "apiVersion: tb/v1
kind: Model
metadata:
  name: tiny
spec:
  format: gguf
  source:
    path: /models/tiny.gguf
  layers: 4
  totalBytes: 64Mi
---
apiVersion: tb/v1
kind: InferenceService
metadata:
  name: chat
spec:
  model: tiny
  executor: builtin
";

#[tokio::test]
async fn apply_wait_says_what_it_waits_for_and_why_it_timed_out() {
    let s = Setup::new("cli-apply-wait", 1).await;
    let file = s.write("chat.yaml", UNPLACEABLE);
    let file = file.to_str().expect("utf-8 path");

    let started = std::time::Instant::now();
    let out = s
        .tbctl
        .run(&["--timeout", "4s", "apply", "--wait", "-f", file])
        .await;
    out.expect_code(1);
    assert_eq!(
        lines(&out.stdout),
        ["model/tiny created", "inferenceservice/chat created"],
        "{out}"
    );
    for want in [
        // Before waiting: the object and the condition.
        "waiting for inferenceservice/chat to be Ready (condition Ready=True) (--timeout 4s)",
        // After: the timeout, where the object stands, and its events.
        "timed out after 4s waiting for inferenceservice/chat to be Ready",
        "inferenceservice/chat after 4s:\n  phase: Pending",
        "  conditions:\n    Scheduled=False Unschedulable: model tiny: the cluster has no Macs",
        "`tbctl describe inferenceservice chat`",
    ] {
        assert!(out.stderr.contains(want), "missing {want:?} in {out}");
    }
    assert!(
        out.stderr.contains("  last events (oldest first):\n    ")
            && out.stderr.contains("FailedScheduling"),
        "{out}"
    );
    assert!(
        out.stderr.trim_end().ends_with("error: timed out after 4s waiting for inferenceservice/chat to be Ready (condition Ready=True)"),
        "the error comes last, on one line: {out}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the wait overran its timeout: {:?}",
        started.elapsed()
    );

    // Only a Model: nothing to wait for, said so, exit 0.
    let model = s.write("model.yaml", &manifest("/models/a.gguf"));
    let out = s
        .tbctl
        .run(&["apply", "--wait", "-f", model.to_str().expect("utf-8 path")])
        .await;
    out.expect_code(0);
    assert!(out.stderr.contains("nothing to wait for"), "{out}");
}
