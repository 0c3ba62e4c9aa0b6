//! A pure reader of a GGUF file's header: its metadata and tensor table, never the weights.
//! `tbctl model inspect` turns what it finds into a Model manifest; it needs no ML runtime, so
//! the reader lives here (std only) rather than in the engine, which reads the same header with
//! candle when it loads the tensors.
//!
//! The file is treated as hostile: every length and count is checked against the bytes left in
//! the file before anything is read or allocated, strings longer than [`MAX_KEPT_STRING`] are
//! skipped rather than kept, and array nesting is bounded. Every error names the file, the byte
//! offset and what was expected there.
//!
//! Layout (GGUF v2 and v3, little-endian): `GGUF`, version u32, tensor count u64, metadata
//! count u64; each metadata entry is a string key, a u32 type and a value; each tensor entry a
//! string name, u32 dimension count, u64 dimensions, u32 ggml type and u64 data offset.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Cursor, Read};
use std::path::{Path, PathBuf};

use crate::Quantity;
use crate::specs::model::{ModelFormat, ModelSource, ModelSpec};

/// The four bytes every GGUF file starts with.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// Strings (metadata values) longer than this are skipped, not kept: chat templates fit,
/// nothing tb reads is longer.
pub const MAX_KEPT_STRING: u64 = 1 << 20;
/// Keys and tensor names longer than this mean a corrupt file.
const MAX_NAME: u64 = 64 * 1024;
/// Arrays of arrays deeper than this mean a corrupt (or hostile) file.
const MAX_ARRAY_DEPTH: u32 = 3;
/// ggml's GGML_MAX_DIMS.
const MAX_DIMS: u32 = 4;

/// Why a file could not be read as GGUF.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{}: not a GGUF file: {found}, and a GGUF file starts with \"GGUF\" \
         (tbctl reads GGUF only: llama.cpp's format, one .gguf file per model)",
        path.display()
    )]
    NotGguf {
        path: PathBuf,
        /// What the file has instead: `it starts with "..."` or `it has only N bytes`.
        found: String,
    },
    #[error("{}: GGUF version {version} is not supported (expected 2 or 3)", path.display())]
    Version { path: PathBuf, version: u32 },
    #[error(
        "{}: truncated at byte {offset}: expected {expected}, but the file ends at byte {len}",
        path.display()
    )]
    Truncated {
        path: PathBuf,
        offset: u64,
        len: u64,
        expected: String,
    },
    #[error("{}: byte {offset}: {detail}", path.display())]
    Corrupt {
        path: PathBuf,
        offset: u64,
        detail: String,
    },
}

/// A metadata value as kept: numbers, booleans and short strings; arrays by element type and
/// length only (a vocabulary is tens of thousands of strings tb does not need).
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    Uint(u64),
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    /// A string longer than [`MAX_KEPT_STRING`], skipped: its length in bytes.
    LongStr(u64),
    Array {
        elem_type: u32,
        len: u64,
    },
}

impl MetaValue {
    /// The value as an unsigned integer, whichever integer type the file used.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            MetaValue::Uint(v) => Some(*v),
            MetaValue::Int(v) => u64::try_from(*v).ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// One tensor's entry in the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` varies fastest (for `token_embd.weight`: hidden, then vocab).
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    /// Relative to the start of the tensor data.
    pub offset: u64,
}

impl TensorInfo {
    pub fn elements(&self) -> Option<u64> {
        self.dims.iter().try_fold(1u64, |n, d| n.checked_mul(*d))
    }

    /// Bytes of the tensor's data, when its type is one tb knows the block size of.
    pub fn bytes(&self) -> Option<u64> {
        let (block, size) = ggml_type_block(self.ggml_type)?;
        let elements = self.elements()?;
        if !elements.is_multiple_of(block) {
            return None;
        }
        (elements / block).checked_mul(size)
    }
}

/// The header of a GGUF file.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufHeader {
    pub path: PathBuf,
    pub version: u32,
    pub file_bytes: u64,
    pub metadata: BTreeMap<String, MetaValue>,
    pub tensors: Vec<TensorInfo>,
    /// Where the tensor table ends (tensor data starts at the next multiple of the alignment).
    pub table_end: u64,
}

