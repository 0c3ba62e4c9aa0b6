//! The prefix cache, end to end on real `tb-shard` processes: requests sharing a system prompt
//! take its KV from the cache (`usage.prompt_tokens_details.cached_tokens`, as OpenAI reports
//! it) in one process, in a 2-stage pipeline and on 2 tensor-parallel ranks, and answer with the
//! very tokens they get with the cache off.

mod common;

use common::{http, start};
use serde_json::{Value, json};

const SYSTEM: &str = "You are the help desk of a lab of Mac Studios linked by Thunderbolt 5 \
cables. Answer every question in one short, friendly sentence, and never invent numbers.";
const QUESTIONS: [&str; 3] = ["What is RDMA?", "Why use several Macs?", "What is RDMA?"];

/// (text, token ids, prompt tokens, cached tokens) of a greedy chat completion.
fn ask(addr: &str, question: &str) -> (String, Vec<u64>, u64, u64) {
    let req = json!({
        "model": "smollm2",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": 12,
        "temperature": 0,
        "return_token_ids": true,
    });
    let (status, body) = http(addr, "POST", "/v1/chat/completions", Some(&req)).expect("POST");
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let usage = &v["usage"];
    (
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        v["choices"][0]["token_ids"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default(),
        usage["prompt_tokens"].as_u64().expect("prompt_tokens"),
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached_tokens"),
    )
}

#[test]
fn a_shared_system_prompt_is_prefilled_once_and_answers_do_not_change() {
    for (ranks, tensor, what) in [
        (1, false, "one process"),
        (2, false, "2-stage pipeline"),
        (2, true, "2 tensor-parallel ranks"),
    ] {
        let off = start(ranks, tensor, &["--prefix-cache", "0"]);
        let want: Vec<_> = QUESTIONS.iter().map(|q| ask(&off.http, q)).collect();
        drop(off);
        assert!(want.iter().all(|w| w.3 == 0), "{what}, cache off: {want:?}");

        let on = start(ranks, tensor, &["--prefix-cache", "4"]);
        let got: Vec<_> = QUESTIONS.iter().map(|q| ask(&on.http, q)).collect();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!((&g.0, &g.1, g.2), (&w.0, &w.1, w.2), "{what}, question {i}");
        }
        let (prompt, cached): (Vec<u64>, Vec<u64>) = got.iter().map(|g| (g.2, g.3)).unzip();
        eprintln!("{what}: prompt tokens {prompt:?}, cached {cached:?}");
        assert_eq!(cached[0], 0, "{what}: nothing kept yet");
        // The second shares the system prompt with the first; the third repeats the first.
        assert!(
            cached[1] >= 30 && cached[1] < prompt[1],
            "{what}: the system prompt is shared: {cached:?} of {prompt:?}"
        );
        assert_eq!(cached[2], prompt[2] - 1, "{what}: all but the last token");
    }
}
