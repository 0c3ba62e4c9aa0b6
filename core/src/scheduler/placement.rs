//! Placement: which Mac runs each rank of a gang. A pure function of the cluster view and the
//! request — the one call a topology-aware placement replaces.
//!
//! Today: memory fit, spread first. Each rank goes, in rank order, to the eligible Mac holding
//! the fewest ranks of this gang so far, and among those to the one with the most memory still
//! free (ties by name). So ranks spread across Macs and stack only when they must: a second rank
//! shares a Mac only when no other eligible Mac has room for it, however much more memory the
//! first Mac has free. (Spreading is what distributed ranks want: each gets a Mac's GPU and
//! memory bandwidth to itself. The cables decide only the rank order, see `place_ranks`.) All
//! ranks fit, or the gang is refused with the reason for every Mac.

use std::collections::BTreeMap;

use super::view::NodeView;

/// What a gang needs.
#[derive(Debug, Clone)]
pub struct GangRequest {
    pub ranks: u32,
    pub memory_bytes: u64,
    pub node_selector: BTreeMap<String, String>,
    /// Whole Macs: at most one rank per Mac and nothing else on it.
    pub exclusive: bool,
}

/// Where each rank goes, and the port it listens on there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankSlot {
    pub node: String,
    pub port: u16,
}

/// Why a gang does not fit, for the job's status: one line a person can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unplaceable {
    pub message: String,
}

pub fn place(
    req: &GangRequest,
    nodes: &BTreeMap<String, NodeView>,
) -> Result<Vec<RankSlot>, Unplaceable> {
    let mut why_not: Vec<String> = Vec::new();
    let mut free: Vec<(String, u64, Vec<u16>)> = Vec::new();
    for n in nodes.values() {
        if !n.ready {
            why_not.push(format!("{} is not Ready", n.name));
            continue;
        }
        if n.spec.unschedulable {
            why_not.push(format!("{} is cordoned", n.name));
            continue;
        }
        if let Some((k, v)) = req
            .node_selector
            .iter()
            .find(|(k, v)| n.labels().get(*k) != Some(*v))
        {
            why_not.push(format!("{} does not have label {k}={v}", n.name));
            continue;
        }
        if req.exclusive && n.free_bytes < n.status.capacity.allocatable_bytes {
            why_not.push(format!("{} is not empty (exclusive)", n.name));
            continue;
        }
        let range = n.status.port_range;
        // A gang takes at most one port per rank on a Mac: no need to list more.
        let ports: Vec<u16> = (range.start..=range.end)
            .filter(|p| *p != 0 && !n.used_ports.contains(p))
            .take(req.ranks as usize)
            .collect();
        free.push((n.name.clone(), n.free_bytes, ports));
    }

    let mut slots = Vec::with_capacity(req.ranks as usize);
    let mut used_on: BTreeMap<String, u32> = BTreeMap::new();
    for _ in 0..req.ranks {
        // Fewest ranks of this gang first (spread), then most free memory; the name breaks
        // ties so the plan is deterministic.
        let ranks_on = |name: &String| used_on.get(name).copied().unwrap_or(0);
        let best = free
            .iter_mut()
            .filter(|(name, bytes, ports)| {
                *bytes >= req.memory_bytes
                    && !ports.is_empty()
                    && !(req.exclusive && used_on.contains_key(name))
            })
            .max_by(|a, b| {
                ranks_on(&b.0)
                    .cmp(&ranks_on(&a.0))
                    .then_with(|| a.1.cmp(&b.1))
                    .then_with(|| b.0.cmp(&a.0))
            });
        let Some((name, bytes, ports)) = best else {
            return Err(unplaceable(req, &free, why_not));
        };
        *bytes -= req.memory_bytes;
        let port = ports.remove(0);
        *used_on.entry(name.clone()).or_default() += 1;
        slots.push(RankSlot {
            node: name.clone(),
            port,
        });
    }
    Ok(slots)
}

fn unplaceable(
    req: &GangRequest,
    free: &[(String, u64, Vec<u16>)],
    mut why_not: Vec<String>,
) -> Unplaceable {
    for (name, bytes, ports) in free {
        if ports.is_empty() {
            why_not.push(format!("{name} has no free port"));
        } else if *bytes < req.memory_bytes {
            why_not.push(format!(
                "{name} has {} free ({} short)",
                human(*bytes),
                human(req.memory_bytes - bytes)
            ));
        }
    }
    let total: u64 = free.iter().map(|f| f.1).sum();
    let needed = req.memory_bytes.saturating_mul(u64::from(req.ranks));
    let mut message = format!(
        "{} rank(s) × {} do not fit on {} eligible Mac(s) ({} free in all, {} needed)",
        req.ranks,
        human(req.memory_bytes),
        free.len(),
        human(total),
        human(needed)
    );
    if req.exclusive {
        message.push_str("; exclusive: one rank per empty Mac");
    }
    if !why_not.is_empty() {
        message.push_str(": ");
        message.push_str(&why_not.join(", "));
    }
    Unplaceable { message }
}

