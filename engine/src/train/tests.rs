//! Tests of training on tiny random models built from tensors: the analytic LoRA gradient
//! against central finite differences (f64), padding, gradient accumulation, simulated
//! data-parallel ranks, checkpoint resume, dropout reproducibility.

use candle_core::{DType, Device};

use crate::adapter::{LoraConfig, Target};
use crate::gguf::ModelConfig;

use super::model::random_weights;
use super::rng::SplitMix64;
use super::{Example, LoraModel, LoraTrainer, TrainConfig};

fn tiny_config(arch: &str) -> ModelConfig {
    ModelConfig {
        architecture: arch.into(),
        n_layers: 2,
        hidden: 16,
        heads: 4,
        kv_heads: 2,
        head_dim: 4,
        ffn: 24,
        vocab: 32,
        context: 64,
        rope_theta: 10000.0,
        rms_eps: 1e-5,
    }
}

fn lora(targets: &[Target], dropout: f32) -> LoraConfig {
    LoraConfig {
        rank: 2,
        alpha: 4.0,
        dropout,
        rslora: false,
        targets: targets.to_vec(),
        base_model: "tiny".into(),
    }
}

fn train_config(lora: LoraConfig) -> TrainConfig {
    TrainConfig {
        learning_rate: 1e-2,
        warmup_steps: 2,
        total_steps: 10,
        weight_decay: 0.01,
        grad_clip: Some(1.0),
        seed: 5,
        ..TrainConfig::new(lora)
    }
}

fn trainer(arch: &str, cfg: TrainConfig, dtype: DType) -> LoraTrainer {
    let config = tiny_config(arch);
    let weights = random_weights(&config, 11, &Device::Cpu).expect("weights");
    let model =
        LoraModel::new(&config, weights, &cfg.lora, cfg.seed, dtype, &Device::Cpu).expect("model");
    LoraTrainer::new(model, cfg, "tiny-random-11").expect("trainer")
}

/// `n` random examples of lengths 3.. with random loss masks (each with a target).
fn examples(n: usize, seed: u64) -> Vec<Example> {
    let mut rng = SplitMix64::new(seed);
    (0..n)
        .map(|i| {
            let len = 3 + (i * 5 + rng.below(4)) % 9;
            let tokens: Vec<u32> = (0..len).map(|_| rng.below(32) as u32).collect();
            let mut loss_mask: Vec<bool> = (0..len).map(|_| rng.next_f64() < 0.6).collect();
            loss_mask[len - 1] = true;
            Example { tokens, loss_mask }
        })
        .collect()
}

/// Gives B (zero at init, which would make A's gradient zero) random values.
fn randomize(t: &mut LoraTrainer, seed: u64) {
    let mut rng = SplitMix64::new(seed);
    let p: Vec<f64> = t
        .params_flat()
        .expect("params")
        .iter()
        .map(|_| (rng.next_f64() - 0.5) * 0.6)
        .collect();
    t.set_params_flat(&p).expect("set");
}

#[test]
fn lora_gradients_match_central_differences_in_f64() {
    for arch in ["llama", "qwen2"] {
        let cfg = train_config(lora(&Target::ALL, 0.0));
        let mut t = trainer(arch, cfg, DType::F64);
        randomize(&mut t, 3);
        let batch = examples(3, 8);
        let (_, _, grads) = t
            .loss_and_grads(&batch, None)
            .expect("grads")
            .expect("targets");
        let base = t.params_flat().expect("params");
        let loss_at = |t: &mut LoraTrainer, p: &[f64]| -> f64 {
            t.set_params_flat(p).expect("set");
            t.eval_loss(&batch).expect("loss").loss_sum
        };
        let mut rng = SplitMix64::new(17);
        let h = 1e-5;
        let mut worst: f64 = 0.0;
        for _ in 0..80 {
            let i = rng.below(base.len());
            let mut p = base.clone();
            p[i] = base[i] + h;
            let up = loss_at(&mut t, &p);
            p[i] = base[i] - h;
            let down = loss_at(&mut t, &p);
            let numeric = (up - down) / (2.0 * h);
            let err = (numeric - grads[i]).abs() / (1e-6 + numeric.abs().max(grads[i].abs()));
            worst = worst.max(err);
            assert!(
                err < 1e-5,
                "{arch}: parameter {i}: analytic {} vs numeric {numeric}",
                grads[i]
            );
        }
        eprintln!("{arch}: worst relative gradient error {worst:.2e}");
    }
}

