//! Random-weight GGUF models: tiny ones for fast tests, written by the tests themselves.

use crate::gguf::{Array, TensorType, Value, Writer};
use crate::weights::quantize;
use rand::{Rng, SeedableRng};

/// Shape and types of a synthetic model.
#[derive(Debug, Clone)]
pub struct SynthSpec {
    pub arch: &'static str,
    pub n_layer: usize,
    pub dim: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub ffn_dim: usize,
    pub ctx: usize,
    /// Types of (attn_q/k, attn_v, attn_output, ffn_gate/up, ffn_down, token_embd, output).
    pub types: [TensorType; 7],
    /// Llama-style models without `output.weight` use the embedding as LM head.
    pub tied_embeddings: bool,
    /// Head size when it is not dim / n_head (written as `key_length` / `value_length`, as
    /// llama.cpp's converter does for Qwen3).
    pub head_dim: Option<usize>,
    /// RoPE base, and whether to write Llama 3.1's `rope_freqs.weight` frequency divisors.
    pub rope_base: f32,
    pub rope_freqs: bool,
    /// Gemma 3: the sliding window of the local layers (every 6th layer is global) and their RoPE
    /// base (`rope.freq_base_swa`; llama.cpp's default 10000 when not written), and the final
    /// logits' soft-capping.
    pub sliding_window: Option<usize>,
    pub rope_base_swa: Option<f32>,
    pub softcap: Option<f32>,
    /// Qwen3-MoE: (experts, experts used per token); `ffn_dim` is then one expert's.
    pub experts: Option<(usize, usize)>,
    /// An embedding model's `pooling_type` (1 mean, 2 cls, 3 last) and `add_eos_token`, as
    /// Qwen3-Embedding's file sets them.
    pub pooling: Option<u32>,
    pub add_eos: bool,
    pub seed: u64,
}

impl SynthSpec {
    /// A tiny Qwen2-style model covering Q4_K, Q6_K, Q5_0, Q8_0 and Q4_1 kernels.
    pub fn tiny_qwen2() -> Self {
        SynthSpec {
            arch: "qwen2",
            n_layer: 2,
            dim: 256,
            n_head: 4,
            n_kv_head: 2,
            ffn_dim: 512,
            ctx: 512,
            types: [
                TensorType::Q4K,
                TensorType::Q6K,
                TensorType::Q5_0,
                TensorType::Q4K,
                TensorType::Q8_0,
                TensorType::Q4_1,
                TensorType::Q6K,
            ],
            tied_embeddings: false,
            head_dim: None,
            rope_base: 10000.0,
            rope_freqs: false,
            sliding_window: None,
            rope_base_swa: None,
            softcap: None,
            experts: None,
            pooling: None,
            add_eos: false,
            seed: 1,
        }
    }

    /// A tiny Qwen3-style model: no Q/K/V biases, per-head Q and K norms, and a head size (128)
    /// that is not dim / n_head, so Q is wider than the hidden state (as in Qwen3-4B and larger).
    pub fn tiny_qwen3() -> Self {
        SynthSpec {
            arch: "qwen3",
            head_dim: Some(128),
            types: [
                TensorType::Q8_0,
                TensorType::Q4K,
                TensorType::F16,
                TensorType::Q4K,
                TensorType::Q6K,
                TensorType::Q8_0,
                TensorType::Q8_0,
            ],
            rope_base: 1_000_000.0,
            seed: 3,
            ..Self::tiny_qwen2()
        }
    }

    /// A tiny Llama 3.1-style model: RoPE base 500000 and `rope_freqs.weight` divisors.
    pub fn tiny_llama3() -> Self {
        SynthSpec {
            rope_base: 500_000.0,
            rope_freqs: true,
            tied_embeddings: false,
            types: [
                TensorType::Q4K,
                TensorType::Q6K,
                TensorType::Q8_0,
                TensorType::Q4K,
                TensorType::Q4K,
                TensorType::Q8_0,
                TensorType::Q6K,
            ],
            seed: 4,
            ..Self::tiny_llama()
        }
    }

