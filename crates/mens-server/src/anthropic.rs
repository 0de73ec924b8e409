//! Anthropic's Messages API: `POST /v1/messages` and `/v1/messages/count_tokens`. A request is
//! translated to an OpenAI chat request (the same checks, template, tools and limits), and the
//! answer is written in Anthropic's shape: content blocks, `stop_reason`, and its stream events
//! (`message_start`, `content_block_*`, `message_delta`, `message_stop`). A reasoning model's
//! leading `<think>` block (split as the chat API splits it) is a `thinking` block; mens signs
//! nothing, so its `signature` is empty, and a `thinking` block sent back is the turn's reasoning.

use crate::api::{chat, chat_tokens, read_json};
use crate::guard::Tenant;
use crate::request::{ApiError, ApiResult, ChatRequest};
use crate::sse::{Kind, Meta};
use crate::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{Extension, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use mens::scheduler::{Event, Finish, Usage};
use mens::tools::{CallSplitter, ToolCall};
use serde_json::{json, Map, Value};
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::mpsc;

/// An error in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`.
fn error(e: ApiError) -> Response {
    let kind = match e.status.as_u16() {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        408 | 413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        _ => "api_error",
    };
    let mut r = (
        e.status,
        axum::Json(json!({"type": "error", "error": {"type": kind, "message": e.message}})),
    )
        .into_response();
    if e.status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut()
            .insert(header::RETRY_AFTER, crate::RETRY_AFTER);
    }
    r
}

fn bad(m: impl Into<String>) -> ApiError {
    ApiError::invalid(m)
}

/// A block's text, or the text blocks of a list joined (tool results, system prompts).
fn text_of(v: &Value, what: &str) -> ApiResult<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(blocks) => {
            let mut t = String::new();
            for b in blocks {
                match (b.get("type").and_then(Value::as_str), b.get("text")) {
                    (Some("text"), Some(Value::String(x))) => t.push_str(x),
                    (k, _) => {
                        return Err(bad(format!(
                            "{what}: blocks of type {} are not supported (text only)",
                            k.map(crate::request::clip).unwrap_or("(none)")
                        )))
                    }
                }
            }
            Ok(t)
        }
        _ => Err(bad(format!("{what} must be a string or a list of blocks"))),
    }
}

/// Claude Code (2.1.36 and later) opens the system prompt with a block
/// `x-anthropic-billing-header: cc_version=…; cch=…;` whose hash changes with every request: left
/// in, no request would share a cached prefix with the one before. It is billing telemetry for
/// Anthropic's servers, not instructions: dropped (as Ollama's launcher and vllm-mlx do).
fn without_billing_header(sys: &Value) -> std::borrow::Cow<'_, Value> {
    let billing = |b: &Value| {
        b.get("text")
            .and_then(Value::as_str)
            .is_some_and(|t| t.starts_with("x-anthropic-billing-header:"))
    };
    match sys {
        Value::Array(blocks) if blocks.first().is_some_and(billing) => {
            std::borrow::Cow::Owned(Value::Array(blocks[1..].to_vec()))
        }
        _ => std::borrow::Cow::Borrowed(sys),
    }
}

/// The `user` a request's prompt cache belongs to (with its API key), from `metadata.user_id`.
/// Claude Code writes there a JSON object of its device, account and session: the session is
/// left out, so a new session of the same device and account reads the system prompt and tools
/// (about 11,600 tokens) from the cache instead of prefilling them again.
fn cache_user(user_id: &str) -> String {
    let Ok(Value::Object(o)) = serde_json::from_str::<Value>(user_id) else {
        return user_id.to_string();
    };
    match (o.get("device_id"), o.get("account_uuid")) {
        (Some(Value::String(d)), Some(Value::String(a))) => format!("device:{d}/account:{a}"),
        _ => user_id.to_string(),
    }
}

