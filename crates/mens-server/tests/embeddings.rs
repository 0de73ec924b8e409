//! Embeddings over raw HTTP on the tiny model: OpenAI's `/v1/embeddings` (floats and base64,
//! `dimensions`), llama-server's `/embedding`, Ollama's `/api/embed` and `/api/embeddings`, and a
//! clear error for each bad field. (Against llama-server's vectors on the real 0.5B:
//! crates/mens/tests/embed.rs; the official clients: crates/mens-cli/tests/*_compat.py.)

mod support;

use mens::embed::Pooling;
use mens_server::ServerConfig;
use serde_json::{json, Value};
use support::*;

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt()
}

#[test]
fn openai_embeddings_in_floats_and_base64() {
    let s = start(2, 8, ServerConfig::default());
    let texts = ["def add(a, b): return a + b", "hello world", "x = 1"];
    let r = post(
        s.addr,
        "/v1/embeddings",
        json!({"input": texts, "model": "mens"}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], "mens");
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    let dim = s.state.config.model.embedding_length as usize;
    let mut vecs = Vec::new();
    for (i, d) in data.iter().enumerate() {
        assert_eq!(
            (d["object"].as_str(), d["index"].as_u64()),
            (Some("embedding"), Some(i as u64))
        );
        let e = floats(&d["embedding"]);
        assert_eq!(e.len(), dim);
        assert!((norm(&e) - 1.0).abs() < 1e-5, "{}", norm(&e));
        vecs.push(e);
    }
    assert_ne!(vecs[0], vecs[1]);
    // Usage: the inputs' tokens, as /tokenize counts them.
    let count = |t: &str| {
        post(s.addr, "/tokenize", json!({"content": t})).json()["tokens"]
            .as_array()
            .unwrap()
            .len() as u64
    };
    let tokens: u64 = texts.iter().map(|t| count(t)).sum();
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": tokens, "total_tokens": tokens})
    );

    // base64: the same floats, little-endian.
    let r = post(
        s.addr,
        "/v1/embeddings",
        json!({"input": texts[0], "encoding_format": "base64"}),
    );
    let b = r.json()["data"][0]["embedding"]
        .as_str()
        .unwrap()
        .to_string();
    let bytes = base64::decode(b).unwrap();
    let decoded: Vec<f32> = bytes
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(decoded, vecs[0]);

    // dimensions: the first values, unit length again; token ids as input; llama-server's
    // embd_normalize -1 leaves the vector as pooled.
    let r = post(
        s.addr,
        "/v1/embeddings",
        json!({"input": texts[0], "dimensions": 8}),
    );
    let short = floats(&r.json()["data"][0]["embedding"]);
    assert_eq!(short.len(), 8);
    assert!((norm(&short) - 1.0).abs() < 1e-5);
    let scale = norm(&vecs[0][..8]) as f32;
    for (a, b) in short.iter().zip(&vecs[0][..8]) {
        assert!((a * scale - b).abs() < 1e-5, "{a} {b}");
    }
    let ids = post(s.addr, "/tokenize", json!({"content": texts[0]})).json()["tokens"].clone();
    let r = post(s.addr, "/v1/embeddings", json!({"input": ids}));
    assert_eq!(floats(&r.json()["data"][0]["embedding"]), vecs[0]);
    let r = post(s.addr, "/v1/embeddings", json!({"input": [ids, ids]}));
    assert_eq!(r.json()["data"].as_array().unwrap().len(), 2);
    let r = post(
        s.addr,
        "/v1/embeddings",
        json!({"input": texts[0], "embd_normalize": -1}),
    );
    let raw = floats(&r.json()["data"][0]["embedding"]);
    let n = norm(&raw) as f32;
    assert!((n - 1.0).abs() > 1e-3, "{n}");
    for (a, b) in raw.iter().zip(&vecs[0]) {
        assert!((a / n - b).abs() < 1e-5);
    }
}

#[test]
fn bad_embedding_requests_get_clear_errors() {
    let s = start(1, 4, ServerConfig::default());
    let e = "/v1/embeddings";
    assert_error(&post(s.addr, e, json!({})), 400, "input is required");
    assert_error(
        &post(s.addr, e, json!({"input": []})),
        400,
        "must not be empty",
    );
    assert_error(
        &post(s.addr, e, json!({"input": [""]})),
        400,
        "input 0 is empty",
    );
    assert_error(&post(s.addr, e, json!({"input": 5})), 400, "input must be");
    assert_error(
        &post(s.addr, e, json!({"input": [1, "a"]})),
        400,
        "input must be",
    );
    assert_error(
        &post(s.addr, e, json!({"input": [-1]})),
        400,
        "input must be",
    );
    let many = vec!["a"; 2049];
    assert_error(
        &post(s.addr, e, json!({"input": many})),
        400,
        "more than 2048",
    );
    assert_error(
        &post(s.addr, e, json!({"input": [1_000_000]})),
        400,
        "outside the vocabulary",
    );
    let long = "word ".repeat(400);
    let r = post(s.addr, e, json!({"input": long}));
    assert_error(&r, 400, "context");
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    assert_error(
        &post(s.addr, e, json!({"input": "a", "encoding_format": "hex"})),
        400,
        "encoding_format",
    );
    assert_error(
        &post(s.addr, e, json!({"input": "a", "dimensions": 0})),
        400,
        "dimensions",
    );
    assert_error(
        &post(s.addr, e, json!({"input": "a", "dimensions": 100000})),
        400,
        "at most",
    );
    assert_error(
        &post(s.addr, e, json!({"input": "a", "embd_normalize": 99})),
        400,
        "embd_normalize",
    );
    assert_error(
        &post(s.addr, e, json!({"input": "a", "model": "gpt-4"})),
        404,
        "does not exist",
    );
    // The server still answers.
    assert_eq!(post(s.addr, e, json!({"input": "a"})).status, 200);
}