    /// A tiny Gemma 3-style model: six layers (five with a sliding window of 8 positions and RoPE
    /// base 100, so that it shows within 8 positions; one global with base 1e6), per-head Q/K norms, norms after attention and after
    /// the FFN, GeGLU, the embedding scaled by sqrt(dim), a head size (128) that is not dim / n_head,
    /// tied embeddings, and logit soft-capping (at 3, low enough to show on these logits; Gemma 2
    /// used 30, and Gemma 3 files may set it).
    pub fn tiny_gemma3() -> Self {
        SynthSpec {
            arch: "gemma3",
            n_layer: 6,
            head_dim: Some(128),
            rope_base: 1_000_000.0,
            tied_embeddings: true,
            sliding_window: Some(8),
            rope_base_swa: Some(100.0),
            softcap: Some(3.0),
            types: [
                TensorType::Q5_0,
                TensorType::Q8_0,
                TensorType::Q4K,
                TensorType::Q5_0,
                TensorType::Q6K,
                TensorType::Q8_0,
                TensorType::Q8_0,
            ],
            seed: 5,
            ..Self::tiny_qwen2()
        }
    }

    /// A tiny Qwen3-MoE model: Qwen3's attention, and FFNs of 8 experts (256 wide), 3 routed per
    /// token by an F32 router (as in the real files).
    pub fn tiny_qwen3moe() -> Self {
        SynthSpec {
            arch: "qwen3moe",
            ffn_dim: 256,
            experts: Some((8, 3)),
            types: [
                TensorType::Q8_0,
                TensorType::Q6K,
                TensorType::Q4K,
                TensorType::Q4K,
                TensorType::Q6K,
                TensorType::Q8_0,
                TensorType::Q8_0,
            ],
            seed: 6,
            ..Self::tiny_qwen3()
        }
    }

    /// A tiny Qwen3-Embedding-style model: Qwen3 with `pooling_type` last and an EOS appended to
    /// each input (`add_eos_token`), as the real embedding files set them.
    pub fn tiny_qwen3_embed() -> Self {
        SynthSpec {
            pooling: Some(3),
            add_eos: true,
            seed: 7,
            ..Self::tiny_qwen3()
        }
    }

    /// The same architecture at the smallest shape (one layer, d = 64, mixed types): the fuzzers'
    /// seeds and the malformed-file cases start from it.
    pub fn micro(self) -> Self {
        SynthSpec {
            n_layer: 1,
            dim: 64,
            n_head: 2,
            n_kv_head: 1,
            ffn_dim: 128,
            ctx: 64,
            types: [
                TensorType::Q8_0,
                TensorType::Q4_0,
                TensorType::Q5_0,
                TensorType::Q8_0,
                TensorType::F16,
                TensorType::Q8_0,
                TensorType::Q4_1,
            ],
            ..self
        }
    }

    /// The tiny model of an architecture, by name: qwen2, qwen3, qwen3moe, llama, llama3, gemma3, and
    /// qwen3-embed (Qwen3 as an embedding model).
    pub fn tiny(arch: &str) -> Option<Self> {
        match arch {
            "qwen2" => Some(Self::tiny_qwen2()),
            "qwen3" => Some(Self::tiny_qwen3()),
            "llama" => Some(Self::tiny_llama()),
            "llama3" => Some(Self::tiny_llama3()),
            "gemma3" => Some(Self::tiny_gemma3()),
            "qwen3moe" => Some(Self::tiny_qwen3moe()),
            "qwen3-embed" => Some(Self::tiny_qwen3_embed()),
            _ => None,
        }
    }

    /// A tiny Llama-style model (no biases, tied embeddings, normal RoPE).
    pub fn tiny_llama() -> Self {
        SynthSpec {
            arch: "llama",
            types: [
                TensorType::Q4_0,
                TensorType::Q8_0,
                TensorType::F16,
                TensorType::Q5_0,
                TensorType::F32,
                TensorType::Q8_0,
                TensorType::Q8_0,
            ],
            tied_embeddings: true,
            seed: 2,
            ..Self::tiny_qwen2()
        }
    }
}