/// The Anthropic request as an OpenAI chat request.
fn translate(v: &Value, count_only: bool) -> ApiResult<ChatRequest> {
    let o = v
        .as_object()
        .ok_or_else(|| bad("the request body must be a JSON object"))?;
    let mut out = Map::new();
    let mut msgs = Vec::new();
    if let Some(sys) = o.get("system") {
        let t = text_of(&without_billing_header(sys), "system")?;
        if !t.is_empty() {
            msgs.push(json!({"role": "system", "content": t}));
        }
    }
    let messages = o
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("messages: a list is required"))?;
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        // A system message within the conversation (instructions from that point on): a system
        // turn where the template has one.
        if role == "system" {
            let t = text_of(m.get("content").unwrap_or(&Value::Null), "system message")?;
            msgs.push(json!({"role": "system", "content": t}));
            continue;
        }
        if role != "user" && role != "assistant" {
            return Err(bad(format!(
                "messages: role must be \"user\", \"assistant\" or \"system\", got {:?}",
                crate::request::clip(role)
            )));
        }
        let blocks = match m.get("content") {
            Some(Value::String(s)) => {
                msgs.push(json!({"role": role, "content": s}));
                continue;
            }
            Some(Value::Array(b)) => b,
            _ => {
                return Err(bad(
                    "messages: content must be a string or a list of blocks",
                ))
            }
        };
        let mut text = String::new();
        let mut reasoning = String::new();
        let mut calls = Vec::new();
        let mut results = Vec::new();
        for b in blocks {
            match b.get("type").and_then(Value::as_str) {
                Some("text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
                // The reasoning of an earlier answer, sent back as the API asks; its signature
                // is not checked (mens signs nothing). A redacted block holds no text.
                Some("thinking") if role == "assistant" => {
                    reasoning.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or(""))
                }
                Some("redacted_thinking") if role == "assistant" => {}
                Some("tool_use") if role == "assistant" => {
                    let name = b.get("name").and_then(Value::as_str).unwrap_or("");
                    let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                    calls.push(json!({"id": b.get("id").cloned().unwrap_or(Value::Null),
                        "type": "function", "function": {"name": name, "arguments": input.to_string()}}));
                }
                Some("tool_result") if role == "user" => {
                    let mut t = text_of(b.get("content").unwrap_or(&Value::Null), "tool_result")?;
                    if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                        t = format!("Error: {t}");
                    }
                    results.push(json!({"role": "tool", "content": t,
                        "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(Value::Null)}));
                }
                Some(k) => {
                    return Err(bad(format!(
                        "messages: content blocks of type {:?} are not supported here",
                        crate::request::clip(k)
                    )))
                }
                None => return Err(bad("messages: a content block has no type")),
            }
        }
        // Tool results come first in a user turn (they answer the previous assistant turn).
        msgs.extend(results);
        if role == "assistant" {
            let mut a = json!({"role": "assistant", "content": text});
            if !reasoning.is_empty() {
                a["reasoning_content"] = json!(reasoning);
            }
            if !calls.is_empty() {
                a["tool_calls"] = json!(calls);
            }
            msgs.push(a);
        } else if !text.is_empty() {
            msgs.push(json!({"role": "user", "content": text}));
        }
    }
    out.insert("messages".into(), json!(msgs));
    match o.get("max_tokens") {
        Some(n) => {
            out.insert("max_tokens".into(), n.clone());
        }
        None if count_only => {}
        None => return Err(bad("max_tokens: this field is required")),
    }
    for (from, to) in [
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("stream", "stream"),
        ("stop_sequences", "stop"),
        ("model", "model"),
    ] {
        if let Some(x) = o.get(from).filter(|x| !x.is_null()) {
            out.insert(to.into(), x.clone());
        }
    }
    // Thinking on or off: the template's `enable_thinking` (Qwen3's switch). `adaptive` leaves
    // the choice to the model, which a thinking template's model makes by thinking;
    // `between_tools` is thinking off. `enabled`'s `budget_tokens` bounds the block (its closing
    // tag forced at the budget, as llama-server does).
    let thinking = o.get("thinking").filter(|t| !t.is_null());
    if let Some(t) = thinking {
        let on = match t.get("type").and_then(Value::as_str) {
            Some("enabled" | "adaptive") => true,
            Some("disabled" | "between_tools") => false,
            _ => {
                return Err(bad(
                    "thinking.type must be \"enabled\", \"adaptive\", \"disabled\" or \"between_tools\"",
                ))
            }
        };
        out.insert(
            "chat_template_kwargs".into(),
            json!({ "enable_thinking": on }),
        );
        if let Some(b) = t.get("budget_tokens").filter(|b| !b.is_null()) {
            match b.as_u64() {
                Some(n) => {
                    out.insert("thinking_budget_tokens".into(), json!(n));
                }
                None => return Err(bad("thinking.budget_tokens must be a number of tokens")),
            }
        }
    }
    if let Some(u) = o
        .get("metadata")
        .and_then(|m| m.get("user_id"))
        .and_then(Value::as_str)
    {
        out.insert("user".into(), json!(cache_user(u)));
    }
    if let Some(tools) = o.get("tools").and_then(Value::as_array) {
        let t: Vec<Value> = tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.get("name").cloned().unwrap_or(Value::Null),
                    "description": t.get("description").cloned().unwrap_or(json!("")),
                    "parameters": t.get("input_schema").cloned().unwrap_or_else(|| json!({"type": "object"})),
                }})
            })
            .collect();
        out.insert("tools".into(), json!(t));
    }
    if let Some(c) = o.get("tool_choice").filter(|c| !c.is_null()) {
        let choice = match c.get("type").and_then(Value::as_str) {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => {
                json!({"type": "function", "function": {"name": c.get("name").cloned().unwrap_or(Value::Null)}})
            }
            _ => return Err(bad("tool_choice.type must be auto, any, tool or none")),
        };
        out.insert("tool_choice".into(), choice);
        // Anthropic's default lets a forced answer make several calls.
        let one = c.get("disable_parallel_tool_use").and_then(Value::as_bool) == Some(true);
        out.insert("parallel_tool_calls".into(), json!(!one));
    }
    // Anthropic's default is greedy-ish 1.0; leave mens's sampler defaults when absent.
    let mut r: ChatRequest = serde_json::from_value(Value::Object(out))
        .map_err(|e| bad(format!("the request is not valid: {e}")))?;
    // Clients send a large `max_tokens` whatever the model (Claude Code: 32,000): an answer
    // ends where the context does (`stop_reason: "max_tokens"`) instead of being refused.
    r.common.max_tokens_bound = true;
    Ok(r)
}

