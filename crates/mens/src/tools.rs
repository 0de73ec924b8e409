//! Tool calls in model output, in the two formats a model's chat template asks for:
//! - JSON (Qwen2.5, Qwen3 and the Hermes format many models share): `<tool_call>\n{"name": "f",
//!   "arguments": {…}}\n</tool_call>`; small models often drop the tags and answer with the bare
//!   object, or with it as a `json` code block, which counts as a call when it is the whole answer
//!   and names a defined tool (as llama.cpp's Hermes parser accepted it, fence and all);
//! - XML (Qwen3-Coder): `<tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n…
//!   </function>\n</tool_call>`, a value as raw text where the tool's schema says `string`, else
//!   as JSON (falling back to the text when it does not parse).
//!
//! [`parse`] splits finished text into content and calls, [`CallSplitter`] does the same while
//! text streams in, and [`call_grammar`] is the Lark grammar that forces a call (`tool_choice:
//! required` or a named function).

use crate::error::{Error, Result};
use crate::stream::partial_tail;
use serde_json::{json, Map, Value};

pub const OPEN: &str = "<tool_call>";
/// Most calls a forced answer may make.
pub const MAX_CALLS: usize = 8;
pub const CLOSE: &str = "</tool_call>";

/// How the model writes a call inside `<tool_call>` (see the module's doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CallFormat {
    #[default]
    Json,
    Xml,
}

impl CallFormat {
    /// The format a chat template teaches its model: XML when it writes `<function=` and
    /// `<parameter=` blocks (Qwen3-Coder's template does, for calls in the history and in its
    /// instructions), else JSON.
    pub fn of_template(source: Option<&str>) -> Self {
        match source {
            Some(s) if s.contains("<function=") && s.contains("<parameter=") => CallFormat::Xml,
            _ => CallFormat::Json,
        }
    }
}

/// The tools a request defined, as the parser needs them: each function's name and `parameters`
/// schema, and the format the model writes calls in.
#[derive(Debug, Clone, Default)]
pub struct Toolbox {
    pub format: CallFormat,
    tools: Vec<(String, Value)>,
}

impl Toolbox {
    /// From OpenAI tool definitions (entries without a function name are skipped).
    pub fn new(format: CallFormat, tools: &[Value]) -> Self {
        let tools = tools
            .iter()
            .filter_map(|t| {
                let name = tool_name(t)?.to_string();
                let params = t
                    .get("function")
                    .and_then(|f| f.get("parameters"))
                    .cloned()
                    .unwrap_or(Value::Null);
                Some((name, params))
            })
            .collect();
        Toolbox { format, tools }
    }

    fn has(&self, name: &str) -> bool {
        self.tools.iter().any(|(n, _)| n == name)
    }

    /// Whether parameter `param` of function `func` is declared a string (its value is then
    /// taken as written, never as JSON).
    fn is_string(&self, func: &str, param: &str) -> bool {
        self.tools
            .iter()
            .find(|(n, _)| n == func)
            .and_then(|(_, params)| params.get("properties")?.get(param))
            .is_some_and(string_typed)
    }
}

/// Whether a parameter's schema says `string` (or a string or null): the XML format writes its
/// value as raw text, the parser and the forcing grammar alike.
fn string_typed(schema: &Value) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(ts)) => {
            ts.iter().any(|t| t == "string") && !ts.iter().any(|t| t != "string" && t != "null")
        }
        _ => false,
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// A call's JSON body, or None when it is not `{"name": string, "arguments": …}`.
fn json_call_of(body: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        Some(Value::String(s)) => s.clone(),
        Some(a) => a.to_string(),
        None => "{}".into(),
    };
    Some(ToolCall { name, arguments })
}

