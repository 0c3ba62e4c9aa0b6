//! Tests of `validate_object` and `validate_status`: one per kind of rejection, and the shape of
//! normalised objects.

use serde_json::{Value, json};

use super::*;
use crate::specs::*;
use crate::testdata;

fn object(v: Value) -> Object {
    serde_json::from_value(v).expect("test object")
}

fn job(spec: Value) -> Object {
    object(
        json!({"apiVersion": "tb/v1", "kind": "TrainingJob", "metadata": {"name": "j"}, "spec": spec}),
    )
}

fn isvc(spec: Value) -> Object {
    object(
        json!({"apiVersion": "tb/v1", "kind": "InferenceService", "metadata": {"name": "s"}, "spec": spec}),
    )
}

fn error(obj: Object) -> ValidationError {
    validate_object(&obj).expect_err("should be rejected")
}

/// Asserts the error's path and that its message contains `want`.
fn assert_error(obj: Object, path: &str, want: &str) {
    let err = error(obj);
    assert_eq!(err.path, path, "{err}");
    assert!(
        err.message.contains(want),
        "{err} does not contain {want:?}"
    );
}

#[test]
fn wrong_api_version() {
    let mut obj = job(json!({"command": ["true"]}));
    obj.api_version = "v1".into();
    let err = error(obj);
    assert_eq!(
        err.to_string(),
        "apiVersion: unsupported apiVersion \"v1\"; expected \"tb/v1\""
    );
}

#[test]
fn unknown_kind() {
    let mut obj = job(json!({}));
    obj.kind = "Pod".into();
    assert_error(
        obj,
        "kind",
        "unknown kind \"Pod\"; expected one of Model, InferenceService",
    );
}

#[test]
fn nul_bytes_are_refused_in_commands_env_and_annotations() {
    assert_error(
        job(json!({"command": ["sh", "-c", "echo\0hi"]})),
        "spec.command[2]",
        "contains a NUL byte (at byte 4)",
    );
    assert_error(
        job(json!({"command": ["x"], "env": {"A": "b\0"}})),
        "spec.env.A",
        "contains a NUL byte",
    );
    assert_error(
        job(json!({"command": ["x"], "env": {"A\0": "b"}})),
        "spec.env.A\\0",
        "contains a NUL byte",
    );
    let mut obj = job(json!({"command": ["x"]}));
    obj.metadata
        .annotations
        .insert("note".into(), "a\0b".into());
    assert_error(obj, "metadata.annotations.note", "contains a NUL byte");
    // Other control characters are text (a script may hold tabs and newlines).
    validate_object(&job(json!({"command": ["sh", "-c", "echo a\tb\necho c"]}))).unwrap();
}

#[test]
fn memory_must_be_whole_bytes() {
    assert_error(
        job(json!({"command": ["x"], "memory": 0.5})),
        "spec.memory",
        "is not a whole number of bytes",
    );
}

#[test]
fn kind_aliases_are_normalised() {
    let mut obj = isvc(json!({"model": "m"}));
    obj.kind = "isvc".into();
    assert_eq!(validate_object(&obj).unwrap().kind, "InferenceService");
}

#[test]
fn bad_name() {
    let mut obj = job(json!({"command": ["true"]}));
    obj.metadata.name = "My_Job".into();
    let err = error(obj);
    assert_eq!(
        err.to_string(),
        "metadata.name: \"My_Job\" is not a valid name: use lower-case letters, digits, '-' and \
         '.'; each dot-separated part starts and ends with a letter or digit and has at most 63 \
         characters (253 in all)"
    );
    let mut obj = job(json!({"command": ["true"]}));
    obj.metadata.name = String::new();
    assert_error(obj, "metadata.name", "a name is required");
}

