//! The simulated nodelets: each Mac joins with the join token, heartbeats its Node status,
//! watches its Allocations and writes their statuses (Running, then Succeeded after the job's
//! run time, or Stopped), telling the recorder what it saw as `Ev`s.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use tb_api::proto::nodes_client::NodesClient;
use tb_api::proto::objects_client::ObjectsClient;
use tb_api::proto::{HeartbeatRequest, JoinRequest, UpdateStatusRequest, WatchEvent, WatchRequest};
use tb_api::specs::allocation::LABEL_NODE;
use tb_api::specs::{AllocationPhase, AllocationSpec, AllocationStatus, Desired, parse_spec};
use tb_api::status::{NodeCapacity, NodeStatus, PortRange, set_condition};
use tb_api::{Kind, Object, ObjectMeta};
use tokio::sync::{mpsc, oneshot};
use tonic::Streaming;

use super::cluster::{Authed, Bearer, retry, retryable, tls_channel};
use super::{ATTEMPTS, GI, HEARTBEAT, RPC_TIMEOUT, RaftSetup, WATCH_RECONNECTS};

/// What the Macs tell the recorder.
pub(super) enum Ev {
    Admitted {
        mac: usize,
        job: String,
        at: Instant,
        /// The allocation's creationTimestamp: the clock of the reconcile pass that made it
        /// (every plan of a pass carries the same one).
        created: Option<tb_api::Timestamp>,
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
pub(super) struct Mac {
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

fn now_stamp() -> tb_api::Timestamp {
    tb_api::Timestamp::now()
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
pub(super) async fn join(
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
        protocol_version: Some(tb_api::version::PROTOCOL),
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
    pub(super) async fn heartbeat(&self) -> anyhow::Result<Duration> {
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
            protocol_version: Some(tb_api::version::PROTOCOL),
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
    pub(super) async fn heartbeats(self: Arc<Self>, mut interval: Duration, beats: u64) {
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
    pub(super) async fn watch(&self, from: u64) -> anyhow::Result<Streaming<WatchEvent>> {
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
    pub(super) async fn follow(self: Arc<Self>, mut stream: Streaming<WatchEvent>) {
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
            started_at: Some(started_at.clone()),
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
            started_at: Some(started_at),
            finished_at: Some(now_stamp()),
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
