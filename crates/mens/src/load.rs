//! Loading and admission, for every caller (the CLI, the server, the fuzz target, the tests): one
//! [`load`] opens the model, builds its tokenizer and chat template from the file, and admits it
//! against the memory budget of the chosen backend; [`Loaded::runner`] then makes a sequence on that
//! backend (uploading the weights for a GPU and sizing the context to its memory).

use crate::chat::{ChatTemplate, Isolation};
use crate::cpu::{Session, SessionOptions};
use crate::gguf::Gguf;
pub use crate::memory::Backend;
use crate::memory::{self, Budget, Estimate};
use crate::model::{KvType, Model};
use crate::runner::Runner;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Prompt tokens per CPU forward pass.
pub const CPU_BATCH: usize = 512;
/// Prompt tokens per CUDA prefill pass: weights are dequantized once per pass, so larger is faster.
pub const CUDA_UBATCH: usize = 2048;

impl Backend {
    /// Backends this build has.
    pub fn built() -> Vec<Backend> {
        let mut v = vec![Backend::Cpu];
        if cfg!(feature = "cuda") {
            v.push(Backend::Cuda);
        }
        if cfg!(feature = "metal") {
            v.push(Backend::Metal);
        }
        v
    }

    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
            Backend::Metal => "metal",
        }
    }

    /// The best backend this build and machine have: CUDA when built and a device is found, Metal
    /// when built (Apple Silicon), else the CPU.
    pub fn best() -> Backend {
        #[cfg(feature = "cuda")]
        if crate::cuda::Device::open(0).is_ok() {
            return Backend::Cuda;
        }
        if cfg!(feature = "metal") {
            return Backend::Metal;
        }
        Backend::Cpu
    }

    /// An error unless this build has the backend.
    pub fn check_built(self) -> Result<()> {
        if Backend::built().contains(&self) {
            return Ok(());
        }
        let have: Vec<&str> = Backend::built().iter().map(|b| b.name()).collect();
        Err(Error::InvalidArgument(format!(
            "backend {:?} is not in this build (it has: {}); build with `cargo build --release --features {}`",
            self.name(),
            have.join(", "),
            self.name()
        )))
    }
}

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub path: PathBuf,
    pub backend: Backend,
    /// Context tokens per sequence; None = the largest that fits (up to the trained context).
    pub ctx: Option<usize>,
    /// Overrides the probed budget (CPU and Metal); on CUDA a cap on the device memory used.
    pub memory_budget: Option<u64>,
    /// Sequences admitted together (the server's slots).
    pub slots: usize,
    /// What the KV cache stores for K and V (`-ctk` / `-ctv`; CUDA: one type for both; Metal: f16).
    pub cache: (KvType, KvType),
    /// Render chat templates in a helper process (see [`Isolation`]).
    pub isolation: Option<Isolation>,
    /// A chat template to use instead of the file's (`--chat-template-file`).
    pub chat_template: Option<String>,
}

/// A model, its tokenizer and chat template, admitted for a backend.
pub struct Loaded {
    pub model: Arc<Model>,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub backend: Backend,
    /// CPU: the admitted session options. GPU: `ctx` is the requested context (0 = choose at upload).
    pub options: SessionOptions,
    /// CPU: what the admitted sessions need.
    pub estimate: Estimate,
    /// One line on the budget and the context chosen (CPU), for the load log.
    pub plan: String,
    pub load_time: std::time::Duration,
    /// `--memory-budget`: on a GPU, a cap on the device memory used (the KV pool takes what the
    /// weights and buffers leave of it).
    pub memory_budget: Option<u64>,
}

