//! OpenAI-compatible endpoints under load, for `pipeline-bench` and `serve-bench`: starting the
//! servers (tb's `tb-shard` processes, one per pipeline stage, or llama.cpp's `llama-server`),
//! all bound to 127.0.0.1 and killed when dropped (or when the bench dies: each child gets
//! SIGKILL from the kernel when the thread that started it ends), and one streamed completion
//! read token by token over plain HTTP/1.1 (`Connection: close`, chunked or not) with the
//! arrival time of every text chunk.
//!
//! Servers are started from the main thread: the parent-death signal follows the thread that
//! spawned the child.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
#[cfg(target_os = "linux")]
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// A loopback port that was free a moment ago.
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("binding a free loopback port")?;
    Ok(l.local_addr()?.port())
}

/// Processes serving one endpoint; every one is killed (SIGKILL) and reaped when dropped.
pub struct Server {
    pub name: String,
    /// `127.0.0.1:PORT` of the HTTP endpoint (for llama.cpp's RPC servers, which speak no
    /// HTTP, their addresses joined by commas).
    pub http: String,
    children: Vec<(String, Child)>,
}

impl Drop for Server {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Server {
    pub fn new(name: &str, http: String) -> Server {
        Server {
            name: name.to_string(),
            http,
            children: Vec::new(),
        }
    }

    /// Starts `cmd` (stdin and stdout closed, stderr to `log` when given) as one of this
    /// server's processes.
    pub fn spawn(&mut self, what: &str, cmd: &mut Command, log: Option<&Path>) -> Result<()> {
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
        match log {
            Some(path) => {
                let f = std::fs::File::create(path)
                    .with_context(|| format!("creating {}", path.display()))?;
                cmd.stderr(f);
            }
            None => {
                cmd.stderr(Stdio::null());
            }
        }
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of the
        // parent; it is all that runs between fork and exec. Linux only (macOS has no
        // parent-death signal: there the servers are killed on drop alone).
        #[cfg(target_os = "linux")]
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {what} ({:?})", cmd.get_program()))?;
        self.children.push((what.to_string(), child));
        Ok(())
    }

    /// Waits until `GET /health` answers 200, failing early when a process exits.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if health_ok(&self.http) {
                return Ok(());
            }
            for (what, c) in &mut self.children {
                if let Some(st) = c.try_wait()? {
                    bail!("{what} exited ({st}) before {} was ready", self.name);
                }
            }
            if Instant::now() > deadline {
                bail!("{} was not ready in {} s", self.name, timeout.as_secs());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The process ids of the server's processes.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|(_, c)| c.id()).collect()
    }

    /// Fails if any of the server's processes has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        for (what, c) in &mut self.children {
            if let Some(st) = c.try_wait()? {
                bail!("{what} of {} exited ({st})", self.name);
            }
        }
        Ok(())
    }
}

/// How tb's built-in engine is started: one `tb-shard` per entry of `splits` (first block,
/// block count), pipeline order, over loopback TCP.
pub struct TbOptions<'a> {
    pub bin: &'a Path,
    pub model: &'a Path,
    pub splits: &'a [(usize, usize)],
    /// `RAYON_NUM_THREADS` of every process.
    pub threads: usize,
    /// Sequences served at once (`--batch`).
    pub batch: usize,
    /// Tokens of context per sequence (`--context`; the model's own when `None`).
    pub context: Option<usize>,
    /// The ranks are one stage split by tensor parallelism (`--tensor-parallel`; each rank's
    /// split is then every block).
    pub tensor: bool,
    /// More arguments for every `tb-shard` (e.g. `--prefill-per-step 64`).
    pub shard_args: &'a [String],
}

