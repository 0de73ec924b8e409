//! Speculative decoding: propose several tokens, check them in one forward pass of the target
//! model, keep the longest agreeing prefix plus the model's own next token. [`ngram`] proposes by
//! prompt lookup: the continuation of the latest earlier occurrence of the last n tokens (code
//! repeats its input: an edit copies most of the file, a rename repeats the names).

use crate::error::{Error, Result};
use crate::runner::{Logits, Runner};
use crate::tokenizer::Tokenizer;

/// Most proposals a verify pass takes, whatever `SpecOptions::max` asks: the pass (the proposals
/// and the token before them) stays below the 64 rows from which CPU prompt attention runs its own
/// (tiled f32) arithmetic, so verified tokens get decode's bits and the output stays identical.
pub const MAX_PROPOSALS: usize = 48;
const _: () = assert!(MAX_PROPOSALS + 1 < crate::kernels::TILED_ATTENTION_FROM);

/// How to speculate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecOptions {
    /// Most tokens proposed per step.
    pub max: usize,
    /// Longest suffix looked up (shorter ones are tried after it, down to 1).
    pub ngram: usize,
    /// Speculate only where it measures faster than plain decoding: the server's [`Gate`], and
    /// in one sequence's loop (`generate`) the [`Planner`], which also picks how many to propose.
    pub gate: bool,
}

impl SpecOptions {
    /// Most proposals a verify pass takes: `max`, at most [`MAX_PROPOSALS`].
    pub fn most(&self) -> usize {
        self.max.min(MAX_PROPOSALS)
    }
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
/// it), then decode `k` tokens. Returns the draft steps timed and their seconds: the steps that
/// read one or two tokens, not a catch-up read of a longer tail (after plain steps the draft did
/// not see), which would make drafting look dearer the longer the planner waited, so that it
/// waited longer still.
pub fn draft(
    d: &mut dyn Runner,
    history: &[u32],
    k: usize,
    out: &mut Vec<u32>,
) -> Result<(usize, f64)> {
    out.clear();
    if k == 0 || history.is_empty() {
        return Ok((0, 0.0));
    }
    let tail = draft_tail(d, history);
    let room = d.ctx().saturating_sub(history.len());
    let k = k.min(room);
    if k == 0 {
        return Ok((0, 0.0));
    }
    let t0 = std::time::Instant::now();
    let short = tail.len() <= 2;
    // A GPU draft may run each step ahead but the last (whose token is not fed back).
    let mut t1 = t0;
    crate::runner::with_greedy_pipeline(d, k > 1, |d| {
        d.forward(tail, Logits::Last)?;
        t1 = std::time::Instant::now();
        let mut greedy = crate::sample::Sampler::new(crate::sample::SamplerConfig::greedy(), 1)?;
        for i in 0..k {
            if i + 1 == k {
                d.pipeline_greedy(false);
            }
            let t = d.sample(&mut greedy)?;
            out.push(t);
            if i + 1 < k {
                d.forward(&[t], Logits::Last)?;
            }
        }
        Ok(())
    })?;
    Ok(if short {
        (k, t0.elapsed().as_secs_f64())
    } else if k > 1 {
        (k - 1, t1.elapsed().as_secs_f64())
    } else {
        (0, 0.0)
    })
}

/// Up to `max` tokens that followed the latest earlier occurrence of the longest suffix of `history`
/// (at most `n` tokens) found again in it; empty when none is found. Returns the suffix length
/// matched (0: none).
pub fn ngram(history: &[u32], n: usize, max: usize, out: &mut Vec<u32>) -> usize {
    out.clear();
    ngram_append(history, n, max, out)
}

/// [`ngram`], appending the proposals to `out`.
pub fn ngram_append(history: &[u32], n: usize, max: usize, out: &mut Vec<u32>) -> usize {
    let len = history.len();
    for k in (1..=n.min(len.saturating_sub(1))).rev() {
        let pat = &history[len - k..];
        // Latest occurrence that ends before the suffix itself and has something after it.
        let found = (0..len - k).rev().find(|&i| &history[i..i + k] == pat);
        if let Some(i) = found {
            let from = i + k;
            out.extend_from_slice(&history[from..(from + max).min(len)]);
            return k;
        }
    }
    0
}

/// An exponential average and its sample count: `x` itself for the first sample, then `w` of it.
fn average(e: &mut (f64, u32), x: f64, w: f64) {
    e.0 = if e.1 == 0 { x } else { (1.0 - w) * e.0 + w * x };
    e.1 = e.1.saturating_add(1);
}

/// The part of `history` a draft model must still read: it keeps what its cache shares with
/// `history` and drops the rest.
fn draft_tail<'a>(d: &mut dyn Runner, history: &'a [u32]) -> &'a [u32] {
    let keep = crate::stream::reusable_prefix(d.tokens(), history);
    d.truncate(keep);
    &history[keep..]
}