#[test]
fn namespaces_default_and_scope() {
    let out = validate_object(&job(json!({"command": ["true"]}))).unwrap();
    assert_eq!(out.metadata.namespace, "default");

    let mut obj = job(json!({"command": ["true"]}));
    obj.metadata.namespace = "Team A".into();
    assert_error(obj, "metadata.namespace", "is not a valid namespace");

    let queue = object(json!({"apiVersion": "tb/v1", "kind": "Queue",
        "metadata": {"name": "q", "namespace": "default"}, "spec": {}}));
    assert_error(queue, "metadata.namespace", "Queue is cluster-scoped");

    let node =
        object(json!({"apiVersion": "tb/v1", "kind": "Node", "metadata": {"name": "mac-1"}}));
    assert_eq!(validate_object(&node).unwrap().metadata.namespace, "");
}

#[test]
fn bad_labels_and_annotations() {
    let mut obj = job(json!({"command": ["true"]}));
    obj.metadata
        .labels
        .insert("example.com/team".into(), "bad value".into());
    assert_error(
        obj,
        "metadata.labels.example.com/team",
        "is not a valid label value",
    );
    let mut obj = job(json!({"command": ["true"]}));
    obj.metadata.labels.insert("bad key".into(), "x".into());
    assert_error(obj, "metadata.labels.bad key", "is not a valid label key");
    let mut obj = job(json!({"command": ["true"]}));
    obj.metadata
        .annotations
        .insert("Bad/x".into(), "anything at all".into());
    assert_error(obj, "metadata.annotations.Bad/x", "prefix");
}

#[test]
fn the_manifest_dir_annotation_is_an_absolute_normalised_bounded_path() {
    let with = |dir: &str| {
        let mut obj = job(json!({"command": ["true"]}));
        obj.metadata
            .annotations
            .insert(allocation::ANNOTATION_MANIFEST_DIR.into(), dir.into());
        obj
    };
    assert!(validate_object(&with("/Users/ann/project/manifests")).is_ok());
    let path = "metadata.annotations.tb/manifest-dir";
    assert_error(with("manifests"), path, "expected an absolute directory");
    assert_error(with("/a/../etc"), path, "normalised");
    assert_error(with("/a/./b"), path, "normalised");
    assert_error(with("/a//b"), path, "normalised");
    assert_error(with("/a\nb"), path, "control characters");
    let long = format!("/{}", "d".repeat(crate::bounds::MAX_MANIFEST_DIR_BYTES));
    assert_error(with(&long), path, "at most 1024 bytes");
}

#[test]
fn unknown_field() {
    assert_error(
        job(json!({"command": ["true"], "rnaks": 2})),
        "spec",
        "unknown field `rnaks`, expected one of",
    );
    assert_error(
        isvc(json!({"model": "m", "nodes": {"minimum": 1}})),
        "spec.nodes",
        "unknown field `minimum`",
    );
}

#[test]
fn wrong_type() {
    let err = error(job(json!({"command": ["true"], "ranks": "two"})));
    assert_eq!(
        err.to_string(),
        "spec.ranks: invalid type: string \"two\", expected u32"
    );
    assert_error(
        job(json!({"command": "true"})),
        "spec.command",
        "expected a sequence",
    );
    assert_error(
        job(json!({"command": ["true", 3]})),
        "spec.command[1]",
        "expected a string",
    );
    assert_error(
        job(json!({"command": ["x"], "backend": "nccl"})),
        "spec.backend",
        "unknown variant `nccl`",
    );
    assert_error(
        isvc(json!({"model": "m", "endpoint": {"port": 70000}})),
        "spec.endpoint.port",
        "expected an integer from 0 to 65535, found 70000",
    );
}

#[test]
fn missing_required_fields() {
    assert_error(
        isvc(json!({"parallelism": "pipeline"})),
        "spec",
        "missing field `model`",
    );
    let model = object(json!({"apiVersion": "tb/v1", "kind": "Model", "metadata": {"name": "m"}}));
    assert_error(model, "spec", "missing field `format`");
    let schedule = object(
        json!({"apiVersion": "tb/v1", "kind": "Schedule", "metadata": {"name": "s"},
        "spec": {"schedule": "@daily"}}),
    );
    assert_error(schedule, "spec", "missing field `jobTemplate`");
}

