//! Many sequences on the GPU (the server's slots): one KV pool in pages allocated at startup (a
//! page table per slot, `pages::PagePool`), a batched decode step over every decoding slot (one CUDA graph per batch-size bucket,
//! the batch padded to its bucket; tokens, positions and slots in a device buffer so that a replay
//! needs no re-capture), and prompts through one prefill engine (a [`CudaSession`] pointed at the
//! slot's region). Greedy choices for every row come back in one copy per step.

use super::session::Packed;
use super::*;
use crate::pages::PagePool;
use crate::runner::{check_tokens, Logits, Memory, Part, Runner};

/// Batch sizes a decode graph is captured for (powers of two, then `rows`).
fn buckets(rows: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut b = 1;
    while b < rows {
        v.push(b);
        b *= 2;
    }
    v.push(rows);
    v
}

/// Tokens of one slot a step can verify in the batched decode graph (speculative decoding: the
/// rows of one slot at consecutive positions), and the rows a step holds at least.
pub const VERIFY_ROWS: usize = 16;

/// Rows a decode step of a batch of `slots` holds: a row per slot, or one slot's verify rows.
fn step_rows(slots: usize) -> usize {
    slots.max(VERIFY_ROWS)
}

/// Per-row device buffers of the batched decode step, for `slots` rows (beside the KV pool and
/// the prefill engine).
fn decode_bytes(c: &Config, slots: usize, ctx: usize) -> usize {
    let (d, q, f, v) = (c.dim, c.q_dim(), c.ffn_dim, c.vocab_size);
    let wide = d.max(q);
    let splits = ctx.div_ceil(SPLIT);
    slots
        * (4 * d
            + wide
            + 8 * wide / 32
            + f
            + 8 * f / 32
            + 4
            + 4 * q
            + 4 * (q + 2 * c.kv_dim())
            + 8 * f
            + 2 * wide
            + 2 * f
            + 4 * splits * q
            + 8 * splits * c.n_head
            + 4 * c.n_kv_head
            + 8 * ARGMAX_BLOCKS
            + 4
            + 16
            + 8)
        + (slots + 1) * (4 * v + 4)
        + 8 * TOPK_BLOCKS * TOPK_MAX
        + 4 * slots * H16_PART_ROWS
        + 4 * H16_PART_ROWS / H16_ROWS
        + 4096
}

/// Bytes of the rows a cache shift (reuse across edits) moves through: one layer's K and V of a
/// slot, on an f16 pool.
fn shift_bytes(c: &Config, ctx: usize, kv: KvType) -> usize {
    match kv {
        KvType::F16 => 2 * ctx * kv_row_bytes(kv, c.kv_dim()),
        _ => 0,
    }
}

/// Tokens a page of the KV pool holds (one decode attention split: a split never spans pages).
pub const PAGE: usize = SPLIT;

/// Bytes of one page of K (or of V): `PAGE` rows of every layer.
pub fn page_bytes(c: &Config, kv: KvType) -> usize {
    c.n_layer * PAGE * kv_row_bytes(kv, c.kv_dim())
}

/// Pages one sequence of `ctx` tokens may need: its rows, and a page to copy a shared one into.
pub fn sequence_pages(ctx: usize) -> usize {
    ctx.div_ceil(PAGE) + 1
}

/// Pages that give each of `slots` sequences its whole `ctx` (every request is admitted at once).
pub fn full_pool(slots: usize, ctx: usize) -> usize {
    slots * sequence_pages(ctx)
}

/// The prefill engine's shape for a batch of `slots` sequences of `ctx` tokens: (rows of each
/// layer of its cache, tokens a pass takes). A pass may pack several slots' prompt chunks, so it
/// takes up to `ubatch` tokens even where one sequence holds fewer.
fn engine_shape(slots: usize, ctx: usize, ubatch: usize) -> (usize, usize) {
    let ub = ubatch.clamp(1, ctx.saturating_mul(slots).max(1));
    (ctx.max(ub), ub)
}

/// Bytes a batch of `slots` sequences of up to `ctx` tokens (prompts `ubatch` at a time, cache
/// type `kv`) over a pool of `pages` pages allocates on the device.
pub fn batch_bytes(
    c: &Config,
    slots: usize,
    ctx: usize,
    ubatch: usize,
    kv: KvType,
    pages: usize,
) -> u64 {
    // The prefill engine with its own contiguous cache (the staging rows a slot's pages are
    // gathered into for a prompt pass), the page table, the pool.
    let (ectx, ub) = engine_shape(slots, ctx, ubatch);
    let engine = session_bytes(c, ectx, ub, kv) as usize;
    let table = 4 * slots * ctx.div_ceil(PAGE);
    let rows = step_rows(slots);
    let logits = 4 * rows * (c.vocab_size + 1);
    let penalties = 8 * ctx;
    let shift = shift_bytes(c, ctx, kv);
    (2 * pages * page_bytes(c, kv)
        + engine
        + table
        + decode_bytes(c, rows, ctx)
        + super::moe::moe_bytes(c, rows)
        + logits
        + penalties
        + shift) as u64
}

/// The pool for `slots` sequences of up to `ctx` tokens in `budget` bytes: every page they could
/// use, or as many as fit beside the batch's other buffers. None when not even one sequence of
/// `ctx` tokens fits.
pub fn pool_fit(
    c: &Config,
    slots: usize,
    ctx: usize,
    ubatch: usize,
    kv: KvType,
    budget: u64,
) -> Option<usize> {
    let fixed = batch_bytes(c, slots, ctx, ubatch, kv, 0);
    let per = 2 * page_bytes(c, kv) as u64;
    let pages = (budget.checked_sub(fixed)? / per) as usize;
    let least = sequence_pages(ctx);
    (pages >= least).then(|| pages.min(full_pool(slots, ctx).max(least)))
}

/// Kernels of a batched decode step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchKernels {
    /// One row alone: the single-sequence graph (matrix-vector kernels); up to 15 rows: dp4a
    /// kernels on q8 activations (the matrix-vector arithmetic, bound by weight reads); 16 rows
    /// to 32: tensor-core matmuls on f16 activations (bound by dequantization, done once per
    /// weight for all rows); more than 32: each weight dequantized to f16 and one cuBLAS GEMM.
    /// With the model's f16 weight copy ([`CudaBatch::serving`]): cuBLAS on the copy from 5
    /// rows. Measured on the H200: docs/benchmarks.md.
    Auto,
    /// dp4a kernels at every batch size: a row gives the bits it gives alone.
    Dp4a,
    /// Tensor-core matmuls at every batch size: a row gives the bits it gives alone.
    TensorCores,
    /// Each weight dequantized to f16, then a cuBLAS GEMM (as a prompt pass does), at every
    /// batch size: cuBLAS picks its kernel per shape, so a row's bits depend on the batch size.
    Cublas,
}

impl BatchKernels {
    /// `MENS_CUDA_BATCH=dp4a|mma|cublas` forces one family; else [`BatchKernels::Auto`].
    pub fn from_env() -> Self {
        match std::env::var("MENS_CUDA_BATCH").as_deref() {
            Ok("dp4a") => BatchKernels::Dp4a,
            Ok("mma") => BatchKernels::TensorCores,
            Ok("cublas") => BatchKernels::Cublas,
            _ => BatchKernels::Auto,
        }
    }
}

/// Device memory an f16 weight copy must leave free beside the batch (fragmentation, cuBLAS).
const F16_HEADROOM: u64 = 2 << 30;

/// Bytes of an f16 copy of a model's layer matrices (what [`GpuModel::f16_copy_bytes`] gives
/// once uploaded).
pub fn f16_copy_bytes(c: &Config) -> u64 {
    let (d, q, kv, f) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim);
    (2 * c.n_layer * ((q + 2 * kv) * d + d * q + 3 * f * d)) as u64
}

/// Device memory to keep for the f16 weight copy of a batch of `slots` (the copy and its
/// headroom) when [`CudaBatch::serving`] would make one, else 0: what a context fit reserves.
pub fn f16_copy_reserve(c: &Config, slots: usize) -> u64 {
    if f16_copy_pays(slots, BatchKernels::from_env()) {
        f16_copy_bytes(c) + F16_HEADROOM
    } else {
        0
    }
}

/// Whether a batch of `slots` (kernels `k`) runs cuBLAS steps, whose per-step dequantization
/// an f16 copy of the weights saves ([`GpuModel::make_f16_copy`]); `MENS_CUDA_F16=0` says no.
fn f16_copy_pays(slots: usize, k: BatchKernels) -> bool {
    let blas = match k {
        BatchKernels::Auto => slots >= blas_from(true),
        BatchKernels::Cublas => true,
        BatchKernels::Dp4a | BatchKernels::TensorCores => false,
    };
    blas && std::env::var("MENS_CUDA_F16").as_deref() != Ok("0")
}

/// How a decode step multiplies by the weights.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Dp4a,
    Mma,
    Blas,
}