/// Brings a draft model's cache to `history` (no logits), e.g. during the target's prefill.
pub(crate) fn draft_read(d: &mut dyn Runner, history: &[u32]) -> Result<()> {
    let tail = draft_tail(d, history);
    if !tail.is_empty() && history.len() < d.ctx() {
        d.forward(tail, Logits::None)?;
    }
    Ok(())
}

/// Rows a [`Planner`] keeps step costs for (a verify of 64 proposals has 65).
const PLAN_ROWS: usize = 66;
/// Proposal classes a [`Planner`] keeps acceptance for: prompt lookup by matched suffix length
/// (0 unused; 1, 2, 3–4, 5–7, 8 or more: [`lookup_class`]), and a draft model ([`DRAFT_CLASS`]).
pub const PLAN_CLASSES: usize = 7;
/// The planner's class of a draft model's proposals.
pub const DRAFT_CLASS: usize = PLAN_CLASSES - 1;

/// The planner's class of a prompt-lookup proposal whose matched suffix is `len` tokens: a longer
/// match is likelier the place being copied, so it is accepted more often.
pub fn lookup_class(len: usize) -> usize {
    match len {
        0..=2 => len,
        3 | 4 => 3,
        5..=7 => 4,
        _ => 5,
    }
}

/// How many tokens to propose, from what this machine measured: the time of a step of r rows (one
/// decode step is 1 row; a verify of k proposals k + 1), the time of a draft model's step, and how
/// often proposals of each class were accepted. A proposal of k tokens, each accepted with
/// probability p while the ones before it were, yields (1 − p^(k+1)) / (1 − p) tokens (the
/// model's own next token included); the planner picks the k with the most tokens per second, and
/// 0 (a plain step) when none beats plain decoding. So speculation costs nothing where it does
/// not pay (a CPU whose verify pass of 8 costs 4 decode steps, a fresh answer that repeats
/// nothing), and proposes fewer tokens where the verify pass grows with them.
#[derive(Debug, Clone)]
pub struct Planner {
    /// Exponential averages of a step's seconds, and samples, by rows in the step.
    cost: Vec<(f64, u32)>,
    /// Seconds per draft-model token.
    draft: (f64, u32),
    /// Accepted and tried proposal positions, decayed, by class.
    accept: [(f64, f64); PLAN_CLASSES],
    steps: u64,
    /// The step of the next probe, the steps between probes (doubled after a probe that was all
    /// rejected, reset after one that was not), and whether the last plan was a probe.
    next_probe: u64,
    probe_every: u64,
    probing: bool,
}

impl Default for Planner {
    fn default() -> Self {
        Planner {
            cost: vec![(0.0, 0); PLAN_ROWS],
            draft: (0.0, 0),
            // A prior of one accepted in two tried: p = 0.5 until measured.
            accept: [(1.0, 2.0); PLAN_CLASSES],
            steps: 0,
            next_probe: PLAN_PROBE,
            probe_every: PLAN_PROBE,
            probing: false,
        }
    }
}

/// Weight of the newest sample in the planner's averages.
const PLAN_EMA: f64 = 0.25;
/// Decay of the acceptance counts per recorded proposal (about the last 30 proposals count).
const PLAN_DECAY: f64 = 0.97;
/// Every this many steps (at first) the planner proposes a little even when it predicts no gain,
/// so that a change of workload (a part of the answer that repeats the prompt) is noticed; each
/// probe rejected outright doubles the interval, up to [`PLAN_PROBE_MAX`].
const PLAN_PROBE: u64 = 16;
const PLAN_PROBE_MAX: u64 = 128;
/// Tokens a probe proposes (a short verify pass: a probe costs little when rejected).
const PLAN_PROBE_TOKENS: usize = 2;
/// A probe needs the measured costs to allow this speed-up at near-full acceptance.
const PLAN_PROBE_GAIN: f64 = 1.15;

