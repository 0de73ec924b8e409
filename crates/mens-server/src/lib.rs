//! An OpenAI-compatible HTTP server over the mens engine: routes, JSON types, server-sent events,
//! API keys and limits. Thin: it renders and tokenizes prompts, checks requests, hands them to the
//! engine's [`Scheduler`] and turns its events into HTTP responses. The threat model and every limit
//! are in docs/SECURITY.md.

mod anthropic;
mod api;
mod conn;
mod embed;
mod guard;
mod metrics;
mod ollama;
mod request;
mod responses;
mod sse;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use mens::chat::ChatTemplate;
use mens::grammar::Grammars;
use mens::scheduler::Scheduler;
use mens::tokenizer::Tokenizer;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub use api::prepare;
pub use ollama::ModelCard;
pub use request::ApiError;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// When not empty, /v1/ routes require one of these as `Authorization: Bearer KEY` (or
    /// `x-api-key`). Each key is its own tenant: cached prompts are never shared between keys.
    pub api_keys: Vec<String>,
    /// Largest request body, in bytes (413 beyond).
    pub body_limit: usize,
    /// The name `/v1/models` lists and responses carry.
    pub model_name: String,
    /// A connection that sends no complete request header within this time is closed; a body has
    /// this long plus its size at `min_body_rate`.
    pub header_timeout: Duration,
    /// Slowest accepted body upload, bytes per second.
    pub min_body_rate: usize,
    /// Connections served at once (see `conn`).
    pub max_connections: usize,
    /// Connections from one client address.
    pub max_connections_per_client: usize,
    /// Browser origins allowed to call the API (CORS); others get 403. Requests without `Origin`
    /// (every non-browser client) are not affected.
    pub cors_origins: Vec<String>,
    /// Host header values accepted (DNS rebinding); `None` accepts any.
    pub allowed_hosts: Option<Vec<String>>,
    /// Most tokens one request may generate (`max_tokens` above it is refused; absent: this).
    pub max_tokens_cap: Option<usize>,
    /// A `max_tokens` over what the context (or the cap) holds is cut to fit, as llama-server
    /// does, instead of refused (`--fit-max-tokens`; Anthropic's API always cuts).
    pub fit_max_tokens: bool,
    /// Longest a request may generate for; then it ends with `finish_reason: "length"`.
    pub request_timeout: Option<Duration>,
    /// Prompts tokenized at once (each is CPU work off the async workers).
    pub tokenize_parallel: usize,
    /// Chat answers: a leading `<think>` block goes to `reasoning_content` (llama-server's
    /// `--reasoning-format deepseek`); false leaves it in the text.
    pub split_reasoning: bool,
    /// Most tokens a leading `<think>` block may hold before its closing tag is forced (a
    /// request's `thinking_budget_tokens`, or Anthropic's `thinking.budget_tokens`, overrides it;
    /// llama-server's `--reasoning-budget`). `None`: unbounded.
    pub reasoning_budget: Option<usize>,
    /// Text forced before the closing tag when the budget is spent (`--reasoning-budget-message`).
    pub reasoning_budget_message: String,
    /// What the Ollama API's `/api/tags`, `/api/ps` and `/api/show` say of the model.
    pub model: ModelCard,
    /// How an embedding request's rows become one vector (`--pooling`; by default the file's
    /// `pooling_type`, else mean).
    pub pooling: mens::embed::Pooling,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            api_keys: Vec::new(),
            body_limit: 8 << 20,
            model_name: "mens".into(),
            header_timeout: Duration::from_secs(30),
            min_body_rate: 64 << 10,
            max_connections: 256,
            max_connections_per_client: 128,
            cors_origins: Vec::new(),
            allowed_hosts: Some(loopback_hosts()),
            max_tokens_cap: None,
            fit_max_tokens: false,
            request_timeout: None,
            tokenize_parallel: std::thread::available_parallelism().map_or(2, |n| n.get()),
            split_reasoning: true,
            reasoning_budget: None,
            reasoning_budget_message: String::new(),
            model: ModelCard::default(),
            pooling: mens::embed::Pooling::Mean,
        }
    }
}

