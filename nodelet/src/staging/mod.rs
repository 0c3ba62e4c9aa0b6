//! Model staging: a nodelet whose Mac lacks a model's file fetches only the bytes its shard
//! needs — the GGUF header and its layers' tensors — from a nodelet that has the file, over tb's
//! transport, checks each tensor's SHA-256 against the holder's manifest, and keeps them in a
//! content-addressed cache under its data directory: `models/<header sha256>/model.gguf`, a
//! sparse file of the source's length holding just the fetched ranges, which the engine loads
//! like the whole file (it reads only its shard's tensors). What was verified is recorded next
//! to it (`verified.json`), so a restart resumes where it stopped; tensors are hashed again
//! before every use, so a corrupted byte is found and fetched again.
//!
//! - [`serve`]: the holder's side, an op of the probe server (the same port on every address);
//! - [`fetch`]: the fetching side;
//! - [`copies`]: whole staged copies a nodelet keeps and serves like the original file;
//! - [`adapter`]: a LoRA adapter's two files, fetched whole from the node that holds them;
//! - [`dataset`]: the examples of a fine-tune's dataset one rank uses, from the node that holds
//!   the file;
//! - [`shared`]: which files a holder serves at all (those every account could read).
//!
//! ## Protocol (op `F` on the probe server's port)
//!
//! The client sends a request (u32 big-endian length + JSON, [`Request`]); for
//! [`Request::Manifest`] the server answers with the [`Manifest`] (u32 length + JSON); for
//! [`Request::Ranges`] both ends open a 2-rank transport (the client is rank 0 and coordinator,
//! as in a link probe) and the server sends the header (when asked) and each tensor in the
//! order asked, in messages of at most [`CHUNK`] bytes; then it writes its verdict on the control
//! connection (`0`, or `1` + u16 length + message). The server serves only GGUF files, and of
//! them only the header and whole tensors.

pub mod adapter;
pub mod copies;
pub mod dataset;
pub mod fetch;
pub mod serve;
pub mod shared;

use serde::{Deserialize, Serialize};

/// Op byte on the probe server's port.
pub const OP_FETCH: u8 = b'F';
/// Largest transport message of a transfer.
pub const CHUNK: usize = 4 << 20;
/// Largest request or manifest on the control connection.
pub const MAX_CONTROL: usize = 4 << 20;

/// One tensor of the source file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorDigest {
    pub name: String,
    pub offset: u64,
    pub len: u64,
    pub sha256: String,
}

/// What the holder has: the file's length, its header and every tensor with its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub file_len: u64,
    pub header_len: u64,
    pub header_sha256: String,
    pub tensors: Vec<TensorDigest>,
}

impl Manifest {
    pub fn tensor(&self, name: &str) -> Option<&TensorDigest> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// What the client asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "want", rename_all = "camelCase")]
pub enum Request {
    Manifest {
        path: String,
    },
    Ranges {
        path: String,
        header: bool,
        tensors: Vec<String>,
        coordinator_port: u16,
        timeout_ms: u32,
    },
    /// A LoRA adapter directory's two files ([`adapter`]).
    Adapter {
        path: String,
    },
    /// A dataset's record count and digest ([`dataset`]).
    DatasetIndex {
        path: String,
    },
    /// Some records of a dataset ([`dataset`]): `records` is a bitmap, hex, bit i of byte
    /// i / 8 (least significant first) set for record i.
    DatasetRecords {
        path: String,
        sha256: String,
        records: String,
    },
}

/// Why staging failed.
#[derive(Debug, thiserror::Error)]
pub enum StagingError {
    #[error("{source_addr}: {what}: {error}")]
    Io {
        source_addr: String,
        what: &'static str,
        error: std::io::Error,
    },
    #[error("{source_addr}: {message}")]
    Refused {
        source_addr: String,
        message: String,
    },
    #[error("{source_addr}: transport: {message}")]
    Transport {
        source_addr: String,
        message: String,
    },
    #[error("{path}: {message}")]
    Cache { path: String, message: String },
    #[error(
        "tensor {name} from {source_addr} does not match its digest twice (expected {expected})"
    )]
    Corrupt {
        source_addr: String,
        name: String,
        expected: String,
    },
    #[error("the model file: {0}")]
    Model(String),
    /// Checked before fetching (and what a refused write means): nothing is written that
    /// cannot be finished, and the message says where and how much.
    #[error(
        "no space left on the nodelet's data disk: staging needs {need} in {dir}, which \
         has {free} free; free some space there (staging starts again with the next placement)"
    )]
    NoSpace {
        dir: String,
        need: String,
        free: String,
    },
}

/// Bytes as a short human figure (binary units).
pub fn human_bytes(bytes: u64) -> String {
    let mib = bytes as f64 / (1u64 << 20) as f64;
    if mib >= 1024.0 {
        format!("{:.1} GiB", mib / 1024.0)
    } else {
        format!("{mib:.1} MiB")
    }
}

/// Bytes free to this process on the filesystem of `dir` (None: it cannot be asked).
pub fn free_bytes(dir: &std::path::Path) -> Option<u64> {
    let s = nix::sys::statvfs::statvfs(dir).ok()?;
    Some((s.blocks_available() as u64).saturating_mul(s.fragment_size() as u64))
}

/// Room kept beyond the bytes to fetch (the verified record, filesystem overhead).
pub const SPACE_MARGIN: u64 = 1 << 20;

/// `Err(NoSpace)` when `dir` lacks room for `need` more bytes.
pub fn check_space(dir: &std::path::Path, need: u64) -> Result<(), StagingError> {
    match free_bytes(dir) {
        Some(free) if free < need.saturating_add(SPACE_MARGIN) => Err(StagingError::NoSpace {
            dir: dir.display().to_string(),
            need: format!("{} more", human_bytes(need)),
            free: human_bytes(free),
        }),
        _ => Ok(()),
    }
}

/// Hex SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

fn write_frame(w: &mut impl std::io::Write, bytes: &[u8]) -> std::io::Result<()> {
    w.write_all(&(bytes.len() as u32).to_be_bytes())?;
    w.write_all(bytes)
}

fn read_frame(r: &mut impl std::io::Read) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_CONTROL {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a {len}-byte control frame, at most {MAX_CONTROL} allowed"),
        ));
    }
    let mut b = vec![0u8; len];
    r.read_exact(&mut b)?;
    Ok(b)
}
