//! `tbctl explain isvc.spec.nodes`: documentation of every field, by kind and path.
//!
//! The tables (in `fields`) are written by hand; a test checks that every field of a fully
//! populated object is documented and every documented field exists.

// One field per line reads as a table; rustfmt would spread each over six lines.
#[rustfmt::skip]
mod fields;

use crate::kind::Kind;
use crate::object::API_VERSION;
use fields::{Field, kind_doc, top_level};

/// Documentation of `field_path` (e.g. `spec.nodes`; empty for the whole kind) of `kind`.
pub fn explain(kind: Kind, field_path: &str) -> Result<String, String> {
    let root = top_level(kind);
    let path = field_path.trim().trim_matches('.');
    let mut out = format!("KIND:     {kind}\nVERSION:  {API_VERSION}\n\n");
    if path.is_empty() {
        out.push_str(&format!(
            "DESCRIPTION:\n    {}\n\nFIELDS:\n",
            kind_doc(kind).0
        ));
        list_fields(&mut out, &root);
        return Ok(out);
    }
    let mut fields: &[Field] = &root;
    let mut found: Option<&Field> = None;
    let mut walked = String::new();
    for segment in path.split('.') {
        let field = fields.iter().find(|fd| fd.name == segment).ok_or_else(|| {
            let names: Vec<&str> = fields.iter().map(|fd| fd.name).collect();
            if fields.is_empty() {
                format!("{kind} field {walked} has no sub-fields")
            } else if walked.is_empty() {
                format!(
                    "{kind} has no field {segment:?}; its fields are {}",
                    names.join(", ")
                )
            } else {
                format!(
                    "{kind} field {walked} has no field {segment:?}; its fields are {}",
                    names.join(", ")
                )
            }
        })?;
        if !walked.is_empty() {
            walked.push('.');
        }
        walked.push_str(field.name);
        fields = field.fields;
        found = Some(field);
    }
    // The loop ran at least once because `path` is not empty.
    let field = found.ok_or_else(|| format!("{kind} has no field {path:?}"))?;
    out.push_str(&format!("FIELD:    {walked} <{}>", field.ty));
    if !field.note.is_empty() {
        out.push_str(&format!("  ({})", field.note));
    }
    out.push_str(&format!("\n\nDESCRIPTION:\n    {}\n", field.doc));
    if !field.fields.is_empty() {
        out.push_str("\nFIELDS:\n");
        list_fields(&mut out, field.fields);
    }
    Ok(out)
}

/// `tbctl explain isvc.spec.nodes`: the first segment names the kind (any alias).
pub fn explain_path(path: &str) -> Result<String, String> {
    let (kind, rest) = path.split_once('.').unwrap_or((path, ""));
    let kind =
        Kind::parse(kind).ok_or_else(|| crate::kind::UnknownKind(kind.to_string()).to_string())?;
    explain(kind, rest)
}

fn list_fields(out: &mut String, fields: &[Field]) {
    let width = fields.iter().map(|fd| fd.name.len()).max().unwrap_or(0);
    for fd in fields {
        let note = if fd.note.is_empty() {
            String::new()
        } else {
            format!("  ({})", fd.note)
        };
        out.push_str(&format!(
            "  {:width$}  <{}>{note}\n      {}\n",
            fd.name, fd.ty, fd.doc
        ));
    }
}

/// Every documented path under `spec` for a kind, for the completeness test.
#[cfg(test)]
fn spec_paths(kind: Kind) -> Vec<String> {
    fn walk(prefix: &str, fields: &[Field], out: &mut Vec<String>) {
        for fd in fields {
            let path = format!("{prefix}.{}", fd.name);
            walk(&path, fd.fields, out);
            out.push(path);
        }
    }
    let mut out = Vec::new();
    walk("spec", kind_doc(kind).1, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata;

    #[test]
    fn explains_a_kind() {
        let text = explain(Kind::InferenceService, "").unwrap();
        assert!(text.contains("KIND:     InferenceService"), "{text}");
        assert!(text.contains("spec"), "{text}");
        assert!(text.contains("metadata"), "{text}");
    }

    #[test]
    fn explains_an_object_field_with_its_sub_fields() {
        let text = explain_path("isvc.spec.nodes").unwrap();
        assert!(text.contains("FIELD:    spec.nodes <NodeRange>"), "{text}");
        assert!(text.contains("min"), "{text}");
        assert!(text.contains("default 1"), "{text}");
        assert!(text.contains("max"), "{text}");
    }

    #[test]
    fn explains_a_leaf() {
        let text = explain(Kind::TrainingJob, "spec.backend").unwrap();
        assert!(text.contains("jaccl-ring"), "{text}");
        let text = explain(Kind::Schedule, "spec.jobTemplate.spec.ranks").unwrap();
        assert!(text.contains("default 1"), "{text}");
        let text = explain(Kind::Queue, "status.conditions.type").unwrap();
        assert!(text.contains("Ready"), "{text}");
    }

    #[test]
    fn explains_the_priority_policy_of_a_queue() {
        let text = explain_path("queue.spec.maxPriority").unwrap();
        assert!(
            text.contains("FIELD:    spec.maxPriority <integer>"),
            "{text}"
        );
        assert!(text.contains("refused at apply"), "{text}");
        let text = explain_path("queue.spec.preemption").unwrap();
        assert!(text.contains("withinNamespace"), "{text}");
        assert!(text.contains("otherNamespaces"), "{text}");
        let text = explain_path("queue.spec.preemption.otherNamespaces").unwrap();
        assert!(text.contains("(default Never)"), "{text}");
        let text = explain_path("tj.spec.priority").unwrap();
        assert!(text.contains("maxPriority"), "{text}");
    }

    #[test]
    fn unknown_fields_name_the_valid_ones() {
        let err = explain(Kind::InferenceService, "spec.nodez").unwrap_err();
        assert!(err.contains("no field \"nodez\""), "{err}");
        assert!(err.contains("model, parallelism, nodes"), "{err}");
        let err = explain(Kind::Model, "spec.layers.x").unwrap_err();
        assert!(err.contains("no sub-fields"), "{err}");
        assert!(
            explain_path("pods.spec")
                .unwrap_err()
                .contains("unknown kind")
        );
    }

    /// Every field a fully populated spec has is documented, and every documented spec field
    /// appears in the fully populated spec.
    #[test]
    fn documents_every_spec_field() {
        for kind in Kind::ALL {
            let obj = testdata::full_object(kind);
            let mut actual = Vec::new();
            testdata::json_paths("spec", &obj.spec, &mut actual);
            let documented = spec_paths(kind);
            for path in &actual {
                assert!(
                    documented.contains(path),
                    "{kind}: {path} is not documented"
                );
            }
            for path in &documented {
                assert!(
                    actual.contains(path),
                    "{kind}: documented {path} is missing from the full example"
                );
            }
        }
    }
}
