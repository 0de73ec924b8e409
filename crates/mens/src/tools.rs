//! Tool calls in model output. Qwen2.5 (and the Hermes format many models share) writes a call as
//! `<tool_call>\n{"name": "f", "arguments": {…}}\n</tool_call>`; small models often drop the tags
//! and answer with the bare object, which counts as a call when it is the whole answer and names a
//! defined tool (as llama.cpp's Hermes parser accepts it). [`parse`] splits finished text
//! into content and calls, [`CallSplitter`] does the same while text streams in, and
//! [`call_grammar`] is the Lark grammar that forces a call (`tool_choice: required` or a named
//! function).

use crate::error::{Error, Result};
use serde_json::{json, Value};

pub const OPEN: &str = "<tool_call>";
/// Most calls a forced answer may make.
pub const MAX_CALLS: usize = 8;
pub const CLOSE: &str = "</tool_call>";

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// A call's JSON body, or None when it is not `{"name": string, "arguments": …}`.
fn call_of(body: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        Some(Value::String(s)) => s.clone(),
        Some(a) => a.to_string(),
        None => "{}".into(),
    };
    Some(ToolCall { name, arguments })
}

/// Content (the text outside calls, trimmed) and the calls of a finished answer. A block that
/// does not parse stays in the content.
pub fn parse(text: &str, names: &[String]) -> (String, Vec<ToolCall>) {
    let mut s = CallSplitter::new(names.to_vec());
    let mut pieces = s.push(text);
    pieces.extend(s.finish());
    let mut content = String::new();
    let mut calls = Vec::new();
    for p in pieces {
        match p {
            Piece::Text(t) => content.push_str(&t),
            Piece::Call(c) => calls.push(c),
        }
    }
    let content = if calls.is_empty() {
        content
    } else {
        content.trim().to_string()
    };
    (content, calls)
}

#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Call(ToolCall),
}

/// Splits streamed text into content and whole calls: text that may begin a `<tool_call>` is held
/// back until it is known.
#[derive(Default)]
pub struct CallSplitter {
    buf: String,
    /// Inside a `<tool_call>` block.
    open: bool,
    /// The defined tools' names (a bare `{"name": …}` answer must name one).
    names: Vec<String>,
    /// Text was let through: a bare call can no longer start.
    started: bool,
    /// The answer so far could be a bare call: all of it is held.
    bare: bool,
}

/// Whether `text` (the start of an answer) is, or may grow into, `{"name"` (whitespace aside).
fn may_be_bare(text: &str) -> bool {
    let head: String = text
        .chars()
        .filter(|c| !c.is_whitespace())
        .take(7)
        .collect();
    let want = "{\"name\"";
    want.starts_with(&head) || head.starts_with(want)
}

impl CallSplitter {
    pub fn new(names: Vec<String>) -> Self {
        CallSplitter {
            names,
            ..Default::default()
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        if !self.started && !self.open {
            self.bare = may_be_bare(&self.buf);
            if self.bare {
                return out;
            }
        }
        loop {
            if self.open {
                let Some(end) = self.buf.find(CLOSE) else {
                    break;
                };
                let body = self.buf[..end].to_string();
                self.buf.drain(..end + CLOSE.len());
                self.open = false;
                self.started = true;
                match call_of(&body) {
                    Some(c) => out.push(Piece::Call(c)),
                    None => out.push(Piece::Text(format!("{OPEN}{body}{CLOSE}"))),
                }
            } else if let Some(start) = self.buf.find(OPEN) {
                let before = self.buf[..start].to_string();
                if !before.is_empty() {
                    self.started = true;
                    out.push(Piece::Text(before));
                }
                self.buf.drain(..start + OPEN.len());
                self.open = true;
            } else {
                // Keep a tail that could be the start of `<tool_call>`.
                let keep = (1..OPEN.len())
                    .rev()
                    .find(|&k| self.buf.ends_with(&OPEN[..k]))
                    .unwrap_or(0);
                let cut = self.buf.len() - keep;
                if cut > 0 {
                    self.started = true;
                    out.push(Piece::Text(self.buf[..cut].to_string()));
                    self.buf.drain(..cut);
                }
                break;
            }
        }
        out
    }

    /// The end of the text: what was held back (an unclosed call is text; a call the grammar
    /// forced may end without its last newline).
    pub fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.buf);
        if self.bare {
            self.bare = false;
            if let Some(c) = call_of(&rest).filter(|c| self.names.contains(&c.name)) {
                return vec![Piece::Call(c)];
            }
        }
        if self.open {
            self.open = false;
            // Cut off by max_tokens inside the closing tag: the call itself may be whole.
            let keep = (1..CLOSE.len())
                .rev()
                .find(|&k| rest.ends_with(&CLOSE[..k]))
                .map_or(rest.len(), |k| rest.len() - k);
            if let Some(c) = call_of(&rest[..keep]) {
                return vec![Piece::Call(c)];
            }
            return vec![Piece::Text(format!("{OPEN}{rest}"))];
        }
        if rest.is_empty() {
            vec![]
        } else {
            vec![Piece::Text(rest)]
        }
    }
}

