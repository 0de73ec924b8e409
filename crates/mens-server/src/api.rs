//! The OpenAI-shaped endpoints: request types and their checks, responses, server-sent events.

use crate::{AppState, RETRY_AFTER};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use mens::chat::Message;
use mens::sample::SamplerConfig;
use mens::scheduler::{Event, Finish, Request, SubmitError, Usage};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    code: Option<&'static str>,
    param: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            code: None,
            param: None,
        }
    }
    fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }
    fn param(mut self, p: &'static str) -> Self {
        self.param = Some(p);
        self
    }
    pub fn with_code(mut self, c: &'static str) -> Self {
        self.code = Some(c);
        self
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
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut().insert(header::RETRY_AFTER, RETRY_AFTER);
        }
        r
    }
}

type ApiResult<T> = Result<T, ApiError>;

#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// The fields chat and text completions share.
#[derive(Deserialize)]
struct Common {
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<i64>,
    #[serde(default)]
    max_completion_tokens: Option<i64>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    top_k: Option<i64>,
    #[serde(default)]
    min_p: Option<f32>,
    #[serde(default)]
    seed: Option<i64>,
    #[serde(default)]
    stop: Option<Stop>,
    #[serde(default)]
    frequency_penalty: Option<f32>,
    #[serde(default)]
    presence_penalty: Option<f32>,
    #[serde(default)]
    repeat_penalty: Option<f32>,
    #[serde(default)]
    n: Option<i64>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
}

#[derive(Deserialize)]
struct ChatRequest {
    messages: Vec<ChatMessage>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

#[derive(Deserialize)]
struct CompletionRequest {
    prompt: Prompt,
    #[serde(flatten)]
    common: Common,
}

const MAX_STOPS: usize = 16;
const MAX_STOP_LEN: usize = 256;

impl Common {
    fn sampler(&self) -> ApiResult<SamplerConfig> {
        if let Some(n) = self.n {
            if n != 1 {
                return Err(
                    ApiError::invalid(format!("n = {n} is not supported: only n = 1")).param("n"),
                );
            }
        }
        let mut c = SamplerConfig::default();
        if let Some(t) = self.temperature {
            c.temperature = t;
        }
        if let Some(p) = self.top_p {
            c.top_p = p;
        }
        if let Some(k) = self.top_k {
            if !(0..=1 << 20).contains(&k) {
                return Err(ApiError::invalid(format!("top_k must be ≥ 0, got {k}")).param("top_k"));
            }
            c.top_k = k as usize;
        }
        if let Some(p) = self.min_p {
            c.min_p = p;
        }
        if let Some(p) = self.frequency_penalty {
            c.frequency_penalty = p;
        }
        if let Some(p) = self.presence_penalty {
            c.presence_penalty = p;
        }
        if let Some(p) = self.repeat_penalty {
            c.repeat_penalty = p;
        }
        c.seed = match self.seed {
            Some(s) => s as u64,
            // No seed: a different draw each request, as OpenAI's API.
            None => {
                static NEXT: AtomicU64 = AtomicU64::new(0);
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0);
                t ^ NEXT.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            }
        };
        c.validate().map_err(|e| ApiError::invalid(e.to_string()))?;
        Ok(c)
    }

    fn stops(&self) -> ApiResult<Vec<String>> {
        let v = match &self.stop {
            None => vec![],
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if v.len() > MAX_STOPS || v.iter().any(|s| s.len() > MAX_STOP_LEN) {
            return Err(ApiError::invalid(format!(
                "stop takes at most {MAX_STOPS} strings of at most {MAX_STOP_LEN} bytes"
            ))
            .param("stop"));
        }
        Ok(v.into_iter().filter(|s| !s.is_empty()).collect())
    }

    /// `max_tokens` (or `max_completion_tokens`), checked against the context; absent: the rest
    /// of the context.
    fn max_tokens(&self, prompt: usize, ctx: usize) -> ApiResult<usize> {
        let asked = self.max_completion_tokens.or(self.max_tokens);
        if prompt >= ctx {
            return Err(ApiError::invalid(format!(
                "the prompt is {prompt} tokens but the context holds {ctx} tokens"
            ))
            .with_code("context_length_exceeded"));
        }
        match asked {
            None => Ok(ctx - prompt),
            Some(n) if n < 1 => Err(ApiError::invalid(format!("max_tokens must be ≥ 1, got {n}"))
                .param("max_tokens")),
            Some(n) if prompt as i64 + n > ctx as i64 => Err(ApiError::invalid(format!(
                "the prompt ({prompt} tokens) + max_tokens ({n}) exceed the context of {ctx} tokens; shorten the prompt or lower max_tokens"
            ))
            .param("max_tokens")
            .with_code("context_length_exceeded")),
            Some(n) => Ok(n as usize),
        }
    }
}

/// Read and parse a JSON body under the size limit.
async fn read_json<T: serde::de::DeserializeOwned>(
    s: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult<T> {
    let limit = s.config.body_limit;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than the limit of {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let bytes: Bytes = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| too_large())?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid(format!("the request body is not valid: {e}")))
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn new_id(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(1);
    format!(
        "{prefix}-{:x}{:06x}",
        now(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub async fn models(State(s): State<Arc<AppState>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": s.config.model_name,
            "object": "model",
            "created": s.created,
            "owned_by": "mens",
        }],
    }))
    .into_response()
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Text,
}

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

