//! Port discovery: this Mac's Thunderbolt ports, the peers cabled to them, their interfaces,
//! IPv4 addresses and RDMA devices, as the `ports` of the Node status
//! ([`tb_api::status::PortStatus`]). Two ports whose `peer_uuid` names each other's `uuid` are
//! the two ends of a cable; the controller joins them into Link objects.
//!
//! One module per source, each a pure parser tested with recorded fixtures
//! (`tests/fixtures/discovery/`):
//! - macOS ([`macos`]): `system_profiler SPThunderboltDataType -json` ([`thunderbolt`]),
//!   `networksetup -listallhardwareports` ([`hardware_ports`]), `rdma_ctl status` and
//!   `ibv_devices` ([`rdma`]), `ifconfig` ([`ifconfig`]);
//! - Linux ([`linux_sysfs`]): `/sys/bus/thunderbolt`, `/sys/class/net`, `/sys/class/infiniband`;
//! - a described lab (`--topology FILE`, [`crate::topology`]): the ports the file gives.
//!
//! [`discover`] picks the source; [`Discovery`] keeps the last answer so the heartbeat does not
//! run the macOS commands more than every [`REFRESH`].

pub mod command;
pub mod hardware_ports;
pub mod ifconfig;
pub mod linux_sysfs;
pub mod macos;
pub mod rdma;
pub mod thunderbolt;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tb_api::status::PortStatus;

use crate::topology::Topology;

pub use hardware_ports::{HardwarePortsError, parse_hardware_ports};
pub use ifconfig::{IfconfigError, parse_ifconfig};
pub use rdma::{RdmaError, parse_ibv_devices, parse_rdma_status};
pub use thunderbolt::{Bus, Peer, ThunderboltError, parse_buses};

/// How long a discovered set of ports is reused before the OS is asked again.
pub const REFRESH: Duration = Duration::from_secs(30);

/// Where the ports come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// This machine: the macOS commands, or sysfs on Linux.
    Local,
    /// A topology file: the ports it gives this node.
    Static(Arc<Topology>),
}

/// The ports now, from `source`. Blocking: on macOS it runs commands (each with a timeout);
/// missing commands or files mean no ports.
pub fn discover(source: &Source) -> Vec<PortStatus> {
    match source {
        Source::Static(t) => t.ports(),
        Source::Local => local(),
    }
}

#[cfg(target_os = "macos")]
fn local() -> Vec<PortStatus> {
    macos::read()
}

#[cfg(target_os = "linux")]
fn local() -> Vec<PortStatus> {
    linux_sysfs::read()
}

#[cfg(not(any(target_os = "macos", target_os = "linux")))]
fn local() -> Vec<PortStatus> {
    tracing::debug!("no Thunderbolt discovery on {}", std::env::consts::OS);
    Vec::new()
}

/// Discovery with a memory: [`Discovery::ports`] asks the OS at most every [`REFRESH`]
/// (a topology file is read from memory every time).
#[derive(Debug)]
pub struct Discovery {
    source: Source,
    last: Mutex<Option<(Instant, Vec<PortStatus>)>>,
}

impl Discovery {
    pub fn new(source: Source) -> Arc<Discovery> {
        Arc::new(Discovery {
            source,
            last: Mutex::new(None),
        })
    }

    /// The current ports: the last answer while it is fresh, else a new look (off the async
    /// threads, since the macOS commands block).
    pub async fn ports(&self) -> Vec<PortStatus> {
        if let Source::Static(t) = &self.source {
            return t.ports();
        }
        {
            let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((at, ports)) = last.as_ref()
                && at.elapsed() < REFRESH
            {
                return ports.clone();
            }
        }
        let source = self.source.clone();
        let ports = tokio::task::spawn_blocking(move || discover(&source))
            .await
            .unwrap_or_default();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.as_ref().map(|(_, p)| p) != Some(&ports) {
            tracing::info!("ports: {}", describe(&ports));
        }
        *last = Some((Instant::now(), ports.clone()));
        ports
    }
}

/// `tb1 en2 192.168.10.1 -> <peer uuid>, tb2 (no cable)` for the log.
pub fn describe(ports: &[PortStatus]) -> String {
    if ports.is_empty() {
        return "none".into();
    }
    ports
        .iter()
        .map(|p| {
            let mut s = p.name.clone();
            for part in [&p.interface, &p.address, &p.rdma_device]
                .into_iter()
                .flatten()
            {
                s.push(' ');
                s.push_str(part);
            }
            match &p.peer_uuid {
                Some(peer) => s.push_str(&format!(" -> {peer}")),
                None => s.push_str(" (no cable)"),
            }
            s
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_names_ports_and_peers() {
        let ports = vec![
            PortStatus {
                name: "tb1".into(),
                interface: Some("en2".into()),
                address: Some("192.168.10.1".into()),
                uuid: "U1".into(),
                peer_uuid: Some("P1".into()),
                ..Default::default()
            },
            PortStatus {
                name: "tb2".into(),
                uuid: "U2".into(),
                ..Default::default()
            },
        ];
        assert_eq!(
            describe(&ports),
            "tb1 en2 192.168.10.1 -> P1, tb2 (no cable)"
        );
        assert_eq!(describe(&[]), "none");
    }

    #[tokio::test]
    async fn local_discovery_answers_and_is_remembered() {
        // This machine may have no Thunderbolt at all; the answer must come, and stay put.
        let d = Discovery::new(Source::Local);
        let first = d.ports().await;
        assert_eq!(d.ports().await, first);
    }
}
