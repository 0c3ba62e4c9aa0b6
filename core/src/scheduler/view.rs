//! A read-only view of the cluster for scheduling: each Node with what is free on it (memory,
//! ports) once the allocations that still hold resources are counted.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tb_api::specs::{AllocationSpec, AllocationStatus, ModelSpec, NodeSpec, parse_spec};

use super::SchedulerConfig;
use super::memo::{Memo, ParsedJob};
use tb_api::status::NodeStatus;
use tb_api::{Kind, Object};

use super::links::{LinkView, parse_links};
use super::queues::Queues;
use crate::placement::{Topology, live};
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

    /// The ports of its node this rank listens on.
    pub fn ports(&self) -> Vec<u16> {
        let port_of = |h: &str| h.rsplit_once(':').and_then(|(_, p)| p.parse().ok());
        let mut ports = Vec::new();
        if let Some(mlx) = &self.spec.mlx
            && let Some(p) = mlx
                .hosts
                .get(self.spec.rank as usize)
                .and_then(|h| port_of(h))
        {
            ports.push(p);
        }
        if let Some(b) = &self.spec.builtin
            && self.spec.rank == 0
        {
            ports.extend(port_of(&b.coordinator));
            ports.extend(b.endpoint_port);
        }
        ports
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

    /// Why no new work may go here, if so.
    pub fn unavailable(&self) -> Option<String> {
        if !self.ready {
            Some("not Ready".into())
        } else if self.spec.unschedulable {
            Some("cordoned".into())
        } else if self.draining() {
            Some("draining".into())
        } else {
            None
        }
    }

    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.object.metadata.labels
    }
}

/// Every node, allocation, link and model, parsed once per reconcile pass.
#[derive(Clone)]
pub struct ClusterView {
    pub nodes: BTreeMap<String, NodeView>,
    pub allocations: Vec<Alloc>,
    pub links: BTreeMap<String, LinkView>,
    /// (namespace, name) → spec; Models that do not parse are left out.
    pub models: BTreeMap<(String, String), ModelSpec>,
    /// Queues and what their running work holds.
    pub queues: Queues,
    /// TrainingJobs and InferenceServices by (kind, namespace, name), for preemption.
    pub jobs: BTreeMap<(String, String, String), Arc<Object>>,
    /// Each job's priority and queue, parsed once per pass.
    pub facts: BTreeMap<(String, String, String), JobFacts>,
    /// The gangs running now (ranks told to run and holding resources), by job and epoch: what
    /// preemption may choose from.
    pub gangs: Vec<Gang>,
    /// Gang shapes (ranks × memory, selector, exclusive) found not to fit this pass, with why;
    /// cleared whenever capacity changes.
    pub unplaceable: RefCell<BTreeMap<String, String>>,
    /// Indexes into `allocations` by (namespace, job kind, job name).
    pub by_job: BTreeMap<(String, String, String), Vec<usize>>,
    /// Each job's spec and status as parsed (by (kind, namespace, name)).
    pub parsed: BTreeMap<(String, String, String), Arc<ParsedJob>>,
}

/// A job's priority and queue (None: unqueued, or a queue it may not use).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobFacts {
    pub priority: i32,
    pub queue: Option<String>,
    /// Memory the whole gang asks for.
    pub demand_bytes: u64,
}

/// One running gang.
#[derive(Debug, Clone)]
pub struct Gang {
    pub job: Arc<Object>,
    pub facts: JobFacts,
    pub allocations: Vec<Alloc>,
    pub memory_bytes: u64,
}

impl ClusterView {
    pub fn build(state: &State) -> ClusterView {
        ClusterView::build_with(state, &SchedulerConfig::default(), &mut Memo::default())
    }

    /// The view, reusing what `memo` parsed in earlier passes.
    pub fn build_with(state: &State, cfg: &SchedulerConfig, memo: &mut Memo) -> ClusterView {
        let list = |k: Kind| state.list(k.as_str(), "");
        let mut view = ClusterView::from_objects_with(
            list(Kind::Node),
            list(Kind::Allocation),
            list(Kind::Link),
            list(Kind::Model),
            memo,
        );
        view.queues = Queues::new(&list(Kind::Queue));
        view.jobs = list(Kind::TrainingJob)
            .into_iter()
            .chain(list(Kind::InferenceService))
            .map(|j| {
                (
                    (
                        j.kind.clone(),
                        j.metadata.namespace.clone(),
                        j.metadata.name.clone(),
                    ),
                    j,
                )
            })
            .collect();
        view.parsed = view
            .jobs
            .iter()
            .map(|(k, j)| (k.clone(), memo.job(j, cfg)))
            .collect();
        view.facts = view
            .parsed
            .iter()
            .map(|(k, p)| (k.clone(), view.queues.facts_of(&k.1, &p.fields)))
            .collect();
        let mut gangs: BTreeMap<(String, String, String, u64), Vec<Alloc>> = BTreeMap::new();
        for a in &view.allocations {
            if a.holds_resources() && a.spec.desired == tb_api::specs::Desired::Run {
                let key = (
                    a.spec.job.kind.clone(),
                    a.object.metadata.namespace.clone(),
                    a.spec.job.name.clone(),
                    a.spec.epoch,
                );
                gangs.entry(key).or_default().push(a.clone());
            }
        }
        view.gangs = gangs
            .into_iter()
            .filter_map(|((kind, ns, name, _), allocations)| {
                let key = (kind, ns, name);
                let job = view.jobs.get(&key)?;
                let ours = allocations
                    .iter()
                    .all(|a| a.spec.job.uid == job.metadata.uid);
                ours.then(|| Gang {
                    job: job.clone(),
                    facts: view.facts.get(&key).cloned().unwrap_or(JobFacts {
                        priority: 0,
                        queue: None,
                        demand_bytes: 0,
                    }),
                    memory_bytes: allocations.iter().map(|a| a.spec.memory_bytes).sum(),
                    allocations,
                })
            })
            .collect();
        for a in view.allocations.iter().filter(|a| a.holds_resources()) {
            let key = (
                a.spec.job.kind.clone(),
                a.object.metadata.namespace.clone(),
                a.spec.job.name.clone(),
            );
            if let Some(q) = view.facts.get(&key).and_then(|f| f.queue.as_ref()) {
                view.queues
                    .charge(q, a.spec.memory_bytes, [a.spec.node.clone()]);
            }
        }
        view
    }

