//! Heap allocations per decode step, counted by a counting global allocator (one test in this binary,
//! so that nothing else allocates while it counts).

use mens::cpu::{Session, SessionOptions};
use mens::gguf::Gguf;
use mens::model::Model;
use mens::runner::{Logits, Runner};
use mens::sample::{Sampler, SamplerConfig};
use mens::synth::{synth_model, SynthSpec};
use std::sync::Arc;

#[global_allocator]
static GLOBAL: mens::alloc::Counting = mens::alloc::Counting;

/// A steady decode step (forward of one token + sampling, greedy and with temperature) allocates nothing.
#[test]
fn decode_step_allocates_nothing() {
    // A Q4_K embedding as in the real Q4_K_M files (one row is dequantized every step).
    let mut spec = SynthSpec::tiny_qwen2();
    spec.types[5] = mens::gguf::TensorType::Q4K;
    for spec in [
        spec,
        SynthSpec::tiny_llama(),
        SynthSpec::tiny_gemma3(),
        SynthSpec::tiny_qwen3moe(),
    ] {
        steady_steps_allocate_nothing(&spec);
    }
}

fn steady_steps_allocate_nothing(spec: &SynthSpec) {
    let model = Arc::new(Model::from_gguf(Gguf::from_bytes(synth_model(spec)).unwrap()).unwrap());
    let vocab = model.config.vocab_size;
    let mut s = Session::new(
        model,
        SessionOptions {
            ctx: 256,
            batch: 64,
            logit_rows: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let mut greedy = Sampler::new(SamplerConfig::greedy(), vocab).unwrap();
    let mut warm = Sampler::new(
        SamplerConfig {
            repeat_penalty: 1.1,
            ..Default::default()
        },
        vocab,
    )
    .unwrap();
    s.forward(&[1, 2, 3, 4, 5, 6, 7, 8], Logits::Last).unwrap();
    for _ in 0..4 {
        let t = s.sample(&mut warm).unwrap();
        s.forward(&[t], Logits::Last).unwrap();
    }
    let before = mens::alloc::allocations();
    let steps = 32;
    for i in 0..steps {
        let sampler = if i % 2 == 0 { &mut greedy } else { &mut warm };
        let t = s.sample(sampler).unwrap();
        s.forward(&[t], Logits::Last).unwrap();
    }
    let n = mens::alloc::allocations() - before;
    eprintln!(
        "{}: heap allocations in {steps} decode steps: {n}",
        spec.arch
    );
    assert_eq!(n, 0, "{n} heap allocations in {steps} decode steps");
}