/// The vocabulary of synthetic models: the 256 byte-level tokens, a few merges, and ChatML specials.
pub fn synth_vocab() -> (Vec<String>, Vec<String>, Vec<i64>) {
    let mut tokens: Vec<String> = crate::tokenizer::byte_chars()
        .iter()
        .map(|c| c.to_string())
        .collect();
    let merges = vec![
        "Ġ t".to_string(),
        "h e".to_string(),
        "Ġt he".to_string(),
        "i n".to_string(),
    ];
    tokens.extend(["Ġt", "he", "Ġthe", "in"].map(String::from));
    let mut types = vec![1i64; tokens.len()];
    for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        tokens.push(s.to_string());
        types.push(3);
    }
    (tokens, merges, types)
}

/// The byte-level BPE vocabulary (Qwen2 pre-tokenizer), end of sequence = the last token, and the
/// ChatML template: the tokenizer metadata every synthetic model carries.
fn byte_level_vocab(w: &mut Writer, tokens: Vec<String>, merges: Vec<String>, types: Vec<i64>) {
    let eos = tokens.len() as u32 - 1;
    w.kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", Value::String("qwen2".into()))
        .kv(
            "tokenizer.ggml.tokens",
            Value::Array(Array::Strings(tokens)),
        )
        .kv(
            "tokenizer.ggml.merges",
            Value::Array(Array::Strings(merges)),
        )
        .kv(
            "tokenizer.ggml.token_type",
            Value::Array(Array::Ints(types)),
        )
        .kv("tokenizer.ggml.eos_token_id", Value::U32(eos))
        .kv(
            "tokenizer.chat_template",
            Value::String(CHATML_TEMPLATE.into()),
        );
}

