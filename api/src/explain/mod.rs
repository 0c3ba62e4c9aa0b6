//! `tbctl explain isvc.spec.nodes`: documentation of every field, by kind and path.
//!
//! Generated from the api types: their JSON schemas (derived with schemars, which follows the
//! serde renames and defaults) give each field's name, type, default and, from its `///` doc
//! comment, its description. There is no table to keep in step with the types.

mod order;
mod schema;

use crate::kind::Kind;
use crate::object::API_VERSION;
pub use order::declaration_order;
pub use schema::NOTE;
use schema::{Field, kind_doc};

/// Documentation of `field_path` (e.g. `spec.nodes`; empty for the whole kind) of `kind`.
pub fn explain(kind: Kind, field_path: &str) -> Result<String, String> {
    let doc = kind_doc(kind);
    let path = field_path.trim().trim_matches('.');
    let mut out = format!("KIND:     {kind}\nVERSION:  {API_VERSION}\n\n");
    if path.is_empty() {
        out.push_str(&format!("DESCRIPTION:\n    {}\n\nFIELDS:\n", doc.doc));
        list_fields(&mut out, &doc.fields);
        return Ok(out);
    }
    let mut fields: &[Field] = &doc.fields;
    let mut found: Option<&Field> = None;
    let mut walked = String::new();
    for segment in path.split('.') {
        let field = fields.iter().find(|fd| fd.name == segment).ok_or_else(|| {
            let names: Vec<&str> = fields.iter().map(|fd| fd.name.as_str()).collect();
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
        walked.push_str(&field.name);
        fields = &field.fields;
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
        list_fields(&mut out, &field.fields);
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

/// Every documented path under `spec` for a kind, with its description, for the
/// completeness test.
#[cfg(test)]
fn spec_paths(kind: Kind) -> Vec<(String, String)> {
    fn walk(prefix: &str, fields: &[Field], out: &mut Vec<(String, String)>) {
        for fd in fields {
            let path = format!("{prefix}.{}", fd.name);
            walk(&path, &fd.fields, out);
            out.push((path, fd.doc.clone()));
        }
    }
    let mut out = Vec::new();
    let doc = kind_doc(kind);
    let spec = doc.fields.iter().find(|fd| fd.name == "spec");
    walk("spec", spec.map_or(&[][..], |fd| &fd.fields), &mut out);
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

    /// Every field a fully populated spec has is documented (has a doc comment), and every
    /// field the spec types declare appears in the fully populated spec.
    #[test]
    fn documents_every_spec_field() {
        for kind in Kind::ALL {
            let obj = testdata::full_object(kind);
            let mut actual = Vec::new();
            testdata::json_paths("spec", &obj.spec, &mut actual);
            for other in testdata::alternative_objects(kind) {
                testdata::json_paths("spec", &other.spec, &mut actual);
            }
            let documented = spec_paths(kind);
            for path in &actual {
                assert!(
                    documented.iter().any(|(p, _)| p == path),
                    "{kind}: {path} is not in the schema"
                );
            }
            for (path, doc) in &documented {
                assert!(!doc.is_empty(), "{kind}: {path} has no doc comment");
                assert!(
                    actual.contains(path),
                    "{kind}: {path} is missing from the full example"
                );
            }
        }
    }

    /// The fields every kind has are documented too.
    #[test]
    fn documents_metadata_and_status() {
        for kind in Kind::ALL {
            for (path, note) in [
                ("metadata.name", "(required)"),
                ("metadata.creationTimestamp", "(set by tb)"),
                ("status.conditions.lastTransitionTime", ""),
            ] {
                let text = explain(kind, path).unwrap();
                assert!(text.contains(note), "{kind} {path}: {text}");
                let description = text.split("DESCRIPTION:").nth(1).unwrap_or("").trim();
                assert!(!description.is_empty(), "{kind} {path}: {text}");
            }
        }
    }
}
