//! The objects tests write, built as JSON in one place so that a change to a kind's schema is
//! one edit here, and helpers to read them back.
//!
//! Tests that need a value they can change (a "register") use a Model and keep the value in
//! `spec.source.path`: changing it is a spec change, so it bumps `metadata.generation`.

use serde_json::{Value, json};
use tb_api::Object;

pub const API_VERSION: &str = "tb/v1";

/// A Model in `namespace` whose spec carries `value`.
pub fn model(namespace: &str, name: &str, value: &str) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": "Model",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"format": "gguf", "source": {"path": model_path(value)}},
    })
}

fn model_path(value: &str) -> String {
    format!("/models/{value}.gguf")
}

/// The value a [`model`] was built with, read back from a stored object.
pub fn model_value(obj: &Object) -> Option<String> {
    obj.spec
        .get("source")?
        .get("path")?
        .as_str()?
        .strip_prefix("/models/")?
        .strip_suffix(".gguf")
        .map(str::to_string)
}

/// A cluster-scoped Queue.
pub fn queue(name: &str) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {},
    })
}

/// Parse an object the server returned; panics with the text when it is not one.
pub fn parse(json: &str) -> Object {
    Object::from_json(json)
        .unwrap_or_else(|e| panic!("the server returned an invalid object ({e}): {json}"))
}

/// A namespace name unique to one test run, so tests sharing a store never see each other.
pub fn unique_namespace(prefix: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}-{}", &id[..8])
}

/// A fresh idempotency key.
pub fn request_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// SmolLM2 (the GGUF at `model`) as a Model, and `chat`: a built-in InferenceService of it
/// split over two Macs in a pipeline (context 2048, batch 2). With `holder`, only that node is
/// said to hold the file, and the other stage fetches its shard from it.
pub fn smollm2_service_yaml(model: &str, holder: Option<&str>) -> String {
    let nodes = holder
        .map(|h| format!("\n    nodes: [{h}]"))
        .unwrap_or_default();
    format!(
        "apiVersion: tb/v1
kind: Model
metadata:
  name: smollm2
spec:
  format: gguf
  source:
    path: {model}{nodes}
  architecture: llama
  layers: 30
  hiddenSize: 576
  heads: 9
  kvHeads: 3
  contextLength: 8192
  vocabSize: 49152
  bytesPerLayer: 2Mi
  totalBytes: 98Mi
---
apiVersion: tb/v1
kind: InferenceService
metadata:
  name: chat
spec:
  model: smollm2
  executor: builtin
  parallelism: pipeline
  nodes:
    min: 2
    max: 2
  context: 2048
  batch: 2
"
    )
}