#[test]
fn padding_does_not_change_a_sequences_loss() {
    let cfg = train_config(lora(&[Target::Q, Target::V], 0.0));
    let mut t = trainer("llama", cfg, DType::F64);
    randomize(&mut t, 4);
    let batch = examples(4, 2);
    let together = t.eval_loss(&batch).expect("batch");
    let alone: f64 = batch
        .iter()
        .map(|e| t.eval_loss(std::slice::from_ref(e)).expect("one").loss_sum)
        .sum();
    let tokens: usize = batch.iter().map(Example::target_count).sum();
    assert_eq!(together.tokens, tokens as u64);
    assert!(
        (together.loss_sum - alone).abs() < 1e-9,
        "{together:?} vs {alone}"
    );
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn two_half_batches_equal_one_full_batch() {
    let cfg = train_config(lora(&[Target::Q, Target::K, Target::V, Target::O], 0.0));
    let batch = examples(6, 21);
    let mut whole = trainer("llama", cfg.clone(), DType::F32);
    let mut halves = trainer("llama", cfg, DType::F32);
    for step in 0..3 {
        let w = whole.accumulate(&batch).expect("whole");
        let a = halves.accumulate(&batch[..3]).expect("first half");
        let b = halves.accumulate(&batch[3..]).expect("second half");
        assert_eq!(w.tokens, a.tokens + b.tokens);
        assert!((w.loss_sum - a.loss_sum - b.loss_sum).abs() < 1e-4 * w.loss_sum.abs());
        // f32 sums in a different order: equal to ~1e-6 relative.
        let (gw, gh) = (whole.gradients_flat(), halves.gradients_flat());
        let scale = gw.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(max_diff(&gw, &gh) <= 1e-5 * scale, "step {step}");
        whole.apply(w.tokens).expect("apply");
        halves.apply(w.tokens).expect("apply");
    }
    let (pw, ph) = (
        whole.params_flat().expect("w"),
        halves.params_flat().expect("h"),
    );
    let d = pw
        .iter()
        .zip(&ph)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    assert!(d < 1e-5, "parameters differ by {d}");
}

#[test]
fn two_ranks_summing_gradients_equal_one_rank() {
    let cfg = train_config(lora(&Target::ALL, 0.0));
    let data = examples(8, 33);
    let batches = super::data::Batches::new(data.len(), 4, 1);
    let mut single = trainer("qwen2", cfg.clone(), DType::F32);
    let mut ranks = [
        trainer("qwen2", cfg.clone(), DType::F32),
        trainer("qwen2", cfg, DType::F32),
    ];
    for step in 0..4 {
        let global: Vec<Example> = batches
            .global_batch(step)
            .into_iter()
            .map(|i| data[i].clone())
            .collect();
        let s = single.accumulate(&global).expect("single");
        let mut sum = vec![0f32; single.parameter_count()];
        let mut tokens = 0;
        for (r, t) in ranks.iter_mut().enumerate() {
            let mine: Vec<Example> = batches
                .rank_batch(step, r, 2)
                .into_iter()
                .map(|i| data[i].clone())
                .collect();
            tokens += t.accumulate(&mine).expect("rank").tokens;
            for (acc, g) in sum.iter_mut().zip(t.gradients_flat()) {
                *acc += g;
            }
        }
        assert_eq!(tokens, s.tokens);
        let a = single.apply(s.tokens).expect("apply");
        for t in ranks.iter_mut() {
            t.set_gradients_flat(&sum).expect("set");
            let b = t.apply(tokens).expect("apply");
            assert!((a.grad_norm - b.grad_norm).abs() < 1e-5 * a.grad_norm);
        }
    }
    let p = single.params_flat().expect("single");
    for t in &ranks {
        let q = t.params_flat().expect("rank");
        let d = p
            .iter()
            .zip(&q)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        // Tolerance: the sums differ in f32 rounding only (~1e-7 relative), which Adam's
        // normalisation can amplify for near-zero gradients; 1e-4 absolute after 4 steps of
        // lr 1e-2.
        assert!(d < 1e-4, "rank parameters differ by {d}");
    }
    assert_eq!(
        ranks[0].params_flat().expect("0"),
        ranks[1].params_flat().expect("1"),
        "ranks applying the same sum stay identical"
    );
}

#[test]
fn resuming_from_a_checkpoint_is_bit_identical() {
    let cfg = train_config(lora(&[Target::Q, Target::V, Target::Down], 0.1));
    let data = examples(6, 44);
    let batches = super::data::Batches::new(data.len(), 2, 7);
    let run = |t: &mut LoraTrainer, steps: std::ops::Range<u64>| {
        for step in steps {
            let b: Vec<Example> = batches
                .global_batch(step)
                .into_iter()
                .map(|i| data[i].clone())
                .collect();
            let l = t.accumulate(&b[..1]).expect("micro 1").tokens
                + t.accumulate(&b[1..]).expect("micro 2").tokens;
            t.apply(l).expect("apply");
        }
    };
    let mut straight = trainer("llama", cfg.clone(), DType::F32);
    run(&mut straight, 0..5);

    let dir = tempfile::tempdir().expect("tempdir");
    let mut first = trainer("llama", cfg.clone(), DType::F32);
    run(&mut first, 0..2);
    first.save_checkpoint(dir.path()).expect("save");
    drop(first);
    let mut resumed = trainer("llama", cfg.clone(), DType::F32);
    resumed.load_checkpoint(dir.path()).expect("load");
    assert_eq!(resumed.step(), 2);
    run(&mut resumed, 2..5);
    let bits = |t: &LoraTrainer| -> Vec<u64> {
        t.params_flat()
            .expect("p")
            .iter()
            .map(|x| x.to_bits())
            .collect()
    };
    assert_eq!(bits(&straight), bits(&resumed));
    assert_eq!(straight.optimizer(), resumed.optimizer());

    // Another config is refused, and so is a checkpoint without its marker.
    let mut other = train_config(lora(&[Target::Q, Target::V, Target::Down], 0.1));
    other.learning_rate = 2e-2;
    let mut t = trainer("llama", other, DType::F32);
    let e = t.load_checkpoint(dir.path()).expect_err("other config");
    assert!(e.to_string().contains("fingerprints differ"), "{e}");
    std::fs::remove_file(dir.path().join(super::checkpoint::COMPLETE)).expect("rm");
    let mut t = trainer("llama", cfg, DType::F32);
    let e = t.load_checkpoint(dir.path()).expect_err("no marker");
    assert!(e.to_string().contains("COMPLETE"), "{e}");
}

#[test]
fn loss_falls_and_the_adapter_has_every_pair() {
    let mut cfg = train_config(lora(&[Target::Q, Target::V], 0.0));
    cfg.learning_rate = 5e-2;
    cfg.total_steps = 30;
    let mut t = trainer("llama", cfg, DType::F32);
    let batch = examples(4, 5);
    let first = t.eval_loss(&batch).expect("eval").mean();
    for _ in 0..30 {
        let l = t.accumulate(&batch).expect("acc");
        t.apply(l.tokens).expect("apply");
    }
    let last = t.eval_loss(&batch).expect("eval").mean();
    assert!(last < first * 0.8, "loss {first} -> {last}");
    let adapter = t.adapter().expect("adapter");
    assert_eq!(adapter.pairs.len(), 4);
    let (inp, out) = Target::Q.shape(t.model().config());
    assert_eq!(adapter.pair(1, Target::Q).expect("q").a.dims(), [2, inp]);
    assert_eq!(adapter.pair(1, Target::Q).expect("q").b.dims(), [out, 2]);
    // Per block: q 2·16 + 16·2, v 2·16 + 8·2.
    assert_eq!(t.parameter_count(), 2 * (2 * 16 + 16 * 2 + 2 * 16 + 8 * 2));
}

#[test]
fn sizes_and_estimates_agree_with_the_model() {
    let cfg = train_config(lora(&[Target::Q, Target::V, Target::Gate], 0.0));
    let t = trainer("qwen2", cfg.clone(), DType::F32);
    assert_eq!(
        super::parameter_count(&tiny_config("qwen2"), &cfg.lora),
        t.parameter_count()
    );
    let estimate = super::estimate_memory_bytes(&tiny_config("qwen2"), &cfg.lora, 2, 16);
    assert!(
        estimate >= t.memory_bytes(),
        "{estimate} < {}",
        t.memory_bytes()
    );
    fn assert_send<T: Send + 'static>() {}
    assert_send::<super::Trainer>();
}
