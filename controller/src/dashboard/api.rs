//! The dashboard's JSON endpoints: reads of this controller's replica of the store (a
//! follower's may trail the leader by a heartbeat; the change stream says when to read again)
//! and the one action, deleting a job. Objects are sent as the API stores them, so the page
//! and `tbctl get -o json` agree; jobs carry a few derived fields (queue, position, staging).
//!
//! Every answer is bounded: at most [`MAX_OBJECTS`] objects of a kind (newest first) and
//! [`MAX_EVENTS`] events; `truncated` says when more were left out.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tb_api::status::{JobPhase, JobStatus, NodeStatus};
use tb_api::{Kind, Object, ObjectKey};
use tonic::Code;

use super::rights::{Refusal, Viewer, sign_in};
use super::{Dashboard, error, json_response};
use crate::auth::{Access, Verb, authorize};
use crate::scheduler::view::ClusterView;
use crate::scheduler::{order, usage};
use crate::store::{Op, Response as StoreResponse, State as StoreState};

/// Most objects of one kind in one answer.
pub const MAX_OBJECTS: usize = 500;
/// Most events in one answer (the newest).
pub const MAX_EVENTS: usize = 200;

type Shared = State<Arc<Dashboard>>;

/// Sign in, then check the API lets the user list `kinds`.
fn reader(d: &Dashboard, headers: &HeaderMap, kinds: &[Kind]) -> Result<Viewer, Refusal> {
    let viewer = sign_in(d, headers)?;
    for kind in kinds {
        if let Err(denied) = authorize(
            &viewer.caller,
            &Access::new(Verb::List, kind.as_str(), "", ""),
        ) {
            return Err(Refusal::new(StatusCode::FORBIDDEN, denied.to_string()));
        }
    }
    Ok(viewer)
}

