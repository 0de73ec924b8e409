//! Gemma 3: the embedding scaled, per-head Q/K norms, norms after attention and the FFN, GeGLU,
//! sliding-window layers between the global ones (soft-capping when the file sets it).
use super::{ArchDef, BASE};
use crate::model::{Activation, Arch};
use crate::rope::RopeStyle;

pub const DEF: ArchDef = ArchDef {
    name: "gemma3",
    arch: Arch::Gemma3,
    rope: RopeStyle::Neox,
    qk_norm: true,
    post_norms: true,
    activation: Activation::Gelu,
    embed_scale: true,
    sliding_window: true,
    width_scale_at_62_layers: true,
    ..BASE
};
