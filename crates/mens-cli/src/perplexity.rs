//! `mens perplexity`: the engine's `perplexity` over a text file, with llama-perplexity's output.

use crate::{load, PerplexityArgs};
use anyhow::Result;
use mens::engine::{Session, SessionOptions};
use std::time::Instant;

pub fn run(args: PerplexityArgs) -> Result<()> {
    let l = load(&args.model)?;
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", args.file.display()))?;
    let tokens = l.tokenizer.encode_text(&text, usize::MAX)?;
    let ctx = args.model.ctx_size.unwrap_or(512);
    let mut sess = Session::new(
        l.model.clone(),
        SessionOptions {
            ctx,
            batch: ctx.min(512),
            logit_rows: 16,
        },
    )?;
    eprintln!(
        "mens: {} tokens, windows of {ctx}, scoring the second half of each",
        tokens.len()
    );
    let bos = if l.tokenizer.add_bos {
        l.tokenizer.bos
    } else {
        None
    };
    let t0 = Instant::now();
    let r = mens::perplexity::perplexity(&mut sess, &tokens, bos, args.chunks, |i, p| {
        eprint!("[{i}]{p:.4},")
    })?;
    eprintln!();
    println!("Final estimate: PPL = {:.4} +/- {:.5}", r.ppl, r.error);
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "mens: {} windows, {} scored tokens, {secs:.1} s, {:.1} tokens/s evaluated",
        r.windows,
        r.scored,
        (r.windows * ctx) as f64 / secs
    );
    Ok(())
}
