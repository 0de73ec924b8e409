//! Chat prompts: the model's own Jinja template (`tokenizer.chat_template`) rendered with minijinja,
//! under limits (fuel bounds the work, output size is capped); ChatML when the file has no template or
//! it fails to render.

use crate::error::{Error, Result};
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

    /// Render with the model's template; on any failure fall back to ChatML and say why.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        if let Some(src) = &self.source {
            match self.render_jinja(src, messages, add_generation_prompt) {
                Ok(s) => return Ok(s),
                Err(e) => tracing::warn!("the model's chat template failed ({e}); using ChatML"),
            }
        }
        Ok(chatml(messages, add_generation_prompt))
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
        let out = t
            .render(minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(|e| Error::Template(e.to_string()))?;
        if out.len() > MAX_OUTPUT {
            return Err(Error::Template(format!(
                "rendered prompt is over {MAX_OUTPUT} bytes"
            )));
        }
        Ok(out)
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
    fn runaway_template_falls_back_to_chatml() {
        let t = ChatTemplate::new(
            Some(
                "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
                    .into(),
            ),
            String::new(),
            String::new(),
        );
        let msgs = [Message::new("user", "hi")];
        assert!(t
            .render_jinja(t.source.as_ref().unwrap(), &msgs, true)
            .is_err());
        assert_eq!(
            t.render(&msgs, true).unwrap(),
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
