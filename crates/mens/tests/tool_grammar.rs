//! The grammar that forces a tool call in Qwen3-Coder's XML format, run by llguidance over the
//! real Qwen2.5-Coder vocabulary: what it lets through and what it stops.

mod common;

use mens::grammar::{GrammarSpec, Grammars};
use mens::tools::{call_grammar, CallFormat};
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
    let one = call_grammar(&tools, None, CallFormat::Xml, 1).unwrap();
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
    let many = call_grammar(&tools, None, CallFormat::Xml, 8).unwrap();
    assert!(accepts(
        &g,
        &many,
        &tok,
        &format!("{}\n{}", good[0], good[1])
    ));
}
