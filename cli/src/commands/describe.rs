//! `tbctl describe`: one object for people: metadata, spec, status, a table of its conditions,
//! and its recent events.

use std::fmt::Write as _;

use anyhow::Result;
use chrono::{DateTime, Utc};
use serde_json::Value;
use tb_api::proto::{GetRequest, ListRequest};
use tb_api::{Kind, Object};

use super::{Ctx, Reported, parse_kind, parse_object, print_error};
use crate::args::DescribeArgs;
use crate::columns::{age, age_of, at, cell};
use crate::output::{Table, emit};

/// How many of an object's events describe shows (the most recent).
const MAX_EVENTS: usize = 20;
/// Width of the label column, so values line up.
const LABEL_WIDTH: usize = 18;

pub async fn run(ctx: &mut Ctx, args: &DescribeArgs) -> Result<()> {
    let kind = parse_kind(&args.kind)?;
    let mut failed = false;
    for (i, name) in args.names.iter().enumerate() {
        let req = GetRequest {
            kind: kind.as_str().to_string(),
            namespace: ctx.namespace_for(kind),
            name: name.clone(),
            stale: args.stale,
        };
        let object = match ctx.client().get(req).await {
            Ok(r) => parse_object(&r.object_json)?,
            Err(e) => {
                print_error(&e.to_string());
                failed = true;
                continue;
            }
        };
        let events = events_of(ctx, kind, &object, args.stale).await;
        let mut text = if i > 0 {
            "\n\n".to_string()
        } else {
            String::new()
        };
        text.push_str(&render(&object, &events, Utc::now()));
        if kind == Kind::Queue {
            match super::usage::Snapshot::fetch(ctx).await {
                Ok(snap) => text.push_str(&super::usage::queue_detail(&snap, name)),
                Err(e) => text.push_str(&format!("Usage:            <unavailable: {e}>\n")),
            }
        }
        emit(&text)?;
    }
    if failed {
        return Err(Reported(1).into());
    }
    Ok(())
}

/// The object's most recent events, oldest first; an error message if they could not be read
/// (the object itself is still worth showing).
pub async fn events_of(
    ctx: &mut Ctx,
    kind: Kind,
    o: &Object,
    stale: bool,
) -> Result<Vec<Object>, String> {
    let req = ListRequest {
        kind: Kind::Event.as_str().to_string(),
        // Events about a cluster-scoped object may be recorded in any namespace.
        namespace: o.metadata.namespace.clone(),
        label_selector: String::new(),
        stale,
    };
    let resp = ctx.client().list(req).await.map_err(|e| e.to_string())?;
    let events = resp
        .objects_json
        .iter()
        .filter_map(|j| parse_object(j).ok())
        .collect();
    Ok(select_events(events, kind, o))
}

pub fn select_events(mut events: Vec<Object>, kind: Kind, o: &Object) -> Vec<Object> {
    events.retain(|e| {
        involves(
            e,
            kind,
            &o.metadata.namespace,
            &o.metadata.name,
            &o.metadata.uid,
        )
    });
    sort_events(&mut events);
    let skip = events.len().saturating_sub(MAX_EVENTS);
    events.split_off(skip)
}

