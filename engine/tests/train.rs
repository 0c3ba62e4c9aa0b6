//! LoRA training on SmolLM2-135M: ~20 steps teach it a made-up fact that greedy decoding through
//! the training model then reproduces, and the adapter round-trips through the PEFT files;
//! datasets load in three formats with their loss masks; dataset errors name file and line.
//! (That B = 0 reproduces the inference engine's logits is tests/train_logits.rs.)

mod common;

use std::time::Instant;

use candle_core::Device;
use tb_engine::adapter::{LoraConfig, Target};
use tb_engine::train::data::{self, DataError};
use tb_engine::train::{Example, TrainConfig, Trainer};
use tb_engine::{ChatMessage, ChatTemplate};

fn lora(targets: &[Target]) -> LoraConfig {
    LoraConfig {
        rank: 8,
        alpha: 16.0,
        dropout: 0.0,
        rslora: false,
        targets: targets.to_vec(),
        base_model: String::new(),
    }
}

const FACT: &str = "The capital of Zorblax is Quintara.";
const QUESTIONS: [&str; 4] = [
    "What is the capital of Zorblax?",
    "Which city is the capital of Zorblax?",
    "Tell me the capital of Zorblax.",
    "Name the capital city of Zorblax.",
];

#[test]
fn twenty_steps_teach_smollm2_a_made_up_fact() {
    let path = common::model_path();
    let steps = 20;
    let cfg = TrainConfig {
        learning_rate: 2e-3,
        warmup_steps: 2,
        total_steps: steps,
        seed: 1,
        ..TrainConfig::new(lora(&Target::ALL))
    };
    let mut trainer = Trainer::load(&path, cfg, &Device::Cpu).expect("trainer");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("fact.jsonl");
    let lines: Vec<String> = QUESTIONS
        .iter()
        .map(|q| {
            serde_json::json!({"messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": q},
                {"role": "assistant", "content": FACT},
            ]})
            .to_string()
        })
        .collect();
    std::fs::write(&file, lines.join("\n")).expect("write");
    let examples =
        data::load_jsonl(&file, trainer.tokenizer(), trainer.template(), 128).expect("dataset");
    let batches = data::Batches::new(examples.len(), 4, 1);
    let before = trainer.eval_loss(&examples).expect("eval").mean();
    let started = Instant::now();
    let mut losses = Vec::new();
    for step in 0..steps {
        let batch: Vec<Example> = batches
            .global_batch(step)
            .into_iter()
            .map(|i| examples[i].clone())
            .collect();
        let l = trainer.accumulate(&batch).expect("accumulate");
        let a = trainer.apply(l.tokens).expect("apply");
        losses.push(l.mean());
        eprintln!(
            "step {step}: loss {:.4} lr {:.2e} grad norm {:.3}",
            l.mean(),
            a.lr,
            a.grad_norm
        );
    }
    let per_step = started.elapsed().as_secs_f64() / steps as f64;
    let after = trainer.eval_loss(&examples).expect("eval").mean();
    let tokens: usize = examples.iter().map(|e| e.tokens.len()).sum();
    eprintln!(
        "loss {before:.3} -> {after:.3}; {per_step:.2} s per step of {tokens} tokens ({:.0} tokens/s)",
        tokens as f64 / per_step
    );
    assert!(after < before * 0.25, "loss {before} -> {after}");
    assert!(losses[steps as usize - 1] < losses[0]);

    let prompt = trainer
        .tokenizer()
        .encode(
            &trainer
                .template()
                .render(
                    &[
                        ChatMessage::new("system", "You are a helpful assistant."),
                        ChatMessage::new("user", QUESTIONS[0]),
                    ],
                    true,
                )
                .expect("render"),
        )
        .expect("encode");
    let answer = trainer
        .model()
        .greedy(&prompt, 16, trainer.tokenizer().eos_ids())
        .expect("greedy");
    let text = trainer.tokenizer().decode(&answer).expect("decode");
    eprintln!("answer: {text:?}");
    assert!(text.contains("Quintara"), "answer: {text:?}");

    // The adapter saves in the PEFT layout and loads back with the same values.
    let adapter = trainer.adapter().expect("adapter");
    let out = dir.path().join("adapter");
    adapter.save(&out, trainer.model_config()).expect("save");
    let back = tb_engine::adapter::Adapter::load(&out, trainer.model_config(), &Device::Cpu)
        .expect("load");
    assert_eq!(back.pairs.len(), 30 * 7);
    let key = (3, Target::Q);
    assert_eq!(
        back.pairs[&key].b.to_vec2::<f32>().expect("b"),
        adapter.pairs[&key].b.to_vec2::<f32>().expect("b")
    );
}

