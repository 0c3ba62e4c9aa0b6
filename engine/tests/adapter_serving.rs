//! Serving with a LoRA adapter: an adapter whose B is zero changes nothing (bit for bit); a real
//! one changes the greedy tokens; shards that each load the same adapter directory compute
//! exactly what the single-process engine with that adapter computes, one sequence at a time
//! and batched; and an adapter that adapts blocks outside a shard is loaded only where needed.

mod common;

use common::max_abs_diff;

use std::path::Path;

use tb_engine::adapter::{Adapter, Target};
use tb_engine::sample::argmax;
use tb_engine::{
    BatchItem, Engine, GgufIndex, LoadOptions, SamplingParams, Shard, StageInput, StageOutput,
    Tokenizer,
};

const PROMPT: &str =
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";

/// Writes a seeded adapter of every linear layer to `dir`.
fn write_adapter(dir: &Path, b_magnitude: f32) {
    let config = GgufIndex::open(&common::model_path())
        .expect("index")
        .config()
        .clone();
    Adapter::seeded(&config, &Target::ALL, 8, 16.0, b_magnitude, 7)
        .expect("adapter")
        .save(dir, &config)
        .expect("save");
}

fn with_adapter(dir: &Path) -> LoadOptions {
    LoadOptions {
        adapter: Some(dir.to_path_buf()),
        ..Default::default()
    }
}

fn logits(out: StageOutput) -> Vec<f32> {
    match out {
        StageOutput::Logits(l) => l,
        StageOutput::Hidden(_) => panic!("hidden states where logits were expected"),
    }
}

fn run_pipeline(shards: &mut [&mut Shard], seq: u64, tokens: Vec<u32>, pos: usize) -> Vec<f32> {
    let mut input = StageInput::Tokens(tokens);
    for shard in shards.iter_mut() {
        match shard.forward(seq, input, pos).expect("forward") {
            StageOutput::Hidden(a) => input = StageInput::Hidden(a),
            StageOutput::Logits(l) => return l,
        }
    }
    panic!("the last shard returned no logits");
}

/// Greedy tokens and the logits of every step (prefill + `steps` decodes).
fn trace(
    shards: &mut [&mut Shard],
    seq: u64,
    prompt: &[u32],
    steps: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut all = vec![run_pipeline(shards, seq, prompt.to_vec(), 0)];
    let mut tokens = Vec::new();
    for pos in prompt.len()..prompt.len() + steps {
        let next = argmax(all.last().expect("logits"));
        tokens.push(next);
        all.push(run_pipeline(shards, seq, vec![next], pos));
    }
    (tokens, all)
}

#[test]
fn an_adapter_with_zero_b_gives_the_same_logits_bit_for_bit() {
    let path = common::model_path();
    let dir = tempfile::tempdir().expect("tempdir");
    write_adapter(dir.path(), 0.0);
    let prompt = Tokenizer::from_file(&path)
        .expect("tokenizer")
        .encode(PROMPT)
        .expect("encode");
    let mut base = Shard::load(&path, 0, 30, &LoadOptions::default()).expect("base");
    let mut adapted = Shard::load(&path, 0, 30, &with_adapter(dir.path())).expect("adapted");
    // The adapter's pairs count as weights: rank 8 of 7 layers in 30 blocks, f32.
    let c = adapted.config().clone();
    let per_block: usize = Target::ALL
        .iter()
        .map(|t| {
            let (i, o) = t.shape(&c);
            8 * (i + o)
        })
        .sum();
    assert_eq!(
        adapted.weight_bytes(),
        base.weight_bytes() + (30 * per_block * 4) as u64
    );
    let (want_tokens, want) = trace(&mut [&mut base], 1, &prompt, 6);
    let (tokens, got) = trace(&mut [&mut adapted], 1, &prompt, 6);
    assert_eq!(tokens, want_tokens);
    for (step, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!(a == b, "step {step}: max abs diff {}", max_abs_diff(a, b));
    }
}

#[test]
fn a_nonzero_adapter_changes_the_greedy_tokens() {
    let path = common::model_path();
    let dir = tempfile::tempdir().expect("tempdir");
    write_adapter(dir.path(), 0.3);
    let params = SamplingParams {
        max_tokens: 12,
        ..Default::default()
    };
    let mut base = Engine::load(&path, &LoadOptions::default()).expect("base");
    let mut adapted = Engine::load(&path, &with_adapter(dir.path())).expect("adapted");
    let prompt = base.tokenizer().encode(PROMPT).expect("encode");
    let a = base.generate(&prompt, &params).expect("base generate");
    let b = adapted
        .generate(&prompt, &params)
        .expect("adapted generate");
    assert_ne!(a.tokens, b.tokens, "{:?} vs {:?}", a.text, b.text);
    // Deterministic: the same adapter again gives the same tokens.
    let again = adapted.generate(&prompt, &params).expect("again");
    assert_eq!(again.tokens, b.tokens);
}

