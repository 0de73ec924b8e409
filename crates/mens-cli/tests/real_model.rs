//! The `mens` binary on the real 0.5B model (fetched once; see crates/mens/tests/common).

#[path = "../../mens/tests/common/mod.rs"]
mod common;

use std::process::Command;

/// After loading and a full-context prefill, the peak RSS is within 10% of the admission estimate.
#[test]
fn memory_estimate_is_honest() {
    let model = common::real_model("qwen2.5-coder-0.5b");
    let text = std::fs::read_to_string(common::data("difflib.py.txt")).unwrap();
    let ctx = 512;
    // About 490 tokens: the prompt fills the context but for the tokens generated.
    let prompt: String = text.chars().take(2050).collect();
    let out = Command::new(env!("CARGO_BIN_EXE_mens"))
        .args([
            "run",
            "-m",
            model.to_str().unwrap(),
            "-c",
            &ctx.to_string(),
            "-n",
            "2",
            "--temp",
            "0",
            "-p",
            &prompt,
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let num = |key: &str| -> f64 {
        let line = err
            .lines()
            .find(|l| l.contains("mens: memory:"))
            .expect("memory line");
        let at = line.find(key).unwrap() + key.len();
        line[at..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let prompt_tokens: usize = err
        .lines()
        .find(|l| l.starts_with("mens: prompt"))
        .unwrap()
        .split_whitespace()
        .nth(2)
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        prompt_tokens > ctx * 9 / 10 && prompt_tokens < ctx,
        "prompt of {prompt_tokens} tokens"
    );
    let (estimate, peak) = (num("estimated "), num("peak RSS "));
    eprintln!("estimate {estimate} MiB, peak RSS {peak} MiB, {prompt_tokens} prompt tokens in a {ctx} context");
    assert!(
        (peak - estimate).abs() <= 0.10 * estimate,
        "peak RSS {peak} MiB vs estimate {estimate} MiB"
    );
}
