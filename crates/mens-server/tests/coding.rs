//! What coding tools speak, on the real Qwen2.5-Coder-0.5B: schema-constrained output, tool calls
//! (forced and parsed, whole and streamed), log-probabilities.

#[path = "../../mens/tests/common/mod.rs"]
mod common;
mod support;

use mens::scheduler::SchedulerOptions;
use mens_server::ServerConfig;
use serde_json::{json, Value};
use support::*;

fn server() -> Server {
    two_slots(&common::load("qwen2.5-coder-0.5b").model, None, false)
}

fn ask(content: &str) -> Value {
    json!({"messages": [{"role": "user", "content": content}], "max_tokens": 120})
}

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                       "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}},
           {"type": "function", "function": {"name": "read_file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}])
}

/// Sampled (temperature 0.8, several seeds) output under a schema always parses and holds every
/// rule of the schema: types, required keys, no others, enum, array bounds, integer range.
#[test]
fn json_schema_output_always_validates() {
    let s = server();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "lang": {"enum": ["python", "rust", "go"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3},
        },
        "required": ["name", "age", "lang", "tags"],
        "additionalProperties": false,
    });
    for seed in 0..3 {
        let mut b = ask("Describe a programmer as JSON.");
        b["temperature"] = json!(0.8);
        b["seed"] = json!(seed);
        b["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "p", "strict": true, "schema": schema}});
        let r = post(s.addr, "/v1/chat/completions", b);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let v = r.json();
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
        let text = v["choices"][0]["message"]["content"].as_str().unwrap();
        let o: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let o = o.as_object().unwrap();
        let mut keys: Vec<_> = o.keys().cloned().collect();
        keys.sort();
        assert_eq!(keys, ["age", "lang", "name", "tags"], "{text}");
        assert!(o["name"].as_str().unwrap().chars().count() <= 20, "{text}");
        let age = o["age"].as_i64().unwrap_or(-1);
        assert!((0..=120).contains(&age), "{text}");
        assert!(
            ["python", "rust", "go"].contains(&o["lang"].as_str().unwrap()),
            "{text}"
        );
        let tags = o["tags"].as_array().unwrap();
        assert!((1..=3).contains(&tags.len()), "{text}");
        assert!(
            tags.iter()
                .all(|t| t.as_str().is_some_and(|t| t.chars().count() <= 12)),
            "{text}"
        );
    }
    // json_object: any object; a regex and a Lark grammar.
    let mut b = ask("List two fruits.");
    b["response_format"] = json!({"type": "json_object"});
    b["temperature"] = json!(0);
    let v = post(s.addr, "/v1/chat/completions", b).json();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        serde_json::from_str::<Value>(text).unwrap().is_object(),
        "{text}"
    );
    let mut b = ask("What year did Python 3 come out?");
    b["regex"] = json!("[0-9]{4}");
    let v = post(s.addr, "/v1/chat/completions", b).json();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        text.len() == 4 && text.bytes().all(|c| c.is_ascii_digit()),
        "{text}"
    );
    let mut b = ask("Is Rust memory safe?");
    b["grammar"] = json!("start: (\"yes\" | \"no\") \", because \" /[a-z ]{1,40}/ \".\"");
    let v = post(s.addr, "/v1/chat/completions", b).json();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        (text.starts_with("yes, because ") || text.starts_with("no, because "))
            && text.ends_with('.'),
        "{text}"
    );
}

/// One slot of 2048 tokens.
fn one_slot() -> SchedulerOptions {
    SchedulerOptions {
        slots: 1,
        ctx: 2048,
        batch: 256,
        queue: 8,
        cache_reuse: 0,
        spec: None,
        cache: Default::default(),
    }
}

/// A conversation where the assistant called `get_weather` and the tool answered (greedy, no
/// call allowed now).
fn after_a_call(tools: Value) -> Value {
    let mut b = ask("What is the weather in Oslo, in celsius?");
    b["tools"] = tools;
    b["temperature"] = json!(0);
    b["messages"] = json!([
        {"role": "user", "content": "What is the weather in Oslo, in celsius?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"unit\": \"c\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": -3, \"sky\": \"snow\"}"},
    ]);
    b["tool_choice"] = json!("none");
    b
}

