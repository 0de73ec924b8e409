//! Chat prompts: the model's own Jinja template (`tokenizer.chat_template`) rendered with minijinja,
//! under limits (fuel bounds the work, the output is cut off at a size cap while it is written);
//! ChatML when the file has no template. A template that fails is an error, never a silent fallback.
//!
//! [`ChatTemplate::tokens`] is the one way a conversation becomes token ids: message text is
//! [escaped](crate::tokenizer::Tokenizer::escape) before rendering, so only the template's own
//! markup yields control tokens (a user cannot close their turn and forge a system turn).

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
    /// An assistant turn's tool calls, in OpenAI's shape (`{"id", "type": "function",
    /// "function": {"name", "arguments"}}`, the arguments a JSON value).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<serde_json::Value>,
    /// A tool result's call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A tool result's function name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant turn's reasoning (its `<think>` block, given back by the client as
    /// `reasoning_content`): templates that know it (Qwen3's) write it or drop it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            reasoning_content: None,
        }
    }
}

/// Every string in `v` passed through `f` (request text inside tool definitions and calls).
fn map_strings(v: &serde_json::Value, f: &impl Fn(&str) -> String) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::String(s) => Value::String(f(s)),
        Value::Array(a) => Value::Array(a.iter().map(|x| map_strings(x, f)).collect()),
        Value::Object(o) => {
            Value::Object(o.iter().map(|(k, x)| (f(k), map_strings(x, f))).collect())
        }
        x => x.clone(),
    }
}

/// JSON as Python's `json.dumps` writes it (`{"a": 1, "b": [2, 3]}`, non-ASCII kept): the `tojson`
/// of the Jinja used by transformers and llama.cpp, which chat templates are written for.
pub fn py_json(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_json(x, out);
            }
            out.push(']');
        }
        Value::Object(o) => {
            out.push('{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&serde_json::to_string(k).unwrap_or_default());
                out.push_str(": ");
                py_json(x, out);
            }
            out.push('}');
        }
        x => out.push_str(&x.to_string()),
    }
}

/// Instructions a template may execute (minijinja fuel); real templates use a few thousand.
const FUEL: u64 = 2_000_000;
/// Largest rendered prompt, in bytes.
const MAX_OUTPUT: usize = 16 << 20;

pub struct ChatTemplate {
    source: Option<String>,
    pub bos_token: String,
    pub eos_token: String,
    isolation: Option<Isolation>,
    /// The helper process, started at the first render and kept for the next ones.
    helper: std::sync::Mutex<Option<Helper>>,
}

/// Render in a helper process instead of in this one: minijinja bounds a template's work (fuel)
/// but not its memory (a string doubled 30 times is 1 GB in a few instructions), and a failed
/// allocation aborts a Rust process. The helper is `program args…`, which must call
/// [`render_isolated_main`]; it limits its own address space to `memory_limit` bytes, so a
/// hostile template kills the helper (a new one starts for the next render), and the caller gets
/// an error. One helper serves every render of a template, one at a time.
#[derive(Debug, Clone)]
pub struct Isolation {
    pub program: std::path::PathBuf,
    pub args: Vec<String>,
    pub memory_limit: u64,
    pub timeout: std::time::Duration,
}

/// What the helper reads on stdin.
#[derive(Serialize, Deserialize)]
struct RenderJob {
    source: String,
    bos_token: String,
    eos_token: String,
    messages: Vec<Message>,
    #[serde(default)]
    tools: Vec<serde_json::Value>,
    #[serde(default)]
    vars: Vars,
    add_generation_prompt: bool,
}

/// One frame: 8 bytes of little-endian length, then that many bytes of JSON.
fn write_frame(w: &mut impl std::io::Write, v: &impl Serialize) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    w.write_all(&(bytes.len() as u64).to_le_bytes())?;
    w.write_all(&bytes)?;
    w.flush()
}

/// The next frame, at most `max` bytes; None at the end of the stream.
fn read_frame(r: &mut impl std::io::Read, max: u64) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 8];
    match r.read_exact(&mut len) {
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        r => r?,
    }
    let n = u64::from_le_bytes(len);
    if n > max {
        return Err(std::io::Error::other(format!("a frame of {n} bytes")));
    }
    let mut buf = vec![0u8; n as usize];
    r.read_exact(&mut buf)?;
    Ok(Some(buf))
}

