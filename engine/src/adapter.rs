//! LoRA adapters in the PEFT layout (`adapter_config.json` + `adapter_model.safetensors`), the
//! files Hugging Face PEFT, TRL and llama.cpp's converter read and write.
//!
//! In memory an [`Adapter`] holds each adapted matrix's pair in *engine layout*: the rows of the
//! GGUF tensor it adapts. llama.cpp's converter permutes the rows of llama/mistral `q_proj` and
//! `k_proj` (the interleaved RoPE of `rope_i`), so the `lora_B` of those two is permuted the same
//! way on load and back on save; files on disk are always in Hugging Face row order, so an
//! adapter trained by tb loads in PEFT and one trained by PEFT loads in tb.
//!
//! The adapted weight is `W + scale · B·A` with `scale = alpha / rank` (`alpha / sqrt(rank)`
//! with rsLoRA). Only `bias: none`, `fan_in_fan_out: false` adapters of the llama blocks' seven
//! linear layers are accepted; anything else is refused with the key or field that is wrong.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::gguf::ModelConfig;

/// The config file of a PEFT adapter directory.
pub const CONFIG_FILE: &str = "adapter_config.json";
/// The weights file of a PEFT adapter directory.
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// Larger adapter files are refused: a rank-256 adapter of every linear layer of a 70B model is
/// about 3.4 GB in f32, and anything past this is not an adapter.
pub const MAX_WEIGHTS_BYTES: u64 = 8 << 30;
/// Larger config files are refused (PEFT writes well under 2 KiB).
const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// Ranks above this are refused.
pub const MAX_RANK: usize = 1024;

/// A linear layer of a llama block that an adapter may adapt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Target {
    /// All targets, in block order.
    pub const ALL: [Target; 7] = [
        Target::Q,
        Target::K,
        Target::V,
        Target::O,
        Target::Gate,
        Target::Up,
        Target::Down,
    ];

    /// The module name PEFT uses (`q_proj`, ..., `down_proj`).
    pub fn module(self) -> &'static str {
        match self {
            Target::Q => "q_proj",
            Target::K => "k_proj",
            Target::V => "v_proj",
            Target::O => "o_proj",
            Target::Gate => "gate_proj",
            Target::Up => "up_proj",
            Target::Down => "down_proj",
        }
    }

    /// The submodule of the block that holds it (`self_attn` or `mlp`).
    fn parent(self) -> &'static str {
        match self {
            Target::Q | Target::K | Target::V | Target::O => "self_attn",
            Target::Gate | Target::Up | Target::Down => "mlp",
        }
    }

    /// Parses a PEFT module name; `q`, `k`, ... are accepted as short forms.
    pub fn parse(name: &str) -> Option<Target> {
        let name = name.strip_suffix("_proj").unwrap_or(name);
        Some(match name {
            "q" => Target::Q,
            "k" => Target::K,
            "v" => Target::V,
            "o" => Target::O,
            "gate" => Target::Gate,
            "up" => Target::Up,
            "down" => Target::Down,
            _ => return None,
        })
    }

    /// (in, out) features of this layer in `config`'s model.
    pub fn shape(self, config: &ModelConfig) -> (usize, usize) {
        let q = config.heads * config.head_dim;
        let kv = config.kv_heads * config.head_dim;
        match self {
            Target::Q => (config.hidden, q),
            Target::K | Target::V => (config.hidden, kv),
            Target::O => (q, config.hidden),
            Target::Gate | Target::Up => (config.hidden, config.ffn),
            Target::Down => (config.ffn, config.hidden),
        }
    }

    /// Heads whose rows llama.cpp's converter permuted for this target, if it did.
    fn permuted_heads(self, config: &ModelConfig) -> Option<usize> {
        if !rope_interleaved(config) {
            return None;
        }
        match self {
            Target::Q => Some(config.heads),
            Target::K => Some(config.kv_heads),
            _ => None,
        }
    }
}

