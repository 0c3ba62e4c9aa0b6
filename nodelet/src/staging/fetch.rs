//! The fetching side of staging: get the holder's manifest, make or reuse the cached sparse
//! file, check what it already holds, fetch the header and the missing or damaged tensors of
//! this shard over a transport session, verify each, and record them.

use std::collections::BTreeSet;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tb_engine::gguf::GgufIndex;

use super::{
    CHUNK, Manifest, OP_FETCH, Request, StagingError, TensorDigest, read_frame, sha256, write_frame,
};
use crate::probe::session::pick_coordinator_port;
use tb_transport::tcp::TcpConfig;
use tb_transport::{BufId, Endpoints, Preference, TransportError, select};

/// What to stage.
#[derive(Debug, Clone)]
pub struct Job {
    /// Nodelets that hold the file: their probe servers, `ip:port`; tried in order.
    pub sources: Vec<SocketAddr>,
    /// The file's path on the holders.
    pub path: String,
    /// Blocks of the shard; `count` None: to the last.
    pub first: usize,
    pub count: Option<usize>,
    /// `models/` under the nodelet's data directory.
    pub cache_root: PathBuf,
    pub timeout: Duration,
    /// Fetch every tensor of the file (not just the shard's) and record the whole copy
    /// (`super::copies`), which this nodelet then serves to others.
    pub whole: bool,
}

/// How far staging is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Bytes of the shard (header + its tensors) present and verified.
    pub have: u64,
    /// Bytes of the shard in all.
    pub need: u64,
}

/// What staging left.
#[derive(Debug, Clone)]
pub struct Staged {
    /// The sparse file to load.
    pub path: PathBuf,
    /// Bytes fetched this time (0 when everything was cached already).
    pub fetched: u64,
    /// Bytes this shard needs (header + tensors).
    pub needed: u64,
    /// Bytes of the whole source file.
    pub file_len: u64,
}

const VERIFIED: &str = "verified.json";

/// Stages the shard, from a whole copy this nodelet keeps when it has one, else trying each
/// source in turn; calls `progress` as bytes arrive.
pub fn stage(job: &Job, progress: &dyn Fn(Progress)) -> Result<Staged, StagingError> {
    let mut last = None;
    if let Some((_, m)) = super::copies::find(&job.cache_root, &job.path) {
        match stage_from(None, m, job, progress) {
            Ok(s) => return Ok(s),
            Err(e) => {
                tracing::warn!("the local copy of {} cannot serve: {e}", job.path);
                last = Some(e);
            }
        }
    }
    for source in &job.sources {
        let staged = fetch_manifest(*source, &job.path)
            .and_then(|m| stage_from(Some(*source), m, job, progress));
        match staged {
            Ok(s) => return Ok(s),
            Err(e) => {
                tracing::warn!(%source, "staging from this holder failed: {e}");
                last = Some(e);
            }
        }
    }
    Err(last.unwrap_or_else(|| StagingError::Model("no node holds the file".into())))
}

fn io(source: SocketAddr, what: &'static str) -> impl Fn(std::io::Error) -> StagingError {
    move |error| StagingError::Io {
        source_addr: source.to_string(),
        what,
        error,
    }
}

fn control(source: SocketAddr, req: &Request) -> Result<TcpStream, StagingError> {
    let mut s = TcpStream::connect_timeout(&source, Duration::from_secs(5))
        .map_err(io(source, "connecting"))?;
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .map_err(io(source, "socket"))?;
    let _ = s.set_nodelay(true);
    s.write_all(&[OP_FETCH]).map_err(io(source, "sending"))?;
    let body = serde_json::to_vec(req).map_err(|e| StagingError::Model(e.to_string()))?;
    write_frame(&mut s, &body).map_err(io(source, "sending the request"))?;
    Ok(s)
}

