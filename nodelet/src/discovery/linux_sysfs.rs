//! Thunderbolt links on Linux, read from sysfs (the layout of the kernel's
//! `Documentation/ABI/testing/sysfs-bus-thunderbolt` and `drivers/thunderbolt/xdomain.c`).
//!
//! Under `bus/thunderbolt/devices/`:
//! - `domainN`: a Thunderbolt domain (one host controller);
//! - `N-0`: the domain's host router; its `unique_id` is the domain's uuid, which a cabled
//!   host sees as the far end's uuid;
//! - `N-R` (R the route string in hex): a device behind the domain: a dock or other switch
//!   (`DEVTYPE=thunderbolt_device` in `uevent`, has an `authorized` attribute) or another host,
//!   an XDomain (`DEVTYPE=thunderbolt_xdomain`), whose `unique_id` is the far host's domain uuid
//!   and whose `rx_speed` (`"20.0 Gb/s"`, per lane) and `rx_lanes` give the link speed;
//! - `N-R.K`: service K of XDomain `N-R`; `key` names the protocol (`network` for IP over
//!   Thunderbolt). The thunderbolt-net interface is the service's child (`N-R.K/net/<ifname>`),
//!   and `class/net/<ifname>/device` links back to the service.
//!
//! RDMA devices are `class/infiniband/<dev>`; their network interface is named by
//! `ports/<p>/gid_attrs/ndevs/<i>` (soft RoCE, and every RoCE device) or is a child of the
//! device (`device/net/<ifname>`).
//!
//! One port is reported per XDomain (per cabled host), named `tb<N>-<R>`. Uuids are
//! upper-cased, as macOS prints them, so a Linux host and a Mac cabled together name each
//! other alike. All of a domain's ports share its uuid: two hosts on one domain make that uuid
//! ambiguous, and the controller joins no link for it (one cable per domain is fine).
//!
//! [`read_tree`] is pure except for reading the tree under the root it is given (tests pass a
//! fixture directory); [`read`] reads `/sys` and the interfaces' addresses.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;

use tb_api::status::PortStatus;

use super::ifconfig;

const XDOMAIN: &str = "thunderbolt_xdomain";
const SWITCH: &str = "thunderbolt_device";

/// This host's Thunderbolt ports: [`read_tree`] on `/sys`, with the interfaces' addresses.
pub fn read() -> Vec<PortStatus> {
    read_tree(Path::new("/sys"), &interface_addresses())
}

/// Every interface's IPv4 addresses, from getifaddrs(3).
pub fn interface_addresses() -> BTreeMap<String, Vec<Ipv4Addr>> {
    let mut out: BTreeMap<String, Vec<Ipv4Addr>> = BTreeMap::new();
    match nix::ifaddrs::getifaddrs() {
        Ok(addrs) => {
            for a in addrs {
                let v4 = a
                    .address
                    .as_ref()
                    .and_then(|s| s.as_sockaddr_in())
                    .map(|s| s.ip());
                let entry = out.entry(a.interface_name).or_default();
                if let Some(ip) = v4 {
                    entry.push(ip);
                }
            }
        }
        Err(e) => tracing::debug!("getifaddrs: {e}"),
    }
    out
}

/// A device under `bus/thunderbolt/devices`, as named there.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Name {
    Domain,
    /// `N-R`: domain index and route.
    Router {
        domain: u32,
        route: u64,
    },
    /// `N-R.K`: a service of the XDomain `N-R`.
    Service {
        xdomain: String,
    },
}

fn classify(name: &str) -> Option<Name> {
    if name.starts_with("domain") {
        return Some(Name::Domain);
    }
    if let Some((xdomain, id)) = name.split_once('.') {
        id.parse::<u32>().ok()?;
        classify(xdomain)?;
        return Some(Name::Service {
            xdomain: xdomain.to_string(),
        });
    }
    let (domain, route) = name.split_once('-')?;
    Some(Name::Router {
        domain: domain.parse().ok()?,
        route: u64::from_str_radix(route, 16).ok()?,
    })
}

