//! `mens probe` (what mens sees of this machine) and `mens synth` (random-weight models).

use crate::args::{ProbeArgs, SynthArgs};
use anyhow::{Context, Result};
use std::io::Write;

pub(crate) fn probe(args: ProbeArgs) -> Result<()> {
    use mens::memory::{budget, probe, Backend};
    let m = probe();
    let best = mens::load::Backend::best().name();
    let b = budget(&m, Backend::Cpu);
    let cuda = m
        .gpus
        .iter()
        .any(|g| g.api == "cuda")
        .then(|| budget(&m, Backend::Cuda));
    if args.json {
        let v = serde_json::json!({
            "machine": m,
            "default_backend": best,
            "budget": b.as_ref().ok(),
            "budget_error": b.as_ref().err().map(|e| e.to_string()),
            "cuda_budget": cuda.as_ref().and_then(|c| c.as_ref().ok()),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let gib = |x: u64| format!("{:.1} GiB", x as f64 / (1u64 << 30) as f64);
    println!("os:              {}", m.os);
    println!(
        "cpu:             {} ({} physical / {} logical cores)",
        m.cpu, m.physical_cores, m.logical_cores
    );
    println!(
        "simd:            {}",
        if m.simd.is_empty() {
            "none used".into()
        } else {
            m.simd.join(" ")
        }
    );
    println!(
        "memory:          {} total, {} available{}",
        gib(m.total_ram),
        gib(m.available_ram),
        if m.unified_memory { " (unified)" } else { "" }
    );
    if let Some(c) = m.cgroup_limit {
        println!("cgroup limit:    {}", gib(c));
    }
    if m.gpus.is_empty() {
        println!("gpus:            none found");
    }
    for g in &m.gpus {
        println!(
            "gpu:             {} ({}), {} total, {} free",
            g.name,
            g.api,
            gib(g.total),
            gib(g.free)
        );
    }
    let built: Vec<&str> = mens::load::Backend::built()
        .iter()
        .map(|b| b.name())
        .collect();
    println!(
        "default backend: {best} (this build has: {}; --backend picks one)",
        built.join(", ")
    );
    match &b {
        Ok(b) => println!("memory budget:   {} = {}", gib(b.bytes), b.how),
        Err(e) => println!("memory budget:   none: {e}"),
    }
    if let Some(Ok(c)) = &cuda {
        println!("cuda budget:     {} = {}", gib(c.bytes), c.how);
    }
    if let (Some(path), Ok(b)) = (&args.model, &b) {
        let cuda_bytes = cuda.as_ref().and_then(|c| c.as_ref().ok()).map(|c| c.bytes);
        model_fit(path, b, cuda_bytes)?;
    }
    Ok(())
}

/// For each KV cache type: bytes per token, the context that fits `b` (capped at the trained
/// context, as `mens run` chooses it) and the most the budget would hold without that cap; with a
/// CUDA device (`cuda`: its budget), the context a CUDA session of that type gets.
fn model_fit(path: &std::path::Path, b: &mens::memory::Budget, cuda: Option<u64>) -> Result<()> {
    use mens::cpu::SessionOptions;
    use mens::memory::{estimate_slots, fit_context_slots};
    use mens::model::KvType;
    let g =
        mens::gguf::Gguf::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let (model, _, _) = mens::load::from_gguf(g)?;
    let c = &model.config;
    println!(
        "model:           {} ({:?}, {} layers, {} kv heads × {}, trained context {})",
        path.display(),
        c.arch,
        c.n_layer,
        c.n_kv_head,
        c.head_dim,
        c.train_ctx
    );
    for t in [KvType::F16, KvType::Q8_0, KvType::Q4_0] {
        if t != KvType::F16 && c.head_dim % 32 != 0 {
            continue;
        }
        let per_token = c.kv_bytes_per_token_as(t, t);
        let fit = fit_context_slots(&model, b, None, 512, 1, (t, t)).map(|o| o.ctx);
        let opts = |ctx: usize| SessionOptions {
            ctx,
            batch: 512.min(ctx),
            logit_rows: 16,
            cache_k: t,
            cache_v: t,
        };
        let most = mens::load::largest_fit(16, 1 << 26, |ctx| {
            estimate_slots(&model, &opts(ctx), 1).total() <= b.bytes
        });
        let name = format!("KV cache {}:", t.name());
        match fit {
            Ok(ctx) => println!(
                "{name:<17}{:.1} KiB per token; context {ctx} tokens fits{} (the budget holds {} tokens)",
                per_token as f64 / 1024.0,
                if ctx == c.train_ctx { " (the trained context)" } else { "" },
                most.unwrap_or(0)
            ),
            Err(e) => println!("{name:<17}does not fit: {e}"),
        }
        #[cfg(feature = "cuda")]
        if let Some(cb) = cuda {
            match mens::load::cuda_session_fit(&model, cb, t) {
                Some(ctx) => println!("{:<17}context {ctx} tokens fits on the GPU", ""),
                None => println!("{:<17}does not fit the GPU", ""),
            }
        }
    }
    #[cfg(not(feature = "cuda"))]
    let _ = cuda;
    Ok(())
}

pub(crate) fn synth(a: SynthArgs) -> Result<()> {
    use mens::synth::{synth_model, synth_q4_k_m, QwenShape, SynthSpec};
    if let Some(arch) = &a.tiny {
        let spec = SynthSpec::tiny(arch).ok_or_else(|| {
            anyhow::anyhow!(
                "invalid argument: unknown architecture {arch:?} for --tiny (qwen2, qwen3, llama, llama3)"
            )
        })?;
        let spec = SynthSpec {
            seed: a.seed.unwrap_or(spec.seed),
            ..spec
        };
        std::fs::write(&a.output, synth_model(&spec))
            .with_context(|| format!("cannot write {}", a.output.display()))?;
        eprintln!(
            "mens: wrote {} (tiny {arch} test model)",
            a.output.display()
        );
        return Ok(());
    }
    let name = a.shape.as_deref().unwrap_or_default();
    let shape = QwenShape::by_name(name).ok_or_else(|| {
        anyhow::anyhow!("invalid argument: unknown shape {name:?} (0.5b, 1.5b, 7b or 30b-a3b)")
    })?;
    let w = synth_q4_k_m(&shape, a.seed.unwrap_or(1));
    let file = std::fs::File::create(&a.output)
        .with_context(|| format!("cannot create {}", a.output.display()))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    w.write_to(&mut out)
        .and_then(|_| out.flush())
        .with_context(|| format!("cannot write {}", a.output.display()))?;
    let bytes: usize = w.tensors().map(|t| t.3).sum();
    eprintln!(
        "mens: wrote {} ({} shape, Q4_K_M layout, {:.0} MiB of random weights)",
        a.output.display(),
        shape.name,
        bytes as f64 / 1048576.0
    );
    Ok(())
}
