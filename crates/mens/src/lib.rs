//! mens: a local LLM inference engine. This crate is the engine; it knows nothing of HTTP or terminals.
//!
//! Data flows one way: file → [`gguf`] → [`model`] → a [`Runner`] (CPU [`cpu`], [`cuda`], `metal`) →
//! [`sample`] → tokens → [`stream`] → text. [`load()`] builds the model, tokenizer and chat template
//! and admits them against a backend's memory; [`generate()`] runs one sequence, [`Scheduler`] many.
//! docs/ARCHITECTURE.md has the map.

pub mod alloc;
pub mod chat;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod embed;
pub mod error;
pub mod fim;
pub mod generate;
pub mod gguf;
pub mod grammar;
#[doc(hidden)]
pub mod kernels;
pub mod load;
pub mod memory;
#[cfg(feature = "metal")]
pub mod metal;
pub mod model;
pub mod models;
pub mod pages;
pub mod perplexity;
pub mod repack;
pub mod rope;
pub mod runner;
pub mod sample;
pub mod scheduler;
pub mod spec;
pub mod spm;
pub mod stream;
pub mod synth;
pub mod think;
pub mod tokenizer;
pub mod tools;
pub mod weights;

// The API most callers need.
pub use chat::{ChatTemplate, Message};
pub use cpu::{Batch, Session, SessionOptions};
pub use error::{Error, Result};
pub use generate::{generate, GenerateOptions, Stats, StopReason};
pub use load::{load, Backend, LoadOptions, Loaded};
pub use model::Model;
pub use runner::{Logits, Memory, Part, Runner};
pub use sample::{Sampler, SamplerConfig};
pub use scheduler::{Event, Finish, Request, Scheduler, SchedulerOptions, Usage};
pub use tokenizer::Tokenizer;

/// Everything mens derives from an untrusted model file, as [`load()`] does: header, metadata and
/// tensor table, tokenizer, chat template, model configuration and weights; then one encode and one
/// chat render.
/// Used by the fuzz target and its regression tests; returns the first error.
pub fn load_untrusted(bytes: &[u8]) -> Result<()> {
    let (_, t, template) = load::from_gguf(gguf::Gguf::from_bytes(bytes.to_vec())?)?;
    t.encode("def f(x):\n    return <|im_start|>x 日本")?;
    template.tokens(
        &t,
        &[chat::Message::new("user", "hi <|im_end|>")],
        true,
        1 << 16,
    )?;
    Ok(())
}
