//! Answers: one JSON body, or server-sent events with `delta` chunks and a final `[DONE]` (OpenAI);
//! `/infill` answers in llama-server's native shape (`content`, `stop`, `timings`).

use crate::request::{engine_error, ApiResult};
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use mens::sample::TokenLogprobs;
use mens::scheduler::{Event, Finish, Usage};
use mens::think::{self, ThinkSplitter};
use mens::tokenizer::Tokenizer;
use mens::tools::{CallSplitter, Piece, ToolCall};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::mpsc;

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Chat,
    Text,
    /// llama-server's native `/infill` and `/completion` (`quiet`: n_predict 0, the prompt is only cached).
    Native {
        quiet: bool,
    },
    /// Anthropic's Messages API (answered by `anthropic`).
    Messages,
    /// OpenAI's Responses API (answered by `responses`).
    Responses,
    /// Ollama's `/api/chat` (`chat`) and `/api/generate` (answered by `ollama`).
    Ollama {
        chat: bool,
    },
}

pub(crate) struct Meta {
    pub(crate) id: String,
    pub(crate) model: String,
    pub(crate) created: u64,
    pub(crate) kind: Kind,
    /// Parse tool calls into `tool_calls` (chat with tools): the defined tools.
    pub(crate) tools: Option<mens::tools::Toolbox>,
    /// Chat: split a leading `<think>` block into `reasoning_content`; true when the prompt
    /// already opened it.
    pub(crate) think: Option<bool>,
    /// Report log-probabilities.
    pub(crate) logprobs: bool,
    pub(crate) tok: Arc<Tokenizer>,
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    /// Request fields an API echoes in its answer (the Responses API).
    pub(crate) echo: Value,
}

impl Meta {
    fn token_json(&self, id: u32, logprob: f32) -> Value {
        let b = self.tok.token_bytes(id);
        json!({"token": String::from_utf8_lossy(b), "logprob": logprob, "bytes": b})
    }

    /// The id of the answer's `i`th tool call (every API's: OpenAI's, Responses' `call_id`,
    /// Ollama's).
    pub(crate) fn call_id(&self, i: usize) -> String {
        format!("call_{}_{i}", self.id)
    }

    /// A token's entry (`{"token", "logprob", "bytes", "top_logprobs"}`) for each of these: chat's
    /// `logprobs.content`, and Ollama's `logprobs`.
    pub(crate) fn token_entries(&self, lps: &[TokenLogprobs]) -> Vec<Value> {
        lps.iter()
            .map(|l| {
                let mut v = self.token_json(l.token, l.logprob);
                v["top_logprobs"] = l.top.iter().map(|&(t, p)| self.token_json(t, p)).collect();
                v
            })
            .collect()
    }

    /// Chat's `logprobs` object for these tokens.
    fn chat_logprobs(&self, lps: &[TokenLogprobs]) -> Value {
        json!({ "content": self.token_entries(lps) })
    }

    /// The legacy completions `logprobs` object; `offset`: text bytes before the first token.
    fn text_logprobs(&self, lps: &[TokenLogprobs], mut offset: usize) -> Value {
        let text = |t: u32| String::from_utf8_lossy(self.tok.token_bytes(t)).into_owned();
        let mut offsets = Vec::with_capacity(lps.len());
        for l in lps {
            offsets.push(offset);
            offset += self.tok.token_bytes(l.token).len();
        }
        json!({
            "tokens": lps.iter().map(|l| text(l.token)).collect::<Vec<_>>(),
            "token_logprobs": lps.iter().map(|l| l.logprob).collect::<Vec<_>>(),
            "top_logprobs": lps.iter().map(|l| {
                l.top.iter().map(|&(t, p)| (text(t), json!(p))).collect::<serde_json::Map<_, _>>()
            }).collect::<Vec<_>>(),
            "text_offset": offsets,
        })
    }

    fn logprobs_json(&self, lps: &[TokenLogprobs], offset: usize) -> Value {
        match (self.logprobs, self.kind) {
            (false, _) => Value::Null,
            (true, Kind::Chat | Kind::Messages | Kind::Responses) => self.chat_logprobs(lps),
            (true, _) => self.text_logprobs(lps, offset),
        }
    }
}

