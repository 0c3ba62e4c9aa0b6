//! What `get` shows in its table for each kind: `[NAMESPACE] NAME <kind columns> AGE [<wide
//! kind columns> LABELS]`, kubectl-style ages, and memory sizes for people (`41Gi`, `512Mi`).
//!
//! Nodes: `NAME READY FREE/TOTAL CHIP AGE`, wide adding `ADDRESS ALLOCATED` (e.g. `41Gi/64Gi`,
//! `24Gi (46%)` of allocatable). TrainingJobs: `NAME RANKS EXECUTOR STATUS RESTARTS NODES AGE`,
//! STATUS being the phase, `Pending (Unschedulable)` when pending for a reason. Jobs also show
//! QUEUE and POSITION (a pending job's place in the cluster-wide order, filled in by `get` from
//! the scheduler's own ordering code), and with `-o wide` the MESSAGE saying why a job waits.
//!
//! Cells read the object's JSON leniently: a field that is missing or of an unexpected shape
//! prints as `<none>` rather than failing the whole listing.

use chrono::{DateTime, Utc};
use serde_json::Value;
use tb_api::{Kind, Object, Quantity};

use crate::output::Table;

const NONE: &str = "<none>";

/// How a list of one kind is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    pub kind: Kind,
    /// `-A`: a NAMESPACE column (for namespaced kinds).
    pub all_namespaces: bool,
    /// `-o wide`: a LABELS column.
    pub wide: bool,
}

impl View {
    fn namespace_column(&self) -> bool {
        self.all_namespaces && self.kind.is_namespaced()
    }

    pub fn headers(&self) -> Vec<String> {
        let mut h = Vec::new();
        if self.namespace_column() {
            h.push("NAMESPACE".to_string());
        }
        h.push("NAME".to_string());
        h.extend(kind_headers(self.kind).iter().map(|s| s.to_string()));
        h.push("AGE".to_string());
        if self.wide {
            h.extend(kind_wide_headers(self.kind).iter().map(|s| s.to_string()));
            h.push("LABELS".to_string());
        }
        h
    }

    pub fn row(&self, o: &Object, now: DateTime<Utc>) -> Vec<String> {
        let mut r = Vec::new();
        if self.namespace_column() {
            r.push(o.metadata.namespace.clone());
        }
        r.push(o.metadata.name.clone());
        r.extend(kind_cells(self.kind, o));
        r.push(age_of(o.metadata.creation_timestamp.as_ref(), now));
        if self.wide {
            r.extend(kind_wide_cells(self.kind, o));
            r.push(labels(o));
        }
        r
    }

    pub fn table(&self, objects: &[Object], now: DateTime<Utc>) -> Table {
        let mut t = Table::new(self.headers());
        for o in objects {
            t.push(self.row(o, now));
        }
        t
    }
}

fn kind_headers(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Model => &["FORMAT", "LAYERS"],
        Kind::InferenceService => &[
            "MODEL",
            "PARALLELISM",
            "NODES",
            "READY",
            "URL",
            "QUEUE",
            "POSITION",
        ],
        Kind::TrainingJob => &[
            "RANKS", "EXECUTOR", "STATUS", "RESTARTS", "NODES", "QUEUE", "POSITION",
        ],
        Kind::Schedule => &["SCHEDULE", "SUSPEND", "LAST SCHEDULE", "NEXT SCHEDULE"],
        Kind::Queue => &["PRIORITY", "WEIGHT"],
        Kind::Node => &["READY", "FREE/TOTAL", "CHIP"],
        Kind::Link => &["A", "B", "RDMA", "BANDWIDTH", "LATENCY"],
        Kind::Event => &["TYPE", "REASON", "OBJECT", "COUNT", "MESSAGE"],
        Kind::Allocation => &["JOB", "RANK", "EPOCH", "NODE", "DESIRED", "PHASE"],
    }
}

