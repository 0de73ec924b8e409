//! The OpenAI-shaped endpoints: read and check a request (`request`), build its prompt, hand it to
//! the scheduler, answer (`sse`).

use crate::guard::Tenant;
use crate::request::*;
use crate::sse::{stream, whole, Kind, Meta};
use crate::{ApiError, AppState};
use axum::body::{Body, Bytes};
use axum::extract::{Extension, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use mens::chat::Message;
use mens::fim::{fim_prompt, FimInput};
use mens::grammar::{Constraint, GrammarSpec};
use mens::scheduler::{Event, Request, SubmitError};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Read and parse a JSON body: `application/json` only (a browser's no-preflight `text/plain`
/// cannot reach the API), under the size limit, within the header timeout plus the time the body
/// takes at the minimum rate (a client that stops sending cannot hold the connection).
pub(crate) async fn read_json<T: serde::de::DeserializeOwned>(
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

/// Run `f` (tokenizing: CPU work) off the async workers, at most `tokenize_parallel` at a time.
pub(crate) async fn off_workers<T: Send + 'static>(
    s: &Arc<AppState>,
    f: impl FnOnce(&AppState) -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    let _permit = s
        .tokenizing
        .acquire()
        .await
        .map_err(|_| engine_error("the server is stopping".into()))?;
    let st = s.clone();
    tokio::task::spawn_blocking(move || f(&st))
        .await
        .map_err(|_| engine_error("tokenizing failed".into()))?
}

/// Tokenize a prompt off the async workers ([`off_workers`]).
pub(crate) async fn tokenize(
    s: &Arc<AppState>,
    f: impl FnOnce(&AppState, usize) -> ApiResult<Vec<u32>> + Send + 'static,
) -> ApiResult<Vec<u32>> {
    // The prompt must leave room for one generated token: longer is refused without tokenizing it all.
    let limit = s.scheduler.options().ctx - 1;
    off_workers(s, move |st| f(st, limit)).await
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

/// llama-server's `POST /v1/chat/completions/input_tokens`: the prompt length of a chat request,
/// as OpenAI's Responses API counts input (`{"object": "response.input_tokens", "input_tokens"}`).
pub async fn chat_input_tokens(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = async {
        let r: ChatRequest = read_json(&s, &headers, body).await?;
        let n = chat_tokens(&s, r).await?;
        Ok::<_, ApiError>(input_tokens_json(n))
    };
    answer.await.unwrap_or_else(IntoResponse::into_response)
}

pub(crate) fn input_tokens_json(n: usize) -> Response {
    axum::Json(json!({"object": "response.input_tokens", "input_tokens": n})).into_response()
}

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
    chat(s, tenant, r, Kind::Chat, Value::Null)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// A chat request (OpenAI's, or another API's translated to it), answered in `kind`'s shape.
pub(crate) async fn chat(
    s: Arc<AppState>,
    tenant: Tenant,
    r: ChatRequest,
    kind: Kind,
    echo: Value,
) -> ApiResult<Response> {
    let ChatRequest { messages, common } = r;
    let msgs = chat_messages(&messages, &common, &s.config.model_name)?;
    let format = s.template.call_format();
    let tools = common.tool_use(format)?;
    let grammar = match (&tools.grammar, common.grammar_spec()?) {
        (Some(g), None) => Some(GrammarSpec::Lark(g.clone())),
        (None, g) => g,
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "a tool_choice that forces a call cannot be combined with response_format",
            )
            .param("tool_choice"))
        }
    };
    let mut extra = Extra {
        grammar,
        logprobs: common.logprobs(true)?,
        echo,
        tools: tools
            .parse
            .then(|| mens::tools::Toolbox::new(format, &tools.tools)),
        ..Default::default()
    };
    let defs = tools.tools.clone();
    let vars = common.template_vars()?;
    let p = tokenize(&s, move |st, limit| {
        chat_prompt(st, &msgs, &defs, &vars, limit)
    })
    .await?;
    // Whether the template opened the answer's `<think>` block itself (the tag may take a token a
    // byte where a vocabulary lacks its pieces: 16 tokens hold it and a newline).
    let tail = s.tokenizer.decode(&p[p.len().saturating_sub(16)..]);
    let tail = tail.trim_end();
    let opened = tail.ends_with(mens::think::OPEN);
    if s.config.split_reasoning {
        extra.think = Some(opened);
    }
    // A forced call may come after the model's reasoning: inside the block the template opened,
    // or after one it may open (its template knows `<think>`; closed already when the template
    // turned thinking off).
    let source = s.template.source().unwrap_or("");
    let reasoning = if opened {
        mens::tools::Reasoning::Open
    } else if source.contains(mens::think::OPEN) && !tail.ends_with(mens::think::CLOSE) {
        mens::tools::Reasoning::Optional
    } else {
        mens::tools::Reasoning::None
    };
    if reasoning != mens::tools::Reasoning::None {
        extra.watch = Some(opened);
        if let Some(g) = tools.grammar_with(reasoning) {
            extra.grammar = Some(GrammarSpec::Lark(g));
        }
    }
    complete(s.clone(), kind, p, &common, tenant, None, extra).await
}

