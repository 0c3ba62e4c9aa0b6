//! With B = 0 (a fresh adapter) the LoRA training model computes the inference engine's logits
//! for SmolLM2-135M. Its own binary because it sets `CANDLE_DEQUANTIZE_ALL` for the exact
//! comparison, which must not leak into other tests.

mod common;

use common::max_abs_diff;

use candle_core::Device;
use tb_engine::adapter::{LoraConfig, Target};
use tb_engine::train::{TrainConfig, Trainer};
use tb_engine::{ChatMessage, Engine, LoadOptions, Requantize, StageInput, StageOutput};

fn engine_logits(requantize: bool, prompt: &[u32]) -> Vec<f32> {
    let mut engine = Engine::load(
        &common::model_path(),
        &LoadOptions {
            requantize: if requantize {
                Requantize::Always
            } else {
                Requantize::Never
            },
            max_context: Some(512),
            ..Default::default()
        },
    )
    .expect("engine");
    match engine
        .shard_mut()
        .forward(0, StageInput::Tokens(prompt.to_vec()), 0)
        .expect("forward")
    {
        StageOutput::Logits(l) => l,
        StageOutput::Hidden(_) => panic!("a whole model returns logits"),
    }
}

/// Four comparisons of the last position's logits (|logits| up to about 24):
/// - against the engine with every weight dequantised to f32 (`CANDLE_DEQUANTIZE_ALL`, so both
///   sides compute in f32 from the same values) and its KV cache in f32 too (candle's ops,
///   `use_candle_kernels`): the same math, measured 4e-5 apart (f32 rounding in a different
///   order over 30 blocks), asserted below 1e-3;
/// - the same engine with tb's attention, whose cache holds keys and values at f16: measured
///   0.015 apart (2026-12-07), asserted below 0.05;
/// - against the engine on the Q4_1 weights as stored, and requantised to Q8_0 (the default):
///   the engine multiplies those blocks with activations quantised to 8 bits, so the logits
///   are up to ~1.7 apart (measured 0.86 for Q4_1 and 1.65 for Q8_0, 2026-12-05); the bound is
///   2.0 and the arg-max must agree.
#[test]
fn with_b_zero_the_training_model_computes_the_engines_logits() {
    let path = common::model_path();
    let lora = LoraConfig {
        rank: 8,
        alpha: 16.0,
        dropout: 0.0,
        rslora: false,
        targets: vec![Target::Q, Target::K, Target::V, Target::O],
        base_model: String::new(),
    };
    let trainer = Trainer::load(&path, TrainConfig::new(lora), &Device::Cpu).expect("trainer");
    let messages = [
        ChatMessage::new("system", "You are a helpful assistant."),
        // Asked for one sentence: the bare question's first token is a near tie (see engine.rs).
        ChatMessage::new(
            "user",
            "What is the capital of France? Answer in one sentence.",
        ),
    ];
    let text = trainer.template().render(&messages, true).expect("render");
    let prompt = trainer.tokenizer().encode(&text).expect("encode");
    let ours = trainer
        .model()
        .logits(&prompt)
        .expect("logits")
        .get(prompt.len() - 1)
        .expect("last")
        .to_vec1::<f32>()
        .expect("vec");
    let ours_max = tb_engine::sample::argmax(&ours);
    for requantize in [false, true] {
        let theirs = engine_logits(requantize, &prompt);
        let diff = max_abs_diff(&ours, &theirs);
        eprintln!("quantised engine (requantize {requantize}): max |logit difference| {diff:.4}");
        assert!(
            diff < 2.0,
            "requantize {requantize}: logits differ by {diff}"
        );
        assert_eq!(ours_max, tb_engine::sample::argmax(&theirs));
    }
    // candle reads CANDLE_DEQUANTIZE_ALL once per thread, so the exact engine loads on a new
    // thread after the variable is set. This binary's only test runs here, so nothing else
    // reads the environment concurrently.
    unsafe { std::env::set_var("CANDLE_DEQUANTIZE_ALL", "1") };
    let f16_cache = {
        let prompt = prompt.clone();
        std::thread::spawn(move || engine_logits(false, &prompt))
            .join()
            .expect("f32 engine")
    };
    let diff = max_abs_diff(&ours, &f16_cache);
    eprintln!("f32 engine, f16 KV cache: max |logit difference| {diff:.6}");
    assert!(
        diff < 0.05,
        "f32 engine, f16 KV cache: logits differ by {diff}"
    );
    assert_eq!(ours_max, tb_engine::sample::argmax(&f16_cache));

    tb_engine::use_candle_kernels(true);
    let exact = std::thread::spawn(move || engine_logits(false, &prompt))
        .join()
        .expect("exact engine");
    tb_engine::use_candle_kernels(false);
    let diff = max_abs_diff(&ours, &exact);
    eprintln!("f32 engine, f32 KV cache: max |logit difference| {diff:.6}");
    assert!(diff < 1e-3, "f32 engine: logits differ by {diff}");
    assert_eq!(ours_max, tb_engine::sample::argmax(&exact));
}
