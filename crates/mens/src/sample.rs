//! Sampling: logit bias, penalties, top-k, top-p, min-p, temperature, seeded draw; greedy at
//! temperature 0. The order follows llama.cpp's default chain (logit bias → penalties → top-k →
//! top-p → min-p → temperature → draw).
//! Every buffer is allocated once, with the sampler.

use crate::error::{Error, Result};
use crate::grammar::Constraint;
use rand::{Rng, SeedableRng};

#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1 disables.
    pub top_p: f32,
    /// 0 disables.
    pub min_p: f32,
    /// 1 disables.
    pub repeat_penalty: f32,
    pub repeat_last_n: usize,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    pub seed: u64,
    /// Added to these tokens' logits before anything else (OpenAI's `logit_bias`), each in
    /// [-100, 100]: -100 bans a token in practice, 100 all but forces it.
    pub logit_bias: Vec<(u32, f32)>,
}

/// Most `logit_bias` entries a sampler takes.
pub const MAX_LOGIT_BIAS: usize = 4096;

impl SamplerConfig {
    /// llama.cpp's defaults (the CLI's and the server's).
    pub const DEFAULT: SamplerConfig = SamplerConfig {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        repeat_penalty: 1.0,
        repeat_last_n: 64,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        seed: 0xDEC0DE,
        logit_bias: Vec::new(),
    };
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl SamplerConfig {
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            ..Default::default()
        }
    }

    /// Every token the config names (its logit bias) is below `vocab_size`.
    pub fn check_tokens(&self, vocab_size: usize) -> Result<()> {
        match self.logit_bias.iter().find(|b| b.0 as usize >= vocab_size) {
            Some(&(id, _)) => Err(Error::InvalidArgument(format!(
                "logit bias names token {id}, but the vocabulary has {vocab_size} tokens"
            ))),
            None => Ok(()),
        }
    }

    /// Whether a logit bias changes the logits.
    pub fn biased(&self) -> bool {
        !self.logit_bias.is_empty()
    }

    /// Whether any repetition penalty changes the logits (then sampling needs the history).
    pub fn penalised(&self) -> bool {
        (self.repeat_penalty != 1.0
            || self.frequency_penalty != 0.0
            || self.presence_penalty != 0.0)
            && self.repeat_last_n > 0
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad(format!(
                "temperature must be a finite number ≥ 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top-p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min-p must be in [0, 1], got {}", self.min_p));
        }
        if !self.repeat_penalty.is_finite() || self.repeat_penalty <= 0.0 {
            return bad(format!(
                "repeat penalty must be > 0, got {}",
                self.repeat_penalty
            ));
        }
        for (name, v) in [
            ("frequency penalty", self.frequency_penalty),
            ("presence penalty", self.presence_penalty),
        ] {
            if !v.is_finite() || !(-2.0..=2.0).contains(&v) {
                return bad(format!("{name} must be in [-2, 2], got {v}"));
            }
        }
        if self.repeat_last_n > 1 << 20 {
            return bad(format!("repeat-last-n {} is too large", self.repeat_last_n));
        }
        if self.logit_bias.len() > MAX_LOGIT_BIAS {
            return bad(format!(
                "logit bias has {} entries, more than the limit of {MAX_LOGIT_BIAS}",
                self.logit_bias.len()
            ));
        }
        for &(id, b) in &self.logit_bias {
            if !b.is_finite() || !(-100.0..=100.0).contains(&b) {
                return bad(format!(
                    "the logit bias of token {id} must be in [-100, 100], got {b}"
                ));
            }
        }
        Ok(())
    }
}

pub struct Sampler {
    pub config: SamplerConfig,
    /// A grammar the output must follow: disallowed tokens are masked before sampling.
    pub constraint: Option<Constraint>,
    /// Record the sampled token's log-probability and the `n` most likely tokens' (n ≤ 20).
    pub logprobs: Option<usize>,
    /// What the last [`Sampler::sample`] recorded, when `logprobs` is set.
    pub last: Option<TokenLogprobs>,
    rng: rand::rngs::StdRng,
    candidates: Vec<(f32, u32)>,
    window: Vec<u32>,
    /// The penalty window's (token, count) pairs.
    counts: Vec<(u32, u32)>,
    top: Vec<(f32, u32)>,
    /// Tokens to give instead of sampling, first to last (a reasoning budget's closing tag).
    forced: std::collections::VecDeque<u32>,
    /// The scheduler may force tokens: sample on the host, token by token (no device picks, no
    /// speculation).
    pub hold: bool,
}

/// Log-probabilities of the model's distribution at one step (before penalties, grammar and
/// truncation: what the model said).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    /// The most likely tokens, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// Most `top_logprobs` a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