/// An attribute's text, trimmed; `None` when absent, unreadable or empty.
fn attr(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

/// `DEVTYPE=` from a device's `uevent`.
fn devtype(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("uevent")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("DEVTYPE="))
        .map(|s| s.trim().to_string())
}

/// Names of the entries of a directory, sorted; empty when it cannot be read.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Per-lane speed such as `"20.0 Gb/s"` times the lane count.
fn speed(rx_speed: Option<&str>, rx_lanes: Option<&str>) -> Option<f64> {
    let per_lane: f64 = rx_speed?.split_whitespace().next()?.parse().ok()?;
    let lanes: f64 = rx_lanes.and_then(|l| l.parse().ok()).unwrap_or(1.0);
    let total = per_lane * lanes;
    (total.is_finite() && total > 0.0).then_some(total)
}

#[derive(Debug, Default)]
struct XDomain {
    domain: u32,
    route: u64,
    name: String,
    peer_uuid: Option<String>,
    speed_gbps: Option<f64>,
}

/// Reads the Thunderbolt, network and RDMA devices under `root` (a sysfs root such as `/sys`)
/// into one port per XDomain, with `addresses` giving each interface's IPv4 addresses.
pub fn read_tree(root: &Path, addresses: &BTreeMap<String, Vec<Ipv4Addr>>) -> Vec<PortStatus> {
    let devices = root.join("bus/thunderbolt/devices");
    let mut hosts: BTreeMap<u32, String> = BTreeMap::new();
    let mut xdomains: Vec<XDomain> = Vec::new();
    // XDomain name → its thunderbolt-net interface.
    let mut net_of: BTreeMap<String, String> = BTreeMap::new();
    for name in entries(&devices) {
        let dir = devices.join(&name);
        match classify(&name) {
            Some(Name::Router { domain, route: 0 }) => {
                if let Some(uuid) = attr(&dir.join("unique_id")) {
                    hosts.insert(domain, uuid.to_ascii_uppercase());
                }
            }
            Some(Name::Router { domain, route }) => {
                let is_xdomain = match devtype(&dir).as_deref() {
                    Some(XDOMAIN) => true,
                    Some(SWITCH) => false,
                    // No uevent: only switches can be authorized.
                    _ => !dir.join("authorized").exists(),
                };
                if !is_xdomain {
                    continue;
                }
                xdomains.push(XDomain {
                    domain,
                    route,
                    peer_uuid: attr(&dir.join("unique_id")).map(|u| u.to_ascii_uppercase()),
                    speed_gbps: speed(
                        attr(&dir.join("rx_speed")).as_deref(),
                        attr(&dir.join("rx_lanes")).as_deref(),
                    ),
                    name,
                });
            }
            Some(Name::Service { xdomain }) => {
                if let Some(iface) = entries(&dir.join("net")).into_iter().next() {
                    net_of.entry(xdomain).or_insert(iface);
                }
            }
            Some(Name::Domain) | None => {}
        }
    }
    // class/net/<if>/device → ../../../N-R.K: the same pairing, as the ABI documents it.
    let class_net = root.join("class/net");
    for iface in entries(&class_net) {
        let Ok(target) = std::fs::read_link(class_net.join(&iface).join("device")) else {
            continue;
        };
        let Some(service) = target.file_name().map(|f| f.to_string_lossy().to_string()) else {
            continue;
        };
        if let Some(Name::Service { xdomain }) = classify(&service) {
            net_of.entry(xdomain).or_insert(iface);
        }
    }
    let rdma = rdma_devices(root);
    xdomains.sort_by_key(|x| (x.domain, x.route));
    xdomains
        .into_iter()
        .filter_map(|x| {
            let Some(uuid) = hosts.get(&x.domain) else {
                tracing::debug!(xdomain = %x.name, "no host router uuid for its domain; skipped");
                return None;
            };
            let interface = net_of.get(&x.name).cloned();
            let address = interface
                .as_deref()
                .and_then(|i| addresses.get(i))
                .and_then(|a| ifconfig::preferred(a))
                .map(|a| a.to_string());
            let rdma_device = interface.as_deref().and_then(|i| rdma.get(i)).cloned();
            Some(PortStatus {
                name: format!("tb{}-{:x}", x.domain, x.route),
                interface,
                address,
                rdma_device,
                uuid: uuid.clone(),
                peer_uuid: x.peer_uuid,
                speed_gbps: x.speed_gbps,
            })
        })
        .collect()
}

