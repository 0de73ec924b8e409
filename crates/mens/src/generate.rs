//! The generation loop for one sequence on any backend: prefill the prompt, then sample and decode one
//! token per step, streaming text through a callback (the CLI's `run` and `chat`; the server goes
//! through the scheduler, with the same [`TokenStream`]).

use crate::error::{Error, Result};
use crate::runner::{Logits, Runner};
use crate::sample::Sampler;
use crate::spec::SpecOptions;
use crate::stream::TokenStream;
use crate::tokenizer::Tokenizer;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Default)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    /// Generation stops before any of these strings (they are not emitted).
    pub stop: Vec<String>,
    /// Re-run the whole sequence every step instead of using the KV cache (the uncached baseline).
    pub no_kv_cache: bool,
    /// Speculative decoding (no penalties, grammar or logprobs; otherwise ignored): greedy, the
    /// output is exactly what decoding one token per step gives; sampling, every token is drawn
    /// from exactly the same distribution.
    pub spec: Option<SpecOptions>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-sequence or end-of-turn token.
    Eos,
    /// A stop string.
    Stop,
    /// `max_tokens` was reached.
    Length,
    /// The context is full.
    ContextFull,
    /// The callback asked to stop.
    Cancelled,
}

#[derive(Debug, Clone)]
pub struct Stats {
    pub prompt_tokens: usize,
    /// From the start to the first token known (prefill + first sample).
    pub prefill: Duration,
    /// Tokens sampled (the stop token included when there is one).
    pub generated: usize,
    /// Decode steps (forward pass + sampling) and their total time.
    pub decode_steps: usize,
    pub decode: Duration,
    pub stop: StopReason,
    /// Speculation: tokens proposed and accepted (0 without it).
    pub proposed: usize,
    pub accepted: usize,
}

impl Stats {
    pub fn prefill_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill.as_secs_f64().max(1e-9)
    }
    /// Tokens per second of decoding (a step yields one token, plus the accepted proposals).
    pub fn decode_tps(&self) -> f64 {
        (self.decode_steps + self.accepted) as f64 / self.decode.as_secs_f64().max(1e-9)
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
    on_text: impl FnMut(&str) -> bool,
) -> Result<Stats> {
    generate_with_draft(session, None, tokenizer, sampler, prompt, opts, on_text)
}