/// The prompt length of a chat request (for `count_tokens`).
pub(crate) async fn chat_tokens(s: &Arc<AppState>, r: ChatRequest) -> ApiResult<usize> {
    let ChatRequest { messages, common } = r;
    let msgs = chat_messages(&messages, &common, &s.config.model_name)?;
    let defs = common.tool_use(s.template.call_format())?.tools;
    let vars = common.template_vars()?;
    let p = tokenize(s, move |st, _| {
        chat_prompt(st, &msgs, &defs, &vars, MAX_TOKENIZE)
    })
    .await?;
    Ok(p.len())
}

/// The conversation's token ids: message text is text, only the template's markup is control
/// tokens (see `ChatTemplate::tokens`).
fn chat_prompt(
    s: &AppState,
    msgs: &[Message],
    tools: &[serde_json::Value],
    vars: &mens::chat::Vars,
    limit: usize,
) -> ApiResult<Vec<u32>> {
    s.template
        .tokens_full(&s.tokenizer, msgs, tools, vars, true, limit)
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
    if let Err(e) = common.check_text(&s.config.model_name) {
        return e.into_response();
    }
    if let Some(suffix) = suffix.filter(|x| !x.is_empty()) {
        // Fill in the middle between the prompt and the suffix.
        let text = match prompt {
            Prompt::Text(t) => t,
            Prompt::Texts(mut v) if v.len() == 1 => v.remove(0),
            _ => {
                return ApiError::invalid("with a suffix, the prompt must be one string")
                    .param("prompt")
                    .into_response()
            }
        };
        let input = FimInput {
            prefix: text,
            suffix,
            ..Default::default()
        };
        let n_predict = common
            .max_completion_tokens
            .or(common.max_tokens)
            .unwrap_or(0);
        let prompt = tokenize(&s, move |st, limit| fim_ids(st, &input, n_predict, limit)).await;
        return finish_completion(s, prompt, &common, tenant, Kind::Text).await;
    }
    let prompt = tokenize(&s, move |st, limit| {
        prompt_ids(&st.tokenizer, prompt, parse_special, limit)
    })
    .await;
    finish_completion(s, prompt, &common, tenant, Kind::Text).await
}