/// `tool_choice: required` and a named function force a call in the model's format; the answer
/// carries it in `tool_calls` (whole and streamed alike), and a tool result goes back in.
#[test]
fn tool_calls_forced_parsed_and_streamed() {
    let s = server();
    let mut b = ask("What is the weather in Oslo, in celsius?");
    b["tools"] = weather_tools();
    b["temperature"] = json!(0);
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_weather"}}),
    ] {
        b["tool_choice"] = choice;
        let v = post(s.addr, "/v1/chat/completions", b.clone()).json();
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{v}");
        let call = &c["message"]["tool_calls"][0];
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "get_weather", "{v}");
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(
            args["city"].is_string() && ["c", "f"].contains(&args["unit"].as_str().unwrap()),
            "{args}"
        );

        // Streamed: one tool_calls delta with the same call, then finish_reason tool_calls.
        let mut sb = b.clone();
        sb["stream"] = json!(true);
        let r = post(s.addr, "/v1/chat/completions", sb);
        let events = r.events();
        let chunks: Vec<Value> = events
            .iter()
            .filter(|e| *e != "[DONE]")
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        let deltas: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"].get("tool_calls"))
            .collect();
        assert_eq!(deltas.len(), 1, "{events:?}");
        assert_eq!(deltas[0][0]["index"], 0);
        assert_eq!(deltas[0][0]["function"], call["function"]);
        assert_eq!(
            chunks.last().unwrap()["choices"][0]["finish_reason"],
            "tool_calls"
        );
    }
    // The call and its result go back through the template; the model answers in text.
    let v = post(
        s.addr,
        "/v1/chat/completions",
        after_a_call(weather_tools()),
    )
    .json();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert!(!v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .is_empty());
}