/// Largest job the helper reads (a request's messages, bounded by the server's body limit).
const MAX_JOB: u64 = 1 << 30;
/// Largest reply read back: the output cap, JSON-escaped.
const MAX_REPLY: u64 = 8 * MAX_OUTPUT as u64;

/// The helper process's main: limit the address space, then render jobs read from stdin (one
/// [`RenderJob`] per frame) until stdin closes, answering `{"ok": text}` or `{"err": message}`.
pub fn render_isolated_main(memory_limit: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let lim = libc::rlimit {
            rlim_cur: memory_limit as libc::rlim_t,
            rlim_max: memory_limit as libc::rlim_t,
        };
        // SAFETY: setrlimit with a valid pointer to an initialised struct.
        if unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    let (mut input, mut out) = (std::io::stdin().lock(), std::io::stdout().lock());
    while let Some(frame) = read_frame(&mut input, MAX_JOB)? {
        let job: RenderJob = serde_json::from_slice(&frame).map_err(std::io::Error::other)?;
        drop(frame);
        let t = ChatTemplate::new(Some(job.source.clone()), job.bos_token, job.eos_token);
        let reply = match t.render_jinja(
            &job.source,
            &job.messages,
            &job.tools,
            &job.vars,
            job.add_generation_prompt,
        ) {
            Ok(text) => serde_json::json!({ "ok": text }),
            Err(e) => serde_json::json!({ "err": e.to_string() }),
        };
        write_frame(&mut out, &reply)?;
    }
    Ok(())
}

/// A running helper: its stdin, and its replies as a thread reads them.
struct Helper {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    replies: std::sync::mpsc::Receiver<std::io::Result<Option<Vec<u8>>>>,
}

impl Helper {
    fn start(iso: &Isolation) -> Result<Helper> {
        use std::process::{Command, Stdio};
        let mut child = Command::new(&iso.program)
            .args(&iso.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                Error::Template(format!(
                    "cannot start the template helper {}: {e}",
                    iso.program.display()
                ))
            })?;
        let stdin = child.stdin.take().expect("piped");
        let mut stdout = child.stdout.take().expect("piped");
        let (tx, replies) = std::sync::mpsc::channel();
        std::thread::spawn(move || loop {
            let r = read_frame(&mut stdout, MAX_REPLY);
            let end = !matches!(r, Ok(Some(_)));
            if tx.send(r).is_err() || end {
                return;
            }
        });
        Ok(Helper {
            child,
            stdin,
            replies,
        })
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Largest chat template file read (`--chat-template-file`); real templates are under 20 KB.
pub const MAX_TEMPLATE_FILE: u64 = 1 << 20;

/// A chat template file's text, refused when larger than [`MAX_TEMPLATE_FILE`] or not UTF-8.
pub fn read_template_file(path: &std::path::Path) -> Result<String> {
    let what = |e: std::io::Error| {
        Error::InvalidArgument(format!("chat template file {}: {e}", path.display()))
    };
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_TEMPLATE_FILE + 1).read_to_end(&mut bytes))
        .map_err(what)?;
    if bytes.len() as u64 > MAX_TEMPLATE_FILE {
        return Err(Error::InvalidArgument(format!(
            "chat template file {} is more than {MAX_TEMPLATE_FILE} bytes",
            path.display()
        )));
    }
    String::from_utf8(bytes).map_err(|_| {
        Error::InvalidArgument(format!(
            "chat template file {} is not UTF-8",
            path.display()
        ))
    })
}

/// Extra template variables (llama-server's `chat_template_kwargs`).
pub type Vars = serde_json::Map<String, serde_json::Value>;

/// Most extra template variables a request may give, and the longest string among them.
pub const MAX_VARS: usize = 16;
pub const MAX_VAR_LEN: usize = 1024;

