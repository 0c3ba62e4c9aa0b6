//! `tbctl chat NAME "prompt"`: asks an InferenceService through its OpenAI-compatible endpoint
//! and prints the answer as it streams in. A convenience client: the endpoint speaks the OpenAI
//! API, so any OpenAI client works the same.
//!
//! It asks at the service's stable address (`status.url`, served by the controllers over TLS,
//! which follows the service when tb places it again), verified with the context's cluster CA and
//! authenticated with the context's token. Rank 0's own endpoint (`status.endpoint`) takes only
//! the service's key, which the controllers hold, so it is not asked directly.

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
    let stable = obj["status"]["url"].as_str().unwrap_or_default();
    let model = obj["spec"]["model"].as_str().unwrap_or_default();
    let target = target(ctx, &a.name, stable)?;
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
    let url = format!("{}/chat/completions", target.base().trim_end_matches('/'));
    tracing::debug!(%url, "asking the service");
    let (status, mut response) = post(&target, &url, &body.to_string()).await?;
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

/// Where the request goes: the controllers' stable address for the service, with the CA to
/// verify them (https) and the token to send.
struct Target {
    url: String,
    trust: Option<tb_client::Trust>,
    token: Option<String>,
}

impl Target {
    fn base(&self) -> &str {
        &self.url
    }
}

/// The service's stable URL as this context may use it. Rank 0's own endpoint is no
/// alternative: it takes only the service's key, which the controllers hold.
fn target(ctx: &Ctx, name: &str, stable: &str) -> Result<Target> {
    let token = ctx.token().map(str::to_string);
    if stable.starts_with("https://") {
        let Some(trust) = ctx.trust() else {
            bail!(
                "InferenceService {name} is served at {stable}, whose certificate the cluster CA \
                 signs: pass --ca-cert FILE (a controller's DATA_DIR/ca.pem), set TB_CA_CERT, \
                 or `tbctl login --ca-cert FILE`"
            );
        };
        return Ok(Target {
            url: stable.to_string(),
            trust: Some(trust.clone()),
            token,
        });
    }
    if stable.starts_with("http://") {
        if token.is_some() && !ctx.insecure() {
            bail!(
                "InferenceService {name} is served at {stable}, plain HTTP (controllers started \
                 with --insecure): pass --insecure to send your token in clear text"
            );
        }
        return Ok(Target {
            url: stable.to_string(),
            trust: None,
            token,
        });
    }
    bail!(
        "InferenceService {name} has no URL: the controllers serve InferenceServices only when \
         started with --services-listen ADDR (`tbctl up` does)"
    )
}

/// POSTs JSON to `url` (under `target`'s base); returns the status and the body stream.
async fn post(target: &Target, url: &str, body: &str) -> Result<(u16, hyper::body::Incoming)> {
    let (rest, tls) = match &target.trust {
        Some(trust) => (
            url.strip_prefix("https://")
                .with_context(|| format!("{url}: expected an https:// address"))?,
            Some(trust),
        ),
        None => (
            url.strip_prefix("http://")
                .with_context(|| format!("{url}: expected an http:// address"))?,
            None,
        ),
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let stream = tokio::net::TcpStream::connect(authority)
        .await
        .with_context(|| format!("connecting to {authority}"))?;
    let mut req = hyper::Request::post(format!("/{path}"))
        .header("host", authority)
        .header("content-type", "application/json");
    if let Some(token) = &target.token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_string())))
        .context("building the request")?;
    let resp = match tls {
        Some(trust) => {
            let stream = tls_connect(stream, authority, trust).await?;
            send(TokioIo::new(stream), req, authority, url).await?
        }
        None => send(TokioIo::new(stream), req, authority, url).await?,
    };
    Ok((resp.status().as_u16(), resp.into_body()))
}

async fn send<T>(
    io: TokioIo<T>,
    req: hyper::Request<Full<Bytes>>,
    authority: &str,
    url: &str,
) -> Result<hyper::Response<hyper::body::Incoming>>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .with_context(|| format!("talking HTTP to {authority}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
        .send_request(req)
        .await
        .with_context(|| format!("POST {url}"))
}

/// TLS to `authority` trusting only the cluster CA in `trust`.
async fn tls_connect(
    stream: tokio::net::TcpStream,
    authority: &str,
    trust: &tb_client::Trust,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use tokio_rustls::rustls::pki_types::pem::PemObject as _;
    use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
    use tokio_rustls::rustls::{ClientConfig, RootCertStore};

    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(trust.pem.as_bytes()) {
        let cert = cert.with_context(|| format!("reading the CA {}", trust.path.display()))?;
        roots
            .add(cert)
            .with_context(|| format!("the CA {} is not usable", trust.path.display()))?;
    }
    let provider = std::sync::Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let host = authority
        .rsplit_once(':')
        .map_or(authority, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let name = ServerName::try_from(host.to_string())
        .with_context(|| format!("{host} is not a host name or address"))?;
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, stream)
        .await
        .with_context(|| {
            format!(
                "TLS handshake with {authority} (verified with the CA in {})",
                trust.path.display()
            )
        })
}
