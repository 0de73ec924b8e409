//! One sequence on the GPU: its KV cache, every buffer, the decode graph, sampling on the device,
//! and the [`Runner`](crate::runner::Runner) implementation.

use super::*;

/// How a session samples on the device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DeviceSampling {
    Greedy,
    TopK {
        k: usize,
        temp: f32,
        top_p: f32,
        min_p: f32,
        seed: u64,
    },
    /// Penalties or a top-k above TOPK_MAX: the logits go to the host sampler.
    Host,
}

impl DeviceSampling {
    pub fn of(s: &Sampler) -> Self {
        if s.needs_logits() {
            DeviceSampling::Host
        } else {
            Self::of_unpenalised(s)
        }
    }

    /// Whether the host is needed for the penalties alone (no grammar, no log-probabilities,
    /// and a top-k the device can draw): a batch applies them on the device.
    pub fn penalties_only(s: &Sampler) -> bool {
        s.config.penalised()
            && !s.config.biased()
            && !s.forcing()
            && s.constraint.is_none()
            && s.logprobs.is_none()
            && (s.is_greedy() || s.config.top_k <= TOPK_MAX)
    }

    /// How the device samples once any penalties are applied.
    pub fn of_unpenalised(s: &Sampler) -> Self {
        let c = &s.config;
        if s.is_greedy() {
            DeviceSampling::Greedy
        } else if c.top_k > TOPK_MAX {
            DeviceSampling::Host
        } else {
            DeviceSampling::TopK {
                // top-k 0 (off) keeps the 64 most likely tokens.
                k: if c.top_k == 0 { TOPK_MAX } else { c.top_k },
                temp: c.temperature,
                top_p: c.top_p,
                min_p: c.min_p,
                seed: c.seed,
            }
        }
    }
}

/// One sequence on the GPU: KV cache, every buffer, the decode graph.
pub struct CudaSession {
    pub model: Arc<GpuModel>,
    ctx: usize,
    ubatch: usize,
    tokens: Vec<u32>,
    /// What the cache stores (K and V alike).
    kv: KvType,
    kc: Buf,
    vc: Buf,
    /// A quantized cache's rows as f16 for prefill's cuBLAS attention ([ctx][kv_dim] each).
    k16: Buf,
    v16: Buf,
    /// The cache this session runs on when it is a batch's prefill engine (a slot of the batch's
    /// pool) instead of its own `kc`/`vc`.
    kv_ext: Option<(u64, u64)>,
    cos: Buf,
    sin: Buf,
    // decode
    x: Buf,
    qkv: Buf,
    aq: Buf,
    ad: Buf,
    hq: Buf,
    /// A mixture-of-experts model's FFN scratch, for a prompt pass's rows.
    moe: Option<super::moe::MoeBufs>,
    hd: Buf,
    /// A deferred norm's input: q8 of x · w, and each group's sum of squares of x.
    nq: Buf,
    nd: Buf,
    np: Buf,
    part_o: Buf,
    part_ml: Buf,
    logits: Buf,
    partial: Buf,
    counter: Buf,
    tok: Buf,
    out: Buf,
    pos: Buf,
    rng_ctr: Buf,
    cand: Buf,
    // prefill
    xb16: Buf,
    w16: Buf,
    tmp: Buf,
    gu: Buf,
    h16: Buf,
    qperm: Buf,
    scores: Buf,
    probs: Buf,
    o: Buf,
    toks: Buf,
    /// A packed pass's positions ([`CudaSession::prefill_packed`]): each sequence's first, then
    /// each token's (position, cache row).
    pos_many: Buf,
    /// Pinned host memory: the greedy id of a step, in slot 0 or 1 (its decode graph's).
    pinned: *mut i32,
    /// The decode graphs: graph i copies its greedy id to pinned slot i (slot 1: steps run ahead).
    graphs: [Option<sys::CUgraphExec>; 2],
    /// Recorded after each step that reports to slot i, when steps may run ahead.
    done: [sys::CUevent; 2],
    /// Greedy steps run ahead ([`crate::runner::Runner::pipeline_greedy`]).
    ahead_on: bool,
    /// A step launched ahead of its `forward`: (its pinned slot, its input token).
    ahead: Option<(usize, u32)>,
    /// The pinned slot of the last step whose token the host is owed.
    last_slot: usize,
    /// Whether the last step to report to slot i recorded `done[i]` after it.
    evented: [bool; 2],
    /// Steps launched ahead so far (claimed or not).
    pub steps_ahead: usize,
    /// The token id the device holds as the next step's input (sampled there).
    dev_tok: Option<u32>,
    /// Whether the device's pos equals tokens.len() (false after truncate/reset).
    pos_synced: bool,
    host_logits: Vec<f32>,
    logits_valid: bool,
    /// Kernels in the decode graph.
    pub graph_kernels: usize,
}

/// Values of the largest group of layer matrices dequantized at once in prefill.
fn max_group_values(c: &Config) -> usize {
    let qkv = (c.q_dim() + 2 * c.kv_dim()) * c.dim;
    qkv.max(c.dim * c.q_dim())
        .max(2 * c.ffn_dim * c.dim)
        .max(c.dim * c.ffn_dim)
}

/// Bytes of a `ctx`-token KV cache of type `kv` (K and V, every layer).
pub(super) fn cache_bytes(c: &Config, ctx: usize, kv: KvType) -> usize {
    2 * c.n_layer * ctx * kv_row_bytes(kv, c.kv_dim())
}

/// Bytes of each of K and V of one layer as f16, which prefill's cuBLAS attention reads when the
/// cache is quantized (none for an f16 cache).
fn f16_copy_bytes(c: &Config, ctx: usize, kv: KvType) -> usize {
    if kv == KvType::F16 {
        0
    } else {
        ctx * c.kv_dim() * 2
    }
}

/// Bytes a CUDA session of `ctx` tokens, prefill batch `ubatch` and cache type `kv` allocates on
/// the device.
pub fn session_bytes(c: &Config, ctx: usize, ubatch: usize, kv: KvType) -> u64 {
    let max_group = max_group_values(c);
    let (d, q, kvd, f, v) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim, c.vocab_size);
    let row = q + 2 * kvd;
    let splits = ctx.div_ceil(SPLIT);
    let b = ubatch;
    let kvc = cache_bytes(c, ctx, kv);
    let f16_rows = 2 * f16_copy_bytes(c, ctx, kv);
    let rope = 2 * ctx * c.head_dim / 2 * 4;
    let dec = 4 * (b * d + b * row)
        + HEAD_ROWS * d.max(q) * 2
        + f * 2
        + d * 2
        + 4 * NP_REPS * NP_MAX
        + splits * c.n_head * (c.head_dim + 2) * 4
        + v * 4;
    let pre = 2 * b * d.max(q)
        + 2 * max_group
        + 4 * b * d
        + 4 * b * 2 * f
        + 2 * b * f
        + 2 * b * q
        + c.n_head * att_queries(c, ctx, b) * ctx * 6
        + 4 * b * q
        + 20 * b;
    let moe = super::moe::moe_bytes(c, b);
    (kvc + f16_rows + rope + dec + pre + moe + TOPK_BLOCKS * TOPK_MAX * 8 + 4096) as u64
}

/// Rows the LM head of a packed prompt pass takes at once (the batched kernel's widest tile).
const HEAD_ROWS: usize = 8;

/// One sequence of a packed prompt pass ([`CudaSession::prefill_packed`]).
pub(super) struct Packed<'a> {
    /// Its row 0 in every layer of the pass's cache.
    pub off: usize,
    /// Rows it already holds (the position of its first new token).
    pub pos0: usize,
    pub tokens: &'a [u32],
    /// The row of the pass's logits (and greedy ids) that gets its last token's, if wanted.
    pub logits_row: Option<usize>,
}

