//! Speculative decoding: propose several tokens, check them in one forward pass of the target
//! model, keep the longest agreeing prefix plus the model's own next token. [`ngram`] proposes by
//! prompt lookup: the continuation of the latest earlier occurrence of the last n tokens (code
//! repeats its input: an edit copies most of the file, a rename repeats the names).

use crate::error::{Error, Result};
use crate::runner::{Logits, Runner};
use crate::tokenizer::Tokenizer;

/// How to speculate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecOptions {
    /// Most tokens proposed per step.
    pub max: usize,
    /// Longest suffix looked up (shorter ones are tried after it, down to 1).
    pub ngram: usize,
    /// The server: speculate only while it measures faster than plain decoding ([`Gate`]).
    pub gate: bool,
}

impl Default for SpecOptions {
    fn default() -> Self {
        SpecOptions {
            max: 8,
            ngram: 3,
            gate: true,
        }
    }
}

/// How many of the proposals `draft` the model's greedy picks agree with, in order (`picks[i]` is
/// the model's choice after the i-th fed token: the proposal's position).
pub fn agreeing(draft: &[u32], picks: &[u32]) -> usize {
    draft.iter().zip(picks).take_while(|(d, p)| d == p).count()
}

/// A draft model's next proposal count: two more after all `proposed` were accepted (at most
/// `max`), else what was accepted plus one.
pub fn next_k(k: usize, proposed: usize, agree: usize, max: usize) -> usize {
    if agree == proposed {
        (k + 2).min(max)
    } else {
        agree + 1
    }
}

/// A draft model can propose for a target when their token texts agree wherever both define a
/// token (a larger vocabulary may only add padding or extra tokens at the end).
pub fn check_vocab(target: &Tokenizer, draft: &Tokenizer) -> Result<()> {
    let n = target.vocab_size().min(draft.vocab_size());
    if let Some(i) = (0..n as u32).find(|&i| target.token_bytes(i) != draft.token_bytes(i)) {
        return Err(Error::InvalidArgument(format!(
            "the draft model's vocabulary differs from the target's at token {i} ({:?} against {:?}): it cannot propose for it",
            String::from_utf8_lossy(draft.token_bytes(i)),
            String::from_utf8_lossy(target.token_bytes(i))
        )));
    }
    Ok(())
}

/// Greedy proposals of a draft model: bring its cache to `history` (it keeps what it shares with
/// it), then decode `k` tokens.
pub fn draft(d: &mut dyn Runner, history: &[u32], k: usize, out: &mut Vec<u32>) -> Result<()> {
    out.clear();
    if k == 0 || history.is_empty() {
        return Ok(());
    }
    let keep = crate::stream::reusable_prefix(d.tokens(), history);
    d.truncate(keep);
    let room = d.ctx().saturating_sub(history.len());
    let k = k.min(room);
    if k == 0 {
        return Ok(());
    }
    d.forward(&history[keep..], Logits::Last)?;
    let mut greedy = crate::sample::Sampler::new(crate::sample::SamplerConfig::greedy(), 1)?;
    for i in 0..k {
        let t = d.sample(&mut greedy)?;
        out.push(t);
        if i + 1 < k {
            d.forward(&[t], Logits::Last)?;
        }
    }
    Ok(())
}

/// Up to `max` tokens that followed the latest earlier occurrence of the longest suffix of `history`
/// (at most `n` tokens) found again in it; empty when none is found.
pub fn ngram(history: &[u32], n: usize, max: usize, out: &mut Vec<u32>) {
    out.clear();
    ngram_append(history, n, max, out);
}

/// [`ngram`], appending the proposals to `out`.
pub fn ngram_append(history: &[u32], n: usize, max: usize, out: &mut Vec<u32>) {
    let len = history.len();
    for k in (1..=n.min(len.saturating_sub(1))).rev() {
        let pat = &history[len - k..];
        // Latest occurrence that ends before the suffix itself and has something after it.
        let found = (0..len - k).rev().find(|&i| &history[i..i + k] == pat);
        if let Some(i) = found {
            let from = i + k;
            out.extend_from_slice(&history[from..(from + max).min(len)]);
            return;
        }
    }
}