/// A raw prompt's token ids: a string (control-token text is text unless `special`), token ids,
/// or llama-server's mixed list of both (a BOS first when it starts with a string and the model
/// adds one). One prompt per request.
pub(crate) fn prompt_ids(
    tok: &mens::tokenizer::Tokenizer,
    prompt: Prompt,
    special: bool,
    limit: usize,
) -> ApiResult<Vec<u32>> {
    let text = |t: &str| {
        if special {
            tok.encode_special(t, limit)
        } else {
            tok.encode_text(t, limit)
        }
        .map_err(too_long)
    };
    match prompt {
        Prompt::Text(t) => text(&t),
        Prompt::Texts(v) if v.len() == 1 => text(&v[0]),
        Prompt::Texts(v) => Err(ApiError::invalid(format!(
            "one prompt per request is supported, got {}",
            v.len()
        ))
        .param("prompt")),
        Prompt::Tokens(t) if t.len() > limit => Err(too_long(mens::Error::Context(format!(
            "the prompt has {} tokens, more than {limit}",
            t.len()
        )))),
        Prompt::Tokens(t) => Ok(t),
        Prompt::Mixed(pieces) => {
            let mut ids = match pieces.first() {
                Some(PromptPiece::Text(_)) => tok.start(),
                _ => Vec::new(),
            };
            for p in pieces {
                match p {
                    PromptPiece::Id(i) => {
                        if ids.len() >= limit {
                            return Err(too_long(mens::Error::Context(format!(
                                "the prompt has more than {limit} tokens"
                            ))));
                        }
                        ids.push(i)
                    }
                    PromptPiece::Text(t) => tok
                        .encode_append(&t, special, &mut ids, limit)
                        .map_err(too_long)?,
                }
            }
            Ok(ids)
        }
    }
}

/// `POST /completion` (and `/completions`): llama-server's native text completion, answered in
/// its shape (`content`, `stop`, `timings`; streamed as `data: {"content", "stop"}` events).
pub async fn native_completion(
    State(s): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = async {
        let r: NativeRequest = read_json(&s, &headers, body).await?;
        let NativeRequest {
            prompt,
            parse_special,
            n_probs,
            native,
            mut common,
        } = r;
        common.check_text(&s.config.model_name)?;
        if n_probs.unwrap_or(0) > 0 {
            return Err(ApiError::invalid(
                "n_probs is not supported; use /v1/completions with logprobs",
            )
            .param("n_probs"));
        }
        let limits = native.limits(&mut common)?;
        let ids = tokenize(&s, move |st, limit| {
            prompt_ids(&st.tokenizer, prompt, parse_special, limit)
        })
        .await?;
        if ids.is_empty() {
            return Err(ApiError::invalid("the prompt is empty").param("prompt"));
        }
        let grammar = common.grammar_spec()?;
        complete_native(s, tenant, ids, &common, limits, grammar).await
    };
    answer.await.unwrap_or_else(IntoResponse::into_response)
}

/// The FIM prompt of `input` for this server's model and context (400 without FIM tokens).
pub(crate) fn fim_ids(
    st: &AppState,
    input: &FimInput,
    n_predict: i64,
    limit: usize,
) -> ApiResult<Vec<u32>> {
    let fim = st.tokenizer.fim.ok_or_else(|| {
        ApiError::invalid(
            "this model has no fill-in-the-middle tokens (FIM prefix, suffix, middle)",
        )
    })?;
    let ctx = limit + 1;
    fim_prompt(
        &st.tokenizer,
        &fim,
        input,
        FIM_BATCH.min(ctx / 2),
        n_predict.max(0) as usize,
        ctx,
    )
    .map_err(too_long)
}

/// The batch llama-server fits a FIM prompt to (its default `-b`; at most half the context here, so
/// that other files' chunks have room): the prefix keeps 3/4 of it, the suffix 1/4.
const FIM_BATCH: usize = 2048;

/// `POST /infill`: llama-server's fill-in-the-middle endpoint (llama.vscode, llama.vim).
pub async fn infill(
    State(s): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = async {
        let r: InfillRequest = read_json(&s, &headers, body).await?;
        let InfillRequest {
            input_prefix,
            input_suffix,
            input_extra,
            prompt,
            native,
            mut common,
        } = r;
        common.check_supported(&s.config.model_name)?;
        if input_extra.len() > MAX_EXTRA {
            return Err(
                ApiError::invalid(format!("input_extra takes at most {MAX_EXTRA} chunks"))
                    .param("input_extra"),
            );
        }
        let limits = native.limits(&mut common)?;
        let input = FimInput {
            prefix: input_prefix,
            suffix: input_suffix,
            prompt,
            extra: input_extra
                .into_iter()
                .map(|c| (c.filename.unwrap_or_else(|| "tmp".into()), c.text))
                .collect(),
        };
        let n = native.n_predict.unwrap_or(0);
        let ids = tokenize(&s, move |st, limit| fim_ids(st, &input, n, limit)).await?;
        complete_native(s, tenant, ids, &common, limits, None).await
    };
    answer.await.unwrap_or_else(IntoResponse::into_response)
}