/// Network interface → the RDMA device on it (the first by name when several are).
fn rdma_devices(root: &Path) -> BTreeMap<String, String> {
    let class = root.join("class/infiniband");
    let mut by_iface: BTreeMap<String, String> = BTreeMap::new();
    for dev in entries(&class) {
        let dir = class.join(&dev);
        let mut ifaces = entries(&dir.join("device/net"));
        for port in entries(&dir.join("ports")) {
            let ndevs = dir.join("ports").join(port).join("gid_attrs/ndevs");
            ifaces.extend(entries(&ndevs).iter().filter_map(|i| attr(&ndevs.join(i))));
        }
        for iface in ifaces {
            by_iface.entry(iface).or_insert_with(|| dev.clone());
        }
    }
    by_iface
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/discovery")
            .join(name)
    }

    fn addrs(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<Ipv4Addr>> {
        pairs
            .iter()
            .map(|(i, a)| (i.to_string(), vec![a.parse().expect("test address")]))
            .collect()
    }

    #[test]
    fn names_follow_the_kernel() {
        assert_eq!(classify("domain0"), Some(Name::Domain));
        assert_eq!(
            classify("0-0"),
            Some(Name::Router {
                domain: 0,
                route: 0
            })
        );
        assert_eq!(
            classify("1-301"),
            Some(Name::Router {
                domain: 1,
                route: 0x301
            })
        );
        assert_eq!(
            classify("0-1.0"),
            Some(Name::Service {
                xdomain: "0-1".into()
            })
        );
        assert_eq!(classify("0-0:1.1"), None, "a retimer is none of ours");
        assert_eq!(classify("usb4_port1"), None);
        assert_eq!(speed(Some("20.0 Gb/s"), Some("2")), Some(40.0));
        assert_eq!(speed(Some("40.0 Gb/s"), None), Some(40.0));
        assert_eq!(speed(Some("fast"), Some("2")), None);
    }

    #[test]
    fn xdomain_with_thunderbolt_net_and_rdma() {
        let ports = read_tree(
            &fixture("linux-xdomain"),
            &addrs(&[
                ("thunderbolt0", "10.0.5.1"),
                ("thunderbolt1", "169.254.3.3"),
                ("enp65s0", "10.9.0.2"),
            ]),
        );
        assert_eq!(
            ports,
            vec![
                PortStatus {
                    name: "tb0-1".into(),
                    interface: Some("thunderbolt0".into()),
                    address: Some("10.0.5.1".into()),
                    rdma_device: Some("rxe0".into()),
                    uuid: "D0A1B2C3-0000-4000-8000-00000000000A".into(),
                    peer_uuid: Some("9A3B4C5D-0000-4000-8000-000000000001".into()),
                    speed_gbps: Some(40.0),
                },
                PortStatus {
                    name: "tb1-3".into(),
                    interface: Some("thunderbolt1".into()),
                    address: None,
                    rdma_device: None,
                    uuid: "D0A1B2C3-0000-4000-8000-00000000000B".into(),
                    peer_uuid: Some("E4F50617-0000-4000-8000-000000000002".into()),
                    speed_gbps: Some(80.0),
                },
            ],
            "the dock on 1-1 is not a port; mlx5_0 is on enp65s0, not Thunderbolt"
        );
    }

    #[test]
    fn no_cables_and_no_thunderbolt() {
        assert!(read_tree(&fixture("linux-no-cables"), &BTreeMap::new()).is_empty());
        assert!(read_tree(&fixture("no-such-dir"), &BTreeMap::new()).is_empty());
    }

    #[test]
    fn this_hosts_addresses_include_loopback() {
        let all = interface_addresses();
        assert!(all.values().flatten().any(|a| a.is_loopback()), "{all:?}");
    }
}
