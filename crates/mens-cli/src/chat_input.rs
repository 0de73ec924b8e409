//! What `mens chat` reads: one turn at a time, from a line editor on a terminal (history, editing,
//! bracketed paste: a pasted block is one turn) or from piped lines. Multi-line turns: a line of
//! `"""` opens and closes a block, and a line ending in `\` continues on the next. Blank lines are
//! part of a turn, never the end of the chat. Commands start with `/` (see [`HELP`]).

use anyhow::{bail, Result};
use mens::chat::Message;
use std::io::BufRead;

pub(crate) const HELP: &str = "\
mens chat commands:
  /help          this list
  /reset         forget the conversation (the system prompt stays)
  /save FILE     write the conversation to FILE (JSON: [{\"role\", \"content\"}, ...])
  /load FILE     replace the conversation with FILE's (as /save writes it)
  /quit, /exit   leave (so do Ctrl-D, end of input, and Ctrl-C at the prompt)
multi-line input: paste it (a paste is one turn), or type \"\"\" on a line of its own, the lines, and
\"\"\" again; a line ending in \\ continues on the next.";

/// Largest conversation file `/load` reads.
const MAX_LOAD: u64 = 16 << 20;

/// One thing the user entered.
#[derive(Debug, PartialEq)]
pub(crate) enum Entry {
    Turn(String),
    Help,
    Reset,
    Save(String),
    Load(String),
    Quit,
    /// A `/word` that is not a command: said so, nothing sent.
    Unknown(String),
}

/// Where lines come from.
enum Source {
    Editor(rustyline::DefaultEditor),
    Lines(std::io::Lines<std::io::StdinLock<'static>>),
}

pub(crate) struct Input {
    source: Source,
}

impl Input {
    /// A line editor when stdin and stderr are terminals, else plain lines from stdin.
    pub(crate) fn new() -> Input {
        use std::io::IsTerminal;
        if std::io::stdin().is_terminal() && std::io::stderr().is_terminal() {
            if let Ok(e) = rustyline::DefaultEditor::new() {
                return Input {
                    source: Source::Editor(e),
                };
            }
        }
        Input {
            source: Source::Lines(std::io::stdin().lock().lines()),
        }
    }

    /// One raw line; None at end of input, Ctrl-D or Ctrl-C at the prompt.
    fn line(&mut self, prompt: &str) -> Result<Option<String>> {
        match &mut self.source {
            Source::Editor(e) => match e.readline(prompt) {
                Ok(l) => Ok(Some(l)),
                Err(rustyline::error::ReadlineError::Interrupted)
                | Err(rustyline::error::ReadlineError::Eof) => Ok(None),
                Err(err) => bail!("reading input: {err}"),
            },
            Source::Lines(lines) => {
                eprint!("{prompt}");
                match lines.next() {
                    None => Ok(None),
                    Some(l) => Ok(Some(l?)),
                }
            }
        }
    }

    /// The next entry; None when the user leaves.
    pub(crate) fn next(&mut self) -> Result<Option<Entry>> {
        loop {
            let Some(first) = self.line("> ")? else {
                return Ok(None);
            };
            let mut text = first;
            if text.trim() == "\"\"\"" {
                // A block: every line up to the closing """ (end of input closes it too).
                let mut body = Vec::new();
                while let Some(l) = self.line("… ")? {
                    if l.trim() == "\"\"\"" {
                        break;
                    }
                    body.push(l);
                }
                text = body.join("\n");
            } else {
                while let Some(head) = text.strip_suffix('\\') {
                    let head = head.to_string();
                    let Some(next) = self.line("… ")? else {
                        text = head;
                        break;
                    };
                    text = head + "\n" + &next;
                }
            }
            if text.trim().is_empty() {
                continue;
            }
            if let Source::Editor(e) = &mut self.source {
                let _ = e.add_history_entry(text.as_str());
            }
            return Ok(Some(parse(text)));
        }
    }
}

/// A command when the text is one of them, else a turn (trailing blanks trimmed).
pub(crate) fn parse(text: String) -> Entry {
    let t = text.trim();
    if let Some(cmd) = t.strip_prefix('/') {
        let (word, arg) = match cmd.split_once(char::is_whitespace) {
            Some((w, a)) => (w, a.trim()),
            None => (cmd, ""),
        };
        match (word, arg.is_empty()) {
            ("help", true) => return Entry::Help,
            ("reset", true) => return Entry::Reset,
            ("quit" | "exit", true) => return Entry::Quit,
            ("save", false) => return Entry::Save(arg.to_string()),
            ("load", false) => return Entry::Load(arg.to_string()),
            _ if !t.contains(char::is_whitespace) && !t.contains('\n') => {
                return Entry::Unknown(t.to_string())
            }
            _ => {}
        }
    }
    Entry::Turn(text.trim_end().to_string())
}

/// Write the conversation as JSON.
pub(crate) fn save(path: &str, messages: &[Message]) -> Result<()> {
    let json = serde_json::to_string_pretty(messages)?;
    std::fs::write(path, json + "\n")
        .map_err(|e| anyhow::anyhow!("cannot write {path}: {}", e.kind()))
}

/// Read a conversation /save wrote: at most 16 MiB, roles system, user and assistant only.
pub(crate) fn load(path: &str) -> Result<Vec<Message>> {
    let f = std::fs::File::open(path)
        .map_err(|e| anyhow::anyhow!("cannot read {path}: {}", e.kind()))?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(f, MAX_LOAD + 1), &mut text)
        .map_err(|e| anyhow::anyhow!("cannot read {path}: {}", e.kind()))?;
    if text.len() as u64 > MAX_LOAD {
        bail!("{path} is larger than {} MiB", MAX_LOAD >> 20);
    }
    let messages: Vec<Message> = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{path} is not a conversation as /save writes it: {e}"))?;
    if let Some(m) = messages
        .iter()
        .find(|m| !matches!(m.role.as_str(), "system" | "user" | "assistant"))
    {
        bail!("{path}: role {:?} is not system, user or assistant", m.role);
    }
    Ok(messages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_turns() {
        assert_eq!(parse("/help".into()), Entry::Help);
        assert_eq!(parse("  /reset ".into()), Entry::Reset);
        assert_eq!(parse("/exit".into()), Entry::Quit);
        assert_eq!(
            parse("/save a b.json".into()),
            Entry::Save("a b.json".into())
        );
        assert_eq!(parse("/load x".into()), Entry::Load("x".into()));
        assert_eq!(parse("/nope".into()), Entry::Unknown("/nope".into()));
        // A turn that merely starts with a slash is text.
        assert_eq!(
            parse("/usr/bin is where? ".into()),
            Entry::Turn("/usr/bin is where?".into())
        );
        assert_eq!(parse("/save".into()), Entry::Unknown("/save".into()));
        assert_eq!(
            parse("def f():\n\n    pass\n".into()),
            Entry::Turn("def f():\n\n    pass".into())
        );
    }
}