/// Greedy log-probabilities: one entry per generated token, the chosen token is the most likely,
/// alternatives in descending order, the same whole and streamed.
#[test]
fn logprobs_whole_and_streamed_agree() {
    let s = server();
    let mut b = ask("Write a haiku about Rust.");
    b["temperature"] = json!(0);
    b["max_tokens"] = json!(12);
    b["logprobs"] = json!(true);
    b["top_logprobs"] = json!(3);
    let v = post(s.addr, "/v1/chat/completions", b.clone()).json();
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(
        content.len() as i64,
        v["usage"]["completion_tokens"].as_i64().unwrap(),
        "{v}"
    );
    let text: String = content
        .iter()
        .map(|e| e["token"].as_str().unwrap())
        .collect();
    assert_eq!(
        text,
        v["choices"][0]["message"]["content"].as_str().unwrap()
    );
    for e in &content {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0]["token"], e["token"], "greedy picks the most likely");
        let lp: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(
            lp.windows(2).all(|w| w[0] >= w[1]) && lp[0] <= 0.0,
            "{lp:?}"
        );
        let p: f64 = lp.iter().map(|l| l.exp()).sum();
        assert!(p <= 1.0 + 1e-4, "probabilities sum to {p}");
    }
    b["stream"] = json!(true);
    let r = post(s.addr, "/v1/chat/completions", b);
    let streamed: Vec<Value> = r
        .events()
        .iter()
        .filter(|e| *e != "[DONE]")
        .flat_map(|e| {
            let c: Value = serde_json::from_str(e).unwrap();
            c["choices"][0]["logprobs"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(streamed, content);
}

/// A server of `model` with two slots of 2048 tokens, speculating with `spec` (by prompt lookup,
/// or with the model itself as its draft when `draft`).
fn two_slots(
    model: &std::sync::Arc<mens::model::Model>,
    spec: Option<mens::spec::SpecOptions>,
    draft: bool,
) -> Server {
    let tok = mens::tokenizer::Tokenizer::from_gguf(&model.gguf).unwrap();
    let opts = SchedulerOptions {
        slots: 2,
        ctx: 2048,
        batch: 256,
        queue: 8,
        cache_reuse: 0,
        spec,
        cache: Default::default(),
    };
    let draft = spec.filter(|_| draft).map(|_| model.clone());
    support::start_with_draft(model.clone(), draft, tok, opts, ServerConfig::default())
}

/// Speculation in the server: greedy requests propose by prompt lookup and are checked in the same
/// batched step as other slots (here a sampled request beside it); the text equals a server
/// without speculation, and proposals are accepted.
#[test]
fn server_speculation_keeps_greedy_text() {
    let l = common::load("qwen2.5-coder-0.5b");
    let serve = |spec| two_slots(&l.model, spec, false);
    let rename = "Rename the variable `total` to `acc` and return the whole function:\n\n```python\ndef summarize(items):\n    total = 0\n    for item in items:\n        total += item.value\n    return total\n```";
    let mut b = ask(rename);
    b["temperature"] = json!(0);
    b["max_tokens"] = json!(80);
    let plain = post(serve(None).addr, "/v1/chat/completions", b.clone()).json();
    let s = serve(Some(mens::spec::SpecOptions {
        max: 8,
        ngram: 3,
        gate: false,
    }));
    let addr = s.addr;
    let sampled = std::thread::spawn(move || {
        let mut o = ask("Write a haiku about Rust.");
        o["temperature"] = json!(0.8);
        o["max_tokens"] = json!(40);
        post(addr, "/v1/chat/completions", o).status
    });
    let spec = post(addr, "/v1/chat/completions", b).json();
    assert_eq!(sampled.join().unwrap(), 200);
    assert_eq!(
        spec["choices"][0]["message"]["content"], plain["choices"][0]["message"]["content"],
        "speculation changed the greedy text"
    );
    assert_eq!(spec["usage"], plain["usage"]);
    let st = s.state.scheduler.status();
    let (p, a) = (
        st.spec_proposed.load(std::sync::atomic::Ordering::Relaxed),
        st.spec_accepted.load(std::sync::atomic::Ordering::Relaxed),
    );
    eprintln!("server speculation: {a} of {p} proposals accepted");
    assert!(a > 10 && a <= p, "{a} of {p}");
}

/// A draft model in the server: two greedy requests speculate together (their draft caches
/// caught up and drafted in shared draft steps), the texts equal a server without speculation.
/// The draft is the target itself, so every proposal must be accepted: a draft cache out of step
/// with the target's would propose other tokens.
#[test]
fn server_draft_model_keeps_greedy_text() {
    let l = common::load("qwen2.5-coder-0.5b");
    let serve = |spec| two_slots(&l.model, spec, true);
    let asks = [
        "Rename the variable `total` to `acc` and return the whole function:\n\n```python\ndef summarize(items):\n    total = 0\n    for item in items:\n        total += item.value\n    return total\n```",
        "Write a Python function that checks whether a string is a palindrome.",
    ];
    let body = |q: &str| {
        let mut b = ask(q);
        b["temperature"] = json!(0);
        b["max_tokens"] = json!(60);
        b
    };
    // Both servers get the two requests at once, so their prompts are prefilled in the same
    // passes (a prompt in one pass of 64 rows or more and one resumed from a cached prefix run
    // different attention arithmetic, as in llama.cpp).
    let together = |addr| -> Vec<Value> {
        asks.iter()
            .map(|q| {
                let b = body(q);
                std::thread::spawn(move || post(addr, "/v1/chat/completions", b).json())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect()
    };
    let plain = serve(None);
    let want = together(plain.addr);
    let s = serve(Some(mens::spec::SpecOptions {
        max: 8,
        ngram: 3,
        gate: false,
    }));
    let got = together(s.addr);
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(
            g["choices"][0]["message"]["content"], w["choices"][0]["message"]["content"],
            "the draft changed the greedy text"
        );
        assert_eq!(
            g["usage"]["completion_tokens"],
            w["usage"]["completion_tokens"]
        );
    }
    let st = s.state.scheduler.status();
    let (p, a) = (
        st.spec_proposed.load(std::sync::atomic::Ordering::Relaxed),
        st.spec_accepted.load(std::sync::atomic::Ordering::Relaxed),
    );
    eprintln!("server draft model (the target itself): {a} of {p} proposals accepted");
    assert!(p >= 40 && a == p, "{a} of {p}");
}

/// A template that teaches Qwen3-Coder's XML call format (`--chat-template-file`): forced calls
/// are written in it and parsed into `tool_calls` (typed by the tool's schema; whole, streamed and
/// on the Anthropic API alike), and calls in the history are rendered in it.
#[test]
fn xml_tool_calls_forced_parsed_and_rendered() {
    let l = common::load("qwen2.5-coder-0.5b");
    let source = std::fs::read_to_string(common::data("xml-tools.jinja")).unwrap();
    let opts = one_slot();
    let tok = mens::tokenizer::Tokenizer::from_gguf(&l.model.gguf).unwrap();
    let s = support::start_with_template(
        l.model.clone(),
        None,
        tok,
        opts,
        ServerConfig::default(),
        Some(source.clone()),
    );
    let mut tools = weather_tools();
    tools
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "function", "function": {
        "name": "read_lines", "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "start": {"type": "integer", "minimum": 1}},
            "required": ["path", "start"]}}}));
    let mut b = ask("What is the weather in Oslo, in celsius?");
    b["tools"] = tools.clone();
    b["temperature"] = json!(0);
    for (choice, name) in [
        (json!("required"), None),
        (
            json!({"type": "function", "function": {"name": "read_lines"}}),
            Some("read_lines"),
        ),
    ] {
        b["tool_choice"] = choice;
        let v = post(s.addr, "/v1/chat/completions", b.clone()).json();
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{v}");
        let call = &c["message"]["tool_calls"][0];
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        match call["function"]["name"].as_str().unwrap() {
            "get_weather" => assert!(
                args["city"].is_string() && ["c", "f"].contains(&args["unit"].as_str().unwrap()),
                "{args}"
            ),
            "read_lines" => assert!(
                args["path"].is_string() && args["start"].as_i64().is_some_and(|n| n >= 1),
                "{args}"
            ),
            other => panic!("{other}: {v}"),
        }
        if let Some(n) = name {
            assert_eq!(call["function"]["name"], n, "{v}");
        }

        // Streamed: the same call in one delta.
        let mut sb = b.clone();
        sb["stream"] = json!(true);
        let events = post(s.addr, "/v1/chat/completions", sb).events();
        let deltas: Vec<Value> = events
            .iter()
            .filter(|e| *e != "[DONE]")
            .map(|e| serde_json::from_str::<Value>(e).unwrap())
            .filter_map(|c| c["choices"][0]["delta"].get("tool_calls").cloned())
            .collect();
        assert_eq!(deltas.len(), 1, "{events:?}");
        assert_eq!(deltas[0][0]["function"], call["function"]);
    }

    // parallel_tool_calls: true lets a forced answer hold several calls (this model repeats its
    // call until max_tokens); without it, one.
    b["tool_choice"] = json!("required");
    b["parallel_tool_calls"] = json!(true);
    b["max_tokens"] = json!(400);
    let v = post(s.addr, "/v1/chat/completions", b.clone()).json();
    let n = v["choices"][0]["message"]["tool_calls"]
        .as_array()
        .map_or(0, Vec::len);
    assert!((2..=mens::tools::MAX_CALLS).contains(&n), "{v}");

    // The Anthropic API: a forced call comes back as a tool_use block with its input object.
    let a = post(
        s.addr,
        "/v1/messages",
        json!({"model": "mens", "max_tokens": 120, "temperature": 0,
               "messages": [{"role": "user", "content": "Show lines of src/main.rs from line 10."}],
               "tools": [{"name": "read_lines", "input_schema": tools[2]["function"]["parameters"]}],
               "tool_choice": {"type": "tool", "name": "read_lines"}}),
    )
    .json();
    assert_eq!(a["stop_reason"], "tool_use", "{a}");
    let block = a["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap();
    assert!(block["input"]["start"].is_i64(), "{a}");

    // A call in the history is rendered in the template's format, its arguments as the template
    // writes them; a tool result follows it and the model answers in text.
    let template = mens::chat::ChatTemplate::new(Some(source), String::new(), "<|im_end|>".into());
    let mut m = mens::chat::Message::new("assistant", "");
    m.tool_calls = vec![json!({"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}})];
    let text = template
        .render_with(
            &[mens::chat::Message::new("user", "Weather?"), m],
            tools.as_array().unwrap(),
            false,
        )
        .unwrap();
    assert!(
        text.contains("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>"),
        "{text}"
    );
    let v = post(s.addr, "/v1/chat/completions", after_a_call(tools)).json();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
}

/// `logit_bias` (OpenAI's object, llama-server's pairs): -100 (or `false`) keeps a token out of a
/// greedy answer, +100 puts one in; streamed and whole alike.
#[test]
fn logit_bias_bans_and_forces_tokens() {
    let s = server();
    let first = |bias: Value| -> (String, u64) {
        let r = post(
            s.addr,
            "/v1/completions",
            json!({"prompt": "def fibonacci(n):", "max_tokens": 6, "temperature": 0, "logit_bias": bias}),
        );
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let text = r.json()["choices"][0]["text"].as_str().unwrap().to_string();
        let ids = post(s.addr, "/tokenize", json!({"content": text})).json();
        (text, ids["tokens"][0].as_u64().unwrap())
    };
    let (plain, t0) = first(json!(null));
    let (banned, t1) = first(json!({ t0.to_string(): -100 }));
    assert_ne!(t1, t0, "{plain:?} / {banned:?}");
    let (pair, t2) = first(json!([[t0, false]]));
    assert_eq!((pair, t2), (banned, t1));
    let want = post(s.addr, "/tokenize", json!({"content": " banana"})).json()["tokens"][0]
        .as_u64()
        .unwrap();
    let (forced, t3) = first(json!({ want.to_string(): 100 }));
    assert_eq!(t3, want, "{forced:?}");
}

/// A reasoning model's answer (forced here by a grammar): its leading `<think>` block comes back
/// as `reasoning_content`, whole and streamed (`delta.reasoning_content`), the answer as
/// `content`; `split_reasoning: false` (`--reasoning-format none`) leaves the block in the text.
#[test]
fn a_leading_think_block_is_reasoning_content() {
    let l = common::load("qwen2.5-coder-0.5b");
    let answer = "<think>\nadd one and two\n</think>\n\nThe answer is 3.";
    let mut b = ask("What is 1 + 2?");
    b["grammar"] = json!(format!("start: {}", serde_json::to_string(answer).unwrap()));
    b["temperature"] = json!(0);
    let tok = || mens::tokenizer::Tokenizer::from_gguf(&l.model.gguf).unwrap();
    let opts = one_slot;
    let s = support::start_with(l.model.clone(), tok(), opts(), ServerConfig::default());
    let v = post(s.addr, "/v1/chat/completions", b.clone()).json();
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], "add one and two", "{v}");
    assert_eq!(m["content"], "The answer is 3.", "{v}");

    let mut sb = b.clone();
    sb["stream"] = json!(true);
    let (mut reasoning, mut content) = (String::new(), String::new());
    for e in post(s.addr, "/v1/chat/completions", sb).events() {
        if e == "[DONE]" {
            continue;
        }
        let c: Value = serde_json::from_str(&e).unwrap();
        let d = &c["choices"][0]["delta"];
        reasoning += d["reasoning_content"].as_str().unwrap_or("");
        content += d["content"].as_str().unwrap_or("");
    }
    assert_eq!(
        (reasoning.as_str(), content.as_str()),
        ("add one and two", "The answer is 3.")
    );

    let plain = support::start_with(
        l.model.clone(),
        tok(),
        opts(),
        ServerConfig {
            split_reasoning: false,
            ..Default::default()
        },
    );
    let v = post(plain.addr, "/v1/chat/completions", b).json();
    assert_eq!(v["choices"][0]["message"]["content"], answer, "{v}");
    assert!(v["choices"][0]["message"]
        .get("reasoning_content")
        .is_none());
}

/// The 0.5B behind its own template changed to open `<think>` in the assistant's turn (as
/// thinking models' templates do), one slot.
fn thinking_server() -> Server {
    thinking_server_with(ServerConfig::default())
}

fn thinking_server_with(config: ServerConfig) -> Server {
    let l = common::load("qwen2.5-coder-0.5b");
    let tok = mens::tokenizer::Tokenizer::from_gguf(&l.model.gguf).unwrap();
    let base = mens::chat::ChatTemplate::from_gguf(&l.model.gguf, &tok).unwrap();
    let turn = "{{- '<|im_start|>assistant\\n' }}";
    let source = base.source().unwrap();
    assert!(source.contains(turn));
    let opened = source.replace(turn, "{{- '<|im_start|>assistant\\n<think>\\n' }}");
    support::start_with_template(l.model.clone(), None, tok, one_slot(), config, Some(opened))
}

/// A forced call may follow the model's reasoning: with a template that opens the `<think>` block
/// (as thinking models' templates do), the forcing grammar lets the answer reason, close the block
/// and call; the reasoning is `reasoning_content` and the call is parsed. (Before, the grammar
/// forced the call at once, inside the open block, where it was read as reasoning.)
#[test]
fn a_forced_call_may_follow_reasoning_in_an_opened_block() {
    let s = thinking_server();
    let mut b = ask("What is the weather in Oslo, in celsius? Think briefly, then call the tool.");
    b["tools"] = weather_tools();
    b["tool_choice"] = json!("required");
    b["temperature"] = json!(0);
    let v = post(s.addr, "/v1/chat/completions", b).json();
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    let reasoning = c["message"]["reasoning_content"].as_str().unwrap_or("");
    assert!(
        !reasoning.trim().is_empty() && !reasoning.contains("<tool_call>"),
        "{v}"
    );
    let call = &c["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{v}");
}

/// The data of each server-sent event (`event:` lines skipped).
fn event_data(r: &Reply) -> Vec<Value> {
    String::from_utf8(r.body.clone())
        .unwrap()
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// The Anthropic and Responses APIs give a reasoning model's reasoning its own place: a
/// `thinking` block (streamed as `thinking_delta`s, closed by a `signature_delta`) and a
/// `reasoning` item (streamed as `response.reasoning_text.delta`s), before the call; whole and
/// streamed agree. `display: "omitted"` keeps the block and drops its text.
#[test]
fn reasoning_is_a_thinking_block_and_a_reasoning_item() {
    let s = thinking_server();
    let question = "What is the weather in Oslo, in celsius? Think briefly, then call the tool.";
    let schema = weather_tools()[0]["function"]["parameters"].clone();

    // Anthropic, whole.
    let a = json!({"model": "mens", "max_tokens": 120, "temperature": 0,
        "thinking": {"type": "adaptive"},
        "messages": [{"role": "user", "content": question}],
        "tools": [{"name": "get_weather", "input_schema": schema}],
        "tool_choice": {"type": "any"}});
    let v = post(s.addr, "/v1/messages", a.clone()).json();
    let blocks = v["content"].as_array().unwrap();
    assert_eq!(blocks[0]["type"], "thinking", "{v}");
    assert_eq!(blocks[0]["signature"], "", "{v}");
    let thought = blocks[0]["thinking"].as_str().unwrap().to_string();
    assert!(
        !thought.trim().is_empty() && !thought.contains("</think>"),
        "{v}"
    );
    assert_eq!(blocks[1]["type"], "tool_use", "{v}");
    assert_eq!(blocks[1]["name"], "get_weather", "{v}");
    assert_eq!(v["stop_reason"], "tool_use", "{v}");

    // Anthropic, streamed: the same thinking, its block first and closed before the call's.
    let mut sa = a.clone();
    sa["stream"] = json!(true);
    let ev = event_data(&post(s.addr, "/v1/messages", sa));
    let starts: Vec<&Value> = ev
        .iter()
        .filter(|e| e["type"] == "content_block_start")
        .map(|e| &e["content_block"])
        .collect();
    assert_eq!(starts[0]["type"], "thinking", "{ev:?}");
    assert_eq!(starts[1]["type"], "tool_use", "{ev:?}");
    let streamed: String = ev
        .iter()
        .filter(|e| e["delta"]["type"] == "thinking_delta")
        .map(|e| e["delta"]["thinking"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, thought);
    let sig = ev
        .iter()
        .position(|e| e["delta"]["type"] == "signature_delta")
        .unwrap();
    assert_eq!(ev[sig + 1]["type"], "content_block_stop", "{ev:?}");
    assert_eq!(ev[sig + 1]["index"], 0, "{ev:?}");

    // display: "omitted": the block stays, without its text.
    let mut oa = a.clone();
    oa["thinking"] = json!({"type": "enabled", "budget_tokens": 1024, "display": "omitted"});
    let v = post(s.addr, "/v1/messages", oa).json();
    assert_eq!(v["content"][0]["type"], "thinking", "{v}");
    assert_eq!(v["content"][0]["thinking"], "", "{v}");

    // Responses, whole and streamed.
    let r = json!({"model": "mens", "max_output_tokens": 120, "temperature": 0,
        "input": question, "tool_choice": "required",
        "tools": [{"type": "function", "name": "get_weather", "parameters": schema}]});
    let v = post(s.addr, "/v1/responses", r.clone()).json();
    let out = v["output"].as_array().unwrap();
    assert_eq!(out[0]["type"], "reasoning", "{v}");
    assert_eq!(out[0]["content"][0]["type"], "reasoning_text", "{v}");
    assert_eq!(out[0]["content"][0]["text"], json!(thought), "{v}");
    assert_eq!(out[1]["type"], "function_call", "{v}");
    let mut sr = r.clone();
    sr["stream"] = json!(true);
    let ev = event_data(&post(s.addr, "/v1/responses", sr));
    let streamed: String = ev
        .iter()
        .filter(|e| e["type"] == "response.reasoning_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, thought);
    let done = ev.last().unwrap();
    assert_eq!(done["type"], "response.completed", "{ev:?}");
    assert_eq!(done["response"]["output"][0]["type"], "reasoning", "{done}");
    assert_eq!(
        done["response"]["output"][1]["type"], "function_call",
        "{done}"
    );
}

/// A request in the shape Claude Code 2.1 sends (seen through a logging proxy; the text here is
/// made up): `?beta=true`, system blocks with `cache_control`, a system message within the
/// conversation, tools without a `type`, adaptive thinking with its text omitted,
/// `context_management` and `output_config`, `max_tokens` 32,000 against a 2,048-token slot,
/// streamed; then the next turn with an empty-text thinking block, a `tool_use` and its result.
#[test]
fn claude_codes_request_shape_is_served() {
    let l = common::load("qwen2.5-coder-0.5b");
    let tok = mens::tokenizer::Tokenizer::from_gguf(&l.model.gguf).unwrap();
    let s = support::start_with(l.model.clone(), tok, one_slot(), ServerConfig::default());
    let tools = json!([
        {"name": "Read", "description": "Read a file from the local filesystem.",
         "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}},
                          "required": ["file_path"], "additionalProperties": false,
                          "$schema": "http://json-schema.org/draft-07/schema#"}},
        {"name": "Bash", "description": "Run a shell command.",
         "input_schema": {"type": "object", "properties": {"command": {"type": "string"},
                          "timeout": {"type": "number"}}, "required": ["command"]}}]);
    let mut b = json!({
        "model": "mens", "max_tokens": 32000, "stream": true,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": "{\"device_id\":\"d\",\"session_id\":\"s\"}"},
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.a1b; cc_entrypoint=cli; cch=0aaa9;"},
                   {"type": "text", "text": "You are a coding agent."},
                   {"type": "text", "text": "Answer briefly.", "cache_control": {"type": "ephemeral"}}],
        "tools": tools,
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>The date is 2026-12-05.</system-reminder>"},
                {"type": "text", "text": "Reply with the word hello.", "cache_control": {"type": "ephemeral"}}]},
            {"role": "system", "content": [{"type": "text", "text": "Use tools only when needed."}]}]});
    let r = post(s.addr, "/v1/messages?beta=true", b.clone());
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let ev = event_data(&r);
    assert_eq!(ev[0]["type"], "message_start", "{ev:?}");
    assert_eq!(ev.last().unwrap()["type"], "message_stop", "{ev:?}");
    let end = ev.iter().find(|e| e["type"] == "message_delta").unwrap();
    assert!(end["usage"]["cache_read_input_tokens"].is_u64(), "{end}");
    assert!(
        ["end_turn", "max_tokens", "tool_use"]
            .contains(&end["delta"]["stop_reason"].as_str().unwrap()),
        "{end}"
    );

    // The next turn: the earlier answer (its thinking omitted, a call) and the call's result.
    b["messages"] = json!([
        {"role": "user", "content": "What does notes.txt say?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "", "signature": ""},
            {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "notes.txt"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1",
             "content": [{"type": "text", "text": "banana split recipe"}]},
            {"type": "text", "text": "Answer with its first word."}]}]);
    b["stream"] = json!(false);
    // Its billing block changes with every request; dropped, the system prompt and tools are
    // read from the cache the first request left.
    b["system"][0]["text"] =
        json!("x-anthropic-billing-header: cc_version=2.1.332.e59; cc_entrypoint=cli; cch=36ee5;");
    let v = post(s.addr, "/v1/messages?beta=true", b).json();
    assert_eq!(v["type"], "message", "{v}");
    assert!(v["usage"]["output_tokens"].as_u64().unwrap() > 0, "{v}");
    let cached = v["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    assert!(cached > 100, "{v}");
    assert!(v["usage"]["input_tokens"].as_u64().unwrap() > 0, "{v}");
}