/// Bytes as people read them: 1.5Gi, 512Mi.
pub fn human(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("Ti", 1 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ];
    for (unit, size) in UNITS {
        if bytes >= size {
            let v = bytes as f64 / size as f64;
            return if (v - v.round()).abs() < 0.05 {
                format!("{}{unit}", v.round() as u64)
            } else {
                format!("{v:.1}{unit}")
            };
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use super::*;
    use tb_api::status::{NodeCapacity, NodeStatus, PortRange};
    use tb_api::{Object, ObjectMeta};

    const GI: u64 = 1 << 30;

    fn node(name: &str, free_gi: u64, ready: bool) -> NodeView {
        NodeView {
            object: Arc::new(Object {
                api_version: "tb/v1".into(),
                kind: "Node".into(),
                metadata: ObjectMeta {
                    name: name.into(),
                    labels: [("chip".to_string(), "m4".to_string())].into(),
                    ..Default::default()
                },
                spec: serde_json::Value::Null,
                status: serde_json::Value::Null,
            }),
            name: name.into(),
            spec: Default::default(),
            status: NodeStatus {
                capacity: NodeCapacity {
                    allocatable_bytes: 64 * GI,
                    ..Default::default()
                },
                port_range: PortRange {
                    start: 30000,
                    end: 30003,
                },
                ..Default::default()
            },
            ready,
            free_bytes: free_gi * GI,
            used_ports: BTreeSet::new(),
        }
    }

    fn nodes(list: Vec<NodeView>) -> BTreeMap<String, NodeView> {
        list.into_iter().map(|n| (n.name.clone(), n)).collect()
    }

    fn req(ranks: u32, gi: u64) -> GangRequest {
        GangRequest {
            ranks,
            memory_bytes: gi * GI,
            node_selector: BTreeMap::new(),
            exclusive: false,
        }
    }

    #[test]
    fn spreads_then_stacks() {
        let n = nodes(vec![node("a", 10, true), node("b", 10, true)]);
        let slots = place(&req(3, 4), &n).expect("fits");
        let names: Vec<_> = slots.iter().map(|s| s.node.as_str()).collect();
        assert_eq!(names, ["a", "b", "a"]);
        assert_eq!(slots[0].port, 30000);
        assert_eq!(slots[2].port, 30001, "two ranks on one Mac get two ports");
    }

    #[test]
    fn a_roomier_mac_does_not_take_a_second_rank_while_another_has_room() {
        // The case a user met: one Mac with much more free memory than the others.
        let n = nodes(vec![
            node("big", 60, true),
            node("m2", 22, true),
            node("m3", 22, true),
        ]);
        let names =
            |slots: Vec<RankSlot>| -> Vec<String> { slots.into_iter().map(|s| s.node).collect() };
        assert_eq!(names(place(&req(2, 1), &n).expect("fits")), ["big", "m2"]);
        assert_eq!(
            names(place(&req(3, 1), &n).expect("fits")),
            ["big", "m2", "m3"]
        );
        // Four ranks on three Macs: one stacks, on the Mac with the most left.
        assert_eq!(
            names(place(&req(4, 1), &n).expect("fits")),
            ["big", "m2", "m3", "big"]
        );
        // A Mac too small for a rank is skipped; stacking happens only where room is.
        let n = nodes(vec![
            node("big", 60, true),
            node("m2", 22, true),
            node("small", 2, true),
        ]);
        assert_eq!(
            names(place(&req(3, 8), &n).expect("fits")),
            ["big", "m2", "big"]
        );
    }

    #[test]
    fn all_or_nothing_with_reasons() {
        let mut cordoned = node("c", 64, true);
        cordoned.spec.unschedulable = true;
        let n = nodes(vec![node("a", 10, true), node("b", 64, false), cordoned]);
        let err = place(&req(2, 8), &n).unwrap_err();
        assert!(err.message.contains("b is not Ready"), "{}", err.message);
        assert!(err.message.contains("c is cordoned"), "{}", err.message);
        assert!(
            err.message.contains("a has 2Gi free (6Gi short)"),
            "{}",
            err.message
        );
    }

    #[test]
    fn node_selector_and_exclusive() {
        let n = nodes(vec![node("a", 64, true), node("b", 64, true)]);
        let mut r = req(2, 1);
        r.node_selector.insert("chip".into(), "m3".into());
        assert!(
            place(&r, &n)
                .unwrap_err()
                .message
                .contains("does not have label chip=m3")
        );
        let mut r = req(3, 1);
        r.exclusive = true;
        assert!(place(&r, &n).is_err(), "3 exclusive ranks need 3 Macs");
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(64 * GI), "64Gi");
        assert_eq!(human(GI + GI / 2), "1.5Gi");
        assert_eq!(human(512 << 20), "512Mi");
    }
}
