//! Heartbeats: every interval the nodelet reads its capacity afresh and reports its Node status
//! (capacity, free and allocated memory, the allocations it runs, its ports and probe port, its
//! conditions). With a topology file that gives this Mac's memory, the capacity reported is the
//! file's (see [`crate::topology`]).

use std::sync::Arc;
use std::time::Duration;

use std::net::IpAddr;

use tb_api::proto::HeartbeatRequest;
use tb_api::status::{NodeCapacity, NodeStatus, PortRange, PortStatus, set_condition};

use super::controllers::Controllers;
use super::identity::Credential;
use super::supervisor::{Supervisor, now};
use crate::capacity::{self, MemoryPressure};
use crate::discovery::Discovery;
use crate::probe::server::ProbeServer;
use crate::topology::Topology;

/// What the heartbeat needs to know about this nodelet.
pub struct NodeInfo {
    pub address: String,
    pub port_range: PortRange,
    pub reserve_bytes: Option<u64>,
    /// The topology file, when one was given: its capacity for this Mac replaces the measured.
    pub topology: Option<Arc<Topology>>,
    /// The `JobIsolation` condition: (status, reason, message).
    pub isolation: (bool, &'static str, String),
    /// The built-in engine's measured decode speed, once measured.
    pub engine: super::engine_figures::Shared,
}

/// The Node's ports and link-probe server, kept current by [`Links::refresh`].
pub struct Links {
    pub discovery: Arc<Discovery>,
    pub probe_server: Arc<ProbeServer>,
    /// This Mac's own address: the probe server listens there too (model staging).
    pub node_ip: Option<IpAddr>,
}

impl Links {
    /// The ports now (re-discovered when stale), with the probe server listening on their
    /// addresses; returns them and the probe port.
    pub async fn refresh(&self) -> (Vec<PortStatus>, u16) {
        let ports = self.discovery.ports().await;
        let mut addresses: Vec<IpAddr> = ports
            .iter()
            .filter_map(|p| p.address.as_deref()?.parse().ok())
            .collect();
        addresses.extend(self.node_ip.filter(|ip| !ip.is_unspecified()));
        self.probe_server.serve_on(&addresses).await;
        (ports, self.probe_server.port())
    }
}

/// The status a node joins with: what it observes, but not Ready. Its first heartbeat, sent
/// once its credential is saved, makes it Ready — so nothing is placed on a node that, killed
/// right after joining, could not start again (its token spent, no credential kept).
pub fn joining(observed: &NodeStatus) -> NodeStatus {
    let mut status = observed.clone();
    set_condition(
        &mut status.conditions,
        "Ready",
        false,
        "Joining",
        "joined; Ready at its first heartbeat",
        &now(),
    );
    status
}

/// The Node status as this nodelet sees it now, with the given ports and probe port.
pub fn observe(
    info: &NodeInfo,
    supervisor: Option<&Supervisor>,
    ports: Vec<PortStatus>,
    probe_port: u16,
) -> NodeStatus {
    let cap = match info.reserve_bytes {
        Some(r) => capacity::read(r),
        None => capacity::read_with_default_reserve(),
    };
    let stamp = now();
    let mut status = NodeStatus {
        address: info.address.clone(),
        port_range: info.port_range,
        nodelet_version: env!("CARGO_PKG_VERSION").into(),
        ports,
        probe_port,
        ..Default::default()
    };
    if let Some(s) = supervisor {
        let usage = s.usage();
        status.allocated_bytes = usage.allocated_bytes;
        status.allocations = usage.allocations;
        status.job_disk_bytes = usage.job_disk_bytes;
    }
    if let Some(root) = crate::staging::copies::root() {
        status.models = crate::staging::copies::held(root);
    }
    let (isolated, reason, message) = &info.isolation;
    set_condition(
        &mut status.conditions,
        super::accounts::CONDITION,
        *isolated,
        reason,
        message,
        &stamp,
    );
    let measured = cap.as_ref().ok().map(|c| {
        (
            NodeCapacity {
                memory: tb_api::Quantity::from_bytes(c.memory_bytes).to_string(),
                memory_bytes: c.memory_bytes,
                allocatable_bytes: c.allocatable_bytes,
                memory_bandwidth_gbps: tb_api::chips::memory_bandwidth_gbps(&c.chip, c.gpu_cores),
                chip: c.chip.clone(),
                cpu_cores: c.cpu_cores,
                gpu_cores: c.gpu_cores,
                hardware_model: c.hardware_model.clone().unwrap_or_default(),
                os: c.os.clone(),
                engine: None,
            },
            c.free_bytes,
        )
    });
    let described = info
        .topology
        .as_ref()
        .and_then(|t| t.capacity(measured.as_ref().map(|(c, _)| c)));
    // A Mac described by a file is planned as described; this machine's engine is not its.
    let measured = measured.map(|(mut c, free)| {
        c.engine = info.engine.get().cloned();
        (c, free)
    });
    match described.or(measured) {
        Some((capacity, free_bytes)) => {
            status.capacity = capacity;
            status.free_bytes = free_bytes;
            set_condition(
                &mut status.conditions,
                "Ready",
                true,
                "NodeletReady",
                "",
                &stamp,
            );
        }
        None => {
            let message = match &cap {
                Err(e) => e.to_string(),
                Ok(_) => String::new(),
            };
            set_condition(
                &mut status.conditions,
                "Ready",
                false,
                "CapacityUnknown",
                &message,
                &stamp,
            );
        }
    }
    if let Ok(c) = &cap {
        let pressed = !matches!(c.memory_pressure, MemoryPressure::Normal);
        set_condition(
            &mut status.conditions,
            "MemoryPressure",
            pressed,
            if pressed {
                "MemoryPressure"
            } else {
                "NoPressure"
            },
            &format!("{:?}", c.memory_pressure),
            &stamp,
        );
    }
    let devices: Vec<&str> = status
        .ports
        .iter()
        .filter_map(|p| p.rdma_device.as_deref())
        .collect();
    let (rdma, reason, message) = if devices.is_empty() {
        (false, "NotDetected", "no RDMA device found".to_string())
    } else {
        (true, "DevicesFound", devices.join(", "))
    };
    set_condition(
        &mut status.conditions,
        "RDMAEnabled",
        rdma,
        reason,
        &message,
        &stamp,
    );
    status
}

/// Heartbeat until the process ends.
pub async fn run(
    controllers: Arc<Controllers>,
    credential: Credential,
    info: NodeInfo,
    links: Links,
    supervisor: Arc<Supervisor>,
    mut interval: Duration,
    protocol_version: u32,
) {
    // One client for the life of the nodelet: it keeps its connection to the controller that
    // answered last. A beat may take at most one interval, so a slow round never stacks up.
    let mut client = controllers.client_for(interval.max(MIN_BEAT_BUDGET));
    loop {
        let (ports, probe_port) = links.refresh().await;
        let status = observe(&info, Some(&supervisor), ports, probe_port);
        let req = HeartbeatRequest {
            node: credential.node.clone(),
            credential: credential.credential.clone(),
            status_json: status.to_value().to_string(),
            protocol_version: Some(protocol_version),
        };
        let sent_at = std::time::Instant::now();
        match client.heartbeat(req).await {
            Ok(reply) => {
                controllers.remember(&client);
                supervisor.lease().renewed(sent_at, reply.node_grace_ms);
                let ms = reply.heartbeat_interval_ms;
                // The controller's pace wins when it asks for more frequent beats.
                if ms > 0 {
                    interval = interval.min(Duration::from_millis(ms));
                }
            }
            Err(e) if e.is_unanswered() => {
                tracing::debug!("heartbeat not delivered: {e}");
            }
            // A controller that no longer serves this nodelet's version says what to upgrade.
            Err(e) if e.code == tonic::Code::FailedPrecondition => {
                tracing::error!("heartbeat refused: {e}")
            }
            Err(e) => tracing::warn!("heartbeat refused: {e}"),
        }
        tokio::time::sleep(interval).await;
    }
}

/// The least time one heartbeat gets, retries included.
const MIN_BEAT_BUDGET: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use tb_api::lab::LabFile;

