//! Ollama's API, for the editors and tools that speak it: `POST /api/chat`, `/api/generate`,
//! `/api/show`, `GET /api/tags`, `/api/ps`, `/api/version`. A request is translated to the OpenAI
//! chat or completion path (the same checks, template, tools, grammars and limits) and answered in
//! Ollama's shape: JSON objects, one per line and streamed unless `"stream": false`, durations in
//! nanoseconds, errors as `{"error": "…"}`. The server holds one model, always loaded: `keep_alive`
//! and load-time options (`num_ctx`, `num_gpu`, `num_thread`, …) are ignored, as Ollama ignores
//! options a model does not use.

use crate::api::{chat, complete, fim_ids, prompt_ids, read_json, tokenize, Extra};
use crate::guard::Tenant;
use crate::request::{clip, ApiError, ApiResult, ChatRequest, Common, Prompt};
use crate::sse::{Kind, Meta};
use crate::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{Extension, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use mens::fim::FimInput;
use mens::sample::TokenLogprobs;
use mens::scheduler::{Event, Finish, Usage};
use mens::tools::{CallSplitter, ToolCall};
use serde_json::{json, Map, Value};
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::mpsc;

/// The Ollama API level `/api/version` reports: clients gate features (tools, structured output,
/// thinking) on it, and mens answers those requests in this version's shape.
const API_VERSION: &str = "0.13.4";

/// What `/api/tags`, `/api/ps` and `/api/show` say of the served model.
#[derive(Debug, Clone, Default)]
pub struct ModelCard {
    /// `general.architecture` ("qwen2", "gemma3", …).
    pub architecture: String,
    pub parameters: u64,
    /// The file's quantization ("Q4_K_M", …), from `general.file_type`.
    pub quantization: String,
    /// Bytes of the model file.
    pub size: u64,
    /// The context the model was trained for, its width and its layers.
    pub context_length: u64,
    pub embedding_length: u64,
    pub block_count: u64,
    /// The file's modification time.
    pub modified: Option<std::time::SystemTime>,
}

impl ModelCard {
    /// The card of a loaded model (`path`: its file, for the size and modification time).
    pub fn of(model: &mens::model::Model, path: Option<&std::path::Path>) -> Self {
        let g = &model.gguf;
        let parameters = g
            .tensors
            .iter()
            .map(|t| t.dims.iter().product::<u64>())
            .sum();
        let meta = path.and_then(|p| std::fs::metadata(p).ok());
        let file_type = g.get_u64("general.file_type").ok().flatten();
        ModelCard {
            architecture: g
                .get_str("general.architecture")
                .ok()
                .flatten()
                .unwrap_or("")
                .to_string(),
            parameters,
            quantization: file_type
                .and_then(file_type_name)
                .unwrap_or("unknown")
                .to_string(),
            size: meta
                .as_ref()
                .map(|m| m.len())
                .unwrap_or_else(|| g.tensors.iter().map(|t| t.bytes).sum()),
            context_length: model.config.train_ctx as u64,
            embedding_length: model.config.dim as u64,
            block_count: model.config.n_layer as u64,
            modified: meta.and_then(|m| m.modified().ok()),
        }
    }
}

/// llama.cpp's names of `general.file_type` (its `llama_ftype`).
fn file_type_name(t: u64) -> Option<&'static str> {
    Some(match t {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        _ => return None,
    })
}

/// An error as Ollama writes it: `{"error": "…"}` with the status.
pub(crate) fn error(e: ApiError) -> Response {
    let mut r = (e.status, axum::Json(json!({ "error": e.message }))).into_response();
    if e.status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut()
            .insert(header::RETRY_AFTER, crate::RETRY_AFTER);
    }
    r
}

fn bad(m: impl Into<String>) -> ApiError {
    ApiError::invalid(m)
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_nanos(std::time::SystemTime::now()).to_string()
}

