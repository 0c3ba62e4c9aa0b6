//! The object API's contract, checked against real controllers over gRPC: optimistic
//! concurrency, generation and status rules, idempotent retries, all-or-none applies, request
//! limits, linearizable reads on followers, and errors that name what was wrong.
//!
//! Every test checks not only the answer to a bad request but also that nothing stored changed.

use std::time::Duration;

use serde_json::{Value, json};
use tb_api::Object;
use tb_api::proto::{ApplyRequest, ApplyResponse, DeleteRequest, UpdateStatusRequest};
use tb_tests::objects::{self, model, model_value, parse, queue, unique_namespace};
use tb_tests::{Client, Cluster, ClusterOptions};
use tonic::{Code, Status};

/// Budget for a write that may meet an election.
const BUDGET: Duration = Duration::from_secs(20);

/// One object's part of an apply answer.
#[derive(Debug)]
struct Applied {
    outcome: String,
    object: Object,
}

fn results(resp: ApplyResponse) -> Vec<Applied> {
    resp.results
        .into_iter()
        .map(|r| Applied {
            outcome: r.outcome,
            object: parse(&r.object_json),
        })
        .collect()
}

async fn apply(client: &Client, objs: &[Value]) -> Result<Vec<Applied>, Status> {
    client
        .apply(objs, &objects::request_id(), 0, BUDGET)
        .await
        .map(results)
}

/// Apply a single object that must be accepted.
async fn apply_ok(client: &Client, obj: Value) -> Applied {
    let mut r = apply(client, std::slice::from_ref(&obj))
        .await
        .unwrap_or_else(|e| panic!("apply of {obj} failed: {e:?}"));
    assert_eq!(r.len(), 1, "one result per object");
    r.remove(0)
}

/// A Model as stored (linearizable read), or `None` if it does not exist.
async fn get_model(client: &Client, ns: &str, name: &str) -> Option<Object> {
    match client
        .get_on(&client.addrs()[0], "Model", ns, name, false)
        .await
    {
        Ok(json) => Some(parse(&json)),
        Err(e) if e.code() == Code::NotFound => None,
        Err(e) => panic!("get Model {ns}/{name}: {e:?}"),
    }
}

async fn model_names(client: &Client, ns: &str) -> Vec<String> {
    let list = client
        .list("Model", ns, 0, BUDGET)
        .await
        .unwrap_or_else(|e| panic!("list: {e:?}"));
    list.objects_json
        .iter()
        .map(|j| parse(j).metadata.name)
        .collect()
}

fn with_resource_version(mut obj: Value, rv: u64) -> Value {
    obj["metadata"]["resourceVersion"] = json!(rv);
    obj
}

async fn single(name: &str) -> Cluster {
    Cluster::start(name, ClusterOptions::new(1)).await
}

#[tokio::test]
async fn stale_resource_version_is_aborted_and_changes_nothing() {
    let cluster = single("conflict").await;
    let client = cluster.client();
    let ns = unique_namespace("conflict");

    let v1 = apply_ok(&client, model(&ns, "m", "v1")).await;
    assert_eq!(v1.outcome, "created");
    let v2 = apply_ok(&client, model(&ns, "m", "v2")).await;
    assert_eq!(v2.outcome, "configured");
    let (rv1, rv2) = (
        v1.object.metadata.resource_version,
        v2.object.metadata.resource_version,
    );
    assert!(rv2 > rv1, "resourceVersion must grow: {rv1} then {rv2}");

    // A stale version, in a two-object apply whose other object is new and valid.
    let stale = with_resource_version(model(&ns, "m", "v3"), rv1);
    let err = apply(&client, &[model(&ns, "other", "x"), stale])
        .await
        .expect_err("a stale resourceVersion must be refused");
    assert_eq!(err.code(), Code::Aborted, "{err:?}");
    for rv in [rv1, rv2] {
        assert!(
            err.message().contains(&rv.to_string()),
            "the conflict should name both versions: {err:?}"
        );
    }

    let stored = get_model(&client, &ns, "m").await.expect("m still exists");
    assert_eq!(
        model_value(&stored).as_deref(),
        Some("v2"),
        "the refused apply changed m"
    );
    assert_eq!(stored.metadata.resource_version, rv2);
    assert_eq!(stored.metadata.generation, 2);
    assert!(
        get_model(&client, &ns, "other").await.is_none(),
        "all or none: 'other' was stored"
    );

    // The current version is accepted, as a string too (as in Kubernetes manifests).
    let mut current = model(&ns, "m", "v3");
    current["metadata"]["resourceVersion"] = json!(rv2.to_string());
    let v3 = apply_ok(&client, current).await;
    assert_eq!(v3.outcome, "configured");
    assert_eq!(v3.object.metadata.generation, 3);
    assert!(v3.object.metadata.resource_version > rv2);

    // Creating with a resourceVersion means "update exactly this": the object must exist.
    let err = apply(
        &client,
        &[with_resource_version(model(&ns, "ghost", "x"), rv2)],
    )
    .await
    .expect_err("a resourceVersion on a missing object must be refused");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(get_model(&client, &ns, "ghost").await.is_none());
}

