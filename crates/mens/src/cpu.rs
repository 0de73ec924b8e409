//! The CPU backend. A `Session` is one sequence: its KV cache and a `RunState` holding every
//! activation buffer, both allocated once for the session's context length and batch size (llama2.c's
//! RunState). A forward pass runs a batch of tokens through the model, writing into those buffers; a
//! decode step is a batch of one and allocates nothing. A `Batch` is many sequences stepped together.
//! Both implement [`Runner`]; this file and `kernels/` are the only ones that know the CPU kernels.

use crate::error::{Error, Result};
use crate::kernels::kv::KvRowsMut;
use crate::kernels::ops::{self, QkvLayout, RopeTable};
use crate::kernels::{act_type, attention, matmul, ActType, QuantizedInput};
use crate::model::{Activation, KvType, Model};
use crate::runner::{check_tokens, single, Logits, Memory, Part, Runner};
use crate::sample::Sampler;
use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Context length: tokens the KV cache holds.
    pub ctx: usize,
    /// Largest number of tokens one forward pass processes (prompt chunks).
    pub batch: usize,
    /// Positions whose logits one LM-head pass computes when every position's logits are wanted.
    pub logit_rows: usize,
    /// What the KV cache stores for K and for V.
    pub cache_k: KvType,
    pub cache_v: KvType,
}

impl SessionOptions {
    /// The K and V cache types.
    pub fn cache(&self) -> (KvType, KvType) {
        (self.cache_k, self.cache_v)
    }
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            ctx: 4096,
            batch: 512,
            logit_rows: 16,
            cache_k: KvType::F16,
            cache_v: KvType::F16,
        }
    }
}

/// Rows from which a pass computes each row the same way whatever its size: the tiled prompt
/// attention's 64 on an f16 cache (unless every pass runs decode's arithmetic), else 1 (a quantized
/// cache runs every pass the one way).
fn uniform_rows(types: (KvType, KvType), exact: bool) -> usize {
    if types == (KvType::F16, KvType::F16) && !exact && crate::kernels::tiled_prompt_attention() {
        crate::kernels::TILED_ATTENTION_FROM
    } else {
        1
    }
}

/// The K and V cache of every layer, [layer][kv head][position][head_dim], in f16 (llama.cpp's
/// default cache type) or in Q8_0 / Q4_0 blocks (`SessionOptions::cache_k` / `cache_v`), one
/// allocation each. Head-major, so that attention streams each head's rows contiguously (with
/// [position][kv_dim] rows a head's keys are strided: cold-cache attention at 512 keys took 5.7 ms
/// per 0.5B step against 4.9 ms head-major, examples/attention.rs).
pub struct KvCache {
    // u16-backed: f16 rows and the blocks' f16 scales stay aligned.
    k: Vec<u16>,
    v: Vec<u16>,
    types: (KvType, KvType),
    /// Bytes of one head's row, K and V.
    rows: (usize, usize),
    /// Rows per layer (kv heads × ctx).
    per_layer: usize,
    ctx: usize,
}

impl KvCache {
    fn new(c: &crate::model::Config, ctx: usize, types: (KvType, KvType)) -> Self {
        let per_layer = c.n_kv_head * ctx;
        let rows = (types.0.row_bytes(c.head_dim), types.1.row_bytes(c.head_dim));
        // Zeroed allocations (calloc): pages are only backed by memory once written, so a session's
        // resident size grows with the tokens actually cached.
        let zeroed = |row: usize| vec![0u16; c.n_layer * per_layer * row / 2];
        KvCache {
            k: zeroed(rows.0),
            v: zeroed(rows.1),
            types,
            rows,
            per_layer,
            ctx,
        }
    }
    /// Layer `l`'s K and V, and the positions each head holds (the row count of a head).
    fn layer(&mut self, l: usize) -> (KvRowsMut<'_>, KvRowsMut<'_>, usize) {
        fn bytes(v: &mut [u16], l: usize, n: usize) -> &mut [u8] {
            assert!((l + 1) * n <= v.len() * 2);
            // SAFETY: u16s viewed as bytes (alignment 1), the range inside the vector.
            unsafe { std::slice::from_raw_parts_mut((v.as_mut_ptr() as *mut u8).add(l * n), n) }
        }
        let k = KvRowsMut {
            t: self.types.0,
            data: bytes(&mut self.k, l, self.per_layer * self.rows.0),
            row: self.rows.0,
        };
        let v = KvRowsMut {
            t: self.types.1,
            data: bytes(&mut self.v, l, self.per_layer * self.rows.1),
            row: self.rows.1,
        };
        (k, v, self.ctx)
    }
    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * 2
    }

    /// Copy positions 0..n of every layer and head from `src` (a cache of the same shape).
    fn copy_prefix_from(&mut self, src: &KvCache, n: usize) {
        assert!(self.types == src.types && self.per_layer == src.per_layer && n <= self.ctx);
        for (dst, src, row) in [
            (&mut self.k, &src.k, self.rows.0),
            (&mut self.v, &src.v, self.rows.1),
        ] {
            // [layer][kv head] runs of ctx rows of `row` bytes (row / 2 u16s).
            let (run, take) = (self.ctx * row / 2, n * row / 2);
            for (d, s) in dst.chunks_exact_mut(run).zip(src.chunks_exact(run)) {
                d[..take].copy_from_slice(&s[..take]);
            }
        }
    }
}

/// Every buffer one forward pass writes, sized for `batch` tokens.
pub struct RunState {
    x: Vec<f32>,
    xb: Vec<f32>,
    tmp: Vec<f32>,
    qkv: Vec<f32>,
    att: Vec<f32>,
    /// [batch, 2 × ffn]: gate and up; after the gated activation, [batch, ffn] in place.
    gate_up: Vec<f32>,
    in_norm: QuantizedInput,
    in_att: QuantizedInput,
    in_ffn: QuantizedInput,
    in_head: QuantizedInput,
    /// [logit_rows, vocab]
    logits: Vec<f32>,
    rope: RopeTable,
    /// The sliding-window layers' table (Gemma 3: their own RoPE base).
    rope_swa: Option<RopeTable>,
    /// Mixture-of-experts scratch (empty for dense models).
    moe: MoeState,
    /// Every pass with decode's attention arithmetic (`Session::exact_attention`).
    exact_attention: bool,
}