/// Open, check and admit a model (see the module comment). No weight page is touched before the
/// model is admitted.
pub fn load(o: &LoadOptions) -> Result<Loaded> {
    o.backend.check_built()?;
    if let Some(c) = o.ctx {
        if c == 0 || c > 1 << 20 {
            return Err(Error::InvalidArgument(format!(
                "--ctx-size must be between 1 and {}",
                1 << 20
            )));
        }
    }
    if o.cache != (KvType::F16, KvType::F16) && o.backend == Backend::Metal {
        return Err(Error::InvalidArgument(format!(
            "a {}/{} KV cache runs on the CPU and CUDA backends (this run: metal); use f16 or --backend cpu",
            o.cache.0.name(),
            o.cache.1.name(),
        )));
    }
    let t0 = Instant::now();
    let (model, tokenizer, mut template) = from_gguf(Gguf::open(&o.path)?)?;
    if let Some(src) = &o.chat_template {
        template = template.with_source(src.clone());
    }
    if let Some(iso) = &o.isolation {
        template.isolate(iso.clone());
    }
    if o.chat_template.is_some() {
        template.check()?;
    }
    let (options, plan) = match o.backend {
        Backend::Cpu => {
            let b = match o.memory_budget {
                Some(bytes) => Budget {
                    backend: Backend::Cpu,
                    bytes,
                    base: bytes,
                    how: "--memory-budget".into(),
                },
                None => memory::budget(&memory::probe(), Backend::Cpu)?,
            };
            let slots = o.slots.max(1);
            let opts = memory::fit_context_slots(&model, &b, o.ctx, CPU_BATCH, slots, o.cache)?;
            let e = memory::estimate_slots(&model, &opts, slots);
            let plan = format!(
                "memory budget {} MiB ({}); context {} tokens{}{}; KV cache {}/{} ({} MiB); estimated use {} MiB",
                b.bytes >> 20,
                b.how,
                opts.ctx,
                if slots > 1 {
                    format!(" × {slots} slots")
                } else {
                    String::new()
                },
                if o.ctx.is_none() {
                    " (the largest that fits, up to the trained context)"
                } else {
                    ""
                },
                o.cache.0.name(),
                o.cache.1.name(),
                e.kv_cache >> 20,
                e.total() >> 20
            );
            (opts, plan)
        }
        _ => (
            SessionOptions {
                ctx: o.ctx.unwrap_or(0),
                cache_k: o.cache.0,
                cache_v: o.cache.1,
                ..Default::default()
            },
            String::new(),
        ),
    };
    let estimate = memory::estimate_slots(&model, &options, o.slots.max(1));
    if o.backend == Backend::Cpu {
        prefault(&model);
    }
    Ok(Loaded {
        model: Arc::new(model),
        tokenizer,
        template,
        backend: o.backend,
        options,
        estimate,
        plan,
        load_time: t0.elapsed(),
        memory_budget: o.memory_budget,
    })
}

/// The largest GPU context that `fits`, from 256 up to the trained context (at most 128 Ki tokens).
#[cfg(any(feature = "cuda", feature = "metal"))]
fn gpu_fit(model: &Model, fits: impl Fn(usize) -> bool) -> Option<usize> {
    let hi = model.config.train_ctx.min(1 << 17);
    largest_fit(256.min(hi), hi, fits)
}

/// The context a CUDA session with cache type `kv` gets when `-c` is not given, for a device
/// budget of `budget` bytes (free memory less [`memory::CUDA_MARGIN`]): what `mens probe` prints.
#[cfg(feature = "cuda")]
pub fn cuda_session_fit(model: &Model, budget: u64, kv: KvType) -> Option<usize> {
    let c = &model.config;
    let w = model.weight_bytes();
    gpu_fit(model, |ctx| {
        w + crate::cuda::session_bytes(c, ctx, CUDA_UBATCH.min(ctx), kv) <= budget
    })
}

/// The model, its tokenizer and its chat template from a parsed file: the one way every caller
/// (the CLI, the server, the fuzz target, the tests) builds them.
pub fn from_gguf(g: Gguf) -> Result<(Model, Tokenizer, ChatTemplate)> {
    let tokenizer = Tokenizer::from_gguf(&g)?;
    let template = ChatTemplate::from_gguf(&g, &tokenizer)?;
    let model = Model::from_gguf(g)?;
    tokenizer.check_model(model.config.vocab_size)?;
    Ok((model, tokenizer, template))
}

