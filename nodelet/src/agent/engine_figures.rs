//! The built-in engine's decode speed on this machine ([`tb_engine::calibrate`]): measured
//! once, in the background, after the nodelet starts, and kept in
//! `DATA_DIR/engine-figures.json` (used again while tb's version and the engine's backend stay
//! the same). The heartbeat reports it in the Node's capacity, where placement prefers it to
//! the chip's nominal bandwidth.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use tb_api::status::EngineFigures;

/// The figures once measured (or read back); empty until then, or when measuring failed.
pub type Shared = Arc<OnceLock<EngineFigures>>;

/// What is kept on disk: the figures and what they were measured with.
#[derive(Debug, Serialize, Deserialize)]
struct Kept {
    version: String,
    figures: EngineFigures,
}

fn kept_path(data_dir: &Path) -> PathBuf {
    data_dir.join("engine-figures.json")
}

/// The figures kept from an earlier start, if they are of this tb and this backend.
fn read_kept(data_dir: &Path, backend: &str) -> Option<EngineFigures> {
    let text = std::fs::read(kept_path(data_dir)).ok()?;
    let kept: Kept = serde_json::from_slice(&text).ok()?;
    (kept.version == env!("CARGO_PKG_VERSION")
        && kept.figures.backend == backend
        && kept.figures.weight_gbs.is_finite()
        && kept.figures.weight_gbs > 0.0)
        .then_some(kept.figures)
}

/// Starts measuring (or reads the kept figures); the result appears in the returned cell.
pub fn start(data_dir: &Path) -> Shared {
    let shared: Shared = Arc::default();
    let cell = shared.clone();
    let data_dir = data_dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let device = tb_engine::shard::default_device();
        let backend = tb_engine::calibrate::backend(&device);
        if let Some(figures) = read_kept(&data_dir, backend) {
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
        match tb_engine::calibrate::calibrate(&scratch, &device) {
            Ok(c) => {
                let figures = EngineFigures {
                    backend: c.backend,
                    weight_gbs: (c.weight_gbs * 1000.0).round() / 1000.0,
                    token_overhead_us: c.token_overhead_us.round(),
                    measured_at: Some(tb_api::Timestamp::now()),
                };
                tracing::info!(
                    weight_gbs = figures.weight_gbs,
                    token_overhead_us = figures.token_overhead_us,
                    took_ms = c.took.as_millis() as u64,
                    "measured the built-in engine's decode speed"
                );
                let kept = Kept {
                    version: env!("CARGO_PKG_VERSION").into(),
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
    fn kept_figures_are_used_only_for_this_version_and_backend() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kept = Kept {
            version: env!("CARGO_PKG_VERSION").into(),
            figures: EngineFigures {
                backend: "cpu".into(),
                weight_gbs: 4.2,
                token_overhead_us: 300.0,
                measured_at: None,
            },
        };
        std::fs::write(
            kept_path(dir.path()),
            serde_json::to_vec(&kept).expect("json"),
        )
        .expect("write");
        assert_eq!(
            read_kept(dir.path(), "cpu").map(|f| f.weight_gbs),
            Some(4.2)
        );
        assert!(read_kept(dir.path(), "metal").is_none(), "another backend");
        let old = Kept {
            version: "0.0.0-old".into(),
            ..kept
        };
        std::fs::write(
            kept_path(dir.path()),
            serde_json::to_vec(&old).expect("json"),
        )
        .expect("write");
        assert!(read_kept(dir.path(), "cpu").is_none(), "another tb");
        std::fs::write(kept_path(dir.path()), "garbage").expect("write");
        assert!(read_kept(dir.path(), "cpu").is_none());
    }
}
