//! The server tests' harness: a server on an ephemeral loopback port over the tiny random model (or
//! a real one), and a raw HTTP/1.1 client so that every byte on the wire is what a test sees.
#![allow(dead_code)]

use mens::chat::ChatTemplate;
use mens::gguf::Gguf;
use mens::model::Model;
use mens::scheduler::{Scheduler, SchedulerOptions};
use mens::synth::{synth_model, SynthSpec};
use mens::tokenizer::Tokenizer;
use mens_server::{AppState, ServerConfig};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

pub struct Server {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    _rt: tokio::runtime::Runtime,
    _stop: tokio::sync::oneshot::Sender<()>,
}

pub fn start_with(
    model: Arc<Model>,
    tok: Tokenizer,
    opts: SchedulerOptions,
    config: ServerConfig,
) -> Server {
    start_with_draft(model, None, tok, opts, config)
}

/// [`start_with`], with a draft model proposing for speculating slots.
pub fn start_with_draft(
    model: Arc<Model>,
    draft: Option<Arc<Model>>,
    tok: Tokenizer,
    opts: SchedulerOptions,
    config: ServerConfig,
) -> Server {
    start_with_template(model, draft, tok, opts, config, None)
}

/// [`start_with_draft`] with another chat template than the file's (`--chat-template-file`).
pub fn start_with_template(
    model: Arc<Model>,
    draft: Option<Arc<Model>>,
    tok: Tokenizer,
    opts: SchedulerOptions,
    config: ServerConfig,
    source: Option<String>,
) -> Server {
    let mut config = config;
    if config.model.architecture.is_empty() {
        config.model = mens_server::ModelCard::of(&model, None);
    }
    // The template exactly as the shipped binary builds it.
    let mut template = ChatTemplate::from_gguf(&model.gguf, &tok).unwrap();
    if let Some(src) = source {
        template = template.with_source(src);
        template.check().unwrap();
    }
    let tokenizer = Arc::new(tok);
    let scheduler = match draft {
        Some(d) => Scheduler::cpu_with_draft(model, d, tokenizer.clone(), opts).unwrap(),
        None => Scheduler::cpu(model, tokenizer.clone(), opts).unwrap(),
    };
    let state = Arc::new(AppState::new(scheduler, tokenizer, template, config));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    rt.spawn(mens_server::serve(listener, state.clone(), async {
        let _ = stopped.await;
    }));
    Server {
        addr,
        state,
        _rt: rt,
        _stop: stop,
    }
}

pub fn tiny() -> (Arc<Model>, Tokenizer) {
    // As the shipped binary loads a file (mens::load::load calls the same function).
    let g = Gguf::from_bytes(synth_model(&SynthSpec::tiny_qwen2())).unwrap();
    let (model, tok, _) = mens::load::from_gguf(g).unwrap();
    (Arc::new(model), tok)
}

/// The tiny model's server options: `slots` of 256 tokens, steps of 64.
pub fn tiny_options(slots: usize, queue: usize) -> SchedulerOptions {
    SchedulerOptions {
        slots,
        ctx: 256,
        batch: 64,
        queue,
        cache_reuse: 0,
        spec: None,
        cache: Default::default(),
    }
}

pub fn start(slots: usize, queue: usize, config: ServerConfig) -> Server {
    let (m, t) = tiny();
    start_with(m, t, tiny_options(slots, queue), config)
}

pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    /// The `data:` payloads of a server-sent-event body.
    pub fn events(&self) -> Vec<String> {
        String::from_utf8(self.body.clone())
            .unwrap()
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: ").map(str::to_string))
            .collect()
    }
}

pub fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    // A hung server's bound, not a speed bound: on two AVX2 cores with two tests' servers sharing
    // them, one 96-token reply of the reasoning-budget test took over 120 s (session 50).
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    s
}

pub fn read_reply(s: TcpStream) -> Reply {
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status: u16 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':').unwrap();
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            r.read_line(&mut line).unwrap();
            let n = usize::from_str_radix(line.trim(), 16).unwrap();
            if n == 0 {
                break;
            }
            let mut chunk = vec![0u8; n + 2];
            r.read_exact(&mut chunk).unwrap();
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        r.read_to_end(&mut body).unwrap();
    }
    Reply {
        status,
        headers,
        body,
    }
}

pub fn call(addr: SocketAddr, method: &str, path: &str, body: &Value) -> Reply {
    let b = if body.is_null() {
        vec![]
    } else {
        body.to_string().into_bytes()
    };
    read_reply(send(
        addr,
        method,
        path,
        &[("Content-Type", "application/json")],
        &b,
    ))
}

pub fn post(addr: SocketAddr, path: &str, body: Value) -> Reply {
    call(addr, "POST", path, &body)
}

pub fn assert_error(r: &Reply, status: u16, needle: &str) {
    assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let e = &v["error"];
    assert!(e["type"].is_string(), "error type missing: {v}");
    let m = e["message"].as_str().expect("error message");
    assert!(m.contains(needle), "message {m:?} lacks {needle:?}");
}

pub fn chat(content: &str) -> Value {
    json!({"messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0})
}