/// Extra template variables must be few, named like identifiers, and plain values (a boolean, a
/// number or a short string): a switch such as `enable_thinking`, never a structure that makes a
/// template do unbounded work. They cannot replace `messages`, `tools` or the tokens (the
/// template's own variables come first).
pub fn check_vars(vars: &Vars) -> Result<()> {
    if vars.len() > MAX_VARS {
        return Err(Error::InvalidArgument(format!(
            "chat_template_kwargs takes at most {MAX_VARS} variables"
        )));
    }
    for (k, v) in vars {
        let name_ok = !k.is_empty()
            && k.len() <= 64
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !k.starts_with(|c: char| c.is_ascii_digit());
        if !name_ok {
            return Err(Error::InvalidArgument(format!(
                "chat_template_kwargs: {:?} is not a variable name",
                k.chars().take(64).collect::<String>()
            )));
        }
        let value_ok = match v {
            serde_json::Value::Bool(_) | serde_json::Value::Number(_) | serde_json::Value::Null => {
                true
            }
            serde_json::Value::String(s) => s.len() <= MAX_VAR_LEN,
            _ => false,
        };
        if !value_ok {
            return Err(Error::InvalidArgument(format!(
                "chat_template_kwargs: {k} must be a boolean, a number or a string of at most {MAX_VAR_LEN} bytes"
            )));
        }
    }
    Ok(())
}

impl ChatTemplate {
    pub fn new(source: Option<String>, bos_token: String, eos_token: String) -> Self {
        ChatTemplate {
            source,
            bos_token,
            eos_token,
            isolation: None,
            helper: std::sync::Mutex::new(None),
        }
    }

    /// This template's BOS and EOS texts with another source (`--chat-template-file`).
    pub fn with_source(self, source: String) -> Self {
        ChatTemplate::new(Some(source), self.bos_token, self.eos_token)
    }

    /// Render a one-message conversation (in the helper process when isolated): a template
    /// that cannot is refused at load, not at the first request.
    pub fn check(&self) -> Result<()> {
        self.render(&[Message::new("user", "hi")], true)
            .map(|_| ())
            .map_err(|e| Error::Template(format!("the chat template does not render: {e}")))
    }

    /// The template's Jinja source (none: the ChatML fallback).
    pub fn source(&self) -> Option<&str> {
        self.source.as_deref()
    }

    /// How the model writes tool calls, as its template teaches it (see [`crate::tools`]).
    pub fn call_format(&self) -> crate::tools::CallFormat {
        crate::tools::CallFormat::of_template(self.source.as_deref())
    }

    /// Render in a helper process from now on (see [`Isolation`]).
    pub fn isolate(&mut self, isolation: Isolation) {
        self.isolation = Some(isolation);
    }

    /// The template of a model file, with its BOS and EOS token texts (one way, for every caller).
    pub fn from_gguf(g: &crate::gguf::Gguf, tok: &Tokenizer) -> Result<Self> {
        let source = g.get_str("tokenizer.chat_template")?.map(str::to_string);
        let text = |id: Option<u32>| {
            id.map(|i| String::from_utf8_lossy(tok.token_bytes(i)).into_owned())
                .unwrap_or_default()
        };
        Ok(ChatTemplate::new(
            source,
            text(tok.bos),
            text(Some(tok.eos)),
        ))
    }

