//! Writes the fuzzing seed corpus: small valid GGUF models (Qwen2 and Llama shapes) with a tokenizer
//! and chat template. `cargo run --release --example seeds` (from the repository root).
use mens::synth::{synth_model, SynthSpec};

fn main() {
    std::fs::create_dir_all("fuzz/seeds").unwrap();
    for (name, spec) in [
        ("micro-qwen2.gguf", SynthSpec::tiny_qwen2().micro()),
        ("micro-llama.gguf", SynthSpec::tiny_llama().micro()),
    ] {
        let bytes = synth_model(&spec);
        mens::load_untrusted(&bytes).expect("seed loads");
        std::fs::write(format!("fuzz/seeds/{name}"), &bytes).unwrap();
        println!("fuzz/seeds/{name}: {} bytes", bytes.len());
    }
}
