//! The shard's math mirrors candle-transformers' `quantized_llama`: the full-model logits agree
//! with candle's own implementation for the same prompt.
//!
//! With the products routed through candle's kernels the two agree to float noise, so any slip
//! in the rest of the math (RoPE, attention, norms) shows. tb's own kernels sum in another order
//! (Q4_1) or sum like candle's only where k is not a multiple of 256 (Q8_0); each layer's input
//! is requantised to 8 bits, so an ulp that moves a rounding step is amplified through 30
//! layers (as a tensor-parallel split's reordering is): with tb's kernels the logits are held
//! to the same greedy token and a bound a slip in the math would exceed many times over.

mod common;

use std::path::Path;

use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use tb_engine::{LoadOptions, Requantize, Shard, StageInput, StageOutput, Tokenizer};

fn candle_logits(path: &Path, prompt: &[u32]) -> Vec<f32> {
    let mut file = std::fs::File::open(path).expect("open");
    let content = gguf_file::Content::read(&mut file).expect("header");
    let mut reference = candle_transformers::models::quantized_llama::ModelWeights::from_gguf(
        content,
        &mut file,
        &Device::Cpu,
    )
    .expect("candle model");
    let input = Tensor::new(prompt, &Device::Cpu)
        .and_then(|t| t.unsqueeze(0))
        .expect("input");
    reference
        .forward(&input, 0)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1())
        .expect("reference forward")
}

fn tb_logits(path: &Path, prompt: &[u32]) -> Vec<f32> {
    let mut shard = Shard::load(
        path,
        0,
        30,
        &LoadOptions {
            requantize: Requantize::Never, // candle's model runs the weights as stored
            ..Default::default()
        },
    )
    .expect("load");
    match shard
        .forward(0, StageInput::Tokens(prompt.to_vec()), 0)
        .expect("forward")
    {
        StageOutput::Logits(l) => l,
        StageOutput::Hidden(_) => panic!("expected logits"),
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    common::max_abs_diff(a, b)
}

#[test]
fn logits_match_candle_quantized_llama() {
    let path = common::model_path();
    let tok = Tokenizer::from_file(&path).expect("tokenizer");
    let prompt = tok
        .encode(
            "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        )
        .expect("encode");

    let want = candle_logits(&path, &prompt);
    tb_engine::use_candle_kernels(true);
    let got = tb_logits(&path, &prompt);
    tb_engine::use_candle_kernels(false);
    let d = max_diff(&want, &got);
    assert!(
        d < 1e-3,
        "candle's kernels: max abs diff vs candle quantized_llama: {d}"
    );
    assert_eq!(
        tb_engine::sample::argmax(&want),
        tb_engine::sample::argmax(&got)
    );

    let got = tb_logits(&path, &prompt);
    let d = max_diff(&want, &got);
    eprintln!("tb's kernels: max abs diff vs candle quantized_llama {d}");
    assert!(
        d < 2.0,
        "tb's kernels: max abs diff vs candle quantized_llama: {d}"
    );
    assert_eq!(
        tb_engine::sample::argmax(&want),
        tb_engine::sample::argmax(&got)
    );
}
