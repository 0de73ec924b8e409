//! The HTTP server end to end: started on an ephemeral loopback port over the tiny random model (and
//! the real 0.5B where the behaviour needs a model slow enough to watch), driven by a raw HTTP/1.1
//! client so that every byte on the wire is what the test sees.

#[path = "../../mens/tests/common/mod.rs"]
mod common;
mod support;

use mens::sample::SamplerConfig;
use mens::scheduler::{Event, Request, SchedulerOptions};
use mens::tokenizer::Tokenizer;
use mens_server::ServerConfig;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::*;

#[test]
fn health_and_models() {
    let s = start(2, 4, ServerConfig::default());
    let h = call(s.addr, "GET", "/health", &Value::Null);
    assert_eq!(h.status, 200);
    assert_eq!(h.json()["status"], "ok");
    assert_eq!(h.json()["slots"], 2);
    let m = call(s.addr, "GET", "/v1/models", &Value::Null);
    assert_eq!(m.status, 200);
    let v = m.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "mens");
    assert_eq!(v["data"][0]["object"], "model");
    assert_error(
        &call(s.addr, "GET", "/nope", &Value::Null),
        404,
        "no such route",
    );
}

#[test]
fn chat_completion_whole_and_streamed_agree() {
    let s = start(2, 4, ServerConfig::default());
    let r = post(s.addr, "/v1/chat/completions", chat("the theory"));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let u = &v["usage"];
    let (p, c) = (
        u["prompt_tokens"].as_u64().unwrap(),
        u["completion_tokens"].as_u64().unwrap(),
    );
    assert!(p > 5 && (1..=8).contains(&c), "{u}");
    assert_eq!(u["total_tokens"].as_u64().unwrap(), p + c);
    let reason = v["choices"][0]["finish_reason"].as_str().unwrap();
    assert_eq!(reason, if c == 8 { "length" } else { "stop" });

    let mut body = chat("the theory");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let r = post(s.addr, "/v1/chat/completions", body);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let ev = r.events();
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut streamed = String::new();
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        if let Some(t) = c["choices"][0]["delta"]["content"].as_str() {
            streamed.push_str(t);
        }
    }
    // Greedy: the streamed text is the whole answer, chunk by chunk.
    assert_eq!(streamed, text);
    let n = chunks.len();
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], reason);
    assert_eq!(chunks[n - 1]["choices"].as_array().unwrap().len(), 0);
    assert_eq!(
        chunks[n - 1]["usage"]["completion_tokens"]
            .as_u64()
            .unwrap(),
        c
    );
}

