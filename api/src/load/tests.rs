//! Tests of loading: exact error positions, multi-document files, directories, round trips,
//! and the example manifests.

use std::path::PathBuf;

use std::io::Read;

use serde_json::{Value, json};

use super::*;
use crate::kind::Kind;

const JOB: &str = "\
apiVersion: tb/v1
kind: TrainingJob
metadata:
  name: echo
spec:
  command: [sh, -c, 'echo hi']
  ranks: 2
";

/// The one error of a load that must fail, as displayed.
fn load_error(text: &str) -> String {
    let err = load_str("job.yaml", text).expect_err("should fail");
    assert_eq!(err.errors.len(), 1, "{err}");
    err.to_string()
}

#[test]
fn loads_a_document() {
    let objs = load_str("job.yaml", JOB).unwrap();
    assert_eq!(objs.len(), 1);
    let o = &objs[0];
    assert_eq!((o.source.as_str(), o.line), ("job.yaml", 1));
    assert_eq!(o.object.kind, "TrainingJob");
    assert_eq!(o.object.metadata.namespace, "default");
    assert_eq!(o.object.spec["ranks"], json!(2));
    assert_eq!(o.object.spec["backend"], json!("ring"));
}

#[test]
fn wrong_type_is_placed_at_the_value() {
    let text = JOB.replace("ranks: 2", "ranks: two");
    assert_eq!(
        load_error(&text),
        "job.yaml:7:10: spec.ranks: invalid type: string \"two\", expected u32"
    );
}

#[test]
fn unknown_field_is_placed_at_the_key() {
    let text = JOB.replace("ranks: 2", "rnaks: 2");
    let err = load_error(&text);
    assert!(
        err.starts_with("job.yaml:7:3: spec: unknown field `rnaks`, expected one of `model`"),
        "{err}"
    );
}

#[test]
fn unknown_top_level_field() {
    let err = load_error(&format!("{JOB}stauts: {{}}\n"));
    assert!(
        err.starts_with("job.yaml:8:1: unknown field `stauts`, expected one of `apiVersion`"),
        "{err}"
    );
}

#[test]
fn unknown_kind_is_placed_at_the_value() {
    let text = JOB.replace("kind: TrainingJob", "kind: Pod");
    assert_eq!(
        load_error(&text),
        "job.yaml:2:7: kind: unknown kind \"Pod\"; expected one of Model, InferenceService (isvc), \
         TrainingJob (tj), Schedule, Queue, Node, Link, Event, Allocation (alloc)"
    );
}

#[test]
fn wrong_api_version_is_placed_at_the_value() {
    let text = JOB.replace("apiVersion: tb/v1", "apiVersion: batch/v1");
    assert_eq!(
        load_error(&text),
        "job.yaml:1:13: apiVersion: unsupported apiVersion \"batch/v1\"; expected \"tb/v1\""
    );
}

#[test]
fn missing_kind_and_api_version() {
    let err = load_error("apiVersion: tb/v1\nmetadata: {name: x}\n");
    assert!(
        err.starts_with("job.yaml:1:1: kind: missing; expected one of Model"),
        "{err}"
    );
    let err = load_error("\n\nkind: Model\n");
    assert_eq!(
        err,
        "job.yaml:3:1: apiVersion: missing; expected apiVersion: tb/v1"
    );
}

#[test]
fn bad_name_is_placed_at_the_value() {
    let text = JOB.replace("name: echo", "name: My_Job");
    let err = load_error(&text);
    assert!(
        err.starts_with(
            "job.yaml:4:9: metadata.name: \"My_Job\" is not a valid name: use lower-case"
        ),
        "{err}"
    );
}

#[test]
fn malformed_yaml() {
    let text = "apiVersion: tb/v1\nkind: TrainingJob\nmetadata:\n  name: x\n labels: {}\n";
    let err = load_error(text);
    assert_eq!(err, "job.yaml:5:2: did not find expected key");
    let err = load_error("apiVersion: tb/v1\nkind: [TrainingJob\n");
    assert!(
        err.starts_with("job.yaml:3:1: did not find expected ',' or ']'"),
        "{err}"
    );
    let err = load_error("a: 1\n\tb: 2\n");
    assert!(err.starts_with("job.yaml:2:"), "{err}");
}

