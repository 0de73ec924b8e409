//! The backend boundary: what the generation loop, the scheduler, the benchmark and perplexity need
//! from a backend, and nothing more. A runner holds one or more sequences ("slots"), each with its
//! KV cache; one [`Runner::step`] is one forward pass over parts of several slots (continuous
//! batching), each part asking for no logits, the last position's, or every position's from some
//! index on (the verify pass of speculative decoding, perplexity). The CPU backend implements it for
//! one sequence ([`crate::cpu::Session`]) and for many ([`crate::cpu::Batch`]); CUDA and Metal for one.

use crate::error::{Error, Result};
use crate::sample::Sampler;

/// Which logits a part of a step produces.
pub enum Logits<'a> {
    /// None (a prompt chunk that is not the last).
    None,
    /// Only the last token's (generation); read them with [`Runner::sample_slot`].
    Last,
    /// Every position's from index `from` on, handed to the callback as (index in the part's
    /// tokens, logits).
    All {
        from: usize,
        f: &'a mut dyn FnMut(usize, &[f32]),
    },
    /// Every position's greedy pick from index `from` on, handed to the callback as (index,
    /// token): a greedy verify pass, which needs no logits on the host (a CUDA batch reads back
    /// one id a row, picked on the device as its greedy decoding picks).
    Argmax {
        from: usize,
        f: &'a mut dyn FnMut(usize, u32),
    },
    /// Every position's hidden state after the final norm (the model's width, no LM head) from
    /// index `from` on, handed to the callback as (index, row): embeddings. Only where
    /// [`Runner::hidden_states`] says so.
    Hidden {
        from: usize,
        f: &'a mut dyn FnMut(usize, &[f32]),
    },
}

impl Logits<'_> {
    /// Whether every position's logits (or picks) from some index on are wanted.
    pub fn every(&self) -> bool {
        self.start().is_some()
    }

    /// The first position whose logits (or pick) are wanted, for `All` and `Argmax`.
    pub fn start(&self) -> Option<usize> {
        match self {
            Logits::All { from, .. }
            | Logits::Argmax { from, .. }
            | Logits::Hidden { from, .. } => Some(*from),
            Logits::None | Logits::Last => None,
        }
    }

    /// Hand position `i`'s logits over: the row itself (`All`) or its argmax (`Argmax`).
    pub fn give(&mut self, i: usize, row: &[f32]) {
        match self {
            Logits::All { f, .. } => f(i, row),
            Logits::Argmax { f, .. } => f(i, crate::sample::argmax(row)),
            Logits::None | Logits::Last | Logits::Hidden { .. } => {}
        }
    }

    /// Whether the part wants hidden states, not logits ([`Logits::Hidden`]).
    pub fn hidden(&self) -> bool {
        matches!(self, Logits::Hidden { .. })
    }

    /// Hand position `i`'s final hidden state over (`Hidden`).
    pub fn give_hidden(&mut self, i: usize, row: &[f32]) {
        if let Logits::Hidden { f, .. } = self {
            f(i, row)
        }
    }
}

/// Tokens to append to one slot's sequence in a step.
pub struct Part<'a> {
    pub slot: usize,
    pub tokens: &'a [u32],
    pub logits: Logits<'a>,
}

/// Bytes a runner holds on its device, besides the weights.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    pub kv_cache: usize,
    /// Activations, logits, RoPE tables, scratch.
    pub buffers: usize,
}

/// One kernel family of a profiled GPU decode step.
#[derive(Clone, Debug)]
pub struct KernelTime {
    pub name: &'static str,
    pub calls: usize,
    /// Microseconds per step, all calls.
    pub us: f64,
    /// Bytes the calls read and write in device memory per step (weights, cache, activations).
    pub bytes: u64,
}

/// A profiled GPU decode step: its kernels, slowest first, and the device's copy bandwidth.
#[derive(Clone, Debug)]
pub struct Profile {
    pub kernels: Vec<KernelTime>,
    /// GB/s of a device-to-device copy, bytes read plus bytes written.
    pub copy_gbs: f64,
}