/// llama and mistral GGUFs store q/k rows permuted for interleaved RoPE; qwen2 does not.
fn rope_interleaved(config: &ModelConfig) -> bool {
    config.architecture != "qwen2"
}

/// The hyper-parameters of an adapter (`targets` in block order, as [`Adapter::load`] gives them).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    pub rank: usize,
    pub alpha: f32,
    pub dropout: f32,
    /// rsLoRA: scale by alpha / sqrt(rank) instead of alpha / rank.
    pub rslora: bool,
    pub targets: Vec<Target>,
    /// What the adapter was trained on (PEFT's `base_model_name_or_path`).
    pub base_model: String,
}

impl LoraConfig {
    /// The factor applied to B·A.
    pub fn scale(&self) -> f32 {
        if self.rslora {
            self.alpha / (self.rank as f32).sqrt()
        } else {
            self.alpha / self.rank as f32
        }
    }
}

/// One adapted matrix: `a` is [rank, in], `b` is [out, rank], both f32, `b`'s rows in engine
/// layout.
#[derive(Debug, Clone)]
pub struct LoraPair {
    pub a: Tensor,
    pub b: Tensor,
}

impl LoraPair {
    /// `scale · x·Aᵀ·Bᵀ` for x of shape [..., in]: the adapter's addition to the layer's output.
    ///
    /// On the CPU each row is computed on its own in a fixed order, so a row's result does not
    /// depend on how many rows are multiplied with it (a batched step gives every sequence the
    /// bits it gets alone); candle's f32 matmul takes another kernel for one row than for many.
    pub fn delta(&self, x: &Tensor, scale: f32) -> Result<Tensor> {
        let f32s = [x, &self.a, &self.b]
            .iter()
            .all(|t| t.device().is_cpu() && t.dtype() == DType::F32);
        if !f32s {
            let h = x.broadcast_matmul(&self.a.t()?)?;
            let y = h.broadcast_matmul(&self.b.t()?)?;
            return Ok((y * f64::from(scale))?);
        }
        let (rank, input) = self.a.dims2()?;
        let (output, b_rank) = self.b.dims2()?;
        let mut shape = x.dims().to_vec();
        if shape.last() != Some(&input) || b_rank != rank {
            return Err(EngineError::BadInput {
                detail: format!(
                    "LoRA input has shape {shape:?}; A is {rank}x{input}, B is {output}x{b_rank}"
                ),
            });
        }
        if let Some(last) = shape.last_mut() {
            *last = output;
        }
        if rank == 0 || input == 0 {
            return Ok(Tensor::zeros(shape, DType::F32, x.device())?);
        }
        let out = crate::host::with_f32(x, |xs| {
            crate::host::with_f32(&self.a, |a| {
                crate::host::with_f32(&self.b, |b| {
                    low_rank_rows(xs, a, b, [input, rank, output], scale)
                })
            })
        })???;
        Ok(Tensor::from_vec(out, shape, x.device())?)
    }
}

/// `scale · B·(A·row)` for each row of `xs` (A: rank × input, B: output × rank, row-major;
/// `input` and `rank` not 0).
fn low_rank_rows(
    xs: &[f32],
    a: &[f32],
    b: &[f32],
    [input, rank, output]: [usize; 3],
    scale: f32,
) -> Vec<f32> {
    let rows = xs.len() / input;
    let mut out = vec![0f32; rows * output];
    let mut h = vec![0f32; rank];
    for (row, y) in xs.chunks_exact(input).zip(out.chunks_exact_mut(output)) {
        for (hj, aj) in h.iter_mut().zip(a.chunks_exact(input)) {
            *hj = dot(row, aj);
        }
        for (yi, bi) in y.iter_mut().zip(b.chunks_exact(rank)) {
            *yi = dot(&h, bi) * scale;
        }
    }
    out
}

