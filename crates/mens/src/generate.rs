//! The generation loop: prefill the prompt, then sample and decode one token per step, streaming text
//! through a callback. Shared by the CLI and (later) the server.

use crate::engine::{Logits, Runner, Session};
use crate::error::{Error, Result};
use crate::sample::Sampler;
use crate::tokenizer::{StreamDecoder, Tokenizer};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Default)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    /// Generation stops before any of these strings (they are not emitted).
    pub stop: Vec<String>,
    /// Re-run the whole sequence every step instead of using the KV cache (the uncached baseline).
    pub no_kv_cache: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-sequence or end-of-turn token.
    Eos,
    /// A stop string.
    Stop,
    /// `max_tokens` or the context was reached.
    Length,
    /// The callback asked to stop.
    Cancelled,
}

#[derive(Debug, Clone)]
pub struct Stats {
    pub prompt_tokens: usize,
    pub prefill: Duration,
    /// Tokens sampled (the stop token included when there is one).
    pub generated: usize,
    /// Decode forward passes and their total time.
    pub decode_steps: usize,
    pub decode: Duration,
    pub stop: StopReason,
}

impl Stats {
    pub fn prefill_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill.as_secs_f64().max(1e-9)
    }
    pub fn decode_tps(&self) -> f64 {
        self.decode_steps as f64 / self.decode.as_secs_f64().max(1e-9)
    }
}

/// Held-back text: emits what can no longer be the start of a stop string.
pub(crate) struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

impl StopMatcher {
    pub(crate) fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops,
            pending: String::new(),
        }
    }

    /// Add text; returns (text safe to emit, whether a stop string was hit).
    pub(crate) fn push(&mut self, text: &str, out: &mut String) -> bool {
        self.pending.push_str(text);
        if self.stops.is_empty() {
            out.push_str(&self.pending);
            self.pending.clear();
            return false;
        }
        if let Some(i) = self
            .stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            out.push_str(&self.pending[..i]);
            self.pending.clear();
            return true;
        }
        // Keep the longest suffix that is a prefix of some stop string.
        let mut keep_from = self.pending.len();
        for (i, _) in self.pending.char_indices().rev() {
            let tail = &self.pending[i..];
            if self.stops.iter().any(|s| s.starts_with(tail)) {
                keep_from = i;
            }
        }
        out.push_str(&self.pending[..keep_from]);
        self.pending.drain(..keep_from);
        false
    }
    pub(crate) fn finish(&mut self, out: &mut String) {
        out.push_str(&self.pending);
        self.pending.clear();
    }
}

/// Append `prompt` to the session, then generate up to `opts.max_tokens` tokens. `on_text` receives
/// each piece of complete UTF-8 text and returns false to stop.
pub fn generate<R: Runner + ?Sized>(
    session: &mut R,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<Stats> {
    let ctx = session.ctx();
    if prompt.is_empty() {
        return Err(Error::InvalidArgument("the prompt is empty".into()));
    }
    if session.tokens().len() + prompt.len() >= ctx {
        return Err(Error::Context(format!(
            "the prompt is {} tokens ({} already in the cache) but the context holds {ctx}; use a shorter prompt or a larger --ctx-size",
            prompt.len(),
            session.tokens().len()
        )));
    }
    // The uncached baseline re-runs this whole sequence each step (allocated once).
    let mut all: Vec<u32> = if opts.no_kv_cache {
        Vec::with_capacity(ctx)
    } else {
        Vec::new()
    };
    let t0 = Instant::now();
    if opts.no_kv_cache {
        session.rerun(prompt, &mut all)?;
    } else {
        session.forward(prompt, Logits::Last)?;
    }
    let prefill = t0.elapsed();

    let mut stats = Stats {
        prompt_tokens: prompt.len(),
        prefill,
        generated: 0,
        decode_steps: 0,
        decode: Duration::ZERO,
        stop: StopReason::Length,
    };
    let mut decoder = StreamDecoder::new();
    let mut matcher = StopMatcher::new(opts.stop.clone());
    let mut piece = String::with_capacity(64);
    let mut emit = String::with_capacity(64);

    while stats.generated < opts.max_tokens {
        let next = session.sample(sampler)?;
        stats.generated += 1;
        if tokenizer.is_stop(next) {
            stats.stop = StopReason::Eos;
            break;
        }
        piece.clear();
        emit.clear();
        decoder.push(tokenizer, next, &mut piece);
        let hit = matcher.push(&piece, &mut emit);
        if !emit.is_empty() && !on_text(&emit) {
            stats.stop = StopReason::Cancelled;
            break;
        }
        if hit {
            stats.stop = StopReason::Stop;
            break;
        }
        if stats.generated >= opts.max_tokens || session.tokens().len() + 1 >= ctx {
            stats.stop = StopReason::Length;
            break;
        }
        let t = Instant::now();
        if opts.no_kv_cache {
            session.rerun(&[next], &mut all)?;
        } else {
            session.forward(&[next], Logits::Last)?;
        }
        stats.decode += t.elapsed();
        stats.decode_steps += 1;
    }
    emit.clear();
    piece.clear();
    decoder.finish(&mut piece);
    if stats.stop != StopReason::Stop {
        matcher.push(&piece, &mut emit);
        matcher.finish(&mut emit);
        if !emit.is_empty() {
            on_text(&emit);
        }
    }
    Ok(stats)
}

impl Session {
    /// Sample the next token from the last logits, with the cached tokens as the penalty history.
    pub fn sample_next(&mut self, sampler: &mut Sampler) -> u32 {
        let (logits, tokens) = self.logits_and_tokens();
        sampler.sample(logits, tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_matcher_holds_back_partial_stops() {
        let stops = vec!["</end>".to_string()];
        let mut m = StopMatcher::new(stops.clone());
        let mut out = String::new();
        assert!(!m.push("hello </", &mut out));
        assert_eq!(out, "hello ");
        assert!(m.push("end> more", &mut out));
        assert_eq!(out, "hello ");
        let mut m = StopMatcher::new(stops.clone());
        let mut out = String::new();
        assert!(!m.push("a </b", &mut out));
        assert_eq!(out, "a </b");
    }
}