/// The name `/api/tags` lists: the served name, with Ollama's default tag when it has none.
pub(crate) fn listed_name(s: &AppState) -> String {
    let n = &s.config.model_name;
    if n.contains(':') {
        n.clone()
    } else {
        format!("{n}:latest")
    }
}

/// A request's `model` as the served name (`NAME:latest` is `NAME`); absent: the served model.
fn model_field(s: &AppState, o: &Map<String, Value>) -> ApiResult<()> {
    let name = &s.config.model_name;
    match o.get("model").or_else(|| o.get("name")) {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if m.is_empty() || m == name || *m == listed_name(s) => Ok(()),
        Some(Value::String(m)) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!(
                "model '{}' not found: this server serves '{}'",
                clip(m),
                listed_name(s)
            ),
        )),
        Some(_) => Err(bad("model must be a string")),
    }
}

/// The fields every generating request shares, as an OpenAI request's: `stream` (default true),
/// `format` ("json" or a JSON schema), and `options`' sampling fields.
fn common_fields(o: &Map<String, Value>) -> ApiResult<Map<String, Value>> {
    let mut out = Map::new();
    let stream = match o.get("stream") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("stream must be true or false")),
    };
    out.insert("stream".into(), json!(stream));
    // Log-probabilities (Ollama's fields are OpenAI chat's: `logprobs: true`, `top_logprobs`).
    for key in ["logprobs", "top_logprobs"] {
        if let Some(v) = o.get(key).filter(|v| !v.is_null()) {
            out.insert(key.into(), v.clone());
        }
    }
    match o.get("format") {
        None | Some(Value::Null) => {}
        Some(Value::String(f)) if f.is_empty() => {}
        Some(Value::String(f)) if f == "json" => {
            out.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(schema @ Value::Object(_)) => {
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"schema": schema}}),
            );
        }
        Some(_) => return Err(bad("format must be \"json\" or a JSON schema")),
    }
    let options = match o.get("options") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err(bad("options must be an object")),
    };
    for key in [
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "repeat_penalty",
        "repeat_last_n",
        "presence_penalty",
        "frequency_penalty",
    ] {
        if let Some(v) = options.get(key).filter(|v| !v.is_null()) {
            out.insert(key.into(), v.clone());
        }
    }
    // num_predict: -1 (endless) and -2 (fill the context) leave the rest of the context.
    match options.get("num_predict") {
        None | Some(Value::Null) => {}
        Some(v) => match v.as_i64() {
            Some(n) if n >= 0 => {
                out.insert("max_tokens".into(), json!(n));
            }
            Some(_) => {}
            None => return Err(bad("options.num_predict must be an integer")),
        },
    }
    Ok(out)
}

/// `think`: true asks for the reasoning apart (`message.thinking`); anything else leaves it in the
/// text. The levels some models take ("low", "high") count as true.
fn wants_thinking(o: &Map<String, Value>) -> bool {
    match o.get("think") {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => !s.is_empty(),
        _ => false,
    }
}

/// A chat request's `think`, given to the template as `enable_thinking` (Qwen3's switch: false
/// makes the template close the reasoning block before the answer); absent: the template's default.
fn think_var(o: &Map<String, Value>, out: &mut Map<String, Value>) {
    if o.get("think").is_some_and(|t| !t.is_null()) {
        out.insert(
            "chat_template_kwargs".into(),
            json!({ "enable_thinking": wants_thinking(o) }),
        );
    }
}

fn no_images(v: Option<&Value>) -> ApiResult<()> {
    match v {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Array(a)) if a.is_empty() => Ok(()),
        _ => Err(bad("this model takes no images")),
    }
}