#[test]
fn duplicate_keys_are_placed_at_the_duplicate() {
    let text = format!("{JOB}  ranks: 3\n");
    assert_eq!(
        load_error(&text),
        "job.yaml:8:3: spec: duplicate entry with key \"ranks\""
    );
}

#[test]
fn bad_quantity_is_placed_at_the_value() {
    let text = JOB.replace("ranks: 2", "memory: 12XB");
    assert_eq!(
        load_error(&text),
        "job.yaml:7:11: spec.memory: expected a quantity like 64Gi, 512G or 1.5Ti, got \"12XB\""
    );
    let text = JOB.replace("ranks: 2", "memory: -3");
    assert!(
        load_error(&text).starts_with("job.yaml:7:11: spec.memory: quantity \"-3\" is negative")
    );
}

#[test]
fn bad_resource_version_is_placed_at_the_value() {
    let text = JOB.replace("name: echo", "name: echo\n  resourceVersion: abc");
    let err = load_error(&text);
    assert!(
        err.starts_with("job.yaml:5:20: metadata.resourceVersion: expected a resourceVersion"),
        "{err}"
    );
}

#[test]
fn missing_required_field() {
    let text = "apiVersion: tb/v1\nkind: InferenceService\nmetadata:\n  name: chat\nspec:\n  parallelism: pipeline\n";
    assert_eq!(
        load_error(text),
        "job.yaml:6:3: spec: missing field `model`"
    );
    let text = "apiVersion: tb/v1\nkind: Model\nmetadata:\n  name: m\n";
    assert_eq!(
        load_error(text),
        "job.yaml:1:1: spec: missing field `format`"
    );
}

#[test]
fn semantic_errors_are_placed_by_field() {
    let err = load_error(&JOB.replace("ranks: 2", "ranks: 0"));
    assert_eq!(err, "job.yaml:7:10: spec.ranks: must be at least 1");

    let isvc = "apiVersion: tb/v1\nkind: InferenceService\nmetadata:\n  name: chat\nspec:\n  model: m\n  nodes:\n    min: 3\n    max: 2\n";
    assert_eq!(
        load_error(isvc),
        "job.yaml:9:10: spec.nodes.max: must be at least min (3), got 2"
    );

    let queue =
        "apiVersion: tb/v1\nkind: Queue\nmetadata:\n  name: q\n  namespace: team\nspec: {}\n";
    assert!(
        load_error(queue).starts_with("job.yaml:5:14: metadata.namespace: Queue is cluster-scoped")
    );

    let schedule = "apiVersion: tb/v1\nkind: Schedule\nmetadata: {name: s}\nspec:\n  schedule: \"0 25 * * *\"\n  jobTemplate:\n    spec: {command: [x]}\n";
    assert_eq!(
        load_error(schedule),
        "job.yaml:5:13: spec.schedule: \"0 25 * * *\" is not a valid schedule: hour \"25\" is out of range; expected 0-23"
    );

    let label = "apiVersion: tb/v1\nkind: Node\nmetadata:\n  name: n\n  labels:\n    example.com/chip: \"m3 ultra\"\n";
    assert!(load_error(label).starts_with(
        "job.yaml:6:23: metadata.labels.example.com/chip: \"m3 ultra\" is not a valid label value"
    ));

    let exec = "apiVersion: tb/v1\nkind: TrainingJob\nmetadata: {name: j}\nspec:\n  ranks: 1\n";
    assert!(
        load_error(exec).starts_with("job.yaml:4:1: spec.command: required when executor is exec")
    );
}

#[test]
fn errors_in_later_documents_name_their_own_lines() {
    let text = format!(
        "{JOB}---\n# second\n{}",
        JOB.replace("echo", "echo-2")
            .replace("ranks: 2", "ranks: two")
    );
    let err = load_error(&text);
    assert_eq!(
        err,
        "job.yaml:16:10: spec.ranks: invalid type: string \"two\", expected u32"
    );
}