/// Starts tb's pipeline and waits (up to 180 s) until its endpoint is healthy.
pub fn start_tb(name: &str, o: &TbOptions) -> Result<Server> {
    let world = o.splits.len();
    let coordinator = format!("127.0.0.1:{}", free_port()?);
    let mut s = Server::new(name, format!("127.0.0.1:{}", free_port()?));
    let hosts = vec!["127.0.0.1"; world].join(",");
    for (rank, (first, count)) in o.splits.iter().enumerate() {
        let mut cmd = Command::new(o.bin);
        cmd.args(["--model", &o.model.display().to_string()])
            .args(["--model-name", "bench", "--rank", &rank.to_string()])
            .args(["--hosts", &hosts, "--coordinator", &coordinator])
            .args(["--first", &first.to_string(), "--count", &count.to_string()])
            .args(["--transport", "tcp", "--batch", &o.batch.to_string()])
            .env("RAYON_NUM_THREADS", o.threads.to_string())
            .env("RUST_LOG", "warn");
        if let Some(c) = o.context {
            cmd.args(["--context", &c.to_string()]);
        }
        if o.tensor {
            cmd.arg("--tensor-parallel");
        }
        cmd.args(o.shard_args);
        if rank == 0 {
            cmd.args(["--http", &s.http]);
        }
        s.spawn(&format!("tb-shard rank {rank}"), &mut cmd, None)?;
    }
    s.wait_ready(Duration::from_secs(180))?;
    Ok(s)
}

/// How llama.cpp's `llama-server` is started.
pub struct LlamaServerOptions<'a> {
    pub bin: &'a Path,
    pub model: &'a Path,
    /// `-t` and `-tb` (threads for generation and for prompt processing).
    pub threads: usize,
    /// `-np`: slots decoded together (continuous batching).
    pub parallel: usize,
    /// Tokens of context per slot (`-c` is this times `parallel`).
    pub context: usize,
    /// Where its log goes (it is quiet otherwise).
    pub log: Option<&'a Path>,
}

/// Starts `llama-server` on 127.0.0.1 and waits (up to 180 s) until `/health` answers 200.
pub fn start_llama_server(name: &str, o: &LlamaServerOptions) -> Result<Server> {
    let port = free_port()?;
    let mut s = Server::new(name, format!("127.0.0.1:{port}"));
    let mut cmd = Command::new(o.bin);
    cmd.args(["-m", &o.model.display().to_string()])
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["-t", &o.threads.to_string(), "-tb", &o.threads.to_string()])
        .args(["-np", &o.parallel.to_string(), "--cont-batching"])
        .args(["-c", &(o.context * o.parallel.max(1)).to_string()])
        .args(["-ngl", "0", "--no-webui", "--metrics"]);
    s.spawn("llama-server", &mut cmd, o.log)?;
    s.wait_ready(Duration::from_secs(180))?;
    Ok(s)
}

/// The body of `GET path`, if it answered 200.
pub fn get_ok(http: &str, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(http).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = Vec::new();
    s.take(1 << 20).read_to_end(&mut out).ok()?;
    let out = String::from_utf8_lossy(&out);
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.lines()
        .next()
        .is_some_and(|l| l.contains(" 200"))
        .then(|| body.to_string())
}

/// Forward passes a server has run: tb's rank 0 reports them at `/health` (`steps`),
/// llama-server (started with `--metrics`) at `/metrics` (`llamacpp:n_decode_total`). Each
/// reads every weight once, for all the sequences it carries.
pub fn steps_run(http: &str, llama: bool) -> Option<u64> {
    if llama {
        let metrics = get_ok(http, "/metrics")?;
        let line = metrics
            .lines()
            .find(|l| l.starts_with("llamacpp:n_decode_total "))?;
        let value: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(value as u64)
    } else {
        let health: Value = serde_json::from_str(&get_ok(http, "/health")?).ok()?;
        health["steps"].as_u64()
    }
}

/// `GET /health` answered 200.
pub fn health_ok(http: &str) -> bool {
    get_ok(http, "/health").is_some()
}

/// CPU time spent over a window: by the watched processes and this one (the bench's own
/// clients), and by everything else on the machine (`/proc/stat` counts every process of the
/// machine, including those this one cannot see), so that a figure taken while something else
/// was computing can be told apart.
pub struct CpuMeter {
    started: Instant,
    machine: u64,
    ours: u64,
    pids: Vec<u32>,
}