#[test]
fn text_completions_seeds_stops_and_token_prompts() {
    let s = start(2, 4, ServerConfig::default());
    let body = |seed: u64| {
        json!({"prompt": "the theory of", "max_tokens": 12, "temperature": 1.0, "top_k": 0,
               "top_p": 1.0, "min_p": 0.0, "seed": seed})
    };
    let a = post(s.addr, "/v1/completions", body(7)).json();
    let b = post(s.addr, "/v1/completions", body(7)).json();
    assert_eq!(a["object"], "text_completion");
    assert_eq!(
        a["choices"][0]["text"], b["choices"][0]["text"],
        "same seed, same text"
    );
    let texts: std::collections::HashSet<String> = (0..6)
        .map(|i| {
            post(s.addr, "/v1/completions", body(100 + i)).json()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(
        texts.len() > 1,
        "different seeds should give different samples"
    );

    // A stop string cuts the text before it and finishes with "stop".
    let t = a["choices"][0]["text"].as_str().unwrap().to_string();
    if let Some((i, ch)) = t.char_indices().nth(3) {
        let stop = ch.to_string();
        let mut q = body(7);
        q["stop"] = json!([stop]);
        let r = post(s.addr, "/v1/completions", q).json();
        let cut = r["choices"][0]["text"].as_str().unwrap();
        assert_eq!(cut, &t[..t.find(&stop).unwrap().min(i)]);
        assert_eq!(r["choices"][0]["finish_reason"], "stop");
    }

    // Token-id prompts are accepted; streamed completions end with [DONE].
    let r = post(
        s.addr,
        "/v1/completions",
        json!({"prompt": [1, 2, 3], "max_tokens": 3, "stream": true}),
    );
    assert_eq!(r.status, 200);
    let ev = r.events();
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let last: Value = serde_json::from_str(&ev[ev.len() - 2]).unwrap();
    assert_eq!(last["object"], "text_completion");
    assert!(last["choices"][0]["finish_reason"].is_string());
}

#[test]
fn invalid_requests_get_openai_errors() {
    let s = start(
        1,
        2,
        ServerConfig {
            body_limit: 4096,
            ..Default::default()
        },
    );
    let a = s.addr;
    let mut b = chat("x");
    b["temperature"] = json!(-1);
    assert_error(&post(a, "/v1/chat/completions", b), 400, "temperature");
    let mut b = chat("x");
    b["top_p"] = json!(2);
    assert_error(&post(a, "/v1/chat/completions", b), 400, "top-p");
    let mut b = chat("x");
    b["n"] = json!(2);
    assert_error(&post(a, "/v1/chat/completions", b), 400, "n = 2");
    let b = json!({"messages": [{"role": "wizard", "content": "x"}]});
    assert_error(&post(a, "/v1/chat/completions", b), 400, "unknown role");
    assert_error(
        &post(a, "/v1/chat/completions", json!({"messages": []})),
        400,
        "empty",
    );
    assert_error(
        &post(a, "/v1/chat/completions", json!({"nope": 1})),
        400,
        "messages",
    );
    let json_type = [("Content-Type", "application/json")];
    let r = read_reply(send(
        a,
        "POST",
        "/v1/chat/completions",
        &json_type,
        b"{not json",
    ));
    assert_error(&r, 400, "not valid");
    let mut b = chat("x");
    b["max_tokens"] = json!(0);
    assert_error(&post(a, "/v1/chat/completions", b), 400, "max_tokens");
    // prompt + max_tokens over the context: a clear 400, never silent truncation.
    let mut b = chat("x");
    b["max_tokens"] = json!(250);
    let r = post(a, "/v1/chat/completions", b);
    assert_error(&r, 400, "exceed the context of 256");
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    let long = "a ".repeat(1500);
    let r = post(
        a,
        "/v1/completions",
        json!({"prompt": long, "max_tokens": 1}),
    );
    assert_error(&r, 400, "context");
    assert_error(
        &post(a, "/v1/completions", json!({"prompt": ""})),
        400,
        "empty",
    );
    assert_error(
        &post(
            a,
            "/v1/completions",
            json!({"prompt": [999999], "max_tokens": 1}),
        ),
        400,
        "vocabulary",
    );
    // A body over the limit: 413, both when declared and when sent chunked.
    let big = json!({"prompt": "x".repeat(5000)});
    assert_error(&post(a, "/v1/completions", big), 413, "limit");
    let mut st = TcpStream::connect(a).unwrap();
    let chunk = "x".repeat(3000);
    write!(
        st,
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len(),
        chunk.len()
    )
    .unwrap();
    assert_error(&read_reply(st), 413, "limit");
    // The server is still fine.
    assert_eq!(post(a, "/v1/chat/completions", chat("x")).status, 200);
}

#[test]
fn api_key_is_required_when_set() {
    let s = start(
        1,
        2,
        ServerConfig {
            api_keys: vec!["sekrit".into()],
            ..Default::default()
        },
    );
    let body = chat("x").to_string();
    let r = read_reply(send(
        s.addr,
        "POST",
        "/v1/chat/completions",
        &[],
        body.as_bytes(),
    ));
    assert_error(&r, 401, "API key");
    let r = read_reply(send(
        s.addr,
        "POST",
        "/v1/chat/completions",
        &[("Authorization", "Bearer wrong!")],
        body.as_bytes(),
    ));
    assert_error(&r, 401, "API key");
    let r = read_reply(send(
        s.addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer sekrit")],
        b"",
    ));
    assert_eq!(r.status, 200);
    let r = read_reply(send(
        s.addr,
        "POST",
        "/v1/chat/completions",
        &[
            ("Authorization", "Bearer sekrit"),
            ("Content-Type", "application/json"),
        ],
        body.as_bytes(),
    ));
    assert_eq!(r.status, 200);
    // /health stays open (for load balancers), under both of llama-server's names; every other
    // name of a route needs the key too.
    assert_eq!(call(s.addr, "GET", "/health", &Value::Null).status, 200);
    assert_eq!(call(s.addr, "GET", "/v1/health", &Value::Null).status, 200);
    for path in [
        "/chat/completions",
        "/chat/completions/input_tokens",
        "/responses",
        "/v1/responses/input_tokens",
    ] {
        let r = read_reply(send(s.addr, "POST", path, &[], body.as_bytes()));
        assert_error(&r, 401, "API key");
    }
    assert_error(
        &call(s.addr, "GET", "/models", &Value::Null),
        401,
        "API key",
    );
}

/// A request that holds the scheduler thread (its callback blocks) until released.
fn blocker(
    tok_ids: Vec<u32>,
) -> (
    Request,
    std::sync::mpsc::Sender<()>,
    std::sync::mpsc::Receiver<()>,
) {
    let (release, wait) = std::sync::mpsc::channel::<()>();
    let (started_tx, started) = std::sync::mpsc::channel::<()>();
    let req = Request {
        prompt: tok_ids,
        max_tokens: 4,
        sampler: SamplerConfig::greedy(),
        stop: vec![],
        min_indent: 0,
        on_event: Box::new(move |e| {
            if matches!(e, Event::Text(_)) {
                let _ = started_tx.send(());
                let _ = wait.recv_timeout(Duration::from_secs(30));
            }
            true
        }),
        alive: Box::new(|| true),
        tenant: 0,
        deadline: None,
        constraint: None,
        logprobs: None,
        ignore_eos: false,
        think: None,
        embed: None,
    };
    (req, release, started)
}

#[test]
fn full_queue_answers_503_with_retry_after() {
    let s = start(1, 1, ServerConfig::default());
    let ids = s
        .state
        .tokenizer
        .encode("the theory of everything")
        .unwrap();
    // One request occupies the only slot (blocked in its callback), one fills the queue.
    let (a, release_a, started_a) = blocker(ids.clone());
    s.state.scheduler.submit(a).unwrap();
    started_a.recv_timeout(Duration::from_secs(30)).unwrap();
    let (b, release_b, _) = blocker(ids);
    s.state.scheduler.submit(b).unwrap();
    let r = post(s.addr, "/v1/chat/completions", chat("x"));
    assert_error(&r, 503, "busy");
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.json()["error"]["code"], "queue_full");
    for _ in 0..8 {
        let _ = release_a.send(());
        let _ = release_b.send(());
    }
    // Once the queue drains, requests are served again.
    let t0 = Instant::now();
    loop {
        let r = post(s.addr, "/v1/chat/completions", chat("x"));
        if r.status == 200 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "still {}", r.status);
        for _ in 0..8 {
            let _ = release_a.send(());
            let _ = release_b.send(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A request of `tenant` whose events arrive on the returned channel.
fn listened(prompt: Vec<u32>, tenant: u64) -> (Request, std::sync::mpsc::Receiver<Event>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let req = Request {
        prompt,
        max_tokens: 12,
        sampler: SamplerConfig::greedy(),
        stop: vec![],
        min_indent: 0,
        on_event: Box::new(move |e| tx.send(e).is_ok()),
        alive: Box::new(|| true),
        tenant,
        deadline: None,
        constraint: None,
        logprobs: None,
        ignore_eos: true,
        think: None,
        embed: None,
    };
    (req, rx)
}

/// The text and usage a listened request ends with.
fn outcome(rx: std::sync::mpsc::Receiver<Event>) -> (String, mens::scheduler::Usage) {
    let mut text = String::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(60)).unwrap() {
            Event::Text(t) => text.push_str(&t),
            Event::Done(u) => return (text, u),
            Event::Error(e) => panic!("{e}"),
            Event::Logprobs(_) | Event::Embedding(_) => {}
        }
    }
}

/// A prompt prefix that another slot of the same tenant holds, here a busy one (its request is
/// mid-answer), is copied into the new request's slot instead of prefilled: it counts as cached,
/// and the greedy text is a cold request's. Another tenant's request with the same prompt gets
/// none of it.
#[test]
fn a_prefix_held_by_a_busy_slot_is_copied_within_a_tenant() {
    let s = start(3, 8, ServerConfig::default());
    let tok = s.state.tokenizer.clone();
    let system: String = (0..9).map(|i| format!("rule {i}; ")).collect();
    let ids = |tail: &str| tok.encode(&format!("{system}{tail}")).unwrap();
    let shared = mens::stream::reusable_prefix(&ids("alpha beta"), &ids("gamma delta"));
    assert!(shared >= 64, "the prompts share {shared} tokens");
    // A (tenant 0) holds slot 0 with the shared prefix cached, blocked in its first text event
    // while B (tenant 0) and C (tenant 5) are queued: both are admitted while A is busy.
    let (a, release, started) = blocker(ids("alpha beta"));
    s.state.scheduler.submit(a).unwrap();
    started.recv_timeout(Duration::from_secs(30)).unwrap();
    let (b, b_rx) = listened(ids("gamma delta"), 0);
    let (c, c_rx) = listened(ids("gamma delta"), 5);
    s.state.scheduler.submit(b).unwrap();
    s.state.scheduler.submit(c).unwrap();
    for _ in 0..8 {
        let _ = release.send(());
    }
    let (b_text, b_usage) = outcome(b_rx);
    let (c_text, c_usage) = outcome(c_rx);
    assert_eq!(
        b_usage.cached_tokens, shared,
        "B copies the shared prefix from A's slot"
    );
    assert_eq!(c_usage.cached_tokens, 0, "C is another tenant");
    // The same prompt cold, alone on a fresh server: the same greedy text.
    let cold = start(1, 1, ServerConfig::default());
    let (d, d_rx) = listened(ids("gamma delta"), 0);
    cold.state.scheduler.submit(d).unwrap();
    let (d_text, d_usage) = outcome(d_rx);
    assert_eq!(d_usage.cached_tokens, 0);
    assert!(!d_text.is_empty());
    assert_eq!(b_text, d_text, "a copied prefix answers as a cold prompt");
    assert_eq!(c_text, d_text);
}

#[test]
fn concurrent_requests_all_complete() {
    let s = start(3, 16, ServerConfig::default());
    let addr = s.addr;
    let handles: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                let mut b = json!({"prompt": format!("the {i} theory"), "max_tokens": 20,
                                   "temperature": 0.5, "seed": i});
                if i % 2 == 0 {
                    b["stream"] = json!(true);
                }
                post(addr, "/v1/completions", b)
            })
        })
        .collect();
    for h in handles {
        let r = h.join().unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        if r.header("content-type") == Some("text/event-stream") {
            assert_eq!(r.events().last().unwrap(), "[DONE]");
        } else {
            assert!(r.json()["usage"]["completion_tokens"].as_u64().unwrap() >= 1);
        }
    }
    let h = call(addr, "GET", "/health", &Value::Null).json();
    assert_eq!(h["slots_busy"], 0);
    assert_eq!(h["queued"], 0);
}