/// Whether an Event is about the object of this kind and name. An empty `namespace` or `uid`
/// matches any; an Event that names no namespace or uid matches any too.
pub fn involves(e: &Object, kind: Kind, namespace: &str, name: &str, uid: &str) -> bool {
    let s = |f: &str| {
        at(&e.spec, &["involvedObject", f])
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    let (ev_ns, ev_uid) = (s("namespace"), s("uid"));
    Kind::parse(s("kind")) == Some(kind)
        && s("name") == name
        && (!kind.is_namespaced() || namespace.is_empty() || ev_ns.is_empty() || ev_ns == namespace)
        // An earlier object of the same name is another object.
        && (uid.is_empty() || ev_uid.is_empty() || ev_uid == uid)
}

/// Oldest first, by when each was last seen (events never seen sort first).
pub fn sort_events(events: &mut [Object]) {
    events.sort_by_key(|e| {
        last_seen(e)
            .map(|t| t.timestamp_millis())
            .unwrap_or(i64::MIN)
    });
}

/// When an Event last happened: lastTimestamp, else firstTimestamp, else its creation.
pub fn last_seen(e: &Object) -> Option<DateTime<Utc>> {
    let t = at(&e.spec, &["lastTimestamp"])
        .or_else(|| at(&e.spec, &["firstTimestamp"]))
        .and_then(Value::as_str);
    match t {
        Some(t) => DateTime::parse_from_rfc3339(t)
            .ok()
            .map(|t| t.with_timezone(&Utc)),
        None => e.metadata.creation_timestamp.as_ref().map(|t| t.at()),
    }
}

pub fn render(o: &Object, events: &Result<Vec<Object>, String>, now: DateTime<Utc>) -> String {
    let mut out = String::new();
    field(&mut out, "Name", &o.metadata.name);
    if !o.metadata.namespace.is_empty() {
        field(&mut out, "Namespace", &o.metadata.namespace);
    }
    field(&mut out, "Kind", &o.kind);
    map_field(&mut out, "Labels", &o.metadata.labels);
    map_field(&mut out, "Annotations", &o.metadata.annotations);
    if !o.metadata.uid.is_empty() {
        field(&mut out, "UID", &o.metadata.uid);
    }
    field(
        &mut out,
        "Resource Version",
        &o.metadata.resource_version.to_string(),
    );
    field(&mut out, "Generation", &o.metadata.generation.to_string());
    let created = match &o.metadata.creation_timestamp {
        None => "<unknown>".to_string(),
        Some(t) => format!("{t} ({} ago)", age_of(Some(t), now)),
    };
    field(&mut out, "Created", &created);

    block(&mut out, "Spec", &o.spec);
    let mut status = o.status.clone();
    let conditions = status.as_object_mut().and_then(|m| m.remove("conditions"));
    let placement = status
        .as_object_mut()
        .and_then(|m| m.remove("modelPlacement"));
    let training = status.as_object_mut().and_then(|m| m.remove("training"));
    if status.as_object().is_some_and(|m| !m.is_empty())
        || (!status.is_null() && !status.is_object())
    {
        block(&mut out, "Status", &status);
    }

    if let Some(p) = placement.as_ref().filter(|p| p.is_object()) {
        render_placement(&mut out, p, at(&o.spec, &["batch"]).and_then(Value::as_u64));
    }
    if let Some(t) = training.as_ref().filter(|t| t.is_object()) {
        render_training(&mut out, t);
    }

    match conditions
        .as_ref()
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty())
    {
        None => field(&mut out, "Conditions", "<none>"),
        Some(list) => {
            out.push_str("Conditions:\n");
            let mut t = Table::new(["TYPE", "STATUS", "REASON", "MESSAGE", "LAST TRANSITION"]);
            for c in list {
                let changed = at(c, &["lastTransitionTime"])
                    .and_then(Value::as_str)
                    .map(|ts| format!("{} ago", age(ts, now)))
                    .unwrap_or_else(|| "<unknown>".into());
                t.push(vec![
                    cell(at(c, &["type"])),
                    cell(at(c, &["status"])),
                    cell(at(c, &["reason"])),
                    cell(at(c, &["message"])),
                    changed,
                ]);
            }
            indent(&mut out, &t.render());
        }
    }

    match events {
        Err(e) => field(&mut out, "Events", &format!("<unavailable: {e}>")),
        Ok(list) if list.is_empty() => field(&mut out, "Events", "<none>"),
        Ok(list) => {
            out.push_str("Events:\n");
            let mut t = Table::new(["TYPE", "REASON", "AGE", "MESSAGE"]);
            for e in list {
                t.push(vec![
                    cell(at(&e.spec, &["type"])),
                    cell(at(&e.spec, &["reason"])),
                    event_age(e, now),
                    cell(at(&e.spec, &["message"])),
                ]);
            }
            indent(&mut out, &t.render());
        }
    }
    out
}

