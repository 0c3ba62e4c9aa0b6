//! Thunderbolt topology discovery on macOS, the way MLX does it: which physical port is cabled to
//! which other Mac, over which network interface, and with which RDMA device.
//!
//! Four command outputs are parsed by pure functions (no I/O; the caller runs the commands):
//! - `system_profiler SPThunderboltDataType -json` → [`thunderbolt::parse_buses`];
//! - `networksetup -listallhardwareports` → [`hardware_ports::parse_hardware_ports`];
//! - `rdma_ctl status` → [`rdma::parse_rdma_status`];
//! - `ibv_devices` → [`rdma::parse_ibv_devices`].
//!
//! [`ports`] joins them: bus receptacle N ↔ "Thunderbolt N" → `enX` ↔ `rdma_enX` (when that
//! device exists and RDMA is enabled). The N ↔ "Thunderbolt N" pairing is observed, not
//! documented by Apple. A link between two Macs is a pair of [`Port`]s whose
//! `peer_domain_uuid` names each other's `local_domain_uuid`.

pub mod hardware_ports;
pub mod rdma;
pub mod thunderbolt;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use hardware_ports::{HardwarePortsError, parse_hardware_ports};
pub use rdma::{RdmaError, parse_ibv_devices, parse_rdma_status};
pub use thunderbolt::{Bus, Peer, ThunderboltError, parse_buses};

/// One physical Thunderbolt port of this Mac, joined across the discovery commands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    /// The port number N (the bus's `receptacle_id_key`, "Thunderbolt N").
    pub receptacle: u32,
    /// The BSD interface of "Thunderbolt N" (`en3`), if `networksetup` lists it.
    pub interface: Option<String>,
    /// `rdma_<interface>` when RDMA is enabled and `ibv_devices` lists that device.
    pub rdma_device: Option<String>,
    /// The domain uuid of the far end's bus, when another Mac is cabled to this port.
    pub peer_domain_uuid: Option<String>,
    /// Link speed in Gb/s, when known.
    pub speed_gbps: Option<u32>,
    /// This port's own bus domain uuid (what the peer sees as its `peer_domain_uuid`).
    pub local_domain_uuid: String,
}