#[test]
fn bad_quantity() {
    assert_error(
        job(json!({"command": ["x"], "memory": "12XB"})),
        "spec.memory",
        "expected a quantity like 64Gi, 512G or 1.5Ti, got \"12XB\"",
    );
    assert_error(
        job(json!({"command": ["x"], "memory": "-1Gi"})),
        "spec.memory",
        "negative",
    );
    assert_error(
        job(json!({"command": ["x"], "memory": 0})),
        "spec.memory",
        "more than 0 bytes",
    );
}

#[test]
fn training_job_rules() {
    assert_error(
        job(json!({"command": ["x"], "ranks": 0})),
        "spec.ranks",
        "at least 1",
    );
    assert_error(
        job(json!({"command": ["x"], "ranks": 100000})),
        "spec.ranks",
        "at most 1024",
    );
    assert_error(
        job(json!({})),
        "spec.command",
        "required when executor is exec",
    );
    assert_error(
        job(json!({"command": [""]})),
        "spec.command[0]",
        "must not be empty",
    );
    assert_error(
        job(json!({"executor": "builtin"})),
        "spec.model",
        "required when executor is builtin",
    );
    assert_error(
        job(json!({"executor": "builtin", "model": "m", "command": ["x"]})),
        "spec.command",
        "only used when executor is exec",
    );
    assert_error(
        job(json!({"command": ["x"], "env": {"TB_RANK": "3"}})),
        "spec.env.TB_RANK",
        "reserved",
    );
    assert_error(
        job(json!({"command": ["x"], "env": {"1X": "3"}})),
        "spec.env.1X",
        "environment variable name",
    );
    assert_error(
        job(json!({"command": ["x"], "checkpoints": {"dir": ""}})),
        "spec.checkpoints.dir",
        "must not be empty",
    );
    assert_error(
        job(json!({"command": ["x"], "queue": "Big Queue"})),
        "spec.queue",
        "is not a valid name",
    );
    assert_error(
        job(json!({"command": ["x"], "nodeSelector": {"chip": "m3 ultra"}})),
        "spec.nodeSelector.chip",
        "label value",
    );
    let builtin = |extra: Value| {
        let mut spec = json!({"executor": "builtin", "model": "m", "finetune": {"steps": 1}});
        for (k, v) in extra.as_object().expect("fields") {
            spec[k] = v.clone();
        }
        job(spec)
    };
    assert_error(
        builtin(json!({"dataset": "facts.jsonl", "datasetNode": "mac1"})),
        "spec.dataset",
        "absolute path on datasetNode",
    );
    assert_error(
        builtin(json!({"dataset": "/d/facts.jsonl", "datasetNode": "Mac 1"})),
        "spec.datasetNode",
        "is not a valid name",
    );
    assert_error(
        job(json!({"command": ["x"], "dataset": "/d/f.jsonl", "datasetNode": "mac1"})),
        "spec.datasetNode",
        "only used when executor is builtin",
    );
    assert!(
        validate_object(&builtin(
            json!({"dataset": "/d/facts.jsonl", "datasetNode": "mac1"})
        ))
        .is_ok()
    );
}

#[test]
fn inference_service_rules() {
    assert_error(
        isvc(json!({"model": "m", "nodes": {"min": 3, "max": 2}})),
        "spec.nodes.max",
        "must be at least min (3), got 2",
    );
    assert_error(
        isvc(json!({"model": "m", "nodes": {"min": 0}})),
        "spec.nodes.min",
        "at least 1",
    );
    assert_error(
        isvc(json!({"model": ""})),
        "spec.model",
        "a name is required",
    );
    assert_error(
        isvc(json!({"model": "m", "executor": "exec"})),
        "spec.command",
        "required when executor is exec",
    );
    assert_error(
        isvc(json!({"model": "m", "endpoint": {"port": 0}})),
        "spec.endpoint.port",
        "between 1 and 65535",
    );
    assert_error(
        isvc(json!({"model": "m", "context": 0})),
        "spec.context",
        "at least 1",
    );
}

