//! Answers: one JSON body, or server-sent events with `delta` chunks and a final `[DONE]` (OpenAI);
//! `/infill` answers in llama-server's native shape (`content`, `stop`, `timings`).

use crate::request::{engine_error, ApiResult};
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use mens::scheduler::{Event, Finish, Usage};
use serde_json::{json, Value};
use std::collections::VecDeque;
use tokio::sync::mpsc;

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Chat,
    Text,
    /// llama-server's `/infill` (`quiet`: n_predict 0, the prompt is only cached).
    Infill {
        quiet: bool,
    },
}

pub(crate) struct Meta {
    pub(crate) id: String,
    pub(crate) model: String,
    pub(crate) created: u64,
    pub(crate) kind: Kind,
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

/// Collect the whole answer.
pub(crate) async fn whole(
    meta: Meta,
    mut rx: mpsc::UnboundedReceiver<Event>,
) -> ApiResult<Response> {
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
    if let Kind::Infill { quiet } = meta.kind {
        let content = if quiet { "" } else { text.as_str() };
        return Ok(axum::Json(infill_json(&meta, content, &usage)).into_response());
    }
    let (object, choice) = match meta.kind {
        Kind::Chat => (
            "chat.completion",
            json!({"index": 0, "message": {"role": "assistant", "content": text},
                   "logprobs": null, "finish_reason": reason}),
        ),
        Kind::Text | Kind::Infill { .. } => (
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

pub(crate) struct Sse {
    pub(crate) meta: Meta,
    pub(crate) rx: mpsc::UnboundedReceiver<Event>,
    pub(crate) include_usage: bool,
    pub(crate) pending: VecDeque<Bytes>,
    pub(crate) done: bool,
}

impl Sse {
    pub(crate) fn chunk(&self, delta: Option<&str>, reason: Option<&str>, first: bool) -> Value {
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
            Kind::Infill { .. } => json!({"content": delta.unwrap_or(""), "stop": false}),
            Kind::Text => json!({"id": m.id, "object": "text_completion", "created": m.created,
                       "model": m.model,
                       "choices": [{"index": 0, "text": delta.unwrap_or(""), "logprobs": null,
                                    "finish_reason": reason}]}),
        }
    }

    pub(crate) fn push(&mut self, v: &Value) {
        self.pending
            .push_back(Bytes::from(format!("data: {v}\n\n")));
    }

    pub(crate) fn on(&mut self, e: Option<Event>) {
        match e {
            Some(Event::Text(t)) => {
                if self.meta.kind != (Kind::Infill { quiet: true }) {
                    let c = self.chunk(Some(&t), None, false);
                    self.push(&c);
                }
            }
            Some(Event::Done(u)) if matches!(self.meta.kind, Kind::Infill { .. }) => {
                let v = infill_json(&self.meta, "", &u);
                self.push(&v);
                self.done = true;
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
                        Kind::Text | Kind::Infill { .. } => "text_completion",
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

pub(crate) fn stream(
    meta: Meta,
    rx: mpsc::UnboundedReceiver<Event>,
    include_usage: bool,
) -> Response {
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
