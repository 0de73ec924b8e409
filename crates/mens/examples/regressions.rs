//! Writes the malformed-file cases kept in `fuzz/regressions/` (beside the fuzzers' seeds): each
//! `reject-*.gguf` must be refused with an error, never a panic; the test suite replays them all
//! (`crates/mens/tests/malformed.rs`). `cargo run --release --example regressions` (from the
//! repository root).
use mens::synth::{synth_model, SynthSpec};

fn main() {
    let qwen2 = synth_model(&SynthSpec::tiny_qwen2().micro());
    let qwen3 = synth_model(&SynthSpec {
        head_dim: Some(64),
        ..SynthSpec::tiny_qwen3().micro()
    });
    mens::load_untrusted(&qwen2).expect("the base file loads");
    mens::load_untrusted(&qwen3).expect("the base file loads");
    let put = |b: &[u8], at: usize, v: &[u8]| {
        let mut b = b.to_vec();
        b[at..at + v.len()].copy_from_slice(v);
        b
    };
    // GGUF: magic (4), version (4), tensor count (8), key-value count (8), then the first key's
    // length (8) and bytes, its value type (4), its value.
    let first_key = u64::from_le_bytes(qwen2[24..32].try_into().unwrap()) as usize;
    let first_type = 32 + first_key;
    // A hyperparameter that contradicts the tensors: a value head size of 1000 beside keys of 64
    // (the class of the RoPE-dimension bug: such a file loaded and ran before it was checked).
    let key = b"qwen3.attention.value_length";
    let at = qwen3
        .windows(key.len())
        .position(|w| w == key)
        .expect("the key is written")
        + key.len()
        + 4;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("reject-truncated-8.gguf", qwen2[..8].to_vec()),
        ("reject-truncated-header.gguf", qwen2[..30].to_vec()),
        (
            "reject-truncated-half.gguf",
            qwen2[..qwen2.len() / 2].to_vec(),
        ),
        (
            "reject-truncated-last-byte.gguf",
            qwen2[..qwen2.len() - 1].to_vec(),
        ),
        ("reject-bad-magic.gguf", put(&qwen2, 0, b"GGUG")),
        (
            "reject-version-99.gguf",
            put(&qwen2, 4, &99u32.to_le_bytes()),
        ),
        (
            "reject-tensor-count-huge.gguf",
            put(&qwen2, 8, &u64::MAX.to_le_bytes()),
        ),
        (
            "reject-kv-count-huge.gguf",
            put(&qwen2, 16, &u64::MAX.to_le_bytes()),
        ),
        (
            "reject-key-length-huge.gguf",
            put(&qwen2, 24, &u64::MAX.to_le_bytes()),
        ),
        (
            "reject-value-type-99.gguf",
            put(&qwen2, first_type, &99u32.to_le_bytes()),
        ),
        (
            "reject-value-length-contradicts.gguf",
            put(&qwen3, at, &1000u32.to_le_bytes()),
        ),
    ];
    for (name, bytes) in cases {
        let e = mens::load_untrusted(&bytes).expect_err(name);
        std::fs::write(format!("fuzz/regressions/{name}"), &bytes).unwrap();
        println!("fuzz/regressions/{name}: {} bytes: {e}", bytes.len());
    }
}
