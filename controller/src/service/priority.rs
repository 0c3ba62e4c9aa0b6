//! Priority policy at apply: a TrainingJob, an InferenceService or a Schedule's jobTemplate
//! asking for a priority above the ceiling of the queue it resolves to (the queue's
//! `maxPriority`, else its `priority`; 0 for work in no queue) is refused, for every caller —
//! admins raise the Queue instead. The queue is resolved exactly as the scheduler resolves it
//! ([`Queues::priority_refusal`]), against the Queues stored plus those applied in the same
//! request (which replace the stored ones of their name).
//!
//! FAILED_PRECONDITION, not INVALID_ARGUMENT: the manifest is well formed, and the same request
//! succeeds once an admin raises the Queue's ceiling; it is the stored policy that refuses it.
//! A refusal is only given against an up-to-date store (checked again after a read barrier);
//! an acceptance against a store that lags is harmless, as the scheduler caps every job's
//! priority at its queue's ceiling when it orders and preempts.

use std::collections::BTreeSet;
use std::sync::Arc;

use tb_api::specs::{InferenceServiceSpec, ScheduleSpec, TrainingJobSpec, parse_spec};
use tb_api::{Kind, Object};
use tonic::Status;

use crate::raft::RaftNode;
use crate::scheduler::queues::Queues;
use crate::store::State;

use super::unavailable;

/// Refuse `objects` (one apply request, already validated and authorized) if one of them asks
/// for a priority its queue does not allow.
pub(crate) async fn check_apply(node: &Arc<RaftNode>, objects: &[Object]) -> Result<(), Status> {
    if !objects.iter().any(|o| asked(o).is_some()) {
        return Ok(());
    }
    if refusal(&node.store().read(), objects).is_none() {
        return Ok(());
    }
    // This member's copy may lag behind a Queue just raised: refuse only what the latest
    // policy refuses.
    node.linearize().await.map_err(unavailable)?;
    match refusal(&node.store().read(), objects) {
        None => Ok(()),
        Some(reason) => {
            tracing::info!(%reason, "apply refused by priority policy");
            Err(Status::failed_precondition(reason))
        }
    }
}

/// What a job-creating object asks for: the field's path, the queue it names, the priority.
fn asked(obj: &Object) -> Option<(&'static str, Option<String>, i32)> {
    let (path, queue, priority) = match obj.kind()? {
        Kind::TrainingJob => {
            let s: TrainingJobSpec = parse_spec(&obj.spec).ok()?;
            ("spec.priority", s.queue, s.priority)
        }
        Kind::InferenceService => {
            let s: InferenceServiceSpec = parse_spec(&obj.spec).ok()?;
            ("spec.priority", s.queue, s.priority)
        }
        Kind::Schedule => {
            let s: ScheduleSpec = parse_spec(&obj.spec).ok()?;
            let t = s.job_template.spec;
            ("spec.jobTemplate.spec.priority", t.queue, t.priority)
        }
        _ => return None,
    };
    Some((path, queue, priority?))
}

