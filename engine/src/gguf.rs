//! GGUF header parsing: the model configuration ([`ModelConfig`]) and an index of every tensor's
//! absolute byte range in the file ([`GgufIndex`]), so model staging can fetch only the byte ranges
//! a shard needs ([`GgufIndex::tensors_for_blocks`]) and [`crate::shard::Shard`] can read only
//! those tensors.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::{self, Content, Value};

use tb_api::gguf::{GgufError, GgufHeader};

use crate::error::{EngineError, Result};

/// Architectures whose block tb-engine implements (llama block; qwen2 adds q/k/v biases and
/// uses NEOX-style RoPE).
pub const SUPPORTED_ARCHITECTURES: &[&str] = &["llama", "mistral", "qwen2"];

/// The hyper-parameters of a llama-family model, read from GGUF metadata `{arch}.*`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: String,
    pub n_layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub context: usize,
    pub rope_theta: f32,
    pub rms_eps: f64,
}

fn md<'a>(content: &'a Content, key: &str) -> Option<&'a Value> {
    content.metadata.get(key)
}

fn bad(key: &str, detail: impl Into<String>) -> EngineError {
    EngineError::BadMetadata {
        key: key.to_string(),
        detail: detail.into(),
    }
}

/// Any integer-typed GGUF value as u64 (files differ in which integer type they use).
pub(crate) fn value_as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::U8(x) => Some(u64::from(*x)),
        Value::U16(x) => Some(u64::from(*x)),
        Value::U32(x) => Some(u64::from(*x)),
        Value::U64(x) => Some(*x),
        Value::I8(x) => u64::try_from(*x).ok(),
        Value::I16(x) => u64::try_from(*x).ok(),
        Value::I32(x) => u64::try_from(*x).ok(),
        Value::I64(x) => u64::try_from(*x).ok(),
        _ => None,
    }
}

fn value_as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::F32(x) => Some(f64::from(*x)),
        Value::F64(x) => Some(*x),
        other => value_as_u64(other).map(|x| x as f64),
    }
}

fn req_usize(content: &Content, key: &str) -> Result<usize> {
    let v = md(content, key).ok_or_else(|| bad(key, "missing"))?;
    value_as_u64(v)
        .and_then(|x| usize::try_from(x).ok())
        .ok_or_else(|| bad(key, format!("expected an unsigned integer, got {v:?}")))
}

fn opt_usize(content: &Content, key: &str) -> Result<Option<usize>> {
    match md(content, key) {
        None => Ok(None),
        Some(_) => req_usize(content, key).map(Some),
    }
}

fn opt_f64(content: &Content, key: &str) -> Result<Option<f64>> {
    match md(content, key) {
        None => Ok(None),
        Some(v) => value_as_f64(v)
            .map(Some)
            .ok_or_else(|| bad(key, format!("expected a number, got {v:?}"))),
    }
}

