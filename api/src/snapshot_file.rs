//! The backup file `tbctl snapshot save` writes and `tb-controller restore` reads: a magic line,
//! a one-line JSON header (format version, cluster id, revision, the body's length and SHA-256),
//! then the body, the controller's store as JSON.
//!
//! The header lets a reader refuse what it must not restore — another kind of file, a newer
//! format, a truncated or altered copy — with a message that says which, before it reads the
//! body. The body holds every object, user and schedule, and the hashes of users' tokens and
//! nodes' credentials: a snapshot file is a secret and is written mode 0600.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The first line of every snapshot file.
pub const MAGIC: &[u8] = b"tb-snapshot\n";

/// The newest format this build writes and reads.
pub const FORMAT: u32 = 1;

/// A header line longer than this is not a header.
const MAX_HEADER_BYTES: usize = 64 * 1024;

/// What the header says about the body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotHeader {
    /// The file format's version.
    pub format: u32,
    /// The cluster the snapshot was taken of (empty for a cluster made before clusters had ids).
    pub cluster_id: String,
    /// The store's revision (the last applied log index) the snapshot holds.
    pub revision: u64,
    /// When it was taken (RFC 3339, UTC).
    pub created_at: String,
    /// The tb version of the controller that took it.
    pub tb_version: String,
    /// The body's length in bytes.
    pub body_bytes: u64,
    /// The body's SHA-256, lowercase hex.
    pub body_sha256: String,
}

/// Why a file is not a snapshot this build can restore.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotFileError {
    #[error("not a tb snapshot file (it does not start with \"tb-snapshot\")")]
    NotASnapshot,
    #[error("the snapshot header is unreadable: {0}")]
    BadHeader(String),
    #[error(
        "the snapshot has format version {found}; this build reads up to {supported} — use a newer tb"
    )]
    NewerFormat { found: u32, supported: u32 },
    #[error(
        "the snapshot is truncated: its header promises {expected} bytes of data, the file holds {found}"
    )]
    Truncated { expected: u64, found: u64 },
    #[error("the snapshot is corrupt: {found} bytes of data where its header promises {expected}")]
    TrailingBytes { expected: u64, found: u64 },
    #[error(
        "the snapshot is corrupt: its data does not match the checksum in its header (sha256 {expected}, found {found})"
    )]
    ChecksumMismatch { expected: String, found: String },
}

