//! The context of one search: the Macs eligible for the workload (in name order; a Mac is
//! referred to by its position among them), the bounds on the Mac count, and the refusals for
//! requests no search can meet.

use petgraph::graph::NodeIndex;

use crate::placement::cost::{Assignment, ineligibility};
use crate::placement::topology::{Mac, Topology};
use crate::placement::{Strategy, Unplaceable, Workload};

pub(super) struct Ctx<'a> {
    pub(super) topo: &'a Topology,
    pub(super) work: &'a Workload,
    /// Eligible Macs, by name.
    pub(super) macs: Vec<NodeIndex>,
    /// "mac4 cordoned", "mac5 lacks label rack=a".
    excluded: Vec<String>,
    /// Bounds on the Mac count: lo ≥ 1, hi ≤ eligible.
    pub(super) lo: usize,
    pub(super) hi: usize,
}

impl<'a> Ctx<'a> {
    pub(super) fn new(topo: &'a Topology, work: &'a Workload) -> Result<Ctx<'a>, Unplaceable> {
        let mut macs = Vec::new();
        let mut excluded = Vec::new();
        for i in topo.graph.node_indices() {
            let mac = &topo.graph[i];
            match ineligibility(mac, work) {
                Some(why) => excluded.push(format!("{} {why}", mac.name)),
                None => macs.push(i),
            }
        }
        let lo = (work.min_nodes as usize).max(1);
        let hi = work
            .max_nodes
            .map_or(usize::MAX, |m| m as usize)
            .min(macs.len());
        let ctx = Ctx {
            topo,
            work,
            macs,
            excluded,
            lo,
            hi,
        };
        let name = &work.model.name;
        if topo.is_empty() {
            return Err(ctx.refuse(format!("model {name}: the cluster has no Macs"), None));
        }
        if ctx.macs.is_empty() {
            return Err(ctx.refuse(format!("model {name}: no Mac is eligible"), None));
        }
        if work.max_nodes == Some(0) {
            return Err(ctx.refuse(format!("model {name}: nodes.max is 0"), None));
        }
        if lo > ctx.hi {
            let e = ctx.macs.len();
            return Err(ctx.refuse(
                format!(
                    "model {name} asks for at least {lo} Macs; {}",
                    if ctx.hi < e {
                        format!("at most {} allowed", ctx.hi)
                    } else {
                        format!("{e} {} eligible", if e == 1 { "is" } else { "are" })
                    }
                ),
                None,
            ));
        }
        Ok(ctx)
    }

    pub(super) fn mac(&self, pos: usize) -> &'a Mac {
        &self.topo.graph[self.macs[pos]]
    }

    pub(super) fn name(&self, pos: usize) -> &'a str {
        &self.mac(pos).name
    }

    /// An Unplaceable with the ineligible Macs appended.
    pub(super) fn refuse(&self, message: String, short_bytes: Option<u64>) -> Unplaceable {
        let message = if self.excluded.is_empty() {
            message
        } else {
            format!("{message}; not eligible: {}", self.excluded.join(", "))
        };
        Unplaceable {
            message,
            short_bytes,
        }
    }

    pub(super) fn assignment(&self, strategy: Strategy, order: &[(usize, u32)]) -> Assignment {
        Assignment {
            strategy,
            order: order
                .iter()
                .map(|&(p, l)| (self.name(p).to_string(), l))
                .collect(),
        }
    }
}

/// Positions by memory bandwidth (fastest first), then free memory, then name.
pub(super) fn fastest_first(ctx: &Ctx<'_>, pos: &[usize]) -> Vec<usize> {
    let mut v = pos.to_vec();
    v.sort_by(|&a, &b| {
        let (x, y) = (ctx.mac(a), ctx.mac(b));
        y.memory_bandwidth_gbs
            .total_cmp(&x.memory_bandwidth_gbs)
            .then(y.free_bytes.cmp(&x.free_bytes))
            .then(a.cmp(&b))
    });
    v
}
