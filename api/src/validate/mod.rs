//! Checks an object as a whole and returns its normalised form; shared by tbctl (before sending)
//! and the controller (before storing), so both reject the same things with the same words.
//!
//! Normalising means: the kind is spelled canonically, a namespaced object without a namespace
//! gets `default`, and the spec is re-serialised from its typed form so that every default is
//! written out and fields appear in a stable order.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

use crate::bounds::{MAX_ANNOTATIONS_BYTES, MAX_OBJECT_BYTES, describe_bytes, excerpt_to};
use crate::kind::Kind;
use crate::meta::Condition;
use crate::name::{validate_label_key, validate_label_value, validate_name, validate_namespace};
use crate::object::{API_VERSION, Object};
use crate::specs::TypedSpec;

/// Namespaced objects without a namespace land here, as in Kubernetes.
pub const DEFAULT_NAMESPACE: &str = "default";

/// A rejected object: which field (`spec.nodes.min`, or empty for the whole object) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ValidationError {
    pub path: String,
    pub message: String,
}

impl ValidationError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        ValidationError {
            path: path.into(),
            message: message.into(),
        }
    }

    /// The same error seen from one level up: `nodes.min` under `spec` is `spec.nodes.min`.
    pub fn under(mut self, prefix: &str) -> Self {
        self.path = join_path(prefix, &self.path);
        self
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Joins field paths, keeping list indices attached: `spec` + `command[0]`, `spec` + `[0]`.
pub(crate) fn join_path(prefix: &str, path: &str) -> String {
    match (prefix.is_empty(), path.is_empty()) {
        (_, true) => prefix.to_string(),
        (true, false) => path.to_string(),
        (false, false) if path.starts_with('[') => format!("{prefix}{path}"),
        (false, false) => format!("{prefix}.{path}"),
    }
}

/// Checks `obj` and returns it normalised (see the module docs). The status is checked for shape
/// but left as it is.
pub fn validate_object(obj: &Object) -> Result<Object, ValidationError> {
    validate_size(obj)?;
    if obj.api_version != API_VERSION {
        return Err(ValidationError::new(
            "apiVersion",
            api_version_message(&obj.api_version),
        ));
    }
    let kind = Kind::parse(&obj.kind).ok_or_else(|| {
        ValidationError::new(
            "kind",
            crate::kind::UnknownKind(obj.kind.clone()).to_string(),
        )
    })?;
    let mut out = obj.clone();
    out.kind = kind.as_str().to_string();
    validate_metadata(kind, &mut out)?;
    no_nul_bytes("spec", &obj.spec)?;
    out.spec = TypedSpec::from_value(kind, &obj.spec)?.to_value();
    validate_status(kind, &obj.status)?;
    Ok(out)
}

/// How many bytes `value` takes as compact JSON, counted without building the text.
pub fn json_size<T: serde::Serialize + ?Sized>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail, and string-keyed trees always serialise.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// The object's and its annotations' sizes against [`MAX_OBJECT_BYTES`] and
/// [`MAX_ANNOTATIONS_BYTES`], so that no one object can fill the store.
pub fn validate_size(obj: &Object) -> Result<(), ValidationError> {
    let annotations: usize = obj
        .metadata
        .annotations
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    if annotations > MAX_ANNOTATIONS_BYTES {
        return Err(ValidationError::new(
            "metadata.annotations",
            format!(
                "the annotations take {annotations} bytes; all of an object's annotations \
                 together may take at most {}",
                describe_bytes(MAX_ANNOTATIONS_BYTES)
            ),
        ));
    }
    let size = json_size(obj);
    if size > MAX_OBJECT_BYTES {
        return Err(ValidationError::new(
            "",
            format!(
                "the object is {size} bytes; an object may be at most {} (as JSON)",
                describe_bytes(MAX_OBJECT_BYTES)
            ),
        ));
    }
    Ok(())
}

/// A status as sent on its own (by nodelets and tb itself) is bounded like an object.
pub fn validate_status_size(status: &Value) -> Result<(), ValidationError> {
    let size = json_size(status);
    if size > MAX_OBJECT_BYTES {
        return Err(ValidationError::new(
            "status",
            format!(
                "the status is {size} bytes; a status may be at most {} (as JSON)",
                describe_bytes(MAX_OBJECT_BYTES)
            ),
        ));
    }
    Ok(())
}

/// No string (value or key) under `value` holds a NUL byte: no program argument, environment
/// variable or path can carry one, so such a job could only fail on every node, over and over.
pub(crate) fn no_nul_bytes(path: &str, value: &Value) -> Result<(), ValidationError> {
    let nul = |path: String, s: &str| Err(nul_error(path, s));
    match value {
        Value::String(s) if s.contains('\0') => nul(path.to_string(), s),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| no_nul_bytes(&format!("{path}[{i}]"), v)),
        Value::Object(map) => map.iter().try_for_each(|(k, v)| {
            let at = join_path(path, &excerpt_to(k, 256).replace('\0', "\\0"));
            if k.contains('\0') {
                return nul(at, k);
            }
            no_nul_bytes(&at, v)
        }),
        _ => Ok(()),
    }
}