pub async fn chat_completions(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r: ChatRequest = match read_json(&s, &headers, body).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let ChatRequest { messages, common } = r;
    // Rendering and tokenizing a long prompt is CPU work: off the async workers.
    let st = s.clone();
    let prompt = match tokio::task::spawn_blocking(move || chat_prompt(&st, &messages)).await {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => return e.into_response(),
        Err(_) => return engine_error("tokenizing the prompt failed".into()).into_response(),
    };
    complete(s, Kind::Chat, prompt, &common)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

fn chat_prompt(s: &AppState, messages: &[ChatMessage]) -> ApiResult<Vec<u32>> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages must not be empty").param("messages"));
    }
    let mut msgs = Vec::with_capacity(messages.len());
    for m in messages {
        if !ROLES.contains(&m.role.as_str()) {
            return Err(ApiError::invalid(format!(
                "unknown role '{}' (expected one of {})",
                m.role,
                ROLES.join(", ")
            ))
            .param("messages"));
        }
        let content = match &m.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut t = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(x)) => t.push_str(x),
                        _ => {
                            return Err(ApiError::invalid(format!(
                                "content parts of type '{}' are not supported (text only)",
                                p.kind
                            ))
                            .param("messages"))
                        }
                    }
                }
                t
            }
        };
        let role = if m.role == "developer" {
            "system"
        } else {
            &m.role
        };
        msgs.push(Message::new(role, &content));
    }
    let text = s
        .template
        .render(&msgs, true)
        .map_err(|e| ApiError::invalid(format!("the chat template failed: {e}")))?;
    s.tokenizer
        .encode(&text)
        .map_err(|e| ApiError::invalid(e.to_string()))
}

pub async fn completions(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r: CompletionRequest = match read_json(&s, &headers, body).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let CompletionRequest { prompt, common } = r;
    let text = match prompt {
        Prompt::Text(t) => t,
        Prompt::Texts(mut v) if v.len() == 1 => v.remove(0),
        Prompt::Texts(v) => {
            return ApiError::invalid(format!(
                "one prompt per request is supported, got {}",
                v.len()
            ))
            .param("prompt")
            .into_response()
        }
        Prompt::Tokens(t) => return finish_completion(s, Ok(t), &common).await,
    };
    let st = s.clone();
    let prompt = match tokio::task::spawn_blocking(move || st.tokenizer.encode(&text)).await {
        Ok(p) => p,
        Err(_) => return engine_error("tokenizing the prompt failed".into()).into_response(),
    };
    finish_completion(s, prompt, &common).await
}

async fn finish_completion(
    s: Arc<AppState>,
    prompt: mens::Result<Vec<u32>>,
    common: &Common,
) -> Response {
    let prompt = match prompt {
        Ok(p) if !p.is_empty() => p,
        Ok(_) => {
            return ApiError::invalid("the prompt is empty")
                .param("prompt")
                .into_response()
        }
        Err(e) => return ApiError::invalid(e.to_string()).into_response(),
    };
    complete(s, Kind::Text, prompt, common)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// Submit the request and answer: one JSON body, or server-sent events when `stream` is set.
async fn complete(
    s: Arc<AppState>,
    kind: Kind,
    prompt: Vec<u32>,
    c: &Common,
) -> ApiResult<Response> {
    let sampler = c.sampler()?;
    let stop = c.stops()?;
    let ctx = s.scheduler.options().ctx;
    let max_tokens = c.max_tokens(prompt.len(), ctx)?;
    let (tx, rx) = mpsc::unbounded_channel::<Event>();
    let alive = tx.clone();
    let req = Request {
        prompt,
        max_tokens,
        sampler,
        stop,
        on_event: Box::new(move |e| tx.send(e).is_ok()),
        alive: Box::new(move || !alive.is_closed()),
    };
    s.scheduler.submit(req).map_err(|e| match e {
        SubmitError::Invalid(e) => ApiError::invalid(e.to_string()),
        SubmitError::QueueFull => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the server is busy (every slot and the queue are full); retry later",
        )
        .with_code("queue_full"),
        SubmitError::Stopped => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the engine has stopped",
        ),
    })?;
    let meta = Meta {
        id: new_id(if kind == Kind::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        }),
        model: s.config.model_name.clone(),
        created: now(),
        kind,
    };
    if c.stream.unwrap_or(false) {
        let usage = c
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        Ok(stream(meta, rx, usage))
    } else {
        whole(meta, rx).await
    }
}