fn kind_cells(kind: Kind, o: &Object) -> Vec<String> {
    let spec = &o.spec;
    let status = &o.status;
    match kind {
        Kind::Model => vec![cell(at(spec, &["format"])), cell(at(spec, &["layers"]))],
        Kind::InferenceService => vec![
            cell(at(spec, &["model"]).map(|m| at(m, &["name"]).unwrap_or(m))),
            cell(at(spec, &["parallelism"])),
            isvc_nodes(o),
            condition(o, "Ready").unwrap_or_else(|| "Unknown".into()),
            // The stable address; a cluster without a services listener has only rank 0's.
            text(status, "url")
                .or_else(|| text(status, "endpoint"))
                .unwrap_or(NONE)
                .to_string(),
            queue_cell(o),
            position_cell(o),
        ],
        Kind::TrainingJob => vec![
            cell(at(spec, &["ranks"]).or_else(|| at(spec, &["nodes"]))),
            cell(at(spec, &["executor"])),
            job_status(o),
            at(status, &["restarts"])
                .and_then(Value::as_u64)
                .unwrap_or(0)
                .to_string(),
            cell(at(status, &["nodes"])),
            queue_cell(o),
            position_cell(o),
        ],
        Kind::Schedule => vec![
            cell(at(spec, &["schedule"])),
            at(spec, &["suspend"])
                .and_then(Value::as_bool)
                .unwrap_or(false)
                .to_string(),
            at(status, &["lastScheduleTime"])
                .and_then(Value::as_str)
                .map(|t| age(t, Utc::now()))
                .unwrap_or_else(|| NONE.into()),
            next_schedule(spec, Utc::now()),
        ],
        Kind::Queue => vec![cell(at(spec, &["priority"])), cell(at(spec, &["weight"]))],
        Kind::Node => {
            let mem = NodeMemory::of(o);
            vec![
                node_ready(o),
                match (mem.free, mem.total) {
                    (Some(free), Some(total)) => {
                        format!("{}/{}", human_bytes(free), human_bytes(total))
                    }
                    (None, Some(total)) => format!("?/{}", human_bytes(total)),
                    _ => NONE.into(),
                },
                cell(at(status, &["capacity", "chip"])),
            ]
        }
        Kind::Link => vec![
            link_end(at(spec, &["a"])),
            link_end(at(spec, &["b"])),
            at(spec, &["rdma"])
                .and_then(Value::as_bool)
                .unwrap_or(false)
                .to_string(),
            at(status, &["bandwidthGbps"])
                .and_then(Value::as_f64)
                .map(|g| format!("{g:.1} Gb/s"))
                .unwrap_or_else(|| NONE.into()),
            at(status, &["latencyUsP50"])
                .and_then(Value::as_f64)
                .map(|us| format!("{us:.0} µs"))
                .unwrap_or_else(|| NONE.into()),
        ],
        Kind::Event => vec![
            cell(at(spec, &["type"])),
            cell(at(spec, &["reason"])),
            involved_object(spec),
            cell(at(spec, &["count"])),
            cell(at(spec, &["message"])),
        ],
        Kind::Allocation => vec![
            cell(at(spec, &["job", "name"])),
            cell(at(spec, &["rank"])),
            cell(at(spec, &["epoch"])),
            cell(at(spec, &["node"])),
            cell(at(spec, &["desired"])),
            cell(at(status, &["phase"])),
        ],
    }
}

/// Columns `-o wide` adds after AGE (before LABELS).
fn kind_wide_headers(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Node => &["ADDRESS", "ALLOCATED"],
        Kind::TrainingJob => &["STEP", "LOSS", "MESSAGE"],
        Kind::InferenceService => &["BACKEND", "MESSAGE"],
        _ => &[],
    }
}