/// The function name of an OpenAI tool definition (`{"type": "function", "function": {"name"…}}`).
pub fn tool_name(tool: &Value) -> Option<&str> {
    tool.get("function")?.get("name")?.as_str()
}

/// A Lark grammar for one or more calls to `tools` (only `only` when given), each in the model's
/// `<tool_call>` format with arguments that follow the tool's `parameters` schema.
pub fn call_grammar(tools: &[Value], only: Option<&str>) -> Result<String> {
    let mut alts = Vec::new();
    for t in tools {
        let Some(name) = tool_name(t) else {
            return Err(Error::InvalidArgument(
                "each tool must be {\"type\": \"function\", \"function\": {\"name\": …}}".into(),
            ));
        };
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let params = t
            .get("function")
            .and_then(|f| f.get("parameters"))
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"}));
        alts.push(json!({
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": params},
            "required": ["name", "arguments"],
            "additionalProperties": false,
        }));
    }
    if alts.is_empty() {
        return Err(Error::InvalidArgument(match only {
            Some(o) => format!("tool_choice names the function '{o}', which is not in tools"),
            None => "tool_choice requires a call but tools is empty".into(),
        }));
    }
    let schema = if alts.len() == 1 {
        alts.remove(0)
    } else {
        json!({ "anyOf": alts })
    };
    let mut schema = schema;
    schema["x-guidance"] = json!({
        "whitespace_flexible": false, "item_separator": ", ", "key_separator": ": ",
        "coerce_one_of": true,
    });
    // At most MAX_CALLS calls, so a model that keeps calling still ends.
    Ok(format!(
        "start: call (\"\\n\" call){{0,{}}}\ncall: \"{OPEN}\\n\" body \"\\n{CLOSE}\"\nbody: %json {schema}\n",
        MAX_CALLS - 1
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_calls_and_keeps_bad_blocks_as_text() {
        let names = ["get".to_string()];
        let (c, calls) = parse(
            "Let me look.\n<tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
            &names,
        );
        assert_eq!(c, "Let me look.");
        assert_eq!(
            calls,
            vec![ToolCall {
                name: "get".into(),
                arguments: "{\"city\":\"Oslo\"}".into()
            }]
        );
        let (c, calls) = parse("x <tool_call>not json</tool_call> y", &names);
        assert!(calls.is_empty());
        assert_eq!(c, "x <tool_call>not json</tool_call> y");
        assert_eq!(parse("plain <tool text", &names).0, "plain <tool text");
        // A bare object is a call when it is the whole answer and names a defined tool.
        let bare = " {\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}";
        assert_eq!(parse(bare, &names).1.len(), 1);
        assert!(parse(bare, &["other".to_string()]).1.is_empty());
        assert_eq!(parse("{\"names\": 1}", &names).0, "{\"names\": 1}");
        // Cut off inside the closing tag (max_tokens): the call is whole.
        let cut = "<tool_call>\n{\"name\": \"get\", \"arguments\": {}}\n</tool_ca";
        assert_eq!(parse(cut, &names).1.len(), 1);
    }

    #[test]
    fn streaming_split_equals_whole_parse_at_every_cut() {
        let text = "a<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {\"x\": 1}}\n</tool_call>";
        let whole = parse(text, &[]);
        for cut in 1..text.len() {
            let mut s = CallSplitter::default();
            let mut p = s.push(&text[..cut]);
            p.extend(s.push(&text[cut..]));
            p.extend(s.finish());
            let calls: Vec<_> = p
                .iter()
                .filter_map(|x| match x {
                    Piece::Call(c) => Some(c.clone()),
                    _ => None,
                })
                .collect();
            assert_eq!(calls, whole.1, "cut at {cut}");
        }
        assert_eq!(whole.1.len(), 2);
    }

    #[test]
    fn grammar_names_a_missing_function() {
        let tools = [
            json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}),
        ];
        assert!(call_grammar(&tools, Some("g"))
            .unwrap_err()
            .to_string()
            .contains("'g'"));
        let g = call_grammar(&tools, None).unwrap();
        assert!(g.contains("%json"), "{g}");
    }
}
