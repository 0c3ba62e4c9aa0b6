//! The chat template of the GGUF (rendered with minijinja) and the ChatML fallback.

mod common;

use tb_engine::{ChatMessage, ChatTemplate};

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "You are a concise assistant."),
        ChatMessage::new("user", "What is the capital of France?"),
    ]
}

const EXPECTED: &str = "<|im_start|>system\nYou are a concise assistant.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";

#[test]
fn gguf_template_renders_chatml() {
    let index = tb_engine::GgufIndex::open(&common::model_path()).expect("index");
    let t = ChatTemplate::from_gguf(index.content()).expect("template");
    assert_eq!(t.render(&conversation(), true).expect("render"), EXPECTED);
    // transformers' apply_chat_template produced the same string (recorded in the fixture).
    let fx: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/smollm2_token_ids.json"
        ))
        .expect("fixture"),
    )
    .expect("json");
    assert_eq!(fx["chat_template_rendered"].as_str(), Some(EXPECTED));
    // Without a system message SmolLM2's template inserts its default one.
    let only_user = t.render(&conversation()[1..], false).expect("render");
    assert!(
        only_user.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"),
        "{only_user}"
    );
    assert!(only_user.ends_with("France?<|im_end|>\n"), "{only_user:?}");
}

#[test]
fn chatml_fallback() {
    let t = ChatTemplate::chatml();
    assert_eq!(t.render(&conversation(), true).expect("render"), EXPECTED);
    let no_gen = t.render(&conversation(), false).expect("render");
    assert_eq!(no_gen, EXPECTED.trim_end_matches("<|im_start|>assistant\n"));
}

#[test]
fn raise_exception_is_an_error() {
    let t = ChatTemplate::new("{{ raise_exception('no tools here') }}", "", "").expect("compile");
    let e = t.render(&conversation(), true).expect_err("must fail");
    assert!(e.to_string().contains("no tools here"), "{e}");
}
