//! Reading the objects named by `-f` (files, directories, or `-` for stdin) and preparing them to
//! be sent: namespaces defaulted from `-n`/the context, every object validated locally, repeats
//! caught, and each job read from a file annotated with its file's directory (where the nodelets
//! look for a relative program). All problems in all inputs are collected, so one run reports every mistake.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::Path;

use tb_api::load::{LoadedObject, STDIN_NAME};
use tb_api::specs::allocation::ANNOTATION_MANIFEST_DIR;
use tb_api::{Kind, Object};

use crate::config::Target;

/// Problems found in the input, one per line, each naming file, line and field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputErrors(pub Vec<String>);

impl fmt::Display for InputErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("\n"))
    }
}

impl std::error::Error for InputErrors {}

/// A loaded object, and whether its document wrote `metadata.namespace` itself.
#[derive(Debug, Clone)]
pub struct Input {
    pub loaded: LoadedObject,
    /// The loader fills in `default` for a missing namespace; tbctl must know it was missing
    /// to use `-n` or the context's namespace instead.
    pub namespace_given: bool,
}

/// Load every input in order. Load errors are collected across inputs.
pub fn load(inputs: &[String]) -> Result<Vec<Input>, InputErrors> {
    let mut objects = Vec::new();
    let mut errors = Vec::new();
    let mut read_stdin = false;
    for input in inputs {
        let (loaded, stdin_text) = if input == "-" {
            if std::mem::replace(&mut read_stdin, true) {
                errors.push("-f -: standard input can be read only once".to_string());
                continue;
            }
            // Bounded, and not-UTF-8 named with its line and column.
            let text = match tb_api::load::read_text(STDIN_NAME, std::io::stdin().lock()) {
                Ok(text) => text,
                Err(e) => {
                    errors.push(e.to_string());
                    continue;
                }
            };
            (tb_api::load::load_str(STDIN_NAME, &text), Some(text))
        } else {
            let path = Path::new(input);
            if !path.exists() {
                errors.push(format!("{input}: no such file or directory"));
                continue;
            }
            (tb_api::load::load_path(path), None)
        };
        match loaded {
            Ok(objs) => {
                let mut unset: HashMap<String, HashSet<(Kind, String)>> = HashMap::new();
                for l in objs {
                    let without = unset.entry(l.source.clone()).or_insert_with(|| {
                        let text = match &stdin_text {
                            Some(t) => Some(t.clone()),
                            None => std::fs::read_to_string(&l.source).ok(),
                        };
                        text.map(|t| namespace_omitted(&t)).unwrap_or_default()
                    });
                    let namespace_given = !l
                        .object
                        .kind()
                        .is_some_and(|k| without.contains(&(k, l.object.metadata.name.clone())));
                    objects.push(Input {
                        loaded: l,
                        namespace_given,
                    });
                }
            }
            Err(e) => errors.extend(e.to_string().lines().map(str::to_string)),
        }
    }
    if errors.is_empty() {
        Ok(objects)
    } else {
        Err(InputErrors(errors))
    }
}

/// The (kind, name) of each document in `text` that has no `metadata.namespace`. Within one
/// load a kind and name with no namespace appears at most once (it would be a repeat).
pub fn namespace_omitted(text: &str) -> HashSet<(Kind, String)> {
    use serde::Deserialize;
    let mut out = HashSet::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let Ok(v) = serde_yaml::Value::deserialize(doc) else {
            continue;
        };
        let kind = v.get("kind").and_then(|k| k.as_str()).and_then(Kind::parse);
        let meta = v.get("metadata");
        let name = meta.and_then(|m| m.get("name")).and_then(|n| n.as_str());
        let ns = meta
            .and_then(|m| m.get("namespace"))
            .and_then(|n| n.as_str())
            .unwrap_or("");
        if let (Some(kind), Some(name)) = (kind, name)
            && ns.is_empty()
        {
            out.insert((kind, name.to_string()));
        }
    }
    out
}

/// Where a loaded object came from, as `FILE:LINE`.
pub fn origin(l: &LoadedObject) -> String {
    format!("{}:{}", l.source, l.line)
}

