//! The OpenAI-compatible HTTP API that rank 0 of a built-in service serves:
//! `POST /v1/chat/completions` and `POST /v1/completions` (streamed as server-sent events or
//! not), `GET /v1/models` and `GET /v1/models/{id}`, and `GET /health` (200 once a token has
//! gone through every stage, with the decode tokens/s streams observed and the steps run; 503
//! before that and after a stage failed).
//!
//! With an API key (`--api-key-file`: the service's own, which the nodelet gets from the
//! controllers and their forwarder sends), every `/v1` request must carry it as
//! `Authorization: Bearer`, else 401; `/health` takes none (the nodelet's readiness probe).
//! With a certificate (`--tls-cert-file`, the controllers' for the service's name) the
//! endpoint is HTTPS (`super::run`), so the key never crosses the lab's network in clear.
//!
//! Errors have OpenAI's shape — `{"error": {"message", "type", "param", "code"}}` — with 400 for
//! bad requests (malformed JSON with its line and column, out-of-range parameters, a prompt too
//! long for the context), 404 for an unknown model or path, and 503 while the pipeline is not
//! ready.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::mpsc::Sender;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use tb_engine::chat::{ChatMessage, ChatTemplate};
use tb_engine::generate::FinishReason;
use tb_engine::sample::SamplingParams;
use tb_engine::tokenizer::Tokenizer;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::driver::{Event, Finish, Health, Request};

/// Completion tokens when the request does not say (and the context allows).
pub const DEFAULT_MAX_TOKENS: usize = 512;

/// What the handlers share.
pub struct Api {
    /// The key `/v1` requests must carry (`Authorization: Bearer`); None: any caller.
    pub api_key: Option<String>,
    pub requests: std::sync::Mutex<Sender<Request>>,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// The model id served (the Model object's name).
    pub model: String,
    pub context: usize,
    pub health: Arc<Health>,
    /// The decode speed streams have seen, reported by `GET /health`.
    pub observed: Arc<super::observed::DecodeRate>,
    /// Places for requests; when they are all taken a request gets 429.
    pub admission: Arc<super::admission::Admission>,
    /// Unix seconds, for `created` fields.
    pub started: i64,
}

pub fn router(api: Arc<Api>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route_layer(axum::middleware::from_fn_with_state(
            api.clone(),
            require_key,
        ))
        .route("/health", get(health))
        .fallback(unknown_path)
        .with_state(api)
}

/// The longest API key file read.
const MAX_KEY_FILE: u64 = 1024;

/// The API key in `path`: its first line, which must not be empty.
pub fn read_key_file(path: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context;
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_KEY_FILE).read_to_string(&mut text))
        .with_context(|| format!("reading the API key file {}", path.display()))?;
    let key = text.lines().next().unwrap_or("").trim();
    if key.is_empty() {
        anyhow::bail!("the API key file {} is empty", path.display());
    }
    Ok(key.to_string())
}

/// Refuses a `/v1` request that does not carry the service's key (the controllers' forwarder
/// sends it; a client that reaches rank 0's address directly has none).
async fn require_key(
    State(api): State<Arc<Api>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(key) = &api.api_key {
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !tb_api::secret::constant_time_eq(presented.as_bytes(), key.as_bytes()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

/// An OpenAI-style error response.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    code: &'static str,
    param: Option<&'static str>,
    message: String,
}

impl ApiError {
    fn bad(param: Option<&'static str>, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code,
            param,
            message: message.into(),
        }
    }

    fn unauthorized() -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            kind: "invalid_request_error",
            code: "invalid_api_key",
            param: None,
            message: "this endpoint takes the service's own API key, which only tb's controllers \
                      hold: call the service at its URL (`tbctl get isvc`) with your tb token"
                .into(),
        }
    }

    fn unavailable(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "service_unavailable",
            code: "service_unavailable",
            param: None,
            message: message.into(),
        }
    }

    /// Every place is taken: 429 with Retry-After (OpenAI's rate-limit shape, which the SDKs
    /// retry).
    fn busy(limit: usize) -> Self {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            kind: "rate_limit_error",
            code: "busy",
            param: None,
            message: format!(
                "the service holds {limit} requests (running and waiting), its limit; retry later"
            ),
        }
    }

    /// OpenAI's error code, e.g. `invalid_json`, `invalid_value`, `model_not_found`.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// What the client is told.
    pub fn message(&self) -> &str {
        &self.message
    }

    fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = json_response(self.status, &self.body());
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        r
    }
}

