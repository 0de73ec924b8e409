//! Embeddings: OpenAI's `POST /v1/embeddings`, llama-server's `/embedding` and `/embeddings` (its
//! own shape), Ollama's `/api/embed` and `/api/embeddings`. Each input is one scheduler request
//! (`Request::embed`): its tokens prefilled in a slot, the final hidden states pooled (`--pooling`),
//! then normalised here as each API does (llama-server's `embd_normalize`, default Euclidean).

use crate::api::{off_workers, read_json, submit_error};
use crate::guard::Tenant;
use crate::request::{check_model, engine_error, tenant_of, ApiError, ApiResult};
use crate::AppState;
use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use mens::embed::{normalize, Pooling};
use mens::sample::SamplerConfig;
use mens::scheduler::{Event, Request};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Most inputs one request may carry (OpenAI's limit).
const MAX_INPUTS: usize = 2048;

/// One input: text (tokenized as text: control-token text stays text) or token ids.
enum Input {
    Text(String),
    Ids(Vec<u32>),
}

fn bad(m: impl Into<String>) -> ApiError {
    ApiError::invalid(m)
}

fn ids(a: &[Value]) -> Option<Vec<u32>> {
    a.iter()
        .map(|x| x.as_u64().and_then(|v| u32::try_from(v).ok()))
        .collect()
}

/// `input` as OpenAI and llama-server take it: a string, a list of strings, a list of token ids,
/// or a list of such lists.
fn inputs(v: &Value, field: &str) -> ApiResult<Vec<Input>> {
    let shape = || {
        bad(format!("{field} must be a string, a list of strings, a list of token ids or a list of lists of token ids"))
    };
    let list = match v {
        Value::String(t) => return Ok(vec![Input::Text(t.clone())]),
        Value::Array(a) => a,
        _ => return Err(shape()),
    };
    if list.is_empty() {
        return Err(bad(format!("{field} must not be empty")));
    }
    if list.len() > MAX_INPUTS {
        return Err(bad(format!(
            "{field} has {} inputs, more than {MAX_INPUTS}",
            list.len()
        )));
    }
    if list.iter().all(Value::is_number) {
        return ids(list).map(|v| vec![Input::Ids(v)]).ok_or_else(shape);
    }
    list.iter()
        .map(|x| match x {
            Value::String(t) => Ok(Input::Text(t.clone())),
            Value::Array(a) => ids(a).map(Input::Ids).ok_or_else(shape),
            _ => Err(shape()),
        })
        .collect()
}

/// Each input's token ids (off the async workers): at most a slot's context each, or its first
/// that many with `truncate` (Ollama's default).
async fn tokenize(
    s: &Arc<AppState>,
    inputs: Vec<Input>,
    truncate: bool,
) -> ApiResult<Vec<Vec<u32>>> {
    let ctx = s.scheduler.options().ctx;
    off_workers(s, move |st| {
        let too_long = |i: usize| {
            ApiError::invalid(format!(
                "input {i} has more than {ctx} tokens, the context of this server's slots: shorten it"
            ))
            .with_code("context_length_exceeded")
        };
        inputs
            .into_iter()
            .enumerate()
            .map(|(i, input)| {
                let mut ids = match input {
                    // Truncating: the whole text, bounded by the body's size.
                    Input::Text(t) => st
                        .tokenizer
                        .encode_embedding(&t, if truncate { usize::MAX } else { ctx })
                        .map_err(|e| match e {
                            mens::Error::Context(_) => too_long(i),
                            e => ApiError::invalid(e.to_string()),
                        })?,
                    Input::Ids(v) => v,
                };
                if ids.is_empty() {
                    return Err(bad(format!("input {i} is empty")));
                }
                if ids.len() > ctx {
                    if !truncate {
                        return Err(too_long(i));
                    }
                    ids.truncate(ctx);
                }
                Ok(ids)
            })
            .collect()
    })
    .await
}

/// Each input's pooled vector (not normalised) and its token count, computed a wave of slots at a
/// time (a request of many inputs neither fills the queue nor waits on its own inputs).
async fn run(
    s: &Arc<AppState>,
    inputs: Vec<Vec<u32>>,
    tenant: u64,
) -> ApiResult<Vec<(Vec<f32>, usize)>> {
    let pooling = s.config.pooling;
    let wave = s.scheduler.options().slots.max(1);
    let mut out = Vec::with_capacity(inputs.len());
    let mut inputs = inputs.into_iter().peekable();
    while inputs.peek().is_some() {
        let mut rxs = Vec::with_capacity(wave);
        for prompt in inputs.by_ref().take(wave) {
            let (tx, rx) = mpsc::unbounded_channel::<Event>();
            let alive = tx.clone();
            s.scheduler
                .submit(Request {
                    prompt,
                    max_tokens: 0,
                    sampler: SamplerConfig::greedy(),
                    stop: Vec::new(),
                    min_indent: 0,
                    on_event: Box::new(move |e| tx.send(e).is_ok()),
                    alive: Box::new(move || !alive.is_closed()),
                    tenant,
                    // A deadline cuts generation; an embedding generates nothing (its work is
                    // one prefill, bounded by the context).
                    deadline: None,
                    constraint: None,
                    logprobs: None,
                    ignore_eos: false,
                    think: None,
                    embed: Some(pooling),
                })
                .map_err(submit_error)?;
            rxs.push(rx);
        }
        for mut rx in rxs {
            let mut v = None;
            loop {
                match rx.recv().await {
                    Some(Event::Embedding(e)) => v = Some(e),
                    Some(Event::Done(u)) => {
                        s.metrics.finished(&u);
                        let v = v.ok_or_else(|| engine_error("no embedding came back".into()))?;
                        out.push((v, u.prompt_tokens));
                        break;
                    }
                    Some(Event::Error(m)) => return Err(engine_error(m)),
                    Some(_) => {}
                    None => return Err(engine_error("the engine dropped the request".into())),
                }
            }
        }
    }
    Ok(out)
}

/// `embd_normalize` (llama-server's: -1 none, 0 max-abs, 1 taxicab, 2 Euclidean, p > 2 p-norm).
fn norm_field(o: &Map<String, Value>) -> ApiResult<i32> {
    match o.get("embd_normalize") {
        None | Some(Value::Null) => Ok(2),
        Some(v) => v
            .as_i64()
            .filter(|p| (-1..=64).contains(p))
            .map(|p| p as i32)
            .ok_or_else(|| bad("embd_normalize must be an integer from -1 to 64")),
    }
}

/// `dimensions`: the first that many values, normalised again (OpenAI's and Ollama's shortening;
/// at most the model's width, checked in [`finish`]).
fn dims_field(o: &Map<String, Value>) -> ApiResult<Option<usize>> {
    match o.get("dimensions") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(d) if d >= 1 => Ok(Some(d.min(u32::MAX as u64) as usize)),
            _ => Err(bad("dimensions must be a positive integer").param("dimensions")),
        },
    }
}

