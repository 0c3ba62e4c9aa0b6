//! The MLX distributed contract (MLX 0.32): the files and environment that make each rank of an
//! MLX program find its peers, computed from tb's placement. Pure functions; the exec executor
//! writes the files next to the job and passes [`env_for_rank`] to the process.
//!
//! - Ring backend (TCP): `MLX_RANK` and `MLX_HOSTFILE`, a JSON list with one entry per rank of
//!   the `"ip:port"` addresses it listens on. Rank i talks to rank i±1, so the list order is the
//!   ring and must follow the cables.
//! - JACCL (RDMA over Thunderbolt): `MLX_RANK`, `MLX_IBV_DEVICES` (an N×N JSON matrix whose cell
//!   `[i][j]` names the RDMA device on host i cabled to host j, `null` where none),
//!   `MLX_JACCL_COORDINATOR` (rank 0's `ip:port`) and, for ring mode, `MLX_JACCL_RING=1`.
//! - The `mlx.launch` hostfile (`{"backend", "envs", "hosts": [{"ssh", "ips", "rdma"}]}`) for
//!   running the same placement by hand.
//!
//! Addresses are IPv4: MLX formats them as `ip:port` without brackets, and JACCL needs an IPv4
//! address on every Thunderbolt link.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::ser::{SerializeSeq, Serializer};

/// The most hosts a JACCL mesh supports (every pair needs its own cable).
pub const MESH_MAX_HOSTS: usize = 8;

/// MLX's distributed backends (shared with the object model).
pub use tb_api::specs::Backend;

/// Where the per-job files live on the rank's machine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MlxFiles {
    /// The ring hostfile (ring backend).
    pub hostfile_path: Option<PathBuf>,
    /// The IBV device matrix (JACCL backends).
    pub ibv_devices_path: Option<PathBuf>,
}

/// A contract that cannot be honoured, with what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum MlxError {
    #[error("a distributed job needs at least one rank")]
    NoRanks,
    #[error("{address:?} is not an IPv4 ip:port address")]
    InvalidAddress { address: String },
    #[error("rank {rank} is outside a world of {world}")]
    RankOutOfRange { rank: u32, world: u32 },
    #[error("the {backend} backend needs {what}")]
    Missing {
        backend: Backend,
        what: &'static str,
    },
    #[error("IBV device matrix: row {row} has {len} entries, expected {expected}")]
    NotSquare {
        row: usize,
        len: usize,
        expected: usize,
    },
    #[error("IBV device matrix: host {rank} lists devices {devices:?} to itself")]
    SelfLink { rank: usize, devices: Vec<String> },
    #[error("IBV device matrix: empty device name at [{row}][{col}]")]
    EmptyDevice { row: usize, col: usize },
    #[error(
        "the {backend} backend needs a cable between hosts {from} and {to}, and none is listed"
    )]
    NotCabled {
        backend: Backend,
        from: usize,
        to: usize,
    },
    #[error("a JACCL mesh supports at most {MESH_MAX_HOSTS} hosts, not {hosts}")]
    MeshTooLarge { hosts: usize },
    #[error("host {rank} ({ssh}) has no IP address, which the {backend} backend needs")]
    NoIp {
        rank: usize,
        ssh: String,
        backend: Backend,
    },
    #[error("environment variable name {name:?} is not valid (letters, digits and _ only)")]
    InvalidEnvName { name: String },
    #[error("path {} is not valid UTF-8", path.display())]
    PathNotUtf8 { path: PathBuf },
    #[error("cannot encode JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// `ip:port` as MLX expects it.
fn address(ip: Ipv4Addr, port: u16) -> String {
    format!("{ip}:{port}")
}

/// Parses an `ip:port` (IPv4) address, as an Allocation's MLX assignment lists them.
pub fn parse_address(text: &str) -> Result<(Ipv4Addr, u16), MlxError> {
    text.trim()
        .parse::<SocketAddrV4>()
        .map(|addr| (*addr.ip(), addr.port()))
        .map_err(|_| MlxError::InvalidAddress {
            address: text.to_string(),
        })
}

