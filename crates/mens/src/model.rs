//! Model configuration (from GGUF metadata) and weights (quantized, inside the memory map), for
//! every architecture: what each one turns on is its definition in `models/` (one small file
//! each); biases, tied embeddings, RoPE frequency factors and scaling and soft-capping come from
//! the file.

use crate::error::{Error, Result};
use crate::gguf::{Gguf, TensorInfo};
use crate::rope::{RopeStyle, MAX_HEAD_DIM};
use crate::weights::QTensor;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Qwen2,
    Qwen3,
    Llama,
    Gemma3,
    Qwen3Moe,
}

/// A mixture-of-experts FFN (Qwen3-MoE): `n_expert` experts of `Config::ffn_dim`, `n_used` routed
/// per token (softmax over the router's logits, the top `n_used` kept and renormalised).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Experts {
    pub n_expert: usize,
    pub n_used: usize,
}

/// The gated FFN's activation: SiLU (SwiGLU) or tanh-approximated GELU (GeGLU, Gemma).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Silu,
    Gelu,
}

/// Sliding-window attention (Gemma 3): the layers marked in `layers` see only the last `window`
/// positions (a query at p sees keys p - window + 1 ..= p) and rotate with `rope_base`.
#[derive(Debug, Clone)]
pub struct SlidingWindow {
    pub window: usize,
    pub layers: Vec<bool>,
    pub rope_base: f32,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub arch: Arch,
    pub name: String,
    pub n_layer: usize,
    pub dim: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub vocab_size: usize,
    /// The context length the model was trained for.
    pub train_ctx: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    pub rope_style: RopeStyle,
    /// Linear RoPE scaling: positions are multiplied by this (1 / `rope.scaling.factor`).
    pub rope_scale: f32,
    /// The token embedding is multiplied by this (Gemma: sqrt(dim); else 1).
    pub embed_scale: f32,
    /// Attention scores are Q·K times this (1 / sqrt(head_dim) unless the model says otherwise).
    pub attn_scale: f32,
    pub activation: Activation,
    pub sliding: Option<SlidingWindow>,
    /// Final logits become c · tanh(logits / c) (Gemma 2 style soft-capping), when set.
    pub logit_softcap: Option<f32>,
    /// Mixture-of-experts layers (every layer, as Qwen3-MoE); `ffn_dim` is then one expert's.
    pub experts: Option<Experts>,
    /// The file's `{arch}.pooling_type` (an embedding model's), when it names one.
    pub pooling: Option<crate::embed::Pooling>,
}

/// What the KV cache stores for each K or V value (llama.cpp's `-ctk` / `-ctv`): f16, or 32-value
/// blocks of 8-bit (Q8_0, 34 bytes) or 4-bit (Q4_0, 18 bytes) integers with an f16 scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    #[default]
    F16,
    Q8_0,
    Q4_0,
}

impl KvType {
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            "q4_0" => Ok(KvType::Q4_0),
            _ => Err(Error::InvalidArgument(format!(
                "cache type {s:?} is not one of f16, q8_0, q4_0"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    /// Whether rows of this type are stored rotated (`kernels::kv::hadamard32`): the block types.
    pub fn rotated(self) -> bool {
        self != KvType::F16
    }

    /// Bytes of one head's row of `head_dim` values (a multiple of 32 for the block types).
    pub fn row_bytes(self, head_dim: usize) -> usize {
        match self {
            KvType::F16 => head_dim * 2,
            KvType::Q8_0 => head_dim / 32 * 34,
            KvType::Q4_0 => head_dim / 32 * 18,
        }
    }
}

impl Config {
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }
    /// The attention window of layer `l`: `usize::MAX` for a global layer.
    pub fn window(&self, l: usize) -> usize {
        match &self.sliding {
            Some(s) if s.layers[l] => s.window,
            _ => usize::MAX,
        }
    }
    /// Whether the model uses a feature only the CPU backend has so far, and which (the Metal
    /// backend's test).
    pub fn cpu_only_feature(&self) -> Option<&'static str> {
        if self.experts.is_some() {
            Some("mixture-of-experts layers")
        } else {
            self.cuda_missing_feature()
        }
    }
    /// Whether the model uses a feature the CUDA backend lacks so far (it runs experts), and which.
    pub fn cuda_missing_feature(&self) -> Option<&'static str> {
        if self.sliding.is_some() {
            Some("sliding-window attention")
        } else if self.activation != Activation::Silu {
            Some("a GELU feed-forward")
        } else if self.logit_softcap.is_some() {
            Some("logit soft-capping")
        } else if self.embed_scale != 1.0 {
            Some("a scaled embedding")
        } else if (self.attn_scale * (self.head_dim as f32).sqrt() - 1.0).abs() > 1e-6 {
            Some("an attention scale other than 1/sqrt(head size)")
        } else {
            None
        }
    }
    /// Bytes of K and V cache per token of context with K stored as `k` and V as `v`.
    pub fn kv_bytes_per_token_as(&self, k: KvType, v: KvType) -> u64 {
        let rows = (self.n_layer * self.n_kv_head) as u64;
        rows * (k.row_bytes(self.head_dim) + v.row_bytes(self.head_dim)) as u64
    }
}

pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub q: QTensor,
    pub k: QTensor,
    pub v: QTensor,
    /// Q, K and V biases concatenated (Qwen2), in the layout of the fused QKV buffer.
    pub qkv_bias: Option<Vec<f32>>,
    /// The RMSNorm weights applied to each Q head and each K head before RoPE (Qwen3).
    pub qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    pub o: QTensor,
    pub ffn_norm: Vec<f32>,
    pub gate: QTensor,
    pub up: QTensor,
    pub down: QTensor,
    /// RMSNorm weights applied to the attention output and to the FFN output before each is added
    /// to the residual stream (Gemma 3).
    pub post_norms: Option<(Vec<f32>, Vec<f32>)>,
    /// Mixture of experts: `gate`, `up` and `down` above then hold every expert stacked (as the
    /// file's 3-D tensors do), and this the router and each expert's own view of them.
    pub moe: Option<Moe>,
}

pub struct Moe {
    /// [n_expert, dim]: the router's logits.
    pub router: QTensor,
    /// Expert e's (gate, up, down) matrices: rows of the stacked tensors.
    pub experts: Vec<(QTensor, QTensor, QTensor)>,
}

pub struct Model {
    pub config: Config,
    pub gguf: Gguf,
    pub embedding: QTensor,
    pub layers: Vec<Layer>,
    pub output_norm: Vec<f32>,
    /// The LM head (`output.weight`, or the embedding when tied).
    pub output: QTensor,
    /// RoPE frequency divisors, one per rotated pair (`rope_freqs.weight`: Llama 3.1's scaling).
    pub rope_freqs: Option<Vec<f32>>,
}

fn tensor_info<'a>(g: &'a Gguf, name: &str) -> Result<&'a TensorInfo> {
    g.tensor(name)
        .ok_or_else(|| Error::Model(format!("tensor {name} is missing")))
}

/// A matrix with `rows` outputs of `cols` inputs (GGUF dims = [cols, rows]).
fn matrix(g: &Gguf, name: &str, rows: usize, cols: usize) -> Result<QTensor> {
    shaped(g, name, &[cols as u64, rows as u64], rows, cols)
}

/// Tensor `name`, which must have exactly the GGUF dims `dims`, as a matrix of `rows` × `cols`.
fn shaped(g: &Gguf, name: &str, dims: &[u64], rows: usize, cols: usize) -> Result<QTensor> {
    let t = tensor_info(g, name)?;
    if t.dims.as_slice() != dims {
        return Err(Error::Model(format!(
            "tensor {name} has shape {:?}, expected {dims:?}",
            t.dims
        )));
    }
    QTensor::new(
        t.ttype,
        rows,
        cols,
        g.storage.clone(),
        t.offset as usize,
        t.bytes as usize,
    )
}

/// `n` matrices of `rows` × `cols` stacked (GGUF dims = [cols, rows, n]), as one of n · rows rows.
fn stacked(g: &Gguf, name: &str, rows: usize, cols: usize, n: usize) -> Result<QTensor> {
    shaped(
        g,
        name,
        &[cols as u64, rows as u64, n as u64],
        n * rows,
        cols,
    )
}