fn json_response(status: StatusCode, v: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

async fn health(State(api): State<Arc<Api>>) -> Response {
    if api.health.ready() {
        let mut body = json!({"status": "ok", "steps": api.health.steps()});
        if let Some(seen) = api.observed.get() {
            body["decodeTokensPerSecond"] = json!((seen.tokens_per_second * 10.0).round() / 10.0);
            body["decodeContextTokens"] = json!(seen.context_tokens.round() as u64);
        }
        json_response(StatusCode::OK, &body)
    } else if api.health.failed() {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "failed"}),
        )
    } else {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "starting"}),
        )
    }
}

fn model_object(api: &Api) -> Value {
    json!({"id": api.model, "object": "model", "created": api.started, "owned_by": "tb"})
}

async fn models(State(api): State<Arc<Api>>) -> Response {
    json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": [model_object(&api)]}),
    )
}

/// `GET /v1/models/{id}`: the served model, or OpenAI's 404 for any other id.
async fn model(
    State(api): State<Arc<Api>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    if id == api.model {
        json_response(StatusCode::OK, &model_object(&api))
    } else {
        unknown_model(&api.model, &id).into_response()
    }
}

fn unknown_model(model: &str, asked: &str) -> ApiError {
    // The id is echoed cut short: a request may carry anything.
    let asked: String = asked.chars().take(200).collect();
    ApiError {
        status: StatusCode::NOT_FOUND,
        kind: "invalid_request_error",
        code: "model_not_found",
        param: Some("model"),
        message: format!("the model `{asked}` does not exist here; this endpoint serves `{model}`"),
    }
}

/// Any other path: a JSON 404 clients can show, not an empty body.
async fn unknown_path(uri: axum::http::Uri) -> Response {
    let path: String = uri.path().chars().take(200).collect();
    ApiError {
        status: StatusCode::NOT_FOUND,
        kind: "invalid_request_error",
        code: "unknown_url",
        param: None,
        message: format!(
            "no such endpoint: {path} (this server answers /v1/chat/completions, \
             /v1/completions, /v1/models and /health)"
        ),
    }
    .into_response()
}

/// `stop`: one string or several.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// Message content: a string, or a list of parts of which the text ones count.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Message {
    role: String,
    #[serde(default)]
    content: Option<Content>,
}

#[derive(Debug, Default, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// The fields both endpoints share; others (user, logit_bias, ...) are accepted and ignored.
#[derive(Debug, Deserialize)]
struct Common {
    model: String,
    #[serde(default)]
    max_tokens: Option<usize>,
    #[serde(default)]
    max_completion_tokens: Option<usize>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    stop: Option<Stop>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    n: Option<u32>,
    /// Also answer the generated token ids (`choices[0].token_ids`), as vLLM does.
    #[serde(default)]
    return_token_ids: bool,
}

#[derive(Debug, Deserialize)]
struct ChatBody {
    messages: Vec<Message>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Prompt {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
struct CompletionBody {
    prompt: Prompt,
    #[serde(flatten)]
    common: Common,
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad(
            None,
            "invalid_json",
            format!(
                "the request body is not valid for this endpoint: {e} (line {}, column {})",
                e.line(),
                e.column()
            ),
        )
    })
}

/// Checks the shared fields; returns sampling parameters (max_tokens still to be fitted to
/// the context) and whether to stream.
fn sampling(
    model: &str,
    c: &Common,
) -> Result<(SamplingParams, Option<usize>, bool, bool), ApiError> {
    if c.model != model {
        return Err(unknown_model(model, &c.model));
    }
    if let Some(n) = c.n
        && n != 1
    {
        return Err(ApiError::bad(
            Some("n"),
            "invalid_value",
            format!("n must be 1, got {n}"),
        ));
    }
    let temperature = c.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::bad(
            Some("temperature"),
            "invalid_value",
            format!("temperature must be between 0 and 2, got {temperature}"),
        ));
    }
    let top_p = c.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad(
            Some("top_p"),
            "invalid_value",
            format!("top_p must be in (0, 1], got {top_p}"),
        ));
    }
    let max_tokens = c.max_completion_tokens.or(c.max_tokens);
    if max_tokens == Some(0) {
        return Err(ApiError::bad(
            Some("max_tokens"),
            "invalid_value",
            "max_tokens must be at least 1",
        ));
    }
    let stop = match &c.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) if v.len() <= 4 => v.clone(),
        Some(Stop::Many(v)) => {
            return Err(ApiError::bad(
                Some("stop"),
                "invalid_value",
                format!("at most 4 stop sequences, got {}", v.len()),
            ));
        }
    };
    let seed = c.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let params = SamplingParams {
        temperature,
        top_p,
        seed,
        max_tokens: 0,
        stop,
    };
    let include_usage = c.stream_options.as_ref().is_some_and(|o| o.include_usage);
    Ok((params, max_tokens, c.stream.unwrap_or(false), include_usage))
}

