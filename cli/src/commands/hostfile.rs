//! `tbctl hostfile JOB`: the job's current placement as a hostfile MLX understands, so the same
//! Macs can be driven by hand with `mlx.launch --hostfile` (or a rank's MLX_HOSTFILE checked).
//!
//! Output contracts (stdout, or the file named by `-o`):
//! - `--format mlx` (default), mlx.launch's JSON, hosts in rank order, pretty-printed:
//!   `{"backend": "ring"|"jaccl"|"jaccl-ring", "envs": [], "hosts": [{"ssh": HOST, "ips": [IP],
//!   "rdma": [...]}, ...]}`. `ssh` is the host of the Node's nodelet address, `ips` the address
//!   the rank listens on (`spec.mlx.hosts[rank]` without its port), `rdma` the rank's row of the
//!   JACCL device matrix (`null` on the diagonal), `[]` for ring. mlx.launch requires
//!   `backend` and `envs` in this form and reads a missing `rdma` as `[]`.
//! - `--format ring`, MLX's ring hostfile: `[["ip:port"], ...]` on one line, in rank (= ring)
//!   order, with the ports tb assigned.

use std::path::Path;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use serde_json::Value;
use tb_api::proto::GetRequest;
use tb_api::specs::{Backend, MlxAssignment};
use tb_api::status::{JobStatus, NodeStatus};
use tb_api::{Kind, Object};
use tonic::Code;

use super::{Ctx, JobRef, parse_job_ref};
use crate::args::{HostfileArgs, HostfileFormat};
use crate::output::emit;

/// One rank of the placement: where it runs and its MLX assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankHost {
    pub rank: u32,
    /// What mlx.launch would ssh to: the host of the Node's nodelet address.
    pub ssh: String,
    pub mlx: MlxAssignment,
}

#[derive(Serialize)]
struct Hostfile {
    backend: String,
    envs: Vec<String>,
    hosts: Vec<HostEntry>,
}

#[derive(Serialize)]
struct HostEntry {
    ssh: String,
    ips: Vec<String>,
    rdma: Vec<Option<String>>,
}

/// `ring`, `jaccl` or `jaccl-ring`, as MLX spells them.
fn backend_name(b: Backend) -> String {
    match serde_json::to_value(b) {
        Ok(Value::String(s)) => s,
        _ => format!("{b:?}").to_ascii_lowercase(),
    }
}

/// `10.0.0.1` of `10.0.0.1:32323`, `::1` of `[::1]:32323`; a bare host as is.
fn host_part(addr: &str) -> String {
    let host = match addr.rsplit_once(':') {
        Some((h, port))
            if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) && !h.is_empty() =>
        {
            h
        }
        _ => addr,
    };
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_string()
}

/// The ranks, checked to be 0..n, each with the address it listens on.
fn listen_addresses(ranks: &[RankHost]) -> Result<Vec<&str>> {
    ranks
        .iter()
        .enumerate()
        .map(|(i, r)| {
            if r.rank as usize != i {
                bail!(
                    "the placement has no rank {i} (ranks must run 0..{})",
                    ranks.len()
                );
            }
            match r.mlx.hosts.get(i) {
                Some(h) if !h.is_empty() => Ok(h.as_str()),
                _ => bail!("rank {i}'s MLX assignment lists no address for rank {i}"),
            }
        })
        .collect()
}

/// mlx.launch's JSON hostfile, pretty-printed, ending in a newline.
pub fn mlx_hostfile(ranks: &[RankHost]) -> Result<String> {
    let Some(first) = ranks.first() else {
        bail!("the placement is empty");
    };
    if let Some(other) = ranks.iter().find(|r| r.mlx.backend != first.mlx.backend) {
        bail!(
            "ranks disagree on the MLX backend: rank 0 uses {}, rank {} uses {}",
            backend_name(first.mlx.backend),
            other.rank,
            backend_name(other.mlx.backend)
        );
    }
    let addrs = listen_addresses(ranks)?;
    let hosts = ranks
        .iter()
        .zip(addrs)
        .map(|(r, addr)| {
            let rdma = match r.mlx.backend {
                Backend::Ring => Vec::new(),
                Backend::Jaccl | Backend::JacclRing => r
                    .mlx
                    .ibv_devices
                    .as_ref()
                    .and_then(|m| m.get(r.rank as usize))
                    .cloned()
                    .unwrap_or_default(),
            };
            HostEntry {
                ssh: r.ssh.clone(),
                ips: vec![host_part(addr)],
                rdma,
            }
        })
        .collect();
    let doc = Hostfile {
        backend: backend_name(first.mlx.backend),
        envs: Vec::new(),
        hosts,
    };
    let mut text = serde_json::to_string_pretty(&doc).context("encoding the hostfile")?;
    text.push('\n');
    Ok(text)
}