/// The ring hostfile: `[["ip:port"], ...]`, one entry per rank in ring order.
pub fn ring_hostfile(ranks: &[(Ipv4Addr, u16)]) -> Result<String, MlxError> {
    if ranks.is_empty() {
        return Err(MlxError::NoRanks);
    }
    let entries: Vec<[String; 1]> = ranks
        .iter()
        .map(|&(ip, port)| [address(ip, port)])
        .collect();
    to_json(&entries)
}

/// The JACCL coordinator: rank 0's `ip:port`.
pub fn coordinator(ranks: &[(Ipv4Addr, u16)]) -> Result<String, MlxError> {
    ranks
        .first()
        .map(|&(ip, port)| address(ip, port))
        .ok_or(MlxError::NoRanks)
}

/// One cell of the device matrix: the RDMA devices on one host cabled to another. Serializes
/// as MLX reads it: `null` for none, a string for one, a list for several.
#[derive(Debug, Clone, Copy)]
struct Devices<'a>(&'a [String]);

impl Serialize for Devices<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            [] => serializer.serialize_none(),
            [one] => serializer.serialize_str(one),
            many => {
                let mut seq = serializer.serialize_seq(Some(many.len()))?;
                for device in many {
                    seq.serialize_element(device)?;
                }
                seq.end()
            }
        }
    }
}

/// Checks that a device matrix is square, has nothing on its diagonal and no empty names.
fn check_matrix(matrix: &[Vec<Vec<String>>]) -> Result<(), MlxError> {
    if matrix.is_empty() {
        return Err(MlxError::NoRanks);
    }
    let n = matrix.len();
    for (row, cells) in matrix.iter().enumerate() {
        if cells.len() != n {
            return Err(MlxError::NotSquare {
                row,
                len: cells.len(),
                expected: n,
            });
        }
        if !cells[row].is_empty() {
            return Err(MlxError::SelfLink {
                rank: row,
                devices: cells[row].clone(),
            });
        }
        for (col, devices) in cells.iter().enumerate() {
            if devices.iter().any(|d| d.trim().is_empty()) {
                return Err(MlxError::EmptyDevice { row, col });
            }
        }
    }
    Ok(())
}

/// The IBV device matrix JSON from `matrix[i][j]` = the RDMA devices on host i cabled to host
/// j (empty where there is no cable, and always on the diagonal).
pub fn ibv_devices(matrix: &[Vec<Vec<String>>]) -> Result<String, MlxError> {
    check_matrix(matrix)?;
    let cells: Vec<Vec<Devices<'_>>> = matrix
        .iter()
        .map(|row| row.iter().map(|d| Devices(d)).collect())
        .collect();
    to_json(&cells)
}