/// Touch every page of the mapped file so the first token does not pay for disk reads.
fn prefault(model: &Model) {
    let bytes: &[u8] = &model.gguf.storage;
    let mut sum = 0u8;
    for p in bytes.iter().step_by(4096) {
        sum = sum.wrapping_add(*p);
    }
    std::hint::black_box(sum);
}

/// The largest context in `lo..=hi` for which `fits` holds (it must be monotone), if any.
pub fn largest_fit(lo: usize, hi: usize, fits: impl Fn(usize) -> bool) -> Option<usize> {
    if lo > hi || !fits(lo) {
        return None;
    }
    let (mut lo, mut hi) = (lo, hi);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Some(lo)
}

impl Loaded {
    /// A sequence on the loaded backend. `log` receives one-line notes (device, context chosen);
    /// `progress` the layers uploaded so far and their count (GPU).
    pub fn runner(
        &self,
        log: &mut dyn FnMut(String),
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Box<dyn Runner>> {
        self.target().runner(log, progress)
    }

    /// What [`Self::runner`] needs, to make the runner elsewhere (the scheduler's thread).
    pub fn target(&self) -> Target {
        Target {
            model: self.model.clone(),
            backend: self.backend,
            options: self.options.clone(),
            memory_budget: self.memory_budget,
        }
    }
}

/// A model admitted for a backend, without its tokenizer and template: enough to make runners.
#[derive(Clone)]
pub struct Target {
    pub model: Arc<Model>,
    pub backend: Backend,
    pub options: SessionOptions,
    /// See [`Loaded::memory_budget`].
    pub memory_budget: Option<u64>,
}

impl Target {
    /// See [`Loaded::runner`].
    pub fn runner(
        &self,
        log: &mut dyn FnMut(String),
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Box<dyn Runner>> {
        let _ = (&log, &progress);
        match self.backend {
            Backend::Cpu => Ok(Box::new(Session::new(
                self.model.clone(),
                self.options.clone(),
            )?)),
            #[cfg(feature = "cuda")]
            Backend::Cuda => self.cuda_runner(log, progress),
            #[cfg(feature = "metal")]
            Backend::Metal => self.metal_runner(log),
            #[allow(unreachable_patterns)]
            b => Err(Error::InvalidArgument(format!(
                "backend {} is not in this build",
                b.name()
            ))),
        }
    }

    /// The server's runner: `slots` sequences stepped together, at most `step_tokens` tokens a
    /// step. CPU: one [`crate::cpu::Batch`]; CUDA: one [`crate::cuda::CudaBatch`] (a KV pool for
    /// every slot, batched decode); Metal: one sequence.
    pub fn batch_runner(
        &self,
        slots: usize,
        step_tokens: usize,
        log: &mut dyn FnMut(String),
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Box<dyn Runner>> {
        let _ = (&log, &progress);
        match self.backend {
            Backend::Cpu => Ok(Box::new(crate::cpu::Batch::with_cache(
                self.model.clone(),
                slots,
                self.options.ctx,
                step_tokens,
                self.options.cache(),
            )?)),
            #[cfg(feature = "cuda")]
            Backend::Cuda => self.cuda_batch(slots, step_tokens, log, progress),
            _ if slots == 1 => self.runner(log, progress),
            b => Err(Error::InvalidArgument(format!(
                "backend {} serves one sequence at a time (--parallel 1)",
                b.name()
            ))),
        }
    }

    /// The device memory a CUDA runner may use: free memory less [`memory::CUDA_MARGIN`], at most
    /// `--memory-budget`.
    #[cfg(feature = "cuda")]
    fn cuda_budget(&self, free: u64) -> u64 {
        let b = free.saturating_sub(memory::CUDA_MARGIN);
        self.memory_budget.map_or(b, |m| b.min(m))
    }

    /// The context a CUDA runner gets (the requested one, or the largest that fits), where
    /// `bytes(ctx)` is what `runner` allocates beside the weights: the budget is
    /// [`Target::cuda_budget`]. A clear error when it cannot fit.
    #[cfg(feature = "cuda")]
    fn cuda_ctx(
        &self,
        device: &str,
        free: u64,
        runner: &str,
        bytes: impl Fn(usize) -> u64,
        advice: &str,
    ) -> Result<usize> {
        let budget = self.cuda_budget(free);
        let weights = self.model.weight_bytes();
        let need = |ctx: usize| weights + bytes(ctx);
        let ctx = self.gpu_ctx(|ctx| need(ctx) <= budget);
        if need(ctx) > budget {
            return Err(Error::Memory(format!(
                "the model ({} MiB) and {runner} of {ctx} tokens ({} MiB) do not fit the {} MiB budget of {device} ({} MiB free − {} MiB margin); {advice}",
                weights >> 20,
                (need(ctx) - weights) >> 20,
                budget >> 20,
                free >> 20,
                memory::CUDA_MARGIN >> 20
            )));
        }
        Ok(ctx)
    }

    #[cfg(feature = "cuda")]
    fn cuda_batch(
        &self,
        slots: usize,
        step_tokens: usize,
        log: &mut dyn FnMut(String),
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Box<dyn Runner>> {
        use crate::cuda::{
            batch_bytes, check_cache, f16_copy_reserve, pool_fit, sequence_pages, CudaBatch,
            GpuModel, PAGE,
        };
        let t0 = Instant::now();
        let c = &self.model.config;
        let kv = check_cache(c, self.options.cache())?;
        let (dev, free) = open_cuda(log)?;
        // The KV pool is paged: each sequence may grow to the context, and the pool takes what
        // the budget leaves (every page the slots could use at most), so many short requests and
        // a few long ones share it.
        let budget = self
            .cuda_budget(free)
            .saturating_sub(self.model.weight_bytes());
        let pool = |ctx: usize, extra: u64| {
            pool_fit(c, slots, ctx, CUDA_UBATCH, kv, budget.saturating_sub(extra))
        };
        let fit = |extra: u64| -> Result<(usize, usize)> {
            let ctx = self.cuda_ctx(
                &dev.name,
                free,
                &format!("{slots} CUDA sequences"),
                // At least one sequence of ctx tokens (and a page to copy a shared one into).
                |ctx| {
                    let least = sequence_pages(ctx);
                    batch_bytes(c, slots, ctx, CUDA_UBATCH, kv, least) + extra
                },
                "use fewer --parallel slots, a smaller --ctx-size or a smaller model",
            )?;
            let pages = pool(ctx, extra).ok_or_else(|| {
                Error::Memory(format!(
                    "no KV pool for {slots} sequences of {ctx} tokens fits"
                ))
            })?;
            Ok((ctx, pages))
        };
        // Room for the f16 weight copy (twice the decode speed from 5 rows: see CudaBatch) where
        // the context still fits with it; else the context without it.
        let ((ctx, pages), copy) = match f16_copy_reserve(c, slots) {
            0 => (fit(0)?, false),
            r => match fit(r) {
                Ok(f) => (f, true),
                Err(_) => (fit(0)?, false),
            },
        };
        let n = c.n_layer;
        let model = GpuModel::upload(dev, &self.model, |i| progress(i, n))?;
        let (b, copy) = CudaBatch::serving(
            Arc::new(model),
            slots,
            ctx,
            CUDA_UBATCH,
            step_tokens,
            kv,
            pages,
            copy,
        )?;
        let copy = if copy.is_empty() {
            copy
        } else {
            format!(", {copy}")
        };
        let m = b.memory();
        log(format!(
            "memory plan: weights {} MiB{copy}, KV pool {} MiB ({pages} pages of {PAGE} tokens, {}; {slots} slots of up to {ctx} tokens), buffers {} MiB on the GPU; in {:.2} s",
            self.model.weight_bytes() >> 20,
            m.kv_cache >> 20,
            kv.name(),
            m.buffers >> 20,
            t0.elapsed().as_secs_f64()
        ));
        Ok(Box::new(b))
    }

    /// GPU context: `-c` when given, else the largest that `fits` up to the trained context
    /// (at most 128 Ki tokens, at least 256).
    #[cfg(any(feature = "cuda", feature = "metal"))]
    fn gpu_ctx(&self, fits: impl Fn(usize) -> bool) -> usize {
        if self.options.ctx > 0 {
            return self.options.ctx;
        }
        let hi = self.model.config.train_ctx.min(1 << 17);
        gpu_fit(&self.model, fits).unwrap_or(256.min(hi))
    }

    #[cfg(feature = "cuda")]
    fn cuda_runner(
        &self,
        log: &mut dyn FnMut(String),
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Box<dyn Runner>> {
        use crate::cuda::{check_cache, session_bytes, CudaSession, GpuModel};
        let t0 = Instant::now();
        let c = &self.model.config;
        let kv = check_cache(c, self.options.cache())?;
        let (dev, free) = open_cuda(log)?;
        let ctx = self.cuda_ctx(
            &dev.name,
            free,
            "a CUDA session",
            |ctx| session_bytes(c, ctx, CUDA_UBATCH.min(ctx), kv),
            "use a smaller --ctx-size or model",
        )?;
        let n = c.n_layer;
        let model = GpuModel::upload(dev, &self.model, |i| progress(i, n))?;
        let s = CudaSession::with_cache(Arc::new(model), ctx, CUDA_UBATCH, kv)?;
        log(format!(
            "memory plan: weights {} MiB, KV cache {} MiB ({}), buffers {} MiB on the GPU; context {ctx} tokens; in {:.2} s",
            self.model.weight_bytes() >> 20,
            s.kv_cache_bytes() >> 20,
            kv.name(),
            (session_bytes(c, ctx, CUDA_UBATCH.min(ctx), kv) - s.kv_cache_bytes() as u64) >> 20,
            t0.elapsed().as_secs_f64()
        ));
        Ok(Box::new(s))
    }

    #[cfg(feature = "metal")]
    fn metal_runner(&self, log: &mut dyn FnMut(String)) -> Result<Box<dyn Runner>> {
        use crate::metal::{kv_cache_bytes, MetalModel, MetalSession};
        // Unified memory: the Apple Silicon rule (75% of hw.memsize, 2048 MiB headroom, Metal's
        // recommended working set) against weights + KV cache.
        let b = memory::budget(&memory::probe(), Backend::Metal)?;
        let c = &self.model.config;
        let weights = self.model.weight_bytes();
        let fits = |ctx: usize| weights + kv_cache_bytes(c, ctx) <= b.bytes;
        let ctx = self.gpu_ctx(fits);
        if !fits(ctx) {
            return Err(Error::Memory(format!(
                "the model ({} MiB) and a {ctx}-token KV cache ({} MiB) do not fit the {} MiB budget ({})",
                weights >> 20,
                kv_cache_bytes(c, ctx) >> 20,
                b.bytes >> 20,
                b.how
            )));
        }
        let dev = MetalModel::device()?;
        let model = MetalModel::upload(dev, self.model.clone())?;
        log(format!("Metal device, context {ctx} tokens"));
        Ok(Box::new(MetalSession::new(Arc::new(model), ctx)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn largest_fit_bisects_a_monotone_predicate() {
        assert_eq!(largest_fit(16, 4096, |c| c <= 1000), Some(1000));
        assert_eq!(largest_fit(16, 4096, |c| c <= 10), None);
        assert_eq!(largest_fit(16, 4096, |_| true), Some(4096));
        assert_eq!(largest_fit(256, 256, |_| true), Some(256));
    }
}

/// The first CUDA device and its free memory, said in the load log.
#[cfg(feature = "cuda")]
fn open_cuda(log: &mut dyn FnMut(String)) -> Result<(Arc<crate::cuda::Device>, u64)> {
    let dev = crate::cuda::Device::open(0)?;
    let (free, total) = dev.mem_info()?;
    log(format!(
        "CUDA device {} (sm_{}{}, {} SMs), {} MiB free of {} MiB",
        dev.name,
        dev.arch.0,
        dev.arch.1,
        dev.sms,
        free >> 20,
        total >> 20
    ));
    Ok((dev, free))
}