/// The holder's manifest of `path`.
pub fn fetch_manifest(source: SocketAddr, path: &str) -> Result<Manifest, StagingError> {
    let mut s = control(
        source,
        &Request::Manifest {
            path: path.to_string(),
        },
    )?;
    let raw = read_frame(&mut s).map_err(io(source, "reading the manifest"))?;
    let v: serde_json::Value = serde_json::from_slice(&raw).map_err(|e| StagingError::Refused {
        source_addr: source.to_string(),
        message: format!("a manifest that is not JSON: {e}"),
    })?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        return Err(StagingError::Refused {
            source_addr: source.to_string(),
            message: e.to_string(),
        });
    }
    serde_json::from_value(v["ok"].clone()).map_err(|e| StagingError::Refused {
        source_addr: source.to_string(),
        message: format!("a malformed manifest: {e}"),
    })
}

fn cache_err(path: &Path) -> impl Fn(std::io::Error) -> StagingError + '_ {
    move |e| {
        // The disk filled while writing (another process took the room): say so plainly.
        if e.raw_os_error() == Some(nix::libc::ENOSPC) {
            let dir = path.parent().unwrap_or(path);
            return StagingError::NoSpace {
                dir: dir.display().to_string(),
                need: "more room".into(),
                free: super::human_bytes(super::free_bytes(dir).unwrap_or(0)),
            };
        }
        StagingError::Cache {
            path: path.display().to_string(),
            message: e.to_string(),
        }
    }
}

