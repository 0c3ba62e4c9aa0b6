//! `--topology FILE`: a described lab ([`tb_api::lab::LabFile`]) instead of what this machine
//! finds. It is how a lab whose links are not Thunderbolt (Ethernet), or the emulated lab of the
//! tests (several nodelets on one host), states what each machine has:
//! - the ports come from the file (uuid `mac/port`, peers from its `links`);
//! - when the file gives this Mac's `memory`, the heartbeat reports the file's capacity (memory,
//!   allocatable, free, and chip, gpuCores, memoryBandwidth when given) instead of the measured
//!   one; CPU cores, hardware model, OS and memory pressure are still measured;
//! - its labels are added to the Node's (`--labels` win).

use std::path::{Path, PathBuf};

use tb_api::lab::{LabFile, LabMac};
use tb_api::status::{NodeCapacity, PortStatus};

/// Why a topology file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// The file cannot be read or is not a valid lab (file:line:col: what was expected).
    #[error("--topology {0}")]
    Load(tb_api::load::LocatedError),
    #[error("--topology {file}: no Mac named {node:?}; the Macs are {names}")]
    UnknownNode {
        file: String,
        node: String,
        names: String,
    },
}

/// A loaded topology file and the Mac in it that this nodelet is.
#[derive(Debug, Clone)]
pub struct Topology {
    pub file: PathBuf,
    pub lab: LabFile,
    pub node: String,
}

impl Topology {
    /// Reads and checks `path` (errors name file:line:col), and finds `node` in it.
    pub fn load(path: &Path, node: &str) -> Result<Topology, TopologyError> {
        let lab = LabFile::load(path).map_err(TopologyError::Load)?;
        Self::new(path, lab, node)
    }

