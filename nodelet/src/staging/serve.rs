//! The holder's side of staging: answers a manifest request with the file's tensors and their
//! digests (computed once per file version and kept), and a ranges request by sending the
//! header and the asked tensors over a transport session back to the client.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use tb_engine::gguf::GgufIndex;

use super::{CHUNK, Manifest, Request, TensorDigest, read_frame, sha256, write_frame};
use tb_transport::tcp::TcpConfig;
use tb_transport::{BufId, Endpoints, Preference, Transport, TransportError, select};

/// Transfers in flight at once.
const DEPTH: usize = 4;
/// The longest transfer session a server agrees to.
const MAX_SESSION: Duration = Duration::from_secs(3600);

type Key = (PathBuf, u64, Option<SystemTime>);

fn manifests() -> &'static Mutex<HashMap<Key, Arc<Manifest>>> {
    static M: OnceLock<Mutex<HashMap<Key, Arc<Manifest>>>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The manifest of the GGUF file at `path` (cached while the file's length and mtime stay).
pub fn manifest(path: &Path) -> Result<Arc<Manifest>, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let key = (path.to_path_buf(), meta.len(), meta.modified().ok());
    if let Some(m) = manifests()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
    {
        return Ok(m.clone());
    }
    let index = GgufIndex::open(path).map_err(|e| e.to_string())?;
    let mut file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut read = |offset: u64, len: u64| -> Result<Vec<u8>, String> {
        let mut b = vec![0u8; len as usize];
        file.seek(SeekFrom::Start(offset))
            .and_then(|_| file.read_exact(&mut b))
            .map_err(|e| format!("{}: reading {len} bytes at {offset}: {e}", path.display()))?;
        Ok(b)
    };
    let header_sha256 = sha256(&read(0, index.header_len())?);
    let mut tensors = Vec::new();
    for t in index.tensors() {
        index.check_in_file(t).map_err(|e| e.to_string())?;
        tensors.push(TensorDigest {
            name: t.name.clone(),
            offset: t.offset,
            len: t.len,
            sha256: sha256(&read(t.offset, t.len)?),
        });
    }
    tensors.sort_by_key(|t| t.offset);
    let m = Arc::new(Manifest {
        file_len: index.file_len(),
        header_len: index.header_len(),
        header_sha256,
        tensors,
    });
    manifests()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, m.clone());
    Ok(m)
}

/// The file to serve for `path` and its manifest: the file at that path, or else a whole
/// staged copy of it this nodelet keeps (`super::copies`).
fn resolve(path: &str) -> Result<(PathBuf, Arc<Manifest>), String> {
    let at = Path::new(path);
    if !at.is_file()
        && let Some(root) = super::copies::root()
        && let Some((file, m)) = super::copies::find(root, path)
    {
        return Ok((file, Arc::new(m)));
    }
    manifest(at).map(|m| (at.to_path_buf(), m))
}