impl SnapshotHeader {
    /// The header for `body`, taken of `cluster_id` at `revision`.
    pub fn for_body(cluster_id: &str, revision: u64, created_at: &str, body: &[u8]) -> Self {
        SnapshotHeader {
            format: FORMAT,
            cluster_id: cluster_id.to_string(),
            revision,
            created_at: created_at.to_string(),
            tb_version: env!("CARGO_PKG_VERSION").to_string(),
            body_bytes: body.len() as u64,
            body_sha256: sha256_hex(body),
        }
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The whole file: magic, header line, body.
pub fn encode(header: &SnapshotHeader, body: &[u8]) -> Vec<u8> {
    // A struct of strings and numbers always serializes.
    let line = serde_json::to_vec(header).unwrap_or_default();
    let mut out = Vec::with_capacity(MAGIC.len() + line.len() + 1 + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&line);
    out.push(b'\n');
    out.extend_from_slice(body);
    out
}

/// Check a whole file and return its header and body: the magic, the header, the format
/// version, the body's length and checksum.
pub fn decode(file: &[u8]) -> Result<(SnapshotHeader, &[u8]), SnapshotFileError> {
    let header = read_header(file)?;
    let body = &file[header_len(file)?..];
    let found = body.len() as u64;
    if found < header.body_bytes {
        return Err(SnapshotFileError::Truncated {
            expected: header.body_bytes,
            found,
        });
    }
    if found > header.body_bytes {
        return Err(SnapshotFileError::TrailingBytes {
            expected: header.body_bytes,
            found,
        });
    }
    let sum = sha256_hex(body);
    if sum != header.body_sha256 {
        return Err(SnapshotFileError::ChecksumMismatch {
            expected: header.body_sha256,
            found: sum,
        });
    }
    Ok((header, body))
}

/// The header alone (the magic and the format version checked, not the body).
pub fn read_header(file: &[u8]) -> Result<SnapshotHeader, SnapshotFileError> {
    let end = header_len(file)?;
    let line = &file[MAGIC.len()..end - 1];
    // The format first, leniently: a newer header may have fields this build does not know.
    let format = serde_json::from_slice::<serde_json::Value>(line)
        .map_err(|e| SnapshotFileError::BadHeader(e.to_string()))?
        .get("format")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| SnapshotFileError::BadHeader("no format version".into()))?;
    if format > u64::from(FORMAT) {
        return Err(SnapshotFileError::NewerFormat {
            found: u32::try_from(format).unwrap_or(u32::MAX),
            supported: FORMAT,
        });
    }
    serde_json::from_slice(line).map_err(|e| SnapshotFileError::BadHeader(e.to_string()))
}

/// Where the body starts: after the magic and the header's newline.
fn header_len(file: &[u8]) -> Result<usize, SnapshotFileError> {
    if !file.starts_with(MAGIC) {
        return Err(SnapshotFileError::NotASnapshot);
    }
    let rest = &file[MAGIC.len()..file.len().min(MAGIC.len() + MAX_HEADER_BYTES)];
    match rest.iter().position(|b| *b == b'\n') {
        Some(n) => Ok(MAGIC.len() + n + 1),
        None if rest.len() >= MAX_HEADER_BYTES => Err(SnapshotFileError::BadHeader(format!(
            "no end of the header line within {MAX_HEADER_BYTES} bytes"
        ))),
        None => Err(SnapshotFileError::BadHeader(
            "the file ends inside its header (truncated)".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(body: &[u8]) -> Vec<u8> {
        let header = SnapshotHeader::for_body("c-1", 42, "2026-01-01T00:00:00.000Z", body);
        encode(&header, body)
    }

    #[test]
    fn a_file_reads_back_as_written() {
        let body = br#"{"objects":{}}"#;
        let f = file(body);
        let (header, read) = decode(&f).expect("valid");
        assert_eq!(read, body);
        assert_eq!(header.format, FORMAT);
        assert_eq!(header.cluster_id, "c-1");
        assert_eq!(header.revision, 42);
        assert_eq!(header.body_bytes, body.len() as u64);
        assert_eq!(header.body_sha256.len(), 64);
    }

    #[test]
    fn a_truncated_file_is_refused_and_says_so() {
        let f = file(b"0123456789");
        for cut in [f.len() - 1, f.len() - 10] {
            let e = decode(&f[..cut]).expect_err("truncated");
            assert!(matches!(e, SnapshotFileError::Truncated { .. }), "{e}");
            assert!(e.to_string().contains("truncated"), "{e}");
        }
        // Cut inside the header line.
        let e = decode(&f[..MAGIC.len() + 5]).expect_err("no header end");
        assert!(e.to_string().contains("truncated"), "{e}");
    }

    #[test]
    fn an_altered_body_is_refused() {
        let mut f = file(b"0123456789");
        let last = f.len() - 1;
        f[last] ^= 1;
        let e = decode(&f).expect_err("altered");
        assert!(
            matches!(e, SnapshotFileError::ChecksumMismatch { .. }),
            "{e}"
        );
        let mut f = file(b"0123456789");
        f.push(b'x');
        assert!(matches!(
            decode(&f),
            Err(SnapshotFileError::TrailingBytes { .. })
        ));
    }

    #[test]
    fn another_kind_of_file_is_refused() {
        let e = decode(b"SQLite format 3\0...").expect_err("foreign");
        assert_eq!(e, SnapshotFileError::NotASnapshot);
        assert!(decode(b"").is_err());
        let e = decode(b"tb-snapshot\nnot json\nbody").expect_err("bad header");
        assert!(matches!(e, SnapshotFileError::BadHeader(_)), "{e}");
    }

    #[test]
    fn a_newer_format_is_refused_with_the_versions() {
        let body = b"{}";
        let mut header = SnapshotHeader::for_body("c", 1, "t", body);
        header.format = FORMAT + 1;
        let mut v = serde_json::to_value(&header).expect("json");
        // A newer writer may add fields: the version check comes first.
        v["somethingNew"] = serde_json::json!(true);
        let mut f = MAGIC.to_vec();
        f.extend_from_slice(v.to_string().as_bytes());
        f.push(b'\n');
        f.extend_from_slice(body);
        let e = decode(&f).expect_err("newer");
        assert_eq!(
            e,
            SnapshotFileError::NewerFormat {
                found: FORMAT + 1,
                supported: FORMAT
            }
        );
        assert!(e.to_string().contains("use a newer tb"), "{e}");
    }
}
