//! The architectures, one small file each: what a GGUF `general.architecture` turns on among the
//! shared blocks every backend runs (`cpu::run_layers`, the CUDA graph): biases and norms,
//! RoPE pairing, the FFN's activation or experts, sliding windows. Adding an architecture whose
//! blocks exist is a file here and an entry in [`ARCHS`]; it touches no kernel.

use crate::model::{Activation, Arch};
use crate::rope::RopeStyle;

mod gemma3;
mod llama;
mod qwen2;
mod qwen3;
mod qwen3moe;

/// What an architecture is built from. Q/K/V biases, tied embeddings, RoPE frequency factors
/// and scaling, logit soft-capping and the head size come from the file, for any architecture.
#[derive(Debug, Clone, Copy)]
pub struct ArchDef {
    /// `general.architecture`, and the prefix of its metadata keys.
    pub name: &'static str,
    pub arch: Arch,
    /// How RoPE pairs a head's values.
    pub rope: RopeStyle,
    /// A per-head RMSNorm of Q and K before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// RMSNorms after attention and after the FFN (`post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    /// A routed mixture of experts as the FFN (`expert_count`, the `*_exps` tensors).
    pub experts: bool,
    /// The gated FFN's activation.
    pub activation: Activation,
    /// The embedding scaled by sqrt(width).
    pub embed_scale: bool,
    /// Sliding-window layers (`attention.sliding_window`, its layer pattern and RoPE base).
    pub sliding_window: bool,
    /// Attention scaled by 1/sqrt(width / heads) in 62-layer files (Gemma 3 27B; llama.cpp's rule),
    /// else by 1/sqrt(head size).
    pub width_scale_at_62_layers: bool,
}

/// A Llama-style decoder: pre-norms only, SwiGLU, one FFN, full attention.
const BASE: ArchDef = ArchDef {
    name: "",
    arch: Arch::Llama,
    rope: RopeStyle::Normal,
    qk_norm: false,
    post_norms: false,
    experts: false,
    activation: Activation::Silu,
    embed_scale: false,
    sliding_window: false,
    width_scale_at_62_layers: false,
};

/// Every supported architecture.
pub const ARCHS: [ArchDef; 5] = [
    qwen2::DEF,
    qwen3::DEF,
    qwen3moe::DEF,
    llama::DEF,
    gemma3::DEF,
];

/// The definition for a file's `general.architecture`.
pub fn find(name: &str) -> Option<&'static ArchDef> {
    ARCHS.iter().find(|a| a.name == name)
}

impl Arch {
    /// This architecture's definition.
    pub fn def(&self) -> &'static ArchDef {
        ARCHS
            .iter()
            .find(|a| a.arch == *self)
            .expect("every Arch has a definition")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each definition is found by its name and by its `Arch`, once.
    #[test]
    fn every_architecture_is_defined_once() {
        for a in &ARCHS {
            assert_eq!(find(a.name).map(|d| d.arch), Some(a.arch));
            assert_eq!(a.arch.def().name, a.name);
            assert_eq!(ARCHS.iter().filter(|b| b.arch == a.arch).count(), 1);
        }
        assert!(find("gpt2").is_none());
    }
}