const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A GGUF file (as bytes) with random weights of the given shape.
pub fn synth_model(spec: &SynthSpec) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    let (tokens, merges, types) = synth_vocab();
    let vocab = tokens.len();
    // Pad the vocabulary rows to whole blocks for every type.
    let vocab_rows = vocab;
    let hd = spec.head_dim.unwrap_or(spec.dim / spec.n_head);
    let (qd, kd) = (spec.n_head * hd, spec.n_kv_head * hd);
    let a = spec.arch;
    let mut w = Writer::new();
    w.kv("general.architecture", Value::String(a.into()))
        .kv("general.name", Value::String(format!("synthetic {a}")))
        .kv(&format!("{a}.block_count"), Value::U32(spec.n_layer as u32))
        .kv(
            &format!("{a}.embedding_length"),
            Value::U32(spec.dim as u32),
        )
        .kv(
            &format!("{a}.attention.head_count"),
            Value::U32(spec.n_head as u32),
        )
        .kv(
            &format!("{a}.attention.head_count_kv"),
            Value::U32(spec.n_kv_head as u32),
        )
        .kv(
            &format!("{a}.feed_forward_length"),
            Value::U32(spec.ffn_dim as u32),
        )
        .kv(&format!("{a}.context_length"), Value::U32(spec.ctx as u32))
        .kv(
            &format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-6),
        )
        .kv(&format!("{a}.rope.freq_base"), Value::F32(spec.rope_base))
        .kv("tokenizer.ggml.bos_token_id", Value::U32(vocab as u32 - 3));
    if let Some(win) = spec.sliding_window {
        w.kv(
            &format!("{a}.attention.sliding_window"),
            Value::U32(win as u32),
        );
    }
    if let Some((n, used)) = spec.experts {
        w.kv(&format!("{a}.expert_count"), Value::U32(n as u32))
            .kv(&format!("{a}.expert_used_count"), Value::U32(used as u32))
            .kv(
                &format!("{a}.expert_feed_forward_length"),
                Value::U32(spec.ffn_dim as u32),
            );
    }
    if let Some(b) = spec.rope_base_swa {
        w.kv(&format!("{a}.rope.freq_base_swa"), Value::F32(b));
    }
    if let Some(c) = spec.softcap {
        w.kv(&format!("{a}.final_logit_softcapping"), Value::F32(c));
    }
    if let Some(p) = spec.pooling {
        w.kv(&format!("{a}.pooling_type"), Value::U32(p));
    }
    if spec.add_eos {
        w.kv("tokenizer.ggml.add_eos_token", Value::Bool(true));
    }
    if spec.head_dim.is_some() {
        w.kv(&format!("{a}.attention.key_length"), Value::U32(hd as u32))
            .kv(
                &format!("{a}.attention.value_length"),
                Value::U32(hd as u32),
            );
    }
    byte_level_vocab(&mut w, tokens, merges, types);

    let mut mat =
        |w: &mut Writer, name: &str, rows: usize, cols: usize, t: TensorType, scale: f32| {
            let x: Vec<f32> = (0..rows * cols)
                .map(|_| rng.gen_range(-scale..scale))
                .collect();
            let experts = spec.experts.map_or(1, |e| e.0);
            let dims: &[u64] = if rows == 1 {
                &[cols as u64]
            } else if name.ends_with("_exps.weight") {
                // Every expert's matrix stacked: [cols, rows / experts, experts].
                &[cols as u64, (rows / experts) as u64, experts as u64]
            } else {
                &[cols as u64, rows as u64]
            };
            w.tensor(name, dims, t, quantize(t, &x));
        };
    let [t_qk, t_v, t_o, t_gu, t_down, t_emb, t_out] = spec.types;
    let d = spec.dim;
    let mut norm_rng = rand::rngs::StdRng::seed_from_u64(spec.seed ^ 0x5eed);
    // Gemma multiplies the embedding by sqrt(dim): smaller values keep the layers' share visible.
    let emb_scale = if a == "gemma3" { 0.25 } else { 1.0 };
    mat(&mut w, "token_embd.weight", vocab_rows, d, t_emb, emb_scale);
    if spec.rope_freqs {
        // Divisors from 1 (the fastest pair) to 8 (the slowest), as Llama 3.1's range, linear so
        // that pairs which turn noticeably within a short test prompt are moved too.
        let f: Vec<f32> = (0..hd / 2)
            .map(|i| 1.0 + 7.0 * i as f32 / (hd / 2 - 1) as f32)
            .collect();
        w.tensor(
            "rope_freqs.weight",
            &[hd as u64 / 2],
            TensorType::F32,
            quantize(TensorType::F32, &f),
        );
    }
    let ws = 1.0 / (d as f32).sqrt();
    for i in 0..spec.n_layer {
        let n = |s: &str| format!("blk.{i}.{s}");
        let ones = |len: usize| quantize(TensorType::F32, &vec![1.0f32; len]);
        w.tensor(
            &n("attn_norm.weight"),
            &[d as u64],
            TensorType::F32,
            ones(d),
        );
        w.tensor(&n("ffn_norm.weight"), &[d as u64], TensorType::F32, ones(d));
        mat(&mut w, &n("attn_q.weight"), qd, d, t_qk, ws * 2.0);
        mat(&mut w, &n("attn_k.weight"), kd, d, t_qk, ws * 2.0);
        mat(&mut w, &n("attn_v.weight"), kd, d, t_v, ws);
        if a == "qwen2" {
            mat(&mut w, &n("attn_q.bias"), 1, qd, TensorType::F32, 0.1);
            mat(&mut w, &n("attn_k.bias"), 1, kd, TensorType::F32, 0.1);
            mat(&mut w, &n("attn_v.bias"), 1, kd, TensorType::F32, 0.1);
        }
        // Norm weights around 1, so that a norm applied with the wrong weights shows.
        let mut norm = |w: &mut Writer, t: &str, len: usize| {
            let g: Vec<f32> = (0..len).map(|_| norm_rng.gen_range(0.5..1.5)).collect();
            w.tensor(
                &n(t),
                &[len as u64],
                TensorType::F32,
                quantize(TensorType::F32, &g),
            );
        };
        if a == "qwen3" || a == "qwen3moe" || a == "gemma3" {
            norm(&mut w, "attn_q_norm.weight", hd);
            norm(&mut w, "attn_k_norm.weight", hd);
        }
        if a == "gemma3" {
            norm(&mut w, "post_attention_norm.weight", d);
            norm(&mut w, "post_ffw_norm.weight", d);
        }
        mat(&mut w, &n("attn_output.weight"), d, qd, t_o, ws);
        if let Some((ne, _)) = spec.experts {
            // The router (F32, logits a few units apart so that routing is decisive) and every
            // expert's matrices stacked in 3-D tensors, as llama.cpp's converter writes them.
            let f = spec.ffn_dim;
            mat(
                &mut w,
                &n("ffn_gate_inp.weight"),
                ne,
                d,
                TensorType::F32,
                8.0 * ws,
            );
            mat(&mut w, &n("ffn_gate_exps.weight"), ne * f, d, t_gu, ws);
            mat(&mut w, &n("ffn_up_exps.weight"), ne * f, d, t_gu, ws);
            // Four times the dense scale, so that the experts' share of the output shows.
            let down = 4.0 / (f as f32).sqrt();
            mat(&mut w, &n("ffn_down_exps.weight"), ne * d, f, t_down, down);
            continue;
        }
        // Gemma's gate is wider, so that GELU and SiLU differ visibly on it.
        let gate_scale = if a == "gemma3" { 4.0 * ws } else { ws };
        mat(
            &mut w,
            &n("ffn_gate.weight"),
            spec.ffn_dim,
            d,
            t_gu,
            gate_scale,
        );
        mat(&mut w, &n("ffn_up.weight"), spec.ffn_dim, d, t_gu, ws);
        mat(
            &mut w,
            &n("ffn_down.weight"),
            d,
            spec.ffn_dim,
            t_down,
            1.0 / (spec.ffn_dim as f32).sqrt(),
        );
    }
    w.tensor(
        "output_norm.weight",
        &[d as u64],
        TensorType::F32,
        quantize(TensorType::F32, &vec![1.0f32; d]),
    );
    if !spec.tied_embeddings {
        mat(&mut w, "output.weight", vocab_rows, d, t_out, 1.0);
    }
    w.to_bytes()
}