/// The first object of `objects` whose priority is above its queue's ceiling under the Queues
/// of `state` as `objects` would leave them, with why.
pub(crate) fn refusal(state: &State, objects: &[Object]) -> Option<String> {
    let applied: Vec<Arc<Object>> = objects
        .iter()
        .filter(|o| o.kind() == Some(Kind::Queue))
        .map(|o| Arc::new(o.clone()))
        .collect();
    let replaced: BTreeSet<&str> = applied.iter().map(|q| q.metadata.name.as_str()).collect();
    let queues: Vec<Arc<Object>> = state
        .list(Kind::Queue.as_str(), "")
        .into_iter()
        .filter(|q| !replaced.contains(q.metadata.name.as_str()))
        .chain(applied.iter().cloned())
        .collect();
    let queues = Queues::new(&queues);
    objects.iter().enumerate().find_map(|(i, obj)| {
        let (path, queue, priority) = asked(obj)?;
        let ns = &obj.metadata.namespace;
        let why = queues.priority_refusal(ns, queue, Some(priority))?;
        Some(format!(
            "objects[{i}] ({} {ns}/{}): {path}: {why}",
            obj.kind, obj.metadata.name
        ))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use tb_api::ObjectMeta;

    use super::*;
    use crate::store::{Command, Op};

    fn object(kind: &str, namespace: &str, name: &str, spec: Value) -> Object {
        let obj = Object {
            api_version: "tb/v1".into(),
            kind: kind.into(),
            metadata: ObjectMeta {
                name: name.into(),
                namespace: namespace.into(),
                ..Default::default()
            },
            spec,
            status: Value::Null,
        };
        tb_api::validate_object(&obj).expect("valid object")
    }

    fn queue(name: &str, spec: Value) -> Object {
        object("Queue", "", name, spec)
    }

    fn job(namespace: &str, spec: Value) -> Object {
        let mut spec = spec;
        spec["command"] = json!(["true"]);
        object("TrainingJob", namespace, "j", spec)
    }

    fn state_with(objects: Vec<Object>) -> State {
        let mut state = State::default();
        let cmd = Command {
            request_id: String::new(),
            now: "2026-06-01T00:00:00.000Z".into(),
            op: Op::Apply { objects },
            user: String::new(),
        };
        state.apply(1, &cmd);
        state
    }

    #[test]
    fn a_priority_above_the_queues_ceiling_is_refused_with_the_figures() {
        let state = state_with(vec![
            queue(
                "batch",
                json!({"priority": 1, "maxPriority": 10, "namespaces": ["vision"]}),
            ),
            queue("plain", json!({"priority": 5})),
        ]);
        let refused = |objects: &[Object]| refusal(&state, objects);
        // Named queue, and the queue listing the namespace: the scheduler's resolution.
        let greedy = job("vision", json!({"queue": "batch", "priority": i32::MAX}));
        assert_eq!(
            refused(std::slice::from_ref(&greedy)).as_deref(),
            Some(
                "objects[0] (TrainingJob vision/j): spec.priority: 2147483647 is above queue \
                 \"batch\"'s maxPriority 10"
            )
        );
        assert!(refused(&[job("vision", json!({"priority": 11}))]).is_some());
        assert_eq!(refused(&[job("vision", json!({"priority": 10}))]), None);
        assert_eq!(refused(&[job("vision", json!({"priority": -3}))]), None);
        assert_eq!(refused(&[job("vision", json!({}))]), None);
        // No maxPriority: the queue's own priority is the ceiling.
        let why = refused(&[job("x", json!({"queue": "plain", "priority": 6}))]).unwrap();
        assert!(
            why.contains("6 is above queue \"plain\"'s maxPriority 5 (its priority"),
            "{why}"
        );
        // In no queue: at most 0.
        let why = refused(&[job("other", json!({"priority": 1}))]).unwrap();
        assert!(
            why.contains("spec.priority: 1 is above 0, the most a job in no queue may ask for"),
            "{why}"
        );
        assert_eq!(refused(&[job("other", json!({"priority": 0}))]), None);
        // A queue the job may not use or that does not exist: the scheduler holds it instead.
        assert_eq!(
            refused(&[job("other", json!({"queue": "batch", "priority": 99}))]),
            None
        );
        assert_eq!(
            refused(&[job("x", json!({"queue": "nope", "priority": 99}))]),
            None
        );
        // The second object is named; a Schedule's template and a service are checked too.
        let schedule = object(
            "Schedule",
            "vision",
            "nightly",
            json!({"schedule": "@daily",
                   "jobTemplate": {"spec": {"command": ["true"], "priority": 50}}}),
        );
        let why = refused(&[job("vision", json!({})), schedule]).unwrap();
        assert!(
            why.starts_with(
                "objects[1] (Schedule vision/nightly): spec.jobTemplate.spec.priority: 50 is \
                 above queue \"batch\"'s maxPriority 10"
            ),
            "{why}"
        );
        let service = object(
            "InferenceService",
            "vision",
            "chat",
            json!({"model": "m", "priority": 11}),
        );
        assert!(refused(&[service]).is_some());
    }

    #[test]
    fn queues_applied_in_the_same_request_are_the_policy() {
        let state = state_with(vec![queue(
            "batch",
            json!({"maxPriority": 10, "namespaces": ["vision"]}),
        )]);
        let high = job("vision", json!({"priority": 20}));
        assert!(refusal(&state, std::slice::from_ref(&high)).is_some());
        let raised = queue(
            "batch",
            json!({"maxPriority": 20, "namespaces": ["vision"]}),
        );
        assert_eq!(refusal(&state, &[raised, high]), None);
        let lowered = queue("batch", json!({"maxPriority": 5, "namespaces": ["vision"]}));
        let low = job("vision", json!({"priority": 8}));
        assert!(refusal(&state, std::slice::from_ref(&low)).is_none());
        assert!(refusal(&state, &[lowered, low]).is_some());
    }
}
