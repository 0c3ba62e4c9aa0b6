//! Bounded inputs, checked against a real controller through the raw gRPC API (not tbctl, which
//! checks the same things first): the server refuses on its own every input tbctl refuses
//! (duplicate JSON keys, NUL bytes, unknown zones, crons that never fire, half bytes, names
//! over 63 characters per label, overflowing integers), answers INVALID_ARGUMENT and never
//! INTERNAL (invalid UTF-8 inside a protobuf string), refuses objects over 1.5 MiB and
//! annotations over 256 KiB with the limit and the size, and a refused call with a 10 MiB name
//! gets a short answer and leaves nothing of it in the audit log. An idle cluster holding an
//! unschedulable job commits almost nothing.
//!
//! Every refusal is followed by a check that nothing was stored.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tb_api::proto::auth_client::AuthClient;
use tb_api::proto::{
    ApplyRequest, ApplyResponse, AuditRequest, CreateUserRequest, DeleteRequest,
    UpdateStatusRequest,
};
use tb_tests::lab::{Lab, LabOptions};
use tb_tests::objects::{self, model, unique_namespace};
use tb_tests::{Client, Cluster, ClusterOptions, step};
use tonic::{Code, Status};

const BUDGET: Duration = Duration::from_secs(20);

async fn single(name: &str) -> Cluster {
    Cluster::start(name, ClusterOptions::new(1)).await
}

/// Sends one object's JSON text as it is (not re-serialised: duplicate keys survive).
async fn apply_text(client: &Client, addr: &str, text: String) -> Result<ApplyResponse, Status> {
    client
        .apply_on(
            addr,
            ApplyRequest {
                objects_json: vec![text],
                dry_run: false,
                request_id: objects::request_id(),
            },
        )
        .await
}

async fn names(client: &Client, kind: &str, ns: &str) -> Vec<String> {
    let list = client
        .list(kind, ns, 0, BUDGET)
        .await
        .unwrap_or_else(|e| panic!("list: {e:?}"));
    list.objects_json
        .iter()
        .map(|j| objects::parse(j).metadata.name)
        .collect()
}

