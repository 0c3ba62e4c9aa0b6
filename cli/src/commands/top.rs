//! `tbctl top nodes`: how the memory of each Mac is used, from what its nodelet last reported:
//! `NAME READY MEMORY ALLOCATABLE ALLOCATED FREE CHIP ALLOCS`. MEMORY is the Mac's total,
//! ALLOCATABLE what tb may hand out, ALLOCATED what tb's allocations hold (and its share of
//! ALLOCATABLE), FREE what the OS reports free, ALLOCS how many allocations run there. Sizes are
//! binary (`64Gi`, `512Mi`); rows are sorted by name.
//!
//! `tbctl top queues`: `NAME PRIORITY WEIGHT MEMORY MACS BORROWED PENDING FAIR-SHARE`, usage
//! against quota, what is held beyond the quota, pending jobs, and the decayed usage per weight
//! the scheduler orders equal priorities by (see `usage`).

use anyhow::Result;
use serde_json::Value;
use tb_api::proto::ListRequest;
use tb_api::{Kind, Object};

use super::{Ctx, parse_object};
use crate::args::TopCommand;
use crate::columns::{NodeMemory, at, cell, human_bytes, node_ready, share};
use crate::output::{Table, emit};

pub async fn run(ctx: &mut Ctx, cmd: TopCommand) -> Result<()> {
    match cmd {
        TopCommand::Nodes => {
            let req = ListRequest {
                kind: Kind::Node.as_str().to_string(),
                namespace: String::new(),
                label_selector: String::new(),
                stale: false,
            };
            let resp = ctx.client().list(req).await?;
            let nodes = resp
                .objects_json
                .iter()
                .map(|j| parse_object(j))
                .collect::<Result<Vec<_>>>()?;
            if nodes.is_empty() {
                eprintln!("No resources found");
                return Ok(());
            }
            emit(&nodes_table(nodes).render())
        }
        TopCommand::Queues => {
            let snap = super::usage::Snapshot::fetch(ctx).await?;
            let t = super::usage::queues_table(&snap);
            if t.rows.is_empty() {
                eprintln!("No queues found");
                return Ok(());
            }
            emit(&t.render())
        }
    }
}

pub fn nodes_table(mut nodes: Vec<Object>) -> Table {
    nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut t = Table::new([
        "NAME",
        "READY",
        "MEMORY",
        "ALLOCATABLE",
        "ALLOCATED",
        "FREE",
        "CHIP",
        "ALLOCS",
    ]);
    let size = |b: Option<u64>| b.map_or_else(|| "<none>".to_string(), human_bytes);
    for n in &nodes {
        let mem = NodeMemory::of(n);
        let allocs = at(&n.status, &["allocations"])
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        t.push(vec![
            n.metadata.name.clone(),
            node_ready(n),
            size(mem.total),
            size(mem.allocatable),
            share(mem.allocated, mem.allocatable),
            size(mem.free),
            cell(at(&n.status, &["capacity", "chip"])),
            allocs.to_string(),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, status: Value) -> Object {
        serde_json::from_value(json!({"apiVersion": "tb/v1", "kind": "Node", "metadata": {"name": name}, "status": status}))
            .expect("node")
    }

    #[test]
    fn rows_are_sorted_and_sized_for_people() {
        let studio = node(
            "studio",
            json!({"capacity": {"memory": "512Gi", "memoryBytes": 549755813888u64, "allocatableBytes": 515396075520u64,
                                "chip": "Apple M3 Ultra"},
                   "freeBytes": 300647710720u64, "allocatedBytes": 206158430208u64,
                   "allocations": ["chat-e1-r0"],
                   "conditions": [{"type": "Ready", "status": "True"}]}),
        );
        let mini = node(
            "mini",
            json!({"capacity": {"memory": "64Gi", "memoryBytes": 68719476736u64, "allocatableBytes": 55834574848u64,
                                "chip": "Apple M4 Pro"},
                   "freeBytes": 62277025792u64, "allocatedBytes": 0,
                   "conditions": [{"type": "Ready", "status": "False"}]}),
        );
        let fresh = node("fresh", Value::Null);
        assert_eq!(
            nodes_table(vec![studio, mini, fresh]).render(),
            "NAME     READY     MEMORY   ALLOCATABLE   ALLOCATED     FREE     CHIP             ALLOCS\n\
             fresh    Unknown   <none>   <none>        <none>        <none>   <none>           0\n\
             mini     False     64Gi     52Gi          0 (0%)        58Gi     Apple M4 Pro     0\n\
             studio   True      512Gi    480Gi         192Gi (40%)   280Gi    Apple M3 Ultra   1\n"
        );
    }
}
