//! OpenAI's Responses API, stateless: `POST /v1/responses` with `input` (a string or items:
//! messages, `function_call`, `function_call_output`, `custom_tool_call`(`_output`), `reasoning`),
//! `instructions`, `tools` (function, custom as a function of one `input` string, namespace as
//! `namespace.name`; tools the API's servers run are not offered), `tool_choice`, `text.format`
//! (json_schema / json_object), `reasoning.effort`,
//! `max_output_tokens`, `stream`. Like `anthropic`, the request becomes a chat request; the answer
//! is written as output items (a reasoning model's leading `<think>` block as a `reasoning` item),
//! or as the API's stream events. Nothing is stored: `previous_response_id` is refused.

use crate::api::{chat, read_json};
use crate::guard::Tenant;
use crate::request::{ApiError, ApiResult, ChatRequest};
use crate::sse::{Kind, Meta};
use crate::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use mens::scheduler::{Event, Finish, Usage};
use mens::tools::{CallSplitter, ToolCall};
use serde_json::{json, Map, Value};
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::mpsc;

fn bad(m: impl Into<String>) -> ApiError {
    ApiError::invalid(m)
}

/// A message item's text: a string, or `input_text` / `output_text` / `text` parts.
fn text_of(v: &Value) -> ApiResult<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut t = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("input_text" | "output_text" | "text"), Some(Value::String(x))) => {
                        t.push_str(x)
                    }
                    (k, _) => {
                        return Err(bad(format!(
                            "input: content parts of type {} are not supported (text only)",
                            k.map(crate::request::clip).unwrap_or("(none)")
                        ))
                        .param("input"))
                    }
                }
            }
            Ok(t)
        }
        _ => Err(bad("input: content must be a string or a list of parts").param("input")),
    }
}

/// Tool types the API's own servers run (their calls are items `<type>_call`).
const HOSTED: [&str; 9] = [
    "web_search",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "file_search",
    "code_interpreter",
    "image_generation",
    "mcp",
    "tool_search",
    "web_fetch",
];

/// An assistant turn with the reasoning items' text that came before it (taken: it is this
/// turn's alone).
fn with_reasoning(mut turn: Value, reasoning: &mut String) -> Value {
    if !reasoning.is_empty() {
        turn["reasoning_content"] = json!(std::mem::take(reasoning));
    }
    turn
}

/// A namespaced tool's name as the model sees it.
fn flat_name(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) if !ns.is_empty() => format!("{ns}.{name}"),
        _ => name.to_string(),
    }
}

