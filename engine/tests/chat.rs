//! The chat template of the GGUF (rendered with minijinja) and the ChatML fallback; the prompt
//! tb builds from chat messages against Hugging Face's `apply_chat_template`
//! (tests/fixtures/smollm2_chat_prompts.json, recorded by tests/fixtures/mkchatfixture.py).

mod common;

use serde_json::Value;
use tb_engine::generate::Engine;
use tb_engine::shard::LoadOptions;
use tb_engine::{ChatMessage, ChatTemplate, Tokenizer};

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

fn chat_fixture() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/smollm2_chat_prompts.json"
    ))
    .expect("fixture file");
    serde_json::from_str(&text).expect("fixture json")
}

fn messages_of(case: &Value) -> Vec<ChatMessage> {
    serde_json::from_value(case["messages"].clone()).expect("messages")
}

fn ids_of(case: &Value) -> Vec<u32> {
    case["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|v| u32::try_from(v.as_u64().expect("id")).expect("u32 id"))
        .collect()
}

/// With and without a system message, one turn and several, with and without the generation
/// prompt: tb's text and token ids are transformers' (SmolLM2's template adds its default
/// system prompt when the conversation has none).
#[test]
fn prompts_equal_transformers_apply_chat_template() {
    let model = common::model_path();
    let index = tb_engine::GgufIndex::open(&model).expect("index");
    let template = ChatTemplate::from_gguf(index.content()).expect("template");
    let fx = chat_fixture();
    assert_eq!(
        fx["chat_template"].as_str(),
        Some(template.source()),
        "the fixture was recorded with the GGUF's own template"
    );
    let tokenizer = Tokenizer::from_file(&model).expect("tokenizer");
    let cases = fx["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 8);
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let generation = case["add_generation_prompt"].as_bool().expect("flag");
        let text = template
            .render(&messages_of(case), generation)
            .expect("render");
        assert_eq!(
            Some(text.as_str()),
            case["text"].as_str(),
            "{name} (generation prompt: {generation})"
        );
        let ids = tokenizer.encode(&text).expect("encode");
        assert_eq!(
            ids,
            ids_of(case),
            "{name} (generation prompt: {generation})"
        );
    }
    let user_only = &cases[0];
    assert!(
        user_only["text"]
            .as_str()
            .is_some_and(|t| t.contains("You are a helpful AI assistant named SmolLM")),
        "{user_only}"
    );
}

/// The path the OpenAI endpoint takes (render with the generation prompt, then tokenize), through
/// the engine: the same ids as transformers.
#[test]
fn engine_chat_prompt_equals_the_fixture() {
    let engine = Engine::load(&common::model_path(), &LoadOptions::default()).expect("engine");
    let fx = chat_fixture();
    for case in fx["cases"].as_array().expect("cases") {
        if case["add_generation_prompt"] != Value::Bool(true) {
            continue;
        }
        let ids = engine.chat_prompt(&messages_of(case)).expect("prompt");
        assert_eq!(ids, ids_of(case), "{}", case["name"]);
    }
}