fn job(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "tb/v1", "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

fn schedule(ns: &str, name: &str, cron: &str, zone: Option<&str>) -> Value {
    let mut spec = json!({"schedule": cron,
        "jobTemplate": {"spec": {"command": ["python3", "tune.py"]}}});
    if let Some(z) = zone {
        spec["timeZone"] = json!(z);
    }
    json!({"apiVersion": "tb/v1", "kind": "Schedule",
        "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

/// Asserts an INVALID_ARGUMENT whose message has every one of `want`.
fn assert_invalid(result: Result<impl std::fmt::Debug, Status>, what: &str, want: &[&str]) {
    let err = result.expect_err(what);
    assert_eq!(err.code(), Code::InvalidArgument, "{what}: {err:?}");
    for w in want {
        assert!(err.message().contains(w), "{what}: {w:?} not in {err:?}");
    }
}

#[tokio::test]
async fn the_server_refuses_on_its_own_what_tbctl_refuses() {
    let cluster = single("server-validation").await;
    let client = cluster.client();
    let addr = cluster.addr(0);
    let ns = unique_namespace("val");

    let dup = format!(
        r#"{{"apiVersion": "tb/v1", "kind": "TrainingJob", "metadata": {{"name": "dup", "namespace": "{ns}"}},
            "spec": {{"command": ["true"], "ranks": 1, "ranks": 64}}}}"#
    );
    assert_invalid(
        apply_text(&client, &addr, dup).await,
        "duplicate keys",
        &["spec", "duplicate entry with key \"ranks\""],
    );
    let cases: Vec<(&str, Value, Vec<&str>)> = vec![
        (
            "NUL in a command argument",
            job(&ns, "nul", json!({"command": ["sh", "-c", "echo \u{0}x"]})),
            vec!["spec.command[2]", "NUL"],
        ),
        (
            "NUL in an environment value",
            job(
                &ns,
                "nul-env",
                json!({"command": ["true"], "env": {"A": "x\u{0}"}}),
            ),
            vec!["spec.env.A", "NUL"],
        ),
        (
            "an unknown zone",
            schedule(&ns, "mars", "0 2 * * *", Some("Mars/Olympus")),
            vec![
                "spec.timeZone",
                "\"Mars/Olympus\" is not a time zone in the IANA database",
            ],
        ),
        (
            "a cron that never fires",
            schedule(&ns, "feb31", "0 0 31 2 *", None),
            vec!["spec.schedule", "never fires"],
        ),
        (
            "half a byte",
            job(&ns, "half", json!({"command": ["true"], "memory": 0.5})),
            vec!["spec.memory", "not a whole number of bytes"],
        ),
        (
            "a 64-character name",
            job(&ns, &"a".repeat(64), json!({"command": ["true"]})),
            vec![
                "metadata.name",
                "has 64 characters; each dot-separated part of a name has at most 63",
            ],
        ),
    ];
    for (what, obj, want) in cases {
        step!("{what}");
        assert_invalid(
            apply_text(&client, &addr, obj.to_string()).await,
            what,
            &want,
        );
    }
    let overflow = format!(
        r#"{{"apiVersion": "tb/v1", "kind": "TrainingJob", "metadata": {{"name": "big", "namespace": "{ns}"}},
            "spec": {{"command": ["true"], "ranks": 99999999999999999999999}}}}"#
    );
    assert_invalid(
        apply_text(&client, &addr, overflow).await,
        "an overflowing integer",
        &["spec.ranks: expected an integer from 0 to 4294967295, found"],
    );
    assert!(names(&client, "TrainingJob", &ns).await.is_empty());
    assert!(names(&client, "Schedule", &ns).await.is_empty());

    // A status with a duplicate key is refused too, and the stored one is unchanged.
    let created = apply_text(&client, &addr, model(&ns, "m", "v1").to_string())
        .await
        .expect("a valid model");
    let rv = objects::parse(&created.results[0].object_json)
        .metadata
        .resource_version;
    let status = client
        .objects(&addr)
        .update_status(UpdateStatusRequest {
            kind: "Model".into(),
            namespace: ns.clone(),
            name: "m".into(),
            status_json: r#"{"observedGeneration": 1, "observedGeneration": 7}"#.into(),
            resource_version: 0,
            request_id: objects::request_id(),
        })
        .await;
    assert_invalid(
        status,
        "duplicate status keys",
        &["status", "duplicate entry"],
    );
    let stored = client
        .get_on(&addr, "Model", &ns, "m", false)
        .await
        .expect("get");
    assert_eq!(objects::parse(&stored).metadata.resource_version, rv);
}

/// An ApplyRequest as bytes on the wire: `objects_json` (field 1) carries bytes that are not
/// UTF-8, which a `string` field may not hold.
#[derive(Clone, PartialEq, prost::Message)]
struct RawApplyRequest {
    #[prost(bytes = "vec", repeated, tag = "1")]
    objects_json: Vec<Vec<u8>>,
}

#[tokio::test]
async fn a_request_that_cannot_be_decoded_is_invalid_argument_not_internal() {
    let cluster = single("undecodable").await;
    let client = cluster.client();
    let addr = cluster.addr(0);
    let mut grpc = tonic::client::Grpc::new(client.authed(&addr));
    grpc.ready().await.expect("ready");
    let req = RawApplyRequest {
        objects_json: vec![b"{\"apiVersion\": \"tb/v1\xff\xfe\"}".to_vec()],
    };
    let codec = tonic_prost::ProstCodec::<RawApplyRequest, ApplyResponse>::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/tb.v1.Objects/Apply");
    let err = grpc
        .unary(tonic::Request::new(req), path, codec)
        .await
        .expect_err("invalid UTF-8 in a string field");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("UTF-8"), "{err:?}");
}