/// Joins the parsed outputs into one [`Port`] per bus that has a port number, sorted by port
/// number. Buses without a receptacle are skipped. When a bus lists several Macs, the first is
/// taken as the peer.
pub fn ports(
    buses: &[Bus],
    hardware_ports: &BTreeMap<u32, String>,
    rdma_devices: &[String],
    rdma_enabled: bool,
) -> Vec<Port> {
    let mut ports: Vec<Port> = buses
        .iter()
        .filter_map(|bus| {
            let Some(receptacle) = bus.receptacle else {
                tracing::debug!(bus = %bus.name, "Thunderbolt bus without a receptacle; skipped");
                return None;
            };
            if bus.peers.len() > 1 {
                tracing::warn!(bus = %bus.name, peers = bus.peers.len(), "several Macs on one bus; using the first");
            }
            let interface = hardware_ports.get(&receptacle).cloned();
            let rdma_device = interface
                .as_deref()
                .map(|iface| format!("rdma_{iface}"))
                .filter(|device| rdma_enabled && rdma_devices.iter().any(|d| d == device));
            Some(Port {
                receptacle,
                interface,
                rdma_device,
                peer_domain_uuid: bus.peers.first().map(|p| p.domain_uuid.clone()),
                speed_gbps: bus.speed_gbps,
                local_domain_uuid: bus.domain_uuid.clone(),
            })
        })
        .collect();
    ports.sort_by_key(|p| p.receptacle);
    ports
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! fixture {
        ($scenario:literal) => {{
            let buses = parse_buses(include_str!(concat!(
                "../../tests/fixtures/discovery/",
                $scenario,
                "/sp_thunderbolt.json"
            )))
            .expect("sp_thunderbolt.json parses");
            let hw = parse_hardware_ports(include_str!(concat!(
                "../../tests/fixtures/discovery/",
                $scenario,
                "/hardware_ports.txt"
            )))
            .expect("hardware_ports.txt parses");
            let devices = parse_ibv_devices(include_str!(concat!(
                "../../tests/fixtures/discovery/",
                $scenario,
                "/ibv_devices.txt"
            )))
            .expect("ibv_devices.txt parses");
            let enabled = parse_rdma_status(include_str!(concat!(
                "../../tests/fixtures/discovery/",
                $scenario,
                "/rdma_ctl.txt"
            )))
            .expect("rdma_ctl.txt parses");
            ports(&buses, &hw, &devices, enabled)
        }};
    }

    fn peers(ports: &[Port]) -> Vec<Option<&str>> {
        ports
            .iter()
            .map(|p| p.peer_domain_uuid.as_deref())
            .collect()
    }

    #[test]
    fn mesh_member() {
        let ports = fixture!("mesh_member");
        assert_eq!(ports.len(), 4);
        assert_eq!(
            ports[0],
            Port {
                receptacle: 1,
                interface: Some("en2".into()),
                rdma_device: Some("rdma_en2".into()),
                peer_domain_uuid: Some("9A3B4C5D-0000-4000-8000-000000000001".into()),
                speed_gbps: Some(80),
                local_domain_uuid: "6C1E2F7A-0000-4000-8000-000000000001".into(),
            }
        );
        let connected: Vec<_> = ports
            .iter()
            .filter(|p| p.peer_domain_uuid.is_some())
            .collect();
        assert_eq!(connected.len(), 3);
        assert!(connected.iter().all(|p| p.rdma_device.is_some()));
        assert_eq!(ports[2].speed_gbps, Some(120));
        assert_eq!(ports[3].peer_domain_uuid, None);
        assert_eq!(
            ports[3].rdma_device.as_deref(),
            Some("rdma_en5"),
            "an idle port still has a device"
        );
    }

    #[test]
    fn two_cables_to_the_same_peer_are_two_ports() {
        let ports = fixture!("same_peer_twice");
        let peer = Some("7C8D9EAF-0000-4000-8000-000000000001");
        assert_eq!(peers(&ports), vec![peer, peer, None]);
        assert_ne!(ports[0].local_domain_uuid, ports[1].local_domain_uuid);
        assert_eq!(ports[0].rdma_device.as_deref(), Some("rdma_en2"));
        assert_eq!(ports[1].rdma_device.as_deref(), Some("rdma_en3"));
    }

    #[test]
    fn rdma_disabled_has_interfaces_but_no_devices() {
        let ports = fixture!("rdma_disabled");
        assert_eq!(ports.len(), 2);
        assert_eq!(ports[0].interface.as_deref(), Some("en2"));
        assert_eq!(ports[0].speed_gbps, Some(40));
        assert!(ports.iter().all(|p| p.rdma_device.is_none()));
    }

    #[test]
    fn rdma_disabled_hides_devices_that_exist() {
        let buses = parse_buses(include_str!(
            "../../tests/fixtures/discovery/mesh_member/sp_thunderbolt.json"
        ))
        .expect("fixture parses");
        let hw = parse_hardware_ports(include_str!(
            "../../tests/fixtures/discovery/mesh_member/hardware_ports.txt"
        ))
        .expect("fixture parses");
        let devices = vec!["rdma_en2".to_owned()];
        let ports = ports(&buses, &hw, &devices, false);
        assert!(ports.iter().all(|p| p.rdma_device.is_none()));
    }

    #[test]
    fn chain_middle_has_two_peers() {
        let ports = fixture!("chain_middle");
        assert_eq!(
            peers(&ports),
            vec![
                Some("A0B1C2D3-0000-4000-8000-000000000002"),
                None,
                Some("E4F50617-0000-4000-8000-000000000001"),
                None
            ]
        );
    }

    #[test]
    fn no_cables() {
        let ports = fixture!("no_cables");
        assert_eq!(ports.len(), 3);
        assert!(
            ports
                .iter()
                .all(|p| p.peer_domain_uuid.is_none() && p.speed_gbps.is_none())
        );
    }

    #[test]
    fn missing_interface_and_receptacle() {
        let buses = vec![
            Bus {
                name: "b1".into(),
                domain_uuid: "U1".into(),
                receptacle: Some(2),
                connected: false,
                speed_gbps: None,
                peers: vec![],
            },
            Bus {
                name: "b0".into(),
                domain_uuid: "U0".into(),
                receptacle: None,
                connected: false,
                speed_gbps: None,
                peers: vec![],
            },
        ];
        let ports = ports(&buses, &BTreeMap::new(), &["rdma_en2".into()], true);
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].receptacle, 2);
        assert_eq!(ports[0].interface, None);
        assert_eq!(ports[0].rdma_device, None);
    }

    #[test]
    fn port_serde_is_camel_case() {
        let port = Port {
            receptacle: 3,
            interface: Some("en3".into()),
            rdma_device: Some("rdma_en3".into()),
            peer_domain_uuid: None,
            speed_gbps: Some(80),
            local_domain_uuid: "U".into(),
        };
        let json = serde_json::to_value(&port).expect("serialises");
        assert_eq!(
            json,
            serde_json::json!({"receptacle": 3, "interface": "en3", "rdmaDevice": "rdma_en3",
                "peerDomainUuid": null, "speedGbps": 80, "localDomainUuid": "U"})
        );
        let back: Port = serde_json::from_value(json).expect("deserialises");
        assert_eq!(back, port);
    }
}