/// What a mixture-of-experts FFN writes: the router's logits, each token's routes, the routes
/// grouped by expert, the grouped inputs and each route's output.
#[derive(Default)]
struct MoeState {
    /// [batch, n_expert]
    logits: Vec<f32>,
    /// [batch, n_used]: (expert, weight), in the router's order (highest probability first).
    routes: Vec<(u32, f32)>,
    /// Route indices (token · n_used + k) grouped by expert, and where each expert's group starts.
    order: Vec<u32>,
    starts: Vec<u32>,
    /// Position of each route in `order`.
    at: Vec<u32>,
    /// [batch, dim]: one expert's input rows, gathered.
    gathered: Vec<f32>,
    input: Option<QuantizedInput>,
    /// [batch · n_used, dim]: each route's expert output, in `order`.
    out: Vec<f32>,
}

/// The RoPE table of layer `l`: the sliding-window layers' own where the model has one. (A function
/// of the two fields, not of `RunState`, so that it can be borrowed beside its other buffers.)
fn layer_rope<'a>(
    rope: &'a RopeTable,
    sliding: &'a Option<RopeTable>,
    c: &crate::model::Config,
    l: usize,
) -> &'a RopeTable {
    match sliding {
        Some(t) if c.window(l) != usize::MAX => t,
        _ => rope,
    }
}

impl RunState {
    fn new(m: &Model, o: &SessionOptions) -> Self {
        prepare_weights(m);
        let c = &m.config;
        let b = o.batch;
        let types = |ts: &[&crate::kernels::QTensor]| -> Vec<ActType> {
            ts.iter().map(|t| act_type(t.ttype)).collect()
        };
        let mut norm_types = Vec::new();
        let mut att_types = Vec::new();
        let mut ffn_types = Vec::new();
        for l in &m.layers {
            norm_types.extend(types(&[&l.q, &l.k, &l.v, &l.gate, &l.up]));
            if let Some(moe) = &l.moe {
                norm_types.extend(types(&[&moe.router]));
            }
            att_types.extend(types(&[&l.o]));
            ffn_types.extend(types(&[&l.down]));
        }
        RunState {
            x: vec![0f32; b * c.dim],
            xb: vec![0f32; b * c.dim],
            tmp: vec![0f32; b * c.dim],
            qkv: vec![0f32; b * (c.q_dim() + 2 * c.kv_dim())],
            att: vec![0f32; b * c.q_dim()],
            gate_up: vec![
                0f32;
                match c.experts {
                    None => b.min(FFN_ROWS),
                    Some(_) => b,
                } * 2
                    * c.ffn_dim
            ],
            in_norm: QuantizedInput::new(b, c.dim, &norm_types),
            in_att: QuantizedInput::new(b, c.q_dim(), &att_types),
            in_ffn: QuantizedInput::new(b, c.ffn_dim, &ffn_types),
            in_head: QuantizedInput::new(o.logit_rows, c.dim, &[act_type(m.output.ttype)]),
            logits: vec![0f32; o.logit_rows * c.vocab_size],
            moe: match c.experts {
                None => MoeState::default(),
                Some(x) => {
                    let routes = b * x.n_used;
                    let types: Vec<ActType> = m
                        .layers
                        .iter()
                        .flat_map(|l| [act_type(l.gate.ttype), act_type(l.up.ttype)])
                        .collect();
                    MoeState {
                        logits: vec![0f32; b * x.n_expert],
                        routes: vec![(0, 0.0); routes],
                        order: vec![0; routes],
                        starts: vec![0; x.n_expert + 1],
                        at: vec![0; routes],
                        gathered: vec![0f32; b * c.dim],
                        input: Some(QuantizedInput::new(b, c.dim, &types)),
                        out: vec![0f32; routes * c.dim],
                    }
                }
            },
            rope: RopeTable::of(m, o.ctx),
            rope_swa: RopeTable::of_sliding(m, o.ctx),
            exact_attention: false,
        }
    }

    fn bytes(&self) -> usize {
        let f = |v: &Vec<f32>| v.len() * 4;
        f(&self.x)
            + f(&self.xb)
            + f(&self.tmp)
            + f(&self.qkv)
            + f(&self.att)
            + f(&self.gate_up)
            + self.in_norm.bytes()
            + self.in_att.bytes()
            + self.in_ffn.bytes()
            + self.in_head.bytes()
            + f(&self.logits)
            + f(&self.rope.cos)
            + f(&self.rope.sin)
            + self.rope_swa.as_ref().map_or(0, |r| f(&r.cos) + f(&r.sin))
            + f(&self.moe.logits)
            + f(&self.moe.gathered)
            + f(&self.moe.out)
            + self.moe.routes.len() * 8
            + (self.moe.order.len() + self.moe.at.len() + self.moe.starts.len()) * 4
            + self.moe.input.as_ref().map_or(0, |i| i.bytes())
    }
}

/// Make the CPU kernels' repacked weight copies now (in parallel, once per model), not in the
/// first prompt's time.
fn prepare_weights(m: &Model) {
    let mut ws: Vec<&crate::kernels::QTensor> = vec![&m.output];
    for l in &m.layers {
        ws.extend([&l.q, &l.k, &l.v, &l.o]);
        match &l.moe {
            None => ws.extend([&l.gate, &l.up, &l.down]),
            Some(moe) => ws.extend(moe.experts.iter().flat_map(|(g, u, d)| [g, u, d])),
        }
    }
    crate::kernels::pool::pool().run(ws.len(), &|i| crate::kernels::prepare(ws[i]));
}

/// Bytes a session of these options allocates (KV cache + RunState), without allocating it.
pub fn session_bytes(m: &Model, o: &SessionOptions) -> u64 {
    let c = &m.config;
    let kv = c.kv_bytes_per_token_as(o.cache_k, o.cache_v) * o.ctx as u64;
    let b = o.batch as u64;
    let (d, q, kv_d, f, v) = (
        c.dim as u64,
        c.q_dim() as u64,
        c.kv_dim() as u64,
        c.ffn_dim as u64,
        c.vocab_size as u64,
    );
    // f32 activations; quantized inputs take at most ~1.2 bytes per value per format (two formats at most).
    let acts = 4 * b * (3 * d + q + 2 * kv_d + q + 3 * f) + 3 * b * (d + q + f);
    let logits = 4 * o.logit_rows as u64 * v;
    let tables = 1 + c.sliding.is_some() as u64;
    let rope = tables * 4 * o.ctx as u64 * c.head_dim as u64;
    let moe = c.experts.map_or(0, |x| {
        let routes = b * x.n_used as u64;
        4 * b * (x.n_expert as u64 + 2 * d) + 16 * routes + 4 * routes * d
    });
    kv + acts + logits + rope + moe
}

