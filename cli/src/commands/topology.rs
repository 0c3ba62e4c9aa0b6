//! `tbctl topology`: the Macs and the cables between them, with what the nodelets measured.
//!
//! - default: a table of Macs (memory, chip bandwidth, the engine's measured decode speed,
//!   ports), a table of links (ends, RDMA, nominal and measured bandwidth, latency p50/p99,
//!   when measured) and a picture: each Mac with its neighbours;
//! - `-o dot`: Graphviz (`tbctl topology -o dot | dot -Tsvg > lab.svg`);
//! - `-o json`: `{"macs": [...Node objects], "links": [...Link objects]}`.
//!
//! `tbctl topology probe [LINK...]` asks the nodelets to measure links again (all when none
//! is named) by raising each Link's `spec.probeRequest`; `--wait` waits for the figures.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use chrono::Utc;
use serde_json::{Value, json};
use tb_api::proto::{ApplyRequest, ListRequest};
use tb_api::specs::{LinkSpec, LinkStatus, parse_spec};
use tb_api::status::NodeStatus;
use tb_api::{Kind, Object};

use super::{Ctx, parse_object, request_id};
use crate::args::{TopologyArgs, TopologyCommand, TopologyOutput};
use crate::columns::{age_of, human_bytes, node_ready};
use crate::output::{Table, emit};

async fn list(ctx: &mut Ctx, kind: Kind) -> Result<Vec<Object>> {
    let resp = ctx
        .client()
        .list(ListRequest {
            kind: kind.as_str().to_string(),
            namespace: String::new(),
            label_selector: String::new(),
            stale: false,
        })
        .await?;
    let mut objects = resp
        .objects_json
        .iter()
        .map(|j| parse_object(j))
        .collect::<Result<Vec<_>>>()?;
    objects.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(objects)
}

/// How long `probe --wait` waits without --timeout.
pub const DEFAULT_PROBE_WAIT: Duration = Duration::from_secs(60);

pub async fn run(ctx: &mut Ctx, args: &TopologyArgs, timeout: Option<Duration>) -> Result<()> {
    match &args.command {
        Some(TopologyCommand::Probe(p)) => {
            probe(ctx, &p.links, p.wait, timeout.unwrap_or(DEFAULT_PROBE_WAIT)).await
        }
        None => {
            let nodes = list(ctx, Kind::Node).await?;
            let links = list(ctx, Kind::Link).await?;
            let text = match args.output {
                TopologyOutput::Table => render_tables(&nodes, &links),
                TopologyOutput::Dot => render_dot(&nodes, &links),
                TopologyOutput::Json => {
                    serde_json::to_string_pretty(&json!({"macs": nodes, "links": links}))? + "\n"
                }
            };
            emit(&text)
        }
    }
}

/// A Link parsed; None for one that does not parse (shown as unknown).
fn parsed(o: &Object) -> Option<(LinkSpec, LinkStatus)> {
    let spec = parse_spec::<LinkSpec>(&o.spec).ok()?;
    Some((spec, LinkStatus::from_value(&o.status)))
}

fn gbps(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |g| format!("{g:.1}"))
}

fn micros(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |us| format!("{us:.0}"))
}