#[test]
fn model_rules() {
    let model = |spec: Value| {
        object(
            json!({"apiVersion": "tb/v1", "kind": "Model", "metadata": {"name": "m"}, "spec": spec}),
        )
    };
    assert_error(
        model(json!({"format": "gguf"})),
        "spec.source",
        "say where the weights are",
    );
    assert_error(
        model(json!({"format": "onnx", "source": {"path": "/m"}})),
        "spec.format",
        "unknown variant `onnx`",
    );
    assert_error(
        model(json!({"format": "mlx", "source": {"path": "/m"}, "heads": 9, "kvHeads": 2})),
        "spec.kvHeads",
        "must divide heads (9)",
    );
    assert_error(
        model(
            json!({"format": "mlx", "source": {"path": "/m"}, "experts": 8, "expertsPerToken": 9}),
        ),
        "spec.expertsPerToken",
        "at most experts (8)",
    );
    assert_error(
        model(json!({"format": "mlx", "source": {"path": "/m"}, "expertsPerToken": 2})),
        "spec.expertsPerToken",
        "needs experts",
    );
    assert_error(
        model(json!({"format": "mlx", "source": {"path": "/m"}, "qkRopeHeadDim": 64})),
        "spec.qkRopeHeadDim",
        "give kvLoraRank too",
    );
    assert_error(
        model(
            json!({"format": "mlx", "source": {"path": "/m"}, "layers": 4,
                     "slidingWindow": 128, "slidingWindowLayers": 5}),
        ),
        "spec.slidingWindowLayers",
        "at most layers (4)",
    );
    assert_error(
        model(
            json!({"format": "mlx", "source": {"path": "/m"}, "totalBytes": "1Gi",
                     "activeBytes": "2Gi"}),
        ),
        "spec.activeBytes",
        "at most totalBytes",
    );
    assert_error(
        model(json!({"format": "mlx", "source": {"path": "/m"}, "headDim": 0})),
        "spec.headDim",
        "at least 1",
    );
    assert_error(
        model(json!({"format": "mlx", "source": {"nodes": ["Mac 1"]}})),
        "spec.source.nodes[0]",
        "is not a valid name",
    );
    assert_error(
        model(json!({"format": "mlx", "source": {"path": "/m"}, "layers": 0})),
        "spec.layers",
        "at least 1",
    );
}

#[test]
fn schedule_rules() {
    let schedule = |spec: Value| {
        object(
            json!({"apiVersion": "tb/v1", "kind": "Schedule", "metadata": {"name": "s"}, "spec": spec}),
        )
    };
    let template = json!({"spec": {"command": ["x"]}});
    assert_error(
        schedule(json!({"schedule": "61 * * * *", "jobTemplate": template})),
        "spec.schedule",
        "minute \"61\" is out of range; expected 0-59",
    );
    assert_error(
        schedule(json!({"schedule": "* * *", "jobTemplate": template})),
        "spec.schedule",
        "it has 3 fields",
    );
    assert_error(
        schedule(
            json!({"schedule": "@daily", "timeZone": "Paris, France", "jobTemplate": template}),
        ),
        "spec.timeZone",
        "not a time zone in the IANA database",
    );
    // Well-formed but unknown to the zone database.
    assert_error(
        schedule(
            json!({"schedule": "@daily", "timeZone": "Mars/Olympus", "jobTemplate": template}),
        ),
        "spec.timeZone",
        "\"Mars/Olympus\" is not a time zone in the IANA database",
    );
    assert_error(
        schedule(
            json!({"schedule": "@daily", "timeZone": "europe/paris", "jobTemplate": template}),
        ),
        "spec.timeZone",
        "(did you mean Europe/Paris?)",
    );
    assert_error(
        schedule(json!({"schedule": "0 0 31 2 *", "jobTemplate": template})),
        "spec.schedule",
        "it never fires",
    );
    assert_error(
        schedule(
            json!({"schedule": "@daily", "concurrencyPolicy": "forbid", "jobTemplate": template}),
        ),
        "spec.concurrencyPolicy",
        "unknown variant `forbid`",
    );
    assert_error(
        schedule(
            json!({"schedule": "@daily", "jobTemplate": {"spec": {"command": ["x"], "ranks": 0}}}),
        ),
        "spec.jobTemplate.spec.ranks",
        "at least 1",
    );
    assert_error(
        schedule(
            json!({"schedule": "@daily", "jobTemplate": {"metadata": {"labels": {"a": "b c"}}, "spec": {"command": ["x"]}}}),
        ),
        "spec.jobTemplate.metadata.labels.a",
        "label value",
    );
    for tz in [
        "UTC",
        "Europe/Paris",
        "America/Argentina/Buenos_Aires",
        "Etc/GMT+5",
        "America/Port-au-Prince",
    ] {
        assert!(schedule::validate_time_zone(tz).is_ok(), "{tz}");
    }
}

