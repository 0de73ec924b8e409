//! Reasoning in model output: a `<think>…</think>` block at the start of an answer (Qwen3,
//! DeepSeek-R1 and their distillations) is the model's reasoning, the rest its answer, as
//! llama-server's `--reasoning-format deepseek` splits them. [`ThinkSplitter`] splits text as it
//! streams in, [`split`] a finished answer. When the prompt already opened the block (a template
//! that ends with `<think>`), the answer starts inside it.

use crate::stream::partial_tail;

pub const OPEN: &str = "<think>";
pub const CLOSE: &str = "</think>";

#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Reasoning(String),
    Text(String),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    /// Nothing but whitespace yet: the answer may still open a block.
    Start,
    /// Inside the block (leading whitespace still dropped while `fresh`).
    Thinking {
        fresh: bool,
    },
    /// After the block: leading whitespace of the answer is dropped.
    AfterThink,
    Text,
}

/// Splits streamed text into reasoning and answer; text that may be a tag, and whitespace that
/// may end the reasoning, is held back until known.
#[derive(Debug, Clone)]
pub struct ThinkSplitter {
    buf: String,
    state: State,
}

impl ThinkSplitter {
    /// `open`: the prompt ended inside a `<think>` block.
    pub fn new(open: bool) -> Self {
        ThinkSplitter {
            buf: String::new(),
            state: if open {
                State::Thinking { fresh: true }
            } else {
                State::Start
            },
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let t = self.buf.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.buf = rest.to_string();
                        self.state = State::Thinking { fresh: true };
                    } else if OPEN.starts_with(t) {
                        break; // whitespace, or the start of the tag: wait
                    } else {
                        self.state = State::Text;
                    }
                }
                State::Thinking { fresh } => {
                    if fresh {
                        let t = self.buf.trim_start();
                        if t.is_empty() {
                            self.buf.clear();
                            break;
                        }
                        self.buf = t.to_string();
                        self.state = State::Thinking { fresh: false };
                    }
                    if let Some(end) = self.buf.find(CLOSE) {
                        let r = self.buf[..end].trim_end();
                        if !r.is_empty() {
                            out.push(Part::Reasoning(r.to_string()));
                        }
                        self.buf.drain(..end + CLOSE.len());
                        self.state = State::AfterThink;
                        continue;
                    }
                    // Hold back a possible start of the closing tag and trailing whitespace.
                    let keep = partial_tail(&self.buf, CLOSE);
                    let body = &self.buf[..self.buf.len() - keep];
                    let cut = body.trim_end().len();
                    if cut > 0 {
                        out.push(Part::Reasoning(self.buf[..cut].to_string()));
                        self.buf.drain(..cut);
                    }
                    break;
                }
                State::AfterThink => {
                    let t = self.buf.trim_start();
                    if t.is_empty() {
                        self.buf.clear();
                        break;
                    }
                    self.buf = t.to_string();
                    self.state = State::Text;
                }
                State::Text => {
                    if !self.buf.is_empty() {
                        out.push(Part::Text(std::mem::take(&mut self.buf)));
                    }
                    break;
                }
            }
        }
        out
    }

    /// The end of the answer: what was held back (an unclosed block is reasoning, cut short).
    pub fn finish(&mut self) -> Vec<Part> {
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Thinking { .. } => {
                let r = rest.trim();
                if r.is_empty() {
                    vec![]
                } else {
                    vec![Part::Reasoning(r.to_string())]
                }
            }
            State::AfterThink => vec![],
            State::Start | State::Text if rest.is_empty() => vec![],
            State::Start | State::Text => vec![Part::Text(rest)],
        }
    }
}

/// [`split`] when the answer's reasoning goes apart (`Some(open)`); else no reasoning and all of
/// `text` as the answer.
pub fn split_if(text: String, open: Option<bool>) -> (String, String) {
    match open {
        Some(open) => split(&text, open),
        None => (String::new(), text),
    }
}

