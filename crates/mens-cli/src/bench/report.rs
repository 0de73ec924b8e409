//! `mens bench`'s report: the Markdown table, the JSON of every raw figure, the SVG plot.

use super::{median, window_at, Plan, Results, Schedule, SCHEDULE_PROMPT};
use crate::args::BenchArgs;
use anyhow::Result;
use mens::load::{Backend, Loaded};
use mens::runner::Runner;
use serde_json::{json, Value};

fn mib(b: f64) -> f64 {
    b / 1048576.0
}

pub(super) fn write(
    args: &BenchArgs,
    plan: &Plan,
    l: &Loaded,
    s: &dyn Runner,
    r: &Results,
) -> Result<()> {
    let name = args
        .model
        .model
        .as_ref()
        .and_then(|p| p.file_stem())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| l.model.config.name.clone());
    let device = if l.backend == Backend::Cpu {
        format!("{} threads, CPU", mens::cpu::threads())
    } else {
        format!("backend {}", l.backend.name())
    };
    let graph = s.launches_per_token();
    let (mut md, window_json) = table(args, plan, r, &name, &l.model.config.name, &device, graph);
    footer(args, plan, l, s, r, graph, &mut md);
    cpu_profile(&mut md);
    print!("{md}");
    if let Some(path) = &args.md {
        std::fs::write(path, &md)?;
    }
    if let Some(path) = &args.plot {
        plot(path, &r.schedules, &name)?;
    }
    if let Some(path) = &args.json {
        let v = to_json(args, plan, l, s, r, &name, window_json);
        std::fs::write(path, serde_json::to_string_pretty(&v)?)?;
    }
    Ok(())
}

fn row(md: &mut String, schedules: &[Schedule], label: &str, f: &dyn Fn(&Schedule) -> String) {
    md.push_str(&format!("| {label} |"));
    for sch in schedules {
        md.push_str(&format!(" {} |", f(sch)));
    }
    md.push('\n');
}

