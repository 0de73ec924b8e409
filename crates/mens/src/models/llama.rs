//! Llama 2 and 3 (and SmolLM2): the base decoder; Llama 3.1's RoPE factors come from the file.
use super::{ArchDef, BASE};

pub const DEF: ArchDef = ArchDef {
    name: "llama",
    ..BASE
};
