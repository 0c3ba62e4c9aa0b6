//! A pure reader of Hugging Face and MLX model directories: `config.json` (the model's shape)
//! and, when the weights are there, the headers of its `.safetensors` files (each tensor's
//! name, type and byte range; never the weights). `tbctl model inspect DIR` turns what it finds
//! into a Model manifest, as [`crate::gguf`] does for GGUF files.
//!
//! The shape facts placement needs and plain `config.json` readers get wrong:
//! - `head_dim` is not always hidden / heads (Qwen3: 128 in a 5120-wide model with 64 heads);
//! - multi-head latent attention (DeepSeek-V3, Kimi-K2) caches one latent of `kv_lora_rank +
//!   qk_rope_head_dim` values per token and layer, not K and V per head;
//! - mixture-of-experts models hold every expert but read only `num_experts_per_tok` of them
//!   per token (the "active" weights that set decode speed);
//! - sliding-window layers (gpt-oss: every other layer, 128 tokens) cache only their window.
//!
//! Without `.safetensors` files the bytes are counted from the shape: every weight matrix of
//! the architecture families below, in the precision `config.json` declares (`torch_dtype`,
//! MLX's `quantization` {bits, group_size}, `quantization_config` fp8 or mxfp4). The families:
//! llama-style dense decoders (llama, mistral, qwen2, qwen3, …), their MoE variants (mixtral,
//! qwen3_moe, gpt_oss) and DeepSeek-V3-style MLA + MoE (deepseek_v3, kimi_k2).
//!
//! Files are treated as hostile: `config.json` and each safetensors header are bounded in size
//! before they are read, and tensor byte ranges are checked against the file.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The largest `config.json` read (published ones are a few KiB).
const MAX_CONFIG: u64 = 4 << 20;
/// The largest safetensors header read (a 1,000-tensor shard's is about 150 KiB).
const MAX_HEADER: u64 = 64 << 20;

/// Why a directory could not be read as a model.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {what}", path.display())]
    Invalid { path: PathBuf, what: String },
}

fn invalid(path: &Path, what: impl Into<String>) -> HfError {
    HfError::Invalid {
        path: path.to_path_buf(),
        what: what.into(),
    }
}

/// A model's shape and weight sizes, as far as its directory says.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HfFacts {
    /// `model_type`, e.g. `llama`, `qwen3`, `deepseek_v3`.
    pub architecture: String,
    pub layers: u32,
    pub hidden_size: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub context_length: Option<u32>,
    pub vocab_size: u32,
    pub tied_embeddings: bool,
    /// Multi-head latent attention: `kv_lora_rank` and `qk_rope_head_dim`.
    pub kv_lora_rank: Option<u32>,
    pub qk_rope_head_dim: Option<u32>,
    /// Mixture of experts: routed experts per MoE layer and those a token uses.
    pub experts: Option<u32>,
    pub experts_per_token: Option<u32>,
    pub shared_experts: Option<u32>,
    /// Sliding-window attention: the window and how many layers use it.
    pub sliding_window: Option<u32>,
    pub sliding_window_layers: Option<u32>,
    /// How the weights are stored, e.g. `bfloat16`, `mlx 4-bit (group 64)`, `fp8`.
    pub precision: String,
    /// Parameters in all and those one token uses (the unused experts left out).
    pub parameters: u64,
    pub active_parameters: u64,
    /// Weight bytes in all, of the largest block, and those one token reads.
    pub total_bytes: u64,
    pub bytes_per_layer: u64,
    pub active_bytes: u64,
    /// Where the byte counts come from: the safetensors headers or the shape.
    pub bytes_from: BytesFrom,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BytesFrom {
    #[default]
    Shape,
    /// Summed from this many `.safetensors` files.
    Safetensors(usize),
}