#[test]
fn a_bad_document_fails_the_whole_load_and_every_error_is_reported() {
    let good = JOB.replace("echo", "good");
    let bad1 = JOB.replace("echo", "bad-1").replace("ranks: 2", "ranks: 0");
    let bad2 = JOB.replace("echo", "Bad2");
    let text = format!("{good}---\n{bad1}---\n{bad2}");
    let err = load_str("many.yaml", &text).unwrap_err();
    assert_eq!(err.errors.len(), 2, "{err}");
    assert_eq!(
        err.first().map(|e| (e.line, e.path.as_str())),
        Some((15, "spec.ranks"))
    );
    assert_eq!(
        (err.errors[1].line, err.errors[1].path.as_str()),
        (20, "metadata.name")
    );
    let shown = err.to_string();
    assert_eq!(shown.lines().count(), 2, "{shown}");
    assert!(
        shown.lines().all(|l| l.starts_with("many.yaml:")),
        "{shown}"
    );
}

#[test]
fn documents_report_their_start_lines() {
    let text = format!("# jobs\n\n{JOB}---\n\n{}", JOB.replace("echo", "two"));
    let objs = load_str("jobs.yaml", &text).unwrap();
    assert_eq!(objs.iter().map(|o| o.line).collect::<Vec<_>>(), vec![3, 12]);
}

#[test]
fn the_same_object_twice_is_an_error() {
    let text = format!("{JOB}---\n{JOB}");
    let err = load_error(&text);
    assert_eq!(
        err,
        "job.yaml:12:9: metadata.name: TrainingJob/default/echo is defined twice in this load (first at job.yaml:1)"
    );
}

#[test]
fn files_without_objects_are_rejected() {
    for text in ["", "\n\n", "# nothing\n", "---\n---\n"] {
        let err = load_str("empty.yaml", text).unwrap_err();
        assert_eq!(
            err.to_string(),
            "empty.yaml: no objects found; expected YAML documents with apiVersion, kind, metadata and spec"
        );
    }
    let err = load_error("- a\n- b\n");
    assert!(err.contains("expected a tb object"), "{err}");
}

#[test]
fn loads_json_and_flow_style() {
    let text = r#"{"apiVersion": "tb/v1", "kind": "Queue", "metadata": {"name": "q"}, "spec": {"weight": 0}}"#;
    let err = load_str("q.json", text).unwrap_err().to_string();
    assert_eq!(err, "q.json:1:88: spec.weight: must be at least 1");
    let ok = text.replace("\"weight\": 0", "\"weight\": 2");
    assert_eq!(
        load_str("q.json", &ok).unwrap()[0].object.spec["weight"],
        json!(2)
    );
}

#[test]
fn round_trips_through_json_and_yaml() {
    let objs = load_path(&manifests()).unwrap();
    for loaded in objs {
        let obj = loaded.object;
        assert_eq!(parse_object_json(&obj.to_json()).unwrap(), obj);
        let again = load_str("again.yaml", &to_yaml(&obj)).unwrap();
        assert_eq!(again[0].object, obj);
    }
}

#[test]
fn parse_object_json_reports_paths() {
    let bad = json!({"apiVersion": "tb/v1", "kind": "TrainingJob", "metadata": {"name": "j"},
        "spec": {"command": ["x"], "ranks": "two"}});
    let err = parse_object_json(&bad.to_string()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "spec.ranks: invalid type: string \"two\", expected u32"
    );
    let err = parse_object_json(
        r#"{"apiVersion": "tb/v1", "kind": "Node", "metadata": {"name": "n"}, "extra": 1}"#,
    )
    .unwrap_err();
    assert!(
        err.to_string().starts_with("unknown field `extra`"),
        "{err}"
    );
    let err =
        parse_object_json(r#"{"apiVersion": "tb/v1", "kind": "Node", "metadata": {"name": 5}}"#)
            .unwrap_err();
    assert_eq!(err.path, "metadata.name");
    let err = parse_object_json("{").unwrap_err();
    assert!(err.message.contains("EOF"), "{err}");
    let err = parse_object_json(
        r#"{"apiVersion": "tb/v1", "kind": "Node", "metadata": {"name": "n"}} x"#,
    )
    .unwrap_err();
    assert!(err.message.contains("trailing"), "{err}");
}

#[test]
fn loads_a_directory_in_name_order() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    write("b.yaml", &JOB.replace("echo", "from-b"));
    write("a.yml", &JOB.replace("echo", "from-a"));
    write(
        "c.json",
        r#"{"apiVersion": "tb/v1", "kind": "Queue", "metadata": {"name": "from-c"}}"#,
    );
    write("notes.txt", "not yaml: [");
    write("empty.yaml", "# nothing yet\n");
    std::fs::create_dir(dir.path().join("sub.yaml")).unwrap();
    let objs = load_path(dir.path()).unwrap();
    let names: Vec<_> = objs
        .iter()
        .map(|o| o.object.metadata.name.as_str())
        .collect();
    assert_eq!(names, ["from-a", "from-b", "from-c"]);
    assert!(objs[1].source.ends_with("b.yaml"), "{}", objs[1].source);
}

