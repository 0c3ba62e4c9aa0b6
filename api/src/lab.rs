//! A described lab: Macs (chip, memory, bandwidth, ports) and the cables between them, in one
//! YAML file. Two readers share it:
//! - `tbctl plan --cluster FILE` plans against it offline, with the same placement function the
//!   controller runs on the live cluster ("what if we add a Mac?");
//! - `tb-nodelet --topology FILE` takes its own Mac's ports from it, for labs whose links are not
//!   Thunderbolt (Ethernet) and for the emulated lab in the tests.
//!
//! ```yaml
//! macs:
//!   - name: studio-1
//!     chip: Apple M3 Ultra
//!     memory: 512Gi
//!     ports:
//!       - {name: tb1, interface: en3, address: 192.168.10.1, rdmaDevice: rdma_en3}
//!   - {name: studio-2, chip: Apple M3 Ultra, memory: 512Gi, ports: [{name: tb1}]}
//! links:
//!   - {between: [studio-1/tb1, studio-2/tb1], bandwidthGbps: 80, latencyUs: 5, rdma: true}
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::load::{LocatedError, load_typed_str};
use crate::name::{validate_label_key, validate_label_value, validate_name};
use crate::quantity::Quantity;
use crate::status::PortStatus;
use crate::validate::ValidationError;

/// What macOS and everything else keeps when a file gives no `allocatable`: the larger of
/// 8 GiB and an eighth of the memory.
pub fn default_reserve(memory_bytes: u64) -> u64 {
    (8u64 << 30).max(memory_bytes / 8).min(memory_bytes)
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabFile {
    pub macs: Vec<LabMac>,
    #[serde(default)]
    pub links: Vec<LabLink>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabMac {
    pub name: String,
    /// As macOS names it: `Apple M3 Ultra`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chip: Option<String>,
    /// Unified memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// What tb may use (memory less a reserve for macOS when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocatable: Option<Quantity>,
    /// Free for new work now (all of `allocatable` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free: Option<Quantity>,
    /// GB/s; from the chip when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bandwidth: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_cores: Option<u32>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<LabPort>,
    /// Cordoned: nothing new is placed here.
    #[serde(default)]
    pub unschedulable: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabPort {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_device: Option<String>,
    /// Negotiated speed, Gb/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_gbps: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabLink {
    /// Two ends, each `mac` or `mac/port`.
    pub between: Vec<String>,
    /// Gb/s, measured or nominal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_gbps: Option<f64>,
    /// Round-trip time of a small message, microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<f64>,
    #[serde(default)]
    pub rdma: bool,
}

/// One end of a link, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabEnd<'a> {
    pub mac: &'a str,
    pub port: Option<&'a str>,
}

impl LabLink {
    /// The two ends (valid after [`LabFile::check`]).
    pub fn ends(&self) -> Option<(LabEnd<'_>, LabEnd<'_>)> {
        match self.between.as_slice() {
            [a, b] => Some((lab_end(a), lab_end(b))),
            _ => None,
        }
    }
}

/// The file's name as errors show it, and its text.
fn read(path: &Path) -> Result<(String, String), LocatedError> {
    let name = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => Ok((name, text)),
        Err(e) => Err(LocatedError {
            file: name,
            line: 0,
            column: 0,
            path: String::new(),
            message: format!("cannot read: {e}"),
        }),
    }
}

fn lab_end(s: &str) -> LabEnd<'_> {
    match s.split_once('/') {
        Some((mac, port)) => LabEnd {
            mac: mac.trim(),
            port: Some(port.trim()),
        },
        None => LabEnd {
            mac: s.trim(),
            port: None,
        },
    }
}

fn err(path: String, message: impl Into<String>) -> Result<(), ValidationError> {
    Err(ValidationError::new(path, message))
}

fn positive(path: String, what: &str, v: Option<f64>) -> Result<(), ValidationError> {
    match v {
        Some(x) if !(x.is_finite() && x > 0.0) => err(
            path,
            format!("must be a positive number of {what}, got {x}"),
        ),
        _ => Ok(()),
    }
}

impl LabFile {
    /// Reads and checks a lab file.
    pub fn load(path: &Path) -> Result<LabFile, LocatedError> {
        let (name, text) = read(path)?;
        Self::parse(&name, &text)
    }

