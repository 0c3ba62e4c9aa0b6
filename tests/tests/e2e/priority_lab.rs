//! Priority policy end to end, on real processes (a controller and one nodelet): priorities are
//! the admins' Queue policy, not a member's free choice.
//!
//! - A member whose queue allows at most 10 asks for 2147483647 (a TrainingJob, and a Schedule
//!   whose template does): refused at apply with FAILED_PRECONDITION naming the field, the
//!   value, the queue and its ceiling, through the raw gRPC API (dry run too) and through
//!   `tbctl apply`; nothing is stored. The same manifest is refused for the admin as well
//!   (admins change the Queue instead).
//! - A permitted priority does not preempt another namespace's running job under the default
//!   policy (the member's job waits Unschedulable, the other job keeps running); once the admin
//!   sets the queue's `preemption.otherNamespaces: LowerPriority` it does, and runs.
//!
//! `tbctl explain queue.spec.maxPriority` documents the field.
//!
//! Sizes: one job of 60 % of the Mac's allocatable memory fills it, so a second cannot start
//! unless the first is stopped. No assertion is about speed; waits are bounded.

use std::time::Duration;

use serde_json::{Value, json};
use tb_api::proto::ApplyRequest;
use tb_tests::lab::Lab;
use tb_tests::objects::request_id;
use tb_tests::{Client, Tbctl, step};
use tonic::Code;

/// Generous bound for a job to be placed, start or stop on a loaded 2-core machine.
const JOB_TIMEOUT: Duration = Duration::from_secs(30);
const MI: u64 = 1 << 20;
const REFUSAL: &str = "spec.priority: 2147483647 is above queue \"plab-vision\"'s maxPriority 10";

/// MiB per job: 60 % of the Mac, so one fits and two never do.
async fn big_job_mi(lab: &Lab) -> u64 {
    let nodes = lab.nodes().await;
    let allocatable = nodes[0]["status"]["capacity"]["allocatableBytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no allocatableBytes: {nodes:#?}"));
    allocatable / MI * 6 / 10
}

/// A TrainingJob that sleeps until stopped.
fn job(namespace: &str, name: &str, memory_mi: u64, priority: Option<i64>) -> Value {
    let mut spec = json!({
        "command": ["sh", "-c", "exec sleep 300"],
        "memory": format!("{memory_mi}Mi"),
        "backoffLimit": 0,
    });
    if let Some(p) = priority {
        spec["priority"] = json!(p);
    }
    json!({"apiVersion": "tb/v1", "kind": "TrainingJob",
           "metadata": {"name": name, "namespace": namespace}, "spec": spec})
}

/// A TrainingJob's status, once `check` accepts it.
async fn wait_status(
    lab: &Lab,
    namespace: &str,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let check = &check;
    tb_tests::wait::expect(
        &format!("tj/{name} in {namespace}: {what}"),
        JOB_TIMEOUT,
        || async move {
            let jobs = lab.list("TrainingJob", namespace).await?;
            let job = jobs
                .iter()
                .find(|j| j["metadata"]["name"] == name)
                .ok_or_else(|| format!("no tj/{name} in {namespace}"))?;
            if check(&job["status"]) {
                Ok(job["status"].clone())
            } else {
                Err(format!("status: {}", job["status"]))
            }
        },
    )
    .await
}

