//! Links: the cables between Macs, found by joining the ports the nodelets report. Two ports
//! are the ends of one cable when each names the other's uuid as its peer. Each cable becomes
//! a Link object (its spec from the ports; its status measured by the nodelet at end `a`).
//! A Link whose ports change is measured again; a Link whose ports are gone is deleted.

use std::collections::BTreeMap;
use std::sync::Arc;

use tb_api::specs::{LinkEnd, LinkSpec, LinkStatus, link_name, parse_spec};
use tb_api::status::PortStatus;
use tb_api::{Kind, Object, ObjectKey, ObjectMeta};

use super::view::ClusterView;
use crate::store::{Plan, PlanWrite};

/// A stored Link, parsed.
#[derive(Debug, Clone)]
pub struct LinkView {
    pub object: Arc<Object>,
    pub spec: LinkSpec,
    pub status: LinkStatus,
}

/// Link objects, parsed, by name; ones that do not parse are left out.
pub fn parse_links(objects: Vec<Arc<Object>>) -> BTreeMap<String, LinkView> {
    objects
        .into_iter()
        .filter_map(|o| {
            let spec = parse_spec::<LinkSpec>(&o.spec).ok()?;
            let status = LinkStatus::from_value(&o.status);
            Some((
                o.metadata.name.clone(),
                LinkView {
                    object: o,
                    spec,
                    status,
                },
            ))
        })
        .collect()
}

fn end(node: &str, port: &PortStatus) -> LinkEnd {
    LinkEnd {
        node: node.to_string(),
        port: port.name.clone(),
        interface: port.interface.clone(),
        address: port.address.clone(),
        rdma_device: port.rdma_device.clone(),
    }
}

/// The Links the Nodes' ports describe, by name. Pure.
pub fn desired_links(view: &ClusterView) -> BTreeMap<String, LinkSpec> {
    // uuid → (node, port); a uuid claimed twice is ambiguous and joins nothing.
    let mut by_uuid: BTreeMap<&str, Option<(&str, &PortStatus)>> = BTreeMap::new();
    for node in view.nodes.values() {
        for port in &node.status.ports {
            by_uuid
                .entry(port.uuid.as_str())
                .and_modify(|e| *e = None)
                .or_insert(Some((node.name.as_str(), port)));
        }
    }
    let mut links = BTreeMap::new();
    for (uuid, here) in &by_uuid {
        let Some((node, port)) = here else { continue };
        let Some(peer_uuid) = port.peer_uuid.as_deref() else {
            continue;
        };
        let Some(Some((peer_node, peer))) = by_uuid.get(peer_uuid) else {
            continue;
        };
        // Each cable once, from the end that sorts first; both ends must agree.
        if peer.peer_uuid.as_deref() != Some(uuid) || node == peer_node {
            continue;
        }
        if (*node, port.name.as_str()) > (*peer_node, peer.name.as_str()) {
            continue;
        }
        let nominal = match (port.speed_gbps, peer.speed_gbps) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        let spec = LinkSpec {
            a: end(node, port),
            b: end(peer_node, peer),
            nominal_gbps: nominal,
            rdma: port.rdma_device.is_some() && peer.rdma_device.is_some(),
            probe_request: 0,
        };
        links.insert(link_name(node, &port.name, peer_node, &peer.name), spec);
    }
    links
}

fn link_key(name: &str) -> ObjectKey {
    ObjectKey {
        kind: Kind::Link.as_str().into(),
        namespace: String::new(),
        name: name.to_string(),
    }
}