/// Reads `dir/config.json` and, when present, the headers of `dir/*.safetensors`.
pub fn read_dir(dir: &Path) -> Result<HfFacts, HfError> {
    let config_path = dir.join("config.json");
    let text = read_bounded(&config_path, MAX_CONFIG)?;
    let mut facts = parse_config(&config_path, &text)?;
    let mut shards = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|source| HfError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            shards.push(path);
        }
    }
    shards.sort();
    if !shards.is_empty() {
        let mut tensors = Vec::new();
        for shard in &shards {
            tensors.extend(read_safetensors_header(shard)?);
        }
        facts.apply_tensors(&tensors, shards.len());
    }
    Ok(facts)
}

/// The facts in a `config.json` already read (`path` only names it in errors).
pub fn parse_config(path: &Path, bytes: &[u8]) -> Result<HfFacts, HfError> {
    let config: Value = serde_json::from_slice(bytes).map_err(|e| {
        invalid(
            path,
            format!("not JSON: {e} (line {}, column {})", e.line(), e.column()),
        )
    })?;
    facts_from_config(path, &config)
}

fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, HfError> {
    let io = |source| HfError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len > max {
        return Err(invalid(
            path,
            format!("{len} bytes; a model's config is at most {max}"),
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max).read_to_end(&mut bytes).map_err(io)?;
    Ok(bytes)
}

/// One tensor of a safetensors file: its name and the bytes it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorBytes {
    pub name: String,
    pub bytes: u64,
}

/// The tensor table of a `.safetensors` file: an 8-byte little-endian header length, then a
/// JSON object of `name: {dtype, shape, data_offsets: [begin, end]}` (and `__metadata__`).
pub fn read_safetensors_header(path: &Path) -> Result<Vec<TensorBytes>, HfError> {
    let io = |source| HfError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();
    let mut len = [0u8; 8];
    file.read_exact(&mut len)
        .map_err(|_| invalid(path, "shorter than a safetensors header (8 bytes)"))?;
    let header_len = u64::from_le_bytes(len);
    if header_len > MAX_HEADER || header_len > file_len.saturating_sub(8) {
        return Err(invalid(
            path,
            format!(
                "safetensors header of {header_len} bytes in a file of {file_len}: not a \
                 safetensors file, or cut short"
            ),
        ));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header).map_err(io)?;
    parse_safetensors_header(path, &header, file_len - 8 - header_len)
}

/// The tensor table of a safetensors file (or a prefix of one) already in memory.
pub fn parse_safetensors(path: &Path, bytes: &[u8]) -> Result<Vec<TensorBytes>, HfError> {
    let Some((len, rest)) = bytes.split_first_chunk::<8>() else {
        return Err(invalid(path, "shorter than a safetensors header (8 bytes)"));
    };
    let header_len = u64::from_le_bytes(*len);
    if header_len > MAX_HEADER || header_len > rest.len() as u64 {
        return Err(invalid(
            path,
            format!(
                "safetensors header of {header_len} bytes in a file of {}: not a safetensors \
                 file, or cut short",
                bytes.len()
            ),
        ));
    }
    let (header, data) = rest.split_at(header_len as usize);
    parse_safetensors_header(path, header, data.len() as u64)
}

/// The tensors of a header already read; `data_len` is the bytes after it.
pub fn parse_safetensors_header(
    path: &Path,
    header: &[u8],
    data_len: u64,
) -> Result<Vec<TensorBytes>, HfError> {
    let table: BTreeMap<String, Value> = serde_json::from_slice(header).map_err(|e| {
        invalid(
            path,
            format!("safetensors header is not a JSON object: {e}"),
        )
    })?;
    let mut tensors = Vec::with_capacity(table.len());
    for (name, entry) in table {
        if name == "__metadata__" {
            continue;
        }
        let offsets = entry
            .get("data_offsets")
            .and_then(Value::as_array)
            .and_then(|a| Some((a.first()?.as_u64()?, a.get(1)?.as_u64()?)));
        let Some((begin, end)) = offsets else {
            return Err(invalid(
                path,
                format!("tensor {name}: expected data_offsets [begin, end]"),
            ));
        };
        if begin > end || end > data_len {
            return Err(invalid(
                path,
                format!(
                    "tensor {name}: data_offsets [{begin}, {end}] outside the {data_len} bytes \
                     of data (a truncated file?)"
                ),
            ));
        }
        tensors.push(TensorBytes {
            name,
            bytes: end - begin,
        });
    }
    Ok(tensors)
}

/// The integer at `key`, if it is one that fits u32.
fn int(config: &Value, key: &str) -> Option<u32> {
    config
        .get(key)
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
}

/// The largest value each dimension may take: far above any published model, low enough that
/// counting parameters cannot overflow (in u128) and the per-layer table stays small.
const DIMENSION_LIMITS: &[(&str, u32)] = &[
    ("num_hidden_layers", 4096),
    ("first_k_dense_replace", 4096),
    ("hidden_size", 1 << 20),
    ("intermediate_size", 1 << 22),
    ("moe_intermediate_size", 1 << 22),
    ("vocab_size", 1 << 24),
    ("num_attention_heads", 1 << 16),
    ("num_key_value_heads", 1 << 16),
    ("head_dim", 1 << 16),
    ("kv_lora_rank", 1 << 16),
    ("q_lora_rank", 1 << 16),
    ("qk_rope_head_dim", 1 << 16),
    ("qk_nope_head_dim", 1 << 16),
    ("v_head_dim", 1 << 16),
    ("n_routed_experts", 1 << 16),
    ("num_local_experts", 1 << 16),
    ("num_experts", 1 << 16),
    ("n_shared_experts", 1 << 16),
    ("num_experts_per_tok", 1 << 16),
    ("experts_per_token", 1 << 16),
];

/// A model dimension at `key` no larger than `max` (a hostile config's 4-billion-layer model
/// would have tb allocate and count for each layer).
fn dim(path: &Path, config: &Value, key: &str, max: u32) -> Result<Option<u32>, HfError> {
    match int(config, key) {
        Some(n) if n > max => Err(invalid(
            path,
            format!("{key}: {n} is more than any model has (at most {max})"),
        )),
        n => Ok(n),
    }
}

/// The first of `keys` the config has.
fn first_int(config: &Value, keys: &[&str]) -> Option<u32> {
    keys.iter().find_map(|k| int(config, k))
}

/// Bits per parameter of each kind of tensor.
#[derive(Debug, Clone, Copy)]
struct Precision {
    /// Linear layers in the blocks, other than the experts.
    linear: f64,
    /// The routed (and shared) experts' matrices.
    experts: f64,
    /// Embeddings and the output head.
    embedding: f64,
    /// Norms, biases, routers.
    small: f64,
}

fn precision(path: &Path, config: &Value) -> Result<(Precision, String), HfError> {
    let dtype = config
        .get("torch_dtype")
        .or_else(|| config.get("dtype"))
        .and_then(Value::as_str)
        .unwrap_or("bfloat16");
    let base = match dtype {
        "float32" => 32.0,
        "bfloat16" | "float16" => 16.0,
        other => {
            return Err(invalid(
                path,
                format!("torch_dtype {other:?}: expected float32, bfloat16 or float16"),
            ));
        }
    };
    let all = |bits: f64| Precision {
        linear: bits,
        experts: bits,
        embedding: bits,
        small: base,
    };
    // MLX: every linear layer and the embeddings in `bits`, with a 16-bit scale and bias per
    // group of `group_size`.
    if let Some(q) = config.get("quantization").or_else(|| {
        config
            .get("quantization_config")
            .filter(|q| q.get("bits").is_some() && q.get("quant_method").is_none())
    }) {
        let bits = q.get("bits").and_then(Value::as_u64).unwrap_or(4);
        let group = q.get("group_size").and_then(Value::as_u64).unwrap_or(64);
        if !(1..=16).contains(&bits) || group == 0 {
            return Err(invalid(
                path,
                format!(
                    "quantization: bits {bits}, group_size {group}: expected 1–16 bits in groups of at least 1"
                ),
            ));
        }
        let per = bits as f64 + 32.0 / group as f64;
        return Ok((all(per), format!("mlx {bits}-bit (group {group})")));
    }
    if let Some(q) = config.get("quantization_config") {
        match q.get("quant_method").and_then(Value::as_str) {
            // DeepSeek-V3's fp8: the blocks' linear layers in 8 bits with a float32 scale per
            // 128×128 block; embeddings, head, norms and routers stay in 16 bits.
            Some("fp8") => {
                let per = 8.0 + 32.0 / (128.0 * 128.0);
                return Ok((
                    Precision {
                        linear: per,
                        experts: per,
                        embedding: base,
                        small: base,
                    },
                    "fp8 (block 128×128)".into(),
                ));
            }
            // gpt-oss's mxfp4: the experts in 4 bits with an 8-bit scale per 32; the rest 16.
            Some("mxfp4") => {
                return Ok((
                    Precision {
                        linear: base,
                        experts: 4.0 + 8.0 / 32.0,
                        embedding: base,
                        small: base,
                    },
                    "mxfp4 experts, bfloat16 elsewhere".into(),
                ));
            }
            Some(other) => {
                return Err(invalid(
                    path,
                    format!(
                        "quantization_config.quant_method {other:?}: tb sizes fp8, mxfp4 and MLX \
                         quantization from the config alone; put the .safetensors files beside it"
                    ),
                ));
            }
            None => {}
        }
    }
    Ok((all(base), dtype.to_string()))
}

/// Parameters of one block, split by the precision they are stored in.
#[derive(Debug, Default, Clone, Copy)]
struct Block {
    linear: u128,
    /// Routed experts, all of them.
    routed: u128,
    /// Shared experts (every token uses them).
    shared: u128,
    small: u128,
}

impl Block {
    fn parameters(&self) -> u128 {
        self.linear + self.routed + self.shared + self.small
    }
}

fn facts_from_config(path: &Path, config: &Value) -> Result<HfFacts, HfError> {
    // Multimodal checkpoints keep the language model's shape in `text_config`.
    let config = match config.get("text_config") {
        Some(text) if text.is_object() => text,
        _ => config,
    };
    let need = |key: &str| {
        int(config, key).filter(|n| *n > 0).ok_or_else(|| {
            invalid(
                path,
                format!(
                    "{key}: expected a positive integer (is this a language model's config.json?)"
                ),
            )
        })
    };
    for (key, max) in DIMENSION_LIMITS {
        dim(path, config, key, *max)?;
    }
    let architecture = config
        .get("model_type")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(path, "model_type: expected the architecture's name"))?
        .to_string();
    let layers = need("num_hidden_layers")?;
    let hidden = need("hidden_size")?;
    let heads = need("num_attention_heads")?;
    let kv_heads = int(config, "num_key_value_heads").unwrap_or(heads).max(1);
    let vocab = need("vocab_size")?;
    let kv_lora_rank = int(config, "kv_lora_rank").filter(|r| *r > 0);
    // With latent attention a query/key head is its no-rotary and rotary parts together.
    let mla_head = kv_lora_rank
        .and_then(|_| Some(int(config, "qk_nope_head_dim")? + int(config, "qk_rope_head_dim")?));
    let head_dim = int(config, "head_dim")
        .or(mla_head)
        .unwrap_or(hidden / heads)
        .max(1);
    let intermediate = int(config, "intermediate_size").unwrap_or(4 * hidden);
    let tied = config
        .get("tie_word_embeddings")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let experts = first_int(
        config,
        &["n_routed_experts", "num_local_experts", "num_experts"],
    )
    .filter(|n| *n > 1);
    let experts_per_token = experts
        .and(first_int(
            config,
            &["num_experts_per_tok", "experts_per_token"],
        ))
        .filter(|k| *k > 0);
    let shared_experts = int(config, "n_shared_experts").filter(|n| *n > 0);
    let moe_intermediate = int(config, "moe_intermediate_size").unwrap_or(intermediate);
    // DeepSeek-V3 keeps its first `first_k_dense_replace` blocks dense.
    let dense_first = int(config, "first_k_dense_replace")
        .unwrap_or(0)
        .min(layers);
    let (sliding_window, sliding_window_layers) = sliding(config, layers);
    let (precision, precision_name) = precision(path, config)?;

    let (h, hd) = (u128::from(hidden), u128::from(head_dim));
    let (nh, nkv) = (u128::from(heads), u128::from(kv_heads));
    let attention = match kv_lora_rank {
        Some(rank) => {
            // q_a (hidden→q_lora) + q_b (q_lora→heads×(nope+rope)), kv_a (hidden→rank+rope),
            // kv_b (rank→heads×(nope+v)), o (heads×v→hidden); two latent norms.
            let rope = u128::from(int(config, "qk_rope_head_dim").unwrap_or(64));
            let nope = u128::from(int(config, "qk_nope_head_dim").unwrap_or(128));
            let v = u128::from(int(config, "v_head_dim").unwrap_or(128));
            let rank = u128::from(rank);
            let q = match int(config, "q_lora_rank") {
                Some(q) if q > 0 => {
                    let q = u128::from(q);
                    h * q + q * nh * (nope + rope)
                }
                _ => h * nh * (nope + rope),
            };
            Block {
                linear: q + h * (rank + rope) + rank * nh * (nope + v) + nh * v * h,
                small: rank + u128::from(int(config, "q_lora_rank").unwrap_or(0)),
                ..Block::default()
            }
        }
        None => {
            let bias = config
                .get("attention_bias")
                .and_then(Value::as_bool)
                .unwrap_or(architecture == "qwen2" || architecture == "gpt_oss");
            let qkv_bias = if bias { nh * hd + 2 * nkv * hd } else { 0 };
            let o_bias = if architecture == "gpt_oss" { h + nh } else { 0 }; // + sinks
            let qk_norm = if architecture.starts_with("qwen3") {
                2 * hd
            } else {
                0
            };
            Block {
                linear: h * nh * hd + 2 * h * nkv * hd + nh * hd * h,
                small: qkv_bias + o_bias + qk_norm,
                ..Block::default()
            }
        }
    };
    let norms = 2 * h;
    let dense_mlp = 3 * h * u128::from(intermediate);
    let mut blocks = Vec::with_capacity(layers as usize);
    for i in 0..layers {
        let mut block = attention;
        block.small += norms;
        match experts {
            Some(e) if i >= dense_first => {
                let e = u128::from(e);
                let per_expert = 3 * h * u128::from(moe_intermediate);
                // gpt-oss's experts have biases (gate+up and down).
                let expert_bias = if architecture == "gpt_oss" {
                    2 * u128::from(moe_intermediate) + h
                } else {
                    0
                };
                block.routed += e * (per_expert + expert_bias);
                block.shared += u128::from(shared_experts.unwrap_or(0)) * per_expert;
                // The router: hidden × experts (+ a bias or correction per expert).
                block.small += h * e + e;
            }
            _ => block.linear += dense_mlp,
        }
        blocks.push(block);
    }
    let embedding = u128::from(vocab) * h;
    let head = if tied { 0 } else { embedding };
    let bits = |b: &Block| {
        b.linear as f64 * precision.linear
            + (b.routed + b.shared) as f64 * precision.experts
            + b.small as f64 * precision.small
    };
    // Float to integer casts saturate: a count past u64 reads as u64::MAX.
    let bytes = |bits: f64| (bits / 8.0).ceil() as u64;
    let clamp = |n: u128| u64::try_from(n).unwrap_or(u64::MAX);
    let other_bits = (embedding + head) as f64 * precision.embedding + h as f64 * precision.small;
    let total_bits = blocks.iter().map(bits).sum::<f64>() + other_bits;
    let share = match (experts, experts_per_token) {
        (Some(e), Some(k)) => f64::from(k) / f64::from(e),
        _ => 1.0,
    };
    let active_bits = blocks
        .iter()
        .map(|b| bits(b) - (1.0 - share) * b.routed as f64 * precision.experts)
        .sum::<f64>()
        + other_bits;
    let parameters = blocks.iter().map(Block::parameters).sum::<u128>() + embedding + head + h;
    let active_parameters = blocks
        .iter()
        .map(|b| b.parameters() - b.routed + (b.routed as f64 * share).round() as u128)
        .sum::<u128>()
        + embedding
        + head
        + h;
    Ok(HfFacts {
        architecture,
        layers,
        hidden_size: hidden,
        heads,
        kv_heads,
        head_dim,
        context_length: int(config, "max_position_embeddings").filter(|n| *n > 0),
        vocab_size: vocab,
        tied_embeddings: tied,
        kv_lora_rank,
        qk_rope_head_dim: kv_lora_rank.and(int(config, "qk_rope_head_dim")),
        experts,
        experts_per_token,
        shared_experts,
        sliding_window,
        sliding_window_layers,
        precision: precision_name,
        parameters: clamp(parameters),
        active_parameters: clamp(active_parameters),
        total_bytes: bytes(total_bits),
        bytes_per_layer: blocks.iter().map(|b| bytes(bits(b))).max().unwrap_or(0),
        active_bytes: bytes(active_bits),
        bytes_from: BytesFrom::Shape,
    })
}