#[test]
fn a_bad_file_in_a_directory_is_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), JOB).unwrap();
    std::fs::write(
        dir.path().join("b.yaml"),
        JOB.replace("echo", "b").replace("ranks: 2", "ranks: -1"),
    )
    .unwrap();
    let err = load_path(dir.path()).unwrap_err();
    let first = err.first().unwrap();
    assert!(first.file.ends_with("b.yaml"), "{err}");
    assert_eq!(
        (first.line, first.column, first.path.as_str()),
        (7, 10, "spec.ranks")
    );
}

#[test]
fn empty_or_missing_paths_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let err = load_path(dir.path()).unwrap_err().to_string();
    assert!(err.contains("no objects found in the directory"), "{err}");
    let missing = dir.path().join("missing.yaml");
    let err = load_path(&missing).unwrap_err().to_string();
    assert!(err.contains("missing.yaml: cannot read"), "{err}");
    std::fs::write(dir.path().join("bin.yaml"), [0xff, 0xfe, 0x00]).unwrap();
    let err = load_path(&dir.path().join("bin.yaml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("not UTF-8"), "{err}");
}

#[test]
fn load_reader_reads_everything() {
    let objs = load_reader(STDIN_NAME, JOB.as_bytes()).unwrap();
    assert_eq!(objs[0].source, "<stdin>");
}

fn manifests() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests")
}

#[test]
fn every_example_manifest_loads() {
    let mut files: Vec<_> = std::fs::read_dir(manifests())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 6, "{files:?}");
    for file in &files {
        let objs = load_path(file).unwrap_or_else(|e| panic!("{e}"));
        assert!(!objs.is_empty(), "{}", file.display());
    }
    let all = load_path(&manifests()).unwrap();
    let count = |k: Kind| all.iter().filter(|o| o.object.kind == k.as_str()).count();
    assert_eq!(count(Kind::Queue), 2);
    assert_eq!(count(Kind::Model), 2);
    assert_eq!(count(Kind::InferenceService), 2);
    assert_eq!(count(Kind::TrainingJob), 2);
    assert_eq!(count(Kind::Schedule), 2);
}

/// Loads `bytes` as the file job.yaml in a fresh directory; the one error, with the directory
/// cut from the file name.
fn file_error(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.yaml");
    std::fs::write(&path, bytes).unwrap();
    let err = load_path(&path).expect_err("should fail");
    assert_eq!(err.errors.len(), 1, "{err}");
    err.to_string()
        .replace(&format!("{}/", dir.path().display()), "")
}

#[test]
fn invalid_utf8_is_placed_at_its_line_and_column() {
    let mut bytes = JOB.as_bytes().to_vec();
    // Inside `name: echo` on line 4: after "  name: ec".
    let at = JOB.find("echo\n").unwrap() + 2;
    bytes.splice(at..at, [0xff, 0xfe]);
    assert_eq!(
        file_error(&bytes),
        format!(
            "job.yaml:4:11: not UTF-8 text: byte 0xff (at byte offset {at}) does not begin or \
             continue a UTF-8 character; save the file as UTF-8"
        )
    );
}

#[test]
fn a_nul_byte_is_placed_at_its_line_and_column() {
    let text = JOB.replace("echo hi", "echo \0hi");
    let err = file_error(text.as_bytes());
    assert!(
        err.starts_with("job.yaml:6:27: control character U+0000 (NUL) is not allowed in YAML"),
        "{err}"
    );
    // Written as an escape it is read, and refused by the rule for text fields.
    let text = JOB.replace("'echo hi'", "\"echo \\0hi\"");
    let err = load_error(&text);
    assert!(
        err.starts_with("job.yaml:6:") && err.contains("spec.command[2]: contains a NUL byte"),
        "{err}"
    );
}

