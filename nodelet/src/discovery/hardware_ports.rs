//! Parser for `networksetup -listallhardwareports`: which BSD interface (`enX`) serves each
//! Thunderbolt port.
//!
//! The output is blocks of `Hardware Port: <name>` / `Device: <bsd name>` /
//! `Ethernet Address: ...`. Only ports named `Thunderbolt N` (N a port number) are kept; the
//! `Thunderbolt Bridge` (`bridge0`) and every non-Thunderbolt port are ignored, as are trailing
//! sections such as `VLAN Configurations`.
//!
//! Pure: takes the command's output as a string, does no I/O.

use std::collections::BTreeMap;

const PORT_PREFIX: &str = "Hardware Port:";
const DEVICE_PREFIX: &str = "Device:";
const THUNDERBOLT: &str = "Thunderbolt ";
const BRIDGE: &str = "Thunderbolt Bridge";

/// Why `networksetup -listallhardwareports` output could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HardwarePortsError {
    /// A `Hardware Port: Thunderbolt ...` line whose suffix is not a port number.
    #[error(
        "line {line}: expected `Hardware Port: Thunderbolt <number>` or `Thunderbolt Bridge`, found `{found}`"
    )]
    BadPortNumber {
        /// 1-based line number.
        line: usize,
        /// The port name found.
        found: String,
    },
    /// A Thunderbolt port block ended without a `Device:` line.
    #[error("expected a `Device:` line for `Thunderbolt {port}`")]
    MissingDevice {
        /// The port number.
        port: u32,
    },
    /// A `Device:` line with nothing after the colon.
    #[error("line {line}: expected an interface name after `Device:`")]
    EmptyDevice {
        /// 1-based line number.
        line: usize,
    },
    /// The same Thunderbolt port is listed twice.
    #[error("line {line}: expected `Thunderbolt {port}` once, found it again")]
    DuplicatePort {
        /// 1-based line number.
        line: usize,
        /// The port number.
        port: u32,
    },
}

/// Parses `networksetup -listallhardwareports` into a map from Thunderbolt port number N
/// ("Thunderbolt N") to its interface (`en3`).
pub fn parse_hardware_ports(text: &str) -> Result<BTreeMap<u32, String>, HardwarePortsError> {
    let mut ports = BTreeMap::new();
    // The Thunderbolt port whose `Device:` line we are waiting for.
    let mut pending: Option<u32> = None;
    for (index, raw) in text.lines().enumerate() {
        let line_no = index + 1;
        let line = raw.trim();
        if let Some(name) = line.strip_prefix(PORT_PREFIX) {
            if let Some(port) = pending.take() {
                return Err(HardwarePortsError::MissingDevice { port });
            }
            let name = name.trim();
            if name == BRIDGE {
                continue;
            }
            let Some(number) = name.strip_prefix(THUNDERBOLT) else {
                continue;
            };
            let port =
                number
                    .trim()
                    .parse::<u32>()
                    .map_err(|_| HardwarePortsError::BadPortNumber {
                        line: line_no,
                        found: name.to_owned(),
                    })?;
            if ports.contains_key(&port) {
                return Err(HardwarePortsError::DuplicatePort {
                    line: line_no,
                    port,
                });
            }
            pending = Some(port);
        } else if let Some(device) = line.strip_prefix(DEVICE_PREFIX) {
            let Some(port) = pending.take() else {
                continue;
            };
            let device = device.trim();
            if device.is_empty() {
                return Err(HardwarePortsError::EmptyDevice { line: line_no });
            }
            ports.insert(port, device.to_owned());
        }
    }
    match pending {
        Some(port) => Err(HardwarePortsError::MissingDevice { port }),
        None => Ok(ports),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MESH: &str =
        include_str!("../../tests/fixtures/discovery/mesh_member/hardware_ports.txt");
    const RDMA_OFF: &str =
        include_str!("../../tests/fixtures/discovery/rdma_disabled/hardware_ports.txt");

    #[test]
    fn maps_thunderbolt_ports_and_ignores_the_rest() {
        let ports = parse_hardware_ports(MESH).expect("fixture parses");
        let expected: BTreeMap<u32, String> = [(1, "en2"), (2, "en3"), (3, "en4"), (4, "en5")]
            .into_iter()
            .map(|(n, e)| (n, e.to_owned()))
            .collect();
        assert_eq!(ports, expected);
        let ports = parse_hardware_ports(RDMA_OFF).expect("fixture parses");
        assert_eq!(ports.len(), 2);
        assert!(
            !ports
                .values()
                .any(|d| d == "bridge0" || d == "en0" || d == "en1")
        );
    }

    #[test]
    fn empty_output_has_no_ports() {
        assert_eq!(parse_hardware_ports(""), Ok(BTreeMap::new()));
    }

    #[test]
    fn malformed_input_is_rejected_with_what_was_expected() {
        let err = parse_hardware_ports("Hardware Port: Thunderbolt X\nDevice: en3\n")
            .expect_err("bad number");
        assert_eq!(
            err,
            HardwarePortsError::BadPortNumber {
                line: 1,
                found: "Thunderbolt X".into()
            }
        );
        assert!(err.to_string().contains("Thunderbolt <number>"));
        let err = parse_hardware_ports(
            "Hardware Port: Thunderbolt 3\n\nHardware Port: Wi-Fi\nDevice: en1\n",
        )
        .expect_err("missing device");
        assert_eq!(err, HardwarePortsError::MissingDevice { port: 3 });
        let err = parse_hardware_ports("Hardware Port: Thunderbolt 3\n").expect_err("truncated");
        assert_eq!(err, HardwarePortsError::MissingDevice { port: 3 });
        let err = parse_hardware_ports("Hardware Port: Thunderbolt 3\nDevice:\n")
            .expect_err("empty device");
        assert_eq!(err, HardwarePortsError::EmptyDevice { line: 2 });
        let err = parse_hardware_ports(
            "Hardware Port: Thunderbolt 3\nDevice: en3\n\nHardware Port: Thunderbolt 3\nDevice: en4\n",
        )
        .expect_err("duplicate");
        assert_eq!(err, HardwarePortsError::DuplicatePort { line: 4, port: 3 });
    }
}
