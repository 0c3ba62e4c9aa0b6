//! `tbctl plan -f job.yaml`: where a job's model would go — which Macs, in which order, which
//! layers each, the memory each needs, the predicted tokens/s — and why other candidates lost.
//! A dry run: nothing is stored.
//!
//! - Live (default): against the cluster as the controller sees it now (Nodes, Links with
//!   their measured figures, the memory running allocations hold).
//! - `--cluster FILE`: against a described lab (see `tb_api::lab`), for capacity planning
//!   ("what if we add a Mac?") without a cluster.
//!
//! Both call the placement function the scheduler calls. The Model comes from the `-f` files
//! when one of that name is there, else (live) from the cluster.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use tb_api::lab::LabFile;
use tb_api::proto::ListRequest;
use tb_api::specs::{ModelSpec, parse_spec};
use tb_api::{Kind, Object};
use tb_core::placement::{self, Options, Plan, Topology, live};
use tb_core::scheduler::view::ClusterView;

use super::{Ctx, parse_object};
use crate::args::{PlanArgs, PlanOutput};
use crate::columns::human_bytes;
use crate::manifests;
use crate::output::{Table, emit};

/// The jobs and models named by `-f`, namespaces defaulted to `namespace`.
struct Inputs {
    jobs: Vec<Object>,
    models: BTreeMap<(String, String), ModelSpec>,
}

fn read_inputs(files: &[String], namespace: &str) -> Result<Inputs> {
    let loaded = manifests::load(files).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut jobs = Vec::new();
    let mut models = BTreeMap::new();
    for input in loaded {
        let origin = manifests::origin(&input.loaded);
        let mut o = input.loaded.object;
        if !input.namespace_given {
            o.metadata.namespace = namespace.to_string();
        }
        match o.kind() {
            Some(Kind::Model) => {
                let spec: ModelSpec = parse_spec(&o.spec).with_context(|| origin.clone())?;
                models.insert(
                    (o.metadata.namespace.clone(), o.metadata.name.clone()),
                    spec,
                );
            }
            Some(Kind::InferenceService | Kind::TrainingJob) => jobs.push(o),
            _ => {}
        }
    }
    if jobs.is_empty() {
        bail!(
            "no InferenceService or TrainingJob in {}: nothing to plan",
            files.join(", ")
        );
    }
    Ok(Inputs { jobs, models })
}

/// Offline: `--cluster FILE`; needs no server.
pub fn run_offline(args: &PlanArgs, namespace: &str) -> Result<()> {
    let Some(cluster) = &args.cluster else {
        bail!("--cluster is required offline");
    };
    let lab = LabFile::load_for_planning(Path::new(cluster)).map_err(|e| anyhow::anyhow!("{e}"))?;
    let topology = Topology::from_lab(&lab);
    let inputs = read_inputs(&args.files, namespace)?;
    report(&topology, &inputs.jobs, &inputs.models, args)
}