#[test]
fn a_two_stage_split_with_the_adapter_matches_the_engine_exactly() {
    let path = common::model_path();
    let dir = tempfile::tempdir().expect("tempdir");
    write_adapter(dir.path(), 0.3);
    let opts = with_adapter(dir.path());
    let mut engine = Engine::load(&path, &opts).expect("engine");
    let prompt = engine.tokenizer().encode(PROMPT).expect("encode");
    let (want_tokens, want) = trace(&mut [engine.shard_mut()], 1, &prompt, 8);
    let k = 13;
    let mut first = Shard::load(&path, 0, k, &opts).expect("first stage");
    let mut second = Shard::load(&path, k, 30 - k, &opts).expect("second stage");
    let (tokens, got) = trace(&mut [&mut first, &mut second], 1, &prompt, 8);
    assert_eq!(tokens, want_tokens);
    for (step, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!(a == b, "step {step}: max abs diff {}", max_abs_diff(a, b));
    }
    // Each stage holds only its blocks' pairs: the two together hold the adapter once.
    let base_first = Shard::load(&path, 0, k, &LoadOptions::default()).expect("base first");
    let base_second = Shard::load(&path, k, 30 - k, &LoadOptions::default()).expect("base 2nd");
    let adapter_bytes = (first.weight_bytes() - base_first.weight_bytes())
        + (second.weight_bytes() - base_second.weight_bytes());
    assert_eq!(
        adapter_bytes,
        engine.shard().weight_bytes()
            - Shard::load(&path, 0, 30, &LoadOptions::default())
                .expect("base")
                .weight_bytes()
    );
    assert!(first.weight_bytes() > base_first.weight_bytes());
}

#[test]
fn batched_steps_with_the_adapter_match_one_sequence_at_a_time() {
    let path = common::model_path();
    let dir = tempfile::tempdir().expect("tempdir");
    // A milder adapter than the others': the low-rank matmul is f32, whose rounding depends on
    // how many rows it multiplies at once (one row takes a matrix-vector kernel). A last-bit
    // difference can move an activation across a rounding step of the next quantised matmul's
    // 8-bit activations, which 30 blocks carry to the logits: measured up to 0.57 for one of
    // these prompts, 0 for the other. Greedy tokens must not change.
    write_adapter(dir.path(), 0.05);
    let tok = Tokenizer::from_file(&path).expect("tokenizer");
    let mut shard = Shard::load(&path, 0, 30, &with_adapter(dir.path())).expect("load");
    let prompts: Vec<Vec<u32>> = ["The capital of France is", "def fibonacci(n):"]
        .iter()
        .map(|p| tok.encode(p).expect("encode"))
        .collect();
    let alone: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| trace(&mut [&mut shard], 10 + i as u64, p, 4))
        .collect();
    // Both prompts prefilled in one pass, then decoded together.
    let mut inputs: Vec<Vec<u32>> = prompts.clone();
    let mut pos = [0usize; 2];
    for step in 0..5 {
        let items = (0..2)
            .map(|i| BatchItem {
                seq: i as u64 + 1,
                input: StageInput::Tokens(inputs[i].clone()),
                pos: pos[i],
            })
            .collect();
        for (i, out) in shard.forward_batch(items).into_iter().enumerate() {
            let l = logits(out.expect("batched step"));
            let d = max_abs_diff(&l, &alone[i].1[step]);
            assert!(d <= 1.0, "prompt {i} step {step}: max abs diff {d}");
            let next = argmax(&l);
            assert_eq!(next, argmax(&alone[i].1[step]), "prompt {i} step {step}");
            if step < 4 {
                assert_eq!(next, alone[i].0[step], "prompt {i} step {step}");
            }
            pos[i] += inputs[i].len();
            inputs[i] = vec![next];
        }
    }
}

#[test]
fn a_bad_adapter_fails_the_load_with_its_file_named() {
    let path = common::model_path();
    let dir = tempfile::tempdir().expect("tempdir");
    let e = Shard::load(&path, 0, 2, &with_adapter(dir.path())).expect_err("no files");
    assert!(e.to_string().contains("adapter_config.json"), "{e}");
    // An adapter for another model (a different hidden size) is refused by shape.
    let mut other = GgufIndex::open(&path).expect("index").config().clone();
    other.hidden *= 2;
    Adapter::seeded(&other, &[Target::V], 4, 8.0, 0.1, 1)
        .expect("adapter")
        .save(dir.path(), &other)
        .expect("save");
    let e = Shard::load(&path, 0, 2, &with_adapter(dir.path())).expect_err("wrong model");
    assert!(e.to_string().contains("expected [4, 576]"), "{e}");
}
