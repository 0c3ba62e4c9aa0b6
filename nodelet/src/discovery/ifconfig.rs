//! Parser for `ifconfig` (no arguments): the IPv4 addresses of each network interface, so each
//! Thunderbolt port (`en3`) can report the address probes and data-plane traffic go to.
//!
//! The output is one block per interface: a header line at column 0 (`en3: flags=8863<UP,..>
//! mtu 1500` on macOS and current Linux net-tools; `eth0      Link encap:Ethernet` on old
//! net-tools) followed by indented lines, among them `inet 192.168.10.1 netmask 0xfffffffc ..`
//! (macOS), `inet 192.168.10.1  netmask 255.255.255.252 ..` or `inet addr:192.168.10.1 ..`
//! (Linux). `inet6` lines are ignored.
//!
//! [`preferred`] picks the address a port reports: the first one that is not link-local
//! (169.254/16). A self-assigned link-local address is left out: every Thunderbolt interface
//! gets one from the same /16, so traffic to it may leave by any interface and would not
//! measure the cable it names.
//!
//! Pure: takes the command's output as a string, does no I/O.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

/// Why `ifconfig` output could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IfconfigError {
    /// An indented line before any interface header.
    #[error("line {line}: expected an interface header (`en0: flags=..`) first, found `{found}`")]
    NoInterface { line: usize, found: String },
    /// An `inet` line whose address is not an IPv4 address.
    #[error("line {line}: expected an IPv4 address after `inet`, found `{found}`")]
    BadAddress { line: usize, found: String },
}

/// Parses `ifconfig` output into each interface's IPv4 addresses, in the order listed.
/// Interfaces without one map to an empty list.
pub fn parse_ifconfig(text: &str) -> Result<BTreeMap<String, Vec<Ipv4Addr>>, IfconfigError> {
    let mut interfaces: BTreeMap<String, Vec<Ipv4Addr>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for (index, raw) in text.lines().enumerate() {
        let line_no = index + 1;
        if raw.trim().is_empty() {
            continue;
        }
        if !raw.starts_with([' ', '\t']) {
            let name = raw
                .split(|c: char| c == ':' || c.is_whitespace())
                .next()
                .unwrap_or_default();
            interfaces.entry(name.to_string()).or_default();
            current = Some(name.to_string());
            continue;
        }
        let mut words = raw.split_whitespace();
        if words.next() != Some("inet") {
            continue;
        }
        let Some(iface) = current.as_ref() else {
            return Err(IfconfigError::NoInterface {
                line: line_no,
                found: raw.trim().to_string(),
            });
        };
        let word = words.next().unwrap_or_default();
        let text = word.strip_prefix("addr:").unwrap_or(word);
        let addr = text
            .parse::<Ipv4Addr>()
            .map_err(|_| IfconfigError::BadAddress {
                line: line_no,
                found: word.to_string(),
            })?;
        interfaces.entry(iface.clone()).or_default().push(addr);
    }
    Ok(interfaces)
}

/// The address a port reports: the first that is neither link-local nor unspecified.
pub fn preferred(addresses: &[Ipv4Addr]) -> Option<Ipv4Addr> {
    addresses
        .iter()
        .copied()
        .find(|a| !a.is_link_local() && !a.is_unspecified())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MESH: &str = include_str!("../../tests/fixtures/discovery/mesh_member/ifconfig.txt");

    fn v4(s: &str) -> Ipv4Addr {
        s.parse().expect("test address")
    }

    #[test]
    fn macos_blocks_give_each_interface_its_ipv4_addresses() {
        let ifs = parse_ifconfig(MESH).expect("fixture parses");
        assert_eq!(ifs["lo0"], vec![v4("127.0.0.1")]);
        assert_eq!(ifs["en2"], vec![v4("192.168.10.1")]);
        assert_eq!(ifs["en3"], vec![v4("169.254.12.7"), v4("192.168.11.1")]);
        assert_eq!(ifs["en5"], vec![v4("169.254.40.2")]);
        assert!(ifs["bridge0"].is_empty());
        assert_eq!(preferred(&ifs["en3"]), Some(v4("192.168.11.1")));
        assert_eq!(preferred(&ifs["en5"]), None, "link-local only");
        assert_eq!(preferred(&ifs["bridge0"]), None);
    }

    #[test]
    fn linux_net_tools_formats() {
        let text = "\
thunderbolt0: flags=4163<UP,BROADCAST,RUNNING,MULTICAST>  mtu 1500
        inet 10.0.5.1  netmask 255.255.255.252  broadcast 10.0.5.3
        inet6 fe80::1  prefixlen 64  scopeid 0x20<link>

eth0      Link encap:Ethernet  HWaddr 00:11:22:33:44:55
          inet addr:192.168.1.20  Bcast:192.168.1.255  Mask:255.255.255.0
";
        let ifs = parse_ifconfig(text).expect("parses");
        assert_eq!(ifs["thunderbolt0"], vec![v4("10.0.5.1")]);
        assert_eq!(ifs["eth0"], vec![v4("192.168.1.20")]);
    }

    #[test]
    fn empty_output_and_errors() {
        assert_eq!(parse_ifconfig(""), Ok(BTreeMap::new()));
        assert_eq!(
            parse_ifconfig("\tinet 10.0.0.1 netmask 0xff000000\n"),
            Err(IfconfigError::NoInterface {
                line: 1,
                found: "inet 10.0.0.1 netmask 0xff000000".into()
            })
        );
        let err = parse_ifconfig("en3: flags=8863<UP> mtu 1500\n\tinet 10.0.0.300 netmask 0\n")
            .expect_err("bad address");
        assert_eq!(
            err,
            IfconfigError::BadAddress {
                line: 2,
                found: "10.0.0.300".into()
            }
        );
        assert!(err.to_string().contains("expected an IPv4 address"));
    }
}
