//! Thunderbolt ports on macOS, the way MLX finds them: [`join`] (pure) puts five command
//! outputs together, [`read`] runs the commands.
//!
//! Bus receptacle N ↔ "Thunderbolt N" → `enX` ↔ `rdma_enX` (when RDMA is enabled and that
//! device exists) and `enX`'s IPv4 address. The N ↔ "Thunderbolt N" pairing is observed, not
//! documented by Apple. Each bus is its own Thunderbolt domain on Apple silicon, so a port's
//! `uuid` is its bus's domain uuid and its `peer_uuid` the far bus's: a cable is two ports that
//! name each other.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use tb_api::status::PortStatus;

use super::command;
use super::{hardware_ports, ifconfig, rdma, thunderbolt};
use thunderbolt::Bus;

/// The longest any one discovery command may take (system_profiler takes about a second).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// The parsed outputs of the discovery commands.
#[derive(Debug, Clone, Default)]
pub struct Outputs {
    pub buses: Vec<Bus>,
    /// "Thunderbolt N" → `enX`.
    pub hardware_ports: BTreeMap<u32, String>,
    pub rdma_devices: Vec<String>,
    pub rdma_enabled: bool,
    /// Interface → its IPv4 addresses.
    pub addresses: BTreeMap<String, Vec<Ipv4Addr>>,
}

/// One port per bus that has a port number, named `tb<N>`, sorted by N. Buses without a
/// receptacle are skipped. When a bus lists several Macs (a chain through a dock), the first is
/// taken as the peer.
pub fn join(out: &Outputs) -> Vec<PortStatus> {
    let mut ports: Vec<(u32, PortStatus)> = out
        .buses
        .iter()
        .filter_map(|bus| {
            let Some(receptacle) = bus.receptacle else {
                tracing::debug!(bus = %bus.name, "Thunderbolt bus without a receptacle; skipped");
                return None;
            };
            if bus.peers.len() > 1 {
                tracing::debug!(bus = %bus.name, peers = bus.peers.len(), "several Macs on one bus; using the first");
            }
            let interface = out.hardware_ports.get(&receptacle).cloned();
            let rdma_device = interface
                .as_deref()
                .map(|iface| format!("rdma_{iface}"))
                .filter(|device| out.rdma_enabled && out.rdma_devices.iter().any(|d| d == device));
            let address = interface
                .as_deref()
                .and_then(|iface| out.addresses.get(iface))
                .and_then(|a| ifconfig::preferred(a))
                .map(|a| a.to_string());
            Some((
                receptacle,
                PortStatus {
                    name: format!("tb{receptacle}"),
                    interface,
                    address,
                    rdma_device,
                    uuid: bus.domain_uuid.clone(),
                    peer_uuid: bus.peers.first().map(|p| p.domain_uuid.clone()),
                    speed_gbps: bus.speed_gbps.map(f64::from),
                },
            ))
        })
        .collect();
    ports.sort_by_key(|(n, _)| *n);
    ports.into_iter().map(|(_, p)| p).collect()
}

/// Runs the commands and joins what they print. A missing or failing command contributes
/// nothing (logged at debug): no `system_profiler` → no ports; no `rdma_ctl` → RDMA off.
pub fn read() -> Vec<PortStatus> {
    join(&gather(|program, args| {
        command::run(program, args, COMMAND_TIMEOUT)
    }))
}