impl Planner {
    /// Per-token acceptance estimate of a class.
    pub fn acceptance(&self, class: usize) -> f64 {
        let (a, t) = self.accept[class.min(PLAN_CLASSES - 1)];
        (a / t).clamp(0.0, 0.99)
    }

    /// Seconds of a step of `rows` rows: measured; else interpolated between the nearest
    /// measured sizes, or extrapolated along the last two measured below it (a verify pass grows
    /// about linearly with its rows); with only a plain step measured, its cost (an optimistic
    /// guess, so that proposing gets tried). `None` before any plain step.
    fn step_cost(&self, rows: usize) -> Option<f64> {
        let rows = rows.clamp(1, PLAN_ROWS - 1);
        if self.cost[1].1 == 0 {
            return None;
        }
        if self.cost[rows].1 > 0 {
            return Some(self.cost[rows].0);
        }
        let measured = |r: &usize| self.cost[*r].1 > 0;
        let lo = (1..rows).rev().find(measured).unwrap_or(1);
        let at = |r: usize| self.cost[r].0;
        let line = |a: usize, b: usize| {
            let slope = ((at(b) - at(a)) / (b - a) as f64).max(0.0);
            at(a) + slope * (rows - a) as f64
        };
        Some(match (rows + 1..PLAN_ROWS).find(measured) {
            Some(hi) => line(lo, hi),
            None => match (1..lo).rev().find(measured) {
                Some(below) => line(below, lo),
                None => at(lo),
            },
        })
    }

    /// The best number of tokens to propose (at most `max`, 0: decode plainly) for a proposal of
    /// `class` and its expected tokens per second, from the measured costs alone (no probing);
    /// `drafted`: each proposed token costs a draft-model step. `None` before any plain step.
    pub fn best(&self, class: usize, max: usize, drafted: bool) -> Option<(usize, f64)> {
        let c1 = self.step_cost(1)?;
        let p = self.acceptance(class);
        let (mut best, mut best_rate) = (0usize, 1.0 / c1);
        for k in 1..=max.min(PLAN_ROWS - 2) {
            let r = self.rate(k, p, drafted, c1);
            if r > best_rate {
                (best, best_rate) = (k, r);
            }
        }
        Some((best, best_rate))
    }

    /// Whether a prompt lookup's proposal (`found` tokens of `class`) beats a draft model's of up
    /// to `draft_k`, by the tokens per second [`best`] expects of each (a draft costs its steps;
    /// the lookup none). False until a plain step has been measured.
    ///
    /// [`best`]: Planner::best
    pub fn prefers_lookup(&self, class: usize, found: usize, draft_k: usize) -> bool {
        found > 0
            && match (
                self.best(class, found, false),
                self.best(DRAFT_CLASS, draft_k, true),
            ) {
                (Some((kl, rl)), Some((_, rd))) => kl > 0 && rl >= rd,
                _ => false,
            }
    }

    /// Tokens per second proposing `k` at per-token acceptance `q`: a proposal of k tokens, each
    /// accepted while the ones before it were, yields (1 − q^(k+1)) / (1 − q) tokens.
    fn rate(&self, k: usize, q: f64, drafted: bool, c1: f64) -> f64 {
        let per_draft = if drafted && self.draft.1 > 0 {
            self.draft.0
        } else {
            0.0
        };
        let tokens = (1.0 - q.powi(k as i32 + 1)) / (1.0 - q);
        tokens / (self.step_cost(k + 1).unwrap_or(c1) + k as f64 * per_draft)
    }

