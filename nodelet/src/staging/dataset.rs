//! Staging a fine-tune's dataset: a rank on a Mac without the file fetches, from the nodelet of
//! the Node that holds it (`datasetNode`), only the examples it trains and evaluates on — its
//! share of every global batch and of the held-out split, which it computes from the record
//! count alone ([`crate::builtin::train::records_of_rank`]).
//!
//! A record is a non-blank line of the JSONL file, counted as `str::lines` does (a trailing
//! `\r` is part of the line ending); record i is example i of the engine's loader, so a rank
//! with fetched records batches exactly as one that read the whole file.
//!
//! Protocol (op `F` on the probe server's port):
//! - [`Request::DatasetIndex`]: the holder scans the file — UTF-8, every non-blank line a JSON
//!   object, so a bad line no rank fetches still fails the job with its line number — and
//!   answers `{"ok": {"records", "bytes", "sha256"}}` or `{"error": "path:line: ..."}`.
//! - [`Request::DatasetRecords`] (a bitmap of records, with the digest the index gave): the
//!   holder answers `{"ok": true}` (or an error), then each asked record in order as its line
//!   number (u64 big-endian) and a frame of its bytes, then the line number `u64::MAX` and a
//!   verdict frame: `{"ok": {"records", "sha256"}}` of the file as read this time, or an error.
//!   The client keeps nothing unless the digest is the index's and every asked record came.
//!
//! What is served: files every account could read ([`super::shared`]), at most the engine's
//! dataset limit, lines of at most [`MAX_CONTROL`] bytes.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::{MAX_CONTROL, OP_FETCH, Request, StagingError, read_frame, write_frame};

/// The largest dataset served (the engine reads no larger file).
pub const MAX_FILE_BYTES: u64 = tb_engine::train::data::MAX_FILE_BYTES;
/// Marks the end of the records in an answer.
const END: u64 = u64::MAX;

/// What the holder says of a dataset file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetIndex {
    /// Non-blank lines (examples).
    pub records: u64,
    pub bytes: u64,
    pub sha256: String,
}

/// One fetched record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Its index among the records (the example number).
    pub index: usize,
    /// Its 1-based line number in the holder's file.
    pub line: u64,
    pub text: String,
}

/// Reads `file` record by record: `visit(index, line, text)` for each non-blank line, in order.
/// Fails naming `path` and the line when a line is not UTF-8, not JSON or not an object.
/// Returns the record count and the file's SHA-256.
fn scan(
    file: std::fs::File,
    path: &str,
    mut visit: impl FnMut(usize, u64, &str) -> Result<(), String>,
) -> Result<(u64, String), String> {
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut hasher = sha2::Sha256::new();
    let mut buf = Vec::new();
    let (mut line_no, mut records) = (0u64, 0u64);
    loop {
        buf.clear();
        let n = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| format!("{path}: {e}"))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf);
        line_no += 1;
        let mut line = buf.as_slice();
        if let Some(l) = line.strip_suffix(b"\n") {
            line = l.strip_suffix(b"\r").unwrap_or(l);
        }
        let text = std::str::from_utf8(line).map_err(|e| {
            format!(
                "{path}:{line_no}: not UTF-8 text (byte {})",
                e.valid_up_to()
            )
        })?;
        if text.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(v) if v.is_object() => {}
            Ok(_) => {
                return Err(format!(
                    "{path}:{line_no}: expected a JSON object ({{\"messages\": ...}}, {{\"prompt\": ..., \"completion\": ...}} or {{\"text\": ...}})"
                ));
            }
            Err(e) => {
                return Err(format!(
                    "{path}:{line_no}: not JSON (column {}): {e}",
                    e.column()
                ));
            }
        }
        visit(records as usize, line_no, text)?;
        records += 1;
    }
    Ok((records, hex::encode(hasher.finalize())))
}

fn open(path: &str) -> Result<std::fs::File, String> {
    super::shared::open_shared(Path::new(path), "dataset", MAX_FILE_BYTES).map(|(f, _)| f)
}

/// The holder's side of [`Request::DatasetIndex`].
pub fn serve_index(control: &mut TcpStream, path: &str) -> std::io::Result<()> {
    let answer = match open(path).and_then(|f| {
        let bytes = f.metadata().map(|m| m.len()).unwrap_or(0);
        scan(f, path, |_, _, _| Ok(())).map(|(records, sha256)| DatasetIndex {
            records,
            bytes,
            sha256,
        })
    }) {
        Ok(index) => serde_json::json!({ "ok": index }),
        Err(e) => {
            tracing::debug!("refused to index dataset {path}: {e}");
            serde_json::json!({ "error": e })
        }
    };
    write_frame(control, answer.to_string().as_bytes())?;
    control.flush()
}

