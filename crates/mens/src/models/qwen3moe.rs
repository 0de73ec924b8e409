//! Qwen3-MoE (Qwen3-Coder-30B-A3B): Qwen3's attention, a routed mixture of experts as the FFN.
use super::{ArchDef, BASE};
use crate::model::Arch;
use crate::rope::RopeStyle;

pub const DEF: ArchDef = ArchDef {
    name: "qwen3moe",
    arch: Arch::Qwen3Moe,
    rope: RopeStyle::Neox,
    qk_norm: true,
    experts: true,
    ..BASE
};
