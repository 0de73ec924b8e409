//! Qwen2 and Qwen2.5 (the Coder models): Q/K/V biases (from the file), RoPE on split halves.
use super::{ArchDef, BASE};
use crate::model::Arch;
use crate::rope::RopeStyle;

pub const DEF: ArchDef = ArchDef {
    name: "qwen2",
    arch: Arch::Qwen2,
    rope: RopeStyle::Neox,
    ..BASE
};