/// [`generate`] with a draft model proposing (when `opts.spec` is set; else prompt lookup does). The
/// draft keeps its own cache, brought to the target's history before each proposal; the number
/// of proposals adapts: it grows by 2 (up to `spec.max`) when all were accepted, else becomes
/// the accepted count + 1.
pub fn generate_with_draft<R: Runner + ?Sized>(
    session: &mut R,
    mut draft_model: Option<&mut (dyn Runner + 'static)>,
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
    // Times are what the caller waits for: a step ends when its token is known (on a GPU the
    // forward pass is an asynchronous launch, and sampling waits for it).
    let t0 = Instant::now();
    if opts.no_kv_cache {
        session.rerun(prompt, &mut all)?;
    } else {
        session.forward(prompt, Logits::Last)?;
    }
    let mut pending = match opts.max_tokens {
        0 => None,
        _ => Some(session.sample(sampler)?),
    };
    // The draft model reads the prompt too, as part of the wait for the first token (else its
    // first proposal would prefill it inside a decode step).
    if let (Some(d), true) = (
        draft_model.as_deref_mut(),
        opts.spec.is_some() && pending.is_some(),
    ) {
        crate::spec::draft_read(d, session.tokens())?;
    }
    let prefill = t0.elapsed();

    let mut stats = Stats {
        prompt_tokens: prompt.len(),
        prefill,
        generated: 0,
        decode_steps: 0,
        decode: Duration::ZERO,
        stop: StopReason::Length,
        proposed: 0,
        accepted: 0,
    };
    let mut stream = TokenStream::new(opts.stop.clone());
    // Greedy: the output is exactly plain decoding's; sampling: each token is drawn from exactly
    // the plain distribution (`Sampler::speculate`), with other random draws.
    let spec = opts
        .spec
        .filter(|s| s.max > 0 && !opts.no_kv_cache && !sampler.needs_logits());
    let greedy = sampler.is_greedy();
    let mut rows: Vec<f32> = Vec::new();
    // Tokens to emit after `pending`: accepted proposals, already in the cache, then the model's
    // own next token (not in the cache, like `pending`).
    let mut queue: std::collections::VecDeque<u32> = Default::default();
    let mut ahead = 0usize;
    let (mut draft, mut step_tokens, mut picks) = (Vec::new(), Vec::new(), Vec::new());
    let len0 = session.tokens().len();
    let mut popped = 0usize;
    let mut k = spec.map_or(0, |s| s.max.min(4));
    let mut planner = crate::spec::Planner::default();

    // Plain greedy decoding may run a step ahead on a GPU (the loop reads no logits).
    let pipelined = spec.is_none() && !opts.no_kv_cache;
    crate::runner::with_greedy_pipeline(session, pipelined, |session| {
        while let Some(next) = pending.take().or_else(|| queue.pop_front()) {
            popped += 1;
            let in_cache = ahead > 0;
            ahead = ahead.saturating_sub(1);
            stats.generated += 1;
            if tokenizer.is_stop(next) {
                stats.stop = StopReason::Eos;
                break;
            }
            let (emit, hit) = stream.push(tokenizer, next);
            if !emit.is_empty() && !on_text(emit) {
                stats.stop = StopReason::Cancelled;
                break;
            }
            if hit {
                stats.stop = StopReason::Stop;
                break;
            }
            if stats.generated >= opts.max_tokens {
                stats.stop = StopReason::Length;
                break;
            }
            if in_cache {
                continue;
            }
            if session.tokens().len() + 1 >= ctx {
                stats.stop = StopReason::ContextFull;
                break;
            }
            let t = Instant::now();
            draft.clear();
            let mut class = 0;
            if let Some(sp) = spec {
                // Propose from the history (the cache and `next`): as many tokens as the planner
                // expects to pay (with the gate), else `k`.
                step_tokens.clear();
                step_tokens.extend_from_slice(session.tokens());
                step_tokens.push(next);
                let room = ctx - session.tokens().len() - 1;
                // The step yields the accepted proposals and one more token: stay within max_tokens.
                let left = (opts.max_tokens - stats.generated).saturating_sub(1);
                let cap = sp.most().min(room - 1).min(left);
                // The prompt lookup's proposal; with a draft model, the draft's instead unless the
                // planner expects more of the lookup (it costs no draft steps: an answer that
                // repeats the prompt).
                let found = crate::spec::ngram(&step_tokens, sp.ngram, cap, &mut draft);
                let lookup = crate::spec::lookup_class(found);
                let dk = k.min(cap);
                let lookup_pays = || sp.gate && planner.prefers_lookup(lookup, draft.len(), dk);
                match draft_model.as_deref_mut() {
                    Some(d) if !lookup_pays() => {
                        class = crate::spec::DRAFT_CLASS;
                        let want = if sp.gate {
                            planner.plan(class, dk, true)
                        } else {
                            dk
                        };
                        let (steps, secs) = crate::spec::draft(d, &step_tokens, want, &mut draft)?;
                        planner.record_draft(steps, secs);
                    }
                    _ => {
                        class = lookup;
                        if sp.gate {
                            let want = planner.plan(class, draft.len(), false);
                            draft.truncate(want);
                        }
                    }
                }
            }
            let tv = Instant::now();
            if let (Some(sp), false) = (spec, draft.is_empty()) {
                // Check every proposal in one pass.
                step_tokens.clear();
                step_tokens.push(next);
                step_tokens.extend_from_slice(&draft);
                picks.clear();
                rows.clear();
                let base = session.tokens().len();
                let logits = if greedy {
                    Logits::Argmax {
                        from: 0,
                        f: &mut |_, t| picks.push(t),
                    }
                } else {
                    Logits::All {
                        from: 0,
                        f: &mut |_, l| rows.extend_from_slice(l),
                    }
                };
                session.forward(&step_tokens, logits)?;
                let (agree, next_token) = if greedy {
                    let agree = crate::spec::agreeing(&draft, &picks);
                    (agree, picks[agree])
                } else {
                    let v = rows.len() / step_tokens.len();
                    let mut out = None;
                    for (i, &d) in draft.iter().enumerate() {
                        let (ok, t) = sampler.speculate(&rows[i * v..(i + 1) * v], d);
                        if !ok {
                            out = Some((i, t));
                            break;
                        }
                    }
                    out.unwrap_or_else(|| {
                        let i = draft.len();
                        (i, sampler.choose(&mut rows[i * v..(i + 1) * v], &[]))
                    })
                };
                session.truncate(base + 1 + agree);
                planner.record_step(step_tokens.len(), tv.elapsed().as_secs_f64());
                queue.extend(draft[..agree].iter().copied());
                queue.push_back(next_token);
                ahead = agree;
                stats.proposed += draft.len();
                stats.accepted += agree;
                planner.record_accept(class, draft.len(), agree);
                k = crate::spec::next_k(k, draft.len(), agree, sp.max);
            } else {
                if opts.no_kv_cache {
                    session.rerun(&[next], &mut all)?;
                } else {
                    session.forward(&[next], Logits::Last)?;
                }
                pending = Some(session.sample(sampler)?);
                planner.record_step(1, tv.elapsed().as_secs_f64());
            }
            stats.decode += t.elapsed();
            stats.decode_steps += 1;
        }
        Ok(())
    })?;
    // As without speculation: the cache holds the prompt and every token but the last one.
    if spec.is_some() && popped > 0 && session.tokens().len() > len0 + popped - 1 {
        session.truncate(len0 + popped - 1);
    }
    let rest = stream.finish();
    if !rest.is_empty() {
        on_text(rest);
    }
    Ok(stats)
}