/// The holder's side of [`Request::DatasetRecords`].
pub fn serve_records(
    control: &mut TcpStream,
    path: &str,
    sha256: &str,
    records: &str,
) -> std::io::Result<()> {
    let opened = hex::decode(records)
        .map_err(|e| format!("records: not a hex bitmap: {e}"))
        .and_then(|bits| open(path).map(|f| (f, bits)));
    let (file, bits) = match opened {
        Ok(v) => v,
        Err(e) => {
            let answer = serde_json::json!({ "error": e });
            return write_frame(control, answer.to_string().as_bytes());
        }
    };
    write_frame(control, br#"{"ok":true}"#)?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, &mut *control);
    let mut sent: std::io::Result<()> = Ok(());
    let scanned = scan(file, path, |index, line, text| {
        if !bit(&bits, index) {
            return Ok(());
        }
        if text.len() > MAX_CONTROL {
            return Err(format!(
                "{path}:{line}: a line of {} bytes; a staged dataset's lines have at most {MAX_CONTROL}",
                text.len()
            ));
        }
        sent = w
            .write_all(&line.to_be_bytes())
            .and_then(|()| write_frame(&mut w, text.as_bytes()));
        sent.as_ref().map_err(|e| format!("sending: {e}"))?;
        Ok(())
    });
    sent?;
    let verdict = match scanned {
        Ok((n, digest)) if digest != sha256 => serde_json::json!({
            "error": format!("{path} changed since it was indexed (now {n} records, sha256 {digest})")
        }),
        Ok((n, digest)) => serde_json::json!({ "ok": {"records": n, "sha256": digest} }),
        Err(e) => serde_json::json!({ "error": e }),
    };
    w.write_all(&END.to_be_bytes())?;
    write_frame(&mut w, verdict.to_string().as_bytes())?;
    w.flush()
}

fn bit(bits: &[u8], i: usize) -> bool {
    bits.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0)
}

/// The hex bitmap of `wanted` (all below `n`).
fn bitmap(n: usize, wanted: &BTreeSet<usize>) -> String {
    let mut bits = vec![0u8; n.div_ceil(8)];
    for &i in wanted.iter().filter(|&&i| i < n) {
        bits[i / 8] |= 1 << (i % 8);
    }
    hex::encode(bits)
}

fn connect(
    source: SocketAddr,
    req: &Request,
    timeout: Duration,
) -> Result<TcpStream, StagingError> {
    let io = |what: &'static str| {
        move |error| StagingError::Io {
            source_addr: source.to_string(),
            what,
            error,
        }
    };
    let mut s =
        TcpStream::connect_timeout(&source, Duration::from_secs(5)).map_err(io("connecting"))?;
    s.set_read_timeout(Some(timeout)).map_err(io("socket"))?;
    s.write_all(&[OP_FETCH]).map_err(io("sending"))?;
    let body = serde_json::to_vec(req).map_err(|e| StagingError::Model(e.to_string()))?;
    write_frame(&mut s, &body).map_err(io("sending the request"))?;
    Ok(s)
}

/// Reads a `{"ok": ...}` / `{"error": ...}` frame.
fn answer(s: &mut impl Read, source: SocketAddr) -> Result<serde_json::Value, StagingError> {
    let raw = read_frame(s).map_err(|error| StagingError::Io {
        source_addr: source.to_string(),
        what: "reading the answer",
        error,
    })?;
    let refused = |message: String| StagingError::Refused {
        source_addr: source.to_string(),
        message,
    };
    let v: serde_json::Value = serde_json::from_slice(&raw)
        .map_err(|e| refused(format!("an answer that is not JSON: {e}")))?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        return Err(refused(e.to_string()));
    }
    v.get("ok")
        .cloned()
        .ok_or_else(|| refused("an answer with neither ok nor error".into()))
}