#[tokio::test]
async fn objects_over_the_size_limits_are_refused_with_the_limit_and_their_size() {
    let cluster = single("size-limit").await;
    let client = cluster.client();
    let addr = cluster.addr(0);
    let ns = unique_namespace("size");

    let mut big = job(
        &ns,
        "big",
        json!({"command": ["true", "x".repeat(2 << 20)]}),
    );
    assert_invalid(
        apply_text(&client, &addr, big.to_string()).await,
        "a 2 MiB object",
        &["the object is 2097", "at most 1.5 MiB (1572864 bytes)"],
    );
    big = model(&ns, "annotated", "v1");
    big["metadata"]["annotations"] = json!({"note": "x".repeat(300 << 10)});
    assert_invalid(
        apply_text(&client, &addr, big.to_string()).await,
        "300 KiB of annotations",
        &[
            "metadata.annotations",
            "307204 bytes",
            "at most 256 KiB (262144 bytes)",
        ],
    );
    assert!(names(&client, "TrainingJob", &ns).await.is_empty());
    assert!(names(&client, "Model", &ns).await.is_empty());
}

/// The controller's resident memory, from /proc (Linux).
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

async fn audit_bytes(auth: &mut AuthClient<tb_tests::client::AuthChannel>) -> (usize, usize) {
    let records = auth
        .audit(AuditRequest::default())
        .await
        .expect("audit")
        .into_inner()
        .records;
    let bytes = records
        .iter()
        .map(|r| r.name.len() + r.namespace.len() + r.kind.len() + r.user.len())
        .sum();
    let longest = records.iter().map(|r| r.name.len()).max().unwrap_or(0);
    (bytes, longest)
}