/// A tensor whose data lies (partly) past the end of the file: a truncated download.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingData {
    pub tensor: String,
    /// The byte the tensor's data ends at.
    pub ends_at: u64,
    pub file_bytes: u64,
}

/// The facts a Model manifest needs, read from the header's `{architecture}.*` keys.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelFacts {
    pub architecture: String,
    /// `general.name`, when the file has one.
    pub name: Option<String>,
    pub layers: Option<u64>,
    pub hidden_size: Option<u64>,
    pub heads: Option<u64>,
    pub kv_heads: Option<u64>,
    /// `attention.key_length`, else hidden size / heads when it divides.
    pub head_dim: Option<u64>,
    pub feed_forward: Option<u64>,
    pub context_length: Option<u64>,
    /// `vocab_size`, else the tokenizer's token count, else `token_embd.weight`'s rows.
    pub vocab_size: Option<u64>,
    /// e.g. `Q4_1`: `general.file_type` when it names one, else the type holding most of the
    /// blocks' weight bytes.
    pub quantization: Option<String>,
    /// Bytes of all tensors whose type tb knows.
    pub tensor_bytes: u64,
    /// The bytes of one transformer block (the largest, when they differ).
    pub bytes_per_layer: Option<u64>,
    /// Multi-head latent attention (`attention.kv_lora_rank`) and its rotary key part
    /// (`rope.dimension_count`).
    pub kv_lora_rank: Option<u64>,
    pub qk_rope_head_dim: Option<u64>,
    /// Mixture of experts: `expert_count` and `expert_used_count`.
    pub experts: Option<u64>,
    pub experts_per_token: Option<u64>,
    /// `attention.sliding_window`.
    pub sliding_window: Option<u64>,
    /// `token_embd.weight` and no `output.weight`: the head is the embedding table.
    pub tied_embeddings: bool,
}

/// A header count as a Model spec field takes it: present, positive and within u32.
pub fn spec_count(v: Option<u64>) -> Option<u32> {
    v.and_then(|n| u32::try_from(n).ok()).filter(|n| *n > 0)
}

impl ModelFacts {
    /// The Model spec of the GGUF file at `path` (as nodes will name it) whose header gave
    /// these facts; fields the header does not give are left out (placement then estimates).
    pub fn model_spec(&self, path: &str, file_bytes: u64) -> ModelSpec {
        ModelSpec {
            format: ModelFormat::Gguf,
            source: ModelSource {
                path: Some(path.to_string()),
                nodes: Vec::new(),
            },
            architecture: Some(self.architecture.clone()),
            layers: spec_count(self.layers),
            bytes_per_layer: self
                .bytes_per_layer
                .filter(|b| *b > 0)
                .map(Quantity::from_bytes),
            total_bytes: (file_bytes > 0).then(|| Quantity::from_bytes(file_bytes)),
            hidden_size: spec_count(self.hidden_size),
            heads: spec_count(self.heads),
            kv_heads: spec_count(self.kv_heads),
            context_length: spec_count(self.context_length),
            vocab_size: spec_count(self.vocab_size),
            head_dim: match (self.head_dim, self.hidden_size, self.heads) {
                (Some(d), Some(h), Some(n)) if n > 0 && d != h / n => spec_count(Some(d)),
                _ => None,
            },
            kv_lora_rank: spec_count(self.kv_lora_rank),
            qk_rope_head_dim: spec_count(self.kv_lora_rank.and(self.qk_rope_head_dim)),
            experts: spec_count(self.experts),
            experts_per_token: spec_count(self.experts.and(self.experts_per_token)),
            sliding_window: spec_count(self.sliding_window),
            tied_embeddings: self.tied_embeddings.then_some(true),
            ..ModelSpec::default()
        }
    }
}

