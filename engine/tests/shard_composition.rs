//! Shards chained in a pipeline compute what the whole model computes: logits of the full model
//! equal those of a 2-way and a 3-way split, for the prefill and 5 greedy decode steps.

mod common;

use common::max_abs_diff;

use tb_engine::sample::argmax;
use tb_engine::{LoadOptions, Shard, StageInput, StageOutput, Tokenizer};

fn run_pipeline(shards: &mut [Shard], seq: u64, tokens: Vec<u32>, pos: usize) -> Vec<f32> {
    let mut input = StageInput::Tokens(tokens);
    for shard in shards.iter_mut() {
        match shard.forward(seq, input, pos).expect("forward") {
            StageOutput::Hidden(a) => input = StageInput::Hidden(a),
            StageOutput::Logits(l) => return l,
        }
    }
    panic!("the last shard returned no logits");
}

/// Greedy tokens and per-step logits of a pipeline.
fn trace(shards: &mut [Shard], seq: u64, prompt: &[u32]) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut logits = vec![run_pipeline(shards, seq, prompt.to_vec(), 0)];
    let mut tokens = Vec::new();
    for pos in prompt.len()..prompt.len() + 5 {
        let next = argmax(logits.last().expect("logits"));
        tokens.push(next);
        logits.push(run_pipeline(shards, seq, vec![next], pos));
    }
    (tokens, logits)
}

#[test]
fn split_shards_match_full_model() {
    let path = common::model_path();
    let opts = LoadOptions::default();
    let tok = Tokenizer::from_file(&path).expect("tokenizer");
    let mut full = vec![Shard::load(&path, 0, 30, &opts).expect("full")];
    let n = full[0].config().n_layers;
    assert_eq!(n, 30);
    assert!(full[0].is_first() && full[0].is_last());
    let k = 13;
    let mut two = vec![
        Shard::load(&path, 0, k, &opts).expect("a"),
        Shard::load(&path, k, n - k, &opts).expect("b"),
    ];
    assert!(two[0].is_first() && !two[0].is_last() && !two[1].is_first() && two[1].is_last());
    let mut three = vec![
        Shard::load(&path, 0, 7, &opts).expect("a"),
        Shard::load(&path, 7, 12, &opts).expect("b"),
        Shard::load(&path, 19, n - 19, &opts).expect("c"),
    ];
    // Weight bytes of the splits add up to the whole (the tied embedding is held twice in a
    // split: by the first shard for lookup and by the last for the head).
    let embd = 30_081_024u64;
    let sum2: u64 = two.iter().map(Shard::weight_bytes).sum();
    let sum3: u64 = three.iter().map(Shard::weight_bytes).sum();
    assert_eq!(sum2, full[0].weight_bytes() + embd);
    assert_eq!(sum3, full[0].weight_bytes() + embd);

    let prompts = [
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        "The quick brown fox",
        "fn fibonacci(n: u64) -> u64 {",
    ];
    for (i, text) in prompts.iter().enumerate() {
        let prompt = tok.encode(text).expect("encode");
        let seq = 100 + i as u64;
        let (want_tokens, want_logits) = trace(&mut full, seq, &prompt);
        assert_eq!(want_logits[0].len(), 49152);
        for (name, shards) in [("2-way", &mut two), ("3-way", &mut three)] {
            let (tokens, logits) = trace(shards, seq, &prompt);
            assert_eq!(tokens, want_tokens, "{name} greedy tokens for {text:?}");
            for (step, (a, b)) in logits.iter().zip(&want_logits).enumerate() {
                let d = max_abs_diff(a, b);
                assert!(
                    d <= 1e-4,
                    "{name} step {step} of {text:?}: max abs diff {d}"
                );
            }
        }
    }
}

#[test]
fn sequences_are_independent() {
    let path = common::model_path();
    let tok = Tokenizer::from_file(&path).expect("tokenizer");
    let mut shard = Shard::load(&path, 0, 30, &LoadOptions::default()).expect("load");
    let a = tok.encode("Hello there").expect("encode");
    let b = tok.encode("Numbers: 1 2 3").expect("encode");
    let la = run_pipeline(std::slice::from_mut(&mut shard), 1, a.clone(), 0);
    let _ = run_pipeline(std::slice::from_mut(&mut shard), 2, b, 0);
    // Continuing sequence 1 after sequence 2 ran gives the same as an uninterrupted run.
    let next = argmax(&la);
    let l1 = run_pipeline(std::slice::from_mut(&mut shard), 1, vec![next], a.len());
    let mut whole = a.clone();
    whole.push(next);
    let l2 = run_pipeline(std::slice::from_mut(&mut shard), 3, whole, 0);
    assert!(
        max_abs_diff(&l1, &l2) < 1e-3,
        "incremental vs full prefill: {}",
        max_abs_diff(&l1, &l2)
    );
    assert_eq!(argmax(&l1), argmax(&l2));
    shard.drop_sequence(1);
    assert_eq!(shard.seq_len(1), 0);
    assert_eq!(shard.seq_len(3), a.len() + 1);
}