/// A call's XML body (`<function=f>` with `<parameter=p>` blocks; only whitespace between them),
/// or None when it is not one. Each value loses the newline the format puts on either side.
fn xml_call_of(body: &str, tools: &Toolbox) -> Option<ToolCall> {
    let rest = body.trim().strip_prefix("<function=")?;
    let (name, rest) = rest.split_once('>')?;
    let name = name.trim();
    if name.is_empty() || name.contains(['<', '\n']) {
        return None;
    }
    let mut rest = rest.strip_suffix("</function>")?;
    let mut args = Map::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let r = rest.strip_prefix("<parameter=")?;
        let (param, r) = r.split_once('>')?;
        let end = r.find("</parameter>")?;
        let raw = &r[..end];
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let param = param.trim();
        if param.is_empty() || param.contains(['<', '\n']) {
            return None;
        }
        let value = if tools.is_string(name, param) {
            Value::String(raw.to_string())
        } else {
            serde_json::from_str(raw.trim()).unwrap_or_else(|_| Value::String(raw.to_string()))
        };
        args.insert(param.to_string(), value);
        rest = &r[end + "</parameter>".len()..];
    }
    Some(ToolCall {
        name: name.to_string(),
        arguments: Value::Object(args).to_string(),
    })
}

/// A `<tool_call>` block's body in the toolbox's format (a JSON body is accepted in either, as
/// models trained on one sometimes write the other).
fn call_of(body: &str, tools: &Toolbox) -> Option<ToolCall> {
    match tools.format {
        CallFormat::Xml => xml_call_of(body, tools).or_else(|| json_call_of(body)),
        CallFormat::Json => json_call_of(body),
    }
}

/// Content (the text outside calls, trimmed) and the calls of a finished answer. A block that
/// does not parse stays in the content.
pub fn parse(text: &str, tools: &Toolbox) -> (String, Vec<ToolCall>) {
    let mut s = CallSplitter::new(tools.clone());
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
    /// The defined tools (a bare `{"name": …}` answer must name one) and the call format.
    tools: Toolbox,
    /// Text was let through: a bare call can no longer start.
    started: bool,
    /// The answer so far could be a bare call: all of it is held.
    bare: bool,
}

/// A Markdown code fence's opening: a bare call may come inside one (Qwen2.5-Coder writes its
/// calls as a `json` code block when it drops the tags).
const FENCE: &str = "```";

/// Whether `text` (the start of an answer) is, or may grow into, `{"name"` (whitespace aside),
/// alone or as the first thing in a `json` code block.
fn may_be_bare(text: &str) -> bool {
    let head: String = text
        .chars()
        .filter(|c| !c.is_whitespace())
        .take(14)
        .collect();
    if "```json".starts_with(&head) {
        return true;
    }
    let body = after_fence(&head).unwrap_or(&head);
    let want = "{\"name\"";
    want.starts_with(body) || body.starts_with(want)
}

/// The answer without the code fence around all of it (`json` or no language), if it has one.
fn unfenced(text: &str) -> &str {
    let t = text.trim();
    after_fence(t)
        .and_then(|r| r.strip_suffix(FENCE))
        .unwrap_or(t)
}

/// `text` after a code fence's opening (`json` or no language), if it starts with one.
fn after_fence(text: &str) -> Option<&str> {
    text.strip_prefix("```json")
        .or_else(|| text.strip_prefix(FENCE))
}

