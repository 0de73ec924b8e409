//! `mens bench`: time to first token at the `--prompt` sizes, the time of every decode step from 1 to
//! `--steps` (with and without the KV cache), llama-bench-style decode tests at `--depth`, memory, heap
//! allocations and kernel dispatches per decode step. Prompts are random ids from the ordinary part of
//! the model's vocabulary. Output: a Markdown table (rows = metrics, columns = configurations), JSON
//! with every raw figure and the machine, and an SVG plot of per-step time against step.
//!
//! [`Plan`] works out what to run from the flags, [`measure`] runs it on one runner, `report` writes
//! the results.

mod report;

use crate::args::BenchArgs;
use crate::load;
use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressStyle};
use mens::alloc::allocations;
use mens::cpu::{dispatches, Session, SessionOptions};
use mens::load::Backend;
use mens::runner::{Logits, Runner};
use mens::sample::{Sampler, SamplerConfig};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::time::Instant;

/// Tokens of prompt before the decode schedule's step 1.
const SCHEDULE_PROMPT: usize = 16;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The steps of the window reported at `point`: `window` steps starting there (ending at the last
/// step for points near the end).
fn window_at(point: usize, window: usize, steps: usize) -> std::ops::RangeInclusive<usize> {
    let w = window.min(steps);
    let start = point.clamp(1, steps + 1 - w);
    start..=start + w - 1
}

/// One configuration's decode schedule.
struct Schedule {
    cached: bool,
    /// (step, seconds) for every timed step.
    times: Vec<(usize, f64)>,
    allocations_per_step: f64,
    dispatches_per_step: f64,
}

impl Schedule {
    fn tps_over(&self, r: &std::ops::RangeInclusive<usize>) -> f64 {
        let t: Vec<f64> = self
            .times
            .iter()
            .filter(|(s, _)| r.contains(s))
            .map(|x| x.1)
            .collect();
        t.len() as f64 / t.iter().sum::<f64>()
    }
    fn name(&self) -> &'static str {
        if self.cached {
            "KV cache"
        } else {
            "no KV cache"
        }
    }
}

/// What a bench run measures, worked out from the flags before anything is loaded.
struct Plan {
    /// Context the runner needs.
    ctx: usize,
    /// The last reported step (the far side of the paired test).
    last_point: usize,
    /// Reported steps.
    points: Vec<usize>,
    /// Steps the uncached schedule times (the reported windows).
    uncached_steps: Vec<usize>,
    /// Configurations: with the KV cache (true), without (false).
    configs: Vec<bool>,
    /// Progress units: prefill reps, timed decode steps, depth-test reps.
    total: usize,
}

impl Plan {
    fn new(args: &BenchArgs) -> Result<Plan> {
        if args.reps == 0 || args.prompt.contains(&0) || args.window == 0 {
            bail!("invalid argument: --reps, --window and prompt sizes must be > 0");
        }
        if args.steps > 1 << 16 || args.gen > 1 << 16 {
            bail!("invalid argument: --steps and --gen must be at most 65536");
        }
        // The context limit (2^20 tokens), named by the flags that set it.
        if let Some(p) = args.prompt.iter().find(|&&p| p >= 1 << 20) {
            bail!("invalid argument: --prompt {p} is more than the 1048575 tokens a context holds");
        }
        if let Some(d) = args.depth.iter().find(|&&d| d >= (1 << 20) - (1 << 16) - 1) {
            bail!("invalid argument: --depth {d} with --gen is more than the 1048575 tokens a context holds");
        }
        if !args.concurrency.is_empty()
            && (args.concurrency.iter().any(|&n| n == 0 || n > 1024)
                || args.concurrency_prompt == 0
                || args.concurrency_prompt > 1 << 16
                || args.gen == 0)
        {
            bail!("invalid argument: --concurrency takes 1 to 1024 sequences, --concurrency-prompt 1 to 65536 tokens, and --gen must be > 0");
        }
        if args.verify.iter().any(|&k| k == 0 || k > 64) || args.verify_depth > 1 << 16 {
            bail!("invalid argument: --verify takes 1 to 64 tokens a pass, --verify-depth at most 65536");
        }
        let max_depth = args.depth.iter().copied().max().unwrap_or(0);
        let max_prompt = args.prompt.iter().copied().max().unwrap_or(0);
        let last_point = args
            .at
            .iter()
            .copied()
            .max()
            .unwrap_or(1)
            .clamp(1, args.steps.max(1));
        let ctx = (max_prompt + 1)
            .max(SCHEDULE_PROMPT + args.steps + 1)
            .max(SCHEDULE_PROMPT + last_point + args.paired + 1)
            .max(max_depth + args.gen + 1)
            .max(args.verify_depth + args.verify.iter().max().unwrap_or(&0) + 1)
            .max(16);
        let configs = if args.compare {
            vec![true, false]
        } else {
            vec![!args.no_kv_cache]
        };
        let mut points: Vec<usize> = args
            .at
            .iter()
            .map(|&p| p.clamp(1, args.steps.max(1)))
            .collect();
        points.dedup();
        if args.steps == 0 {
            points.clear();
        }
        let mut uncached_steps: Vec<usize> = points
            .iter()
            .flat_map(|&p| window_at(p, args.window, args.steps))
            .collect();
        uncached_steps.sort();
        uncached_steps.dedup();
        let total = args.reps * args.prompt.len()
            + configs
                .iter()
                .map(|&c| if c { args.steps } else { uncached_steps.len() })
                .sum::<usize>()
            + args.reps * args.depth.len()
            + args.concurrency.len()
            + args.verify.len();
        Ok(Plan {
            ctx,
            last_point,
            points,
            uncached_steps,
            configs,
            total,
        })
    }
}

