//! What a model needs in memory, per layer and per Mac: weights, the KV cache reserved for
//! context × batch, the activations a pipeline hop carries, and a fixed runtime overhead.
//! Everything here is bytes; the sizes are the ones the cost model charges for.

use tb_api::specs::ModelSpec;

/// Hidden size and heads assumed when a Model does not give them (a 7-8B-class shape).
const DEFAULT_HIDDEN: u32 = 4096;
const DEFAULT_HEADS: u32 = 32;
const DEFAULT_CONTEXT: u32 = 4096;
/// fp16/bf16: the KV cache and activations are kept in 16 bits whatever the weights' format.
const HALF: u64 = 2;
/// The runtime itself on each Mac (Metal buffers, the process, the kernels).
const RUNTIME_BYTES: u64 = 512 << 20;
/// Prompts are prefilled in chunks of this many tokens (mlx_lm's prefill step), which bounds
/// the activation workspace whatever the context.
const PREFILL_CHUNK: u64 = 2048;

/// The shape of a model, as placement needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelShape {
    pub name: String,
    pub layers: u32,
    pub bytes_per_layer: u64,
    /// Embeddings + output head: in no layer; the first stage holds half, the last the rest
    /// (tied: both are the one table, which each holds whole).
    pub other_bytes: u64,
    /// The output head is the embedding table.
    pub tied_embeddings: bool,
    pub hidden_size: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// Multi-head latent attention: values cached per token and layer (kvLoraRank +
    /// qkRopeHeadDim) in place of K and V per KV head; 0 for plain attention.
    pub latent_kv: u32,
    /// Tokens a sliding-window layer caches (0: no such layers) and how many layers do.
    pub sliding_window: u32,
    pub sliding_layers: u32,
    /// Weight bytes of one block that one decoded token reads, when less than bytes_per_layer
    /// (a MoE model's unused experts); `None`: all of them.
    pub active_bytes_per_layer: Option<u64>,
    /// Tokens of context the KV cache is reserved for.
    pub context: u32,
    /// Sequences decoded together.
    pub batch: u32,
}

impl ModelShape {
    /// From a Model's spec, with the context and batch a service reserves for.
    ///
    /// Needs `layers` and `bytesPerLayer` or `totalBytes`. With both sizes, what is not in the
    /// layers is embeddings and head; with one, embeddings and head are estimated from the
    /// vocabulary (input and output matrices of vocab × hidden in 16 bits) and, when only the
    /// total is known, taken out of it before dividing by the layers.
    pub fn from_spec(
        name: &str,
        spec: &ModelSpec,
        context: Option<u32>,
        batch: Option<u32>,
    ) -> Result<ModelShape, String> {
        let layers = match spec.layers {
            Some(0) => return Err(format!("model {name}: spec.layers must be at least 1")),
            Some(l) => l,
            None => return Err(format!("model {name}: spec.layers is required to place it")),
        };
        let hidden_size = spec.hidden_size.unwrap_or(DEFAULT_HIDDEN).max(1);
        let heads = spec.heads.unwrap_or(DEFAULT_HEADS).max(1);
        let kv_heads = spec.kv_heads.unwrap_or(heads).max(1);
        let head_dim = spec.head_dim.unwrap_or(hidden_size / heads).max(1);
        let vocab_estimate = spec
            .vocab_size
            .map_or(0, |v| 2 * u64::from(v) * u64::from(hidden_size) * HALF);
        let per_layer = spec.bytes_per_layer.as_ref().map(|q| q.bytes());
        let total = spec.total_bytes.as_ref().map(|q| q.bytes());
        let l = u64::from(layers);
        let (bytes_per_layer, other_bytes) = match (per_layer, total) {
            (Some(p), Some(t)) => (p, t.saturating_sub(p.saturating_mul(l))),
            (Some(p), None) => (p, vocab_estimate),
            (None, Some(t)) => {
                let other = vocab_estimate.min(t);
                ((t - other) / l, other)
            }
            (None, None) => {
                return Err(format!(
                    "model {name}: spec.bytesPerLayer or spec.totalBytes is required to place it"
                ));
            }
        };
        // A MoE model reads only the experts a token uses: the active share of the weights.
        let active_bytes_per_layer = spec.active_bytes.as_ref().map(|q| {
            let all = l
                .saturating_mul(bytes_per_layer)
                .saturating_add(other_bytes);
            let fraction = (q.bytes() as f64 / all.max(1) as f64).min(1.0);
            (bytes_per_layer as f64 * fraction).ceil() as u64
        });
        let latent_kv = spec
            .kv_lora_rank
            .map_or(0, |r| r.saturating_add(spec.qk_rope_head_dim.unwrap_or(0)));
        let sliding_window = spec.sliding_window.unwrap_or(0);
        let sliding_layers = match sliding_window {
            0 => 0,
            _ => spec.sliding_window_layers.unwrap_or(layers).min(layers),
        };
        Ok(ModelShape {
            name: name.to_string(),
            layers,
            bytes_per_layer,
            other_bytes,
            tied_embeddings: spec.tied_embeddings.unwrap_or(false),
            hidden_size,
            heads,
            kv_heads,
            head_dim,
            latent_kv,
            sliding_window,
            sliding_layers,
            active_bytes_per_layer,
            context: context
                .or(spec.context_length)
                .unwrap_or(DEFAULT_CONTEXT)
                .max(1),
            batch: batch.unwrap_or(1).max(1),
        })
    }