    /// Render with the model's template (ChatML when the file has none). The text is what the
    /// template wrote; see [`Self::tokens`] for the ids.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, &[], add_generation_prompt)
    }

    /// Render with tool definitions (OpenAI's `tools`, handed to the template as `tools`).
    pub fn render_with(
        &self,
        messages: &[Message],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_full(messages, tools, &Vars::new(), add_generation_prompt)
    }

    /// Render with tool definitions and extra template variables (`vars`, a request's
    /// `chat_template_kwargs` such as `enable_thinking`: see [`check_vars`]).
    pub fn render_full(
        &self,
        messages: &[Message],
        tools: &[serde_json::Value],
        vars: &Vars,
        add_generation_prompt: bool,
    ) -> Result<String> {
        match (&self.source, &self.isolation) {
            (Some(src), Some(iso)) => {
                self.render_in(iso, src, messages, tools, vars, add_generation_prompt)
            }
            (Some(src), None) => {
                self.render_jinja(src, messages, tools, vars, add_generation_prompt)
            }
            (None, _) if tools.is_empty() => Ok(chatml(messages, add_generation_prompt)),
            (None, _) => Err(Error::Template(
                "this model has no chat template, so it cannot be given tools".into(),
            )),
        }
    }

    fn render_in(
        &self,
        iso: &Isolation,
        src: &str,
        messages: &[Message],
        tools: &[serde_json::Value],
        vars: &Vars,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let job = RenderJob {
            source: src.to_string(),
            bos_token: self.bos_token.clone(),
            eos_token: self.eos_token.clone(),
            messages: messages.to_vec(),
            tools: tools.to_vec(),
            vars: vars.clone(),
            add_generation_prompt,
        };
        let mut slot = self.helper.lock().unwrap_or_else(|e| e.into_inner());
        let helper = match slot.as_mut() {
            Some(h) => h,
            None => slot.insert(Helper::start(iso)?),
        };
        let failed = |m: String| Error::Template(format!("the template helper failed: {m}"));
        let sent = write_frame(&mut helper.stdin, &job);
        let reply = match (sent, helper.replies.recv_timeout(iso.timeout)) {
            (Ok(()), Ok(Ok(Some(bytes)))) => bytes,
            (_, Err(std::sync::mpsc::RecvTimeoutError::Timeout)) => {
                *slot = None;
                return Err(Error::Template(format!(
                    "rendering took longer than {:?}",
                    iso.timeout
                )));
            }
            _ => {
                // The helper died (its memory limit, most likely): the next render starts another.
                *slot = None;
                return Err(Error::Template(format!(
                    "rendering needed more than {} MiB of memory, or failed",
                    iso.memory_limit >> 20
                )));
            }
        };
        let v: serde_json::Value =
            serde_json::from_slice(&reply).map_err(|e| failed(format!("bad reply: {e}")))?;
        match (
            v.get("ok").and_then(|x| x.as_str()),
            v.get("err").and_then(|x| x.as_str()),
        ) {
            (Some(text), _) => Ok(text.to_string()),
            (_, Some(e)) => Err(Error::Template(e.to_string())),
            _ => Err(failed("bad reply".into())),
        }
    }

    /// The token ids of a conversation, at most `limit` of them: message text is tokenized as
    /// text (control tokens written in it stay text), the template's markup as markup.
    pub fn tokens(
        &self,
        tok: &Tokenizer,
        messages: &[Message],
        add_generation_prompt: bool,
        limit: usize,
    ) -> Result<Vec<u32>> {
        self.tokens_with(tok, messages, &[], add_generation_prompt, limit)
    }

    /// [`Self::tokens`] with tool definitions; every string in them and in tool calls is text too.
    pub fn tokens_with(
        &self,
        tok: &Tokenizer,
        messages: &[Message],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
        limit: usize,
    ) -> Result<Vec<u32>> {
        self.tokens_full(
            tok,
            messages,
            tools,
            &Vars::new(),
            add_generation_prompt,
            limit,
        )
    }

    /// [`Self::tokens_with`] with extra template variables; their strings are text too.
    pub fn tokens_full(
        &self,
        tok: &Tokenizer,
        messages: &[Message],
        tools: &[serde_json::Value],
        vars: &Vars,
        add_generation_prompt: bool,
        limit: usize,
    ) -> Result<Vec<u32>> {
        check_vars(vars)?;
        let esc = |s: &str| tok.escape(s).into_owned();
        let escaped: Vec<Message> = messages
            .iter()
            .map(|m| Message {
                role: m.role.clone(),
                content: esc(&m.content),
                tool_calls: m.tool_calls.iter().map(|c| map_strings(c, &esc)).collect(),
                tool_call_id: m.tool_call_id.as_deref().map(esc),
                name: m.name.as_deref().map(esc),
                reasoning_content: m.reasoning_content.as_deref().map(esc),
            })
            .collect();
        let tools: Vec<serde_json::Value> = tools.iter().map(|t| map_strings(t, &esc)).collect();
        let vars: Vars = vars
            .iter()
            .map(|(k, v)| (k.clone(), map_strings(v, &esc)))
            .collect();
        let text = self.render_full(&escaped, &tools, &vars, add_generation_prompt)?;
        tok.encode_rendered(&text, limit)
    }

    pub fn render_jinja(
        &self,
        src: &str,
        messages: &[Message],
        tools: &[serde_json::Value],
        vars: &Vars,
        add_generation_prompt: bool,
    ) -> Result<String> {
        for m in messages {
            if !matches!(m.role.as_str(), "system" | "user" | "assistant" | "tool") {
                return Err(Error::InvalidArgument(format!(
                    "unknown message role {:?}",
                    m.role
                )));
            }
        }
        let mut env = minijinja::Environment::new();
        env.set_fuel(Some(FUEL));
        env.set_recursion_limit(64);
        // Python's string and dict methods (`startswith`, `split`, `strip`, `items`…), which
        // templates written for Jinja2 call (Qwen3's does), as llama.cpp's template engine has them.
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_filter(
            "tojson",
            |v: minijinja::Value,
             kw: minijinja::value::Kwargs|
             -> std::result::Result<String, minijinja::Error> {
                let bad =
                    |e: String| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e);
                let j = serde_json::to_value(&v).map_err(|e| bad(e.to_string()))?;
                let indent: Option<usize> = kw.get("indent").ok().flatten();
                if let Some(n) = indent {
                    // json.dumps(indent=n): one item per line.
                    let ind = vec![b' '; n.min(16)];
                    let mut buf = Vec::new();
                    let f = serde_json::ser::PrettyFormatter::with_indent(&ind);
                    let mut ser = serde_json::Serializer::with_formatter(&mut buf, f);
                    serde::Serialize::serialize(&j, &mut ser).map_err(|e| bad(e.to_string()))?;
                    return String::from_utf8(buf).map_err(|e| bad(e.to_string()));
                }
                let mut out = String::new();
                py_json(&j, &mut out);
                Ok(out)
            },
        );
        env.add_template("chat", src)
            .map_err(|e| Error::Template(e.to_string()))?;
        let t = env
            .get_template("chat")
            .map_err(|e| Error::Template(e.to_string()))?;
        let mut out = Capped(Vec::new());
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        // No tools: `tools` is undefined, not none (as llama.cpp's engine leaves it): templates
        // test `tools is defined` (Qwen3-Coder's sets [] then, and `none is iterable` holds in
        // minijinja, so its `tools | length` failed on none).
        let ctx = if tools.is_empty() {
            ctx
        } else {
            minijinja::context! { tools => tools, ..ctx }
        };
        // A request's variables never replace the ones above (merge_maps: the last map wins).
        let ctx = if vars.is_empty() {
            ctx
        } else {
            minijinja::value::merge_maps([minijinja::Value::from_serialize(vars), ctx])
        };
        t.render_captured_to(ctx, &mut out).map_err(|e| {
            if out.0.len() >= MAX_OUTPUT {
                Error::Template(format!("the rendered prompt is over {MAX_OUTPUT} bytes"))
            } else {
                Error::Template(e.to_string())
            }
        })?;
        String::from_utf8(out.0).map_err(|_| Error::Template("the output is not UTF-8".into()))
    }
}