pub async fn messages(
    State(s): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = async {
        let v: Value = read_json(&s, &headers, body).await?;
        let r = translate(&v, false)?;
        // `display: "omitted"`: thinking blocks come without their text.
        let omitted = v
            .get("thinking")
            .and_then(|t| t.get("display"))
            .and_then(Value::as_str)
            == Some("omitted");
        let echo = json!({ "omit_thinking": omitted });
        chat(s.clone(), tenant, r, Kind::Messages, echo).await
    };
    answer.await.unwrap_or_else(error)
}

pub async fn count_tokens(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = async {
        let v: Value = read_json(&s, &headers, body).await?;
        let r = translate(&v, true)?;
        let n = chat_tokens(&s, r).await?;
        Ok::<_, ApiError>(axum::Json(json!({ "input_tokens": n })).into_response())
    };
    answer.await.unwrap_or_else(error)
}

fn stop_reason(u: &Usage, calls: usize) -> &'static str {
    match (u.finish, &u.stop_sequence) {
        (Finish::Length, _) => "max_tokens",
        (Finish::Stop, _) if calls > 0 => "tool_use",
        (Finish::Stop, Some(_)) => "stop_sequence",
        (Finish::Stop, None) => "end_turn",
    }
}

/// Anthropic's usage: `input_tokens` are the prompt tokens not read from the cache (the prompt
/// is `input_tokens + cache_read_input_tokens`, as Anthropic counts).
fn usage_json(u: &Usage) -> Value {
    json!({"input_tokens": u.prompt_tokens.saturating_sub(u.cached_tokens),
           "output_tokens": u.completion_tokens,
           "cache_read_input_tokens": u.cached_tokens, "cache_creation_input_tokens": 0})
}

/// Whether this answer's thinking blocks go without their text (`display: "omitted"`).
fn omitted(m: &Meta) -> bool {
    m.echo["omit_thinking"] == json!(true)
}

fn tool_use(m: &Meta, c: &ToolCall, i: usize) -> Value {
    let input: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
    json!({"type": "tool_use", "id": format!("toolu_{}_{i}", m.id), "name": c.name, "input": input})
}

/// The whole answer as one message.
pub(crate) async fn whole(
    meta: Meta,
    mut rx: mpsc::UnboundedReceiver<Event>,
) -> ApiResult<Response> {
    let (text, _, usage) = crate::sse::collect(&meta, &mut rx).await?;
    let (reasoning, text) = mens::think::split_if(text, meta.think);
    let (content, calls) = match &meta.tools {
        Some(tools) => mens::tools::parse(&text, tools),
        None => (text, Vec::new()),
    };
    let mut blocks = Vec::new();
    if !reasoning.is_empty() {
        let shown = if omitted(&meta) {
            ""
        } else {
            reasoning.as_str()
        };
        blocks.push(json!({"type": "thinking", "thinking": shown, "signature": ""}));
    }
    // An empty text block only when there is nothing else (the answer was cut off in its
    // reasoning: the thinking block alone, as Anthropic's).
    if !content.is_empty() || blocks.is_empty() && calls.is_empty() {
        blocks.push(json!({"type": "text", "text": content}));
    }
    blocks.extend(calls.iter().enumerate().map(|(i, c)| tool_use(&meta, c, i)));
    Ok(axum::Json(json!({
        "id": meta.id, "type": "message", "role": "assistant", "model": meta.model,
        "content": blocks, "stop_reason": stop_reason(&usage, calls.len()),
        "stop_sequence": usage.stop_sequence, "usage": usage_json(&usage),
    }))
    .into_response())
}

