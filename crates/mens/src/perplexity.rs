//! Perplexity as llama-perplexity computes it: the tokens are cut into non-overlapping windows of
//! `ctx`; each window is evaluated from an empty cache and only its second half is scored (each
//! position predicts the next token), so every scored token sees at least ctx/2 tokens of context.

use crate::error::{Error, Result};
use crate::runner::{Logits, Runner};

#[derive(Debug, Clone)]
pub struct Perplexity {
    pub ppl: f64,
    /// Standard error of the estimate.
    pub error: f64,
    pub windows: usize,
    pub scored: usize,
}

/// The runner's context is the window (any backend). `bos` replaces each window's first token when the model adds
/// one (llama.cpp does the same). `progress(window, running ppl)` is called after each window.
pub fn perplexity(
    session: &mut dyn Runner,
    tokens: &[u32],
    bos: Option<u32>,
    max_windows: Option<usize>,
    mut progress: impl FnMut(usize, f64),
) -> Result<Perplexity> {
    let ctx = session.ctx();
    if ctx < 4 {
        return Err(Error::InvalidArgument(
            "the perplexity window must be at least 4 tokens".into(),
        ));
    }
    let mut windows = tokens.len() / ctx;
    if let Some(m) = max_windows {
        windows = windows.min(m);
    }
    if windows == 0 {
        return Err(Error::Context(format!(
            "the text has {} tokens, fewer than one window of {ctx}",
            tokens.len()
        )));
    }
    let first = ctx / 2;
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    let mut window = vec![0u32; ctx];
    for i in 0..windows {
        let targets = &tokens[i * ctx..(i + 1) * ctx];
        window.copy_from_slice(targets);
        if let Some(b) = bos {
            window[0] = b;
        }
        session.truncate(0);
        let mut score = |j: usize, logits: &[f32]| {
            if j + 1 >= ctx {
                return;
            }
            let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
            let z: f64 = logits.iter().map(|&x| ((x as f64) - max).exp()).sum();
            let lp = logits[targets[j + 1] as usize] as f64 - max - z.ln();
            nll -= lp;
            nll2 += lp * lp;
            count += 1;
        };
        session.forward(
            &window,
            Logits::All {
                from: first,
                f: &mut score,
            },
        )?;
        progress(i + 1, (nll / count as f64).exp());
    }
    let mean = nll / count as f64;
    let var = (nll2 / count as f64 - mean * mean).max(0.0);
    let ppl = mean.exp();
    Ok(Perplexity {
        ppl,
        error: ppl * (var / (count as f64 - 1.0).max(1.0)).sqrt(),
        windows,
        scored: count,
    })
}