#[test]
fn follow_up_turn_reuses_the_cached_prefix() {
    let s = start(1, 4, ServerConfig::default());
    let first = json!({"messages": [{"role": "user", "content": "the theory of everything"}],
                       "max_tokens": 6, "temperature": 0});
    let r = post(s.addr, "/v1/chat/completions", first).json();
    let p1 = r["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let answer = r["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let second = json!({"messages": [
        {"role": "user", "content": "the theory of everything"},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "in short"}], "max_tokens": 4, "temperature": 0});
    let r = post(s.addr, "/v1/chat/completions", second).json();
    let cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let p2 = r["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        cached >= p1 && cached < p2,
        "cached {cached}, first prompt {p1}, second {p2}"
    );
}

/// On the real 0.5B (slow enough to watch): 4 concurrent streams are decoded in shared steps, a
/// client that disconnects mid-stream frees its slot within a few steps, and greedy text over HTTP
/// equals llama.cpp's greedy continuation.
#[test]
fn real_model_batching_disconnect_and_greedy_text() {
    let l = common::load("qwen2.5-coder-0.5b");
    let tok = Tokenizer::from_gguf(&l.model.gguf).unwrap();
    let opts = SchedulerOptions {
        slots: 4,
        ctx: 1024,
        batch: 256,
        queue: 8,
        cache_reuse: 0,
        spec: None,
        cache: Default::default(),
    };
    let s = start_with(l.model.clone(), tok, opts, ServerConfig::default());
    let st = s.state.scheduler.status();
    use std::sync::atomic::Ordering::SeqCst;

    // Greedy text equals the reference continuation (first 16 tokens).
    let g = common::json("greedy.json");
    let case = &g["qwen2.5-coder-0.5b"][0];
    let prompt = case["prompt"].as_str().unwrap();
    let ids: Vec<u32> = case["tokens"].as_array().unwrap()[..16]
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let r = post(
        s.addr,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 16, "temperature": 0}),
    )
    .json();
    assert_eq!(
        r["choices"][0]["text"].as_str().unwrap(),
        l.tokenizer.decode(&ids)
    );

    // Four concurrent streams share decode steps.
    let (steps0, gen0) = (st.steps.load(SeqCst), st.generated.load(SeqCst));
    let addr = s.addr;
    let hs: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                post(
                    addr,
                    "/v1/completions",
                    json!({"prompt": format!("def f{i}(x):"),
                      "max_tokens": 24, "temperature": 0, "stream": true}),
                )
            })
        })
        .collect();
    for h in hs {
        assert_eq!(h.join().unwrap().events().last().unwrap(), "[DONE]");
    }
    let steps = st.steps.load(SeqCst) - steps0;
    let generated = st.generated.load(SeqCst) - gen0;
    eprintln!("4 streams: {generated} tokens in {steps} steps");
    assert!(
        generated >= 4 * 20 && steps * 2 < generated,
        "{generated} tokens in {steps} steps: not batched"
    );

    // A client that goes away mid-stream frees its slot.
    let mut sock = send(
        addr,
        "POST",
        "/v1/completions",
        &[("Content-Type", "application/json")],
        json!({"prompt": "def quicksort(a):", "max_tokens": 400, "temperature": 0, "stream": true})
            .to_string()
            .as_bytes(),
    );
    let mut buf = [0u8; 512];
    let n = sock.read(&mut buf).unwrap();
    assert!(n > 0);
    let gen_at_close = st.generated.load(SeqCst);
    drop(sock);
    let t0 = Instant::now();
    while st.active.load(SeqCst) != 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "slot not freed after disconnect"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = st.generated.load(SeqCst) - gen_at_close;
    eprintln!(
        "disconnect: slot freed after {after} more tokens, {:?}",
        t0.elapsed()
    );
    // CLAIM-14: freed within 8 tokens (measured 1–3: the first write after the close still
    // succeeds into the socket buffer; the next one fails).
    assert!(after <= 8, "{after} tokens generated after the client left");
}

