//! `scheduler-bench --raft`: the scheduler measured through the real controller. A 3-member
//! `tb-controller` cluster (the release binary, TLS and auth on, as a user runs it) schedules
//! 5,000 queued one-rank TrainingJobs from 10 weighted queues onto 64 simulated Macs, in real
//! time: every plan the leader's reconcile loop makes is committed through Raft (redb, fsync)
//! and every status a Mac reports is a gRPC call.
//!
//! The Macs are simulated in this process, over gRPC with tb-api's clients, the way
//! `tb-nodelet` talks to the controllers: each joins with a join token (`Nodes.Join`, Node
//! object with 32 GiB allocatable and a port range) and then calls with its node credential;
//! it heartbeats its Node status every 2 s (the interval the controllers ask for), watches its
//! Allocations (`Objects.Watch`, label `tb/node=NAME`), reports each new one Running, and
//! Succeeded once the job's run time (2–10 s, deterministic per job) has passed since the
//! allocation was seen. No process is started. Each simulated Mac keeps one TLS connection
//! to one controller (Mac i to controller i mod 3; writes to a follower are forwarded to the
//! leader).
//!
//! Sequence: start the cluster and wait until it is healthy; apply the 10 Queues and the
//! 5,000 jobs (batches of `Objects.Apply`); join the 64 Macs with `Ready=False` (a nodelet
//! that has not read its capacity yet) and open their watches; then start the clock (`t0`) and
//! send every Mac's first `Ready=True` heartbeat at once. From there on everything is real time
//! on this machine's clock:
//!
//! - **initial fill**: the first 512 admissions (every slot) ÷ the time from `t0` to the 512th
//!   allocation seen by its Mac's watch;
//! - **whole drain**: all admissions ÷ the time from `t0` to the last one (bounded by the jobs'
//!   run times, so it is compared with the ideal: total run time ÷ slots);
//! - **capacity freed → next admission**: per Mac, from the Succeeded status write being
//!   acknowledged to the next allocation for that Mac seen by its watch (admission `j` on a
//!   Mac of 8 slots is paired with free `j − 8`: the slot it needed);
//! - **fairness error**: over the contended window (`t0` until the first queue has no backlog),
//!   each queue's share of the held memory·time against its weight's share, worst relative
//!   error — the virtual bench's measure (`crate::scheduler::Results::fairness_error`);
//! - the leader's CPU time (`/proc/PID/stat`) and memory, and server-side latencies from its
//!   `/metrics`.
//!
//! Every wait is bounded; the whole run stops after `time_limit` and reports what it has.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;
use tb_api::proto::cluster_client::ClusterClient;
use tb_api::proto::nodes_client::NodesClient;
use tb_api::proto::objects_client::ObjectsClient;
use tb_api::proto::{
    ApplyRequest, ClusterStatusRequest, CreateTokenRequest, HeartbeatRequest, JoinRequest,
    UpdateStatusRequest, WatchEvent, WatchRequest,
};
use tb_api::specs::allocation::LABEL_NODE;
use tb_api::specs::{AllocationPhase, AllocationSpec, AllocationStatus, Desired, parse_spec};
use tb_api::status::{NodeCapacity, NodeStatus, PortRange, set_condition};
use tb_api::{Kind, Object, ObjectMeta};
use tokio::sync::{mpsc, oneshot};
use tonic::Streaming;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::backend::{Backend, Probe, RpcError, Write, with_timeout};
use crate::cluster::Cluster;
use crate::member::{Member, Memory};
use crate::stats::Latencies;

const GI: u64 = 1 << 30;
/// How long one RPC may take (a write may wait for an election).
const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts of one write on retryable errors.
const ATTEMPTS: u32 = 20;
/// How long the cluster may take to become healthy.
const STARTUP: Duration = Duration::from_secs(60);
/// Heartbeat interval of the simulated nodelets (the controllers ask for node grace ÷ 5 = 2 s).
const HEARTBEAT: Duration = Duration::from_secs(2);
/// The run is stopped when nothing is admitted and nothing ends for this long.
const STALL: Duration = Duration::from_secs(45);
/// Times a Mac's watch is reopened after it ends.
const WATCH_RECONNECTS: u32 = 50;

/// What to run.
#[derive(Debug, Clone)]
pub struct RaftSetup {
    /// The `tb-controller` binary.
    pub controller: PathBuf,
    /// Parent of the run's temporary dir (data dirs, logs, credentials).
    pub dir: PathBuf,
    /// Keep the temporary dir.
    pub keep: bool,
    /// `RUST_LOG` for the controllers (their default when `None`).
    pub rust_log: Option<String>,
    pub macs: usize,
    pub mac_memory_gi: u64,
    pub jobs: usize,
    pub job_memory_gi: u64,
    pub weights: Vec<u32>,
    /// Job run time: uniform in [min, max] milliseconds (deterministic per job).
    pub run_ms: (u64, u64),
    /// Jobs per `Objects.Apply`.
    pub apply_batch: usize,
    /// The whole run (after the cluster is up) stops after this long, with partial results.
    pub time_limit: Duration,
    /// Every simulated Mac talks to the leader (true), or Mac i to controller i mod 3.
    pub macs_on_leader: bool,
}

impl RaftSetup {
    pub fn new(controller: PathBuf, dir: PathBuf) -> Self {
        RaftSetup {
            controller,
            dir,
            keep: false,
            rust_log: None,
            macs: 64,
            mac_memory_gi: 32,
            jobs: 5000,
            job_memory_gi: 4,
            weights: vec![1, 1, 2, 2, 3, 3, 4, 4, 5, 5],
            run_ms: (2000, 10_000),
            apply_batch: 250,
            time_limit: Duration::from_secs(600),
            macs_on_leader: false,
        }
    }

    fn slots_per_mac(&self) -> usize {
        (self.mac_memory_gi / self.job_memory_gi.max(1)) as usize
    }

    fn slots(&self) -> usize {
        self.macs * self.slots_per_mac()
    }
}

/// CPU use of one process over a window, in percent of one core.
#[derive(Debug, Clone, Default)]
pub struct Cpu {
    pub fill: Option<f64>,
    pub run: Option<f64>,
    /// The busiest whole second of the run.
    pub peak_second: Option<f64>,
}

/// What came out.
#[derive(Debug, Clone)]
pub struct RaftResults {
    pub setup: RaftSetup,
    pub controller: String,
    pub date: String,
    /// Why the run stopped early, if it did.
    pub aborted: Option<String>,
    pub submitted: usize,
    pub submit_time: Duration,
    pub join_time: Duration,
    /// `t0` → the last of the Macs' first Ready heartbeats acknowledged.
    pub ready_time: Duration,
    /// Admission times since `t0`, sorted.
    pub admissions: Vec<Duration>,
    pub fill: usize,
    pub fill_time: Option<Duration>,
    pub completed: usize,
    /// `t0` → the last Succeeded acknowledged.
    pub finish: Option<Duration>,
    /// Total run time ÷ slots: the shortest possible drain.
    pub ideal_finish: Duration,
    pub free_to_admit: Latencies,
    /// Pairs where the allocation was seen before the freeing write's answer (counted as 0).
    pub early_admissions: usize,
    pub stopped: usize,
    /// (queue, weight, memory byte·seconds in the contended window).
    pub shares: Vec<(String, u32, f64)>,
    pub contended: Duration,
    /// Held memory·time ÷ (capacity × contended window).
    pub utilization: f64,
    pub leader: String,
    pub leader_cpu: Cpu,
    pub followers_cpu: Vec<(String, Cpu)>,
    pub bench_cpu: Cpu,
    pub leader_memory: Option<Memory>,
    pub notes: Vec<String>,
    pub wall: Duration,
    /// `/proc/loadavg` before the cluster started and after the run.
    pub load: (String, String),
    pub passes: Passes,
}