#[test]
fn queue_rules() {
    let queue = |spec: Value| {
        object(
            json!({"apiVersion": "tb/v1", "kind": "Queue", "metadata": {"name": "q"}, "spec": spec}),
        )
    };
    assert_error(queue(json!({"weight": 0})), "spec.weight", "at least 1");
    assert_error(
        queue(json!({"fairShareHalfLife": "soon"})),
        "spec.fairShareHalfLife",
        "expected a duration like 30m",
    );
    assert_error(
        queue(json!({"fairShareHalfLife": "0s"})),
        "spec.fairShareHalfLife",
        "longer than zero",
    );
    assert_error(
        queue(json!({"namespaces": ["ok", "Not OK"]})),
        "spec.namespaces[1]",
        "not a valid namespace",
    );
    assert_error(
        queue(json!({"quota": {"memory": "lots"}})),
        "spec.quota.memory",
        "expected a quantity",
    );
}

/// The priority policy of a Queue: `maxPriority` (at least `priority`) and `preemption`, whose
/// defaults keep preemption within a namespace; unknown fields and values are refused.
#[test]
fn queue_priority_policy() {
    let queue = |spec: Value| {
        object(
            json!({"apiVersion": "tb/v1", "kind": "Queue", "metadata": {"name": "q"}, "spec": spec}),
        )
    };
    let spec = |spec: Value| -> QueueSpec {
        parse_spec(&validate_object(&queue(spec)).expect("valid queue").spec).expect("spec")
    };
    // Absent: the ceiling is the queue's own priority; preemption stays in the namespace.
    let plain = spec(json!({"priority": 7}));
    assert_eq!((plain.max_priority, plain.ceiling()), (None, 7));
    assert_eq!(plain.preemption, QueuePreemption::default());
    assert_eq!(
        plain.preemption.towards("a", "a"),
        PreemptionPolicy::LowerPriority
    );
    assert_eq!(plain.preemption.towards("a", "b"), PreemptionPolicy::Never);
    // Defaults are not written back, so queues stored before these fields stay unchanged.
    let stored = validate_object(&queue(json!({"priority": 7}))).unwrap();
    assert_eq!(stored.spec, json!({"priority": 7, "weight": 1}));

    let set = spec(json!({"priority": 1, "maxPriority": 10,
        "preemption": {"otherNamespaces": "LowerPriority"}}));
    assert_eq!((set.max_priority, set.ceiling()), (Some(10), 10));
    assert_eq!(
        set.preemption,
        QueuePreemption {
            within_namespace: PreemptionPolicy::LowerPriority,
            other_namespaces: PreemptionPolicy::LowerPriority,
        }
    );
    let never = spec(json!({"preemption": {"withinNamespace": "Never"}}));
    assert_eq!(never.preemption.towards("a", "a"), PreemptionPolicy::Never);
    assert_eq!(never.preemption.towards("a", "b"), PreemptionPolicy::Never);
    assert_eq!(
        spec(json!({"maxPriority": -5, "priority": -5})).ceiling(),
        -5
    );

    assert_error(
        queue(json!({"priority": 10, "maxPriority": 5})),
        "spec.maxPriority",
        "5 is below the queue's priority 10",
    );
    assert_error(
        queue(json!({"maxPriority": "high"})),
        "spec.maxPriority",
        "invalid type",
    );
    assert_error(
        queue(json!({"maxPriority": 2147483648u64})),
        "spec.maxPriority",
        "",
    );
    assert_error(
        queue(json!({"preemption": {"otherNamespaces": "Always"}})),
        "spec.preemption.otherNamespaces",
        "unknown variant `Always`, expected `LowerPriority` or `Never`",
    );
    assert_error(
        queue(json!({"preemption": {"crossNamespace": "Never"}})),
        "spec.preemption",
        "unknown field `crossNamespace`",
    );
}

