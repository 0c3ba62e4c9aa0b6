//! Training checkpoints: a directory with
//!
//! - `params.safetensors`: every LoRA A and B, exact (the model's dtype),
//! - `optimizer.safetensors`: AdamW's first and second moments (`m`, `v`, f64),
//! - `trainer.json`: format version, step, fingerprint, parameter count,
//! - `COMPLETE`: written last, holding the same JSON.
//!
//! Saving removes `COMPLETE` first, writes each file beside its final name and renames it, and
//! writes `COMPLETE` last; loading refuses a directory without it or whose `trainer.json`
//! disagrees with it, so a crash mid-save never yields a half checkpoint. Loading also refuses a
//! checkpoint whose fingerprint (base model, model/LoRA config, hyper-parameters, seed) is not
//! the trainer's. Values round-trip bit for bit, so a resumed run continues exactly as an
//! uninterrupted one (same machine, same thread count).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::optim::AdamW;
use super::trainer::LoraTrainer;
use super::{Result, TrainError};

const PARAMS: &str = "params.safetensors";
const OPTIMIZER: &str = "optimizer.safetensors";
const STATE: &str = "trainer.json";
/// The marker of a complete checkpoint.
pub const COMPLETE: &str = "COMPLETE";
const FORMAT: u32 = 1;

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct State {
    format: u32,
    step: u64,
    fingerprint: String,
    parameters: usize,
}

/// What [`load`] read.
pub(crate) struct Loaded {
    pub(crate) params: BTreeMap<String, Tensor>,
    pub(crate) opt: AdamW,
    pub(crate) step: u64,
}

fn bad(dir: &Path, detail: impl Into<String>) -> TrainError {
    TrainError::Checkpoint {
        path: dir.to_path_buf(),
        detail: detail.into(),
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn tmp(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let t = tmp(path);
    std::fs::write(&t, bytes).map_err(io(&t))?;
    let f = std::fs::File::open(&t).map_err(io(&t))?;
    f.sync_all().map_err(io(&t))?;
    std::fs::rename(&t, path).map_err(io(path))
}

fn save_tensors(path: &Path, tensors: &HashMap<String, Tensor>) -> Result<()> {
    let t = tmp(path);
    candle_core::safetensors::save(tensors, &t)?;
    std::fs::File::open(&t)
        .and_then(|f| f.sync_all())
        .map_err(io(&t))?;
    std::fs::rename(&t, path).map_err(io(path))
}

/// Writes `trainer`'s state to `dir` (made if missing).
pub(crate) fn save(dir: &Path, trainer: &LoraTrainer) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let marker = dir.join(COMPLETE);
    match std::fs::remove_file(&marker) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(&marker)(e)),
    }
    let params: HashMap<String, Tensor> = trainer.param_tensors().into_iter().collect();
    save_tensors(&dir.join(PARAMS), &params)?;
    let opt = trainer.optimizer();
    let n = opt.m.len();
    let mut moments = HashMap::new();
    moments.insert(
        "m".to_string(),
        Tensor::from_slice(&opt.m, n, &Device::Cpu)?,
    );
    moments.insert(
        "v".to_string(),
        Tensor::from_slice(&opt.v, n, &Device::Cpu)?,
    );
    save_tensors(&dir.join(OPTIMIZER), &moments)?;
    let state = State {
        format: FORMAT,
        step: trainer.step(),
        fingerprint: trainer.fingerprint().to_string(),
        parameters: trainer.parameter_count(),
    };
    let json = serde_json::to_vec_pretty(&state).map_err(|e| bad(dir, e.to_string()))?;
    write_atomic(&dir.join(STATE), &json)?;
    write_atomic(&marker, &json)?;
    tracing::info!(dir = %dir.display(), step = state.step, "saved training checkpoint");
    Ok(())
}

fn read_state(path: &Path, dir: &Path) -> Result<State> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        bad(
            dir,
            format!(
                "{}: line {}, column {}: {e}",
                path.display(),
                e.line(),
                e.column()
            ),
        )
    })
}

/// Reads the checkpoint in `dir`, checking it is complete, of `fingerprint` and of `n`
/// parameters.
pub(crate) fn load(dir: &Path, fingerprint: &str, n: usize) -> Result<Loaded> {
    let marker = dir.join(COMPLETE);
    if !marker.exists() {
        return Err(bad(
            dir,
            format!("no {COMPLETE} marker: not a checkpoint, or one whose save did not finish"),
        ));
    }
    let done = read_state(&marker, dir)?;
    let state = read_state(&dir.join(STATE), dir)?;
    if done != state {
        return Err(bad(dir, format!("{STATE} disagrees with {COMPLETE}")));
    }
    if state.format != FORMAT {
        return Err(bad(
            dir,
            format!("format {} (this tb reads {FORMAT})", state.format),
        ));
    }
    if state.fingerprint != fingerprint {
        return Err(bad(
            dir,
            "it was made for another model or training config (fingerprints differ); \
             start from scratch or use the original config",
        ));
    }
    if state.parameters != n {
        return Err(bad(
            dir,
            format!("{} parameters, expected {n}", state.parameters),
        ));
    }
    let params_path = dir.join(PARAMS);
    let params = candle_core::safetensors::load(&params_path, &Device::Cpu)
        .map_err(|e| bad(dir, format!("{}: {e}", params_path.display())))?;
    let opt_path = dir.join(OPTIMIZER);
    let moments = candle_core::safetensors::load(&opt_path, &Device::Cpu)
        .map_err(|e| bad(dir, format!("{}: {e}", opt_path.display())))?;
    let moment = |name: &str| -> Result<Vec<f64>> {
        let t = moments
            .get(name)
            .ok_or_else(|| bad(dir, format!("{OPTIMIZER} lacks {name}")))?;
        let v = t.to_vec1::<f64>()?;
        if v.len() != n {
            return Err(bad(
                dir,
                format!("{OPTIMIZER} {name} has {} values, expected {n}", v.len()),
            ));
        }
        Ok(v)
    };
    let opt = AdamW {
        m: moment("m")?,
        v: moment("v")?,
    };
    Ok(Loaded {
        params: params.into_iter().collect(),
        opt,
        step: state.step,
    })
}
