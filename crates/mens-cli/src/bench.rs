//! `mens bench`: prefill and decode speed on random (real-vocabulary) tokens, like llama-bench's
//! pp/tg tests, plus memory, heap allocations and kernel dispatches per decode step.

use crate::{load, BenchArgs, ALLOCATIONS};
use anyhow::{bail, Result};
use mens::engine::{Logits, Session, SessionOptions};
use mens::kernels::ops::argmax;
use mens::kernels::DISPATCHES;
use rand::{Rng, SeedableRng};
use std::sync::atomic::Ordering;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

pub fn run(args: BenchArgs) -> Result<()> {
    let l = load(&args.model)?;
    let c = &l.model.config;
    let max_depth = args.depth.iter().copied().max().unwrap_or(0);
    let max_prompt = args.prompt.iter().copied().max().unwrap_or(0);
    let ctx = (max_prompt.max(max_depth + args.gen) + 1).max(16);
    if args.reps == 0 || args.prompt.contains(&0) {
        bail!("invalid argument: --reps and prompt sizes must be > 0");
    }
    let mut s = Session::new(
        l.model.clone(),
        SessionOptions {
            ctx,
            batch: 512.min(ctx),
            logit_rows: 1,
        },
    )?;
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
    let mut rows = Vec::new();
    println!("| model | threads | test | tokens/s | ms | notes |");
    println!("|---|---|---|---|---|---|");
    for &n in &args.prompt {
        let mut tps = Vec::new();
        let mut ttft = Vec::new();
        for _ in 0..args.reps {
            let toks = random(n);
            s.reset();
            let t0 = Instant::now();
            s.forward(&toks, Logits::Last)?;
            let _first = argmax(s.logits());
            let dt = t0.elapsed().as_secs_f64();
            tps.push(n as f64 / dt);
            ttft.push(dt * 1e3);
        }
        let (t, ms) = (median(tps), median(ttft));
        println!("| {name} | {threads} | pp{n} | {t:.1} | {ms:.0} | time to first token (median of {}) |", args.reps);
        rows.push(serde_json::json!({"test": format!("pp{n}"), "n_prompt": n, "n_gen": 0, "n_depth": 0, "tokens_per_s": t, "ttft_ms": ms}));
    }
    let mut scratch = Vec::with_capacity(ctx);
    for &d in &args.depth {
        let mut tps = Vec::new();
        let (mut allocs, mut disp) = (0u64, 0u64);
        for _ in 0..args.reps {
            s.reset();
            if d > 0 {
                s.forward(&random(d), Logits::Last)?;
            } else {
                s.forward(&random(1), Logits::Last)?;
            }
            let a0 = ALLOCATIONS.load(Ordering::Relaxed);
            let k0 = DISPATCHES.load(Ordering::Relaxed);
            let t0 = Instant::now();
            for _ in 0..args.gen {
                let next = argmax(s.logits());
                if args.no_kv_cache {
                    s.rerun(&[next], &mut scratch)?;
                } else {
                    s.forward(&[next], Logits::Last)?;
                }
            }
            tps.push(args.gen as f64 / t0.elapsed().as_secs_f64());
            allocs = ALLOCATIONS.load(Ordering::Relaxed) - a0;
            disp = DISPATCHES.load(Ordering::Relaxed) - k0;
        }
        let mode = if args.no_kv_cache {
            "no KV cache"
        } else {
            "KV cache"
        };
        rows.push(serde_json::json!({
            "test": format!("tg{}", args.gen), "n_prompt": 0, "n_gen": args.gen, "n_depth": d,
            "tokens_per_s": median(tps.clone()), "kv_cache": !args.no_kv_cache,
            "allocations_per_step": allocs as f64 / args.gen as f64, "dispatches_per_step": disp as f64 / args.gen as f64,
        }));
        println!(
            "| {name} | {threads} | tg{} @ d{d} | {:.2} | {:.1} | {mode}; {:.1} heap allocations, {} kernel dispatches per step |",
            args.gen,
            median(tps.clone()),
            1e3 / median(tps),
            allocs as f64 / args.gen as f64,
            disp / args.gen as u64
        );
    }
    if let Some(path) = &args.json {
        let v = serde_json::json!({
            "model": name, "threads": threads, "results": rows,
            "kv_cache_bytes": s.kv_cache_bytes(), "session_bytes": s.bytes(),
            "model_bytes": l.model.weight_bytes(), "peak_rss_bytes": mens::memory::peak_rss(),
            "machine": mens::memory::probe(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&v)?)?;
    }
    println!();
    println!(
        "model {:.0} MiB (file {:.0} MiB), KV cache {:.1} MiB for {ctx} tokens, session buffers {:.1} MiB, peak RSS {:.0} MiB",
        l.model.weight_bytes() as f64 / 1048576.0,
        l.model.gguf.file_len() as f64 / 1048576.0,
        s.kv_cache_bytes() as f64 / 1048576.0,
        s.bytes() as f64 / 1048576.0,
        peak_rss_mib()
    );
    Ok(())
}