impl ModelConfig {
    /// Reads `general.architecture` and `{arch}.block_count`, `embedding_length`,
    /// `attention.head_count(_kv)`, `feed_forward_length`, `context_length`, `rope.freq_base`
    /// (default 10000), `attention.layer_norm_rms_epsilon` (default 1e-5), `vocab_size` (else the
    /// length of `tokenizer.ggml.tokens`, else the rows of `token_embd.weight`).
    pub fn from_gguf(content: &gguf_file::Content) -> Result<Self> {
        let arch_key = "general.architecture";
        let arch = md(content, arch_key)
            .ok_or_else(|| bad(arch_key, "missing"))?
            .to_string()
            .map_err(|e| bad(arch_key, e.to_string()))?
            .clone();
        if !SUPPORTED_ARCHITECTURES.contains(&arch.as_str()) {
            return Err(EngineError::UnsupportedArchitecture { arch });
        }
        let k = |s: &str| format!("{arch}.{s}");
        let n_layers = req_usize(content, &k("block_count"))?;
        let hidden = req_usize(content, &k("embedding_length"))?;
        let heads = req_usize(content, &k("attention.head_count"))?;
        let kv_heads = opt_usize(content, &k("attention.head_count_kv"))?.unwrap_or(heads);
        let ffn = req_usize(content, &k("feed_forward_length"))?;
        let context = req_usize(content, &k("context_length"))?;
        if n_layers == 0 || hidden == 0 || heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(bad(
                &k("attention.head_count_kv"),
                format!(
                    "need layers, hidden, heads, kv heads > 0 and heads divisible by kv heads; got layers {n_layers}, hidden {hidden}, heads {heads}, kv heads {kv_heads}"
                ),
            ));
        }
        let head_dim = match opt_usize(content, &k("attention.key_length"))? {
            Some(d) => d,
            None if hidden % heads == 0 => hidden / heads,
            None => {
                return Err(bad(
                    &k("embedding_length"),
                    format!("hidden {hidden} is not divisible by heads {heads}"),
                ));
            }
        };
        if let Some(rope_dim) = opt_usize(content, &k("rope.dimension_count"))?
            && rope_dim != head_dim
        {
            return Err(bad(
                &k("rope.dimension_count"),
                format!(
                    "partial rotary embeddings are not supported: rope dims {rope_dim}, head dim {head_dim}"
                ),
            ));
        }
        let vocab = match opt_usize(content, &k("vocab_size"))? {
            Some(v) => v,
            None => match md(content, "tokenizer.ggml.tokens").and_then(|v| v.to_vec().ok()) {
                Some(tokens) => tokens.len(),
                None => content
                    .tensor_infos
                    .get("token_embd.weight")
                    .and_then(|t| t.shape.dims().first().copied())
                    .ok_or_else(|| {
                        bad(
                            &k("vocab_size"),
                            "missing, and no tokenizer or token_embd.weight",
                        )
                    })?,
            },
        };
        let rope_theta = opt_f64(content, &k("rope.freq_base"))?.unwrap_or(10_000.0) as f32;
        let rms_eps = opt_f64(content, &k("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5);
        Ok(Self {
            architecture: arch,
            n_layers,
            hidden,
            heads,
            kv_heads,
            head_dim,
            ffn,
            vocab,
            context,
            rope_theta,
            rms_eps,
        })
    }
}

/// One tensor's place in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    pub name: String,
    /// Absolute offset of the tensor's data in the file.
    pub offset: u64,
    /// Length of the tensor's data in bytes.
    pub len: u64,
    /// ggml type, e.g. "Q4_1", "Q8_0", "F32".
    pub dtype: String,
    /// Shape in row-major (PyTorch) order, e.g. [vocab, hidden] for `token_embd.weight`.
    pub shape: Vec<u64>,
}

