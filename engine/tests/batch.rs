//! Batched decoding computes what decoding one sequence at a time computes: four prompts
//! decoded greedily in one batch — joining and leaving at different steps, a prompt prefilled
//! in the same pass as other sequences' decode steps — give the same tokens (and logits) as
//! each decoded alone.

mod common;

use common::max_abs_diff;

use tb_engine::sample::argmax;
use tb_engine::{BatchItem, LoadOptions, Shard, StageInput, StageOutput, Tokenizer};

const STEPS: usize = 32;

fn logits(out: StageOutput) -> Vec<f32> {
    match out {
        StageOutput::Logits(l) => l,
        StageOutput::Hidden(_) => panic!("the whole model returned hidden states"),
    }
}

/// Greedy tokens and the logits of every step, one sequence alone.
fn alone(shard: &mut Shard, prompt: &[u32]) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut l = logits(
        shard
            .forward(100, StageInput::Tokens(prompt.to_vec()), 0)
            .expect("prefill"),
    );
    let (mut tokens, mut all) = (Vec::new(), Vec::new());
    for pos in prompt.len()..prompt.len() + STEPS {
        let next = argmax(&l);
        tokens.push(next);
        all.push(l);
        l = logits(
            shard
                .forward(100, StageInput::Tokens(vec![next]), pos)
                .expect("decode"),
        );
    }
    shard.drop_sequence(100);
    (tokens, all)
}

#[test]
fn batched_decoding_matches_one_sequence_at_a_time() {
    let path = common::model_path();
    let tok = Tokenizer::from_file(&path).expect("tokenizer");
    let mut shard = Shard::load(&path, 0, 30, &LoadOptions::default()).expect("load");
    let prompts: Vec<Vec<u32>> = [
        "The capital of France is",
        "Once upon a time, in a land far away, there lived",
        "def fibonacci(n):",
        "Water boils at",
    ]
    .iter()
    .map(|p| tok.encode(p).expect("encode"))
    .collect();
    let reference: Vec<_> = prompts.iter().map(|p| alone(&mut shard, p)).collect();

    // Sequence i joins at step joins[i] (its prefill rides with the others' decode steps) and
    // leaves after STEPS tokens, so the batch grows and shrinks.
    let joins = [0usize, 0, 5, 11];
    struct Seq {
        pos: usize,
        input: Vec<u32>,
        tokens: Vec<u32>,
        logits: Vec<Vec<f32>>,
    }
    let mut seqs: Vec<Seq> = prompts
        .iter()
        .map(|p| Seq {
            pos: 0,
            input: p.clone(),
            tokens: Vec::new(),
            logits: Vec::new(),
        })
        .collect();
    let mut sizes = Vec::new();
    for step in 0.. {
        let members: Vec<usize> = (0..seqs.len())
            .filter(|&i| joins[i] <= step && seqs[i].tokens.len() < STEPS)
            .collect();
        if members.is_empty() {
            break;
        }
        sizes.push(members.len());
        let items = members
            .iter()
            .map(|&i| BatchItem {
                seq: i as u64 + 1,
                input: StageInput::Tokens(seqs[i].input.clone()),
                pos: seqs[i].pos,
            })
            .collect();
        let outs = shard.forward_batch(items);
        assert_eq!(outs.len(), members.len());
        for (&i, out) in members.iter().zip(outs) {
            let l = logits(out.expect("batched step"));
            let s = &mut seqs[i];
            s.pos += s.input.len();
            let next = argmax(&l);
            s.tokens.push(next);
            s.logits.push(l);
            s.input = vec![next];
        }
    }
    assert!(
        sizes.contains(&1) && sizes.contains(&4),
        "batch sizes {sizes:?}"
    );
    for (i, (s, (tokens, all))) in seqs.iter().zip(&reference).enumerate() {
        assert_eq!(&s.tokens, tokens, "prompt {i}: batched tokens differ");
        let worst = s
            .logits
            .iter()
            .zip(all)
            .map(|(a, b)| max_abs_diff(a, b))
            .fold(0.0, f32::max);
        // Every row of a quantised matmul is computed on its own, so batching changes nothing.
        assert_eq!(worst, 0.0, "prompt {i}: logits differ by up to {worst}");
    }
}

#[test]
fn a_bad_item_fails_alone() {
    let path = common::model_path();
    let mut shard = Shard::load(&path, 0, 2, &LoadOptions::default()).expect("load");
    shard
        .forward(1, StageInput::Tokens(vec![42; 3]), 0)
        .expect("prefill");
    let outs = shard.forward_batch(vec![
        BatchItem {
            seq: 1,
            input: StageInput::Tokens(vec![7]),
            pos: 3,
        },
        BatchItem {
            seq: 2,
            input: StageInput::Tokens(vec![7]),
            pos: 5,
        },
        BatchItem {
            seq: 1,
            input: StageInput::Tokens(vec![7]),
            pos: 4,
        },
    ]);
    assert!(outs[0].is_ok(), "{:?}", outs[0]);
    assert!(outs[1].is_err() && outs[2].is_err());
    assert_eq!(shard.seq_len(1), 4);
    assert_eq!(shard.seq_len(2), 0);
}