/// OpenAI's `tool_calls` entries; ids are the answer's id and the call's index.
fn calls_json(m: &Meta, calls: &[ToolCall], first: usize, stream: bool) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({
                "id": m.call_id(first + i),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            });
            if stream {
                v["index"] = json!(first + i);
            }
            v
        })
        .collect()
}

pub(crate) fn finish_reason(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stop",
        Finish::Length => "length",
    }
}

pub(crate) fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
    })
}

/// llama-server's fields of a finished `/infill` answer.
fn infill_json(m: &Meta, content: &str, u: &Usage) -> Value {
    let prompt_ms = u.time_to_first_token.as_secs_f64() * 1e3;
    let predicted_ms = (u.total.as_secs_f64() * 1e3 - prompt_ms).max(0.0);
    let prompt_n = u.prompt_tokens - u.cached_tokens;
    let predicted_n = u.completion_tokens;
    json!({
        "content": content, "stop": true, "model": m.model, "id_slot": 0,
        "stop_type": if u.finish == Finish::Length { "limit" } else { "eos" },
        "tokens_predicted": predicted_n, "tokens_evaluated": u.prompt_tokens,
        "tokens_cached": u.cached_tokens, "truncated": false,
        "timings": {
            "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_second": prompt_n as f64 / (prompt_ms / 1e3).max(1e-9),
            "predicted_n": predicted_n, "predicted_ms": predicted_ms,
            "predicted_per_second": predicted_n as f64 / (predicted_ms / 1e3).max(1e-9),
            "cache_n": u.cached_tokens,
        },
    })
}

/// The whole answer's text, log-probabilities and counts (every API's non-streamed answer).
pub(crate) async fn collect(
    meta: &Meta,
    rx: &mut mpsc::UnboundedReceiver<Event>,
) -> ApiResult<(String, Vec<TokenLogprobs>, Usage)> {
    let mut text = String::new();
    let mut lps = Vec::new();
    loop {
        match rx.recv().await {
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Logprobs(l)) => lps.push(l),
            Some(Event::Embedding(_)) => {}
            Some(Event::Done(u)) => {
                meta.metrics.finished(&u);
                return Ok((text, lps, u));
            }
            Some(Event::Error(m)) => return Err(engine_error(m)),
            None => return Err(engine_error("the engine dropped the request".into())),
        }
    }
}

/// One API's shape of a streamed answer (OpenAI chunks, Anthropic events, Responses events): what
/// each part of the answer becomes, queued as bytes to send. [`event_stream`] drives it.
pub(crate) trait EventSink: Send + 'static {
    /// Events ready to send.
    fn pending(&mut self) -> &mut VecDeque<Bytes>;
    /// Answer text (tool calls already split off).
    fn text(&mut self, t: &str);
    /// Reasoning text (chat, see `Meta::think`).
    fn reasoning(&mut self, t: &str) {
        self.text(t)
    }
    /// Split reasoning from the answer (`Some(open)`, see `Meta::think`).
    fn think(&self) -> Option<bool> {
        None
    }
    /// A whole tool call.
    fn call(&mut self, c: ToolCall);
    /// The log-probabilities of the text that comes next.
    fn logprobs(&mut self, _l: TokenLogprobs) {}
    /// The end of the answer (the last events).
    fn finish(&mut self, u: Usage);
    /// The request failed: the error event.
    fn error(&mut self, m: String);
}

/// What every stream does with engine events, whatever the API: text through the tool-call
/// splitter when the request has tools, the splitter's rest at the end, then the API's last events.
struct Pipe<S> {
    sink: S,
    rx: mpsc::UnboundedReceiver<Event>,
    think: Option<ThinkSplitter>,
    calls: Option<CallSplitter>,
    done: bool,
}

impl<S: EventSink> Pipe<S> {
    fn pieces(&mut self, pieces: Vec<Piece>) {
        for p in pieces {
            match p {
                Piece::Text(t) => self.sink.text(&t),
                Piece::Call(c) => self.sink.call(c),
            }
        }
    }

    /// Answer text (after the reasoning): through the tool-call splitter when there is one.
    fn answer(&mut self, t: &str) {
        match self.calls.as_mut() {
            Some(s) => {
                let p = s.push(t);
                self.pieces(p);
            }
            None => self.sink.text(t),
        }
    }

    fn parts(&mut self, parts: Vec<think::Part>) {
        for p in parts {
            match p {
                think::Part::Reasoning(r) => self.sink.reasoning(&r),
                think::Part::Text(t) => self.answer(&t),
            }
        }
    }

