//! Staging a LoRA adapter: a rank whose service names an adapter held by another Node fetches
//! the adapter's two PEFT files from that node's nodelet and keeps them in the staging cache,
//! `adapters/<sha256 of the weights>/`, which `tb-shard --adapter` then reads.
//!
//! Protocol (op `F` on the probe server's port, request [`Request::Adapter`]): the holder
//! answers with one control frame, `{"ok": [file, file]}` (each [`AdapterFile`]) or
//! `{"error": message}`, then sends the config's bytes and the weights' bytes on the same
//! connection. The client checks each file's length and SHA-256 and writes them beside their
//! final names, so a reader never sees half an adapter.
//!
//! What the holder serves: the staging port answers anyone who can reach it, and the nodelet
//! may run as root, so it serves only what every local account could read anyway — an absolute,
//! normalised directory, both files regular (not links), readable by all (`o+r`) under
//! directories every account may enter (`o+x`), and no larger than an adapter can be. An
//! adapter kept private to one account (a job's `work/` is 0700) is refused with that said.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::{OP_FETCH, Request, StagingError, read_frame, write_frame};

/// The files of a PEFT adapter directory, in the order they are sent.
const FILES: [&str; 2] = [
    tb_engine::adapter::CONFIG_FILE,
    tb_engine::adapter::WEIGHTS_FILE,
];
/// The most bytes each file may have (the engine refuses larger ones too).
const MAX_BYTES: [u64; 2] = [1 << 20, tb_engine::adapter::MAX_WEIGHTS_BYTES];

/// One file of an adapter, as the holder announces it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdapterFile {
    pub name: String,
    pub len: u64,
    pub sha256: String,
}

/// Opens one file of the adapter directory `dir` for serving ([`super::shared`]).
fn open_shared(dir: &Path, name: &str, max: u64) -> Result<(std::fs::File, u64), String> {
    super::shared::check_path(dir, "adapter directory")?;
    super::shared::open_shared(&dir.join(name), "adapter", max)
}

/// The holder's side: answers `path` on `control` (after the request was read).
pub fn serve(control: &mut TcpStream, path: &str) -> std::io::Result<()> {
    let dir = Path::new(path);
    let mut opened = Vec::new();
    let mut files = Vec::new();
    for (name, max) in FILES.iter().zip(MAX_BYTES) {
        match open_shared(dir, name, max).and_then(|(mut f, len)| {
            let digest = hash(&mut f, len).map_err(|e| format!("{name}: {e}"))?;
            Ok((f, len, digest))
        }) {
            Ok((f, len, sha256)) => {
                files.push(AdapterFile {
                    name: name.to_string(),
                    len,
                    sha256,
                });
                opened.push(f);
            }
            Err(e) => {
                tracing::debug!("refused to serve adapter {path}: {e}");
                let answer = serde_json::json!({ "error": e });
                return write_frame(control, answer.to_string().as_bytes());
            }
        }
    }
    let answer = serde_json::json!({ "ok": files });
    write_frame(control, answer.to_string().as_bytes())?;
    for (mut f, meta) in opened.into_iter().zip(&files) {
        use std::io::Seek;
        f.seek(std::io::SeekFrom::Start(0))?;
        let copied = std::io::copy(&mut (&mut f).take(meta.len), control)?;
        if copied != meta.len {
            return Err(std::io::Error::other(format!(
                "{} shrank while being sent",
                meta.name
            )));
        }
    }
    control.flush()
}

/// Hex SHA-256 of the next `len` bytes of `r`.
fn hash(r: &mut impl Read, len: u64) -> std::io::Result<String> {
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = (left as usize).min(buf.len());
        r.read_exact(&mut buf[..n])?;
        h.update(&buf[..n]);
        left -= n as u64;
    }
    Ok(hex::encode(h.finalize()))
}