/// Block-quantized cache rows need a head dimension of whole 32-value blocks.
fn check_cache(m: &Model, o: &SessionOptions) -> Result<()> {
    let hd = m.config.head_dim;
    for t in [o.cache_k, o.cache_v] {
        if t != KvType::F16 && !hd.is_multiple_of(32) {
            return Err(Error::InvalidArgument(format!(
                "a {} KV cache needs a head dimension that is a multiple of 32 (this model: {hd})",
                t.name()
            )));
        }
    }
    Ok(())
}

/// One sequence's state: its KV cache and the tokens it holds (capacity = ctx, never grows past it).
pub struct Sequence {
    kv: KvCache,
    tokens: Vec<u32>,
    ctx: usize,
}

impl Sequence {
    fn new(m: &Model, ctx: usize, types: (KvType, KvType)) -> Self {
        Sequence {
            kv: KvCache::new(&m.config, ctx, types),
            tokens: Vec::with_capacity(ctx),
            ctx,
        }
    }

    /// Tokens now in the cache.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn pos(&self) -> usize {
        self.tokens.len()
    }

    pub fn ctx(&self) -> usize {
        self.ctx
    }

    pub fn kv_cache_bytes(&self) -> usize {
        self.kv.bytes()
    }

    /// Drop the cache entries after `n` tokens (to reuse a common prefix).
    pub fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
    }

    /// Copy the cache rows of positions `src..src + len` to `dst..dst + len` (any overlap), keys
    /// re-rotated for their new positions; the token list is not changed (see
    /// [`Runner::shift_kv`]).
    fn shift(
        &mut self,
        c: &crate::model::Config,
        run: &RunState,
        src: usize,
        dst: usize,
        len: usize,
    ) -> Result<()> {
        if src.max(dst) + len > self.ctx {
            return Err(Error::Context(format!(
                "a cache shift of {len} rows from {src} to {dst} exceeds the context of {}",
                self.ctx
            )));
        }
        if len == 0 || src == dst {
            return Ok(());
        }
        let hd = c.head_dim;
        let delta = dst as isize - src as isize;
        let mut row = vec![0f32; hd];
        for l in 0..c.n_layer {
            let rope = layer_rope(&run.rope, &run.rope_swa, c, l);
            let (mut k, mut v, cap) = self.kv.layer(l);
            for h in 0..c.n_kv_head {
                let base = h * cap;
                k.copy_rows(base + src, base + dst, len);
                v.copy_rows(base + src, base + dst, len);
                for r in base + dst..base + dst + len {
                    k.as_rows().load(r, &mut row);
                    rope.rotate_by(&mut row, delta, c.rope_style);
                    k.store(r, &row);
                }
            }
        }
        Ok(())
    }

    /// Append `tokens` whose cache rows are already in place (written by [`Sequence::shift`]).
    fn assume(&mut self, tokens: &[u32]) -> Result<()> {
        if self.tokens.len() + tokens.len() > self.ctx {
            return Err(Error::Context("assumed tokens exceed the context".into()));
        }
        self.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// Check that `tokens` may be appended.
    fn check(&self, tokens: &[u32], vocab: usize) -> Result<()> {
        check_tokens(self.pos(), self.ctx, tokens, vocab)
    }
}

/// Tokens whose gate/up outputs a dense FFN holds at once: a longer pass runs gate/up and the gated
/// activation in chunks of this many tokens, so the [rows × 2 ffn] f32 buffer is half a 512-token
/// batch's (18 MiB less on the 1.5B; the AMX kernels lose ~2% a call from 512 to 256 tokens).
/// A token's numbers do not depend on its chunk (one kernel per type at any row count).
const FFN_ROWS: usize = 256;

