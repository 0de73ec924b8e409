//! Request bodies of the OpenAI endpoints, their checks, and the OpenAI-shaped error.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use mens::chat::Message;
use mens::grammar::GrammarSpec;
use mens::sample::SamplerConfig;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::guard::Tenant;
use crate::RETRY_AFTER;

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) kind: &'static str,
    pub(crate) message: String,
    pub(crate) code: Option<&'static str>,
    pub(crate) param: Option<&'static str>,
}

/// Longest error message: request text echoed in one is cut to this many bytes.
pub(crate) const MAX_MESSAGE: usize = 512;

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
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }
    pub(crate) fn param(mut self, p: &'static str) -> Self {
        self.param = Some(p);
        self
    }
    pub fn with_code(mut self, c: &'static str) -> Self {
        self.code = Some(c);
        self
    }
    pub(crate) fn body(&self) -> Value {
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

pub(crate) type ApiResult<T> = Result<T, ApiError>;

#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
pub(crate) struct StreamOptions {
    #[serde(default)]
    pub(crate) include_usage: Option<bool>,
}

/// The fields chat and text completions share.
#[derive(Deserialize)]
pub(crate) struct Common {
    #[serde(default)]
    pub(crate) stream: Option<bool>,
    #[serde(default)]
    pub(crate) stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub(crate) max_tokens: Option<i64>,
    #[serde(default)]
    pub(crate) max_completion_tokens: Option<i64>,
    /// `max_tokens` is only a bound: more than the context has room for (or the server's cap)
    /// is cut to it, not refused (Anthropic's API, whose clients send 32,000 whatever the model).
    #[serde(skip)]
    pub(crate) max_tokens_bound: bool,
    #[serde(default)]
    pub(crate) temperature: Option<f32>,
    #[serde(default)]
    pub(crate) top_p: Option<f32>,
    #[serde(default)]
    pub(crate) top_k: Option<i64>,
    #[serde(default)]
    pub(crate) min_p: Option<f32>,
    #[serde(default)]
    pub(crate) seed: Option<i64>,
    #[serde(default)]
    pub(crate) stop: Option<Stop>,
    #[serde(default)]
    pub(crate) frequency_penalty: Option<f32>,
    #[serde(default)]
    pub(crate) presence_penalty: Option<f32>,
    #[serde(default)]
    pub(crate) repeat_penalty: Option<f32>,
    /// The penalties' window: the last this many tokens (llama-server's and Ollama's; -1: the
    /// whole context, 0: none).
    #[serde(default)]
    pub(crate) repeat_last_n: Option<i64>,
    #[serde(default)]
    pub(crate) n: Option<i64>,
    #[serde(default)]
    pub(crate) model: Option<String>,
    /// An end user's id: prompt caching is shared only within one API key and one `user`.
    #[serde(default)]
    pub(crate) user: Option<String>,
    /// `{"type": "text" | "json_object" | "json_schema", "json_schema": {"schema": …}}`.
    #[serde(default)]
    pub(crate) response_format: Option<Value>,
    /// A grammar in llguidance's Lark syntax the output must follow.
    #[serde(default)]
    pub(crate) grammar: Option<String>,
    /// A regular expression the whole output must match.
    #[serde(default)]
    pub(crate) regex: Option<String>,
    #[serde(default)]
    pub(crate) tools: Option<Value>,
    #[serde(default)]
    pub(crate) tool_choice: Option<Value>,
    /// true: a forced answer may make up to `tools::MAX_CALLS` calls; else one (llama-server's
    /// default: small models forced to call tend to repeat the call until max_tokens).
    #[serde(default)]
    pub(crate) parallel_tool_calls: Option<bool>,
    /// Chat: true/false; completions: the number of alternatives (0–5, legacy shape).
    #[serde(default)]
    pub(crate) logprobs: Option<Value>,
    #[serde(default)]
    pub(crate) top_logprobs: Option<Value>,
    /// Generate to max_tokens even past an end-of-generation token (benchmarks; as llama-server).
    #[serde(default)]
    pub(crate) ignore_eos: Option<bool>,
    /// Extra chat template variables (llama-server's and vLLM's field; Qwen3's `enable_thinking`):
    /// a few plain values, checked by `mens::chat::check_vars`.
    #[serde(default)]
    pub(crate) chat_template_kwargs: Option<Value>,
    /// Most tokens of a leading `<think>` block (-1: unbounded; llama-server's field).
    #[serde(default)]
    pub(crate) thinking_budget_tokens: Option<Value>,
    // Not supported yet: refused when set to anything but its neutral value.
    #[serde(default)]
    pub(crate) logit_bias: Option<Value>,
}

/// How a chat request uses tools.
#[derive(Default)]
pub(crate) struct ToolUse {
    /// Definitions handed to the template (none for `tool_choice: "none"`).
    pub(crate) tools: Vec<Value>,
    /// Parse `<tool_call>` blocks of the answer into `tool_calls`.
    pub(crate) parse: bool,
    /// Force calls (`required`, or a named function): the grammar that does it, calls only.
    pub(crate) grammar: Option<String>,
    /// What forces them: the function (`None`: any), how many calls, the format.
    forced: Option<(Option<String>, usize, mens::tools::CallFormat)>,
}

impl ToolUse {
    /// The forcing grammar when the answer may reason first (see `mens::tools::Reasoning`).
    pub(crate) fn grammar_with(&self, reasoning: mens::tools::Reasoning) -> Option<String> {
        let (only, calls, format) = self.forced.as_ref()?;
        mens::tools::call_grammar(&self.tools, only.as_deref(), *format, *calls, reasoning).ok()
    }
}

/// Most tools one request may define.
pub(crate) const MAX_TOOLS: usize = 128;

#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
pub(crate) struct ContentPart {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    #[serde(default)]
    pub(crate) text: Option<String>,
}

#[derive(Deserialize)]
pub(crate) struct ChatMessage {
    pub(crate) role: String,
    #[serde(default)]
    pub(crate) content: Option<Content>,
    /// An assistant turn's calls: `[{"id", "type": "function", "function": {"name", "arguments"}}]`.
    #[serde(default)]
    pub(crate) tool_calls: Option<Vec<Value>>,
    #[serde(default)]
    pub(crate) tool_call_id: Option<String>,
    #[serde(default)]
    pub(crate) name: Option<String>,
    /// An assistant turn's reasoning, as llama-server returned it (handed to the template).
    #[serde(default)]
    pub(crate) reasoning_content: Option<String>,
}

#[derive(Deserialize)]
pub(crate) struct ChatRequest {
    pub(crate) messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub(crate) common: Common,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    /// llama-server's mixed prompt: token ids and strings in one list (`[12, "text", 34]`).
    Mixed(Vec<PromptPiece>),
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum PromptPiece {
    Id(u32),
    Text(String),
}

/// llama-server's native `/completion` body (Continue's "llama.cpp" provider and other tools):
/// `prompt`, `n_predict`, sampling fields, `stream`; answered in the native shape (`content`).
#[derive(Deserialize)]
pub(crate) struct NativeRequest {
    pub(crate) prompt: Prompt,
    #[serde(default)]
    pub(crate) parse_special: bool,
    /// Per-token probabilities (llama-server's `completion_probabilities`): not supported.
    #[serde(default)]
    pub(crate) n_probs: Option<i64>,
    #[serde(flatten)]
    pub(crate) native: NativeFields,
    #[serde(flatten)]
    pub(crate) common: Common,
}

/// The generation fields of llama-server's native endpoints (`/infill`, `/completion`).
#[derive(Deserialize)]
pub(crate) struct NativeFields {
    /// Tokens to generate: -1 (or absent) the rest of the context, 0 only caches the prompt.
    #[serde(default)]
    pub(crate) n_predict: Option<i64>,
    /// Generation time limit in milliseconds.
    #[serde(default)]
    pub(crate) t_max_predict_ms: Option<u64>,
    /// The least indentation of the completion's later lines (the cursor line's).
    #[serde(default)]
    pub(crate) n_indent: Option<i64>,
}

/// What the native fields ask of a generation.
pub(crate) struct NativeLimits {
    /// `n_predict` 0: the prompt is only cached (one token is made and not sent).
    pub(crate) quiet: bool,
    pub(crate) deadline: Option<std::time::Duration>,
    /// `n_indent` (≤ 0: off).
    pub(crate) min_indent: usize,
}

impl NativeFields {
    /// Checks them and sets `common.max_tokens` from `n_predict`.
    pub(crate) fn limits(&self, common: &mut Common) -> ApiResult<NativeLimits> {
        if let Some(n) = self.n_predict {
            common.max_tokens = (n >= 0).then_some(n.max(1));
        }
        let min_indent = match self.n_indent {
            None => 0,
            Some(n) if n <= 0 => 0,
            Some(n) if n <= 1 << 16 => n as usize,
            Some(n) => {
                return Err(ApiError::invalid(format!(
                    "n_indent must be at most {}, got {n}",
                    1 << 16
                ))
                .param("n_indent"))
            }
        };
        Ok(NativeLimits {
            quiet: self.n_predict == Some(0),
            deadline: self.t_max_predict_ms.map(std::time::Duration::from_millis),
            min_indent,
        })
    }
}

#[derive(Deserialize)]
pub(crate) struct CompletionRequest {
    pub(crate) prompt: Prompt,
    /// Parse special-token text in the prompt (`<|im_start|>`) as control tokens (llama-server's
    /// `parse_special`). Off by default: request text is text.
    #[serde(default)]
    pub(crate) parse_special: bool,
    #[serde(default)]
    pub(crate) suffix: Option<String>,
    #[serde(flatten)]
    pub(crate) common: Common,
}

/// llama-server's `/infill` body (the shape llama.vscode and llama.vim send). Fields it sends that
/// mens has no use for (`samplers`, `cache_prompt`, `t_max_prompt_ms`) are accepted.
#[derive(Deserialize)]
pub(crate) struct InfillRequest {
    #[serde(default)]
    pub(crate) input_prefix: String,
    #[serde(default)]
    pub(crate) input_suffix: String,
    #[serde(default)]
    pub(crate) input_extra: Vec<ExtraChunk>,
    /// The text of the cursor's line before the cursor (after the prefix).
    #[serde(default)]
    pub(crate) prompt: String,
    #[serde(flatten)]
    pub(crate) native: NativeFields,
    #[serde(flatten)]
    pub(crate) common: Common,
}

#[derive(Deserialize)]
pub(crate) struct ExtraChunk {
    #[serde(default)]
    pub(crate) filename: Option<String>,
    #[serde(default)]
    pub(crate) text: String,
}

/// Most `input_extra` chunks one request may send.
pub(crate) const MAX_EXTRA: usize = 1024;

pub(crate) const MAX_STOPS: usize = 16;
pub(crate) const MAX_STOP_LEN: usize = 256;

/// A JSON value that leaves a feature off: absent, null, false, 0, "", [] or {}.
pub(crate) fn neutral(v: &Option<Value>) -> bool {
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => true,
        Some(Value::Number(n)) => n.as_f64() == Some(0.0),
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(Value::Object(o)) => o.is_empty(),
        _ => false,
    }
}

impl Common {
    /// A text completion's checks (no chat): the model's name, and no tools.
    pub(crate) fn check_text(&self, model_name: &str) -> ApiResult<()> {
        self.check_supported(model_name)?;
        if !neutral(&self.tools) || !neutral(&self.tool_choice) {
            return Err(ApiError::invalid("tools are for /v1/chat/completions").param("tools"));
        }
        Ok(())
    }

    /// Refuse what the server cannot do yet, rather than ignore it.
    pub(crate) fn check_supported(&self, model_name: &str) -> ApiResult<()> {
        check_model(self.model.as_deref(), model_name)
    }

    /// The grammar the output must follow: `response_format`, `grammar` or `regex` (one of them).
    pub(crate) fn grammar_spec(&self) -> ApiResult<Option<GrammarSpec>> {
        let mut specs = Vec::new();
        if let Some(f) = self.response_format.as_ref().filter(|f| !f.is_null()) {
            let kind = f.get("type").and_then(Value::as_str);
            match kind {
                Some("text") => {}
                Some("json_object") => specs.push(GrammarSpec::JsonObject),
                Some("json_schema") => {
                    let js = f.get("json_schema");
                    // OpenAI nests it as json_schema.schema; llama-server also takes `schema`.
                    let schema = js
                        .and_then(|j| j.get("schema"))
                        .or_else(|| f.get("schema"))
                        .cloned()
                        .unwrap_or_else(|| serde_json::json!({}));
                    specs.push(GrammarSpec::JsonSchema(schema));
                }
                _ => {
                    return Err(ApiError::invalid(
                        "response_format.type must be \"text\", \"json_object\" or \"json_schema\"",
                    )
                    .param("response_format"))
                }
            }
        }
        if let Some(g) = &self.grammar {
            specs.push(GrammarSpec::Lark(g.clone()));
        }
        if let Some(r) = &self.regex {
            specs.push(GrammarSpec::Regex(r.clone()));
        }
        if specs.len() > 1 {
            return Err(ApiError::invalid(
                "give at most one of response_format (JSON), grammar and regex",
            ));
        }
        Ok(specs.pop())
    }

    /// Log-probabilities: None, or the number of alternatives per token. `chat`: OpenAI's chat
    /// fields (`logprobs: true`, `top_logprobs: 0..20`); else the legacy `logprobs: 0..5`.
    pub(crate) fn logprobs(&self, chat: bool) -> ApiResult<Option<usize>> {
        let max = mens::sample::MAX_TOP_LOGPROBS as i64;
        if chat {
            let on = match &self.logprobs {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(
                        ApiError::invalid("logprobs must be true or false").param("logprobs")
                    )
                }
            };
            let top = match &self.top_logprobs {
                None | Some(Value::Null) => 0,
                Some(v) => match v.as_i64() {
                    Some(n) if (0..=max).contains(&n) => n,
                    _ => {
                        return Err(ApiError::invalid(format!(
                            "top_logprobs must be an integer from 0 to {max}"
                        ))
                        .param("top_logprobs"))
                    }
                },
            };
            if top > 0 && !on {
                return Err(
                    ApiError::invalid("top_logprobs needs logprobs: true").param("top_logprobs")
                );
            }
            Ok(on.then_some(top as usize))
        } else {
            match &self.logprobs {
                None | Some(Value::Null) => Ok(None),
                Some(v) => match v.as_i64() {
                    Some(n) if (0..=5).contains(&n) => Ok(Some(n as usize)),
                    _ => Err(ApiError::invalid("logprobs must be an integer from 0 to 5")
                        .param("logprobs")),
                },
            }
        }
    }

    /// What the request's `tools` and `tool_choice` ask for (chat only).
    pub(crate) fn tool_use(&self, format: mens::tools::CallFormat) -> ApiResult<ToolUse> {
        let tools: Vec<Value> = match &self.tools {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a.clone(),
            Some(_) => return Err(ApiError::invalid("tools must be a list").param("tools")),
        };
        if tools.len() > MAX_TOOLS {
            return Err(
                ApiError::invalid(format!("tools takes at most {MAX_TOOLS} tools")).param("tools"),
            );
        }
        for t in &tools {
            let ok = t.get("type").and_then(Value::as_str).unwrap_or("function") == "function"
                && mens::tools::tool_name(t).is_some_and(|n| !n.is_empty());
            if !ok {
                return Err(ApiError::invalid(
                    "each tool must be {\"type\": \"function\", \"function\": {\"name\": …, \"parameters\": …}}",
                )
                .param("tools"));
            }
        }
        let forced: Option<Option<String>> = match &self.tool_choice {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) if c == "auto" => None,
            Some(Value::String(c)) if c == "none" => {
                return Ok(ToolUse::default());
            }
            Some(Value::String(c)) if c == "required" => Some(None),
            Some(v) => match v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
            {
                Some(n) => Some(Some(n.to_string())),
                None => {
                    return Err(ApiError::invalid(
                        "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}",
                    )
                    .param("tool_choice"))
                }
            },
        };
        if tools.is_empty() {
            if forced.is_some() {
                return Err(ApiError::invalid("tool_choice requires tools").param("tool_choice"));
            }
            return Ok(ToolUse::default());
        }
        let calls = match self.parallel_tool_calls {
            Some(true) => mens::tools::MAX_CALLS,
            _ => 1,
        };
        let grammar = match &forced {
            Some(only) => Some(
                mens::tools::call_grammar(
                    &tools,
                    only.as_deref(),
                    format,
                    calls,
                    mens::tools::Reasoning::None,
                )
                .map_err(|e| ApiError::invalid(e.to_string()).param("tool_choice"))?,
            ),
            None => None,
        };
        Ok(ToolUse {
            tools,
            parse: true,
            grammar,
            forced: forced.map(|only| (only, calls, format)),
        })
    }

    /// `thinking_budget_tokens`: `None` when absent (the server's default), `Some(None)` for -1
    /// (unbounded), else the budget.
    pub(crate) fn thinking_budget(&self) -> ApiResult<Option<Option<usize>>> {
        match &self.thinking_budget_tokens {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_i64() {
                Some(-1) => Ok(Some(None)),
                Some(n) if n >= 0 => Ok(Some(Some(n.try_into().unwrap_or(usize::MAX)))),
                _ => Err(ApiError::invalid(
                    "thinking_budget_tokens must be -1 (unbounded) or a number of tokens",
                )
                .param("thinking_budget_tokens")),
            },
        }
    }

    /// `chat_template_kwargs` as template variables (checked).
    pub(crate) fn template_vars(&self) -> ApiResult<mens::chat::Vars> {
        let vars = match &self.chat_template_kwargs {
            None | Some(Value::Null) => return Ok(mens::chat::Vars::new()),
            Some(Value::Object(o)) => o.clone(),
            Some(_) => {
                return Err(ApiError::invalid("chat_template_kwargs must be an object")
                    .param("chat_template_kwargs"))
            }
        };
        mens::chat::check_vars(&vars)
            .map_err(|e| ApiError::invalid(e.to_string()).param("chat_template_kwargs"))?;
        Ok(vars)
    }

    /// The tenant whose cached prompts this request may reuse: its API key and `user`.
    pub(crate) fn tenant(&self, key: Tenant) -> u64 {
        tenant_of(key, self.user.as_deref())
    }

    /// `logit_bias` as (token, bias) pairs: OpenAI's object of token ids (as strings) to
    /// biases, or llama-server's list of `[id, bias]` pairs where a bias of `false` bans the
    /// token (taken as -100). The sampler's checks (`validate`, `check_tokens`) follow.
    fn logit_bias(&self) -> ApiResult<Vec<(u32, f32)>> {
        let bad = |m: String| ApiError::invalid(m).param("logit_bias");
        let entry = |id: &Value, b: &Value| -> ApiResult<(u32, f32)> {
            let id = match id {
                Value::String(s) => s.trim().parse::<u64>().ok(),
                Value::Number(n) => n.as_u64(),
                _ => None,
            }
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| bad(format!("logit_bias keys must be token ids, got {id}")))?;
            let b = match b {
                Value::Bool(false) => -100.0,
                Value::Number(n) => n.as_f64().unwrap_or(f64::NAN) as f32,
                _ => return Err(bad(format!("a logit bias must be a number, got {b}"))),
            };
            Ok((id, b))
        };
        let out = match &self.logit_bias {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Object(o)) if o.len() <= mens::sample::MAX_LOGIT_BIAS => o
                .iter()
                .map(|(k, v)| entry(&Value::String(k.clone()), v))
                .collect::<ApiResult<_>>()?,
            Some(Value::Array(a)) if a.len() <= mens::sample::MAX_LOGIT_BIAS => a
                .iter()
                .map(|p| match p.as_array().map(Vec::as_slice) {
                    Some([id, b]) => entry(id, b),
                    _ => Err(bad(
                        "logit_bias as a list takes [token id, bias] pairs".into()
                    )),
                })
                .collect::<ApiResult<_>>()?,
            Some(Value::Object(_) | Value::Array(_)) => {
                return Err(bad(format!(
                    "logit_bias takes at most {} entries",
                    mens::sample::MAX_LOGIT_BIAS
                )))
            }
            Some(_) => {
                return Err(bad(
                    "logit_bias must be an object of token ids to biases".into()
                ))
            }
        };
        Ok(out)
    }

    pub(crate) fn sampler(&self, vocab: usize) -> ApiResult<SamplerConfig> {
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
        match self.repeat_last_n {
            None => {}
            Some(-1) => c.repeat_last_n = 1 << 20,
            Some(n) if (0..=1 << 20).contains(&n) => c.repeat_last_n = n as usize,
            Some(n) => {
                return Err(ApiError::invalid(format!(
                    "repeat_last_n must be -1 (the whole context) or between 0 and {}, got {n}",
                    1 << 20
                ))
                .param("repeat_last_n"))
            }
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
        c.logit_bias = self.logit_bias()?;
        c.validate().map_err(|e| ApiError::invalid(e.to_string()))?;
        c.check_tokens(vocab)
            .map_err(|e| ApiError::invalid(e.to_string()).param("logit_bias"))?;
        Ok(c)
    }

    pub(crate) fn stops(&self) -> ApiResult<Vec<String>> {
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
    /// cap (or cut to them: `max_tokens_bound`, or `fit` from the server's `--fit-max-tokens`);
    /// absent: the rest of the context, at most the cap.
    pub(crate) fn max_tokens(
        &self,
        prompt: usize,
        ctx: usize,
        cap: Option<usize>,
        fit: bool,
    ) -> ApiResult<usize> {
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
            Some(n) if n >= 1 && (self.max_tokens_bound || fit) => {
                Ok((ctx - prompt).min(cap).min(n.min(usize::MAX as i64) as usize))
            }
            Some(n) if n < 1 => {
                Err(ApiError::invalid(format!("{name} must be ≥ 1, got {n}")).param(name))
            }
            Some(n) if n as u64 > cap as u64 => Err(ApiError::invalid(format!(
                "{name} = {n} is above this server's limit of {cap} tokens per request"
            ))
            .param(name)),
            Some(n) if prompt as i64 + n > ctx as i64 => Err(ApiError::invalid(format!(
                "the prompt ({prompt} tokens) + {name} ({n}) exceed the context of {ctx} tokens; shorten the prompt or lower {name} (a server started with --fit-max-tokens cuts it to fit)"
            ))
            .param(name)
            .with_code("context_length_exceeded")),
            Some(n) => Ok(n as usize),
        }
    }
}

