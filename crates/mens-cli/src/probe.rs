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
    match b {
        Ok(b) => println!("memory budget:   {} = {}", gib(b.bytes), b.how),
        Err(e) => println!("memory budget:   none: {e}"),
    }
    if let Some(Ok(c)) = &cuda {
        println!("cuda budget:     {} = {}", gib(c.bytes), c.how);
    }
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
        anyhow::anyhow!("invalid argument: unknown shape {name:?} (0.5b, 1.5b or 7b)")
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
        "mens: wrote {} (Qwen2.5 {} shape, Q4_K_M layout, {:.0} MiB of random weights)",
        a.output.display(),
        shape.name,
        bytes as f64 / 1048576.0
    );
    Ok(())
}
