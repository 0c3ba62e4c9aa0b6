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

/// One tensor-parallel rank's bytes ([`ModelShape::tensor_rank`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorRank {
    /// Weights held (its slice of every block, the embedding table and the head).
    pub weight: u64,
    /// KV cache held.
    pub kv: u64,
    /// Weight bytes read per decoded token (without the KV cache).
    pub read: u64,
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

    /// Whether tb's engine splits this model over `n` tensor-parallel ranks: whole groups of
    /// query heads sharing a KV head per rank, so at most one rank per KV head — the first
    /// ranks take one more when `n` does not divide the KV heads (`tb_engine::tp`). With latent
    /// attention (one latent per token, no KV heads to give out) or heads that are not whole
    /// groups, `n` must divide the heads and the KV heads.
    pub fn tensor_ranks_ok(&self, n: u32) -> bool {
        if n < 2 {
            return false;
        }
        if self.heads_in_kv_groups() {
            n <= self.kv_heads
        } else {
            self.heads.is_multiple_of(n) && self.kv_heads.is_multiple_of(n)
        }
    }

    /// Whether the query heads come in whole groups per KV head, which tensor parallelism
    /// gives out to its ranks (not so with latent attention).
    pub fn heads_in_kv_groups(&self) -> bool {
        self.latent_kv == 0 && self.kv_heads > 0 && self.heads.is_multiple_of(self.kv_heads)
    }

    /// What the busiest of `n` tensor-parallel ranks holds and reads per token, as tb's engine
    /// splits a model (`tb_engine::tp`): the first rank, which has the most KV heads, and
    /// which alone applies the output head. Every rank keeps the embedding table (each looks
    /// its rows up itself: no broadcast per step).
    pub fn tensor_rank(&self, n: u32) -> TensorRank {
        let n = n.max(1);
        let layers = |per: u64| u64::from(self.layers).saturating_mul(per);
        let (weight, kv, read) = if self.kv_heads == 0 || self.kv_heads.is_multiple_of(n) {
            let n64 = u64::from(n);
            (
                layers(self.bytes_per_layer).div_ceil(n64),
                self.kv_bytes().div_ceil(n64),
                layers(self.read_bytes_per_layer()).div_ceil(n64),
            )
        } else {
            // ⌈kv_heads / n⌉ KV heads, their query heads and their share of the cache; the
            // MLP's columns split evenly. The spec does not give the MLP's size, so attention's
            // part of a block is taken with the usual intermediate size of 8/3 × hidden
            // (SmolLM2's exactly; the busiest rank's share moves little with it: Llama 3 8B's
            // 3.5 × hidden over 3 ranks gives 34.1 % of a block against 34.3 %).
            let kv_share = f64::from(self.kv_heads.div_ceil(n)) / f64::from(self.kv_heads);
            let (h, d) = (f64::from(self.hidden_size), f64::from(self.head_dim));
            let attention = 2.0 * h * d * f64::from(self.heads + self.kv_heads);
            let mlp = 8.0 * h * h;
            let f = if attention + mlp > 0.0 {
                attention / (attention + mlp)
            } else {
                0.0
            };
            let block_share = f * kv_share + (1.0 - f) / f64::from(n);
            let part = |bytes: u64, share: f64| (bytes as f64 * share).ceil() as u64;
            (
                part(layers(self.bytes_per_layer), block_share),
                part(self.kv_bytes(), kv_share),
                part(layers(self.read_bytes_per_layer()), block_share),
            )
        };
        TensorRank {
            weight: weight.saturating_add(self.embed_and_head_bytes()),
            kv,
            read: read.saturating_add(self.head_bytes()),
        }
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// SmolLM2-135M's shape: 30 blocks of 9 heads over 3 KV heads, 64 wide.
    pub(crate) fn smollm2() -> ModelShape {
        ModelShape {
            name: "smollm2".into(),
            layers: 30,
            bytes_per_layer: 2_211_840,
            other_bytes: 30_081_024,
            tied_embeddings: true,
            hidden_size: 576,
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            context: 512,
            batch: 1,
            ..ModelShape::default()
        }
    }

    #[test]
    fn two_ranks_split_three_kv_heads_two_and_one() {
        let m = smollm2();
        assert!(m.tensor_ranks_ok(2) && m.tensor_ranks_ok(3));
        assert!(!m.tensor_ranks_ok(4), "more ranks than KV heads");
        assert!(!m.tensor_ranks_ok(1));
        // The first rank: 2 of 3 KV heads (their 6 query heads) and half the MLP's columns,
        // 54.2 % of a block (tb_engine::tp: 54 % / 46 %), by hand:
        // attention 2·576·64·(9+3) = 884,736 weights, MLP 3·576·1536 = 2,654,208;
        // (884,736 · 2/3 + 2,654,208 / 2) / 3,538,944 = 0.5417.
        // It also holds the (tied) embedding table, which is the head it alone applies.
        let rank = m.tensor_rank(2);
        let blocks = 30 * 2_211_840u64;
        let share = (rank.weight - 30_081_024) as f64 / blocks as f64;
        assert!((share - 0.5417).abs() < 1e-3, "{share}");
        assert_eq!(
            rank.read, rank.weight,
            "reads all it holds: the table is the head"
        );
        assert_eq!(rank.kv, (m.kv_bytes() as f64 * 2.0 / 3.0).ceil() as u64);
        // Three ranks divide the KV heads: a third of the blocks each.
        let even = m.tensor_rank(3);
        assert_eq!(even.weight, blocks.div_ceil(3) + 30_081_024);
        assert_eq!(even.kv, m.kv_bytes().div_ceil(3));
        // Untied: every rank holds the embedding table, the first also the head, which it
        // reads; the table only for a row per token.
        let untied = ModelShape {
            tied_embeddings: false,
            ..smollm2()
        };
        let first = untied.tensor_rank(3);
        assert_eq!(first.weight, blocks.div_ceil(3) + 30_081_024);
        assert_eq!(first.read, blocks.div_ceil(3) + 30_081_024 / 2);
    }

    #[test]
    fn latent_attention_needs_ranks_that_divide_the_heads() {
        let m = ModelShape {
            heads: 128,
            kv_heads: 128,
            latent_kv: 576,
            ..smollm2()
        };
        assert!(m.tensor_ranks_ok(2) && m.tensor_ranks_ok(8));
        assert!(!m.tensor_ranks_ok(3));
    }
}