impl CallSplitter {
    pub fn new(tools: Toolbox) -> Self {
        CallSplitter {
            tools,
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
                match call_of(&body, &self.tools) {
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
                let keep = partial_tail(&self.buf, OPEN);
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
            if let Some(c) = json_call_of(unfenced(&rest)).filter(|c| self.tools.has(&c.name)) {
                return vec![Piece::Call(c)];
            }
        }
        if self.open {
            self.open = false;
            // Cut off by max_tokens inside the closing tag: the call itself may be whole.
            let keep = rest.len() - partial_tail(&rest, CLOSE);
            if let Some(c) = call_of(&rest[..keep], &self.tools) {
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

/// A Lark grammar for 1 to `calls` calls (at most [`MAX_CALLS`]) to `tools` (only `only` when
/// given), each in the model's `<tool_call>` format (`format`) with arguments that follow the
/// tool's `parameters` schema.
/// Whether a forced answer may reason (a `<think>…</think>` block) before its calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reasoning {
    /// Calls only.
    None,
    /// The model can think (its template knows `<think>`): an optional block first.
    Optional,
    /// The prompt opened the block: the answer starts inside it and closes it before the calls.
    Open,
}

pub fn call_grammar(
    tools: &[Value],
    only: Option<&str>,
    format: CallFormat,
    calls: usize,
    reasoning: Reasoning,
) -> Result<String> {
    let mut chosen = Vec::new();
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
        chosen.push((name, params));
    }
    if chosen.is_empty() {
        return Err(Error::InvalidArgument(match only {
            Some(o) => format!("tool_choice names the function '{o}', which is not in tools"),
            None => "tool_choice requires a call but tools is empty".into(),
        }));
    }
    // At most MAX_CALLS calls, so a model that keeps calling still ends.
    let more = match calls.clamp(1, MAX_CALLS) - 1 {
        0 => String::new(),
        n => format!(" (\"\\n\" call){{0,{n}}}"),
    };
    // Reasoning: any text up to the first `</think>` (and the blank after it) as one lexeme.
    let think = "THINK_REST: /(?s:.*)<\\/think>[ \\t\\n]*/ & ~/(?s:.*)<\\/think>(?s:.*)<\\/think>(?s:.*)/\n";
    let start = match reasoning {
        Reasoning::None => "start: calls\n".to_string(),
        Reasoning::Optional => format!(
            "start: (\"{}\" THINK_REST)? calls\n{think}",
            crate::think::OPEN
        ),
        Reasoning::Open => format!("start: THINK_REST calls\n{think}"),
    };
    let head = format!("{start}calls: call{more}\ncall: \"{OPEN}\\n\" body \"\\n{CLOSE}\"\n");
    match format {
        CallFormat::Json => Ok(head + &json_body(chosen)),
        CallFormat::Xml => Ok(head + &xml_body(&chosen)?),
    }
}

/// JSON options of a schema the grammar inlines: compact, as the model's template writes JSON.
fn compact(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": ",
                   "coerce_one_of": true}),
        );
    }
    schema
}