/// Smallest bucket [`BatchKernels::Auto`] runs on tensor cores.
const MMA_FROM: usize = 16;
/// Smallest bucket [`BatchKernels::Auto`] runs through cuBLAS (its dequantization costs a fixed
/// ~8 ms a 7B step, paid back only past 32 rows, where the tensor-core kernel takes two tiles).
const BLAS_FROM: usize = 33;
/// The same with an f16 copy of the weights (no dequantization: a step reads the copy once). On
/// the H200, synth 7B: 4 rows 720 tokens/s with the copy against 735 with dp4a, 8 rows 1416
/// against 1013, 16 rows 2805 against 1789 (tensor cores); docs/benchmarks.md.
const BLAS_FROM_COPY: usize = 5;

/// One part a slot, slot i reading `toks[i]` with its last logits (warm-up and profiles).
fn slot_parts(toks: &[Vec<u32>]) -> Vec<Part<'_>> {
    toks.iter()
        .enumerate()
        .map(|(slot, t)| Part {
            slot,
            tokens: t,
            logits: Logits::Last,
        })
        .collect()
}

/// `MENS_CUDA_PACK=0`: every prompt chunk in a pass of its own (the arithmetic of a request
/// alone; for measuring what packing gains).
fn packing_off() -> bool {
    std::env::var("MENS_CUDA_PACK").is_ok_and(|v| v == "0")
}

/// Smallest bucket run through cuBLAS: `MENS_CUDA_BLAS_FROM` (for measurements), else
/// [`BLAS_FROM_COPY`] with an f16 weight copy and [`BLAS_FROM`] without.
fn blas_from(copy: bool) -> usize {
    match std::env::var("MENS_CUDA_BLAS_FROM")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(n) => n,
        None if copy => BLAS_FROM_COPY,
        None => BLAS_FROM,
    }
}

/// `slots` sequences of `ctx` tokens each on one GPU.
pub struct CudaBatch {
    engine: CudaSession,
    model: Arc<GpuModel>,
    slots: usize,
    /// Rows a decode step holds (`step_rows`).
    rows: usize,
    /// A mixture-of-experts model's FFN scratch, for a step's rows.
    moe: Option<super::moe::MoeBufs>,
    ctx: usize,
    /// Rows of each layer of the prefill engine's cache (`ctx`, or more where a pass packs
    /// several slots' prompt chunks: [`engine_shape`]).
    ectx: usize,
    /// Prompt chunks of several slots share a pass (`MENS_CUDA_PACK=0` turns it off).
    pack: bool,
    ubatch: usize,
    step_tokens: usize,
    /// What the pool stores (K and V alike).
    kv: KvType,
    /// The pool: [page][layer][PAGE] rows of kv_row_bytes, K and V.
    kc: Buf,
    vc: Buf,
    /// Which pages each slot's cache is made of ([`PagePool`]), and its copy on the device:
    /// [slots][max_pages] i32 (rows of dirty slots are uploaded before the next step).
    pool: PagePool,
    table: Buf,
    max_pages: usize,
    dirty: Vec<bool>,
    /// The prefill engine's own contiguous cache: a slot's rows are gathered into it for a
    /// prompt pass and the new rows scattered back. `staged`: (slot, rows) it holds equal to
    /// the slot's first rows in the pool.
    stage_k: Buf,
    stage_v: Buf,
    staged: Option<(usize, usize)>,
    tokens: Vec<Vec<u32>>,
    /// Whether a slot's last step left logits (row `slot` of `logits`, its greedy id in `ids`).
    ready: Vec<bool>,
    x: Buf,
    aq: Buf,
    ad: Buf,
    hq: Buf,
    hd: Buf,
    /// A deferred norm's scale of each row (rmsnorm_q8s).
    ns: Buf,
    q: Buf,
    qkv: Buf,
    gu: Buf,
    /// f16 activations of the tensor-core path: [slots][max(dim, q_dim)] and [slots][ffn_dim].
    x16: Buf,
    h16: Buf,
    /// Which kernels a decode step uses (`MENS_CUDA_BATCH=dp4a` or `=mma` forces one family).
    kernels: BatchKernels,
    /// Smallest bucket [`BatchKernels::Auto`] runs through cuBLAS ([`blas_from`]).
    blas_from: usize,
    part_o: Buf,
    part_ml: Buf,
    counters: Buf,
    /// [slots + 1 + rows][vocab]: a row per slot, one for padding rows, then one per step row
    /// for verify rows (every position's logits).
    logits: Buf,
    am_partial: Buf,
    am_counter: Buf,
    /// The tensor-core matmul's partial sums ([`H16_PART_ROWS`] × slots f32), then its tickets
    /// (at byte `part_counters`).
    part: Buf,
    part_counters: usize,
    /// [slots + 1 + rows] greedy ids, as `logits`.
    ids: Buf,
    /// tok, pos, slot and logits row of each batch row: four arrays of `rows` i32.
    meta: Buf,
    rng: Buf,
    cand: Buf,
    /// The device sampler's outputs (bytes 0..12) and the padding row's index (at 12).
    scratch: Buf,
    /// A penalised request's (token, count) pairs ([ctx] pairs of i32), and their host staging.
    pen: Buf,
    pen_pairs: Vec<(u32, u32)>,
    pen_flat: Vec<i32>,
    /// One layer's moved K and V rows for `shift_kv` (an f16 pool only: [`shift_bytes`]).
    shift: Option<Buf>,
    /// Pinned host memory: meta (4 × rows), ids (slots + 1), one sampled id.
    host: *mut i32,
    graphs: Vec<(usize, sys::CUgraphExec)>,
    /// The slot the prefill engine ran last, when nothing has touched that slot since: its next
    /// single-token step resumes the engine's device state (no uploads).
    chain: Option<usize>,
    graph_kernels: usize,
    /// Ids were copied back by the last step and not yet waited for.
    pending: bool,
    host_logits: Vec<f32>,
    /// A verify part's logits rows, copied to the host.
    verify_logits: Vec<f32>,
}

// SAFETY: the pinned pointer is owned by the batch and used from one thread at a time (&mut).
unsafe impl Send for CudaBatch {}

impl CudaBatch {
    /// `slots` sequences of `ctx` tokens; prompts run `ubatch` tokens at a time, and a step takes
    /// at most `step_tokens` tokens (decode rows first: see [`crate::scheduler::plan`]).
    pub fn new(
        model: Arc<GpuModel>,
        slots: usize,
        ctx: usize,
        ubatch: usize,
        step_tokens: usize,
    ) -> Result<Self> {
        Self::with_cache(model, slots, ctx, ubatch, step_tokens, KvType::F16)
    }

    /// The server's batch: as [`CudaBatch::with_pool`], after making the model's f16 weight
    /// copy (when `copy_allowed`) where the batch runs cuBLAS steps and the copy fits beside it
    /// with [`F16_HEADROOM`] to spare. Also says what it did about the copy, for the memory plan.
    #[allow(clippy::too_many_arguments)]
    pub fn serving(
        model: Arc<GpuModel>,
        slots: usize,
        ctx: usize,
        ubatch: usize,
        step_tokens: usize,
        kv: KvType,
        pages: usize,
        copy_allowed: bool,
    ) -> Result<(Self, String)> {
        let mut copy = String::new();
        if copy_allowed && f16_copy_pays(slots, BatchKernels::from_env()) {
            let batch = batch_bytes(&model.config, slots, ctx, ubatch, kv, pages);
            copy = match model.make_f16_copy(batch + F16_HEADROOM)? {
                Some(b) => format!("f16 weight copy {} MiB", b >> 20),
                None => format!(
                    "no f16 weight copy ({} MiB would leave less than {} MiB free)",
                    model.f16_copy_bytes() >> 20,
                    F16_HEADROOM >> 20
                ),
            };
        }
        let mut b = Self::with_pool(model, slots, ctx, ubatch, step_tokens, kv, pages)?;
        b.warm_up()?;
        Ok((b, copy))
    }

    /// Run the steps a burst of requests starts with (prompts packed into one pass, a prompt
    /// alone, a decode step of them all) and forget them, so that the first requests do not pay
    /// for cuBLAS loading its kernels on first use (measured on the H200: 565 against 727 ms TTFT
    /// p99 for 64 requests at once on the 7B; docs/benchmarks.md, session 24). llama-server warms
    /// up at startup the same way.
    pub fn warm_up(&mut self) -> Result<()> {
        let len = 256.min(self.ctx.saturating_sub(1));
        let per = sequence_pages(len + 1);
        let n = self.slots.min(8).min(self.pool.pages() / per);
        if len < 2 || n == 0 {
            return Ok(());
        }
        let v = self.model.config.vocab_size;
        let prompts: Vec<Vec<u32>> = (0..n)
            .map(|i| (0..len).map(|j| ((i * 31 + j * 17) % v) as u32).collect())
            .collect();
        let forget = |b: &mut Self| {
            for i in 0..n {
                b.truncate_slot(i, 0);
                b.release(i);
            }
        };
        forget(self);
        let r = (|| {
            self.step(&mut slot_parts(&prompts))?;
            let next: Vec<Vec<u32>> = (0..n).map(|i| vec![i as u32 % v as u32]).collect();
            self.step(&mut slot_parts(&next))?;
            self.truncate_slot(0, 0);
            self.step(&mut slot_parts(&prompts[..1]))?;
            self.model.dev.sync()
        })();
        forget(self);
        self.pending = false;
        r
    }