pub trait Runner {
    /// Sequences held.
    fn slots(&self) -> usize {
        1
    }
    /// Context length of each slot (tokens its cache holds).
    fn ctx(&self) -> usize;
    /// Most tokens one step takes, all parts together.
    fn max_step_tokens(&self) -> usize;
    /// Tokens now in a slot's cache.
    fn slot_tokens(&self, slot: usize) -> &[u32];
    /// Drop a slot's cache entries after `n` tokens (no copy: the next step overwrites them).
    fn truncate_slot(&mut self, slot: usize, n: usize);
    /// Rows from which a prompt pass computes each row the same way whatever the pass's size (1:
    /// any size, or none is promised). The CPU runs passes of 64 rows and more with llama.cpp's tiled
    /// attention and shorter ones with decode's: the scheduler keeps the passes of a prompt of 128
    /// tokens or more at 64 rows or more, so a request that reuses a cached prefix gets a cold
    /// request's bits.
    fn uniform_pass(&self) -> usize {
        1
    }
    /// Whether [`Runner::shift_kv`] works (cache reuse across edits needs it).
    fn can_shift_kv(&self) -> bool {
        false
    }
    /// Copy a slot's cache rows `src..src + len` to `dst..dst + len`, keys re-rotated for the new
    /// positions (rows past the slot's tokens may be written; its token list is unchanged). With
    /// [`Runner::assume_tokens`] this reuses cached text that moved (an edit before it).
    fn shift_kv(&mut self, _slot: usize, _src: usize, _dst: usize, _len: usize) -> Result<()> {
        Err(Error::InvalidArgument(
            "this backend cannot shift its KV cache".into(),
        ))
    }
    /// Append tokens whose rows are already in the cache (placed by `shift_kv`), computing nothing.
    fn assume_tokens(&mut self, _slot: usize, _tokens: &[u32]) -> Result<()> {
        Err(Error::InvalidArgument(
            "this backend cannot shift its KV cache".into(),
        ))
    }
    /// Whether [`Runner::copy_prefix`] works.
    fn can_copy_prefix(&self) -> bool {
        false
    }
    /// Make slot `dst` hold the first `n` cached tokens of slot `src`, their cache rows copied
    /// (computing nothing): a prompt prefix another slot already holds (a shared system prompt).
    fn copy_prefix(&mut self, _src: usize, _dst: usize, _n: usize) -> Result<()> {
        Err(Error::InvalidArgument(
            "this backend cannot copy cache rows between slots".into(),
        ))
    }
    /// Room for `tokens` tokens (prompt and answer) on `slot`, for a request starting there or
    /// growing: whether the runner can hold them now. A paged KV pool
    /// ([`crate::pages::PagePool`]) answers from its free pages; false: the request waits (or
    /// another is preempted). Other runners give every slot its whole context.
    fn admit(&mut self, _slot: usize, _tokens: usize) -> bool {
        true
    }
    /// The request on `slot` ended: what it held may go to others (its cached rows stay until
    /// they are needed).
    fn release(&mut self, _slot: usize) {}
    /// A paged KV pool's (pages in use, pages).
    fn pages(&self) -> Option<(usize, usize)> {
        None
    }
    /// One forward pass over `parts` (at most one per slot).
    fn step(&mut self, parts: &mut [Part]) -> Result<()>;
    /// Whether [`Logits::Hidden`] parts are served (embeddings).
    fn hidden_states(&self) -> bool {
        false
    }
    /// Pick a slot's next token from its last-position logits of the last step.
    fn sample_slot(&mut self, slot: usize, sampler: &mut Sampler) -> Result<u32>;
    fn memory(&self) -> Memory;
    /// Greedy decoding of slot 0 may run a step ahead (a GPU launches the next step, on its own
    /// greedy pick, before the host has read this one's, so the device never waits for the
    /// host): `on` promises that, until it is turned off, each `sample` with a greedy sampler is
    /// followed by `forward` of the token it returned or by nothing that reads logits. Anything
    /// else first waits for (and drops) the step run ahead. Default: nothing.
    fn pipeline_greedy(&mut self, _on: bool) {}
    /// For a GPU: launches the host issues per decode token and kernels they run.
    fn launches_per_token(&self) -> Option<(usize, usize)> {
        None
    }
    /// For a GPU: where a decode step's time goes, over `steps` decode steps run launch by
    /// launch. None for the CPU.
    fn profile_decode(&mut self, _steps: usize) -> Result<Option<Profile>> {
        Ok(None)
    }
    /// Another single sequence of `ctx` tokens on the same device, weights and stream (so that a
    /// sync waits for both: the benchmark's paired test).
    fn sibling(&self, ctx: usize) -> Result<Box<dyn Runner>>;
    /// `slots` sequences of `ctx` tokens stepped together (at most `step_tokens` tokens a step) on
    /// the same device and weights: the benchmark's --concurrency test. One slot: a sibling.
    fn batch_sibling(
        &self,
        slots: usize,
        ctx: usize,
        step_tokens: usize,
    ) -> Result<Box<dyn Runner>> {
        let _ = step_tokens;
        if slots == 1 {
            return self.sibling(ctx);
        }
        Err(Error::InvalidArgument(
            "this backend steps one sequence at a time".into(),
        ))
    }

