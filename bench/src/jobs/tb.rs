//! tb for `jobs-bench`: one `tb-controller` with its defaults (it makes the cluster CA in its
//! data dir and writes the admin token there; every call goes over TLS with that token) and N
//! `tb-nodelet`s on loopback trusting that CA, joined with a token from a 0600 file, and one
//! run of a job: `Objects.Apply` a TrainingJob, watch its Allocations (from the
//! apply's resourceVersion, label `tb/job=<name>`) until every rank reports `Running`, delete
//! the job, and watch on until its Allocations are gone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{JobShape, RunTimes};
use crate::member::Member;
use crate::procstat::Watched;
use crate::secure::{AdminChannel, AdminToken};
use anyhow::Context;
use tb_api::proto::cluster_client::ClusterClient;
use tb_api::proto::nodes_client::NodesClient;
use tb_api::proto::objects_client::ObjectsClient;
use tb_api::proto::{
    ApplyRequest, ClusterStatusRequest, CreateTokenRequest, DeleteRequest, ListRequest,
    WatchRequest,
};
use tb_api::specs::{AllocationPhase, AllocationStatus};
use tb_api::status::NodeStatus;
use tb_api::{Kind, Object};

/// How to start tb.
#[derive(Debug, Clone)]
pub struct TbOptions {
    pub controller: PathBuf,
    pub nodelet: PathBuf,
    pub nodelets: usize,
    /// Nodelet i hands out ports `base + 100·i ..= base + 100·i + 99` to ranks.
    pub port_range_base: u16,
    /// `RUST_LOG` for every process (their default when `None`).
    pub rust_log: Option<String>,
}

/// How long a single RPC may take.
const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the cluster may take to come up.
const STARTUP: Duration = Duration::from_secs(60);
const NAMESPACE: &str = "default";
/// The uids of each nodelet's `--job-uid-range` (nodelets sharing a host must not share uids:
/// each owns its range and kills what runs under it).
const JOB_UIDS: u32 = 16;
/// The first uid handed to the first nodelet's jobs.
const JOB_UID_BASE: u32 = 300_000;

/// A running controller and its nodelets.
pub struct TbCluster {
    pub controller: Member,
    pub nodelets: Vec<Member>,
    pub metrics_addr: String,
    objects: ObjectsClient<AdminChannel>,
    channel: AdminChannel,
    token: AdminToken,
    /// The cluster CA the controller made in its data dir, which the nodelets trust.
    ca_cert: PathBuf,
    controller_addr: String,
    node_names: Vec<String>,
    dir: PathBuf,
    opts: TbOptions,
}

impl TbCluster {
    /// Start the controller (one-member cluster) with its data and log under `dir`, and wait
    /// for the CA it makes; the nodelets join in [`TbCluster::ready`].
    pub async fn start(opts: &TbOptions, dir: &Path) -> anyhow::Result<Self> {
        let ports = crate::ports::free_ports(2)?;
        let controller_addr = format!("127.0.0.1:{}", ports[0]);
        let metrics_addr = format!("127.0.0.1:{}", ports[1]);
        let data = dir.join("controller");
        let mut controller = Member::new(
            "tb-controller",
            &opts.controller,
            vec![
                "--id".into(),
                "1".into(),
                "--listen".into(),
                controller_addr.clone(),
                "--data-dir".into(),
                data.display().to_string(),
                "--metrics-listen".into(),
                metrics_addr.clone(),
            ],
            dir.join("controller.log"),
        )
        .data_dir(data.clone());
        if let Some(filter) = &opts.rust_log {
            controller = controller.env("RUST_LOG", filter);
        }
        controller.spawn()?;
        let ca_pem = match crate::secure::wait_for_ca(&data, STARTUP).await {
            Ok(pem) => pem,
            Err(e) => {
                let tail = controller.log_tail(20);
                let _ = controller.kill().await;
                return Err(e.context(format!("--- last log lines ---\n{tail}")));
            }
        };
        let token = AdminToken::from_data_dirs(std::slice::from_ref(&data));
        let channel = crate::secure::as_admin(
            crate::secure::tls_channel(&controller_addr, &ca_pem)?,
            &token,
        );
        Ok(TbCluster {
            controller,
            nodelets: Vec::new(),
            metrics_addr,
            objects: ObjectsClient::new(channel.clone()),
            channel,
            token,
            ca_cert: data.join(crate::secure::CA_CERT_FILE),
            controller_addr,
            node_names: Vec::new(),
            dir: dir.to_path_buf(),
            opts: opts.clone(),
        })
    }

