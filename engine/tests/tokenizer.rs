//! The GGUF tokenizer against reference ids recorded with Hugging Face transformers
//! (tests/fixtures/smollm2_token_ids.json), round-trips, and the streaming decoder.

mod common;

use tb_engine::Tokenizer;

fn fixture() -> serde_json::Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/smollm2_token_ids.json"
    ))
    .expect("fixture file");
    serde_json::from_str(&text).expect("fixture json")
}

#[test]
fn ids_match_reference_and_round_trip() {
    let tok = Tokenizer::from_file(&common::model_path()).expect("tokenizer");
    let fx = fixture();
    let cases = fx["cases"].as_array().expect("cases");
    assert!(cases.len() >= 10);
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let want: Vec<u32> = case["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|v| v.as_u64().expect("id") as u32)
            .collect();
        let got = tok.encode(text).expect("encode");
        assert_eq!(got, want, "ids of {text:?}");
        assert_eq!(
            tok.decode(&got).expect("decode"),
            text,
            "round trip of {text:?}"
        );
        // Streaming decode yields the same text, piece by piece at UTF-8 boundaries.
        let mut dec = tok.decoder();
        let mut streamed = String::new();
        for &id in &got {
            streamed.push_str(&dec.push(id));
        }
        streamed.push_str(&dec.finish());
        assert_eq!(streamed, text, "streamed decode of {text:?}");
    }
}

#[test]
fn special_tokens_and_ids() {
    let tok = Tokenizer::from_file(&common::model_path()).expect("tokenizer");
    assert_eq!(tok.encode("<|im_start|>").expect("encode"), vec![1]);
    assert_eq!(tok.encode("<|im_end|>").expect("encode"), vec![2]);
    assert_eq!(tok.bos_id(), Some(1));
    assert!(tok.eos_ids().contains(&2), "{:?}", tok.eos_ids());
    assert!(
        tok.eos_ids().contains(&0),
        "<|endoftext|> ends generation: {:?}",
        tok.eos_ids()
    );
    assert_eq!(tok.vocab_size(), 49152);
}

#[test]
fn streaming_decoder_waits_for_complete_utf8() {
    let tok = Tokenizer::from_file(&common::model_path()).expect("tokenizer");
    let ids = tok.encode("🚀").expect("encode");
    assert!(
        ids.len() > 1,
        "the rocket is split into byte tokens: {ids:?}"
    );
    let mut dec = tok.decoder();
    let pieces: Vec<String> = ids.iter().map(|&id| dec.push(id)).collect();
    assert!(
        pieces[..pieces.len() - 1].iter().all(String::is_empty),
        "{pieces:?}"
    );
    assert_eq!(pieces.last().map(String::as_str), Some("🚀"));
}
