//! `EngineError`: every way loading or running a model shard can fail. Each message names the
//! file, tensor or value involved and what was expected, so an operator can act on it.

use std::path::PathBuf;

/// Errors of the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot read model file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a usable GGUF file: {detail}")]
    NotGguf { path: PathBuf, detail: String },
    #[error(
        "unsupported model architecture {arch:?} (tb-engine runs \"llama\", \"mistral\" and \"qwen2\")"
    )]
    UnsupportedArchitecture { arch: String },
    #[error("tensor {tensor} has quantization {dtype}, which tb-engine cannot run")]
    UnsupportedQuantization { tensor: String, dtype: String },
    #[error("tensor {name} is missing from the GGUF file")]
    MissingTensor { name: String },
    #[error("GGUF metadata key {key} is missing or invalid: {detail}")]
    BadMetadata { key: String, detail: String },
    #[error(
        "bad block range: first {first}, count {count}, but the model has {layers} blocks (need count >= 1 and first + count <= {layers})"
    )]
    BadRange {
        first: usize,
        count: usize,
        layers: usize,
    },
    #[error("{tokens} tokens exceed the context length of {context}")]
    ContextExceeded { tokens: usize, context: usize },
    #[error(
        "sequence {seq}: the KV cache holds {expected} positions but the input starts at {got}"
    )]
    Position {
        seq: u64,
        expected: usize,
        got: usize,
    },
    #[error(
        "bad activation: expected hidden size {expected_hidden} (and data = tokens x hidden, tokens >= 1), got {got}"
    )]
    BadActivation { expected_hidden: usize, got: String },
    #[error("bad stage input: {detail}")]
    BadInput { detail: String },
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken { id: u32, vocab: usize },
    #[error("tokenizer: {detail}")]
    Tokenizer { detail: String },
    #[error("chat template: {detail}")]
    ChatTemplate { detail: String },
    #[error("sequence {seq} appears twice in one batched step")]
    DuplicateSequence { seq: u64 },
    #[error("the batched step failed: {detail}")]
    BatchFailed { detail: String },
    #[error("LoRA adapter {path}: {detail}")]
    BadAdapter { path: PathBuf, detail: String },
    #[error("tensor parallelism: {detail}")]
    TensorParallel { detail: String },
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Result with [`EngineError`].
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