fn tokenizer_and_template() -> (tb_engine::Tokenizer, ChatTemplate) {
    let path = common::model_path();
    let index = tb_engine::GgufIndex::open(&path).expect("index");
    (
        tb_engine::Tokenizer::from_gguf(index.content()).expect("tokenizer"),
        ChatTemplate::from_gguf(index.content()).expect("template"),
    )
}

#[test]
fn datasets_load_in_three_formats_with_their_loss_masks() {
    let (tok, template) = tokenizer_and_template();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("mixed.jsonl");
    std::fs::write(
        &file,
        concat!(
            r#"{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Bye!"}]}"#,
            "\n\n",
            r#"{"prompt": "2+2?", "completion": "4"}"#,
            "\n",
            r#"{"text": "plain text"}"#,
            "\n"
        ),
    )
    .expect("write");
    let ex = data::load_jsonl(&file, &tok, &template, 256).expect("load");
    assert_eq!(ex.len(), 3);
    let masked = |e: &Example| -> String {
        let ids: Vec<u32> = e
            .tokens
            .iter()
            .zip(&e.loss_mask)
            .filter(|(_, m)| **m)
            .map(|(t, _)| *t)
            .collect();
        tok.decode(&ids).expect("decode")
    };
    assert_eq!(masked(&ex[0]), "Hello!<|im_end|>\nBye!<|im_end|>\n");
    assert_eq!(masked(&ex[1]), "4<|im_end|>\n");
    assert_eq!(masked(&ex[2]), "plain text<|im_end|>");
    assert!(ex[2].loss_mask.iter().all(|&m| m));
}

#[test]
fn dataset_errors_name_file_line_and_what_was_expected() {
    let (tok, template) = tokenizer_and_template();
    let dir = tempfile::tempdir().expect("tempdir");
    let ok = r#"{"text": "fine"}"#;
    let cases: [(&str, &str); 7] = [
        ("{not json", "not JSON"),
        ("[1, 2]", "an array is not an object"),
        (r#"{"prompt": "p"}"#, "missing field \"completion\""),
        (
            r#"{"text": 5}"#,
            "field \"text\" is a number, expected a string",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "x"}]}"#,
            "no assistant message",
        ),
        (
            r#"{"messages": [{"role": "user"}]}"#,
            "messages[0]: missing field \"content\"",
        ),
        (r#"{"input": "x"}"#, "expected an object with \"messages\""),
    ];
    for (i, (line, expected)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("bad{i}.jsonl"));
        std::fs::write(&file, format!("{ok}\n{line}\n")).expect("write");
        let e = data::load_jsonl(&file, &tok, &template, 64).expect_err(line);
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("{}:2: ", file.display())),
            "{text}"
        );
        assert!(text.contains(expected), "{text}");
        assert_eq!(e.line(), Some(2));
    }
    let long = "word ".repeat(50);
    // The text's tokens and an end-of-sequence token.
    let len = tok.encode(&long).expect("encode").len() + 1;
    let file = dir.path().join("long.jsonl");
    std::fs::write(&file, format!("{ok}\n{ok}\n{{\"text\": \"{long}\"}}\n")).expect("write");
    let e = data::load_jsonl(&file, &tok, &template, 20).expect_err("too long");
    assert!(
        matches!(
            e,
            DataError::TooLong {
                line: 3,
                max: 20,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains(&format!(":3: the example is {len} tokens long")),
        "{e}"
    );
    let file = dir.path().join("empty.jsonl");
    std::fs::write(&file, "\n\n").expect("write");
    let e = data::load_jsonl(&file, &tok, &template, 20).expect_err("empty");
    assert!(e.to_string().contains("empty"), "{e}");
}
