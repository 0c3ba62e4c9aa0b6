//! What the tests that start real `tb-shard` processes share: the model, free ports, a
//! service of N ranks on loopback, and one HTTP request.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

pub fn model() -> PathBuf {
    let p = tb_engine::test_model_path();
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-model.sh",
        p.display()
    );
    p
}

/// A free port on 127.0.0.1 for a process to bind, below Linux's ephemeral range (32768+): it
/// is closed again before the process binds it, and in that window concurrent tests open
/// connections whose local ports the kernel picks from the ephemeral range. Each call starts
/// past the last port handed out, so that two tests never get the same one.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7919);
    (0..10_000u32)
        .map(|_| NEXT.fetch_add(1, Ordering::Relaxed))
        .filter_map(|i| u16::try_from(10_000 + start.wrapping_add(i) % 10_000).ok())
        .find(|port| TcpListener::bind(("127.0.0.1", *port)).is_ok())
        .expect("a free port in 10000..20000")
}

/// The processes of one service, killed when dropped.
pub struct Service {
    procs: Vec<Child>,
    pub http: String,
}

impl Drop for Service {
    fn drop(&mut self) {
        for p in &mut self.procs {
            let _ = p.kill();
            let _ = p.wait();
        }
    }
}

/// `ranks` tb-shard processes on loopback: one stage split by tensor parallelism when
/// `tensor`, else a pipeline of equal block ranges; `extra` arguments for every rank.
pub fn start(ranks: usize, tensor: bool, extra: &[&str]) -> Service {
    let addr = format!("127.0.0.1:{}", free_port());
    let coordinator = format!("127.0.0.1:{}", free_port());
    let hosts = vec!["127.0.0.1"; ranks].join(",");
    let procs = (0..ranks)
        .map(|rank| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_tb-shard"));
            cmd.args(["--model", &model().display().to_string()])
                .args(["--model-name", "smollm2", "--rank", &rank.to_string()])
                .args(["--hosts", &hosts, "--coordinator", &coordinator])
                .args(["--transport", "tcp", "--batch", "4", "--context", "512"])
                .args(["--connect-timeout", "120"])
                .env("RAYON_NUM_THREADS", "1")
                .stdout(Stdio::null())
                .stderr(Stdio::inherit());
            if tensor {
                cmd.arg("--tensor-parallel");
            } else {
                let (first, count) = (
                    30 * rank / ranks,
                    30 * (rank + 1) / ranks - 30 * rank / ranks,
                );
                cmd.args(["--first", &first.to_string(), "--count", &count.to_string()]);
            }
            cmd.args(extra);
            if rank == 0 {
                cmd.args(["--http", &addr]);
            }
            cmd.spawn().expect("starting tb-shard")
        })
        .collect();
    let mut s = Service { procs, http: addr };
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Ok((200, _)) = http(&s.http, "GET", "/health", None) {
            return s;
        }
        for (rank, p) in s.procs.iter_mut().enumerate() {
            if let Ok(Some(status)) = p.try_wait() {
                panic!("rank {rank} of {ranks} exited ({status}) before the service was ready");
            }
        }
        assert!(
            Instant::now() < deadline,
            "{ranks} ranks: not ready in 300 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One HTTP/1.1 request (Connection: close): status and body.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> std::io::Result<(u16, String)> {
    http_with_key(addr, None, method, path, body)
}

/// [`http`] with `Authorization: Bearer KEY` when `key` is given.
pub fn http_with_key(
    addr: &str,
    key: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(300)))?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let authorization = key.map_or_else(String::new, |k| format!("Authorization: Bearer {k}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{authorization}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}
