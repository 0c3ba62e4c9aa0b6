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

/// A CA, and a certificate it signed for `name`: (CA PEM, certificate PEM, key PEM).
fn ca_and_leaf(name: &str) -> (String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
        KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
    };
    let ca_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("CA key");
    let mut ca = CertificateParams::default();
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_pem = ca.self_signed(&ca_key).expect("CA").pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("key");
    let mut leaf = CertificateParams::new(vec![name.to_string()]).expect("params");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = leaf.signed_by(&key, &issuer).expect("leaf");
    (ca_pem, cert.pem(), key.serialize_pem())
}

/// `GET path` over TLS to `addr`, checking the certificate is for `name`: status and body.
async fn https_get(
    addr: &str,
    name: &str,
    ca_pem: &str,
    key: &str,
    path: &str,
) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = tb_api::https::client_config(ca_pem).expect("client config");
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let mut tls = tb_api::https::connect(tcp, name, config).await?;
    tls.write_all(
        format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\r\n")
            .as_bytes(),
    )
    .await?;
    let mut raw = Vec::new();
    let _ = tls.read_to_end(&mut raw).await;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let status = raw.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = raw
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// A process killed when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn with_a_certificate_rank_0_serves_https_for_its_service_name_only() {
    let name = tb_api::https::service_server_name("default", "chat");
    let (ca_pem, cert_pem, tls_key_pem) = ca_and_leaf(&name);
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |file: &str, text: &str| {
        let p = dir.path().join(file);
        std::fs::write(&p, text).expect("write");
        p.display().to_string()
    };
    let key = "tbsvc-0123";
    let addr = format!("127.0.0.1:{}", common::free_port());
    let mut shard = Killed(
        Command::new(env!("CARGO_BIN_EXE_tb-shard"))
            .args([
                "--model",
                &model().display().to_string(),
                "--model-name",
                "smollm2",
            ])
            .args(["--hosts", "127.0.0.1", "--coordinator"])
            .arg(format!("127.0.0.1:{}", common::free_port()))
            .args(["--http", &addr, "--context", "256", "--transport", "tcp"])
            .args(["--api-key-file", &write("service.key", key)])
            .args(["--tls-cert-file", &write("service.crt", &cert_pem)])
            .args(["--tls-key-file", &write("service-tls.key", &tls_key_pem)])
            .env("RAYON_NUM_THREADS", "1")
            .spawn()
            .expect("tb-shard"),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    loop {
        if let Ok((200, _)) = https_get(&addr, &name, &ca_pem, "", "/health").await {
            break;
        }
        if let Ok(Some(status)) = shard.0.try_wait() {
            panic!("tb-shard exited ({status}) before it was ready");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not ready over HTTPS in 300 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let (code, body) = https_get(&addr, &name, &ca_pem, key, "/v1/models")
        .await
        .expect("HTTPS");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("smollm2"), "{body}");
    let (code, _) = https_get(&addr, &name, &ca_pem, "tbsvc-0124", "/v1/models")
        .await
        .expect("HTTPS");
    assert_eq!(code, 401);
    // A client expecting another service refuses this one; plain HTTP gets no answer.
    let other = tb_api::https::service_server_name("default", "chat2");
    assert!(
        https_get(&addr, &other, &ca_pem, key, "/v1/models")
            .await
            .is_err(),
        "a client expecting another service accepted this one"
    );
    let plain = tokio::task::spawn_blocking(move || http(&addr, "GET", "/health", None))
        .await
        .expect("plain");
    assert!(!matches!(plain, Ok((200, _))), "{plain:?}");
}