fn kind_wide_cells(kind: Kind, o: &Object) -> Vec<String> {
    match kind {
        Kind::Node => {
            let mem = NodeMemory::of(o);
            vec![
                cell(at(&o.status, &["address"]).or_else(|| at(&o.spec, &["address"]))),
                share(mem.allocated, mem.allocatable),
            ]
        }
        // Why a job waits: which quota, which Macs, how much memory is short.
        Kind::TrainingJob => vec![
            // A built-in fine-tune's progress.
            match (
                at(&o.status, &["training", "step"]).and_then(Value::as_u64),
                at(&o.status, &["training", "totalSteps"]).and_then(Value::as_u64),
            ) {
                (Some(step), Some(total)) => format!("{step}/{total}"),
                _ => NONE.to_string(),
            },
            at(&o.status, &["training", "loss"])
                .and_then(Value::as_f64)
                .map_or_else(|| NONE.to_string(), |l| format!("{l:.4}")),
            text(&o.status, "message").unwrap_or(NONE).to_string(),
        ],
        // Where the URL forwards to now: rank 0's own endpoint.
        Kind::InferenceService => vec![
            text(&o.status, "endpoint").unwrap_or(NONE).to_string(),
            text(&o.status, "message").unwrap_or(NONE).to_string(),
        ],
        _ => Vec::new(),
    }
}

/// A non-empty string field of `v`.
fn text<'a>(v: &'a Value, field: &str) -> Option<&'a str> {
    at(v, &[field])
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
}

/// A job's queue, as `get` filled it in (`status.queue`; see `commands::usage`).
fn queue_cell(o: &Object) -> String {
    at(&o.status, &["queue"])
        .and_then(Value::as_str)
        .filter(|q| !q.is_empty())
        .unwrap_or("-")
        .to_string()
}

/// A pending job's 1-based place in the cluster-wide order, as `get` filled it in.
fn position_cell(o: &Object) -> String {
    at(&o.status, &["position"])
        .and_then(Value::as_u64)
        .map_or_else(|| "-".to_string(), |p| p.to_string())
}

/// `node/port` of one end of a Link.
fn link_end(end: Option<&Value>) -> String {
    match end {
        Some(e) => format!(
            "{}/{}",
            at(e, &["node"]).and_then(Value::as_str).unwrap_or("?"),
            at(e, &["port"]).and_then(Value::as_str).unwrap_or("?")
        ),
        None => NONE.into(),
    }
}

/// A Node's Ready condition: True, False or Unknown.
pub fn node_ready(o: &Object) -> String {
    condition(o, "Ready").unwrap_or_else(|| "Unknown".into())
}

/// A Node's memory as its nodelet reports it, field by field (a malformed field is unknown, the
/// others still show).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeMemory {
    pub total: Option<u64>,
    pub allocatable: Option<u64>,
    pub allocated: Option<u64>,
    pub free: Option<u64>,
}

impl NodeMemory {
    pub fn of(o: &Object) -> NodeMemory {
        let bytes = |path: &[&str]| at(&o.status, path).and_then(Value::as_u64);
        let total = bytes(&["capacity", "memoryBytes"])
            .filter(|b| *b > 0)
            .or_else(|| {
                at(&o.status, &["capacity", "memory"])
                    .and_then(Value::as_str)
                    .and_then(|q| Quantity::parse(q).ok())
                    .map(|q| q.bytes())
                    .filter(|b| *b > 0)
            });
        NodeMemory {
            total,
            allocatable: bytes(&["capacity", "allocatableBytes"]).filter(|b| *b > 0),
            allocated: bytes(&["allocatedBytes"]),
            free: bytes(&["freeBytes"]),
        }
    }
}

/// `24Gi (46%)`: an amount and its share of a whole, rounded down; just the amount when the
/// whole is unknown.
pub fn share(part: Option<u64>, whole: Option<u64>) -> String {
    match (part, whole) {
        (None, _) => NONE.into(),
        (Some(p), Some(w)) if w > 0 => {
            let pct = u128::from(p) * 100 / u128::from(w);
            format!("{} ({pct}%)", human_bytes(p))
        }
        (Some(p), _) => human_bytes(p),
    }
}

/// Bytes for people, in binary units: `64Gi`, `9.5Gi`, `512Mi`, `1.5Ti`, `900`. Three
/// significant figures at most: one decimal below 10 of a unit, none above.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 5] = [
        ("Pi", 1 << 50),
        ("Ti", 1 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ];
    for (suffix, unit) in UNITS {
        if bytes >= unit {
            let n = bytes as f64 / unit as f64;
            let text = if n >= 9.95 {
                format!("{n:.0}")
            } else {
                format!("{n:.1}")
            };
            let text = text.strip_suffix(".0").unwrap_or(&text);
            return format!("{text}{suffix}");
        }
    }
    bytes.to_string()
}

