//! Cache reuse across an edit, on the real Qwen2.5-Coder-0.5B: the cached text after an inserted
//! line is moved (rows copied, keys re-rotated) instead of prefilled again. Its rows were computed
//! with the old text before them, so the result is close to a cold prefill, not equal (llama.cpp's
//! `--cache-reuse` makes the same trade); how close is measured here against a cold run and against
//! the same reuse with the rows left unmoved (what a wrong shift would give).

mod common;
use mens::cpu::{Session, SessionOptions};
use mens::runner::{Logits, Runner};
use mens::sample::argmax;
use mens::stream::{move_order, reusable_prefix, reuse_chunks};

fn source(edit: bool) -> String {
    let mut s = String::new();
    for i in 0..40 {
        s.push_str(&format!(
            "def step_{i}(state, value):\n    \"\"\"Advance the state by {i}.\"\"\"\n    state += value * {}\n    return state\n\n",
            i % 7 + 2
        ));
        if edit && i == 12 {
            s.push_str("# a comment added in the middle of the file\n");
        }
    }
    s.push_str("def main():\n    state = 0\n    for v in range(10):\n        state = step_");
    s
}

/// Reuse what `s` holds for `prompt` (moving chunks unless `moved` is false), prefill the rest;
/// the last logits and the number of tokens prefilled.
fn warm(s: &mut Session, prompt: &[u32], moved: bool) -> (Vec<f32>, usize) {
    let keep = reusable_prefix(s.tokens(), prompt);
    let chunks = reuse_chunks(s.tokens(), prompt, keep, 32);
    if moved {
        for c in move_order(&chunks) {
            s.shift_kv(0, c.src, c.dst, c.len).unwrap();
        }
    }
    s.truncate(keep);
    let (mut fed, mut prefilled) = (keep, 0);
    for c in &chunks {
        if c.dst > fed {
            s.forward(&prompt[fed..c.dst], Logits::None).unwrap();
            prefilled += c.dst - fed;
        }
        s.assume_tokens(0, &prompt[c.dst..c.dst + c.len]).unwrap();
        fed = c.dst + c.len;
    }
    s.forward(&prompt[fed..], Logits::Last).unwrap();
    prefilled += prompt.len() - fed;
    (s.logits().to_vec(), prefilled)
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (d / n).sqrt()
}

#[test]
fn moved_cache_rows_give_logits_close_to_a_cold_prefill() {
    let l = common::load("qwen2.5-coder-0.5b");
    let t = &l.tokenizer;
    let (before, after) = (
        t.encode_text(&source(false), usize::MAX).unwrap(),
        t.encode_text(&source(true), usize::MAX).unwrap(),
    );
    let opts = SessionOptions {
        ctx: 2048,
        batch: 512,
        logit_rows: 1,
        ..Default::default()
    };
    let mut cold = Session::new(l.model.clone(), opts.clone()).unwrap();
    cold.forward(&after, Logits::Last).unwrap();
    let cold_logits = cold.logits().to_vec();

    let mut results = Vec::new();
    for moved in [true, false] {
        let mut s = Session::new(l.model.clone(), opts.clone()).unwrap();
        s.forward(&before, Logits::None).unwrap();
        let (logits, prefilled) = warm(&mut s, &after, moved);
        let err = rel_l2(&logits, &cold_logits);
        eprintln!(
            "rows moved: {moved}: prefilled {prefilled} of {} tokens; logits rel. L2 {err:.4}; argmax {} (cold {})",
            after.len(),
            argmax(&logits),
            argmax(&cold_logits)
        );
        results.push((err, argmax(&logits), prefilled));
    }
    let (moved, unmoved) = (results[0], results[1]);
    // Most of the prompt is reused: only the inserted line and the last token are prefilled.
    assert!(moved.2 < after.len() / 20, "prefilled {} tokens", moved.2);
    assert_eq!(
        moved.1,
        argmax(&cold_logits),
        "the next token differs from a cold prefill"
    );
    assert!(moved.0 < 0.1, "moved rows: logits rel. L2 {}", moved.0);
    // Rows at the wrong positions (no shift) are far off: the check above can fail.
    assert!(
        unmoved.0 > 4.0 * moved.0,
        "unmoved {} vs moved {}",
        unmoved.0,
        moved.0
    );
}