/// CPU used over a [`CpuMeter`]'s window, in cores (1.0 = one core busy the whole time).
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuShare {
    pub ours: f64,
    pub others: f64,
}

/// Busy ticks of the whole machine (every field of `/proc/stat`'s `cpu` line but idle and
/// iowait; guest time is already in user).
fn machine_busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return 0;
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal
    [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| v.get(i)).sum()
}

fn process_ticks(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| crate::procstat::parse_cpu_ticks(&s))
        .unwrap_or(0)
}

impl CpuMeter {
    /// Starts a window watching `pids` (and this process).
    pub fn start(pids: Vec<u32>) -> CpuMeter {
        let mut m = CpuMeter {
            started: Instant::now(),
            machine: machine_busy_ticks(),
            ours: 0,
            pids,
        };
        m.ours = m.ours_now();
        m
    }

    fn ours_now(&self) -> u64 {
        process_ticks("self")
            + self
                .pids
                .iter()
                .map(|p| process_ticks(&p.to_string()))
                .sum::<u64>()
    }

    /// CPU used since `start`.
    pub fn finish(&self) -> CpuShare {
        let ticks = crate::procstat::clock_ticks_per_second().unwrap_or(100) as f64;
        let secs = self.started.elapsed().as_secs_f64().max(1e-9);
        let machine = machine_busy_ticks().saturating_sub(self.machine) as f64;
        let ours = self.ours_now().saturating_sub(self.ours) as f64;
        CpuShare {
            ours: ours / ticks / secs,
            others: (machine - ours).max(0.0) / ticks / secs,
        }
    }
}

/// One streamed completion as the client saw it.
#[derive(Debug, Clone)]
pub struct Streamed {
    /// When the request was sent.
    pub started: Instant,
    /// When each chunk carrying text arrived, in order.
    pub arrivals: Vec<Instant>,
    /// When the stream ended (`[DONE]` or the connection closed).
    pub ended: Instant,
    /// `usage.completion_tokens` when the server sent it.
    pub usage_tokens: Option<usize>,
    /// `usage.prompt_tokens` when the server sent it.
    pub prompt_tokens: Option<usize>,
}

impl Streamed {
    /// Time to the first text chunk.
    pub fn ttft(&self) -> Option<Duration> {
        self.arrivals
            .first()
            .map(|t| t.duration_since(self.started))
    }

    /// Tokens generated: the server's count, else the text chunks seen.
    pub fn tokens(&self) -> usize {
        self.usage_tokens.unwrap_or(self.arrivals.len())
    }

    /// Gaps between consecutive text chunks (inter-token latency as the client sees it).
    pub fn gaps(&self) -> impl Iterator<Item = Duration> + '_ {
        self.arrivals.windows(2).map(|w| w[1].duration_since(w[0]))
    }

    /// Decode tokens/s: tokens after the first over the time from the first to the last chunk.
    pub fn decode_tps(&self) -> f64 {
        match (self.arrivals.first(), self.arrivals.last()) {
            (Some(a), Some(b)) if b > a => {
                self.tokens().saturating_sub(1) as f64 / b.duration_since(*a).as_secs_f64()
            }
            _ => 0.0,
        }
    }
}