/// MLX's ring hostfile: `[["ip:port"], ...]` on one line.
pub fn ring_hostfile(ranks: &[RankHost]) -> Result<String> {
    if ranks.is_empty() {
        bail!("the placement is empty");
    }
    let rows: Vec<Vec<&str>> = listen_addresses(ranks)?
        .into_iter()
        .map(|a| vec![a])
        .collect();
    let mut text = serde_json::to_string(&rows).context("encoding the hostfile")?;
    text.push('\n');
    Ok(text)
}

async fn get(
    ctx: &mut Ctx,
    kind: Kind,
    namespace: &str,
    name: &str,
) -> Result<Object, crate::client::RpcError> {
    let req = GetRequest {
        kind: kind.as_str().to_string(),
        namespace: namespace.to_string(),
        name: name.to_string(),
        stale: false,
    };
    let resp = ctx.client().get(req).await?;
    Object::from_json(&resp.object_json).map_err(|e| crate::client::RpcError {
        code: Code::Internal,
        message: format!("the server sent an object tbctl cannot read: {e}"),
    })
}

/// Read the job's placement, its allocations and their Nodes.
async fn gather(ctx: &mut Ctx, job: &JobRef) -> Result<Vec<RankHost>> {
    let namespace = ctx.namespace_for(job.kind);
    let object = get(ctx, job.kind, &namespace, &job.name).await?;
    let status = JobStatus::from_value(&object.status);
    if status.placement.is_empty() {
        let why = if status.reason.is_empty() {
            status.phase.as_str().to_string()
        } else {
            format!("{}: {}", status.phase.as_str(), status.reason)
        };
        bail!(
            "{} has not been placed yet ({why}): no hostfile",
            job.display()
        );
    }
    let mut placement = status.placement.clone();
    placement.sort_by_key(|p| p.rank);
    let mut ranks = Vec::with_capacity(placement.len());
    for p in placement {
        let alloc = get(ctx, Kind::Allocation, &namespace, &p.allocation)
            .await
            .with_context(|| format!("rank {}: allocation {}", p.rank, p.allocation))?;
        let mlx = match alloc.spec.get("mlx").filter(|m| !m.is_null()) {
            Some(m) => serde_json::from_value::<MlxAssignment>(m.clone())
                .with_context(|| format!("allocation {}: spec.mlx", p.allocation))?,
            None => bail!(
                "allocation {} (rank {}) has no MLX assignment: {} does not use MLX's distributed backends",
                p.allocation,
                p.rank,
                job.display()
            ),
        };
        let ssh = match get(ctx, Kind::Node, "", &p.node).await {
            Ok(node) => ssh_host(&node),
            Err(e) if e.code == Code::NotFound => p.node.clone(),
            Err(e) => return Err(e).with_context(|| format!("node {}", p.node)),
        };
        ranks.push(RankHost {
            rank: p.rank,
            ssh,
            mlx,
        });
    }
    Ok(ranks)
}

/// Where to ssh to reach a Node: its nodelet's host, else the address in its spec, else its name.
fn ssh_host(node: &Object) -> String {
    let status = NodeStatus::from_value(&node.status);
    if !status.address.is_empty() {
        return host_part(&status.address);
    }
    match node.spec.get("address").and_then(Value::as_str) {
        Some(a) if !a.is_empty() => host_part(a),
        _ => node.metadata.name.clone(),
    }
}