pub(crate) const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// Checked messages, their content flattened to text.
pub(crate) fn chat_messages(
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
        let mut msg = Message::new(role, &content);
        for c in m.tool_calls.iter().flatten() {
            let f = c.get("function");
            let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
            let Some(name) = name else {
                return Err(ApiError::invalid(
                    "each tool call must have function.name and function.arguments",
                )
                .param("messages"));
            };
            // Templates write the arguments with `tojson`: give them the JSON value, not its text.
            let args = match f.and_then(|f| f.get("arguments")) {
                Some(Value::String(t)) => {
                    serde_json::from_str(t).unwrap_or_else(|_| Value::String(t.clone()))
                }
                Some(v) => v.clone(),
                None => json!({}),
            };
            msg.tool_calls.push(json!({
                "id": c.get("id").cloned().unwrap_or(Value::Null),
                "type": "function",
                "function": {"name": name, "arguments": args},
            }));
        }
        msg.tool_call_id = m.tool_call_id.clone();
        msg.name = m.name.clone();
        msg.reasoning_content = m.reasoning_content.clone().filter(|_| role == "assistant");
        msgs.push(msg);
    }
    Ok(msgs)
}

/// The first bytes of request text quoted in an error.
pub(crate) fn clip(s: &str) -> &str {
    let mut end = s.len().min(64);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

pub(crate) fn engine_error(m: String) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", m)
}