struct Stream {
    meta: Meta,
    pending: VecDeque<Bytes>,
    /// Index of the next content block; whether a text or a thinking block is open.
    block: usize,
    text_open: bool,
    thinking_open: bool,
    n_calls: usize,
}

impl Stream {
    fn event(&mut self, name: &str, v: Value) {
        self.pending
            .push_back(Bytes::from(format!("event: {name}\ndata: {v}\n\n")));
    }

    /// Close an open thinking block: its (empty) signature, then its end.
    fn close_thinking(&mut self) {
        if self.thinking_open {
            self.thinking_open = false;
            let i = self.block;
            self.event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": i,
                       "delta": {"type": "signature_delta", "signature": ""}}),
            );
            self.event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": i}),
            );
            self.block += 1;
        }
    }

    fn close_text(&mut self) {
        self.close_thinking();
        if self.text_open {
            self.text_open = false;
            let i = self.block;
            self.event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": i}),
            );
            self.block += 1;
        }
    }
}

impl crate::sse::EventSink for Stream {
    fn pending(&mut self) -> &mut VecDeque<Bytes> {
        &mut self.pending
    }

    fn text(&mut self, t: &str) {
        if t.is_empty() {
            return;
        }
        self.close_thinking();
        if !self.text_open {
            self.text_open = true;
            let i = self.block;
            self.event(
                "content_block_start",
                json!({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}}),
            );
        }
        let i = self.block;
        self.event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": t}}),
        );
    }

    fn reasoning(&mut self, t: &str) {
        if t.is_empty() {
            return;
        }
        if !self.thinking_open {
            self.thinking_open = true;
            let i = self.block;
            self.event(
                "content_block_start",
                json!({"type": "content_block_start", "index": i,
                       "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
            );
        }
        if !omitted(&self.meta) {
            let i = self.block;
            self.event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": i,
                       "delta": {"type": "thinking_delta", "thinking": t}}),
            );
        }
    }

    fn think(&self) -> Option<bool> {
        self.meta.think
    }

    fn call(&mut self, c: ToolCall) {
        self.close_text();
        let i = self.block;
        let mut start = tool_use(&self.meta, &c, self.n_calls);
        let input = std::mem::replace(&mut start["input"], json!({}));
        self.event(
            "content_block_start",
            json!({"type": "content_block_start", "index": i, "content_block": start}),
        );
        self.event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": i,
                   "delta": {"type": "input_json_delta", "partial_json": input.to_string()}}),
        );
        self.event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": i}),
        );
        self.block += 1;
        self.n_calls += 1;
    }

    fn finish(&mut self, u: Usage) {
        self.meta.metrics.finished(&u);
        self.close_text();
        let reason = stop_reason(&u, self.n_calls);
        self.event(
            "message_delta",
            json!({"type": "message_delta",
                   "delta": {"stop_reason": reason, "stop_sequence": u.stop_sequence},
                   "usage": usage_json(&u)}),
        );
        self.event("message_stop", json!({"type": "message_stop"}));
    }

    fn error(&mut self, m: String) {
        self.event(
            "error",
            json!({"type": "error", "error": {"type": "api_error", "message": m}}),
        );
    }
}