/// A Qwen2.5 shape (or Qwen3-Coder-30B-A3B's, a Qwen3-MoE), for random-weight models of real
/// sizes in llama.cpp's Q4_K_M layout.
#[derive(Debug, Clone)]
pub struct QwenShape {
    pub name: &'static str,
    pub n_layer: usize,
    pub dim: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    /// One expert's width in a mixture-of-experts shape.
    pub ffn_dim: usize,
    pub vocab: usize,
    /// Qwen3-MoE: (experts, experts used per token) and the head size; a dense Qwen2 when None.
    pub moe: Option<(usize, usize, usize)>,
}

impl QwenShape {
    pub const ALL: [QwenShape; 4] = [
        QwenShape {
            name: "0.5b",
            n_layer: 24,
            dim: 896,
            n_head: 14,
            n_kv_head: 2,
            ffn_dim: 4864,
            vocab: 151936,
            moe: None,
        },
        QwenShape {
            name: "1.5b",
            n_layer: 28,
            dim: 1536,
            n_head: 12,
            n_kv_head: 2,
            ffn_dim: 8960,
            vocab: 151936,
            moe: None,
        },
        QwenShape {
            name: "7b",
            n_layer: 28,
            dim: 3584,
            n_head: 28,
            n_kv_head: 4,
            ffn_dim: 18944,
            vocab: 152064,
            moe: None,
        },
        // Qwen3-Coder-30B-A3B: 128 experts of 768, 8 a token, head size 128.
        QwenShape {
            name: "30b-a3b",
            n_layer: 48,
            dim: 2048,
            n_head: 32,
            n_kv_head: 4,
            ffn_dim: 768,
            vocab: 151936,
            moe: Some((128, 8, 128)),
        },
    ];

    pub fn by_name(name: &str) -> Option<QwenShape> {
        Self::ALL
            .iter()
            .find(|s| s.name.eq_ignore_ascii_case(name))
            .cloned()
    }
}

/// The type llama.cpp's Q4_K_M quantizer gives a weight: `wide` = a Q6_K tensor (output, and
/// attn_v / ffn_down in the layers the rule picks), else Q4_K; rows (`cols` values) that are not a
/// multiple of 256 fall back to Q8_0 and Q5_0.
pub fn q4_k_m_type(wide: bool, cols: usize) -> TensorType {
    match (wide, cols.is_multiple_of(256)) {
        (true, true) => TensorType::Q6K,
        (true, false) => TensorType::Q8_0,
        (false, true) => TensorType::Q4K,
        (false, false) => TensorType::Q5_0,
    }
}