/// Answer a native endpoint's prompt in llama-server's shape, under its limits.
async fn complete_native(
    s: Arc<AppState>,
    tenant: Tenant,
    ids: Vec<u32>,
    common: &Common,
    limits: NativeLimits,
    grammar: Option<GrammarSpec>,
) -> ApiResult<Response> {
    let extra = Extra {
        grammar,
        min_indent: limits.min_indent,
        ..Default::default()
    };
    let kind = Kind::Native {
        quiet: limits.quiet,
    };
    complete(s, kind, ids, common, tenant, limits.deadline, extra).await
}

async fn finish_completion(
    s: Arc<AppState>,
    prompt: ApiResult<Vec<u32>>,
    common: &Common,
    tenant: Tenant,
    kind: Kind,
) -> Response {
    let answer = async {
        let prompt = match prompt? {
            p if p.is_empty() => {
                return Err(ApiError::invalid("the prompt is empty").param("prompt"))
            }
            p => p,
        };
        let extra = Extra {
            echo: Value::Null,
            grammar: common.grammar_spec()?,
            logprobs: common.logprobs(false)?,
            ..Default::default()
        };
        complete(s, kind, prompt, common, tenant, None, extra).await
    };
    answer.await.unwrap_or_else(IntoResponse::into_response)
}

/// What a request asks beyond text: a grammar, log-probabilities, tool calls parsed.
#[derive(Default)]
pub(crate) struct Extra {
    pub(crate) echo: Value,
    pub(crate) grammar: Option<GrammarSpec>,
    pub(crate) logprobs: Option<usize>,
    /// Parse tool calls to these tools.
    pub(crate) tools: Option<mens::tools::Toolbox>,
    /// Split a leading `<think>` block into `reasoning_content` (see `Meta::think`).
    pub(crate) think: Option<bool>,
    /// llama-server's `n_indent` (`mens::scheduler::Request::min_indent`).
    pub(crate) min_indent: usize,
    /// The answer may start with a `<think>` block (`Some(true)`: the prompt opened it): count its
    /// tokens and close it at the reasoning budget.
    pub(crate) watch: Option<bool>,
}

/// Compile a grammar off the async workers (bounded like tokenization; llguidance bounds the
/// work per grammar with its fuel limits). The token trie is built at the first use.
pub(crate) async fn compile(s: &Arc<AppState>, spec: GrammarSpec) -> ApiResult<Constraint> {
    let _permit = s
        .tokenizing
        .acquire()
        .await
        .map_err(|_| engine_error("the server is stopping".into()))?;
    let st = s.clone();
    tokio::task::spawn_blocking(move || {
        let g = st.grammars()?;
        g.compile(&spec).map_err(|e| {
            ApiError::invalid(e.to_string())
                .param("response_format")
                .with_code("invalid_grammar")
        })
    })
    .await
    .map_err(|_| engine_error("compiling the grammar failed".into()))?
}

/// How the answer's `<think>` block is watched: the request's budget or the server's, and the
/// tokens that close it (the budget message, then the closing tag, as text).
fn think_watch(s: &AppState, c: &Common, open: bool) -> ApiResult<mens::think::Think> {
    let budget = c.thinking_budget()?.unwrap_or(s.config.reasoning_budget);
    let close = match budget {
        Some(_) => {
            let text = format!(
                "{}{}",
                s.config.reasoning_budget_message,
                mens::think::CLOSE
            );
            s.tokenizer
                .encode_text(&text, MAX_TOKENIZE)
                .map_err(|e| engine_error(e.to_string()))?
        }
        None => Vec::new(),
    };
    Ok(mens::think::Think {
        open,
        budget,
        close,
    })
}

