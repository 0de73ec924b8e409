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
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
        }
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
}

impl ChatTemplate {
    pub fn new(source: Option<String>, bos_token: String, eos_token: String) -> Self {
        ChatTemplate {
            source,
            bos_token,
            eos_token,
        }
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
        match &self.source {
            Some(src) => self.render_jinja(src, messages, add_generation_prompt),
            None => Ok(chatml(messages, add_generation_prompt)),
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
        let escaped: Vec<Message> = messages
            .iter()
            .map(|m| Message {
                role: m.role.clone(),
                content: tok.escape(&m.content).into_owned(),
            })
            .collect();
        let text = self.render(&escaped, add_generation_prompt)?;
        tok.encode_rendered(&text, limit)
    }

    pub fn render_jinja(
        &self,
        src: &str,
        messages: &[Message],
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
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_template("chat", src)
            .map_err(|e| Error::Template(e.to_string()))?;
        let t = env
            .get_template("chat")
            .map_err(|e| Error::Template(e.to_string()))?;
        let mut out = Capped(Vec::new());
        t.render_captured_to(
            minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            },
            &mut out,
        )
        .map_err(|e| {
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
                true
            )
            .is_err());
        assert!(t
            .render_jinja("x", &[Message::new("wizard", "x")], true)
            .is_err());
    }
}