/// A finished answer's reasoning and text (`open`: as [`ThinkSplitter::new`]).
pub fn split(text: &str, open: bool) -> (String, String) {
    let mut s = ThinkSplitter::new(open);
    let mut parts = s.push(text);
    parts.extend(s.finish());
    joined(parts)
}

/// Parts joined into (reasoning, text).
fn joined(parts: Vec<Part>) -> (String, String) {
    let (mut reasoning, mut answer) = (String::new(), String::new());
    for p in parts {
        match p {
            Part::Reasoning(r) => reasoning.push_str(&r),
            Part::Text(t) => answer.push_str(&t),
        }
    }
    (reasoning, answer)
}

/// How a request's leading `<think>` block is watched while it is generated: its tokens counted,
/// and with a budget, closed by force when the budget is spent (llama-server's
/// `--reasoning-budget`).
#[derive(Debug, Clone, PartialEq)]
pub struct Think {
    /// The prompt opened the block (the answer starts inside it).
    pub open: bool,
    /// Most tokens the block may hold after its opening tag; then `close` is forced.
    pub budget: Option<usize>,
    /// The tokens forced when the budget is spent: a message, if any, then the closing tag.
    pub close: Vec<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Watching {
    /// Only whitespace (or a part of the opening tag) yet.
    Before,
    Inside,
    /// The budget is spent: the closing tokens are being forced.
    Closing,
    /// Closed, or the answer did not open a block.
    Done,
}

/// Counts the tokens of a leading `<think>` block from the token bytes as they come, and says when
/// its budget is spent. Tags are matched on the text, whatever tokens spell them.
#[derive(Debug, Clone)]
pub struct Watch {
    state: Watching,
    budget: Option<usize>,
    /// Tokens inside the block, the closing tag's included.
    tokens: usize,
    /// The text not yet known not to hold a tag (bounded by the tags' length).
    tail: Vec<u8>,
}

impl Watch {
    pub fn new(open: bool, budget: Option<usize>) -> Self {
        Watch {
            state: if open {
                Watching::Inside
            } else {
                Watching::Before
            },
            budget,
            tokens: 0,
            tail: Vec::new(),
        }
    }

    /// Whether the block must be closed before any token (an opened block with a budget of 0).
    pub fn close_at_start(&mut self) -> bool {
        self.spent()
    }

    fn spent(&mut self) -> bool {
        if self.state == Watching::Inside && self.budget.is_some_and(|b| self.tokens >= b) {
            self.state = Watching::Closing;
            return true;
        }
        false
    }

    /// A generated token's bytes. True when the budget is now spent: force the closing tokens.
    pub fn push(&mut self, bytes: &[u8]) -> bool {
        match self.state {
            Watching::Done => false,
            Watching::Before => {
                self.tail.extend_from_slice(bytes);
                let start = self
                    .tail
                    .iter()
                    .position(|b| !b.is_ascii_whitespace())
                    .unwrap_or(self.tail.len());
                let t = &self.tail[start..];
                if let Some(rest) = t.strip_prefix(OPEN.as_bytes()) {
                    // The tokens after the tag count; a token holding text past it counts too.
                    self.tokens = usize::from(!rest.is_empty());
                    self.tail = rest.to_vec();
                    self.state = Watching::Inside;
                    self.closed();
                    self.spent()
                } else {
                    if !OPEN.as_bytes().starts_with(t) {
                        self.state = Watching::Done;
                        self.tail = Vec::new();
                    }
                    false
                }
            }
            Watching::Inside | Watching::Closing => {
                self.tokens += 1;
                self.tail.extend_from_slice(bytes);
                self.closed();
                self.spent()
            }
        }
    }

    /// The closing tag ends the block; else keep only what may start it.
    fn closed(&mut self) {
        let c = CLOSE.as_bytes();
        if self.tail.windows(c.len()).any(|w| w == c) {
            self.state = Watching::Done;
            self.tail = Vec::new();
        } else {
            let keep = self.tail.len().min(c.len() - 1);
            self.tail.drain(..self.tail.len() - keep);
        }
    }