    /// Weight bytes of one block that one decoded token reads.
    pub fn read_bytes_per_layer(&self) -> u64 {
        self.active_bytes_per_layer
            .map_or(self.bytes_per_layer, |b| b.min(self.bytes_per_layer))
    }

    /// What a first stage holds besides its layers: the embedding table.
    pub fn embed_bytes(&self) -> u64 {
        match self.tied_embeddings {
            true => self.other_bytes,
            false => self.other_bytes / 2,
        }
    }

    /// What a last stage holds besides its layers, and reads for every token: the output head.
    pub fn head_bytes(&self) -> u64 {
        match self.tied_embeddings {
            true => self.other_bytes,
            false => self.other_bytes - self.other_bytes / 2,
        }
    }

    /// What a stage that is both first and last holds besides its layers.
    pub fn embed_and_head_bytes(&self) -> u64 {
        self.other_bytes
    }

    /// All the weights: every layer plus embeddings and head.
    pub fn weight_bytes(&self) -> u64 {
        u64::from(self.layers)
            .saturating_mul(self.bytes_per_layer)
            .saturating_add(self.other_bytes)
    }

    /// The KV cache of one layer, in 16 bits, for every sequence of the batch: per token K and V
    /// of every KV head (or, with latent attention, the one latent), for the whole context (or
    /// the window, in sliding-window layers; averaged over the layers, as the two kinds
    /// alternate).
    pub fn kv_bytes_per_layer(&self) -> u64 {
        let per_token = match self.latent_kv {
            0 => 2 * u64::from(self.kv_heads) * u64::from(self.head_dim),
            latent => u64::from(latent),
        };
        let context = u64::from(self.context);
        let tokens = match self.sliding_window {
            0 => context,
            window => {
                let sliding = u64::from(self.sliding_layers.min(self.layers));
                let full = u64::from(self.layers) - sliding;
                let windowed = u64::from(window).min(context);
                (full * context + sliding * windowed).div_ceil(u64::from(self.layers.max(1)))
            }
        };
        per_token * tokens * u64::from(self.batch) * HALF
    }

    /// The KV cache of every layer.
    pub fn kv_bytes(&self) -> u64 {
        u64::from(self.layers).saturating_mul(self.kv_bytes_per_layer())
    }

    /// What one pipeline hop carries per decode step: the hidden state of each sequence.
    pub fn activation_bytes(&self, batch: u32) -> u64 {
        u64::from(self.hidden_size) * u64::from(batch) * HALF
    }

    /// Per Mac, beyond weights and KV cache: 512 MiB for the runtime, plus the activation
    /// workspace of a prefill chunk (4 hidden-sized buffers — residual, attention output, MLP
    /// input and output — for min(context, 2048) tokens × batch, in 16 bits). For a 8192-wide
    /// model at batch 1 that is 128 MiB more.
    pub fn overhead_bytes(&self) -> u64 {
        let tokens = u64::from(self.context).min(PREFILL_CHUNK) * u64::from(self.batch);
        RUNTIME_BYTES + 4 * u64::from(self.hidden_size) * tokens * HALF
    }
}