struct Meta {
    id: String,
    model: String,
    created: u64,
    kind: Kind,
}

fn finish_reason(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stop",
        Finish::Length => "length",
    }
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

fn engine_error(m: String) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", m)
}

/// Collect the whole answer.
async fn whole(meta: Meta, mut rx: mpsc::UnboundedReceiver<Event>) -> ApiResult<Response> {
    let mut text = String::new();
    let usage = loop {
        match rx.recv().await {
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Done(u)) => break u,
            Some(Event::Error(m)) => return Err(engine_error(m)),
            None => return Err(engine_error("the engine dropped the request".into())),
        }
    };
    let reason = finish_reason(usage.finish);
    let (object, choice) = match meta.kind {
        Kind::Chat => (
            "chat.completion",
            json!({"index": 0, "message": {"role": "assistant", "content": text},
                   "logprobs": null, "finish_reason": reason}),
        ),
        Kind::Text => (
            "text_completion",
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": reason}),
        ),
    };
    Ok(axum::Json(json!({
        "id": meta.id,
        "object": object,
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
        "usage": usage_json(&usage),
    }))
    .into_response())
}

struct Sse {
    meta: Meta,
    rx: mpsc::UnboundedReceiver<Event>,
    include_usage: bool,
    pending: VecDeque<Bytes>,
    done: bool,
}

impl Sse {
    fn chunk(&self, delta: Option<&str>, reason: Option<&str>, first: bool) -> Value {
        let m = &self.meta;
        match m.kind {
            Kind::Chat => {
                let d = match (first, delta) {
                    (true, _) => json!({"role": "assistant", "content": ""}),
                    (false, Some(t)) => json!({"content": t}),
                    (false, None) => json!({}),
                };
                json!({"id": m.id, "object": "chat.completion.chunk", "created": m.created,
                       "model": m.model,
                       "choices": [{"index": 0, "delta": d, "logprobs": null, "finish_reason": reason}]})
            }
            Kind::Text => json!({"id": m.id, "object": "text_completion", "created": m.created,
                       "model": m.model,
                       "choices": [{"index": 0, "text": delta.unwrap_or(""), "logprobs": null,
                                    "finish_reason": reason}]}),
        }
    }

    fn push(&mut self, v: &Value) {
        self.pending
            .push_back(Bytes::from(format!("data: {v}\n\n")));
    }

    fn on(&mut self, e: Option<Event>) {
        match e {
            Some(Event::Text(t)) => {
                let c = self.chunk(Some(&t), None, false);
                self.push(&c);
            }
            Some(Event::Done(u)) => {
                let mut c = self.chunk(None, Some(finish_reason(u.finish)), false);
                if self.include_usage {
                    c["usage"] = Value::Null;
                }
                self.push(&c);
                if self.include_usage {
                    let m = &self.meta;
                    let object = match m.kind {
                        Kind::Chat => "chat.completion.chunk",
                        Kind::Text => "text_completion",
                    };
                    let v = json!({"id": m.id, "object": object, "created": m.created,
                                   "model": m.model, "choices": [], "usage": usage_json(&u)});
                    self.push(&v);
                }
                self.pending
                    .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                self.done = true;
            }
            Some(Event::Error(m)) => {
                let v = engine_error(m).body();
                self.push(&v);
                self.done = true;
            }
            None => self.done = true,
        }
    }
}

fn stream(meta: Meta, rx: mpsc::UnboundedReceiver<Event>, include_usage: bool) -> Response {
    let mut sse = Sse {
        meta,
        rx,
        include_usage,
        pending: VecDeque::new(),
        done: false,
    };
    if sse.meta.kind == Kind::Chat {
        let c = sse.chunk(None, None, true);
        sse.push(&c);
    }
    let body = futures_util::stream::unfold(sse, |mut st| async move {
        loop {
            if let Some(b) = st.pending.pop_front() {
                return Some((Ok::<Bytes, std::convert::Infallible>(b), st));
            }
            if st.done {
                return None;
            }
            let e = st.rx.recv().await;
            st.on(e);
        }
    });
    let mut r = Response::new(Body::from_stream(body));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}