/// The table (rows = metrics, columns = configurations) and the windows' figures for the JSON.
fn table(
    args: &BenchArgs,
    plan: &Plan,
    r: &Results,
    name: &str,
    model_name: &str,
    device: &str,
    graph: Option<(usize, usize)>,
) -> (String, Vec<Value>) {
    let schedules = &r.schedules;
    let row = |md: &mut String, label: &str, f: &dyn Fn(&Schedule) -> String| {
        row(md, schedules, label, f)
    };
    let mut md = String::new();
    md.push_str(&format!(
        "mens bench: {name} ({}), {}; median of {} reps for prefill; decode windows of {} steps after a {SCHEDULE_PROMPT}-token prompt\n\n",
        model_name, device, args.reps, args.window.min(args.steps.max(1))
    ));
    md.push_str("| metric |");
    for sch in &r.schedules {
        md.push_str(&format!(" {} |", sch.name()));
    }
    md.push_str("\n|---|");
    for _ in &r.schedules {
        md.push_str("---|");
    }
    md.push('\n');
    for p in &r.prefill {
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
    for &p in &plan.points {
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
        for sch in schedules {
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
        let vals: Vec<(bool, f64)> = r
            .depth_rows
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
    (md, window_json)
}

/// Memory rows, notes, the kernel profile and the paired figure.
fn footer(
    args: &BenchArgs,
    plan: &Plan,
    l: &Loaded,
    s: &dyn Runner,
    r: &Results,
    graph: Option<(usize, usize)>,
    md: &mut String,
) {
    let peak = mens::memory::peak_rss().unwrap_or(0);
    let shared = |md: &mut String, label: &str, v: String| {
        md.push_str(&format!("| {label} |"));
        for _ in &r.schedules {
            md.push_str(&format!(" {v} |"));
        }
        md.push('\n');
    };
    for c in &r.concurrency {
        shared(
            md,
            &format!(
                "{} sequences together: tokens/s in all (per sequence), {} tokens after {}",
                c["sequences"], c["n_gen"], c["prompt"]
            ),
            format!(
                "{:.1} ({:.1})",
                c["tokens_per_s"].as_f64().unwrap_or(0.0),
                c["per_sequence_tokens_per_s"].as_f64().unwrap_or(0.0)
            ),
        );
    }
    for v in &r.verify {
        shared(
            md,
            &format!(
                "verify {} tokens after {}: ms (÷ one decode step)",
                v["k"], v["n_depth"]
            ),
            format!(
                "{:.2} ({:.2}×)",
                v["verify_ms"].as_f64().unwrap_or(0.0),
                v["ratio"].as_f64().unwrap_or(0.0)
            ),
        );
    }
    shared(md, "peak RSS (MiB)", format!("{:.0}", mib(peak as f64)));
    shared(
        md,
        "model (MiB)",
        format!("{:.0}", mib(l.model.weight_bytes() as f64)),
    );
    shared(
        md,
        &format!("KV cache, {} tokens (MiB)", plan.ctx),
        format!("{:.1}", mib(s.kv_cache_bytes() as f64)),
    );
    md.push_str(if graph.is_some() {
        "\nHost launches = launches the host issues per decode token (the CUDA graph); allocations = heap allocations counted by the binary's global allocator. Uncached: each timed step re-runs the whole sequence (a prefill); only the reported windows are timed.\n"
    } else {
        "\nDispatches = parallel regions issued to the CPU thread pool (matmuls, norms, attention); allocations = heap allocations counted by the binary's global allocator. Uncached: each timed step re-runs the whole sequence; only the reported windows are timed.\n"
    });
    if let Some(p) = &r.profile {
        md.push_str(&gpu_profile(p, args.steps));
    }
    if let Some((near, far)) = &r.paired {
        let (a, b) = (1e3 / median(near.clone()), 1e3 / median(far.clone()));
        md.push_str(&format!(
            "\nPaired flatness (KV cache; {} steps at step 1.. alternating with {} at step {}.., medians): step 1 {a:.2} tokens/s, step {} {b:.2} tokens/s, ratio {:.3}\n",
            near.len(),
            far.len(),
            plan.last_point,
            plan.last_point,
            b / a
        ));
    }
}

/// GB/s of `bytes` moved in `us` microseconds.
fn gbs(bytes: u64, us: f64) -> f64 {
    bytes as f64 / (us * 1e3)
}

/// The GPU decode step's kernels: time, share, bytes, GB/s and % of the copy bandwidth each.
fn gpu_profile(p: &mens::runner::Profile, step: usize) -> String {
    let total: f64 = p.kernels.iter().map(|k| k.us).sum();
    let bytes: u64 = p.kernels.iter().map(|k| k.bytes).sum();
    let mut md = format!(
        "\nKernels of one decode step at step {step}, launched one by one (not as the graph), mean of 16 steps: {total:.0} µs and {:.1} MB in all ({:.0} GB/s); device-to-device copy {:.0} GB/s (read + write)\n\n| kernel | calls per step | µs per step | share | MB per step | GB/s | % of copy |\n|---|---|---|---|---|---|---|\n",
        bytes as f64 / 1e6,
        gbs(bytes, total),
        p.copy_gbs
    );
    for k in &p.kernels {
        md.push_str(&format!(
            "| {} | {} | {:.1} | {:.1}% | {:.2} | {:.0} | {:.0}% |\n",
            k.name,
            k.calls,
            k.us,
            100.0 * k.us / total,
            k.bytes as f64 / 1e6,
            gbs(k.bytes, k.us),
            100.0 * gbs(k.bytes, k.us) / p.copy_gbs
        ));
    }
    md
}

fn to_json(
    args: &BenchArgs,
    plan: &Plan,
    l: &Loaded,
    s: &dyn Runner,
    r: &Results,
    name: &str,
    window_json: Vec<Value>,
) -> Value {
    let c = &l.model.config;
    let graph = s.launches_per_token();
    let peak = mens::memory::peak_rss().unwrap_or(0);
    let cpu = l.backend == Backend::Cpu;
    let threads = mens::cpu::threads();
    json!({
        "model": name, "model_name": c.name, "backend": l.backend.name(), "threads": threads,
        "graph": graph.map(|g| json!({"launches_per_token": g.0, "kernels_per_token": g.1})),
        "reps": args.reps, "window": args.window, "schedule_prompt": SCHEDULE_PROMPT,
        "prefill": r.prefill,
        "decode": r.schedules.iter().map(|sch| json!({
            "kv_cache": sch.cached,
            "steps": sch.times.iter().map(|t| t.0).collect::<Vec<_>>(),
            "step_ms": sch.times.iter().map(|t| t.1 * 1e3).collect::<Vec<_>>(),
            "mean_tokens_per_s": sch.times.len() as f64 / sch.times.iter().map(|t| t.1).sum::<f64>().max(1e-12),
            "allocations_per_step": sch.allocations_per_step,
            "dispatches_per_step": sch.dispatches_per_step,
        })).collect::<Vec<_>>(),
        "windows": window_json,
        "paired": r.paired.as_ref().map(|(near, far)| json!({
            "far_step": plan.last_point, "near_step_ms": near, "far_step_ms": far,
            "near_tokens_per_s": 1e3 / median(near.clone()),
            "far_tokens_per_s": 1e3 / median(far.clone()),
            "ratio": median(near.clone()) / median(far.clone()),
        })),
        "results": r.depth_rows,
        "concurrency": r.concurrency,
        "verify": r.verify,
        "profile": r.profile.as_ref().map(|p| json!({
            "copy_gbs": p.copy_gbs,
            "kernels": p.kernels.iter().map(|k| json!({
                "name": k.name, "calls": k.calls, "us": k.us, "bytes": k.bytes,
                "gbs": gbs(k.bytes, k.us),
            })).collect::<Vec<_>>(),
        })),
        "memory": {
            "peak_rss_bytes": peak, "model_bytes": l.model.weight_bytes(),
            "file_bytes": l.model.gguf.file_len(), "kv_cache_bytes": s.kv_cache_bytes(),
            "session_bytes": s.bytes(), "ctx": plan.ctx,
            "device_bytes": if cpu { Value::Null } else { json!(s.bytes() as u64 + l.model.weight_bytes()) },
        },
        "counted": {
            "allocations": "heap allocations by the global allocator during decode steps",
            "dispatches": "parallel regions issued to the CPU thread pool per decode step",
        },
        "machine": mens::memory::probe(),
    })
}

/// Per-step decode time (ms) against step, one series per configuration.
pub(super) fn plot(path: &std::path::Path, schedules: &[Schedule], name: &str) -> Result<()> {
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

/// With `MENS_CPU_PROFILE=1`: the CPU passes' time by section, over the whole run.
fn cpu_profile(md: &mut String) {
    let sections = mens::kernels::profile::report();
    if sections.is_empty() {
        return;
    }
    let all: f64 = sections.iter().map(|s| s.1).sum();
    md.push_str(
        "\nCPU forward passes by section, every pass of the run (`MENS_CPU_PROFILE=1`):\n\n",
    );
    md.push_str("| section | calls | seconds | share |\n|---|---|---|---|\n");
    for (name, secs, calls) in sections {
        md.push_str(&format!(
            "| {name} | {calls} | {secs:.3} | {:.1}% |\n",
            100.0 * secs / all
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mens::runner::{KernelTime, Profile};

    #[test]
    fn gpu_profile_rows_give_each_kernels_rate_against_the_copy() {
        let p = Profile {
            kernels: vec![
                KernelTime {
                    name: "matvec_glu_q8_q4k",
                    calls: 28,
                    us: 1000.0,
                    bytes: 2_000_000_000,
                },
                KernelTime {
                    name: "rmsnorm_q8",
                    calls: 57,
                    us: 250.0,
                    bytes: 0,
                },
            ],
            copy_gbs: 4000.0,
        };
        let md = gpu_profile(&p, 512);
        // 2 GB in 1 ms: 2000 GB/s, half the copy bandwidth, 80% of the step's time.
        assert!(
            md.contains("| matvec_glu_q8_q4k | 28 | 1000.0 | 80.0% | 2000.00 | 2000 | 50% |"),
            "{md}"
        );
        assert!(
            md.contains("| rmsnorm_q8 | 57 | 250.0 | 20.0% | 0.00 | 0 | 0% |"),
            "{md}"
        );
        assert!(md.contains("at step 512"), "{md}");
        assert!(
            md.contains("1250 µs and 2000.0 MB in all (1600 GB/s)"),
            "{md}"
        );
    }
}
