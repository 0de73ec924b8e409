//! The OpenAI-shaped endpoints: request types and their checks, responses, server-sent events.

use crate::guard::Tenant;
use crate::{AppState, RETRY_AFTER};
use axum::body::{Body, Bytes};
use axum::extract::{Extension, State};
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

/// Longest error message: request text echoed in one is cut to this many bytes.
const MAX_MESSAGE: usize = 512;

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        let mut message = message.into();
        if message.len() > MAX_MESSAGE {
            let mut end = MAX_MESSAGE;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push_str("… (cut)");
        }
        ApiError {
            status,
            kind,
            message,
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
    #[serde(default)]
    model: Option<String>,
    /// An end user's id: prompt caching is shared only within one API key and one `user`.
    #[serde(default)]
    user: Option<String>,
    // Not supported yet: refused when set to anything but their neutral value.
    #[serde(default)]
    response_format: Option<Value>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    logprobs: Option<Value>,
    #[serde(default)]
    top_logprobs: Option<Value>,
    #[serde(default)]
    logit_bias: Option<Value>,
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
    /// Parse special-token text in the prompt (`<|im_start|>`) as control tokens (llama-server's
    /// `parse_special`). Off by default: request text is text.
    #[serde(default)]
    parse_special: bool,
    #[serde(default)]
    suffix: Option<String>,
    #[serde(flatten)]
    common: Common,
}

const MAX_STOPS: usize = 16;
const MAX_STOP_LEN: usize = 256;

/// A JSON value that leaves a feature off: absent, null, false, 0, "", [] or {}.
fn neutral(v: &Option<Value>) -> bool {
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => true,
        Some(Value::Number(n)) => n.as_f64() == Some(0.0),
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(Value::Object(o)) => o.is_empty(),
        _ => false,
    }
}

fn unsupported(field: &'static str) -> ApiError {
    ApiError::invalid(format!("{field} is not supported by this server yet")).param(field)
}

impl Common {
    /// Refuse what the server cannot do yet, rather than ignore it.
    fn check_supported(&self, model_name: &str) -> ApiResult<()> {
        if let Some(m) = &self.model {
            if !m.is_empty() && m != model_name {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "invalid_request_error",
                    format!(
                        "the model '{m}' does not exist here: this server serves '{model_name}'"
                    ),
                )
                .param("model")
                .with_code("model_not_found"));
            }
        }
        let text_format = self
            .response_format
            .as_ref()
            .is_some_and(|f| f.get("type").and_then(Value::as_str) == Some("text"));
        if !neutral(&self.response_format) && !text_format {
            return Err(unsupported("response_format"));
        }
        if !neutral(&self.tools) {
            return Err(unsupported("tools"));
        }
        let choice_off =
            matches!(&self.tool_choice, Some(Value::String(c)) if c == "none" || c == "auto");
        if !neutral(&self.tool_choice) && !choice_off {
            return Err(unsupported("tool_choice"));
        }
        for (v, name) in [
            (&self.logprobs, "logprobs"),
            (&self.top_logprobs, "top_logprobs"),
            (&self.logit_bias, "logit_bias"),
        ] {
            if !neutral(v) {
                return Err(unsupported(name));
            }
        }
        Ok(())
    }

    /// The tenant whose cached prompts this request may reuse: its API key and `user`.
    fn tenant(&self, key: Tenant) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (key.0, self.user.as_deref()).hash(&mut h);
        h.finish()
    }

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
                return Err(ApiError::invalid(format!(
                    "top_k must be between 0 and {}, got {k}",
                    1 << 20
                ))
                .param("top_k"));
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

    /// `max_tokens` (or `max_completion_tokens`), checked against the context and the server's
    /// cap; absent: the rest of the context, at most the cap.
    fn max_tokens(&self, prompt: usize, ctx: usize, cap: Option<usize>) -> ApiResult<usize> {
        let (asked, name) = match self.max_completion_tokens {
            Some(n) => (Some(n), "max_completion_tokens"),
            None => (self.max_tokens, "max_tokens"),
        };
        if prompt >= ctx {
            return Err(ApiError::invalid(format!(
                "the prompt is {prompt} tokens but the context holds {ctx} tokens"
            ))
            .with_code("context_length_exceeded"));
        }
        let cap = cap.unwrap_or(usize::MAX);
        match asked {
            None => Ok((ctx - prompt).min(cap)),
            Some(n) if n < 1 => {
                Err(ApiError::invalid(format!("{name} must be ≥ 1, got {n}")).param(name))
            }
            Some(n) if n as u64 > cap as u64 => Err(ApiError::invalid(format!(
                "{name} = {n} is above this server's limit of {cap} tokens per request"
            ))
            .param(name)),
            Some(n) if prompt as i64 + n > ctx as i64 => Err(ApiError::invalid(format!(
                "the prompt ({prompt} tokens) + {name} ({n}) exceed the context of {ctx} tokens; shorten the prompt or lower {name}"
            ))
            .param(name)
            .with_code("context_length_exceeded")),
            Some(n) => Ok(n as usize),
        }
    }
}