/// A request in the shape Codex 0.171 sends to the Responses API (seen through a logging proxy;
/// the text here is made up): developer messages, function tools, a namespace of tools, a hosted
/// web search, `reasoning.summary`, `include`, `prompt_cache_key`, `client_metadata`, `store:
/// false`, streamed. Forced calls come back under their namespace, and a custom tool's call as a
/// `custom_tool_call` with its text input.
#[test]
fn codexs_request_shape_is_served() {
    let s = server();
    let mut b = json!({
        "model": "mens", "stream": true, "store": false, "parallel_tool_calls": true,
        "tool_choice": "auto", "reasoning": {"summary": "auto"},
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "thread-1",
        "client_metadata": {"thread_id": "thread-1", "turn_id": "turn-1"},
        "max_output_tokens": 80, "temperature": 0,
        "tools": [
            {"type": "function", "name": "exec_command", "description": "Run a shell command.",
             "strict": false, "parameters": {"type": "object",
                "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
            {"type": "namespace", "name": "agents", "description": "Sub-agents.", "tools": [
                {"type": "function", "name": "close_agent", "description": "Close an agent.",
                 "parameters": {"type": "object", "properties": {"id": {"type": "string"}},
                                "required": ["id"]}}]},
            {"type": "custom", "name": "apply_patch", "description": "Apply a patch to files."},
            {"type": "web_search", "external_web_access": false}],
        "input": [
            {"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": "You are a coding agent."}]},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "<environment_context><cwd>/w</cwd></environment_context>"}]},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "Close the agent named a1."}]}]});
    let r = post(s.addr, "/v1/responses", b.clone());
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let ev = event_data(&r);
    assert_eq!(ev.last().unwrap()["type"], "response.completed", "{ev:?}");

    b["tool_choice"] = json!({"type": "function", "namespace": "agents", "name": "close_agent"});
    let ev = event_data(&post(s.addr, "/v1/responses", b.clone()));
    let done = &ev.last().unwrap()["response"];
    let call = done["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call")
        .unwrap_or_else(|| panic!("{done}"));
    assert_eq!(
        (&call["namespace"], &call["name"]),
        (&json!("agents"), &json!("close_agent"))
    );
    assert!(ev.iter().any(
        |e| e["type"] == "response.function_call_arguments.done" && e["name"] == "close_agent"
    ));

    b["tool_choice"] = json!({"type": "custom", "name": "apply_patch"});
    b["stream"] = json!(false);
    b["input"][2]["content"][0]["text"] = json!("Add a line 'x = 1' to a.py.");
    let v = post(s.addr, "/v1/responses", b).json();
    let call = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "custom_tool_call")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(call["name"], "apply_patch", "{v}");
    assert!(
        call["input"].is_string() && call.get("arguments").is_none(),
        "{v}"
    );
}