pub async fn run(ctx: &mut Ctx, args: &HostfileArgs) -> Result<()> {
    let job = parse_job_ref(&args.job)?;
    let ranks = gather(ctx, &job).await?;
    let text = match args.format {
        HostfileFormat::Mlx => mlx_hostfile(&ranks),
        HostfileFormat::Ring => ring_hostfile(&ranks),
    }
    .with_context(|| job.display())?;
    match &args.output {
        None => emit(&text),
        Some(path) => {
            write_file(path, &text)?;
            eprintln!(
                "wrote the hostfile of {} ({} ranks) to {}",
                job.display(),
                ranks.len(),
                path.display()
            );
            Ok(())
        }
    }
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(n: u32) -> Vec<RankHost> {
        let hosts: Vec<String> = (0..n)
            .map(|i| format!("10.0.0.{}:{}", i + 1, 32323 + i))
            .collect();
        (0..n)
            .map(|rank| RankHost {
                rank,
                ssh: format!("mac{}.local", rank + 1),
                mlx: MlxAssignment {
                    backend: Backend::Ring,
                    hosts: hosts.clone(),
                    coordinator: None,
                    ibv_devices: None,
                },
            })
            .collect()
    }

    #[test]
    fn three_rank_ring_for_mlx_launch() {
        assert_eq!(
            mlx_hostfile(&ring(3)).expect("hostfile"),
            r#"{
  "backend": "ring",
  "envs": [],
  "hosts": [
    {
      "ssh": "mac1.local",
      "ips": [
        "10.0.0.1"
      ],
      "rdma": []
    },
    {
      "ssh": "mac2.local",
      "ips": [
        "10.0.0.2"
      ],
      "rdma": []
    },
    {
      "ssh": "mac3.local",
      "ips": [
        "10.0.0.3"
      ],
      "rdma": []
    }
  ]
}
"#
        );
    }

    #[test]
    fn three_rank_ring_hostfile() {
        assert_eq!(
            ring_hostfile(&ring(3)).expect("hostfile"),
            "[[\"10.0.0.1:32323\"],[\"10.0.0.2:32324\"],[\"10.0.0.3:32325\"]]\n"
        );
    }

    #[test]
    fn jaccl_rows_come_from_the_device_matrix() {
        let matrix = vec![
            vec![None, Some("rdma_en3".to_string())],
            vec![Some("rdma_en3".to_string()), None],
        ];
        let ranks: Vec<RankHost> = ring(2)
            .into_iter()
            .map(|mut r| {
                r.mlx.backend = Backend::JacclRing;
                r.mlx.ibv_devices = Some(matrix.clone());
                r
            })
            .collect();
        let v: Value =
            serde_json::from_str(&mlx_hostfile(&ranks).expect("hostfile")).expect("json");
        assert_eq!(v["backend"], "jaccl-ring");
        assert_eq!(v["hosts"][0]["rdma"], serde_json::json!([null, "rdma_en3"]));
        assert_eq!(v["hosts"][1]["rdma"], serde_json::json!(["rdma_en3", null]));
    }

    #[test]
    fn gaps_and_disagreements_are_errors() {
        let mut gap = ring(3);
        gap.remove(1);
        assert!(
            mlx_hostfile(&gap)
                .expect_err("gap")
                .to_string()
                .contains("no rank 1")
        );
        let mut mixed = ring(2);
        mixed[1].mlx.backend = Backend::Jaccl;
        assert!(
            mlx_hostfile(&mixed)
                .expect_err("mixed")
                .to_string()
                .contains("disagree")
        );
        let mut short = ring(2);
        short[1].mlx.hosts.truncate(1);
        assert!(ring_hostfile(&short).is_err());
        assert!(ring_hostfile(&[]).is_err());
    }

    #[test]
    fn hosts_lose_their_ports_and_brackets() {
        assert_eq!(host_part("10.0.0.1:32323"), "10.0.0.1");
        assert_eq!(host_part("[::1]:7601"), "::1");
        assert_eq!(host_part("mac1.local"), "mac1.local");
        let node: Object = serde_json::from_value(serde_json::json!({
            "apiVersion": "tb/v1", "kind": "Node", "metadata": {"name": "mac1"},
            "status": {"address": "192.168.1.20:7601"}
        }))
        .expect("node");
        assert_eq!(ssh_host(&node), "192.168.1.20");
        let bare: Object = serde_json::from_value(serde_json::json!({
            "apiVersion": "tb/v1", "kind": "Node", "metadata": {"name": "mac2"}
        }))
        .expect("node");
        assert_eq!(ssh_host(&bare), "mac2");
    }
}