/// Read and parse a JSON body: `application/json` only (a browser's no-preflight `text/plain`
/// cannot reach the API), under the size limit, within the header timeout plus the time the body
/// takes at the minimum rate (a client that stops sending cannot hold the connection).
async fn read_json<T: serde::de::DeserializeOwned>(
    s: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult<T> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            "the request body must be JSON, sent with Content-Type: application/json",
        ));
    }
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
    let size = declared.unwrap_or(limit as u64);
    let allowed = s.config.header_timeout
        + std::time::Duration::from_secs_f64(size as f64 / s.config.min_body_rate.max(1) as f64);
    let bytes: Bytes = match tokio::time::timeout(allowed, axum::body::to_bytes(body, limit)).await
    {
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!(
                    "the request body did not arrive within {:.0} s",
                    allowed.as_secs_f64()
                ),
            ))
        }
        Ok(Err(e)) => {
            let over = std::error::Error::source(&e)
                .is_some_and(|c| c.is::<http_body_util::LengthLimitError>());
            return Err(if over {
                too_large()
            } else {
                ApiError::invalid(format!("the request body could not be read: {e}"))
            });
        }
        Ok(Ok(b)) => b,
    };
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid(format!("the request body is not valid: {e}")))
}

/// Tokenize off the async workers, at most `tokenize_parallel` prompts at a time.
async fn tokenize(
    s: &Arc<AppState>,
    f: impl FnOnce(&AppState, usize) -> ApiResult<Vec<u32>> + Send + 'static,
) -> ApiResult<Vec<u32>> {
    let _permit = s
        .tokenizing
        .acquire()
        .await
        .map_err(|_| engine_error("the server is stopping".into()))?;
    let st = s.clone();
    // The prompt must leave room for one generated token: longer is refused without tokenizing it all.
    let limit = s.scheduler.options().ctx - 1;
    tokio::task::spawn_blocking(move || f(&st, limit))
        .await
        .map_err(|_| engine_error("tokenizing the prompt failed".into()))?
}

fn too_long(e: mens::Error) -> ApiError {
    match e {
        mens::Error::Context(m) => ApiError::invalid(format!(
            "{m}, the context of this server's slots: shorten it"
        ))
        .with_code("context_length_exceeded"),
        e => ApiError::invalid(e.to_string()),
    }
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
    Extension(tenant): Extension<Tenant>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r: ChatRequest = match read_json(&s, &headers, body).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let ChatRequest { messages, common } = r;
    let prompt = match chat_messages(&messages, &common, &s.config.model_name) {
        Ok(msgs) => tokenize(&s, move |st, limit| chat_prompt(st, &msgs, limit)).await,
        Err(e) => Err(e),
    };
    match prompt {
        Ok(p) => complete(s, Kind::Chat, p, &common, tenant).await,
        Err(e) => Err(e),
    }
    .unwrap_or_else(IntoResponse::into_response)
}