/// A reasoning budget closes the `<think>` block by force (llama-server's `--reasoning-budget`):
/// at the request's `thinking_budget_tokens` (Anthropic's `thinking.budget_tokens`) or else the
/// server's budget, its closing tag (after the budget message) is given instead of sampled, and the
/// answer follows. Greedy, the block is the unbudgeted block's first tokens; usage counts it.
#[test]
fn a_reasoning_budget_closes_the_block() {
    let s = thinking_server();
    let close = |text: &str| {
        let v = post(s.addr, "/tokenize", json!({"content": text})).json();
        v["tokens"].as_array().unwrap().len() as u64
    };
    let tag = close("</think>");
    let reasoning = |v: &Value| {
        let n = v["usage"]["completion_tokens_details"]["reasoning_tokens"]
            .as_u64()
            .unwrap();
        let m = &v["choices"][0]["message"];
        let r = m["reasoning_content"].as_str().unwrap_or("").to_string();
        (n, r, m["content"].as_str().unwrap_or("").to_string())
    };
    let mut b = ask("Explain how a hash map works, step by step.");
    b["temperature"] = json!(0);
    b["max_tokens"] = json!(96);
    let free = post(s.addr, "/v1/chat/completions", b.clone()).json();
    let (free_n, free_r, _) = reasoning(&free);
    assert!(free_n > 12 && free_r.len() > 20, "{free}");

    b["thinking_budget_tokens"] = json!(8);
    let v = post(s.addr, "/v1/chat/completions", b.clone()).json();
    let (n, r, content) = reasoning(&v);
    assert_eq!(n, 8 + tag, "{v}");
    assert!(
        !r.is_empty() && free_r.starts_with(&r) && r.len() < free_r.len(),
        "{r:?} / {free_r:?}"
    );
    assert!(
        !content.trim().is_empty() && !content.contains("</think>"),
        "{v}"
    );
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() > n, "{v}");

    // Budget 0: closed at once. -1: unbounded. Anything else: a 400 naming the field.
    b["thinking_budget_tokens"] = json!(0);
    let v = post(s.addr, "/v1/chat/completions", b.clone()).json();
    let (n, r, _) = reasoning(&v);
    // (The 0.5B, no thinking model, then ends its answer at once.)
    assert_eq!((n, r.as_str()), (tag, ""), "{v}");
    b["thinking_budget_tokens"] = json!(-1);
    let v = post(s.addr, "/v1/chat/completions", b.clone()).json();
    assert_eq!(reasoning(&v).0, free_n, "{v}");
    b["thinking_budget_tokens"] = json!("many");
    let r = post(s.addr, "/v1/chat/completions", b.clone());
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "thinking_budget_tokens");

    // Anthropic: `thinking.budget_tokens` bounds the thinking block.
    let a = json!({"model": "mens", "max_tokens": 96, "temperature": 0,
        "thinking": {"type": "enabled", "budget_tokens": 8},
        "messages": [{"role": "user", "content": "Explain how a hash map works, step by step."}]});
    let v = post(s.addr, "/v1/messages", a).json();
    let blocks = v["content"].as_array().unwrap();
    assert_eq!(blocks[0]["type"], "thinking", "{v}");
    assert!(
        free_r.starts_with(blocks[0]["thinking"].as_str().unwrap()),
        "{v}"
    );
    assert!(blocks.iter().any(|b| b["type"] == "text"), "{v}");
    drop(s);

    // The server's budget (`--reasoning-budget 4`, with a message) when the request sets none.
    let s = thinking_server_with(ServerConfig {
        reasoning_budget: Some(4),
        reasoning_budget_message: " Enough thinking.".into(),
        ..Default::default()
    });
    b.as_object_mut().unwrap().remove("thinking_budget_tokens");
    let v = post(s.addr, "/v1/chat/completions", b.clone()).json();
    let (n, r, _) = reasoning(&v);
    let forced = post(
        s.addr,
        "/tokenize",
        json!({"content": " Enough thinking.</think>"}),
    )
    .json();
    assert_eq!(
        n,
        4 + forced["tokens"].as_array().unwrap().len() as u64,
        "{v}"
    );
    assert!(r.ends_with("Enough thinking."), "{r:?}");
    b["thinking_budget_tokens"] = json!(-1);
    let v = post(s.addr, "/v1/chat/completions", b).json();
    assert_eq!(reasoning(&v).0, free_n, "{v}");
}

