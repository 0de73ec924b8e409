//! Random-weight GGUF models: tiny ones for fast tests, written by the tests themselves.

use crate::gguf::{Array, TensorType, Value, Writer};
use crate::kernels::quantize;
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
            seed: 1,
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

const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A GGUF file (as bytes) with random weights of the given shape.
pub fn synth_model(spec: &SynthSpec) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    let (tokens, merges, types) = synth_vocab();
    let vocab = tokens.len();
    // Pad the vocabulary rows to whole blocks for every type.
    let vocab_rows = vocab;
    let hd = spec.dim / spec.n_head;
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
        .kv(&format!("{a}.rope.freq_base"), Value::F32(10000.0))
        .kv("tokenizer.ggml.model", Value::String("gpt2".into()))
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
        .kv("tokenizer.ggml.eos_token_id", Value::U32(vocab as u32 - 1))
        .kv("tokenizer.ggml.bos_token_id", Value::U32(vocab as u32 - 3))
        .kv(
            "tokenizer.chat_template",
            Value::String(CHATML_TEMPLATE.into()),
        );

    let mut mat =
        |w: &mut Writer, name: &str, rows: usize, cols: usize, t: TensorType, scale: f32| {
            let x: Vec<f32> = (0..rows * cols)
                .map(|_| rng.gen_range(-scale..scale))
                .collect();
            let dims: &[u64] = if rows == 1 {
                &[cols as u64]
            } else {
                &[cols as u64, rows as u64]
            };
            w.tensor(name, dims, t, quantize(t, &x));
        };
    let [t_qk, t_v, t_o, t_gu, t_down, t_emb, t_out] = spec.types;
    let d = spec.dim;
    mat(&mut w, "token_embd.weight", vocab_rows, d, t_emb, 1.0);
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
        mat(&mut w, &n("attn_output.weight"), d, qd, t_o, ws);
        mat(&mut w, &n("ffn_gate.weight"), spec.ffn_dim, d, t_gu, ws);
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
