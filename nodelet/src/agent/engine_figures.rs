//! The built-in engine's decode speed on this machine ([`tb_engine::calibrate`]): measured
//! once, in the background, after the nodelet starts — by `tb-shard --calibrate`, the binary
//! and settings that serve the models, so the figures are the executor's own — and kept in
//! `DATA_DIR/engine-figures.json` (used again while tb's version, the measurement's method,
//! the engine's backend and its thread count stay the same). It runs with the threads the
//! nodelet gives its built-in ranks (`--engine-threads`), so that a nodelet sharing its machine
//! with others (`tbctl up`) measures what its ranks will get. The heartbeat reports it in the
//! Node's capacity, where placement prefers it to the chip's nominal bandwidth.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tb_api::status::{EngineCalibration, EngineFigures};

/// The longest a measurement may take before it is given up (it takes seconds).
const MEASURE_TIMEOUT: Duration = Duration::from_secs(300);

/// Set when the nodelet stops: a measurement under way is abandoned, its process killed, so
/// that it does not hold the nodelet's exit (the runtime waits for blocking tasks).
static STOPPING: AtomicBool = AtomicBool::new(false);

/// Abandons a measurement under way (the nodelet is stopping); the next start measures again.
pub fn stop() {
    STOPPING.store(true, Ordering::SeqCst);
}

/// Measures the engine in this process, on its default device (`tb-shard --calibrate`);
/// the synthetic models are written under `scratch` and removed.
pub fn measure_here(scratch: &Path) -> Result<EngineCalibration, String> {
    let device = tb_engine::shard::default_device();
    let c = tb_engine::calibrate::calibrate(scratch, &device).map_err(|e| e.to_string());
    let _ = std::fs::remove_dir_all(scratch);
    let c = c?;
    Ok(EngineCalibration {
        backend: c.backend,
        weight_gbs: c.weight_gbs,
        token_overhead_us: c.token_overhead_us,
        took_ms: c.took.as_millis() as u64,
    })
}

/// Why a measurement ended without figures when the nodelet stopped (logged, not warned).
const STOPPED: &str = "stopping: the engine measurement is abandoned, to be made at the next start";

/// The longest a nodelet waits for another one on this machine to finish measuring.
const TURN_TIMEOUT: Duration = Duration::from_secs(90);

/// One measurement at a time per user on this machine: nodelets sharing a host (a local
/// cluster from `tbctl up`) that measured at once shared its cores, and each measured a
/// fraction of the engine's speed (seen on 2 cores: 5.4, 2.0 and 1.2 GB/s, with 6–32 ms of
/// per-token overhead, where one alone measures ~8 GB/s). Best effort: a lock file that cannot
/// be opened as ours (another user's, a symlink) or a turn that does not come within
/// [`TURN_TIMEOUT`] means measuring anyway. On a lab of Macs, one nodelet each, it is never
/// contended.
fn take_turn() -> Option<nix::fcntl::Flock<std::fs::File>> {
    use nix::fcntl::{Flock, FlockArg};
    use std::os::unix::fs::OpenOptionsExt;
    let path = std::env::temp_dir().join(format!(
        "tb-engine-calibration-{}.lock",
        nix::unistd::getuid()
    ));
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&path)
        .ok()?;
    let deadline = Instant::now() + TURN_TIMEOUT;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Some(lock),
            Err((f, nix::errno::Errno::EWOULDBLOCK))
                if Instant::now() < deadline && !STOPPING.load(Ordering::SeqCst) =>
            {
                file = f;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(_) => return None,
        }
    }
}

