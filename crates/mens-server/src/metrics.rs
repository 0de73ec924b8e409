//! Operations: a request id and a structured log line per request (`tracing`), and `GET /metrics`
//! in Prometheus's text format. The format is a few lines of text, written here by hand: a metrics
//! crate would bring its own registry and HTTP stack for what this file does.

use crate::AppState;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use mens::scheduler::Usage;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tracing::Instrument;

/// Histogram bucket bounds in seconds.
const TTFT_BOUNDS: [f64; 12] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const TPOT_BOUNDS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0,
];

struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative); the last is +Inf.
    counts: Vec<AtomicU64>,
    sum_us: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
        }
    }
    fn observe(&self, secs: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add((secs * 1e6) as u64, Ordering::Relaxed);
    }
    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (i, c) in self.counts.iter().enumerate() {
            cum += c.load(Ordering::Relaxed);
            let le = match self.bounds.get(i) {
                Some(b) => b.to_string(),
                None => "+Inf".into(),
            };
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cum}");
        }
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {cum}");
    }
}

pub(crate) struct Metrics {
    /// (route, status) → requests. Routes are the server's own paths ("other" for any unknown
    /// path), so a client cannot grow this map.
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    ttft: Histogram,
    tpot: Histogram,
    next_id: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Mutex::default(),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            ttft: Histogram::new(&TTFT_BOUNDS),
            tpot: Histogram::new(&TPOT_BOUNDS),
            next_id: AtomicU64::new(1),
        }
    }
}

/// The routes counted by name.
const ROUTES: [&str; 35] = [
    "/health",
    "/v1/health",
    "/metrics",
    "/v1/models",
    "/models",
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/chat/completions/input_tokens",
    "/chat/completions/input_tokens",
    "/responses",
    "/v1/responses/input_tokens",
    "/responses/input_tokens",
    "/v1/embeddings",
    "/embeddings",
    "/embedding",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/infill",
    "/tokenize",
    "/detokenize",
    "/completion",
    "/completions",
    "/api/generate",
    "/api/chat",
    "/api/tags",
    "/api/show",
    "/api/ps",
    "/api/version",
    "/api/embed",
    "/api/embeddings",
    "/props",
    "/apply-template",
    "other",
];

impl Metrics {
    /// A finished generation's counts and latencies.
    pub(crate) fn finished(&self, u: &Usage) {
        self.prompt_tokens
            .fetch_add(u.prompt_tokens as u64, Ordering::Relaxed);
        self.generated_tokens
            .fetch_add(u.completion_tokens as u64, Ordering::Relaxed);
        self.cached_tokens
            .fetch_add(u.cached_tokens as u64, Ordering::Relaxed);
        if u.completion_tokens > 0 {
            let ttft = u.time_to_first_token.as_secs_f64();
            self.ttft.observe(ttft);
            if u.completion_tokens > 1 {
                let rest = (u.total.as_secs_f64() - ttft).max(0.0);
                self.tpot.observe(rest / (u.completion_tokens - 1) as f64);
            }
        }
    }

    fn count(&self, route: &'static str, status: u16) {
        let mut m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((route, status)).or_insert(0) += 1;
    }

    fn render(&self, s: &AppState) -> String {
        let mut out = String::with_capacity(4096);
        let _ = writeln!(
            out,
            "# HELP mens_requests_total HTTP requests by route and status.\n# TYPE mens_requests_total counter"
        );
        for ((route, status), n) in self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "mens_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        };
        let gauge = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(
            &mut out,
            "mens_prompt_tokens_total",
            "Prompt tokens of finished requests.",
            ld(&self.prompt_tokens),
        );
        counter(
            &mut out,
            "mens_generated_tokens_total",
            "Tokens generated by finished requests.",
            ld(&self.generated_tokens),
        );
        counter(
            &mut out,
            "mens_cache_reused_tokens_total",
            "Prompt tokens found in a slot's KV cache and not prefilled again.",
            ld(&self.cached_tokens),
        );
        self.ttft.write(
            &mut out,
            "mens_time_to_first_token_seconds",
            "From admission to the first generated token.",
        );
        self.tpot.write(
            &mut out,
            "mens_time_per_output_token_seconds",
            "Mean time per generated token after the first, per request.",
        );
        let st = s.scheduler.status();
        let o = s.scheduler.options();
        let u = |x: usize| x as u64;
        gauge(
            &mut out,
            "mens_slots",
            "Sequences decoded together.",
            u(o.slots),
        );
        gauge(
            &mut out,
            "mens_slots_busy",
            "Slots holding a request.",
            u(st.active.load(Ordering::SeqCst)),
        );
        gauge(
            &mut out,
            "mens_queue_length",
            "Requests waiting for a slot.",
            u(st.queued.load(Ordering::SeqCst)),
        );
        gauge(
            &mut out,
            "mens_kv_cache_tokens",
            "Tokens held in the slots' KV caches.",
            u(st.kv_tokens.load(Ordering::Relaxed)),
        );
        gauge(
            &mut out,
            "mens_kv_cache_capacity_tokens",
            "Tokens the slots' KV caches can hold.",
            u(o.slots * o.ctx),
        );
        gauge(
            &mut out,
            "mens_kv_pages_used",
            "Pages of the paged KV pool held by requests and kept caches (0 without a paged pool).",
            u(st.kv_pages_used.load(Ordering::Relaxed)),
        );
        gauge(
            &mut out,
            "mens_kv_pages",
            "Pages in the paged KV pool (0 without a paged pool).",
            u(st.kv_pages.load(Ordering::Relaxed)),
        );
        gauge(
            &mut out,
            "mens_kv_cache_bytes",
            "Bytes of KV cache allocated.",
            u(st.kv_bytes.load(Ordering::Relaxed)),
        );
        counter(
            &mut out,
            "mens_preempted_total",
            "Requests whose KV pages went to others (a paged pool ran out); each resumed by computing its text again.",
            st.preempted.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "mens_spec_proposed_tokens_total",
            "Speculative decoding: tokens proposed.",
            st.spec_proposed.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "mens_spec_accepted_tokens_total",
            "Speculative decoding: proposed tokens the model agreed with.",
            st.spec_accepted.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "mens_steps_total",
            "Forward passes run.",
            st.steps.load(Ordering::Relaxed),
        );
        out
    }
}

pub(crate) async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    let body = s.metrics.render(&s);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        body,
    )
        .into_response()
}

/// A request id (the client's `x-request-id` when it is short and plain, else a new one) on the
/// response and in every log line of the request; one log line with status and time; counts.
pub(crate) async fn track(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            !v.is_empty()
                && v.len() <= 64
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        })
        .map(str::to_string);
    let id = given.unwrap_or_else(|| {
        format!(
            "req-{:x}-{}",
            s.created,
            s.metrics.next_id.fetch_add(1, Ordering::Relaxed)
        )
    });
    let route = ROUTES
        .iter()
        .find(|r| **r == req.uri().path())
        .copied()
        .unwrap_or("other");
    let method = req.method().clone();
    let t0 = std::time::Instant::now();
    let span = tracing::info_span!("request", id = %id, method = %method, route);
    let mut r = next.run(req).instrument(span.clone()).await;
    let status = r.status().as_u16();
    s.metrics.count(route, status);
    span.in_scope(|| tracing::info!(status, ms = t0.elapsed().as_secs_f64() * 1e3, "answered"));
    if let Ok(v) = HeaderValue::from_str(&id) {
        r.headers_mut().insert("x-request-id", v);
    }
    r
}
