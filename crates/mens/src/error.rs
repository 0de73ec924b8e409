//! One error type for the whole engine. Every failure a user can cause (bad file, bad prompt,
//! bad sampling value, too little memory) is a value of this type, never a panic.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The OS error is part of this message, not a source: printed once.
    #[error("cannot open {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A malformed GGUF file: the field, what was wrong, and where in the file.
    #[error("invalid GGUF file at byte offset {offset}: {field}: {message}")]
    Gguf {
        offset: u64,
        field: String,
        message: String,
    },
    /// The file is valid GGUF but not a model mens can run (architecture, shapes, types).
    #[error("unsupported or inconsistent model: {0}")]
    Model(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    /// The prompt (plus what must be generated) does not fit the context.
    #[error("context too small: {0}")]
    Context(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("memory budget: {0}")]
    Memory(String),
    /// A compute backend (CUDA, Metal) is missing or failed.
    #[error("backend: {0}")]
    Backend(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn gguf(offset: u64, field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Gguf {
            offset,
            field: field.into(),
            message: message.into(),
        }
    }
}