/// Serves one staging control connection (after its op byte), blocking.
pub fn serve(mut control: TcpStream) -> std::io::Result<()> {
    control.set_read_timeout(Some(Duration::from_secs(30)))?;
    let raw = read_frame(&mut control)?;
    let req: Request = serde_json::from_slice(&raw).map_err(|e| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, format!("request: {e}"))
    })?;
    match req {
        Request::Adapter { path } => super::adapter::serve(&mut control, &path),
        Request::DatasetIndex { path } => super::dataset::serve_index(&mut control, &path),
        Request::DatasetRecords {
            path,
            sha256,
            records,
        } => super::dataset::serve_records(&mut control, &path, &sha256, &records),
        Request::Manifest { path } => {
            let answer = match resolve(&path) {
                Ok((_, m)) => serde_json::json!({"ok": &*m}),
                Err(e) => serde_json::json!({"error": e}),
            };
            write_frame(&mut control, answer.to_string().as_bytes())
        }
        Request::Ranges {
            path,
            header,
            tensors,
            coordinator_port,
            timeout_ms,
        } => {
            let local = control.local_addr()?.ip();
            let peer = control.peer_addr()?.ip();
            let timeout = Duration::from_millis(u64::from(timeout_ms)).min(MAX_SESSION);
            let outcome = resolve(&path).and_then(|(file, m)| {
                let mut ranges = Vec::new();
                if header {
                    ranges.push((0, m.header_len));
                }
                for name in &tensors {
                    let t = m
                        .tensor(name)
                        .ok_or_else(|| format!("{path} has no tensor {name}"))?;
                    ranges.push((t.offset, t.len));
                }
                let ep = Endpoints {
                    rank: 1,
                    world: 2,
                    peers: vec![SocketAddr::new(peer, 0), SocketAddr::new(local, 0)],
                    coordinator: SocketAddr::new(peer, coordinator_port),
                    connect_timeout: timeout.min(Duration::from_secs(30)),
                };
                send_ranges(&ep, &file, &ranges, timeout).map_err(|e| e.to_string())
            });
            let verdict = match outcome {
                Ok(()) => vec![0u8],
                Err(message) => {
                    tracing::debug!(%peer, "staging transfer failed: {message}");
                    let n = message.len().min(u16::MAX as usize);
                    let mut v = vec![1u8];
                    v.extend_from_slice(&(n as u16).to_be_bytes());
                    v.extend_from_slice(&message.as_bytes()[..n]);
                    v
                }
            };
            control.write_all(&verdict)
        }
    }
}

fn send_ranges(
    ep: &Endpoints,
    path: &Path,
    ranges: &[(u64, u64)],
    timeout: Duration,
) -> Result<(), TransportError> {
    let tcp = TcpConfig::default().spinning_for(ep, 1);
    let mut t = select::open_endpoints(ep, Preference::Auto, tcp)?;
    let mut file = std::fs::File::open(path).map_err(|e| TransportError::Io {
        peer: None,
        source: e,
    })?;
    let bufs: Vec<BufId> = (0..DEPTH)
        .map(|_| t.register(CHUNK))
        .collect::<Result<_, _>>()?;
    let deadline = Instant::now() + timeout;
    let mut free: Vec<BufId> = bufs.clone();
    let mut comps = Vec::new();
    for &(offset, len) in ranges {
        let mut done = 0u64;
        while done < len {
            while free.is_empty() {
                wait(t.as_mut(), &mut comps, deadline, &mut free, &bufs)?;
            }
            let Some(b) = free.pop() else { continue };
            let n = (len - done).min(CHUNK as u64) as usize;
            file.seek(SeekFrom::Start(offset + done))
                .and_then(|_| file.read_exact(&mut t.buf_mut(b)[..n]))
                .map_err(|e| TransportError::Io {
                    peer: None,
                    source: e,
                })?;
            t.post_send(0, b, n, u64::from(b.0))?;
            done += n as u64;
        }
    }
    while free.len() < DEPTH {
        wait(t.as_mut(), &mut comps, deadline, &mut free, &bufs)?;
    }
    // Keep the connection until the client has everything: it says so with one empty message.
    let ack = t.register(8)?;
    t.post_recv(0, ack, 99)?;
    let mut got = false;
    while !got {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(TransportError::Timeout {
                peer: Some(0),
                step: "staging: waiting for the client's receipt".into(),
            });
        }
        comps.clear();
        t.poll(&mut comps, left)?;
        for c in comps.drain(..) {
            c.result?;
            got |= c.wr_id == 99;
        }
    }
    Ok(())
}

fn wait(
    t: &mut dyn Transport,
    comps: &mut Vec<tb_transport::Completion>,
    deadline: Instant,
    free: &mut Vec<BufId>,
    bufs: &[BufId],
) -> Result<(), TransportError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(TransportError::Timeout {
            peer: Some(0),
            step: "staging: sending".into(),
        });
    }
    comps.clear();
    t.poll(comps, left)?;
    for c in comps.drain(..) {
        c.result?;
        if let Some(b) = bufs.iter().find(|b| u64::from(b.0) == c.wr_id) {
            free.push(*b);
        }
    }
    Ok(())
}
