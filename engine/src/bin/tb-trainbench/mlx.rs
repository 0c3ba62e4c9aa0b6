//! The mlx_lm.lora column of tb-trainbench: runs `python -m mlx_lm lora` with tb's LoRA
//! settings on the Hugging Face copy of the model ([`export_hf`], shared with the PyTorch + PEFT
//! row), reading tokens/s from its report lines.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::{Device, Tensor};
use tb_engine::train::{Example, Trainer};
use tb_engine::{GgufIndex, ModelConfig};

use crate::Options;

type Error = Box<dyn std::error::Error>;

/// A directory under the system temp dir, removed on drop.
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    pub fn new() -> std::io::Result<Self> {
        let p = std::env::temp_dir().join(format!("tb-trainbench-{}", std::process::id()));
        std::fs::create_dir_all(&p)?;
        Ok(Self(p))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs mlx_lm.lora on `model` (the directory [`export_hf`] wrote), its data and adapter in
/// `scratch`, and returns its table row and tokens/s.
pub fn run(
    python: &Path,
    model: &Path,
    scratch: &Path,
    trainer: &Trainer,
    batch: &[Example],
    o: &Options,
) -> Result<(String, f64), Error> {
    let data = scratch.join("data");
    std::fs::create_dir_all(&data)?;
    let mut lines = String::new();
    for ex in batch {
        let text = trainer.tokenizer().decode(&ex.tokens)?;
        lines.push_str(&serde_json::json!({ "text": text }).to_string());
        lines.push('\n');
    }
    std::fs::write(data.join("train.jsonl"), &lines)?;
    std::fs::write(data.join("valid.jsonl"), &lines)?;
    let keys: Vec<String> = o
        .targets
        .iter()
        .map(|t| {
            let parent = if matches!(
                t,
                tb_engine::adapter::Target::Gate
                    | tb_engine::adapter::Target::Up
                    | tb_engine::adapter::Target::Down
            ) {
                "mlp"
            } else {
                "self_attn"
            };
            format!("{parent}.{}", t.module())
        })
        .collect();
    let lora = trainer.model().lora();
    // mlx_lm's LoRA scale multiplies B·A directly: PEFT's alpha / rank.
    let config = serde_json::json!({
        "model": model,
        "train": true,
        "data": data,
        "fine_tune_type": "lora",
        "num_layers": -1,
        "batch_size": o.batch,
        "iters": o.steps + 1,
        "max_seq_length": o.seq,
        "learning_rate": 1e-4,
        "steps_per_report": 1,
        "steps_per_eval": 100000,
        "val_batches": 1,
        "save_every": 100000,
        "adapter_path": scratch.join("adapter"),
        "lora_parameters": {"keys": keys, "rank": lora.rank, "scale": lora.scale(), "dropout": 0.0},
        "seed": 0,
    });
    // JSON is YAML.
    let config_path = scratch.join("lora.yaml");
    std::fs::write(&config_path, config.to_string())?;
    let out = Command::new(python)
        .args(["-m", "mlx_lm", "lora", "--config"])
        .env("NO_COLOR", "1")
        .arg(&config_path)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        return Err(format!("exit {}: {}", out.status, tail.join(" / ")).into());
    }
    // The first report includes warm-up; the best of the later ones is comparable to tb's.
    let mut best: Option<(f64, f64, f64)> = None;
    let plain = strip_ansi(&stdout);
    for (s, tps, loss) in plain.lines().filter_map(report_line).skip(1) {
        if best.is_none_or(|b| tps > b.1) {
            best = Some((s, tps, loss));
        }
    }
    let (s, tps, loss) = best.ok_or_else(|| {
        let tail: Vec<&str> = plain.lines().rev().take(5).collect();
        format!(
            "no report lines in mlx_lm's output (last lines: {})",
            tail.join(" / ")
        )
    })?;
    let row = format!(
        "| mlx_lm.lora (mlx cpu, f32 HF copy) | train step, best of {} | {s:.2} | {tps:.1} | {loss:.3} |",
        o.steps
    );
    Ok((row, tps))
}

/// `text` without ANSI escape sequences (mlx_lm's console styles its output even into a pipe).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
            continue;
        }
        // CSI: ESC [ parameters... final byte in '@'..='~'.
        if chars.next() == Some('[') {
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        }
    }
    out
}