#[tokio::test]
async fn generation_bumps_only_on_spec_change() {
    let cluster = single("generation").await;
    let client = cluster.client();
    let ns = unique_namespace("gen");

    let created = apply_ok(&client, model(&ns, "m", "a")).await;
    assert_eq!(created.outcome, "created");
    assert_eq!(created.object.metadata.generation, 1);
    assert!(
        !created.object.metadata.uid.is_empty(),
        "the server sets a uid"
    );
    assert!(
        created.object.metadata.creation_timestamp.is_some(),
        "the server sets creationTimestamp"
    );
    let rv = created.object.metadata.resource_version;

    let same = apply_ok(&client, model(&ns, "m", "a")).await;
    assert_eq!(same.outcome, "unchanged");
    assert_eq!(
        same.object.metadata.resource_version, rv,
        "an unchanged apply must not write"
    );
    assert_eq!(same.object.metadata.generation, 1);

    let mut labelled = model(&ns, "m", "a");
    labelled["metadata"]["labels"] = json!({"team": "vision"});
    let relabelled = apply_ok(&client, labelled.clone()).await;
    assert_eq!(relabelled.outcome, "configured");
    assert_eq!(
        relabelled.object.metadata.generation, 1,
        "labels are not spec"
    );
    assert!(relabelled.object.metadata.resource_version > rv);
    assert_eq!(
        relabelled
            .object
            .metadata
            .labels
            .get("team")
            .map(String::as_str),
        Some("vision")
    );

    let mut annotated = labelled.clone();
    annotated["metadata"]["annotations"] = json!({"note": "free text"});
    let reannotated = apply_ok(&client, annotated.clone()).await;
    assert_eq!(reannotated.outcome, "configured");
    assert_eq!(
        reannotated.object.metadata.generation, 1,
        "annotations are not spec"
    );

    let mut respecced = annotated;
    respecced["spec"] = model(&ns, "m", "b")["spec"].clone();
    let changed = apply_ok(&client, respecced).await;
    assert_eq!(changed.outcome, "configured");
    assert_eq!(
        changed.object.metadata.generation, 2,
        "a spec change bumps generation"
    );
    assert_eq!(
        changed.object.metadata.uid, created.object.metadata.uid,
        "uid is stable"
    );
    assert_eq!(
        changed.object.metadata.creation_timestamp, created.object.metadata.creation_timestamp,
        "creationTimestamp is stable"
    );

    let stored = get_model(&client, &ns, "m").await.expect("m exists");
    assert_eq!(stored.metadata.generation, 2);
    assert_eq!(model_value(&stored).as_deref(), Some("b"));
}

