//! Model: where a model's weights are and the shape facts placement needs to split it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{self, CheckResult};
use crate::quantity::Quantity;
use crate::validate::ValidationError;

/// The file format of the weights.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ModelFormat {
    #[default]
    Gguf,
    Mlx,
    Safetensors,
}

/// Where the weights are: a path every node can read, and/or the nodes that hold a copy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct ModelSource {
    /// A file or directory every listed node can read; ~ is the nodelet's home.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Names of the Nodes that hold the weights (all nodes, when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
}

/// Where a model's weights are and its shape, which placement uses to split it across Macs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct ModelSpec {
    /// gguf, mlx or safetensors.
    pub format: ModelFormat,
    /// Where the weights are: source.path and/or source.nodes.
    #[serde(default)]
    #[schemars(extend("x-explain-note" = "required"))]
    pub source: ModelSource,
    /// Model family, e.g. llama, qwen3, deepseek2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// Transformer blocks; placement splits these across Macs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<u32>,
    /// Weight bytes of one block, e.g. 3Gi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_layer: Option<Quantity>,
    /// Weight bytes in all, e.g. 98Mi or 1.2Ti.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_bytes: Option<Quantity>,
    /// Width of the hidden state; sizes the activations passed between Macs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_size: Option<u32>,
    /// Attention heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<u32>,
    /// Key/value heads (fewer than heads with grouped-query attention); sizes the KV cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_heads: Option<u32>,
    /// Longest context the model supports, in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_length: Option<u32>,
    /// Tokens in the vocabulary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<u32>,
    /// Values in one attention head's key (default hiddenSize / heads; Qwen3 and gpt-oss use
    /// another size); sizes the KV cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<u32>,
    /// Multi-head latent attention (DeepSeek-V3, Kimi-K2: 512): the width of the compressed
    /// key/value latent each layer caches per token, in place of kvHeads × headDim keys and values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_lora_rank: Option<u32>,
    /// With kvLoraRank: the rotary part of the key cached beside the latent (DeepSeek-V3: 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qk_rope_head_dim: Option<u32>,
    /// Tokens a sliding-window layer attends over (and caches), e.g. 128 for gpt-oss.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<u32>,
    /// How many layers use slidingWindow (default: all; gpt-oss: every other one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window_layers: Option<u32>,
    /// Mixture of experts: routed experts in each MoE layer (all of them are held in memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts: Option<u32>,
    /// Mixture of experts: routed experts each token goes through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts_per_token: Option<u32>,
    /// Weight bytes one decoded token reads (a MoE model's unused experts are not read), e.g.
    /// 20Gi; default all of totalBytes. Sets the predicted tokens/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_bytes: Option<Quantity>,
    /// The output head is the embedding table (SmolLM2, Gemma, Qwen3's small models): no
    /// separate head in the file, and every token reads the whole table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tied_embeddings: Option<bool>,
}

impl ModelSpec {
    pub(crate) fn check(&self) -> CheckResult {
        let source = &self.source;
        if source.path.is_none() && source.nodes.is_empty() {
            return Err(ValidationError::new(
                "source",
                "say where the weights are: source.path (a path the nodes can read) and/or \
                 source.nodes (the nodes that hold them)",
            ));
        }
        common::not_blank("source.path", source.path.as_deref())?;
        for (i, node) in source.nodes.iter().enumerate() {
            common::object_name(&format!("source.nodes[{i}]"), node)?;
        }
        common::not_blank("architecture", self.architecture.as_deref())?;
        common::at_least_one("layers", self.layers)?;
        common::at_least_one("hiddenSize", self.hidden_size)?;
        common::at_least_one("heads", self.heads)?;
        common::at_least_one("kvHeads", self.kv_heads)?;
        common::at_least_one("contextLength", self.context_length)?;
        common::at_least_one("vocabSize", self.vocab_size)?;
        common::non_zero_quantity("bytesPerLayer", self.bytes_per_layer.as_ref())?;
        common::non_zero_quantity("totalBytes", self.total_bytes.as_ref())?;
        common::at_least_one("headDim", self.head_dim)?;
        common::at_least_one("kvLoraRank", self.kv_lora_rank)?;
        common::at_least_one("qkRopeHeadDim", self.qk_rope_head_dim)?;
        common::at_least_one("slidingWindow", self.sliding_window)?;
        common::at_least_one("experts", self.experts)?;
        common::at_least_one("expertsPerToken", self.experts_per_token)?;
        common::non_zero_quantity("activeBytes", self.active_bytes.as_ref())?;
        if self.qk_rope_head_dim.is_some() && self.kv_lora_rank.is_none() {
            return Err(ValidationError::new(
                "qkRopeHeadDim",
                "is part of multi-head latent attention: give kvLoraRank too",
            ));
        }
        if let Some(n) = self.sliding_window_layers {
            if self.sliding_window.is_none() {
                return Err(ValidationError::new(
                    "slidingWindowLayers",
                    "counts the layers that use slidingWindow: give slidingWindow too",
                ));
            }
            if let Some(layers) = self.layers
                && n > layers
            {
                return Err(ValidationError::new(
                    "slidingWindowLayers",
                    format!("must be at most layers ({layers}), got {n}"),
                ));
            }
        }
        match (self.experts, self.experts_per_token) {
            (None, Some(_)) => {
                return Err(ValidationError::new(
                    "expertsPerToken",
                    "needs experts (the routed experts of each MoE layer)",
                ));
            }
            (Some(e), Some(k)) if k > e => {
                return Err(ValidationError::new(
                    "expertsPerToken",
                    format!("must be at most experts ({e}), got {k}"),
                ));
            }
            _ => {}
        }
        if let (Some(active), Some(total)) = (&self.active_bytes, &self.total_bytes)
            && active.bytes() > total.bytes()
        {
            return Err(ValidationError::new(
                "activeBytes",
                format!("must be at most totalBytes ({total}), got {active}"),
            ));
        }
        if let (Some(heads), Some(kv)) = (self.heads, self.kv_heads)
            && !heads.is_multiple_of(kv)
        {
            return Err(ValidationError::new(
                "kvHeads",
                format!("must divide heads ({heads}) evenly, got {kv}"),
            ));
        }
        Ok(())
    }
}