/// A connection that sends no request header within the timeout is closed (slow or idle clients
/// cannot hold connections forever).
#[test]
fn idle_connections_are_closed() {
    let s = start(
        1,
        2,
        ServerConfig {
            header_timeout: Duration::from_millis(500),
            ..Default::default()
        },
    );
    let mut idle = TcpStream::connect(s.addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 256];
    // Either EOF or an error reply (408), then EOF: never a connection held open.
    loop {
        match idle.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) => panic!("connection not closed: {e}"),
        }
    }
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(400) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    // The server still serves.
    assert_eq!(call(s.addr, "GET", "/health", &Value::Null).status, 200);
}

/// A template that opens `<think>` is seen whatever tokens spell the tag (the synthetic vocabulary
/// takes a token a byte: 8 for `<think>\n`), and a reasoning budget closes the block there too.
#[test]
fn an_opened_block_is_seen_and_budgeted_in_any_vocabulary() {
    let (m, t) = tiny();
    let opts = tiny_options(1, 4);
    let opened = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + \
                  message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt \
                  %}{{ '<|im_start|>assistant\n<think>\n' }}{% endif %}";
    let s = start_with_template(
        m,
        None,
        t,
        opts,
        ServerConfig::default(),
        Some(opened.into()),
    );
    let tag = call(s.addr, "POST", "/tokenize", &json!({"content": "</think>"})).json()["tokens"]
        .as_array()
        .unwrap()
        .len() as u64;
    assert!(tag > 4, "the tag is {tag} tokens");
    let mut b = chat("x");
    b["max_tokens"] = json!(30);
    b["temperature"] = json!(0);
    let v = post(s.addr, "/v1/chat/completions", b.clone()).json();
    // Random weights never close the block: it is all reasoning.
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"], 30,
        "{v}"
    );
    assert!(
        v["choices"][0]["message"]["reasoning_content"].is_string(),
        "{v}"
    );
    b["thinking_budget_tokens"] = json!(5);
    let v = post(s.addr, "/v1/chat/completions", b).json();
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"],
        5 + tag,
        "{v}"
    );
}