/// The answer as Anthropic's server-sent events.
pub(crate) fn stream(
    meta: Meta,
    rx: mpsc::UnboundedReceiver<Event>,
    prompt_tokens: usize,
) -> Response {
    let calls = meta.tools.clone().map(CallSplitter::new);
    let mut st = Stream {
        meta,
        pending: VecDeque::new(),
        block: 0,
        text_open: false,
        thinking_open: false,
        n_calls: 0,
    };
    let m = &st.meta;
    let start = json!({"type": "message_start", "message": {
        "id": m.id, "type": "message", "role": "assistant", "model": m.model, "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}});
    st.event("message_start", start);
    st.event("ping", json!({"type": "ping"}));
    crate::sse::event_stream(st, rx, calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thinking_of(r: &ChatRequest) -> Option<Value> {
        r.common
            .chat_template_kwargs
            .as_ref()
            .map(|k| k["enable_thinking"].clone())
    }

    /// An assistant's thinking blocks are its turn's reasoning (a redacted one adds nothing);
    /// every thinking type Anthropic defines maps to the template's switch, others are refused.
    #[test]
    fn thinking_blocks_and_types_translate() {
        let body = |thinking: Value| {
            json!({"max_tokens": 8, "thinking": thinking, "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "say hello", "signature": "x"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "hello"}]},
                {"role": "user", "content": "again"}]})
        };
        let r = translate(&body(json!({"type": "adaptive"})), false).unwrap();
        let a = &r.messages[1];
        assert_eq!(a.role, "assistant");
        assert_eq!(a.reasoning_content.as_deref(), Some("say hello"));
        assert!(matches!(&a.content, Some(crate::request::Content::Text(t)) if t == "hello"));
        assert_eq!(thinking_of(&r), Some(json!(true)));
        for (t, on) in [
            ("enabled", Some(json!(true))),
            ("disabled", Some(json!(false))),
            ("between_tools", Some(json!(false))),
        ] {
            let r = translate(&body(json!({ "type": t })), false).unwrap();
            assert_eq!(thinking_of(&r), on, "{t}");
        }
        assert!(thinking_of(&translate(&body(Value::Null), false).unwrap()).is_none());
        let e = translate(&body(json!({"type": "sometimes"})), false)
            .err()
            .unwrap();
        assert!(e.message.contains("thinking.type"), "{}", e.message);
        // Thinking is an assistant's: in a user turn it is refused.
        let user = json!({"max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "thinking", "thinking": "x", "signature": ""}]}]});
        assert!(translate(&user, false).is_err());
    }

    /// A system message within the conversation stays where it is, as a system turn; a large
    /// `max_tokens` is a bound (cut to the context), not a refusal; other roles are refused.
    #[test]
    fn mid_conversation_system_messages_and_max_tokens() {
        let r = translate(
            &json!({"max_tokens": 32000, "system": "be terse", "messages": [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": [{"type": "text", "text": "now in French",
                                                 "cache_control": {"type": "ephemeral"}}]},
                {"role": "user", "content": "again"}]}),
            false,
        )
        .unwrap();
        let roles: Vec<&str> = r.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "system", "user"]);
        // Claude Code's per-request billing block, first in the system prompt, is dropped (only
        // there: the same text later is the client's).
        let sys = |blocks: Value| {
            let r = translate(
                &json!({"max_tokens": 8, "system": blocks,
                "messages": [{"role": "user", "content": "hi"}]}),
                false,
            )
            .unwrap();
            match &r.messages[0].content {
                Some(crate::request::Content::Text(t)) => t.clone(),
                _ => panic!("no system text"),
            }
        };
        let header = json!({"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.bf1; cch=1a2b3;"});
        let rules = json!({"type": "text", "text": "You are a coding agent."});
        assert_eq!(sys(json!([header, rules])), "You are a coding agent.");
        assert!(sys(json!([rules, header])).contains("cch=1a2b3"));
        // Claude Code's sessions of one device and account share a cache tenant; other users
        // are kept as sent.
        let user = |id: &str| {
            translate(
                &json!({"max_tokens": 8, "metadata": {"user_id": id},
                "messages": [{"role": "user", "content": "hi"}]}),
                false,
            )
            .unwrap()
            .common
            .user
            .unwrap()
        };
        let a = user(r#"{"device_id":"d1","account_uuid":"","session_id":"s1"}"#);
        assert_eq!(
            a,
            user(r#"{"device_id":"d1","account_uuid":"","session_id":"s2"}"#)
        );
        assert_ne!(
            a,
            user(r#"{"device_id":"d2","account_uuid":"","session_id":"s1"}"#)
        );
        assert_ne!(
            a,
            user(r#"{"device_id":"d1","account_uuid":"a","session_id":"s1"}"#)
        );
        assert_eq!(user("alice"), "alice");
        assert!(
            matches!(&r.messages[2].content, Some(crate::request::Content::Text(t)) if t == "now in French")
        );
        assert_eq!(r.common.max_tokens(1000, 4096, None, false).unwrap(), 3096);
        assert_eq!(
            r.common.max_tokens(1000, 40000, Some(512), false).unwrap(),
            512
        );
        assert!(r.common.max_tokens(4096, 4096, None, false).is_err());
        let e = translate(
            &json!({"max_tokens": 8, "messages": [{"role": "tool", "content": "x"}]}),
            false,
        )
        .err()
        .unwrap();
        assert!(e.message.contains("role"), "{}", e.message);
    }
}
