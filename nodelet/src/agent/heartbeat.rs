//! Heartbeats: every interval the nodelet reads its capacity afresh and reports its Node status
//! (capacity, free and allocated memory, the allocations it runs, its conditions).

use std::sync::Arc;
use std::time::Duration;

use tb_api::proto::HeartbeatRequest;
use tb_api::status::{NodeCapacity, NodeStatus, PortRange, set_condition};

use super::controllers::{Controllers, retryable};
use super::identity::Credential;
use super::supervisor::{Supervisor, now};
use crate::capacity::{self, MemoryPressure};

/// What the heartbeat needs to know about this nodelet.
pub struct NodeInfo {
    pub address: String,
    pub port_range: PortRange,
    pub reserve_bytes: Option<u64>,
}

/// The Node status as this nodelet sees it now.
pub fn observe(info: &NodeInfo, supervisor: Option<&Supervisor>) -> NodeStatus {
    let cap = match info.reserve_bytes {
        Some(r) => capacity::read(r),
        None => capacity::read_with_default_reserve(),
    };
    let stamp = now();
    let mut status = NodeStatus {
        address: info.address.clone(),
        port_range: info.port_range,
        nodelet_version: env!("CARGO_PKG_VERSION").into(),
        ..Default::default()
    };
    if let Some(s) = supervisor {
        let usage = s.usage();
        status.allocated_bytes = usage.allocated_bytes;
        status.allocations = usage.allocations;
    }
    match cap {
        Ok(c) => {
            status.capacity = NodeCapacity {
                memory: tb_api::Quantity::from_bytes(c.memory_bytes).to_string(),
                memory_bytes: c.memory_bytes,
                allocatable_bytes: c.allocatable_bytes,
                memory_bandwidth_gbps: capacity::chips::memory_bandwidth_gbps(&c.chip, c.gpu_cores),
                chip: c.chip,
                cpu_cores: c.cpu_cores,
                gpu_cores: c.gpu_cores,
                hardware_model: c.hardware_model.unwrap_or_default(),
                os: c.os,
            };
            status.free_bytes = c.free_bytes;
            let pressure = !matches!(c.memory_pressure, MemoryPressure::Normal);
            set_condition(
                &mut status.conditions,
                "Ready",
                true,
                "NodeletReady",
                "",
                &stamp,
            );
            set_condition(
                &mut status.conditions,
                "MemoryPressure",
                pressure,
                if pressure {
                    "MemoryPressure"
                } else {
                    "NoPressure"
                },
                &format!("{:?}", c.memory_pressure),
                &stamp,
            );
        }
        Err(e) => {
            set_condition(
                &mut status.conditions,
                "Ready",
                false,
                "CapacityUnknown",
                &e.to_string(),
                &stamp,
            );
        }
    }
    // RDMA over Thunderbolt needs the topology discovery that comes with placement.
    set_condition(
        &mut status.conditions,
        "RDMAEnabled",
        false,
        "NotDetected",
        "no RDMA device found",
        &stamp,
    );
    status
}

/// Heartbeat until the process ends.
pub async fn run(
    controllers: Arc<Controllers>,
    credential: Credential,
    info: NodeInfo,
    supervisor: Arc<Supervisor>,
    mut interval: Duration,
) {
    loop {
        let status = observe(&info, Some(&supervisor));
        let req = HeartbeatRequest {
            node: credential.node.clone(),
            credential: credential.credential.clone(),
            status_json: status.to_value().to_string(),
        };
        let result = async {
            let mut client = controllers
                .nodes()
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            client.heartbeat(req).await
        }
        .await;
        match result {
            Ok(reply) => {
                let ms = reply.into_inner().heartbeat_interval_ms;
                // The controller's pace wins when it asks for more frequent beats.
                if ms > 0 {
                    interval = interval.min(Duration::from_millis(ms));
                }
            }
            Err(s) if retryable(&s) => {
                controllers.rotate();
                tracing::debug!("heartbeat not delivered: {}", s.message());
            }
            Err(s) => tracing::warn!("heartbeat refused: {}", s.message()),
        }
        tokio::time::sleep(interval).await;
    }
}
