//! The `mens` binary on bad input: a clear message and exit code 2, never a panic.

use mens::synth::{synth_model, SynthSpec};
use std::path::PathBuf;
use std::process::Command;

fn mens() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mens"))
}

fn tmp(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mens-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn tiny() -> PathBuf {
    tmp("tiny.gguf", &synth_model(&SynthSpec::tiny_qwen2()))
}

/// Runs mens, expects exit code 2, no panic, and `want` in stderr.
fn fails_with(args: &[&str], want: &str) {
    let out = mens().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "args {args:?}: stderr {err}");
    assert!(!err.contains("panicked"), "args {args:?} panicked: {err}");
    assert!(
        err.contains(want),
        "args {args:?}: expected {want:?} in {err}"
    );
}

#[test]
fn missing_file() {
    fails_with(
        &["run", "-m", "/nonexistent/model.gguf", "-p", "x"],
        "cannot open /nonexistent/model.gguf",
    );
}

#[test]
fn not_a_gguf_file() {
    let p = tmp("not.gguf", b"this is not a model file at all");
    fails_with(
        &["run", "-m", p.to_str().unwrap(), "-p", "x"],
        "not a GGUF file",
    );
}

#[test]
fn truncated_gguf() {
    let bytes = synth_model(&SynthSpec::tiny_qwen2());
    for cut in [10, 100, 5000, bytes.len() / 2, bytes.len() - 1] {
        let p = tmp(&format!("cut{cut}.gguf"), &bytes[..cut]);
        fails_with(
            &["run", "-m", p.to_str().unwrap(), "-p", "x"],
            "invalid GGUF file",
        );
    }
}

#[test]
fn unknown_architecture() {
    let bytes = synth_model(&SynthSpec::tiny_qwen2());
    // Same length, so the rest of the file stays valid: "qwen2" → "qwenX" in the architecture value.
    let needle = b"general.architecture";
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap()
        + needle.len()
        + 4
        + 8;
    let mut bad = bytes.clone();
    assert_eq!(&bad[at..at + 5], b"qwen2");
    bad[at + 4] = b'X';
    let p = tmp("arch.gguf", &bad);
    fails_with(
        &["run", "-m", p.to_str().unwrap(), "-p", "x"],
        "architecture \"qwenX\" is not supported",
    );
}

#[test]
fn prompt_longer_than_context() {
    let m = tiny();
    let long = "word ".repeat(100);
    fails_with(
        &["run", "-m", m.to_str().unwrap(), "-c", "32", "-p", &long],
        "context",
    );
}

#[test]
fn invalid_sampling_values() {
    let m = tiny();
    let m = m.to_str().unwrap();
    fails_with(&["run", "-m", m, "-p", "x", "--temp", "-1"], "temperature");
    fails_with(&["run", "-m", m, "-p", "x", "--top-p", "2"], "top-p");
    fails_with(&["run", "-m", m, "-p", "x", "--min-p", "7"], "min-p");
}

#[test]
fn generates_on_a_tiny_model() {
    let m = tiny();
    let out = mens()
        .args([
            "run",
            "-m",
            m.to_str().unwrap(),
            "-p",
            "the",
            "-n",
            "8",
            "--temp",
            "0",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("the"));
    assert!(err.contains("tokens/s"), "timing lines missing: {err}");
    let chat = mens()
        .args([
            "run",
            "-m",
            m.to_str().unwrap(),
            "--chat",
            "-p",
            "hi",
            "-n",
            "4",
        ])
        .output()
        .unwrap();
    assert!(
        chat.status.success(),
        "{}",
        String::from_utf8_lossy(&chat.stderr)
    );
}

fn bench_json(m: &std::path::Path, extra: &[&str], name: &str) -> serde_json::Value {
    let json = std::env::temp_dir().join(format!("mens-bench-{}-{name}.json", std::process::id()));
    let mut args = vec![
        "bench",
        "-m",
        m.to_str().unwrap(),
        "--prompt",
        "32",
        "--reps",
        "3",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--json", json.to_str().unwrap()]);
    let out = mens().args(&args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

/// `mens bench` reports every field; allocations and dispatches per step are as the engine says.
#[test]
fn bench_reports_every_field() {
    let v = bench_json(&tiny(), &["--gen", "16", "--depth", "0,16"], "fields");
    for key in [
        "model",
        "threads",
        "results",
        "kv_cache_bytes",
        "session_bytes",
        "model_bytes",
        "machine",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    let r = v["results"].as_array().unwrap();
    assert_eq!(r.len(), 3);
    assert!(r[0]["ttft_ms"].as_f64().unwrap() > 0.0);
    for t in &r[1..] {
        assert!(t["tokens_per_s"].as_f64().unwrap() > 0.0);
        assert_eq!(t["allocations_per_step"].as_f64().unwrap(), 0.0, "{t}");
        assert_eq!(
            t["dispatches_per_step"].as_f64().unwrap(),
            20.0,
            "2 layers × 9 + 2"
        );
    }
}

/// Uncached decode slows down with depth (it re-runs the sequence) while the cached one stays nearly
/// flat, on a model large enough that matmuls, not attention, dominate (d = 1024, 4 layers).
#[test]
fn the_kv_cache_keeps_decode_flat() {
    use mens::gguf::TensorType::Q8_0;
    let spec = SynthSpec {
        n_layer: 4,
        dim: 1024,
        n_head: 16,
        n_kv_head: 4,
        ffn_dim: 2816,
        types: [Q8_0; 7],
        ..SynthSpec::tiny_qwen2()
    };
    let m = tmp("medium.gguf", &synth_model(&spec));
    let cached = bench_json(&m, &["--gen", "8", "--depth", "0,64"], "cached");
    let uncached = bench_json(
        &m,
        &["--gen", "4", "--depth", "0,64", "--no-kv-cache"],
        "uncached",
    );
    let tps = |v: &serde_json::Value, i: usize| v["results"][i]["tokens_per_s"].as_f64().unwrap();
    let cached_ratio = tps(&cached, 2) / tps(&cached, 1);
    let uncached_ratio = tps(&uncached, 2) / tps(&uncached, 1);
    eprintln!("decode speed at depth 64 / depth 0: cached {cached_ratio:.2}, uncached {uncached_ratio:.2}");
    assert!(
        uncached_ratio < 0.25,
        "uncached decode should slow down with depth: {uncached_ratio}"
    );
    assert!(
        cached_ratio > 0.5,
        "cached decode should stay nearly flat: {cached_ratio}"
    );
}
