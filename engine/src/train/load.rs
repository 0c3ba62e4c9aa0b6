//! Reads a GGUF's weights for training: every tensor dequantised to f32 ([`base_weights`]), and
//! an identity of the file's tensors ([`model_identity`]) for checkpoint fingerprints.

use candle_core::Device;
use sha2::{Digest, Sha256};

use crate::gguf::GgufIndex;
use crate::weights::TensorReader;

use super::Result;
use super::model::{BaseWeights, BlockWeights};

/// Every weight of the model at `index`, dequantised on the CPU, placed on `device` in f32.
pub fn base_weights(index: &GgufIndex, device: &Device) -> Result<BaseWeights> {
    let config = index.config();
    for entry in index.tensors() {
        index.check_in_file(entry)?;
    }
    let mut r = TensorReader::new(
        index,
        index.path(),
        &Device::Cpu,
        crate::weights::Requantize::Never,
    )?;
    let mut get = |name: &str| -> Result<candle_core::Tensor> {
        Ok(r.qtensor(name)?
            .dequantize(&Device::Cpu)?
            .to_device(device)?)
    };
    let embed = get("token_embd.weight")?;
    let mut blocks = Vec::with_capacity(config.n_layers);
    for i in 0..config.n_layers {
        let p = format!("blk.{i}");
        let has = |n: &str| index.tensor(&format!("{p}.{n}")).is_some();
        let (hq, hk, hv) = (has("attn_q.bias"), has("attn_k.bias"), has("attn_v.bias"));
        blocks.push(BlockWeights {
            attn_norm: get(&format!("{p}.attn_norm.weight"))?,
            wq: get(&format!("{p}.attn_q.weight"))?,
            wk: get(&format!("{p}.attn_k.weight"))?,
            wv: get(&format!("{p}.attn_v.weight"))?,
            wo: get(&format!("{p}.attn_output.weight"))?,
            bq: if hq {
                Some(get(&format!("{p}.attn_q.bias"))?)
            } else {
                None
            },
            bk: if hk {
                Some(get(&format!("{p}.attn_k.bias"))?)
            } else {
                None
            },
            bv: if hv {
                Some(get(&format!("{p}.attn_v.bias"))?)
            } else {
                None
            },
            ffn_norm: get(&format!("{p}.ffn_norm.weight"))?,
            gate: get(&format!("{p}.ffn_gate.weight"))?,
            up: get(&format!("{p}.ffn_up.weight"))?,
            down: get(&format!("{p}.ffn_down.weight"))?,
        });
    }
    let output_norm = get("output_norm.weight")?;
    let output = if index.tensor("output.weight").is_some() {
        Some(get("output.weight")?)
    } else {
        None
    };
    Ok(BaseWeights {
        embed,
        blocks,
        output_norm,
        output,
    })
}

/// A digest of the GGUF's tensor table (name, type, shape, size, offset) and model config: two
/// files with different weights layouts or quantizations differ; a copy of the same file does
/// not.
pub fn model_identity(index: &GgufIndex) -> String {
    let mut h = Sha256::new();
    h.update(format!("{:?}", index.config()));
    for t in index.tensors() {
        h.update(format!(
            "{}|{}|{:?}|{}|{};",
            t.name, t.dtype, t.shape, t.len, t.offset
        ));
    }
    hex(&h.finalize())
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