/// Plans that make the stored Links match the ports: one plan per Link created, changed or
/// deleted. A user's `probeRequest` survives; changed ports clear the old measurement.
pub fn reconcile_links(view: &ClusterView, stored: &BTreeMap<String, LinkView>) -> Vec<Plan> {
    let desired = desired_links(view);
    let mut plans = Vec::new();
    for (name, mut spec) in desired.clone() {
        let mut plan = Plan::default();
        match stored.get(&name) {
            None => {
                plan.guards.push((link_key(&name), 0));
                plan.writes.push(PlanWrite::Put(Object {
                    api_version: tb_api::API_VERSION.into(),
                    kind: Kind::Link.as_str().into(),
                    metadata: ObjectMeta {
                        name: name.clone(),
                        ..Default::default()
                    },
                    spec: serde_json::to_value(&spec).unwrap_or_default(),
                    status: serde_json::Value::Null,
                }));
            }
            Some(current) => {
                spec.probe_request = current.spec.probe_request;
                if spec == current.spec {
                    continue;
                }
                let mut obj = (*current.object).clone();
                obj.spec = serde_json::to_value(&spec).unwrap_or_default();
                // Different ports or addresses: the old figures describe another path.
                obj.status = serde_json::Value::Null;
                plan.guards
                    .push((obj.key(), current.object.metadata.resource_version));
                plan.writes.push(PlanWrite::Put(obj));
            }
        }
        plans.push(plan);
    }
    for (name, current) in stored {
        if desired.contains_key(name) {
            continue;
        }
        let mut plan = Plan::default();
        plan.guards
            .push((link_key(name), current.object.metadata.resource_version));
        plan.writes.push(PlanWrite::Delete {
            key: link_key(name),
        });
        plans.push(plan);
    }
    plans
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::scheduler::view::NodeView;
    use tb_api::status::NodeStatus;

    fn port(name: &str, uuid: &str, peer: Option<&str>) -> PortStatus {
        PortStatus {
            name: name.into(),
            interface: Some(format!("en{}", &name[2..])),
            address: Some(format!("10.0.{}.1", &name[2..])),
            rdma_device: Some(format!("rdma_en{}", &name[2..])),
            uuid: uuid.into(),
            peer_uuid: peer.map(str::to_string),
            speed_gbps: Some(80.0),
        }
    }

    fn node(name: &str, ports: Vec<PortStatus>) -> NodeView {
        NodeView {
            object: Arc::new(Object {
                api_version: "tb/v1".into(),
                kind: "Node".into(),
                metadata: ObjectMeta {
                    name: name.into(),
                    ..Default::default()
                },
                spec: serde_json::Value::Null,
                status: serde_json::Value::Null,
            }),
            name: name.into(),
            spec: Default::default(),
            status: NodeStatus {
                ports,
                ..Default::default()
            },
            ready: true,
            free_bytes: 0,
            used_ports: BTreeSet::new(),
        }
    }

    fn view(nodes: Vec<NodeView>) -> ClusterView {
        ClusterView {
            nodes: nodes.into_iter().map(|n| (n.name.clone(), n)).collect(),
            allocations: Vec::new(),
            links: BTreeMap::new(),
            models: BTreeMap::new(),
            queues: Default::default(),
            jobs: BTreeMap::new(),
            facts: BTreeMap::new(),
            gangs: Vec::new(),
            unplaceable: Default::default(),
            by_job: BTreeMap::new(),
            parsed: BTreeMap::new(),
        }
    }

    #[test]
    fn ports_naming_each_other_are_one_link() {
        // m1 —(2 cables)— m2 — m3, and a half-plugged port on m3.
        let v = view(vec![
            node(
                "m1",
                vec![
                    port("tb1", "u11", Some("u21")),
                    port("tb2", "u12", Some("u22")),
                ],
            ),
            node(
                "m2",
                vec![
                    port("tb1", "u21", Some("u11")),
                    port("tb2", "u22", Some("u12")),
                    port("tb3", "u23", Some("u31")),
                ],
            ),
            node(
                "m3",
                vec![
                    port("tb1", "u31", Some("u23")),
                    port("tb2", "u32", Some("u99")),
                ],
            ),
        ]);
        let links = desired_links(&v);
        let names: Vec<&str> = links.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            ["m1.tb1.m2.tb1", "m1.tb2.m2.tb2", "m2.tb3.m3.tb1"],
            "two cables m1–m2, one m2–m3, nothing for the unanswered port"
        );
        let l = &links["m2.tb3.m3.tb1"];
        assert_eq!((l.a.node.as_str(), l.b.node.as_str()), ("m2", "m3"));
        assert!(l.rdma);
        assert_eq!(l.a.address.as_deref(), Some("10.0.3.1"));
    }

    #[test]
    fn one_sided_claims_and_duplicate_uuids_join_nothing() {
        let v = view(vec![
            node("m1", vec![port("tb1", "u11", Some("u21"))]),
            node("m2", vec![port("tb1", "u21", None)]),
            node("m3", vec![port("tb1", "dup", Some("x"))]),
            node("m4", vec![port("tb1", "dup", Some("x"))]),
            node("m5", vec![port("tb1", "x", Some("dup"))]),
        ]);
        assert!(desired_links(&v).is_empty());
    }

    #[test]
    fn reconcile_creates_keeps_and_deletes() {
        let v = view(vec![
            node("m1", vec![port("tb1", "u11", Some("u21"))]),
            node("m2", vec![port("tb1", "u21", Some("u11"))]),
        ]);
        let plans = reconcile_links(&v, &BTreeMap::new());
        assert_eq!(plans.len(), 1);
        let PlanWrite::Put(obj) = &plans[0].writes[0] else {
            panic!("a create")
        };
        // Stored with a probe request and a measurement: nothing to do.
        let mut spec: LinkSpec = serde_json::from_value(obj.spec.clone()).expect("spec");
        spec.probe_request = 3;
        let stored_obj = Arc::new(Object {
            spec: serde_json::to_value(&spec).expect("json"),
            ..obj.clone()
        });
        let stored = BTreeMap::from([(
            obj.metadata.name.clone(),
            LinkView {
                object: stored_obj.clone(),
                spec: spec.clone(),
                status: LinkStatus::default(),
            },
        )]);
        assert!(reconcile_links(&v, &stored).is_empty());
        // The address changes: same link, new spec, measurement cleared, probe request kept.
        let mut moved = v;
        if let Some(n) = moved.nodes.get_mut("m2") {
            n.status.ports[0].address = Some("10.9.9.9".into());
        }
        let plans = reconcile_links(&moved, &stored);
        let PlanWrite::Put(obj) = &plans[0].writes[0] else {
            panic!("an update")
        };
        let spec: LinkSpec = serde_json::from_value(obj.spec.clone()).expect("spec");
        assert_eq!(spec.probe_request, 3);
        assert_eq!(spec.b.address.as_deref(), Some("10.9.9.9"));
        assert!(obj.status.is_null());
        // The cable is unplugged: the Link goes.
        let empty = view(vec![node("m1", vec![]), node("m2", vec![])]);
        let plans = reconcile_links(&empty, &stored);
        assert!(matches!(plans[0].writes[0], PlanWrite::Delete { .. }));
    }
}