/// Run the model's layers over `parts` (each: a sequence and the tokens to append to it, all
/// together at most `run`'s batch size), leaving the final-normed hidden states of every new token,
/// in order, in `run.xb`. Matrix products run once over all rows; RoPE, the cache write and
/// attention run per sequence against its own cache.
fn run_layers(m: &Model, r: &mut RunState, parts: &mut [(&mut Sequence, &[u32])]) {
    let c = &m.config;
    let t: usize = parts.iter().map(|p| p.1.len()).sum();
    let (d, f) = (c.dim, c.ffn_dim);
    let l = QkvLayout {
        q_dim: c.q_dim(),
        kv_dim: c.kv_dim(),
        head_dim: c.head_dim,
    };
    let row = l.q_dim + 2 * l.kv_dim;
    use crate::kernels::profile::{time, Section};

    let embed = time(Section::Embed);
    for (i, &tok) in parts.iter().flat_map(|p| p.1.iter()).enumerate() {
        let x = &mut r.x[i * d..(i + 1) * d];
        m.embedding.dequantize_row(tok as usize, x);
        if c.embed_scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= c.embed_scale);
        }
    }
    ops::rmsnorm(
        &r.x[..t * d],
        &m.layers[0].attn_norm,
        c.rms_eps,
        &mut r.xb[..t * d],
    );
    drop(embed);
    for (li, layer) in m.layers.iter().enumerate() {
        let p = time(Section::Quantize);
        r.in_norm.set(&r.xb[..t * d], t);
        drop(p);
        let p = time(Section::Qkv);
        matmul(
            &[
                (&layer.q, 0),
                (&layer.k, l.q_dim),
                (&layer.v, l.q_dim + l.kv_dim),
            ],
            &r.in_norm,
            &mut r.qkv,
            row,
        );
        drop(p);
        let rope = layer_rope(&r.rope, &r.rope_swa, c, li);
        let mut first = 0;
        for (seq, toks) in parts.iter_mut() {
            let n = toks.len();
            let pos0 = seq.tokens.len();
            let (mut kc, mut vc, cap) = seq.kv.layer(li);
            let qkv = &mut r.qkv[first * row..(first + n) * row];
            let p = time(Section::RopeStore);
            ops::bias_rope_store(
                qkv,
                n,
                &l,
                layer.qkv_bias.as_deref(),
                layer
                    .qk_norm
                    .as_ref()
                    .map(|(q, k)| (&q[..], &k[..], c.rms_eps)),
                rope,
                c.rope_style,
                pos0,
                &mut kc,
                &mut vc,
                cap,
            );
            drop(p);
            let p = time(Section::Attention);
            attention::attention_masked(
                qkv,
                n,
                &l,
                c.n_head,
                c.n_kv_head,
                pos0,
                kc.as_rows(),
                vc.as_rows(),
                cap,
                attention::Mask {
                    scale: c.attn_scale,
                    window: c.window(li),
                },
                r.exact_attention,
                &mut r.att[first * l.q_dim..(first + n) * l.q_dim],
            );
            drop(p);
            first += n;
        }
        let p = time(Section::Quantize);
        r.in_att.set(&r.att[..t * l.q_dim], t);
        drop(p);
        let p = time(Section::Output);
        matmul(&[(&layer.o, 0)], &r.in_att, &mut r.tmp, d);
        drop(p);
        let post = layer.post_norms.as_ref();
        let p = time(Section::Norm);
        ops::add_rmsnorm(
            &mut r.x[..t * d],
            &r.tmp[..t * d],
            post.map(|p| &p.0[..]),
            &layer.ffn_norm,
            c.rms_eps,
            &mut r.xb[..t * d],
        );
        drop(p);
        if let (Some(moe), Some(x)) = (&layer.moe, c.experts) {
            let p = time(Section::Quantize);
            r.in_norm.set(&r.xb[..t * d], t);
            drop(p);
            let _p = time(Section::Moe);
            moe_ffn(moe, x, r, t, d, f);
        } else {
            // Gate/up and the gated activation in chunks of FFN_ROWS tokens; down over all rows.
            for c0 in (0..t).step_by(FFN_ROWS) {
                let n = (t - c0).min(FFN_ROWS);
                let p = time(Section::Quantize);
                r.in_norm.set(&r.xb[c0 * d..(c0 + n) * d], n);
                drop(p);
                let p = time(Section::GateUp);
                matmul(
                    &[(&layer.gate, 0), (&layer.up, f)],
                    &r.in_norm,
                    &mut r.gate_up,
                    2 * f,
                );
                drop(p);
                let p = time(Section::Activation);
                match c.activation {
                    Activation::Silu => ops::swiglu(&mut r.gate_up, n, f),
                    Activation::Gelu => ops::geglu(&mut r.gate_up, n, f),
                }
                drop(p);
                let p = time(Section::Quantize);
                r.in_ffn.set_at(&r.gate_up[..n * f], c0, n);
                drop(p);
            }
            let _p = time(Section::Down);
            matmul(&[(&layer.down, 0)], &r.in_ffn, &mut r.tmp, d);
        }
        let norm = match m.layers.get(li + 1) {
            Some(next) => &next.attn_norm,
            None => &m.output_norm,
        };
        let _p = time(Section::Norm);
        ops::add_rmsnorm(
            &mut r.x[..t * d],
            &r.tmp[..t * d],
            post.map(|p| &p.1[..]),
            norm,
            c.rms_eps,
            &mut r.xb[..t * d],
        );
    }
    for (seq, toks) in parts.iter_mut() {
        seq.tokens.extend_from_slice(toks);
    }
}

/// A mixture-of-experts FFN over the `t` normed rows in `r.xb` (already quantized in `r.in_norm`),
/// into `r.tmp`, as llama.cpp's `build_moe_ffn` computes it for Qwen3-MoE: softmax over the router's
/// logits, the `n_used` most probable experts, their probabilities divided by their sum; each
/// expert's SwiGLU FFN runs once over all the rows routed to it (its weights read once per step),
/// and a token's output is the sum of its experts' outputs times their weights, in the router's order.
fn moe_ffn(
    moe: &crate::model::Moe,
    x: crate::model::Experts,
    r: &mut RunState,
    t: usize,
    d: usize,
    f: usize,
) {
    let (ne, nu) = (x.n_expert, x.n_used);
    let s = &mut r.moe;
    matmul(&[(&moe.router, 0)], &r.in_norm, &mut s.logits, ne);
    s.starts.iter_mut().for_each(|v| *v = 0);
    for ti in 0..t {
        let lg = &mut s.logits[ti * ne..(ti + 1) * ne];
        let max = lg.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f64;
        for v in lg.iter_mut() {
            *v = (*v - max).exp();
            sum += *v as f64;
        }
        let inv = (1.0 / sum) as f32;
        lg.iter_mut().for_each(|v| *v *= inv);
        // The top n_used by probability (ties: the lower index), highest first.
        let routes = &mut s.routes[ti * nu..(ti + 1) * nu];
        for k in 0..nu {
            let mut best = usize::MAX;
            for (e, &p) in lg.iter().enumerate() {
                let taken = routes[..k].iter().any(|&(x, _)| x as usize == e);
                if !taken && (best == usize::MAX || p > lg[best]) {
                    best = e;
                }
            }
            routes[k] = (best as u32, lg[best]);
            s.starts[best + 1] += 1;
        }
        let total: f32 = routes.iter().map(|r| r.1).sum();
        let total = total.max(6.103_515_6e-5);
        routes.iter_mut().for_each(|r| r.1 /= total);
    }
    // Group the routes by expert (a counting sort).
    for e in 0..ne {
        s.starts[e + 1] += s.starts[e];
    }
    for a in 0..t * nu {
        let e = s.routes[a].0 as usize;
        let pos = s.starts[e] as usize;
        s.order[pos] = a as u32;
        s.at[a] = pos as u32;
        s.starts[e] += 1;
    }
    // `starts[e]` is now where expert e's group ends: shift back to starts.
    for e in (1..=ne).rev() {
        s.starts[e] = s.starts[e - 1];
    }
    s.starts[0] = 0;
    let input = s
        .input
        .as_mut()
        .expect("the MoE input is allocated with the experts");
    for (e, (gate, up, down)) in moe.experts.iter().enumerate() {
        let (j0, j1) = (s.starts[e] as usize, s.starts[e + 1] as usize);
        if j0 == j1 {
            continue;
        }
        let n = j1 - j0;
        for (i, &a) in s.order[j0..j1].iter().enumerate() {
            let ti = a as usize / nu;
            s.gathered[i * d..(i + 1) * d].copy_from_slice(&r.xb[ti * d..(ti + 1) * d]);
        }
        input.set(&s.gathered[..n * d], n);
        matmul(&[(gate, 0), (up, f)], input, &mut r.gate_up, 2 * f);
        ops::swiglu(&mut r.gate_up, n, f);
        r.in_ffn.set(&r.gate_up[..n * f], n);
        matmul(&[(down, 0)], &r.in_ffn, &mut s.out[j0 * d..j1 * d], d);
    }
    // Each token: its experts' outputs times their weights, summed in the router's order.
    for ti in 0..t {
        let o = &mut r.tmp[ti * d..(ti + 1) * d];
        for k in 0..nu {
            let a = ti * nu + k;
            let w = s.routes[a].1;
            let pos = s.at[a] as usize;
            let eo = &s.out[pos * d..(pos + 1) * d];
            if k == 0 {
                o.iter_mut().zip(eo).for_each(|(o, &v)| *o = v * w);
            } else {
                o.iter_mut().zip(eo).for_each(|(o, &v)| *o += v * w);
            }
        }
    }
}