pub fn render_tables(nodes: &[Object], links: &[Object]) -> String {
    let mut out = String::new();
    let mut macs = Table::new([
        "MAC", "READY", "CHIP", "MEMORY", "FREE", "GB/S", "ENGINE", "PORTS",
    ]);
    for n in nodes {
        let s = NodeStatus::from_value(&n.status);
        macs.push(vec![
            n.metadata.name.clone(),
            node_ready(n),
            if s.capacity.chip.is_empty() {
                "-".into()
            } else {
                s.capacity.chip.clone()
            },
            human_bytes(s.capacity.memory_bytes),
            human_bytes(
                s.capacity
                    .allocatable_bytes
                    .saturating_sub(s.allocated_bytes),
            ),
            s.capacity
                .memory_bandwidth_gbps
                .map_or_else(|| "-".into(), |b| format!("{b:.0}")),
            // What tb's engine measured of itself: decode GB/s of weights + µs per token, and
            // with how many threads.
            s.capacity.engine.as_ref().map_or_else(
                || "-".into(),
                |e| {
                    format!(
                        "{} {:.2} GB/s +{:.0}µs{}",
                        e.backend,
                        e.weight_gbs,
                        e.token_overhead_us,
                        e.threads.map_or_else(String::new, |t| format!(
                            ", {t} thread{}",
                            if t == 1 { "" } else { "s" }
                        ))
                    )
                },
            ),
            if s.ports.is_empty() {
                "-".into()
            } else {
                s.ports
                    .iter()
                    .map(|p| match &p.peer_uuid {
                        Some(_) => format!("{}*", p.name),
                        None => p.name.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            },
        ]);
    }
    out.push_str(&macs.render());
    out.push('\n');
    if links.is_empty() {
        out.push_str("No links (no two Macs report ports cabled to each other).\n");
        return out;
    }
    let mut t = Table::new([
        "LINK", "A", "B", "RDMA", "NOMINAL", "GB/S", "P50 µS", "P99 µS", "MEASURED",
    ]);
    let now = Utc::now();
    for l in links {
        let Some((spec, status)) = parsed(l) else {
            t.push(vec![l.metadata.name.clone(), "?".into()]);
            continue;
        };
        t.push(vec![
            l.metadata.name.clone(),
            format!("{}/{}", spec.a.node, spec.a.port),
            format!("{}/{}", spec.b.node, spec.b.port),
            if spec.rdma { "yes" } else { "no" }.into(),
            gbps(spec.nominal_gbps),
            gbps(status.bandwidth_gbps),
            micros(status.latency_us_p50),
            micros(status.latency_us_p99),
            if !status.error.is_empty() {
                format!("failed: {}", status.error)
            } else if let Some(at) = &status.measured_at {
                format!("{} ago", age_of(Some(at), now))
            } else {
                "never".into()
            },
        ]);
    }
    out.push_str(&t.render());
    out.push('\n');
    out.push_str(&render_picture(nodes, links));
    out
}

/// Each Mac and its neighbours: `a ══ b (61.2 Gb/s, 7 µs, rdma)`; `══` RDMA, `──` TCP,
/// `┄┄` not measured yet.
pub fn render_picture(nodes: &[Object], links: &[Object]) -> String {
    let mut neighbours: BTreeMap<String, Vec<String>> = nodes
        .iter()
        .map(|n| (n.metadata.name.clone(), Vec::new()))
        .collect();
    for l in links {
        let Some((spec, status)) = parsed(l) else {
            continue;
        };
        let line = if !status.measured() {
            "┄┄"
        } else if spec.rdma {
            "══"
        } else {
            "──"
        };
        let figures = match (status.bandwidth_gbps, status.latency_us_p50) {
            (Some(b), Some(us)) => format!("{b:.1} Gb/s, {us:.0} µs"),
            _ => format!("{} Gb/s nominal", gbps(spec.nominal_gbps)),
        };
        for (here, there) in [(&spec.a, &spec.b), (&spec.b, &spec.a)] {
            neighbours
                .entry(here.node.clone())
                .or_default()
                .push(format!(
                    "{line} {} ({figures}{}, {}→{})",
                    there.node,
                    if spec.rdma { ", rdma" } else { "" },
                    here.port,
                    there.port
                ));
        }
    }
    let width = neighbours.keys().map(String::len).max().unwrap_or(0);
    let mut out = String::new();
    for (mac, list) in &neighbours {
        if list.is_empty() {
            let _ = writeln!(out, "{mac:<width$}   (no cables)");
            continue;
        }
        for (i, n) in list.iter().enumerate() {
            let label = if i == 0 { mac.as_str() } else { "" };
            let _ = writeln!(out, "{label:<width$} {n}");
        }
    }
    out
}

pub fn render_dot(nodes: &[Object], links: &[Object]) -> String {
    let mut out = String::from("graph tb {\n  node [shape=box];\n");
    for n in nodes {
        let s = NodeStatus::from_value(&n.status);
        let _ = writeln!(
            out,
            "  \"{}\" [label=\"{}\\n{}\\n{} free\"];",
            n.metadata.name,
            n.metadata.name,
            if s.capacity.chip.is_empty() {
                "?"
            } else {
                &s.capacity.chip
            },
            human_bytes(
                s.capacity
                    .allocatable_bytes
                    .saturating_sub(s.allocated_bytes)
            )
        );
    }
    for l in links {
        let Some((spec, status)) = parsed(l) else {
            continue;
        };
        let label = match (status.bandwidth_gbps, status.latency_us_p50) {
            (Some(b), Some(us)) => format!("{b:.1} Gb/s\\n{us:.0} µs"),
            _ => format!("{} Gb/s?", gbps(spec.nominal_gbps)),
        };
        let _ = writeln!(
            out,
            "  \"{}\" -- \"{}\" [label=\"{label}\"{}];",
            spec.a.node,
            spec.b.node,
            if spec.rdma { ", penwidth=3" } else { "" }
        );
    }
    out.push_str("}\n");
    out
}

async fn probe(ctx: &mut Ctx, names: &[String], wait: bool, timeout: Duration) -> Result<()> {
    let links = list(ctx, Kind::Link).await?;
    let chosen: Vec<&Object> = if names.is_empty() {
        links.iter().collect()
    } else {
        let mut chosen = Vec::new();
        for n in names {
            match links.iter().find(|l| &l.metadata.name == n) {
                Some(l) => chosen.push(l),
                None => bail!(
                    "link {n:?} not found; the links are: {}",
                    links
                        .iter()
                        .map(|l| l.metadata.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        }
        chosen
    };
    if chosen.is_empty() {
        bail!("no links to probe (no two Macs report ports cabled to each other)");
    }
    let mut wanted = Vec::new();
    for l in chosen {
        let Some((mut spec, _)) = parsed(l) else {
            bail!("link {} has a spec tbctl cannot read", l.metadata.name);
        };
        spec.probe_request += 1;
        let mut o = l.clone();
        o.spec = serde_json::to_value(&spec)?;
        o.status = Value::Null;
        let req = ApplyRequest {
            objects_json: vec![serde_json::to_string(&o)?],
            dry_run: false,
            request_id: request_id(),
        };
        ctx.client().apply(req).await?;
        println!("link/{} probe requested", l.metadata.name);
        wanted.push((l.metadata.name.clone(), spec.probe_request));
    }
    if !wait {
        return Ok(());
    }
    let deadline = Instant::now() + timeout;
    loop {
        let links = list(ctx, Kind::Link).await?;
        let pending: Vec<&str> = wanted
            .iter()
            .filter(|(name, request)| {
                links
                    .iter()
                    .find(|l| &l.metadata.name == name)
                    .and_then(parsed)
                    .is_none_or(|(_, s)| s.probe_request < *request)
            })
            .map(|(n, _)| n.as_str())
            .collect();
        if pending.is_empty() {
            let nodes = list(ctx, Kind::Node).await?;
            return emit(&render_tables(&nodes, &links));
        }
        if Instant::now() >= deadline {
            bail!(
                "timed out after {:?} waiting for {}",
                timeout,
                pending.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tb_api::ObjectMeta;

    fn obj(kind: &str, name: &str, spec: Value, status: Value) -> Object {
        Object {
            api_version: "tb/v1".into(),
            kind: kind.into(),
            metadata: ObjectMeta {
                name: name.into(),
                ..Default::default()
            },
            spec,
            status,
        }
    }

    fn sample() -> (Vec<Object>, Vec<Object>) {
        let nodes = ["m1", "m2", "m3"]
            .iter()
            .map(|n| {
                obj(
                    "Node",
                    n,
                    json!({}),
                    json!({"capacity": {"chip": "Apple M4 Max", "memoryBytes": 68719476736u64,
                                        "allocatableBytes": 60129542144u64, "memoryBandwidthGbps": 546.0},
                           "ports": [{"name": "tb1", "uuid": format!("{n}/tb1"), "peerUuid": "x"}]}),
                )
            })
            .collect();
        let links = vec![
            obj(
                "Link",
                "m1.tb1.m2.tb1",
                json!({"a": {"node": "m1", "port": "tb1"}, "b": {"node": "m2", "port": "tb1"},
                       "nominalGbps": 80.0, "rdma": true}),
                json!({"bandwidthGbps": 61.5, "latencyUsP50": 7.0, "latencyUsP99": 12.0,
                       "measuredAt": "2026-12-02T10:00:00.000Z"}),
            ),
            obj(
                "Link",
                "m2.tb2.m3.tb1",
                json!({"a": {"node": "m2", "port": "tb2"}, "b": {"node": "m3", "port": "tb1"},
                       "nominalGbps": 40.0}),
                json!(null),
            ),
        ];
        (nodes, links)
    }

    #[test]
    fn tables_and_picture_show_measured_and_unmeasured_links() {
        let (nodes, links) = sample();
        let text = render_tables(&nodes, &links);
        assert!(text.contains("m1.tb1.m2.tb1"), "{text}");
        assert!(text.contains("61.5"), "{text}");
        assert!(
            text.contains("never"),
            "the unmeasured link says so: {text}"
        );
        assert!(
            text.contains("m1 ══ m2 (61.5 Gb/s, 7 µs, rdma, tb1→tb1)"),
            "{text}"
        );
        assert!(text.contains("┄┄ m3 (40.0 Gb/s nominal"), "{text}");
        assert!(text.contains("546"), "memory bandwidth column: {text}");
    }

    #[test]
    fn dot_is_an_undirected_graph_with_figures() {
        let (nodes, links) = sample();
        let dot = render_dot(&nodes, &links);
        assert!(dot.starts_with("graph tb {"));
        assert!(
            dot.contains("\"m1\" -- \"m2\" [label=\"61.5 Gb/s\\n7 µs\", penwidth=3];"),
            "{dot}"
        );
        assert!(
            dot.contains("\"m2\" -- \"m3\" [label=\"40.0 Gb/s?\"];"),
            "{dot}"
        );
        assert!(dot.trim_end().ends_with('}'));
    }
}