/// Fits max_tokens to what the context leaves after the prompt.
fn fit(api: &Api, prompt: usize, asked: Option<usize>) -> Result<usize, ApiError> {
    let room = api.context.saturating_sub(prompt);
    if room == 0 {
        return Err(ApiError::bad(
            Some("messages"),
            "context_length_exceeded",
            format!(
                "the prompt has {prompt} tokens; this model's context holds {} (prompt and \
                 completion together)",
                api.context
            ),
        ));
    }
    match asked {
        Some(n) if n > room => Err(ApiError::bad(
            Some("max_tokens"),
            "context_length_exceeded",
            format!(
                "the prompt has {prompt} tokens and {n} more were asked for; this model's \
                 context holds {} in all",
                api.context
            ),
        )),
        Some(n) => Ok(n),
        None => Ok(room.min(DEFAULT_MAX_TOKENS)),
    }
}

fn submit(
    api: &Api,
    prompt: Vec<u32>,
    params: SamplingParams,
) -> Result<UnboundedReceiver<Event>, ApiError> {
    if !api.health.ready() {
        return Err(ApiError::unavailable(if api.health.failed() {
            "a stage of this service failed; tb is restarting it"
        } else {
            "the service is starting: its pipeline has not answered yet"
        }));
    }
    let permit = api
        .admission
        .try_admit()
        .ok_or_else(|| ApiError::busy(api.admission.limit()))?;
    let (tx, rx) = unbounded_channel();
    let sent = api
        .requests
        .lock()
        .map_err(|_| ApiError::unavailable("the pipeline stopped"))?
        .send(Request {
            prompt,
            params,
            events: tx,
            permit: Some(permit),
        });
    sent.map_err(|_| ApiError::unavailable("the pipeline stopped"))?;
    Ok(api.observed.watch(rx))
}

fn finish_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

fn usage(f: &Finish) -> Value {
    json!({
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": f.cached_tokens},
    })
}

fn failure(api: &Api, why: String) -> ApiError {
    if api.health.failed() {
        ApiError::unavailable(why)
    } else {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            code: "generation_failed",
            param: None,
            message: why,
        }
    }
}

/// Waits for a whole answer.
async fn collect(
    api: &Api,
    mut rx: UnboundedReceiver<Event>,
) -> Result<(String, Finish), ApiError> {
    let mut text = String::new();
    while let Some(e) = rx.recv().await {
        match e {
            Event::Text(t) => text.push_str(&t),
            Event::Done(f) => return Ok((text, f)),
            Event::Failed(why) => return Err(failure(api, why)),
        }
    }
    Err(failure(api, "the pipeline dropped the request".into()))
}

fn request_id(prefix: &str) -> String {
    format!("{prefix}-{}", uuid_like())
}