/// The Macs serving it when placed (status), else the range asked for (spec).
fn isvc_nodes(o: &Object) -> String {
    let placed = at(&o.status, &["nodes"])
        .or_else(|| at(&o.status, &["placement", "nodes"]))
        .and_then(Value::as_array);
    match placed {
        Some(list) if !list.is_empty() => list
            .iter()
            .map(|n| {
                n.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| cell(at(n, &["name"])))
            })
            .collect::<Vec<_>>()
            .join(","),
        _ => cell(at(&o.spec, &["nodes"])),
    }
}

/// The phase, with the reason when pending for one: `Pending (Unschedulable)`.
fn job_status(o: &Object) -> String {
    if let Some(p) = at(&o.status, &["phase"])
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
    {
        let reason = at(&o.status, &["reason"])
            .and_then(Value::as_str)
            .unwrap_or("");
        if p == "Pending" && !reason.is_empty() {
            return format!("{p} ({reason})");
        }
        return p.to_string();
    }
    for c in ["Failed", "Complete", "Succeeded", "Running", "Scheduled"] {
        if condition(o, c).as_deref() == Some("True") {
            return c.to_string();
        }
    }
    "Pending".into()
}

/// `Kind/name` of an Event's subject.
pub fn involved_object(event_spec: &Value) -> String {
    let kind = at(event_spec, &["involvedObject", "kind"])
        .and_then(Value::as_str)
        .unwrap_or("");
    let name = at(event_spec, &["involvedObject", "name"])
        .and_then(Value::as_str)
        .unwrap_or("");
    if kind.is_empty() && name.is_empty() {
        NONE.into()
    } else {
        format!("{}/{name}", kind.to_ascii_lowercase())
    }
}

/// The status ("True", "False", "Unknown") of a condition.
pub fn condition(o: &Object, type_: &str) -> Option<String> {
    at(&o.status, &["conditions"])?
        .as_array()?
        .iter()
        .find(|c| at(c, &["type"]).and_then(Value::as_str) == Some(type_))
        .and_then(|c| at(c, &["status"]))
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn labels(o: &Object) -> String {
    if o.metadata.labels.is_empty() {
        return NONE.into();
    }
    o.metadata
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

pub fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter()
        .try_fold(v, |cur, key| cur.get(key))
        .filter(|v| !v.is_null())
}

/// A JSON value as a table cell.
pub fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => NONE.into(),
        Some(Value::String(s)) if s.is_empty() => NONE.into(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Array(a)) if a.is_empty() => NONE.into(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| cell(Some(x)))
            .collect::<Vec<_>>()
            .join(","),
        Some(Value::Object(m)) => match (m.get("min"), m.get("max")) {
            // A range such as `nodes: {min: 2, max: 4}`.
            (Some(lo), Some(hi)) if lo == hi => cell(Some(lo)),
            (Some(lo), Some(hi)) => format!("{}-{}", cell(Some(lo)), cell(Some(hi))),
            (Some(lo), None) => format!("{}+", cell(Some(lo))),
            (None, Some(hi)) => format!("<={}", cell(Some(hi))),
            _ => serde_json::to_string(m).unwrap_or_default(),
        },
    }
}

/// When a Schedule starts its next run (UTC, to the second), computed here with the scheduler's
/// own slot rule; `<none>` when suspended or invalid.
pub fn next_schedule(spec: &Value, now: DateTime<Utc>) -> String {
    tb_api::specs::parse_spec::<tb_api::specs::ScheduleSpec>(spec)
        .ok()
        .and_then(|s| tb_core::scheduler::schedules::next_run(&s, now))
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| NONE.into())
}

/// How long ago an RFC 3339 timestamp was, kubectl style; `<unknown>` if it cannot be read.
pub fn age(timestamp: &str, now: DateTime<Utc>) -> String {
    match DateTime::parse_from_rfc3339(timestamp) {
        Ok(t) => human_duration(now.signed_duration_since(t.with_timezone(&Utc))),
        Err(_) => "<unknown>".into(),
    }
}