/// The LM head over `rows` rows of `input`, into `logits` (soft-capped when the model says so).
fn lm_head(m: &Model, input: &QuantizedInput, logits: &mut [f32], rows: usize) {
    let v = m.config.vocab_size;
    let _p = crate::kernels::profile::time(crate::kernels::profile::Section::LmHead);
    matmul(&[(&m.output, 0)], input, logits, v);
    if let Some(cap) = m.config.logit_softcap {
        ops::softcap(&mut logits[..rows * v], cap);
    }
}

pub struct Session {
    pub model: Arc<Model>,
    pub options: SessionOptions,
    seq: Sequence,
    run: RunState,
}

impl Session {
    pub fn new(model: Arc<Model>, options: SessionOptions) -> Result<Self> {
        if options.ctx == 0 || options.batch == 0 || options.logit_rows == 0 {
            return Err(Error::InvalidArgument(
                "context, batch and logit rows must be > 0".into(),
            ));
        }
        check_cache(&model, &options)?;
        let seq = Sequence::new(&model, options.ctx, (options.cache_k, options.cache_v));
        let run = RunState::new(&model, &options);
        Ok(Session {
            seq,
            run,
            options,
            model,
        })
    }

    /// Tokens now in the cache.
    pub fn tokens(&self) -> &[u32] {
        &self.seq.tokens
    }

    /// Run every pass's attention with decode's arithmetic (llama.cpp's one-chunk kernel), so that a
    /// prompt's logits are bit-equal to decoding its tokens one by one (tests of the cache). By
    /// default passes of 64 rows or more use llama.cpp's tiled f32 arithmetic, as llama.cpp does.
    pub fn exact_attention(&mut self, on: bool) {
        self.run.exact_attention = on;
    }

    pub fn pos(&self) -> usize {
        self.seq.tokens.len()
    }

    /// Bytes allocated by this session (KV cache and run state).
    pub fn bytes(&self) -> usize {
        self.seq.kv.bytes() + self.run.bytes()
    }

    pub fn kv_cache_bytes(&self) -> usize {
        self.seq.kv.bytes()
    }

    /// Forget everything: the next forward starts at position 0. The buffers stay.
    pub fn reset(&mut self) {
        self.seq.tokens.clear();
    }

    /// Drop the cache entries after `n` tokens (to reuse a common prefix).
    pub fn truncate(&mut self, n: usize) {
        self.seq.truncate(n);
    }

    /// The logits of the last token of the last forward pass with `Logits::Last`.
    pub fn logits(&self) -> &[f32] {
        &self.run.logits[..self.model.config.vocab_size]
    }

    /// The last logits (mutable, for in-place penalties) and the cached tokens, borrowed together.
    pub fn logits_and_tokens(&mut self) -> (&mut [f32], &[u32]) {
        let v = self.model.config.vocab_size;
        (&mut self.run.logits[..v], &self.seq.tokens)
    }

    /// Run `tokens` through the model after what the cache already holds.
    pub fn forward(&mut self, tokens: &[u32], mut logits: Logits) -> Result<()> {
        self.seq.check(tokens, self.model.config.vocab_size)?;
        let (b, uniform) = (self.options.batch, Runner::uniform_pass(self));
        let mut done = 0;
        while done < tokens.len() {
            let n = crate::stream::next_pass(tokens.len() - done, b, uniform);
            let chunk = &tokens[done..done + n];
            let last = done + chunk.len() == tokens.len();
            match logits.start() {
                None if last && matches!(logits, Logits::Last) => {
                    self.forward_batch(chunk, Some(None))
                }
                None => self.forward_batch(chunk, None),
                Some(from) if from.saturating_sub(done) >= chunk.len() => {
                    self.forward_batch(chunk, None)
                }
                Some(from) if logits.hidden() => {
                    // The final norm's rows (run.xb), no head.
                    self.forward_batch(chunk, None);
                    let d = self.model.config.dim;
                    for i in from.saturating_sub(done)..chunk.len() {
                        logits.give_hidden(done + i, &self.run.xb[i * d..(i + 1) * d]);
                    }
                }
                Some(from) => {
                    let mut cb = |i: usize, l: &[f32]| logits.give(done + i, l);
                    self.forward_batch(chunk, Some(Some((from.saturating_sub(done), &mut cb))))
                }
            }
            done += chunk.len();
        }
        Ok(())
    }

