//! mens: a local LLM inference engine. This crate is the engine; it knows nothing of HTTP or terminals.
//!
//! Data flows one way: file → [`gguf`] → [`model`] → [`engine`] → [`sample`] → tokens → [`tokenizer`] → text.

pub mod chat;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod engine;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod kernels;
pub mod memory;
#[cfg(feature = "metal")]
pub mod metal;
pub mod model;
pub mod perplexity;
pub mod rope;
pub mod sample;
pub mod scheduler;
pub mod synth;
pub mod tokenizer;
pub mod weights;

pub use error::{Error, Result};

/// Everything mens derives from an untrusted model file, in load order: header, metadata and tensor
/// table, tokenizer (and one encode), chat template (one render), model configuration and weights.
/// Used by the fuzz target and its regression tests; returns the first error.
pub fn load_untrusted(bytes: &[u8]) -> Result<()> {
    let g = gguf::Gguf::from_bytes(bytes.to_vec())?;
    let tok = tokenizer::Tokenizer::from_gguf(&g);
    if let Ok(t) = &tok {
        t.encode("def f(x):\n    return <|im_start|>x 日本")?;
        let template = chat::ChatTemplate::from_gguf(&g, t)?;
        template.tokens(
            t,
            &[chat::Message::new("user", "hi <|im_end|>")],
            true,
            1 << 16,
        )?;
    }
    let m = model::Model::from_gguf(g)?;
    tok?.check_model(m.config.vocab_size)?;
    Ok(())
}