#[tokio::test]
async fn a_10_mib_name_gets_a_short_refusal_and_stores_nothing() {
    let cluster = single("huge-name").await;
    let admin = cluster.client();
    let addr = cluster.addr(0);
    let ns = unique_namespace("huge");
    let mut auth = admin.auth(&addr);
    let viewer = auth
        .create_user(CreateUserRequest {
            name: "vic".into(),
            role: "viewer".into(),
            namespaces: Vec::new(),
            ttl_seconds: 0,
        })
        .await
        .expect("create a viewer")
        .into_inner()
        .token;
    let vic = Client::with_token(vec![addr.clone()], Some(&viewer));

    // A refused call with a valid name is audited (the baseline).
    let denied = vic
        .objects(&addr)
        .delete(DeleteRequest {
            kind: "Model".into(),
            namespace: ns.clone(),
            name: "m".into(),
            resource_version: 0,
            request_id: objects::request_id(),
        })
        .await
        .expect_err("a viewer may not delete");
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    let deadline = Instant::now() + BUDGET;
    let before = loop {
        let (bytes, longest) = audit_bytes(&mut auth).await;
        if bytes > 0 || Instant::now() > deadline {
            break (bytes, longest);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(before.0 > 0, "the refusal is audited");

    let pid = cluster.member(0).pid().expect("controller pid");
    let rss_before = rss_kib(pid);
    let huge = "x".repeat(10 << 20);
    for (who, client) in [("viewer", &vic), ("admin", &admin), ("viewer", &vic)] {
        let err = client
            .objects(&addr)
            .delete(DeleteRequest {
                kind: "Model".into(),
                namespace: ns.clone(),
                name: huge.clone(),
                resource_version: 0,
                request_id: objects::request_id(),
            })
            .await
            .expect_err("a 10 MiB name");
        // The reason, not a transport error; and short.
        assert_eq!(err.code(), Code::InvalidArgument, "{who}: {err:?}");
        assert!(
            err.message().len() < 2048,
            "{who}: a {} byte reply",
            err.message().len()
        );
        assert!(
            err.message().contains("…(10485760 bytes)") && err.message().starts_with("name: "),
            "{who}: {}",
            err.message()
        );
    }
    // A 10 MiB label selector and namespace are refused as shortly.
    let err = vic
        .objects(&addr)
        .list(tb_api::proto::ListRequest {
            kind: "Model".into(),
            namespace: huge.clone(),
            label_selector: String::new(),
            stale: false,
        })
        .await
        .expect_err("a 10 MiB namespace");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().len() < 2048);

    // Give any (wrongly) spawned audit write time to land, then compare.
    let marker = vic
        .objects(&addr)
        .delete(DeleteRequest {
            kind: "Model".into(),
            namespace: ns.clone(),
            name: "marker".into(),
            resource_version: 0,
            request_id: objects::request_id(),
        })
        .await
        .expect_err("a viewer may not delete");
    assert_eq!(marker.code(), Code::PermissionDenied);
    let deadline = Instant::now() + BUDGET;
    let after = loop {
        let records = auth
            .audit(AuditRequest::default())
            .await
            .expect("audit")
            .into_inner()
            .records;
        if records.iter().any(|r| r.name == "marker") || Instant::now() > deadline {
            break audit_bytes(&mut auth).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        after.1 <= 1100,
        "an audit record holds a {} byte name",
        after.1
    );
    assert!(
        after.0 < before.0 + 256,
        "the audit log grew from {} to {} bytes",
        before.0,
        after.0
    );
    if let (Some(b), Some(a)) = (rss_before, rss_kib(pid)) {
        // Reported, not asserted: allocator behaviour is not ours to promise.
        eprintln!(
            "controller RSS around three refused 10 MiB names: {b} KiB -> {a} KiB ({:+} KiB)",
            a as i64 - b as i64
        );
    }
}

/// The leader's commit index.
async fn commit_index(client: &Client, addr: &str) -> u64 {
    let status = client.status_on(addr).await.expect("cluster status");
    status
        .members
        .iter()
        .map(|m| m.commit_index)
        .max()
        .unwrap_or(0)
}

#[tokio::test]
async fn an_idle_cluster_with_objects_it_cannot_act_on_commits_almost_nothing() {
    let mut lab = Lab::start_with("idle-commits", LabOptions::new(1)).await;
    let client = Client::new(vec![lab.addr().to_string()]);
    let addr = lab.addr().to_string();
    // Too big for any Mac: unschedulable, for as long as it exists.
    apply_text(
        &client,
        &addr,
        job(
            "default",
            "huge",
            json!({"command": ["true"], "memory": "64Ti"}),
        )
        .to_string(),
    )
    .await
    .expect("apply");
    // Refused now: it can no longer be stored to loop on.
    assert_invalid(
        apply_text(
            &client,
            &addr,
            schedule("default", "mars", "* * * * *", Some("Mars/Olympus")).to_string(),
        )
        .await,
        "an unknown zone",
        &["Mars/Olympus"],
    );
    let deadline = Instant::now() + BUDGET;
    while lab
        .event_reasons("huge")
        .await
        .iter()
        .all(|r| r != "FailedScheduling")
    {
        assert!(Instant::now() < deadline, "the job never said why it waits");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Heartbeats are Raft writes too: stop the nodelet, and let its Node be declared NotReady
    // (one write, one event), so that what remains is the scheduler's own doing.
    lab.stop_nodelet(0);
    let node = lab.nodelet(0).name.clone();
    lab.wait_node_ready(&node, false, BUDGET).await;
    // Settled: no commit for two seconds (bounded wait).
    let deadline = Instant::now() + BUDGET;
    let mut last = commit_index(&client, &addr).await;
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(2) {
        assert!(Instant::now() < deadline, "the cluster never went quiet");
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = commit_index(&client, &addr).await;
        if now != last {
            last = now;
            quiet_since = Instant::now();
        }
    }
    let start = commit_index(&client, &addr).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let end = commit_index(&client, &addr).await;
    step!("idle for 10 s: commit index {start} -> {end}");
    assert!(
        end - start <= 3,
        "an idle cluster committed {} entries in 10 s",
        end - start
    );
    lab.cont_nodelet(0);
}

#[tokio::test]
async fn tbctl_logs_prints_a_line_longer_than_a_grpc_message() {
    const LONG: usize = 6 << 20;
    let lab = Lab::start("long-log-line", 1).await;
    lab.apply_yaml(&format!(
        "apiVersion: tb/v1\nkind: TrainingJob\nmetadata:\n  name: chatty\nspec:\n  command: \
         [sh, -c, \"head -c {LONG} /dev/zero | tr '\\\\0' x; echo; echo done\"]\n"
    ))
    .await;
    lab.wait_job("chatty", "Succeeded", Duration::from_secs(60), |s| {
        s["phase"] == "Succeeded"
    })
    .await;
    let out = lab.tbctl_ok(&["logs", "tj/chatty"]).await;
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines.iter().map(|l| l.len()).collect::<Vec<_>>(),
        [LONG, 4],
        "one 6 MiB line, whole, then the next"
    );
    assert!(lines[0].bytes().all(|b| b == b'x'));
    assert_eq!(lines[1], "done");
}