    /// One batch (≤ options.batch tokens). `head`: None = no logits, Some(None) = last token's into
    /// `run.logits`, Some(Some((from, f))) = those of positions from `from` on through `f`.
    #[allow(clippy::type_complexity)]
    fn forward_batch(
        &mut self,
        tokens: &[u32],
        head: Option<Option<(usize, &mut dyn FnMut(usize, &[f32]))>>,
    ) {
        let m = &*self.model;
        let c = &m.config;
        let t = tokens.len();
        let d = c.dim;
        let r = &mut self.run;
        run_layers(m, r, &mut [(&mut self.seq, tokens)]);

        let v = c.vocab_size;
        match head {
            None => {}
            Some(None) => {
                r.in_head.set(&r.xb[(t - 1) * d..t * d], 1);
                lm_head(m, &r.in_head, &mut r.logits, 1);
            }
            Some(Some((from, cb))) => {
                let rows = self.options.logit_rows;
                for r0 in (from..t).step_by(rows) {
                    let n = rows.min(t - r0);
                    r.in_head.set(&r.xb[r0 * d..(r0 + n) * d], n);
                    lm_head(m, &r.in_head, &mut r.logits, n);
                    for i in 0..n {
                        cb(r0 + i, &r.logits[i * v..(i + 1) * v]);
                    }
                }
            }
        }
    }
}

/// Rows of logits a batch computes per LM-head pass at least.
const HEAD_ROWS: usize = 16;

/// Several sequences ("slots") decoded together: one RunState for all of them, one KV cache each.
/// A step appends tokens to any subset of the slots (one token for a decoding slot, a prompt chunk
/// for a prefilling one) and runs every matrix product once over all the new rows, so that the
/// weights are read once per step instead of once per sequence (continuous batching).
pub struct Batch {
    pub model: Arc<Model>,
    slots: Vec<Sequence>,
    run: RunState,
    batch: usize,
    /// Which slot each logits row of the last step belongs to.
    logit_slots: Vec<usize>,
    /// Staging for the rows that get logits (contiguous for the LM head).
    head_rows: Vec<f32>,
}

impl Batch {
    /// What the slots' KV caches store for K and V.
    pub fn cache(&self) -> (KvType, KvType) {
        self.slots[0].kv.types
    }

    /// `slots` sequences of `ctx` tokens each; a step processes at most `batch` tokens in all.
    pub fn new(model: Arc<Model>, slots: usize, ctx: usize, batch: usize) -> Result<Self> {
        Self::with_cache(model, slots, ctx, batch, (KvType::F16, KvType::F16))
    }

    /// As [`Batch::new`], the KV cache storing K and V as `cache`.
    pub fn with_cache(
        model: Arc<Model>,
        slots: usize,
        ctx: usize,
        batch: usize,
        cache: (KvType, KvType),
    ) -> Result<Self> {
        if slots == 0 || slots > 64 || ctx == 0 || batch < slots {
            return Err(Error::InvalidArgument(format!(
                "a batch needs 1..=64 slots, a context > 0 and room for one token per slot (slots {slots}, ctx {ctx}, batch {batch})"
            )));
        }
        // Logit rows per LM-head pass: one per slot, and at least a speculative verify's worth
        // (reading the head once per row would cost more than the proposals save).
        let rows = slots.max(HEAD_ROWS).min(batch);
        let options = SessionOptions {
            ctx,
            batch,
            logit_rows: rows,
            cache_k: cache.0,
            cache_v: cache.1,
        };
        check_cache(&model, &options)?;
        let run = RunState::new(&model, &options);
        let seqs = (0..slots)
            .map(|_| Sequence::new(&model, ctx, cache))
            .collect();
        let d = model.config.dim;
        Ok(Batch {
            slots: seqs,
            run,
            batch,
            logit_slots: Vec::with_capacity(slots),
            head_rows: vec![0f32; rows * d],
            model,
        })
    }

    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    pub fn max_tokens_per_step(&self) -> usize {
        self.batch
    }

    pub fn slot(&self, i: usize) -> &Sequence {
        &self.slots[i]
    }

    pub fn slot_mut(&mut self, i: usize) -> &mut Sequence {
        &mut self.slots[i]
    }

    /// Bytes of every KV cache and the run state.
    pub fn bytes(&self) -> usize {
        self.slots.iter().map(|s| s.kv.bytes()).sum::<usize>() + self.run.bytes()
    }

    /// One step over `parts` (distinct slots, ≤ `max_tokens_per_step` tokens in all). Afterwards
    /// `logits(slot)` holds the last-token logits of each part that asked for them (`Logits::Last`);
    /// `Logits::All` parts get every position's through their callback during the step.
    pub fn step(&mut self, parts: &mut [Part]) -> Result<()> {
        let total: usize = parts.iter().map(|p| p.tokens.len()).sum();
        if parts.is_empty() || total > self.batch {
            return Err(Error::InvalidArgument(format!(
                "a batch step takes 1..={} tokens, got {total}",
                self.batch
            )));
        }
        let n = self.slots.len();
        let mut seen = 0u128;
        for p in parts.iter() {
            if p.slot >= n || p.slot >= 128 || seen & (1 << p.slot) != 0 {
                return Err(Error::InvalidArgument(format!(
                    "slot {} is out of range or repeated",
                    p.slot
                )));
            }
            seen |= 1 << p.slot;
            self.slots[p.slot].check(p.tokens, self.model.config.vocab_size)?;
        }
        let m = &*self.model;
        let d = m.config.dim;
        // Disjoint &mut borrows of the slots, in the order of `parts`.
        let mut refs: Vec<Option<&mut Sequence>> = self.slots.iter_mut().map(Some).collect();
        let mut work: Vec<(&mut Sequence, &[u32])> = parts
            .iter()
            .map(|p| (refs[p.slot].take().expect("distinct slots"), p.tokens))
            .collect();
        run_layers(m, &mut self.run, &mut work);
        drop(work);

        // Every position's logits of `All` parts first (through the head in groups of `slots`
        // rows), then the last positions' (which stay in `run.logits` for `sample_slot`).
        let v = m.config.vocab_size;
        let cap = self.head_rows.len() / d;
        let mut row = 0;
        for p in parts.iter_mut() {
            let start = row;
            row += p.tokens.len();
            if p.logits.hidden() {
                let from = p.logits.start().unwrap_or(0);
                for i in from..p.tokens.len() {
                    let src = (start + i) * d;
                    p.logits.give_hidden(i, &self.run.xb[src..src + d]);
                }
                continue;
            }
            if let Some(from) = p.logits.start() {
                let mut i = from;
                while i < p.tokens.len() {
                    let k = cap.min(p.tokens.len() - i);
                    for j in 0..k {
                        let src = (start + i + j) * d;
                        self.head_rows[j * d..(j + 1) * d]
                            .copy_from_slice(&self.run.xb[src..src + d]);
                    }
                    let r = &mut self.run;
                    r.in_head.set(&self.head_rows[..k * d], k);
                    lm_head(m, &r.in_head, &mut r.logits, k);
                    for j in 0..k {
                        p.logits.give(i + j, &r.logits[j * v..(j + 1) * v]);
                    }
                    i += k;
                }
            }
        }
        self.logit_slots.clear();
        let mut row = 0;
        for p in parts.iter() {
            row += p.tokens.len();
            if matches!(p.logits, Logits::Last) {
                let k = self.logit_slots.len();
                self.head_rows[k * d..(k + 1) * d]
                    .copy_from_slice(&self.run.xb[(row - 1) * d..row * d]);
                self.logit_slots.push(p.slot);
            }
        }
        let k = self.logit_slots.len();
        if k > 0 {
            let r = &mut self.run;
            r.in_head.set(&self.head_rows[..k * d], k);
            lm_head(m, &r.in_head, &mut r.logits, k);
        }
        Ok(())
    }