/// Runs `shard_bin --calibrate` (its scratch files under `scratch`) in this machine's turn
/// ([`take_turn`]), bounded by [`MEASURE_TIMEOUT`].
fn measure_with(
    shard_bin: &Path,
    scratch: &Path,
    threads: u32,
) -> Result<EngineCalibration, String> {
    let _turn = take_turn();
    if STOPPING.load(Ordering::SeqCst) {
        return Err(STOPPED.into());
    }
    std::fs::create_dir_all(scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let mut child = Command::new(shard_bin)
        .arg("--calibrate")
        .env("TMPDIR", scratch)
        .env("RUST_LOG", "warn")
        .env(tb_engine::THREADS_ENV, threads.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", shard_bin.display()))?;
    let deadline = Instant::now() + MEASURE_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if STOPPING.load(Ordering::SeqCst) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(STOPPED.into());
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("gave up after {MEASURE_TIMEOUT:?}"));
            }
            Err(e) => return Err(format!("waiting for {}: {e}", shard_bin.display())),
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("reading {}: {e}", shard_bin.display()))?;
    if !out.status.success() {
        // Its last 2000 characters: what went wrong is at the end.
        let stderr = String::from_utf8_lossy(&out.stderr);
        let start = stderr.char_indices().rev().nth(1999).map_or(0, |(i, _)| i);
        let tail = &stderr[start..];
        return Err(format!(
            "{} --calibrate: {}: {tail}",
            shard_bin.display(),
            out.status
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "{} --calibrate printed {:?}: {e}",
            shard_bin.display(),
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The figures once measured (or read back); empty until then, or when measuring failed.
pub type Shared = Arc<OnceLock<EngineFigures>>;

/// What is kept on disk: the figures and what they were measured with.
#[derive(Debug, Serialize, Deserialize)]
struct Kept {
    version: String,
    /// [`tb_engine::calibrate::METHOD`] (absent: the first method).
    #[serde(default)]
    method: u32,
    figures: EngineFigures,
}

fn kept_path(data_dir: &Path) -> PathBuf {
    data_dir.join("engine-figures.json")
}

/// The threads a built-in rank runs with: `configured` (`--engine-threads`), else what the
/// engine takes by itself (`RAYON_NUM_THREADS` inherited by the nodelet, else every core).
pub fn engine_threads(configured: Option<u32>) -> u32 {
    configured.unwrap_or_else(|| u32::try_from(tb_engine::cpu_threads()).unwrap_or(u32::MAX))
}

/// The figures kept from an earlier start, if they are of this tb, this backend and `threads`.
fn read_kept(data_dir: &Path, backend: &str, threads: u32) -> Option<EngineFigures> {
    let text = std::fs::read(kept_path(data_dir)).ok()?;
    let kept: Kept = serde_json::from_slice(&text).ok()?;
    (kept.version == env!("CARGO_PKG_VERSION")
        && kept.method == tb_engine::calibrate::METHOD
        && kept.figures.backend == backend
        && kept.figures.threads == Some(threads)
        && kept.figures.weight_gbs.is_finite()
        && kept.figures.weight_gbs > 0.0)
        .then_some(kept.figures)
}

/// Starts measuring with `threads` (or reads the kept figures); the result appears in the
/// returned cell.
pub fn start(data_dir: &Path, shard_bin: &Path, threads: u32) -> Shared {
    let shared: Shared = Arc::default();
    let cell = shared.clone();
    let data_dir = data_dir.to_path_buf();
    let shard_bin = shard_bin.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let device = tb_engine::shard::default_device();
        let backend = tb_engine::calibrate::backend(&device);
        if let Some(figures) = read_kept(&data_dir, backend, threads) {
            tracing::info!(
                weight_gbs = figures.weight_gbs,
                token_overhead_us = figures.token_overhead_us,
                "engine figures from {}",
                kept_path(&data_dir).display()
            );
            let _ = cell.set(figures);
            return;
        }
        let scratch = data_dir.join("engine-calibration");
        match measure_with(&shard_bin, &scratch, threads) {
            Ok(c) if c.weight_gbs.is_finite() && c.weight_gbs > 0.0 => {
                let figures = EngineFigures {
                    backend: c.backend,
                    weight_gbs: (c.weight_gbs * 1000.0).round() / 1000.0,
                    token_overhead_us: c.token_overhead_us.round(),
                    measured_at: Some(tb_api::Timestamp::now()),
                    threads: Some(threads),
                };
                tracing::info!(
                    weight_gbs = figures.weight_gbs,
                    token_overhead_us = figures.token_overhead_us,
                    took_ms = c.took_ms,
                    threads,
                    "measured the built-in engine's decode speed"
                );
                let kept = Kept {
                    version: env!("CARGO_PKG_VERSION").into(),
                    method: tb_engine::calibrate::METHOD,
                    figures: figures.clone(),
                };
                if let Ok(text) = serde_json::to_vec_pretty(&kept) {
                    let path = kept_path(&data_dir);
                    let tmp = path.with_extension("json.tmp");
                    if let Err(e) =
                        std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, &path))
                    {
                        tracing::warn!("keeping the engine figures in {}: {e}", path.display());
                    }
                }
                let _ = cell.set(figures);
            }
            Ok(c) => tracing::warn!(
                "measuring the built-in engine gave {} GB/s; placement uses the chip's figures",
                c.weight_gbs
            ),
            Err(e) if e == STOPPED => tracing::info!("{e}"),
            Err(e) => tracing::warn!(
                "measuring the built-in engine failed ({e}); placement uses the chip's figures"
            ),
        }
        let _ = std::fs::remove_dir_all(&scratch);
    });
    shared
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measurements_on_one_machine_take_turns() {
        let first = take_turn().expect("this user's lock file");
        let (tx, rx) = std::sync::mpsc::channel();
        let second = std::thread::spawn(move || {
            let turn = take_turn();
            let _ = tx.send(());
            turn.is_some()
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "a second measurement waits for the first"
        );
        drop(first);
        assert!(rx.recv_timeout(Duration::from_secs(10)).is_ok());
        assert!(second.join().expect("thread"), "and then takes its turn");
    }

    #[test]
    fn kept_figures_are_used_only_for_this_version_backend_and_thread_count() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kept = Kept {
            version: env!("CARGO_PKG_VERSION").into(),
            method: tb_engine::calibrate::METHOD,
            figures: EngineFigures {
                backend: "cpu".into(),
                weight_gbs: 4.2,
                token_overhead_us: 300.0,
                measured_at: None,
                threads: Some(2),
            },
        };
        std::fs::write(
            kept_path(dir.path()),
            serde_json::to_vec(&kept).expect("json"),
        )
        .expect("write");
        assert_eq!(
            read_kept(dir.path(), "cpu", 2).map(|f| f.weight_gbs),
            Some(4.2)
        );
        assert!(
            read_kept(dir.path(), "metal", 2).is_none(),
            "another backend"
        );
        assert!(
            read_kept(dir.path(), "cpu", 1).is_none(),
            "another share of the cores (--engine-threads)"
        );
        let old = Kept {
            version: "0.0.0-old".into(),
            ..kept
        };
        std::fs::write(
            kept_path(dir.path()),
            serde_json::to_vec(&old).expect("json"),
        )
        .expect("write");
        assert!(read_kept(dir.path(), "cpu", 2).is_none(), "another tb");
        let measured_otherwise = serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "figures": {"backend": "cpu", "weightGbs": 19.0, "tokenOverheadUs": 0.0},
        });
        std::fs::write(kept_path(dir.path()), measured_otherwise.to_string()).expect("write");
        assert!(
            read_kept(dir.path(), "cpu", 2).is_none(),
            "figures from before the method was kept are measured again"
        );
        let unsaid = serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "method": tb_engine::calibrate::METHOD,
            "figures": {"backend": "cpu", "weightGbs": 19.0, "tokenOverheadUs": 0.0},
        });
        std::fs::write(kept_path(dir.path()), unsaid.to_string()).expect("write");
        assert!(
            read_kept(dir.path(), "cpu", 2).is_none(),
            "figures that do not say their thread count are measured again"
        );
        std::fs::write(kept_path(dir.path()), "garbage").expect("write");
        assert!(read_kept(dir.path(), "cpu", 2).is_none());
    }
}