/// An Ollama chat message as an OpenAI one.
fn message(m: &Value) -> ApiResult<Value> {
    let role = m.get("role").and_then(Value::as_str).unwrap_or("");
    no_images(m.get("images"))?;
    let content = match m.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(bad("messages: content must be a string")),
    };
    let mut out = json!({"role": role, "content": content});
    if let Some(calls) = m.get("tool_calls").filter(|c| !c.is_null()) {
        let calls = calls
            .as_array()
            .ok_or_else(|| bad("messages: tool_calls must be a list"))?;
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                let f = c.get("function").cloned().unwrap_or(Value::Null);
                json!({"id": c.get("id").cloned().unwrap_or(Value::Null), "type": "function",
                       "function": {"name": f.get("name").cloned().unwrap_or(Value::Null),
                                    "arguments": f.get("arguments").cloned().unwrap_or_else(|| json!({}))}})
            })
            .collect();
        out["tool_calls"] = json!(calls);
    }
    if let Some(n) = m.get("tool_name").and_then(Value::as_str) {
        out["name"] = json!(n);
    }
    if let Some(id) = m.get("tool_call_id").and_then(Value::as_str) {
        out["tool_call_id"] = json!(id);
    }
    if let Some(t) = m.get("thinking").and_then(Value::as_str) {
        out["reasoning_content"] = json!(t);
    }
    Ok(out)
}

/// The request's JSON object, its `model` checked.
pub(crate) async fn read_object(
    s: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult<Map<String, Value>> {
    match read_json(s, headers, body).await? {
        Value::Object(o) => {
            model_field(s, &o)?;
            Ok(o)
        }
        _ => Err(bad("the request body must be a JSON object")),
    }
}

/// Whether the request only loads (or unloads) the model: no prompt, no messages.
fn load_answer(s: &AppState, o: &Map<String, Value>, chat: bool) -> Response {
    let unload = o
        .get("keep_alive")
        .is_some_and(|k| k.as_i64() == Some(0) || k.as_str() == Some("0"));
    let mut v = json!({"model": listed_name(s), "created_at": now_rfc3339(), "done": true,
                       "done_reason": if unload { "unload" } else { "load" }});
    if chat {
        v["message"] = json!({"role": "assistant", "content": ""});
    } else {
        v["response"] = json!("");
    }
    axum::Json(v).into_response()
}

/// A request as a chat of `msgs` (OpenAI messages) with the request's fields `out`, answered in
/// Ollama's shape for `/api/chat` (`chat`) or `/api/generate`.
async fn as_chat(
    s: &Arc<AppState>,
    tenant: Tenant,
    o: &Map<String, Value>,
    mut out: Map<String, Value>,
    msgs: Vec<Value>,
    chat_api: bool,
) -> ApiResult<Response> {
    out.insert("messages".into(), json!(msgs));
    think_var(o, &mut out);
    let r: ChatRequest = serde_json::from_value(Value::Object(out))
        .map_err(|e| bad(format!("the request is not valid: {e}")))?;
    let echo = json!({ "think": wants_thinking(o) });
    chat(s.clone(), tenant, r, Kind::Ollama { chat: chat_api }, echo).await
}

/// `POST /api/chat`.
pub async fn api_chat(
    State(s): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = async {
        let o = &read_object(&s, &headers, body).await?;
        let messages = match o.get("messages") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a.clone(),
            Some(_) => return Err(bad("messages must be a list")),
        };
        if messages.is_empty() {
            return Ok(load_answer(&s, o, true));
        }
        let mut out = common_fields(o)?;
        if let Some(t) = o.get("tools").filter(|t| !t.is_null()) {
            out.insert("tools".into(), t.clone());
        }
        let msgs = messages
            .iter()
            .map(message)
            .collect::<ApiResult<Vec<_>>>()?;
        as_chat(&s, tenant, o, out, msgs, true).await
    };
    answer.await.unwrap_or_else(error)
}