    /// The logits of `slot` from the last step (mutable, for in-place penalties) and its tokens.
    pub fn logits_and_tokens(&mut self, slot: usize) -> Option<(&mut [f32], &[u32])> {
        let k = self.logit_slots.iter().position(|&s| s == slot)?;
        let v = self.model.config.vocab_size;
        Some((
            &mut self.run.logits[k * v..(k + 1) * v],
            &self.slots[slot].tokens,
        ))
    }
}

impl Runner for Session {
    fn ctx(&self) -> usize {
        self.options.ctx
    }
    fn hidden_states(&self) -> bool {
        true
    }
    fn sibling(&self, ctx: usize) -> Result<Box<dyn Runner>> {
        let options = SessionOptions {
            ctx,
            batch: self.options.batch.min(ctx),
            ..self.options.clone()
        };
        Ok(Box::new(Session::new(self.model.clone(), options)?))
    }
    fn batch_sibling(&self, slots: usize, ctx: usize, step: usize) -> Result<Box<dyn Runner>> {
        let cache = (self.options.cache_k, self.options.cache_v);
        Ok(Box::new(Batch::with_cache(
            self.model.clone(),
            slots,
            ctx,
            step,
            cache,
        )?))
    }
    fn uniform_pass(&self) -> usize {
        uniform_rows(self.seq.kv.types, self.run.exact_attention)
    }
    fn max_step_tokens(&self) -> usize {
        self.options.ctx
    }
    fn slot_tokens(&self, _slot: usize) -> &[u32] {
        &self.seq.tokens
    }
    fn truncate_slot(&mut self, _slot: usize, n: usize) {
        self.seq.truncate(n)
    }
    fn can_shift_kv(&self) -> bool {
        true
    }
    fn shift_kv(&mut self, _slot: usize, src: usize, dst: usize, len: usize) -> Result<()> {
        let c = &self.model.config;
        self.seq.shift(c, &self.run, src, dst, len)
    }
    fn assume_tokens(&mut self, _slot: usize, tokens: &[u32]) -> Result<()> {
        self.seq.assume(tokens)
    }
    fn step(&mut self, parts: &mut [Part]) -> Result<()> {
        let p = single(parts)?;
        let logits = std::mem::replace(&mut p.logits, Logits::None);
        self.forward(p.tokens, logits)
    }
    /// The next token from the last logits, with the cached tokens as the penalty history.
    fn sample_slot(&mut self, _slot: usize, sampler: &mut Sampler) -> Result<u32> {
        let (logits, tokens) = self.logits_and_tokens();
        sampler.sample(logits, tokens)
    }
    fn memory(&self) -> Memory {
        Memory {
            kv_cache: self.seq.kv.bytes(),
            buffers: self.run.bytes(),
        }
    }
}

impl Runner for Batch {
    fn hidden_states(&self) -> bool {
        true
    }
    fn slots(&self) -> usize {
        self.slots.len()
    }
    fn sibling(&self, ctx: usize) -> Result<Box<dyn Runner>> {
        Ok(Box::new(Batch::with_cache(
            self.model.clone(),
            1,
            ctx,
            self.batch,
            self.cache(),
        )?))
    }
    fn batch_sibling(&self, slots: usize, ctx: usize, step: usize) -> Result<Box<dyn Runner>> {
        Ok(Box::new(Batch::with_cache(
            self.model.clone(),
            slots,
            ctx,
            step,
            self.cache(),
        )?))
    }
    fn ctx(&self) -> usize {
        self.slots[0].ctx
    }
    fn uniform_pass(&self) -> usize {
        uniform_rows(self.cache(), self.run.exact_attention)
    }
    fn max_step_tokens(&self) -> usize {
        self.batch
    }
    fn slot_tokens(&self, slot: usize) -> &[u32] {
        &self.slots[slot].tokens
    }
    fn truncate_slot(&mut self, slot: usize, n: usize) {
        self.slots[slot].truncate(n)
    }
    fn can_shift_kv(&self) -> bool {
        true
    }
    fn shift_kv(&mut self, slot: usize, src: usize, dst: usize, len: usize) -> Result<()> {
        let c = &self.model.config;
        self.slots[slot].shift(c, &self.run, src, dst, len)
    }
    fn assume_tokens(&mut self, slot: usize, tokens: &[u32]) -> Result<()> {
        self.slots[slot].assume(tokens)
    }
    fn can_copy_prefix(&self) -> bool {
        true
    }
    fn copy_prefix(&mut self, src: usize, dst: usize, n: usize) -> Result<()> {
        let slots = self.slots.len();
        if src >= slots || dst >= slots || src == dst || n > self.slots[src].tokens.len() {
            return Err(Error::InvalidArgument(format!(
                "cannot copy {n} tokens from slot {src} to slot {dst}"
            )));
        }
        let (a, b) = self.slots.split_at_mut(src.max(dst));
        let (from, to) = if src < dst {
            (&a[src], &mut b[0])
        } else {
            (&b[0], &mut a[dst])
        };
        to.kv.copy_prefix_from(&from.kv, n);
        to.tokens.clear();
        to.tokens.extend_from_slice(&from.tokens[..n]);
        Ok(())
    }
    fn step(&mut self, parts: &mut [Part]) -> Result<()> {
        Batch::step(self, parts)
    }
    fn sample_slot(&mut self, slot: usize, sampler: &mut Sampler) -> Result<u32> {
        let (logits, tokens) = self.logits_and_tokens(slot).ok_or_else(|| {
            Error::InvalidArgument(format!("slot {slot} has no logits from the last step"))
        })?;
        sampler.sample(logits, tokens)
    }
    fn memory(&self) -> Memory {
        Memory {
            kv_cache: self.slots.iter().map(|s| s.kv.bytes()).sum(),
            buffers: self.run.bytes(),
        }
    }
}