/// Everything measured, for the report.
struct Results {
    prefill: Vec<Value>,
    schedules: Vec<Schedule>,
    profile: Option<mens::runner::Profile>,
    paired: Option<(Vec<f64>, Vec<f64>)>,
    depth_rows: Vec<Value>,
    concurrency: Vec<Value>,
    verify: Vec<Value>,
}

/// Tokens a step of the --concurrency test takes (as `mens serve` defaults: 128 on the CPU, 512 on
/// a GPU, at least one per sequence).
fn concurrency_step(cpu: bool, n: usize) -> usize {
    n.max(if cpu { 128 } else { 512 })
}

pub fn run(mut args: BenchArgs) -> Result<()> {
    let plan = Plan::new(&args)?;
    // Admit the context the bench needs (unless -c says more).
    args.model.ctx_size = Some(args.model.ctx_size.unwrap_or(0).max(plan.ctx));
    let l = load(&args.model, 1)?;
    let cpu = l.backend == Backend::Cpu;
    let cpu_session = |ctx: usize| -> Result<Box<dyn Runner>> {
        Ok(Box::new(Session::new(
            l.model.clone(),
            SessionOptions {
                ctx,
                batch: 512.min(plan.ctx),
                logit_rows: args.verify.iter().copied().max().unwrap_or(1),
                ..Default::default()
            },
        )?))
    };
    let s = if cpu {
        cpu_session(plan.ctx)?
    } else {
        // --verify measures the runner speculative decoding uses (on CUDA, a batch of one).
        crate::runner_for(&l, !args.verify.is_empty())?
    };
    if let (true, Some(&n)) = (cpu, args.concurrency.iter().max()) {
        // The --concurrency sequences come on top of the admitted session: admit them too.
        let options = SessionOptions {
            ctx: args.concurrency_prompt + args.gen + 1,
            batch: concurrency_step(true, n),
            logit_rows: n,
            ..Default::default()
        };
        let e = mens::memory::estimate_slots(&l.model, &options, n);
        let budget = mens::memory::budget(&mens::memory::probe(), Backend::Cpu)?;
        let need = l.estimate.total() + e.kv_cache + e.buffers;
        if need > budget.bytes {
            bail!(
                "{n} sequences of {} tokens need {} MiB with the model and the bench session, more than the {} MiB budget ({}); use smaller --concurrency, --concurrency-prompt or --gen",
                options.ctx,
                need >> 20,
                budget.bytes >> 20,
                budget.how
            );
        }
    }
    // The paired test's second sequence: on the same device, weights and stream (a sibling), so
    // that each step's sync waits for that step alone.
    let far = if args.paired > 0 && args.steps > 0 && plan.last_point > 1 {
        Some(s.sibling(SCHEDULE_PROMPT + plan.last_point + args.paired + 1)?)
    } else {
        None
    };
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(plan.total as u64)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} {msg:24} [{bar:30}] {pos}/{len} {elapsed}, about {eta} left",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let vocab = l.model.config.vocab_size;
    // Real ids from the ordinary part of the vocabulary (special tokens sit at its end).
    let hi = l
        .tokenizer
        .vocab_size()
        .min(vocab)
        .saturating_sub(512)
        .max(2);
    let mut m = Measure {
        s,
        greedy: Sampler::new(SamplerConfig::greedy(), vocab)?,
        vocab,
        rng: rand::rngs::StdRng::seed_from_u64(42),
        hi,
        bar,
        args: &args,
        plan: &plan,
        scratch: Vec::with_capacity(plan.ctx),
    };
    let results = m.all(far)?;
    m.bar.finish_and_clear();
    report::write(&args, &plan, &l, m.s.as_ref(), &results)
}

