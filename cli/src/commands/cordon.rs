//! `tbctl cordon NODE` and `tbctl uncordon NODE`: keep new work off a Mac, or let it back.
//!
//! Cordon sets the Node's `spec.unschedulable`; drain (see `drain`) also adds the taint
//! `tb/drain=true:NoExecute`, which asks tb to move running work away; uncordon clears both and
//! keeps every other taint. The Node is read, changed and written back with Apply carrying the
//! resourceVersion read (optimistic concurrency: a nodelet or another user writing in between
//! makes the server answer ABORTED, and the change is redone on a fresh read). Output:
//! `node/NAME cordoned` or `node/NAME uncordoned`, also when the Node already was.

use anyhow::{Result, bail};
use serde_json::{Map, Value};
use tb_api::proto::{ApplyRequest, GetRequest};
use tb_api::{Kind, Object};
use tonic::Code;

use super::{Ctx, parse_object, request_id};
use crate::output::emit;

/// The taint drain adds: running work is to leave the Mac.
pub const DRAIN_TAINT: &str = "tb/drain=true:NoExecute";
const DRAIN_TAINT_KEY: &str = "tb/drain";
/// Times a change is redone after losing a race with another writer.
const CONFLICT_RETRIES: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    Cordon,
    /// Cordon and taint `tb/drain=true:NoExecute`.
    Drain,
    /// Clear both.
    Uncordon,
}

impl Mark {
    pub fn past_tense(self) -> &'static str {
        match self {
            Mark::Cordon | Mark::Drain => "cordoned",
            Mark::Uncordon => "uncordoned",
        }
    }
}

/// A taint's key: `tb/drain` of `tb/drain=true:NoExecute`.
fn taint_key(taint: &str) -> &str {
    taint.split(['=', ':']).next().unwrap_or(taint)
}

/// The Node spec with `mark` applied. Other fields, and taints other than drain's, are kept;
/// uncordon leaves out what it clears rather than writing `false` and `[]`.
pub fn marked_spec(spec: &Value, mark: Mark) -> Result<Value> {
    let mut map = match spec {
        Value::Null => Map::new(),
        Value::Object(m) => m.clone(),
        other => bail!("the Node's spec is not an object: {other}"),
    };
    let mut taints: Vec<Value> = match map.remove("taints") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a,
        Some(other) => bail!("the Node's spec.taints is not a list: {other}"),
    };
    // Drop drain's taint whatever its value or effect; drain puts back the one it means.
    taints.retain(|t| t.as_str().is_none_or(|s| taint_key(s) != DRAIN_TAINT_KEY));
    match mark {
        Mark::Cordon => {
            map.insert("unschedulable".into(), Value::Bool(true));
            // Cordoning a drained Node keeps it drained.
            if let Some(Value::Array(old)) = spec.get("taints") {
                taints.extend(
                    old.iter()
                        .filter(|t| t.as_str().is_some_and(|s| taint_key(s) == DRAIN_TAINT_KEY))
                        .cloned(),
                );
            }
        }
        Mark::Drain => {
            map.insert("unschedulable".into(), Value::Bool(true));
            taints.push(Value::String(DRAIN_TAINT.into()));
        }
        Mark::Uncordon => {
            map.remove("unschedulable");
        }
    }
    if !taints.is_empty() {
        map.insert("taints".into(), Value::Array(taints));
    }
    Ok(Value::Object(map))
}

/// Whether two specs say the same (a missing spec is an empty one).
fn same_spec(a: &Value, b: &Value) -> bool {
    let empty = Value::Object(Map::new());
    let norm = |v: &Value| {
        if v.is_null() {
            empty.clone()
        } else {
            v.clone()
        }
    };
    norm(a) == norm(b)
}