fn uuid_like() -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{n:x}")
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Streams events as server-sent events; `chunk` shapes one text piece / the final chunk.
fn sse(
    mut rx: UnboundedReceiver<Event>,
    first: Option<Value>,
    chunk: impl Fn(Option<&str>, Option<&Finish>) -> Value + Send + 'static,
    include_usage: bool,
    usage_chunk: impl Fn(&Finish) -> Value + Send + 'static,
) -> Response {
    let (tx, out) = unbounded_channel::<Result<Bytes, Infallible>>();
    let line = |v: &Value| Ok(Bytes::from(format!("data: {v}\n\n")));
    tokio::spawn(async move {
        if let Some(f) = first {
            let _ = tx.send(line(&f));
        }
        while let Some(e) = rx.recv().await {
            match e {
                Event::Text(t) => {
                    if tx.send(line(&chunk(Some(&t), None))).is_err() {
                        return; // the client went away; dropping `rx` cancels the request
                    }
                }
                Event::Done(f) => {
                    let _ = tx.send(line(&chunk(None, Some(&f))));
                    if include_usage {
                        let _ = tx.send(line(&usage_chunk(&f)));
                    }
                    break;
                }
                Event::Failed(why) => {
                    let _ = tx.send(line(&ApiError::unavailable(why).body()));
                    break;
                }
            }
        }
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n")));
    });
    let stream = futures::stream::unfold(out, |mut out| async move {
        out.recv().await.map(|item| (item, out))
    });
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// A chat request as checked, before its prompt is rendered and tokenized.
#[derive(Debug)]
pub struct ChatRequest {
    /// Roles checked (`developer` is passed on as `system`), content parts joined.
    pub messages: Vec<ChatMessage>,
    /// `max_tokens` is 0 here: it is fitted to the context once the prompt is tokenized.
    pub params: SamplingParams,
    pub max_tokens: Option<usize>,
    pub stream: bool,
    pub include_usage: bool,
    pub return_token_ids: bool,
}

/// Parses and checks the body of `POST /v1/chat/completions` for the model `model` (pure: no
/// engine, no pipeline), so that every refusal is a 400 with OpenAI's error shape.
pub fn parse_chat_request(body: &[u8], model: &str) -> Result<ChatRequest, ApiError> {
    let req: ChatBody = parse(body)?;
    let (params, max_tokens, stream, include_usage) = sampling(model, &req.common)?;
    if req.messages.is_empty() {
        return Err(ApiError::bad(
            Some("messages"),
            "invalid_value",
            "messages must hold at least one message",
        ));
    }
    let mut messages = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.iter().enumerate() {
        if !matches!(
            m.role.as_str(),
            "system" | "user" | "assistant" | "developer" | "tool"
        ) {
            return Err(ApiError::bad(
                Some("messages"),
                "invalid_value",
                format!(
                    "messages[{i}].role is `{}`; expected system, user, assistant, developer or tool",
                    m.role
                ),
            ));
        }
        let content = match &m.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => parts
                .iter()
                .filter(|p| p.kind == "text")
                .filter_map(|p| p.text.clone())
                .collect::<Vec<_>>()
                .join(""),
        };
        let role = if m.role == "developer" {
            "system"
        } else {
            &m.role
        };
        messages.push(ChatMessage::new(role, content));
    }
    Ok(ChatRequest {
        messages,
        params,
        max_tokens,
        stream,
        include_usage,
        return_token_ids: req.common.return_token_ids,
    })
}

/// A completion request as checked, before its prompt is tokenized.
#[derive(Debug)]
pub struct CompletionRequest {
    /// One non-empty prompt.
    pub prompt: String,
    /// `max_tokens` is 0 here, as in [`ChatRequest`].
    pub params: SamplingParams,
    pub max_tokens: Option<usize>,
    pub stream: bool,
    pub include_usage: bool,
    pub return_token_ids: bool,
}

/// Parses and checks the body of `POST /v1/completions` for the model `model` (pure).
pub fn parse_completion_request(body: &[u8], model: &str) -> Result<CompletionRequest, ApiError> {
    let req: CompletionBody = parse(body)?;
    let (params, max_tokens, stream, include_usage) = sampling(model, &req.common)?;
    let prompt = match req.prompt {
        Prompt::One(p) => p,
        Prompt::Many(mut v) if v.len() == 1 => v.remove(0),
        Prompt::Many(v) => {
            return Err(ApiError::bad(
                Some("prompt"),
                "invalid_value",
                format!("one prompt per request, got {}", v.len()),
            ));
        }
    };
    if prompt.is_empty() {
        return Err(ApiError::bad(
            Some("prompt"),
            "invalid_value",
            "the prompt is empty",
        ));
    }
    Ok(CompletionRequest {
        prompt,
        params,
        max_tokens,
        stream,
        include_usage,
        return_token_ids: req.common.return_token_ids,
    })
}