/// Asks the holder whose probe server is `source` for the index of the dataset at `path`.
pub fn fetch_index(
    source: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<DatasetIndex, StagingError> {
    let req = Request::DatasetIndex {
        path: path.to_string(),
    };
    let mut s = connect(source, &req, timeout)?;
    serde_json::from_value(answer(&mut s, source)?).map_err(|e| StagingError::Refused {
        source_addr: source.to_string(),
        message: format!("a malformed index: {e}"),
    })
}

/// Fetches records `wanted` of the dataset `index` describes, in order. Fails unless the file
/// is still the indexed one and every wanted record came.
pub fn fetch_records(
    source: SocketAddr,
    path: &str,
    index: &DatasetIndex,
    wanted: &BTreeSet<usize>,
    timeout: Duration,
) -> Result<Vec<Record>, StagingError> {
    let refused = |message: String| StagingError::Refused {
        source_addr: source.to_string(),
        message,
    };
    let n = usize::try_from(index.records).unwrap_or(usize::MAX);
    if let Some(&past) = wanted.iter().find(|&&i| i >= n) {
        return Err(refused(format!(
            "record {past} asked of a dataset of {n} records"
        )));
    }
    let records = bitmap(n, wanted);
    if records.len() + 1024 > MAX_CONTROL {
        return Err(refused(format!(
            "{path} has {n} records; a staged dataset has at most {} (keep a copy on every \
             rank's Mac and leave datasetNode out)",
            (MAX_CONTROL - 1024) * 4
        )));
    }
    let req = Request::DatasetRecords {
        path: path.to_string(),
        sha256: index.sha256.clone(),
        records,
    };
    let mut s = std::io::BufReader::with_capacity(1 << 20, connect(source, &req, timeout)?);
    answer(&mut s, source)?;
    let io = |what: &'static str| {
        move |error| StagingError::Io {
            source_addr: source.to_string(),
            what,
            error,
        }
    };
    let mut out = Vec::with_capacity(wanted.len());
    let mut expected = wanted.iter();
    loop {
        let mut line = [0u8; 8];
        s.read_exact(&mut line).map_err(io("reading a record"))?;
        let line = u64::from_be_bytes(line);
        if line == END {
            break;
        }
        let bytes = read_frame(&mut s).map_err(io("reading a record"))?;
        let text =
            String::from_utf8(bytes).map_err(|_| refused("a record that is not UTF-8".into()))?;
        let Some(&index) = expected.next() else {
            return Err(refused("more records than were asked for".into()));
        };
        out.push(Record { index, line, text });
    }
    let verdict = answer(&mut s, source)?;
    if verdict["sha256"].as_str() != Some(index.sha256.as_str()) {
        return Err(refused(format!("{path} changed while it was read")));
    }
    if out.len() != wanted.len() {
        return Err(refused(format!(
            "{} of {} asked records came",
            out.len(),
            wanted.len()
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A holder on loopback serving one connection per request, like the probe server.
    fn holder() -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let mut op = [0u8; 1];
                let mut c = c;
                if c.read_exact(&mut op).is_ok() && op[0] == OP_FETCH {
                    let _ = super::super::serve::serve(c);
                }
            }
        });
        addr
    }

    fn shared_file(text: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let p = dir.path().join("data.jsonl");
        std::fs::write(&p, text).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        (dir, p.display().to_string())
    }

    const TEXT: &str =
        "{\"text\": \"a\"}\n\n{\"text\": \"b\"}\r\n   \n{\"text\": \"c\"}\n{\"text\": \"d\"}";

    #[test]
    fn a_rank_gets_exactly_the_records_it_asks_for_with_their_lines() {
        let (_dir, path) = shared_file(TEXT);
        let source = holder();
        let t = Duration::from_secs(10);
        let index = fetch_index(source, &path, t).expect("index");
        assert_eq!(index.records, 4);
        assert_eq!(index.bytes, TEXT.len() as u64);
        assert_eq!(index.sha256, super::super::sha256(TEXT.as_bytes()));
        let wanted = BTreeSet::from([1, 3]);
        let got = fetch_records(source, &path, &index, &wanted, t).expect("records");
        assert_eq!(
            got,
            [
                Record {
                    index: 1,
                    line: 3,
                    text: "{\"text\": \"b\"}".into()
                },
                Record {
                    index: 3,
                    line: 6,
                    text: "{\"text\": \"d\"}".into()
                },
            ]
        );
        // The same records as the engine's loader numbers them.
        let lines: Vec<&str> = TEXT.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines[1], got[0].text);
        assert_eq!(lines[3], got[1].text);
        // Nothing asked, nothing sent; a record past the end is not asked at all.
        assert!(
            fetch_records(source, &path, &index, &BTreeSet::new(), t)
                .expect("none")
                .is_empty()
        );
        let e = fetch_records(source, &path, &index, &BTreeSet::from([4]), t).unwrap_err();
        assert!(e.to_string().contains("record 4"), "{e}");
    }

    #[test]
    fn a_changed_file_is_not_trusted_and_a_bad_line_is_named() {
        let (_dir, path) = shared_file(TEXT);
        let source = holder();
        let t = Duration::from_secs(10);
        let index = fetch_index(source, &path, t).expect("index");
        std::fs::write(&path, TEXT.replace('a', "z")).expect("rewrite");
        let e = fetch_records(source, &path, &index, &BTreeSet::from([0]), t).unwrap_err();
        assert!(e.to_string().contains("changed"), "{e}");

        std::fs::write(&path, "{\"text\": \"a\"}\n\n[1, 2]\n").expect("rewrite");
        let e = fetch_index(source, &path, t).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{path}:3: expected a JSON object")),
            "{e}"
        );
        std::fs::write(&path, "{\"text\": \"a\"}\n{\"text\": \n").expect("rewrite");
        let e = fetch_index(source, &path, t).unwrap_err().to_string();
        assert!(e.contains(&format!("{path}:2: not JSON")), "{e}");
    }

    #[test]
    fn a_private_dataset_is_refused() {
        let (dir, path) = shared_file(TEXT);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let source = holder();
        let e = fetch_index(source, &path, Duration::from_secs(10))
            .unwrap_err()
            .to_string();
        assert!(e.contains("o+r"), "{e}");
        let e = fetch_index(source, "data.jsonl", Duration::from_secs(10))
            .unwrap_err()
            .to_string();
        assert!(e.contains("absolute"), "{e}");
        drop(dir);
    }
}