/// Apply `mark` to the Node and return it as stored.
pub async fn set_mark(ctx: &mut Ctx, node: &str, mark: Mark) -> Result<Object> {
    let mut attempt = 0;
    loop {
        let req = GetRequest {
            kind: Kind::Node.as_str().to_string(),
            namespace: String::new(),
            name: node.to_string(),
            stale: false,
        };
        let current = parse_object(&ctx.client().get(req).await?.object_json)?;
        let spec = marked_spec(&current.spec, mark)?;
        if same_spec(&spec, &current.spec) {
            return Ok(current);
        }
        let mut next = current.clone();
        next.spec = spec;
        // Apply never changes status; leaving it out keeps the request small.
        next.status = Value::Null;
        let req = ApplyRequest {
            objects_json: vec![next.to_json()],
            dry_run: false,
            request_id: request_id(),
        };
        match ctx.client().apply(req).await {
            Ok(resp) => {
                return match resp.results.first() {
                    Some(r) if !r.object_json.is_empty() => parse_object(&r.object_json),
                    _ => Ok(next),
                };
            }
            Err(e) if e.code == Code::Aborted && attempt < CONFLICT_RETRIES => {
                attempt += 1;
                tracing::info!(node, attempt, error = %e, "node changed meanwhile; reading it again");
            }
            Err(e) => return Err(e.into()),
        }
    }
}

pub async fn run(ctx: &mut Ctx, node: &str, mark: Mark) -> Result<Object> {
    let stored = set_mark(ctx, node, mark).await?;
    emit(&format!("node/{node} {}\n", mark.past_tense()))?;
    Ok(stored)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cordon_sets_unschedulable_and_keeps_the_rest() {
        let spec = json!({"address": "10.0.0.2", "taints": ["gpu=busy:NoSchedule"]});
        assert_eq!(
            marked_spec(&spec, Mark::Cordon).expect("cordon"),
            json!({"address": "10.0.0.2", "unschedulable": true, "taints": ["gpu=busy:NoSchedule"]})
        );
        assert_eq!(
            marked_spec(&Value::Null, Mark::Cordon).expect("cordon"),
            json!({"unschedulable": true})
        );
    }

    #[test]
    fn drain_adds_its_taint_once() {
        let spec = json!({"taints": ["gpu=busy:NoSchedule"]});
        let drained = marked_spec(&spec, Mark::Drain).expect("drain");
        assert_eq!(
            drained,
            json!({"unschedulable": true, "taints": ["gpu=busy:NoSchedule", "tb/drain=true:NoExecute"]})
        );
        assert_eq!(marked_spec(&drained, Mark::Drain).expect("again"), drained);
        // A drain taint with another value or effect is replaced by the one drain means.
        let odd = json!({"taints": ["tb/drain=later:NoSchedule"]});
        assert_eq!(
            marked_spec(&odd, Mark::Drain).expect("drain"),
            json!({"unschedulable": true, "taints": ["tb/drain=true:NoExecute"]})
        );
    }

    #[test]
    fn cordon_keeps_a_drain() {
        let drained = json!({"unschedulable": true, "taints": ["tb/drain=true:NoExecute"]});
        assert_eq!(
            marked_spec(&drained, Mark::Cordon).expect("cordon"),
            drained
        );
    }

    #[test]
    fn uncordon_clears_both_and_nothing_else() {
        let spec = json!({"address": "mac1", "unschedulable": true,
                          "taints": ["gpu=busy:NoSchedule", "tb/drain=true:NoExecute"]});
        assert_eq!(
            marked_spec(&spec, Mark::Uncordon).expect("uncordon"),
            json!({"address": "mac1", "taints": ["gpu=busy:NoSchedule"]})
        );
        let only_drain = json!({"unschedulable": true, "taints": ["tb/drain=true:NoExecute"]});
        assert_eq!(
            marked_spec(&only_drain, Mark::Uncordon).expect("uncordon"),
            json!({})
        );
        assert!(same_spec(
            &marked_spec(&Value::Null, Mark::Uncordon).expect("noop"),
            &Value::Null
        ));
    }

    #[test]
    fn malformed_specs_are_reported() {
        assert!(marked_spec(&json!("x"), Mark::Cordon).is_err());
        assert!(marked_spec(&json!({"taints": "a=b:NoSchedule"}), Mark::Drain).is_err());
    }

    #[test]
    fn the_result_is_a_valid_node_spec() {
        let spec = marked_spec(&json!({"taints": ["a=b:NoSchedule"]}), Mark::Drain).expect("drain");
        let typed: tb_api::specs::NodeSpec = serde_json::from_value(spec).expect("NodeSpec");
        assert!(typed.unschedulable);
        assert_eq!(typed.taints, ["a=b:NoSchedule", DRAIN_TAINT]);
    }
}