impl TensorEntry {
    /// End of the tensor's data (exclusive), absolute in the file.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// The parsed header of a GGUF file: metadata, model config and tensor index.
#[derive(Debug)]
pub struct GgufIndex {
    path: PathBuf,
    content: Content,
    file_len: u64,
    config: ModelConfig,
    tensors: BTreeMap<String, TensorEntry>,
}

/// The bytes of a tensor's data, or None when its element count overflows (a hostile shape) or
/// is not a whole number of blocks.
fn tensor_len(info: &gguf_file::TensorInfo) -> Option<u64> {
    let elems = element_count(info)?;
    let block = info.ggml_dtype.block_size();
    if block == 0 || !elems.is_multiple_of(block) {
        return None;
    }
    let bytes = (elems / block).checked_mul(info.ggml_dtype.type_size())?;
    u64::try_from(bytes).ok()
}

/// The product of a tensor's dimensions, checked (candle's `Shape::elem_count` overflows).
fn element_count(info: &gguf_file::TensorInfo) -> Option<usize> {
    info.shape
        .dims()
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// Reads the GGUF header of `path`. Errors: [`EngineError::Io`] when the file cannot be opened,
/// [`EngineError::NotGguf`] when the header is not GGUF or is truncated/corrupt.
pub(crate) fn read_content(path: &Path) -> Result<(Content, u64)> {
    guard(path, GgufHeader::read(path))?;
    let file = File::open(path).map_err(|source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut reader = BufReader::new(file);
    let file_len = reader
        .seek(SeekFrom::End(0))
        .and_then(|n| reader.seek(SeekFrom::Start(0)).map(|_| n))
        .map_err(|source| EngineError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    let content = read_guarded(path, &mut reader)
        .map_err(|e| format!("cannot parse the header ({file_len} bytes in file): {e}"))
        .map_err(|detail| EngineError::NotGguf {
            path: path.to_path_buf(),
            detail,
        })?;
    Ok((content, file_len))
}

/// Parses a GGUF header held in memory (`path` names it in errors), as [`read_content`] does
/// for a file: the fuzz targets' way in.
pub fn parse_content(path: &Path, bytes: &[u8]) -> Result<Content> {
    guard(path, GgufHeader::parse(path, bytes))?;
    let mut reader = std::io::Cursor::new(bytes);
    read_guarded(path, &mut reader).map_err(|e| EngineError::NotGguf {
        path: path.to_path_buf(),
        detail: format!("cannot parse the header ({} bytes): {e}", bytes.len()),
    })
}

/// candle's header reader, with a panic of its own turned into an error. [`guard`] refuses
/// what is known to make it panic; this catches what the two readers may still see
/// differently (a fuzzed header once reached a division by a zero alignment past the guard).
fn read_guarded<R: std::io::Read + std::io::Seek>(
    path: &Path,
    reader: &mut R,
) -> std::result::Result<Content, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Content::read(reader))) {
        Ok(Ok(content)) => Ok(content),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => {
            tracing::warn!(path = %path.display(), "candle's GGUF reader panicked on this header");
            Err("candle's GGUF reader could not read this header".into())
        }
    }
}

/// Checks a header with tb-api's bounded reader before candle's reader sees it: candle's
/// allocates as the header's counts say and divides by `general.alignment` unchecked (a zero
/// there panics). Files that pass have every count backed by bytes in the file and an alignment
/// that is a power of two (as llama.cpp requires).
fn guard(path: &Path, header: std::result::Result<GgufHeader, GgufError>) -> Result<()> {
    let not_gguf = |detail: String| EngineError::NotGguf {
        path: path.to_path_buf(),
        detail,
    };
    let header = header.map_err(|e| match e {
        GgufError::Io { path, source } => EngineError::Io { path, source },
        other => {
            let text = other.to_string();
            let prefix = format!("{}: ", path.display());
            not_gguf(text.strip_prefix(&prefix).unwrap_or(&text).to_string())
        }
    })?;
    if let Some(align) = header
        .get("general.alignment")
        .and_then(tb_api::gguf::MetaValue::as_u64)
        && !align.is_power_of_two()
    {
        return Err(not_gguf(format!(
            "general.alignment is {align}; expected a power of two"
        )));
    }
    Ok(())
}

impl GgufIndex {
    /// Parses the header of the GGUF file at `path` (reads only the header, not tensor data).
    pub fn open(path: &Path) -> Result<Self> {
        let (content, file_len) = read_content(path)?;
        Self::from_content(path, content, file_len)
    }