impl GgufHeader {
    /// Reads the header of the file at `path` (not the tensor data).
    pub fn read(path: &Path) -> Result<GgufHeader, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if file.metadata().map_err(io)?.is_dir() {
            return Err(GgufError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::other("is a directory"),
            });
        }
        let mut r = Reader {
            path,
            inner: BufReader::new(file),
            pos: 0,
            len,
        };
        r.header()
    }

    /// Reads a header from bytes already in memory (`path` only names them in errors): what
    /// the fuzz targets and tests feed. The bytes may be a prefix of a file; tensors whose data
    /// lies past them are then reported by [`GgufHeader::missing_data`].
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<GgufHeader, GgufError> {
        let mut r = Reader {
            path,
            inner: Cursor::new(bytes),
            pos: 0,
            len: bytes.len() as u64,
        };
        r.header()
    }

    /// The tensor whose data ends furthest past the end of the file, if any does: the file
    /// was cut short (an interrupted download or copy).
    pub fn missing_data(&self) -> Option<MissingData> {
        let align = self
            .get("general.alignment")
            .and_then(MetaValue::as_u64)
            .filter(|a| *a > 0)
            .unwrap_or(32);
        let data_start = self.table_end.div_ceil(align).saturating_mul(align);
        self.tensors
            .iter()
            .filter_map(|t| {
                let end = data_start.checked_add(t.offset)?.checked_add(t.bytes()?)?;
                (end > self.file_bytes).then_some((end, t))
            })
            .max_by_key(|(end, _)| *end)
            .map(|(ends_at, t)| MissingData {
                tensor: t.name.clone(),
                ends_at,
                file_bytes: self.file_bytes,
            })
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    fn arch_u64(&self, arch: &str, key: &str) -> Option<u64> {
        self.get(&format!("{arch}.{key}"))
            .and_then(MetaValue::as_u64)
    }

    /// The model's shape and quantisation, as far as the header says.
    pub fn model_facts(&self) -> ModelFacts {
        let architecture = self
            .get("general.architecture")
            .and_then(MetaValue::as_str)
            .unwrap_or("")
            .to_string();
        let a = architecture.as_str();
        let heads = self.arch_u64(a, "attention.head_count");
        let hidden = self.arch_u64(a, "embedding_length");
        let head_dim = self
            .arch_u64(a, "attention.key_length")
            .or(match (hidden, heads) {
                (Some(h), Some(n)) if n > 0 && h.is_multiple_of(n) => Some(h / n),
                _ => None,
            });
        let vocab = self
            .arch_u64(a, "vocab_size")
            .or_else(|| match self.get("tokenizer.ggml.tokens") {
                Some(MetaValue::Array { len, .. }) => Some(*len),
                _ => None,
            })
            .or_else(|| {
                self.tensors
                    .iter()
                    .find(|t| t.name == "token_embd.weight")
                    .and_then(|t| t.dims.last().copied())
            });
        ModelFacts {
            name: self
                .get("general.name")
                .and_then(MetaValue::as_str)
                .map(str::to_string),
            layers: self.arch_u64(a, "block_count"),
            hidden_size: hidden,
            heads,
            kv_heads: self.arch_u64(a, "attention.head_count_kv").or(heads),
            head_dim,
            feed_forward: self.arch_u64(a, "feed_forward_length"),
            context_length: self.arch_u64(a, "context_length"),
            vocab_size: vocab,
            quantization: self.quantization(),
            // Saturating: a hostile table's sizes may add up past u64.
            tensor_bytes: self
                .tensors
                .iter()
                .filter_map(TensorInfo::bytes)
                .fold(0u64, u64::saturating_add),
            bytes_per_layer: self.bytes_per_layer(),
            kv_lora_rank: self
                .arch_u64(a, "attention.kv_lora_rank")
                .filter(|r| *r > 0),
            qk_rope_head_dim: self.arch_u64(a, "rope.dimension_count"),
            experts: self.arch_u64(a, "expert_count").filter(|n| *n > 1),
            experts_per_token: self.arch_u64(a, "expert_used_count"),
            sliding_window: self.arch_u64(a, "attention.sliding_window"),
            tied_embeddings: self.tensors.iter().any(|t| t.name == "token_embd.weight")
                && !self.tensors.iter().any(|t| t.name == "output.weight"),
            architecture,
        }
    }

    fn quantization(&self) -> Option<String> {
        let from_file_type = self
            .get("general.file_type")
            .and_then(MetaValue::as_u64)
            .and_then(file_type_name);
        if let Some(name) = from_file_type {
            return Some(name.to_string());
        }
        let mut by_type: BTreeMap<u32, u64> = BTreeMap::new();
        for t in &self.tensors {
            if t.name.starts_with("blk.") && t.dims.len() >= 2 {
                let sum = by_type.entry(t.ggml_type).or_default();
                *sum = sum.saturating_add(t.bytes().unwrap_or(0));
            }
        }
        let (ty, _) = by_type.into_iter().max_by_key(|&(_, bytes)| bytes)?;
        Some(ggml_type_name(ty).map_or_else(|| format!("ggml type {ty}"), str::to_string))
    }

    fn bytes_per_layer(&self) -> Option<u64> {
        let mut per_block: BTreeMap<u64, u64> = BTreeMap::new();
        for t in &self.tensors {
            let Some(block) = t
                .name
                .strip_prefix("blk.")
                .and_then(|rest| rest.split_once('.'))
                .and_then(|(n, _)| n.parse::<u64>().ok())
            else {
                continue;
            };
            // A tensor of unknown size would make the figure a guess: give none.
            let sum = per_block.entry(block).or_default();
            *sum = sum.saturating_add(t.bytes()?);
        }
        per_block.into_values().max()
    }
}