fn vector(g: &Gguf, name: &str, len: usize) -> Result<Vec<f32>> {
    let t = tensor_info(g, name)?;
    if t.elements() != len as u64 || t.dims.len() != 1 {
        return Err(Error::Model(format!(
            "tensor {name} has shape {:?}, expected [{len}]",
            t.dims
        )));
    }
    let q = QTensor::new(
        t.ttype,
        1,
        len,
        g.storage.clone(),
        t.offset as usize,
        t.bytes as usize,
    )?;
    let mut out = vec![0f32; len];
    q.dequantize_row(0, &mut out);
    Ok(out)
}

impl Config {
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let arch_name = g
            .get_str("general.architecture")?
            .ok_or_else(|| Error::Model("general.architecture is missing".into()))?;
        let def = crate::models::find(arch_name).ok_or_else(|| {
            let known: Vec<&str> = crate::models::ARCHS.iter().map(|a| a.name).collect();
            Error::Model(format!(
                "architecture {arch_name:?} is not supported (supported: {})",
                known.join(", ")
            ))
        })?;
        let (arch, rope_style) = (def.arch, def.rope);
        let key = |k: &str| format!("{arch_name}.{k}");
        let n_layer = g.require_u64(&key("block_count"))? as usize;
        let dim = g.require_u64(&key("embedding_length"))? as usize;
        let n_head = g.require_u64(&key("attention.head_count"))? as usize;
        let n_kv_head = g
            .get_u64(&key("attention.head_count_kv"))?
            .unwrap_or(n_head as u64) as usize;
        let experts = if def.experts {
            let n_expert = g.require_u64(&key("expert_count"))?;
            let n_used = g.require_u64(&key("expert_used_count"))?;
            if !(1..=1024).contains(&n_expert) || !(1..=64.min(n_expert)).contains(&n_used) {
                return Err(Error::Model(format!(
                    "expert_count {n_expert} / expert_used_count {n_used} out of range (1..=1024 experts, 1..=64 of them used)"
                )));
            }
            Some(Experts {
                n_expert: n_expert as usize,
                n_used: n_used as usize,
            })
        } else {
            None
        };
        let ffn_dim = match experts {
            Some(_) => g.require_u64(&key("expert_feed_forward_length"))? as usize,
            None => g.require_u64(&key("feed_forward_length"))? as usize,
        };
        let train_ctx = g.get_u64(&key("context_length"))?.unwrap_or(4096) as usize;
        let rms_eps = g
            .get_f64(&key("attention.layer_norm_rms_epsilon"))?
            .unwrap_or(1e-6) as f32;
        let rope_base = g.get_f64(&key("rope.freq_base"))?.unwrap_or(10000.0) as f32;
        let name = g.get_str("general.name")?.unwrap_or(arch_name).to_string();