/// Steps speculation stays off after it measured slower than plain decoding.
pub const GATE_OFF_STEPS: u64 = 64;
/// Decoding-sequence counts the gate keeps apart (more share the last entry).
const GATE_SIZES: usize = 65;

/// Whether speculating pays here and now: decode throughput of steps with proposals against
/// steps without, kept per number of decoding sequences (a batch of 8 costs differently from one).
/// Where proposals are verified slowly (a CPU whose prefill is not much faster per token than its
/// decode) or mostly rejected, speculating is slower than plain decoding: the gate then switches it
/// off for [`GATE_OFF_STEPS`] steps and tries again after, so a change of workload is noticed.
#[derive(Debug, Clone)]
pub struct Gate {
    /// Exponential averages of tokens/s, and samples since the last reset, by sequence count.
    plain: Vec<(f64, u32)>,
    spec: Vec<(f64, u32)>,
    step: u64,
    off_until: u64,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            plain: vec![(0.0, 0); GATE_SIZES],
            spec: vec![(0.0, 0); GATE_SIZES],
            step: 0,
            off_until: 0,
        }
    }
}

impl Gate {
    /// Whether a step decoding `n` sequences may propose: once a plain step of that size has been
    /// measured, and not while switched off. Counts the step.
    pub fn allow(&mut self, n: usize) -> bool {
        self.step += 1;
        self.plain[n.min(GATE_SIZES - 1)].1 > 0 && self.step >= self.off_until
    }

    /// A decode step of `n` sequences (no prompt in it) gave `tokens` in `secs`, `speculated` if
    /// it verified proposals (their drafting included in `secs`).
    pub fn record(&mut self, n: usize, speculated: bool, tokens: usize, secs: f64) {
        if secs <= 0.0 || tokens == 0 {
            return;
        }
        let i = n.min(GATE_SIZES - 1);
        let rate = tokens as f64 / secs;
        let e = if speculated {
            &mut self.spec[i]
        } else {
            &mut self.plain[i]
        };
        e.0 = if e.1 == 0 {
            rate
        } else {
            0.7 * e.0 + 0.3 * rate
        };
        e.1 += 1;
        let (plain, spec) = (self.plain[i], self.spec[i]);
        // Two speculating steps at least, so that one slow step does not decide.
        if speculated && plain.1 > 0 && spec.1 >= 2 && spec.0 < plain.0 {
            self.off_until = self.step + GATE_OFF_STEPS;
            self.spec[i] = (0.0, 0);
        }
    }

    /// Whether speculation is switched off now.
    pub fn is_off(&self) -> bool {
        self.step < self.off_until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_switches_slow_speculation_off_and_tries_again() {
        let mut g = Gate::default();
        // Nothing measured: plain first.
        assert!(!g.allow(1));
        g.record(1, false, 1, 0.1); // 10 tokens/s plain
        assert!(g.allow(1));
        // Speculation at 8 tokens/s: one step does not decide, two do.
        g.record(1, true, 4, 0.5);
        assert!(g.allow(1));
        g.record(1, true, 4, 0.5);
        assert!(g.is_off());
        for _ in 1..GATE_OFF_STEPS {
            assert!(!g.allow(1));
        }
        assert!(g.allow(1), "tried again after the pause");
        // Faster now (a repetitive answer): it stays on.
        for _ in 0..10 {
            g.record(1, true, 6, 0.2);
            assert!(g.allow(1));
        }
        // Another batch size has its own figures: not measured plain yet.
        assert!(!g.allow(3));
    }

    #[test]
    fn proposes_the_continuation_of_the_latest_match() {
        let mut out = Vec::new();
        // "a b c d ... a b" → "c d ..." from the latest "a b".
        ngram(&[1, 2, 3, 4, 9, 1, 2, 7, 8, 1, 2], 3, 4, &mut out);
        assert_eq!(out, [7, 8, 1, 2]);
        // The longest suffix wins over a later shorter one.
        ngram(&[5, 6, 7, 1, 6, 7, 2, 5, 6, 7], 3, 2, &mut out);
        assert_eq!(out, [1, 6]);
        ngram(&[1, 2, 3], 3, 4, &mut out);
        assert!(out.is_empty());
        ngram(&[], 3, 4, &mut out);
        assert!(out.is_empty());
    }
}
