//! An OpenAI-compatible HTTP server over the mens engine: routes, JSON types, server-sent events,
//! API keys and limits. Thin: it renders and tokenizes prompts, checks requests, hands them to the
//! engine's [`Scheduler`] and turns its events into HTTP responses.

mod api;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use mens::chat::ChatTemplate;
use mens::scheduler::Scheduler;
use mens::tokenizer::Tokenizer;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub use api::ApiError;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Required as `Authorization: Bearer KEY` on /v1/ routes when set.
    pub api_key: Option<String>,
    /// Largest request body, in bytes (413 beyond).
    pub body_limit: usize,
    /// The name `/v1/models` lists and responses carry.
    pub model_name: String,
    /// A connection that sends no complete request header within this time is closed.
    pub header_timeout: Duration,
    /// Connections served at once; more wait in the kernel's accept backlog.
    pub max_connections: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            api_key: None,
            body_limit: 8 << 20,
            model_name: "mens".into(),
            header_timeout: Duration::from_secs(30),
            max_connections: 256,
        }
    }
}

pub struct AppState {
    pub scheduler: Scheduler,
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    pub config: ServerConfig,
    /// Unix time the server started (the model's `created`).
    pub created: u64,
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(api::models))
        .route("/v1/chat/completions", post(api::chat_completions))
        .route("/v1/completions", post(api::completions))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth))
        .with_state(state)
}

async fn health(State(s): State<Arc<AppState>>) -> Response {
    let st = s.scheduler.status();
    let o = s.scheduler.options();
    axum::Json(serde_json::json!({
        "status": "ok",
        "slots": o.slots,
        "slots_busy": st.active.load(std::sync::atomic::Ordering::SeqCst),
        "queued": st.queued.load(std::sync::atomic::Ordering::SeqCst),
        "queue_limit": o.queue,
        "ctx_per_slot": o.ctx,
    }))
    .into_response()
}

async fn not_found() -> Response {
    ApiError::new(StatusCode::NOT_FOUND, "not_found_error", "no such route").into_response()
}

/// API key check for /v1/ routes (`/health` stays open, as llama-server's).
async fn auth(
    State(s): State<Arc<AppState>>,
    req: Request<Body>,
    next: axum::middleware::Next,
) -> Response {
    if let Some(key) = &s.config.api_key {
        if req.uri().path().starts_with("/v1/") && !key_matches(req.headers(), key) {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "invalid or missing API key (send Authorization: Bearer KEY)",
            )
            .with_code("invalid_api_key")
            .into_response();
        }
    }
    next.run(req).await
}

fn key_matches(h: &HeaderMap, key: &str) -> bool {
    let Some(v) = h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let Some(given) = v.strip_prefix("Bearer ") else {
        return false;
    };
    // Constant-time comparison: the time does not tell how much of the key matched.
    let (a, b) = (given.trim().as_bytes(), key.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Serve HTTP/1.1 on `listener` until `shutdown` completes. Each connection gets a header-read
/// timeout (idle keep-alive connections are closed) and at most `max_connections` are served at once.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let app = router(state.clone());
    let permits = Arc::new(Semaphore::new(state.config.max_connections.max(1)));
    let timeout = state.config.header_timeout;
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("semaphore is never closed"),
            _ = &mut shutdown => return Ok(()),
        };
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => return Ok(()),
        };
        let _ = stream.set_nodelay(true);
        let svc = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(timeout)
                .serve_connection(TokioIo::new(stream), svc);
            let _ = conn.await;
            drop(permit);
        });
    }
}

/// `Retry-After` for 503 answers, in seconds.
pub(crate) const RETRY_AFTER: HeaderValue = HeaderValue::from_static("1");