#[derive(Deserialize)]
pub(crate) struct TokenizeRequest {
    #[serde(default)]
    pub(crate) content: String,
    #[serde(default)]
    pub(crate) add_special: bool,
    #[serde(default)]
    pub(crate) parse_special: bool,
    #[serde(default)]
    pub(crate) with_pieces: bool,
}

#[derive(Deserialize)]
pub(crate) struct DetokenizeRequest {
    #[serde(default)]
    pub(crate) tokens: Vec<u32>,
}

/// A request's `model` must name the served model (or be empty or absent).
pub(crate) fn check_model(model: Option<&str>, model_name: &str) -> ApiResult<()> {
    if let Some(m) = model {
        // `NAME:latest` is the name Ollama's `/api/tags` lists (and Ollama's own OpenAI
        // routes take, as `codex --oss` sends it).
        let listed = m.strip_suffix(":latest") == Some(model_name);
        if !m.is_empty() && m != model_name && !listed {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("the model '{m}' does not exist here: this server serves '{model_name}'"),
            )
            .param("model")
            .with_code("model_not_found"));
        }
    }
    Ok(())
}

/// A request's tenant: its API key's, split further by OpenAI's `user` field.
pub(crate) fn tenant_of(key: Tenant, user: Option<&str>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (key.0, user).hash(&mut h);
    h.finish()
}