/// Threads the CPU kernels use (all logical cores unless set); only the first call, before any
/// kernel runs, counts (false after that).
pub fn set_threads(n: usize) -> bool {
    crate::kernels::pool::set_threads(n)
}

pub fn threads() -> usize {
    crate::kernels::pool::pool().threads()
}

/// Kernel dispatches (parallel regions) issued so far, for `mens bench`.
pub fn dispatches() -> u64 {
    crate::kernels::DISPATCHES.load(std::sync::atomic::Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{synth_model, SynthSpec};

    /// Every position's logits from a batch step (beside another slot's prompt chunk) equal a single
    /// session's, bit for bit, in groups larger than the head's row capacity (the speculative
    /// verify pass in the server).
    #[test]
    fn batch_all_logits_equal_a_session() {
        let g = crate::gguf::Gguf::from_bytes(synth_model(&SynthSpec::tiny_qwen2())).unwrap();
        let (model, _, _) = crate::load::from_gguf(g).unwrap();
        let model = Arc::new(model);
        // 20 positions: more than one LM-head pass (HEAD_ROWS).
        let toks: Vec<u32> = (0..20).map(|i| 5 + i * 11).collect();
        let mut want = Vec::new();
        let mut s = Session::new(
            model.clone(),
            SessionOptions {
                ctx: 64,
                batch: 64,
                logit_rows: 4,
                ..Default::default()
            },
        )
        .unwrap();
        s.forward(
            &toks,
            Logits::All {
                from: 2,
                f: &mut |i, l| want.push((i, l.to_vec())),
            },
        )
        .unwrap();
        let mut b = Batch::new(model, 2, 64, 32).unwrap();
        let mut got = Vec::new();
        let other = [7u32, 8, 9];
        let mut f = |i: usize, l: &[f32]| got.push((i, l.to_vec()));
        b.step(&mut [
            Part {
                slot: 1,
                tokens: &other,
                logits: Logits::Last,
            },
            Part {
                slot: 0,
                tokens: &toks,
                logits: Logits::All { from: 2, f: &mut f },
            },
        ])
        .unwrap();
        assert_eq!(got.len(), toks.len() - 2);
        assert!(got == want, "batch logits differ from the session's");
        assert!(b.logits_and_tokens(1).is_some());
        // Logits::Argmax: each position's argmax, in the session and in the batch.
        let picks: Vec<(usize, u32)> = want
            .iter()
            .map(|(i, l)| (*i, crate::sample::argmax(l)))
            .collect();
        s.truncate(0);
        let mut got = Vec::new();
        s.forward(
            &toks,
            Logits::Argmax {
                from: 2,
                f: &mut |i, t| got.push((i, t)),
            },
        )
        .unwrap();
        assert_eq!(got, picks, "session picks");
        b.truncate_slot(0, 0);
        let mut got = Vec::new();
        let mut f = |i: usize, t: u32| got.push((i, t));
        b.step(&mut [Part {
            slot: 0,
            tokens: &toks,
            logits: Logits::Argmax { from: 2, f: &mut f },
        }])
        .unwrap();
        assert_eq!(got, picks, "batch picks");
    }

    /// A cached key moved by `shift` equals the key computed at the new position, to f16 rounding:
    /// layer 0's keys depend only on the token and its position, so there the two must agree; values
    /// move unchanged. Checked for a move right and a move left.
    #[test]
    fn shifted_keys_equal_keys_computed_at_the_new_position() {
        let g = crate::gguf::Gguf::from_bytes(synth_model(&SynthSpec::tiny_qwen2())).unwrap();
        let (model, _, _) = crate::load::from_gguf(g).unwrap();
        let model = Arc::new(model);
        let c = model.config.clone();
        let opts = SessionOptions {
            ctx: 64,
            batch: 64,
            logit_rows: 1,
            ..Default::default()
        };
        let text: Vec<u32> = (0..12).map(|i| 3 + i * 7).collect();
        let pad = [1u32, 2, 5, 9, 11];
        for (before, after) in [(&[][..], &pad[..]), (&pad[..], &[][..])] {
            // `a` holds `before + text`, then moves `text` to where it sits in `after + text`.
            let mut a = Session::new(model.clone(), opts.clone()).unwrap();
            let mut b = Session::new(model.clone(), opts.clone()).unwrap();
            let seq_a: Vec<u32> = before.iter().chain(&text).copied().collect();
            let seq_b: Vec<u32> = after.iter().chain(&text).copied().collect();
            a.forward(&seq_a, Logits::None).unwrap();
            b.forward(&seq_b, Logits::None).unwrap();
            let (src, dst, n) = (before.len(), after.len(), text.len());
            a.shift_kv(0, src, dst, n).unwrap();
            let hd = c.head_dim;
            let (ka, va, cap) = a.seq.kv.layer(0);
            let (ka, va) = (ka.as_rows().f16().to_vec(), va.as_rows().f16().to_vec());
            let (kb, vb, _) = b.seq.kv.layer(0);
            let (kb, vb) = (kb.as_rows().f16(), vb.as_rows().f16());
            let mut worst = 0f32;
            for h in 0..c.n_kv_head {
                for p in dst..dst + n {
                    let r = h * cap * hd + p * hd..h * cap * hd + (p + 1) * hd;
                    assert_eq!(&va[r.clone()], &vb[r.clone()], "values move unchanged");
                    for (x, y) in ka[r.clone()].iter().zip(&kb[r]) {
                        let (x, y) = (x.to_f32(), y.to_f32());
                        worst = worst.max((x - y).abs() / y.abs().max(1.0));
                    }
                }
            }
            // Two f16 roundings (store, then store after the rotation) and f32 rotation.
            assert!(worst < 2e-3, "moved keys differ by {worst}");
        }
    }
}
