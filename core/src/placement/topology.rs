//! The cluster as placement sees it: an undirected petgraph graph whose vertices are Macs (free
//! unified memory, memory bandwidth) and whose edges are Thunderbolt links (bandwidth, latency,
//! RDMA). Several cables between the same two Macs are one edge with their capacities merged.
//! Built from a described lab file here; the controller builds it from Node/Link objects.

use std::collections::BTreeMap;

use petgraph::graph::{NodeIndex, UnGraph};
use serde::Serialize;
use tb_api::lab::LabFile;

/// Memory bandwidth assumed for a Mac whose chip is unknown and whose file gives none (GB/s).
const DEFAULT_MEMORY_BANDWIDTH_GBS: f64 = 100.0;
/// Link speed assumed when neither the link nor its ports say (Gb/s): Thunderbolt 3/4.
const DEFAULT_LINK_GBPS: f64 = 40.0;
/// Round trip assumed when a link's latency was not measured (µs): RDMA over Thunderbolt is
/// tens of microseconds, TCP over Thunderbolt a few hundred.
const DEFAULT_RDMA_LATENCY_US: f64 = 50.0;
const DEFAULT_TCP_LATENCY_US: f64 = 300.0;

/// A Mac: what placement needs to know about it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Mac {
    pub name: String,
    pub chip: String,
    /// What tb may use on it at most.
    pub allocatable_bytes: u64,
    /// What is free for new work now: the limit placement checks.
    pub free_bytes: u64,
    /// GB/s (10^9 bytes/s) of weights read while decoding: the engine's own measurement
    /// when the nodelet made one, else the chip's nominal memory bandwidth.
    pub memory_bandwidth_gbs: f64,
    /// Time per token beyond reading weights, µs (measured by the engine; 0 when not).
    pub token_overhead_us: f64,
    /// Whether the figures above were measured on this Mac's engine (else: the chip's).
    pub engine_measured: bool,
    pub gpu_cores: u32,
    pub labels: BTreeMap<String, String>,
    /// Some(reason) when nothing new may go here: "not Ready", "cordoned".
    pub unavailable: Option<String>,
}

/// A link between two Macs (all the cables between them).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkInfo {
    /// Gb/s (10^9 bits/s); the sum over cables.
    pub bandwidth_gbps: f64,
    /// Round trip of a small message, µs; the fastest cable's.
    pub latency_us: f64,
    /// Every cable runs RDMA.
    pub rdma: bool,
    pub cables: u32,
    /// Bandwidth and latency were measured (not assumed) on every cable.
    pub measured: bool,
    /// Node name -> the RDMA devices on that node's end(s) of this link.
    pub rdma_devices: BTreeMap<String, Vec<String>>,
}

impl LinkInfo {
    /// Folds another cable between the same two Macs into this link.
    fn merge(&mut self, other: LinkInfo) {
        self.bandwidth_gbps += other.bandwidth_gbps;
        self.latency_us = self.latency_us.min(other.latency_us);
        self.rdma &= other.rdma;
        self.cables += other.cables;
        self.measured &= other.measured;
        for (node, devices) in other.rdma_devices {
            let mine = self.rdma_devices.entry(node).or_default();
            for d in devices {
                if !mine.contains(&d) {
                    mine.push(d);
                }
            }
        }
    }
}

/// Macs and links. Vertices are added in name order, so vertex `i` is the `i`-th Mac by name.
#[derive(Debug, Clone)]
pub struct Topology {
    pub graph: UnGraph<Mac, LinkInfo>,
    index: BTreeMap<String, NodeIndex>,
}

impl Topology {
    /// Builds the graph. Several entries for the same pair are several cables and are merged;
    /// links naming an unknown Mac, or a Mac to itself, are ignored with a warning, and so is a
    /// second Mac of the same name.
    pub fn new(mut macs: Vec<Mac>, links: Vec<(String, String, LinkInfo)>) -> Topology {
        macs.sort_by(|a, b| a.name.cmp(&b.name));
        let mut graph: UnGraph<Mac, LinkInfo> = UnGraph::with_capacity(macs.len(), links.len());
        let mut index = BTreeMap::new();
        for mac in macs {
            if index.contains_key(&mac.name) {
                tracing::warn!(mac = %mac.name, "placement: Mac listed twice; the second is ignored");
                continue;
            }
            let name = mac.name.clone();
            index.insert(name, graph.add_node(mac));
        }
        for (a, b, link) in links {
            let (Some(&ia), Some(&ib)) = (index.get(&a), index.get(&b)) else {
                tracing::warn!(%a, %b, "placement: link names an unknown Mac; ignored");
                continue;
            };
            if ia == ib {
                tracing::warn!(mac = %a, "placement: link from a Mac to itself; ignored");
                continue;
            }
            match graph.find_edge(ia, ib) {
                Some(e) => {
                    if let Some(existing) = graph.edge_weight_mut(e) {
                        existing.merge(link);
                    }
                }
                None => {
                    graph.add_edge(ia, ib, link);
                }
            }
        }
        Topology { graph, index }
    }