/// The vectors shortened to `dims` and normalised by `p`.
fn finish(out: Vec<(Vec<f32>, usize)>, dims: Option<usize>, p: i32) -> ApiResult<Vec<Vec<f32>>> {
    out.into_iter()
        .map(|(mut v, _)| {
            if let Some(d) = dims {
                if d > v.len() {
                    let m = format!("dimensions must be at most {}, the model's width", v.len());
                    return Err(bad(m).param("dimensions"));
                }
                v.truncate(d);
            }
            normalize(&mut v, p);
            Ok(v)
        })
        .collect()
}

fn no_pooling(api: &str) -> ApiError {
    bad(format!(
        "pooling none (every token's row) is not {api}'s shape: start the server with another --pooling, or use /embedding"
    ))
}

/// Embeddings need a backend that computes hidden states (the CPU's and the CUDA one's).
fn served(s: &AppState) -> ApiResult<()> {
    if s.scheduler.embeddings() {
        return Ok(());
    }
    Err(ApiError::new(
        axum::http::StatusCode::NOT_IMPLEMENTED,
        "not_implemented",
        "this backend does not compute embeddings: start mens serve with --backend cpu or --backend cuda",
    ))
}

/// An OpenAI-shaped route's body: a JSON object naming the served model (or none).
async fn openai_body(
    s: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult<Map<String, Value>> {
    served(s)?;
    let Value::Object(o) = read_json(s, headers, body).await? else {
        return Err(bad("the request body must be a JSON object"));
    };
    match o.get("model") {
        None | Some(Value::Null) => {}
        Some(Value::String(m)) => check_model(Some(m), &s.config.model_name)?,
        Some(_) => return Err(bad("model must be a string").param("model")),
    }
    Ok(o)
}

/// `POST /v1/embeddings`: OpenAI's shape (`encoding_format` float or base64, `dimensions`).
pub async fn openai(
    State(s): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = async {
        let o = openai_body(&s, &headers, body).await?;
        if s.config.pooling == Pooling::None {
            return Err(no_pooling("OpenAI"));
        }
        let input = o
            .get("input")
            .ok_or_else(|| bad("input is required").param("input"))?;
        let inputs = inputs(input, "input")?;
        let base64 = match o.get("encoding_format") {
            None | Some(Value::Null) => false,
            Some(Value::String(f)) if f == "float" => false,
            Some(Value::String(f)) if f == "base64" => true,
            Some(_) => {
                return Err(bad("encoding_format must be float or base64").param("encoding_format"))
            }
        };
        let (p, dims) = (norm_field(&o)?, dims_field(&o)?);
        let ids = tokenize(&s, inputs, false).await?;
        let tenant = tenant_of(tenant, o.get("user").and_then(Value::as_str));
        let out = run(&s, ids, tenant).await?;
        let tokens: usize = out.iter().map(|e| e.1).sum();
        let data: Vec<Value> = finish(out, dims, p)?
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                let embedding = if base64 {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    json!(base64::encode(bytes))
                } else {
                    json!(v)
                };
                json!({"object": "embedding", "index": i, "embedding": embedding})
            })
            .collect();
        Ok(axum::Json(json!({
            "object": "list",
            "data": data,
            "model": s.config.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }))
        .into_response())
    };
    answer.await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /embedding` and `/embeddings`: llama-server's own shape, `[{"index", "embedding": [[…]]}]`
/// (`input` or `content`; with pooling none every token's row, not normalised).
pub async fn native(
    State(s): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = async {
        let o = openai_body(&s, &headers, body).await?;
        let input = o
            .get("input")
            .or_else(|| o.get("content"))
            .ok_or_else(|| bad("\"input\" or \"content\" must be provided"))?;
        let inputs = inputs(input, "input")?;
        let p = norm_field(&o)?;
        let ids = tokenize(&s, inputs, false).await?;
        let out = run(&s, ids, tenant_of(tenant, None)).await?;
        let data: Vec<Value> = if s.config.pooling == Pooling::None {
            // Every token's row, as the model gives it.
            out.into_iter()
                .enumerate()
                .map(|(i, (v, n))| {
                    let rows: Vec<&[f32]> = v.chunks(v.len() / n.max(1)).collect();
                    json!({"index": i, "embedding": rows})
                })
                .collect()
        } else {
            finish(out, None, p)?
                .into_iter()
                .enumerate()
                .map(|(i, v)| json!({"index": i, "embedding": [v]}))
                .collect()
        };
        ApiResult::Ok(axum::Json(Value::Array(data)).into_response())
    };
    answer.await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /api/embed` (Ollama): `input` a string or strings, `truncate` (default true),