/// `POST /api/generate`: the prompt as a user turn of the chat template (with `system`), or as
/// given with `raw: true` (the client wrote the template's markup, which is then parsed as
/// control tokens: Ollama's raw mode is the request's explicit ask), or filled in the middle
/// between `prompt` and `suffix` with the model's FIM tokens.
pub async fn api_generate(
    State(s): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = async {
        let o = &read_object(&s, &headers, body).await?;
        no_images(o.get("images"))?;
        let text = |k: &str| -> ApiResult<String> {
            match o.get(k) {
                None | Some(Value::Null) => Ok(String::new()),
                Some(Value::String(t)) => Ok(t.clone()),
                Some(_) => Err(bad(format!("{k} must be a string"))),
            }
        };
        let (prompt, suffix, system) = (text("prompt")?, text("suffix")?, text("system")?);
        if !text("template")?.is_empty() {
            return Err(bad(
                "a request cannot supply a template: the server uses the model's own",
            ));
        }
        if o.get("context")
            .is_some_and(|c| c.as_array().is_some_and(|a| !a.is_empty()))
        {
            return Err(bad("context (deprecated in Ollama) is not supported: send the conversation to /api/chat"));
        }
        let raw = o.get("raw").and_then(Value::as_bool).unwrap_or(false);
        if prompt.is_empty() && suffix.is_empty() {
            return Ok(load_answer(&s, o, false));
        }
        let out = common_fields(o)?;
        let kind = Kind::Ollama { chat: false };
        if !raw && suffix.is_empty() {
            let mut msgs = Vec::new();
            if !system.is_empty() {
                msgs.push(json!({"role": "system", "content": system}));
            }
            msgs.push(json!({"role": "user", "content": prompt}));
            return as_chat(&s, tenant, o, out, msgs, false).await;
        }
        let common: Common = serde_json::from_value(Value::Object(out))
            .map_err(|e| bad(format!("the request is not valid: {e}")))?;
        let ids = if suffix.is_empty() {
            tokenize(&s, move |st, limit| {
                prompt_ids(&st.tokenizer, Prompt::Text(prompt), true, limit)
            })
            .await?
        } else {
            if raw {
                return Err(bad("raw and suffix cannot be combined"));
            }
            let input = FimInput {
                prefix: prompt,
                suffix,
                ..Default::default()
            };
            let n = common.max_tokens.unwrap_or(0);
            tokenize(&s, move |st, limit| fim_ids(st, &input, n, limit)).await?
        };
        let extra = Extra {
            grammar: common.grammar_spec()?,
            logprobs: common.logprobs(true)?,
            ..Default::default()
        };
        complete(s.clone(), kind, ids, &common, tenant, None, extra).await
    };
    answer.await.unwrap_or_else(error)
}

fn parameter_size(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.1}B", n as f64 / 1e9)
    } else {
        format!("{:.2}M", n as f64 / 1e6)
    }
}

fn details(c: &ModelCard) -> Value {
    json!({"parent_model": "", "format": "gguf", "family": c.architecture,
           "families": [c.architecture], "parameter_size": parameter_size(c.parameters),
           "quantization_level": c.quantization})
}

/// A stable id of the served file (name, size, time): not the file's sha256, which would mean
/// reading gigabytes at every start.
fn digest(s: &AppState) -> String {
    use std::hash::{Hash, Hasher};
    let c = &s.config.model;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&s.config.model_name, c.size, c.modified).hash(&mut h);
    let a = h.finish();
    a.hash(&mut h);
    format!("{a:016x}{:016x}", h.finish())
}