/// `--fit-max-tokens`: a `max_tokens` over the context's room (or the cap) is cut to fit, as
/// llama-server does, and the answer ends with `length` where the room ends; without it the same
/// request is a 400 (above).
#[test]
fn fit_max_tokens_cuts_instead_of_refusing() {
    for (cap, asked, most) in [(None, 32000, 256), (Some(6), 100, 6)] {
        let s = start(
            1,
            2,
            ServerConfig {
                fit_max_tokens: true,
                max_tokens_cap: cap,
                ..Default::default()
            },
        );
        let mut b = chat("x");
        b["max_tokens"] = json!(asked);
        b["ignore_eos"] = json!(true);
        let v = post(s.addr, "/v1/chat/completions", b.clone()).json();
        assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
        let u = &v["usage"];
        let (p, n) = (
            u["prompt_tokens"].as_u64().unwrap(),
            u["completion_tokens"].as_u64().unwrap(),
        );
        assert!(n >= 1 && n <= most && p + n <= 256, "{v}");
        if cap.is_some() {
            assert_eq!(n, 6, "{v}");
        }
        b["max_tokens"] = json!(0);
        assert_error(&post(s.addr, "/v1/chat/completions", b), 400, "max_tokens");
    }
}

/// An agent's side request (another system prompt: it shares only the template's first tokens with
/// the conversation) takes the empty slot, so the conversation's next turn still finds its prompt
/// cached; before, it took the conversation's slot for those few tokens and threw the rest away.
#[test]
fn a_side_request_leaves_the_conversation_cached() {
    let s = start(2, 4, ServerConfig::default());
    let system = "you are a careful agent ".repeat(2);
    let talk = |turns: Value| {
        let mut m = vec![json!({"role": "system", "content": system})];
        m.extend(turns.as_array().unwrap().iter().cloned());
        json!({"messages": m, "max_tokens": 4, "temperature": 0})
    };
    let r = post(
        s.addr,
        "/v1/chat/completions",
        talk(json!([{"role": "user", "content": "first"}])),
    )
    .json();
    let p1 = r["usage"]["prompt_tokens"].as_u64().unwrap();
    let answer = r["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let side = json!({"messages": [{"role": "system", "content": "title this"},
                                   {"role": "user", "content": "first"}],
                      "max_tokens": 4, "temperature": 0});
    assert_eq!(post(s.addr, "/v1/chat/completions", side).status, 200);
    let r = post(
        s.addr,
        "/v1/chat/completions",
        talk(json!([{"role": "user", "content": "first"},
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": "second"}])),
    )
    .json();
    let cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("{r}"));
    assert!(
        cached >= p1,
        "cached {cached} of the first prompt's {p1}: {r}"
    );
}
