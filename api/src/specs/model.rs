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
