//! `mens bench`: time to first token at the `--prompt` sizes, the time of every decode step from 1 to
//! `--steps` (with and without the KV cache), llama-bench-style decode tests at `--depth`, memory, heap
//! allocations and kernel dispatches per decode step. Prompts are random ids from the ordinary part of
//! the model's vocabulary. Output: a Markdown table (rows = metrics, columns = configurations), JSON
//! with every raw figure and the machine, and an SVG plot of per-step time against step.

use crate::{load, runner, BenchArgs, ALLOCATIONS};
use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressStyle};
use mens::engine::{Logits, Runner, Session, SessionOptions};
use mens::kernels::DISPATCHES;
use mens::sample::{Sampler, SamplerConfig};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
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

pub fn run(mut args: BenchArgs) -> Result<()> {
    if args.reps == 0 || args.prompt.contains(&0) || args.window == 0 {
        bail!("invalid argument: --reps, --window and prompt sizes must be > 0");
    }
    if args.steps > 1 << 16 || args.gen > 1 << 16 {
        bail!("invalid argument: --steps and --gen must be at most 65536");
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
        .max(16);
    // Admit the context the bench needs (unless -c says more).
    args.model.ctx_size = Some(args.model.ctx_size.unwrap_or(0).max(ctx));
    let l = load(&args.model)?;
    let c = &l.model.config;
    let cpu = args.model.backend == "cpu";
    let mut s: Box<dyn Runner> = if cpu {
        Box::new(Session::new(
            l.model.clone(),
            SessionOptions {
                ctx,
                batch: 512.min(ctx),
                logit_rows: 1,
            },
        )?)
    } else {
        runner(&l, &args.model)?
    };
    let mut greedy = Sampler::new(SamplerConfig::greedy(), c.vocab_size)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    // Real ids from the ordinary part of the vocabulary (special tokens sit at its end).
    let hi = l
        .tokenizer
        .vocab_size()
        .min(c.vocab_size)
        .saturating_sub(512)
        .max(2);
    let mut random = |n: usize| {
        (0..n)
            .map(|_| rng.gen_range(1..hi) as u32)
            .collect::<Vec<u32>>()
    };
    let name = args
        .model
        .model
        .as_ref()
        .and_then(|p| p.file_stem())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| c.name.clone());
    let threads = mens::kernels::pool::pool().threads();
    let configs: Vec<bool> = if args.compare {
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

    // The steps the uncached schedule times: the reported windows.
    let mut uncached_steps: Vec<usize> = points
        .iter()
        .flat_map(|&p| window_at(p, args.window, args.steps))
        .collect();
    uncached_steps.sort();
    uncached_steps.dedup();

    // Progress: one unit per prefill rep, timed decode step and depth-test rep.
    let total = args.reps * args.prompt.len()
        + configs
            .iter()
            .map(|&c| if c { args.steps } else { uncached_steps.len() })
            .sum::<usize>()
        + args.reps * args.depth.len();
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg:24} [{bar:30}] {pos}/{len} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );

    // 1. Time to first token: prompt of n tokens → first sampled token.
    let mut prefill = Vec::new();
    for &n in &args.prompt {
        bar.set_message(format!("prefill {n}"));
        let mut ttft = Vec::new();
        for _ in 0..args.reps {
            let toks = random(n);
            s.truncate(0);
            let t0 = Instant::now();
            s.forward(&toks, Logits::Last)?;
            let _first = s.sample(&mut greedy)?;
            ttft.push(t0.elapsed().as_secs_f64());
            bar.inc(1);
        }
        let m = median(ttft.clone());
        prefill.push(
            json!({"n_prompt": n, "ttft_ms": m * 1e3, "tokens_per_s": n as f64 / m,
                            "ttft_ms_all": ttft.iter().map(|t| t * 1e3).collect::<Vec<_>>()}),
        );
    }

    // 2. The decode schedule: step k is the k-th generated token after a short prompt.
    let mut scratch = Vec::with_capacity(ctx);
    let mut schedules = Vec::new();
    let mut profile = Vec::new();
    for &cached in &configs {
        let mut sch = Schedule {
            cached,
            times: Vec::new(),
            allocations_per_step: 0.0,
            dispatches_per_step: 0.0,
        };
        if args.steps == 0 {
            schedules.push(sch);
            continue;
        }
        bar.set_message(format!("decode, {}", sch.name()));
        let prompt = random(SCHEDULE_PROMPT);
        if cached {
            s.truncate(0);
            s.forward(&prompt, Logits::Last)?;
            sch.times.reserve(args.steps);
            let a0 = ALLOCATIONS.load(Ordering::Relaxed);
            let k0 = DISPATCHES.load(Ordering::Relaxed);
            for step in 1..=args.steps {
                let t0 = Instant::now();
                let next = s.sample(&mut greedy)?;
                s.forward(&[next], Logits::Last)?;
                let dt = t0.elapsed().as_secs_f64();
                // The push stays within the reserved capacity: no allocation is counted.
                sch.times.push((step, dt));
                bar.inc(1);
            }
            let n = args.steps as f64;
            sch.allocations_per_step = (ALLOCATIONS.load(Ordering::Relaxed) - a0) as f64 / n;
            if args.profile {
                profile = s.profile_decode(16)?;
            }
            sch.dispatches_per_step = match s.launches_per_token() {
                Some((launches, _)) => launches as f64,
                None => (DISPATCHES.load(Ordering::Relaxed) - k0) as f64 / n,
            };
        } else {
            // Uncached step k re-runs the whole sequence (prompt + k tokens): its cost does not
            // depend on earlier steps, so only the reported windows are timed.
            let mut seq = prompt.clone();
            seq.extend(random(args.steps));
            let (mut allocs, mut disp) = (0u64, 0u64);
            for &step in &uncached_steps {
                s.truncate(0);
                s.forward(&seq[..SCHEDULE_PROMPT + step - 1], Logits::Last)?;
                let a0 = ALLOCATIONS.load(Ordering::Relaxed);
                let k0 = DISPATCHES.load(Ordering::Relaxed);
                let t0 = Instant::now();
                let next = s.sample(&mut greedy)?;
                s.rerun(&[next], &mut scratch)?;
                let dt = t0.elapsed().as_secs_f64();
                allocs += ALLOCATIONS.load(Ordering::Relaxed) - a0;
                disp += DISPATCHES.load(Ordering::Relaxed) - k0;
                sch.times.push((step, dt));
                bar.inc(1);
            }
            let n = uncached_steps.len().max(1) as f64;
            sch.allocations_per_step = allocs as f64 / n;
            sch.dispatches_per_step = disp as f64 / n;
            if s.launches_per_token().is_some() {
                // A GPU re-run is a prefill, not a graph launch: no per-step launch count.
                sch.dispatches_per_step = f64::NAN;
            }
        }
        schedules.push(sch);
    }

    // Paired flatness: one step on a sequence at step 1.., one on a sequence at step `last_point`..,
    // alternating (and swapping which goes first), so that the drift of a shared machine (phases of
    // tens of steps ±20% on the CI VMs) affects both alike; medians of the step times.
    let mut paired = None;
    if args.paired > 0 && args.steps > 0 && last_point > 1 {
        bar.set_message("paired steps");
        let mut far: Box<dyn Runner> = if cpu {
            Box::new(Session::new(
                l.model.clone(),
                SessionOptions {
                    ctx: SCHEDULE_PROMPT + last_point + args.paired + 1,
                    batch: 512.min(ctx),
                    logit_rows: 1,
                },
            )?)
        } else {
            runner(&l, &args.model)?
        };
        s.truncate(0);
        s.forward(&random(SCHEDULE_PROMPT), Logits::Last)?;
        far.forward(&random(SCHEDULE_PROMPT + last_point - 1), Logits::Last)?;
        let (mut near_ms, mut far_ms) = (Vec::new(), Vec::new());
        for i in 0..args.paired {
            for which in [i % 2, 1 - i % 2] {
                let (r, out): (&mut dyn Runner, &mut Vec<f64>) = if which == 0 {
                    (s.as_mut(), &mut near_ms)
                } else {
                    (far.as_mut(), &mut far_ms)
                };
                let t0 = Instant::now();
                let next = r.sample(&mut greedy)?;
                r.forward(&[next], Logits::Last)?;
                out.push(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
        paired = Some((near_ms, far_ms));
    }

    // 3. llama-bench-style decode tests: `gen` tokens after a context of `depth` tokens.
    let mut depth_rows = Vec::new();
    for &d in &args.depth {
        bar.set_message(format!("tg{} @ d{d}", args.gen));
        for &cached in &configs {
            let mut tps = Vec::new();
            for _ in 0..args.reps {
                s.truncate(0);
                s.forward(&random(d.max(1)), Logits::Last)?;
                let t0 = Instant::now();
                for _ in 0..args.gen {
                    let next = s.sample(&mut greedy)?;
                    if cached {
                        s.forward(&[next], Logits::Last)?;
                    } else {
                        s.rerun(&[next], &mut scratch)?;
                    }
                }
                tps.push(args.gen as f64 / t0.elapsed().as_secs_f64());
                if cached {
                    bar.inc(1);
                }
            }
            depth_rows.push(
                json!({"test": format!("tg{}", args.gen), "n_prompt": 0, "n_gen": args.gen,
                                   "n_depth": d, "kv_cache": cached, "tokens_per_s": median(tps)}),
            );
        }
    }
    bar.finish_and_clear();

    // Report.
    let device = if cpu {
        format!("{threads} threads, CPU")
    } else {
        format!("backend {}", args.model.backend)
    };
    let graph = s.launches_per_token();
    let mib = |b: f64| b / 1048576.0;
    let peak = mens::memory::peak_rss().unwrap_or(0);
    let mut md = String::new();
    md.push_str(&format!(
        "mens bench: {name} ({}), {}; median of {} reps for prefill; decode windows of {} steps after a {SCHEDULE_PROMPT}-token prompt\n\n",
        c.name, device, args.reps, args.window.min(args.steps.max(1))
    ));
    md.push_str("| metric |");
    for sch in &schedules {
        md.push_str(&format!(" {} |", sch.name()));
    }
    md.push_str("\n|---|");
    for _ in &schedules {
        md.push_str("---|");
    }
    md.push('\n');
    let row = |md: &mut String, label: &str, f: &dyn Fn(&Schedule) -> String| {
        md.push_str(&format!("| {label} |"));
        for sch in &schedules {
            md.push_str(&format!(" {} |", f(sch)));
        }
        md.push('\n');
    };
    for p in &prefill {
        let n = p["n_prompt"].as_u64().unwrap_or(0);
        let (ms, tps) = (
            p["ttft_ms"].as_f64().unwrap_or(0.0),
            p["tokens_per_s"].as_f64().unwrap_or(0.0),
        );
        // The prompt pass is the same with or without the cache.
        row(&mut md, &format!("TTFT, {n}-token prompt (ms)"), &|_| {
            format!("{ms:.0}")
        });
        row(&mut md, &format!("prefill, {n} tokens (tokens/s)"), &|_| {
            format!("{tps:.1}")
        });
    }
    let mut window_json = Vec::new();
    for &p in &points {
        let r = window_at(p, args.window, args.steps);
        row(
            &mut md,
            &format!(
                "decode at step {p} (tokens/s, steps {}–{})",
                r.start(),
                r.end()
            ),
            &|sch| format!("{:.2}", sch.tps_over(&r)),
        );
        for sch in &schedules {
            window_json.push(
                json!({"kv_cache": sch.cached, "step": p, "from": r.start(), "to": r.end(),
                                    "tokens_per_s": sch.tps_over(&r)}),
            );
        }
    }
    if args.steps > 0 {
        row(
            &mut md,
            &format!("decode mean, timed steps of 1–{} (tokens/s)", args.steps),
            &|sch| {
                format!(
                    "{:.2}",
                    sch.times.len() as f64 / sch.times.iter().map(|t| t.1).sum::<f64>()
                )
            },
        );
        row(&mut md, "heap allocations per decode step", &|sch| {
            format!("{:.2}", sch.allocations_per_step)
        });
        let label = if graph.is_some() {
            "host launches per decode step (CUDA graph)"
        } else {
            "kernel dispatches per decode step"
        };
        row(&mut md, label, &|sch| {
            if sch.dispatches_per_step.is_nan() {
                "prefill".into()
            } else {
                format!("{:.0}", sch.dispatches_per_step)
            }
        });
        if let Some((_, kernels)) = graph {
            row(
                &mut md,
                "kernels per decode step (inside the graph)",
                &|sch| {
                    if sch.cached {
                        kernels.to_string()
                    } else {
                        "-".into()
                    }
                },
            );
        }
    }
    for &depth in &args.depth {
        let vals: Vec<(bool, f64)> = depth_rows
            .iter()
            .filter(|x| x["n_depth"] == depth)
            .map(|x| {
                (
                    x["kv_cache"] == true,
                    x["tokens_per_s"].as_f64().unwrap_or(0.0),
                )
            })
            .collect();
        let label = format!("tg{} @ depth {depth} (tokens/s)", args.gen);
        row(&mut md, &label, &|sch| {
            vals.iter()
                .find(|x| x.0 == sch.cached)
                .map(|x| format!("{:.2}", x.1))
                .unwrap_or_default()
        });
    }
    let shared = |md: &mut String, label: &str, v: String| {
        md.push_str(&format!("| {label} |"));
        for _ in &schedules {
            md.push_str(&format!(" {v} |"));
        }
        md.push('\n');
    };
    shared(
        &mut md,
        "peak RSS (MiB)",
        format!("{:.0}", mib(peak as f64)),
    );
    shared(
        &mut md,
        "model (MiB)",
        format!("{:.0}", mib(l.model.weight_bytes() as f64)),
    );
    shared(
        &mut md,
        &format!("KV cache, {ctx} tokens (MiB)"),
        format!("{:.1}", mib(s.kv_cache_bytes() as f64)),
    );
    md.push_str(if graph.is_some() {
        "\nHost launches = launches the host issues per decode token (the CUDA graph); allocations = heap allocations counted by the binary's global allocator. Uncached: each timed step re-runs the whole sequence (a prefill); only the reported windows are timed.\n"
    } else {
        "\nDispatches = parallel regions issued to the CPU thread pool (matmuls, norms, attention); allocations = heap allocations counted by the binary's global allocator. Uncached: each timed step re-runs the whole sequence; only the reported windows are timed.\n"
    });
    if !profile.is_empty() {
        let total: f64 = profile.iter().map(|p| p.2).sum();
        md.push_str(&format!(
            "\nKernels of one decode step at step {}, launched one by one (not as the graph), mean of 16 steps: {total:.0} µs in all\n\n| kernel | calls per step | µs per step | share |\n|---|---|---|---|\n",
            args.steps
        ));
        for (name, calls, us) in &profile {
            md.push_str(&format!(
                "| {name} | {calls} | {us:.1} | {:.1}% |\n",
                100.0 * us / total
            ));
        }
    }
    if let Some((near, far)) = &paired {
        let (a, b) = (1e3 / median(near.clone()), 1e3 / median(far.clone()));
        md.push_str(&format!(
            "\nPaired flatness (KV cache; {} steps at step 1.. alternating with {} at step {last_point}.., medians): step 1 {a:.2} tokens/s, step {last_point} {b:.2} tokens/s, ratio {:.3}\n",
            near.len(),
            far.len(),
            b / a
        ));
    }
    print!("{md}");
    if let Some(path) = &args.md {
        std::fs::write(path, &md)?;
    }
    if let Some(path) = &args.plot {
        plot(path, &schedules, &name)?;
    }
    if let Some(path) = &args.json {
        let v = json!({
            "model": name, "model_name": c.name, "backend": args.model.backend, "threads": threads,
            "graph": graph.map(|g| json!({"launches_per_token": g.0, "kernels_per_token": g.1})),
            "reps": args.reps, "window": args.window, "schedule_prompt": SCHEDULE_PROMPT,
            "prefill": prefill,
            "decode": schedules.iter().map(|sch| json!({
                "kv_cache": sch.cached,
                "steps": sch.times.iter().map(|t| t.0).collect::<Vec<_>>(),
                "step_ms": sch.times.iter().map(|t| t.1 * 1e3).collect::<Vec<_>>(),
                "mean_tokens_per_s": sch.times.len() as f64 / sch.times.iter().map(|t| t.1).sum::<f64>().max(1e-12),
                "allocations_per_step": sch.allocations_per_step,
                "dispatches_per_step": sch.dispatches_per_step,
            })).collect::<Vec<_>>(),
            "windows": window_json,
            "paired": paired.as_ref().map(|(near, far)| json!({
                "far_step": last_point, "near_step_ms": near, "far_step_ms": far,
                "near_tokens_per_s": 1e3 / median(near.clone()),
                "far_tokens_per_s": 1e3 / median(far.clone()),
                "ratio": median(near.clone()) / median(far.clone()),
            })),
            "results": depth_rows,
            "memory": {
                "peak_rss_bytes": peak, "model_bytes": l.model.weight_bytes(),
                "file_bytes": l.model.gguf.file_len(), "kv_cache_bytes": s.kv_cache_bytes(),
                "session_bytes": s.bytes(), "ctx": ctx,
                "device_bytes": if cpu { Value::Null } else { json!(s.bytes() as u64 + l.model.weight_bytes()) },
            },
            "counted": {
                "allocations": "heap allocations by the global allocator during decode steps",
                "dispatches": "parallel regions issued to the CPU thread pool per decode step",
            },
            "machine": mens::memory::probe(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&v)?)?;
    }
    Ok(())
}

/// Per-step decode time (ms) against step, one series per configuration.
fn plot(path: &std::path::Path, schedules: &[Schedule], name: &str) -> Result<()> {
    use plotters::prelude::*;
    let max_step = schedules
        .iter()
        .flat_map(|s| s.times.iter().map(|t| t.0))
        .max()
        .unwrap_or(1);
    let max_ms = schedules
        .iter()
        .flat_map(|s| s.times.iter().map(|t| t.1 * 1e3))
        .fold(0f64, f64::max)
        .max(1e-3);
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("plot: {e}");
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("mens decode step time — {name}"),
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0usize..max_step + 1, 0f64..max_ms * 1.1)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("decode step")
        .y_desc("ms per step")
        .draw()
        .map_err(|e| err(&e))?;
    for (i, sch) in schedules.iter().enumerate() {
        let color = if i == 0 { BLUE } else { RED };
        let pts: Vec<(usize, f64)> = sch.times.iter().map(|t| (t.0, t.1 * 1e3)).collect();
        if sch.cached {
            chart
                .draw_series(LineSeries::new(pts, color))
                .map_err(|e| err(&e))?
                .label(sch.name())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        } else {
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))
                .map_err(|e| err(&e))?
                .label(sch.name())
                .legend(move |(x, y)| Circle::new((x + 10, y), 3, color.filled()));
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