/// Submit the request and answer: one JSON body, or server-sent events when `stream` is set.
pub(crate) async fn complete(
    s: Arc<AppState>,
    kind: Kind,
    prompt: Vec<u32>,
    c: &Common,
    tenant: Tenant,
    time_limit: Option<std::time::Duration>,
    extra: Extra,
) -> ApiResult<Response> {
    let sampler = c.sampler(s.tokenizer.vocab_size())?;
    let stop = c.stops()?;
    let ctx = s.scheduler.options().ctx;
    let max_tokens = c.max_tokens(
        prompt.len(),
        ctx,
        s.config.max_tokens_cap,
        s.config.fit_max_tokens,
    )?;
    let prompt_tokens = prompt.len();
    let constraint = match extra.grammar {
        Some(g) => Some(compile(&s, g).await?),
        None => None,
    };
    let think = match extra.watch {
        Some(open) => Some(think_watch(&s, c, open)?),
        None => None,
    };
    let (tx, rx) = mpsc::unbounded_channel::<Event>();
    let alive = tx.clone();
    let req = Request {
        prompt,
        max_tokens,
        sampler,
        stop,
        min_indent: extra.min_indent,
        on_event: Box::new(move |e| tx.send(e).is_ok()),
        alive: Box::new(move || !alive.is_closed()),
        tenant: c.tenant(tenant),
        deadline: match (s.config.request_timeout, time_limit) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
        .map(|t| std::time::Instant::now() + t),
        constraint,
        logprobs: extra.logprobs,
        ignore_eos: c.ignore_eos.unwrap_or(false),
        think,
        embed: None,
    };
    s.scheduler.submit(req).map_err(submit_error)?;
    let meta = Meta {
        id: new_id(match kind {
            Kind::Chat => "chatcmpl",
            Kind::Messages => "msg",
            Kind::Responses => "r",
            _ => "cmpl",
        }),
        model: s.config.model_name.clone(),
        created: now(),
        kind,
        tools: extra.tools,
        think: extra.think,
        logprobs: extra.logprobs.is_some(),
        tok: s.tokenizer.clone(),
        metrics: s.metrics.clone(),
        echo: extra.echo,
    };
    if let Kind::Ollama { .. } = kind {
        return match c.stream.unwrap_or(true) {
            true => Ok(crate::ollama::stream(meta, rx)),
            false => crate::ollama::whole(meta, rx).await,
        };
    }
    if kind == Kind::Responses {
        return match c.stream.unwrap_or(false) {
            true => Ok(crate::responses::stream(meta, rx)),
            false => crate::responses::whole(meta, rx).await,
        };
    }
    if kind == Kind::Messages {
        return match c.stream.unwrap_or(false) {
            true => Ok(crate::anthropic::stream(meta, rx, prompt_tokens)),
            false => crate::anthropic::whole(meta, rx).await,
        };
    }
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

/// Why the scheduler did not take a request, as an API error.
pub(crate) fn submit_error(e: SubmitError) -> ApiError {
    match e {
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
    }
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
        let tools = r.common.tool_use(template.call_format())?;
        r.common.logprobs(true)?;
        let vars = r.common.template_vars()?;
        let p = template
            .tokens_full(tok, &msgs, &tools.tools, &vars, true, ctx - 1)
            .map_err(too_long)?;
        (p, r.common)
    } else {
        let r: CompletionRequest = serde_json::from_slice(body).map_err(bad)?;
        r.common.check_supported("mens")?;
        let p = prompt_ids(tok, r.prompt, r.parse_special, ctx - 1)?;
        (p, r.common)
    };
    common.grammar_spec()?;
    common.sampler(tok.vocab_size())?;
    common.stops()?;
    common.max_tokens(prompt.len(), ctx, None, false)?;
    Ok(prompt)
}

/// `GET /props` (llama-server's): the context a request gets, the slots, the sampling defaults,
/// the chat template and its BOS/EOS texts. The model is named by its served name, not its path.
pub async fn props(State(s): State<Arc<AppState>>) -> Response {
    let d = mens::sample::SamplerConfig::default();
    let o = s.scheduler.options();
    axum::Json(json!({
        "default_generation_settings": {
            "n_ctx": o.ctx,
            "params": {"temperature": d.temperature, "top_k": d.top_k, "top_p": d.top_p,
                       "min_p": d.min_p, "repeat_penalty": d.repeat_penalty,
                       "repeat_last_n": d.repeat_last_n, "n_predict": -1},
        },
        "total_slots": o.slots,
        "model_alias": s.config.model_name,
        "model_path": s.config.model_name,
        "modalities": {"vision": false, "audio": false},
        "chat_template": s.template.source().unwrap_or(""),
        "bos_token": s.template.bos_token,
        "eos_token": s.template.eos_token,
        "build_info": format!("mens {}", env!("CARGO_PKG_VERSION")),
    }))
    .into_response()
}