    pub fn new(path: &Path, lab: LabFile, node: &str) -> Result<Topology, TopologyError> {
        if lab.mac(node).is_none() {
            return Err(TopologyError::UnknownNode {
                file: path.display().to_string(),
                node: node.to_string(),
                names: lab
                    .macs
                    .iter()
                    .map(|m| m.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        Ok(Topology {
            file: path.to_path_buf(),
            lab,
            node: node.to_string(),
        })
    }

    /// This node's entry (present: checked by [`Topology::new`]).
    pub fn mac(&self) -> Option<&LabMac> {
        self.lab.mac(&self.node)
    }

    /// This node's ports as the file gives them.
    pub fn ports(&self) -> Vec<PortStatus> {
        self.lab.ports_of(&self.node)
    }

    /// The capacity the file states, when it gives this Mac's memory: `(capacity, free bytes)`,
    /// with what the file leaves out taken from `measured`.
    pub fn capacity(&self, measured: Option<&NodeCapacity>) -> Option<(NodeCapacity, u64)> {
        let mac = self.mac()?;
        described_capacity(mac, measured)
    }
}

/// The capacity a lab file states for `mac` (None when it gives no memory). A chip given in the
/// file comes with the file's GPU cores (the measured ones belong to another chip); without a
/// chip, the measured chip and GPU cores stay.
pub fn described_capacity(
    mac: &LabMac,
    measured: Option<&NodeCapacity>,
) -> Option<(NodeCapacity, u64)> {
    let memory = mac.memory.as_ref()?;
    let base = measured.cloned().unwrap_or_default();
    let (chip, gpu_cores) = match &mac.chip {
        Some(chip) => (chip.clone(), mac.gpu_cores),
        None => (base.chip.clone(), mac.gpu_cores.or(base.gpu_cores)),
    };
    let bandwidth = mac
        .memory_bandwidth
        .or_else(|| tb_api::chips::memory_bandwidth_gbps(&chip, gpu_cores));
    let capacity = NodeCapacity {
        memory: memory.to_string(),
        memory_bytes: mac.memory_bytes(),
        allocatable_bytes: mac.allocatable_bytes(),
        chip,
        gpu_cores,
        memory_bandwidth_gbps: bandwidth,
        ..base
    };
    Some((capacity, mac.free_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAB: &str = "\
macs:
  - name: studio-1
    chip: Apple M3 Ultra
    memory: 512Gi
    allocatable: 480Gi
    free: 400Gi
    gpuCores: 80
    labels: {rack: a}
    ports:
      - {name: tb1, interface: en3, address: 127.0.0.1, rdmaDevice: rdma_en3, speedGbps: 80}
  - name: mini-1
    memory: 64Gi
    ports: [{name: tb1, address: 127.0.0.2}]
  - name: bare
links:
  - {between: [studio-1/tb1, mini-1/tb1]}
";

    fn write(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("lab.yaml");
        std::fs::write(&path, text).expect("write");
        (dir, path)
    }

    #[test]
    fn ports_come_from_the_file() {
        let (_d, path) = write(LAB);
        let t = Topology::load(&path, "studio-1").expect("loads");
        let ports = t.ports();
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].uuid, "studio-1/tb1");
        assert_eq!(ports[0].peer_uuid.as_deref(), Some("mini-1/tb1"));
        assert_eq!(ports[0].address.as_deref(), Some("127.0.0.1"));
        assert_eq!(ports[0].speed_gbps, Some(80.0));
    }

    #[test]
    fn a_node_not_in_the_file_is_an_error_listing_the_names() {
        let (_d, path) = write(LAB);
        let err = Topology::load(&path, "studio-9").expect_err("unknown");
        let text = err.to_string();
        assert!(
            text.contains("no Mac named \"studio-9\"; the Macs are studio-1, mini-1, bare"),
            "{text}"
        );
        assert!(text.contains("lab.yaml"), "{text}");
    }

    #[test]
    fn a_bad_file_names_file_line_and_column() {
        let (_d, path) = write(&LAB.replace("speedGbps: 80", "speedGbps: fast"));
        let text = Topology::load(&path, "studio-1")
            .expect_err("bad")
            .to_string();
        let at = format!("{}:10:", path.display());
        assert!(text.contains(&at), "{text}");
        let (_d, path) =
            write(&LAB.replace("[studio-1/tb1, mini-1/tb1]", "[studio-1/tb1, nope/tb1]"));
        let text = Topology::load(&path, "studio-1")
            .expect_err("bad")
            .to_string();
        assert!(text.contains("unknown Mac \"nope\""), "{text}");
        let missing = Topology::load(Path::new("/no/such/lab.yaml"), "a").expect_err("missing");
        assert!(
            missing
                .to_string()
                .contains("/no/such/lab.yaml: cannot read"),
            "{missing}"
        );
    }

    #[test]
    fn the_file_states_capacity_when_it_gives_memory() {
        let (_d, path) = write(LAB);
        let measured = NodeCapacity {
            memory: "24Gi".into(),
            memory_bytes: 24 << 30,
            allocatable_bytes: 20 << 30,
            chip: "AMD EPYC 7B13".into(),
            cpu_cores: 8,
            gpu_cores: None,
            memory_bandwidth_gbps: None,
            hardware_model: String::new(),
            os: "Debian GNU/Linux 12".into(),
            engine: None,
        };
        let studio = Topology::load(&path, "studio-1").expect("loads");
        let (cap, free) = studio.capacity(Some(&measured)).expect("memory given");
        assert_eq!(cap.memory, "512Gi");
        assert_eq!(cap.memory_bytes, 512 << 30);
        assert_eq!(cap.allocatable_bytes, 480 << 30);
        assert_eq!(free, 400 << 30);
        assert_eq!(cap.chip, "Apple M3 Ultra");
        assert_eq!(cap.gpu_cores, Some(80));
        assert_eq!(cap.memory_bandwidth_gbps, Some(819.0));
        assert_eq!(cap.cpu_cores, 8, "still measured");
        assert_eq!(cap.os, "Debian GNU/Linux 12");

        // Memory only: allocatable and free from the file's defaults, chip measured.
        let mini = Topology::load(&path, "mini-1").expect("loads");
        let (cap, free) = mini.capacity(Some(&measured)).expect("memory given");
        assert_eq!(cap.memory_bytes, 64 << 30);
        assert_eq!(cap.allocatable_bytes, 56 << 30);
        assert_eq!(free, 56 << 30);
        assert_eq!(cap.chip, "AMD EPYC 7B13");
        assert_eq!(cap.memory_bandwidth_gbps, None);

        // No memory: the measured capacity stands.
        let bare = Topology::load(&path, "bare").expect("loads");
        assert!(bare.capacity(Some(&measured)).is_none());
        assert!(bare.ports().is_empty());
    }
}