    pub fn parse(file: &str, text: &str) -> Result<LabFile, LocatedError> {
        load_typed_str(file, text, LabFile::check)
    }

    /// Reads a lab file that must say enough to plan on: every Mac's memory and chip or
    /// bandwidth.
    pub fn parse_for_planning(file: &str, text: &str) -> Result<LabFile, LocatedError> {
        load_typed_str(file, text, |lab: &LabFile| {
            lab.check()?;
            lab.check_capacity()
        })
    }

    pub fn load_for_planning(path: &Path) -> Result<LabFile, LocatedError> {
        let (name, text) = read(path)?;
        Self::parse_for_planning(&name, &text)
    }

    /// Names, ports and links make sense: every link joins two different, known Macs (and known
    /// ports, when it names them), no port is on two links, figures are positive.
    pub fn check(&self) -> Result<(), ValidationError> {
        if self.macs.is_empty() {
            return err("macs".into(), "list at least one Mac");
        }
        let mut ports_of: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (i, mac) in self.macs.iter().enumerate() {
            let at = format!("macs[{i}]");
            validate_name(&mac.name).map_err(|m| ValidationError::new(format!("{at}.name"), m))?;
            if ports_of.contains_key(mac.name.as_str()) {
                return err(
                    format!("{at}.name"),
                    format!("{:?} is listed twice", mac.name),
                );
            }
            positive(
                format!("{at}.memoryBandwidth"),
                "GB/s",
                mac.memory_bandwidth,
            )?;
            for (field, q) in [
                ("memory", &mac.memory),
                ("allocatable", &mac.allocatable),
                ("free", &mac.free),
            ] {
                if let (Some(q), Some(total)) = (q, &mac.memory)
                    && q.bytes() > total.bytes()
                {
                    return err(
                        format!("{at}.{field}"),
                        format!("{q} is more than the Mac's memory ({total})"),
                    );
                }
            }
            if let (Some(free), Some(alloc)) = (&mac.free, &mac.allocatable)
                && free.bytes() > alloc.bytes()
            {
                return err(
                    format!("{at}.free"),
                    format!("{free} is more than allocatable ({alloc})"),
                );
            }
            for (key, value) in &mac.labels {
                let p = format!("{at}.labels.{key}");
                validate_label_key(key).map_err(|m| ValidationError::new(&p, m))?;
                validate_label_value(value).map_err(|m| ValidationError::new(&p, m))?;
            }
            let mut names = BTreeSet::new();
            for (j, port) in mac.ports.iter().enumerate() {
                let p = format!("{at}.ports[{j}]");
                if port.name.trim().is_empty() || port.name.contains('/') {
                    return err(
                        format!("{p}.name"),
                        "must name the port, without '/' (e.g. tb1)",
                    );
                }
                if !names.insert(port.name.as_str()) {
                    return err(
                        format!("{p}.name"),
                        format!("port {:?} is listed twice on {}", port.name, mac.name),
                    );
                }
                if let Some(addr) = &port.address
                    && addr.parse::<std::net::IpAddr>().is_err()
                {
                    return err(
                        format!("{p}.address"),
                        format!("{addr:?} is not an IP address"),
                    );
                }
                positive(format!("{p}.speedGbps"), "Gb/s", port.speed_gbps)?;
            }
            ports_of.insert(&mac.name, names);
        }
        let mut cabled: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        for (i, link) in self.links.iter().enumerate() {
            let at = format!("links[{i}]");
            let Some((a, b)) = link.ends() else {
                return err(
                    format!("{at}.between"),
                    format!(
                        "expected two ends (mac or mac/port), got {}",
                        link.between.len()
                    ),
                );
            };
            for (j, end) in [&a, &b].into_iter().enumerate() {
                let p = format!("{at}.between[{j}]");
                let Some(ports) = ports_of.get(end.mac) else {
                    return err(
                        p,
                        format!(
                            "unknown Mac {:?}; the Macs are {}",
                            end.mac,
                            self.macs
                                .iter()
                                .map(|m| m.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    );
                };
                if let Some(port) = end.port {
                    if !ports.contains(port) {
                        return err(
                            p,
                            format!(
                                "unknown port {port:?} on {}; its ports are {}",
                                end.mac,
                                if ports.is_empty() {
                                    "none (list them under ports)".to_string()
                                } else {
                                    ports.iter().copied().collect::<Vec<_>>().join(", ")
                                }
                            ),
                        );
                    }
                    if let Some(other) = cabled.insert((end.mac, port), i) {
                        return err(
                            p,
                            format!("{}/{port} is already cabled by links[{other}]", end.mac),
                        );
                    }
                }
            }
            if a.mac == b.mac {
                return err(
                    format!("{at}.between[1]"),
                    format!(
                        "a link joins two different Macs; both ends are on {}",
                        a.mac
                    ),
                );
            }
            positive(format!("{at}.bandwidthGbps"), "Gb/s", link.bandwidth_gbps)?;
            if let Some(l) = link.latency_us
                && !(l.is_finite() && l >= 0.0)
            {
                return err(
                    format!("{at}.latencyUs"),
                    format!("must be zero or more microseconds, got {l}"),
                );
            }
        }
        Ok(())
    }

    /// Every Mac says how much memory it has and how fast it is (planning needs both), and
    /// every link how fast it is.
    pub fn check_capacity(&self) -> Result<(), ValidationError> {
        for (i, mac) in self.macs.iter().enumerate() {
            let at = format!("macs[{i}]");
            if mac.memory.is_none() {
                return err(
                    format!("{at}.memory"),
                    "required to plan: the Mac's unified memory, e.g. 128Gi",
                );
            }
            if mac.memory_bandwidth_gbs().is_none() {
                return err(
                    format!("{at}.memoryBandwidth"),
                    format!(
                        "required to plan when the chip is not a known Apple chip ({}): GB/s, e.g. 546",
                        mac.chip.as_deref().unwrap_or("no chip given")
                    ),
                );
            }
        }
        for (i, link) in self.links.iter().enumerate() {
            if link.bandwidth_gbps.is_none() {
                return err(
                    format!("links[{i}].bandwidthGbps"),
                    "required to plan: the link's speed in Gb/s, e.g. 80",
                );
            }
        }
        Ok(())
    }

    pub fn mac(&self, name: &str) -> Option<&LabMac> {
        self.macs.iter().find(|m| m.name == name)
    }

    /// The ports of `mac` as its nodelet reports them: uuid `mac/port`, peer from the links.
    pub fn ports_of(&self, mac: &str) -> Vec<PortStatus> {
        let Some(m) = self.mac(mac) else {
            return Vec::new();
        };
        let mut peers: BTreeMap<&str, String> = BTreeMap::new();
        for link in &self.links {
            let Some((a, b)) = link.ends() else { continue };
            for (here, there) in [(&a, &b), (&b, &a)] {
                if here.mac == mac
                    && let (Some(p), Some(q)) = (here.port, there.port)
                {
                    peers.insert(p, format!("{}/{q}", there.mac));
                }
            }
        }
        m.ports
            .iter()
            .map(|p| PortStatus {
                name: p.name.clone(),
                interface: p.interface.clone(),
                address: p.address.clone(),
                rdma_device: p.rdma_device.clone(),
                uuid: format!("{mac}/{}", p.name),
                peer_uuid: peers.get(p.name.as_str()).cloned(),
                speed_gbps: p.speed_gbps,
            })
            .collect()
    }
}

impl LabMac {
    pub fn memory_bytes(&self) -> u64 {
        self.memory.as_ref().map_or(0, Quantity::bytes)
    }

    pub fn allocatable_bytes(&self) -> u64 {
        match &self.allocatable {
            Some(q) => q.bytes(),
            None => self
                .memory_bytes()
                .saturating_sub(default_reserve(self.memory_bytes())),
        }
    }

    pub fn free_bytes(&self) -> u64 {
        self.free
            .as_ref()
            .map_or(self.allocatable_bytes(), Quantity::bytes)
    }

    /// GB/s: as given, else from the chip table.
    pub fn memory_bandwidth_gbs(&self) -> Option<f64> {
        self.memory_bandwidth.or_else(|| {
            self.chip
                .as_deref()
                .and_then(|c| crate::chips::memory_bandwidth_gbps(c, self.gpu_cores))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAB: &str = "\
macs:
  - name: studio-1
    chip: Apple M3 Ultra
    memory: 512Gi
    ports:
      - {name: tb1, interface: en3, address: 192.168.10.1, rdmaDevice: rdma_en3}
      - {name: tb2}
  - name: mini-1
    chip: Apple M4 Pro
    memory: 64Gi
    free: 40Gi
    ports: [{name: tb1}]
links:
  - {between: [studio-1/tb1, mini-1/tb1], bandwidthGbps: 80, latencyUs: 5, rdma: true}
";

    #[test]
    fn reads_macs_ports_and_links() {
        let lab = LabFile::parse_for_planning("lab.yaml", LAB).expect("valid");
        let studio = lab.mac("studio-1").expect("listed");
        assert_eq!(studio.memory_bandwidth_gbs(), Some(819.0));
        assert_eq!(studio.allocatable_bytes(), 448 << 30);
        assert_eq!(lab.mac("mini-1").map(LabMac::free_bytes), Some(40 << 30));
        let ports = lab.ports_of("studio-1");
        assert_eq!(ports[0].uuid, "studio-1/tb1");
        assert_eq!(ports[0].peer_uuid.as_deref(), Some("mini-1/tb1"));
        assert_eq!(ports[1].peer_uuid, None);
        assert_eq!(
            lab.ports_of("mini-1")[0].peer_uuid.as_deref(),
            Some("studio-1/tb1")
        );
    }

    fn error(text: &str) -> String {
        LabFile::parse_for_planning("lab.yaml", text)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn unknown_ports_and_macs_are_named_with_their_line() {
        let bad = LAB.replace("mini-1/tb1]", "mini-1/tb9]");
        assert_eq!(
            error(&bad),
            "lab.yaml:14:15: links[0].between[1]: unknown port \"tb9\" on mini-1; its ports are tb1"
        );
        let bad = LAB.replace("[studio-1/tb1,", "[studio-9/tb1,");
        assert!(
            error(&bad).starts_with("lab.yaml:14:")
                && error(&bad).contains("unknown Mac \"studio-9\""),
            "{}",
            error(&bad)
        );
    }

    #[test]
    fn self_links_and_negative_speeds_are_refused() {
        let bad = LAB.replace("mini-1/tb1]", "studio-1/tb2]");
        assert!(
            error(&bad).contains("links[0].between[1]: a link joins two different Macs"),
            "{}",
            error(&bad)
        );
        let bad = LAB.replace("bandwidthGbps: 80", "bandwidthGbps: -80");
        assert!(
            error(&bad).contains("links[0].bandwidthGbps: must be a positive number of Gb/s"),
            "{}",
            error(&bad)
        );
        let bad = LAB.replace("latencyUs: 5", "latencyUs: -5");
        assert!(
            error(&bad).contains("links[0].latencyUs"),
            "{}",
            error(&bad)
        );
    }

    #[test]
    fn planning_needs_memory_and_bandwidth() {
        let bad = LAB.replace("    memory: 64Gi\n    free: 40Gi\n", "");
        assert!(
            error(&bad).contains("macs[1].memory: required to plan"),
            "{}",
            error(&bad)
        );
        let bad = LAB.replace("chip: Apple M4 Pro", "chip: Intel Xeon");
        assert!(
            error(&bad).contains("macs[1].memoryBandwidth: required to plan"),
            "{}",
            error(&bad)
        );
        // The nodelet reads the same file without needing capacity.
        let ports_only = "macs: [{name: a, ports: [{name: p}]}, {name: b, ports: [{name: p}]}]\n\
                          links: [{between: [a/p, b/p]}]\n";
        assert!(LabFile::parse("lab.yaml", ports_only).is_ok());
    }

    #[test]
    fn the_example_labs_are_valid_for_planning() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/labs");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("manifests/labs") {
            let path = entry.expect("entry").path();
            if let Err(e) = LabFile::load_for_planning(&path) {
                panic!("{e}");
            }
            seen += 1;
        }
        assert!(seen >= 1);
    }

    #[test]
    fn typos_in_field_names_are_errors() {
        let bad = LAB.replace("latencyUs", "latencyMs");
        assert!(
            error(&bad).contains("unknown field `latencyMs`"),
            "{}",
            error(&bad)
        );
    }
}
