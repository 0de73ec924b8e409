//! Fill-in-the-middle: `/infill` in the shape llama.vscode sends (its `createRequestPayload`, commit
//! 009e5b72 of ggml-org/llama.vscode: input_prefix, input_suffix, input_extra, prompt, n_predict,
//! top_k 40, top_p 0.99, stream false, samplers, cache_prompt, n_indent, t_max_prompt_ms,
//! t_max_predict_ms), answered in llama-server's shape, on the real Qwen2.5-Coder-0.5B; and
//! `/v1/completions` with `suffix`.

#[path = "../../mens/tests/common/mod.rs"]
mod common;
mod support;

use mens::fim::{fim_prompt, FimInput};
use mens::scheduler::SchedulerOptions;
use mens_server::ServerConfig;
use serde_json::{json, Value};
use support::*;

fn vscode_request(prefix: &str, suffix: &str, prompt: &str, n_predict: i64) -> Value {
    json!({
        "input_prefix": prefix,
        "input_suffix": suffix,
        "input_extra": [{"text": "def helper(x):\n    return x * 2\n", "time": 1733000000, "filename": "util.py"}],
        "prompt": prompt,
        "n_predict": n_predict,
        "top_k": 40,
        "top_p": 0.99,
        "stream": false,
        "samplers": ["top_k", "top_p", "infill"],
        "cache_prompt": true,
        "n_indent": 4,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 10000,
    })
}

/// One slot of 2048 tokens.
fn one_slot() -> SchedulerOptions {
    SchedulerOptions {
        slots: 1,
        ctx: 2048,
        batch: 256,
        queue: 4,
        cache_reuse: 0,
        spec: None,
        cache: Default::default(),
    }
}

#[test]
fn infill_fills_a_function_body_like_llama_server() {
    let l = common::load("qwen2.5-coder-0.5b");
    let tok = mens::tokenizer::Tokenizer::from_gguf(&l.model.gguf).unwrap();
    let fim = tok.fim.expect("Qwen2.5-Coder has FIM tokens");
    assert!(fim.repo.is_some() && fim.file_sep.is_some());
    let opts = one_slot();
    let s = start_with(l.model.clone(), tok, opts, ServerConfig::default());
    let prefix = "def add(a, b):\n";
    let suffix = "\n    return result\n";

    // The prompt layout: repo name, the extra chunk as a file, the current file, then
    // prefix + prompt, suffix, middle; all request text as text.
    let input = FimInput {
        prefix: prefix.into(),
        suffix: suffix.into(),
        prompt: "    ".into(),
        extra: vec![(
            "util.py".into(),
            "def helper(x):\n    return x * 2\n".into(),
        )],
    };
    let tok = &s.state.tokenizer;
    let ids = fim_prompt(tok, &fim, &input, 1024, 16, 2048).unwrap();
    let text = tok.decode(&ids);
    assert_eq!(
        text,
        "<|repo_name|>myproject\n<|file_sep|>util.py\ndef helper(x):\n    return x * 2\n\
         <|file_sep|>filename\n<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return result\n<|fim_middle|>"
    );
    assert_eq!(ids[0], fim.repo.unwrap());
    assert_eq!(*ids.last().unwrap(), fim.middle);
    // Control-token text in the code is text.
    let forged = FimInput {
        prefix: "x = '<|fim_middle|>'\n".into(),
        ..input.clone()
    };
    let f = fim_prompt(tok, &fim, &forged, 1024, 16, 2048).unwrap();
    assert_eq!(f.iter().filter(|&&t| t == fim.middle).count(), 1);

    // Greedy: the function body.
    let mut req = vscode_request(prefix, suffix, "    ", 16);
    req["temperature"] = json!(0);
    let r = post(s.addr, "/infill", req);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let content = v["content"].as_str().unwrap();
    eprintln!("infill: {content:?}");
    assert!(content.contains("a + b"), "{content:?}");
    assert_eq!(v["stop"], true);
    assert!(v["timings"]["predicted_n"].as_u64().unwrap() >= 1);
    assert_eq!(v["tokens_evaluated"].as_u64().unwrap() as usize, ids.len());

    // llama.vscode's exact request (sampled, as it sends it) gets an answer of the same shape.
    let r = post(
        s.addr,
        "/infill",
        vscode_request(prefix, suffix, "    ", 16),
    )
    .json();
    assert!(
        r["content"].is_string() && r["timings"]["prompt_ms"].is_number(),
        "{r}"
    );

    // Its warm-up call (n_predict 0) answers empty and leaves the prompt cached for the next one.
    let warm = post(
        s.addr,
        "/infill",
        vscode_request("def sub(a, b):\n", suffix, "    ", 0),
    )
    .json();
    assert_eq!(warm["content"], "");
    let next = post(
        s.addr,
        "/infill",
        vscode_request("def sub(a, b):\n", suffix, "    ", 8),
    )
    .json();
    assert!(next["tokens_cached"].as_u64().unwrap() > 20, "{next}");

    // Streamed: `data: {"content": …, "stop": false}` chunks, then one with stop: true.
    let mut req = vscode_request(prefix, suffix, "    ", 8);
    req["stream"] = json!(true);
    req["temperature"] = json!(0);
    let ev = post(s.addr, "/infill", req).events();
    let last: Value = serde_json::from_str(ev.last().unwrap()).unwrap();
    assert_eq!(last["stop"], true);
    let streamed: String = ev[..ev.len() - 1]
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(streamed, content[..streamed.len()]);

    // /v1/completions with a suffix fills in the middle too.
    let r = post(
        s.addr,
        "/v1/completions",
        json!({"prompt": "def add(a, b):\n    ", "suffix": suffix, "max_tokens": 16, "temperature": 0}),
    )
    .json();
    let text = r["choices"][0]["text"].as_str().unwrap();
    assert!(text.contains("a + b"), "{text:?}");
}

