//! `mens perplexity`: the engine's `perplexity` over a text file, with llama-perplexity's output.

use crate::args::PerplexityArgs;
use crate::{load, runner};
use anyhow::Result;
use std::time::Instant;

/// Window size when -c is not given (llama-perplexity's default).
const DEFAULT_WINDOW: usize = 512;

pub fn run(mut args: PerplexityArgs) -> Result<()> {
    // Windows of -c tokens (512 by default): that is the context to admit, not the trained one.
    let ctx = args.model.ctx_size.unwrap_or(DEFAULT_WINDOW);
    args.model.ctx_size = Some(ctx);
    let l = load(&args.model, 1)?;
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", args.file.display()))?;
    let tokens = l.tokenizer.encode_text(&text, usize::MAX)?;
    let mut sess = runner(&l)?;
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
    let r = mens::perplexity::perplexity(sess.as_mut(), &tokens, bos, args.chunks, |i, p| {
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