    /// Builds the index from an already parsed header.
    pub fn from_content(path: &Path, content: Content, file_len: u64) -> Result<Self> {
        let config = ModelConfig::from_gguf(&content)?;
        let mut tensors = BTreeMap::new();
        for (name, info) in &content.tensor_infos {
            let len = tensor_len(info).ok_or_else(|| EngineError::NotGguf {
                path: path.to_path_buf(),
                detail: match element_count(info) {
                    Some(n) => format!(
                        "tensor {name}: {n} elements are not a multiple of the {:?} block size",
                        info.ggml_dtype
                    ),
                    None => format!(
                        "tensor {name}: its shape {:?} holds more elements than a machine can",
                        info.shape.dims()
                    ),
                },
            })?;
            let offset = content
                .tensor_data_offset
                .checked_add(info.offset)
                .ok_or_else(|| EngineError::NotGguf {
                    path: path.to_path_buf(),
                    detail: format!("tensor {name}: offset {} overflows", info.offset),
                })?;
            tensors.insert(
                name.clone(),
                TensorEntry {
                    name: name.clone(),
                    offset,
                    len,
                    dtype: format!("{:?}", info.ggml_dtype),
                    shape: info.shape.dims().iter().map(|&d| d as u64).collect(),
                },
            );
        }
        Ok(Self {
            path: path.to_path_buf(),
            content,
            file_len,
            config,
            tensors,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn content(&self) -> &Content {
        &self.content
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Size of the file on disk.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Absolute offset where tensor data starts (header + metadata + tensor infos + padding).
    pub fn header_len(&self) -> u64 {
        self.content.tensor_data_offset
    }

    /// One tensor by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.get(name)
    }

    /// All tensors, by name.
    pub fn tensors(&self) -> impl Iterator<Item = &TensorEntry> {
        self.tensors.values()
    }

    /// ggml type of a tensor.
    pub fn ggml_dtype(&self, name: &str) -> Option<GgmlDType> {
        self.content.tensor_infos.get(name).map(|t| t.ggml_dtype)
    }

    /// The tensors a shard of blocks [first, first+count) of an `n_layers` model needs, sorted by
    /// offset: every `blk.N.*` for N in the range; `token_embd.weight` when first == 0; when the
    /// shard is the last (first + count == n_layers) `output_norm.weight` and `output.weight`, or
    /// `token_embd.weight` when `output.weight` is absent (tied embeddings, as in SmolLM2).
    /// An out-of-range request simply lists fewer tensors; [`Self::shard_tensors`] checks the range.
    pub fn tensors_for_blocks(
        &self,
        first: usize,
        count: usize,
        n_layers: usize,
    ) -> Vec<&TensorEntry> {
        let end = first.saturating_add(count);
        let mut out: Vec<&TensorEntry> = self
            .tensors
            .values()
            .filter(|t| block_index(&t.name).is_some_and(|i| i >= first && i < end))
            .collect();
        let mut extra = Vec::new();
        if first == 0 {
            extra.push("token_embd.weight");
        }
        if end == n_layers && count > 0 {
            extra.push("output_norm.weight");
            if self.tensors.contains_key("output.weight") {
                extra.push("output.weight");
            } else if first != 0 {
                extra.push("token_embd.weight");
            }
        }
        out.extend(extra.into_iter().filter_map(|n| self.tensors.get(n)));
        out.sort_by_key(|t| t.offset);
        out
    }

    /// Like [`Self::tensors_for_blocks`] for this model, with the range checked.
    pub fn shard_tensors(&self, first: usize, count: usize) -> Result<Vec<&TensorEntry>> {
        let layers = self.config.n_layers;
        if count == 0 || first.checked_add(count).is_none_or(|end| end > layers) {
            return Err(EngineError::BadRange {
                first,
                count,
                layers,
            });
        }
        Ok(self.tensors_for_blocks(first, count, layers))
    }

    /// Checks that `entry`'s bytes are inside the file (a truncated download is caught here).
    pub fn check_in_file(&self, entry: &TensorEntry) -> Result<()> {
        if entry.end() > self.file_len {
            return Err(EngineError::NotGguf {
                path: self.path.clone(),
                detail: format!(
                    "truncated: tensor {} needs bytes {}..{} but the file has only {} bytes",
                    entry.name,
                    entry.offset,
                    entry.end(),
                    self.file_len
                ),
            });
        }
        Ok(())
    }
}

/// `blk.N.something` -> N.
pub fn block_index(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("blk.")?;
    let (n, _) = rest.split_once('.')?;
    n.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::block_index;

    #[test]
    fn block_names() {
        assert_eq!(block_index("blk.12.attn_q.weight"), Some(12));
        assert_eq!(block_index("blk.x.attn_q.weight"), None);
        assert_eq!(block_index("token_embd.weight"), None);
    }
}