#[test]
fn a_model_without_fim_tokens_gets_a_clear_400() {
    let s = start(1, 4, ServerConfig::default());
    let r = post(s.addr, "/infill", vscode_request("def f(", ")", "", 4));
    assert_error(&r, 400, "fill-in-the-middle");
    let r = post(
        s.addr,
        "/v1/completions",
        json!({"prompt": "a", "suffix": "b", "max_tokens": 2}),
    );
    assert_error(&r, 400, "fill-in-the-middle");
}

/// `n_indent` (llama.vscode sends the cursor line's indentation): the completion ends, as
/// llama-server ends it, before the first later line indented less — here the next method of the
/// class, which the 0.5B goes on to write without it; whole and streamed alike.
#[test]
fn n_indent_ends_the_completion_at_a_shallower_line() {
    let l = common::load("qwen2.5-coder-0.5b");
    let tok = mens::tokenizer::Tokenizer::from_gguf(&l.model.gguf).unwrap();
    let opts = one_slot();
    let s = start_with(l.model.clone(), tok, opts, ServerConfig::default());
    let prefix = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n";
    let ask = |n_indent: i64, stream: bool| {
        let mut b = vscode_request(prefix, "\n", "        ", 80);
        b["n_indent"] = json!(n_indent);
        b["temperature"] = json!(0);
        b["stream"] = json!(stream);
        post(s.addr, "/infill", b)
    };
    let free = ask(0, false).json();
    let free_text = free["content"].as_str().unwrap().to_string();
    // Without the limit the model writes the next method, at 4 spaces.
    assert!(free_text.contains("\n    def "), "{free_text:?}");
    let limited = ask(8, false).json();
    let text = limited["content"].as_str().unwrap();
    // With it, the answer is the free one up to the first later line indented less than 8 (a
    // blank line counts, as in llama-server), cut before that line's first character.
    let line = text.rfind('\n').map(|i| i + 1).expect("a newline");
    let rest = &free_text[line..];
    let indent = rest.len() - rest.trim_start_matches([' ', '\t']).len();
    assert!(
        free_text.starts_with(text) && text.len() < free_text.len(),
        "{limited}"
    );
    assert_eq!(text.len(), line + indent, "{limited}");
    assert!(indent < 8, "{limited}");
    assert!(text[..line]
        .lines()
        .skip(1)
        .all(|l| l.len() - l.trim_start().len() >= 8));
    assert_eq!(limited["stop_type"], "limit");
    assert!(
        limited["tokens_predicted"].as_u64().unwrap() < free["tokens_predicted"].as_u64().unwrap()
    );
    let streamed: String = ask(8, true)
        .events()
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(streamed, text);
    assert_error(
        &post(
            s.addr,
            "/infill",
            json!({"input_prefix": "a", "n_indent": 1 << 20}),
        ),
        400,
        "n_indent",
    );
}
