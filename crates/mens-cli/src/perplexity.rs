//! `mens perplexity`: llama-perplexity's method. The text is cut into non-overlapping windows of
//! ctx tokens; each window is evaluated from an empty cache and only its second half is scored
//! (each position predicts the next token), so every scored token has at least ctx/2 of context.

use crate::{load, PerplexityArgs};
use anyhow::{bail, Result};
use mens::engine::{Logits, Session, SessionOptions};
use std::time::Instant;

pub fn run(args: PerplexityArgs) -> Result<()> {
    let l = load(&args.model)?;
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", args.file.display()))?;
    let tokens = l.tokenizer.encode(&text)?;
    let ctx = args.model.ctx_size.unwrap_or(512);
    if ctx < 4 {
        bail!("invalid argument: --ctx-size must be at least 4 for perplexity");
    }
    let mut n_chunk = tokens.len() / ctx;
    if let Some(c) = args.chunks {
        n_chunk = n_chunk.min(c);
    }
    if n_chunk == 0 {
        bail!(
            "the text has {} tokens, fewer than one window of {ctx}",
            tokens.len()
        );
    }
    eprintln!(
        "mens: {} tokens, {n_chunk} windows of {ctx}, scoring the second half of each",
        tokens.len()
    );
    let mut sess = Session::new(
        l.model.clone(),
        SessionOptions {
            ctx,
            batch: ctx.min(512),
            logit_rows: 16,
        },
    )?;
    let first = ctx / 2;
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    let t0 = Instant::now();
    let mut window = vec![0u32; ctx];
    for i in 0..n_chunk {
        window.copy_from_slice(&tokens[i * ctx..(i + 1) * ctx]);
        if l.tokenizer.add_bos {
            if let Some(b) = l.tokenizer.bos {
                window[0] = b;
            }
        }
        let targets = &tokens[i * ctx..(i + 1) * ctx];
        sess.reset();
        let mut f = |j: usize, logits: &[f32]| {
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
        sess.forward(
            &window,
            Logits::All {
                from: first,
                f: &mut f,
            },
        )?;
        eprint!("[{}]{:.4},", i + 1, (nll / count as f64).exp());
    }
    let mean = nll / count as f64;
    let var = (nll2 / count as f64 - mean * mean).max(0.0);
    let ppl = mean.exp();
    let err = ppl * (var / (count as f64 - 1.0).max(1.0)).sqrt();
    eprintln!();
    println!("Final estimate: PPL = {ppl:.4} +/- {err:.5}");
    eprintln!(
        "mens: {count} scored tokens, {:.1} s, {:.1} tokens/s evaluated",
        t0.elapsed().as_secs_f64(),
        (n_chunk * ctx) as f64 / t0.elapsed().as_secs_f64()
    );
    Ok(())
}
