//! Writes the fuzzing seed corpus: small valid GGUF models (Qwen2 and Llama shapes) with a tokenizer
//! and chat template. `cargo run --release --example seeds` (from the repository root).
use mens::gguf::TensorType;
use mens::synth::{synth_model, SynthSpec};

fn main() {
    let micro = |base: SynthSpec| SynthSpec {
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
        ..base
    };
    std::fs::create_dir_all("fuzz/seeds").unwrap();
    for (name, spec) in [
        ("micro-qwen2.gguf", micro(SynthSpec::tiny_qwen2())),
        ("micro-llama.gguf", micro(SynthSpec::tiny_llama())),
    ] {
        let bytes = synth_model(&spec);
        mens::load_untrusted(&bytes).expect("seed loads");
        std::fs::write(format!("fuzz/seeds/{name}"), &bytes).unwrap();
        println!("fuzz/seeds/{name}: {} bytes", bytes.len());
    }
}