/// The objects of `kind` the viewer sees, newest first, at most `limit`; and whether more were
/// left out.
fn visible(
    state: &StoreState,
    viewer: &Viewer,
    kind: Kind,
    limit: usize,
) -> (Vec<Arc<Object>>, bool) {
    let mut objects: Vec<Arc<Object>> = state
        .list(kind.as_str(), "")
        .into_iter()
        .filter(|o| viewer.sees(&o.metadata.namespace))
        .collect();
    objects.sort_by(|a, b| {
        b.metadata
            .creation_timestamp
            .cmp(&a.metadata.creation_timestamp)
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    let truncated = objects.len() > limit;
    objects.truncate(limit);
    (objects, truncated)
}

fn values(objects: &[Arc<Object>]) -> Vec<Value> {
    objects
        .iter()
        .map(|o| serde_json::to_value(&**o).unwrap_or(Value::Null))
        .collect()
}

/// `{"user", "role", "namespaces"}`: who the token names.
pub async fn whoami(State(d): Shared, headers: HeaderMap) -> Response {
    match sign_in(&d, &headers) {
        Ok(v) => json_response(&v.describe()),
        Err(r) => r.into_response(),
    }
}

/// The lab: Macs (Node objects: memory, ports, engine figures) and cables (Link objects:
/// measured bandwidth, latency, RDMA).
pub async fn lab(State(d): Shared, headers: HeaderMap) -> Response {
    let viewer = match reader(&d, &headers, &[Kind::Node, Kind::Link]) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let state = d.node.store().read();
    let (mut nodes, nodes_cut) = visible(&state, &viewer, Kind::Node, MAX_OBJECTS);
    let (mut links, links_cut) = visible(&state, &viewer, Kind::Link, MAX_OBJECTS);
    nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    links.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    json_response(&json!({
        "nodes": values(&nodes),
        "links": values(&links),
        "revision": state.revision,
        "truncated": nodes_cut || links_cut,
    }))
}

/// TrainingJobs and InferenceServices, each with `status.queue`, `status.position` (its place
/// in the cluster-wide order while Pending, as the scheduler orders) and `status.staging`
/// (model bytes staged of those to stage, over its current ranks).
pub async fn jobs(State(d): Shared, headers: HeaderMap) -> Response {
    let viewer = match reader(&d, &headers, &[Kind::TrainingJob, Kind::InferenceService]) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let state = d.node.store().read();
    let (mut jobs, cut_tj) = visible(&state, &viewer, Kind::TrainingJob, MAX_OBJECTS);
    let (services, cut_isvc) = visible(&state, &viewer, Kind::InferenceService, MAX_OBJECTS);
    jobs.extend(services);
    let places = queue_places(&state, &d.scheduler);
    let jobs: Vec<Value> = jobs
        .iter()
        .map(|job| {
            let mut v = serde_json::to_value(&**job).unwrap_or(Value::Null);
            let key = (
                job.kind.clone(),
                job.metadata.namespace.clone(),
                job.metadata.name.clone(),
            );
            let staging = staging(&state, job);
            if !v["status"].is_object() {
                v["status"] = json!({});
            }
            if let Some((queue, position)) = places.get(&key) {
                v["status"]["queue"] = json!(queue);
                if let Some(p) = position {
                    v["status"]["position"] = json!(p);
                }
            }
            if let Some((staged, total)) = staging {
                v["status"]["staging"] = json!({"stagedBytes": staged, "stageBytes": total});
            }
            v
        })
        .collect();
    json_response(&json!({
        "jobs": jobs,
        "revision": state.revision,
        "truncated": cut_tj || cut_isvc,
    }))
}

/// Each job's queue ("" when unqueued) and, while Pending, its 1-based place in the order the
/// scheduler admits jobs in (the same figures `tbctl get` shows).
fn queue_places(
    state: &StoreState,
    cfg: &crate::scheduler::SchedulerConfig,
) -> BTreeMap<(String, String, String), (String, Option<usize>)> {
    let view = ClusterView::build(state);
    let shares = usage::fair_shares(&state.usage, &view.queues, chrono::Utc::now(), cfg);
    let mut all = state.list(Kind::TrainingJob.as_str(), "");
    all.extend(state.list(Kind::InferenceService.as_str(), ""));
    let ordered = order::order(all, &view, &shares);
    let positions = order::positions(&ordered);
    ordered
        .iter()
        .map(|j| {
            let key = (
                j.kind.clone(),
                j.metadata.namespace.clone(),
                j.metadata.name.clone(),
            );
            let queue = view.queues.queue_of(j).ok().flatten().unwrap_or_default();
            let position = positions.get(&key).copied();
            (key, (queue, position))
        })
        .collect()
}

/// Model bytes staged and to stage over a job's current ranks; None when nothing stages.
fn staging(state: &StoreState, job: &Object) -> Option<(u64, u64)> {
    let status = JobStatus::from_value(&job.status);
    let (mut staged, mut total) = (0u64, 0u64);
    for rank in &status.placement {
        let key = ObjectKey {
            kind: Kind::Allocation.as_str().into(),
            namespace: job.metadata.namespace.clone(),
            name: rank.allocation.clone(),
        };
        if let Some(a) = state.get(&key) {
            let s = tb_api::specs::allocation::AllocationStatus::from_value(&a.status);
            staged = staged.saturating_add(s.staged_bytes);
            total = total.saturating_add(s.stage_bytes);
        }
    }
    (total > 0).then_some((staged, total))
}

/// Queues with their pending and running jobs (of those the viewer sees).
pub async fn queues(State(d): Shared, headers: HeaderMap) -> Response {
    let viewer = match reader(&d, &headers, &[Kind::Queue]) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let state = d.node.store().read();
    let (mut queues, cut) = visible(&state, &viewer, Kind::Queue, MAX_OBJECTS);
    queues.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let places = queue_places(&state, &d.scheduler);
    let mut counts: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for ((kind, namespace, name), (queue, _)) in &places {
        let key = ObjectKey {
            kind: kind.clone(),
            namespace: namespace.clone(),
            name: name.clone(),
        };
        let Some(job) = state.get(&key) else { continue };
        let phase = JobStatus::from_value(&job.status).phase;
        let c = counts.entry(queue.as_str()).or_default();
        match phase {
            JobPhase::Pending => c.0 += 1,
            JobPhase::Scheduled | JobPhase::Running => c.1 += 1,
            _ => {}
        }
    }
    let queues: Vec<Value> = queues
        .iter()
        .map(|q| {
            let (pending, running) = counts
                .get(q.metadata.name.as_str())
                .copied()
                .unwrap_or_default();
            json!({"queue": &**q, "pending": pending, "running": running})
        })
        .collect();
    json_response(&json!({"queues": queues, "revision": state.revision, "truncated": cut}))
}

/// The newest events the viewer sees.
pub async fn events(State(d): Shared, headers: HeaderMap) -> Response {
    let viewer = match reader(&d, &headers, &[Kind::Event]) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let state = d.node.store().read();
    let mut events: Vec<Arc<Object>> = state
        .list(Kind::Event.as_str(), "")
        .into_iter()
        .filter(|e| viewer.sees(&e.metadata.namespace))
        .collect();
    let last = |e: &Object| {
        e.spec
            .get("lastTimestamp")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    events.sort_by_key(|e| std::cmp::Reverse(last(e)));
    let truncated = events.len() > MAX_EVENTS;
    events.truncate(MAX_EVENTS);
    json_response(
        &json!({"events": values(&events), "revision": state.revision, "truncated": truncated}),
    )
}

/// Models, each with the Macs holding a whole staged copy (`heldBy`).
pub async fn models(State(d): Shared, headers: HeaderMap) -> Response {
    let viewer = match reader(&d, &headers, &[Kind::Model, Kind::Node]) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let state = d.node.store().read();
    let (models, cut) = visible(&state, &viewer, Kind::Model, MAX_OBJECTS);
    let held: Vec<(String, Vec<String>)> = state
        .list(Kind::Node.as_str(), "")
        .iter()
        .map(|n| {
            (
                n.metadata.name.clone(),
                NodeStatus::from_value(&n.status).models,
            )
        })
        .collect();
    let models: Vec<Value> = models
        .iter()
        .map(|m| {
            let path = m.spec.pointer("/source/path").and_then(Value::as_str);
            let held_by: Vec<&str> = held
                .iter()
                .filter(|(_, files)| path.is_some_and(|p| files.iter().any(|f| f == p)))
                .map(|(node, _)| node.as_str())
                .collect();
            let mut v = serde_json::to_value(&**m).unwrap_or(Value::Null);
            v["heldBy"] = json!(held_by);
            v
        })
        .collect();
    json_response(&json!({"models": models, "revision": state.revision, "truncated": cut}))
}

/// Deletes a TrainingJob or InferenceService (which stops its ranks), if the API lets the user:
/// a viewer, or a member outside their namespaces, is answered 403 with the API's reason, and
/// the refusal is in the audit log as over gRPC.
pub async fn delete_job(
    State(d): Shared,
    headers: HeaderMap,
    Path((kind, namespace, name)): Path<(String, String, String)>,
) -> Response {
    let viewer = match sign_in(&d, &headers) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let Some(kind) =
        Kind::parse(&kind).filter(|k| matches!(k, Kind::TrainingJob | Kind::InferenceService))
    else {
        return error(
            StatusCode::BAD_REQUEST,
            "kind: expected TrainingJob or InferenceService",
        );
    };
    if let Err(m) = tb_api::name::validate_name(&name) {
        return error(StatusCode::BAD_REQUEST, &format!("name: {m}"));
    }
    if let Err(m) = tb_api::name::validate_namespace(&namespace) {
        return error(StatusCode::BAD_REQUEST, &format!("namespace: {m}"));
    }
    let access = Access::new(Verb::Delete, kind.as_str(), &namespace, &name);
    if let Err(status) = crate::service::check(&d.node, &viewer.caller, &access) {
        return from_status(&status);
    }
    let key = ObjectKey {
        kind: kind.as_str().into(),
        namespace,
        name,
    };
    let op = Op::Delete {
        key,
        resource_version: 0,
    };
    let request_id = uuid::Uuid::new_v4().to_string();
    match crate::service::commit(&d.node, request_id, viewer.caller.user(), op).await {
        Ok(StoreResponse::Deleted {
            resource_version, ..
        }) => json_response(&json!({"deleted": true, "revision": resource_version})),
        Ok(other) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("unexpected store response {other:?}"),
        ),
        Err(status) => from_status(&status),
    }
}

/// A gRPC refusal as the HTTP answer it would be.
pub fn from_status(status: &tonic::Status) -> Response {
    let code = match status.code() {
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::FailedPrecondition | Code::Aborted | Code::AlreadyExists => StatusCode::CONFLICT,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::ResourceExhausted => StatusCode::INSUFFICIENT_STORAGE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(code, status.message())
}

pub async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "no such dashboard endpoint")
}