    /// Tokens in the block so far (its closing tag's included; not the opening tag's).
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Whether the block may still need closing by force (a budget, the block not yet closed).
    pub fn pending(&self) -> bool {
        self.budget.is_some() && matches!(self.state, Watching::Before | Watching::Inside)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leading_block_is_reasoning() {
        assert_eq!(
            split("<think>\nplan it\n</think>\n\nthe answer", false),
            ("plan it".into(), "the answer".into())
        );
        assert_eq!(
            split("  <think>a</think>b", false),
            ("a".into(), "b".into())
        );
        // Not at the start, or no block: all text.
        assert_eq!(
            split("x <think>a</think>", false),
            ("".into(), "x <think>a</think>".into())
        );
        assert_eq!(split("<thin", false), ("".into(), "<thin".into()));
        assert_eq!(split(" plain ", false), ("".into(), " plain ".into()));
        // Opened by the prompt; cut off inside the block.
        assert_eq!(
            split("plan\n</think>\n\nok", true),
            ("plan".into(), "ok".into())
        );
        assert_eq!(
            split("<think>\nhalf a thou", false),
            ("half a thou".into(), "".into())
        );
        assert_eq!(
            split("<think>\n\n</think>\n\nok", false),
            ("".into(), "ok".into())
        );
    }

    #[test]
    fn streaming_split_equals_whole_split_at_every_cut() {
        for (text, open) in [
            (
                "<think>\nfirst, a < b\n\n so </thin k </think>\n\nanswer </think> here",
                false,
            ),
            ("reasoning only\n</think>answer", true),
            ("no block at all <think>", false),
        ] {
            let whole = split(text, open);
            for cut in 0..=text.len() {
                if !text.is_char_boundary(cut) {
                    continue;
                }
                let mut s = ThinkSplitter::new(open);
                let mut parts = s.push(&text[..cut]);
                parts.extend(s.push(&text[cut..]));
                parts.extend(s.finish());
                assert_eq!(joined(parts), whole, "cut at {cut} of {text:?}");
            }
        }
    }
    #[test]
    fn a_watch_counts_the_block_and_spends_its_budget() {
        // Opened by the prompt, no budget: every token to the closing tag counts.
        let mut w = Watch::new(true, None);
        for t in ["plan", " it", "</", "think", ">"] {
            assert!(!w.push(t.as_bytes()));
        }
        assert_eq!(w.tokens(), 5);
        assert!(!w.push(b" answer"));
        assert_eq!(w.tokens(), 5);
        // The model opens it; the budget of 3 is spent at the third token after the tag.
        let mut w = Watch::new(false, Some(3));
        assert!(w.pending());
        assert!(!w.push(b"\n"));
        assert!(!w.push(b"<th"));
        assert!(!w.push(b"ink>"));
        assert!(!w.push(b"a"));
        assert!(!w.push(b"b"));
        assert!(w.push(b"c"));
        assert!(!w.pending());
        // The forced closing tag ends it; later tokens are answer.
        assert!(!w.push(b"</think>"));
        assert!(!w.push(b"x"));
        assert_eq!(w.tokens(), 4);
        // Budget 0 in an opened block: closed before any token.
        assert!(Watch::new(true, Some(0)).close_at_start());
        assert!(!Watch::new(false, Some(0)).close_at_start());
        // No block: nothing counted, nothing forced.
        let mut w = Watch::new(false, Some(1));
        assert!(!w.push(b"  Hello"));
        assert!(!w.push(b"<think>"));
        assert!(!w.pending());
        assert_eq!(w.tokens(), 0);
        // Closed within the budget: nothing forced.
        let mut w = Watch::new(true, Some(4));
        assert!(!w.push(b"ok</think>"));
        assert!(!w.push(b"a"));
        assert!(!w.push(b"b"));
        assert!(!w.push(b"c"));
        assert_eq!(w.tokens(), 1);
    }
}