/// The measurements, on one runner.
struct Measure<'a> {
    s: Box<dyn Runner>,
    greedy: Sampler,
    vocab: usize,
    rng: rand::rngs::StdRng,
    hi: usize,
    bar: ProgressBar,
    args: &'a BenchArgs,
    plan: &'a Plan,
    scratch: Vec<u32>,
}

impl Measure<'_> {
    fn random(&mut self, n: usize) -> Vec<u32> {
        (0..n)
            .map(|_| self.rng.gen_range(1..self.hi) as u32)
            .collect()
    }

    fn all(&mut self, far: Option<Box<dyn Runner>>) -> Result<Results> {
        let prefill = self.prefill()?;
        let mut schedules = Vec::new();
        let mut profile = None;
        for &cached in &self.plan.configs {
            schedules.push(if cached {
                self.cached_schedule(&mut profile)?
            } else {
                self.uncached_schedule()?
            });
        }
        let paired = match far {
            Some(far) => Some(self.paired(far)?),
            None => None,
        };
        let depth_rows = self.depth()?;
        let concurrency = self.concurrency()?;
        let verify = self.verify()?;
        Ok(Results {
            verify,
            prefill,
            schedules,
            profile,
            paired,
            depth_rows,
            concurrency,
        })
    }

    /// Many sequences decoding together: for each N, N random prompts (each prefilled on its own,
    /// untimed), then `gen` steps in which all N take their next greedy token; the clock stops after
    /// the last step's tokens are read back.
    fn concurrency(&mut self) -> Result<Vec<Value>> {
        let Some(&max) = self.args.concurrency.iter().max() else {
            return Ok(Vec::new());
        };
        let (gen, p) = (self.args.gen, self.args.concurrency_prompt);
        let cpu = self.s.launches_per_token().is_none();
        let mut b = self
            .s
            .batch_sibling(max, p + gen + 1, concurrency_step(cpu, max))?;
        let chunk = b.max_step_tokens();
        let mut greedy = Sampler::new(SamplerConfig::greedy(), self.vocab)?;
        let mut rows = Vec::new();
        for &n in &self.args.concurrency {
            self.bar.set_message(format!("{n} sequences together"));
            let mut next: Vec<[u32; 1]> = Vec::with_capacity(n);
            for slot in 0..n {
                b.truncate_slot(slot, 0);
                let prompt = self.random(p);
                let mut done = 0;
                for c in prompt.chunks(chunk) {
                    done += c.len();
                    let logits = if done == p {
                        Logits::Last
                    } else {
                        Logits::None
                    };
                    b.step(&mut [mens::runner::Part {
                        slot,
                        tokens: c,
                        logits,
                    }])?;
                }
                next.push([b.sample_slot(slot, &mut greedy)?]);
            }
            let t0 = Instant::now();
            for _ in 0..gen {
                let mut parts: Vec<mens::runner::Part> = next
                    .iter()
                    .enumerate()
                    .map(|(slot, t)| mens::runner::Part {
                        slot,
                        tokens: t,
                        logits: Logits::Last,
                    })
                    .collect();
                b.step(&mut parts)?;
                drop(parts);
                for (slot, t) in next.iter_mut().enumerate() {
                    t[0] = b.sample_slot(slot, &mut greedy)?;
                }
            }
            let dt = t0.elapsed().as_secs_f64();
            self.bar.inc(1);
            rows.push(json!({"sequences": n, "prompt": p, "n_gen": gen,
                "tokens_per_s": (n * gen) as f64 / dt, "per_sequence_tokens_per_s": gen as f64 / dt,
                "step_ms": dt * 1e3 / gen as f64}));
        }
        Ok(rows)
    }

    /// Time to first token: prompt of n tokens → first sampled token.
    fn prefill(&mut self) -> Result<Vec<Value>> {
        let mut out = Vec::new();
        for &n in &self.args.prompt {
            self.bar.set_message(format!("prefill {n}"));
            let mut ttft = Vec::new();
            for _ in 0..self.args.reps {
                let toks = self.random(n);
                self.s.truncate(0);
                let t0 = Instant::now();
                self.s.forward(&toks, Logits::Last)?;
                let _first = self.s.sample(&mut self.greedy)?;
                ttft.push(t0.elapsed().as_secs_f64());
                self.bar.inc(1);
            }
            let m = median(ttft.clone());
            out.push(
                json!({"n_prompt": n, "ttft_ms": m * 1e3, "tokens_per_s": n as f64 / m,
                            "ttft_ms_all": ttft.iter().map(|t| t * 1e3).collect::<Vec<_>>()}),
            );
        }
        Ok(out)
    }

    /// The decode schedule with the cache: step k is the k-th generated token after a short prompt.
    fn cached_schedule(&mut self, profile: &mut Option<mens::runner::Profile>) -> Result<Schedule> {
        let steps = self.args.steps;
        let mut sch = Schedule {
            cached: true,
            times: Vec::with_capacity(steps),
            allocations_per_step: 0.0,
            dispatches_per_step: 0.0,
        };
        if steps == 0 {
            return Ok(sch);
        }
        self.bar.set_message("decode, KV cache");
        let prompt = self.random(SCHEDULE_PROMPT);
        self.s.truncate(0);
        self.s.forward(&prompt, Logits::Last)?;
        let (a0, k0) = (allocations(), dispatches());
        self.s.pipeline_greedy(true);
        for step in 1..=steps {
            let t0 = Instant::now();
            let next = self.s.sample(&mut self.greedy)?;
            self.s.forward(&[next], Logits::Last)?;
            let dt = t0.elapsed().as_secs_f64();
            // The push stays within the reserved capacity: no allocation is counted.
            sch.times.push((step, dt));
            self.bar.inc(1);
        }
        self.s.pipeline_greedy(false);
        let n = steps as f64;
        sch.allocations_per_step = (allocations() - a0) as f64 / n;
        if self.args.profile {
            *profile = self.s.profile_decode(16)?;
        }
        sch.dispatches_per_step = match self.s.launches_per_token() {
            Some((launches, _)) => launches as f64,
            None => (dispatches() - k0) as f64 / n,
        };
        Ok(sch)
    }

    /// Without the cache, step k re-runs the whole sequence (prompt + k tokens): its cost does not
    /// depend on earlier steps, so only the reported windows are timed.
    fn uncached_schedule(&mut self) -> Result<Schedule> {
        let mut sch = Schedule {
            cached: false,
            times: Vec::new(),
            allocations_per_step: 0.0,
            dispatches_per_step: 0.0,
        };
        if self.args.steps == 0 {
            return Ok(sch);
        }
        self.bar.set_message("decode, no KV cache");
        let mut seq = self.random(SCHEDULE_PROMPT);
        seq.extend(self.random(self.args.steps));
        let (mut allocs, mut disp) = (0u64, 0u64);
        for &step in &self.plan.uncached_steps {
            self.s.truncate(0);
            self.s
                .forward(&seq[..SCHEDULE_PROMPT + step - 1], Logits::Last)?;
            let (a0, k0) = (allocations(), dispatches());
            let t0 = Instant::now();
            let next = self.s.sample(&mut self.greedy)?;
            self.s.rerun(&[next], &mut self.scratch)?;
            let dt = t0.elapsed().as_secs_f64();
            allocs += allocations() - a0;
            disp += dispatches() - k0;
            sch.times.push((step, dt));
            self.bar.inc(1);
        }
        let n = self.plan.uncached_steps.len().max(1) as f64;
        sch.allocations_per_step = allocs as f64 / n;
        sch.dispatches_per_step = disp as f64 / n;
        if self.s.launches_per_token().is_some() {
            // A GPU re-run is a prefill, not a graph launch: no per-step launch count.
            sch.dispatches_per_step = f64::NAN;
        }
        Ok(sch)
    }

    /// Paired flatness: one step on a sequence at step 1.., one on a sequence at step `last_point`..,
    /// alternating (and swapping which goes first), so that the drift of a shared machine (phases of
    /// tens of steps ±20% on the CI VMs) affects both alike; medians of the step times.
    fn paired(&mut self, mut far: Box<dyn Runner>) -> Result<(Vec<f64>, Vec<f64>)> {
        self.bar.set_message("paired steps");
        let near_prompt = self.random(SCHEDULE_PROMPT);
        let far_prompt = self.random(SCHEDULE_PROMPT + self.plan.last_point - 1);
        self.s.truncate(0);
        self.s.forward(&near_prompt, Logits::Last)?;
        far.forward(&far_prompt, Logits::Last)?;
        let (mut near_ms, mut far_ms) = (Vec::new(), Vec::new());
        for i in 0..self.args.paired {
            for which in [i % 2, 1 - i % 2] {
                let (r, out): (&mut dyn Runner, &mut Vec<f64>) = if which == 0 {
                    (self.s.as_mut(), &mut near_ms)
                } else {
                    (far.as_mut(), &mut far_ms)
                };
                let t0 = Instant::now();
                let next = r.sample(&mut self.greedy)?;
                r.forward(&[next], Logits::Last)?;
                out.push(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
        Ok((near_ms, far_ms))
    }

    /// The verify pass of speculative decoding: after a context of `verify_depth` tokens, one
    /// forward pass over K tokens with every position's greedy pick (what `generate`'s greedy
    /// verify does: on a CUDA batch the picks are made on the device), against one decode step (a
    /// token, its logits, a greedy pick). Each is repeated (the cache truncated back each time,
    /// alternating the two) and the medians reported.
    fn verify(&mut self) -> Result<Vec<Value>> {
        let mut rows = Vec::new();
        if self.args.verify.is_empty() {
            return Ok(rows);
        }
        let d = self.args.verify_depth;
        let ctx = self.random(d.max(1));
        self.s.truncate(0);
        self.s.forward(&ctx, Logits::Last)?;
        let reps = 4 * self.args.reps + 1;
        for &k in &self.args.verify.clone() {
            self.bar.set_message(format!("verify {k} @ d{d}"));
            let toks = self.random(k);
            let (mut one, mut pass) = (Vec::new(), Vec::new());
            for _ in 0..reps {
                self.s.truncate(ctx.len());
                let t0 = Instant::now();
                self.s.forward(&toks[..1], Logits::Last)?;
                self.s.sample(&mut self.greedy)?;
                one.push(t0.elapsed().as_secs_f64() * 1e3);
                self.s.truncate(ctx.len());
                let mut seen = 0f32;
                let t0 = Instant::now();
                self.s.forward(
                    &toks,
                    Logits::Argmax {
                        from: 0,
                        f: &mut |_, t| seen += t as f32,
                    },
                )?;
                pass.push(t0.elapsed().as_secs_f64() * 1e3);
                std::hint::black_box(seen);
            }
            let (one, pass) = (median(one), median(pass));
            rows.push(
                json!({"k": k, "n_depth": d, "step_ms": one, "verify_ms": pass,
                             "ratio": pass / one}),
            );
            self.bar.inc(1);
        }
        Ok(rows)
    }

    /// llama-bench-style decode tests: `gen` tokens after a context of `depth` tokens.
    fn depth(&mut self) -> Result<Vec<Value>> {
        let mut rows = Vec::new();
        let gen = self.args.gen;
        for &d in &self.args.depth {
            self.bar.set_message(format!("tg{gen} @ d{d}"));
            for &cached in &self.plan.configs {
                let mut tps = Vec::new();
                for _ in 0..self.args.reps {
                    let ctx = self.random(d.max(1));
                    self.s.truncate(0);
                    self.s.forward(&ctx, Logits::Last)?;
                    // The first token is the prompt's (on a GPU, sampling it waits for the
                    // prefill): the clock starts after it, then times `gen` decode steps.
                    let mut next = self.s.sample(&mut self.greedy)?;
                    // As `mens run` decodes greedily: a GPU may run each step ahead.
                    self.s.pipeline_greedy(cached);
                    let t0 = Instant::now();
                    for _ in 0..gen {
                        if cached {
                            self.s.forward(&[next], Logits::Last)?;
                        } else {
                            self.s.rerun(&[next], &mut self.scratch)?;
                        }
                        next = self.s.sample(&mut self.greedy)?;
                    }
                    tps.push(gen as f64 / t0.elapsed().as_secs_f64());
                    self.s.pipeline_greedy(false);
                    if cached {
                        self.bar.inc(1);
                    }
                }
                rows.push(
                    json!({"test": format!("tg{gen}"), "n_prompt": 0, "n_gen": gen,
                                 "n_depth": d, "kv_cache": cached, "tokens_per_s": median(tps)}),
                );
            }
        }
        Ok(rows)
    }
}
