//! tb-engine: tb's built-in model engine on candle. It runs a *shard* of a llama-family GGUF
//! model (a contiguous range of transformer blocks) so a model can be split across Macs as a
//! pipeline, and, as a reference, the whole model in one process ([`generate::Engine`]), with the
//! tokenizer and chat template read from the GGUF and token sampling. A shard's blocks can also be
//! split across ranks by tensor parallelism ([`tp`]).
//!
//! Features `metal` and `accelerate` forward to candle's.

pub mod adapter;
mod attention;
pub mod calibrate;
pub mod chat;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod sample;
pub mod shard;
pub mod tokenizer;
pub mod tp;
pub mod train;
pub mod weights;

mod block;
mod host;
mod qgemm;
mod swiglu;

pub use chat::{ChatMessage, ChatTemplate};
pub use error::EngineError;
pub use generate::{Engine, FinishReason, Generation};
pub use gguf::{GgufIndex, ModelConfig, TensorEntry};
pub use qgemm::use_candle_kernels;
pub use sample::{Sampler, SamplingParams, StopMatcher};
pub use shard::{Activation, BatchItem, LoadOptions, Shard, StageInput, StageOutput};
pub use tokenizer::{Decoder, Tokenizer};
pub use tp::{AllReduce, InProcessAllReduce, TensorParallel, TpSlice};
pub use weights::Requantize;

/// The variable that sets how many CPU threads the engine computes with (candle's and rayon's
/// pools).
pub const THREADS_ENV: &str = "RAYON_NUM_THREADS";

/// How many threads the engine's CPU kernels compute with ([`THREADS_ENV`], else every core).
pub fn cpu_threads() -> usize {
    candle_core::utils::get_num_threads()
}

/// Where the tests and the bench find the model: `$TB_TEST_MODEL`, else
/// `<workspace>/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf` (fetched by
/// `scripts/fetch-model.sh`).
pub fn test_model_path() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("TB_TEST_MODEL") {
        return p.into();
    }
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf")
}