async fn names(lab: &Lab, kind: &str, namespace: &str) -> Vec<String> {
    lab.list(kind, namespace)
        .await
        .expect("list")
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn a_members_priority_above_its_queue_is_refused_and_preempts_only_where_allowed() {
    let lab = Lab::start("priority-policy", 1).await;
    let addr = lab.addr().to_string();
    let big = big_job_mi(&lab).await;
    step!("a job asks for {big}Mi: one fills the Mac");
    lab.apply_yaml(
        "apiVersion: tb/v1
kind: Queue
metadata:
  name: plab-research
spec:
  namespaces: [research]
---
apiVersion: tb/v1
kind: Queue
metadata:
  name: plab-vision
spec:
  priority: 1
  maxPriority: 10
  namespaces: [vision]
",
    )
    .await;
    let out = lab.tbctl_ok(&["explain", "queue.spec.maxPriority"]).await;
    assert!(out.stdout.contains("spec.maxPriority <integer>"), "{out}");
    let out = lab
        .tbctl_ok(&[
            "admin", "user", "create", "alice", "--role", "member", "-n", "vision",
        ])
        .await;
    let alice = out.stdout.trim().to_string();
    assert!(alice.starts_with("tbuser-"), "{out}");

    // Another namespace's job fills the Mac.
    lab.apply_yaml(&job("research", "long", big, None).to_string())
        .await;
    wait_status(&lab, "research", "long", "Running", |s| {
        s["phase"] == "Running"
    })
    .await;

    // Raw gRPC, as the member: refused, dry run or not, with the reason; nothing stored.
    let member = Client::with_token(vec![addr.clone()], Some(&alice));
    let greedy = job("vision", "greedy", big, Some(i64::from(i32::MAX)));
    for dry_run in [true, false] {
        let e = member
            .objects(&addr)
            .apply(ApplyRequest {
                objects_json: vec![greedy.to_string()],
                dry_run,
                request_id: request_id(),
            })
            .await
            .expect_err("a priority above the queue's ceiling");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert_eq!(
            e.message(),
            format!("objects[0] (TrainingJob vision/greedy): {REFUSAL}"),
            "dry run {dry_run}"
        );
    }
    let schedule = json!({"apiVersion": "tb/v1", "kind": "Schedule",
        "metadata": {"name": "nightly", "namespace": "vision"},
        "spec": {"schedule": "@daily", "jobTemplate": {"spec": greedy["spec"].clone()}}});
    let e = member
        .objects(&addr)
        .apply(ApplyRequest {
            objects_json: vec![schedule.to_string()],
            dry_run: false,
            request_id: request_id(),
        })
        .await
        .expect_err("a Schedule template above the queue's ceiling");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message()
            .contains("spec.jobTemplate.spec.priority: 2147483647 is above queue \"plab-vision\""),
        "{e:?}"
    );

    // tbctl, as the member and as the admin: the server's reason, nothing stored.
    let file = lab.dir().join("greedy.yaml");
    std::fs::write(&file, greedy.to_string()).expect("manifest");
    let file = file.display().to_string();
    let as_alice = Tbctl::new(std::slice::from_ref(&addr), &lab.dir().join("home-alice"))
        .with_token(Some(&alice));
    for (who, out) in [
        ("member", as_alice.run(&["apply", "-f", &file]).await),
        ("admin", lab.tbctl(&["apply", "-f", &file]).await),
    ] {
        assert!(!out.success(), "{who}: {out}");
        assert_eq!(
            out.stderr.trim(),
            format!("error: objects[0] (TrainingJob vision/greedy): {REFUSAL}"),
            "{who}: {out}"
        );
    }
    assert_eq!(
        names(&lab, "TrainingJob", "vision").await,
        Vec::<String>::new()
    );
    assert_eq!(
        names(&lab, "Schedule", "vision").await,
        Vec::<String>::new()
    );

    // A permitted priority, above the running job's, in another namespace: by default it
    // preempts nothing there and waits.
    let urgent = job("vision", "urgent", big, Some(10));
    let file = lab.dir().join("urgent.yaml");
    std::fs::write(&file, urgent.to_string()).expect("manifest");
    let out = as_alice
        .run(&["apply", "-f", &file.display().to_string()])
        .await;
    assert!(out.success(), "{out}");
    let waiting = wait_status(&lab, "vision", "urgent", "Unschedulable", |s| {
        s["reason"] == "Unschedulable"
    })
    .await;
    step!("urgent waits: {}", waiting["message"]);
    let long = wait_status(&lab, "research", "long", "still running", |_| true).await;
    assert_eq!(
        (long["phase"].as_str(), long["epoch"].as_u64()),
        (Some("Running"), Some(1)),
        "{long:#}"
    );
    let allocs = lab
        .list("Allocation", "research")
        .await
        .expect("allocations");
    assert!(
        allocs.iter().all(|a| a["spec"]["desired"] != "stop"),
        "nothing of research is being stopped: {allocs:#?}"
    );

    // The admin lets the vision queue preempt other namespaces: now it does.
    lab.apply_yaml(
        "apiVersion: tb/v1
kind: Queue
metadata:
  name: plab-vision
spec:
  priority: 1
  maxPriority: 10
  namespaces: [vision]
  preemption:
    otherNamespaces: LowerPriority
",
    )
    .await;
    let long = wait_status(&lab, "research", "long", "Preempted", |s| {
        s["reason"] == "Preempted"
    })
    .await;
    let message = long["message"].as_str().unwrap_or("");
    assert!(
        message.contains("preempted by TrainingJob/urgent (priority 10 over 0)"),
        "{long:#}"
    );
    wait_status(&lab, "vision", "urgent", "Running", |s| {
        s["phase"] == "Running"
    })
    .await;
}