impl Sampler {
    pub fn new(config: SamplerConfig, vocab_size: usize) -> Result<Self> {
        config.validate()?;
        config.check_tokens(vocab_size)?;
        Ok(Sampler {
            rng: rand::rngs::StdRng::seed_from_u64(config.seed),
            candidates: Vec::with_capacity(vocab_size),
            // Grown as tokens come: a window of the whole context is not allocated up front.
            window: Vec::with_capacity(config.repeat_last_n.min(1024)),
            counts: Vec::with_capacity(config.repeat_last_n.min(1024)),
            top: Vec::new(),
            forced: Default::default(),
            hold: false,
            constraint: None,
            logprobs: None,
            last: None,
            config,
        })
    }

    /// Whether sampling needs the whole logits row on the host (a device may pick greedy or
    /// top-k tokens itself otherwise).
    pub fn needs_logits(&self) -> bool {
        self.forcing()
            || self.constraint.is_some()
            || self.logprobs.is_some()
            || self.config.penalised()
            || self.config.biased()
    }

    /// Pick the next token, as [`Sampler::choose`], after recording log-probabilities and masking
    /// what the grammar forbids; the grammar then takes the token.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> Result<u32> {
        let lse = match self.logprobs {
            Some(n) => {
                let n = n.min(MAX_TOP_LOGPROBS);
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
                let lse = max + sum.ln() as f32;
                self.top.clear();
                if n > 0 {
                    self.top
                        .extend(logits.iter().enumerate().map(|(i, &l)| (l, i as u32)));
                    let desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0);
                    if n < self.top.len() {
                        self.top.select_nth_unstable_by(n - 1, desc);
                        self.top.truncate(n);
                    }
                    self.top.sort_unstable_by(desc);
                }
                Some(lse)
            }
            None => None,
        };
        // Penalties change logits in place: keep the raw ones then (the mask only touches tokens
        // that cannot be chosen).
        let raw = (lse.is_some() && (self.config.penalised() || self.config.biased()))
            .then(|| logits.to_vec());
        let t = match self.forced.pop_front() {
            Some(t) => t,
            None => {
                if let Some(c) = self.constraint.as_mut() {
                    c.mask(logits)?;
                }
                self.choose(logits, history)
            }
        };
        if let Some(c) = self.constraint.as_mut() {
            c.accept(t)?;
        }
        if let Some(lse) = lse {
            let l = raw.as_deref().unwrap_or(logits)[t as usize];
            self.last = Some(TokenLogprobs {
                token: t,
                logprob: l - lse,
                top: self.top.iter().map(|&(l, i)| (i, l - lse)).collect(),
            });
        }
        Ok(t)
    }

    /// Give these tokens at the next samples, in order, whatever the logits (a grammar still takes
    /// them).
    pub fn force(&mut self, ids: &[u32]) {
        self.forced.extend(ids);
    }

    /// Whether tokens are or may be forced (sampling stays on the host).
    pub fn forcing(&self) -> bool {
        self.hold || !self.forced.is_empty()
    }

    /// Whether the grammar (if any) is complete: nothing may follow.
    pub fn grammar_done(&self) -> bool {
        self.constraint.as_ref().is_some_and(|c| c.is_done())
    }

    pub fn is_greedy(&self) -> bool {
        self.config.temperature <= 0.0
    }

    /// The distinct tokens of the penalty window (the last `repeat_last_n` of `history`) and how
    /// often each occurs, ascending by id: what the penalties act on (also on a GPU).
    pub fn penalty_counts(&mut self, history: &[u32], out: &mut Vec<(u32, u32)>) {
        out.clear();
        self.window.clear();
        let start = history.len().saturating_sub(self.config.repeat_last_n);
        self.window.extend_from_slice(&history[start..]);
        self.window.sort_unstable();
        for &id in &self.window {
            match out.last_mut() {
                Some((last, n)) if *last == id => *n += 1,
                _ => out.push((id, 1)),
            }
        }
    }

    /// Pick the next token. `logits` is scratch (penalties are applied in place); `history` holds the
    /// tokens so far (prompt and generated), for the penalties.
    pub fn choose(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        for &(id, b) in &self.config.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += b;
            }
        }
        if self.config.penalised() {
            let mut counts = std::mem::take(&mut self.counts);
            self.penalty_counts(history, &mut counts);
            let c = &self.config;
            for &(id, count) in &counts {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = if *l > 0.0 {
                        *l / c.repeat_penalty
                    } else {
                        *l * c.repeat_penalty
                    };
                    *l -= count as f32 * c.frequency_penalty + c.presence_penalty;
                }
            }
            self.counts = counts;
        }
        if self.is_greedy() {
            return argmax(logits);
        }
        let total = self.weights(logits);
        let mut r = self.rng.gen::<f32>() * total;
        let cand = &self.candidates;
        for x in cand.iter() {
            r -= x.0;
            if r <= 0.0 {
                return x.1;
            }
        }
        cand[cand.len() - 1].1
    }

    /// Fill `candidates` with the tokens that survive top-k, top-p and min-p, weighted by p^(1/T)
    /// (not normalised); returns the total weight. Sorted by weight, largest first.
    fn weights(&mut self, logits: &[f32]) -> f32 {
        let c = &self.config;
        let cand = &mut self.candidates;
        cand.clear();
        cand.extend(logits.iter().enumerate().map(|(i, &l)| (l, i as u32)));
        let desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0);
        if c.top_k > 0 && c.top_k < cand.len() {
            cand.select_nth_unstable_by(c.top_k - 1, desc);
            cand.truncate(c.top_k);
        }
        cand.sort_unstable_by(desc);

        // Softmax of the raw logits for top-p and min-p (temperature comes after, as in llama.cpp).
        let max = cand[0].0;
        let mut sum = 0f32;
        for x in cand.iter_mut() {
            x.0 = (x.0 - max).exp();
            sum += x.0;
        }
        let mut keep = cand.len();
        if c.top_p < 1.0 {
            let mut cum = 0f32;
            for (i, x) in cand.iter().enumerate() {
                cum += x.0 / sum;
                if cum >= c.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        if c.min_p > 0.0 {
            let floor = c.min_p * cand[0].0; // the top probability (unnormalised) times min-p
            keep = keep.min(cand.iter().take_while(|x| x.0 >= floor).count().max(1));
        }
        cand.truncate(keep.max(1));

        // Temperature on the survivors: p^(1/T) is softmax(logit / T) up to normalisation.
        let inv_t = 1.0 / c.temperature;
        let mut total = 0f32;
        for x in cand.iter_mut() {
            x.0 = x.0.powf(inv_t);
            total += x.0;
        }
        total
    }

    /// Speculative sampling of one position whose proposal is `proposal` (a deterministic
    /// proposal: prompt lookup or a greedy draft). Accept it with its probability p under this
    /// sampler; else draw from the distribution without it, renormalised. The token that comes out
    /// is distributed exactly as a plain draw. Returns (accepted, token). No penalties (the caller
    /// checks `needs_logits`); greedy: accepted when it is the argmax.
    pub fn speculate(&mut self, logits: &[f32], proposal: u32) -> (bool, u32) {
        if self.is_greedy() {
            let t = argmax(logits);
            return (t == proposal, t);
        }
        let total = self.weights(logits);
        let w = self
            .candidates
            .iter()
            .find(|x| x.1 == proposal)
            .map_or(0.0, |x| x.0);
        if self.rng.gen::<f32>() * total < w {
            return (true, proposal);
        }
        let rest = total - w;
        let mut r = self.rng.gen::<f32>() * rest;
        let mut last = proposal;
        for x in self.candidates.iter().filter(|x| x.1 != proposal) {
            last = x.1;
            r -= x.0;
            if r <= 0.0 {
                return (false, x.1);
            }
        }
        (false, last)
    }
}