/// Live: against the cluster's Nodes, Links and Allocations.
pub async fn run(ctx: &mut Ctx, args: &PlanArgs) -> Result<()> {
    let inputs = read_inputs(&args.files, &ctx.target.namespace)?;
    let mut fetched = Vec::new();
    for kind in [Kind::Node, Kind::Allocation, Kind::Link, Kind::Model] {
        let resp = ctx
            .client()
            .list(ListRequest {
                kind: kind.as_str().to_string(),
                namespace: String::new(),
                label_selector: String::new(),
                stale: false,
            })
            .await?;
        let objects = resp
            .objects_json
            .iter()
            .map(|j| parse_object(j).map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        fetched.push(objects);
    }
    let [nodes, allocations, links, models] = <[Vec<Arc<Object>>; 4]>::try_from(fetched)
        .map_err(|_| anyhow::anyhow!("internal: four lists expected"))?;
    let view = ClusterView::from_objects(nodes, allocations, links, models);
    let mut models = view.models.clone();
    // A Model in the files wins: plan what is about to be applied.
    models.extend(inputs.models);
    report(&view.topology(), &inputs.jobs, &models, args)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JobPlan<'a> {
    kind: &'a str,
    namespace: &'a str,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    plan: Option<&'a Plan>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

fn report(
    topology: &Topology,
    jobs: &[Object],
    models: &BTreeMap<(String, String), ModelSpec>,
    args: &PlanArgs,
) -> Result<()> {
    let mut results = Vec::new();
    for job in jobs {
        let outcome = match live::workload_for(job, models) {
            Ok(Some(w)) => {
                placement::plan(topology, &w, &Options::default()).map_err(|u| u.message)
            }
            Ok(None) => Err(format!(
                "{} {} is sized by ranks × memory, not by a Model: nothing to split \
                 (name a model and leave out memory to plan it)",
                job.kind, job.metadata.name
            )),
            Err(e) => Err(e.to_string()),
        };
        results.push((job, outcome));
    }
    let failed = results.iter().any(|(_, r)| r.is_err());
    match args.output {
        PlanOutput::Json | PlanOutput::Yaml => {
            let out: Vec<JobPlan<'_>> = results
                .iter()
                .map(|(job, r)| JobPlan {
                    kind: &job.kind,
                    namespace: &job.metadata.namespace,
                    name: &job.metadata.name,
                    plan: r.as_ref().ok(),
                    error: r.as_ref().err().cloned(),
                })
                .collect();
            let text = if args.output == PlanOutput::Json {
                serde_json::to_string_pretty(&out)? + "\n"
            } else {
                serde_yaml::to_string(&out)?
            };
            emit(&text)?;
        }
        PlanOutput::Table => {
            let mut text = String::new();
            for (i, (job, r)) in results.iter().enumerate() {
                if i > 0 {
                    text.push('\n');
                }
                text.push_str(&render(topology, job, r));
            }
            emit(&text)?;
        }
    }
    if failed {
        bail!("no placement for some jobs (see above)");
    }
    Ok(())
}

/// The plan for people.
fn render(topology: &Topology, job: &Object, result: &Result<Plan, String>) -> String {
    let title = format!("{}/{}", job.kind, job.metadata.name);
    let plan = match result {
        Ok(p) => p,
        Err(e) => return format!("{title}: cannot be placed: {e}\n"),
    };
    let mut out = format!(
        "{title}: {} over {} Mac(s), {} objective{}\n",
        live::strategy_name(plan.strategy),
        plan.stages.len(),
        match plan.objective {
            placement::Objective::Latency => "latency",
            placement::Objective::Throughput => "throughput",
        },
        if plan.ring { ", ring" } else { "" }
    );
    let mut t = Table::new([
        "RANK", "MAC", "LAYERS", "WEIGHTS", "KV CACHE", "MEMORY", "FREE", "GB/S",
    ]);
    for (rank, s) in plan.stages.iter().enumerate() {
        let mac = topology.mac(&s.node);
        t.push(vec![
            rank.to_string(),
            s.node.clone(),
            if s.layers == 0 {
                "-".into()
            } else {
                format!("{}-{}", s.first_layer, s.first_layer + s.layers - 1)
            },
            human_bytes(s.weight_bytes),
            human_bytes(s.kv_bytes),
            human_bytes(s.memory_bytes),
            mac.map_or_else(|| "?".into(), |m| human_bytes(m.free_bytes)),
            mac.map_or_else(
                || "?".into(),
                |m| match m.engine_measured {
                    // The engine's own figure: small, so with more digits, and marked.
                    true => format!("{:.2}*", m.memory_bandwidth_gbs),
                    false => format!("{:.0}", m.memory_bandwidth_gbs),
                },
            ),
        ]);
    }
    out.push_str(&t.render());
    out.push_str(&format!(
        "predicted: {:.1} tokens/s ({:.2} ms per token: {:.2} ms compute, {:.2} ms links)\n",
        plan.tokens_per_second,
        plan.time_per_token_us / 1000.0,
        plan.compute_us / 1000.0,
        plan.network_us / 1000.0
    ));
    if plan.stages.iter().any(|s| s.engine_measured) {
        out.push_str(
            "  * GB/s of weights tb's engine decodes on that Mac, as its nodelet measured (else the \
             chip's memory bandwidth)\n",
        );
    }
    for w in plan.stages.windows(2) {
        if let Some(l) = topology.link(&w[0].node, &w[1].node) {
            out.push_str(&format!(
                "  {} → {}: {:.1} Gb/s, {:.0} µs{}{}\n",
                w[0].node,
                w[1].node,
                l.bandwidth_gbps,
                l.latency_us,
                if l.rdma { ", RDMA" } else { "" },
                if l.measured { "" } else { " (not measured)" }
            ));
        }
    }
    if !plan.alternatives.is_empty() {
        out.push_str("other candidates:\n");
        for a in &plan.alternatives {
            out.push_str(&format!("  {}: {}\n", a.description, a.reason));
        }
    }
    out
}