/// `dimensions`; the vectors normalised (Euclidean).
pub async fn ollama_embed(
    State(s): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = async {
        let t0 = std::time::Instant::now();
        served(&s)?;
        let o = crate::ollama::read_object(&s, &headers, body).await?;
        if s.config.pooling == Pooling::None {
            return Err(no_pooling("Ollama"));
        }
        // No input (or an empty list): no embeddings, as Ollama answers.
        let inputs = match o.get("input") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) if a.is_empty() => Vec::new(),
            Some(v @ (Value::String(_) | Value::Array(_))) => inputs(v, "input")?,
            Some(_) => return Err(bad("input must be a string or a list of strings")),
        };
        let truncate = match o.get("truncate") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(bad("truncate must be true or false")),
        };
        let dims = dims_field(&o)?;
        let ids = tokenize(&s, inputs, truncate).await?;
        let out = run(&s, ids, tenant_of(tenant, None)).await?;
        let tokens: usize = out.iter().map(|e| e.1).sum();
        let embeddings = finish(out, dims, 2)?;
        Ok(axum::Json(json!({
            "model": crate::ollama::listed_name(&s),
            "embeddings": embeddings,
            "total_duration": t0.elapsed().as_nanos() as u64,
            "load_duration": 0,
            "prompt_eval_count": tokens,
        }))
        .into_response())
    };
    answer.await.unwrap_or_else(crate::ollama::error)
}

/// `POST /api/embeddings` (Ollama's older route): `prompt`, answered as `{"embedding": […]}`, the
/// pooled vector as the model gives it (not normalised, as Ollama's); an empty prompt gets an
/// empty vector.
pub async fn ollama_embeddings(
    State(s): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = async {
        served(&s)?;
        let o = crate::ollama::read_object(&s, &headers, body).await?;
        if s.config.pooling == Pooling::None {
            return Err(no_pooling("Ollama"));
        }
        let prompt = match o.get("prompt") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(t)) => t.clone(),
            Some(_) => return Err(bad("prompt must be a string")),
        };
        if prompt.is_empty() {
            return Ok(axum::Json(json!({"embedding": []})).into_response());
        }
        let ids = tokenize(&s, vec![Input::Text(prompt)], true).await?;
        let mut out = run(&s, ids, tenant_of(tenant, None)).await?;
        let (v, _) = out
            .pop()
            .ok_or_else(|| engine_error("no embedding came back".into()))?;
        Ok(axum::Json(json!({"embedding": v})).into_response())
    };
    answer.await.unwrap_or_else(crate::ollama::error)
}