impl CudaSession {
    /// A session of `ctx` tokens with an f16 cache; prompts are processed `ubatch` tokens at a time.
    pub fn new(model: Arc<GpuModel>, ctx: usize, ubatch: usize) -> Result<Self> {
        Self::make(model, ctx, ubatch, true, KvType::F16)
    }

    /// A session whose cache stores K and V as `kv` (see [`check_cache`]).
    pub fn with_cache(model: Arc<GpuModel>, ctx: usize, ubatch: usize, kv: KvType) -> Result<Self> {
        check_cache(&model.config, (kv, kv))?;
        Self::make(model, ctx, ubatch, true, kv)
    }

    /// A session without a cache of its own, for a batch to run prompts with: it runs on the cache
    /// given by [`CudaSession::use_cache`].
    pub(super) fn engine(
        model: Arc<GpuModel>,
        ctx: usize,
        ubatch: usize,
        kv: KvType,
    ) -> Result<Self> {
        Self::make(model, ctx, ubatch, false, kv)
    }

    fn make(
        model: Arc<GpuModel>,
        ctx: usize,
        ubatch: usize,
        own_kv: bool,
        kvt: KvType,
    ) -> Result<Self> {
        let c = model.config.clone();
        if ctx == 0 || ubatch == 0 || ctx > i32::MAX as usize / 2 {
            return Err(Error::InvalidArgument(
                "context and batch must be > 0".into(),
            ));
        }
        let ubatch = ubatch.min(ctx);
        let max_group = max_group_values(&c);
        let kv_bytes = cache_bytes(&c, ctx, kvt) / 2;
        let need =
            session_bytes(&c, ctx, ubatch, kvt) - if own_kv { 0 } else { 2 * kv_bytes as u64 };
        let dev = model.dev.clone();
        let (free, _) = dev.mem_info()?;
        if need + (256 << 20) > free {
            return Err(Error::Memory(format!(
                "a CUDA session of {ctx} tokens needs {} MiB (KV cache and buffers) but {} has {} MiB free",
                need >> 20,
                dev.name,
                free >> 20
            )));
        }
        let (d, q, kv, f, v) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim, c.vocab_size);
        let row = q + 2 * kv;
        let splits = ctx.div_ceil(SPLIT);
        let b = ubatch;
        let rope = RopeTable::scaled(
            ctx,
            c.head_dim,
            c.rope_base,
            model.rope_freqs.as_deref(),
            c.rope_scale,
        );
        let a = |n: usize| dev.alloc(n);
        let kv_len = if own_kv { kv_bytes } else { 16 };
        let kc = a(kv_len)?;
        let vc = a(kv_len)?;
        let pinned =
            unsafe { drv::malloc_host(16, 0) }.map_err(|e| err("pinned memory", e))? as *mut i32;
        let event = || {
            drv::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(|e| err("event", e))
        };
        let done = [event()?, event()?];
        let s = CudaSession {
            cos: dev.upload(&rope.cos)?,
            sin: dev.upload(&rope.sin)?,
            x: a(4 * b * d)?,
            qkv: a(4 * b * row)?,
            aq: a(HEAD_ROWS * d.max(q))?,
            ad: a(HEAD_ROWS * 8 * d.max(q) / 32)?,
            hq: a(f)?,
            moe: super::moe::MoeBufs::new(&dev, &c, b)?,
            hd: a(8 * f / 32)?,
            nq: a(d)?,
            nd: a(8 * d / 32)?,
            np: a(4 * NP_REPS * NP_MAX)?,
            part_o: a(4 * splits * c.n_head * c.head_dim)?,
            part_ml: a(8 * splits * c.n_head)?,
            logits: a(4 * v)?,
            partial: a(8 * ARGMAX_BLOCKS)?,
            // argmax's ticket, then the attention's (a KV head's head groups: up to n_head).
            counter: dev.upload(&vec![0u32; 1 + c.n_head.max(64)])?,
            tok: a(4)?,
            out: a(4)?,
            pos: a(4)?,
            rng_ctr: dev.upload(&[0u64])?,
            cand: a(8 * TOPK_BLOCKS * TOPK_MAX)?,
            xb16: a(2 * b * d.max(q))?,
            w16: a(2 * max_group)?,
            tmp: a(4 * b * d)?,
            gu: a(4 * b * 2 * f)?,
            h16: a(2 * b * f)?,
            qperm: a(2 * b * q)?,
            scores: a(4 * c.n_head * att_queries(&c, ctx, b) * ctx)?,
            probs: a(2 * c.n_head * att_queries(&c, ctx, b) * ctx)?,
            o: a(4 * b * q)?,
            toks: a(4 * b)?,
            pos_many: a(16 * b)?,
            k16: a(f16_copy_bytes(&c, ctx, kvt))?,
            v16: a(f16_copy_bytes(&c, ctx, kvt))?,
            kv: kvt,
            kc,
            vc,
            kv_ext: if own_kv { None } else { Some((0, 0)) },
            pinned,
            graphs: [None, None],
            done,
            ahead_on: false,
            ahead: None,
            last_slot: 0,
            evented: [false; 2],
            steps_ahead: 0,
            dev_tok: None,
            pos_synced: false,
            host_logits: vec![0f32; v],
            logits_valid: false,
            graph_kernels: 0,
            tokens: Vec::with_capacity(ctx),
            ctx,
            ubatch,
            model,
        };
        let mut s = s;
        // Record the decode graph now, so the first token does not pay for it.
        if own_kv {
            s.capture(0)?;
        }
        Ok(s)
    }

    /// Run on the cache at (`kc`, `vc`) with `tokens` in it (a batch's slot: the batch swaps its
    /// token list in and out). The decode graph holds cache addresses: a new cache drops it.
    /// `resume`: nothing has touched this cache, its tokens or this session's device position
    /// since the last [`CudaSession::release_cache`] on it, so the position on the device is still
    /// valid (no upload of it, which costs a synchronous copy each step).
    pub(super) fn use_cache(&mut self, kc: u64, vc: u64, tokens: &mut Vec<u32>, resume: bool) {
        let _ = self.settle();
        let same = self.point_at(kc, vc);
        std::mem::swap(&mut self.tokens, tokens);
        self.logits_valid = false;
        if !(resume && same) {
            self.pos_synced = false;
            self.dev_tok = None;
        }
    }

    /// Run on the cache at (`kc`, `vc`); whether it was already this session's. The decode graph
    /// holds cache addresses, so a new cache drops it.
    fn point_at(&mut self, kc: u64, vc: u64) -> bool {
        if self.kv_ext == Some((kc, vc)) {
            return true;
        }
        self.kv_ext = Some((kc, vc));
        for g in self.graphs.iter_mut().filter_map(Option::take) {
            unsafe {
                let _ = drv::graph::exec_destroy(g);
            }
        }
        false
    }

    /// Give the token list back after [`CudaSession::use_cache`] (the device position is kept
    /// for a `resume`).
    pub(super) fn release_cache(&mut self, tokens: &mut Vec<u32>) {
        std::mem::swap(&mut self.tokens, tokens);
        self.logits_valid = false;
    }

    /// `t` is the greedy id the last forward pass left on the device (read back by the batch):
    /// the next decode of `t` needs no upload of it.
    pub(super) fn device_token_is(&mut self, t: u32) {
        self.dev_tok = Some(t);
    }

    /// Device addresses of the RoPE cos and sin tables.
    pub(super) fn rope(&self) -> (u64, u64) {
        (self.cos.ptr, self.sin.ptr)
    }

    /// Device addresses of the last position's logits and of its greedy choice.
    pub(super) fn last_logits(&self) -> (u64, u64) {
        (self.logits.ptr, self.out.ptr)
    }

    pub fn ctx(&self) -> usize {
        self.ctx
    }
    pub fn pos(&self) -> usize {
        self.tokens.len()
    }
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
    pub fn reset(&mut self) {
        self.truncate(0);
    }
    pub fn truncate(&mut self, n: usize) {
        let _ = self.settle();
        self.tokens.truncate(n);
        self.logits_valid = false;
        self.pos_synced = false;
        self.dev_tok = None;
    }
    pub fn kv_cache_bytes(&self) -> usize {
        if self.kv_ext.is_some() {
            return 0;
        }
        self.kc.bytes + self.vc.bytes
    }

    fn layer_cache(&self, li: usize) -> (u64, u64) {
        let c = &self.model.config;
        let per = (self.ctx * kv_row_bytes(self.kv, c.kv_dim())) as u64;
        let (k, v) = self.kv_ext.unwrap_or((self.kc.ptr, self.vc.ptr));
        (k + li as u64 * per, v + li as u64 * per)
    }

    fn check(&self, tokens: &[u32]) -> Result<()> {
        crate::runner::check_tokens(self.pos(), self.ctx, tokens, self.model.config.vocab_size)
    }

    /// Run `tokens` after the cached ones. `Logits::Last` leaves the last token's logits on the
    /// device (and its greedy choice); `Logits::All` hands each position's logits to the callback,
    /// `Logits::Argmax` each position's pick (positions before `from` are prefilled in batches,
    /// the rest decoded one by one).
    pub fn forward(&mut self, tokens: &[u32], mut logits: Logits) -> Result<()> {
        self.check(tokens)?;
        self.model.dev.bind()?;
        if let Some((slot, t)) = self.ahead {
            if tokens == [t] && matches!(logits, Logits::Last | Logits::None) {
                // The step this forward asks for is already running: it is now the last one.
                self.ahead = None;
                self.last_slot = slot;
                self.tokens.push(t);
                self.logits_valid = false;
                return Ok(());
            }
        }
        self.settle()?;
        if logits.hidden() {
            return self.prefill_hidden(tokens, logits);
        }
        let Some(from) = logits.start() else {
            // The head runs anyway (a prefill chunk without logits costs one more matvec).
            return if tokens.len() == 1 {
                self.decode(tokens[0])
            } else {
                self.prefill(tokens)
            };
        };
        let from = from.min(tokens.len());
        if from > 0 {
            self.prefill(&tokens[..from])?;
        }
        for (i, &t) in tokens.iter().enumerate().skip(from) {
            self.decode(t)?;
            logits.give(i, self.logits()?);
        }
        Ok(())
    }

    /// The last position's logits, copied to the host.
    pub fn logits(&mut self) -> Result<&[f32]> {
        self.no_step_ahead()?;
        if !self.logits_valid {
            let dev = &self.model.dev;
            dev.read(&self.logits, 0, &mut self.host_logits)?;
            self.logits_valid = true;
        }
        Ok(&self.host_logits)
    }

    /// Pick the next token: on the device when the sampler allows it (one 4-byte read-back),
    /// otherwise on the host from copied logits.
    pub fn sample(&mut self, sampler: &mut Sampler) -> Result<u32> {
        match DeviceSampling::of(sampler) {
            DeviceSampling::Greedy => {
                // The decode graph / prefill already ran argmax and copied the id.
                if self.ahead.is_some() {
                    // Sampled twice: the step run ahead goes; this step's id is still in its slot.
                    self.settle()?;
                } else if self.can_run_ahead() {
                    // The next step (on the device's own pick) starts before this one's id is
                    // read back: the GPU goes from one step to the next without waiting.
                    let slot = self.last_slot ^ 1;
                    self.launch_step(slot)?;
                    self.ahead = Some((slot, 0));
                    self.steps_ahead += 1;
                }
                let last = self.last_slot;
                if self.ahead.is_some() {
                    unsafe { drv::event::synchronize(self.done[last]) }
                        .map_err(|e| err("kernel execution", e))?;
                } else {
                    self.model.dev.sync()?;
                }
                let t = unsafe { *self.pinned.add(last) } as u32;
                match &mut self.ahead {
                    Some((_, input)) => *input = t,
                    None => self.dev_tok = Some(t),
                }
                Ok(t)
            }
            DeviceSampling::TopK {
                k,
                temp,
                top_p,
                min_p,
                seed,
            } => {
                self.no_step_ahead()?;
                let t = self.sample_device(k, temp, top_p, min_p, seed)?;
                self.dev_tok = Some(t);
                Ok(t)
            }
            DeviceSampling::Host => {
                self.logits()?;
                let t = sampler.sample(&mut self.host_logits, &self.tokens)?;
                self.logits_valid = false; // penalties changed the copy
                Ok(t)
            }
        }
    }

    fn sample_device(
        &mut self,
        k: usize,
        temp: f32,
        top_p: f32,
        min_p: f32,
        seed: u64,
    ) -> Result<u32> {
        let dev = self.model.dev.clone();
        let v = self.model.config.vocab_size as i32;
        let slice = (v as usize).div_ceil(TOPK_BLOCKS) as i32;
        let k = k as i32;
        launch!(dev, topk_partial, (TOPK_BLOCKS as u32, 1), 256;
            self.logits.ptr, v, k, slice, self.cand.ptr)?;
        launch!(dev, sample_final, (1, 1), 256;
            self.cand.ptr, (TOPK_BLOCKS as i32) * k, k, temp, top_p, min_p, seed,
            self.rng_ctr.ptr, self.tok.ptr, self.out.ptr, self.pos.ptr, 0i32)?;
        unsafe {
            drv::memcpy_dtoh_async(
                std::slice::from_raw_parts_mut(self.pinned, 1),
                self.out.ptr,
                dev.stream,
            )
        }
        .map_err(|e| err("copy from device", e))?;
        dev.sync()?;
        Ok(unsafe { *self.pinned } as u32)
    }

    /// The LM head on the q8 activations in `aq`, then argmax (advancing pos by `advance`) and the
    /// copy of the chosen id to pinned host memory.
    fn head(&self, advance: i32, slot: usize) -> Result<()> {
        let m = &self.model;
        let dev = &m.dev;
        let c = &m.config;
        let h = m.head().seg;
        let rows = c.vocab_size;
        dev.moves(h.bytes() + q8_bytes(c.dim) + 4 * rows as u64);
        let half_k = dev.pair_half(&h).filter(|_| half().head);
        if let Some((_, k)) = half_k {
            launch!(dev, (k) as "matvec (LM head)", (rows.div_ceil(16) as u32, 1), 128;
                h, c.dim as i32, self.aq.ptr, self.ad.ptr, self.logits.ptr)?;
        } else if head_pair() {
            launch!(dev, (dev.matvec_pair_k(&h)) as "matvec (LM head)", (rows.div_ceil(8) as u32, 1), 128;
                h, c.dim as i32, self.aq.ptr, self.ad.ptr, self.logits.ptr)?;
        } else {
            launch!(dev, (dev.matvec_k(&[&h])) as "matvec (LM head)", (rows.div_ceil(4) as u32, 1), 128;
                h, Seg::NONE, Seg::NONE, c.dim as i32, self.aq.ptr, self.ad.ptr, self.logits.ptr, 0u64, 0i32)?;
        }
        dev.moves(4 * rows as u64);
        launch!(dev, argmax, (ARGMAX_BLOCKS as u32, 1), 1024;
            self.logits.ptr, rows as i32, self.partial.ptr, self.counter.ptr, self.tok.ptr,
            self.out.ptr, self.pos.ptr, advance)?;
        unsafe {
            drv::memcpy_dtoh_async(
                std::slice::from_raw_parts_mut(self.pinned.add(slot), 1),
                self.out.ptr,
                dev.stream,
            )
        }
        .map_err(|e| err("copy from device", e))
    }

    /// Every kernel of one decode step (what the graph holds).
    fn decode_kernels(&self, slot: usize) -> Result<usize> {
        let m = &self.model;
        let dev = &m.dev;
        let c = &m.config;
        let (d, f) = (c.dim as i32, c.ffn_dim as i32);
        let eps = c.rms_eps;
        launch!(dev, embed, (1, 1), 128; m.embedding.seg, d, self.tok.ptr, self.x.ptr)?;
        Ok(1 + dev.decode_graph(|| self.decode_layers(d, f, eps, slot))?)
    }

    /// The decode step after the embedding: the layers, the head and argmax.
    fn decode_layers(&self, d: i32, f: i32, eps: f32, slot: usize) -> Result<usize> {
        let m = &self.model;
        let dev = &m.dev;
        let c = &m.config;
        let (q, kv) = (c.q_dim(), c.kv_dim());
        let row = q + 2 * kv;
        let neox = (c.rope_style == RopeStyle::Neox) as i32;
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        let hgs = attn_head_groups(c.n_head, c.n_kv_head, self.kv, 1);
        let workers = decode_attn_workers(self.ctx, c.n_kv_head * hgs, dev.sms) as u32;
        let (mut n, mut unfused) = (0, 0);
        let glu_block = glu_threads(c.ffn_dim / 32, dev.sms);
        let pair_o = pair_o(c.dim, dev.sms);
        let half = half();
        // Bytes each kernel moves, for the profile: weights, cache rows, activations.
        let (du, qu) = (c.dim as u64, q as u64);
        let norm_bytes = 8 * du + q8_bytes(c.dim);
        let cache_bytes =
            2 * (self.tokens.len() as u64 + 1) * kv_row_bytes(self.kv, kv) as u64 + 4 * qu;
        // The Q/K/V and gate/up kernels normalise x themselves where they can (norm_q8_block in
        // kernels/matvec.cu: rmsnorm_q8's bits), so the norms between the layers' matvecs go.
        let fuse = fused_norm(c.dim)
            && m.layers
                .iter()
                .all(|l| l.qk_norm.is_none() && l.router.is_none());
        let (nx, fused_bytes) = if fuse { (self.x.ptr, 8 * du) } else { (0, 0) };
        // Deferred norms (kernels/common.cuh, parts_lane): O and down leave the next norm's
        // input (nq, nd, np), Q/K/V and gate/up scale their rows; no norm kernels but the first
        // and the last (never with a fused norm: norms_deferred asks).
        let defer = norms_deferred(m);
        let (nq, nd, np) = match defer {
            true => (self.nq.ptr, self.nd.ptr, self.np.ptr),
            false => (self.aq.ptr, self.ad.ptr, 0),
        };
        // rmsnorm(x) · w into aq/ad for the next matvec: one kernel.
        let norm = |w: &Buf| -> Result<usize> {
            dev.moves(norm_bytes);
            launch!(dev, rmsnorm_q8, norm_grid(1, c.dim), 1024;
                self.x.ptr, w.ptr, eps, d, self.aq.ptr, self.ad.ptr)?;
            Ok(1)
        };
        if defer {
            dev.moves(norm_bytes);
            launch!(dev, rmsnorm_q8d, norm_grid(1, c.dim), 1024;
                self.x.ptr, m.layers[0].attn_norm.ptr, d, nq, nd, np)?;
            n += 1;
        } else if !fuse {
            n += norm(&m.layers[0].attn_norm)?;
        }
        let quantized = self.kv != KvType::F16;
        for (li, l) in m.layers.iter().enumerate() {
            // Q/K/V, attention, O, gate/up, down; the norms between them where not fused.
            n += 5;
            let (kc, vc) = self.layer_cache(li);
            // A quantized cache: the writers leave K and V in qkv, the attention kernel stores them.
            let (wk, wv) = if quantized { (0, 0) } else { (kc, vc) };
            let bias = l.bias.as_ref().map_or(0, |b| b.ptr);
            dev.moves(
                l.q.seg.bytes() + l.k.seg.bytes() + l.v.seg.bytes() + q8_bytes(c.dim) + fused_bytes,
            );
            if let Some((wq, wk_norm)) = &l.qk_norm {
                // Qwen3: the norm needs whole heads between the matmul and RoPE, so the three
                // steps the fused kernel does run apart.
                launch!(dev, (dev.matvec_k(&[&l.q.seg, &l.k.seg, &l.v.seg])) as "matvec (qkv)", (row.div_ceil(4) as u32, 1), 128;
                    l.q.seg, l.k.seg, l.v.seg, d, self.aq.ptr, self.ad.ptr, self.qkv.ptr, bias, 0i32)?;
                launch!(dev, qk_norm, (1, (c.n_head + c.n_kv_head) as u32), 128;
                    self.qkv.ptr, row as i32, c.n_head as i32, c.head_dim as i32, wq.ptr, wk_norm.ptr, eps)?;
                launch!(dev, rope_store, (1, 1), 256;
                    self.qkv.ptr, 0u64, self.cos.ptr, self.sin.ptr, self.pos.ptr, c.n_head as i32,
                    c.n_kv_head as i32, c.head_dim as i32, neox, wk, wv, 0u64, 1i32, 0u64)?;
                unfused += 2;
            } else {
                let segs = [&l.q.seg, &l.k.seg, &l.v.seg];
                let (k, per_block) = match dev.qkv_half(&segs, c.dim, c.head_dim, half.qkv) {
                    Some(k) => (k, 8),
                    None => (("qkv_rope", dev.qkv_rope_k(&segs)), 4),
                };
                launch!(dev, [k], ((row / 2).div_ceil(per_block) as u32, 1), 128;
                    l.q.seg, l.k.seg, l.v.seg, d, nq, nd, bias, self.cos.ptr,
                    self.sin.ptr, self.pos.ptr, c.n_head as i32, c.n_kv_head as i32,
                    c.head_dim as i32, neox, self.qkv.ptr, wk, wv, nx, l.attn_norm.ptr, eps, np)?;
            }
            let args = (
                self.qkv.ptr,
                kc,
                vc,
                self.pos.ptr,
                c.n_head as i32,
                c.n_kv_head as i32,
                scale,
                self.part_o.ptr,
                self.part_ml.ptr,
                self.counter.at(4),
                self.aq.ptr,
                self.ad.ptr,
            );
            dev.moves(cache_bytes + q8_bytes(q));
            launch!(dev, [dev.attn_decode(c.head_dim, self.kv)], ((c.n_kv_head * hgs) as u32, workers), 256;
                args.0, args.1, args.2, args.3, args.4, args.5, args.6, args.7, args.8,
                args.9, args.10, args.11)?;
            dev.moves(l.o.seg.bytes() + q8_bytes(q) + 8 * du);
            if defer {
                let rows_a_block = if pair_o { 8 } else { 4 };
                launch!(dev, (dev.matvec_add_nq_k(&l.o.seg, pair_o)) as "matvec (attn_output + residual)", ((c.dim / rows_a_block) as u32, 1), 128;
                    l.o.seg, q as i32, self.aq.ptr, self.ad.ptr, self.x.ptr, l.ffn_norm.ptr, nq, nd, np)?;
            } else if pair_o {
                launch!(dev, (dev.matvec_pair_add_k(&l.o.seg)) as "matvec (attn_output + residual)", ((c.dim).div_ceil(8) as u32, 1), 128;
                    l.o.seg, q as i32, self.aq.ptr, self.ad.ptr, self.x.ptr)?;
            } else {
                launch!(dev, (dev.matvec_k(&[&l.o.seg])) as "matvec (attn_output + residual)", ((c.dim).div_ceil(4) as u32, 1), 128;
                    l.o.seg, Seg::NONE, Seg::NONE, q as i32, self.aq.ptr, self.ad.ptr, self.x.ptr, 0u64, 1i32)?;
            }
            let next = m.layers.get(li + 1);
            if let Some(moe) = &self.moe {
                // Experts (never fused nor deferred): the norm, routing and the routes' FFNs,
                // added to the residual.
                n += moe.run(dev, c, l, 1, self.x.ptr, self.x.ptr, true)? - 2;
                n += norm(next.map_or(&m.output_norm, |n| &n.attn_norm))?;
                continue;
            }
            if !fuse && !defer {
                n += norm(&l.ffn_norm)?;
            }
            dev.moves(
                l.gate.seg.bytes()
                    + l.up.seg.bytes()
                    + q8_bytes(c.dim)
                    + q8_bytes(c.ffn_dim)
                    + fused_bytes,
            );
            let glu_k = dev
                .glu_half(&l.gate.seg, &l.up.seg, c.dim, glu_block, half.glu)
                .unwrap_or_else(|| dev.glu(&l.gate.seg, &l.up.seg, glu_block));
            launch!(dev, [glu_k], ((c.ffn_dim / 32) as u32, 1), glu_block;
                l.gate.seg, l.up.seg, d, nq, nd, self.hq.ptr, self.hd.ptr, nx,
                l.ffn_norm.ptr, eps, np)?;
            dev.moves(l.down.seg.bytes() + q8_bytes(c.ffn_dim) + 8 * du);
            if let (true, Some(nl)) = (defer, next) {
                launch!(dev, (dev.matvec_add_nq_k(&l.down.seg, false)) as "matvec (ffn_down + residual)", ((c.dim / 4) as u32, 1), 128;
                    l.down.seg, f, self.hq.ptr, self.hd.ptr, self.x.ptr, nl.attn_norm.ptr, nq, nd, np)?;
            } else if !defer && dev.split_rows(&l.down.seg, c.ffn_dim) {
                launch!(dev, (dev.matvec2_k(&l.down.seg)) as "matvec (ffn_down + residual)", ((c.dim).div_ceil(2) as u32, 1), 128;
                    l.down.seg, f, self.hq.ptr, self.hd.ptr, self.x.ptr, 1i32)?;
            } else {
                launch!(dev, (dev.matvec_k(&[&l.down.seg])) as "matvec (ffn_down + residual)", ((c.dim).div_ceil(4) as u32, 1), 128;
                    l.down.seg, Seg::NONE, Seg::NONE, f, self.hq.ptr, self.hd.ptr, self.x.ptr, 0u64, 1i32)?;
            }
            if (!fuse && !defer) || next.is_none() {
                n += norm(next.map_or(&m.output_norm, |n| &n.attn_norm))?;
            }
        }
        self.head(1, slot)?;
        Ok(n + unfused + 2)
    }

    /// One token: set the input id (unless the device already holds it), replay the graph.
    fn decode(&mut self, token: u32) -> Result<()> {
        let dev = self.model.dev.clone();
        if self.dev_tok != Some(token) {
            dev.write(&self.tok, 0, &[token as i32])?;
        }
        if !self.pos_synced {
            dev.write(&self.pos, 0, &[self.tokens.len() as i32])?;
            self.pos_synced = true;
        }
        self.launch_step(0)?;
        self.last_slot = 0;
        self.tokens.push(token);
        self.dev_tok = None;
        self.logits_valid = false;
        Ok(())
    }

    /// Replay the decode graph that reports to pinned slot `slot` (recording its event when steps
    /// may run ahead).
    fn launch_step(&mut self, slot: usize) -> Result<()> {
        if self.graphs[slot].is_none() {
            self.capture(slot)?;
        }
        let stream = self.model.dev.stream;
        unsafe { drv::graph::launch(self.graphs[slot].unwrap(), stream) }
            .map_err(|e| err("graph launch", e))?;
        if self.ahead_on {
            unsafe { drv::event::record(self.done[slot], stream) }.map_err(|e| err("event", e))?;
        }
        self.evented[slot] = self.ahead_on;
        Ok(())
    }

    /// Whether the next greedy step may start before the host reads this one's id: asked for,
    /// the session's own cache, the device's position in step with the host's (the step run ahead
    /// advances it on the device), and room for one more token.
    fn can_run_ahead(&self) -> bool {
        self.ahead_on
            && self.evented[self.last_slot]
            && self.kv_ext.is_none()
            && self.pos_synced
            && self.tokens.len() + 1 < self.ctx
    }

    /// Wait for a step run ahead that nobody claimed, and forget it: it wrote a cache row past
    /// the host's tokens (overwritten when that position runs), its logits and the device's
    /// token and position, which are rewritten before the next step. Whether there was one.
    fn settle(&mut self) -> Result<bool> {
        if self.ahead.take().is_none() {
            return Ok(false);
        }
        self.model.dev.sync()?;
        self.pos_synced = false;
        self.dev_tok = None;
        self.logits_valid = false;
        Ok(true)
    }

    /// Logits are read: a step run ahead has overwritten the last step's.
    fn no_step_ahead(&mut self) -> Result<()> {
        if self.settle()? {
            return Err(Error::InvalidArgument(
                "the last step's logits were overwritten by a greedy step run ahead".into(),
            ));
        }
        Ok(())
    }

    /// Run greedy steps ahead (see [`crate::runner::Runner::pipeline_greedy`]). Turned off, a
    /// step in flight is left to finish: the next call that needs the device waits for it.
    /// `MENS_CUDA_AHEAD=0` keeps them off.
    pub fn pipeline_greedy(&mut self, on: bool) {
        static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let off = *OFF.get_or_init(|| std::env::var("MENS_CUDA_AHEAD").as_deref() == Ok("0"));
        self.ahead_on = on && !off;
    }

    fn capture(&mut self, slot: usize) -> Result<()> {
        let dev = self.model.dev.clone();
        dev.sync()?;
        unsafe {
            drv::stream::begin_capture(
                dev.stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(|e| err("graph capture", e))?;
        let r = self.decode_kernels(slot);
        let g = unsafe { drv::stream::end_capture(dev.stream) };
        let n = r?;
        let g = g.map_err(|e| err("graph capture", e))?;
        let exec = unsafe { drv::graph::instantiate(g, sys::CUgraphInstantiate_flags(0)) }
            .map_err(|e| err("graph instantiate", e))?;
        unsafe {
            let _ = drv::graph::destroy(g);
        }
        self.graphs[slot] = Some(exec);
        self.graph_kernels = n;
        Ok(())
    }

    /// A prompt pass's gate and up GEMM, then SwiGLU into h16. Gate and up are written in f16
    /// where the FFN width allows the 8-wide kernel (half the bytes of f32 through memory,
    /// and they are rounded to f16 in h16 anyway).
    fn gate_up(&self, l: &super::model::GpuLayer, t: usize) -> Result<()> {
        let dev = &self.model.dev;
        let f = self.model.config.ffn_dim;
        let half = f.is_multiple_of(8);
        self.linear(
            &[&l.gate, &l.up],
            self.xb16.ptr,
            t,
            self.gu.ptr,
            2 * f,
            false,
            half,
        )?;
        if half {
            launch!(dev, swiglu_h16, ((t * f / 8).div_ceil(256) as u32, 1), 256;
                self.gu.ptr, f as i32, t as i32, self.h16.ptr)
        } else {
            launch!(dev, swiglu_f16, ((t * f).div_ceil(256) as u32, 1), 256;
                self.gu.ptr, f as i32, t as i32, self.h16.ptr)
        }
    }

    /// f16 GEMM: out[t][o0..] (f32, or f16 when `out16`; row stride `ldo`) = x16[t] · W^T for
    /// the stacked matrices (`add`: added to what out holds), through the model's f16 copy of the
    /// weights where it has one ([`GpuModel::make_f16_copy`]), else dequantized into `w16` first.
    /// Also the batched decode step's cuBLAS family (see [`super::BatchKernels`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn linear(
        &self,
        mats: &[&Mat],
        x16: u64,
        t: usize,
        out: u64,
        ldo: usize,
        add: bool,
        out16: bool,
    ) -> Result<()> {
        let dev = &self.model.dev;
        let cols = mats[0].cols;
        let rows: usize = mats.iter().map(|m| m.seg.rows as usize).sum();
        let w16 = match self.model.f16_of(mats) {
            Some(w) => w,
            None => {
                let mut at = 0usize;
                for m in mats {
                    let chunks = m.seg.rows as usize * cols / 32;
                    launch!(dev, dequant_f16, (chunks.div_ceil(256) as u32, 1), 256;
                        m.seg, cols as i32, self.w16.at(2 * at * cols))?;
                    at += m.seg.rows as usize;
                }
                self.w16.ptr
            }
        };
        let (one, beta) = (1f32, if add { 1f32 } else { 0f32 });
        unsafe {
            blas::gemm_ex(
                dev.blas,
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                rows as i32,
                t as i32,
                cols as i32,
                &one as *const f32 as *const c_void,
                w16 as *const c_void,
                blas_sys::cudaDataType::CUDA_R_16F,
                cols as i32,
                x16 as *const c_void,
                blas_sys::cudaDataType::CUDA_R_16F,
                cols as i32,
                &beta as *const f32 as *const c_void,
                out as *mut c_void,
                if out16 {
                    blas_sys::cudaDataType::CUDA_R_16F
                } else {
                    blas_sys::cudaDataType::CUDA_R_32F
                },
                ldo as i32,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| err("cuBLAS GEMM", e))?;
        dev.mark(match mats.len() {
            3 => "cuBLAS GEMM (QKV)",
            2 => "cuBLAS GEMM (gate/up)",
            _ if cols == self.model.config.ffn_dim => "cuBLAS GEMM (down)",
            _ if rows == self.model.config.vocab_size => "cuBLAS GEMM (LM head)",
            _ => "cuBLAS GEMM (O)",
        })
    }

    /// Causal attention of one sequence's `t` queries, rows `a..a + t` of the pass's `total`
    /// (Q grouped by KV head in `qperm`, O likewise into `o`), against the first pos0 + t rows
    /// of the cache layer at (`kc`, `vc`); `pos` points at pos0 on the device. Queries go in
    /// sub-batches of `att_queries` so that the score buffer stays within SCORE_BYTES.
    fn attention_gemm(
        &self,
        (mut kc, mut vc): (u64, u64),
        a: usize,
        t: usize,
        pos0: usize,
        pos: u64,
        total: usize,
    ) -> Result<()> {
        let m = &self.model;
        let dev = &m.dev;
        let c = &m.config;
        if let Some(f) = dev.kv_to_f16(self.kv) {
            // A quantized cache: its rows as f16 first (the GEMMs read f16).
            launch!(dev, [f], ((pos0 + t) as u32, 2), 128;
                kc, vc, c.kv_dim() as i32, self.k16.ptr, self.v16.ptr)?;
            (kc, vc) = (self.k16.ptr, self.v16.ptr);
        }
        let g = c.n_head / c.n_kv_head;
        let hd = c.head_dim;
        let scale = 1.0 / (hd as f32).sqrt();
        let (one, zero) = (1f32, 0f32);
        let op = |x| {
            if x {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let f16 = blas_sys::cudaDataType::CUDA_R_16F;
        let f32t = blas_sys::cudaDataType::CUDA_R_32F;
        let per = att_queries(c, self.ctx, self.ubatch);
        for t0 in (0..t).step_by(per) {
            let n = per.min(t - t0);
            let l = pos0 + t0 + n; // keys the last query of this sub-batch sees
            let rows = n * g;
            // Per KV head: Q rows of this sub-batch start at (a + t0) * g; batch strides cover
            // the whole pass.
            let q = self.qperm.ptr + (2 * (a + t0) * g * hd) as u64;
            let o = self.o.ptr + (4 * (a + t0) * g * hd) as u64;
            unsafe {
                // S[kvh] (col-major l × rows) = K[kvh]ᵀ-view · Q[kvh]
                blas::gemm_strided_batched_ex(
                    dev.blas,
                    op(true),
                    op(false),
                    l as i32,
                    rows as i32,
                    hd as i32,
                    &scale as *const f32 as *const c_void,
                    kc as *const c_void,
                    f16,
                    c.kv_dim() as i32,
                    hd as i64,
                    q as *const c_void,
                    f16,
                    hd as i32,
                    (total * g * hd) as i64,
                    &zero as *const f32 as *const c_void,
                    self.scores.ptr as *mut c_void,
                    f32t,
                    l as i32,
                    (rows * l) as i64,
                    c.n_kv_head as i32,
                    blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(|e| err("cuBLAS batched GEMM (scores)", e))?;
            dev.mark("attention GEMM (scores)")?;
            launch!(dev, softmax_causal, ((c.n_kv_head * rows) as u32, 1), 256;
                self.scores.ptr, self.probs.ptr, l as i32, l as i32, g as i32, n as i32,
                pos, t0 as i32)?;
            unsafe {
                // O[kvh] (col-major hd × rows) = V[kvh] (hd × l view) · P[kvh] (l × rows)
                blas::gemm_strided_batched_ex(
                    dev.blas,
                    op(false),
                    op(false),
                    hd as i32,
                    rows as i32,
                    l as i32,
                    &one as *const f32 as *const c_void,
                    vc as *const c_void,
                    f16,
                    c.kv_dim() as i32,
                    hd as i64,
                    self.probs.ptr as *const c_void,
                    f16,
                    l as i32,
                    (rows * l) as i64,
                    &zero as *const f32 as *const c_void,
                    o as *mut c_void,
                    f32t,
                    hd as i32,
                    (total * g * hd) as i64,
                    c.n_kv_head as i32,
                    blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(|e| err("cuBLAS batched GEMM (values)", e))?;
            dev.mark("attention GEMM (values)")?;
        }
        Ok(())
    }

    /// The attention output O ([kv_head][t][g][hd] f32) of a pass of `t` tokens into xb16 as
    /// [t][q_dim] f16.
    fn unpermute(&self, t: usize) -> Result<()> {
        let m = &self.model;
        let dev = &m.dev;
        let c = &m.config;
        let hd = c.head_dim;
        let n = t * c.q_dim();
        launch!(dev, unpermute_f16, (n.div_ceil(256) as u32, 1), 256;
            self.o.ptr, self.xb16.ptr, c.n_head as i32, c.n_kv_head as i32, hd as i32, t as i32)
    }

    /// Causal attention of one sequence's `t` queries, rows `a..a + t` of a pass (rotated, in
    /// `qkv`), against the first pos0 + t rows of the cache layer at (`kc`, `vc`) (the
    /// flash-attention kernel; pos0 at `pos` on the device), into xb16 as [t][q_dim] f16.
    fn attention_flash_at(&self, (kc, vc): (u64, u64), a: usize, t: usize, pos: u64) -> Result<()> {
        let m = &self.model;
        let dev = &m.dev;
        let c = &m.config;
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        let grid = (t.div_ceil(FA_Q) as u32, c.n_head as u32);
        let row = c.q_dim() + 2 * c.kv_dim();
        let args = (
            self.qkv.at(4 * a * row),
            kc,
            vc,
            pos,
            t as i32,
            c.n_head as i32,
            c.n_kv_head as i32,
            scale,
            self.xb16.at(2 * a * c.q_dim()),
        );
        launch!(dev, [dev.flash_prefill(c.head_dim, self.kv)], grid, 256;
            args.0, args.1, args.2, args.3, args.4, args.5, args.6, args.7, args.8)
    }

    /// A prompt, `ubatch` tokens at a time; leaves the last token's logits and greedy id.
    fn prefill(&mut self, tokens: &[u32]) -> Result<()> {
        let chunks: Vec<&[u32]> = tokens.chunks(self.ubatch).collect();
        for (i, ch) in chunks.iter().enumerate() {
            self.prefill_chunk(ch, i + 1 == chunks.len())?;
        }
        self.prompt_done();
        Ok(())
    }

    /// A prompt's hidden states after the final norm (embeddings): each pass's residual rows are
    /// read back and normalised on the host with the CPU reference's RMSNorm (a few rows of the
    /// model's width a request: no kernel of its own), handed over from `logits`' index on.
    fn prefill_hidden(&mut self, tokens: &[u32], mut logits: Logits) -> Result<()> {
        let m = self.model.clone();
        let (d, eps) = (m.config.dim, m.config.rms_eps);
        let from = logits.start().unwrap_or(0);
        let mut w = vec![0f32; d];
        m.dev.read(&m.output_norm, 0, &mut w)?;
        let mut x = Vec::new();
        let mut done = 0;
        for ch in tokens.chunks(self.ubatch) {
            self.prefill_chunk(ch, false)?;
            x.resize(ch.len() * d, 0f32);
            m.dev.read(&self.x, 0, &mut x)?;
            for (i, row) in x.chunks(d).enumerate() {
                if done + i >= from {
                    logits.give_hidden(done + i, &super::reference::rmsnorm(row, &w, eps));
                }
            }
            done += ch.len();
        }
        self.prompt_done();
        // No pass ran the head, which advances the device's position: the next step writes it.
        self.pos_synced = false;
        Ok(())
    }

    /// After a prompt's passes: no token or logits of a step on the device, the position written,
    /// the prompt's head reported to slot 0 with no event after it.
    fn prompt_done(&mut self) {
        self.dev_tok = None;
        self.logits_valid = false;
        self.pos_synced = true;
        self.last_slot = 0;
        self.evented[0] = false;
    }

    fn prefill_chunk(&mut self, toks: &[u32], last: bool) -> Result<()> {
        let m = self.model.clone();
        let dev = &m.dev;
        let c = &m.config;
        let t = toks.len();
        let pos0 = self.tokens.len();
        let d = c.dim;
        let eps = c.rms_eps;
        let ids: Vec<i32> = toks.iter().map(|&x| x as i32).collect();
        dev.write(&self.toks, 0, &ids)?;
        dev.write(&self.pos, 0, &[pos0 as i32])?;
        self.prompt_layers(t, 0, &[(0, t, 0, pos0, self.pos.ptr)])?;
        if last {
            launch!(dev, rmsnorm_q8, norm_grid(1, c.dim), 1024;
                self.x.at(4 * (t - 1) * d), m.output_norm.ptr, eps, d as i32, self.aq.ptr, self.ad.ptr)?;
            self.head(t as i32, 0)?;
        }
        self.tokens.extend_from_slice(toks);
        Ok(())
    }

    /// The layers of a prompt pass over `t` tokens (ids in `toks`), from the embedding to the
    /// final norm's input in `x`. `parts`: (first token, tokens, byte offset of its rows in each
    /// cache layer, pos0, pos0 on the device) of each sequence, attended to separately; `rows`:
    /// the device's (position, cache row) of every token, or 0 for one sequence at pos0 + i.
    fn prompt_layers(
        &self,
        t: usize,
        rows: u64,
        parts: &[(usize, usize, u64, usize, u64)],
    ) -> Result<()> {
        let m = &self.model;
        let dev = &m.dev;
        let c = &m.config;
        let (d, q, kv) = (c.dim, c.q_dim(), c.kv_dim());
        let row = q + 2 * kv;
        let eps = c.rms_eps;
        let neox = (c.rope_style == RopeStyle::Neox) as i32;
        let pos = parts[0].4;
        launch!(dev, embed, (t as u32, 1), 128; m.embedding.seg, d as i32, self.toks.ptr, self.x.ptr)?;
        launch!(dev, add_rmsnorm_f16, (t as u32, 1), 256;
            self.x.ptr, 0u64, m.layers[0].attn_norm.ptr, eps, d as i32, self.xb16.ptr)?;
        let quant = dev.kv_quant(self.kv);
        let flash = flash_prefill();
        for (li, l) in m.layers.iter().enumerate() {
            let (kl, vl) = self.layer_cache(li);
            self.linear(
                &[&l.q, &l.k, &l.v],
                self.xb16.ptr,
                t,
                self.qkv.ptr,
                row,
                false,
                false,
            )?;
            let bias = l.bias.as_ref().map_or(0, |b| b.ptr);
            if let Some((wq, wk)) = &l.qk_norm {
                launch!(dev, qk_norm, (t as u32, (c.n_head + c.n_kv_head) as u32), 128;
                    self.qkv.ptr, row as i32, c.n_head as i32, c.head_dim as i32, wq.ptr, wk.ptr, eps)?;
            }
            // RoPE and the cache writes for every token at once (each at its own position and
            // cache row); attention per sequence.
            let (wk, wv) = if quant.is_some() { (0, 0) } else { (kl, vl) };
            launch!(dev, rope_store, (t as u32, 1), 256;
                self.qkv.ptr, bias, self.cos.ptr, self.sin.ptr, pos, c.n_head as i32,
                c.n_kv_head as i32, c.head_dim as i32, neox, wk, wv, self.qperm.ptr, t as i32, rows)?;
            if let Some(kq) = quant {
                launch!(dev, [kq], (t as u32, 2), 256;
                    self.qkv.ptr, row as i32, q as i32, kv as i32, pos, kl, vl, rows)?;
            }
            for &(a, n, off, pos0, p) in parts {
                let cache = (kl + off, vl + off);
                if flash {
                    self.attention_flash_at(cache, a, n, p)?;
                } else {
                    self.attention_gemm(cache, a, n, pos0, p, t)?;
                }
            }
            if !flash {
                self.unpermute(t)?;
            }
            self.linear(&[&l.o], self.xb16.ptr, t, self.tmp.ptr, d, false, false)?;
            launch!(dev, add_rmsnorm_f16, (t as u32, 1), 256;
                self.x.ptr, self.tmp.ptr, l.ffn_norm.ptr, eps, d as i32, self.xb16.ptr)?;
            match &self.moe {
                Some(moe) => {
                    moe.run(dev, c, l, t, self.x.ptr, self.tmp.ptr, false)?;
                }
                None => {
                    self.gate_up(l, t)?;
                    self.linear(&[&l.down], self.h16.ptr, t, self.tmp.ptr, d, false, false)?;
                }
            }
            let norm = m
                .layers
                .get(li + 1)
                .map_or(&m.output_norm, |n| &n.attn_norm);
            launch!(dev, add_rmsnorm_f16, (t as u32, 1), 256;
                self.x.ptr, self.tmp.ptr, norm.ptr, eps, d as i32, self.xb16.ptr)?;
        }
        Ok(())
    }

    /// One prompt pass over several sequences' tokens (a batch's prompt chunks): the matrices
    /// run as one GEMM over all of them, RoPE, the cache writes and attention per sequence, on
    /// the cache at (`kc`, `vc`) (this session's layout: `ctx` rows a layer), each sequence's rows
    /// from its `off`. Fewer, larger GEMMs than a pass per sequence: what keeps time to first token
    /// low when many prompts arrive at once.
    ///
    /// `out`: (logits [rows][vocab] f32, greedy ids [rows] i32), the rows named by the sequences.
    pub(super) fn prefill_packed(
        &mut self,
        kc: u64,
        vc: u64,
        seqs: &[Packed],
        out: (u64, u64),
    ) -> Result<()> {
        let t: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        // check_tokens (below) refuses an empty part; the rows bound covers each one's offset.
        if t == 0
            || t > self.ubatch
            || seqs
                .iter()
                .any(|s| s.off + s.pos0 + s.tokens.len() > self.ctx)
        {
            return Err(Error::InvalidArgument(format!(
                "a packed prompt pass takes 1 to {} tokens, each sequence within {} cache rows",
                self.ubatch, self.ctx
            )));
        }
        let vocab = self.model.config.vocab_size;
        for s in seqs {
            crate::runner::check_tokens(s.pos0, self.ctx, s.tokens, vocab)?;
        }
        self.model.dev.bind()?;
        self.point_at(kc, vc);
        // The device's position and token are no longer this session's own.
        self.pos_synced = false;
        self.dev_tok = None;
        self.logits_valid = false;
        let m = self.model.clone();
        let dev = &m.dev;
        let c = &m.config;
        let d = c.dim;
        let eps = c.rms_eps;
        let rb = kv_row_bytes(self.kv, c.kv_dim()) as u64;
        let ids: Vec<i32> = seqs
            .iter()
            .flat_map(|s| s.tokens.iter().map(|&x| x as i32))
            .collect();
        // pos_many: each sequence's pos0, each token's (position, cache row), the logits rows.
        let mut pos: Vec<i32> = seqs.iter().map(|s| s.pos0 as i32).collect();
        for s in seqs {
            for j in 0..s.tokens.len() {
                pos.extend([(s.pos0 + j) as i32, (s.off + s.pos0 + j) as i32]);
            }
        }
        let orow_at = pos.len();
        pos.extend(seqs.iter().filter_map(|s| s.logits_row.map(|r| r as i32)));
        dev.write(&self.toks, 0, &ids)?;
        dev.write(&self.pos_many, 0, &pos)?;
        let rows = self.pos_many.at(4 * seqs.len());
        let starts: Vec<usize> = seqs
            .iter()
            .scan(0, |a, s| {
                let at = *a;
                *a += s.tokens.len();
                Some(at)
            })
            .collect();
        let parts: Vec<(usize, usize, u64, usize, u64)> = seqs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let off = s.off as u64 * rb;
                (
                    starts[i],
                    s.tokens.len(),
                    off,
                    s.pos0,
                    self.pos_many.at(4 * i),
                )
            })
            .collect();
        self.prompt_layers(t, rows, &parts)?;
        // The last logits of the sequences that want them, HEAD_ROWS at a time through the
        // batched LM head (each weight block read once for all; the matrix-vector bits of a
        // one-sequence pass), and each one's greedy id.
        let v = c.vocab_size;
        let want: Vec<(usize, usize)> = seqs
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.logits_row.map(|r| (starts[i] + s.tokens.len() - 1, r)))
            .collect();
        for (k, chunk) in want.chunks(HEAD_ROWS).enumerate() {
            for (j, &(last, _)) in chunk.iter().enumerate() {
                launch!(dev, rmsnorm_q8, norm_grid(1, d), 1024;
                    self.x.at(4 * last * d), m.output_norm.ptr, eps, d as i32, self.aq.at(j * d),
                    self.ad.at(8 * j * d / 32))?;
            }
            let b = chunk.len();
            let orow = self.pos_many.at(4 * (orow_at + k * HEAD_ROWS));
            let (k, grid, block) = dev.matmul_q8(b, b, &[&m.head().seg])?;
            launch!(dev, (k) as "matmul_q8 (LM head)", grid, block;
                m.head().seg, Seg::NONE, Seg::NONE, d as i32, self.aq.ptr, self.ad.ptr, b as i32,
                out.0, v as i32, orow, 0u64, 0i32)?;
            for &(_, r) in chunk {
                launch!(dev, argmax, (ARGMAX_BLOCKS as u32, 1), 1024;
                    out.0 + (4 * r * v) as u64, v as i32, self.partial.ptr, self.counter.ptr,
                    self.tok.ptr, out.1 + 4 * r as u64, self.pos.ptr, 0i32)?;
            }
        }
        Ok(())
    }

    /// Time each kernel of `steps` decode steps run one launch at a time (outside the graph,
    /// so each also pays its launch), with the bytes each moves, and the copy bandwidth.
    /// The steps decode the device's own greedy tokens; the session's tokens are not extended, so
    /// the cache entries written here are overwritten by the next forward pass.
    pub fn profile_decode(&mut self, steps: usize) -> Result<crate::runner::Profile> {
        self.settle()?;
        let dev = self.model.dev.clone();
        dev.bind()?;
        dev.write(&self.pos, 0, &[self.tokens.len() as i32])?;
        let kernels = dev.time_kernels(steps, || self.decode_kernels(0))?;
        // The profiled steps advanced the device's position: put it back.
        self.pos_synced = false;
        self.dev_tok = None;
        self.logits_valid = false;
        Ok(crate::runner::Profile {
            kernels,
            copy_gbs: dev.copy_bandwidth()?,
        })
    }
}

impl Drop for CudaSession {
    fn drop(&mut self) {
        let _ = self.model.dev.bind();
        let _ = self.model.dev.sync();
        unsafe {
            for g in self.graphs.iter_mut().filter_map(Option::take) {
                let _ = drv::graph::exec_destroy(g);
            }
            for e in self.done {
                let _ = drv::event::destroy(e);
            }
            let _ = drv::free_host(self.pinned as *mut c_void);
        }
    }
}

impl crate::runner::Runner for CudaSession {
    fn ctx(&self) -> usize {
        self.ctx
    }
    fn sibling(&self, ctx: usize) -> Result<Box<dyn crate::runner::Runner>> {
        Ok(Box::new(CudaSession::make(
            self.model.clone(),
            ctx,
            self.ubatch,
            true,
            self.kv,
        )?))
    }
    fn batch_sibling(
        &self,
        slots: usize,
        ctx: usize,
        step: usize,
    ) -> Result<Box<dyn crate::runner::Runner>> {
        let (b, copy) = super::CudaBatch::serving(
            self.model.clone(),
            slots,
            ctx,
            self.ubatch,
            step,
            self.kv,
            super::batch::full_pool(slots, ctx),
            true,
        )?;
        if !copy.is_empty() {
            eprintln!("mens: {copy}");
        }
        Ok(Box::new(b))
    }
    fn max_step_tokens(&self) -> usize {
        self.ctx
    }
    fn slot_tokens(&self, _slot: usize) -> &[u32] {
        &self.tokens
    }
    fn truncate_slot(&mut self, _slot: usize, n: usize) {
        CudaSession::truncate(self, n)
    }
    fn hidden_states(&self) -> bool {
        true
    }
    fn step(&mut self, parts: &mut [crate::runner::Part]) -> Result<()> {
        let p = crate::runner::single(parts)?;
        let logits = std::mem::replace(&mut p.logits, Logits::None);
        CudaSession::forward(self, p.tokens, logits)
    }
    fn sample_slot(&mut self, _slot: usize, sampler: &mut Sampler) -> Result<u32> {
        CudaSession::sample(self, sampler)
    }
    fn pipeline_greedy(&mut self, on: bool) {
        CudaSession::pipeline_greedy(self, on)
    }
    fn memory(&self) -> crate::runner::Memory {
        let kv = CudaSession::kv_cache_bytes(self);
        let all = session_bytes(&self.model.config, self.ctx, self.ubatch, self.kv) as usize;
        crate::runner::Memory {
            kv_cache: kv,
            buffers: all.saturating_sub(kv),
        }
    }
    fn launches_per_token(&self) -> Option<(usize, usize)> {
        Some((1, self.graph_kernels))
    }
    fn profile_decode(&mut self, steps: usize) -> Result<Option<crate::runner::Profile>> {
        CudaSession::profile_decode(self, steps).map(Some)
    }
}