    // One sequence: slot 0.

    fn tokens(&self) -> &[u32] {
        self.slot_tokens(0)
    }
    fn truncate(&mut self, n: usize) {
        self.truncate_slot(0, n)
    }
    /// Run `tokens` after the cached ones of slot 0.
    fn forward<'a>(&mut self, tokens: &'a [u32], logits: Logits<'a>) -> Result<()> {
        self.step(&mut [Part {
            slot: 0,
            tokens,
            logits,
        }])
    }
    fn sample(&mut self, sampler: &mut Sampler) -> Result<u32> {
        self.sample_slot(0, sampler)
    }
    /// The uncached baseline: re-run the whole sequence plus `extra` from position 0.
    /// `scratch` holds the sequence (give it capacity `ctx` to keep this allocation-free).
    fn rerun(&mut self, extra: &[u32], scratch: &mut Vec<u32>) -> Result<()> {
        scratch.clear();
        scratch.extend_from_slice(self.tokens());
        scratch.extend_from_slice(extra);
        self.truncate(0);
        self.forward(scratch, Logits::Last)
    }
    fn kv_cache_bytes(&self) -> usize {
        self.memory().kv_cache
    }
    /// Bytes of KV cache and buffers.
    fn bytes(&self) -> usize {
        let m = self.memory();
        m.kv_cache + m.buffers
    }
}

/// The one part of a step on a single-sequence runner (slot 0).
/// For a backend without [`Logits::Hidden`]: a clear error when a part asks for hidden states.
pub fn no_hidden(parts: &[Part], backend: &str) -> Result<()> {
    if parts.iter().any(|p| p.logits.hidden()) {
        return Err(Error::InvalidArgument(format!(
            "embeddings (hidden states) are not computed on the {backend} backend; use --backend cpu"
        )));
    }
    Ok(())
}

pub fn single<'p, 'a>(parts: &'p mut [Part<'a>]) -> Result<&'p mut Part<'a>> {
    match parts {
        [p] if p.slot == 0 => Ok(p),
        _ => Err(Error::InvalidArgument(
            "this backend runs one sequence: a step takes one part, for slot 0".into(),
        )),
    }
}

/// Run `f` on `r` with greedy steps run ahead when `on` ([`Runner::pipeline_greedy`]), turned off
/// again after it whatever it returns.
pub fn with_greedy_pipeline<R: Runner + ?Sized, T>(
    r: &mut R,
    on: bool,
    f: impl FnOnce(&mut R) -> Result<T>,
) -> Result<T> {
    r.pipeline_greedy(on);
    let out = f(r);
    r.pipeline_greedy(false);
    out
}

/// Check that `tokens` may be appended to a sequence holding `pos` of `ctx` tokens (every backend).
pub fn check_tokens(pos: usize, ctx: usize, tokens: &[u32], vocab: usize) -> Result<()> {
    if tokens.is_empty() {
        return Err(Error::InvalidArgument("no tokens to process".into()));
    }
    if pos + tokens.len() > ctx {
        return Err(Error::Context(format!(
            "{pos} tokens in the cache + {} new exceed the context of {ctx} tokens",
            tokens.len()
        )));
    }
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(Error::InvalidArgument(format!(
            "token id {bad} is outside the vocabulary ({vocab})"
        )));
    }
    Ok(())
}