/// A writer that refuses to grow past [`MAX_OUTPUT`] bytes, so a runaway template stops there.
struct Capped(Vec<u8>);

impl std::io::Write for Capped {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + b.len() > MAX_OUTPUT {
            self.0.resize(MAX_OUTPUT, 0);
            return Err(std::io::Error::other("output limit"));
        }
        self.0.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub fn chatml(messages: &[Message], add_generation_prompt: bool) -> String {
    let mut s = String::new();
    for m in messages {
        s.push_str(&format!(
            "<|im_start|>{}\n{}<|im_end|>\n",
            m.role, m.content
        ));
    }
    if add_generation_prompt {
        s.push_str("<|im_start|>assistant\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runaway_template_is_an_error() {
        let t = ChatTemplate::new(
            Some(
                "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
                    .into(),
            ),
            String::new(),
            String::new(),
        );
        let msgs = [Message::new("user", "hi")];
        let e = t.render(&msgs, true).unwrap_err().to_string();
        assert!(e.contains("fuel") || e.contains("over"), "{e}");
        let big = ChatTemplate::new(
            Some("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}".into()),
            String::new(),
            String::new(),
        );
        let e = big.render(&msgs, true).unwrap_err().to_string();
        assert!(e.contains("over 16777216 bytes"), "{e}");
        let none = ChatTemplate::new(None, String::new(), String::new());
        assert_eq!(
            none.render(&msgs, true).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    /// Templates written for Jinja2 call Python's string methods (Qwen3's: `startswith`,
    /// `endswith`, `split`, `strip`, `lstrip`, `rstrip`, as it separates `<think>` from the answer).
    #[test]
    fn python_string_methods_work_in_templates() {
        let t = ChatTemplate::new(
            Some(
                "{%- for m in messages %}{%- if m.content.startswith('<think>') and '</think>' in m.content %}\
                 [{{ m.content.split('</think>')[-1].lstrip('\\n') }}|{{ m.content.split('</think>')[0].split('<think>')[-1].strip('\\n') }}]\
                 {%- elif m.content.endswith('!') %}{{ m.content.rstrip('!') | upper }}{%- endif %}{%- endfor %}"
                    .into(),
            ),
            String::new(),
            String::new(),
        );
        let msgs = [
            Message::new("assistant", "<think>\nplan\n</think>\n\nanswer"),
            Message::new("user", "hi!!"),
        ];
        assert_eq!(t.render(&msgs, false).unwrap(), "[answer|plan]HI");
    }

    /// Without tools `tools` is undefined: Qwen3-Coder's template sets `[]` when it is not
    /// defined and then takes its length (on none, minijinja's `is iterable` holds and `length`
    /// fails); with tools their mapping methods (`items()`, `|items`) and loop neighbours work.
    #[test]
    fn tools_are_undefined_when_absent() {
        let src = "{%- if not tools is defined %}{%- set tools = [] %}{%- endif %}\
                   {%- if tools is iterable and tools | length > 0 %}\
                   {%- for t in tools %}{%- for k, v in t.function.parameters.properties | items %}\
                   {{ k }}{% for a, b in v.items() %}[{{ a }}={{ b }}]{% endfor %};{%- endfor %}{%- endfor %}\
                   {%- endif %}{%- for m in messages %}{% if loop.previtem %}<{{ loop.previtem.role }}{% endif %}\
                   {{ m.content }}{%- endfor %}";
        let t = ChatTemplate::new(Some(src.into()), String::new(), String::new());
        let msgs = [Message::new("user", "a"), Message::new("assistant", "b")];
        assert_eq!(t.render(&msgs, false).unwrap(), "a<userb");
        let tools = [
            serde_json::json!({"type": "function", "function": {"name": "f",
            "parameters": {"properties": {"x": {"type": "integer"}}}}}),
        ];
        assert_eq!(
            t.render_with(&msgs, &tools, false).unwrap(),
            "x[type=integer];a<userb"
        );
    }

    /// A request's template variables (Qwen3's `enable_thinking`) and an assistant turn's
    /// `reasoning_content` reach the template; they cannot replace the template's own variables.
    #[test]
    fn template_variables_and_reasoning_reach_the_template() {
        let src = "{%- for m in messages %}{{ m.role }}:{% if m.reasoning_content is string %}\
                   [{{ m.reasoning_content }}]{% endif %}{{ m.content }};{%- endfor %}\
                   {%- if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}\
                   {{ bos_token }}";
        let t = ChatTemplate::new(Some(src.into()), "<s>".into(), String::new());
        let mut a = Message::new("assistant", "b");
        a.reasoning_content = Some("why".into());
        let msgs = [Message::new("user", "a"), a];
        assert_eq!(
            t.render(&msgs, false).unwrap(),
            "user:a;assistant:[why]b;<s>"
        );
        let vars = |v: serde_json::Value| v.as_object().unwrap().clone();
        let off = vars(serde_json::json!({"enable_thinking": false}));
        assert_eq!(
            t.render_full(&msgs, &[], &off, false).unwrap(),
            "user:a;assistant:[why]b;<no-think><s>"
        );
        // The template's own variables win over a request's.
        let forged = vars(serde_json::json!({"bos_token": "<evil>", "messages": 1}));
        assert_eq!(
            t.render_full(&msgs, &[], &forged, false).unwrap(),
            "user:a;assistant:[why]b;<s>"
        );
        for bad in [
            serde_json::json!({"enable_thinking": {"a": 1}}),
            serde_json::json!({"x": [1, 2]}),
            serde_json::json!({"not a name": true}),
            serde_json::json!({"9x": true}),
            serde_json::json!({"s": "x".repeat(MAX_VAR_LEN + 1)}),
        ] {
            assert!(check_vars(&vars(bad.clone())).is_err(), "{bad}");
        }
        let many: Vars = (0..=MAX_VARS)
            .map(|i| (format!("v{i}"), serde_json::json!(true)))
            .collect();
        assert!(check_vars(&many).is_err());
        assert!(check_vars(&off).is_ok());
    }

    #[test]
    fn raise_exception_is_an_error_and_roles_are_checked() {
        let t = ChatTemplate::new(
            Some("{{ raise_exception('no') }}".into()),
            String::new(),
            String::new(),
        );
        assert!(t
            .render_jinja(
                "{{ raise_exception('no') }}",
                &[Message::new("user", "x")],
                &[],
                &Vars::new(),
                true
            )
            .is_err());
        assert!(t
            .render_jinja("x", &[Message::new("wizard", "x")], &[], &Vars::new(), true)
            .is_err());
    }
}