impl RaftResults {
    pub fn fill_per_second(&self) -> Option<f64> {
        self.fill_time
            .map(|t| self.fill as f64 / t.as_secs_f64().max(1e-9))
    }

    pub fn drain_per_second(&self) -> Option<f64> {
        let last = self.admissions.last()?;
        Some(self.admissions.len() as f64 / last.as_secs_f64().max(1e-9))
    }

    /// Admissions/s a perfect scheduler would sustain once the backlog is the only limit:
    /// slots ÷ mean run time.
    pub fn ideal_drain_per_second(&self) -> f64 {
        let (lo, hi) = self.setup.run_ms;
        self.setup.slots() as f64 / ((lo + hi) as f64 / 2000.0)
    }

    /// Worst |got − wanted| / wanted over queues (the virtual bench's measure).
    pub fn fairness_error(&self) -> f64 {
        crate::scheduler::fairness_error(&self.shares)
    }
}

// ---------------------------------------------------------------------------------------------
// Credentials, channels and the cluster.

/// The admin token, cluster secret and CA every member is started with.
struct Credentials {
    admin_token: String,
    ca_pem: String,
    args: Vec<String>,
}

fn random_hex() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("{text}\n"))
        .with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 600 {}", path.display()))
}

impl Credentials {
    /// `tb-controller init-ca DIR/ca`, a random admin token and cluster secret, in files.
    async fn create(controller: &Path, dir: &Path) -> anyhow::Result<Self> {
        let ca_dir = dir.join("ca");
        let out = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::process::Command::new(controller)
                .arg("init-ca")
                .arg(&ca_dir)
                .kill_on_drop(true)
                .output(),
        )
        .await
        .context("tb-controller init-ca took over 30 s")?
        .with_context(|| format!("running {} init-ca", controller.display()))?;
        anyhow::ensure!(
            out.status.success(),
            "tb-controller init-ca failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let (cert, key) = (ca_dir.join("ca.pem"), ca_dir.join("ca.key"));
        let ca_pem = std::fs::read_to_string(&cert)
            .with_context(|| format!("reading {}", cert.display()))?;
        let admin_token = format!("tbuser-{}", random_hex());
        let token_file = dir.join("admin.token");
        let secret_file = dir.join("cluster.secret");
        write_private(&token_file, &admin_token)?;
        write_private(&secret_file, &format!("tbcluster-{}", random_hex()))?;
        let path = |p: &Path| p.display().to_string();
        Ok(Credentials {
            admin_token,
            ca_pem,
            args: vec![
                "--admin-token-file".into(),
                path(&token_file),
                "--cluster-secret-file".into(),
                path(&secret_file),
                "--tls-ca-cert".into(),
                path(&cert),
                "--tls-ca-key".into(),
                path(&key),
            ],
        })
    }
}

/// Adds `authorization: Bearer TOKEN` to every call.
#[derive(Clone)]
struct Bearer(MetadataValue<Ascii>);

impl Bearer {
    fn new(token: &str) -> anyhow::Result<Self> {
        Ok(Bearer(
            format!("Bearer {token}")
                .parse()
                .context("a token that is not a header value")?,
        ))
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        Ok(req)
    }
}

type Authed = InterceptedService<Channel, Bearer>;

/// A lazily connecting TLS channel to `addr` that trusts the cluster CA.
fn tls_channel(addr: &str, ca_pem: &str) -> anyhow::Result<Channel> {
    let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem));
    Ok(Endpoint::from_shared(format!("https://{addr}"))
        .with_context(|| format!("endpoint {addr}"))?
        .tls_config(tls)
        .with_context(|| format!("TLS settings for {addr}"))?
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .connect_lazy())
}

/// The admin's client of the three controllers, over TLS, for `Cluster`'s health check.
pub struct TlsTb {
    objects: Vec<ObjectsClient<Authed>>,
    cluster: Vec<ClusterClient<Authed>>,
    nodes: Vec<NodesClient<Authed>>,
}

impl TlsTb {
    fn new(addrs: &[String], ca_pem: &str, token: &str) -> anyhow::Result<Self> {
        let bearer = Bearer::new(token)?;
        let channels = addrs
            .iter()
            .map(|a| tls_channel(a, ca_pem))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let authed = |c: &Channel| InterceptedService::new(c.clone(), bearer.clone());
        Ok(TlsTb {
            objects: channels
                .iter()
                .map(|c| {
                    ObjectsClient::new(authed(c))
                        .max_decoding_message_size(64 << 20)
                        .max_encoding_message_size(64 << 20)
                })
                .collect(),
            cluster: channels
                .iter()
                .map(|c| ClusterClient::new(authed(c)))
                .collect(),
            nodes: channels
                .iter()
                .map(|c| NodesClient::new(authed(c)))
                .collect(),
        })
    }
}

impl Backend for TlsTb {
    fn name(&self) -> &'static str {
        "tb"
    }

    fn endpoints(&self) -> usize {
        self.objects.len()
    }

    async fn put(&self, endpoint: usize, write: &Write, timeout: Duration) -> Result<(), RpcError> {
        let mut client = self.objects[endpoint].clone();
        let mut req = tonic::Request::new(ApplyRequest {
            objects_json: vec![crate::payload::model_json(&write.name, 256)],
            dry_run: false,
            request_id: write.request_id.clone(),
        });
        req.set_timeout(timeout);
        with_timeout("Objects/Apply", timeout, async {
            client
                .apply(req)
                .await
                .map(|_| ())
                .map_err(|s| RpcError::from_status("Objects/Apply", &s))
        })
        .await
    }

    async fn probe(&self, endpoint: usize, timeout: Duration) -> Result<Probe, RpcError> {
        let mut client = self.cluster[endpoint].clone();
        let mut req = tonic::Request::new(ClusterStatusRequest {});
        req.set_timeout(timeout);
        with_timeout("Cluster/Status", timeout, async {
            let s = client
                .status(req)
                .await
                .map_err(|s| RpcError::from_status("Cluster/Status", &s))?
                .into_inner();
            let id = endpoint as u64 + 1;
            let own = s.members.iter().find(|m| m.id == id);
            Ok(Probe {
                is_leader: s.has_leader && s.leader_id == id,
                has_leader: s.has_leader,
                term: s.term,
                applied: own.map_or(0, |m| m.applied_index),
            })
        })
        .await
    }
}

/// Controllers 1..=3 on fresh loopback ports, TLS and auth from `creds`, each serving
/// `/metrics`. Returns the cluster and the members' API addresses.
fn start_cluster(
    setup: &RaftSetup,
    dir: &Path,
    creds: &Credentials,
) -> anyhow::Result<(Cluster<TlsTb>, Vec<String>)> {
    let ports = crate::ports::free_ports(6)?;
    let (api, metrics) = ports.split_at(3);
    let addrs: Vec<String> = api.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let initial = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let mut members = Vec::new();
    let mut metrics_addrs = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let id = i + 1;
        let metrics_addr = format!("127.0.0.1:{}", metrics[i]);
        let data = dir.join(format!("tb-{id}"));
        let mut args = vec![
            "--id".into(),
            id.to_string(),
            "--listen".into(),
            addr.clone(),
            "--data-dir".into(),
            data.display().to_string(),
            "--initial-cluster".into(),
            initial.clone(),
            "--metrics-listen".into(),
            metrics_addr.clone(),
        ];
        args.extend(creds.args.iter().cloned());
        let mut m = Member::new(
            format!("tb-{id}"),
            &setup.controller,
            args,
            dir.join(format!("tb-{id}.log")),
        )
        .data_dir(data);
        if let Some(filter) = &setup.rust_log {
            m = m.env("RUST_LOG", filter);
        }
        members.push(m);
        metrics_addrs.push(metrics_addr);
    }
    let backend = TlsTb::new(&addrs, &creds.ca_pem, &creds.admin_token)?;
    let mut cluster = Cluster::new(members, Arc::new(backend));
    cluster.metrics = metrics_addrs;
    cluster.spawn_all()?;
    Ok((cluster, addrs))
}

