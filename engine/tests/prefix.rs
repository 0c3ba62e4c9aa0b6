//! A shared prefix (`Shard::fork_sequence`): a sequence that starts from the first L positions
//! of another's KV cache and runs the rest of its prompt gives the logits of running the whole
//! prompt itself, bit for bit — so a prefix cache changes how much is computed, not what.

mod common;

use tb_engine::sample::argmax;
use tb_engine::{LoadOptions, Shard, StageInput, StageOutput, Tokenizer};

fn logits(out: StageOutput) -> Vec<f32> {
    match out {
        StageOutput::Logits(l) => l,
        StageOutput::Hidden(_) => panic!("the whole model returned hidden states"),
    }
}

/// Greedy logits of `steps` decode steps of `seq`, which has run `at` positions and whose
/// last output was `first`.
fn decode(shard: &mut Shard, seq: u64, first: Vec<f32>, at: usize, steps: usize) -> Vec<Vec<f32>> {
    let mut all = vec![first];
    for pos in at..at + steps {
        let next = argmax(all.last().expect("logits"));
        all.push(logits(
            shard
                .forward(seq, StageInput::Tokens(vec![next]), pos)
                .expect("decode"),
        ));
    }
    all
}

#[test]
fn a_forked_prefix_gives_the_logits_of_running_it() {
    let path = common::model_path();
    let tok = Tokenizer::from_file(&path).expect("tokenizer");
    let mut shard = Shard::load(&path, 0, 30, &LoadOptions::default()).expect("load");
    let system = "<|im_start|>system\nYou are a careful assistant for a lab of Macs linked by \
                  Thunderbolt. Answer in one short sentence.<|im_end|>\n";
    let a = tok
        .encode(&format!(
            "{system}<|im_start|>user\nWhat is RDMA?<|im_end|>\n<|im_start|>assistant\n"
        ))
        .expect("encode");
    let b = tok
        .encode(&format!(
            "{system}<|im_start|>user\nName a prime.<|im_end|>\n<|im_start|>assistant\n"
        ))
        .expect("encode");
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!(shared > 20 && shared < b.len(), "{shared} of {}", b.len());

    // b from scratch.
    let fresh = logits(
        shard
            .forward(1, StageInput::Tokens(b.clone()), 0)
            .expect("prefill"),
    );
    let want = decode(&mut shard, 1, fresh, b.len(), 8);
    shard.drop_sequence(1);

    // a runs; b starts from a's first `shared` positions and runs only the rest.
    shard
        .forward(2, StageInput::Tokens(a.clone()), 0)
        .expect("prefill a");
    shard.fork_sequence(2, 3, shared).expect("fork");
    assert_eq!(shard.seq_len(3), shared);
    let rest = logits(
        shard
            .forward(3, StageInput::Tokens(b[shared..].to_vec()), shared)
            .expect("prefill the rest"),
    );
    let got = decode(&mut shard, 3, rest, b.len(), 8);
    assert_eq!(got, want, "forked prefix vs the whole prompt");
    // a is untouched by b's growth.
    assert_eq!(shard.seq_len(2), a.len());

    // Nothing to share, or more than there is.
    assert!(shard.fork_sequence(9, 4, 1).is_err());
    assert!(shard.fork_sequence(2, 4, a.len() + 1).is_err());
    assert!(shard.fork_sequence(2, 4, 0).is_err());
}
