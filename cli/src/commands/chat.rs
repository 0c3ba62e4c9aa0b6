//! `tbctl chat NAME "prompt"`: asks an InferenceService through its OpenAI-compatible endpoint
//! (the URL in its status) and prints the answer as it streams in. A convenience client: the
//! endpoint speaks the OpenAI API, so any OpenAI client works the same.

use anyhow::{Context, Result, bail};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tb_api::Kind;
use tb_api::proto::GetRequest;
use tokio::io::AsyncWriteExt;

use super::Ctx;
use crate::args::ChatArgs;

pub async fn run(ctx: &mut Ctx, a: &ChatArgs) -> Result<()> {
    let namespace = ctx.namespace_for(Kind::InferenceService);
    let obj = ctx
        .client()
        .get(GetRequest {
            kind: Kind::InferenceService.as_str().into(),
            namespace,
            name: a.name.clone(),
            stale: false,
        })
        .await
        .with_context(|| format!("reading InferenceService {}", a.name))?;
    let obj: Value = serde_json::from_str(&obj.object_json).context("the service's JSON")?;
    let endpoint = obj["status"]["endpoint"].as_str().unwrap_or_default();
    let model = obj["spec"]["model"].as_str().unwrap_or_default();
    if endpoint.is_empty() {
        let reason = obj["status"]["reason"].as_str().unwrap_or("Pending");
        bail!(
            "InferenceService {} has no endpoint yet ({reason}); `tbctl wait --for=condition=Ready isvc/{}` waits for one",
            a.name,
            a.name
        );
    }
    let mut messages = Vec::new();
    if let Some(s) = &a.system {
        messages.push(json!({"role": "system", "content": s}));
    }
    messages.push(json!({"role": "user", "content": a.prompt}));
    let mut body = json!({"model": model, "messages": messages, "stream": true,
                          "temperature": a.temperature});
    if let Some(n) = a.max_tokens {
        body["max_tokens"] = json!(n);
    }
    let url = format!("{}/chat/completions", endpoint.trim_end_matches('/'));
    let (status, mut response) = post(&url, &body.to_string()).await?;
    let mut out = tokio::io::stdout();
    let mut pending = String::new();
    let mut error_body = String::new();
    while let Some(frame) = response.frame().await {
        let frame = frame.context("reading the answer")?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        let text = String::from_utf8_lossy(data);
        if status != 200 {
            error_body.push_str(&text);
            continue;
        }
        pending.push_str(&text);
        while let Some(end) = pending.find("\n\n") {
            let event: String = pending.drain(..end + 2).collect();
            for line in event.lines() {
                let Some(payload) = line.strip_prefix("data: ") else {
                    continue;
                };
                if payload == "[DONE]" {
                    out.write_all(b"\n").await?;
                    out.flush().await?;
                    return Ok(());
                }
                let v: Value = serde_json::from_str(payload).context("a streamed chunk")?;
                if let Some(e) = v.get("error") {
                    bail!("{}", e["message"].as_str().unwrap_or("the service failed"));
                }
                if let Some(piece) = v["choices"][0]["delta"]["content"].as_str() {
                    out.write_all(piece.as_bytes()).await?;
                    out.flush().await?;
                }
            }
        }
    }
    if status != 200 {
        let message = serde_json::from_str::<Value>(&error_body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or(error_body);
        bail!("{url} answered {status}: {message}");
    }
    bail!("the stream ended before [DONE]")
}

/// POSTs JSON to an `http://host:port/path` URL; returns the status and the body stream.
async fn post(url: &str, body: &str) -> Result<(u16, hyper::body::Incoming)> {
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("{url}: only http:// endpoints are supported"))?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let stream = tokio::net::TcpStream::connect(authority)
        .await
        .with_context(|| format!("connecting to {authority}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .with_context(|| format!("talking HTTP to {authority}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = hyper::Request::post(format!("/{path}"))
        .header("host", authority)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .context("building the request")?;
    let resp = sender
        .send_request(req)
        .await
        .with_context(|| format!("POST {url}"))?;
    Ok((resp.status().as_u16(), resp.into_body()))
}