/// `POST /apply-template` (llama-server's): the prompt a chat request would get, as text
/// (`{"prompt"}`): messages, `tools` and `chat_template_kwargs` through the model's template.
pub async fn apply_template(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = async {
        let r: ChatRequest = read_json(&s, &headers, body).await?;
        let ChatRequest { messages, common } = r;
        let msgs = chat_messages(&messages, &common, &s.config.model_name)?;
        let tools = common.tool_use(s.template.call_format())?.tools;
        let vars = common.template_vars()?;
        let _permit = s
            .tokenizing
            .acquire()
            .await
            .map_err(|_| engine_error("the server is stopping".into()))?;
        let st = s.clone();
        let text = tokio::task::spawn_blocking(move || {
            st.template
                .render_full(&msgs, &tools, &vars, true)
                .map_err(|e| ApiError::invalid(e.to_string()))
        })
        .await
        .map_err(|_| engine_error("rendering the template failed".into()))??;
        Ok::<_, ApiError>(axum::Json(json!({ "prompt": text })).into_response())
    };
    answer.await.unwrap_or_else(IntoResponse::into_response)
}

/// Most tokens `/tokenize` returns and `/detokenize` takes.
const MAX_TOKENIZE: usize = 1 << 20;

/// `POST /tokenize` (llama-server's shape): `{"content", "add_special", "parse_special",
/// "with_pieces"}` → `{"tokens": [ids]}`, or `[{"id", "piece"}]` with pieces. Special-token text is
/// text unless `parse_special` is true (llama-server parses it by default).
pub async fn tokenize_text(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r: TokenizeRequest = match read_json(&s, &headers, body).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let TokenizeRequest {
        content,
        add_special,
        parse_special,
        with_pieces,
    } = r;
    let ids = tokenize(&s, move |st, _| {
        let t = &st.tokenizer;
        let mut ids = if parse_special {
            t.encode_special(&content, MAX_TOKENIZE)
        } else {
            t.encode_text(&content, MAX_TOKENIZE)
        }
        .map_err(|e| ApiError::invalid(e.to_string()).param("content"))?;
        if add_special && t.add_bos {
            if let Some(b) = t.bos {
                ids.insert(0, b);
            }
        }
        Ok(ids)
    })
    .await;
    let ids = match ids {
        Ok(i) => i,
        Err(e) => return e.into_response(),
    };
    let tokens: serde_json::Value = if with_pieces {
        ids.iter()
            .map(|&id| {
                let b = s.tokenizer.token_bytes(id);
                match std::str::from_utf8(b) {
                    Ok(p) => json!({"id": id, "piece": p}),
                    Err(_) => json!({"id": id, "piece": b}),
                }
            })
            .collect()
    } else {
        json!(ids)
    };
    axum::Json(json!({ "tokens": tokens })).into_response()
}

/// `POST /detokenize`: `{"tokens": [ids]}` → `{"content": text}`.
pub async fn detokenize(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r: DetokenizeRequest = match read_json(&s, &headers, body).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let n = s.tokenizer.vocab_size();
    if r.tokens.len() > MAX_TOKENIZE {
        return ApiError::invalid(format!("at most {MAX_TOKENIZE} tokens"))
            .param("tokens")
            .into_response();
    }
    if let Some(bad) = r.tokens.iter().find(|&&t| t as usize >= n) {
        return ApiError::invalid(format!("token id {bad} is outside the vocabulary ({n})"))
            .param("tokens")
            .into_response();
    }
    axum::Json(json!({ "content": s.tokenizer.decode(&r.tokens) })).into_response()
}