/// (seconds per step, tokens/s, loss) of one of mlx_lm.lora's training reports, in either of
/// the formats its versions print: before 0.30,
/// `Iter 2: Train loss 1.234, Learning Rate 1.000e-04, It/sec 0.123, Tokens/sec 63.1, ...`;
/// since, a table row `   2    1.234 ▼       63      0.5k` (iteration, loss, trend, tokens/s
/// rounded, thousands of tokens trained so far), from which seconds per step come as the
/// tokens of one step over tokens/s.
fn report_line(line: &str) -> Option<(f64, f64, f64)> {
    if line.contains("Tokens/sec") {
        let field = |name: &str| -> Option<f64> {
            let rest = line.split(name).nth(1)?;
            rest.trim_start_matches([' ', ':'])
                .split([',', ' '])
                .next()?
                .parse()
                .ok()
        };
        return Some((
            1.0 / field("It/sec")?,
            field("Tokens/sec")?,
            field("Train loss")?,
        ));
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    let [it, loss, arrow, tps, trained] = words[..] else {
        return None;
    };
    let it: f64 = it.parse().ok()?;
    let loss: f64 = loss.parse().ok()?;
    if !matches!(arrow, "▼" | "▲") || it < 1.0 {
        return None;
    }
    let tps: f64 = tps.replace(',', "").parse().ok()?;
    let trained: f64 = trained.strip_suffix('k')?.parse().ok()?;
    Some((trained * 1000.0 / it / tps, tps, loss))
}

/// Writes the GGUF model at `gguf` as a Hugging Face llama directory in `dir`: f32 safetensors
/// dequantised from the GGUF (q/k rows back in HF order), config.json, tokenizer.json and the
/// chat template.
pub fn export_hf(gguf: &Path, trainer: &Trainer, dir: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(dir)?;
    let index = GgufIndex::open(gguf)?;
    let c: &ModelConfig = index.config();
    let weights = tb_engine::train::load::base_weights(&index, &Device::Cpu)?;
    let mut t: HashMap<String, Tensor> = HashMap::new();
    t.insert("model.embed_tokens.weight".into(), weights.embed.clone());
    t.insert("model.norm.weight".into(), weights.output_norm.clone());
    if let Some(o) = &weights.output {
        t.insert("lm_head.weight".into(), o.clone());
    }
    let unpermute = |w: &Tensor, heads: usize| -> Result<Tensor, Error> {
        if c.architecture == "qwen2" {
            return Ok(w.clone());
        }
        let (out, inp) = w.dims2()?;
        let d = out / heads;
        Ok(w.reshape((heads, d / 2, 2, inp))?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((out, inp))?)
    };
    for (i, b) in weights.blocks.iter().enumerate() {
        let p = format!("model.layers.{i}");
        let mut put = |name: &str, v: Tensor| {
            t.insert(format!("{p}.{name}"), v);
        };
        put("input_layernorm.weight", b.attn_norm.clone());
        put("post_attention_layernorm.weight", b.ffn_norm.clone());
        put("self_attn.q_proj.weight", unpermute(&b.wq, c.heads)?);
        put("self_attn.k_proj.weight", unpermute(&b.wk, c.kv_heads)?);
        put("self_attn.v_proj.weight", b.wv.clone());
        put("self_attn.o_proj.weight", b.wo.clone());
        put("mlp.gate_proj.weight", b.gate.clone());
        put("mlp.up_proj.weight", b.up.clone());
        put("mlp.down_proj.weight", b.down.clone());
    }
    candle_core::safetensors::save(&t, dir.join("model.safetensors"))?;
    let tok = trainer.tokenizer();
    let eos = tok
        .eos_ids()
        .first()
        .and_then(|&id| tok.decode(&[id]).ok())
        .unwrap_or_default();
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": c.hidden,
        "intermediate_size": c.ffn,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.heads,
        "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_dim,
        "vocab_size": c.vocab,
        "rms_norm_eps": c.rms_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": c.context,
        "tie_word_embeddings": weights.output.is_none(),
        "hidden_act": "silu",
        "torch_dtype": "float32",
    });
    std::fs::write(dir.join("config.json"), config.to_string())?;
    tok.inner()
        .save(dir.join("tokenizer.json"), false)
        .map_err(|e| format!("tokenizer.json: {e}"))?;
    let tokenizer_config = serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": trainer.template().source(),
        "eos_token": eos,
        "model_max_length": c.context,
    });
    std::fs::write(
        dir.join("tokenizer_config.json"),
        tokenizer_config.to_string(),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn both_report_formats_are_read() {
        let old = "Iter 2: Train loss 1.250, Learning Rate 1.000e-04, It/sec 0.500, Tokens/sec 64.0, Trained Tokens 256";
        assert_eq!(super::report_line(old), Some((2.0, 64.0, 1.25)));
        let (s, tps, loss) =
            super::report_line("     2    3.440 ▼       64      0.5k").expect("row");
        assert_eq!((tps, loss), (64.0, 3.44));
        assert!((s - 500.0 / 2.0 / 64.0).abs() < 1e-9);
        let styled = "\x1b[38;5;244m   4\x1b[0m    \x1b[1;32m3.172 ▼\x1b[0m    \x1b[1m    6\x1b[0m    \x1b[38;5;244m  1.0k\x1b[0m";
        let (_, tps, loss) = super::report_line(&super::strip_ansi(styled)).expect("styled row");
        assert_eq!((tps, loss), (6.0, 3.172));
        assert_eq!(super::report_line("Loading pretrained model"), None);
        assert_eq!(super::report_line("  it   loss   tok/s   trained"), None);
    }
}