/// A function or custom tool (in a namespace or not) as a chat tool. A custom tool takes free
/// text: a function of one `input` string, its format (a grammar, when it has one) described.
fn chat_tool(namespace: Option<&str>, tool: &Value) -> ApiResult<Value> {
    let name = tool.get("name").and_then(Value::as_str).unwrap_or("");
    let mut description = tool
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let parameters = match tool.get("type").and_then(Value::as_str) {
        Some("function") => tool
            .get("parameters")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"})),
        Some("custom") => {
            let f = tool.get("format");
            if let (Some(syntax), Some(def)) = (
                f.and_then(|f| f.get("syntax")).and_then(Value::as_str),
                f.and_then(|f| f.get("definition")).and_then(Value::as_str),
            ) {
                description.push_str(&format!(
                    "\nThe input follows this {syntax} grammar:\n{def}"
                ));
            }
            json!({"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]})
        }
        k => {
            return Err(bad(format!(
                "tools: a namespace holds function and custom tools, not {:?}",
                crate::request::clip(k.unwrap_or("(none)"))
            ))
            .param("tools"))
        }
    };
    Ok(json!({"type": "function", "function": {
        "name": flat_name(namespace, name), "description": description, "parameters": parameters}}))
}

/// Where a call of the flattened name `flat` goes back to, by the request's tools: its
/// namespace, its own name, and whether it is a custom tool's.
fn call_target(echo: &Value, flat: &str) -> (Option<String>, String, bool) {
    for t in echo["tools"].as_array().into_iter().flatten() {
        let custom = |t: &Value| t["type"] == "custom";
        if t["type"] == "namespace" {
            let ns = t["name"].as_str().unwrap_or("");
            for inner in t["tools"].as_array().into_iter().flatten() {
                let name = inner["name"].as_str().unwrap_or("");
                if flat_name(Some(ns), name) == flat {
                    return (Some(ns.to_string()), name.to_string(), custom(inner));
                }
            }
        } else if t["name"] == flat {
            return (None, flat.to_string(), custom(t));
        }
    }
    (None, flat.to_string(), false)
}

/// The request as a chat request body, and the request's own fields echoed in the answer.
fn translate(v: &Value) -> ApiResult<(Value, Value)> {
    let o = v
        .as_object()
        .ok_or_else(|| bad("the request body must be a JSON object"))?;
    if o.get("previous_response_id").is_some_and(|x| !x.is_null()) {
        return Err(bad(
            "previous_response_id is not supported: this server stores no responses; send the whole conversation in input",
        )
        .param("previous_response_id"));
    }
    let mut msgs: Vec<Value> = Vec::new();
    // A reasoning item's text, kept for the assistant turn that follows it.
    let mut reasoning = String::new();
    if let Some(i) = o.get("instructions").and_then(Value::as_str) {
        msgs.push(json!({"role": "system", "content": i}));
    }
    match o.get("input") {
        Some(Value::String(s)) => msgs.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for it in items {
                match it.get("type").and_then(Value::as_str).unwrap_or("message") {
                    "message" => {
                        let role = it.get("role").and_then(Value::as_str).unwrap_or("user");
                        let role = if role == "developer" { "system" } else { role };
                        let content = text_of(it.get("content").unwrap_or(&Value::Null))?;
                        let m = json!({"role": role, "content": content});
                        msgs.push(if role == "assistant" {
                            with_reasoning(m, &mut reasoning)
                        } else {
                            m
                        });
                    }
                    // An earlier answer's reasoning, sent back as the API asks: its text (or its
                    // summary) goes to the next assistant turn; encrypted content is not read.
                    "reasoning" => {
                        for key in ["content", "summary"] {
                            for p in it.get(key).and_then(Value::as_array).into_iter().flatten() {
                                if let Some(t) = p.get("text").and_then(Value::as_str) {
                                    reasoning.push_str(t);
                                }
                            }
                            if !reasoning.is_empty() {
                                break;
                            }
                        }
                    }
                    kind @ ("function_call" | "custom_tool_call") => {
                        let name = flat_name(
                            it.get("namespace").and_then(Value::as_str),
                            it.get("name").and_then(Value::as_str).unwrap_or(""),
                        );
                        // A custom tool's call is a function call with one `input` string.
                        let arguments = if kind == "custom_tool_call" {
                            json!(
                                json!({"input": it.get("input").cloned().unwrap_or(json!(""))})
                                    .to_string()
                            )
                        } else {
                            it.get("arguments").cloned().unwrap_or(json!("{}"))
                        };
                        let call = json!({"id": it.get("call_id").cloned().unwrap_or(Value::Null),
                            "type": "function", "function": {"name": name, "arguments": arguments}});
                        // Consecutive calls belong to one assistant turn.
                        match msgs.last_mut() {
                            Some(m)
                                if m["role"] == "assistant" && m.get("tool_calls").is_some() =>
                            {
                                if let Some(a) = m["tool_calls"].as_array_mut() {
                                    a.push(call)
                                }
                            }
                            _ => msgs.push(with_reasoning(
                                json!({"role": "assistant", "content": "", "tool_calls": [call]}),
                                &mut reasoning,
                            )),
                        }
                    }
                    // Calls of tools the server would have run (see HOSTED): nothing here ran
                    // them, so there is nothing to hand the template.
                    k if k.strip_suffix("_call").is_some_and(|h| HOSTED.contains(&h)) => {}
                    "function_call_output" | "custom_tool_call_output" => {
                        let out = match it.get("output") {
                            Some(Value::String(s)) => s.clone(),
                            Some(x) => text_of(x)?,
                            None => String::new(),
                        };
                        msgs.push(json!({"role": "tool", "content": out,
                            "tool_call_id": it.get("call_id").cloned().unwrap_or(Value::Null)}));
                    }
                    k => {
                        return Err(bad(format!(
                            "input: items of type {:?} are not supported",
                            crate::request::clip(k)
                        ))
                        .param("input"))
                    }
                }
            }
        }
        _ => return Err(bad("input: a string or a list of items is required").param("input")),
    }
    let mut out = Map::new();
    out.insert("messages".into(), json!(msgs));
    for (from, to) in [
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("stream", "stream"),
        ("user", "user"),
        ("model", "model"),
        ("parallel_tool_calls", "parallel_tool_calls"),
    ] {
        if let Some(x) = o.get(from).filter(|x| !x.is_null()) {
            out.insert(to.into(), x.clone());
        }
    }
    if let Some(tools) = o.get("tools").and_then(Value::as_array) {
        let mut t = Vec::new();
        for tool in tools {
            match tool.get("type").and_then(Value::as_str).unwrap_or("") {
                "function" | "custom" => t.push(chat_tool(None, tool)?),
                // A namespace's tools are offered as `namespace.name`.
                "namespace" => {
                    let ns = tool.get("name").and_then(Value::as_str).unwrap_or("");
                    for inner in tool.get("tools").and_then(Value::as_array).into_iter().flatten() {
                        t.push(chat_tool(Some(ns), inner)?);
                    }
                }
                // Tools the API's own servers run: a local server runs none of them, so the
                // model is not offered them (rather than the request refused).
                k if HOSTED.contains(&k) => {}
                k => {
                    return Err(bad(format!(
                        "tools: {:?} tools are not supported (function, custom and namespace tools are)",
                        crate::request::clip(k)
                    ))
                    .param("tools"))
                }
            }
        }
        if !t.is_empty() {
            out.insert("tools".into(), json!(t));
        }
    }
    if let Some(c) = o.get("tool_choice").filter(|c| !c.is_null()) {
        let choice = match c {
            Value::String(_) => c.clone(),
            _ => {
                let name = flat_name(
                    c.get("namespace").and_then(Value::as_str),
                    c.get("name").and_then(Value::as_str).unwrap_or(""),
                );
                json!({"type": "function", "function": {"name": name}})
            }
        };
        out.insert("tool_choice".into(), choice);
    }
    if let Some(f) = o.get("text").and_then(|t| t.get("format")) {
        let rf = match f.get("type").and_then(Value::as_str) {
            Some("json_schema") => json!({"type": "json_schema", "json_schema": {
                "name": f.get("name").cloned().unwrap_or(json!("schema")),
                "schema": f.get("schema").cloned().unwrap_or_else(|| json!({}))}}),
            Some(k @ ("text" | "json_object")) => json!({ "type": k }),
            _ => {
                return Err(
                    bad("text.format.type must be text, json_object or json_schema").param("text"),
                )
            }
        };
        out.insert("response_format".into(), rf);
    }
    // `reasoning.effort`: "none" turns a thinking template's reasoning off (`enable_thinking`), any
    // other effort on; the effort itself is the template's `reasoning_effort` (gpt-oss reads it).
    let effort = o
        .get("reasoning")
        .and_then(|r| r.get("effort"))
        .filter(|e| !e.is_null());
    if let Some(e) = effort {
        let e = e
            .as_str()
            .ok_or_else(|| bad("reasoning.effort must be a string").param("reasoning"))?;
        if !matches!(e, "none" | "minimal" | "low" | "medium" | "high" | "xhigh") {
            return Err(
                bad("reasoning.effort must be none, minimal, low, medium, high or xhigh")
                    .param("reasoning"),
            );
        }
        out.insert(
            "chat_template_kwargs".into(),
            json!({"enable_thinking": e != "none", "reasoning_effort": e}),
        );
    }
    let summary = o.get("reasoning").and_then(|r| r.get("summary"));
    let echo = json!({
        "reasoning": {"effort": effort.cloned().unwrap_or(Value::Null),
                      "summary": summary.cloned().unwrap_or(Value::Null)},
        "instructions": o.get("instructions").cloned().unwrap_or(Value::Null),
        "max_output_tokens": o.get("max_output_tokens").cloned().unwrap_or(Value::Null),
        "temperature": o.get("temperature").cloned().unwrap_or(Value::Null),
        "top_p": o.get("top_p").cloned().unwrap_or(Value::Null),
        "tools": o.get("tools").cloned().unwrap_or(json!([])),
        "tool_choice": o.get("tool_choice").cloned().unwrap_or(json!("auto")),
        "text": o.get("text").cloned().unwrap_or(json!({"format": {"type": "text"}})),
        "metadata": o.get("metadata").cloned().unwrap_or(json!({})),
        "user": o.get("user").cloned().unwrap_or(Value::Null),
        "parallel_tool_calls": o.get("parallel_tool_calls").cloned().unwrap_or(json!(false)),
    });
    Ok((Value::Object(out), echo))
}

/// A Responses request as a chat request, and the fields its answer echoes.
fn chat_request(v: &Value) -> ApiResult<(ChatRequest, Value)> {
    let (chat_body, echo) = translate(v)?;
    let r = serde_json::from_value(chat_body)
        .map_err(|e| bad(format!("the request is not valid: {e}")))?;
    Ok((r, echo))
}

pub async fn responses(
    State(s): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = async {
        let v: Value = read_json(&s, &headers, body).await?;
        let (r, echo) = chat_request(&v)?;
        chat(s.clone(), tenant, r, Kind::Responses, echo).await
    };
    answer.await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/responses/input_tokens` (OpenAI's input token count): the prompt length of a
/// Responses request.
pub async fn input_tokens(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = async {
        let v: Value = read_json(&s, &headers, body).await?;
        let (r, _) = chat_request(&v)?;
        let n = crate::api::chat_tokens(&s, r).await?;
        Ok::<_, ApiError>(crate::api::input_tokens_json(n))
    };
    answer.await.unwrap_or_else(IntoResponse::into_response)
}

fn message_item(m: &Meta, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": format!("msg_{}", m.id), "status": status, "role": "assistant",
           "content": if status == "in_progress" { json!([]) } else {
               json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]) }})
}

fn reasoning_item(m: &Meta, text: &str, status: &str) -> Value {
    json!({"type": "reasoning", "id": format!("rs_{}", m.id), "status": status, "summary": [],
           "content": if status == "in_progress" { json!([]) } else {
               json!([{"type": "reasoning_text", "text": text}]) }})
}

/// A call as an output item: a `function_call`, or a `custom_tool_call` with its `input`, under
/// its namespace when it has one.
fn call_item(m: &Meta, c: &ToolCall, i: usize, status: &str) -> Value {
    let (namespace, name, custom) = call_target(&m.echo, &c.name);
    let done = status != "in_progress";
    let mut item = if custom {
        let input = serde_json::from_str::<Value>(&c.arguments)
            .ok()
            .and_then(|a| a.get("input").and_then(Value::as_str).map(str::to_string))
            .unwrap_or_default();
        json!({"type": "custom_tool_call", "id": format!("ctc_{}_{i}", m.id),
               "call_id": m.call_id(i), "name": name,
               "input": if done { input } else { String::new() }, "status": status})
    } else {
        json!({"type": "function_call", "id": format!("fc_{}_{i}", m.id),
               "call_id": m.call_id(i), "name": name,
               "arguments": if done { c.arguments.as_str() } else { "" }, "status": status})
    };
    if let Some(ns) = namespace {
        item["namespace"] = json!(ns);
    }
    item
}

/// The whole response object (`status` in_progress while streaming starts).
fn response_json(m: &Meta, echo: &Value, output: Vec<Value>, u: Option<&Usage>) -> Value {
    let (status, incomplete) = match u.map(|u| u.finish) {
        None => ("in_progress", Value::Null),
        Some(Finish::Length) => ("incomplete", json!({"reason": "max_output_tokens"})),
        Some(Finish::Stop) => ("completed", Value::Null),
    };
    let mut r = json!({
        "id": format!("resp_{}", m.id), "object": "response", "created_at": m.created,
        "status": status, "error": null, "incomplete_details": incomplete, "model": m.model,
        "output": output, "previous_response_id": null,
        "store": false, "truncation": "disabled",
        "usage": u.map(|u| json!({
            "input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
            "total_tokens": u.prompt_tokens + u.completion_tokens})),
    });
    if let (Some(r), Some(e)) = (r.as_object_mut(), echo.as_object()) {
        for (k, v) in e {
            r.insert(k.clone(), v.clone());
        }
    }
    r
}

fn output_of(m: &Meta, text: String) -> Vec<Value> {
    let (reasoning, text) = mens::think::split_if(text, m.think);
    let (content, calls) = match &m.tools {
        Some(tools) => mens::tools::parse(&text, tools),
        None => (text, Vec::new()),
    };
    let mut out = Vec::new();
    if !reasoning.is_empty() {
        out.push(reasoning_item(m, &reasoning, "completed"));
    }
    if !content.is_empty() || out.is_empty() && calls.is_empty() {
        out.push(message_item(m, &content, "completed"));
    }
    out.extend(
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| call_item(m, c, i, "completed")),
    );
    out
}

pub(crate) async fn whole(
    meta: Meta,
    mut rx: mpsc::UnboundedReceiver<Event>,
) -> ApiResult<Response> {
    let (text, _, usage) = crate::sse::collect(&meta, &mut rx).await?;
    let output = output_of(&meta, text);
    Ok(axum::Json(response_json(&meta, &meta.echo, output, Some(&usage))).into_response())
}

struct Stream {
    meta: Meta,
    pending: VecDeque<Bytes>,
    seq: u64,
    /// The open message item: its output index and text so far.
    msg: Option<(usize, String)>,
    /// The open reasoning item: its output index and text so far.
    thought: Option<(usize, String)>,
    items: Vec<Value>,
    n_calls: usize,
}

impl Stream {
    fn event(&mut self, mut v: Value) {
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        let name = v["type"].as_str().unwrap_or("").to_string();
        self.pending
            .push_back(Bytes::from(format!("event: {name}\ndata: {v}\n\n")));
    }

    fn open_message(&mut self) {
        let id = format!("msg_{}", self.meta.id);
        if self.msg.is_none() {
            let i = self.items.len();
            self.msg = Some((i, String::new()));
            let item = message_item(&self.meta, "", "in_progress");
            self.event(
                json!({"type": "response.output_item.added", "output_index": i, "item": item}),
            );
            self.event(json!({"type": "response.content_part.added", "item_id": id, "output_index": i,
                "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}));
        }
    }

    fn close_reasoning(&mut self) {
        if let Some((i, text)) = self.thought.take() {
            let id = format!("rs_{}", self.meta.id);
            self.event(
                json!({"type": "response.reasoning_text.done", "item_id": id, "output_index": i,
                "content_index": 0, "text": text}),
            );
            self.event(
                json!({"type": "response.content_part.done", "item_id": id, "output_index": i,
                "content_index": 0, "part": {"type": "reasoning_text", "text": text}}),
            );
            let item = reasoning_item(&self.meta, &text, "completed");
            self.event(
                json!({"type": "response.output_item.done", "output_index": i, "item": item}),
            );
            self.items.push(item);
        }
    }

    fn close_text(&mut self) {
        self.close_reasoning();
        if let Some((i, text)) = self.msg.take() {
            let id = format!("msg_{}", self.meta.id);
            self.event(
                json!({"type": "response.output_text.done", "item_id": id, "output_index": i,
                "content_index": 0, "text": text, "logprobs": []}),
            );
            self.event(json!({"type": "response.content_part.done", "item_id": id, "output_index": i,
                "content_index": 0, "part": {"type": "output_text", "text": text, "annotations": []}}));
            let item = message_item(&self.meta, &text, "completed");
            self.event(
                json!({"type": "response.output_item.done", "output_index": i, "item": item}),
            );
            self.items.push(item);
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
        self.close_reasoning();
        self.open_message();
        let id = format!("msg_{}", self.meta.id);
        let (i, acc) = self.msg.as_mut().expect("open message");
        acc.push_str(t);
        let i = *i;
        self.event(
            json!({"type": "response.output_text.delta", "item_id": id, "output_index": i,
            "content_index": 0, "delta": t, "logprobs": []}),
        );
    }

    fn reasoning(&mut self, t: &str) {
        if t.is_empty() {
            return;
        }
        let id = format!("rs_{}", self.meta.id);
        if self.thought.is_none() {
            let i = self.items.len();
            self.thought = Some((i, String::new()));
            let item = reasoning_item(&self.meta, "", "in_progress");
            self.event(
                json!({"type": "response.output_item.added", "output_index": i, "item": item}),
            );
            self.event(
                json!({"type": "response.content_part.added", "item_id": id, "output_index": i,
                "content_index": 0, "part": {"type": "reasoning_text", "text": ""}}),
            );
        }
        let (i, acc) = self.thought.as_mut().expect("open reasoning");
        acc.push_str(t);
        let i = *i;
        self.event(
            json!({"type": "response.reasoning_text.delta", "item_id": id, "output_index": i,
            "content_index": 0, "delta": t}),
        );
    }

    fn think(&self) -> Option<bool> {
        self.meta.think
    }

    fn call(&mut self, c: ToolCall) {
        self.close_text();
        let i = self.items.len();
        let n = self.n_calls;
        self.n_calls += 1;
        let started = call_item(&self.meta, &c, n, "in_progress");
        let id = started["id"].clone();
        self.event(
            json!({"type": "response.output_item.added", "output_index": i, "item": started}),
        );
        let item = call_item(&self.meta, &c, n, "completed");
        if item["type"] == "custom_tool_call" {
            let input = item["input"].clone();
            self.event(
                json!({"type": "response.custom_tool_call_input.delta", "item_id": id,
                "output_index": i, "delta": input}),
            );
            self.event(
                json!({"type": "response.custom_tool_call_input.done", "item_id": id,
                "output_index": i, "input": input}),
            );
        } else {
            self.event(
                json!({"type": "response.function_call_arguments.delta", "item_id": id,
                "output_index": i, "delta": c.arguments}),
            );
            self.event(
                json!({"type": "response.function_call_arguments.done", "item_id": id,
                "output_index": i, "arguments": c.arguments, "name": item["name"]}),
            );
        }
        self.event(json!({"type": "response.output_item.done", "output_index": i, "item": item}));
        self.items.push(item);
    }

    fn finish(&mut self, u: Usage) {
        self.meta.metrics.finished(&u);
        self.close_text();
        if self.items.is_empty() {
            self.open_message();
            self.close_text();
        }
        let r = response_json(&self.meta, &self.meta.echo, self.items.clone(), Some(&u));
        // `response.completed` also when the status is incomplete: the SDKs' stream
        // helpers wait for it (vLLM does the same).
        self.event(json!({"type": "response.completed", "response": r}));
    }

    fn error(&mut self, m: String) {
        self.event(json!({"type": "error", "code": "server_error", "message": m, "param": null}));
    }
}

pub(crate) fn stream(meta: Meta, rx: mpsc::UnboundedReceiver<Event>) -> Response {
    let calls = meta.tools.clone().map(CallSplitter::new);
    let mut st = Stream {
        meta,
        pending: VecDeque::new(),
        seq: 0,
        msg: None,
        thought: None,
        items: Vec::new(),
        n_calls: 0,
    };
    let r = response_json(&st.meta, &st.meta.echo, vec![], None);
    st.event(json!({"type": "response.created", "response": r}));
    let r = response_json(&st.meta, &st.meta.echo, vec![], None);
    st.event(json!({"type": "response.in_progress", "response": r}));
    crate::sse::event_stream(st, rx, calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reasoning item sent back is the next assistant turn's reasoning (a message's or a
    /// call's); `reasoning.effort` reaches the template, "none" turning thinking off.
    #[test]
    fn reasoning_items_and_effort_translate() {
        let (body, echo) = translate(&json!({"reasoning": {"effort": "none"}, "input": [
            {"type": "message", "role": "user", "content": "weather?"},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "call the tool"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "-3"},
            {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "answer"}]},
            {"type": "message", "role": "assistant", "content": "It is -3."},
            {"type": "message", "role": "user", "content": "thanks"}]}))
        .unwrap();
        let m = body["messages"].as_array().unwrap();
        assert_eq!(m[1]["reasoning_content"], "call the tool", "{body}");
        assert_eq!(m[1]["tool_calls"][0]["function"]["name"], "get_weather");
        assert_eq!(m[3]["reasoning_content"], "answer", "{body}");
        assert_eq!(m[3]["content"], "It is -3.");
        assert!(m[4].get("reasoning_content").is_none());
        assert_eq!(
            body["chat_template_kwargs"],
            json!({"enable_thinking": false, "reasoning_effort": "none"})
        );
        assert_eq!(echo["reasoning"]["effort"], "none");
        let (body, _) = translate(&json!({"input": "x", "reasoning": {"effort": "high"}})).unwrap();
        assert_eq!(body["chat_template_kwargs"]["enable_thinking"], true);
        assert!(translate(&json!({"input": "x", "reasoning": {"effort": "max"}})).is_err());
    }

    /// Codex's tools: functions, a namespace of functions (offered as `namespace.name`), a custom
    /// tool (a function of one `input` string, its grammar described) and a hosted web search (not
    /// offered); calls come back under their namespace, a custom tool's as `custom_tool_call`; the
    /// same calls sent back become the template's calls.
    #[test]
    fn namespace_custom_and_hosted_tools_translate() {
        let tools = json!([
            {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
            {"type": "namespace", "name": "agents", "description": "sub-agents", "tools": [
                {"type": "function", "name": "close_agent", "parameters": {"type": "object"}}]},
            {"type": "custom", "name": "apply_patch", "description": "Edit files.",
             "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
            {"type": "web_search", "external_web_access": false}]);
        let (body, echo) = translate(&json!({"tools": tools, "input": [
            {"type": "message", "role": "user", "content": "go"},
            {"type": "function_call", "namespace": "agents", "name": "close_agent",
             "call_id": "c1", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "closed"},
            {"type": "custom_tool_call", "name": "apply_patch", "call_id": "c2", "input": "*** Begin"},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"},
            {"type": "web_search_call", "id": "ws_1", "status": "completed"}]}))
        .unwrap();
        let names: Vec<&str> = body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["exec_command", "agents.close_agent", "apply_patch"]);
        let patch = &body["tools"][2]["function"];
        assert!(patch["description"]
            .as_str()
            .unwrap()
            .contains("start: /.+/"));
        assert_eq!(patch["parameters"]["required"], json!(["input"]));
        let m = body["messages"].as_array().unwrap();
        assert_eq!(m.len(), 5, "{body}");
        assert_eq!(
            m[1]["tool_calls"][0]["function"]["name"],
            "agents.close_agent"
        );
        assert_eq!(m[3]["tool_calls"][0]["function"]["name"], "apply_patch");
        let args: Value = serde_json::from_str(
            m[3]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(args, json!({"input": "*** Begin"}));
        assert_eq!(m[4]["role"], "tool");
        assert_eq!(
            call_target(&echo, "agents.close_agent"),
            (Some("agents".into()), "close_agent".into(), false)
        );
        assert_eq!(
            call_target(&echo, "apply_patch"),
            (None, "apply_patch".into(), true)
        );
        assert_eq!(
            call_target(&echo, "exec_command"),
            (None, "exec_command".into(), false)
        );
        // A tool the client would run but this API shape does not describe: refused by name.
        let e = translate(&json!({"input": "x", "tools": [{"type": "computer_use_preview"}]}))
            .err()
            .unwrap();
        assert!(e.message.contains("computer_use_preview"), "{}", e.message);
    }
}