        let bad = |m: String| Err(Error::Model(m));
        if n_layer == 0 || n_layer > 1024 {
            return bad(format!("block_count {n_layer} is out of range (1..=1024)"));
        }
        if dim == 0 || dim > 1 << 16 || ffn_dim == 0 || ffn_dim > 1 << 18 {
            return bad(format!(
                "embedding_length {dim} or feed_forward_length {ffn_dim} is out of range"
            ));
        }
        if n_head == 0
            || n_kv_head == 0
            || !n_head.is_multiple_of(n_kv_head)
            || !dim.is_multiple_of(n_head)
        {
            return bad(format!(
                "head_count {n_head} and head_count_kv {n_kv_head} do not divide embedding_length {dim}"
            ));
        }
        let head_dim = g
            .get_u64(&key("attention.key_length"))?
            .map(|v| v as usize)
            .unwrap_or(dim / n_head);
        if head_dim == 0 || head_dim % 2 != 0 || head_dim > MAX_HEAD_DIM {
            return bad(format!(
                "head dimension {head_dim} is not even and at most {MAX_HEAD_DIM}"
            ));
        }
        // Size-like hyperparameters must match what the tensors are: RoPE rotates the whole head
        // here (as these architectures do), values are as wide as keys.
        for (k, what) in [
            ("rope.dimension_count", "the RoPE dimension"),
            ("attention.value_length", "the value head size"),
        ] {
            if let Some(v) = g.get_u64(&key(k))? {
                if v != head_dim as u64 {
                    return bad(format!(
                        "{arch_name}.{k} = {v}: {what} must equal the head size {head_dim}"
                    ));
                }
            }
        }
        if !(rms_eps > 0.0 && rms_eps < 1.0) || !(rope_base > 1.0 && rope_base.is_finite()) {
            return bad(format!(
                "rms epsilon {rms_eps} or rope base {rope_base} is out of range"
            ));
        }
        if train_ctx == 0 {
            return bad("context_length is 0".into());
        }
        let emb = tensor_info(g, "token_embd.weight")?;
        if emb.dims.len() != 2 || emb.dims[0] != dim as u64 {
            return bad(format!(
                "token_embd.weight has shape {:?}, expected [{dim}, vocab]",
                emb.dims
            ));
        }
        let vocab_size = emb.dims[1] as usize;
        if let Some(v) = g.get_u64(&key("vocab_size"))? {
            if v != vocab_size as u64 {
                return bad(format!(
                    "{arch_name}.vocab_size = {v} but token_embd.weight has {vocab_size} rows"
                ));
            }
        }
        let rope_scale = match g.get_str(&key("rope.scaling.type"))? {
            None | Some("none") => 1.0,
            Some("linear") => {
                let f = g.get_f64(&key("rope.scaling.factor"))?.unwrap_or(1.0);
                if !(f.is_finite() && (1.0..=1024.0).contains(&f)) {
                    return bad(format!(
                        "rope.scaling.factor {f} is out of range (1..=1024)"
                    ));
                }
                (1.0 / f) as f32
            }
            Some(other) => {
                return bad(format!(
                    "RoPE scaling {other:?} is not supported (none and linear are)"
                ))
            }
        };
        let sliding = match g.get_u64(&key("attention.sliding_window"))? {
            Some(w) if w > 0 && def.sliding_window => {
                // llama.cpp: a per-layer pattern array, or every n-th layer global (n = 6 unless the
                // file says otherwise).
                let layers = match g.get(&key("attention.sliding_window_pattern")) {
                    Some(crate::gguf::Value::Array(crate::gguf::Array::Bools(b))) => {
                        if b.len() != n_layer {
                            return bad(format!(
                                "sliding_window_pattern has {} entries for {n_layer} layers",
                                b.len()
                            ));
                        }
                        b.clone()
                    }
                    _ => {
                        let n = g
                            .get_u64(&key("attention.sliding_window_pattern"))?
                            .unwrap_or(6) as usize;
                        (0..n_layer).map(|l| n == 0 || l % n < n - 1).collect()
                    }
                };
                let rope_base = g.get_f64(&key("rope.freq_base_swa"))?.unwrap_or(10000.0) as f32;
                if !(rope_base > 1.0 && rope_base.is_finite()) {
                    return bad(format!("rope.freq_base_swa {rope_base} is out of range"));
                }
                Some(SlidingWindow {
                    window: w.min(1 << 24) as usize,
                    layers,
                    rope_base,
                })
            }
            _ => None,
        };
        let logit_softcap = match g.get_f64(&key("final_logit_softcapping"))? {
            Some(c) if c > 0.0 && c.is_finite() => Some(c as f32),
            Some(c) if c != 0.0 => {
                return bad(format!("final_logit_softcapping {c} is not positive"))
            }
            _ => None,
        };
        // Gemma 3 27B scales by the width per head, the others by the head size (llama.cpp's rule).
        let attn_scale = if def.width_scale_at_62_layers && n_layer == 62 {
            1.0 / ((dim / n_head) as f32).sqrt()
        } else {
            1.0 / (head_dim as f32).sqrt()
        };
        let pooling = g
            .get_u64(&key("pooling_type"))?
            .and_then(crate::embed::Pooling::from_gguf);
        Ok(Config {
            pooling,
            experts,
            rope_scale,
            embed_scale: if def.embed_scale {
                (dim as f32).sqrt()
            } else {
                1.0
            },
            attn_scale,
            activation: def.activation,
            sliding,
            logit_softcap,
            arch,
            name,
            n_layer,
            dim,
            n_head,
            n_kv_head,
            head_dim,
            ffn_dim,
            vocab_size,
            train_ctx: train_ctx.min(1 << 20),
            rms_eps,
            rope_base,
            rope_style,
        })
    }
}

