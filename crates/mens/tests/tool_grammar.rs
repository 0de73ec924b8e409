//! The grammar that forces a tool call in Qwen3-Coder's XML format, run by llguidance over the
//! real Qwen2.5-Coder vocabulary: what it lets through and what it stops.

mod common;

use mens::grammar::{GrammarSpec, Grammars};
use mens::tools::{call_grammar, CallFormat, Reasoning};
use serde_json::json;
use std::sync::Arc;

/// Whether `text`, tokenized as plain text, is a complete answer under the grammar.
fn accepts(g: &Grammars, grammar: &str, tok: &mens::tokenizer::Tokenizer, text: &str) -> bool {
    let mut c = g.compile(&GrammarSpec::Lark(grammar.to_string())).unwrap();
    for t in tok.encode_text_plain(text, usize::MAX).unwrap() {
        if c.accept(t).is_err() {
            return false;
        }
    }
    // Complete: the end of the text may end the answer (EOS allowed) or it already ended.
    c.is_done() || {
        let mut l = vec![0.0f32; tok.vocab_size()];
        c.mask(&mut l).unwrap();
        l.iter()
            .enumerate()
            .any(|(i, &x)| x.is_finite() && tok.stop_tokens.contains(&(i as u32)))
    }
}

#[test]
fn xml_call_grammar_takes_code_values_and_stops_markup() {
    let l = common::load("qwen2.5-coder-0.5b");
    let tok = Arc::new(l.tokenizer);
    let g = Grammars::new(tok.clone()).unwrap();
    let tools = [
        json!({"type": "function", "function": {"name": "edit", "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "mode": {"type": "string", "enum": ["a", "w"]},
                       "line": {"type": "integer", "minimum": 1}, "text": {"type": "string"}},
        "required": ["path", "line"]}}}),
    ];
    let one = call_grammar(&tools, None, CallFormat::Xml, 1, Reasoning::None).unwrap();
    let call =
        |body: &str| format!("<tool_call>\n<function=edit>\n{body}</function>\n</tool_call>");
    let p = |k: &str, v: &str| format!("<parameter={k}>\n{v}\n</parameter>\n");
    // Code with `<`, `>` and several lines is a string value; optional parameters may be left out.
    let good = [
        call(&(p("path", "src/a.py") + &p("line", "3"))),
        call(
            &(p("path", "a.py")
                + &p("mode", "w")
                + &p("line", "12")
                + &p("text", "if a < b:\n    return [x for x in y if x > 0]")),
        ),
    ];
    for t in &good {
        assert!(accepts(&g, &one, &tok, t), "{t}");
    }
    let bad = [
        // A required parameter missing, the order changed, a value outside its enum or schema.
        call(&p("path", "a.py")),
        call(&(p("line", "3") + &p("path", "a.py"))),
        call(&(p("path", "a.py") + &p("mode", "x") + &p("line", "3"))),
        call(&(p("path", "a.py") + &p("line", "0"))),
        call(&(p("path", "a.py") + &p("line", "\"3\""))),
        // A string value that swallows the next parameter's tag.
        call(&(p("path", "a.py\n<parameter=line>\n3") + &p("line", "3"))),
        // Another function, or a second call when one is asked for.
        "<tool_call>\n<function=other>\n</function>\n</tool_call>".to_string(),
        format!("{}\n{}", good[0], good[0]),
    ];
    for t in &bad {
        assert!(!accepts(&g, &one, &tok, t), "{t}");
    }
    let many = call_grammar(&tools, None, CallFormat::Xml, 8, Reasoning::None).unwrap();
    assert!(accepts(
        &g,
        &many,
        &tok,
        &format!("{}\n{}", good[0], good[1])
    ));
}

/// A forced call after the model's reasoning: an optional `<think>` block when the model can think,
/// the rest of an opened block when its template opened one, none otherwise; one block, closed once.
#[test]
fn forced_calls_may_follow_a_reasoning_block() {
    let l = common::load("qwen2.5-coder-0.5b");
    let tok = Arc::new(l.tokenizer);
    let g = Grammars::new(tok.clone()).unwrap();
    let tools = [
        json!({"type": "function", "function": {"name": "get", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}),
    ];
    let call =
        "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    let thought = "The user wants the weather; <b>get</b> needs a city.\nOslo it is.";
    let block = format!("<think>\n{thought}\n</think>\n\n{call}");
    let rest = format!("{thought}\n</think>\n\n{call}");
    let grammar = |r: Reasoning| call_grammar(&tools, None, CallFormat::Json, 1, r).unwrap();
    let (none, optional, open) = (
        grammar(Reasoning::None),
        grammar(Reasoning::Optional),
        grammar(Reasoning::Open),
    );
    let cases = [
        // (answer, accepted with None, with Optional, with Open)
        (call.to_string(), true, true, false),
        // (Inside an opened block, `<think>` is text of the reasoning.)
        (block.clone(), false, true, true),
        (rest.clone(), false, false, true),
        // No call after the block; a second closing tag; text before the block (reasoning, when
        // the block is open).
        (
            format!("<think>\n{thought}\n</think>\n\n"),
            false,
            false,
            false,
        ),
        (
            format!("<think>\nA</think>\nB</think>\n\n{call}"),
            false,
            false,
            false,
        ),
        (format!("Sure.\n{block}"), false, false, true),
        (format!("A</think>\nB</think>\n{call}"), false, false, false),
    ];
    for (text, n, o, p) in &cases {
        assert_eq!(accepts(&g, &none, &tok, text), *n, "None: {text}");
        assert_eq!(accepts(&g, &optional, &tok, text), *o, "Optional: {text}");
        assert_eq!(accepts(&g, &open, &tok, text), *p, "Open: {text}");
    }
}