/// Sends `body` to `POST path` with streaming on and reads the server-sent events to the end,
/// timing each chunk whose `choices[0].text` or `choices[0].delta.content` is not empty. Every
/// read waits at most `timeout`.
pub fn stream(http: &str, path: &str, body: &Value, timeout: Duration) -> Result<Streamed> {
    let body = body.to_string();
    let started = Instant::now();
    let mut s = TcpStream::connect(http).with_context(|| format!("connecting to {http}"))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(timeout))?;
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {http}\r\nContent-Type: application/json\r\n\
         Accept: text/event-stream\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status)
        .context("reading the status line")?;
    let mut chunked = false;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 {
            bail!("the connection closed in the response headers");
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.trim().eq_ignore_ascii_case("transfer-encoding")
            && v.to_ascii_lowercase().contains("chunked")
        {
            chunked = true;
        }
    }
    let body: Box<dyn Read> = if chunked {
        Box::new(Chunked {
            inner: r,
            left: 0,
            done: false,
        })
    } else {
        Box::new(r)
    };
    let mut lines = BufReader::new(body);
    if !status.contains(" 200") {
        let mut rest = String::new();
        let _ = lines.take(4096).read_to_string(&mut rest);
        bail!("{http}{path} answered {}: {}", status.trim(), rest.trim());
    }
    let mut out = Streamed {
        started,
        arrivals: Vec::new(),
        ended: started,
        usage_tokens: None,
        prompt_tokens: None,
    };
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line).context("reading the stream")? == 0 {
            break;
        }
        let Some(data) = line.trim_end().strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let now = Instant::now();
        let v: Value = serde_json::from_str(data).context("a streamed chunk")?;
        if !v["error"].is_null() {
            bail!("the stream failed: {}", v["error"]);
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            out.usage_tokens = Some(n as usize);
        }
        if let Some(n) = v["usage"]["prompt_tokens"].as_u64() {
            out.prompt_tokens = Some(n as usize);
        }
        let c = &v["choices"][0];
        let text = c["text"]
            .as_str()
            .or_else(|| c["delta"]["content"].as_str());
        if text.is_some_and(|t| !t.is_empty()) {
            out.arrivals.push(now);
        }
    }
    out.ended = Instant::now();
    Ok(out)
}

/// The body of a chunked HTTP/1.1 response, handed on as soon as each piece arrives.
struct Chunked<R> {
    inner: R,
    /// Bytes left in the current chunk.
    left: usize,
    done: bool,
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let mut size = String::new();
            // The CRLF that ends the previous chunk's data comes first (an empty line).
            while size.trim().is_empty() {
                size.clear();
                if self.inner.read_line(&mut size)? == 0 {
                    self.done = true;
                    return Ok(0);
                }
            }
            let hex = size.trim().split(';').next().unwrap_or("").trim();
            self.left = usize::from_str_radix(hex, 16).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("a bad chunk size line {:?}", size.trim()),
                )
            })?;
            if self.left == 0 {
                self.done = true;
                return Ok(0);
            }
        }
        let want = buf.len().min(self.left);
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            self.done = true;
        }
        self.left -= n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_are_unframed() {
        let raw = b"6\r\nhello \r\n7;ext=1\r\ndata: x\r\n0\r\n\r\n";
        let mut c = Chunked {
            inner: BufReader::new(&raw[..]),
            left: 0,
            done: false,
        };
        let mut s = String::new();
        c.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello data: x");
    }

    #[test]
    fn streams_are_read_from_a_server() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut len = 0;
            loop {
                let mut h = String::new();
                r.read_line(&mut h).unwrap();
                if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap();
                }
                if h.trim().is_empty() {
                    break;
                }
            }
            let mut body = vec![0; len];
            r.read_exact(&mut body).unwrap();
            write!(s, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
            for ev in [
                r#"data: {"choices":[{"delta":{"role":"assistant","content":""}}]}"#,
                r#"data: {"choices":[{"delta":{"content":"Hi"}}]}"#,
                r#"data: {"choices":[{"delta":{"content":" there"}}]}"#,
                r#"data: {"choices":[],"usage":{"completion_tokens":2}}"#,
                "data: [DONE]",
            ] {
                let e = format!("{ev}\n\n");
                write!(s, "{:x}\r\n{e}\r\n", e.len()).unwrap();
            }
            // The client may hang up as soon as it reads [DONE], before this last chunk.
            let _ = write!(s, "0\r\n\r\n");
        });
        let got = stream(
            &addr,
            "/v1/chat/completions",
            &serde_json::json!({"stream": true}),
            Duration::from_secs(10),
        )
        .unwrap();
        server.join().unwrap();
        assert_eq!(got.arrivals.len(), 2);
        assert_eq!(got.tokens(), 2);
        assert_eq!(got.gaps().count(), 1);
        assert!(got.ttft().is_some());
    }
}
