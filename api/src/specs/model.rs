//! Model: where a model's weights are and the shape facts placement needs to split it.

use serde::{Deserialize, Serialize};

use super::common::{self, CheckResult};
use crate::quantity::Quantity;
use crate::validate::ValidationError;

/// The file format of the weights.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelFormat {
    #[default]
    Gguf,
    Mlx,
    Safetensors,
}

/// Where the weights are: a path every node can read, and/or the nodes that hold a copy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelSource {
    /// A file or directory; `~` is the home directory of the user the nodelet runs as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Names of the Nodes that hold the weights at `path` (all of them, when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelSpec {
    pub format: ModelFormat,
    #[serde(default)]
    pub source: ModelSource,
    /// e.g. `llama`, `qwen3`, `deepseek2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// Transformer blocks; the unit placement splits across Macs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_layer: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_bytes: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_size: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<u32>,
    /// Key/value heads (fewer than `heads` with grouped-query attention); sizes the KV cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_heads: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_length: Option<u32>,
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