/// llama-server's other route names answer as the `/v1/` ones (Continue's `llama.cpp` provider
/// posts to `/chat/completions`), and its input-token counters give the prompt length the request
/// then reports.
#[test]
fn llama_servers_route_names_and_input_token_counts() {
    let s = server();
    let mut b = ask("Say hi.");
    b["temperature"] = json!(0);
    b["max_tokens"] = json!(4);
    let a = post(s.addr, "/v1/chat/completions", b.clone()).json();
    let c = post(s.addr, "/chat/completions", b.clone()).json();
    assert_eq!(a["choices"], c["choices"], "{a} / {c}");
    for path in [
        "/v1/chat/completions/input_tokens",
        "/chat/completions/input_tokens",
    ] {
        let n = post(s.addr, path, b.clone()).json();
        assert_eq!(n["object"], "response.input_tokens", "{n}");
        assert_eq!(n["input_tokens"], a["usage"]["prompt_tokens"], "{n} / {a}");
    }
    let r = json!({"model": "mens", "input": "Say hi.", "instructions": "Be brief.",
                   "max_output_tokens": 4, "temperature": 0});
    let x = post(s.addr, "/responses", r.clone()).json();
    assert_eq!(x["object"], "response", "{x}");
    for path in ["/v1/responses/input_tokens", "/responses/input_tokens"] {
        let n = post(s.addr, path, r.clone()).json();
        assert_eq!(n["input_tokens"], x["usage"]["input_tokens"], "{n} / {x}");
    }
    let m = call(s.addr, "GET", "/models", &Value::Null).json();
    assert_eq!(m, call(s.addr, "GET", "/v1/models", &Value::Null).json());
    assert_eq!(
        call(s.addr, "GET", "/v1/health", &Value::Null).json()["status"],
        "ok"
    );
}