    /// Tokens to propose (at most `max`, 0: decode plainly) for a proposal of `class`: [`best`],
    /// or now and then a short probe where nothing pays yet. Counts a step.
    ///
    /// [`best`]: Planner::best
    pub fn plan(&mut self, class: usize, max: usize, drafted: bool) -> usize {
        self.steps += 1;
        let (Some(c1), Some((best, _))) = (self.step_cost(1), self.best(class, max, drafted))
        else {
            return 0;
        };
        if max == 0 {
            return 0;
        }
        // A probe, where the measured costs would let well-accepted proposals pay (a draft model
        // that falls behind must read the skipped tokens again, so probing is not free).
        let probe = best == 0
            && self.steps >= self.next_probe
            && (1..=max.min(PLAN_ROWS - 2))
                .map(|k| self.rate(k, 0.99, drafted, c1))
                .fold(0.0, f64::max)
                > PLAN_PROBE_GAIN / c1;
        self.probing = probe;
        if probe {
            self.next_probe = self.steps + self.probe_every;
            return max.min(PLAN_PROBE_TOKENS);
        }
        best
    }

    /// A target step of `rows` rows took `secs` (drafting not included).
    pub fn record_step(&mut self, rows: usize, secs: f64) {
        if secs.is_nan() || secs <= 0.0 || rows == 0 {
            return;
        }
        average(&mut self.cost[rows.min(PLAN_ROWS - 1)], secs, PLAN_EMA);
    }

    /// A draft model took `secs` for `tokens` steps of one token each.
    pub fn record_draft(&mut self, tokens: usize, secs: f64) {
        if tokens == 0 || secs.is_nan() || secs <= 0.0 {
            return;
        }
        average(&mut self.draft, secs / tokens as f64, PLAN_EMA);
    }

