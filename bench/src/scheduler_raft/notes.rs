//! The notes under the table, read at the end: what the store holds (so a run that stalls
//! says where), the leader's server-side latencies from `/metrics`, and warnings in the
//! members' logs.

use std::collections::BTreeMap;

use tb_api::specs::{AllocationPhase, AllocationSpec, AllocationStatus, Desired, parse_spec};
use tb_api::status::NodeStatus;
use tb_api::{Kind, Object};

use super::cluster::{TlsTb, retry};
use crate::cluster::Cluster;

/// What the store holds at the end: jobs by phase (with the reasons of those not done),
/// allocations by phase, Nodes Ready — so a run that stalls says where.
pub(super) async fn state_summary(
    tb: &TlsTb,
    leader: usize,
    members_of_macs: &[String],
) -> anyhow::Result<String> {
    use tb_api::proto::ListRequest;
    use tb_api::status::JobStatus;
    let list = |kind: Kind| {
        let client = tb.objects[leader].clone();
        retry("Objects/List", move || {
            let mut c = client.clone();
            let req = ListRequest {
                kind: kind.as_str().into(),
                namespace: String::new(),
                label_selector: String::new(),
                stale: false,
            };
            async move { c.list(req).await }
        })
    };
    let parse = |objects: Vec<String>| -> Vec<Object> {
        objects
            .iter()
            .filter_map(|o| Object::from_json(o).ok())
            .collect()
    };
    let jobs = parse(list(Kind::TrainingJob).await?.into_inner().objects_json);
    let allocations = parse(list(Kind::Allocation).await?.into_inner().objects_json);
    let nodes = parse(list(Kind::Node).await?.into_inner().objects_json);
    let mut phases: BTreeMap<String, usize> = BTreeMap::new();
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for j in &jobs {
        let st = JobStatus::from_value(&j.status);
        *phases.entry(format!("{:?}", st.phase)).or_default() += 1;
        if !st.phase.is_terminal() {
            let why = format!("{:?} {}: {}", st.phase, st.reason, st.message);
            *reasons.entry(why.chars().take(160).collect()).or_default() += 1;
        }
    }
    let mut alloc_phases: BTreeMap<String, usize> = BTreeMap::new();
    let mut pending_by_member: BTreeMap<String, usize> = BTreeMap::new();
    for a in &allocations {
        let st = AllocationStatus::from_value(&a.status);
        let spec = parse_spec::<AllocationSpec>(&a.spec).ok();
        let desired = spec.as_ref().map_or(Desired::Run, |s| s.desired);
        *alloc_phases
            .entry(format!("{:?}/{desired:?}", st.phase))
            .or_default() += 1;
        if st.phase == AllocationPhase::Pending
            && let Some(mac) = spec
                .as_ref()
                .and_then(|s| s.node.strip_prefix("mac")?.parse::<usize>().ok())
        {
            let member = members_of_macs.get(mac).cloned().unwrap_or_default();
            *pending_by_member.entry(member).or_default() += 1;
        }
    }
    let ready = nodes
        .iter()
        .filter(|n| NodeStatus::from_value(&n.status).is_ready())
        .count();
    let top: Vec<String> = {
        let mut r: Vec<(&String, &usize)> = reasons.iter().collect();
        r.sort_by(|a, b| b.1.cmp(a.1));
        r.iter().take(3).map(|(w, n)| format!("{n}× {w}")).collect()
    };
    Ok(format!(
        "state at the end: {} TrainingJobs left {phases:?} (ttlSecondsAfterFinished 0 deletes finished ones){}; {} Allocations {alloc_phases:?}, Pending ones by the controller their Mac watches: {pending_by_member:?}; {ready} of {} Nodes Ready",
        jobs.len(),
        if top.is_empty() {
            String::new()
        } else {
            format!(", not done: {}", top.join(" | "))
        },
        allocations.len(),
        nodes.len()
    ))
}

/// Server-side figures from the leader's `/metrics`, and warnings in the members' logs.
pub(super) async fn server_notes(cluster: &Cluster<TlsTb>, leader: usize) -> Vec<String> {
    use crate::tb::metrics;
    let mut notes = Vec::new();
    if let Some(addr) = cluster.metrics.get(leader) {
        match metrics::scrape(addr).await {
            Ok(text) => {
                let mut parts = Vec::new();
                for method in [
                    "Objects/Apply",
                    "Objects/UpdateStatus",
                    "Nodes/Heartbeat",
                    "Nodes/Join",
                    "Raft/Propose",
                ] {
                    if let Some(s) = metrics::method(&text, method)
                        && let Some(mean) = s.mean()
                    {
                        parts.push(format!(
                            "{method} {} calls, mean {:.2} ms",
                            s.count,
                            mean.as_secs_f64() * 1000.0
                        ));
                    }
                }
                if let Some(s) = metrics::apply(&text)
                    && let Some(mean) = s.mean()
                {
                    parts.push(format!(
                        "state-machine apply {} batches, mean {:.2} ms",
                        s.count,
                        mean.as_secs_f64() * 1000.0
                    ));
                }
                notes.push(format!("leader's /metrics: {}", parts.join("; ")));
            }
            Err(e) => notes.push(format!("leader's /metrics unreadable: {e:#}")),
        }
    }
    for m in &cluster.members {
        let text = std::fs::read_to_string(m.log_path()).unwrap_or_default();
        let installs = text.matches("snapshot installed").count();
        if installs > 0 {
            notes.push(format!(
                "{} installed {installs} snapshot(s) from the leader (it fell behind the kept log)",
                m.name
            ));
        }
        let warns: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        if !warns.is_empty() {
            notes.push(format!(
                "{}: {} WARN/ERROR log lines, last: {}",
                m.name,
                warns.len(),
                warns[warns.len() - 1].trim()
            ));
        }
    }
    notes
}