#[tokio::test]
async fn update_status_leaves_spec_and_generation_alone() {
    let cluster = single("status").await;
    let client = cluster.client();
    let addr = cluster.addr(0);
    let ns = unique_namespace("status");

    let created = apply_ok(&client, model(&ns, "m", "a")).await;
    let rv1 = created.object.metadata.resource_version;
    let status =
        json!({"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}]});
    let update = |status: &Value, rv: u64| UpdateStatusRequest {
        kind: "Model".into(),
        namespace: ns.clone(),
        name: "m".into(),
        status_json: status.to_string(),
        resource_version: rv,
        request_id: objects::request_id(),
    };

    let mut objects_client = client.objects(&addr);
    let updated = parse(
        &objects_client
            .update_status(update(&status, rv1))
            .await
            .unwrap_or_else(|e| panic!("UpdateStatus: {e:?}"))
            .into_inner()
            .object_json,
    );
    assert_eq!(updated.status, status);
    assert_eq!(
        updated.metadata.generation, 1,
        "a status write must not bump generation"
    );
    assert_eq!(
        updated.spec, created.object.spec,
        "a status write must not touch the spec"
    );
    let rv2 = updated.metadata.resource_version;
    assert!(
        rv2 > rv1,
        "a status write is a change: resourceVersion must grow"
    );

    // Stale version: refused, nothing changed.
    let err = objects_client
        .update_status(update(&json!({"observedGeneration": 7}), rv1))
        .await
        .expect_err("a stale resourceVersion must be refused");
    assert_eq!(err.code(), Code::Aborted, "{err:?}");

    // A status of the wrong shape: refused with the field's path.
    let err = objects_client
        .update_status(update(&json!({"conditions": "all good"}), 0))
        .await
        .expect_err("conditions must be a list");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("status.conditions"),
        "the error should name the field: {err:?}"
    );

    let stored = get_model(&client, &ns, "m").await.expect("m exists");
    assert_eq!(
        stored.status, status,
        "refused status writes changed the status"
    );
    assert_eq!(stored.metadata.resource_version, rv2);

    // Apply never writes status, even when the object carries one, and keeps the stored one.
    let mut with_status = model(&ns, "m", "b");
    with_status["status"] = json!({"observedGeneration": 99});
    let applied = apply_ok(&client, with_status).await;
    assert_eq!(applied.object.metadata.generation, 2);
    assert_eq!(applied.object.status, status, "apply changed the status");
    let stored = get_model(&client, &ns, "m").await.expect("m exists");
    assert_eq!(stored.status, status);
}

#[tokio::test]
async fn duplicate_request_id_is_applied_once() {
    let cluster = single("dedup").await;
    let client = cluster.client();
    let addr = cluster.addr(0);
    let ns = unique_namespace("dedup");
    let request = ApplyRequest {
        objects_json: vec![model(&ns, "m", "first").to_string()],
        dry_run: false,
        request_id: objects::request_id(),
    };

    let first = client
        .apply_on(&addr, request.clone())
        .await
        .expect("first apply");
    let again = client
        .apply_on(&addr, request.clone())
        .await
        .expect("repeated apply");
    assert_eq!(
        again, first,
        "a repeated request_id must get the first answer"
    );
    let stored = get_model(&client, &ns, "m").await.expect("m exists");
    let rv = parse(&first.results[0].object_json)
        .metadata
        .resource_version;
    assert_eq!(
        stored.metadata.resource_version, rv,
        "the repeat moved resourceVersion"
    );

    // Someone else changes m; the old request arriving late must not undo that.
    let second = apply_ok(&client, model(&ns, "m", "second")).await;
    assert_eq!(second.outcome, "configured");
    let late = client.apply_on(&addr, request).await.expect("late repeat");
    assert_eq!(late.resource_version, first.resource_version, "{late:?}");
    assert_eq!(late.results.len(), 1, "{late:?}");
    assert_eq!(
        late.results[0].outcome, "created",
        "a late repeat must say what the first apply did"
    );
    assert_eq!(
        parse(&late.results[0].object_json).metadata,
        parse(&first.results[0].object_json).metadata,
        "a late repeat must describe the object the first apply stored"
    );
    let stored = get_model(&client, &ns, "m").await.expect("m exists");
    assert_eq!(
        model_value(&stored).as_deref(),
        Some("second"),
        "the late repeat was applied again"
    );
    assert_eq!(
        stored.metadata.resource_version,
        second.object.metadata.resource_version
    );
    assert_eq!(stored.metadata.generation, 2);

    // The same holds for deletes: a repeated delete answers as the first did.
    let delete = DeleteRequest {
        kind: "Model".into(),
        namespace: ns.clone(),
        name: "m".into(),
        resource_version: 0,
        request_id: objects::request_id(),
    };
    let mut c = client.objects(&addr);
    let first_delete = c.delete(delete.clone()).await.expect("delete").into_inner();
    let repeated_delete = c
        .delete(delete)
        .await
        .unwrap_or_else(|e| panic!("a repeated delete must get the first answer, got {e:?}"))
        .into_inner();
    assert_eq!(repeated_delete, first_delete);
    assert!(get_model(&client, &ns, "m").await.is_none());
}

/// The idempotency contract is "the same answer", also when the object has moved on since: a
/// client whose first answer was lost must be able to use the retry's answer in its place.
#[tokio::test]
async fn a_late_repeat_gets_the_whole_first_answer() {
    let cluster = single("dedup-late").await;
    let client = cluster.client();
    let addr = cluster.addr(0);
    let ns = unique_namespace("late");
    let request = ApplyRequest {
        objects_json: vec![model(&ns, "m", "first").to_string()],
        dry_run: false,
        request_id: objects::request_id(),
    };
    let first = client
        .apply_on(&addr, request.clone())
        .await
        .expect("first apply");
    apply_ok(&client, model(&ns, "m", "second")).await;
    let late = client.apply_on(&addr, request).await.expect("late repeat");
    assert_eq!(
        late, first,
        "a late repeat must get the first answer, spec included"
    );
}

#[tokio::test]
async fn invalid_object_in_multi_object_apply_stores_nothing() {
    let cluster = single("invalid").await;
    let client = cluster.client();
    let ns = unique_namespace("invalid");
    apply_ok(&client, model(&ns, "existing", "v1")).await;

    let mut bad = model(&ns, "bad", "x");
    bad["spec"]["layers"] = json!(0);
    let updated_existing = model(&ns, "existing", "v2");
    let err = apply(
        &client,
        &[model(&ns, "good", "x"), updated_existing.clone(), bad],
    )
    .await
    .expect_err("an invalid object must be refused");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("objects[2]"),
        "the error should say which object: {err:?}"
    );
    assert!(
        err.message().contains("spec.layers"),
        "the error should name the field: {err:?}"
    );

    let mut unknown_field = model(&ns, "typo", "x");
    unknown_field["spec"]["layerz"] = json!(3);
    let err = apply(&client, &[updated_existing, unknown_field])
        .await
        .expect_err("an unknown spec field must be refused");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("layerz"),
        "the error should name the unknown field: {err:?}"
    );

    assert_eq!(
        model_names(&client, &ns).await,
        vec!["existing".to_string()],
        "a refused apply stored something"
    );
    let existing = get_model(&client, &ns, "existing").await.expect("exists");
    assert_eq!(
        model_value(&existing).as_deref(),
        Some("v1"),
        "a refused apply changed an object"
    );
}