/// (elements per block, bytes per block) of a ggml tensor type.
pub fn ggml_type_block(ty: u32) -> Option<(u64, u64)> {
    Some(match ty {
        0 => (1, 4),      // F32
        1 => (1, 2),      // F16
        2 => (32, 18),    // Q4_0
        3 => (32, 20),    // Q4_1
        6 => (32, 22),    // Q5_0
        7 => (32, 24),    // Q5_1
        8 => (32, 34),    // Q8_0
        9 => (32, 36),    // Q8_1
        10 => (256, 84),  // Q2_K
        11 => (256, 110), // Q3_K
        12 => (256, 144), // Q4_K
        13 => (256, 176), // Q5_K
        14 => (256, 210), // Q6_K
        15 => (256, 292), // Q8_K
        16 => (256, 66),  // IQ2_XXS
        17 => (256, 74),  // IQ2_XS
        18 => (256, 98),  // IQ3_XXS
        19 => (256, 50),  // IQ1_S
        20 => (32, 18),   // IQ4_NL
        21 => (256, 110), // IQ3_S
        22 => (256, 82),  // IQ2_S
        23 => (256, 136), // IQ4_XS
        24 => (1, 1),     // I8
        25 => (1, 2),     // I16
        26 => (1, 4),     // I32
        27 => (1, 8),     // I64
        28 => (1, 8),     // F64
        29 => (256, 56),  // IQ1_M
        30 => (1, 2),     // BF16
        _ => return None,
    })
}

/// ggml's name of a tensor type.
pub fn ggml_type_name(ty: u32) -> Option<&'static str> {
    Some(match ty {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        _ => return None,
    })
}

/// llama.cpp's name of a `general.file_type` (the quantisation the file was made with).
pub fn file_type_name(ft: u64) -> Option<&'static str> {
    Some(match ft {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        _ => return None,
    })
}

/// The fewest bytes a value of a metadata type takes (for bounding counts before reading).
fn min_value_bytes(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        8 => 8,     // string: its u64 length
        9 => 4 + 8, // array: element type and count
        _ => return None,
    })
}

/// Where the reader's bytes come from: a buffered file or bytes in memory. `skip_forward`
/// moves on without reading (a buffered file keeps its buffer, unlike `Seek::seek`).
trait Source: Read {
    fn skip_forward(&mut self, n: u64) -> std::io::Result<()>;
}

impl Source for BufReader<File> {
    fn skip_forward(&mut self, n: u64) -> std::io::Result<()> {
        let step = i64::try_from(n).map_err(std::io::Error::other)?;
        self.seek_relative(step)
    }
}

impl Source for Cursor<&[u8]> {
    fn skip_forward(&mut self, n: u64) -> std::io::Result<()> {
        let to = self.position().saturating_add(n);
        self.set_position(to);
        Ok(())
    }
}

struct Reader<'a, R> {
    path: &'a Path,
    inner: R,
    pos: u64,
    len: u64,
}

