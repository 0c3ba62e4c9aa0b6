//! `tbctl diff`: what `apply` would change. The server computes the applied objects (a dry-run
//! apply); tbctl compares the parts a user writes (metadata name, namespace, labels,
//! annotations, and spec) with what is stored, and prints a unified diff of their YAML.

use anyhow::Result;
use tb_api::proto::{ApplyRequest, GetRequest};
use tb_api::{Object, ObjectMeta};
use tonic::Code;

use super::{Ctx, parse_object, request_id};
use crate::args::DiffArgs;
use crate::linediff::unified;
use crate::manifests;
use crate::output::emit;

const CONTEXT_LINES: usize = 3;

/// Exit code 0 without changes, 1 with changes (errors exit 2, in main).
pub async fn run(ctx: &mut Ctx, args: &DiffArgs) -> Result<u8> {
    let objects = manifests::load_valid(&args.files, &ctx.target)?;
    let req = ApplyRequest {
        objects_json: objects.iter().map(|l| l.object.to_json()).collect(),
        dry_run: true,
        request_id: request_id(),
    };
    let resp = ctx.client().apply(req).await?;
    let mut changed = false;
    for r in &resp.results {
        if r.outcome == "unchanged" {
            continue;
        }
        let merged = parse_object(&r.object_json)?;
        let live = if r.outcome == "created" {
            None
        } else {
            let get = GetRequest {
                kind: r.kind.clone(),
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                stale: false,
            };
            match ctx.client().get(get).await {
                Ok(g) => Some(parse_object(&g.object_json)?),
                // Deleted since the dry run: everything is new.
                Err(e) if e.code == Code::NotFound => None,
                Err(e) => return Err(e.into()),
            }
        };
        let text = object_diff(live.as_ref(), &merged);
        if !text.is_empty() {
            changed = true;
            emit(&text)?;
        }
    }
    Ok(u8::from(changed))
}

/// The unified diff between the stored object (`None`: not stored) and the one applying would
/// store, over the fields a user writes.
pub fn object_diff(live: Option<&Object>, merged: &Object) -> String {
    let path = diff_path(merged);
    let old = live
        .map(|o| tb_api::load::to_yaml(&user_fields(o)))
        .unwrap_or_default();
    let new = tb_api::load::to_yaml(&user_fields(merged));
    unified(
        &old,
        &new,
        &format!("live/{path}"),
        &format!("merged/{path}"),
        CONTEXT_LINES,
    )
}

fn diff_path(o: &Object) -> String {
    let kind = o.kind.to_ascii_lowercase();
    if o.metadata.namespace.is_empty() {
        format!("{kind}/{}", o.metadata.name)
    } else {
        format!("{kind}/{}/{}", o.metadata.namespace, o.metadata.name)
    }
}

/// The object without server-set metadata and status.
fn user_fields(o: &Object) -> Object {
    Object {
        api_version: o.api_version.clone(),
        kind: o.kind.clone(),
        metadata: ObjectMeta {
            name: o.metadata.name.clone(),
            namespace: o.metadata.namespace.clone(),
            labels: o.metadata.labels.clone(),
            annotations: o.metadata.annotations.clone(),
            ..ObjectMeta::default()
        },
        spec: o.spec.clone(),
        status: serde_json::Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: serde_json::Value) -> Object {
        serde_json::from_value(v).expect("object")
    }

    #[test]
    fn server_fields_and_status_are_ignored() {
        let live = obj(json!({
            "apiVersion": "tb/v1", "kind": "Model",
            "metadata": {"name": "m", "namespace": "d", "uid": "u1", "resourceVersion": 7, "generation": 2},
            "spec": {"format": "gguf"}, "status": {"ready": true}
        }));
        let merged = obj(json!({
            "apiVersion": "tb/v1", "kind": "Model", "metadata": {"name": "m", "namespace": "d"},
            "spec": {"format": "gguf"}
        }));
        assert_eq!(object_diff(Some(&live), &merged), "");
    }

    #[test]
    fn changed_spec_shows_as_a_diff() {
        let live = obj(json!({
            "apiVersion": "tb/v1", "kind": "Model", "metadata": {"name": "m", "namespace": "d"},
            "spec": {"format": "gguf", "layers": 32}
        }));
        let merged = obj(json!({
            "apiVersion": "tb/v1", "kind": "Model", "metadata": {"name": "m", "namespace": "d"},
            "spec": {"format": "gguf", "layers": 40}
        }));
        let d = object_diff(Some(&live), &merged);
        assert!(
            d.starts_with("--- live/model/d/m\n+++ merged/model/d/m\n@@ "),
            "{d}"
        );
        assert!(d.contains("\n-  layers: 32\n+  layers: 40\n"), "{d}");
        let created = object_diff(None, &merged);
        assert!(created.contains("@@ -0,0 +1,"), "{created}");
        assert!(
            created.lines().skip(3).all(|l| l.starts_with('+')),
            "{created}"
        );
    }
}