#[test]
fn an_alias_bomb_is_placed_at_its_first_alias() {
    let mut text = format!("{JOB}  env:\n    A: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for (name, prev) in ["b", "c", "d", "e", "f", "g"]
        .iter()
        .zip(["a", "b", "c", "d", "e", "f"])
    {
        let refs = vec![format!("*{prev}"); 10].join(", ");
        text.push_str(&format!("    {}: &{name} [{refs}]\n", name.to_uppercase()));
    }
    let err = load_error(&text);
    assert!(
        err.starts_with("job.yaml:10:12: repetition limit exceeded: the aliases (*name)"),
        "{err}"
    );
}

#[test]
fn overflowing_integers_read_like_other_errors() {
    for (value, want) in [
        ("99999999999999999999999", "found 99999999999999999999999"),
        ("-99999999999999999999999", "found -99999999999999999999999"),
        ("5000000000", "found 5000000000"),
    ] {
        let text = JOB.replace("ranks: 2", &format!("ranks: {value}"));
        assert_eq!(
            load_error(&text),
            format!("job.yaml:7:10: spec.ranks: expected an integer from 0 to 4294967295, {want}")
        );
    }
    // Through the API (JSON reads big numbers as floats).
    let json = r#"{"apiVersion": "tb/v1", "kind": "TrainingJob", "metadata": {"name": "j"},
        "spec": {"command": ["x"], "ranks": 99999999999999999999999}}"#;
    let err = parse_object_json(json).unwrap_err();
    assert_eq!(err.path, "spec.ranks");
    assert_eq!(
        err.message,
        "expected an integer from 0 to 4294967295, found 1e+23"
    );
}

#[test]
fn a_file_over_the_limit_is_refused_by_name_before_parsing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.yaml");
    // Not even YAML: the size is checked first.
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(crate::bounds::MAX_FILE_BYTES as u64 + 1)
        .unwrap();
    let err = load_path(&path).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!(
            "{}: the file is 16777217 bytes; tbctl reads at most 16 MiB (16777216 bytes)",
            path.display()
        )),
        "{err}"
    );
    let err = load_reader(STDIN_NAME, std::io::repeat(b'a').take(20 << 20))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("<stdin>: the file is more; tbctl reads at most 16 MiB"),
        "{err}"
    );
}

#[test]
fn duplicate_json_keys_are_refused() {
    let json = r#"{"apiVersion": "tb/v1", "kind": "TrainingJob", "metadata": {"name": "j"},
        "spec": {"command": ["x"], "ranks": 1, "ranks": 2}}"#;
    let err = parse_object_json(json).unwrap_err();
    assert_eq!(err.path, "spec");
    assert!(
        err.message
            .starts_with("duplicate entry with key \"ranks\""),
        "{err}"
    );
}

#[test]
fn objects_over_the_size_limits_are_refused_with_the_limit_and_their_size() {
    let with = |annotations: Value, command: Value| {
        json!({"apiVersion": "tb/v1", "kind": "TrainingJob",
            "metadata": {"name": "j", "annotations": annotations},
            "spec": {"command": command}})
        .to_string()
    };
    let err =
        parse_object_json(&with(json!({"a": "x".repeat(300 << 10)}), json!(["x"]))).unwrap_err();
    assert_eq!(err.path, "metadata.annotations");
    assert!(
        err.message.starts_with("the annotations take 307201 bytes; all of an object's annotations together may take at most 256 KiB (262144 bytes)"),
        "{err}"
    );
    let err = parse_object_json(&with(json!({}), json!(["x".repeat(2 << 20)]))).unwrap_err();
    assert_eq!(err.path, "");
    assert!(
        err.message
            .contains("an object may be at most 1.5 MiB (1572864 bytes)")
            && err.message.starts_with("the object is 2097"),
        "{err}"
    );
    // Just under the limits is fine.
    parse_object_json(&with(
        json!({"a": "x".repeat(250 << 10)}),
        json!(["x".repeat(1 << 20)]),
    ))
    .unwrap();
}