/// The sliding window and how many layers use it: `layer_types` when the config lists them
/// (gpt-oss, Gemma), else `sliding_window` for every layer (Mistral 7B v0.1) unless
/// `use_sliding_window` is false (Qwen's configs carry an unused window).
fn sliding(config: &Value, layers: u32) -> (Option<u32>, Option<u32>) {
    let Some(window) = int(config, "sliding_window").filter(|w| *w > 0) else {
        return (None, None);
    };
    if let Some(types) = config.get("layer_types").and_then(Value::as_array) {
        let n = types
            .iter()
            .filter(|t| t.as_str() == Some("sliding_attention"))
            .count();
        return match n {
            0 => (None, None),
            n => (Some(window), Some((n as u32).min(layers))),
        };
    }
    if config.get("use_sliding_window").and_then(Value::as_bool) == Some(false) {
        return (None, None);
    }
    (Some(window), Some(layers))
}

impl HfFacts {
    /// Replaces the byte counts from the shape with the files' own.
    fn apply_tensors(&mut self, tensors: &[TensorBytes], shards: usize) {
        let mut per_layer: BTreeMap<u32, u64> = BTreeMap::new();
        let (mut total, mut routed) = (0u64, 0u64);
        for t in tensors {
            total = total.saturating_add(t.bytes);
            if is_routed_expert(&t.name) {
                routed = routed.saturating_add(t.bytes);
            }
            if let Some(layer) = layer_of(&t.name) {
                *per_layer.entry(layer).or_default() += t.bytes;
            }
        }
        let share = match (self.experts, self.experts_per_token) {
            (Some(e), Some(k)) => f64::from(k) / f64::from(e),
            _ => 1.0,
        };
        self.total_bytes = total;
        self.bytes_per_layer = per_layer.values().copied().max().unwrap_or(0);
        self.active_bytes = total - ((1.0 - share) * routed as f64) as u64;
        self.bytes_from = BytesFrom::Safetensors(shards);
    }
}

/// `model.layers.12.self_attn.q_proj.weight` → 12.
fn layer_of(name: &str) -> Option<u32> {
    let rest = name.split("layers.").nth(1)?;
    rest.split('.').next()?.parse().ok()
}

/// Routed experts' tensors: `mlp.experts.7.…`, fused `mlp.experts.gate_up_proj…` and MLX's
/// `switch_mlp`; not `shared_experts`.
fn is_routed_expert(name: &str) -> bool {
    (name.contains(".experts.") || name.contains(".switch_mlp.")) && !name.contains("shared_expert")
}

#[cfg(test)]
mod tests;