fn json_body(chosen: Vec<(&str, Value)>) -> String {
    let mut alts: Vec<Value> = chosen
        .into_iter()
        .map(|(name, params)| {
            json!({
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    let schema = if alts.len() == 1 {
        alts.remove(0)
    } else {
        json!({ "anyOf": alts })
    };
    format!("body: %json {}\n", compact(schema))
}

/// A Lark string literal of `s` (JSON's escapes are Lark's).
fn lit(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// The XML body: one rule per function, its parameters in the schema's order (the required ones
/// always, the others optional). A string parameter's value is raw text up to the first
/// `\n</parameter>\n` (one of its `enum` values when it has them); any other value is JSON that
/// follows its schema.
fn xml_body(chosen: &[(&str, Value)]) -> Result<String> {
    const END: &str = "\n</parameter>\n";
    let mut rules = String::new();
    let mut alts = Vec::new();
    let mut raw_text = false;
    for (i, (name, params)) in chosen.iter().enumerate() {
        if name.contains(['<', '>', '\n']) {
            return Err(Error::InvalidArgument(format!(
                "the function name '{name}' cannot be written in this model's call format"
            )));
        }
        let props = params.get("properties").and_then(Value::as_object);
        let required: Vec<&str> = params
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut seq = vec![lit(&format!("<function={name}>\n"))];
        for (j, (param, schema)) in props.into_iter().flatten().enumerate() {
            if param.contains(['<', '>', '\n']) {
                return Err(Error::InvalidArgument(format!(
                    "the parameter name '{param}' cannot be written in this model's call format"
                )));
            }
            let rule = format!("f{i}_p{j}");
            let open = lit(&format!("<parameter={param}>\n"));
            let is_string = string_typed(schema);
            let value = match schema.get("enum").and_then(Value::as_array) {
                Some(vals)
                    if is_string && vals.iter().all(Value::is_string) && !vals.is_empty() =>
                {
                    let vs: Vec<String> = vals
                        .iter()
                        .map(|v| lit(&format!("{}{END}", v.as_str().unwrap_or(""))))
                        .collect();
                    format!("({})", vs.join(" | "))
                }
                _ if is_string => {
                    raw_text = true;
                    "RAW_VALUE".to_string()
                }
                _ => format!("%json {} {}", compact(schema.clone()), lit(END)),
            };
            rules.push_str(&format!("{rule}: {open} {value}\n"));
            seq.push(if required.contains(&param.as_str()) {
                rule
            } else {
                format!("{rule}?")
            });
        }
        seq.push(lit("</function>"));
        rules.push_str(&format!("f{i}: {}\n", seq.join(" ")));
        alts.push(format!("f{i}"));
    }
    if raw_text {
        // The value and its closing tag as one lexeme that holds the tag only at its end, and
        // no other markup of the format (a parameter's or a call's tags).
        rules.push_str(
            "RAW_VALUE: /(?s:.*)\\n<\\/parameter>\\n/ & ~/(?s:.*)(<\\/?parameter[=>]|<\\/?function[=>]|<\\/?tool_call>)(?s:.*)\\n<\\/parameter>\\n/\n",
        );
    }
    Ok(format!("body: {}\n{rules}", alts.join(" | ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_calls_and_keeps_bad_blocks_as_text() {
        let names = Toolbox::new(CallFormat::Json, &[json!({"function": {"name": "get"}})]);
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
        let other = Toolbox::new(CallFormat::Json, &[json!({"function": {"name": "other"}})]);
        assert!(parse(bare, &other).1.is_empty());
        assert_eq!(parse("{\"names\": 1}", &names).0, "{\"names\": 1}");
        // As a json code block (Qwen2.5-Coder under Claude Code's prompt), streamed alike.
        let fenced =
            "```json\n{\n  \"name\": \"get\",\n  \"arguments\": {\"city\": \"Oslo\"}\n}\n```";
        assert_eq!(parse(fenced, &names).1, parse(bare, &names).1);
        assert_eq!(split_at_every_cut(fenced, &names), 1);
        assert_eq!(parse(&fenced.replace("```json", "```"), &names).1.len(), 1);
        // Not a call: another language's block, text after the block, an undefined name.
        let py = "```python\n{\"name\": \"get\"}\n```";
        assert_eq!(parse(py, &names), (py.to_string(), vec![]));
        let more = format!("{fenced}\nThat reads the weather.");
        assert_eq!(parse(&more, &names), (more.clone(), vec![]));
        assert!(parse(fenced, &other).1.is_empty());
        // Cut off inside the closing tag (max_tokens): the call is whole.
        let cut = "<tool_call>\n{\"name\": \"get\", \"arguments\": {}}\n</tool_ca";
        assert_eq!(parse(cut, &names).1.len(), 1);
    }

    #[test]
    fn streaming_split_equals_whole_parse_at_every_cut() {
        let text = "a<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {\"x\": 1}}\n</tool_call>";
        assert_eq!(split_at_every_cut(text, &Toolbox::default()), 2);
    }

    /// Streamed in two pieces cut anywhere, `text` gives the calls a whole parse gives; their number.
    fn split_at_every_cut(text: &str, tools: &Toolbox) -> usize {
        let whole = parse(text, tools);
        for cut in 1..text.len() {
            let mut s = CallSplitter::new(tools.clone());
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
        whole.1.len()
    }

    #[test]
    fn grammar_names_a_missing_function() {
        let tools = [
            json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}),
        ];
        assert!(call_grammar(
            &tools,
            Some("g"),
            CallFormat::Json,
            MAX_CALLS,
            Reasoning::None
        )
        .unwrap_err()
        .to_string()
        .contains("'g'"));
        let g = call_grammar(&tools, None, CallFormat::Json, MAX_CALLS, Reasoning::None).unwrap();
        assert!(g.contains("%json"), "{g}");
    }

    fn xml_tools() -> Toolbox {
        Toolbox::new(
            CallFormat::Xml,
            &[
                json!({"type": "function", "function": {"name": "edit", "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "line": {"type": "integer"},
                               "text": {"type": "string"}, "opts": {"type": "object"}},
                "required": ["path", "line"]}}}),
            ],
        )
    }

    #[test]
    fn the_format_follows_the_template() {
        let xml = "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{{- '<parameter=' + k + '>' }}";
        assert_eq!(CallFormat::of_template(Some(xml)), CallFormat::Xml);
        let hermes = "<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}";
        assert_eq!(CallFormat::of_template(Some(hermes)), CallFormat::Json);
        assert_eq!(CallFormat::of_template(None), CallFormat::Json);
    }

    #[test]
    fn xml_calls_parse_with_typed_values() {
        let text = "I will edit it.\n<tool_call>\n<function=edit>\n<parameter=path>\nsrc/a.py\n</parameter>\n\
                    <parameter=line>\n12\n</parameter>\n<parameter=text>\n    return 1\n42\n</parameter>\n\
                    <parameter=opts>\n{\"dry\": true}\n</parameter>\n</function>\n</tool_call>";
        let (content, calls) = parse(text, &xml_tools());
        assert_eq!(content, "I will edit it.");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "edit");
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        // A string parameter keeps its text (leading spaces, a line that looks like a number);
        // the others are JSON.
        assert_eq!(
            args,
            json!({"path": "src/a.py", "line": 12, "text": "    return 1\n42", "opts": {"dry": true}})
        );
        // An undeclared parameter is JSON when it parses, else text.
        let (_, calls) = parse(
            "<tool_call>\n<function=edit>\n<parameter=x>\n[1, 2]\n</parameter>\n<parameter=y>\nhi there\n</parameter>\n</function>\n</tool_call>",
            &xml_tools(),
        );
        assert_eq!(
            serde_json::from_str::<Value>(&calls[0].arguments).unwrap(),
            json!({"x": [1, 2], "y": "hi there"})
        );
        // Not a call: stays text.
        for bad in [
            "<tool_call>\n<function=edit>\n<parameter=path>\nx\n</function>\n</tool_call>",
            "<tool_call>\n<function=edit>\ntext between\n</function>\n</tool_call>",
            "<tool_call>\n<function=>\n</function>\n</tool_call>",
        ] {
            let (c, calls) = parse(bad, &xml_tools());
            assert!(calls.is_empty(), "{bad}");
            assert_eq!(c, bad);
        }
        // A JSON body is still a call under the XML format.
        let (_, calls) = parse(
            "<tool_call>\n{\"name\": \"edit\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>",
            &xml_tools(),
        );
        assert_eq!(calls[0].arguments, "{\"path\":\"a\"}");
    }

    #[test]
    fn xml_streaming_split_equals_whole_parse_at_every_cut() {
        let text = "ok<tool_call>\n<function=edit>\n<parameter=path>\na.py\n</parameter>\n<parameter=line>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=edit>\n</function>\n</tool_call>";
        assert_eq!(split_at_every_cut(text, &xml_tools()), 2);
    }

    #[test]
    fn xml_grammar_lists_parameters_in_order() {
        let tools = [
            json!({"type": "function", "function": {"name": "edit", "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "mode": {"type": "string", "enum": ["a", "w"]},
                           "line": {"type": "integer"}},
            "required": ["path", "line"]}}}),
        ];
        let g = call_grammar(&tools, None, CallFormat::Xml, 1, Reasoning::None).unwrap();
        assert!(
            g.contains("f0: \"<function=edit>\\n\" f0_p0 f0_p1? f0_p2 \"</function>\""),
            "{g}"
        );
        assert!(g.contains("RAW_VALUE"), "{g}");
        assert!(g.contains("%json"), "{g}");
        // A string-or-null parameter is raw text in the grammar too, as the parser reads it.
        let nullable = [
            json!({"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"s": {"type": ["string", "null"]}}}}}),
        ];
        let g = call_grammar(&nullable, None, CallFormat::Xml, 1, Reasoning::None).unwrap();
        assert!(g.contains("RAW_VALUE") && !g.contains("%json"), "{g}");
        let bad = [json!({"type": "function", "function": {"name": "a<b"}})];
        assert!(call_grammar(&bad, None, CallFormat::Xml, 1, Reasoning::None).is_err());
    }
}