#[test]
fn event_and_node_rules() {
    let event = |spec: Value| {
        object(
            json!({"apiVersion": "tb/v1", "kind": "Event", "metadata": {"name": "e"}, "spec": spec}),
        )
    };
    assert_error(
        event(json!({"reason": "", "involvedObject": {"kind": "TrainingJob", "name": "j"}})),
        "spec.reason",
        "must not be empty",
    );
    assert_error(
        event(json!({"reason": "X", "involvedObject": {"kind": "Pod", "name": "j"}})),
        "spec.involvedObject.kind",
        "unknown kind",
    );
    assert_error(
        event(
            json!({"type": "Error", "reason": "X", "involvedObject": {"kind": "Node", "name": "n"}}),
        ),
        "spec.type",
        "unknown variant `Error`",
    );
    let node = object(
        json!({"apiVersion": "tb/v1", "kind": "Node", "metadata": {"name": "n"}, "spec": {"address": "a b"}}),
    );
    assert_error(node, "spec.address", "not an address");
}

#[test]
fn status_shape() {
    assert!(validate_status(Kind::TrainingJob, &Value::Null).is_ok());
    assert!(
        validate_status(
            Kind::TrainingJob,
            &json!({"observedGeneration": 2, "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}]})
        )
        .is_ok()
    );
    let err = validate_status(Kind::Node, &json!("up")).unwrap_err();
    assert_eq!(err.path, "status");
    let err = validate_status(Kind::Node, &json!({"conditions": [{"type": "Ready"}]})).unwrap_err();
    assert_eq!(
        err.to_string(),
        "status.conditions[0]: missing field `status`"
    );
    let err = validate_status(Kind::Node, &json!({"observedGeneration": "two"})).unwrap_err();
    assert_eq!(err.path, "status.observedGeneration");
    let mut obj = job(json!({"command": ["x"]}));
    obj.status = json!([1]);
    assert_error(obj, "status", "must be a mapping");
}

#[test]
fn defaults_are_written_out() {
    let out = validate_object(&isvc(json!({"model": "m"}))).unwrap();
    assert_eq!(
        out.spec,
        json!({"model": "m", "parallelism": "auto", "nodes": {"min": 1}, "executor": "builtin", "objective": "latency"})
    );
    let out = validate_object(&job(json!({"command": ["x"]}))).unwrap();
    assert_eq!(
        out.spec,
        json!({"command": ["x"], "executor": "exec", "ranks": 1, "backend": "ring", "parallelism": "data", "exclusive": false})
    );
}

#[test]
fn status_is_left_untouched() {
    let mut obj = job(json!({"command": ["x"]}));
    obj.status = json!({"phase": "Running", "observedGeneration": 1});
    assert_eq!(validate_object(&obj).unwrap().status, obj.status);
}

#[test]
fn validation_is_idempotent_for_every_kind() {
    for kind in Kind::ALL {
        for once in testdata::full_objects(kind) {
            assert_eq!(validate_object(&once).unwrap(), once, "{kind}");
        }
    }
}

/// `Default` and serde's defaults must agree, or a spec built in code would differ from the same
/// spec read from YAML.
#[test]
fn default_impls_match_serde_defaults() {
    fn read<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).expect("spec")
    }
    assert_eq!(
        read::<TrainingJobSpec>(json!({})),
        TrainingJobSpec::default()
    );
    assert_eq!(read::<QueueSpec>(json!({})), QueueSpec::default());
    assert_eq!(read::<NodeSpec>(json!({})), NodeSpec::default());
    assert_eq!(read::<NodeRange>(json!({})), NodeRange::default());
    assert_eq!(
        read::<InferenceServiceSpec>(json!({"model": "m"})),
        InferenceServiceSpec {
            model: "m".into(),
            ..Default::default()
        }
    );
    assert_eq!(
        read::<ModelSpec>(json!({"format": "gguf"})),
        ModelSpec::default()
    );
    assert_eq!(
        read::<EventSpec>(json!({"reason": "", "involvedObject": {"kind": "", "name": ""}})),
        EventSpec::default()
    );
    assert_eq!(
        read::<ScheduleSpec>(json!({"schedule": "", "jobTemplate": {"spec": {}}})),
        ScheduleSpec::default()
    );
}