#[tokio::test]
async fn oversized_apply_is_refused_with_a_clear_message() {
    let cluster = single("oversized").await;
    let client = cluster.client();
    let addr = cluster.addr(0);
    let ns = unique_namespace("big");

    let mut big = model(&ns, "big", "x");
    big["metadata"]["annotations"] = json!({"blob": "x".repeat(20 << 20)});
    let req = ApplyRequest {
        objects_json: vec![big.to_string()],
        dry_run: false,
        request_id: objects::request_id(),
    };
    let err = client
        .apply_on(&addr, req)
        .await
        .expect_err("a 20 MiB apply must be refused");
    assert!(
        matches!(
            err.code(),
            Code::ResourceExhausted | Code::OutOfRange | Code::InvalidArgument
        ),
        "unexpected code: {err:?}"
    );
    let msg = err.message().to_ascii_lowercase();
    assert!(
        msg.contains("too large") || msg.contains("limit") || msg.contains("exceeds"),
        "the error should say the request is too large: {err:?}"
    );
    assert!(
        err.message().contains("16777216") || err.message().contains("16 MiB"),
        "the error should state the limit: {err:?}"
    );

    // The controller is unharmed and stored nothing.
    apply_ok(&client, model(&ns, "small", "x")).await;
    assert_eq!(model_names(&client, &ns).await, vec!["small".to_string()]);
}

#[tokio::test]
async fn unknown_kind_is_invalid_argument() {
    let cluster = single("kind").await;
    let client = cluster.client();
    let addr = cluster.addr(0);
    let ns = unique_namespace("kind");

    let mut pod = model(&ns, "p", "x");
    pod["kind"] = json!("Pod");
    let err = apply(&client, &[model(&ns, "m", "x"), pod])
        .await
        .expect_err("unknown kind");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("kind"),
        "the error should name the field: {err:?}"
    );
    assert!(
        err.message().contains("Pod"),
        "the error should name the kind: {err:?}"
    );

    let err = client
        .get_on(&addr, "Pod", &ns, "p", false)
        .await
        .expect_err("get of an unknown kind");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let err = client
        .list_on(&addr, "Pod", &ns, false)
        .await
        .expect_err("list of an unknown kind");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");

    assert!(
        model_names(&client, &ns).await.is_empty(),
        "the refused apply stored its valid object"
    );
}

