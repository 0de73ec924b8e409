//! `--backend cuda`: open the GPU, upload the model, size the context to the device's memory.

use crate::{Loaded, ModelArgs};
use anyhow::{bail, Result};
use mens::engine::Runner;

/// The backends this build has.
pub(crate) fn backends() -> Vec<&'static str> {
    let mut have = vec!["cpu"];
    if cfg!(feature = "cuda") {
        have.push("cuda");
    }
    if cfg!(feature = "metal") {
        have.push("metal");
    }
    have
}

/// Fail early, with the list of what this build has, for a backend it lacks.
pub(crate) fn check_backend(name: &str) -> Result<()> {
    let have = backends();
    if have.contains(&name) {
        return Ok(());
    }
    if name == "cuda" || name == "metal" {
        bail!(
            "invalid argument: backend {name:?} is not in this build (it has: {}); build with `cargo build --release --features {name}`",
            have.join(", ")
        );
    }
    bail!(
        "invalid argument: unknown backend {name:?} (this build has: {})",
        have.join(", ")
    )
}

/// `-c` when given (0 = not given), else the trained context halved until it fits (at least 256).
#[cfg(any(feature = "cuda", feature = "metal"))]
fn choose_ctx(requested: usize, train_ctx: usize, fits: impl Fn(usize) -> bool) -> usize {
    if requested > 0 {
        return requested;
    }
    let mut ctx = train_ctx.min(1 << 17);
    while ctx > 256 && !fits(ctx) {
        ctx /= 2;
    }
    ctx
}

/// A sequence on `--backend` (cpu is handled by the caller).
pub(crate) fn session(l: &Loaded, args: &ModelArgs) -> Result<Box<dyn Runner>> {
    check_backend(&args.backend)?;
    match args.backend.as_str() {
        #[cfg(feature = "cuda")]
        "cuda" => cuda_session(l),
        #[cfg(feature = "metal")]
        "metal" => metal_session(l),
        other => {
            let _ = l;
            bail!("invalid argument: backend {other:?} needs no GPU session")
        }
    }
}

#[cfg(feature = "metal")]
fn metal_session(l: &Loaded) -> Result<Box<dyn Runner>> {
    use mens::memory::{budget, probe, Backend};
    use mens::metal::{kv_cache_bytes, MetalModel, MetalSession};
    use std::sync::Arc;
    // Unified memory: the Apple Silicon rule (75% of hw.memsize, 2048 MiB headroom, Metal's
    // recommended working set) against weights + KV cache.
    let b = budget(&probe(), Backend::Metal)?;
    let c = &l.model.config;
    let weights = l.model.weight_bytes();
    let fits = |ctx: usize| weights + kv_cache_bytes(c, ctx) <= b.bytes;
    let ctx = choose_ctx(l.options.ctx, c.train_ctx, fits);
    if !fits(ctx) {
        bail!(
            "memory budget: the model ({} MiB) and a {ctx}-token KV cache ({} MiB) do not fit the {} MiB budget ({})",
            weights >> 20,
            kv_cache_bytes(c, ctx) >> 20,
            b.bytes >> 20,
            b.how
        );
    }
    let dev = MetalModel::device()?;
    let model = MetalModel::upload(dev, l.model.clone())?;
    eprintln!("mens: Metal device, context {ctx} tokens");
    Ok(Box::new(MetalSession::new(Arc::new(model), ctx)?))
}

#[cfg(feature = "cuda")]
fn cuda_session(l: &Loaded) -> Result<Box<dyn Runner>> {
    use mens::cuda::{session_bytes, CudaSession, Device, GpuModel};
    use std::sync::Arc;
    // Prompt tokens per prefill pass: weights are dequantized once per pass, so larger is faster.
    const UBATCH: usize = 2048;
    let t0 = std::time::Instant::now();
    let dev = Device::open(0)?;
    let (free, total) = dev.mem_info()?;
    let c = &l.model.config;
    eprintln!(
        "mens: CUDA device {} (sm_{}{}), {} MiB free of {} MiB",
        dev.name,
        dev.arch.0,
        dev.arch.1,
        free >> 20,
        total >> 20
    );
    // Budget: the free device memory less a margin for the context and cuBLAS workspace.
    let budget = free.saturating_sub(mens::memory::CUDA_MARGIN);
    let weights = l.model.weight_bytes();
    let fits = |ctx: usize| weights + session_bytes(c, ctx, UBATCH.min(ctx)) <= budget;
    let ctx = choose_ctx(l.options.ctx, c.train_ctx, fits);
    if !fits(ctx) {
        bail!(
            "memory budget: the model ({} MiB) and a {ctx}-token CUDA session ({} MiB) do not fit the {} MiB budget of {} ({} MiB free − {} MiB margin); use a smaller --ctx-size or model",
            weights >> 20,
            session_bytes(c, ctx, UBATCH.min(ctx)) >> 20,
            budget >> 20,
            dev.name,
            free >> 20,
            mens::memory::CUDA_MARGIN >> 20
        );
    }
    let bar = indicatif::ProgressBar::new(c.n_layer as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("uploading {bar:40} {pos}/{len} layers")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let model = GpuModel::upload(dev, &l.model, |i| bar.set_position(i as u64))?;
    bar.finish_and_clear();
    let s = CudaSession::new(Arc::new(model), ctx, UBATCH)?;
    eprintln!(
        "mens: {} MiB of weights on the GPU, context {ctx} tokens ({} MiB KV cache), in {:.2} s",
        weights >> 20,
        s.kv_cache_bytes() >> 20,
        t0.elapsed().as_secs_f64()
    );
    Ok(Box::new(s))
}