async fn chat(State(api): State<Arc<Api>>, body: Bytes) -> Result<Response, ApiError> {
    let ChatRequest {
        messages,
        mut params,
        max_tokens: asked,
        stream,
        include_usage,
        return_token_ids,
    } = parse_chat_request(&body, &api.model)?;
    let text = api
        .template
        .render(&messages, true)
        .map_err(|e| ApiError::bad(Some("messages"), "invalid_value", e.to_string()))?;
    let prompt = api
        .tokenizer
        .encode(&text)
        .map_err(|e| ApiError::bad(Some("messages"), "invalid_value", e.to_string()))?;
    params.max_tokens = fit(&api, prompt.len(), asked)?;
    let rx = submit(&api, prompt, params)?;
    let (id, created, model) = (request_id("chatcmpl"), now(), api.model.clone());
    if stream {
        let (id2, model2) = (id.clone(), model.clone());
        let first = json!({"id": id, "object": "chat.completion.chunk", "created": created,
            "model": model, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
            "finish_reason": null}]});
        let chunk = move |text: Option<&str>, done: Option<&Finish>| {
            let delta = match text {
                Some(t) => json!({"content": t}),
                None => json!({}),
            };
            json!({"id": id, "object": "chat.completion.chunk", "created": created,
                "model": model, "choices": [{"index": 0, "delta": delta,
                "finish_reason": done.map(|f| finish_reason(f.reason))}]})
        };
        let usage_chunk = move |f: &Finish| {
            json!({"id": id2, "object": "chat.completion.chunk", "created": created,
                "model": model2, "choices": [], "usage": usage(f)})
        };
        return Ok(sse(rx, Some(first), chunk, include_usage, usage_chunk));
    }
    let (text, f) = collect(&api, rx).await?;
    let mut answer = json!({"id": id, "object": "chat.completion", "created": created,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
            "finish_reason": finish_reason(f.reason), "logprobs": null}],
        "usage": usage(&f)});
    if return_token_ids {
        answer["choices"][0]["token_ids"] = json!(f.token_ids);
    }
    Ok(json_response(StatusCode::OK, &answer))
}

async fn completions(State(api): State<Arc<Api>>, body: Bytes) -> Result<Response, ApiError> {
    let CompletionRequest {
        prompt,
        mut params,
        max_tokens: asked,
        stream,
        include_usage,
        return_token_ids,
    } = parse_completion_request(&body, &api.model)?;
    let tokens = api
        .tokenizer
        .encode(&prompt)
        .map_err(|e| ApiError::bad(Some("prompt"), "invalid_value", e.to_string()))?;
    params.max_tokens = fit(&api, tokens.len(), asked)?;
    let rx = submit(&api, tokens, params)?;
    let (id, created, model) = (request_id("cmpl"), now(), api.model.clone());
    if stream {
        let (id2, model2) = (id.clone(), model.clone());
        let chunk = move |text: Option<&str>, done: Option<&Finish>| {
            json!({"id": id, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": text.unwrap_or(""), "logprobs": null,
                "finish_reason": done.map(|f| finish_reason(f.reason))}]})
        };
        let usage_chunk = move |f: &Finish| {
            json!({"id": id2, "object": "text_completion", "created": created,
                "model": model2, "choices": [], "usage": usage(f)})
        };
        return Ok(sse(rx, None, chunk, include_usage, usage_chunk));
    }
    let (text, f) = collect(&api, rx).await?;
    let mut answer = json!({"id": id, "object": "text_completion", "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish_reason(f.reason),
            "logprobs": null}],
        "usage": usage(&f)});
    if return_token_ids {
        answer["choices"][0]["token_ids"] = json!(f.token_ids);
    }
    Ok(json_response(StatusCode::OK, &answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_gives_its_first_line_and_an_empty_one_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("service.key");
        std::fs::write(&path, "  tbsvc-abc \nignored\n").expect("write");
        assert_eq!(read_key_file(&path).expect("a key"), "tbsvc-abc");
        std::fs::write(&path, "\n").expect("write");
        let e = read_key_file(&path).expect_err("empty").to_string();
        assert!(e.contains("is empty") && e.contains("service.key"), "{e}");
        let e = format!(
            "{:#}",
            read_key_file(&dir.path().join("none")).expect_err("missing")
        );
        assert!(e.contains("reading the API key file"), "{e}");
    }
}