/// Checks that the cabling suits the backend: a JACCL mesh needs every pair cabled (both
/// directions listed) and at most [`MESH_MAX_HOSTS`] hosts; a JACCL ring needs each rank
/// cabled to the next. The ring backend runs over any IP network and needs no RDMA.
pub fn check_cabling(backend: Backend, matrix: &[Vec<Vec<String>>]) -> Result<(), MlxError> {
    if backend == Backend::Ring {
        return Ok(());
    }
    check_matrix(matrix)?;
    let n = matrix.len();
    let linked = |from: usize, to: usize| {
        if matrix[from][to].is_empty() {
            Err(MlxError::NotCabled { backend, from, to })
        } else {
            Ok(())
        }
    };
    match backend {
        Backend::Jaccl => {
            if n > MESH_MAX_HOSTS {
                return Err(MlxError::MeshTooLarge { hosts: n });
            }
            for from in 0..n {
                for to in (0..n).filter(|&to| to != from) {
                    linked(from, to)?;
                }
            }
        }
        Backend::JacclRing if n > 1 => {
            for from in 0..n {
                let next = (from + 1) % n;
                linked(from, next)?;
                linked(next, from)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// The environment of one rank: tb's own variables (`TB_JOB`, `TB_RANK`, `TB_WORLD_SIZE`) and
/// MLX's for the backend. For JACCL it also sets `MLX_DISTRIBUTED_BACKEND`, as `mlx.launch` does.
pub fn env_for_rank(
    job: &str,
    rank: u32,
    world: u32,
    backend: Backend,
    files: &MlxFiles,
    coordinator: Option<String>,
) -> Result<BTreeMap<String, String>, MlxError> {
    if world == 0 {
        return Err(MlxError::NoRanks);
    }
    if rank >= world {
        return Err(MlxError::RankOutOfRange { rank, world });
    }
    let mut env = BTreeMap::new();
    env.insert("TB_JOB".to_string(), job.to_string());
    env.insert("TB_RANK".to_string(), rank.to_string());
    env.insert("TB_WORLD_SIZE".to_string(), world.to_string());
    env.insert("MLX_RANK".to_string(), rank.to_string());
    match backend {
        Backend::Ring => {
            let path = files.hostfile_path.as_deref().ok_or(MlxError::Missing {
                backend,
                what: "a hostfile path",
            })?;
            env.insert("MLX_HOSTFILE".to_string(), utf8(path)?);
        }
        Backend::Jaccl | Backend::JacclRing => {
            let path = files.ibv_devices_path.as_deref().ok_or(MlxError::Missing {
                backend,
                what: "an IBV devices file path",
            })?;
            let coordinator = coordinator
                .filter(|c| !c.is_empty())
                .ok_or(MlxError::Missing {
                    backend,
                    what: "a coordinator address (rank 0's ip:port)",
                })?;
            env.insert("MLX_IBV_DEVICES".to_string(), utf8(path)?);
            env.insert("MLX_JACCL_COORDINATOR".to_string(), coordinator);
            env.insert(
                "MLX_DISTRIBUTED_BACKEND".to_string(),
                backend.as_str().to_string(),
            );
            if backend == Backend::JacclRing {
                // MLX checks only that the variable is present.
                env.insert("MLX_JACCL_RING".to_string(), "1".to_string());
            }
        }
    }
    Ok(env)
}

fn utf8(path: &Path) -> Result<String, MlxError> {
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| MlxError::PathNotUtf8 {
            path: path.to_path_buf(),
        })
}

/// One host of an `mlx.launch` hostfile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchHost {
    /// How `mlx.launch` reaches the host over ssh.
    pub ssh: String,
    /// The addresses peers use to reach it.
    pub ips: Vec<Ipv4Addr>,
    /// Per peer (by rank), the RDMA devices cabled to it; empty for the ring backend.
    pub rdma: Vec<Vec<String>>,
}

#[derive(Serialize)]
struct LaunchFile<'a> {
    backend: Backend,
    envs: Vec<String>,
    hosts: Vec<LaunchFileHost<'a>>,
}

#[derive(Serialize)]
struct LaunchFileHost<'a> {
    ssh: &'a str,
    ips: &'a [Ipv4Addr],
    rdma: Vec<Devices<'a>>,
}

/// The `mlx.launch --hostfile` JSON for a placement, with `envs` passed as `KEY=VALUE`. Checks
/// what `mlx.launch` would: IPs for the ring backend and for the JACCL coordinator, and for
/// JACCL one `rdma` entry per host with none to itself.
pub fn launch_hostfile(
    backend: Backend,
    envs: &BTreeMap<String, String>,
    hosts: &[LaunchHost],
) -> Result<String, MlxError> {
    if hosts.is_empty() {
        return Err(MlxError::NoRanks);
    }
    if let Some(name) = envs.keys().find(|k| !valid_env_name(k)) {
        return Err(MlxError::InvalidEnvName { name: name.clone() });
    }
    let need_ip = |rank: usize, host: &LaunchHost| {
        if host.ips.is_empty() {
            Err(MlxError::NoIp {
                rank,
                ssh: host.ssh.clone(),
                backend,
            })
        } else {
            Ok(())
        }
    };
    if backend.is_jaccl() {
        need_ip(0, &hosts[0])?;
        check_matrix(&hosts.iter().map(|h| h.rdma.clone()).collect::<Vec<_>>())?;
    } else {
        for (rank, host) in hosts.iter().enumerate() {
            need_ip(rank, host)?;
        }
    }
    let file = LaunchFile {
        backend,
        envs: envs.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        hosts: hosts
            .iter()
            .map(|h| LaunchFileHost {
                ssh: &h.ssh,
                ips: &h.ips,
                rdma: h.rdma.iter().map(|d| Devices(d)).collect(),
            })
            .collect(),
    };
    to_json(&file)
}