/// Text from a request is data: control-token text in an input is tokenized as text.
#[test]
fn special_token_text_in_an_input_is_text() {
    let s = start(1, 4, ServerConfig::default());
    let eos = s.state.tokenizer.eos;
    let text = s.state.tokenizer.decode(&[eos]);
    let v = post(s.addr, "/v1/embeddings", json!({"input": text})).json();
    assert!(
        v["usage"]["prompt_tokens"].as_u64().unwrap() > 1,
        "{text:?}: {v}"
    );
    let id = post(s.addr, "/v1/embeddings", json!({"input": [eos]})).json();
    assert_eq!(id["usage"]["prompt_tokens"], 1);
    assert_ne!(v["data"][0]["embedding"], id["data"][0]["embedding"]);
}

#[test]
fn llama_server_and_ollama_shapes() {
    let s = start(2, 8, ServerConfig::default());
    let oai = post(s.addr, "/v1/embeddings", json!({"input": "hello world"})).json();
    let unit = floats(&oai["data"][0]["embedding"]);
    // llama-server's own: a list of {index, embedding: [[...]]}, `content` or `input`.
    for path in ["/embedding", "/embeddings"] {
        let v = post(s.addr, path, json!({"content": "hello world"})).json();
        let rows = v[0]["embedding"].as_array().unwrap();
        assert_eq!((v[0]["index"].as_u64(), rows.len()), (Some(0), 1), "{v}");
        assert_eq!(floats(&rows[0]), unit);
    }
    let v = post(s.addr, "/embedding", json!({"input": ["a", "b"]})).json();
    assert_eq!(v.as_array().unwrap().len(), 2);
    // Ollama's /api/embed: unit vectors, the input's tokens; `truncate` false refuses a long one.
    let v = post(
        s.addr,
        "/api/embed",
        json!({"model": "mens", "input": ["hello world", "x"]}),
    )
    .json();
    assert_eq!(v["model"], "mens:latest");
    let e = v["embeddings"].as_array().unwrap();
    assert_eq!(e.len(), 2);
    assert_eq!(floats(&e[0]), unit);
    assert!(v["prompt_eval_count"].as_u64().unwrap() >= 3);
    assert!(v["total_duration"].as_u64().unwrap() > 0);
    let long = "word ".repeat(400);
    let v = post(s.addr, "/api/embed", json!({"input": long})).json();
    assert_eq!(
        v["prompt_eval_count"].as_u64(),
        Some(s.state.scheduler.options().ctx as u64)
    );
    let r = post(
        s.addr,
        "/api/embed",
        json!({"input": long, "truncate": false}),
    );
    assert_eq!(r.status, 400);
    assert!(r.json()["error"].as_str().unwrap().contains("context"));
    let v = post(s.addr, "/api/embed", json!({"input": "x", "dimensions": 4})).json();
    assert_eq!(floats(&v["embeddings"][0]).len(), 4);
    let v = post(s.addr, "/api/embed", json!({"input": []})).json();
    assert_eq!(v["embeddings"], json!([]));
    // The older /api/embeddings: the pooled vector, not normalised; an empty prompt, nothing.
    let v = post(s.addr, "/api/embeddings", json!({"prompt": "hello world"})).json();
    let raw = floats(&v["embedding"]);
    let n = norm(&raw) as f32;
    for (a, b) in raw.iter().zip(&unit) {
        assert!((a / n - b).abs() < 1e-5);
    }
    let v = post(s.addr, "/api/embeddings", json!({"prompt": ""})).json();
    assert_eq!(v, json!({"embedding": []}));
    let r = post(
        s.addr,
        "/api/embed",
        json!({"model": "other", "input": "x"}),
    );
    assert_eq!(r.status, 404);
}

/// `--pooling none`: llama-server's `/embedding` gives every token's row; the OpenAI and Ollama
/// routes, which carry one vector an input, refuse with a 400 naming the flag.
#[test]
fn pooling_none_gives_every_row_where_the_shape_allows() {
    let config = ServerConfig {
        pooling: Pooling::None,
        ..Default::default()
    };
    let s = start(1, 4, config);
    let n = post(s.addr, "/tokenize", json!({"content": "hello world"})).json()["tokens"]
        .as_array()
        .unwrap()
        .len();
    let v = post(s.addr, "/embedding", json!({"content": "hello world"})).json();
    let rows = v[0]["embedding"].as_array().unwrap();
    assert_eq!(rows.len(), n);
    assert_eq!(
        floats(&rows[0]).len(),
        s.state.config.model.embedding_length as usize
    );
    assert_error(
        &post(s.addr, "/v1/embeddings", json!({"input": "a"})),
        400,
        "--pooling",
    );
    let r = post(s.addr, "/api/embed", json!({"input": "a"}));
    assert_eq!(r.status, 400);
}