#[tokio::test]
async fn delete_honours_resource_version_and_reports_missing_objects() {
    let cluster = single("delete").await;
    let client = cluster.client();
    let addr = cluster.addr(0);
    let ns = unique_namespace("delete");
    let v1 = apply_ok(&client, model(&ns, "m", "v1")).await;
    let v2 = apply_ok(&client, model(&ns, "m", "v2")).await;
    let delete = |rv: u64| DeleteRequest {
        kind: "Model".into(),
        namespace: ns.clone(),
        name: "m".into(),
        resource_version: rv,
        request_id: objects::request_id(),
    };
    let mut c = client.objects(&addr);

    let err = c
        .delete(delete(v1.object.metadata.resource_version))
        .await
        .expect_err("a stale delete must be refused");
    assert_eq!(err.code(), Code::Aborted, "{err:?}");
    assert!(
        get_model(&client, &ns, "m").await.is_some(),
        "a refused delete deleted"
    );

    let gone = c
        .delete(delete(v2.object.metadata.resource_version))
        .await
        .expect("delete at the current version")
        .into_inner();
    let gone_obj = parse(&gone.object_json);
    assert_eq!(
        model_value(&gone_obj).as_deref(),
        Some("v2"),
        "delete returns the deleted object"
    );
    assert!(gone.resource_version > v2.object.metadata.resource_version);
    assert!(get_model(&client, &ns, "m").await.is_none());

    let err = c
        .delete(delete(0))
        .await
        .expect_err("deleting a missing object");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
}

#[tokio::test]
async fn linearizable_read_on_a_follower_sees_the_preceding_write() {
    let mut cluster = Cluster::start("follower-read", ClusterOptions::new(3)).await;
    let leader = cluster.leader_index().await;
    let followers: Vec<usize> = (0..cluster.len()).filter(|&i| i != leader).collect();
    let client = cluster.client();
    let ns = unique_namespace("lin");

    for round in 0..30 {
        let value = format!("v{round}");
        let written = client
            .apply(
                &[model(&ns, "m", &value)],
                &objects::request_id(),
                leader,
                BUDGET,
            )
            .await
            .unwrap_or_else(|e| panic!("write {round}: {e:?}"));
        let written_rv = parse(&written.results[0].object_json)
            .metadata
            .resource_version;
        let follower = cluster.addr(followers[round % followers.len()]);
        let json = client
            .get_on(&follower, "Model", &ns, "m", false)
            .await
            .unwrap_or_else(|e| panic!("linearizable get on follower {follower}: {e:?}"));
        let read = parse(&json);
        assert_eq!(
            model_value(&read).as_deref(),
            Some(value.as_str()),
            "round {round}: follower {follower} missed a write acknowledged before the read began"
        );
        assert_eq!(read.metadata.resource_version, written_rv);

        let list = client
            .list_on(&follower, "Model", &ns, false)
            .await
            .unwrap_or_else(|e| panic!("linearizable list on follower {follower}: {e:?}"));
        assert!(
            list.resource_version >= written_rv,
            "round {round}: list at revision {} predates the write at {written_rv}",
            list.resource_version
        );
    }
}

#[tokio::test]
async fn cluster_scoped_kinds_refuse_a_namespace() {
    let cluster = single("scope").await;
    let client = cluster.client();
    let addr = cluster.addr(0);

    let created = apply_ok(&client, queue("research")).await;
    assert_eq!(created.outcome, "created");
    assert!(
        created.object.metadata.namespace.is_empty(),
        "a Queue got a namespace: {:?}",
        created.object
    );

    let mut namespaced = queue("team-queue");
    namespaced["metadata"]["namespace"] = json!("team");
    let err = apply(&client, &[namespaced])
        .await
        .expect_err("a namespaced Queue must be refused");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("metadata.namespace"),
        "the error should name the field: {err:?}"
    );

    // Reads ignore a namespace for cluster-scoped kinds.
    let json = client
        .get_on(&addr, "Queue", "any-namespace", "research", false)
        .await
        .unwrap_or_else(|e| panic!("get Queue research: {e:?}"));
    assert_eq!(parse(&json).metadata.name, "research");
    let list = client
        .list_on(&addr, "Queue", "", false)
        .await
        .unwrap_or_else(|e| panic!("list: {e:?}"));
    let names: Vec<String> = list
        .objects_json
        .iter()
        .map(|j| parse(j).metadata.name)
        .collect();
    assert_eq!(names, ["research"], "the refused Queue was stored");
}