/// `mlx.launch` skips variables whose names are not letters, digits and underscores.
fn valid_env_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Writes one of these files atomically (a temporary file renamed into place), so a rank that
/// starts while the file is rewritten reads the old or the new contents, never half of one.
pub fn write_atomic(path: &Path, contents: &str) -> Result<(), MlxError> {
    let error = |source| MlxError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    std::fs::write(&tmp, contents).map_err(error)?;
    std::fs::rename(&tmp, path).map_err(error)
}

fn to_json<T: Serialize + ?Sized>(value: &T) -> Result<String, MlxError> {
    Ok(serde_json::to_string(value)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Ipv4Addr {
        Ipv4Addr::new(192, 168, 0, last)
    }

    fn devs(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// Three Macs fully cabled: mac1–mac2 via en3, mac1–mac3 via en4, mac2–mac3 via en5.
    fn mesh3() -> Vec<Vec<Vec<String>>> {
        vec![
            vec![devs(&[]), devs(&["rdma_en3"]), devs(&["rdma_en4"])],
            vec![devs(&["rdma_en3"]), devs(&[]), devs(&["rdma_en5"])],
            vec![devs(&["rdma_en4"]), devs(&["rdma_en5"]), devs(&[])],
        ]
    }

    #[test]
    fn ring_of_three() {
        let ranks = [(ip(1), 32323), (ip(2), 32324), (ip(3), 32325)];
        assert_eq!(
            ring_hostfile(&ranks).expect("hostfile"),
            r#"[["192.168.0.1:32323"],["192.168.0.2:32324"],["192.168.0.3:32325"]]"#
        );
        assert_eq!(
            coordinator(&ranks).expect("coordinator"),
            "192.168.0.1:32323"
        );
        assert!(matches!(ring_hostfile(&[]), Err(MlxError::NoRanks)));

        let files = MlxFiles {
            hostfile_path: Some("/var/tb/jobs/j/hostfile.json".into()),
            ibv_devices_path: None,
        };
        let env = env_for_rank("train-qwen", 1, 3, Backend::Ring, &files, None).expect("env");
        let want: BTreeMap<String, String> = [
            ("MLX_HOSTFILE", "/var/tb/jobs/j/hostfile.json"),
            ("MLX_RANK", "1"),
            ("TB_JOB", "train-qwen"),
            ("TB_RANK", "1"),
            ("TB_WORLD_SIZE", "3"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(env, want);
    }

    #[test]
    fn addresses_parse() {
        assert_eq!(
            parse_address("192.168.0.1:32323").expect("parse"),
            (ip(1), 32323)
        );
        for bad in [
            "192.168.0.1",
            "[::1]:32323",
            "mac1:32323",
            "192.168.0.1:70000",
            "",
        ] {
            let err = parse_address(bad).expect_err(bad);
            assert!(err.to_string().contains("IPv4"), "{err}");
        }
    }

    #[test]
    fn jaccl_mesh_of_three() {
        assert_eq!(
            ibv_devices(&mesh3()).expect("matrix"),
            r#"[[null,"rdma_en3","rdma_en4"],["rdma_en3",null,"rdma_en5"],["rdma_en4","rdma_en5",null]]"#
        );
        check_cabling(Backend::Jaccl, &mesh3()).expect("a full mesh");

        let files = MlxFiles {
            hostfile_path: None,
            ibv_devices_path: Some("/var/tb/jobs/j/ibv.json".into()),
        };
        let coord = Some("192.168.0.1:32323".to_string());
        let env =
            env_for_rank("serve-kimi", 2, 3, Backend::Jaccl, &files, coord.clone()).expect("env");
        let want: BTreeMap<String, String> = [
            ("MLX_DISTRIBUTED_BACKEND", "jaccl"),
            ("MLX_IBV_DEVICES", "/var/tb/jobs/j/ibv.json"),
            ("MLX_JACCL_COORDINATOR", "192.168.0.1:32323"),
            ("MLX_RANK", "2"),
            ("TB_JOB", "serve-kimi"),
            ("TB_RANK", "2"),
            ("TB_WORLD_SIZE", "3"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(env, want);

        let env = env_for_rank("serve-kimi", 0, 3, Backend::JacclRing, &files, coord).expect("env");
        assert_eq!(env.get("MLX_JACCL_RING").map(String::as_str), Some("1"));
        assert_eq!(
            env.get("MLX_DISTRIBUTED_BACKEND").map(String::as_str),
            Some("jaccl-ring")
        );
        assert!(!env.contains_key("MLX_HOSTFILE"));
    }

    #[test]
    fn several_cables_and_missing_cables() {
        let mut m = mesh3();
        m[0][1] = devs(&["rdma_en3", "rdma_en6"]);
        m[1][0] = devs(&["rdma_en3", "rdma_en7"]);
        assert_eq!(
            ibv_devices(&m).expect("matrix"),
            r#"[[null,["rdma_en3","rdma_en6"],"rdma_en4"],[["rdma_en3","rdma_en7"],null,"rdma_en5"],["rdma_en4","rdma_en5",null]]"#
        );

        // A daisy chain 0–1–2: fine for neither a mesh nor a ring (2 and 0 are not cabled).
        let mut chain = mesh3();
        chain[0][2].clear();
        chain[2][0].clear();
        assert_eq!(
            ibv_devices(&chain).expect("matrix"),
            r#"[[null,"rdma_en3",null],["rdma_en3",null,"rdma_en5"],[null,"rdma_en5",null]]"#
        );
        let err = check_cabling(Backend::Jaccl, &chain).expect_err("not a mesh");
        assert!(
            matches!(err, MlxError::NotCabled { from: 0, to: 2, .. }),
            "{err}"
        );
        assert!(check_cabling(Backend::JacclRing, &chain).is_err());
        check_cabling(Backend::Ring, &chain).expect("TCP needs no cables");

        // Four in a ring 0-1-2-3-0 without diagonals: a JACCL ring, not a mesh.
        let cable = |a: usize, b: usize| {
            if (a + 1) % 4 == b || (b + 1) % 4 == a {
                devs(&["rdma_en3"])
            } else {
                vec![]
            }
        };
        let ring4: Vec<Vec<Vec<String>>> = (0..4)
            .map(|a| (0..4).map(|b| cable(a, b)).collect())
            .collect();
        check_cabling(Backend::JacclRing, &ring4).expect("ring");
        assert!(check_cabling(Backend::Jaccl, &ring4).is_err());
    }

    #[test]
    fn malformed_matrices_are_rejected() {
        let mut m = mesh3();
        m[1].pop();
        assert!(matches!(
            ibv_devices(&m),
            Err(MlxError::NotSquare {
                row: 1,
                len: 2,
                expected: 3
            })
        ));
        let mut m = mesh3();
        m[2][2] = devs(&["rdma_en9"]);
        let err = ibv_devices(&m).expect_err("self link");
        assert!(err.to_string().contains("rdma_en9"), "{err}");
        let mut m = mesh3();
        m[0][1] = devs(&[""]);
        assert!(matches!(
            ibv_devices(&m),
            Err(MlxError::EmptyDevice { row: 0, col: 1 })
        ));
        assert!(matches!(ibv_devices(&[]), Err(MlxError::NoRanks)));
        let big: Vec<Vec<Vec<String>>> = (0..9)
            .map(|a| {
                (0..9)
                    .map(|b| if a == b { vec![] } else { devs(&["rdma_en1"]) })
                    .collect()
            })
            .collect();
        assert!(matches!(
            check_cabling(Backend::Jaccl, &big),
            Err(MlxError::MeshTooLarge { hosts: 9 })
        ));
    }

    #[test]
    fn env_errors() {
        let none = MlxFiles::default();
        assert!(matches!(
            env_for_rank("j", 3, 3, Backend::Ring, &none, None),
            Err(MlxError::RankOutOfRange { rank: 3, world: 3 })
        ));
        assert!(matches!(
            env_for_rank("j", 0, 0, Backend::Ring, &none, None),
            Err(MlxError::NoRanks)
        ));
        let err = env_for_rank("j", 0, 2, Backend::Ring, &none, None).expect_err("no hostfile");
        assert!(err.to_string().contains("hostfile"), "{err}");
        let files = MlxFiles {
            hostfile_path: None,
            ibv_devices_path: Some("/x".into()),
        };
        let err =
            env_for_rank("j", 0, 2, Backend::Jaccl, &files, None).expect_err("no coordinator");
        assert!(err.to_string().contains("coordinator"), "{err}");
    }

    #[test]
    fn launch_hostfile_for_jaccl_mesh() {
        let hosts: Vec<LaunchHost> = mesh3()
            .into_iter()
            .enumerate()
            .map(|(i, rdma)| LaunchHost {
                ssh: format!("mac{}", i + 1),
                ips: vec![ip(i as u8 + 1)],
                rdma,
            })
            .collect();
        let envs = BTreeMap::from([("MLX_METAL_FAST_SYNCH".to_string(), "1".to_string())]);
        assert_eq!(
            launch_hostfile(Backend::Jaccl, &envs, &hosts).expect("hostfile"),
            concat!(
                r#"{"backend":"jaccl","envs":["MLX_METAL_FAST_SYNCH=1"],"hosts":["#,
                r#"{"ssh":"mac1","ips":["192.168.0.1"],"rdma":[null,"rdma_en3","rdma_en4"]},"#,
                r#"{"ssh":"mac2","ips":["192.168.0.2"],"rdma":["rdma_en3",null,"rdma_en5"]},"#,
                r#"{"ssh":"mac3","ips":["192.168.0.3"],"rdma":["rdma_en4","rdma_en5",null]}]}"#
            )
        );

        let mut bad = hosts.clone();
        bad[0].ips.clear();
        assert!(matches!(
            launch_hostfile(Backend::Jaccl, &envs, &bad),
            Err(MlxError::NoIp { rank: 0, .. })
        ));
        let mut bad = hosts.clone();
        bad[1].rdma.pop();
        assert!(matches!(
            launch_hostfile(Backend::JacclRing, &envs, &bad),
            Err(MlxError::NotSquare { .. })
        ));
        let bad_env = BTreeMap::from([("NOT-VALID".to_string(), "1".to_string())]);
        assert!(matches!(
            launch_hostfile(Backend::Jaccl, &bad_env, &hosts),
            Err(MlxError::InvalidEnvName { .. })
        ));
    }

    #[test]
    fn launch_hostfile_for_ring() {
        let hosts = vec![
            LaunchHost {
                ssh: "studio-1.local".into(),
                ips: vec![ip(1)],
                rdma: vec![],
            },
            LaunchHost {
                ssh: "studio-2.local".into(),
                ips: vec![ip(2)],
                rdma: vec![],
            },
        ];
        assert_eq!(
            launch_hostfile(Backend::Ring, &BTreeMap::new(), &hosts).expect("hostfile"),
            concat!(
                r#"{"backend":"ring","envs":[],"hosts":["#,
                r#"{"ssh":"studio-1.local","ips":["192.168.0.1"],"rdma":[]},"#,
                r#"{"ssh":"studio-2.local","ips":["192.168.0.2"],"rdma":[]}]}"#
            )
        );
        let mut bad = hosts;
        bad[1].ips.clear();
        let err =
            launch_hostfile(Backend::Ring, &BTreeMap::new(), &bad).expect_err("ring needs IPs");
        assert!(err.to_string().contains("studio-2.local"), "{err}");
    }

    #[test]
    fn files_are_written_atomically() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("hostfile.json");
        write_atomic(&path, "[]").expect("write");
        write_atomic(&path, r#"[["192.168.0.1:32323"]]"#).expect("overwrite");
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            r#"[["192.168.0.1:32323"]]"#
        );
        assert!(!dir.path().join("hostfile.json.tmp").exists());
        let err = write_atomic(&dir.path().join("missing/x.json"), "[]").expect_err("no dir");
        assert!(err.to_string().contains("missing"), "{err}");
    }
}