#[test]
fn typed_accessors_fill_in_defaults() {
    let spec: TrainingJobSpec = parse_spec(&json!({"command": ["x"]})).unwrap();
    assert_eq!(spec.backoff_limit(), 3);
    let spec: ScheduleSpec =
        parse_spec(&json!({"schedule": "@hourly", "jobTemplate": {"spec": {"command": ["x"]}}}))
            .unwrap();
    assert_eq!(
        (spec.successful_history_limit(), spec.failed_history_limit()),
        (3, 1)
    );
    assert!(spec.cron().unwrap().matches(0, 5, 1, 1, 0));
    let spec: QueueSpec = parse_spec(&json!({"fairShareHalfLife": "1h30m"})).unwrap();
    assert_eq!(spec.fair_share_half_life_seconds(), Some(5400));
    let err = parse_spec::<TrainingJobSpec>(&json!({"ranks": 0, "command": ["x"]})).unwrap_err();
    assert_eq!(err.path, "spec.ranks");
}

#[test]
fn an_adapter_names_a_path_or_a_training_job_with_the_field_named() {
    let ok = |adapter: Value| validate_object(&isvc(json!({"model": "m", "adapter": adapter})));
    ok(json!({"path": "/Users/Shared/adapters/zorbania"})).expect("path");
    ok(json!({"path": "/a/b", "node": "mac1"})).expect("path on a node");
    ok(json!({"trainingJob": "tune"})).expect("trainingJob");
    let bad = |adapter: Value| isvc(json!({"model": "m", "adapter": adapter}));
    assert_error(bad(json!({})), "spec.adapter.path", "required");
    assert_error(
        bad(json!({"path": "/a", "trainingJob": "t"})),
        "spec.adapter.trainingJob",
        "not both",
    );
    assert_error(bad(json!({"path": "a/b"})), "spec.adapter.path", "absolute");
    assert_error(
        bad(json!({"path": "/a/../etc"})),
        "spec.adapter.path",
        "normalised",
    );
    assert_error(
        bad(json!({"trainingJob": "t", "node": "mac1"})),
        "spec.adapter.node",
        "only used with path",
    );
    assert_error(
        bad(json!({"trainingJob": "T!"})),
        "spec.adapter.trainingJob",
        "",
    );
    assert_error(
        isvc(
            json!({"model": "m", "executor": "exec", "command": ["x"], "adapter": {"path": "/a"}}),
        ),
        "spec.adapter",
        "builtin",
    );
}