/// A dot product summed in a fixed order: eight running sums (which the compiler keeps in one
/// vector register) added pairwise at the end, then the tail. Also attention's q·k.
pub(crate) fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut sums = [0f32; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let tail: f32 = xc
        .remainder()
        .iter()
        .zip(yc.remainder())
        .map(|(a, b)| a * b)
        .sum();
    for (a, b) in xc.zip(yc) {
        for i in 0..8 {
            sums[i] += a[i] * b[i];
        }
    }
    let quads = [
        sums[0] + sums[4],
        sums[1] + sums[5],
        sums[2] + sums[6],
        sums[3] + sums[7],
    ];
    (quads[0] + quads[2]) + (quads[1] + quads[3]) + tail
}

/// A LoRA adapter: its config and a pair per (block, target) it adapts.
#[derive(Debug, Clone)]
pub struct Adapter {
    pub config: LoraConfig,
    pub pairs: BTreeMap<(usize, Target), LoraPair>,
}

/// The fields of `adapter_config.json` tb reads and writes (PEFT's names).
#[derive(Debug, Serialize, Deserialize)]
struct PeftConfig {
    #[serde(default = "lora")]
    peft_type: String,
    r: usize,
    lora_alpha: f32,
    #[serde(default)]
    lora_dropout: f32,
    target_modules: TargetModules,
    #[serde(default)]
    base_model_name_or_path: Option<String>,
    #[serde(default = "none")]
    bias: String,
    #[serde(default)]
    fan_in_fan_out: bool,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    use_dora: bool,
    #[serde(default)]
    task_type: Option<String>,
    #[serde(default)]
    inference_mode: bool,
    #[serde(default)]
    layers_to_transform: Option<serde_json::Value>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum TargetModules {
    List(Vec<String>),
    Pattern(String),
}

fn lora() -> String {
    "LORA".into()
}

fn none() -> String {
    "none".into()
}

fn bad(path: &Path, detail: impl Into<String>) -> EngineError {
    EngineError::BadAdapter {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

fn io(path: &Path, source: std::io::Error) -> EngineError {
    EngineError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `base_model.model.model.layers.{layer}.{self_attn|mlp}.{module}.lora_{A|B}.weight`.
fn key(layer: usize, target: Target, which: char) -> String {
    format!(
        "base_model.model.model.layers.{layer}.{}.{}.lora_{which}.weight",
        target.parent(),
        target.module()
    )
}

/// Parses a PEFT key into (layer, target, 'A' | 'B'); None for anything else.
fn parse_key(key: &str) -> Option<(usize, Target, char)> {
    let rest = key.strip_prefix("base_model.model.")?;
    let rest = rest.strip_prefix("model.").unwrap_or(rest);
    let rest = rest.strip_prefix("layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (parent, rest) = rest.split_once('.')?;
    let (module, rest) = rest.split_once('.')?;
    let target = Target::parse(module)?;
    if parent != target.parent() {
        return None;
    }
    // PEFT saves without the adapter name; older files kept `.default`.
    let rest = rest.replace(".default", "");
    let which = match rest.as_str() {
        "lora_A.weight" => 'A',
        "lora_B.weight" => 'B',
        _ => return None,
    };
    Some((layer, target, which))
}

/// Reorders the rows of `b` [heads·head_dim, r] between Hugging Face order (`to_engine`) and
/// llama.cpp's permuted order: within each head, HF keeps the two RoPE halves apart
/// ([2, d/2]) where the GGUF interleaves them ([d/2, 2]).
fn permute_rows(b: &Tensor, heads: usize, to_engine: bool) -> Result<Tensor> {
    let (out, r) = b.dims2()?;
    let d = out / heads;
    let split = if to_engine {
        b.reshape((heads, 2, d / 2, r))?
    } else {
        b.reshape((heads, d / 2, 2, r))?
    };
    Ok(split.transpose(1, 2)?.contiguous()?.reshape((out, r))?)
}

impl Adapter {
    /// The scale applied to every pair.
    pub fn scale(&self) -> f32 {
        self.config.scale()
    }

    /// The pair adapting `target` of block `layer`, if the adapter has one.
    pub fn pair(&self, layer: usize, target: Target) -> Option<&LoraPair> {
        self.pairs.get(&(layer, target))
    }

    /// Bytes the pairs hold in memory (f32).
    pub fn bytes(&self) -> u64 {
        self.pairs
            .values()
            .map(|p| ((p.a.elem_count() + p.b.elem_count()) * 4) as u64)
            .sum()
    }

    /// Blocks the adapter touches.
    pub fn layers(&self) -> impl Iterator<Item = usize> + '_ {
        let mut seen: Vec<usize> = self.pairs.keys().map(|(l, _)| *l).collect();
        seen.dedup();
        seen.into_iter()
    }

    /// Reads the PEFT directory `dir` for a model of `config`, checking every key and shape, onto
    /// `device` in f32.
    pub fn load(dir: &Path, config: &ModelConfig, device: &Device) -> Result<Adapter> {
        Self::load_blocks(dir, config, device, 0..config.n_layers)
    }

    /// [`Self::load`], keeping only the pairs of blocks in `blocks` (what a pipeline stage
    /// holding those blocks needs): every key is still checked, only the kept pairs are read
    /// into tensors. The adapter may hold no pair of these blocks; it must hold some pair.
    pub fn load_blocks(
        dir: &Path,
        config: &ModelConfig,
        device: &Device,
        blocks: std::ops::Range<usize>,
    ) -> Result<Adapter> {
        let config_path = dir.join(CONFIG_FILE);
        let text = read_bounded(&config_path, MAX_CONFIG_BYTES)?;
        let peft: PeftConfig = serde_json::from_slice(&text).map_err(|e| {
            bad(
                &config_path,
                format!("line {}, column {}: {e}", e.line(), e.column()),
            )
        })?;
        let lora_config = check_config(&config_path, &peft)?;

        let weights_path = dir.join(WEIGHTS_FILE);
        let size = std::fs::metadata(&weights_path)
            .map_err(|e| io(&weights_path, e))?
            .len();
        if size > MAX_WEIGHTS_BYTES {
            return Err(bad(
                &weights_path,
                format!("{size} bytes is larger than an adapter can be ({MAX_WEIGHTS_BYTES})"),
            ));
        }
        let bytes = std::fs::read(&weights_path).map_err(|e| io(&weights_path, e))?;
        let file = candle_core::safetensors::SliceSafetensors::new(&bytes).map_err(|e| {
            bad(
                &weights_path,
                format!("not a readable safetensors file: {e}"),
            )
        })?;
        let mut halves: BTreeMap<(usize, Target), (Option<Tensor>, Option<Tensor>)> =
            BTreeMap::new();
        let mut in_file = 0usize;
        for (name, _) in file.tensors() {
            let Some((layer, target, which)) = parse_key(&name) else {
                return Err(bad(
                    &weights_path,
                    format!(
                        "tensor {name:?} is not a LoRA weight of a llama block \
                         (expected base_model.model.model.layers.N.self_attn|mlp.MODULE.lora_A|B.weight)"
                    ),
                ));
            };
            if layer >= config.n_layers {
                return Err(bad(
                    &weights_path,
                    format!(
                        "tensor {name} adapts block {layer}, but the model has {} blocks",
                        config.n_layers
                    ),
                ));
            }
            in_file += 1;
            if !blocks.contains(&layer) {
                continue;
            }
            let tensor = file
                .load(&name, device)
                .map_err(|e| bad(&weights_path, format!("tensor {name}: {e}")))?;
            let slot = halves.entry((layer, target)).or_default();
            let tensor = tensor.to_dtype(DType::F32)?;
            if which == 'A' {
                slot.0 = Some(tensor);
            } else {
                slot.1 = Some(tensor);
            }
        }
        if in_file == 0 {
            return Err(bad(&weights_path, "holds no LoRA weights"));
        }
        let mut pairs = BTreeMap::new();
        for ((layer, target), (a, b)) in halves {
            let (Some(a), Some(b)) = (a, b) else {
                return Err(bad(
                    &weights_path,
                    format!(
                        "block {layer} {} has only one of lora_A and lora_B",
                        target.module()
                    ),
                ));
            };
            let (inp, out) = target.shape(config);
            let r = lora_config.rank;
            if a.dims() != [r, inp] || b.dims() != [out, r] {
                return Err(bad(
                    &weights_path,
                    format!(
                        "block {layer} {}: lora_A is {:?} and lora_B {:?}, expected [{r}, {inp}] and [{out}, {r}] for this model at rank {r}",
                        target.module(),
                        a.dims(),
                        b.dims()
                    ),
                ));
            }
            let b = match target.permuted_heads(config) {
                Some(heads) => permute_rows(&b, heads, true)?,
                None => b,
            };
            pairs.insert((layer, target), LoraPair { a, b });
        }
        Ok(Adapter {
            config: lora_config,
            pairs,
        })
    }

    /// Writes the adapter as a PEFT directory `dir` (made if missing) for a model of `config`.
    /// Each file is written beside its final name and renamed, so a reader never sees half a file.
    pub fn save(&self, dir: &Path, config: &ModelConfig) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let mut tensors: HashMap<String, Tensor> = HashMap::new();
        for ((layer, target), pair) in &self.pairs {
            let b = match target.permuted_heads(config) {
                Some(heads) => permute_rows(&pair.b, heads, false)?,
                None => pair.b.clone(),
            };
            tensors.insert(key(*layer, *target, 'A'), pair.a.contiguous()?);
            tensors.insert(key(*layer, *target, 'B'), b);
        }
        let weights = dir.join(WEIGHTS_FILE);
        let tmp = temp_name(&weights);
        candle_core::safetensors::save(&tensors, &tmp)?;
        std::fs::rename(&tmp, &weights).map_err(|e| io(&weights, e))?;

        let mut targets = self.config.targets.clone();
        targets.sort();
        targets.dedup();
        let modules: Vec<String> = targets.iter().map(|t| t.module().to_string()).collect();
        let peft = PeftConfig {
            peft_type: lora(),
            r: self.config.rank,
            lora_alpha: self.config.alpha,
            lora_dropout: self.config.dropout,
            target_modules: TargetModules::List(modules),
            base_model_name_or_path: Some(self.config.base_model.clone()),
            bias: none(),
            fan_in_fan_out: false,
            use_rslora: self.config.rslora,
            use_dora: false,
            task_type: Some("CAUSAL_LM".into()),
            inference_mode: true,
            layers_to_transform: None,
        };
        let json = serde_json::to_vec_pretty(&peft).map_err(|e| bad(dir, e.to_string()))?;
        let config_path = dir.join(CONFIG_FILE);
        let tmp = temp_name(&config_path);
        std::fs::write(&tmp, json).map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, &config_path).map_err(|e| io(&config_path, e))?;
        Ok(())
    }
}

impl Adapter {
    /// A deterministic pseudo-random adapter of every block and `targets` of a `config` model,
    /// for tests and benchmarks: A uniform in ±1/√in, B uniform in ±`b_magnitude` (0: an adapter
    /// that changes nothing), scale `alpha / rank`; the same `seed` gives the same adapter.
    pub fn seeded(
        config: &ModelConfig,
        targets: &[Target],
        rank: usize,
        alpha: f32,
        b_magnitude: f32,
        seed: u64,
    ) -> Result<Adapter> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        // xorshift64*: uniform in [-1, 1).
        let mut next = move || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let v = state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
            (v as f32 / (1u64 << 23) as f32) - 1.0
        };
        let mut targets = targets.to_vec();
        targets.sort();
        targets.dedup();
        let mut pairs = BTreeMap::new();
        for layer in 0..config.n_layers {
            for &target in &targets {
                let (inp, out) = target.shape(config);
                let a_scale = 1.0 / (inp as f32).sqrt();
                let a: Vec<f32> = (0..rank * inp).map(|_| next() * a_scale).collect();
                let b: Vec<f32> = (0..out * rank).map(|_| next() * b_magnitude).collect();
                pairs.insert(
                    (layer, target),
                    LoraPair {
                        a: Tensor::from_vec(a, (rank, inp), &Device::Cpu)?,
                        b: Tensor::from_vec(b, (out, rank), &Device::Cpu)?,
                    },
                );
            }
        }
        Ok(Adapter {
            config: LoraConfig {
                rank,
                alpha,
                dropout: 0.0,
                rslora: false,
                targets,
                base_model: String::new(),
            },
            pairs,
        })
    }
}

