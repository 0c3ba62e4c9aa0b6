//! What one rank of a built-in LoRA fine-tune needs in memory. Data parallel: every rank holds
//! the whole model, dequantised to f32 (the trainer differentiates through it), plus the
//! adapters, their gradients and AdamW's two moments, plus the activations one micro-batch keeps
//! for the backward pass. A prediction from the Model's shape; the trainer reports the real
//! figure in its log.

use tb_api::specs::{FineTuneSpec, LoraTarget, ModelSpec};

/// The runtime beside the tensors (allocator slack, tokenizer, buffers).
const RUNTIME_BYTES: u64 = 256 << 20;
const F32: u64 = 4;

/// One rank's memory, by part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FineTuneMemory {
    /// The base weights in f32.
    pub base_bytes: u64,
    /// Adapters + their gradients + AdamW's moments.
    pub adapter_bytes: u64,
    /// Activations kept for the backward pass of one micro-batch, and the logits.
    pub activation_bytes: u64,
    /// All of it plus the runtime.
    pub total_bytes: u64,
}

/// The prediction for one rank of `ranks`, or why the Model's shape cannot give one.
pub fn finetune_memory(
    model_name: &str,
    model: &ModelSpec,
    f: &FineTuneSpec,
    ranks: u32,
) -> Result<FineTuneMemory, String> {
    let layers =
        u64::from(model.layers.ok_or_else(|| {
            format!("Model {model_name}: spec.layers is needed to size a fine-tune")
        })?);
    let hidden = u64::from(model.hidden_size.ok_or_else(|| {
        format!("Model {model_name}: spec.hiddenSize is needed to size a fine-tune")
    })?);
    let heads = u64::from(model.heads.unwrap_or(1).max(1));
    let kv_heads = u64::from(model.kv_heads.unwrap_or(model.heads.unwrap_or(1)).max(1));
    let head_dim = model.head_dim.map_or(hidden / heads, u64::from).max(1);
    let vocab = u64::from(model.vocab_size.unwrap_or(32_000));
    // A llama-style MLP is about 8/3 of the hidden size wide: 3 matrices of hidden × 8/3 hidden.
    let mlp = hidden * 8 / 3;
    // From the shape, not the file's size: quantised files hold 4 to 8 bits per weight and
    // some tensors at full width, so bytes say little about the count.
    let params =
        layers * (hidden * head_dim * 2 * (heads + kv_heads) + 3 * hidden * mlp) + vocab * hidden;
    let base_bytes = params.saturating_mul(F32);

    let rank = u64::from(f.lora.rank);
    let q_out = heads * head_dim;
    let kv_out = kv_heads * head_dim;
    let per_layer: u64 = f
        .lora
        .targets
        .iter()
        .map(|t| {
            let (inp, out) = match t {
                LoraTarget::Q => (hidden, q_out),
                LoraTarget::K | LoraTarget::V => (hidden, kv_out),
                LoraTarget::O => (q_out, hidden),
                LoraTarget::Gate | LoraTarget::Up => (hidden, mlp),
                LoraTarget::Down => (mlp, hidden),
            };
            rank * (inp + out)
        })
        .sum();
    // Weights, gradients, two moments.
    let adapter_bytes = (layers * per_layer).saturating_mul(4 * F32);

    let examples = u64::from(
        f.batch_size
            .div_ceil(ranks.max(1))
            .div_ceil(f.accumulation.max(1)),
    );
    let tokens = examples * u64::from(f.sequence_length);
    // Per layer and token about 16 hidden-wide values and the MLP's 3 are kept; attention keeps
    // heads × sequence scores per token; the logits and their gradient are vocab-wide.
    let per_token_layer = (16 * hidden + 3 * mlp + heads * u64::from(f.sequence_length)) * F32;
    let activation_bytes =
        tokens.saturating_mul(layers.saturating_mul(per_token_layer) + 2 * vocab * F32);
    let total_bytes = base_bytes
        .saturating_add(adapter_bytes)
        .saturating_add(activation_bytes)
        .saturating_add(RUNTIME_BYTES);
    Ok(FineTuneMemory {
        base_bytes,
        adapter_bytes,
        activation_bytes,
        total_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tb_api::quantity::Quantity;

    #[test]
    fn smollm2_fits_a_small_mac_and_grows_with_the_batch() {
        let model = ModelSpec {
            layers: Some(30),
            hidden_size: Some(576),
            heads: Some(9),
            kv_heads: Some(3),
            vocab_size: Some(49152),
            total_bytes: Some(Quantity::parse("98Mi").expect("quantity")),
            ..Default::default()
        };
        let mut f = FineTuneSpec {
            sequence_length: 64,
            batch_size: 2,
            ..Default::default()
        };
        let m = finetune_memory("smollm2", &model, &f, 1).expect("sized");
        // ~135M parameters in f32.
        assert!((500 << 20..700 << 20).contains(&m.base_bytes), "{m:?}");
        assert!(m.total_bytes < 2 << 30, "{m:?}");
        f.batch_size = 64;
        f.sequence_length = 2048;
        let big = finetune_memory("smollm2", &model, &f, 1).expect("sized");
        assert!(big.activation_bytes > 100 * m.activation_bytes, "{big:?}");
        let split = finetune_memory("smollm2", &model, &f, 4).expect("sized");
        assert!(split.activation_bytes < big.activation_bytes, "{split:?}");
        assert!(finetune_memory("m", &ModelSpec::default(), &f, 1).is_err());
    }
}