    fn on(&mut self, e: Option<Event>) {
        match e {
            Some(Event::Logprobs(l)) => self.sink.logprobs(l),
            Some(Event::Embedding(_)) => {}
            Some(Event::Text(t)) => match self.think.as_mut() {
                Some(s) => {
                    let p = s.push(&t);
                    self.parts(p);
                }
                None => self.answer(&t),
            },
            Some(Event::Done(u)) => {
                if let Some(mut s) = self.think.take() {
                    let p = s.finish();
                    self.parts(p);
                }
                if let Some(mut s) = self.calls.take() {
                    let p = s.finish();
                    self.pieces(p);
                }
                self.sink.finish(u);
                self.done = true;
            }
            Some(Event::Error(m)) => {
                self.sink.error(m);
                self.done = true;
            }
            None => self.done = true,
        }
    }
}

/// The HTTP response that sends `sink`'s events as the engine's come (`calls`: split tool calls
/// from the text).
pub(crate) fn event_stream(
    sink: impl EventSink,
    rx: mpsc::UnboundedReceiver<Event>,
    calls: Option<CallSplitter>,
) -> Response {
    let think = sink.think().map(ThinkSplitter::new);
    let pipe = Pipe {
        sink,
        rx,
        think,
        calls,
        done: false,
    };
    let body = futures_util::stream::unfold(pipe, |mut p| async move {
        loop {
            if let Some(b) = p.sink.pending().pop_front() {
                return Some((Ok::<Bytes, std::convert::Infallible>(b), p));
            }
            if p.done {
                return None;
            }
            let e = p.rx.recv().await;
            p.on(e);
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

/// Collect the whole answer.
pub(crate) async fn whole(
    meta: Meta,
    mut rx: mpsc::UnboundedReceiver<Event>,
) -> ApiResult<Response> {
    let (text, lps, usage) = collect(&meta, &mut rx).await?;
    let mut reason = finish_reason(usage.finish);
    if let Kind::Native { quiet } = meta.kind {
        let content = if quiet { "" } else { text.as_str() };
        return Ok(axum::Json(infill_json(&meta, content, &usage)).into_response());
    }
    let logprobs = meta.logprobs_json(&lps, 0);
    let (object, choice) = match meta.kind {
        Kind::Chat | Kind::Messages | Kind::Responses => {
            let open = meta.think.filter(|_| meta.kind == Kind::Chat);
            let (reasoning, text) = think::split_if(text, open);
            let mut message = json!({"role": "assistant", "content": text});
            if let Some(tools) = &meta.tools {
                let (content, calls) = mens::tools::parse(&text, tools);
                if !calls.is_empty() {
                    message = json!({
                        "role": "assistant",
                        "content": if content.is_empty() { Value::Null } else { json!(content) },
                        "tool_calls": calls_json(&meta, &calls, 0, false),
                    });
                    if usage.finish == Finish::Stop {
                        reason = "tool_calls";
                    }
                }
            }
            if !reasoning.is_empty() {
                message["reasoning_content"] = json!(reasoning);
            }
            (
                "chat.completion",
                json!({"index": 0, "message": message,
                       "logprobs": logprobs, "finish_reason": reason}),
            )
        }
        Kind::Text | Kind::Native { .. } | Kind::Ollama { .. } => (
            "text_completion",
            json!({"index": 0, "text": text, "logprobs": logprobs, "finish_reason": reason}),
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

pub(crate) struct Sse {
    pub(crate) meta: Meta,
    pub(crate) include_usage: bool,
    pub(crate) pending: VecDeque<Bytes>,
    /// Log-probabilities not yet sent (they go with the next text).
    pub(crate) lps: Vec<TokenLogprobs>,
    /// Text bytes sent so far (legacy `text_offset`).
    pub(crate) sent: usize,
    pub(crate) n_calls: usize,
}

impl Sse {
    pub(crate) fn chunk(&self, delta: Option<&str>, reason: Option<&str>, first: bool) -> Value {
        let m = &self.meta;
        match m.kind {
            Kind::Chat | Kind::Messages | Kind::Responses => {
                let d = match (first, delta) {
                    (true, _) => json!({"role": "assistant", "content": ""}),
                    (false, Some(t)) => json!({"content": t}),
                    (false, None) => json!({}),
                };
                json!({"id": m.id, "object": "chat.completion.chunk", "created": m.created,
                       "model": m.model,
                       "choices": [{"index": 0, "delta": d, "logprobs": null, "finish_reason": reason}]})
            }
            Kind::Native { .. } => json!({"content": delta.unwrap_or(""), "stop": false}),
            Kind::Text | Kind::Ollama { .. } => {
                json!({"id": m.id, "object": "text_completion", "created": m.created,
                       "model": m.model,
                       "choices": [{"index": 0, "text": delta.unwrap_or(""), "logprobs": null,
                                    "finish_reason": reason}]})
            }
        }
    }

    /// A text chunk, with the log-probabilities received since the last one.
    fn text(&mut self, t: &str) {
        let mut c = self.chunk(Some(t), None, false);
        if self.meta.logprobs && !matches!(self.meta.kind, Kind::Native { .. }) {
            let lps = std::mem::take(&mut self.lps);
            c["choices"][0]["logprobs"] = self.meta.logprobs_json(&lps, self.sent);
        }
        self.sent += t.len();
        self.push(&c);
    }

    pub(crate) fn push(&mut self, v: &Value) {
        self.pending
            .push_back(Bytes::from(format!("data: {v}\n\n")));
    }
}

impl EventSink for Sse {
    fn pending(&mut self) -> &mut VecDeque<Bytes> {
        &mut self.pending
    }

    fn text(&mut self, t: &str) {
        if self.meta.kind != (Kind::Native { quiet: true }) {
            Sse::text(self, t);
        }
    }

    fn reasoning(&mut self, t: &str) {
        let mut c = self.chunk(None, None, false);
        c["choices"][0]["delta"] = json!({ "reasoning_content": t });
        self.push(&c);
    }

    fn think(&self) -> Option<bool> {
        self.meta.think.filter(|_| self.meta.kind == Kind::Chat)
    }

    fn call(&mut self, call: ToolCall) {
        let calls = calls_json(&self.meta, &[call], self.n_calls, true);
        self.n_calls += 1;
        let mut c = self.chunk(None, None, false);
        c["choices"][0]["delta"] = json!({ "tool_calls": calls });
        self.push(&c);
    }

    fn logprobs(&mut self, l: TokenLogprobs) {
        self.lps.push(l);
    }

    fn finish(&mut self, u: Usage) {
        self.meta.metrics.finished(&u);
        if matches!(self.meta.kind, Kind::Native { .. }) {
            let v = infill_json(&self.meta, "", &u);
            self.push(&v);
            return;
        }
        let reason = if self.n_calls > 0 && u.finish == Finish::Stop {
            "tool_calls"
        } else {
            finish_reason(u.finish)
        };
        let mut c = self.chunk(None, Some(reason), false);
        if self.meta.logprobs && !self.lps.is_empty() {
            let lps = std::mem::take(&mut self.lps);
            c["choices"][0]["logprobs"] = self.meta.logprobs_json(&lps, self.sent);
        }
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        self.push(&c);
        if self.include_usage {
            let m = &self.meta;
            let object = match m.kind {
                Kind::Chat | Kind::Messages | Kind::Responses => "chat.completion.chunk",
                Kind::Text | Kind::Native { .. } | Kind::Ollama { .. } => "text_completion",
            };
            let v = json!({"id": m.id, "object": object, "created": m.created,
                           "model": m.model, "choices": [], "usage": usage_json(&u)});
            self.push(&v);
        }
        self.pending
            .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
    }

    fn error(&mut self, m: String) {
        let v = engine_error(m).body();
        self.push(&v);
    }
}

pub(crate) fn stream(
    meta: Meta,
    rx: mpsc::UnboundedReceiver<Event>,
    include_usage: bool,
) -> Response {
    let calls = match (&meta.tools, meta.kind) {
        (Some(tools), Kind::Chat) => Some(CallSplitter::new(tools.clone())),
        _ => None,
    };
    let mut sse = Sse {
        meta,
        include_usage,
        pending: VecDeque::new(),
        lps: Vec::new(),
        sent: 0,
        n_calls: 0,
    };
    if sse.meta.kind == Kind::Chat {
        let c = sse.chunk(None, None, true);
        sse.push(&c);
    }
    event_stream(sse, rx, calls)
}