/// How long ago a typed timestamp was; `<unknown>` when it is unset.
pub fn age_of(timestamp: Option<&tb_api::Timestamp>, now: DateTime<Utc>) -> String {
    match timestamp {
        Some(t) => human_duration(now.signed_duration_since(t.at())),
        None => "<unknown>".into(),
    }
}

/// kubectl's HumanDuration: two significant units while they help, one after.
pub fn human_duration(d: chrono::TimeDelta) -> String {
    let secs = d.num_seconds();
    if secs < -1 {
        return "<invalid>".into();
    }
    let secs = secs.max(0);
    if secs < 120 {
        return format!("{secs}s");
    }
    let mins = secs / 60;
    if mins < 10 {
        return match secs % 60 {
            0 => format!("{mins}m"),
            s => format!("{mins}m{s}s"),
        };
    }
    if mins < 180 {
        return format!("{mins}m");
    }
    let hours = mins / 60;
    if hours < 8 {
        return match mins % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 24 * 8 {
        return match hours % 24 {
            0 => format!("{days}d"),
            h => format!("{days}d{h}h"),
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if hours < 24 * 365 * 8 {
        return match days % 365 {
            0 => format!("{years}y"),
            d => format!("{years}y{d}d"),
        };
    }
    format!("{years}y")
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;
    use serde_json::json;

    fn obj(v: Value) -> Object {
        serde_json::from_value(v).expect("object")
    }

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2025-06-01T12:00:00Z")
            .expect("time")
            .with_timezone(&Utc)
    }

    #[test]
    fn human_durations_match_kubectl() {
        let cases = [
            (0, "0s"),
            (59, "59s"),
            (119, "119s"),
            (120, "2m"),
            (150, "2m30s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600 + 5 * 60, "3h5m"),
            (8 * 3600, "8h"),
            (47 * 3600, "47h"),
            (50 * 3600, "2d2h"),
            (10 * 86400, "10d"),
            (800 * 86400, "2y70d"),
            (3000 * 86400, "8y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(TimeDelta::seconds(secs)), want, "{secs}s");
        }
        assert_eq!(human_duration(TimeDelta::seconds(-5)), "<invalid>");
    }

    #[test]
    fn next_schedule_in_the_schedules_zone() {
        let spec = json!({"schedule": "0 2 * * *", "timeZone": "Europe/Paris",
            "jobTemplate": {"spec": {"command": ["true"]}}});
        assert_eq!(next_schedule(&spec, now()), "2025-06-02T00:00:00Z");
        let suspended = json!({"schedule": "0 2 * * *", "suspend": true,
            "jobTemplate": {"spec": {"command": ["true"]}}});
        assert_eq!(next_schedule(&suspended, now()), NONE);
    }

    #[test]
    fn ages_from_timestamps() {
        assert_eq!(age("2025-06-01T11:55:00Z", now()), "5m");
        assert_eq!(age("2025-06-01T11:59:59.500+00:00", now()), "0s");
        assert_eq!(age("", now()), "<unknown>");
    }

    #[test]
    fn inference_service_row() {
        let o = obj(json!({
            "apiVersion": "tb/v1", "kind": "InferenceService",
            "metadata": {"name": "chat", "namespace": "team-a", "creationTimestamp": "2025-06-01T11:00:00Z",
                         "labels": {"app": "chat", "tier": "gold"}},
            "spec": {"model": "qwen3-235b", "parallelism": "pipeline", "nodes": {"min": 2, "max": 4}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "endpoint": "http://10.0.0.1:32324/v1",
                       "url": "https://10.0.0.9:7401/services/team-a/chat/v1"}
        }));
        let view = View {
            kind: Kind::InferenceService,
            all_namespaces: true,
            wide: true,
        };
        assert_eq!(
            view.headers(),
            [
                "NAMESPACE",
                "NAME",
                "MODEL",
                "PARALLELISM",
                "NODES",
                "READY",
                "URL",
                "QUEUE",
                "POSITION",
                "AGE",
                "BACKEND",
                "MESSAGE",
                "LABELS"
            ]
        );
        assert_eq!(
            view.row(&o, now()),
            [
                "team-a",
                "chat",
                "qwen3-235b",
                "pipeline",
                "2-4",
                "True",
                "https://10.0.0.9:7401/services/team-a/chat/v1",
                "-",
                "-",
                "60m",
                "http://10.0.0.1:32324/v1",
                "<none>",
                "app=chat,tier=gold"
            ]
        );
    }

    #[test]
    fn cluster_scoped_kinds_have_no_namespace_column() {
        let view = View {
            kind: Kind::Node,
            all_namespaces: true,
            wide: false,
        };
        assert_eq!(
            view.headers(),
            ["NAME", "READY", "FREE/TOTAL", "CHIP", "AGE"]
        );
        let o = obj(json!({
            "apiVersion": "tb/v1", "kind": "Node", "metadata": {"name": "mac1"},
            "status": {"capacity": {"memory": "512Gi"}}
        }));
        assert_eq!(
            view.row(&o, now()),
            ["mac1", "Unknown", "?/512Gi", "<none>", "<unknown>"]
        );
    }

    fn node() -> Object {
        obj(json!({
            "apiVersion": "tb/v1", "kind": "Node",
            "metadata": {"name": "mac-mini-1", "creationTimestamp": "2025-06-01T10:00:00Z", "labels": {"rack": "a"}},
            "spec": {"unschedulable": false},
            "status": {
                "address": "10.0.0.2:7601",
                "capacity": {"memory": "64Gi", "memoryBytes": 68719476736u64, "allocatableBytes": 55834574848u64,
                             "chip": "Apple M4 Pro", "cpuCores": 14, "gpuCores": 20},
                "freeBytes": 44023414784u64, "allocatedBytes": 25769803776u64,
                "portRange": {"start": 32323, "end": 32422},
                "allocations": ["ft-e1-r0", "chat-e2-r1"],
                "conditions": [{"type": "Ready", "status": "True"}, {"type": "MemoryPressure", "status": "False"}]
            }
        }))
    }

    #[test]
    fn node_rows() {
        let view = View {
            kind: Kind::Node,
            all_namespaces: false,
            wide: false,
        };
        assert_eq!(
            view.row(&node(), now()),
            ["mac-mini-1", "True", "41Gi/64Gi", "Apple M4 Pro", "120m"]
        );
        let wide = View { wide: true, ..view };
        assert_eq!(
            wide.headers(),
            [
                "NAME",
                "READY",
                "FREE/TOTAL",
                "CHIP",
                "AGE",
                "ADDRESS",
                "ALLOCATED",
                "LABELS"
            ]
        );
        assert_eq!(
            wide.row(&node(), now()),
            [
                "mac-mini-1",
                "True",
                "41Gi/64Gi",
                "Apple M4 Pro",
                "120m",
                "10.0.0.2:7601",
                "24Gi (46%)",
                "rack=a"
            ]
        );
        assert_eq!(
            view.table(&[node()], now()).render(),
            "NAME         READY   FREE/TOTAL   CHIP           AGE\n\
             mac-mini-1   True    41Gi/64Gi    Apple M4 Pro   120m\n"
        );
    }

    #[test]
    fn a_node_that_has_not_reported_yet() {
        let o = obj(json!({"apiVersion": "tb/v1", "kind": "Node", "metadata": {"name": "new"}}));
        assert_eq!(kind_cells(Kind::Node, &o), ["Unknown", "<none>", "<none>"]);
        assert_eq!(kind_wide_cells(Kind::Node, &o), ["<none>", "<none>"]);
        // A malformed field leaves the others readable.
        let o = obj(
            json!({"apiVersion": "tb/v1", "kind": "Node", "metadata": {"name": "odd"},
                           "status": {"freeBytes": "lots", "capacity": {"memoryBytes": 1073741824u64}}}),
        );
        assert_eq!(kind_cells(Kind::Node, &o)[1], "?/1Gi");
    }

    #[test]
    fn human_sizes() {
        let cases = [
            (0, "0"),
            (900, "900"),
            (1024, "1Ki"),
            (1536, "1.5Ki"),
            (512 << 20, "512Mi"),
            (1 << 30, "1Gi"),
            ((1 << 30) + (1 << 29), "1.5Gi"),
            (9_990_000_000, "9.3Gi"),
            (10_700_000_000, "10Gi"),
            (44_023_414_784, "41Gi"),
            (64 << 30, "64Gi"),
            (512 << 30, "512Gi"),
            (1536 << 30, "1.5Ti"),
        ];
        for (bytes, want) in cases {
            assert_eq!(human_bytes(bytes), want, "{bytes}");
        }
        assert_eq!(share(Some(24 << 30), Some(52 << 30)), "24Gi (46%)");
        assert_eq!(share(Some(0), Some(52 << 30)), "0 (0%)");
        assert_eq!(share(Some(24 << 30), None), "24Gi");
        assert_eq!(share(None, Some(1)), "<none>");
    }

    #[test]
    fn missing_fields_print_none() {
        let o = obj(json!({"apiVersion": "tb/v1", "kind": "Queue", "metadata": {"name": "q"}}));
        let view = View {
            kind: Kind::Queue,
            all_namespaces: false,
            wide: false,
        };
        assert_eq!(view.row(&o, now())[1..3], ["<none>", "<none>"]);
    }

    #[test]
    fn training_job_status_from_conditions() {
        let o = obj(json!({
            "apiVersion": "tb/v1", "kind": "TrainingJob", "metadata": {"name": "ft"},
            "spec": {"ranks": 4, "executor": "exec"},
            "status": {"conditions": [{"type": "Running", "status": "False"}, {"type": "Complete", "status": "True"}]}
        }));
        assert_eq!(
            kind_cells(Kind::TrainingJob, &o),
            ["4", "exec", "Complete", "0", "<none>", "-", "-"]
        );
    }

    #[test]
    fn training_job_status_restarts_and_nodes() {
        let job = |status: Value| {
            obj(json!({
                "apiVersion": "tb/v1", "kind": "TrainingJob", "metadata": {"name": "ft"},
                "spec": {"nodes": 2, "executor": "exec"}, "status": status
            }))
        };
        let pending = job(
            json!({"phase": "Pending", "reason": "Unschedulable", "message": "needs 2 Macs with 40Gi free"}),
        );
        assert_eq!(
            kind_cells(Kind::TrainingJob, &pending),
            [
                "2",
                "exec",
                "Pending (Unschedulable)",
                "0",
                "<none>",
                "-",
                "-"
            ]
        );
        let running = job(
            json!({"phase": "Running", "reason": "AllRanksRunning", "restarts": 2,
                                 "nodes": ["mac1", "mac2"]}),
        );
        assert_eq!(
            kind_cells(Kind::TrainingJob, &running),
            ["2", "exec", "Running", "2", "mac1,mac2", "-", "-"]
        );
        let mut queued = pending.clone();
        queued.status["queue"] = json!("research");
        queued.status["position"] = json!(3);
        assert_eq!(
            kind_cells(Kind::TrainingJob, &queued)[5..],
            ["research", "3"]
        );
        assert_eq!(
            kind_wide_cells(Kind::TrainingJob, &queued),
            ["<none>", "<none>", "needs 2 Macs with 40Gi free"]
        );
        let mut training = queued.clone();
        training.status["training"] = json!({"step": 3, "totalSteps": 10, "loss": 1.23456});
        assert_eq!(
            kind_wide_cells(Kind::TrainingJob, &training)[..2],
            ["3/10", "1.2346"]
        );
        assert_eq!(
            kind_cells(Kind::TrainingJob, &job(json!({"phase": "Pending"})))[2],
            "Pending"
        );
        let view = View {
            kind: Kind::TrainingJob,
            all_namespaces: false,
            wide: false,
        };
        assert_eq!(
            view.headers(),
            [
                "NAME", "RANKS", "EXECUTOR", "STATUS", "RESTARTS", "NODES", "QUEUE", "POSITION",
                "AGE"
            ]
        );
    }
}