/// A job's model placement: the split, per-Mac memory, the prediction, the runners-up.
/// `batch` is the service's: a throughput prediction is for that many sequences at once.
fn render_placement(out: &mut String, p: &Value, batch: Option<u64>) {
    let ring = if at(p, &["ring"]).and_then(Value::as_bool) == Some(true) {
        ", ring"
    } else {
        ""
    };
    let figures = match at(p, &["figures"]).and_then(Value::as_str) {
        Some("engine") => " from the Macs' measured engine",
        Some("mixed") => " from measured and chip figures",
        Some("chip") => " from chip figures",
        _ => "",
    };
    let observed = at(p, &["observedTokensPerSecond"])
        .and_then(Value::as_f64)
        .map(|o| format!(", {o:.1} observed"))
        .unwrap_or_default();
    let predicted = at(p, &["predictedTokensPerSecond"])
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    let batch = match (at(p, &["objective"]).and_then(Value::as_str), batch) {
        (Some("throughput"), Some(b)) if b > 1 => format!(" for {b} sequences at once"),
        _ => String::new(),
    };
    if predicted > 0.0 {
        out.push_str(&format!(
            "Placement:        {} ({} objective{ring}), {predicted:.1} tokens/s predicted{batch}{figures}{observed}\n",
            cell(at(p, &["strategy"])),
            cell(at(p, &["objective"])),
        ));
        if let (Some(o), Some(context), Some(there)) = (
            at(p, &["observedTokensPerSecond"]).and_then(Value::as_f64),
            at(p, &["observedContextTokens"]).and_then(Value::as_u64),
            at(p, &["predictedAtObservedTokensPerSecond"]).and_then(Value::as_f64),
        ) && there > 0.0
        {
            out.push_str(&format!(
                "Observed:         {o:.1} tokens/s per stream at {context} tokens of context, \
                 where {there:.1} are predicted ({:.2}×)\n",
                o / there
            ));
        }
    } else {
        // A fine-tune: no decode speed to predict.
        out.push_str(&format!(
            "Placement:        {} ({} objective{ring})\n",
            cell(at(p, &["strategy"])),
            cell(at(p, &["objective"])),
        ));
    }
    if let Some(note) = at(p, &["note"]).and_then(Value::as_str) {
        out.push_str(&format!("  {note}\n"));
    }
    let mut t = Table::new(["RANK", "MAC", "LAYERS", "WEIGHTS", "KV CACHE", "MEMORY"]);
    let bytes = |s: &Value, k: &str| {
        at(s, &[k])
            .and_then(Value::as_u64)
            .map_or_else(|| "-".into(), crate::columns::human_bytes)
    };
    for (rank, s) in at(p, &["stages"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let first = at(s, &["firstLayer"]).and_then(Value::as_u64).unwrap_or(0);
        let count = at(s, &["layers"]).and_then(Value::as_u64).unwrap_or(0);
        t.push(vec![
            rank.to_string(),
            cell(at(s, &["node"])),
            if count == 0 {
                "-".into()
            } else {
                format!("{first}-{}", first + count - 1)
            },
            bytes(s, "weightBytes"),
            bytes(s, "kvBytes"),
            bytes(s, "memoryBytes"),
        ]);
    }
    indent(out, &t.render());
    for alt in at(p, &["alternatives"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        out.push_str(&format!("  not chosen: {alt}\n"));
    }
}

/// A fine-tune's progress: step, losses, speed, ETA, the loss curve as a sparkline and where
/// the adapter went.
fn render_training(out: &mut String, t: &Value) {
    let num = |k: &str| at(t, &[k]).and_then(Value::as_f64);
    let step = at(t, &["step"]).and_then(Value::as_u64).unwrap_or(0);
    let total = at(t, &["totalSteps"]).and_then(Value::as_u64).unwrap_or(0);
    let mut line = format!("step {step}/{total}");
    if total > 0 {
        line.push_str(&format!(" ({:.0}%)", step as f64 * 100.0 / total as f64));
    }
    if let Some(l) = num("loss") {
        line.push_str(&format!(", loss {l:.4}"));
    }
    if let Some(l) = num("evalLoss") {
        line.push_str(&format!(", eval loss {l:.4}"));
    }
    if let Some(r) = num("tokensPerSecond") {
        line.push_str(&format!(", {r:.1} tokens/s"));
    }
    if let Some(eta) = at(t, &["etaSeconds"]).and_then(Value::as_u64)
        && step < total
    {
        line.push_str(&format!(
            ", ETA {}",
            crate::columns::human_duration(chrono::TimeDelta::seconds(eta as i64))
        ));
    }
    field(out, "Training", &line);
    let curve: Vec<f64> = at(t, &["lossCurve"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_f64)
        .take(tb_api::status::LOSS_CURVE_POINTS)
        .collect();
    if let (Some(first), Some(last)) = (curve.first(), curve.last()) {
        let stride = at(t, &["curveStride"]).and_then(Value::as_u64).unwrap_or(1);
        field(
            out,
            "  Loss Curve",
            &format!(
                "{}  {first:.3} → {last:.3} ({stride} step{} a point)",
                tb_api::status::sparkline(&curve),
                if stride == 1 { "" } else { "s" }
            ),
        );
    }
    if let Some(path) = at(t, &["adapter", "path"]).and_then(Value::as_str) {
        let node = at(t, &["adapter", "node"])
            .and_then(Value::as_str)
            .unwrap_or("");
        let at_node = if node.is_empty() {
            String::new()
        } else {
            format!("{node}:")
        };
        field(out, "  Adapter", &format!("{at_node}{path}"));
    }
}

/// `5m`, or kubectl's `5m (x3 over 20m)` for a repeated event.
pub fn event_age(e: &Object, now: DateTime<Utc>) -> String {
    let last = last_seen(e)
        .map(|t| crate::columns::human_duration(now.signed_duration_since(t)))
        .unwrap_or_else(|| "<unknown>".into());
    let count = at(&e.spec, &["count"]).and_then(Value::as_u64).unwrap_or(1);
    let first = at(&e.spec, &["firstTimestamp"]).and_then(Value::as_str);
    match first {
        Some(first) if count > 1 => format!("{last} (x{count} over {})", age(first, now)),
        _ => last,
    }
}

fn field(out: &mut String, label: &str, value: &str) {
    let _ = writeln!(out, "{:<LABEL_WIDTH$}{value}", format!("{label}:"));
}

fn map_field(out: &mut String, label: &str, map: &std::collections::BTreeMap<String, String>) {
    if map.is_empty() {
        return field(out, label, "<none>");
    }
    for (i, (k, v)) in map.iter().enumerate() {
        let head = if i == 0 {
            format!("{label}:")
        } else {
            String::new()
        };
        let _ = writeln!(out, "{head:<LABEL_WIDTH$}{k}={v}");
    }
}

/// A section header and the value as indented YAML.
fn block(out: &mut String, label: &str, v: &Value) {
    if v.is_null() {
        return field(out, label, "<none>");
    }
    let yaml = serde_yaml::to_string(v).unwrap_or_else(|_| v.to_string());
    let _ = writeln!(out, "{label}:");
    indent(out, &yaml);
}

fn indent(out: &mut String, text: &str) {
    for line in text.lines() {
        let _ = writeln!(out, "  {line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Object {
        serde_json::from_value(v).expect("object")
    }

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2025-06-01T12:00:00Z")
            .expect("time")
            .with_timezone(&Utc)
    }

    fn isvc() -> Object {
        obj(json!({
            "apiVersion": "tb/v1", "kind": "InferenceService",
            "metadata": {"name": "chat", "namespace": "d", "uid": "u1", "resourceVersion": 9, "generation": 1,
                         "creationTimestamp": "2025-06-01T11:00:00Z", "labels": {"a": "1", "b": "2"}},
            "spec": {"model": "qwen"},
            "status": {"observedGeneration": 1,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "Placed",
                                       "lastTransitionTime": "2025-06-01T11:55:00Z"}]}
        }))
    }

    fn event(name: &str, kind: &str, on: &str, uid: &str, last: &str, reason: &str) -> Object {
        obj(json!({
            "apiVersion": "tb/v1", "kind": "Event", "metadata": {"name": name, "namespace": "d"},
            "spec": {"type": "Normal", "reason": reason, "message": "m", "count": 1,
                     "involvedObject": {"kind": kind, "namespace": "d", "name": on, "uid": uid},
                     "firstTimestamp": last, "lastTimestamp": last}
        }))
    }

    #[test]
    fn events_are_filtered_and_ordered() {
        let events = vec![
            event(
                "e1",
                "InferenceService",
                "chat",
                "u1",
                "2025-06-01T11:59:00Z",
                "Late",
            ),
            event(
                "e2",
                "InferenceService",
                "chat",
                "",
                "2025-06-01T11:58:00Z",
                "Early",
            ),
            event(
                "e3",
                "InferenceService",
                "other",
                "u1",
                "2025-06-01T11:58:00Z",
                "OtherName",
            ),
            event(
                "e4",
                "TrainingJob",
                "chat",
                "u1",
                "2025-06-01T11:58:00Z",
                "OtherKind",
            ),
            event(
                "e5",
                "InferenceService",
                "chat",
                "u0",
                "2025-06-01T11:58:00Z",
                "OldObject",
            ),
        ];
        let got = select_events(events, Kind::InferenceService, &isvc());
        let reasons: Vec<String> = got.iter().map(|e| cell(at(&e.spec, &["reason"]))).collect();
        assert_eq!(reasons, ["Early", "Late"]);
    }

    #[test]
    fn keeps_the_last_twenty() {
        let events = (0..30)
            .map(|i| {
                event(
                    "e",
                    "InferenceService",
                    "chat",
                    "u1",
                    &format!("2025-06-01T11:{i:02}:00Z"),
                    &format!("R{i}"),
                )
            })
            .collect();
        let got = select_events(events, Kind::InferenceService, &isvc());
        assert_eq!(got.len(), MAX_EVENTS);
        assert_eq!(cell(at(&got[0].spec, &["reason"])), "R10");
    }

    #[test]
    fn renders_sections_and_ends_with_events() {
        let text = render(&isvc(), &Ok(vec![]), now());
        assert!(text.starts_with("Name:             chat\n"), "{text}");
        assert!(
            text.contains("Labels:           a=1\n                  b=2\n"),
            "{text}"
        );
        assert!(text.contains("Spec:\n  model: qwen\n"), "{text}");
        assert!(
            text.contains("Status:\n  observedGeneration: 1\n"),
            "{text}"
        );
        assert!(text.contains("Conditions:\n  TYPE "), "{text}");
        assert!(text.contains("Placed"), "{text}");
        assert!(text.ends_with("Events:           <none>\n"), "{text}");

        let ev = event(
            "e1",
            "InferenceService",
            "chat",
            "u1",
            "2025-06-01T11:59:00Z",
            "Scheduled",
        );
        let text = render(&isvc(), &Ok(vec![ev]), now());
        let tail: Vec<&str> = text.lines().rev().take(3).collect();
        assert_eq!(tail[2], "Events:");
        assert!(
            tail[0].contains("Scheduled") && tail[0].contains("60s"),
            "{text}"
        );
    }

    #[test]
    fn shows_a_fine_tunes_progress_with_a_sparkline() {
        let o: Object = serde_json::from_value(json!({
            "apiVersion": "tb/v1", "kind": "TrainingJob",
            "metadata": {"name": "facts"},
            "spec": {"executor": "builtin"},
            "status": {"phase": "Running", "training": {
                "step": 5, "totalSteps": 10, "loss": 0.8, "evalLoss": 0.9,
                "tokensPerSecond": 12.5, "etaSeconds": 65,
                "lossCurve": [2.0, 1.5, 1.2, 1.0, 0.8], "curveStride": 1,
                "adapter": {"node": "mac1", "path": "/w/adapter"}}}
        }))
        .unwrap();
        let text = render(&o, &Ok(vec![]), Utc::now());
        assert!(
            text.contains("Training:         step 5/10 (50%), loss 0.8000, eval loss 0.9000, 12.5 tokens/s, ETA 65s"),
            "{text}"
        );
        assert!(
            text.contains("█▅▃▂▁  2.000 → 0.800 (1 step a point)"),
            "{text}"
        );
        assert!(text.contains("mac1:/w/adapter"), "{text}");
        assert!(!text.contains("lossCurve"), "{text}");
    }

    #[test]
    fn a_throughput_prediction_says_for_how_many_sequences() {
        let mut o = isvc();
        o.spec = json!({"model": "qwen", "batch": 2, "objective": "throughput"});
        o.status = json!({"phase": "Running", "modelPlacement": {
            "strategy": "pipeline", "objective": "throughput", "figures": "engine",
            "predictedTokensPerSecond": 19.1}});
        let text = render(&o, &Ok(vec![]), now());
        assert!(
            text.contains(
                "Placement:        pipeline (throughput objective), 19.1 tokens/s predicted for 2 \
                 sequences at once from the Macs' measured engine"
            ),
            "{text}"
        );
    }

    #[test]
    fn shows_the_model_placement_as_a_table() {
        let mut o = isvc();
        o.status = json!({"phase": "Scheduled", "modelPlacement": {
            "strategy": "pipeline", "objective": "latency", "ring": true,
            "predictedTokensPerSecond": 23.4,
            "stages": [
                {"node": "studio", "firstLayer": 0, "layers": 50, "memoryBytes": 64424509440u64,
                 "weightBytes": 53687091200u64, "kvBytes": 1073741824u64},
                {"node": "max", "firstLayer": 50, "layers": 30, "memoryBytes": 34359738368u64,
                 "weightBytes": 32212254720u64, "kvBytes": 644245094u64}],
            "observedTokensPerSecond": 30.5, "observedContextTokens": 180,
            "predictedAtObservedTokensPerSecond": 32.1,
            "alternatives": ["pipeline over max→studio: slower: 20.1 vs 23.4 tok/s"]}});
        let text = render(&o, &Ok(vec![]), now());
        assert!(
            text.contains(
                "Placement:        pipeline (latency objective, ring), 23.4 tokens/s predicted"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "Observed:         30.5 tokens/s per stream at 180 tokens of context, where \
                 32.1 are predicted (0.95×)"
            ),
            "{text}"
        );
        assert!(text.contains("studio   0-49"), "{text}");
        assert!(text.contains("max      50-79"), "{text}");
        assert!(
            text.contains("not chosen: pipeline over max→studio"),
            "{text}"
        );
        assert!(
            !text.contains("modelPlacement"),
            "not repeated in the status block: {text}"
        );
    }
}