/// Checked messages, their content flattened to text.
fn chat_messages(
    messages: &[ChatMessage],
    common: &Common,
    model_name: &str,
) -> ApiResult<Vec<Message>> {
    common.check_supported(model_name)?;
    if messages.is_empty() {
        return Err(ApiError::invalid("messages must not be empty").param("messages"));
    }
    let mut msgs = Vec::with_capacity(messages.len());
    for m in messages {
        if !ROLES.contains(&m.role.as_str()) {
            return Err(ApiError::invalid(format!(
                "unknown role '{}' (expected one of {})",
                clip(&m.role),
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
                                clip(&p.kind)
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
    Ok(msgs)
}

/// The first bytes of request text quoted in an error.
fn clip(s: &str) -> &str {
    let mut end = s.len().min(64);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The conversation's token ids: message text is text, only the template's markup is control
/// tokens (see `ChatTemplate::tokens`).
fn chat_prompt(s: &AppState, msgs: &[Message], limit: usize) -> ApiResult<Vec<u32>> {
    s.template
        .tokens(&s.tokenizer, msgs, true, limit)
        .map_err(|e| match e {
            mens::Error::Template(m) => {
                engine_error(format!("the model's chat template failed: {m}"))
            }
            e => too_long(e),
        })
}

pub async fn completions(
    State(s): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r: CompletionRequest = match read_json(&s, &headers, body).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let CompletionRequest {
        prompt,
        parse_special,
        suffix,
        common,
    } = r;
    if let Err(e) = common.check_supported(&s.config.model_name) {
        return e.into_response();
    }
    if suffix.as_ref().is_some_and(|x| !x.is_empty()) {
        return unsupported("suffix").into_response();
    }
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
        Prompt::Tokens(t) => return finish_completion(s, Ok(t), &common, tenant).await,
    };
    let prompt = tokenize(&s, move |st, limit| {
        if parse_special {
            let ids = st.tokenizer.encode(&text).map_err(too_long)?;
            if ids.len() > limit {
                return Err(too_long(mens::Error::Context(format!(
                    "the prompt is {} tokens",
                    ids.len()
                ))));
            }
            Ok(ids)
        } else {
            st.tokenizer.encode_text(&text, limit).map_err(too_long)
        }
    })
    .await;
    finish_completion(s, prompt, &common, tenant).await
}

async fn finish_completion(
    s: Arc<AppState>,
    prompt: ApiResult<Vec<u32>>,
    common: &Common,
    tenant: Tenant,
) -> Response {
    let prompt = match prompt {
        Ok(p) if !p.is_empty() => p,
        Ok(_) => {
            return ApiError::invalid("the prompt is empty")
                .param("prompt")
                .into_response()
        }
        Err(e) => return e.into_response(),
    };
    complete(s, Kind::Text, prompt, common, tenant)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// Submit the request and answer: one JSON body, or server-sent events when `stream` is set.
async fn complete(
    s: Arc<AppState>,
    kind: Kind,
    prompt: Vec<u32>,
    c: &Common,
    tenant: Tenant,
) -> ApiResult<Response> {
    let sampler = c.sampler()?;
    let stop = c.stops()?;
    let ctx = s.scheduler.options().ctx;
    let max_tokens = c.max_tokens(prompt.len(), ctx, s.config.max_tokens_cap)?;
    let (tx, rx) = mpsc::unbounded_channel::<Event>();
    let alive = tx.clone();
    let req = Request {
        prompt,
        max_tokens,
        sampler,
        stop,
        on_event: Box::new(move |e| tx.send(e).is_ok()),
        alive: Box::new(move || !alive.is_closed()),
        tenant: c.tenant(tenant),
        deadline: s
            .config
            .request_timeout
            .map(|t| std::time::Instant::now() + t),
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

/// The checks and prompt building of `/v1/chat/completions` (`chat`) or `/v1/completions` on a
/// body, without a scheduler or a connection: what the fuzz target and its regression test drive.
/// The prompt ids, or the error the server would answer.
pub fn prepare(
    chat: bool,
    body: &[u8],
    tok: &mens::tokenizer::Tokenizer,
    template: &mens::chat::ChatTemplate,
    ctx: usize,
) -> ApiResult<Vec<u32>> {
    let bad =
        |e: serde_json::Error| ApiError::invalid(format!("the request body is not valid: {e}"));
    let (prompt, common) = if chat {
        let r: ChatRequest = serde_json::from_slice(body).map_err(bad)?;
        let msgs = chat_messages(&r.messages, &r.common, "mens")?;
        let p = template
            .tokens(tok, &msgs, true, ctx - 1)
            .map_err(too_long)?;
        (p, r.common)
    } else {
        let r: CompletionRequest = serde_json::from_slice(body).map_err(bad)?;
        r.common.check_supported("mens")?;
        let p = match r.prompt {
            Prompt::Text(t) if r.parse_special => tok.encode(&t).map_err(too_long)?,
            Prompt::Text(t) => tok.encode_text(&t, ctx - 1).map_err(too_long)?,
            Prompt::Texts(v) => return Err(ApiError::invalid(format!("{} prompts", v.len()))),
            Prompt::Tokens(t) => t,
        };
        (p, r.common)
    };
    common.sampler()?;
    common.stops()?;
    common.max_tokens(prompt.len(), ctx, None)?;
    Ok(prompt)
}