fn retryable(s: &tonic::Status) -> bool {
    RpcError::from_status("", s).retryable
}

/// `call` until it succeeds, a final error, or `ATTEMPTS` tries (each bounded by
/// `RPC_TIMEOUT`).
async fn retry<T, F, Fut>(what: &str, mut call: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut last = String::new();
    for attempt in 0..ATTEMPTS {
        match tokio::time::timeout(RPC_TIMEOUT, call()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(s)) if retryable(&s) => last = format!("{:?}: {}", s.code(), s.message()),
            Ok(Err(s)) => anyhow::bail!("{what}: {:?}: {}", s.code(), s.message()),
            Err(_) => last = format!("no answer within {RPC_TIMEOUT:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt.min(10) + 1))).await;
    }
    anyhow::bail!("{what}: gave up after {ATTEMPTS} attempts: {last}")
}

// ---------------------------------------------------------------------------------------------
// The workload.

fn queue_json(name: &str, weight: u32) -> String {
    json!({"apiVersion": "tb/v1", "kind": "Queue", "metadata": {"name": name},
           "spec": {"weight": weight}})
    .to_string()
}

fn job_json(name: &str, queue: &str, memory_gi: u64) -> String {
    json!({"apiVersion": "tb/v1", "kind": "TrainingJob",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"command": ["python3", "train.py"], "ranks": 1,
                    "memory": format!("{memory_gi}Gi"), "queue": queue,
                    "ttlSecondsAfterFinished": 0}})
    .to_string()
}

/// A deterministic run time per job number (the virtual bench's generator).
fn run_time(n: u64, (lo, hi): (u64, u64)) -> Duration {
    let x = n
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    Duration::from_millis(lo + (x >> 33) % (hi - lo + 1))
}

/// The queue a job belongs to: its name's prefix (`q3-17` → `q3`).
fn queue_of(job: &str) -> &str {
    job.split('-').next().unwrap_or("")
}