impl Model {
    pub fn open(path: &Path) -> Result<Self> {
        Self::from_gguf(Gguf::open(path)?)
    }

    pub fn from_gguf(g: Gguf) -> Result<Self> {
        let c = Config::from_gguf(&g)?;
        let (d, qd, kd, f) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
        let embedding = matrix(&g, "token_embd.weight", c.vocab_size, d)?;
        let mut layers = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}");
            let qkv_bias = if g.tensor(&n("attn_q.bias")).is_some() {
                let mut b = vector(&g, &n("attn_q.bias"), qd)?;
                b.extend(vector(&g, &n("attn_k.bias"), kd)?);
                b.extend(vector(&g, &n("attn_v.bias"), kd)?);
                Some(b)
            } else {
                None
            };
            let def = c.arch.def();
            let qk_norm = if def.qk_norm {
                Some((
                    vector(&g, &n("attn_q_norm.weight"), c.head_dim)?,
                    vector(&g, &n("attn_k_norm.weight"), c.head_dim)?,
                ))
            } else {
                None
            };
            let (gate, up, down, moe) = match c.experts {
                None => (
                    matrix(&g, &n("ffn_gate.weight"), f, d)?,
                    matrix(&g, &n("ffn_up.weight"), f, d)?,
                    matrix(&g, &n("ffn_down.weight"), d, f)?,
                    None,
                ),
                Some(x) => {
                    let e = x.n_expert;
                    let gate = stacked(&g, &n("ffn_gate_exps.weight"), f, d, e)?;
                    let up = stacked(&g, &n("ffn_up_exps.weight"), f, d, e)?;
                    let down = stacked(&g, &n("ffn_down_exps.weight"), d, f, e)?;
                    let experts = (0..e)
                        .map(|i| {
                            Ok((
                                gate.row_range(i * f, f)?,
                                up.row_range(i * f, f)?,
                                down.row_range(i * d, d)?,
                            ))
                        })
                        .collect::<Result<Vec<_>>>()?;
                    let router = matrix(&g, &n("ffn_gate_inp.weight"), e, d)?;
                    (gate, up, down, Some(Moe { router, experts }))
                }
            };
            layers.push(Layer {
                attn_norm: vector(&g, &n("attn_norm.weight"), d)?,
                q: matrix(&g, &n("attn_q.weight"), qd, d)?,
                k: matrix(&g, &n("attn_k.weight"), kd, d)?,
                v: matrix(&g, &n("attn_v.weight"), kd, d)?,
                qkv_bias,
                qk_norm,
                o: matrix(&g, &n("attn_output.weight"), d, qd)?,
                ffn_norm: vector(&g, &n("ffn_norm.weight"), d)?,
                gate,
                up,
                down,
                moe,
                post_norms: if def.post_norms {
                    Some((
                        vector(&g, &n("post_attention_norm.weight"), d)?,
                        vector(&g, &n("post_ffw_norm.weight"), d)?,
                    ))
                } else {
                    None
                },
            });
        }
        let output_norm = vector(&g, "output_norm.weight", d)?;
        let output = if g.tensor("output.weight").is_some() {
            matrix(&g, "output.weight", c.vocab_size, d)?
        } else {
            embedding.clone()
        };
        let rope_freqs = match g.tensor("rope_freqs.weight") {
            Some(_) => {
                let f = vector(&g, "rope_freqs.weight", c.head_dim / 2)?;
                if f.iter().any(|&x| !(x.is_finite() && x > 0.0)) {
                    return Err(Error::Model(
                        "rope_freqs.weight holds a value that is not a positive number".into(),
                    ));
                }
                Some(f)
            }
            None => None,
        };
        Ok(Model {
            rope_freqs,
            config: c,
            gguf: g,
            embedding,
            layers,
            output_norm,
            output,
        })
    }

    /// Bytes of weights as stored (what the mmap brings into memory).
    pub fn weight_bytes(&self) -> u64 {
        self.gguf.tensors.iter().map(|t| t.bytes).sum()
    }
}