fn modified(s: &AppState) -> String {
    let t = s.config.model.modified.unwrap_or(std::time::UNIX_EPOCH);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// `GET /api/tags`: the served model.
pub async fn tags(State(s): State<Arc<AppState>>) -> Response {
    let c = &s.config.model;
    let name = listed_name(&s);
    axum::Json(json!({"models": [{
        "name": name, "model": name, "modified_at": modified(&s), "size": c.size,
        "digest": digest(&s), "details": details(c),
    }]}))
    .into_response()
}

/// `GET /api/ps`: the served model, loaded until the server stops.
pub async fn ps(State(s): State<Arc<AppState>>) -> Response {
    let c = &s.config.model;
    let name = listed_name(&s);
    axum::Json(json!({"models": [{
        "name": name, "model": name, "size": c.size, "digest": digest(&s),
        "details": details(c), "expires_at": "0001-01-01T00:00:00Z", "size_vram": 0,
        "context_length": s.scheduler.options().ctx,
    }]}))
    .into_response()
}

/// `GET /api/version`.
pub async fn version() -> Response {
    axum::Json(json!({ "version": API_VERSION })).into_response()
}

/// `POST /api/show`: the model's details, its chat template, what it can do (`capabilities`), and
/// the context a request gets here as `num_ctx` (a slot's).
pub async fn show(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let answer = async {
        read_object(&s, &headers, body).await?;
        let c = &s.config.model;
        let a = &c.architecture;
        let source = s.template.source().unwrap_or("");
        let mut caps = vec!["completion"];
        if source.contains("tools") {
            caps.push("tools");
        }
        // The model's Jinja template; with FIM tokens it ends with a Go-template comment naming
        // `.Suffix` (Ollama's templates are Go templates, and Continue's Ollama provider turns
        // fill-in-the-middle on when the template mentions `.Suffix`).
        let mut template = source.to_string();
        if s.tokenizer.fim.is_some() {
            caps.push("insert");
            template.push_str(
                "\n{{/* .Suffix: mens fills in the middle with the model's FIM tokens */}}",
            );
        }
        if source.contains(mens::think::OPEN) {
            caps.push("thinking");
        }
        let mut info = Map::new();
        info.insert("general.architecture".into(), json!(a));
        info.insert("general.parameter_count".into(), json!(c.parameters));
        info.insert(format!("{a}.context_length"), json!(c.context_length));
        info.insert(format!("{a}.embedding_length"), json!(c.embedding_length));
        info.insert(format!("{a}.block_count"), json!(c.block_count));
        Ok::<_, ApiError>(
            axum::Json(json!({
                "modelfile": "", "template": template,
                "parameters": format!("num_ctx {}", s.scheduler.options().ctx),
                "details": details(c), "model_info": info, "capabilities": caps,
                "modified_at": modified(&s),
            }))
            .into_response(),
        )
    };
    answer.await.unwrap_or_else(error)
}

fn done_reason(u: &Usage) -> &'static str {
    match u.finish {
        Finish::Stop => "stop",
        Finish::Length => "length",
    }
}

/// The counts and durations of the last object (nanoseconds).
fn stats(v: &mut Value, u: &Usage) {
    let ns = |d: std::time::Duration| d.as_nanos() as u64;
    let ttft = u.time_to_first_token.min(u.total);
    v["done"] = json!(true);
    v["done_reason"] = json!(done_reason(u));
    v["total_duration"] = json!(ns(u.total));
    v["load_duration"] = json!(0);
    v["prompt_eval_count"] = json!(u.prompt_tokens);
    v["prompt_eval_duration"] = json!(ns(ttft));
    v["eval_count"] = json!(u.completion_tokens);
    v["eval_duration"] = json!(ns(u.total - ttft));
}

/// A call as Ollama writes it: an id (as the OpenAI API's: the answer's id and the call's index),
/// the index, the arguments as an object.
fn call_json(m: &Meta, c: &ToolCall, i: usize) -> Value {
    let args: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
    json!({"id": m.call_id(i),
           "function": {"index": i, "name": c.name, "arguments": args}})
}

/// Whether this answer's reasoning goes apart (`think` asked, and the server splits it).
fn thinks(m: &Meta) -> Option<bool> {
    m.think.filter(|_| m.echo["think"] == json!(true))
}

fn head(m: &Meta) -> Value {
    json!({"model": m.model, "created_at": now_rfc3339()})
}