/// Apply the queues, then the jobs interleaved by queue, in batches. Returns the jobs' run
/// times by name.
async fn submit(
    tb: &TlsTb,
    leader: usize,
    setup: &RaftSetup,
) -> anyhow::Result<HashMap<String, Duration>> {
    let queues: Vec<String> = (0..setup.weights.len()).map(|i| format!("q{i}")).collect();
    let mut batches = vec![
        queues
            .iter()
            .zip(&setup.weights)
            .map(|(q, w)| queue_json(q, *w))
            .collect::<Vec<_>>(),
    ];
    let mut runs = HashMap::new();
    let mut batch = Vec::new();
    let per_queue = setup.jobs / queues.len().max(1);
    for n in 0..per_queue {
        for q in &queues {
            let name = format!("{q}-{n}");
            runs.insert(name.clone(), run_time(runs.len() as u64, setup.run_ms));
            batch.push(job_json(&name, q, setup.job_memory_gi));
            if batch.len() >= setup.apply_batch {
                batches.push(std::mem::take(&mut batch));
            }
        }
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    for objects in batches {
        let n = objects.len();
        let req = ApplyRequest {
            objects_json: objects,
            dry_run: false,
            request_id: uuid::Uuid::new_v4().to_string(),
        };
        let client = tb.objects[leader].clone();
        let resp = retry("Objects/Apply", || {
            let (mut c, req) = (client.clone(), req.clone());
            async move { c.apply(req).await }
        })
        .await?
        .into_inner();
        anyhow::ensure!(
            resp.results.len() == n,
            "Objects/Apply: {} results for {n} objects",
            resp.results.len()
        );
    }
    Ok(runs)
}

// ---------------------------------------------------------------------------------------------
// The simulated nodelets.

/// What the Macs tell the recorder.
enum Ev {
    Admitted {
        mac: usize,
        job: String,
        at: Instant,
        /// The allocation's creationTimestamp: the clock of the reconcile pass that made it
        /// (every plan of a pass carries the same one).
        created: String,
    },
    Ended {
        mac: usize,
        job: String,
        admitted: Instant,
        at: Instant,
        phase: AllocationPhase,
        acknowledged: bool,
    },
    Problem(String),
}

/// One live allocation on a Mac.
struct Live {
    memory_bytes: u64,
    stop: Option<oneshot::Sender<()>>,
}

/// One simulated Mac after its join.
struct Mac {
    index: usize,
    name: String,
    credential: String,
    objects: ObjectsClient<Authed>,
    nodes: NodesClient<Authed>,
    capacity_bytes: u64,
    port_range: PortRange,
    runs: Arc<HashMap<String, Duration>>,
    events: mpsc::UnboundedSender<Ev>,
    live: Mutex<BTreeMap<String, Live>>,
    seen: Mutex<HashSet<String>>,
}

fn now_stamp() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn node_status(address: &str, capacity: u64, range: PortRange, ready: bool) -> NodeStatus {
    let mut status = NodeStatus {
        address: address.into(),
        capacity: NodeCapacity {
            memory: tb_api::Quantity::from_bytes(capacity).to_string(),
            memory_bytes: capacity,
            allocatable_bytes: capacity,
            chip: "Apple M2 Ultra".into(),
            cpu_cores: 24,
            os: "macOS (simulated by scheduler-bench)".into(),
            ..Default::default()
        },
        free_bytes: capacity,
        port_range: range,
        nodelet_version: "scheduler-bench".into(),
        ..Default::default()
    };
    let (reason, message) = if ready {
        ("NodeletReady", "")
    } else {
        (
            "Starting",
            "simulated: Ready once the bench starts its clock",
        )
    };
    set_condition(
        &mut status.conditions,
        "Ready",
        ready,
        reason,
        message,
        &now_stamp(),
    );
    status
}

/// Join Mac `index` through the controller at `addr` with `token`.
async fn join(
    index: usize,
    setup: &RaftSetup,
    addr: &str,
    ca_pem: &str,
    token: &str,
    runs: Arc<HashMap<String, Duration>>,
    events: mpsc::UnboundedSender<Ev>,
) -> anyhow::Result<Arc<Mac>> {
    let name = format!("mac{index:02}");
    let channel = tls_channel(addr, ca_pem)?;
    let capacity = setup.mac_memory_gi * GI;
    let port_range = PortRange {
        start: 32323,
        end: 32422,
    };
    let address = format!("127.0.0.1:{}", 17600 + index);
    let node = Object {
        api_version: tb_api::API_VERSION.into(),
        kind: Kind::Node.as_str().into(),
        metadata: ObjectMeta {
            name: name.clone(),
            ..Default::default()
        },
        spec: json!({ "address": address }),
        status: node_status(&address, capacity, port_range, false).to_value(),
    };
    let req = JoinRequest {
        token: token.into(),
        node_json: node.to_json(),
    };
    let anonymous = NodesClient::new(channel.clone());
    let reply = retry(&format!("Nodes/Join {name}"), || {
        let (mut c, req) = (anonymous.clone(), req.clone());
        async move { c.join(req).await }
    })
    .await?
    .into_inner();
    anyhow::ensure!(
        !reply.node_cert_pem.is_empty(),
        "{name}: the join answered no node certificate: is TLS off?"
    );
    let bearer = Bearer::new(&reply.credential)?;
    Ok(Arc::new(Mac {
        index,
        name,
        credential: reply.credential,
        objects: ObjectsClient::with_interceptor(channel.clone(), bearer.clone())
            .max_decoding_message_size(64 << 20),
        nodes: NodesClient::with_interceptor(channel, bearer),
        capacity_bytes: capacity,
        port_range,
        runs,
        events,
        live: Mutex::new(BTreeMap::new()),
        seen: Mutex::new(HashSet::new()),
    }))
}

impl Mac {
    fn address(&self) -> String {
        format!("127.0.0.1:{}", 17600 + self.index)
    }

    /// One heartbeat with the allocations this Mac holds now.
    async fn heartbeat(&self) -> anyhow::Result<Duration> {
        let mut status = node_status(&self.address(), self.capacity_bytes, self.port_range, true);
        {
            let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            status.allocated_bytes = live.values().map(|l| l.memory_bytes).sum();
            status.free_bytes = self.capacity_bytes.saturating_sub(status.allocated_bytes);
            status.allocations = live.keys().cloned().collect();
        }
        let req = HeartbeatRequest {
            node: self.name.clone(),
            credential: self.credential.clone(),
            status_json: status.to_value().to_string(),
        };
        let reply = retry(&format!("Nodes/Heartbeat {}", self.name), || {
            let (mut c, req) = (self.nodes.clone(), req.clone());
            async move { c.heartbeat(req).await }
        })
        .await?
        .into_inner();
        Ok(match reply.heartbeat_interval_ms {
            0 => HEARTBEAT,
            ms => HEARTBEAT.min(Duration::from_millis(ms)),
        })
    }

    /// Heartbeat every interval, `beats` times at most (the run is aborted long before).
    async fn heartbeats(self: Arc<Self>, mut interval: Duration, beats: u64) {
        for _ in 0..beats {
            tokio::time::sleep(interval).await;
            match self.heartbeat().await {
                Ok(next) => interval = next,
                Err(e) => {
                    let _ = self.events.send(Ev::Problem(format!("{e:#}")));
                }
            }
        }
    }

    /// Open the watch of this Mac's allocations after `from`. A member that has not applied
    /// this Mac's join yet does not know its credential (`UNAUTHENTICATED`): like a nodelet,
    /// try again shortly.
    async fn watch(&self, from: u64) -> anyhow::Result<Streaming<WatchEvent>> {
        let req = WatchRequest {
            kind: Kind::Allocation.as_str().into(),
            namespace: String::new(),
            label_selector: format!("{LABEL_NODE}={}", self.name),
            resource_version: from,
        };
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            let mut c = self.objects.clone();
            match tokio::time::timeout(RPC_TIMEOUT, c.watch(req.clone())).await {
                Ok(Ok(stream)) => return Ok(stream.into_inner()),
                Ok(Err(s)) if s.code() == tonic::Code::Unauthenticated || retryable(&s) => {
                    last = format!("{:?}: {}", s.code(), s.message());
                }
                Ok(Err(s)) => {
                    anyhow::bail!(
                        "{}: Objects/Watch: {:?}: {}",
                        self.name,
                        s.code(),
                        s.message()
                    )
                }
                Err(_) => last = format!("no answer within {RPC_TIMEOUT:?}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::bail!(
            "{}: Objects/Watch: gave up after {ATTEMPTS} attempts: {last}",
            self.name
        )
    }

    /// Follow the watch, reopening it (from the last version seen) when it ends.
    async fn follow(self: Arc<Self>, mut stream: Streaming<WatchEvent>) {
        let mut from = 0u64;
        for _ in 0..WATCH_RECONNECTS {
            let why = loop {
                match stream.message().await {
                    Ok(Some(ev)) => {
                        from = from.max(ev.resource_version);
                        self.absorb(&ev);
                    }
                    Ok(None) => break "the controller ended the watch".to_string(),
                    Err(s) => {
                        if s.code() == tonic::Code::OutOfRange {
                            from = 0;
                        }
                        break format!("{:?}: {}", s.code(), s.message());
                    }
                }
            };
            let _ = self.events.send(Ev::Problem(format!(
                "{}: watch ended ({why}); reopening",
                self.name
            )));
            tokio::time::sleep(Duration::from_millis(300)).await;
            match self.watch(from).await {
                Ok(s) => stream = s,
                Err(e) => {
                    let _ = self.events.send(Ev::Problem(format!("{e:#}")));
                    return;
                }
            }
        }
    }

    /// One watch event: start what is new, stop what is told to stop or gone.
    fn absorb(self: &Arc<Self>, ev: &WatchEvent) {
        let at = Instant::now();
        let Ok(obj) = Object::from_json(&ev.object_json) else {
            let _ = self.events.send(Ev::Problem(format!(
                "{}: an event that does not parse",
                self.name
            )));
            return;
        };
        let name = obj.metadata.name.clone();
        let spec = parse_spec::<AllocationSpec>(&obj.spec).ok();
        let wanted = ev.r#type != "DELETED"
            && spec
                .as_ref()
                .is_some_and(|s| s.node == self.name && s.desired == Desired::Run);
        if !wanted {
            let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(stop) = live.get_mut(&name).and_then(|l| l.stop.take()) {
                let _ = stop.send(());
            }
            return;
        }
        let Some(spec) = spec else { return };
        if AllocationStatus::from_value(&obj.status)
            .phase
            .is_terminal()
        {
            return;
        }
        let incarnation = format!("{}/{}", obj.metadata.uid, spec.epoch);
        if !self
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(incarnation)
        {
            return;
        }
        let (tx, rx) = oneshot::channel();
        self.live.lock().unwrap_or_else(|e| e.into_inner()).insert(
            name.clone(),
            Live {
                memory_bytes: spec.memory_bytes,
                stop: Some(tx),
            },
        );
        let _ = self.events.send(Ev::Admitted {
            mac: self.index,
            job: spec.job.name.clone(),
            at,
            created: obj.metadata.creation_timestamp.clone(),
        });
        let me = self.clone();
        tokio::spawn(async move { me.run(obj, spec, at, rx).await });
    }

    /// Run one allocation: Running at once, Succeeded after the job's run time (from when it
    /// was seen), or Stopped when told to stop first.
    async fn run(
        self: Arc<Self>,
        obj: Object,
        spec: AllocationSpec,
        admitted: Instant,
        stop: oneshot::Receiver<()>,
    ) {
        let (namespace, name) = (obj.metadata.namespace.clone(), obj.metadata.name.clone());
        let started_at = now_stamp();
        let running = AllocationStatus {
            phase: AllocationPhase::Running,
            reason: "Started".into(),
            pid: Some(1),
            started_at: started_at.clone(),
            ..Default::default()
        };
        self.report(&namespace, &name, &running).await;
        let due = self
            .runs
            .get(&spec.job.name)
            .copied()
            .unwrap_or(Duration::from_secs(5));
        let stopped = tokio::select! {
            _ = tokio::time::sleep_until((admitted + due).into()) => false,
            _ = stop => true,
        };
        let (phase, reason) = if stopped {
            (AllocationPhase::Stopped, "Stopped")
        } else {
            (AllocationPhase::Succeeded, "Completed")
        };
        let ended = AllocationStatus {
            phase,
            reason: reason.into(),
            exit_code: Some(0),
            pid: Some(1),
            started_at,
            finished_at: now_stamp(),
            ..Default::default()
        };
        let acknowledged = self.report(&namespace, &name, &ended).await;
        let at = Instant::now();
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&name);
        let _ = self.events.send(Ev::Ended {
            mac: self.index,
            job: spec.job.name,
            admitted,
            at,
            phase,
            acknowledged,
        });
    }

    /// Write an allocation's status (retrying); false when it did not land.
    async fn report(&self, namespace: &str, name: &str, status: &AllocationStatus) -> bool {
        let req = UpdateStatusRequest {
            kind: Kind::Allocation.as_str().into(),
            namespace: namespace.into(),
            name: name.into(),
            status_json: status.to_value().to_string(),
            resource_version: 0,
            request_id: String::new(),
        };
        let result = retry(&format!("Objects/UpdateStatus {namespace}/{name}"), || {
            let (mut c, req) = (self.objects.clone(), req.clone());
            async move { c.update_status(req).await }
        })
        .await;
        match result {
            Ok(_) => true,
            Err(e) => {
                let _ = self
                    .events
                    .send(Ev::Problem(format!("{}: {e:#}", self.name)));
                false
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Measuring.

/// CPU ticks (`utime + stime`) of a process so far.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    crate::procstat::parse_cpu_ticks(&stat)
}

/// Per-second CPU samples of a few processes.
struct CpuWatch {
    pids: Vec<(String, u32)>,
    hz: f64,
    /// (time since t0, ticks per process).
    samples: Vec<(Duration, Vec<Option<u64>>)>,
}

impl CpuWatch {
    fn sample(&mut self, since_t0: Duration) {
        let ticks = self.pids.iter().map(|(_, p)| cpu_ticks(*p)).collect();
        self.samples.push((since_t0, ticks));
    }

    /// Percent of one core used by process `i` between the samples nearest `from` and `to`.
    fn percent(&self, i: usize, from: Duration, to: Duration) -> Option<f64> {
        let at = |t: Duration| {
            self.samples
                .iter()
                .min_by_key(|(s, _)| s.abs_diff(t))
                .and_then(|(s, v)| Some((*s, v.get(i).copied().flatten()?)))
        };
        let ((t1, a), (t2, b)) = (at(from)?, at(to)?);
        let wall = t2.checked_sub(t1)?.as_secs_f64();
        (wall > 0.0).then(|| 100.0 * b.saturating_sub(a) as f64 / self.hz / wall)
    }

    fn peak_second(&self, i: usize) -> Option<f64> {
        self.samples
            .windows(2)
            .filter_map(|w| {
                let (a, b) = (
                    w[0].1.get(i).copied().flatten()?,
                    w[1].1.get(i).copied().flatten()?,
                );
                let wall = w[1].0.checked_sub(w[0].0)?.as_secs_f64();
                (wall >= 0.5).then(|| 100.0 * b.saturating_sub(a) as f64 / self.hz / wall)
            })
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
    }

    fn cpu(&self, i: usize, fill: Option<Duration>, end: Duration) -> Cpu {
        Cpu {
            fill: fill.and_then(|f| self.percent(i, Duration::ZERO, f)),
            run: self.percent(i, Duration::ZERO, end),
            peak_second: self.peak_second(i),
        }
    }
}

/// One allocation's life as the Macs saw it.
struct Held {
    mac: usize,
    queue: String,
    admitted: Instant,
    /// When the reconcile pass that admitted it ran (its clock), since t0.
    pass: Option<Duration>,
    ended: Option<(Instant, AllocationPhase)>,
}

/// Run the benchmark: start the cluster, submit, join, drain, measure, stop.
pub async fn run(setup: RaftSetup) -> anyhow::Result<RaftResults> {
    let tmp = tempfile::Builder::new()
        .prefix("tb-scheduler-raft-")
        .tempdir_in(&setup.dir)
        .with_context(|| format!("making a temporary dir under {}", setup.dir.display()))?;
    let dir = tmp.path().to_path_buf();
    eprintln!("scheduler-bench --raft: working in {}", dir.display());
    let load_before = crate::machine::load_average();
    let creds = Credentials::create(&setup.controller, &dir).await?;
    let (mut cluster, addrs) = start_cluster(&setup, &dir, &creds)?;
    let mut outcome = drive(&setup, &mut cluster, &addrs, &creds).await;
    cluster.stop().await;
    if let Ok(r) = &mut outcome {
        r.load = (load_before, crate::machine::load_average());
    }
    if setup.keep {
        let kept = tmp.keep();
        eprintln!("kept {}", kept.display());
    }
    outcome
}

async fn drive(
    setup: &RaftSetup,
    cluster: &mut Cluster<TlsTb>,
    addrs: &[String],
    creds: &Credentials,
) -> anyhow::Result<RaftResults> {
    let wall = Instant::now();
    let date = chrono::Utc::now()
        .format("%Y-%m-%d %H:%M:%S UTC")
        .to_string();
    let leader = cluster
        .wait_healthy(STARTUP, 5)
        .await
        .context("the 3-member cluster did not become healthy")?;
    let tb = cluster.backend.clone();
    eprintln!("cluster healthy; leader tb-{}", leader + 1);

    // The backlog, before any Mac exists.
    let submit_start = Instant::now();
    let runs = Arc::new(submit(&tb, leader, setup).await?);
    let submit_time = submit_start.elapsed();
    let submitted = runs.len();
    eprintln!("submitted {submitted} jobs in {submit_time:.2?}");

    let token = retry("Nodes/CreateToken", || {
        let mut c = tb.nodes[leader].clone();
        async move {
            c.create_token(CreateTokenRequest {
                ttl_seconds: 3600,
                description: "scheduler-bench".into(),
            })
            .await
        }
    })
    .await?
    .into_inner()
    .token;

    // Join every Mac (not Ready yet) and open its watch.
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let join_start = Instant::now();
    let macs = futures::future::join_all((0..setup.macs).map(|i| {
        let member = if setup.macs_on_leader {
            leader
        } else {
            i % addrs.len()
        };
        join(
            i,
            setup,
            &addrs[member],
            &creds.ca_pem,
            &token,
            runs.clone(),
            events_tx.clone(),
        )
    }))
    .await
    .into_iter()
    .collect::<anyhow::Result<Vec<_>>>()?;
    let join_time = join_start.elapsed();
    let streams = futures::future::join_all(macs.iter().map(|m| m.watch(0)))
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?;
    eprintln!(
        "{} Macs joined in {join_time:.2?}; watches open",
        macs.len()
    );
    drop(events_tx);

    // The clock starts: every Mac says it is Ready.
    let leader_pid = cluster.members[leader]
        .pid()
        .context("the leader is not running")?;
    let mut cpu = CpuWatch {
        pids: cluster
            .members
            .iter()
            .map(|m| (m.name.clone(), m.pid().unwrap_or(0)))
            .chain(std::iter::once(("bench".into(), std::process::id())))
            .collect(),
        hz: crate::procstat::clock_ticks_per_second()? as f64,
        samples: Vec::new(),
    };
    let mut tasks = tokio::task::JoinSet::new();
    for (mac, stream) in macs.iter().zip(streams) {
        tasks.spawn(mac.clone().follow(stream));
    }
    let t0 = Instant::now();
    let t0_wall = chrono::Utc::now();
    cpu.sample(Duration::ZERO);
    let intervals = futures::future::join_all(macs.iter().map(|m| m.heartbeat()))
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?;
    let ready_time = t0.elapsed();
    let beats = setup.time_limit.as_secs() / HEARTBEAT.as_secs().max(1) + 10;
    for (mac, interval) in macs.iter().zip(intervals) {
        tasks.spawn(mac.clone().heartbeats(interval, beats));
    }
    eprintln!("all Macs Ready {ready_time:.2?} after t0");

    // Record until every job has succeeded, or the time is up.
    let deadline = tokio::time::Instant::from(wall + setup.time_limit);
    let mut held: Vec<Held> = Vec::new();
    let mut open: HashMap<(usize, String), usize> = HashMap::new();
    let mut completed = 0usize;
    let mut problems: Vec<String> = Vec::new();
    let mut problem_count = 0usize;
    let mut aborted = None;
    let mut fill_at: Option<Duration> = None;
    let fill_target = setup.slots().min(submitted);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_print = Instant::now();
    let mut last_progress = Instant::now();
    while completed < submitted {
        tokio::select! {
            ev = events.recv() => match ev {
                Some(Ev::Admitted { mac, job, at, created }) => {
                    last_progress = at;
                    open.insert((mac, job.clone()), held.len());
                    let pass = chrono::DateTime::parse_from_rfc3339(&created)
                        .ok()
                        .and_then(|c| (c.with_timezone(&chrono::Utc) - t0_wall).to_std().ok());
                    held.push(Held { mac, queue: queue_of(&job).to_string(), admitted: at, pass, ended: None });
                    if held.len() == fill_target && fill_at.is_none() {
                        fill_at = Some(at.saturating_duration_since(t0));
                        cpu.sample(at.saturating_duration_since(t0));
                        eprintln!("initial fill: {fill_target} admissions {:.2?} after t0", at - t0);
                    }
                }
                Some(Ev::Ended { mac, job, admitted, at, phase, acknowledged }) => {
                    last_progress = at;
                    if let Some(i) = open.remove(&(mac, job.clone())) {
                        held[i].ended = Some((at, phase));
                    } else {
                        held.push(Held { mac, queue: queue_of(&job).to_string(), admitted, pass: None, ended: Some((at, phase)) });
                    }
                    if phase == AllocationPhase::Succeeded && acknowledged {
                        completed += 1;
                    }
                }
                Some(Ev::Problem(p)) => {
                    problem_count += 1;
                    if problems.len() < 5 {
                        eprintln!("problem: {p}");
                        problems.push(p);
                    }
                }
                None => {
                    aborted = Some("every simulated Mac stopped".to_string());
                    break;
                }
            },
            _ = tick.tick() => {
                cpu.sample(t0.elapsed());
                if let Some(why) = cluster.members.iter_mut().find_map(Member::exited) {
                    aborted = Some(why);
                    break;
                }
                if last_progress.elapsed() >= STALL {
                    aborted = Some(format!(
                        "stalled: no admission and no job end for {STALL:?}, {} of {submitted} jobs admitted, {completed} done",
                        held.len()
                    ));
                    break;
                }
                if last_print.elapsed() >= Duration::from_secs(5) {
                    last_print = Instant::now();
                    let running = held.iter().filter(|h| h.ended.is_none()).count();
                    let leader_cpu = cpu.samples.len().checked_sub(6).and_then(|i| {
                        cpu.percent(leader, cpu.samples[i].0, cpu.samples[cpu.samples.len() - 1].0)
                    });
                    eprintln!(
                        "t={:>5.1}s admitted={} running={running} succeeded={completed} leader CPU (5 s)={}",
                        t0.elapsed().as_secs_f64(),
                        held.len(),
                        leader_cpu.map_or("?".into(), |c| format!("{c:.0} %")),
                    );
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                aborted = Some(format!(
                    "time limit of {:?} reached with {completed} of {submitted} jobs done",
                    setup.time_limit
                ));
                break;
            }
        }
    }
    let end = t0.elapsed();
    cpu.sample(end);
    tasks.abort_all();
    let leader_memory = cluster.members[leader].memory().ok();
    let mut notes = Vec::new();
    if problem_count > 0 {
        notes.push(format!(
            "{problem_count} problems reported by the simulated Macs, first: {}",
            problems.join(" | ")
        ));
    }
    notes.extend(server_notes(cluster, leader).await);
    let members_of_macs: Vec<String> = (0..setup.macs)
        .map(|i| {
            let m = if setup.macs_on_leader {
                leader
            } else {
                i % addrs.len()
            };
            cluster.members[m].name.clone()
        })
        .collect();
    match state_summary(&tb, leader, &members_of_macs).await {
        Ok(summary) => notes.push(summary),
        Err(e) => notes.push(format!("the state at the end could not be listed: {e:#}")),
    }
    let still_leader = cluster.probe_all().await.get(leader).and_then(|p| {
        p.as_ref()
            .and_then(|r| r.as_ref().ok())
            .map(|p| p.is_leader)
    });
    if still_leader != Some(true) {
        notes.push(format!(
            "tb-{} was not the leader at the end: leadership changed during the run",
            leader + 1
        ));
    }
    if cpu.pids.get(leader).map(|p| p.1) != Some(leader_pid) {
        notes.push("the leader's pid changed".into());
    }

    Ok(measure(
        setup,
        Measured {
            held,
            t0,
            end,
            fill_at,
            fill_target,
            completed,
            submitted,
            submit_time,
            join_time,
            ready_time,
            date,
            aborted,
            cpu,
            leader,
            leader_memory,
            notes,
            wall: wall.elapsed(),
        },
    ))
}

/// Everything `drive` collected, to be turned into results.
struct Measured {
    held: Vec<Held>,
    t0: Instant,
    end: Duration,
    fill_at: Option<Duration>,
    fill_target: usize,
    completed: usize,
    submitted: usize,
    submit_time: Duration,
    join_time: Duration,
    ready_time: Duration,
    date: String,
    aborted: Option<String>,
    cpu: CpuWatch,
    leader: usize,
    leader_memory: Option<Memory>,
    notes: Vec<String>,
    wall: Duration,
}

fn measure(setup: &RaftSetup, m: Measured) -> RaftResults {
    let t0 = m.t0;
    let since = |i: Instant| i.saturating_duration_since(t0);
    let mut admissions: Vec<Duration> = m.held.iter().map(|h| since(h.admitted)).collect();
    admissions.sort_unstable();

    // Capacity freed → next admission, per Mac: admission j needs slot-free j − slots.
    let per_mac = setup.slots_per_mac();
    let mut free_to_admit = Vec::new();
    let mut free_to_pass = Vec::new();
    let mut early = 0;
    for mac in 0..setup.macs {
        let mut adm: Vec<(Instant, Option<Duration>)> = m
            .held
            .iter()
            .filter(|h| h.mac == mac)
            .map(|h| (h.admitted, h.pass))
            .collect();
        let mut frees: Vec<Instant> = m
            .held
            .iter()
            .filter(|h| h.mac == mac)
            .filter_map(|h| h.ended.map(|e| e.0))
            .collect();
        adm.sort_unstable();
        frees.sort_unstable();
        for (j, (a, pass)) in adm.iter().enumerate().skip(per_mac) {
            let Some(f) = frees.get(j - per_mac) else {
                break;
            };
            if a < f {
                early += 1;
            }
            free_to_admit.push(a.saturating_duration_since(*f));
            if let Some(pass) = pass {
                free_to_pass.push(pass.saturating_sub(since(*f)));
            }
        }
    }

    // The contended window: t0 until the first queue has no job left to admit.
    let queues: Vec<String> = (0..setup.weights.len()).map(|i| format!("q{i}")).collect();
    let per_queue = setup.jobs / queues.len().max(1);
    let mut changes: Vec<(Instant, &str, i64)> = Vec::new();
    for h in &m.held {
        changes.push((h.admitted, &h.queue, 1));
        if let Some((at, AllocationPhase::Stopped)) = h.ended {
            changes.push((at, &h.queue, -1));
        }
    }
    changes.sort_by_key(|c| c.0);
    let mut count: HashMap<&str, i64> = HashMap::new();
    let mut window_end = t0 + m.end;
    for (at, q, d) in changes {
        let n = count.entry(q).or_default();
        *n += d;
        if *n >= per_queue as i64 {
            window_end = at;
            break;
        }
    }
    let contended = window_end.saturating_duration_since(t0);
    let mut window: HashMap<&str, f64> = HashMap::new();
    let bytes = (setup.job_memory_gi * GI) as f64;
    let run_end = t0 + m.end;
    for h in &m.held {
        let from = h.admitted.max(t0);
        let to = h.ended.map_or(run_end, |e| e.0).min(window_end);
        if to > from {
            *window.entry(&h.queue).or_default() += bytes * (to - from).as_secs_f64();
        }
    }
    let shares: Vec<(String, u32, f64)> = queues
        .iter()
        .zip(&setup.weights)
        .map(|(q, w)| {
            (
                q.clone(),
                *w,
                window.get(q.as_str()).copied().unwrap_or(0.0),
            )
        })
        .collect();
    let held_total: f64 = shares.iter().map(|s| s.2).sum();
    let capacity = (setup.macs as u64 * setup.mac_memory_gi * GI) as f64;
    let utilization = held_total / (capacity * contended.as_secs_f64()).max(1e-9);

    let finish = m
        .held
        .iter()
        .filter_map(|h| h.ended.map(|e| since(e.0)))
        .max()
        .filter(|_| m.completed == m.submitted);
    let total_run: Duration = (0..m.submitted as u64)
        .map(|n| run_time(n, setup.run_ms))
        .sum();
    let ideal_finish = total_run / setup.slots().max(1) as u32;

    let passes = pass_stats(&m.held, t0, m.fill_at, free_to_pass, setup.slots());
    let names: Vec<String> = m.cpu.pids.iter().map(|p| p.0.clone()).collect();
    let bench_index = names.len() - 1;
    RaftResults {
        setup: setup.clone(),
        controller: crate::binaries::describe("tb-controller", &setup.controller),
        date: m.date,
        aborted: m.aborted,
        submitted: m.submitted,
        submit_time: m.submit_time,
        join_time: m.join_time,
        ready_time: m.ready_time,
        fill: m.fill_target,
        fill_time: m.fill_at,
        completed: m.completed,
        finish,
        ideal_finish,
        free_to_admit: Latencies::new(free_to_admit),
        early_admissions: early,
        stopped: m
            .held
            .iter()
            .filter(|h| matches!(h.ended, Some((_, AllocationPhase::Stopped))))
            .count(),
        admissions,
        shares,
        contended,
        utilization,
        leader: names[m.leader].clone(),
        leader_cpu: m.cpu.cpu(m.leader, m.fill_at, m.end),
        followers_cpu: (0..bench_index)
            .filter(|i| *i != m.leader)
            .map(|i| (names[i].clone(), m.cpu.cpu(i, m.fill_at, m.end)))
            .collect(),
        bench_cpu: m.cpu.cpu(bench_index, m.fill_at, m.end),
        leader_memory: m.leader_memory,
        notes: m.notes,
        wall: m.wall,
        load: Default::default(),
        passes,
    }
}

/// The reconcile passes as the allocations' creationTimestamps show them.
#[derive(Debug, Clone, Default)]
pub struct Passes {
    /// Passes that admitted something, in all and up to the initial fill.
    pub admitting: usize,
    pub admitting_in_fill: usize,
    /// Admissions per admitting pass, median and most.
    pub per_pass_median: usize,
    pub per_pass_max: usize,
    /// Time between consecutive admitting passes (their clocks) during the fill.
    pub fill_gaps: Vec<Duration>,
    /// A pass's clock → the allocation seen by its Mac's watch (the pass's own compute after
    /// reading the clock, the Raft commit, replication to the Mac's member, the watch).
    pub pass_to_seen: Latencies,
    /// Freeing status write answered → the clock of the pass that refilled the slot.
    pub free_to_pass: Latencies,
    /// Admissions seen in each second after t0, the first 10.
    pub fill_timeline: Vec<usize>,
    /// t0 → the allocation that filled half, 90 % and all of the slots, seen.
    pub fill_milestones: Vec<(usize, Option<Duration>)>,
}

fn pass_stats(
    held: &[Held],
    t0: Instant,
    fill_at: Option<Duration>,
    free_to_pass: Vec<Duration>,
    slots: usize,
) -> Passes {
    let mut seen: Vec<Duration> = held
        .iter()
        .map(|h| h.admitted.saturating_duration_since(t0))
        .collect();
    seen.sort_unstable();
    let fill_milestones = [slots / 2, slots * 9 / 10, slots]
        .into_iter()
        .map(|n| (n, n.checked_sub(1).and_then(|i| seen.get(i).copied())))
        .collect();
    let mut by_pass: BTreeMap<Duration, usize> = BTreeMap::new();
    let mut pass_to_seen = Vec::new();
    let mut timeline = vec![0usize; 10];
    for h in held {
        let seen = h.admitted.saturating_duration_since(t0);
        if let Some(slot) = timeline.get_mut(seen.as_secs() as usize) {
            *slot += 1;
        }
        if let Some(p) = h.pass {
            *by_pass.entry(p).or_default() += 1;
            pass_to_seen.push(seen.saturating_sub(p));
        }
    }
    let mut counts: Vec<usize> = by_pass.values().copied().collect();
    counts.sort_unstable();
    let fill_end = fill_at.unwrap_or(Duration::MAX);
    let fill_passes: Vec<Duration> = by_pass.keys().copied().filter(|p| *p <= fill_end).collect();
    Passes {
        admitting: by_pass.len(),
        admitting_in_fill: fill_passes.len(),
        per_pass_median: counts.get(counts.len() / 2).copied().unwrap_or(0),
        per_pass_max: counts.last().copied().unwrap_or(0),
        fill_gaps: fill_passes.windows(2).map(|w| w[1] - w[0]).collect(),
        pass_to_seen: Latencies::new(pass_to_seen),
        free_to_pass: Latencies::new(free_to_pass),
        fill_timeline: timeline,
        fill_milestones,
    }
}

/// What the store holds at the end: jobs by phase (with the reasons of those not done),
/// allocations by phase, Nodes Ready — so a run that stalls says where.
async fn state_summary(
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
async fn server_notes(cluster: &Cluster<TlsTb>, leader: usize) -> Vec<String> {
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

// ---------------------------------------------------------------------------------------------
// The report.

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

fn pct(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.0} %"))
}

/// The markdown table.
pub fn report(r: &RaftResults) -> String {
    let s = &r.setup;
    let yes = |b: bool| if b { "yes" } else { "no" };
    let mut out = String::new();
    out.push_str(&format!(
        "### scheduler-bench --raft: through the real controller (3 members, Raft, TLS)\n\n\
         - date: {}\n- machine: {} CPUs ({}), load average (1/5/15 min) before {}, after {}\n- {}\n\
         - workload: {} simulated Macs × {} Gi, {} jobs × {} Gi from {} queues (weights {:?}), \
         run {}–{} s real time, {} slots\n\
         - submitted in {:.2} s ({} jobs per Objects.Apply); {} Macs joined in {:.2} s; \
         their first Ready heartbeats acknowledged {} ms after t0; each Mac keeps one TLS connection to {}\n",
        r.date,
        crate::machine::Machine::describe().nproc,
        crate::machine::Machine::describe().cpu_model,
        r.load.0,
        r.load.1,
        r.controller,
        s.macs,
        s.mac_memory_gi,
        s.jobs,
        s.job_memory_gi,
        s.weights.len(),
        s.weights,
        s.run_ms.0 as f64 / 1000.0,
        s.run_ms.1 as f64 / 1000.0,
        s.slots(),
        r.submit_time.as_secs_f64(),
        s.apply_batch,
        s.macs,
        r.join_time.as_secs_f64(),
        ms(r.ready_time),
        if s.macs_on_leader {
            "the leader"
        } else {
            "controller (i mod 3) + 1"
        },
    ));
    if let Some(why) = &r.aborted {
        out.push_str(&format!("- **stopped early: {why}** (partial results)\n"));
    }
    out.push_str("\n| metric | value | target | met |\n|---|--:|---|---|\n");
    match (r.fill_per_second(), r.fill_time) {
        (Some(rate), Some(t)) => out.push_str(&format!(
            "| initial fill: {} admissions from a {}-job backlog, t0 → {}th allocation seen (admissions/s) | {rate:.0} ({:.2} s) | ≥ 1,000 | {} |\n",
            r.fill,
            r.submitted,
            r.fill,
            t.as_secs_f64(),
            yes(rate >= 1000.0)
        )),
        _ => out.push_str(&format!(
            "| initial fill: {} admissions (admissions/s) | not reached ({} admitted) | ≥ 1,000 | no |\n",
            r.fill,
            r.admissions.len()
        )),
    }
    if let Some(rate) = r.drain_per_second() {
        out.push_str(&format!(
            "| whole drain: {} admissions, t0 → last admission (admissions/s; capacity-bound, ideal {:.0}/s) | {rate:.0} | ≥ 90 % of ideal | {} |\n",
            r.admissions.len(),
            r.ideal_drain_per_second(),
            yes(rate >= 0.9 * r.ideal_drain_per_second())
        ));
    }
    out.push_str(&format!(
        "| all {} jobs Succeeded, t0 → last (s; ideal: total run time ÷ slots = {:.1} s) | {} | | |\n",
        r.submitted,
        r.ideal_finish.as_secs_f64(),
        r.finish
            .map_or(format!("{} done", r.completed), |f| format!("{:.1}", f.as_secs_f64()))
    ));
    let q = |p: f64| r.free_to_admit.quantile(p).map_or("–".into(), ms);
    out.push_str(&format!(
        "| capacity freed → next admission on that Mac, p50 (ms; {} pairs) | {} | | |\n",
        r.free_to_admit.len(),
        q(0.5)
    ));
    out.push_str(&format!(
        "| capacity freed → next admission on that Mac, p99 (ms) | {} | | |\n",
        q(0.99)
    ));
    let err = r.fairness_error() * 100.0;
    out.push_str(&format!(
        "| fairness error, worst queue, memory·time over the {:.1} s every queue had a backlog (%) | {err:.1} | ≤ 5 % | {} |\n",
        r.contended.as_secs_f64(),
        yes(err <= 5.0)
    ));
    out.push_str(&format!(
        "| slots held over that window (memory·time ÷ capacity·time) | {:.1} % | | |\n",
        r.utilization * 100.0
    ));
    out.push_str(&format!(
        "| leader ({}) CPU, fill / whole run / busiest second (% of one core) | {} / {} / {} | | |\n",
        r.leader,
        pct(r.leader_cpu.fill),
        pct(r.leader_cpu.run),
        pct(r.leader_cpu.peak_second)
    ));
    if let Some(mem) = r.leader_memory {
        out.push_str(&format!(
            "| leader RSS at the end / peak (MB) | {:.1} / {:.1} | | |\n",
            mem.rss as f64 / 1e6,
            mem.peak as f64 / 1e6
        ));
    }
    out.push_str("\n| queue | weight | wanted | got |\n|---|--:|--:|--:|\n");
    let total: f64 = r.shares.iter().map(|x| x.2).sum();
    let weights: f64 = r.shares.iter().map(|x| f64::from(x.1)).sum();
    for (q, w, used) in &r.shares {
        out.push_str(&format!(
            "| {q} | {w} | {:.1} % | {:.1} % |\n",
            100.0 * f64::from(*w) / weights,
            100.0 * used / total.max(1e-9)
        ));
    }
    out.push_str("\nDetails:\n");
    for (name, c) in &r.followers_cpu {
        out.push_str(&format!(
            "- {name} (follower) CPU fill / run / busiest second: {} / {} / {}\n",
            pct(c.fill),
            pct(c.run),
            pct(c.peak_second)
        ));
    }
    out.push_str(&format!(
        "- the bench process itself (64 simulated Macs) CPU fill / run / busiest second: {} / {} / {}\n",
        pct(r.bench_cpu.fill),
        pct(r.bench_cpu.run),
        pct(r.bench_cpu.peak_second)
    ));
    let p = &r.passes;
    let q2 = |l: &Latencies, x: f64| l.quantile(x).map_or("–".into(), ms);
    out.push_str(&format!(
        "- reconcile passes that admitted (grouped by the allocations' creationTimestamp, the pass's clock): {} in all, {} up to the initial fill; admissions per pass median {}, most {}\n",
        p.admitting, p.admitting_in_fill, p.per_pass_median, p.per_pass_max
    ));
    out.push_str(&format!(
        "- gaps between admitting passes during the fill (ms): {}\n",
        p.fill_gaps
            .iter()
            .map(|g| ms(*g))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    out.push_str(&format!(
        "- admissions seen per second after t0 (first 10 s): {:?}; t0 → {}\n",
        p.fill_timeline,
        p.fill_milestones
            .iter()
            .map(|(n, t)| format!(
                "{n}th admission {}",
                t.map_or("–".into(), |t| format!("{:.2} s", t.as_secs_f64()))
            ))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    out.push_str(&format!(
        "- pass clock → allocation seen by its Mac (pass compute + Raft commit + watch), p50 / p99 (ms): {} / {}\n",
        q2(&p.pass_to_seen, 0.5),
        q2(&p.pass_to_seen, 0.99)
    ));
    out.push_str(&format!(
        "- capacity freed (write answered) → clock of the pass that refilled it, p50 / p99 (ms): {} / {}\n",
        q2(&p.free_to_pass, 0.5),
        q2(&p.free_to_pass, 0.99)
    ));
    if r.early_admissions > 0 {
        out.push_str(&format!(
            "- {} admissions were seen before the freeing status write's answer (counted as 0 ms)\n",
            r.early_admissions
        ));
    }
    if r.stopped > 0 {
        out.push_str(&format!(
            "- {} allocations were stopped (preempted) before their run time\n",
            r.stopped
        ));
    }
    for n in &r.notes {
        out.push_str(&format!("- {n}\n"));
    }
    out.push_str(&format!(
        "- whole bench wall time (cluster up → report): {:.1} s\n",
        r.wall.as_secs_f64()
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_times_are_deterministic_and_in_range() {
        for n in 0..1000 {
            let t = run_time(n, (2000, 10_000));
            assert!(t >= Duration::from_secs(2) && t <= Duration::from_secs(10));
            assert_eq!(t, run_time(n, (2000, 10_000)));
        }
        assert_eq!(queue_of("q3-17"), "q3");
    }
}