/// Runs each command through `run` and parses what it printed; an output that does not parse
/// is logged and counts as absent.
pub fn gather(run: impl Fn(&str, &[&str]) -> Option<String>) -> Outputs {
    fn parsed<T, E: std::fmt::Display>(what: &str, r: Result<T, E>) -> Option<T> {
        r.map_err(|e| tracing::warn!("cannot parse the output of {what}: {e}"))
            .ok()
    }
    let buses = run("system_profiler", &["SPThunderboltDataType", "-json"])
        .and_then(|t| parsed("system_profiler", thunderbolt::parse_buses(&t)))
        .unwrap_or_default();
    if buses.is_empty() {
        // No Thunderbolt at all: the rest would say nothing useful.
        return Outputs::default();
    }
    Outputs {
        buses,
        hardware_ports: run("networksetup", &["-listallhardwareports"])
            .and_then(|t| parsed("networksetup", hardware_ports::parse_hardware_ports(&t)))
            .unwrap_or_default(),
        rdma_devices: run("ibv_devices", &[])
            .and_then(|t| parsed("ibv_devices", rdma::parse_ibv_devices(&t)))
            .unwrap_or_default(),
        rdma_enabled: run("rdma_ctl", &["status"])
            .and_then(|t| parsed("rdma_ctl", rdma::parse_rdma_status(&t)))
            .unwrap_or(false),
        addresses: run("ifconfig", &[])
            .and_then(|t| parsed("ifconfig", ifconfig::parse_ifconfig(&t)))
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scenario's recorded outputs, served to [`gather`] as if the commands ran.
    fn scenario(name: &str) -> Vec<PortStatus> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/discovery")
            .join(name);
        let out = gather(|program, _| {
            let file = match program {
                "system_profiler" => "sp_thunderbolt.json",
                "networksetup" => "hardware_ports.txt",
                "ibv_devices" => "ibv_devices.txt",
                "rdma_ctl" => "rdma_ctl.txt",
                "ifconfig" => "ifconfig.txt",
                _ => return None,
            };
            std::fs::read_to_string(dir.join(file)).ok()
        });
        join(&out)
    }

    fn peers(ports: &[PortStatus]) -> Vec<Option<&str>> {
        ports.iter().map(|p| p.peer_uuid.as_deref()).collect()
    }

    #[test]
    fn mesh_member() {
        let ports = scenario("mesh_member");
        assert_eq!(ports.len(), 4);
        assert_eq!(
            ports[0],
            PortStatus {
                name: "tb1".into(),
                interface: Some("en2".into()),
                address: Some("192.168.10.1".into()),
                rdma_device: Some("rdma_en2".into()),
                uuid: "6C1E2F7A-0000-4000-8000-000000000001".into(),
                peer_uuid: Some("9A3B4C5D-0000-4000-8000-000000000001".into()),
                speed_gbps: Some(80.0),
            }
        );
        let connected: Vec<_> = ports.iter().filter(|p| p.peer_uuid.is_some()).collect();
        assert_eq!(connected.len(), 3);
        assert!(connected.iter().all(|p| p.rdma_device.is_some()));
        assert_eq!(
            ports[1].address.as_deref(),
            Some("192.168.11.1"),
            "not the link-local one"
        );
        assert_eq!(ports[2].speed_gbps, Some(120.0));
        assert_eq!(ports[3].peer_uuid, None);
        assert_eq!(ports[3].address, None, "link-local only");
        assert_eq!(
            ports[3].rdma_device.as_deref(),
            Some("rdma_en5"),
            "an idle port still has a device"
        );
    }

    #[test]
    fn several_cables_between_two_macs_pair_up() {
        let a = scenario("two_cables_a");
        let b = scenario("two_cables_b");
        let cabled = |ports: &[PortStatus]| ports.iter().filter(|p| p.peer_uuid.is_some()).count();
        assert_eq!((cabled(&a), cabled(&b)), (2, 2));
        // Each cabled port of A names exactly one port of B, which names it back.
        for pa in a.iter().filter(|p| p.peer_uuid.is_some()) {
            let pb: Vec<_> = b
                .iter()
                .filter(|pb| Some(pb.uuid.as_str()) == pa.peer_uuid.as_deref())
                .collect();
            assert_eq!(pb.len(), 1, "{}", pa.name);
            assert_eq!(pb[0].peer_uuid.as_deref(), Some(pa.uuid.as_str()));
            // The two ends of each cable share a /30.
            let (x, y) = (
                pa.address.as_deref().unwrap_or(""),
                pb[0].address.as_deref().unwrap_or(""),
            );
            assert_eq!(
                x.rsplit_once('.').map(|s| s.0),
                y.rsplit_once('.').map(|s| s.0)
            );
        }
        assert_eq!(a[0].name, "tb1");
        assert_eq!(b[1].name, "tb2");
        assert_eq!(b[1].address.as_deref(), Some("192.168.50.2"));
        assert_eq!(a[0].peer_uuid.as_deref(), Some(b[1].uuid.as_str()));
    }

    #[test]
    fn two_cables_to_the_same_peer_bus_are_two_ports() {
        let ports = scenario("same_peer_twice");
        let peer = Some("7C8D9EAF-0000-4000-8000-000000000001");
        assert_eq!(peers(&ports), vec![peer, peer, None]);
        assert_ne!(ports[0].uuid, ports[1].uuid);
        assert_eq!(ports[0].rdma_device.as_deref(), Some("rdma_en2"));
        assert_eq!(ports[1].rdma_device.as_deref(), Some("rdma_en3"));
    }

    #[test]
    fn rdma_disabled_has_interfaces_but_no_devices() {
        let ports = scenario("rdma_disabled");
        assert_eq!(ports.len(), 2);
        assert_eq!(ports[0].interface.as_deref(), Some("en2"));
        assert_eq!(ports[0].address.as_deref(), Some("192.168.30.1"));
        assert_eq!(ports[0].speed_gbps, Some(40.0));
        assert!(ports.iter().all(|p| p.rdma_device.is_none()));
    }

    #[test]
    fn rdma_disabled_hides_devices_that_exist() {
        let mut out = Outputs {
            buses: thunderbolt::parse_buses(include_str!(
                "../../tests/fixtures/discovery/mesh_member/sp_thunderbolt.json"
            ))
            .expect("fixture parses"),
            rdma_devices: vec!["rdma_en2".into()],
            ..Default::default()
        };
        out.hardware_ports.insert(1, "en2".into());
        assert!(join(&out).iter().all(|p| p.rdma_device.is_none()));
        out.rdma_enabled = true;
        assert_eq!(join(&out)[0].rdma_device.as_deref(), Some("rdma_en2"));
    }

    #[test]
    fn chain_middle_has_two_peers() {
        let ports = scenario("chain_middle");
        assert_eq!(
            peers(&ports),
            vec![
                Some("A0B1C2D3-0000-4000-8000-000000000002"),
                None,
                Some("E4F50617-0000-4000-8000-000000000001"),
                None
            ]
        );
        assert_eq!(ports[0].address.as_deref(), Some("192.168.20.2"));
        assert_eq!(ports[2].address.as_deref(), Some("192.168.21.1"));
    }

    #[test]
    fn no_cables() {
        let ports = scenario("no_cables");
        assert_eq!(ports.len(), 3);
        assert!(
            ports
                .iter()
                .all(|p| p.peer_uuid.is_none() && p.speed_gbps.is_none() && p.address.is_none())
        );
    }

    #[test]
    fn no_thunderbolt_or_no_commands_means_no_ports() {
        assert!(join(&gather(|_, _| None)).is_empty());
        // system_profiler prints something unexpected: logged, no ports.
        assert!(join(&gather(|_, _| Some("not json".into()))).is_empty());
    }

    #[test]
    fn missing_interface_and_receptacle() {
        let bus = |name: &str, uuid: &str, receptacle| Bus {
            name: name.into(),
            domain_uuid: uuid.into(),
            receptacle,
            connected: false,
            speed_gbps: None,
            peers: vec![],
        };
        let out = Outputs {
            buses: vec![bus("b1", "U1", Some(2)), bus("b0", "U0", None)],
            rdma_devices: vec!["rdma_en2".into()],
            rdma_enabled: true,
            ..Default::default()
        };
        let ports = join(&out);
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].name, "tb2");
        assert_eq!(ports[0].uuid, "U1");
        assert_eq!(ports[0].interface, None);
        assert_eq!(ports[0].rdma_device, None);
    }

    /// The fenced block right after each `<!-- MARKER... -->` line of docs/real-macs.md, with
    /// what follows the marker's name.
    fn guide_blocks<'a>(guide: &'a str, marker: &str) -> Vec<(&'a str, Vec<&'a str>)> {
        let mut found = Vec::new();
        let mut lines = guide.lines();
        while let Some(line) = lines.next() {
            let Some(arg) = line
                .strip_prefix(marker)
                .and_then(|rest| rest.strip_suffix("-->"))
            else {
                continue;
            };
            assert_eq!(lines.next().map(str::trim), Some("```text"), "{line}");
            let block: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
            found.push((arg.trim(), block));
        }
        found
    }

    #[test]
    fn the_real_macs_guide_quotes_what_tb_parses() {
        let guide = include_str!("../../../docs/real-macs.md");
        let fixtures =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/discovery");
        let commands = [
            ("rdma_ctl.txt", "rdma_ctl status"),
            ("ibv_devices.txt", "ibv_devices"),
            ("hardware_ports.txt", "networksetup -listallhardwareports"),
        ];
        let quoted = guide_blocks(guide, "<!-- fixture:");
        assert_eq!(quoted.len(), 3, "the guide quotes three command outputs");
        for (file, block) in quoted {
            let fixture = std::fs::read_to_string(fixtures.join(file)).expect(file);
            let name = file.rsplit('/').next().unwrap_or(file);
            let command = commands
                .iter()
                .find(|(f, _)| *f == name)
                .map(|(_, c)| *c)
                .expect("a command tb runs");
            assert_eq!(block[0], format!("$ {command}"), "{file}");
            // `...` elides lines; every run of quoted lines appears in the fixture as it is.
            for run in block[1..].split(|l| *l == "...") {
                let run = run.join("\n");
                assert!(fixture.contains(&run), "{file}: the guide quotes\n{run}");
            }
        }
        let logged = guide_blocks(guide, "<!-- ports:");
        assert_eq!(logged.len(), 1);
        for (name, block) in logged {
            let expected = format!("ports: {}", super::super::describe(&scenario(name)));
            assert_eq!(
                block,
                vec![expected.as_str()],
                "the nodelet's log line for {name}"
            );
        }
    }
}