/// Put each namespaced object without a namespace into the target namespace. With an explicit
/// `-n`, an object naming another namespace is a mistake, not a choice.
pub fn default_namespaces(objects: &mut [Input], target: &Target) -> Result<(), InputErrors> {
    let mut errors = Vec::new();
    for input in objects.iter_mut() {
        let l = &mut input.loaded;
        let Some(kind) = l.object.kind() else {
            continue;
        };
        if !kind.is_namespaced() {
            continue;
        }
        if l.object.metadata.namespace.is_empty() || !input.namespace_given {
            l.object.metadata.namespace = target.namespace.clone();
        } else if target.namespace_explicit && l.object.metadata.namespace != target.namespace {
            errors.push(format!(
                "{}: metadata.namespace: {:?} does not match --namespace {:?}",
                origin(l),
                l.object.metadata.namespace,
                target.namespace
            ));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(InputErrors(errors))
    }
}

/// Load, default namespaces and validate: the objects as they will be sent, or every problem.
pub fn load_valid(inputs: &[String], target: &Target) -> Result<Vec<LoadedObject>, InputErrors> {
    let mut loaded = load(inputs)?;
    default_namespaces(&mut loaded, target)?;
    let mut errors = Vec::new();
    let mut valid = Vec::with_capacity(loaded.len());
    for Input { loaded: l, .. } in loaded {
        // Checked again: the namespace may have changed since the loader checked it.
        match tb_api::validate::validate_object(&l.object) {
            Ok(mut object) => {
                record_manifest_dir(&mut object, &l.source);
                valid.push(LoadedObject { object, ..l })
            }
            Err(e) => errors.push(format!("{}: {e}", origin(&l))),
        }
    }
    errors.extend(repeats(&valid));
    if !errors.is_empty() {
        return Err(InputErrors(errors));
    }
    if valid.is_empty() {
        return Err(InputErrors(vec![format!(
            "no objects found in {}",
            inputs.join(", ")
        )]));
    }
    Ok(valid)
}

/// Annotates a job read from a file (and a Schedule's job template) with the file's absolute
/// directory ([`ANNOTATION_MANIFEST_DIR`]), unless the manifest sets it itself: a relative
/// program in the job's command is then found beside the manifest on a Mac that has the same
/// directory. Jobs from stdin, and directories the API would refuse (too long, odd characters),
/// get none.
fn record_manifest_dir(object: &mut Object, source: &str) {
    if source == STDIN_NAME {
        return;
    }
    let Some(dir) = Path::new(source)
        .canonicalize()
        .ok()
        .and_then(|file| file.parent().map(Path::to_path_buf))
        .and_then(|dir| dir.to_str().map(str::to_string))
    else {
        return;
    };
    let mut annotated = object.clone();
    match object.kind() {
        Some(Kind::TrainingJob | Kind::InferenceService) => {
            annotated
                .metadata
                .annotations
                .entry(ANNOTATION_MANIFEST_DIR.into())
                .or_insert(dir);
        }
        Some(Kind::Schedule) => {
            let Some(template) = annotated
                .spec
                .get_mut("jobTemplate")
                .and_then(|t| t.as_object_mut())
            else {
                return;
            };
            let metadata = template
                .entry("metadata")
                .or_insert_with(|| serde_json::json!({}));
            let Some(metadata) = metadata.as_object_mut() else {
                return;
            };
            let annotations = metadata
                .entry("annotations")
                .or_insert_with(|| serde_json::json!({}));
            let Some(annotations) = annotations.as_object_mut() else {
                return;
            };
            annotations
                .entry(ANNOTATION_MANIFEST_DIR)
                .or_insert(serde_json::Value::String(dir));
        }
        _ => return,
    }
    if let Ok(valid) = tb_api::validate::validate_object(&annotated) {
        *object = valid;
    }
}

/// The same object given twice would make the result depend on input order.
fn repeats(objects: &[LoadedObject]) -> Vec<String> {
    let mut first: HashMap<(String, String, String), &LoadedObject> = HashMap::new();
    let mut errors = Vec::new();
    for l in objects {
        let o: &Object = &l.object;
        let key = (
            o.kind.to_ascii_lowercase(),
            o.metadata.namespace.clone(),
            o.metadata.name.clone(),
        );
        if let Some(prev) = first.get(&key) {
            errors.push(format!(
                "{}: {} is also defined at {}",
                origin(l),
                o.display_name(),
                origin(prev)
            ));
        } else {
            first.insert(key, l);
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loaded(kind: &str, name: &str, ns: &str, line: usize) -> LoadedObject {
        let object: Object = serde_json::from_value(serde_json::json!({
            "apiVersion": "tb/v1", "kind": kind, "metadata": {"name": name, "namespace": ns}
        }))
        .expect("object");
        LoadedObject {
            object,
            source: "a.yaml".into(),
            line,
        }
    }

    fn input(kind: &str, name: &str, ns: &str, line: usize, namespace_given: bool) -> Input {
        Input {
            loaded: loaded(kind, name, ns, line),
            namespace_given,
        }
    }

    fn target(ns: &str, explicit: bool) -> Target {
        Target {
            servers: Vec::new(),
            namespace: ns.into(),
            namespace_explicit: explicit,
        }
    }

    #[test]
    fn namespaces_default_for_namespaced_kinds_only() {
        let mut objs = vec![
            input("Model", "m", "default", 1, false),
            input("Node", "mac1", "", 5, false),
            input("Model", "n", "x", 9, true),
            input("Model", "o", "default", 12, true),
        ];
        default_namespaces(&mut objs, &target("team", false)).expect("ok");
        let ns: Vec<&str> = objs
            .iter()
            .map(|i| i.loaded.object.metadata.namespace.as_str())
            .collect();
        assert_eq!(ns, ["team", "", "x", "default"]);
    }

    #[test]
    fn explicit_namespace_must_match() {
        let mut objs = vec![input("Model", "n", "x", 9, true)];
        let e = default_namespaces(&mut objs, &target("team", true)).expect_err("mismatch");
        assert_eq!(e.0.len(), 1);
        assert!(
            e.0[0].starts_with("a.yaml:9: metadata.namespace"),
            "{}",
            e.0[0]
        );
    }

    #[test]
    fn repeats_are_reported_with_both_places() {
        let objs = vec![
            loaded("Model", "m", "d", 1),
            loaded("Model", "m", "d", 7),
            loaded("Model", "m", "e", 9),
        ];
        let e = repeats(&objs);
        assert_eq!(e, ["a.yaml:7: model/m is also defined at a.yaml:1"]);
    }

    #[test]
    fn finds_documents_without_a_namespace() {
        let text = "apiVersion: tb/v1\nkind: isvc\nmetadata: {name: a}\n---\n# note\n---\n\
                    apiVersion: tb/v1\nkind: Model\nmetadata:\n  name: b\n  namespace: x\n---\n\
                    {\"apiVersion\": \"tb/v1\", \"kind\": \"Queue\", \"metadata\": {\"name\": \"q\"}}\n";
        let got = namespace_omitted(text);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got.contains(&(Kind::InferenceService, "a".to_string())));
        assert!(got.contains(&(Kind::Queue, "q".to_string())));
    }

    #[test]
    fn missing_files_are_named() {
        let e = load(&["/nonexistent/tb.yaml".to_string()]).expect_err("missing");
        assert_eq!(e.0, ["/nonexistent/tb.yaml: no such file or directory"]);
    }

    #[test]
    fn jobs_from_a_file_record_its_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("job.yaml");
        std::fs::write(
            &file,
            "apiVersion: tb/v1\nkind: TrainingJob\nmetadata: {name: j}\n\
             spec: {command: [python3, train.py]}\n---\n\
             apiVersion: tb/v1\nkind: Queue\nmetadata: {name: q}\nspec: {}\n---\n\
             apiVersion: tb/v1\nkind: Schedule\nmetadata: {name: s}\n\
             spec: {schedule: '0 2 * * *', jobTemplate: {spec: {command: [python3, t.py]}}}\n",
        )
        .expect("write");
        let objs =
            load_valid(&[file.display().to_string()], &target("default", false)).expect("valid");
        let want = dir.path().canonicalize().expect("canonical");
        let annotation = |i: usize| {
            objs[i]
                .object
                .metadata
                .annotations
                .get(ANNOTATION_MANIFEST_DIR)
                .cloned()
        };
        assert_eq!(annotation(0), want.to_str().map(str::to_string));
        assert_eq!(annotation(1), None, "only jobs run commands");
        assert_eq!(
            objs[2].object.spec["jobTemplate"]["metadata"]["annotations"][ANNOTATION_MANIFEST_DIR],
            serde_json::Value::from(want.to_str().expect("utf-8")),
            "a Schedule's jobs too"
        );
    }
}
