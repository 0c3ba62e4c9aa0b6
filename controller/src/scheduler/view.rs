//! A read-only view of the cluster for scheduling: each Node with what is free on it (memory,
//! ports) once the allocations that still hold resources are counted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tb_api::specs::{AllocationSpec, AllocationStatus, NodeSpec, parse_spec};
use tb_api::status::NodeStatus;
use tb_api::{Kind, Object};

use crate::store::State;

/// One allocation, parsed.
#[derive(Debug, Clone)]
pub struct Alloc {
    pub object: Arc<Object>,
    pub spec: AllocationSpec,
    pub status: AllocationStatus,
}

impl Alloc {
    /// Memory and ports stay taken until the process is known to be gone.
    pub fn holds_resources(&self) -> bool {
        !self.status.phase.is_terminal()
    }

    pub fn port(&self) -> Option<u16> {
        let mlx = self.spec.mlx.as_ref()?;
        let host = mlx.hosts.get(self.spec.rank as usize)?;
        host.rsplit_once(':')?.1.parse().ok()
    }
}

/// One Node and what is left on it.
#[derive(Debug, Clone)]
pub struct NodeView {
    pub object: Arc<Object>,
    pub name: String,
    pub spec: NodeSpec,
    pub status: NodeStatus,
    pub ready: bool,
    pub free_bytes: u64,
    pub used_ports: BTreeSet<u16>,
}

impl NodeView {
    pub fn schedulable(&self) -> bool {
        self.ready && !self.spec.unschedulable
    }

    /// Being drained: work running here is moved elsewhere (a `NoExecute` taint).
    pub fn draining(&self) -> bool {
        self.spec.taints.iter().any(|t| t.ends_with(":NoExecute"))
    }

    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.object.metadata.labels
    }
}

/// Every node and allocation, parsed once per reconcile pass.
pub struct ClusterView {
    pub nodes: BTreeMap<String, NodeView>,
    pub allocations: Vec<Alloc>,
}

impl ClusterView {
    pub fn build(state: &State) -> ClusterView {
        let allocations: Vec<Alloc> = state
            .list(Kind::Allocation.as_str(), "")
            .into_iter()
            .filter_map(|o| {
                let spec = parse_spec::<AllocationSpec>(&o.spec).ok()?;
                let status = AllocationStatus::from_value(&o.status);
                Some(Alloc {
                    object: o,
                    spec,
                    status,
                })
            })
            .collect();
        let mut nodes = BTreeMap::new();
        for o in state.list(Kind::Node.as_str(), "") {
            let spec = parse_spec::<NodeSpec>(&o.spec).unwrap_or_default();
            let status = NodeStatus::from_value(&o.status);
            let ready = status.is_ready();
            let name = o.metadata.name.clone();
            nodes.insert(
                name.clone(),
                NodeView {
                    free_bytes: status.capacity.allocatable_bytes,
                    object: o,
                    name,
                    spec,
                    status,
                    ready,
                    used_ports: BTreeSet::new(),
                },
            );
        }
        for a in allocations.iter().filter(|a| a.holds_resources()) {
            if let Some(n) = nodes.get_mut(&a.spec.node) {
                n.free_bytes = n.free_bytes.saturating_sub(a.spec.memory_bytes);
                if let Some(p) = a.port() {
                    n.used_ports.insert(p);
                }
            }
        }
        ClusterView { nodes, allocations }
    }

    /// A job's allocations (any epoch).
    pub fn allocations_of<'a>(
        &'a self,
        namespace: &'a str,
        kind: &'a str,
        name: &'a str,
    ) -> impl Iterator<Item = &'a Alloc> {
        self.allocations.iter().filter(move |a| {
            a.object.metadata.namespace == namespace
                && a.spec.job.kind == kind
                && a.spec.job.name == name
        })
    }
}