    /// `agree` of `proposed` tokens of `class` were accepted.
    pub fn record_accept(&mut self, class: usize, proposed: usize, agree: usize) {
        if proposed == 0 {
            return;
        }
        if self.probing {
            self.probing = false;
            self.probe_every = if agree == 0 {
                (2 * self.probe_every).min(PLAN_PROBE_MAX)
            } else {
                PLAN_PROBE
            };
            self.next_probe = self.steps + self.probe_every;
        }
        let tried = if agree < proposed { agree + 1 } else { agree };
        let e = &mut self.accept[class.min(PLAN_CLASSES - 1)];
        e.0 = e.0 * PLAN_DECAY + agree as f64;
        e.1 = e.1 * PLAN_DECAY + tried as f64;
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
        average(e, rate, 0.3);
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
    fn the_planner_interpolates_step_costs() {
        let mut p = Planner::default();
        assert_eq!(p.step_cost(4), None);
        p.record_step(1, 0.1);
        assert_eq!(p.step_cost(9), Some(0.1), "only plain measured: optimistic");
        p.record_step(3, 0.2);
        let near = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-9;
        assert!(near(p.step_cost(2), 0.15), "between 1 and 3");
        assert!(near(p.step_cost(5), 0.3), "along 1 → 3");
        p.record_step(9, 0.3);
        assert!(near(p.step_cost(6), 0.25), "between 3 and 9");
    }

    #[test]
    fn the_planner_proposes_what_pays_and_nothing_when_nothing_does() {
        let mut p = Planner::default();
        assert_eq!(
            p.plan(3, 8, false),
            0,
            "a plain step first: nothing measured"
        );
        p.record_step(1, 0.1);
        // Costs as on a 2-core CPU: 2 rows 1.6 steps, 4 rows 2, 8 rows 4, 9 rows 4.5.
        for (r, c) in [
            (2, 0.16),
            (3, 0.19),
            (4, 0.2),
            (5, 0.3),
            (6, 0.32),
            (7, 0.36),
            (8, 0.4),
            (9, 0.45),
        ] {
            p.record_step(r, c);
        }
        // Everything accepted: 3 proposals (4 rows, 0.2 s for 4 tokens) beat 8 (0.45 s for 9).
        for _ in 0..200 {
            p.record_accept(3, 8, 8);
        }
        assert!(p.acceptance(3) > 0.98);
        assert_eq!(p.plan(3, 8, false), 3);
        // Cheap verify passes (a GPU): the longest proposal.
        let mut g = p.clone();
        for _ in 0..20 {
            for r in 2..=9 {
                g.record_step(r, 0.1 + 0.005 * r as f64);
            }
        }
        assert_eq!(g.plan(3, 8, false), 8);
        // Rejected proposals: plain steps, but a probe now and then.
        for _ in 0..200 {
            p.record_accept(1, 8, 0);
        }
        let ks: Vec<usize> = (0..2 * PLAN_PROBE).map(|_| p.plan(1, 8, false)).collect();
        let probes = ks.iter().filter(|&&k| k > 0).count();
        assert_eq!(probes, 2, "{ks:?}");
        assert!(
            ks.iter().all(|&k| k <= PLAN_PROBE_TOKENS),
            "probes are short"
        );
        // Probes rejected outright come less and less often.
        let mut q = p.clone();
        let mut probes = 0;
        for _ in 0..256 {
            let k = q.plan(1, 8, false);
            if k > 0 {
                probes += 1;
                q.record_accept(1, k, 0);
            }
        }
        assert!((3..=5).contains(&probes), "{probes} probes in 256 steps");
        // A draft model whose steps cost half a target step: fewer proposals than lookup.
        let mut d = p.clone();
        for _ in 0..200 {
            d.record_accept(3, 4, 3);
        }
        let free = d.plan(3, 8, false);
        d.record_draft(4, 0.2);
        let drafted = d.plan(3, 8, true);
        assert!(drafted <= free && free > 0, "{drafted} {free}");
        // Draft steps that cost a whole target step: no gain even if all were accepted, no probes.
        d.record_draft(1, 10.0);
        assert!((0..2 * PLAN_PROBE).all(|_| d.plan(3, 8, true) == 0));
    }

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

    /// Prompt lookup and a draft model compared by the rate each promises: at the same acceptance
    /// the lookup wins (no draft steps); a lookup class that is mostly rejected loses.
    #[test]
    fn the_planner_compares_lookup_with_the_draft() {
        let mut p = Planner::default();
        assert_eq!(p.best(DRAFT_CLASS, 4, true), None, "nothing measured");
        p.record_step(1, 0.1);
        p.record_step(5, 0.15);
        p.record_draft(4, 0.16); // 0.04 s a draft token
        for _ in 0..20 {
            p.record_accept(DRAFT_CLASS, 4, 4);
            p.record_accept(lookup_class(3), 4, 4);
            p.record_accept(lookup_class(1), 4, 0);
        }
        assert_eq!(lookup_class(4), lookup_class(3));
        assert_eq!(lookup_class(30), lookup_class(8));
        assert_ne!(lookup_class(9), DRAFT_CLASS);
        let (kd, rd) = p.best(DRAFT_CLASS, 4, true).unwrap();
        let (kl, rl) = p.best(lookup_class(3), 4, false).unwrap();
        assert!(
            kd > 0 && kl > 0 && rl > rd,
            "lookup {kl} at {rl}, draft {kd} at {rd}"
        );
        let (k1, r1) = p.best(lookup_class(1), 4, false).unwrap();
        assert_eq!(k1, 0, "rejected lookups are not proposed");
        assert!(r1 < rd);
    }

    /// A draft's timing counts its one-token steps, not the read of a long tail it fell behind by.
    #[test]
    fn a_draft_times_its_steps_not_its_catch_up() {
        use crate::synth::{synth_model, SynthSpec};
        let g = crate::gguf::Gguf::from_bytes(synth_model(&SynthSpec::tiny_qwen2())).unwrap();
        let (model, _, _) = crate::load::from_gguf(g).unwrap();
        let opts = crate::cpu::SessionOptions {
            ctx: 128,
            batch: 64,
            ..Default::default()
        };
        let mut d = crate::cpu::Session::new(std::sync::Arc::new(model), opts).unwrap();
        let mut history: Vec<u32> = (0..40).map(|i| 3 + i * 5).collect();
        let mut out = Vec::new();
        // A fresh cache: the 40 tokens are a catch-up read, not a step.
        let (steps, secs) = draft(&mut d, &history, 3, &mut out).unwrap();
        assert_eq!((out.len(), steps), (3, 2));
        assert!(secs > 0.0);
        // All accepted plus the target's own token: a tail of two (the last proposal and it).
        history.extend_from_slice(&out);
        history.push(9);
        let (steps, _) = draft(&mut d, &history, 3, &mut out).unwrap();
        assert_eq!((out.len(), steps), (3, 3));
        // One proposal after a long tail: nothing to time.
        history.extend((0..20).map(|i| 5 + i));
        let (steps, secs) = draft(&mut d, &history, 1, &mut out).unwrap();
        assert_eq!((out.len(), steps, secs), (1, 0, 0.0));
    }
}