/// The host names a loopback-bound server answers to.
pub fn loopback_hosts() -> Vec<String> {
    ["localhost", "127.0.0.1", "[::1]", "::1"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

pub struct AppState {
    pub scheduler: Scheduler,
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    pub config: ServerConfig,
    /// Unix time the server started (the model's `created`).
    pub created: u64,
    /// Bounds concurrent prompt tokenization and grammar compilation.
    pub(crate) tokenizing: Semaphore,
    /// The grammar compiler (its token trie), built at the first structured-output request.
    grammars: std::sync::OnceLock<std::result::Result<Arc<Grammars>, String>>,
    connections: Arc<conn::Registry>,
    pub(crate) metrics: Arc<metrics::Metrics>,
}

impl AppState {
    pub fn new(
        scheduler: Scheduler,
        tokenizer: Arc<Tokenizer>,
        template: ChatTemplate,
        config: ServerConfig,
    ) -> Self {
        AppState {
            scheduler,
            tokenizer,
            template,
            tokenizing: Semaphore::new(config.tokenize_parallel.max(1)),
            config,
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            connections: Arc::default(),
            metrics: Arc::default(),
            grammars: std::sync::OnceLock::new(),
        }
    }

    /// The grammar compiler for this model's vocabulary (built once; blocking).
    pub(crate) fn grammars(&self) -> std::result::Result<Arc<Grammars>, ApiError> {
        self.grammars
            .get_or_init(|| {
                Grammars::new(self.tokenizer.clone())
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|e| request::engine_error(format!("the grammar engine failed: {e}")))
    }
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/v1/models", get(api::models))
        .route("/v1/chat/completions", post(api::chat_completions))
        .route("/v1/completions", post(api::completions))
        .route("/v1/embeddings", post(embed::openai))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/responses", post(responses::responses))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        // llama-server's other names for these (Continue's `llama.cpp` provider posts to
        // `/chat/completions`), and its input-token counters.
        .route("/models", get(api::models))
        .route("/chat/completions", post(api::chat_completions))
        .route("/responses", post(responses::responses))
        .route("/embedding", post(embed::native))
        .route("/embeddings", post(embed::native))
        .route(
            "/v1/chat/completions/input_tokens",
            post(api::chat_input_tokens),
        )
        .route(
            "/chat/completions/input_tokens",
            post(api::chat_input_tokens),
        )
        .route("/v1/responses/input_tokens", post(responses::input_tokens))
        .route("/responses/input_tokens", post(responses::input_tokens))
        .route("/infill", post(api::infill))
        .route("/completion", post(api::native_completion))
        .route("/completions", post(api::native_completion))
        .route("/api/chat", post(ollama::api_chat))
        .route("/api/generate", post(ollama::api_generate))
        .route("/api/show", post(ollama::show))
        .route("/api/tags", get(ollama::tags))
        .route("/api/ps", get(ollama::ps))
        .route("/api/version", get(ollama::version))
        .route("/api/embed", post(embed::ollama_embed))
        .route("/api/embeddings", post(embed::ollama_embeddings))
        .route("/props", get(api::props))
        .route("/apply-template", post(api::apply_template))
        .route("/tokenize", post(api::tokenize_text))
        .route("/detokenize", post(api::detokenize))
        .route("/metrics", get(metrics::metrics))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::check,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            metrics::track,
        ))
        .layer(axum::middleware::from_fn(conn::track))
        .with_state(state)
}

async fn health(axum::extract::State(s): axum::extract::State<Arc<AppState>>) -> Response {
    let st = s.scheduler.status();
    let o = s.scheduler.options();
    axum::Json(serde_json::json!({
        "status": "ok",
        "slots": o.slots,
        "slots_busy": st.active.load(std::sync::atomic::Ordering::SeqCst),
        "queued": st.queued.load(std::sync::atomic::Ordering::SeqCst),
        "queue_limit": o.queue,
        "ctx_per_slot": o.ctx,
        "connections": s.connections.open(),
    }))
    .into_response()
}

async fn not_found() -> Response {
    ApiError::new(StatusCode::NOT_FOUND, "not_found_error", "no such route").into_response()
}

/// Serve HTTP/1.1 on `listener` until `shutdown` completes (connection limits: see `conn`).
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let c = &state.config;
    let limits = (c.max_connections, c.max_connections_per_client);
    let timeout = c.header_timeout;
    let registry = state.connections.clone();
    conn::accept_loop(
        listener,
        router(state.clone()),
        registry,
        limits,
        timeout,
        shutdown,
    )
    .await
}

/// `Retry-After` for 503 answers, in seconds.
pub(crate) const RETRY_AFTER: HeaderValue = HeaderValue::from_static("1");
