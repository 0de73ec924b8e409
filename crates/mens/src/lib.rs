//! mens: a local LLM inference engine. This crate is the engine; it knows nothing of HTTP or terminals.
//!
//! Data flows one way: file → [`gguf`] → [`model`] → [`engine`] → [`sample`] → tokens → [`tokenizer`] → text.

pub mod chat;
pub mod engine;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod kernels;
pub mod memory;
pub mod model;
pub mod perplexity;
pub mod sample;
pub mod synth;
pub mod tokenizer;

pub use error::{Error, Result};
