//! Fill-in-the-middle: the prompt a code model completes between a prefix and a suffix, built as
//! llama-server's `/infill` builds it (the repo-level pattern of Qwen2.5-Coder):
//!
//! ```text
//! [FIM_REP]myproject\n[FIM_SEP]file0\n<chunk 0>[FIM_SEP]file1\n<chunk 1>…[FIM_SEP]filename\n
//! [FIM_PRE]<prefix><prompt>[FIM_SUF]<suffix>[FIM_MID]
//! ```
//!
//! The model's FIM tokens come from the file (`tokenizer.ggml.fim_*_token_id`) or, as llama.cpp does,
//! from their known texts in the vocabulary. Every text is a request's: tokenized as text.

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// A model's FIM token ids.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FimTokens {
    pub prefix: u32,
    pub suffix: u32,
    pub middle: u32,
    /// Repository name marker (`<|repo_name|>`), if the model has one.
    pub repo: Option<u32>,
    /// File separator (`<|file_sep|>`), if the model has one.
    pub file_sep: Option<u32>,
}

/// Known texts of each FIM token (llama.cpp's list).
const PRE: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<PRE>",
    "▁<PRE>",
    "<｜fim▁begin｜>",
];
const SUF: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<SUF>",
    "▁<SUF>",
    "<｜fim▁hole｜>",
];
const MID: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<MID>",
    "▁<MID>",
    "<｜fim▁end｜>",
];
const REP: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const SEP: &[&str] = &["<|file_sep|>", "<fim-sep>", "<SEP>", "<filename>"];

impl FimTokens {
    /// The model's FIM tokens, or None when it has no prefix/suffix/middle tokens.
    pub fn of(tok: &Tokenizer, meta: impl Fn(&str) -> Option<u32>) -> Option<FimTokens> {
        let find = |key: &str, texts: &[&str]| {
            meta(&format!("tokenizer.ggml.{key}_token_id"))
                .filter(|&i| (i as usize) < tok.vocab_size())
                .or_else(|| texts.iter().find_map(|t| tok.token_id(t)))
        };
        Some(FimTokens {
            prefix: find("fim_pre", PRE)?,
            suffix: find("fim_suf", SUF)?,
            middle: find("fim_mid", MID)?,
            repo: find("fim_rep", REP),
            file_sep: find("fim_sep", SEP),
        })
    }
}

/// What to fill: the code before and after the gap, the text of the cursor's line before the cursor
/// (`prompt`, appended to the prefix), and chunks of other files as (filename, text).
#[derive(Debug, Clone, Default)]
pub struct FimInput {
    pub prefix: String,
    pub suffix: String,
    pub prompt: String,
    pub extra: Vec<(String, String)>,
}

/// The FIM prompt's ids, fitted as llama-server fits them: the prefix keeps its last 3/4 of a batch,
/// the suffix its first quarter less the prompt, and the extra chunks the context left over after a
/// batch and twice `n_predict` (the newest kept). At most `limit` tokens of each text are tokenized.
pub fn fim_prompt(
    tok: &Tokenizer,
    fim: &FimTokens,
    input: &FimInput,
    n_batch: usize,
    n_predict: usize,
    n_ctx: usize,
) -> Result<Vec<u32>> {
    let text = |s: &str| tok.encode_text_plain(s, n_ctx.max(1) * 4);
    let mut extra = Vec::new();
    if let Some(rep) = fim.repo {
        extra.push(rep);
        extra.extend(text("myproject\n")?);
    }
    for (filename, chunk) in &input.extra {
        match fim.file_sep {
            Some(sep) => {
                extra.push(sep);
                extra.extend(text(&format!("{filename}\n"))?);
            }
            None => extra.extend(text("\n\n--- snippet ---\n\n")?),
        }
        extra.extend(text(chunk)?);
    }
    if let Some(sep) = fim.file_sep {
        extra.push(sep);
        extra.extend(text("filename\n")?);
    }
    let prefix = text(&input.prefix)?;
    let suffix = text(&input.suffix)?;
    let prompt = text(&input.prompt)?;
    let n_prefix = prefix.len().min(3 * (n_batch / 4));
    let n_suffix = suffix
        .len()
        .min((n_batch / 4).saturating_sub(2 + prompt.len()));
    let n_extra = n_ctx
        .saturating_sub(n_batch.saturating_add(n_predict.saturating_mul(2)))
        .min(extra.len());
    let mut out = Vec::with_capacity(n_extra + n_prefix + n_suffix + prompt.len() + 4);
    if let (true, Some(b)) = (tok.add_bos, tok.bos) {
        // llama.cpp puts the BOS after the extra chunks, before the prefix.
        out.extend_from_slice(&extra[extra.len() - n_extra..]);
        out.push(b);
    } else {
        out.extend_from_slice(&extra[extra.len() - n_extra..]);
    }
    out.push(fim.prefix);
    out.extend_from_slice(&prefix[prefix.len() - n_prefix..]);
    out.extend_from_slice(&prompt);
    out.push(fim.suffix);
    out.extend_from_slice(&suffix[..n_suffix]);
    out.push(fim.middle);
    if out.len() >= n_ctx {
        return Err(Error::Context(format!(
            "the fill-in-the-middle prompt is {} tokens but the context holds {n_ctx}",
            out.len()
        )));
    }
    Ok(out)
}