    /// The view from object lists (as a client fetched them), so `tbctl plan` sees what the
    /// scheduler sees.
    pub fn from_objects(
        node_objects: Vec<Arc<Object>>,
        allocation_objects: Vec<Arc<Object>>,
        link_objects: Vec<Arc<Object>>,
        model_objects: Vec<Arc<Object>>,
    ) -> ClusterView {
        ClusterView::from_objects_with(
            node_objects,
            allocation_objects,
            link_objects,
            model_objects,
            &mut Memo::default(),
        )
    }

    fn from_objects_with(
        node_objects: Vec<Arc<Object>>,
        allocation_objects: Vec<Arc<Object>>,
        link_objects: Vec<Arc<Object>>,
        model_objects: Vec<Arc<Object>>,
        memo: &mut Memo,
    ) -> ClusterView {
        let allocations: Vec<Alloc> = allocation_objects
            .into_iter()
            .filter_map(|o| {
                let parsed = memo.allocation(&o)?;
                let (spec, status) = (*parsed).clone();
                Some(Alloc {
                    object: o,
                    spec,
                    status,
                })
            })
            .collect();
        let mut by_job: BTreeMap<(String, String, String), Vec<usize>> = BTreeMap::new();
        for (i, a) in allocations.iter().enumerate() {
            by_job
                .entry((
                    a.object.metadata.namespace.clone(),
                    a.spec.job.kind.clone(),
                    a.spec.job.name.clone(),
                ))
                .or_default()
                .push(i);
        }
        let mut nodes = BTreeMap::new();
        for o in node_objects {
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
                n.used_ports.extend(a.ports());
            }
        }
        let models = model_objects
            .into_iter()
            .filter_map(|o| {
                let spec = parse_spec::<ModelSpec>(&o.spec).ok()?;
                Some((
                    (o.metadata.namespace.clone(), o.metadata.name.clone()),
                    spec,
                ))
            })
            .collect();
        ClusterView {
            nodes,
            allocations,
            links: parse_links(link_objects),
            models,
            queues: Queues::default(),
            jobs: BTreeMap::new(),
            facts: BTreeMap::new(),
            gangs: Vec::new(),
            unplaceable: RefCell::default(),
            by_job,
            parsed: BTreeMap::new(),
        }
    }

    /// The topology placement sees now: every Node with what is free on it, every Link with
    /// its measured (or nominal) figures.
    pub fn topology(&self) -> Topology {
        live::topology(
            self.nodes.values().map(|n| live::NodeFacts {
                name: &n.name,
                chip: &n.status.capacity.chip,
                allocatable_bytes: n.status.capacity.allocatable_bytes,
                free_bytes: n.free_bytes,
                memory_bandwidth_gbs: n.status.capacity.memory_bandwidth_gbps,
                engine: n.status.capacity.engine.as_ref(),
                gpu_cores: n.status.capacity.gpu_cores,
                labels: n.labels(),
                unavailable: n.unavailable(),
            }),
            self.links.values().map(|l| (&l.spec, &l.status)),
        )
    }

    /// A job's spec and status as parsed for this pass (parsed now if the view lacks it).
    pub fn parsed_job(&self, job: &Object, cfg: &SchedulerConfig) -> Arc<ParsedJob> {
        let key = (
            job.kind.clone(),
            job.metadata.namespace.clone(),
            job.metadata.name.clone(),
        );
        let same = self.jobs.get(&key).is_some_and(|j| {
            j.metadata.resource_version == job.metadata.resource_version
                && j.metadata.uid == job.metadata.uid
        });
        match self.parsed.get(&key) {
            Some(p) if same => p.clone(),
            _ => Arc::new(ParsedJob::parse(job, cfg)),
        }
    }

    /// A job's allocations (any epoch).
    pub fn allocations_of<'a>(
        &'a self,
        namespace: &'a str,
        kind: &'a str,
        name: &'a str,
    ) -> impl Iterator<Item = &'a Alloc> {
        let key = (namespace.to_string(), kind.to_string(), name.to_string());
        self.by_job
            .get(&key)
            .into_iter()
            .flatten()
            .filter_map(|i| self.allocations.get(*i))
    }
}
