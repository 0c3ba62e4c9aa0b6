//! The shard's math mirrors candle-transformers' `quantized_llama`: the full-model logits agree
//! with candle's own implementation for the same prompt.

mod common;

use candle_core::{Device, Tensor};
use tb_engine::{LoadOptions, Shard, StageInput, StageOutput, Tokenizer};

#[test]
fn logits_match_candle_quantized_llama() {
    let path = common::model_path();
    let tok = Tokenizer::from_file(&path).expect("tokenizer");
    let prompt = tok
        .encode(
            "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        )
        .expect("encode");
    let mut file = std::fs::File::open(&path).expect("open");
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).expect("header");
    let mut reference = candle_transformers::models::quantized_llama::ModelWeights::from_gguf(
        content,
        &mut file,
        &Device::Cpu,
    )
    .expect("candle model");
    let input = Tensor::new(prompt.as_slice(), &Device::Cpu)
        .and_then(|t| t.unsqueeze(0))
        .expect("input");
    let want: Vec<f32> = reference
        .forward(&input, 0)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1())
        .expect("reference forward");
    let mut shard = Shard::load(
        &path,
        0,
        30,
        &LoadOptions {
            requantize_to_q8_0: false, // candle's model runs the weights as stored
            ..Default::default()
        },
    )
    .expect("load");
    let got = match shard
        .forward(0, StageInput::Tokens(prompt.clone()), 0)
        .expect("forward")
    {
        StageOutput::Logits(l) => l,
        StageOutput::Hidden(_) => panic!("expected logits"),
    };
    let d = want
        .iter()
        .zip(&got)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(d < 1e-3, "max abs diff vs candle quantized_llama: {d}");
    assert_eq!(
        tb_engine::sample::argmax(&want),
        tb_engine::sample::argmax(&got)
    );
}