    /// A described lab: Macs with their memory and chip, links with their measured or nominal
    /// figures (see the module doc of `tb_api::lab`).
    pub fn from_lab(lab: &LabFile) -> Topology {
        let macs = lab
            .macs
            .iter()
            .map(|m| Mac {
                name: m.name.clone(),
                chip: m.chip.clone().unwrap_or_default(),
                allocatable_bytes: m.allocatable_bytes(),
                free_bytes: m.free_bytes(),
                memory_bandwidth_gbs: m
                    .memory_bandwidth_gbs()
                    .unwrap_or(DEFAULT_MEMORY_BANDWIDTH_GBS),
                token_overhead_us: 0.0,
                engine_measured: false,
                gpu_cores: m.gpu_cores.unwrap_or(0),
                labels: m.labels.clone(),
                unavailable: m.unschedulable.then(|| "cordoned".to_string()),
            })
            .collect();
        let mut links = Vec::new();
        for link in &lab.links {
            let Some((a, b)) = link.ends() else {
                tracing::warn!(between = ?link.between, "placement: link without two ends; ignored");
                continue;
            };
            let port = |end: &tb_api::lab::LabEnd<'_>| {
                let name = end.port?;
                lab.mac(end.mac)?.ports.iter().find(|p| p.name == name)
            };
            let (pa, pb) = (port(&a), port(&b));
            // A cable runs at the slower of its two ports.
            let port_speed = match (pa.and_then(|p| p.speed_gbps), pb.and_then(|p| p.speed_gbps)) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            };
            let mut rdma_devices: BTreeMap<String, Vec<String>> = BTreeMap::new();
            if link.rdma {
                for (end, p) in [(&a, pa), (&b, pb)] {
                    if let Some(dev) = p.and_then(|p| p.rdma_device.clone()) {
                        rdma_devices
                            .entry(end.mac.to_string())
                            .or_default()
                            .push(dev);
                    }
                }
            }
            let default_latency = if link.rdma {
                DEFAULT_RDMA_LATENCY_US
            } else {
                DEFAULT_TCP_LATENCY_US
            };
            links.push((
                a.mac.to_string(),
                b.mac.to_string(),
                LinkInfo {
                    bandwidth_gbps: link
                        .bandwidth_gbps
                        .or(port_speed)
                        .unwrap_or(DEFAULT_LINK_GBPS),
                    latency_us: link.latency_us.unwrap_or(default_latency),
                    rdma: link.rdma,
                    cables: 1,
                    measured: link.bandwidth_gbps.is_some() && link.latency_us.is_some(),
                    rdma_devices,
                },
            ));
        }
        Topology::new(macs, links)
    }

    pub fn mac(&self, name: &str) -> Option<&Mac> {
        self.index
            .get(name)
            .and_then(|&i| self.graph.node_weight(i))
    }

    /// The link between two Macs, either way round.
    pub fn link(&self, a: &str, b: &str) -> Option<&LinkInfo> {
        let (&ia, &ib) = (self.index.get(a)?, self.index.get(b)?);
        self.graph
            .find_edge(ia, ib)
            .and_then(|e| self.graph.edge_weight(e))
    }

    /// Every Mac, sorted by name.
    pub fn macs(&self) -> Vec<&Mac> {
        self.graph.node_weights().collect()
    }

    pub fn len(&self) -> usize {
        self.graph.node_count()
    }

    pub fn is_empty(&self) -> bool {
        self.graph.node_count() == 0
    }

    /// The vertex of a Mac (its rank among the Macs by name).
    pub(crate) fn index_of(&self, name: &str) -> Option<NodeIndex> {
        self.index.get(name).copied()
    }

    /// The link between two vertices.
    pub(crate) fn link_at(&self, a: NodeIndex, b: NodeIndex) -> Option<&LinkInfo> {
        self.graph
            .find_edge(a, b)
            .and_then(|e| self.graph.edge_weight(e))
    }

    /// Shortest one-way latency (half the round trips, summed) from `a` to `b` through Macs that
    /// are not unavailable (a Mac that is down forwards nothing); `None` when unreachable.
    pub(crate) fn one_way_latency_us(&self, a: NodeIndex, b: NodeIndex) -> Option<f64> {
        if a == b {
            return Some(0.0);
        }
        let n = self.graph.node_count();
        let mut dist = vec![f64::INFINITY; n];
        let mut done = vec![false; n];
        dist[a.index()] = 0.0;
        // Dijkstra without a heap: clusters have tens of Macs.
        loop {
            let mut best: Option<usize> = None;
            for v in 0..n {
                if !done[v] && dist[v].is_finite() && best.is_none_or(|u| dist[v] < dist[u]) {
                    best = Some(v);
                }
            }
            let u = best?;
            if u == b.index() {
                return Some(dist[u]);
            }
            done[u] = true;
            let ui = NodeIndex::new(u);
            // Only the ends may be unavailable: an intermediate Mac must forward.
            if u != a.index()
                && self
                    .graph
                    .node_weight(ui)
                    .is_some_and(|m| m.unavailable.is_some())
            {
                continue;
            }
            for e in self.graph.edges(ui) {
                use petgraph::visit::EdgeRef;
                let v = if e.source() == ui {
                    e.target()
                } else {
                    e.source()
                };
                let d = dist[u] + e.weight().latency_us / 2.0;
                if d < dist[v.index()] {
                    dist[v.index()] = d;
                }
            }
        }
    }
}