    /// Wait for the controller to lead and write the admin token, create a join token (in a
    /// 0600 file), start the nodelets and wait until every one's Node is Ready.
    pub async fn ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + STARTUP;
        self.token.wait(STARTUP).await?;
        self.wait_leader(deadline).await?;
        let token = self.join_token(deadline).await?;
        // Never on the command line, where every local user could read it.
        let token_file = self.dir.join("join.token");
        crate::secure::write_private(&token_file, &format!("{token}\n"))?;
        let ports = crate::ports::free_ports(self.opts.nodelets)?;
        for (i, port) in ports.iter().enumerate() {
            let name = format!("node-{}", i + 1);
            let range_start = u32::from(self.opts.port_range_base) + 100 * i as u32;
            let range_end = range_start + 99;
            anyhow::ensure!(
                range_end <= u32::from(u16::MAX),
                "--port-range-base {} leaves no room for {} nodelets' port ranges",
                self.opts.port_range_base,
                self.opts.nodelets
            );
            let data = self.dir.join(&name);
            let mut m = Member::new(
                name.clone(),
                &self.opts.nodelet,
                vec![
                    "--controller".into(),
                    self.controller_addr.clone(),
                    "--name".into(),
                    name.clone(),
                    "--data-dir".into(),
                    data.display().to_string(),
                    "--listen".into(),
                    format!("127.0.0.1:{port}"),
                    "--port-range".into(),
                    format!("{range_start}-{range_end}"),
                    "--ca-cert".into(),
                    self.ca_cert.display().to_string(),
                    "--join-token-file".into(),
                    token_file.display().to_string(),
                    // Several nodelets share this host: each lets the OS pick its probe port.
                    "--probe-port".into(),
                    "0".into(),
                ],
                self.dir.join(format!("{name}.log")),
            )
            .data_dir(data);
            if is_root() {
                // As root a nodelet runs each namespace's jobs under a uid of its own range.
                let first = JOB_UID_BASE + JOB_UIDS * i as u32;
                m = m.args([
                    "--job-uid-range".to_string(),
                    format!("{first}-{}", first + JOB_UIDS - 1),
                ]);
            }
            if let Some(filter) = &self.opts.rust_log {
                m = m.env("RUST_LOG", filter);
            }
            m.spawn()?;
            self.nodelets.push(m);
            self.node_names.push(name);
        }
        self.wait_nodes_ready(deadline).await
    }

    /// Fail with the log's tail if a process has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        for m in std::iter::once(&mut self.controller).chain(self.nodelets.iter_mut()) {
            if let Some(why) = m.exited() {
                anyhow::bail!("{why}\n--- last log lines ---\n{}", m.log_tail(20));
            }
        }
        Ok(())
    }

    async fn wait_leader(&mut self, deadline: Instant) -> anyhow::Result<()> {
        let mut client = ClusterClient::new(self.channel.clone());
        loop {
            self.check_alive()?;
            let status = tokio::time::timeout(RPC_TIMEOUT, client.status(ClusterStatusRequest {}));
            let last = match status.await {
                Ok(Ok(s)) if s.get_ref().has_leader && s.get_ref().leader_id == 1 => return Ok(()),
                Ok(Ok(s)) => format!("no leader yet (term {})", s.get_ref().term),
                Ok(Err(e)) => format!("Cluster/Status: {}", e.message()),
                Err(_) => "Cluster/Status timed out".into(),
            };
            anyhow::ensure!(
                Instant::now() < deadline,
                "the controller did not lead within {STARTUP:?}: {last}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn join_token(&mut self, deadline: Instant) -> anyhow::Result<String> {
        let mut client = NodesClient::new(self.channel.clone());
        loop {
            self.check_alive()?;
            let req = CreateTokenRequest {
                ttl_seconds: 3600,
                description: "jobs-bench".into(),
                uses: u32::try_from(self.opts.nodelets).unwrap_or(u32::MAX).max(1),
                node: String::new(),
            };
            let why = match tokio::time::timeout(RPC_TIMEOUT, client.create_token(req)).await {
                Ok(Ok(r)) => return Ok(r.into_inner().token),
                Ok(Err(e)) => format!("Nodes/CreateToken: {:?}: {}", e.code(), e.message()),
                Err(_) => "Nodes/CreateToken timed out".into(),
            };
            anyhow::ensure!(Instant::now() < deadline, "no join token: {why}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn wait_nodes_ready(&mut self, deadline: Instant) -> anyhow::Result<()> {
        loop {
            self.check_alive()?;
            let req = ListRequest {
                kind: Kind::Node.as_str().into(),
                namespace: String::new(),
                label_selector: String::new(),
                stale: false,
            };
            let last = match tokio::time::timeout(RPC_TIMEOUT, self.objects.list(req)).await {
                Ok(Ok(r)) => {
                    let ready: Vec<String> = r
                        .into_inner()
                        .objects_json
                        .iter()
                        .filter_map(|j| Object::from_json(j).ok())
                        .filter(|o| NodeStatus::from_value(&o.status).is_ready())
                        .map(|o| o.metadata.name)
                        .collect();
                    let missing: Vec<&String> = self
                        .node_names
                        .iter()
                        .filter(|n| !ready.contains(n))
                        .collect();
                    if missing.is_empty() {
                        return Ok(());
                    }
                    format!("not Ready yet: {missing:?}")
                }
                Ok(Err(e)) => format!("Objects/List: {}", e.message()),
                Err(_) => "Objects/List timed out".into(),
            };
            anyhow::ensure!(
                Instant::now() < deadline,
                "nodes not Ready within {STARTUP:?}: {last}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One run of a job named `name`: apply, until every rank is Running (within `timeout`),
    /// then delete, until its allocations are gone (within `timeout` plus the ranks' 10 s stop
    /// grace).
    pub async fn run_job(
        &mut self,
        name: &str,
        shape: &JobShape,
        timeout: Duration,
    ) -> anyhow::Result<RunTimes> {
        let job = serde_json::json!({
            "apiVersion": tb_api::API_VERSION,
            "kind": Kind::TrainingJob.as_str(),
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "command": shape.command,
                "ranks": shape.ranks,
                "memory": format!("{}Mi", shape.memory_mib),
            },
        });
        let wall0 = chrono::Utc::now();
        let t0 = Instant::now();
        let applied = tokio::time::timeout(
            RPC_TIMEOUT,
            self.objects.apply(ApplyRequest {
                objects_json: vec![job.to_string()],
                dry_run: false,
                request_id: uuid::Uuid::new_v4().to_string(),
            }),
        )
        .await
        .context("Objects/Apply timed out")?
        .map_err(|s| anyhow::anyhow!("Objects/Apply: {:?}: {}", s.code(), s.message()))?
        .into_inner();
        let submit = t0.elapsed();

        let watch = WatchRequest {
            kind: Kind::Allocation.as_str().into(),
            namespace: NAMESPACE.into(),
            label_selector: format!("{}={name}", tb_api::specs::allocation::LABEL_JOB),
            resource_version: applied.resource_version,
        };
        let mut stream = tokio::time::timeout(RPC_TIMEOUT, self.objects.watch(watch))
            .await
            .context("Objects/Watch timed out")?
            .map_err(|s| anyhow::anyhow!("Objects/Watch: {:?}: {}", s.code(), s.message()))?
            .into_inner();

        // Allocation name → its latest status.
        let mut allocs: BTreeMap<String, AllocationStatus> = BTreeMap::new();
        let mut placed = None;
        let deadline = tokio::time::Instant::now() + timeout;
        let running = loop {
            let ev = next_event(&mut stream, deadline, "every rank Running").await?;
            placed.get_or_insert_with(|| t0.elapsed());
            let (alloc, status) = parse_event(&ev.object_json)?;
            if ev.r#type == "DELETED" {
                allocs.remove(&alloc);
                continue;
            }
            if status.phase.is_terminal() {
                anyhow::bail!(
                    "allocation {alloc} ended before the gang ran: {:?} {} {}",
                    status.phase,
                    status.reason,
                    status.message
                );
            }
            allocs.insert(alloc, status);
            let up = allocs
                .values()
                .filter(|s| s.phase == AllocationPhase::Running)
                .count();
            if up >= shape.ranks as usize {
                break t0.elapsed();
            }
        };
        let started = allocs
            .values()
            .filter_map(|s| s.started_at.as_ref().map(tb_api::Timestamp::at))
            .max()
            .map(|t| (t - wall0).to_std().unwrap_or(Duration::ZERO));

        let td = Instant::now();
        self.delete(name).await?;
        let deadline = tokio::time::Instant::now() + timeout + Duration::from_secs(10);
        while !allocs.is_empty() {
            let ev = next_event(&mut stream, deadline, "the allocations gone").await?;
            let (alloc, status) = parse_event(&ev.object_json)?;
            if ev.r#type == "DELETED" {
                allocs.remove(&alloc);
            } else {
                allocs.insert(alloc, status);
            }
        }
        Ok(RunTimes {
            submit,
            placed,
            running,
            started,
            teardown: td.elapsed(),
            polls: None,
        })
    }

    /// Delete job `name` (after a failed run too, so that its ranks stop).
    pub async fn delete(&mut self, name: &str) -> anyhow::Result<()> {
        let req = DeleteRequest {
            kind: Kind::TrainingJob.as_str().into(),
            namespace: NAMESPACE.into(),
            name: name.into(),
            resource_version: 0,
            request_id: uuid::Uuid::new_v4().to_string(),
        };
        match tokio::time::timeout(RPC_TIMEOUT, self.objects.delete(req)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(s)) if s.code() == tonic::Code::NotFound => Ok(()),
            Ok(Err(s)) => anyhow::bail!("Objects/Delete: {:?}: {}", s.code(), s.message()),
            Err(_) => anyhow::bail!("Objects/Delete timed out"),
        }
    }

    /// How many Allocations the store holds (to wait for a failed run's ranks to go).
    pub async fn allocations(&mut self) -> anyhow::Result<usize> {
        let req = ListRequest {
            kind: Kind::Allocation.as_str().into(),
            namespace: String::new(),
            label_selector: String::new(),
            stale: false,
        };
        let r = tokio::time::timeout(RPC_TIMEOUT, self.objects.list(req))
            .await
            .context("Objects/List timed out")?
            .map_err(|s| anyhow::anyhow!("Objects/List: {}", s.message()))?;
        Ok(r.into_inner().objects_json.len())
    }

    /// Wait until no Allocation is left, up to `timeout`.
    pub async fn wait_no_allocations(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let n = self.allocations().await?;
            if n == 0 {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{n} allocation(s) still stored after {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The processes to sample while idle.
    pub fn watched(&self) -> anyhow::Result<Vec<Watched>> {
        let mut out = Vec::new();
        let controller = self
            .controller
            .pid()
            .context("tb-controller is not running")?;
        out.push(Watched {
            role: "controller".into(),
            name: "tb-controller".into(),
            pid: controller,
        });
        for m in &self.nodelets {
            out.push(Watched {
                role: "agent".into(),
                name: m.name.clone(),
                pid: m
                    .pid()
                    .with_context(|| format!("{} is not running", m.name))?,
            });
        }
        Ok(out)
    }

    /// Scrape the controller's `/metrics` (kept as `metrics-controller.txt` in the dir) and say
    /// where the time went: server-side latency per RPC and state-machine apply batches.
    pub async fn metrics_notes(&self) -> Vec<String> {
        use crate::tb::metrics;
        let text = match metrics::scrape(&self.metrics_addr).await {
            Ok(t) => t,
            Err(e) => return vec![format!("controller metrics unavailable: {e:#}")],
        };
        let _ = std::fs::write(self.dir.join("metrics-controller.txt"), &text);
        let mut parts = Vec::new();
        for m in [
            "Objects/Apply",
            "Objects/Delete",
            "Objects/UpdateStatus",
            "Objects/List",
            "Nodes/Heartbeat",
        ] {
            if let Some(h) = metrics::method(&text, m).filter(|h| h.count > 0) {
                parts.push(format!("{m}: {} calls, mean {} ms", h.count, ms2(h.mean())));
            }
        }
        let mut notes = vec![format!(
            "controller, server-side latency: {}",
            parts.join("; ")
        )];
        if let Some(h) = metrics::apply(&text).filter(|h| h.count > 0) {
            notes.push(format!(
                "controller, state-machine apply (`tb_apply_duration_seconds`): {} batches, mean {} ms",
                h.count,
                ms2(h.mean())
            ));
        }
        let kinds: Vec<String> = ["TrainingJob", "Allocation", "Node", "Event"]
            .iter()
            .filter_map(|k| metrics::objects(&text, k).map(|n| format!("{n} {k}")))
            .collect();
        if !kinds.is_empty() {
            notes.push(format!(
                "controller stores at the end: {}",
                kinds.join(", ")
            ));
        }
        notes
    }

    /// Stop the nodelets, then the controller (SIGKILL: the data is thrown away).
    pub async fn stop(&mut self) {
        for m in &mut self.nodelets {
            let _ = m.kill().await;
        }
        let _ = self.controller.kill().await;
    }
}

/// Whether this process runs as root (then the nodelets do, and isolate jobs by uid).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

fn ms2(d: Option<Duration>) -> String {
    d.map_or_else(
        || "-".into(),
        |d| format!("{:.2}", d.as_secs_f64() * 1000.0),
    )
}

/// The next watch event, or why there is none by `deadline`.
async fn next_event(
    stream: &mut tonic::Streaming<tb_api::proto::WatchEvent>,
    deadline: tokio::time::Instant,
    waiting_for: &str,
) -> anyhow::Result<tb_api::proto::WatchEvent> {
    match tokio::time::timeout_at(deadline, stream.message()).await {
        Err(_) => anyhow::bail!("timed out waiting for {waiting_for}"),
        Ok(Err(s)) => anyhow::bail!("Objects/Watch: {:?}: {}", s.code(), s.message()),
        Ok(Ok(None)) => anyhow::bail!("the controller ended the watch"),
        Ok(Ok(Some(ev))) => Ok(ev),
    }
}

/// An Allocation event's name and status.
fn parse_event(json: &str) -> anyhow::Result<(String, AllocationStatus)> {
    let obj = Object::from_json(json).context("an Allocation event that does not parse")?;
    Ok((
        obj.metadata.name.clone(),
        AllocationStatus::from_value(&obj.status),
    ))
}
