//! Qwen3 dense: no biases, a per-head RMSNorm of Q and K, a head size apart from the width.
use super::{ArchDef, BASE};
use crate::model::Arch;
use crate::rope::RopeStyle;

pub const DEF: ArchDef = ArchDef {
    name: "qwen3",
    arch: Arch::Qwen3,
    rope: RopeStyle::Neox,
    qk_norm: true,
    ..BASE
};