/// Serialises the read-modify-write of `verified.json`: ranks of several allocations (and a
/// whole copy being made) may stage into one cache directory at once.
static VERIFIED_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Adds `verified` to the record in `dir` (keeping what others recorded meanwhile).
fn record_verified(dir: &Path, verified: &BTreeSet<String>) -> Result<(), StagingError> {
    let _held = VERIFIED_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut all: BTreeSet<String> = std::fs::read(dir.join(VERIFIED))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    all.extend(verified.iter().cloned());
    let record = serde_json::to_vec(&all).map_err(|e| StagingError::Model(e.to_string()))?;
    let tmp = dir.join(format!("{VERIFIED}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, record)
        .and_then(|_| std::fs::rename(&tmp, dir.join(VERIFIED)))
        .map_err(cache_err(dir))
}

/// What is missing from the cache is fetched from `source`; with no source (a whole copy
/// kept here), everything must be present and intact already.
fn stage_from(
    source: Option<SocketAddr>,
    m: Manifest,
    job: &Job,
    progress: &dyn Fn(Progress),
) -> Result<Staged, StagingError> {
    let origin = source.map_or_else(|| "the local copy".to_string(), |s| s.to_string());
    let dir = job
        .cache_root
        .join(&m.header_sha256[..32.min(m.header_sha256.len())]);
    std::fs::create_dir_all(&dir).map_err(cache_err(&dir))?;
    super::check_space(&dir, m.header_len)?;
    let file_path = dir.join("model.gguf");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&file_path)
        .map_err(cache_err(&file_path))?;
    // Sparse: holes where the other shards' tensors are.
    if file.metadata().map_err(cache_err(&file_path))?.len() != m.file_len {
        file.set_len(m.file_len).map_err(cache_err(&file_path))?;
    }
    let mut verified: BTreeSet<String> = std::fs::read(dir.join(VERIFIED))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let mut fetched = 0u64;

    // The header first: it says which tensors the shard needs.
    let header = TensorDigest {
        name: "<header>".into(),
        offset: 0,
        len: m.header_len,
        sha256: m.header_sha256.clone(),
    };
    if !intact(&mut file, &file_path, &header)? {
        let Some(source) = source else {
            return Err(StagingError::Model(format!(
                "{origin}: its header is damaged"
            )));
        };
        fetched += transfer(source, job, &m, true, &[], &mut file, &file_path)?;
        if !intact(&mut file, &file_path, &header)? {
            return Err(StagingError::Corrupt {
                source_addr: source.to_string(),
                name: header.name,
                expected: header.sha256,
            });
        }
    }
    let index = GgufIndex::open(&file_path).map_err(|e| StagingError::Model(e.to_string()))?;
    let n_layers = index.config().n_layers;
    let count = job
        .count
        .unwrap_or_else(|| n_layers.saturating_sub(job.first));
    let names: Vec<String> = if job.whole {
        m.tensors.iter().map(|t| t.name.clone()).collect()
    } else {
        index
            .shard_tensors(job.first, count)
            .map_err(|e| StagingError::Model(e.to_string()))?
            .iter()
            .map(|t| t.name.clone())
            .collect()
    };
    let wanted: Vec<&TensorDigest> = names
        .iter()
        .map(|n| {
            m.tensor(n).ok_or_else(|| StagingError::Refused {
                source_addr: origin.clone(),
                message: format!("the manifest lacks tensor {n}"),
            })
        })
        .collect::<Result<_, _>>()?;
    let need = m.header_len + wanted.iter().map(|t| t.len).sum::<u64>();
    // What is cached and still intact (hashing what was verified before catches corruption).
    let mut missing = Vec::new();
    let mut have = m.header_len;
    for t in &wanted {
        if verified.contains(&t.name) && intact(&mut file, &file_path, t)? {
            have += t.len;
        } else {
            verified.remove(&t.name);
            missing.push(*t);
        }
    }
    progress(Progress { have, need });
    // Refuse before writing a byte when the shard cannot fit: a disk filled half-way by a
    // transfer that then fails helps nobody.
    super::check_space(&dir, missing.iter().map(|t| t.len).sum())?;
    for attempt in 0..2 {
        if missing.is_empty() {
            break;
        }
        let Some(source) = source else {
            return Err(StagingError::Model(format!(
                "{origin} lacks {} tensor(s) of the shard",
                missing.len()
            )));
        };
        let names: Vec<String> = missing.iter().map(|t| t.name.clone()).collect();
        fetched += transfer(source, job, &m, false, &names, &mut file, &file_path)?;
        let mut still = Vec::new();
        for t in missing {
            if intact(&mut file, &file_path, t)? {
                verified.insert(t.name.clone());
                have += t.len;
            } else if attempt == 1 {
                return Err(StagingError::Corrupt {
                    source_addr: source.to_string(),
                    name: t.name.clone(),
                    expected: t.sha256.clone(),
                });
            } else {
                tracing::warn!(tensor = %t.name, "a fetched tensor does not match its digest; fetching it again");
                still.push(t);
            }
        }
        missing = still;
        record_verified(&dir, &verified)?;
        progress(Progress { have, need });
    }
    if source.is_some() {
        file.sync_all().map_err(cache_err(&file_path))?;
    }
    if job.whole && source.is_some() {
        super::copies::record(&dir, &job.path, &m).map_err(cache_err(&dir))?;
    }
    Ok(Staged {
        path: file_path,
        fetched,
        needed: need,
        file_len: m.file_len,
    })
}

/// Whether the cached bytes of `t` hash to its digest.
fn intact(file: &mut std::fs::File, path: &Path, t: &TensorDigest) -> Result<bool, StagingError> {
    let mut b = vec![0u8; t.len as usize];
    file.seek(SeekFrom::Start(t.offset))
        .and_then(|_| file.read_exact(&mut b))
        .map_err(cache_err(path))?;
    Ok(sha256(&b) == t.sha256)
}

/// One transfer session: the header (when asked) and `names`, written into `file`.
fn transfer(
    source: SocketAddr,
    job: &Job,
    m: &Manifest,
    header: bool,
    names: &[String],
    file: &mut std::fs::File,
    file_path: &Path,
) -> Result<u64, StagingError> {
    let probe = TcpStream::connect_timeout(&source, Duration::from_secs(5))
        .map_err(io(source, "connecting"))?;
    let local: IpAddr = probe.local_addr().map_err(io(source, "socket"))?.ip();
    drop(probe);
    let coordinator_port = pick_coordinator_port(local).map_err(io(source, "picking a port"))?;
    let mut control = control(
        source,
        &Request::Ranges {
            path: job.path.clone(),
            header,
            tensors: names.to_vec(),
            coordinator_port,
            timeout_ms: job.timeout.as_millis().min(u128::from(u32::MAX)) as u32,
        },
    )?;
    let mut ranges = Vec::new();
    if header {
        ranges.push((0u64, m.header_len));
    }
    for n in names {
        let t = m
            .tensor(n)
            .ok_or_else(|| StagingError::Model(format!("no tensor {n}")))?;
        ranges.push((t.offset, t.len));
    }
    let ep = Endpoints {
        rank: 0,
        world: 2,
        peers: vec![SocketAddr::new(local, 0), SocketAddr::new(source.ip(), 0)],
        coordinator: SocketAddr::new(local, coordinator_port),
        connect_timeout: job.timeout.min(Duration::from_secs(30)),
    };
    let received = receive(&ep, &ranges, file, file_path, job.timeout);
    // The server's verdict explains a failure on our side.
    let mut code = [0u8; 1];
    let verdict = control.read_exact(&mut code).map(|_| code[0]);
    let theirs = match verdict {
        Ok(0) => None,
        Ok(_) => {
            let mut len = [0u8; 2];
            let mut msg = Vec::new();
            if control.read_exact(&mut len).is_ok() {
                msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
                let _ = control.read_exact(&mut msg);
            }
            Some(String::from_utf8_lossy(&msg).into_owned())
        }
        Err(e) => Some(format!("no verdict: {e}")),
    };
    match (received, theirs) {
        (Ok(n), None) => Ok(n),
        (Ok(_), Some(t)) => Err(StagingError::Refused {
            source_addr: source.to_string(),
            message: t,
        }),
        (Err(e), theirs) => Err(StagingError::Transport {
            source_addr: source.to_string(),
            message: match theirs {
                Some(t) => format!("{e} (the holder: {t})"),
                None => e.to_string(),
            },
        }),
    }
}

fn receive(
    ep: &Endpoints,
    ranges: &[(u64, u64)],
    file: &mut std::fs::File,
    file_path: &Path,
    timeout: Duration,
) -> Result<u64, TransportError> {
    let tcp = TcpConfig::default().spinning_for(ep, 1);
    let mut t = select::open_endpoints(ep, Preference::Auto, tcp)?;
    let deadline = Instant::now() + timeout;
    // The messages, in order: (file offset, length).
    let mut messages = std::collections::VecDeque::new();
    for &(offset, len) in ranges {
        let mut done = 0;
        while done < len {
            let n = (len - done).min(CHUNK as u64);
            messages.push_back((offset + done, n));
            done += n;
        }
    }
    let depth = 4.min(messages.len().max(1));
    let bufs: Vec<BufId> = (0..depth)
        .map(|_| t.register(CHUNK))
        .collect::<Result<_, _>>()?;
    // Receives complete in the order posted for one peer (small ones may overtake a striped
    // big one, so each completion is matched by its wr_id, the message's sequence number).
    let mut posted = std::collections::BTreeMap::new();
    let mut next = 0usize;
    let total = messages.len();
    let mut free: Vec<BufId> = bufs.clone();
    let mut received = 0u64;
    let mut done = 0usize;
    let mut comps = Vec::new();
    while done < total {
        while next < total && !free.is_empty() {
            let Some(b) = free.pop() else { break };
            t.post_recv(1, b, next as u64)?;
            posted.insert(next, b);
            next += 1;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(TransportError::Timeout {
                peer: Some(1),
                step: "staging: receiving".into(),
            });
        }
        comps.clear();
        t.poll(&mut comps, left)?;
        for c in comps.drain(..) {
            c.result?;
            let seq = c.wr_id as usize;
            let Some(b) = posted.remove(&seq) else {
                continue;
            };
            let (offset, len) = messages[seq];
            if c.len as u64 != len {
                return Err(TransportError::Malformed {
                    peer: 1,
                    what: format!("message {seq} has {} bytes, {len} expected", c.len),
                });
            }
            file.seek(SeekFrom::Start(offset))
                .and_then(|_| file.write_all(&t.buf(b)[..c.len]))
                .map_err(|e| TransportError::Io {
                    peer: None,
                    source: std::io::Error::new(e.kind(), format!("{}: {e}", file_path.display())),
                })?;
            received += c.len as u64;
            done += 1;
            free.push(b);
        }
    }
    // Receipt: the holder may close now.
    let ack = t.register(8)?;
    t.post_send(1, ack, 0, 99)?;
    let mut sent = false;
    while !sent {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        comps.clear();
        t.poll(&mut comps, left)?;
        sent = comps.iter().any(|c| c.wr_id == 99);
    }
    Ok(received)
}