/// Fetches the adapter at `path` on the holder whose probe server is `source` into
/// `cache_root` (the nodelet's `adapters/`), returning the directory to load.
pub fn fetch(
    source: SocketAddr,
    path: &str,
    cache_root: &Path,
    timeout: Duration,
) -> Result<PathBuf, StagingError> {
    let io = |what: &'static str| {
        move |error| StagingError::Io {
            source_addr: source.to_string(),
            what,
            error,
        }
    };
    let refused = |message: String| StagingError::Refused {
        source_addr: source.to_string(),
        message,
    };
    let mut s =
        TcpStream::connect_timeout(&source, Duration::from_secs(5)).map_err(io("connecting"))?;
    s.set_read_timeout(Some(timeout.min(Duration::from_secs(120))))
        .map_err(io("socket"))?;
    s.write_all(&[OP_FETCH]).map_err(io("sending"))?;
    let req = Request::Adapter {
        path: path.to_string(),
    };
    let body = serde_json::to_vec(&req).map_err(|e| StagingError::Model(e.to_string()))?;
    write_frame(&mut s, &body).map_err(io("sending the request"))?;
    let raw = read_frame(&mut s).map_err(io("reading the answer"))?;
    let v: serde_json::Value = serde_json::from_slice(&raw)
        .map_err(|e| refused(format!("an answer that is not JSON: {e}")))?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        return Err(refused(format!("adapter {path}: {e}")));
    }
    let files: Vec<AdapterFile> = serde_json::from_value(v["ok"].clone())
        .map_err(|e| refused(format!("a malformed answer: {e}")))?;
    let expected: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
    if expected != FILES
        || files
            .iter()
            .zip(MAX_BYTES)
            .any(|(f, max)| f.len > max || f.sha256.len() != 64)
    {
        return Err(refused(format!(
            "announced files {expected:?}; expected {FILES:?} within their size limits"
        )));
    }
    let weights = &files[1];
    let dir = cache_root.join(&weights.sha256[..32]);
    let cache_err = |p: &Path| {
        let p = p.display().to_string();
        move |e: std::io::Error| StagingError::Cache {
            path: p.clone(),
            message: e.to_string(),
        }
    };
    std::fs::create_dir_all(&dir).map_err(cache_err(&dir))?;
    super::check_space(&dir, files.iter().map(|f| f.len).sum())?;
    for f in &files {
        let target = dir.join(&f.name);
        let tmp = dir.join(format!("{}.{}.tmp", f.name, std::process::id()));
        let mut out = std::fs::File::create(&tmp).map_err(cache_err(&tmp))?;
        let mut h = sha2::Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut left = f.len;
        while left > 0 {
            let n = (left as usize).min(buf.len());
            s.read_exact(&mut buf[..n])
                .map_err(io("receiving the adapter"))?;
            h.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(cache_err(&tmp))?;
            left -= n as u64;
        }
        if hex::encode(h.finalize()) != f.sha256 {
            let _ = std::fs::remove_file(&tmp);
            return Err(StagingError::Corrupt {
                source_addr: source.to_string(),
                name: f.name.clone(),
                expected: f.sha256.clone(),
            });
        }
        out.sync_all().map_err(cache_err(&tmp))?;
        std::fs::rename(&tmp, &target).map_err(cache_err(&target))?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn shared_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        for name in FILES {
            let p = dir.path().join(name);
            std::fs::write(&p, format!("{name} bytes")).expect("write");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        }
        dir
    }

    #[test]
    fn only_files_every_account_could_read_are_served() {
        let dir = shared_dir();
        let (_, len) = open_shared(dir.path(), FILES[0], MAX_BYTES[0]).expect("shared");
        assert_eq!(len, "adapter_config.json bytes".len() as u64);
        // A private file.
        let p = dir.path().join(FILES[1]);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let e = open_shared(dir.path(), FILES[1], MAX_BYTES[1]).unwrap_err();
        assert!(e.contains("o+r"), "{e}");
        // A private directory.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        let e = open_shared(dir.path(), FILES[1], MAX_BYTES[1]).unwrap_err();
        assert!(e.contains("o+x"), "{e}");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        // A link to something else.
        std::fs::remove_file(&p).expect("rm");
        std::os::unix::fs::symlink("/etc/hostname", &p).expect("symlink");
        assert!(open_shared(dir.path(), FILES[1], MAX_BYTES[1]).is_err());
        // Relative or unnormalised paths, and files past the limit.
        let e = open_shared(Path::new("etc"), FILES[0], 10).unwrap_err();
        assert!(e.contains("absolute"), "{e}");
        let dotted = format!("{}/../x", dir.path().display());
        assert!(open_shared(Path::new(&dotted), FILES[0], 10).is_err());
        let e = open_shared(dir.path(), FILES[0], 3).unwrap_err();
        assert!(e.contains("at most 3"), "{e}");
    }

    #[test]
    fn an_adapter_is_fetched_whole_and_a_private_one_is_refused() {
        let dir = shared_dir();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = std::thread::spawn(move || {
            for _ in 0..2 {
                let (mut c, _) = listener.accept().expect("accept");
                let mut op = [0u8; 1];
                c.read_exact(&mut op).expect("op");
                let raw = read_frame(&mut c).expect("request");
                let Ok(Request::Adapter { path }) = serde_json::from_slice(&raw) else {
                    panic!("not an adapter request");
                };
                serve(&mut c, &path).expect("serve");
            }
        });
        let cache = tempfile::tempdir().expect("cache");
        let path = dir.path().display().to_string();
        let got = fetch(addr, &path, cache.path(), Duration::from_secs(10)).expect("fetch");
        for name in FILES {
            assert_eq!(
                std::fs::read(got.join(name)).expect("read"),
                std::fs::read(dir.path().join(name)).expect("read")
            );
        }
        let p = dir.path().join(FILES[0]);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let e = fetch(addr, &path, cache.path(), Duration::from_secs(10)).unwrap_err();
        assert!(e.to_string().contains("o+r"), "{e}");
        server.join().expect("server");
    }
}