/// Index of the largest value (the first one on ties), as llama.cpp's greedy sampler.
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    let mut bv = f32::NEG_INFINITY;
    for (i, &v) in x.iter().enumerate() {
        if v > bv {
            bv = v;
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forced_tokens_come_first_and_keep_sampling_on_the_host() {
        let mut s = Sampler::new(SamplerConfig::greedy(), 8).unwrap();
        assert!(!s.needs_logits());
        s.force(&[5, 7]);
        assert!(s.needs_logits() && s.forcing());
        let logits = [9.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let picks: Vec<u32> = (0..3)
            .map(|_| s.sample(&mut logits.clone(), &[]).unwrap())
            .collect();
        assert_eq!(picks, [5, 7, 0]);
        assert!(!s.forcing());
        s.hold = true;
        assert!(s.needs_logits());
    }

    #[test]
    fn invalid_values_are_rejected() {
        for bad in [
            SamplerConfig {
                temperature: -1.0,
                ..Default::default()
            },
            SamplerConfig {
                top_p: 2.0,
                ..Default::default()
            },
            SamplerConfig {
                top_p: 0.0,
                ..Default::default()
            },
            SamplerConfig {
                min_p: 1.5,
                ..Default::default()
            },
            SamplerConfig {
                repeat_penalty: 0.0,
                ..Default::default()
            },
            SamplerConfig {
                temperature: f32::NAN,
                ..Default::default()
            },
        ] {
            assert!(Sampler::new(bad, 10).is_err());
        }
    }

    #[test]
    fn same_seed_same_draws_and_filters_hold() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let cfg = SamplerConfig {
            top_k: 5,
            seed: 42,
            ..Default::default()
        };
        let mut a = Sampler::new(cfg.clone(), 100).unwrap();
        let mut b = Sampler::new(cfg, 100).unwrap();
        let mut top5: Vec<u32> = (0..100).collect();
        top5.sort_by(|&x, &y| logits[y as usize].total_cmp(&logits[x as usize]));
        top5.truncate(5);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let x = a.choose(&mut logits.clone(), &[]);
            assert_eq!(x, b.choose(&mut logits.clone(), &[]));
            assert!(top5.contains(&x), "token {x} is outside the top 5");
            seen.insert(x);
        }
        assert!(
            seen.len() > 1,
            "temperature 0.8 should not always pick one token"
        );
    }

    /// The speculative rule gives each token its plain probability, whatever the proposal, also when
    /// the proposal is filtered out (top-k).
    #[test]
    fn speculative_sampling_keeps_the_distribution() {
        let logits = [2.0f32, 1.0, 0.5, -1.0, 0.0];
        for top_k in [0, 3] {
            let cfg = SamplerConfig {
                temperature: 0.7,
                top_k,
                top_p: 1.0,
                min_p: 0.0,
                seed: 9,
                ..Default::default()
            };
            let mut want = vec![0f64; 5];
            let mut ranked: Vec<usize> = (0..5).collect();
            ranked.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
            let kept = if top_k > 0 {
                &ranked[..top_k]
            } else {
                &ranked[..]
            };
            let z: f64 = kept.iter().map(|&i| (logits[i] as f64 / 0.7).exp()).sum();
            for &i in kept {
                want[i] = (logits[i] as f64 / 0.7).exp() / z;
            }
            for proposal in 0..5u32 {
                let mut s = Sampler::new(cfg.clone(), 5).unwrap();
                let n = 200_000;
                let mut got = vec![0f64; 5];
                let mut accepted = 0;
                for _ in 0..n {
                    let (a, t) = s.speculate(&logits, proposal);
                    got[t as usize] += 1.0 / n as f64;
                    accepted += a as usize;
                    assert!(!a || t == proposal);
                }
                for i in 0..5 {
                    assert!(
                        (got[i] - want[i]).abs() < 0.005,
                        "top-k {top_k}, proposal {proposal}: token {i} drawn {:.4}, want {:.4}",
                        got[i],
                        want[i]
                    );
                }
                let p = want[proposal as usize];
                assert!(
                    (accepted as f64 / n as f64 - p).abs() < 0.005,
                    "acceptance ≠ p"
                );
            }
        }
    }

    #[test]
    fn greedy_and_repeat_penalty() {
        let mut s = Sampler::new(SamplerConfig::greedy(), 4).unwrap();
        assert_eq!(s.choose(&mut [0.0, 3.0, 2.9, 1.0], &[]), 1);
        let mut s = Sampler::new(
            SamplerConfig {
                repeat_penalty: 1.5,
                ..SamplerConfig::greedy()
            },
            4,
        )
        .unwrap();
        assert_eq!(s.choose(&mut [0.0, 3.0, 2.9, 1.0], &[1, 1]), 2);
    }

    #[test]
    fn logit_bias_bans_forces_and_is_checked() {
        let with = |bias: Vec<(u32, f32)>, temperature: f32| SamplerConfig {
            logit_bias: bias,
            temperature,
            seed: 3,
            ..Default::default()
        };
        let logits = [0.0f32, 3.0, 2.9, 1.0];
        // Greedy: -100 takes the best token out, +100 puts the worst in.
        let mut s = Sampler::new(with(vec![(1, -100.0)], 0.0), 4).unwrap();
        assert!(s.needs_logits());
        assert_eq!(s.choose(&mut logits.clone(), &[]), 2);
        let mut s = Sampler::new(with(vec![(0, 100.0)], 0.0), 4).unwrap();
        assert_eq!(s.choose(&mut logits.clone(), &[]), 0);
        // Sampled: a banned token is never drawn.
        let mut s = Sampler::new(with(vec![(1, -100.0), (2, -100.0)], 1.0), 4).unwrap();
        for _ in 0..2000 {
            let t = s.choose(&mut logits.clone(), &[]);
            assert!(t == 0 || t == 3, "{t}");
        }
        for (bias, want) in [
            (vec![(1, 100.5)], "[-100, 100]"),
            (vec![(1, f32::NAN)], "[-100, 100]"),
            (vec![(0, 1.0); MAX_LOGIT_BIAS + 1], "limit"),
        ] {
            let e = Sampler::new(with(bias, 0.0), 4).err().unwrap().to_string();
            assert!(e.contains(want), "{e}");
        }
        let e = Sampler::new(with(vec![(4, 1.0)], 0.0), 4)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("vocabulary has 4"), "{e}");
    }
}
