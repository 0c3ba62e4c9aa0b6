//! Rank 0 with `--api-key-file` (the service's own key, which a nodelet writes for it): every
//! `/v1` request must carry that key, whatever else it carries; `/health` stays open; a file
//! with no key stops the rank at start, saying which file.

mod common;

use std::process::Command;

use common::{http, http_with_key, model, start};
use serde_json::json;

#[test]
fn only_the_service_key_opens_the_v1_endpoints() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key_file = dir.path().join("service.key");
    let key = "tbsvc-5f0c1a2b3c4d5e6f";
    std::fs::write(&key_file, format!("{key}\n")).expect("key file");
    let service = start(
        1,
        false,
        &["--api-key-file", &key_file.display().to_string()],
    );

    let chat = json!({"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}],
                      "max_tokens": 2});
    let requests = [
        ("GET", "/v1/models", None),
        ("GET", "/v1/models/smollm2", None),
        ("POST", "/v1/chat/completions", Some(&chat)),
    ];
    // A prefix of the key, the key with a byte changed, and a longer string are all refused.
    for wrong in [
        None,
        Some(""),
        Some("tbsvc-5f0c1a2b3c4d5e6"),
        Some("tbsvc-5f0c1a2b3c4d5e6e"),
        Some("tbsvc-5f0c1a2b3c4d5e6f0"),
    ] {
        for (method, path, body) in requests {
            let (code, answer) =
                http_with_key(&service.http, wrong, method, path, body).expect("HTTP");
            assert_eq!(code, 401, "{method} {path} with {wrong:?}: {answer}");
            let v: serde_json::Value = serde_json::from_str(&answer).expect("a JSON error");
            assert_eq!(v["error"]["code"], "invalid_api_key", "{answer}");
        }
    }
    for (method, path, body) in requests {
        let (code, answer) =
            http_with_key(&service.http, Some(key), method, path, body).expect("HTTP");
        assert_eq!(code, 200, "{method} {path}: {answer}");
    }
    let (code, answer) = http(&service.http, "GET", "/health", None).expect("GET /health");
    assert_eq!(code, 200, "{answer}");
}

#[test]
fn an_empty_key_file_stops_rank_0_naming_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key_file = dir.path().join("service.key");
    std::fs::write(&key_file, "\n").expect("key file");
    let port = common::free_port();
    let out = Command::new(env!("CARGO_BIN_EXE_tb-shard"))
        .args([
            "--model",
            &model().display().to_string(),
            "--model-name",
            "smollm2",
        ])
        .args([
            "--hosts",
            "127.0.0.1",
            "--coordinator",
            &format!("127.0.0.1:{}", common::free_port()),
        ])
        .args(["--http", &format!("127.0.0.1:{port}")])
        .args(["--api-key-file", &key_file.display().to_string()])
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .expect("tb-shard");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("the API key file {} is empty", key_file.display())),
        "{stderr}"
    );
}