    fn condition<'a>(status: &'a NodeStatus, type_: &str) -> Option<&'a str> {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| c.status.as_str())
    }

    #[test]
    fn a_topology_file_states_capacity_and_ports() {
        let lab = LabFile::parse(
            "lab.yaml",
            "macs: [{name: m, chip: Apple M4 Pro, memory: 64Gi, free: 30Gi,\n\
             ports: [{name: tb1, address: 127.0.0.1, rdmaDevice: rdma_en2}]}]\n",
        )
        .expect("valid lab");
        let topology = Arc::new(Topology::new(Path::new("lab.yaml"), lab, "m").expect("listed"));
        let info = NodeInfo {
            address: "127.0.0.1:7600".into(),
            port_range: PortRange { start: 1, end: 2 },
            reserve_bytes: None,
            topology: Some(topology.clone()),
            isolation: (false, "SingleUser", String::new()),
            engine: Default::default(),
        };
        let status = observe(&info, None, topology.ports(), 7700);
        assert_eq!(status.capacity.memory, "64Gi");
        assert_eq!(status.capacity.memory_bytes, 64 << 30);
        assert_eq!(status.capacity.allocatable_bytes, 56 << 30);
        assert_eq!(status.free_bytes, 30 << 30);
        assert_eq!(status.capacity.chip, "Apple M4 Pro");
        assert_eq!(status.probe_port, 7700);
        assert_eq!(status.ports.len(), 1);
        assert_eq!(status.ports[0].uuid, "m/tb1");
        assert_eq!(condition(&status, "Ready"), Some("True"));
        assert_eq!(condition(&status, "RDMAEnabled"), Some("True"));
        assert_eq!(condition(&status, "JobIsolation"), Some("False"));
        // It joins with all of that but Ready, which its first heartbeat brings.
        let joined = joining(&status);
        assert_eq!(condition(&joined, "Ready"), Some("False"));
        assert_eq!(condition(&joined, "RDMAEnabled"), Some("True"));
        assert_eq!(joined.capacity, status.capacity);

        // Without the file: the measured capacity (whatever this machine has), no ports.
        let info = NodeInfo {
            topology: None,
            ..info
        };
        let status = observe(&info, None, Vec::new(), 0);
        if let Ok(measured) = capacity::read_with_default_reserve() {
            assert_eq!(status.capacity.memory_bytes, measured.memory_bytes);
        }
        assert_eq!(status.probe_port, 0);
        assert_eq!(condition(&status, "RDMAEnabled"), Some("False"));
    }
}