impl<R: Source> Reader<'_, R> {
    fn truncated(&self, n: u64, expected: &str) -> GgufError {
        GgufError::Truncated {
            path: self.path.to_path_buf(),
            offset: self.pos,
            len: self.len,
            expected: format!("{expected} ({n} bytes)"),
        }
    }

    fn corrupt(&self, offset: u64, detail: String) -> GgufError {
        GgufError::Corrupt {
            path: self.path.to_path_buf(),
            offset,
            detail,
        }
    }

    fn left(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    /// Fails unless `n` more bytes are in the file.
    fn need(&self, n: u64, what: &str) -> Result<(), GgufError> {
        if n > self.left() {
            return Err(self.truncated(n, what));
        }
        Ok(())
    }

    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        self.need(N as u64, what)?;
        let mut buf = [0u8; N];
        self.inner
            .read_exact(&mut buf)
            .map_err(|source| GgufError::Io {
                path: self.path.to_path_buf(),
                source,
            })?;
        self.pos += N as u64;
        Ok(buf)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        self.bytes::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        self.bytes::<8>(what).map(u64::from_le_bytes)
    }

    fn skip(&mut self, n: u64, what: &str) -> Result<(), GgufError> {
        self.need(n, what)?;
        self.inner.skip_forward(n).map_err(|source| GgufError::Io {
            path: self.path.to_path_buf(),
            source,
        })?;
        self.pos += n;
        Ok(())
    }

    /// A string of at most `max` bytes; None (skipped) when longer and `skip_long`.
    fn string(
        &mut self,
        what: &str,
        max: u64,
        skip_long: bool,
    ) -> Result<Option<String>, GgufError> {
        let at = self.pos;
        let n = self.u64(&format!("the length of {what}"))?;
        if n > max {
            if skip_long {
                self.skip(n, what)?;
                return Ok(None);
            }
            return Err(self.corrupt(
                at,
                format!("{what} claims {n} bytes (at most {max} expected)"),
            ));
        }
        self.need(n, what)?;
        let mut buf = vec![0u8; n as usize];
        self.inner
            .read_exact(&mut buf)
            .map_err(|source| GgufError::Io {
                path: self.path.to_path_buf(),
                source,
            })?;
        self.pos += n;
        String::from_utf8(buf)
            .map(Some)
            .map_err(|_| self.corrupt(at, format!("{what} is not UTF-8")))
    }

    /// Checks that `count` items of at least `each` bytes fit in the rest of the file.
    fn check_count(&self, at: u64, count: u64, each: u64, what: &str) -> Result<(), GgufError> {
        if count.saturating_mul(each) > self.left() {
            return Err(self.corrupt(
                at,
                format!(
                    "{what}: {count} claimed, but only {} bytes are left in the file (truncated \
                     or corrupt)",
                    self.left()
                ),
            ));
        }
        Ok(())
    }

    fn header(&mut self) -> Result<GgufHeader, GgufError> {
        let magic = match self.bytes::<4>("the magic \"GGUF\"") {
            Ok(m) => m,
            Err(GgufError::Truncated { .. }) => {
                return Err(GgufError::NotGguf {
                    path: self.path.to_path_buf(),
                    found: format!("it has only {} bytes", self.len),
                });
            }
            Err(e) => return Err(e),
        };
        if &magic != MAGIC {
            return Err(GgufError::NotGguf {
                path: self.path.to_path_buf(),
                // Escaped: the bytes of a binary file would garble the terminal.
                found: format!("it starts with \"{}\"", magic.escape_ascii()),
            });
        }
        let version = self.u32("the version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::Version {
                path: self.path.to_path_buf(),
                version,
            });
        }
        let at = self.pos;
        let tensor_count = self.u64("the tensor count")?;
        let kv_count = self.u64("the metadata count")?;
        // The smallest entry: an empty key (8) and a type (4) and a one-byte value.
        self.check_count(at + 8, kv_count, 13, "metadata entries")?;
        let mut metadata = BTreeMap::new();
        for i in 0..kv_count {
            let key = self
                .string(&format!("metadata key #{i}"), MAX_NAME, false)?
                .unwrap_or_default();
            let value = self.value(&key, 0)?;
            metadata.insert(key, value);
        }
        let at = self.pos;
        // The smallest tensor entry: name length, dimension count, type and offset.
        self.check_count(at, tensor_count, 8 + 4 + 4 + 8, "tensors")?;
        let mut tensors = Vec::new();
        for i in 0..tensor_count {
            let name = self
                .string(&format!("the name of tensor #{i}"), MAX_NAME, false)?
                .unwrap_or_default();
            let at = self.pos;
            let n_dims = self.u32(&format!("the dimension count of {name}"))?;
            if n_dims > MAX_DIMS {
                return Err(self.corrupt(
                    at,
                    format!("tensor {name}: {n_dims} dimensions (at most {MAX_DIMS} expected)"),
                ));
            }
            let dims = (0..n_dims)
                .map(|_| self.u64(&format!("a dimension of {name}")))
                .collect::<Result<Vec<_>, _>>()?;
            let ggml_type = self.u32(&format!("the type of {name}"))?;
            let offset = self.u64(&format!("the data offset of {name}"))?;
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
            });
        }
        Ok(GgufHeader {
            path: self.path.to_path_buf(),
            version,
            file_bytes: self.len,
            metadata,
            tensors,
            table_end: self.pos,
        })
    }

    fn value(&mut self, key: &str, depth: u32) -> Result<MetaValue, GgufError> {
        let at = self.pos;
        let ty = self.u32(&format!("the type of {key}"))?;
        self.typed_value(key, ty, at, depth)
    }

    fn typed_value(
        &mut self,
        key: &str,
        ty: u32,
        at: u64,
        depth: u32,
    ) -> Result<MetaValue, GgufError> {
        let what = format!("the value of {key}");
        Ok(match ty {
            0 => MetaValue::Uint(u64::from(self.bytes::<1>(&what)?[0])),
            1 => MetaValue::Int(i64::from(i8::from_le_bytes(self.bytes::<1>(&what)?))),
            2 => MetaValue::Uint(u64::from(u16::from_le_bytes(self.bytes::<2>(&what)?))),
            3 => MetaValue::Int(i64::from(i16::from_le_bytes(self.bytes::<2>(&what)?))),
            4 => MetaValue::Uint(u64::from(self.u32(&what)?)),
            5 => MetaValue::Int(i64::from(i32::from_le_bytes(self.bytes::<4>(&what)?))),
            6 => MetaValue::Float(f64::from(f32::from_le_bytes(self.bytes::<4>(&what)?))),
            7 => MetaValue::Bool(self.bytes::<1>(&what)?[0] != 0),
            8 => {
                let start = self.pos;
                match self.string(&what, MAX_KEPT_STRING, true)? {
                    Some(s) => MetaValue::Str(s),
                    None => MetaValue::LongStr(self.pos - start - 8),
                }
            }
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.corrupt(
                        at,
                        format!("{key}: arrays nested deeper than {MAX_ARRAY_DEPTH}"),
                    ));
                }
                let elem_at = self.pos;
                let elem_type = self.u32(&format!("the element type of {key}"))?;
                let each = min_value_bytes(elem_type).ok_or_else(|| {
                    self.corrupt(
                        elem_at,
                        format!("{key}: unknown array element type {elem_type} (0..=12 expected)"),
                    )
                })?;
                let count_at = self.pos;
                let len = self.u64(&format!("the length of {key}"))?;
                self.check_count(count_at, len, each, key)?;
                match elem_type {
                    // Fixed-size elements: skip them in one step.
                    0..=7 | 10..=12 => self.skip(len * each, &what)?,
                    // Strings (a vocabulary): skipped by their lengths, not kept.
                    8 => {
                        for _ in 0..len {
                            let n = self.u64(&format!("the length of a string in {key}"))?;
                            self.skip(n, &format!("a string in {key}"))?;
                        }
                    }
                    _ => {
                        for _ in 0..len {
                            let at = self.pos;
                            self.typed_value(key, elem_type, at, depth + 1)?;
                        }
                    }
                }
                MetaValue::Array { elem_type, len }
            }
            10 => MetaValue::Uint(self.u64(&what)?),
            11 => MetaValue::Int(i64::from_le_bytes(self.bytes::<8>(&what)?)),
            12 => MetaValue::Float(f64::from_le_bytes(self.bytes::<8>(&what)?)),
            other => {
                return Err(self.corrupt(
                    at,
                    format!("{key}: unknown value type {other} (0..=12 expected)"),
                ));
            }
        })
    }
}

#[cfg(test)]
mod tests;
