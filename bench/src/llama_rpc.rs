//! llama.cpp's RPC backend, the peer of tb's pipelines in `pipeline-bench`: `ggml-rpc-server`
//! processes on loopback, each given an even share of the model's layers by `llama-bench
//! --rpc … -ngl 99 -ts 1/1/…`, and the decode rate `llama-bench` measures through them. With no
//! server, `llama-bench` computes on its own CPU: the single process's peer.
//!
//! Every process is bound to 127.0.0.1, computes with the same thread count as tb's stages, and
//! is killed when its measurement ends, when the bench fails or (Linux) when the bench dies;
//! `llama-bench` is given at most [`LLAMA_BENCH_TIMEOUT`].

use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::openai_load::{Server, free_port};

/// Longest a `llama-bench` run may take before it is killed.
pub const LLAMA_BENCH_TIMEOUT: Duration = Duration::from_secs(300);

/// Where llama.cpp's binaries are and what to measure.
pub struct LlamaRpc<'a> {
    /// The directory holding `llama-bench` and `ggml-rpc-server` (a cmake build's `bin`).
    pub bin_dir: &'a Path,
    pub model: &'a Path,
    /// CPU threads of every process (`-t`).
    pub threads: usize,
    /// Tokens generated per run (`-n`).
    pub tokens: usize,
    /// Timed runs (`-r`).
    pub runs: usize,
    /// Where the servers' logs go.
    pub log_dir: &'a Path,
}

/// `name` in `dir`, or an error saying how to build it.
fn binary(dir: &Path, name: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    if !path.is_file() {
        bail!(
            "{} is missing (build llama.cpp with -DGGML_RPC=ON, targets ggml-rpc-server and llama-bench)",
            path.display()
        );
    }
    Ok(path)
}

/// `dir` holds both binaries.
pub fn check_binaries(dir: &Path) -> Result<()> {
    binary(dir, "llama-bench")?;
    binary(dir, "ggml-rpc-server")?;
    Ok(())
}

impl LlamaRpc<'_> {
    /// The best of `runs` decode rates (tokens/s, from an empty context) with the model's
    /// layers split evenly over `servers` RPC servers; 0: on `llama-bench`'s own CPU.
    pub fn decode_tps(&self, servers: usize) -> Result<f64> {
        let rpc = binary(self.bin_dir, "ggml-rpc-server")?;
        let ports = (0..servers)
            .map(|_| free_port())
            .collect::<Result<Vec<u16>>>()?;
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut procs = Server::new(&format!("{servers} llama.cpp RPC servers"), addrs.join(","));
        for (i, port) in ports.iter().enumerate() {
            let log = self.log_dir.join(format!("rpc-server-{i}.log"));
            procs.spawn(
                "ggml-rpc-server",
                Command::new(&rpc)
                    .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                    .args(["-t", &self.threads.to_string()])
                    .env("LD_LIBRARY_PATH", self.bin_dir),
                Some(&log),
            )?;
        }
        for addr in &addrs {
            wait_listening(addr, &mut procs, Duration::from_secs(30))?;
        }
        let mut cmd = Command::new(binary(self.bin_dir, "llama-bench")?);
        cmd.args(["-m", &self.model.display().to_string()])
            .args(["-t", &self.threads.to_string()])
            .args(["-p", "0", "-n", &self.tokens.to_string()])
            .args(["-r", &self.runs.max(1).to_string(), "-o", "json"])
            .env("LD_LIBRARY_PATH", self.bin_dir);
        if servers == 0 {
            cmd.args(["-ngl", "0"]);
        } else {
            let split = vec!["1"; servers].join("/");
            cmd.args(["--rpc", &addrs.join(","), "-ngl", "99", "-ts", &split]);
        }
        let out = run_bounded(&mut cmd, LLAMA_BENCH_TIMEOUT)?;
        procs.check_alive()?;
        best_decode_tps(&out, self.tokens)
    }
}

/// Waits until `addr` accepts a connection, failing early when a process of `procs` exits.
fn wait_listening(addr: &str, procs: &mut Server, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let sock = addr.parse().with_context(|| format!("address {addr}"))?;
    while TcpStream::connect_timeout(&sock, Duration::from_secs(1)).is_err() {
        procs.check_alive()?;
        if Instant::now() > deadline {
            bail!(
                "no RPC server listened at {addr} within {} s",
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Runs `cmd` to its end and returns its stdout; kills it after `timeout`.
fn run_bounded(cmd: &mut Command, timeout: Duration) -> Result<String> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {program}"))?;
    let mut stdout = child.stdout.take().context("no stdout")?;
    let mut stderr = child.stderr.take().context("no stderr")?;
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{program} did not finish within {} s", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    if !status.success() {
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!("{program} failed ({status}): {}", tail.join(" | "));
    }
    Ok(out)
}

/// The best decode rate of `llama-bench -o json`'s generation test of `tokens` tokens.
fn best_decode_tps(json: &str, tokens: usize) -> Result<f64> {
    let tests: Vec<Value> = serde_json::from_str(json.trim())
        .with_context(|| format!("llama-bench printed no JSON list: {:.200}", json.trim()))?;
    let test = tests
        .iter()
        .find(|t| t["n_prompt"] == 0 && t["n_gen"].as_u64() == Some(tokens as u64))
        .with_context(|| format!("llama-bench's output has no tg{tokens} test"))?;
    test["samples_ts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_f64)
        .reduce(f64::max)
        .or_else(|| test["avg_ts"].as_f64())
        .context("llama-bench's tg test has no rate")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_sample_of_the_generation_test_is_taken() {
        let json = r#"[
          {"n_prompt": 50, "n_gen": 0, "avg_ts": 290.0, "samples_ts": [288.0, 292.0]},
          {"n_prompt": 0, "n_gen": 64, "avg_ts": 90.0, "samples_ts": [88.5, 91.5, 90.0]}
        ]"#;
        assert_eq!(best_decode_tps(json, 64).expect("parses"), 91.5);
        let err = best_decode_tps(json, 32).expect_err("no tg32");
        assert!(err.to_string().contains("no tg32 test"), "{err}");
        assert!(best_decode_tps("main: error", 64).is_err());
    }
}