/// Whether attn_v and ffn_down of layer `i` (of `n`) are Q6_K under Q4_K_M.
pub fn q4_k_m_wide_layer(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i >= n / 8 && (i - n / 8) % 3 == 2)
}

/// Random blocks of type `t` for `rows` × `cols` values: random quants, small fixed scales (so that
/// activations stay finite through every layer) whose sign alternates from block to block. Fast:
/// no quantization of f32 data.
///
/// Q4_K blocks are made zero-mean (below), and the alternating sign cancels the others' small mean
/// (random Q5_0 quants average -0.5 d). With a mean, every row carries the same component, the
/// residual stream grows along the all-ones direction layer after layer, and the model sits near
/// an instability: at one token, two CPU kernel sets that differ only by f32 rounding parted from
/// layer 9 on and ended with residuals of 2,939 and 748 (an f64 reference: 3,893), so GPU-against-
/// CPU checks on such a file measured the file, not the engines.
fn random_blocks(t: TensorType, rows: usize, cols: usize, rng: &mut impl Rng) -> Vec<u8> {
    let (block, bytes) = match t {
        TensorType::Q4K => (256, 144),
        TensorType::Q6K => (256, 210),
        TensorType::Q5_0 => (32, 22),
        TensorType::Q8_0 => (32, 34),
        _ => unreachable!("Q4_K_M uses Q4_K, Q6_K, Q5_0, Q8_0 for weights"),
    };
    let n = rows * cols / block;
    let mut out = vec![0u8; n * bytes];
    rng.fill(&mut out[..]);
    let f16 = |x: f32| half::f16::from_f32(x).to_le_bytes();
    for (i, b) in out.chunks_exact_mut(bytes).enumerate() {
        let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
        match t {
            TensorType::Q4K => {
                // Each sub-block's min equal to its scale, and dmin = 7.5 d: d·sc·q − dmin·m
                // averages zero over q in 0..15. (Scale j and min j are 6-bit fields packed in
                // bytes 4..16: bytes 4..8 repeated in 8..12, both nibbles of 12..16 equal.)
                b[0..2].copy_from_slice(&f16(sign * 1e-4));
                b[2..4].copy_from_slice(&f16(sign * 7.5e-4));
                let (lo, hi) = b[4..16].split_at_mut(4);
                hi[..4].copy_from_slice(lo);
                for v in &mut hi[4..8] {
                    *v = (*v & 0x0F) | (*v << 4);
                }
            }
            TensorType::Q6K => b[208..210].copy_from_slice(&f16(sign * 1e-4)),
            TensorType::Q5_0 => b[0..2].copy_from_slice(&f16(sign * 4e-3)),
            _ => b[0..2].copy_from_slice(&f16(sign * 8e-4)),
        }
    }
    out
}