    /// As [`CudaBatch::new`], with a cache that stores K and V as `kv` (see [`check_cache`]).
    pub fn with_cache(
        model: Arc<GpuModel>,
        slots: usize,
        ctx: usize,
        ubatch: usize,
        step_tokens: usize,
        kv: KvType,
    ) -> Result<Self> {
        let pages = full_pool(slots, ctx);
        Self::with_pool(model, slots, ctx, ubatch, step_tokens, kv, pages)
    }

    /// As [`CudaBatch::with_cache`] over a pool of `pages` pages of [`PAGE`] tokens, shared by
    /// the slots as they grow (fewer than [`full_pool`]: requests wait for pages, see
    /// [`Runner::admit`]).
    pub fn with_pool(
        model: Arc<GpuModel>,
        slots: usize,
        ctx: usize,
        ubatch: usize,
        step_tokens: usize,
        kv: KvType,
        pages: usize,
    ) -> Result<Self> {
        let c = model.config.clone();
        check_cache(&c, (kv, kv))?;
        if slots == 0 || slots > 1024 || ctx == 0 || ctx > i32::MAX as usize / 2 {
            return Err(Error::InvalidArgument(
                "a CUDA batch needs 1 to 1024 slots and a context > 0".into(),
            ));
        }
        let max_pages = ctx.div_ceil(PAGE);
        if pages < sequence_pages(ctx) || pages > i32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "a KV pool of {pages} pages cannot hold one sequence of {ctx} tokens ({} pages)",
                sequence_pages(ctx)
            )));
        }
        let (ectx, ubatch) = engine_shape(slots, ctx, ubatch);
        let need = batch_bytes(&c, slots, ctx, ubatch, kv, pages);
        let dev = model.dev.clone();
        // The batch kernels' module now, not inside a graph capture (its first load compiles).
        dev.fb()?;
        let (free, _) = dev.mem_info()?;
        if need + (256 << 20) > free {
            return Err(Error::Memory(format!(
                "{slots} CUDA sequences of {ctx} tokens need {} MiB (KV pool and buffers) but {} has {} MiB free",
                need >> 20,
                dev.name,
                free >> 20
            )));
        }
        let engine = CudaSession::engine(model.clone(), ectx, ubatch, kv)?;
        let (d, q, f, v) = (c.dim, c.q_dim(), c.ffn_dim, c.vocab_size);
        let wide = d.max(q);
        let splits = ctx.div_ceil(SPLIT);
        let s = step_rows(slots);
        let zeros = |n: usize| -> Result<Buf> {
            let b = dev.alloc(n)?;
            unsafe { drv::memset_d8_async(b.ptr, 0, n.max(16), dev.stream) }
                .map_err(|e| err("memset", e))?;
            Ok(b)
        };
        let pool = pages * page_bytes(&c, kv);
        let stage = super::session::cache_bytes(&c, ectx, kv) / 2;
        let host_len = 4 * s + slots + 2;
        let host = unsafe { drv::malloc_host(4 * host_len, 0) }
            .map_err(|e| err("pinned memory", e))? as *mut i32;
        let mut b = CudaBatch {
            kv,
            kc: zeros(pool)?,
            vc: zeros(pool)?,
            pool: PagePool::new(pages, PAGE, slots)?,
            table: zeros(4 * slots * max_pages)?,
            max_pages,
            dirty: vec![false; slots],
            stage_k: zeros(stage)?,
            stage_v: zeros(stage)?,
            staged: None,
            x: zeros(4 * s * d)?,
            aq: zeros(s * wide)?,
            ad: zeros(8 * s * wide / 32)?,
            hq: zeros(s * f)?,
            moe: super::moe::MoeBufs::new(&dev, &c, s)?,
            hd: zeros(8 * s * f / 32)?,
            ns: zeros(4 * s)?,
            q: zeros(4 * s * q)?,
            qkv: zeros(4 * s * (q + 2 * c.kv_dim()))?,
            gu: zeros(8 * s * f)?,
            x16: zeros(2 * s * wide)?,
            h16: zeros(2 * s * f)?,
            kernels: BatchKernels::from_env(),
            blas_from: blas_from(model.has_f16_copy()),
            part_o: zeros(4 * s * splits * q)?,
            part_ml: zeros(8 * s * splits * c.n_head)?,
            counters: zeros(4 * s * c.n_head)?,
            logits: zeros(4 * (slots + 1 + s) * v)?,
            am_partial: zeros(8 * s * ARGMAX_BLOCKS)?,
            am_counter: zeros(4 * s)?,
            part: zeros(4 * s * H16_PART_ROWS + 4 * H16_PART_ROWS / H16_ROWS)?,
            part_counters: 4 * s * H16_PART_ROWS,
            ids: zeros(4 * (slots + 1 + s))?,
            meta: zeros(16 * s)?,
            rng: zeros(8 * slots)?,
            cand: zeros(8 * TOPK_BLOCKS * TOPK_MAX)?,
            scratch: zeros(16)?,
            pen: zeros(8 * ctx)?,
            pen_pairs: Vec::new(),
            pen_flat: Vec::new(),
            shift: match kv {
                KvType::F16 => Some(zeros(shift_bytes(&c, ctx, kv))?),
                _ => None,
            },
            host,
            graphs: Vec::new(),
            chain: None,
            graph_kernels: 0,
            pending: false,
            host_logits: vec![0f32; v],
            verify_logits: Vec::new(),
            tokens: (0..slots).map(|_| Vec::with_capacity(ctx)).collect(),
            ready: vec![false; slots],
            engine,
            model,
            slots,
            rows: s,
            ctx,
            ectx,
            pack: !packing_off(),
            ubatch,
            step_tokens: step_tokens.max(slots),
        };
        // The padding row's index, where a penalised slot's logits are sampled (argmax_b's orow).
        dev.write(&b.scratch, 12, &[slots as i32])?;
        for bp in buckets(s) {
            b.capture(bp)?;
        }
        // MENS_CUDA_PROFILE=1: where a step's time goes; =both: each kernel family at each size.
        if let Ok(p) = std::env::var("MENS_CUDA_PROFILE") {
            let chosen = b.kernels;
            let families = if p == "both" {
                vec![
                    BatchKernels::Dp4a,
                    BatchKernels::TensorCores,
                    BatchKernels::Cublas,
                ]
            } else {
                vec![chosen]
            };
            for k in families {
                b.kernels = k;
                for bp in buckets(slots) {
                    b.print_profile(bp, (ctx / 2).min(512))?;
                }
            }
            b.kernels = chosen;
            // And a step of prompts alone: one 256-token prompt, then eight packed together.
            for n in [1usize, 8] {
                if n <= slots && 256 <= ctx {
                    b.print_prompt_profile(n, 256)?;
                }
            }
        }
        Ok(b)
    }

    /// Time each kernel of a step that prefills `n` prompts of `len` tokens (slots 0..n, which
    /// must be idle; emptied after), printed to stderr. Host work between launches (uploads, page
    /// tables) counts toward the launch after it.
    fn print_prompt_profile(&mut self, n: usize, len: usize) -> Result<()> {
        let v = self.model.config.vocab_size;
        let prompts: Vec<Vec<u32>> = (0..n)
            .map(|i| {
                (0..len)
                    .map(|j| ((i * 7919 + j * 104_729) % v) as u32)
                    .collect()
            })
            .collect();
        let dev = self.model.dev.clone();
        let totals = dev.time_kernels(3, || {
            for i in 0..n {
                self.truncate_slot(i, 0);
            }
            self.step(&mut slot_parts(&prompts))?;
            Ok(0)
        });
        for i in 0..n {
            self.truncate_slot(i, 0);
        }
        let totals = totals?;
        let all: f64 = totals.iter().map(|t| t.us).sum::<f64>();
        eprintln!(
            "mens: profile, {n} prompts of {len} tokens in one step (packed: {}): {:.0} µs ({:.0} tokens/s)",
            self.pack,
            all,
            (n * len) as f64 * 1e6 / all
        );
        for t in totals {
            eprintln!(
                "mens:   {:<40} {:>4} calls {:>9.1} µs {:>5.1}%",
                t.name,
                t.calls,
                t.us,
                100.0 * t.us / all
            );
        }
        Ok(())
    }

    /// Time each kernel of a decode step over `bp` rows at position `at` (kernels launched one by
    /// one, outside the graph), printed to stderr: where a step's time goes at each batch size.
    /// Writes cache rows at `at` of the first `bp` slots (startup only: nothing is cached yet).
    fn print_profile(&mut self, bp: usize, at: usize) -> Result<()> {
        self.chain = None;
        let dev = self.model.dev.clone();
        let s = self.rows;
        let h = self.host();
        for i in 0..s {
            h[i] = 0;
            h[s + i] = if i < bp { at as i32 } else { -1 };
            h[2 * s + i] = i as i32;
            h[3 * s + i] = i as i32;
        }
        let meta = unsafe { std::slice::from_raw_parts(self.host, 4 * s) }.to_vec();
        dev.write(&self.meta, 0, &meta)?;
        let totals = dev.time_kernels(5, || self.decode_kernels(bp))?;
        let all: f64 = totals.iter().map(|t| t.us).sum::<f64>();
        eprintln!(
            "mens: profile, {:?} kernels, batch of {bp} at position {at}: {:.0} µs per step ({:.0} tokens/s)",
            self.kernels,
            all,
            bp as f64 * 1e6 / all
        );
        for t in totals {
            eprintln!(
                "mens:   {:<40} {:>4} calls {:>9.1} µs",
                t.name, t.calls, t.us
            );
        }
        Ok(())
    }

    /// Bytes of one cache row (one position of one layer, K or V).
    fn row_bytes(&self) -> usize {
        kv_row_bytes(self.kv, self.model.config.kv_dim())
    }

    /// Bytes between two layers' rows in a page of the pool.
    fn layer_stride(&self) -> u64 {
        (PAGE * self.row_bytes()) as u64
    }

    /// Bytes between two pages of the pool.
    fn page_stride(&self) -> u64 {
        page_bytes(&self.model.config, self.kv) as u64
    }

    /// Bytes between two layers' rows in the engine's contiguous cache.
    fn stage_layer(&self) -> u64 {
        (self.ectx * self.row_bytes()) as u64
    }

    /// Before slot `slot` writes rows `from..to`: pages for them, its own copy of any shared page
    /// they fall in (copied on the stream), the caches of idle slots the pool took forgotten.
    fn make_room(&mut self, slot: usize, from: usize, to: usize) -> Result<()> {
        let had = self.pool.table(slot).len();
        let prep = self.pool.prepare(slot, from, to)?;
        let pb = self.page_stride();
        for &(src, dst) in &prep.copies {
            let dev = &self.model.dev;
            dev.copy(
                self.kc.ptr + dst as u64 * pb,
                self.kc.ptr + src as u64 * pb,
                pb as usize,
            )?;
            dev.copy(
                self.vc.ptr + dst as u64 * pb,
                self.vc.ptr + src as u64 * pb,
                pb as usize,
            )?;
        }
        for &v in &prep.evicted {
            self.tokens[v].clear();
            self.ready[v] = false;
            if self.staged.is_some_and(|s| s.0 == v) {
                self.staged = None;
            }
            if self.chain == Some(v) {
                self.chain = None;
            }
        }
        // The table changes by growing or by a page copied in place of a shared one.
        if self.pool.table(slot).len() != had || !prep.copies.is_empty() {
            self.dirty[slot] = true;
        }
        Ok(())
    }

    /// Upload the page tables that changed (waits for the stream: the steps before read them).
    fn upload_tables(&mut self) -> Result<()> {
        for s in 0..self.slots {
            if std::mem::take(&mut self.dirty[s]) {
                let t = self.pool.table(s);
                if !t.is_empty() {
                    self.model
                        .dev
                        .write(&self.table, 4 * s * self.max_pages, t)?;
                }
            }
        }
        Ok(())
    }

    /// Rows `from..from + n` of every layer of a slot between its pages and the engine's cache.
    fn move_rows(&self, slot: usize, from: usize, n: usize, to_pool: bool) -> Result<()> {
        self.move_rows_at(slot, 0, from, n, to_pool)
    }

    /// As [`CudaBatch::move_rows`], the slot's row 0 at row `at` of the engine's cache.
    fn move_rows_at(
        &self,
        slot: usize,
        at: usize,
        from: usize,
        n: usize,
        to_pool: bool,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let dev = &self.model.dev;
        let pt = self.table.at(4 * slot * self.max_pages);
        launch!(dev, (dev.fb()?.kv_pages_copy) as "kv_pages_copy", (n as u32, self.model.config.n_layer as u32), 128;
            self.kc.ptr, self.vc.ptr, self.stage_k.ptr, self.stage_v.ptr, pt, self.page_stride(),
            self.row_bytes() as i32, self.ectx as i32, at as i32, from as i32, to_pool as i32)
    }

    /// Make the engine's cache hold the slot's rows (gathering those it lacks).
    fn stage(&mut self, slot: usize) -> Result<()> {
        self.stage_rows(slot, self.tokens[slot].len())
    }

    /// Make the engine's cache hold the slot's first `rows` rows (within its pages).
    fn stage_rows(&mut self, slot: usize, rows: usize) -> Result<()> {
        let have = match self.staged {
            Some((s, n)) if s == slot => n,
            _ => 0,
        };
        if rows > have {
            self.move_rows(slot, have, rows - have, false)?;
        }
        self.staged = Some((slot, rows.max(have)));
        Ok(())
    }

    /// Attention blocks per (row, KV head): enough blocks in all to fill the GPU twice over.
    fn workers(&self, rows: usize) -> usize {
        let c = &self.model.config;
        let want = (2 * self.model.dev.sms).div_ceil(c.n_kv_head * rows);
        want.clamp(1, self.ctx.div_ceil(SPLIT))
    }

    /// The kernel family of a step over `bp` rows. Auto: tensor cores from MMA_FROM rows
    /// (cuBLAS from blas_from) when that many slots decode together; a batch of fewer slots
    /// keeps dp4a for its verify rows (a row's bits as alone: the same greedy tokens as plain
    /// decoding).
    fn family(&self, bp: usize) -> Family {
        let bf = self.blas_from;
        match self.kernels {
            // An expert FFN runs its own kernels on q8 rows.
            _ if self.moe.is_some() => Family::Dp4a,
            BatchKernels::Auto if bp >= bf && self.slots >= bf => Family::Blas,
            BatchKernels::Auto if bp >= MMA_FROM && self.slots >= MMA_FROM => Family::Mma,
            BatchKernels::Auto | BatchKernels::Dp4a => Family::Dp4a,
            BatchKernels::TensorCores => Family::Mma,
            BatchKernels::Cublas => Family::Blas,
        }
    }

    /// Every kernel of a decode step over `bp` rows (what a bucket's graph holds). The dp4a
    /// family's kernels after the embedding (batch.cu's and the norms, each waiting for the one
    /// before it at `pdl_wait()`) use programmatic dependent launch, as the single-sequence
    /// step's do (`Device::decode_graph`); the tensor-core, cuBLAS and expert kernels do not.
    fn decode_kernels(&self, bp: usize) -> Result<usize> {
        let m = &self.model;
        let fam = self.family(bp);
        launch!(m.dev, embed, (bp as u32, 1), 128; m.embedding.seg, m.config.dim as i32, self.meta.ptr, self.x.ptr)?;
        if fam == Family::Dp4a && self.moe.is_none() {
            m.dev.decode_graph(|| self.decode_layers(bp, fam))
        } else {
            self.decode_layers(bp, fam)
        }
    }

    /// A decode step over `bp` rows after the embedding: the layers, the head and argmax.
    fn decode_layers(&self, bp: usize, fam: Family) -> Result<usize> {
        let m = &self.model;
        let dev = &m.dev;
        let c = &m.config;
        let (d, q, kv, f) = (c.dim as i32, c.q_dim(), c.kv_dim(), c.ffn_dim);
        let row = q + 2 * kv;
        let eps = c.rms_eps;
        let neox = (c.rope_style == RopeStyle::Neox) as i32;
        let s = self.rows;
        let (part, counters) = (self.part.ptr, self.part.ptr + self.part_counters as u64);
        let mma = fam != Family::Dp4a; // f16 activations

        // dp4a tiles: 8 activation rows for the gate/up and LM-head matrices (many weight rows),
        // 4 for Q/K/V, the attention output and ffn_down, which measured faster in two tiles
        // of 4 at 8 and 16 rows (H200, synth 7B: ffn_down 1559 µs against 2144 at 8 rows, while
        // gate/up took 2195 against 2676; docs/benchmarks.md, session 21).
        let narrow = bp.min(4);
        // meta: tokens (read by the embedding), then these.
        let (pos, slot, orow) = (
            self.meta.at(4 * s),
            self.meta.at(8 * s),
            self.meta.at(12 * s),
        );
        let splits = self.ctx.div_ceil(SPLIT) as i32;
        let workers = self.workers(bp) as u32;
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        let (pages, maxp, pb) = (self.table.ptr, self.max_pages as i32, self.page_stride());
        let layer = self.layer_stride();
        let quantized = self.kv != KvType::F16;
        let (cos, sin) = self.engine.rope();
        let b = bp as i32;
        let v = c.vocab_size;
        let head = m.head();
        let hgs = attn_head_groups(c.n_head, c.n_kv_head, self.kv, bp);
        let att = |li: usize, kc: u64, vc: u64, o16: u64| -> Result<()> {
            let grid = ((c.n_kv_head * bp * hgs) as u32, workers);
            let args = (
                self.q.ptr,
                kc,
                vc,
                pos,
                slot,
                pages,
                maxp,
                pb,
                c.n_head as i32,
                c.n_kv_head as i32,
                scale,
                splits,
                self.part_o.ptr,
                self.part_ml.ptr,
                self.counters.ptr,
                self.aq.ptr,
                self.ad.ptr,
                o16,
            );
            let _ = li;
            launch!(dev, [dev.attn_decode_b(c.head_dim, self.kv)?], grid, 256;
                args.0, args.1, args.2, args.3, args.4, args.5, args.6, args.7, args.8,
                args.9, args.10, args.11, args.12, args.13, args.14, args.15, args.16, args.17,
                self.qkv.ptr, hgs as i32)
        };
        // Deferred norms (norms_deferred): each row's q8 of x · w and its scale for Q/K/V and
        // gate/up, the decode step's bits; the head's norm as before.
        let defer = !mma && norms_deferred(m);
        let ns = if defer { self.ns.ptr } else { 0 };
        // The next matmuls' input: a deferred norm's (`deferred`), else the norm itself.
        let norm = |w: u64, deferred: bool| -> Result<()> {
            if deferred {
                launch!(dev, rmsnorm_q8s, (bp as u32, 1), 1024;
                    self.x.ptr, w, eps, d, self.aq.ptr, self.ad.ptr, self.ns.ptr)
            } else if mma {
                launch!(dev, add_rmsnorm_f16, (bp as u32, 1), 256;
                    self.x.ptr, 0u64, w, eps, d, self.x16.ptr)
            } else {
                launch!(dev, rmsnorm_q8, norm_grid(bp, c.dim), 1024;
                    self.x.ptr, w, eps, d, self.aq.ptr, self.ad.ptr)
            }
        };
        norm(m.layers[0].attn_norm.ptr, defer)?;
        let mut n = 2;
        for (li, l) in m.layers.iter().enumerate() {
            let (kc, vc) = (
                self.kc.ptr + li as u64 * layer,
                self.vc.ptr + li as u64 * layer,
            );
            // A quantized pool: the writers leave K and V in qkv, the attention kernel stores them.
            let (wk, wv) = if quantized { (0, 0) } else { (kc, vc) };
            let bias = l.bias.as_ref().map_or(0, |b| b.ptr);
            let rest = m
                .layers
                .get(li + 1)
                .map_or(&m.output_norm, |n| &n.attn_norm);
            if mma {
                if fam == Family::Blas && l.qk_norm.is_some() && bias != 0 {
                    // rope_store_b adds the bias after the norm: no model has both.
                    return Err(Error::Backend(
                        "the cuBLAS decode step cannot apply both Q/K/V bias and a Q/K norm".into(),
                    ));
                }
                // The f16 families' matmul over up to three stacked matrices (`add`: onto what
                // `out` holds; cuBLAS leaves the bias to rope_store_b): the kernels it queued.
                let mm = |name: &'static str,
                          mats: &[&Mat],
                          x: u64,
                          out: u64,
                          ldo: usize,
                          add: bool,
                          bias: u64|
                 -> Result<usize> {
                    if fam == Family::Blas {
                        self.engine.linear(mats, x, bp, out, ldo, add, false)?;
                        return Ok(mats.len() + 1);
                    }
                    let seg = |i: usize| mats.get(i).map_or(Seg::NONE, |m| m.seg);
                    let rows = mats.iter().map(|m| m.seg.rows as usize).sum();
                    launch!(dev, [(name, dev.matmul_h16(bp)?)], dev.h16_grid(rows, mats[0].cols), 256;
                        seg(0), seg(1), seg(2), mats[0].cols as i32, x, b, out, ldo as i32, 0u64,
                        bias, add as i32, part, counters)?;
                    Ok(1)
                };
                let (mm_bias, rope_bias) = if fam == Family::Blas {
                    (0, bias)
                } else {
                    (bias, 0)
                };
                let x16 = self.x16.ptr;
                n += mm(
                    "matmul_h16 (qkv)",
                    &[&l.q, &l.k, &l.v],
                    x16,
                    self.qkv.ptr,
                    row,
                    false,
                    mm_bias,
                )?;
                if let Some((wq, wkn)) = &l.qk_norm {
                    launch!(dev, qk_norm, (bp as u32, (c.n_head + c.n_kv_head) as u32), 128;
                        self.qkv.ptr, row as i32, c.n_head as i32, c.head_dim as i32, wq.ptr, wkn.ptr, eps)?;
                    n += 1;
                }
                launch!(dev, (dev.fb()?.rope_store_b) as "rope_store_b", (bp as u32, 1), 256;
                    self.qkv.ptr, rope_bias, cos, sin, pos, slot, pages, maxp, pb, c.n_head as i32,
                    c.n_kv_head as i32, c.head_dim as i32, neox, self.q.ptr, wk, wv)?;
                att(li, kc, vc, x16)?;
                let dd = d as usize;
                n += mm(
                    "matmul_h16 (attn_output + residual)",
                    &[&l.o],
                    x16,
                    self.x.ptr,
                    dd,
                    true,
                    0,
                )?;
                norm(l.ffn_norm.ptr, false)?;
                n += mm(
                    "matmul_h16 (gate, up)",
                    &[&l.gate, &l.up],
                    x16,
                    self.gu.ptr,
                    2 * f,
                    false,
                    0,
                )?;
                launch!(dev, swiglu_f16, ((bp * f).div_ceil(256) as u32, 1), 256;
                    self.gu.ptr, f as i32, b, self.h16.ptr)?;
                n += mm(
                    "matmul_h16 (ffn_down + residual)",
                    &[&l.down],
                    self.h16.ptr,
                    self.x.ptr,
                    dd,
                    true,
                    0,
                )?;
                norm(rest.ptr, false)?;
                // rope_store_b, attention, two norms, SwiGLU.
                n += 5;
            } else {
                if let Some((wq, wkn)) = &l.qk_norm {
                    // Qwen3: matmul, per-head norm, then RoPE and the cache write (see the session).
                    let (k, grid, block) =
                        dev.matmul_q8(narrow, bp, &[&l.q.seg, &l.k.seg, &l.v.seg])?;
                    launch!(dev, (k) as "matmul_q8 (qkv)", grid, block;
                        l.q.seg, l.k.seg, l.v.seg, d, self.aq.ptr, self.ad.ptr, b, self.qkv.ptr,
                        row as i32, 0u64, bias, 0i32)?;
                    launch!(dev, qk_norm, (bp as u32, (c.n_head + c.n_kv_head) as u32), 128;
                        self.qkv.ptr, row as i32, c.n_head as i32, c.head_dim as i32, wq.ptr, wkn.ptr, eps)?;
                    launch!(dev, (dev.fb()?.rope_store_b) as "rope_store_b", (bp as u32, 1), 256;
                        self.qkv.ptr, 0u64, cos, sin, pos, slot, pages, maxp, pb, c.n_head as i32,
                        c.n_kv_head as i32, c.head_dim as i32, neox, self.q.ptr, wk, wv)?;
                    n += 2;
                } else {
                    launch!(dev, (dev.qkv_rope_b(narrow)?) as "qkv_rope_b", ((row / 2).div_ceil(4) as u32, 1), 128;
                        l.q.seg, l.k.seg, l.v.seg, d, self.aq.ptr, self.ad.ptr, b, bias, cos, sin, pos,
                        slot, pages, maxp, pb, c.n_head as i32, c.n_kv_head as i32, c.head_dim as i32, neox,
                        self.q.ptr, wk, wv, self.qkv.ptr, ns)?;
                }
                att(li, kc, vc, 0)?;
                let (k, grid, block) = dev.matmul_q8(narrow, bp, &[&l.o.seg])?;
                launch!(dev, (k) as "matmul_q8 (attn_output + residual)", grid, block;
                    l.o.seg, Seg::NONE, Seg::NONE, q as i32, self.aq.ptr, self.ad.ptr, b, self.x.ptr, d,
                    0u64, 0u64, MODE_ADD)?;
                if let Some(moe) = &self.moe {
                    // Experts (norms never deferred): the norm, routing and the routes' FFNs,
                    // added to the residual.
                    n += moe.run(dev, c, l, bp, self.x.ptr, self.x.ptr, true)?;
                    norm(rest.ptr, false)?;
                    n += 4;
                    continue;
                }
                norm(l.ffn_norm.ptr, defer)?;
                launch!(dev, (dev.glu_q8_b(bp, &l.gate.seg, &l.up.seg)?) as "glu_q8_b", ((f / 32) as u32, 1), 256;
                    l.gate.seg, l.up.seg, d, self.aq.ptr, self.ad.ptr, b, self.hq.ptr, self.hd.ptr, ns)?;
                // Added to the residual, in the decode step's split order where it has one.
                let split = !defer && dev.split_rows(&l.down.seg, f);
                let (k, grid, block) = if split {
                    dev.matmul_q8_split(narrow, &l.down.seg)?
                } else {
                    dev.matmul_q8(narrow, bp, &[&l.down.seg])?
                };
                launch!(dev, (k) as "matmul_q8 (ffn_down + residual)", grid, block;
                    l.down.seg, Seg::NONE, Seg::NONE, f as i32, self.hq.ptr, self.hd.ptr, b, self.x.ptr, d,
                    0u64, 0u64, MODE_ADD | if split { MODE_SPLIT } else { 0 })?;
                // The output norm (before the head) is never deferred.
                norm(rest.ptr, defer && li + 1 < m.layers.len())?;
                n += 7;
            }
        }
        if mma {
            launch!(dev, (dev.matmul_h16(bp)?) as "matmul_h16 (LM head)", dev.h16_grid(v, c.dim), 256;
                head.seg, Seg::NONE, Seg::NONE, d, self.x16.ptr, b, self.logits.ptr, v as i32, orow,
                0u64, 0i32, part, counters)?;
        } else {
            let (k, grid, block) = dev.matmul_q8(bp, bp, &[&head.seg])?;
            launch!(dev, (k) as "matmul_q8 (LM head)", grid, block;
                head.seg, Seg::NONE, Seg::NONE, d, self.aq.ptr, self.ad.ptr, b, self.logits.ptr,
                v as i32, orow, 0u64, 0i32)?;
        }
        launch!(dev, (dev.fb()?.argmax_b) as "argmax_b", (ARGMAX_BLOCKS as u32, bp as u32), 1024;
            self.logits.ptr, v as i32, orow, self.am_partial.ptr, self.am_counter.ptr, self.ids.ptr)?;
        Ok(n + 2)
    }

    fn capture(&mut self, bp: usize) -> Result<()> {
        let dev = self.model.dev.clone();
        dev.bind()?;
        dev.sync()?;
        unsafe {
            drv::stream::begin_capture(
                dev.stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(|e| err("graph capture", e))?;
        let r = self.decode_kernels(bp);
        let g = unsafe { drv::stream::end_capture(dev.stream) };
        let n = r?;
        let g = g.map_err(|e| err("graph capture", e))?;
        let exec = unsafe { drv::graph::instantiate(g, sys::CUgraphInstantiate_flags(0)) }
            .map_err(|e| err("graph instantiate", e))?;
        unsafe {
            let _ = drv::graph::destroy(g);
        }
        self.graphs.push((bp, exec));
        self.graph_kernels = n;
        Ok(())
    }

    fn host(&mut self) -> &mut [i32] {
        // SAFETY: allocated with 4 × rows + slots + 2 i32 in new().
        unsafe { std::slice::from_raw_parts_mut(self.host, 4 * self.rows + self.slots + 2) }
    }

    /// One decode step over `rows` (slot, token, logits row), each row at its slot's next
    /// position (a slot's rows in order: its verify rows): the bucket's graph, padding rows
    /// marked pos -1.
    fn decode(&mut self, rows: &[(usize, u32, usize)]) -> Result<()> {
        self.chain = None;
        let dev = self.model.dev.clone();
        let &(bp, exec) = self
            .graphs
            .iter()
            .find(|g| g.0 >= rows.len())
            .expect("a bucket holds every batch");
        // The pinned meta may still be in flight from the last step.
        dev.sync()?;
        let (s, pad) = (self.rows, self.slots as i32);
        let mut next: Vec<usize> = self.tokens.iter().map(|t| t.len()).collect();
        let lens: Vec<i32> = rows
            .iter()
            .map(|&(slot, _, _)| {
                next[slot] += 1;
                next[slot] as i32 - 1
            })
            .collect();
        let h = self.host();
        for i in 0..bp {
            let (tok, pos, slot, orow) = match rows.get(i) {
                Some(&(slot, t, orow)) => (t as i32, lens[i], slot as i32, orow as i32),
                None => (0, -1, 0, pad),
            };
            h[i] = tok;
            h[s + i] = pos;
            h[2 * s + i] = slot;
            h[3 * s + i] = orow;
        }
        unsafe {
            drv::memcpy_htod_async(
                self.meta.ptr,
                std::slice::from_raw_parts(self.host, 4 * s),
                dev.stream,
            )
            .map_err(|e| err("copy to device", e))?;
            drv::graph::launch(exec, dev.stream).map_err(|e| err("graph launch", e))?;
        }
        for &(slot, t, _) in rows {
            self.tokens[slot].push(t);
        }
        Ok(())
    }

    /// A part that is not a single decode token: through the prefill engine, on its own cache
    /// holding the slot's rows (gathered from the pages), the new rows scattered back after.
    fn run_engine(&mut self, slot: usize, tokens: &[u32], logits: Logits) -> Result<()> {
        let want = matches!(logits, Logits::Last);
        self.stage(slot)?;
        let len = self.tokens[slot].len();
        let (kc, vc) = (self.stage_k.ptr, self.stage_v.ptr);
        let resume = self.chain == Some(slot);
        self.engine
            .use_cache(kc, vc, &mut self.tokens[slot], resume);
        let r = self.engine.forward(tokens, logits);
        self.engine.release_cache(&mut self.tokens[slot]);
        self.chain = r.is_ok().then_some(slot);
        if r.is_err() {
            self.staged = None;
        }
        r?;
        let n = self.tokens[slot].len() - len;
        self.move_rows(slot, len, n, true)?;
        self.staged = Some((slot, len + n));
        if want {
            let dev = &self.model.dev;
            let v = self.model.config.vocab_size;
            let (l, id) = self.engine.last_logits();
            dev.copy(self.logits.at(4 * slot * v), l, 4 * v)?;
            dev.copy(self.ids.at(4 * slot), id, 4)?;
            self.ready[slot] = true;
        }
        Ok(())
    }

    /// The parts that go through the prefill engine: prompt chunks packed into passes of up to
    /// `ubatch` tokens whose rows fit the engine's cache; a part alone in its pass, a single
    /// token (the decode arithmetic) or one that wants every position's logits by itself.
    fn run_prompts(&mut self, parts: &mut [Part], idx: &[usize]) -> Result<()> {
        let mut group: Vec<usize> = Vec::new();
        let (mut rows, mut toks) = (0, 0);
        for &i in idx {
            let p = &parts[i];
            let (len, t) = (self.tokens[p.slot].len(), p.tokens.len());
            let packable = t >= 2
                && t <= self.ubatch
                && matches!(p.logits, Logits::Last | Logits::None)
                && self.pack;
            if !packable {
                let logits = std::mem::replace(&mut parts[i].logits, Logits::None);
                self.run_engine(parts[i].slot, parts[i].tokens, logits)?;
                continue;
            }
            if rows + len + t > self.ectx || toks + t > self.ubatch {
                self.run_group(parts, &group)?;
                group.clear();
                (rows, toks) = (0, 0);
            }
            group.push(i);
            rows += len + t;
            toks += t;
        }
        self.run_group(parts, &group)
    }

    /// One pass over the prompt chunks of `group` (indices into `parts`): a lone part through
    /// [`CudaBatch::run_engine`], several packed ([`CudaSession::prefill_packed`]) with each
    /// slot's rows gathered into the engine's cache one after another and its new rows scattered
    /// back after.
    fn run_group(&mut self, parts: &mut [Part], group: &[usize]) -> Result<()> {
        match group {
            [] => return Ok(()),
            &[i] => {
                let logits = std::mem::replace(&mut parts[i].logits, Logits::None);
                return self.run_engine(parts[i].slot, parts[i].tokens, logits);
            }
            _ => {}
        }
        self.chain = None;
        self.staged = None;
        let mut seqs = Vec::with_capacity(group.len());
        let mut off = 0;
        for &i in group {
            let p = &parts[i];
            let len = self.tokens[p.slot].len();
            self.move_rows_at(p.slot, off, 0, len, false)?;
            let want = matches!(p.logits, Logits::Last);
            seqs.push(Packed {
                off,
                pos0: len,
                tokens: p.tokens,
                logits_row: want.then_some(p.slot),
            });
            off += len + p.tokens.len();
        }
        let (kc, vc) = (self.stage_k.ptr, self.stage_v.ptr);
        self.engine
            .prefill_packed(kc, vc, &seqs, (self.logits.ptr, self.ids.ptr))?;
        for (s, &i) in seqs.iter().zip(group) {
            let slot = parts[i].slot;
            self.move_rows_at(slot, s.off, s.pos0, s.tokens.len(), true)?;
            self.tokens[slot].extend_from_slice(s.tokens);
            self.ready[slot] = s.logits_row.is_some();
            parts[i].logits = Logits::None;
        }
        Ok(())
    }

    /// Pick a slot's next token on the device (top-k and the rest) from logits row `row` (the
    /// slot's, or a penalised copy): one 4-byte read-back.
    fn sample_device(&mut self, slot: usize, row: usize, d: DeviceSampling) -> Result<u32> {
        let DeviceSampling::TopK {
            k,
            temp,
            top_p,
            min_p,
            seed,
        } = d
        else {
            unreachable!("top-k sampling")
        };
        let dev = self.model.dev.clone();
        let v = self.model.config.vocab_size;
        let slice = v.div_ceil(TOPK_BLOCKS) as i32;
        let k = k as i32;
        let row = self.logits.at(4 * row * v);
        let sc = &self.scratch;
        launch!(dev, topk_partial, (TOPK_BLOCKS as u32, 1), 256;
            row, v as i32, k, slice, self.cand.ptr)?;
        launch!(dev, sample_final, (1, 1), 256;
            self.cand.ptr, (TOPK_BLOCKS as i32) * k, k, temp, top_p, min_p, seed,
            self.rng.at(8 * slot), sc.ptr, sc.at(4), sc.at(8), 0i32)?;
        let at = 4 * self.rows + self.slots + 1;
        unsafe {
            drv::memcpy_dtoh_async(
                std::slice::from_raw_parts_mut(self.host.add(at), 1),
                sc.at(4),
                dev.stream,
            )
        }
        .map_err(|e| err("copy from device", e))?;
        dev.sync()?;
        self.pending = false;
        Ok(self.host()[at] as u32)
    }

    /// A request whose only host-side need is repetition penalties: the slot's logits copied to
    /// the padding row, penalised there (`penalize`, the host sampler's arithmetic), then greedy
    /// or top-k on the device as for any request. Only the penalty window's (token, count) pairs
    /// go up and one id comes back, instead of the whole row going to the host.
    fn sample_penalised(&mut self, slot: usize, sampler: &mut Sampler) -> Result<u32> {
        let dev = self.model.dev.clone();
        let v = self.model.config.vocab_size;
        let pad = self.slots;
        sampler.penalty_counts(&self.tokens[slot], &mut self.pen_pairs);
        let n = self.pen_pairs.len().min(self.ctx);
        self.pen_flat.clear();
        for &(id, count) in &self.pen_pairs[..n] {
            self.pen_flat.extend([id as i32, count as i32]);
        }
        // Synchronous: the last step (and its id copy) is done after this.
        if n > 0 {
            dev.write(&self.pen, 0, &self.pen_flat)?;
            self.pending = false;
        }
        dev.copy(
            self.logits.at(4 * pad * v),
            self.logits.at(4 * slot * v),
            4 * v,
        )?;
        let c = &sampler.config;
        if n > 0 {
            launch!(dev, penalize, (n.div_ceil(256) as u32, 1), 256;
                self.logits.at(4 * pad * v), v as i32, self.pen.ptr, n as i32, c.repeat_penalty,
                c.frequency_penalty, c.presence_penalty)?;
        }
        match DeviceSampling::of_unpenalised(sampler) {
            d @ DeviceSampling::TopK { .. } => self.sample_device(slot, pad, d),
            _ => {
                launch!(dev, (dev.fb()?.argmax_b) as "argmax_b", (ARGMAX_BLOCKS as u32, 1), 1024;
                    self.logits.ptr, v as i32, self.scratch.at(12), self.am_partial.ptr,
                    self.am_counter.ptr, self.ids.ptr)?;
                let mut id = [0i32];
                dev.read(&self.ids, 4 * pad, &mut id)?;
                Ok(id[0] as u32)
            }
        }
    }
}

impl CudaBatch {
    /// Switch the decode kernels (the graphs are captured again).
    pub fn set_kernels(&mut self, k: BatchKernels) -> Result<()> {
        self.chain = None;
        if k == self.kernels {
            return Ok(());
        }
        self.model.dev.bind()?;
        self.model.dev.sync()?;
        for (_, g) in self.graphs.drain(..) {
            unsafe {
                let _ = drv::graph::exec_destroy(g);
            }
        }
        self.kernels = k;
        for bp in buckets(self.rows) {
            self.capture(bp)?;
        }
        Ok(())
    }

    /// Whether prompt chunks of several slots share a pass (on unless `MENS_CUDA_PACK=0`).
    pub fn set_packing(&mut self, on: bool) {
        self.pack = on;
    }

    /// A slot's last logits (what its next token is sampled from), copied to the host.
    pub fn slot_logits(&mut self, slot: usize) -> Result<Vec<f32>> {
        if slot >= self.slots || !self.ready[slot] {
            return Err(Error::InvalidArgument(format!("slot {slot} has no logits")));
        }
        let v = self.model.config.vocab_size;
        let mut l = vec![0f32; v];
        self.model.dev.read(&self.logits, 4 * slot * v, &mut l)?;
        Ok(l)
    }
}

impl Drop for CudaBatch {
    fn drop(&mut self) {
        let _ = self.model.dev.bind();
        let _ = self.model.dev.sync();
        unsafe {
            for (_, g) in self.graphs.drain(..) {
                let _ = drv::graph::exec_destroy(g);
            }
            let _ = drv::free_host(self.host as *mut c_void);
        }
    }
}

impl Runner for CudaBatch {
    fn slots(&self) -> usize {
        self.slots
    }
    fn ctx(&self) -> usize {
        self.ctx
    }
    fn max_step_tokens(&self) -> usize {
        self.step_tokens
    }
    fn slot_tokens(&self, slot: usize) -> &[u32] {
        &self.tokens[slot]
    }
    fn truncate_slot(&mut self, slot: usize, n: usize) {
        self.chain = None;
        self.tokens[slot].truncate(n);
        self.pool.truncate(slot, self.tokens[slot].len());
        if let Some((s, rows)) = self.staged {
            if s == slot {
                self.staged = Some((s, rows.min(n)));
            }
        }
        self.ready[slot] = false;
        // A new request on the slot: its device sampler's draws count from 0 again.
        let _ = self.model.dev.write(&self.rng, 8 * slot, &[0u64]);
    }
    /// Cache reuse across edits on an f16 pool (a quantized pool would need its blocks
    /// requantized: there only the common prefix is reused).
    fn can_shift_kv(&self) -> bool {
        self.kv == KvType::F16
    }
    fn shift_kv(&mut self, slot: usize, src: usize, dst: usize, len: usize) -> Result<()> {
        if slot >= self.slots || src.max(dst) + len > self.ctx {
            return Err(Error::Context(format!(
                "a cache shift of {len} rows from {src} to {dst} exceeds the context of {}",
                self.ctx
            )));
        }
        // The rows moved must be in the slot's pages (its tokens, or rows past them that a
        // truncation kept in its last page).
        let held = self.pool.table(slot).len() * PAGE;
        if src + len > held {
            return Err(Error::InvalidArgument(format!(
                "a cache shift of rows {src}..{} reads past the {held} rows slot {slot} holds",
                src + len
            )));
        }
        if !self.can_shift_kv() {
            return Err(Error::InvalidArgument(
                "a quantized CUDA cache cannot shift its rows".into(),
            ));
        }
        if len == 0 || src == dst {
            return Ok(());
        }
        self.chain = None;
        self.model.dev.bind()?;
        // On the engine's cache (the slot's rows gathered), then the moved rows back to the pages.
        self.make_room(slot, dst, dst + len)?;
        self.upload_tables()?;
        self.stage_rows(slot, self.tokens[slot].len().max(src + len))?;
        let c = &self.model.config;
        let dev = self.model.dev.clone();
        let kvd = c.kv_dim();
        let (rb, layer) = (self.row_bytes(), self.stage_layer());
        let scratch = self.shift.as_ref().expect("an f16 pool has the shift rows");
        let (sk, sv) = (scratch.ptr, scratch.at(self.ctx * rb));
        let (kc, vc) = (self.stage_k.ptr, self.stage_v.ptr);
        let (cos, sin) = self.engine.rope();
        let neox = (c.rope_style == RopeStyle::Neox) as i32;
        let n = len * rb;
        let at = |base: u64, li: usize, pos: usize| base + li as u64 * layer + (pos * rb) as u64;
        for li in 0..c.n_layer {
            // Through the scratch rows, so that overlapping ranges move whole.
            dev.copy(sk, at(kc, li, src), n)?;
            dev.copy(sv, at(vc, li, src), n)?;
            dev.copy(at(vc, li, dst), sv, n)?;
            launch!(dev, shift_k, (len as u32, 1), 256;
                sk, at(kc, li, dst), kvd as i32, c.head_dim as i32, neox, cos, sin,
                dst as i32 - src as i32)?;
        }
        self.move_rows(slot, dst, len, true)
    }
    fn assume_tokens(&mut self, slot: usize, tokens: &[u32]) -> Result<()> {
        if slot >= self.slots {
            return Err(Error::InvalidArgument(format!("no slot {slot}")));
        }
        check_tokens(
            self.tokens[slot].len(),
            self.ctx,
            tokens,
            self.model.config.vocab_size,
        )?;
        self.chain = None;
        self.ready[slot] = false;
        self.tokens[slot].extend_from_slice(tokens);
        Ok(())
    }
    fn can_copy_prefix(&self) -> bool {
        true
    }
    fn copy_prefix(&mut self, src: usize, dst: usize, n: usize) -> Result<()> {
        if src >= self.slots || dst >= self.slots || src == dst || n > self.tokens[src].len() {
            return Err(Error::InvalidArgument(format!(
                "cannot copy {n} tokens from slot {src} to slot {dst}"
            )));
        }
        self.chain = None;
        self.ready[dst] = false;
        // The pages are shared, not copied: a write into a shared page copies it first
        // (`make_room`).
        if self.staged.is_some_and(|s| s.0 == dst) {
            self.staged = None;
        }
        self.dirty[dst] = true;
        if let Err(e) = self.pool.share(src, dst, n) {
            // Refused (no page to spare): the slot is left empty.
            self.pool.truncate(dst, 0);
            self.tokens[dst].clear();
            return Err(e);
        }
        let mut to = std::mem::take(&mut self.tokens[dst]);
        to.clear();
        to.extend_from_slice(&self.tokens[src][..n]);
        self.tokens[dst] = to;
        Ok(())
    }
    fn hidden_states(&self) -> bool {
        true
    }
    fn step(&mut self, parts: &mut [Part]) -> Result<()> {
        let vocab = self.model.config.vocab_size;
        let mut seen = vec![false; self.slots];
        for p in parts.iter() {
            if p.slot >= self.slots || std::mem::replace(&mut seen[p.slot], true) {
                return Err(Error::InvalidArgument(format!(
                    "a step takes at most one part per slot, for slots below {}",
                    self.slots
                )));
            }
            check_tokens(self.tokens[p.slot].len(), self.ctx, p.tokens, vocab)?;
        }
        self.model.dev.bind()?;
        let lens: Vec<usize> = parts.iter().map(|p| self.tokens[p.slot].len()).collect();
        for (p, &len) in parts.iter().zip(&lens) {
            self.make_room(p.slot, len, len + p.tokens.len())?;
        }
        // Pages come from idle slots only: a slot of this step losing its cache means the batch
        // was driven past its pool without admission.
        if parts
            .iter()
            .zip(&lens)
            .any(|(p, &l)| self.tokens[p.slot].len() != l)
        {
            return Err(Error::Memory(
                "the KV pool ran out of pages for this step".into(),
            ));
        }
        self.upload_tables()?;
        let mut rows = Vec::with_capacity(parts.len());
        // Verify parts (every position's logits, a few tokens) go into the decode graph as rows
        // of their slot, each with a logits row of its own, when the pool is f16 (a quantized
        // pool's rows are stored by the attention kernel of their own row, too late for the
        // slot's later rows) and the step has room; the rest through the prefill engine.
        let mut verify = Vec::new();
        let mut prompts = Vec::new();
        for (i, p) in parts.iter_mut().enumerate() {
            self.ready[p.slot] = false;
            if p.tokens.len() == 1 && !p.logits.every() {
                rows.push((p.slot, p.tokens[0], p.slot));
                continue;
            }
            // (Hidden states go through the prefill engine, alone: `run_prompts`.)
            if p.logits.every()
                && !p.logits.hidden()
                && self.kv == KvType::F16
                && p.tokens.len() <= VERIFY_ROWS
                && rows.len() + p.tokens.len() <= self.rows
            {
                let first = rows.len();
                for &t in p.tokens {
                    rows.push((p.slot, t, self.slots + 1 + rows.len()));
                }
                verify.push((i, first));
                continue;
            }
            prompts.push(i);
        }
        self.run_prompts(parts, &prompts)?;
        if let ([(slot, t, _)], BatchKernels::Auto, true) =
            (&rows[..], self.kernels, verify.is_empty())
        {
            let (slot, t) = (*slot, *t);
            // One decode row alone: the single-sequence graph (matrix-vector kernels) is faster
            // than a batch of one.
            self.run_engine(slot, &[t], Logits::Last)?;
        } else if !rows.is_empty() {
            self.decode(&rows)?;
            for p in parts.iter() {
                if p.tokens.len() == 1 && matches!(p.logits, Logits::Last) {
                    self.ready[p.slot] = true;
                }
            }
        }
        let v = self.model.config.vocab_size;
        for (i, first) in verify {
            let p = &mut parts[i];
            let n = p.tokens.len();
            let row = self.slots + 1 + first;
            match &mut p.logits {
                Logits::All { from, f } => {
                    // One copy of the part's rows (the read waits for the step).
                    self.verify_logits.resize(n * v, 0.0);
                    self.model
                        .dev
                        .read(&self.logits, 4 * row * v, &mut self.verify_logits)?;
                    for j in (*from).min(n)..n {
                        f(j, &self.verify_logits[j * v..(j + 1) * v]);
                    }
                }
                Logits::Argmax { from, f } => {
                    // The step's argmax_b already picked each row's token: n ids, not n rows.
                    let mut ids = [0i32; VERIFY_ROWS];
                    self.model.dev.read(&self.ids, 4 * row, &mut ids[..n])?;
                    for (j, &t) in ids[..n].iter().enumerate().skip(*from) {
                        f(j, t as u32);
                    }
                }
                Logits::None | Logits::Last | Logits::Hidden { .. } => {}
            }
        }
        let dev = &self.model.dev;
        let (r, s) = (self.rows, self.slots);
        unsafe {
            drv::memcpy_dtoh_async(
                std::slice::from_raw_parts_mut(self.host.add(4 * r), s + 1),
                self.ids.ptr,
                dev.stream,
            )
        }
        .map_err(|e| err("copy from device", e))?;
        self.pending = true;
        Ok(())
    }
    fn sample_slot(&mut self, slot: usize, sampler: &mut Sampler) -> Result<u32> {
        if slot >= self.slots || !self.ready[slot] {
            return Err(Error::InvalidArgument(format!(
                "slot {slot} has no logits to sample (run a step with its last logits first)"
            )));
        }
        match DeviceSampling::of(sampler) {
            DeviceSampling::Greedy => {
                if self.pending {
                    self.model.dev.sync()?;
                    self.pending = false;
                }
                let r = self.rows;
                let t = self.host()[4 * r + slot] as u32;
                if self.chain == Some(slot) {
                    // The engine's argmax, which its pass also left as its next input.
                    self.engine.device_token_is(t);
                }
                Ok(t)
            }
            d @ DeviceSampling::TopK { .. } => self.sample_device(slot, slot, d),
            DeviceSampling::Host if DeviceSampling::penalties_only(sampler) => {
                self.sample_penalised(slot, sampler)
            }
            DeviceSampling::Host => {
                let v = self.model.config.vocab_size;
                self.model
                    .dev
                    .read(&self.logits, 4 * slot * v, &mut self.host_logits)?;
                self.pending = false;
                sampler.sample(&mut self.host_logits, &self.tokens[slot])
            }
        }
    }
    fn admit(&mut self, slot: usize, tokens: usize) -> bool {
        self.pool.admit(slot, tokens)
    }
    fn release(&mut self, slot: usize) {
        self.pool.release(slot);
    }
    fn pages(&self) -> Option<(usize, usize)> {
        Some((self.pool.used(), self.pool.pages()))
    }
    fn memory(&self) -> Memory {
        let kv = self.kc.bytes + self.vc.bytes;
        let all = batch_bytes(
            &self.model.config,
            self.slots,
            self.ctx,
            self.ubatch,
            self.kv,
            self.pool.pages(),
        ) as usize;
        Memory {
            kv_cache: kv,
            buffers: all.saturating_sub(kv),
        }
    }
    fn launches_per_token(&self) -> Option<(usize, usize)> {
        Some((1, self.graph_kernels))
    }
    fn sibling(&self, ctx: usize) -> Result<Box<dyn Runner>> {
        Ok(Box::new(CudaSession::with_cache(
            self.model.clone(),
            ctx,
            self.ubatch,
            self.kv,
        )?))
    }
    fn batch_sibling(&self, slots: usize, ctx: usize, step: usize) -> Result<Box<dyn Runner>> {
        Ok(Box::new(CudaBatch::with_cache(
            self.model.clone(),
            slots,
            ctx,
            self.ubatch,
            step,
            self.kv,
        )?))
    }
}