/// The one wording for a NUL byte in `s`, found at `path`.
pub(crate) fn nul_error(path: String, s: &str) -> ValidationError {
    let at = s.find('\0').unwrap_or(0);
    ValidationError::new(
        path,
        format!(
            "contains a NUL byte (at byte {at}); text fields cannot hold NUL (\\0): no command, \
             argument or environment variable can carry it"
        ),
    )
}

/// The one wording for a wrong apiVersion, used here and by the YAML loader.
pub(crate) fn api_version_message(got: &str) -> String {
    format!(
        "unsupported apiVersion {}; expected {API_VERSION:?}",
        crate::bounds::Quoted(got)
    )
}

/// Name, namespace (defaulted or refused by scope), label and annotation keys and values.
fn validate_metadata(kind: Kind, obj: &mut Object) -> Result<(), ValidationError> {
    let meta = &mut obj.metadata;
    validate_name(&meta.name).map_err(|m| ValidationError::new("metadata.name", m))?;
    if kind.is_namespaced() {
        if meta.namespace.is_empty() {
            meta.namespace = DEFAULT_NAMESPACE.to_string();
        }
        validate_namespace(&meta.namespace)
            .map_err(|m| ValidationError::new("metadata.namespace", m))?;
    } else if !meta.namespace.is_empty() {
        return Err(ValidationError::new(
            "metadata.namespace",
            format!("{kind} is cluster-scoped and has no namespace; remove metadata.namespace"),
        ));
    }
    validate_labels("metadata.labels", &meta.labels)?;
    validate_annotations("metadata.annotations", &meta.annotations)
}

/// Label keys and values, reported at `PREFIX.KEY`.
pub(crate) fn validate_labels(
    prefix: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), ValidationError> {
    for (key, value) in labels {
        let at = || format!("{prefix}.{}", excerpt_to(key, 256));
        validate_label_key(key).map_err(|m| ValidationError::new(at(), m))?;
        validate_label_value(value).map_err(|m| ValidationError::new(at(), m))?;
    }
    Ok(())
}

/// Annotation keys follow the label-key rules; values are free text, without NUL bytes.
pub(crate) fn validate_annotations(
    prefix: &str,
    annotations: &BTreeMap<String, String>,
) -> Result<(), ValidationError> {
    for (key, value) in annotations {
        let at = || format!("{prefix}.{}", excerpt_to(key, 256));
        validate_label_key(key).map_err(|m| ValidationError::new(at(), m))?;
        if value.contains('\0') {
            return Err(nul_error(at(), value));
        }
        if key == crate::specs::allocation::ANNOTATION_MANIFEST_DIR {
            validate_manifest_dir(value).map_err(|m| ValidationError::new(at(), m))?;
        }
    }
    Ok(())
}

/// The manifest directory tb records: an absolute, normalised path of bounded length (the
/// nodelets look for programs there, so it must say plainly where).
pub(crate) fn validate_manifest_dir(value: &str) -> Result<(), String> {
    let max = crate::bounds::MAX_MANIFEST_DIR_BYTES;
    if value.len() > max {
        return Err(format!(
            "expected a directory of at most {max} bytes, got {} bytes",
            value.len()
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(format!(
            "expected a directory without control characters, got {value:?}"
        ));
    }
    if !value.starts_with('/') {
        return Err(format!("expected an absolute directory, got {value:?}"));
    }
    if value.split('/').any(|part| part == "." || part == "..") || value.contains("//") {
        return Err(format!(
            "expected a normalised directory (no `.`, `..` or `//`), got {value:?}"
        ));
    }
    Ok(())
}

/// A status must be a mapping (or absent); `conditions` and `observedGeneration`, which every
/// kind shares, must have their documented types. The rest belongs to each kind's controller.
pub fn validate_status(kind: Kind, status: &Value) -> Result<(), ValidationError> {
    let map = match status {
        Value::Null => return Ok(()),
        Value::Object(map) => map,
        other => {
            return Err(ValidationError::new(
                "status",
                format!(
                    "the status of a {kind} must be a mapping, got {}",
                    json_type(other)
                ),
            ));
        }
    };
    if let Some(conditions) = map.get("conditions") {
        crate::serde_util::from_value::<Vec<Condition>>(conditions)
            .map_err(|e| e.under("status.conditions"))?;
    }
    if let Some(generation) = map.get("observedGeneration") {
        crate::serde_util::from_value::<u64>(generation)
            .map_err(|e| e.under("status.observedGeneration"))?;
    }
    Ok(())
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests;
