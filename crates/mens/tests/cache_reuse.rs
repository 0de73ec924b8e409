//! Cache reuse across an edit, on the real Qwen2.5-Coder-0.5B: the cached text after an inserted
//! line is moved (rows copied, keys re-rotated) instead of prefilled again. Its rows were computed
//! with the old text before them, so the result is close to a cold prefill, not equal (llama.cpp's
//! `--cache-reuse` makes the same trade); how close is measured here against a cold run and against
//! the same reuse with the rows left unmoved (what a wrong shift would give).

mod common;
use mens::cpu::{Session, SessionOptions};
use mens::runner::{Logits, Runner};
use mens::sample::argmax;
use mens::stream::{move_order, reusable_prefix, reuse_chunks, uniform_keep};

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

fn options() -> SessionOptions {
    SessionOptions {
        ctx: 2048,
        batch: 512,
        logit_rows: 1,
        ..Default::default()
    }
}

/// A fresh session that prefilled `prompt`, and its last logits.
fn cold_run(l: &common::Loaded, prompt: &[u32]) -> (Session, Vec<f32>) {
    let mut cold = Session::new(l.model.clone(), options()).unwrap();
    cold.forward(prompt, Logits::Last).unwrap();
    let logits = cold.logits().to_vec();
    (cold, logits)
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
    let opts = options();
    let (_, cold_logits) = cold_run(&l, &after);

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

/// Exact prefix reuse (no rows moved) gives a cold prefill's logits bit for bit when the tokens
/// run again make passes of 64 rows or more: the CPU's tiled prompt attention computes a row alike
/// in any such pass (the matmuls in any pass), so the scheduler keeps 64 tokens or more to run
/// (`uniform_keep`) and splits prompts into passes of 64 or more (`next_pass`, which
/// `Session::forward` uses too). An edit near the end of the file, whose common prefix would leave
/// a few tokens to run, is the case: run as they are, those rows take decode's arithmetic.
#[test]
fn exact_prefix_reuse_gives_the_cold_logits_bit_for_bit() {
    let l = common::load("qwen2.5-coder-0.5b");
    let t = &l.tokenizer;
    let base = source(false);
    let edited = format!("{base}2(state, v)\n    return state\n");
    let (before, after) = (
        t.encode_text(&format!("{base}1(state, v)\n"), usize::MAX)
            .unwrap(),
        t.encode_text(&edited, usize::MAX).unwrap(),
    );
    let opts = options();
    let (cold, cold_logits) = cold_run(&l, &after);
    let uniform = cold.uniform_pass();
    assert_eq!(uniform, 64, "f16 cache, tiled prompt attention");
    let keep = reusable_prefix(&before, &after);
    assert!(after.len() - keep < 64, "the edit is near the end");
    for (k, want_bits) in [
        (uniform_keep(keep, after.len(), uniform), true),
        (keep, false),
    ] {
        let mut s = Session::new(l.model.clone(), opts.clone()).unwrap();
        s.forward(&before, Logits::None).unwrap();
        s.truncate(k);
        s.forward(&after[k..], Logits::Last).unwrap();
        let same = s.logits() == &cold_logits[..];
        eprintln!(
            "kept {k} of {} tokens (common prefix {keep}): {} tokens run, logits bit for bit as cold: {same}, rel. L2 {:.2e}",
            after.len(),
            after.len() - k,
            rel_l2(s.logits(), &cold_logits)
        );
        if want_bits {
            assert!(same, "kept {k}: not the cold logits");
        }
    }
}