fn temp_name(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>> {
    let size = std::fs::metadata(path).map_err(|e| io(path, e))?.len();
    if size > max {
        return Err(bad(path, format!("{size} bytes; at most {max} expected")));
    }
    std::fs::read(path).map_err(|e| io(path, e))
}

fn check_config(path: &Path, peft: &PeftConfig) -> Result<LoraConfig> {
    if !peft.peft_type.eq_ignore_ascii_case("LORA") {
        return Err(bad(
            path,
            format!("peft_type is {:?}; tb runs LORA adapters", peft.peft_type),
        ));
    }
    if peft.r == 0 || peft.r > MAX_RANK {
        return Err(bad(
            path,
            format!("r is {}; expected 1..={MAX_RANK}", peft.r),
        ));
    }
    if !peft.lora_alpha.is_finite() || peft.lora_alpha <= 0.0 {
        return Err(bad(
            path,
            format!(
                "lora_alpha is {}; expected a positive number",
                peft.lora_alpha
            ),
        ));
    }
    if peft.bias != "none" {
        return Err(bad(
            path,
            format!(
                "bias is {:?}; tb runs adapters with bias \"none\"",
                peft.bias
            ),
        ));
    }
    if peft.fan_in_fan_out {
        return Err(bad(
            path,
            "fan_in_fan_out is true; tb expects false (llama)",
        ));
    }
    if peft.use_dora {
        return Err(bad(path, "use_dora is true; tb runs plain LoRA"));
    }
    if peft.layers_to_transform.is_some() {
        // The weights file says which blocks are adapted; the field only restricts training.
        tracing::debug!(path = %path.display(), "layers_to_transform ignored: the weights name their blocks");
    }
    let mut targets = match &peft.target_modules {
        TargetModules::List(list) => list
            .iter()
            .map(|m| {
                Target::parse(m).ok_or_else(|| {
                    bad(
                        path,
                        format!(
                            "target_modules names {m:?}; tb adapts q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj and down_proj"
                        ),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?,
        // A regex: the weights file says which modules are adapted.
        TargetModules::Pattern(_) => Target::ALL.to_vec(),
    };
    targets.sort();
    targets.dedup();
    Ok(LoraConfig {
        rank: peft.r,
        alpha: peft.lora_alpha,
        dropout: peft.lora_dropout,
        rslora: peft.use_rslora,
        targets,
        base_model: peft.base_model_name_or_path.clone().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(arch: &str) -> ModelConfig {
        ModelConfig {
            architecture: arch.into(),
            n_layers: 2,
            hidden: 8,
            heads: 2,
            kv_heads: 1,
            head_dim: 4,
            ffn: 12,
            vocab: 16,
            context: 32,
            rope_theta: 10000.0,
            rms_eps: 1e-5,
        }
    }

    fn adapter(config: &ModelConfig) -> Adapter {
        let dev = Device::Cpu;
        let mut pairs = BTreeMap::new();
        for (i, target) in [Target::Q, Target::K, Target::V, Target::Down]
            .into_iter()
            .enumerate()
        {
            let (inp, out) = target.shape(config);
            let a: Vec<f32> = (0..2 * inp).map(|v| (v + i) as f32 * 0.5).collect();
            let b: Vec<f32> = (0..out * 2).map(|v| (v * 3 + i) as f32).collect();
            pairs.insert(
                (1, target),
                LoraPair {
                    a: Tensor::from_vec(a, (2, inp), &dev).expect("a"),
                    b: Tensor::from_vec(b, (out, 2), &dev).expect("b"),
                },
            );
        }
        Adapter {
            config: LoraConfig {
                rank: 2,
                alpha: 4.0,
                dropout: 0.0,
                rslora: false,
                targets: vec![Target::Q, Target::K, Target::V, Target::Down],
                base_model: "smollm2".into(),
            },
            pairs,
        }
    }

    fn rows(t: &Tensor) -> Vec<Vec<f32>> {
        t.to_vec2::<f32>().expect("vec2")
    }

    #[test]
    fn a_delta_is_the_dense_product_and_odd_shapes_are_errors_not_panics() {
        let t =
            |v: Vec<f32>, r: usize, c: usize| Tensor::from_vec(v, (r, c), &Device::Cpu).unwrap();
        let pair = LoraPair {
            a: t((0..2 * 9).map(|i| i as f32 * 0.1).collect(), 2, 9),
            b: t((0..3 * 2).map(|i| 1.0 - i as f32 * 0.3).collect(), 3, 2),
        };
        let x = Tensor::from_vec(
            (0..2 * 9).map(|i| (i % 5) as f32).collect::<Vec<f32>>(),
            (1, 2, 9),
            &Device::Cpu,
        )
        .unwrap();
        let got = pair.delta(&x, 0.5).unwrap();
        let want = (x
            .broadcast_matmul(&pair.a.t().unwrap())
            .and_then(|h| h.broadcast_matmul(&pair.b.t().unwrap()))
            .unwrap()
            * 0.5)
            .unwrap();
        assert_eq!(got.dims(), &[1, 2, 3]);
        let (got, want) = (
            got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            want.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        );
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-4 * w.abs().max(1.0), "{g} vs {w}");
        }
        // Rank 0 adds nothing.
        let empty = LoraPair {
            a: t(vec![], 0, 9),
            b: t(vec![], 3, 0),
        };
        let zero = empty.delta(&x, 0.5).unwrap();
        assert_eq!(zero.dims(), &[1, 2, 3]);
        assert!(
            zero.flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .all(|v| *v == 0.0)
        );
        // B whose columns are not A's rank, and an input of the wrong width, are named.
        let bad = LoraPair {
            a: pair.a.clone(),
            b: t(vec![0.0; 9], 3, 3),
        };
        let err = bad.delta(&x, 0.5).unwrap_err().to_string();
        assert!(err.contains("B is 3x3"), "{err}");
        let narrow = Tensor::zeros((1, 2, 8), DType::F32, &Device::Cpu).unwrap();
        let err = pair.delta(&narrow, 0.5).unwrap_err().to_string();
        assert!(
            err.contains("[1, 2, 8]") && err.contains("A is 2x9"),
            "{err}"
        );
    }

    #[test]
    fn an_adapter_survives_a_save_and_load_in_both_layouts() {
        for arch in ["llama", "qwen2"] {
            let cfg = config(arch);
            let original = adapter(&cfg);
            let dir = tempfile::tempdir().expect("tempdir");
            original.save(dir.path(), &cfg).expect("save");
            let back = Adapter::load(dir.path(), &cfg, &Device::Cpu).expect("load");
            assert_eq!(back.config, original.config);
            assert_eq!(back.pairs.len(), original.pairs.len());
            for (k, pair) in &original.pairs {
                let other = back.pair(k.0, k.1).expect("pair");
                assert_eq!(rows(&other.a), rows(&pair.a), "{arch} {k:?} A");
                assert_eq!(rows(&other.b), rows(&pair.b), "{arch} {k:?} B");
            }
        }
    }

    #[test]
    fn llama_q_and_k_rows_are_stored_in_hugging_face_order() {
        let cfg = config("llama");
        let a = adapter(&cfg);
        let dir = tempfile::tempdir().expect("tempdir");
        a.save(dir.path(), &cfg).expect("save");
        let raw = candle_core::safetensors::load(dir.path().join(WEIGHTS_FILE), &Device::Cpu)
            .expect("raw");
        // q: 2 heads of head_dim 4; engine row h*4 + j*2 + t is HF row h*4 + t*2 + j.
        let engine = rows(&a.pair(1, Target::Q).expect("q").b);
        let hf = rows(&raw[&key(1, Target::Q, 'B')]);
        for h in 0..2 {
            for j in 0..2 {
                for t in 0..2 {
                    assert_eq!(engine[h * 4 + j * 2 + t], hf[h * 4 + t * 2 + j]);
                }
            }
        }
        // v is not permuted.
        assert_eq!(
            rows(&a.pair(1, Target::V).expect("v").b),
            rows(&raw[&key(1, Target::V, 'B')])
        );
        let text = std::fs::read_to_string(dir.path().join(CONFIG_FILE)).expect("config");
        let json: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(json["peft_type"], "LORA");
        assert_eq!(json["r"], 2);
        assert_eq!(json["task_type"], "CAUSAL_LM");
    }

    #[test]
    fn delta_is_scale_times_x_a_t_b_t() {
        let dev = Device::Cpu;
        let pair = LoraPair {
            a: Tensor::from_vec(vec![1f32, 0., 0., 1.], (2, 2), &dev).expect("a"),
            b: Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], (3, 2), &dev).expect("b"),
        };
        let x = Tensor::from_vec(vec![1f32, 1.], (1, 1, 2), &dev).expect("x");
        let y = pair.delta(&x, 0.5).expect("delta");
        assert_eq!(
            y.flatten_all()
                .expect("flat")
                .to_vec1::<f32>()
                .expect("vec"),
            vec![1.5, 3.5, 5.5]
        );
    }

    #[test]
    fn wrong_files_are_refused_with_what_is_wrong() {
        let cfg = config("llama");
        let dir = tempfile::tempdir().expect("tempdir");
        adapter(&cfg).save(dir.path(), &cfg).expect("save");
        // A model with one block: block 1 does not exist.
        let mut small = cfg.clone();
        small.n_layers = 1;
        let e = Adapter::load(dir.path(), &small, &Device::Cpu).expect_err("too few blocks");
        assert!(e.to_string().contains("has 1 blocks"), "{e}");
        // A wider model: shapes do not match.
        let mut wide = cfg.clone();
        wide.hidden = 16;
        let e = Adapter::load(dir.path(), &wide, &Device::Cpu).expect_err("shape");
        assert!(e.to_string().contains("expected [2, 16]"), "{e}");
        // A config PEFT could write but tb cannot run.
        let path = dir.path().join(CONFIG_FILE);
        let text = std::fs::read_to_string(&path).expect("read");
        std::fs::write(&path, text.replace("\"none\"", "\"all\"")).expect("write");
        let e = Adapter::load(dir.path(), &cfg, &Device::Cpu).expect_err("bias");
        assert!(e.to_string().contains("bias"), "{e}");
        std::fs::write(&path, "{ \"r\": 2,").expect("write");
        let e = Adapter::load(dir.path(), &cfg, &Device::Cpu).expect_err("json");
        assert!(e.to_string().contains(CONFIG_FILE), "{e}");
        assert!(e.to_string().contains("line 1"), "{e}");
        // Not safetensors at all.
        adapter(&cfg).save(dir.path(), &cfg).expect("save");
        std::fs::write(dir.path().join(WEIGHTS_FILE), b"garbage").expect("write");
        let e = Adapter::load(dir.path(), &cfg, &Device::Cpu).expect_err("weights");
        assert!(e.to_string().contains("safetensors"), "{e}");
    }

    #[test]
    fn peft_keys_parse_and_others_do_not() {
        assert_eq!(
            parse_key("base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"),
            Some((3, Target::Q, 'A'))
        );
        assert_eq!(
            parse_key("base_model.model.model.layers.0.mlp.down_proj.lora_B.default.weight"),
            Some((0, Target::Down, 'B'))
        );
        assert_eq!(
            parse_key("base_model.model.model.layers.0.mlp.q_proj.lora_A.weight"),
            None
        );
        assert_eq!(parse_key("base_model.model.lm_head.lora_A.weight"), None);
    }
}