/// The whole answer as one object.
pub(crate) async fn whole(
    meta: Meta,
    mut rx: mpsc::UnboundedReceiver<Event>,
) -> ApiResult<Response> {
    let (text, lps, usage) = crate::sse::collect(&meta, &mut rx).await?;
    let (thinking, text) = mens::think::split_if(text, thinks(&meta));
    let mut v = head(&meta);
    if meta.logprobs {
        v["logprobs"] = json!(meta.token_entries(&lps));
    }
    if meta.kind == (Kind::Ollama { chat: true }) {
        let (content, calls) = match &meta.tools {
            Some(tools) => mens::tools::parse(&text, tools),
            None => (text, Vec::new()),
        };
        let mut msg = json!({"role": "assistant", "content": content});
        if !thinking.is_empty() {
            msg["thinking"] = json!(thinking);
        }
        if !calls.is_empty() {
            msg["tool_calls"] = calls
                .iter()
                .enumerate()
                .map(|(i, c)| call_json(&meta, c, i))
                .collect();
        }
        v["message"] = msg;
    } else {
        v["response"] = json!(text);
        if !thinking.is_empty() {
            v["thinking"] = json!(thinking);
        }
    }
    stats(&mut v, &usage);
    Ok(axum::Json(v).into_response())
}

/// The streamed answer: an object a line.
struct Lines {
    meta: Meta,
    chat: bool,
    pending: VecDeque<Bytes>,
    /// Log-probabilities of the text the next line carries.
    lps: Vec<TokenLogprobs>,
    calls: usize,
}

impl Lines {
    /// A line, with the log-probabilities of its text.
    fn line(&mut self, v: &mut Value) {
        if !self.lps.is_empty() {
            v["logprobs"] = json!(self.meta.token_entries(&self.lps));
            self.lps.clear();
        }
        self.pending.push_back(Bytes::from(format!("{v}\n")));
    }

    /// A part of the answer: text, reasoning or calls in the message (chat) or the response.
    fn part(&mut self, content: &str, extra: Option<(&str, Value)>) {
        let mut v = head(&self.meta);
        if self.chat {
            let mut msg = json!({"role": "assistant", "content": content});
            if let Some((k, x)) = extra {
                msg[k] = x;
            }
            v["message"] = msg;
        } else {
            v["response"] = json!(content);
            if let Some((k, x)) = extra {
                v[k] = x;
            }
        }
        v["done"] = json!(false);
        self.line(&mut v);
    }
}

impl crate::sse::EventSink for Lines {
    fn pending(&mut self) -> &mut VecDeque<Bytes> {
        &mut self.pending
    }

    fn text(&mut self, t: &str) {
        if !t.is_empty() {
            self.part(t, None);
        }
    }

    fn reasoning(&mut self, t: &str) {
        if !t.is_empty() {
            self.part("", Some(("thinking", json!(t))));
        }
    }

    fn think(&self) -> Option<bool> {
        thinks(&self.meta)
    }

    fn call(&mut self, c: ToolCall) {
        let call = call_json(&self.meta, &c, self.calls);
        self.calls += 1;
        self.part("", Some(("tool_calls", json!([call]))));
    }

    fn logprobs(&mut self, l: TokenLogprobs) {
        self.lps.push(l);
    }

    fn finish(&mut self, u: Usage) {
        self.meta.metrics.finished(&u);
        let mut v = head(&self.meta);
        if self.chat {
            v["message"] = json!({"role": "assistant", "content": ""});
        } else {
            v["response"] = json!("");
        }
        stats(&mut v, &u);
        self.line(&mut v);
    }

    fn error(&mut self, m: String) {
        self.lps.clear();
        self.line(&mut json!({ "error": m }));
    }
}

/// The answer as newline-delimited JSON.
pub(crate) fn stream(meta: Meta, rx: mpsc::UnboundedReceiver<Event>) -> Response {
    let chat = meta.kind == (Kind::Ollama { chat: true });
    let calls = match chat {
        true => meta.tools.clone().map(CallSplitter::new),
        false => None,
    };
    let lines = Lines {
        meta,
        chat,
        pending: VecDeque::new(),
        lps: Vec::new(),
        calls: 0,
    };
    let mut r = crate::sse::event_stream(lines, rx, calls);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    r
}