/// A GGUF writer holding a random-weight Qwen2 model of `shape` in llama.cpp's Q4_K_M layout, with a
/// vocabulary of the right size (byte tokens, fillers, ChatML specials) and the ChatML template.
pub fn synth_q4_k_m(shape: &QwenShape, seed: u64) -> Writer {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let v = shape.vocab;
    let mut tokens: Vec<String> = crate::tokenizer::byte_chars()
        .iter()
        .map(|c| c.to_string())
        .collect();
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    let fillers = v - tokens.len() - specials.len();
    tokens.extend((0..fillers).map(|i| format!("<|synth_{i}|>")));
    let mut types = vec![1i64; tokens.len()];
    for s in specials {
        tokens.push(s.to_string());
        types.push(3);
    }
    let d = shape.dim;
    let hd = shape.moe.map_or(d / shape.n_head, |m| m.2);
    let (qd, kd) = (shape.n_head * hd, shape.n_kv_head * hd);
    let (a, title) = match shape.moe {
        None => ("qwen2", "Qwen2.5"),
        Some(_) => ("qwen3moe", "Qwen3-MoE"),
    };
    let k = |s: &str| format!("{a}.{s}");
    let mut w = Writer::new();
    w.kv("general.architecture", Value::String(a.into()))
        .kv(
            "general.name",
            Value::String(format!("synthetic {title} {} Q4_K_M", shape.name)),
        )
        .kv("general.file_type", Value::U32(15))
        .kv(&k("block_count"), Value::U32(shape.n_layer as u32))
        .kv(&k("context_length"), Value::U32(32768))
        .kv(&k("embedding_length"), Value::U32(d as u32))
        .kv(&k("feed_forward_length"), Value::U32(shape.ffn_dim as u32))
        .kv(&k("attention.head_count"), Value::U32(shape.n_head as u32))
        .kv(
            &k("attention.head_count_kv"),
            Value::U32(shape.n_kv_head as u32),
        )
        .kv(&k("rope.freq_base"), Value::F32(1e6))
        .kv(&k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6));
    if let Some((experts, used, _)) = shape.moe {
        w.kv(&k("attention.key_length"), Value::U32(hd as u32))
            .kv(&k("attention.value_length"), Value::U32(hd as u32))
            .kv(&k("expert_count"), Value::U32(experts as u32))
            .kv(&k("expert_used_count"), Value::U32(used as u32))
            .kv(
                &k("expert_feed_forward_length"),
                Value::U32(shape.ffn_dim as u32),
            );
    }
    w.kv("tokenizer.ggml.padding_token_id", Value::U32(v as u32 - 3))
        .kv("tokenizer.ggml.add_bos_token", Value::Bool(false));
    byte_level_vocab(&mut w, tokens, vec![], types);
    // A matrix, or `n` of them stacked (an expert tensor: dims [cols, rows, n]).
    let stacked =
        |w: &mut Writer, rng: &mut rand::rngs::StdRng, name: &str, rows, cols, wide, n| {
            let t = q4_k_m_type(wide, cols);
            let data = random_blocks(t, n * rows, cols, rng);
            let dims = [cols as u64, rows as u64, n as u64];
            w.tensor(name, &dims[..if n > 1 { 3 } else { 2 }], t, data);
        };
    let mut mat = |w: &mut Writer, name: &str, rows: usize, cols: usize, wide: bool| {
        stacked(w, &mut rng, name, rows, cols, wide, 1)
    };
    let f32s = |x: f32, n: usize| quantize(TensorType::F32, &vec![x; n]);
    let mut router_rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x9e37);
    mat(&mut w, "token_embd.weight", v, d, false);
    for i in 0..shape.n_layer {
        let n = |s: &str| format!("blk.{i}.{s}");
        let wide = q4_k_m_wide_layer(i, shape.n_layer);
        w.tensor(
            &n("attn_norm.weight"),
            &[d as u64],
            TensorType::F32,
            f32s(1.0, d),
        );
        mat(&mut w, &n("attn_q.weight"), qd, d, false);
        mat(&mut w, &n("attn_k.weight"), kd, d, false);
        mat(&mut w, &n("attn_v.weight"), kd, d, wide);
        if shape.moe.is_none() {
            for (b, len) in [
                ("attn_q.bias", qd),
                ("attn_k.bias", kd),
                ("attn_v.bias", kd),
            ] {
                w.tensor(&n(b), &[len as u64], TensorType::F32, f32s(0.0, len));
            }
        } else {
            for b in ["attn_q_norm.weight", "attn_k_norm.weight"] {
                w.tensor(&n(b), &[hd as u64], TensorType::F32, f32s(1.0, hd));
            }
        }
        mat(&mut w, &n("attn_output.weight"), d, qd, false);
        w.tensor(
            &n("ffn_norm.weight"),
            &[d as u64],
            TensorType::F32,
            f32s(1.0, d),
        );
        let f = shape.ffn_dim;
        match shape.moe {
            None => {
                mat(&mut w, &n("ffn_gate.weight"), f, d, false);
                mat(&mut w, &n("ffn_up.weight"), f, d, false);
                mat(&mut w, &n("ffn_down.weight"), d, f, wide);
            }
            Some((e, _, _)) => {
                // An F32 router (as the real files keep it) whose logits spread by about 1 on a
                // normed input, so that tokens pick different experts.
                let router: Vec<f32> = (0..e * d)
                    .map(|_| router_rng.gen_range(-0.035..0.035))
                    .collect();
                w.tensor(
                    &n("ffn_gate_inp.weight"),
                    &[d as u64, e as u64],
                    TensorType::F32,
                    quantize(TensorType::F32, &router),
                );
                let r = &mut router_rng;
                stacked(&mut w, r, &n("ffn_gate_exps.weight"), f, d, false, e);
                stacked(&mut w, r, &n("ffn_up_exps.weight"), f, d, false, e);
                stacked(&mut w, r, &n("ffn_down_exps.weight"), d, f, wide, e);
            }
        }
    }
    w.tensor(
        "output_norm.weight",
        &[d as u64],
        TensorType::F32,
        f32s(1.0, d),
    );
    mat(&mut w, "output.weight", v, d, true);
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Storage;
    use crate::weights::QTensor;
    use std::sync::Arc;

    /// The Qwen3-MoE layout of `synth_q4_k_m` (the `30b-a3b` shape's, at a small size) loads as
    /// a Qwen3-MoE with its experts, and its tokens are routed to different experts: a prompt's
    /// logits are finite and differ between two prompts.
    #[test]
    fn moe_shape_loads_and_runs() {
        let shape = QwenShape {
            name: "tiny-moe",
            n_layer: 2,
            dim: 256,
            n_head: 4,
            n_kv_head: 2,
            ffn_dim: 256,
            vocab: 512,
            moe: Some((8, 2, 64)),
        };
        let mut bytes = Vec::new();
        synth_q4_k_m(&shape, 3).write_to(&mut bytes).unwrap();
        let g = crate::gguf::Gguf::from_bytes(bytes).unwrap();
        let m = Arc::new(crate::model::Model::from_gguf(g).unwrap());
        let c = &m.config;
        assert_eq!(c.arch, crate::model::Arch::Qwen3Moe);
        assert_eq!(c.experts.map(|x| (x.n_expert, x.n_used)), Some((8, 2)));
        assert_eq!((c.head_dim, c.ffn_dim), (64, 256));
        let mut s = crate::cpu::Session::new(m, Default::default()).unwrap();
        let mut last = Vec::new();
        for prompt in [[1u32, 2, 3], [300, 301, 302]] {
            s.reset();
            s.forward(&prompt, crate::runner::Logits::Last).unwrap();
            let l = s.logits().to_vec();
            assert!(l.iter().all(|v| v.is_finite()));
            assert_ne!(l, last);
            last = l;
        }
    }

    /// The random weights of the real-shape files have no mean worth the name: for every type the
    /// generator writes, the mean of a tensor's values is under 2% of their spread (random
    /// fluctuation alone: 0.3%; before the fix, Q5_0 stood at 5%), and so is the mean of every run
    /// of 256 values. With a mean, the residual stream of a deep model grows along one direction
    /// and the file sits near an instability (see `random_blocks`).
    #[test]
    fn random_weights_have_zero_mean() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for t in [
            TensorType::Q4K,
            TensorType::Q6K,
            TensorType::Q5_0,
            TensorType::Q8_0,
        ] {
            let (rows, cols) = (64, 1536);
            let data = random_blocks(t, rows, cols, &mut rng);
            let len = data.len();
            let w = QTensor::new(t, rows, cols, Arc::new(Storage::Bytes(data)), 0, len).unwrap();
            let mut all = vec![0f32; rows * cols];
            for (r, row) in all.chunks_exact_mut(cols).enumerate() {
                w.dequantize_row(r, row);
            }
            let n = all.len() as f64;
            let mean = all.iter().map(|&v| v as f64).sum::<f64>() / n;
            let sd = (all.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
            assert!(
                sd > 0.0 && (mean / sd).abs() < 0.02,
                "{t:?}: mean {mean:.3e}, spread {sd:.3e}"
            );
            // Nor has any run of 256 values (random fluctuation: 6% of the spread; Q4_K blocks
            // with random mins, whatever their sign: 70%).
            let chunk = all
                .chunks_exact(256)
                .map(|c| (c.iter().map(|&v| v as f64).sum::<f64>() / 256.0).powi(2))
                .sum::<f64>()
                / (all.len() / 256) as f64;
            let ratio = chunk.sqrt() / sd;
            assert!(
                ratio < 0.2,
                "{t:?}: 256-value means at {ratio:.3} of the spread"
            );
        }
    }
}
