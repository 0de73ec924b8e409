//! Causal attention against the f16 KV cache, written to give the same numbers as llama.cpp's CPU
//! flash-attention kernel (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`, its path for decode
//! and for short prompts), the oracle of the tests:
//! - Q is rounded to f16 (done when Q is stored, `ops::bias_rope_store`);
//! - Q·K is summed in the order of ggml's AVX-512 `ggml_vec_dot_f16`: four 16-lane accumulators
//!   over 64-wide steps, reduced 0+2, 1+3, 0+1, then lanes at distance 8, 4, 2, 1; any tail of the
//!   head dimension beyond a multiple of 64 added in f64;
//! - an online softmax over the keys in order, with glibc's `expf` (ported here, `expf`, so that the
//!   vector path can run it 8 lanes at a time with the same bits), and the V accumulator rounded to
//!   f16 after every update; the running sum as `S = S·ms + vs` with one rounding (an FMA).
//!
//! `run_ref` is the plain reference; `attend_avx2` gives the same bits (tested): Q·K and `expf` for
//! 8 keys at a time, then the sequential accumulator updates, with no call in the loop (a call would
//! spill the accumulators). On CPUs with AVX-512 its 512-bit twin `attend512_heads` runs instead
//! (`wide`), with the same bits.

use super::count_dispatch;
use super::kv::KvRows;
use super::ops::{QkvLayout, MAX_HEAD_DIM};
use crate::model::KvType;
use half::f16;

/// Causal attention of `t` query rows (at positions pos0..pos0+t) against the f16 cache, head-major
/// ([kv head][cap][head_dim]), one pass per (token, head), so it needs no score buffer. GQA: query
/// head h reads KV head h / (n_head / n_kv_head) straight from the cache, without copies.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    qkv: &[f32],
    t: usize,
    l: &QkvLayout,
    n_head: usize,
    n_kv_head: usize,
    pos0: usize,
    k_cache: KvRows,
    v_cache: KvRows,
    cap: usize,
    out: &mut [f32],
) {
    let scale = 1.0 / (l.head_dim as f32).sqrt();
    let m = Mask {
        scale,
        window: usize::MAX,
    };
    attention_masked(
        qkv, t, l, n_head, n_kv_head, pos0, k_cache, v_cache, cap, m, false, out,
    )
}

/// What a layer's attention sees: scores are Q·K · `scale`; a query at position p sees the keys
/// of positions p + 1 - `window` ..= p (`usize::MAX`: all of them). Keys outside the window are
/// skipped, as llama.cpp's kernel skips masked ones.
#[derive(Clone, Copy, Debug)]
pub struct Mask {
    pub scale: f32,
    pub window: usize,
}

/// [`attention`] with a scale and a sliding window. A pass of 64 rows or more over an f16 cache runs
/// llama.cpp's tiled f32 arithmetic (`prompt_attention`) unless `exact`: then every pass runs the
/// one-chunk kernel's, and a prompt's rows are bit-equal to decoding its tokens one by one.
#[allow(clippy::too_many_arguments)]
pub fn attention_masked(
    qkv: &[f32],
    t: usize,
    l: &QkvLayout,
    n_head: usize,
    n_kv_head: usize,
    pos0: usize,
    k_cache: KvRows,
    v_cache: KvRows,
    cap: usize,
    mask: Mask,
    exact: bool,
    out: &mut [f32],
) {
    count_dispatch();
    let f16_cache = k_cache.t == KvType::F16 && v_cache.t == KvType::F16;
    let long = t >= super::prompt_attention::FROM;
    if f16_cache && long && !exact && super::prompt_attention::allowed() {
        return super::prompt_attention::attention(
            qkv, t, l, n_head, n_kv_head, pos0, k_cache, v_cache, cap, mask, out,
        );
    }
    if f16_cache && t >= TILE_FROM && tiling() {
        return tiled(
            qkv, t, l, n_head, n_kv_head, pos0, k_cache, v_cache, cap, mask, out,
        );
    }
    let hd = l.head_dim;
    let group = n_head / n_kv_head;
    let row = l.q_dim + 2 * l.kv_dim;
    let scale = mask.scale;
    let path = Path::get(hd);
    // A task is a run of query heads of one KV group for one token: the heads of a group read the
    // same K/V rows, so one thread reads them from memory once and then from its own cache. Groups
    // are split only when there are fewer (token, group) pairs than threads.
    let threads = super::pool::pool().threads();
    let parts = threads.div_ceil(t * n_kv_head).clamp(1, group);
    let per = group.div_ceil(parts);
    let parts = group.div_ceil(per);
    // Task j: token ti, KV head kvh, query heads h0..h0+len (contiguous in `out`).
    let task = |j: usize| {
        let (ti, kvh, c) = (j / (n_kv_head * parts), j / parts % n_kv_head, j % parts);
        (ti, kvh, kvh * group + c * per, per.min(group - c * per))
    };
    let span = |j: usize| {
        let (ti, _, h0, len) = task(j);
        (ti * l.q_dim + h0 * hd, len * hd)
    };
    let work = |j: usize, o: &mut [f32]| {
        let (ti, kvh, h0, _) = task(j);
        let end = pos0 + ti + 1;
        assert!(end <= cap);
        let lo = end.saturating_sub(mask.window);
        let (n, first) = (end - lo, kvh * cap + lo);
        if !f16_cache {
            // The task's query heads together: each cache row is read and dequantized once.
            let qs = &qkv[ti * row + h0 * hd..ti * row + h0 * hd + o.len()];
            let (k, v) = (k_cache.rows(first, n), v_cache.rows(first, n));
            for (q, o) in qs.chunks(GROUP * hd).zip(o.chunks_mut(GROUP * hd)) {
                attend_quant(q, k, v, n, scale, o);
            }
            return;
        }
        let k = &k_cache.f16()[first * hd..(first + n) * hd];
        let v = &v_cache.f16()[first * hd..(first + n) * hd];
        let q = |h: usize| &qkv[ti * row + (h0 + h) * hd..ti * row + (h0 + h + 1) * hd];
        // As many heads at once as the path serves best ([`Path::heads_at_once`]), a run each.
        let mut runs = [0f32; 4 * (RUN_HEADER + MAX_HEAD_DIM)];
        let sl = RUN_HEADER + hd;
        let most = path.heads_at_once(hd);
        for (c, o) in o.chunks_mut(most * hd).enumerate() {
            let runs = &mut runs[..o.len() / hd * sl];
            runs.chunks_exact_mut(sl).for_each(run_start);
            run_heads(path, most, &|h| q(c * most + h), k, v, n, scale, runs);
            for (st, o) in runs.chunks_exact(sl).zip(o.chunks_exact_mut(hd)) {
                run_finish(st, o);
            }
        }
    };
    let tasks = t * n_kv_head * parts;
    let out = &mut out[..t * l.q_dim];
    if t * n_head * (pos0 + t) < 4096 {
        for j in 0..tasks {
            let (at, len) = span(j);
            work(j, &mut out[at..at + len]);
        }
    } else {
        let base = super::OutPtr(out.as_mut_ptr());
        super::pool::pool().run(tasks, &|j| {
            let (at, len) = span(j);
            // SAFETY: the tasks' spans are disjoint and inside `out`.
            let o = unsafe { std::slice::from_raw_parts_mut(base.ptr().add(at), len) };
            work(j, o);
        });
    }
}

/// Query rows from which [`attention_masked`] tiles (a prompt pass, a long verify).
const TILE_FROM: usize = 4;
/// Keys a tile holds: 64 rows of K and V stay in L1/L2 while every query of a block reads them.
const TILE_KEYS: usize = 64;
/// Tokens of a query block at most (each with the group's heads).
const TILE_TOKENS: usize = 16;

/// Runs `work(kvh, t0, t1)` for every KV head and block of at most `most` of the pass's `t`
/// tokens: blocks small enough that every thread gets a few tasks, on the pool unless the pass is
/// small. The tiled passes' schedule (here and in `prompt_attention`).
pub(super) fn token_blocks(
    t: usize,
    n_kv_head: usize,
    n_head: usize,
    pos0: usize,
    most: usize,
    work: &(dyn Fn(usize, usize, usize) + Sync),
) {
    let threads = super::pool::pool().threads();
    let bt = (t * n_kv_head / (4 * threads)).clamp(1, most);
    let tasks = t.div_ceil(bt) * n_kv_head;
    let task = |j: usize| {
        let (kvh, blk) = (j % n_kv_head, j / n_kv_head);
        work(kvh, blk * bt, ((blk + 1) * bt).min(t))
    };
    if t * n_head * (pos0 + t) < 4096 {
        (0..tasks).for_each(task);
    } else {
        super::pool::pool().run(tasks, &task);
    }
}

/// False when `MENS_NO_TILE` is set: prompt passes take the per-token path (same bits), for A/B
/// runs in one binary.
fn tiling() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("MENS_NO_TILE").is_none())
}

/// `runs` (H runs of `sl` values each, in order) as H slices.
fn split_runs<const H: usize>(runs: &mut [f32], sl: usize) -> [&mut [f32]; H] {
    let mut it = runs.chunks_exact_mut(sl);
    std::array::from_fn(|_| it.next().unwrap())
}

thread_local! {
    /// A worker's runs of one query block (grows to its largest block once).
    static RUNS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`attention_masked`] for a prompt pass over an f16 cache, tiled: a task is one KV head and a
/// block of tokens, with every query head of the group; it walks the keys in tiles of
/// [`TILE_KEYS`], and each (token, head) run takes the tile's keys it sees before the next tile
/// is read. Each key tile is read from memory once per block, not once per (token, head), and
/// each run's arithmetic is the per-token path's (keys in order, the state carried between
/// tiles), so the bits are the same (tested).
#[allow(clippy::too_many_arguments)]
fn tiled(
    qkv: &[f32],
    t: usize,
    l: &QkvLayout,
    n_head: usize,
    n_kv_head: usize,
    pos0: usize,
    k_cache: KvRows,
    v_cache: KvRows,
    cap: usize,
    mask: Mask,
    out: &mut [f32],
) {
    let hd = l.head_dim;
    let group = n_head / n_kv_head;
    let row = l.q_dim + 2 * l.kv_dim;
    let path = Path::get(hd);
    let sl = RUN_HEADER + hd;
    let (kf, vf) = (k_cache.f16(), v_cache.f16());
    assert!(pos0 + t <= cap && out.len() >= t * l.q_dim);
    let base = super::OutPtr(out.as_mut_ptr());
    let work = |kvh: usize, t0: usize, t1: usize| {
        // Token ti sees keys lo(ti) .. pos0 + ti + 1 of this KV head.
        let end = |ti: usize| pos0 + ti + 1;
        let lo = |ti: usize| end(ti).saturating_sub(mask.window);
        RUNS.with(|r| {
            let mut runs = r.borrow_mut();
            let need = (t1 - t0) * group * sl;
            if runs.len() < need {
                runs.resize(need, 0.0);
            }
            let runs = &mut runs[..need];
            for st in runs.chunks_exact_mut(sl) {
                run_start(st);
            }
            let q = |ti: usize, h: usize| {
                let at = ti * row + (kvh * group + h) * hd;
                &qkv[at..at + hd]
            };
            let mut k0 = lo(t0);
            while k0 < end(t1 - 1) {
                let k1 = (k0 + TILE_KEYS).min(end(t1 - 1));
                for ti in t0..t1 {
                    let (a, b) = (lo(ti).max(k0), end(ti).min(k1));
                    if a >= b {
                        continue;
                    }
                    let first = kvh * cap + a;
                    let (k, v) = (
                        &kf[first * hd..(first + b - a) * hd],
                        &vf[first * hd..(first + b - a) * hd],
                    );
                    let runs = &mut runs[(ti - t0) * group * sl..(ti - t0 + 1) * group * sl];
                    let (n, sc) = (b - a, mask.scale);
                    run_heads(
                        path,
                        path.heads_at_once(hd),
                        &|h| q(ti, h),
                        k,
                        v,
                        n,
                        sc,
                        runs,
                    );
                }
                k0 = k1;
            }
            for ti in t0..t1 {
                for h in 0..group {
                    let at = ti * l.q_dim + (kvh * group + h) * hd;
                    // SAFETY: (token, head) spans are disjoint across tasks and inside `out`.
                    let o = unsafe { std::slice::from_raw_parts_mut(base.ptr().add(at), hd) };
                    let st = &runs[((ti - t0) * group + h) * sl..((ti - t0) * group + h + 1) * sl];
                    run_finish(st, o);
                }
            }
        });
    };
    token_blocks(t, n_kv_head, n_head, pos0, TILE_TOKENS, &work);
}

/// The runs `runs` (one a head, [`RUN_HEADER`] + hd values each) of heads `q(0)`, `q(1)`, … of
/// one KV group, `n` more keys each: at most `most` heads a pass (4, then 3, 2, 1 for what is left).
#[allow(clippy::too_many_arguments)]
fn run_heads<'q>(
    path: Path,
    most: usize,
    q: &dyn Fn(usize) -> &'q [f32],
    k: &[f16],
    v: &[f16],
    n: usize,
    scale: f32,
    runs: &mut [f32],
) {
    let hd = q(0).len();
    let sl = RUN_HEADER + hd;
    let heads = runs.len() / sl;
    let (mut h, mut rest) = (0, runs);
    while h < heads {
        let take = (heads - h).min(most).min(4);
        let (now, r) = rest.split_at_mut(take * sl);
        match take {
            4 => {
                let qs = [q(h), q(h + 1), q(h + 2), q(h + 3)];
                path.run_n(qs, k, v, hd, n, scale, split_runs(now, sl));
            }
            3 => path.run_n(
                [q(h), q(h + 1), q(h + 2)],
                k,
                v,
                hd,
                n,
                scale,
                split_runs(now, sl),
            ),
            2 => path.run_n([q(h), q(h + 1)], k, v, hd, n, scale, split_runs(now, sl)),
            _ => path.run(q(h), k, v, hd, n, scale, now),
        }
        (rest, h) = (r, h + take);
    }
}

/// Which implementation runs for a head dimension on this CPU.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    Reference,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// The AVX2 path's arithmetic on 512-bit vectors ([`attend512_heads`]), where [`wide`].
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// Whether attention runs on 512-bit vectors: on CPUs with AVX-512 (the VNNI kernel level), unless
/// `MENS_ATTN=256` (A/B runs in one binary). Measured in real steps, 2 threads (docs/benchmarks.md,
/// session 55): a Zen 5 VM's 1.5B verify of 8 at 512 keys 2.45–2.49 → 2.18–2.19 decode steps; an
/// Intel Xeon with AMX, the synthetic 1.5B, decode after 2048 tokens faster in each of three
/// alternations (11.1–12.8 → 13.0–13.4 tokens/s) and a verify of 8 at 1024 keys 3.08–3.23 →
/// 2.18–2.78 steps; a Zen 4 VM (session 56), attention alone 27–30% faster for head size 128.
#[cfg(target_arch = "x86_64")]
fn wide() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        use super::simd::{level, Level};
        let has = level() == Level::Vnni && is_x86_feature_detected!("avx512f");
        has && std::env::var("MENS_ATTN").as_deref() != Ok("256")
    })
}

impl Path {
    fn get(hd: usize) -> Path {
        #[cfg(target_arch = "x86_64")]
        {
            use super::simd::{level, Level};
            if hd.is_multiple_of(64) && hd <= MAX_HEAD_DIM && level() != Level::None {
                return if wide() { Path::Avx512 } else { Path::Avx2 };
            }
        }
        let _ = hd;
        Path::Reference
    }

    /// Query heads a pass runs at once ([`Path::run_n`], decode and tiled passes alike). On 512-bit
    /// vectors as many as keep their accumulators in the 32 registers (4 of 64 values, 3 of 128,
    /// else 1; for 128, 3 a pass measured 6.7–6.9 ms a 9-row pass of the 1.5B at 512 keys, 2
    /// 7.9–8.5, 4 7.1–7.3). On 256-bit vectors (16 registers) 4 of 64 values, else 1: on a Zen 3
    /// (AVX2 only; docs/benchmarks.md, session 57) the 0.5B's decode attention at 512 keys took
    /// 1.11–1.31 ms with 4 against 1.59–2.05 one head at a time, the 1.5B's 9-row pass 21.3–22.3
    /// ms with 1 against 23.5–26.0 with 4.
    fn heads_at_once(self, hd: usize) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 if hd > 128 => 1,
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 if hd > 64 => 3,
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 if hd > 64 => 1,
            _ => 4,
        }
    }

    /// One query head against `n` cached positions (rows `stride` apart), into `out` (the tests'
    /// single-head pass).
    #[cfg(test)]
    #[allow(clippy::too_many_arguments)]
    fn attend(
        self,
        q: &[f32],
        k: &[f16],
        v: &[f16],
        stride: usize,
        n: usize,
        scale: f32,
        out: &mut [f32],
    ) {
        let mut st = [0f32; RUN_HEADER + MAX_HEAD_DIM];
        let st = &mut st[..RUN_HEADER + q.len()];
        run_start(st);
        self.run(q, k, v, stride, n, scale, st);
        run_finish(st, out);
    }

    /// [`Path::run`] for `H` query heads of one KV group over the same keys in one pass: their
    /// accumulator chains are independent, so the f16 rounding's latency of one head overlaps the
    /// others' work (one head alone waits on it at every key). Each head's bits are its own run's.
    #[allow(clippy::too_many_arguments)]
    fn run_n<const H: usize>(
        self,
        q: [&[f32]; H],
        k: &[f16],
        v: &[f16],
        stride: usize,
        n: usize,
        scale: f32,
        st: [&mut [f32]; H],
    ) {
        let hd = q[0].len();
        assert!(
            n > 0
                && q.iter().all(|q| q.len() == hd)
                && st.iter().all(|s| s.len() == RUN_HEADER + hd)
                && k.len().min(v.len()) >= (n - 1) * stride + hd
        );
        match self {
            Path::Reference => {
                for (q, st) in q.into_iter().zip(st) {
                    run_ref(q, k, v, stride, n, scale, st);
                }
            }
            // SAFETY: as in `run`; every head has hd values and a run of RUN_HEADER + hd.
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => unsafe {
                let qp = q.map(|q| q.as_ptr());
                let sp = st.map(|s| s.as_mut_ptr());
                match hd {
                    64 => attend_avx2_heads::<8, H>(qp, k, v, stride, n, scale, sp),
                    128 => attend_avx2_heads::<16, H>(qp, k, v, stride, n, scale, sp),
                    192 => attend_avx2_heads::<24, H>(qp, k, v, stride, n, scale, sp),
                    _ => attend_avx2_heads::<32, H>(qp, k, v, stride, n, scale, sp),
                }
            },
            // SAFETY: as for Avx2; `wide` says AVX-512F and VL are present.
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => unsafe {
                let qp = q.map(|q| q.as_ptr());
                let sp = st.map(|s| s.as_mut_ptr());
                match hd {
                    64 => attend512_heads::<4, H>(qp, k, v, stride, n, scale, sp),
                    128 => attend512_heads::<8, H>(qp, k, v, stride, n, scale, sp),
                    192 => attend512_heads::<12, H>(qp, k, v, stride, n, scale, sp),
                    _ => attend512_heads::<16, H>(qp, k, v, stride, n, scale, sp),
                }
            },
        }
    }

    /// `n` more cached positions (rows `stride` apart) of one query head's run `st`.
    #[allow(clippy::too_many_arguments)]
    fn run(
        self,
        q: &[f32],
        k: &[f16],
        v: &[f16],
        stride: usize,
        n: usize,
        scale: f32,
        st: &mut [f32],
    ) {
        assert!(
            n > 0
                && st.len() == RUN_HEADER + q.len()
                && k.len().min(v.len()) >= (n - 1) * stride + q.len()
        );
        match self {
            Path::Reference => run_ref(q, k, v, stride, n, scale, st),
            // SAFETY: the paths are chosen by CPU features (`Path::get`), hd % 64 == 0, and k and v
            // hold n rows (asserted above).
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => unsafe {
                match q.len() {
                    64 => attend_avx2::<8>(q, k, v, stride, n, scale, st),
                    128 => attend_avx2::<16>(q, k, v, stride, n, scale, st),
                    192 => attend_avx2::<24>(q, k, v, stride, n, scale, st),
                    _ => attend_avx2::<32>(q, k, v, stride, n, scale, st),
                }
            },
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => self.run_n([q], k, v, stride, n, scale, [st]),
        }
    }
}

/// 2^(i/32) rounded to the nearest double, minus i << 47 (so that adding k << 47 gives 2^(k/32) for
/// any integer k): the table of Arm's expf algorithm, which glibc's `expf` uses.
const EXP2_TAB: [u64; 32] = [
    0x3FF0000000000000,
    0x3FEFD9B0D3158574,
    0x3FEFB5586CF9890F,
    0x3FEF9301D0125B51,
    0x3FEF72B83C7D517B,
    0x3FEF54873168B9AA,
    0x3FEF387A6E756238,
    0x3FEF1E9DF51FDEE1,
    0x3FEF06FE0A31B715,
    0x3FEEF1A7373AA9CB,
    0x3FEEDEA64C123422,
    0x3FEECE086061892D,
    0x3FEEBFDAD5362A27,
    0x3FEEB42B569D4F82,
    0x3FEEAB07DD485429,
    0x3FEEA47EB03A5585,
    0x3FEEA09E667F3BCD,
    0x3FEE9F75E8EC5F74,
    0x3FEEA11473EB0187,
    0x3FEEA589994CCE13,
    0x3FEEACE5422AA0DB,
    0x3FEEB737B0CDC5E5,
    0x3FEEC49182A3F090,
    0x3FEED503B23E255D,
    0x3FEEE89F995AD3AD,
    0x3FEEFF76F2FB5E47,
    0x3FEF199BDD85529C,
    0x3FEF3720DCEF9069,
    0x3FEF5818DCFBA487,
    0x3FEF7C97337B9B5F,
    0x3FEFA4AFA2A490DA,
    0x3FEFD0765B6E4540,
];
/// 32 / ln 2, the rounding shift 1.5·2^52, and the cubic for 2^(r/32) - 1 (Arm's coefficients).
const INV_LN2_N: f64 = f64::from_bits(0x3FF71547652B82FE) * 32.0;
const SHIFT: f64 = f64::from_bits(0x4338000000000000);
const C0: f64 = f64::from_bits(0x3FAC6AF84B912394) / 32768.0;
const C1: f64 = f64::from_bits(0x3FCEBFCE50FAC4F3) / 1024.0;
const C2: f64 = f64::from_bits(0x3FE62E42FF0C52D6) / 32.0;
/// −0x1.9fe368p6: below this, expf underflows to 0 (−inf included).
const EXP_MIN: f32 = f32::from_bits(0xC2CF_F1B4);

/// expf as glibc computes it (x = k·ln2/32 + r, 2^(k/32) from the table, a cubic in r, in f64),
/// for the arguments attention needs (x ≤ 0; NaN stays NaN). Same bits as glibc's on every
/// argument tested; written out so that the AVX2 path can compute 8 at a time identically.
#[inline]
pub(super) fn expf(x: f32) -> f32 {
    if x < EXP_MIN {
        return 0.0;
    }
    let xd = x as f64;
    let k = INV_LN2_N.mul_add(xd, SHIFT);
    let ki = k.to_bits();
    let kd = k - SHIFT;
    let r = INV_LN2_N.mul_add(xd, -kd);
    let s = f64::from_bits(EXP2_TAB[(ki % 32) as usize].wrapping_add(ki << 47));
    let z = C0.mul_add(r, C1);
    let y = C2.mul_add(r, 1.0);
    (z.mul_add(r * r, y) * s) as f32
}

/// Q·K in ggml's AVX-512 order (see the module comment).
fn dot_ref(q: &[f32], k: &[f16]) -> f32 {
    let hd = q.len();
    let np = hd / 64 * 64;
    let mut acc = [[0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, a) in a.iter_mut().enumerate() {
                let x = i + j * 16 + l;
                *a = k[x].to_f32().mul_add(q[x], *a);
            }
        }
    }
    #[allow(clippy::needless_range_loop)]
    for l in 0..16 {
        acc[0][l] += acc[2][l];
        acc[1][l] += acc[3][l];
        acc[0][l] += acc[1][l];
    }
    let a = acc[0];
    let b: [f32; 8] = std::array::from_fn(|i| a[i + 8] + a[i]);
    let c: [f32; 4] = std::array::from_fn(|i| b[i + 4] + b[i]);
    let mut sum = ((c[0] + c[2]) + (c[1] + c[3])) as f64;
    for x in np..hd {
        sum += (k[x].to_f32() * q[x]) as f64;
    }
    sum as f32
}

fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// An online softmax in progress for one query head, as the kernels carry it from key to key:
/// `[max, sum, acc[0..hd]]` (acc: the f16-rounded V accumulator). Keys can be fed in any number of
/// runs, in order: the bits are those of one pass over all of them.
pub(super) const RUN_HEADER: usize = 2;

pub(super) fn run_start(st: &mut [f32]) {
    st[0] = f32::NEG_INFINITY;
    st[1] = 0.0;
    st[RUN_HEADER..].fill(0.0);
}

/// The output of a finished run: acc / sum.
pub(super) fn run_finish(st: &[f32], out: &mut [f32]) {
    let sum = st[1];
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for (o, a) in out.iter_mut().zip(&st[RUN_HEADER..]) {
        *o = a * inv;
    }
}

/// The reference, llama.cpp's one-chunk flash attention for one query row (`Path::Reference`):
/// its loop over `n` more keys of a run.
fn run_ref(q: &[f32], k: &[f16], v: &[f16], stride: usize, n: usize, scale: f32, st: &mut [f32]) {
    let hd = q.len();
    let (head, acc) = st.split_at_mut(RUN_HEADER);
    let acc = &mut acc[..hd];
    let (mut max, mut sum) = (head[0], head[1]);
    for p in 0..n {
        let s = dot_ref(q, &k[p * stride..p * stride + hd]) * scale;
        let (mut ms, mut vs) = (1f32, 1f32);
        if s > max {
            ms = expf(max - s);
            max = s;
            for a in acc.iter_mut() {
                *a = round_f16(*a * ms);
            }
        } else {
            vs = expf(s - max);
        }
        for (a, x) in acc.iter_mut().zip(&v[p * stride..p * stride + hd]) {
            *a = round_f16(x.to_f32().mul_add(vs, *a));
        }
        sum = sum.mul_add(ms, vs);
    }
    head[0] = max;
    head[1] = sum;
}

/// Query heads of one KV group that [`attend_quant`] takes together.
const GROUP: usize = 8;

/// Up to `GROUP` query heads of one KV group (`qs`, head after head) against `n` rows of a cache
/// with a block-quantized K or V (`-ctk` / `-ctv`), as llama.cpp's CPU flash attention computes each
/// head for those types: with a quantized K, Q (f32, not rounded to f16) is quantized to Q8_0 and
/// each score is the Q8_0 dot product of the K type; with a quantized V, each row is dequantized
/// and accumulated in f32 (with an f16 V, in the f16 accumulator of `run_ref`). The same online
/// softmax and `expf` as the f16 kernel. The heads share each row's dequantization; each head's
/// arithmetic is what it would be alone.
fn attend_quant(qs: &[f32], k: KvRows, v: KvRows, n: usize, scale: f32, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::level() != super::simd::Level::None {
        // SAFETY: AVX2, FMA and F16C are present (the level says so).
        return unsafe { attend_quant_avx2(qs, k, v, n, scale, out) };
    }
    attend_quant_body(qs, k, v, n, scale, out)
}

/// The same code compiled with AVX2 and FMA (the binary targets the x86-64 baseline, where
/// `mul_add` is a library call).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_quant_avx2(
    qs: &[f32],
    k: KvRows,
    v: KvRows,
    n: usize,
    scale: f32,
    out: &mut [f32],
) {
    attend_quant_body(qs, k, v, n, scale, out)
}

#[inline(always)]
fn attend_quant_body(qs: &[f32], k: KvRows, v: KvRows, n: usize, scale: f32, out: &mut [f32]) {
    use super::simd::{self, ActRow, Kind, Level};
    use candle_core::quantized::k_quants::{BlockQ4_0, BlockQ8_0, GgmlType};
    const NB: usize = MAX_HEAD_DIM / 32;
    let hd = k.row_len();
    let heads = qs.len() / hd;
    assert!(heads <= GROUP && out.len() == qs.len());
    let nb = hd / 32;
    // Each Q as Q8_0 blocks, and their scales as f32 (the dot kernels' activation format).
    let mut qq = [[0u8; NB * 34]; GROUP];
    let mut qd = [[0f32; NB]; GROUP];
    let quant_k = k.t != KvType::F16;
    if quant_k {
        for h in 0..heads {
            let mut q = [0f32; MAX_HEAD_DIM];
            let q = &mut q[..hd];
            q.copy_from_slice(&qs[h * hd..(h + 1) * hd]);
            if k.t.rotated() {
                super::kv::hadamard32(q);
            }
            super::act_quant::q8_0_ggml(q, &mut qq[h][..nb * 34]);
            for (b, d) in qd[h][..nb].iter_mut().enumerate() {
                *d = f16::from_le_bytes([qq[h][b * 34], qq[h][b * 34 + 1]]).to_f32();
            }
        }
    }
    let level = simd::level();
    let kind = if k.t == KvType::Q8_0 {
        Kind::Q8_0
    } else {
        Kind::Q4_0
    };
    // Every head's Q as a dot kernel's activation row (unused ones repeat the first): one call
    // scores a key for all heads, the K row unpacked once (each row's sum is the one-row kernel's).
    let acts: [ActRow; GROUP] = std::array::from_fn(|h| {
        let h = if h < heads { h } else { 0 };
        ActRow {
            q: qq[h].as_ptr(),
            d: qd[h].as_ptr(),
            s: qd[h].as_ptr(),
        }
    });
    let scores = |p: usize, out: &mut [f32; GROUP]| {
        let row = k.row_bytes(p);
        match k.t {
            KvType::F16 => {
                let kr = &k.f16()[p * hd..(p + 1) * hd];
                for (h, o) in out[..heads].iter_mut().enumerate() {
                    *o = dot_ref(&qs[h * hd..(h + 1) * hd], kr);
                }
            }
            // SAFETY: the level is not None; the row holds nb blocks, each of `acts` nb blocks
            // and scales.
            _ if level != Level::None => {
                *out = unsafe { simd::dot::<GROUP>(level, kind, nb, row.as_ptr(), &acts) }
            }
            KvType::Q8_0 => {
                for (h, o) in out[..heads].iter_mut().enumerate() {
                    *o = BlockQ8_0::vec_dot(
                        hd,
                        crate::weights::cast::<BlockQ8_0>(row),
                        crate::weights::cast::<BlockQ8_0>(&qq[h][..nb * 34]),
                    );
                }
            }
            KvType::Q4_0 => {
                for (h, o) in out[..heads].iter_mut().enumerate() {
                    *o = BlockQ4_0::vec_dot(
                        hd,
                        crate::weights::cast::<BlockQ4_0>(row),
                        crate::weights::cast::<BlockQ8_0>(&qq[h][..nb * 34]),
                    );
                }
            }
        }
    };
    let mut acc = [[0f32; MAX_HEAD_DIM]; GROUP];
    let mut vrow = [0f32; MAX_HEAD_DIM];
    let vrow = &mut vrow[..hd];
    let f16_v = v.t == KvType::F16;
    let mut max = [f32::NEG_INFINITY; GROUP];
    let mut sum = [0f32; GROUP];
    // Eight keys at a time: their scores, the running max after each, and vs = expf(s − max
    // after) on 8 lanes; then the sequential updates (where the max moves, ms = expf(max before −
    // max after) one at a time), the same arithmetic as one key at a time.
    let mut raw = [[0f32; GROUP]; 8];
    for p0 in (0..n).step_by(8) {
        let m = (n - p0).min(8);
        for (i, r) in raw[..m].iter_mut().enumerate() {
            scores(p0 + i, r);
        }
        let mut sv = [[0f32; 8]; GROUP];
        let mut before = [[0f32; 8]; GROUP];
        let mut vs = [[0f32; 8]; GROUP];
        for h in 0..heads {
            let mut after = [0f32; 8];
            for i in 0..m {
                let s = raw[i][h] * scale;
                sv[h][i] = s;
                before[h][i] = max[h];
                if s > max[h] {
                    max[h] = s;
                }
                after[i] = max[h];
            }
            vs[h] = exp8(std::array::from_fn(|i| sv[h][i] - after[i]));
        }
        for i in 0..m {
            let p = p0 + i;
            if !f16_v {
                super::kv::load(v.t, v.row_bytes(p), vrow);
            }
            for h in 0..heads {
                let acc = &mut acc[h][..hd];
                let (s, b) = (sv[h][i], before[h][i]);
                let vs = if s > b {
                    let ms = expf(b - s);
                    for a in acc.iter_mut() {
                        *a = if f16_v { round_f16(*a * ms) } else { *a * ms };
                    }
                    sum[h] = sum[h].mul_add(ms, 1.0);
                    1.0
                } else {
                    sum[h] += vs[h][i];
                    vs[h][i]
                };
                if f16_v {
                    for (a, x) in acc.iter_mut().zip(&v.f16()[p * hd..(p + 1) * hd]) {
                        *a = round_f16(x.to_f32().mul_add(vs, *a));
                    }
                } else {
                    for (a, x) in acc.iter_mut().zip(vrow.iter()) {
                        *a = x.mul_add(vs, *a);
                    }
                }
            }
        }
    }
    for h in 0..heads {
        let inv = if sum[h] == 0.0 { 0.0 } else { 1.0 / sum[h] };
        let o = &mut out[h * hd..(h + 1) * hd];
        for (o, a) in o.iter_mut().zip(&acc[h][..hd]) {
            *o = a * inv;
        }
        if v.t.rotated() {
            super::kv::hadamard32(o);
        }
    }
}

/// [`expf`] of 8 values: `expf8` where the CPU has AVX2, else one at a time (the same bits).
#[inline(always)]
fn exp8(x: [f32; 8]) -> [f32; 8] {
    #[cfg(target_arch = "x86_64")]
    if super::simd::level() != super::simd::Level::None {
        use std::arch::x86_64::*;
        let mut o = [0f32; 8];
        // SAFETY: AVX2 and FMA are present (the level says so).
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), expf8(_mm256_loadu_ps(x.as_ptr()))) };
        return o;
    }
    x.map(expf)
}

/// `expf` on 8 lanes (AVX2: the table read by a gather).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn expf8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let half = |xd: __m256d| -> __m128 {
        let k = _mm256_fmadd_pd(_mm256_set1_pd(INV_LN2_N), xd, _mm256_set1_pd(SHIFT));
        let ki = _mm256_castpd_si256(k);
        let kd = _mm256_sub_pd(k, _mm256_set1_pd(SHIFT));
        let r = _mm256_fmadd_pd(
            _mm256_set1_pd(INV_LN2_N),
            xd,
            _mm256_sub_pd(_mm256_setzero_pd(), kd),
        );
        let idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
        let t = _mm256_i64gather_epi64::<8>(EXP2_TAB.as_ptr() as *const i64, idx);
        let s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64::<47>(ki)));
        let z = _mm256_fmadd_pd(_mm256_set1_pd(C0), r, _mm256_set1_pd(C1));
        let y = _mm256_fmadd_pd(_mm256_set1_pd(C2), r, _mm256_set1_pd(1.0));
        _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_fmadd_pd(z, _mm256_mul_pd(r, r), y), s))
    };
    let lo = half(_mm256_cvtps_pd(_mm256_castps256_ps128(x)));
    let hi = half(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x)));
    let y = _mm256_set_m128(hi, lo);
    let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(EXP_MIN));
    _mm256_blendv_ps(y, _mm256_setzero_ps(), under)
}

/// `expf` on 16 lanes (AVX-512: two halves of 8 doubles, the table read by a gather): [`expf8`]'s
/// arithmetic lane by lane, so the same bits.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn expf16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let half = |xd: __m512d| -> __m256 {
        let k = _mm512_fmadd_pd(_mm512_set1_pd(INV_LN2_N), xd, _mm512_set1_pd(SHIFT));
        let ki = _mm512_castpd_si512(k);
        let kd = _mm512_sub_pd(k, _mm512_set1_pd(SHIFT));
        let r = _mm512_fmadd_pd(
            _mm512_set1_pd(INV_LN2_N),
            xd,
            _mm512_sub_pd(_mm512_setzero_pd(), kd),
        );
        let idx = _mm512_and_si512(ki, _mm512_set1_epi64(31));
        let t = _mm512_i64gather_epi64::<8>(idx, EXP2_TAB.as_ptr() as *const i64);
        let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
        let z = _mm512_fmadd_pd(_mm512_set1_pd(C0), r, _mm512_set1_pd(C1));
        let y = _mm512_fmadd_pd(_mm512_set1_pd(C2), r, _mm512_set1_pd(1.0));
        _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_fmadd_pd(z, _mm512_mul_pd(r, r), y), s))
    };
    let lo = half(_mm512_cvtps_pd(_mm512_castps512_ps256(x)));
    let hi = half(_mm512_cvtps_pd(_mm256_castpd_ps(
        _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)),
    )));
    let y = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castps_pd(_mm512_castps256_ps512(lo)),
        _mm256_castps_pd(hi),
    ));
    let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(EXP_MIN));
    _mm512_mask_blend_ps(under, y, _mm512_setzero_ps())
}

/// `run_ref` on 256-bit vectors for head dimension `8 * L` (L a multiple of 8): Q·K of 8 keys at
/// a time, each key's 16-lane vectors of ggml's order as two 8-lane halves, the 8 lane-reductions
/// done together in the same order (a transposing tree), `expf` on 8 lanes, then the sequential
/// softmax and f16 accumulator updates. The path of CPUs without AVX-512 (and of `MENS_ATTN=256`).
/// Session 1 measured a 512-bit kernel of one head a pass slower than this one in a real step on an
/// Intel Xeon (the core's wide-vector warm-up between 256-bit matmuls: 1.8 ms hot, 4.4 ms between
/// other kernels, at 512 keys on the 0.5B); [`attend512_heads`], several heads a pass, is faster in
/// a real step on Intel Xeon and AMD Zen 5 alike (see [`wide`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_avx2<const L: usize>(
    q: &[f32],
    k: &[f16],
    v: &[f16],
    stride: usize,
    n: usize,
    scale: f32,
    st: &mut [f32],
) {
    attend_heads::<L, 1>([q.as_ptr()], k, v, stride, n, scale, [st.as_mut_ptr()])
}

/// `attend_heads` for `H` heads with AVX2 (see [`Path::run_n`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_avx2_heads<const L: usize, const H: usize>(
    q: [*const f32; H],
    k: &[f16],
    v: &[f16],
    stride: usize,
    n: usize,
    scale: f32,
    st: [*mut f32; H],
) {
    attend_heads::<L, H>(q, k, v, stride, n, scale, st)
}

/// The body of [`attend_avx2`] for `H` query heads (L × 8 values each) against the same keys:
/// `n` more keys of each head's run (`st`, see [`RUN_HEADER`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn attend_heads<const L: usize, const H: usize>(
    q: [*const f32; H],
    k: &[f16],
    v: &[f16],
    stride: usize,
    n: usize,
    scale: f32,
    st: [*mut f32; H],
) {
    use std::arch::x86_64::*;
    let mut acc: [[__m256; L]; H] = std::array::from_fn(|hh| {
        std::array::from_fn(|j| _mm256_loadu_ps(st[hh].add(RUN_HEADER + 8 * j)))
    });
    let mut max: [f32; H] = std::array::from_fn(|hh| *st[hh]);
    let mut sum: [f32; H] = std::array::from_fn(|hh| *st[hh].add(1));
    let round = |x: __m256| _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
    let mut p0 = 0;
    while p0 < n {
        let m = (n - p0).min(8);
        // Per key: the 16-lane accumulators of ggml's order (j % 4, half), folded 0+2, 1+3, 0+1,
        // then the halves at distance 8: one 8-lane vector a key.
        let mut w = [[_mm256_setzero_ps(); 8]; H];
        for i in 0..m {
            let kp = k.as_ptr().add((p0 + i) * stride) as *const __m128i;
            let mut s = [[[_mm256_setzero_ps(); 2]; 4]; H];
            for c in 0..L {
                let (j, h) = ((c / 2) % 4, c % 2);
                let kc = _mm256_cvtph_ps(_mm_loadu_si128(kp.add(c)));
                for (s, q) in s.iter_mut().zip(&q) {
                    s[j][h] = _mm256_fmadd_ps(kc, _mm256_loadu_ps(q.add(c * 8)), s[j][h]);
                }
            }
            for (w, s) in w.iter_mut().zip(&s) {
                let x0 = _mm256_add_ps(
                    _mm256_add_ps(s[0][0], s[2][0]),
                    _mm256_add_ps(s[1][0], s[3][0]),
                );
                let x1 = _mm256_add_ps(
                    _mm256_add_ps(s[0][1], s[2][1]),
                    _mm256_add_ps(s[1][1], s[3][1]),
                );
                w[i] = _mm256_add_ps(x1, x0);
            }
        }
        let (sc, before, vs) = block_softmax::<H>(&w, m, scale, &mut max);
        for i in 0..m {
            let mut e = [_mm256_setzero_ps(); H];
            for hh in 0..H {
                if sc[hh][i] > before[hh][i] {
                    let ms = expf(before[hh][i] - sc[hh][i]);
                    let mv = _mm256_set1_ps(ms);
                    for a in acc[hh].iter_mut() {
                        *a = round(_mm256_mul_ps(*a, mv));
                    }
                    sum[hh] = sum[hh].mul_add(ms, 1.0);
                } else {
                    sum[hh] += vs[hh][i];
                }
                e[hh] = _mm256_set1_ps(vs[hh][i]);
            }
            let vp = v.as_ptr().add((p0 + i) * stride) as *const __m128i;
            for j in 0..L {
                let vv = _mm256_cvtph_ps(_mm_loadu_si128(vp.add(j)));
                for (a, e) in acc.iter_mut().zip(&e) {
                    a[j] = round(_mm256_fmadd_ps(vv, *e, a[j]));
                }
            }
        }
        p0 += m;
    }
    for hh in 0..H {
        *st[hh] = max[hh];
        *st[hh].add(1) = sum[hh];
        for (j, a) in acc[hh].iter().enumerate() {
            _mm256_storeu_ps(st[hh].add(RUN_HEADER + 8 * j), *a);
        }
    }
}

/// [`attend_heads`] on 512-bit vectors, for `H` heads of `16 * L` values: the same arithmetic lane
/// by lane (ggml's four 16-lane Q·K accumulators are one vector each here; the f16 rounding of the
/// V accumulator takes one conversion pair per 16 values, not per 8), so the same bits (tested). It
/// is [`Path::Avx512`]'s kernel, chosen on CPUs with AVX-512 (see [`wide`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
unsafe fn attend512_heads<const L: usize, const H: usize>(
    q: [*const f32; H],
    k: &[f16],
    v: &[f16],
    stride: usize,
    n: usize,
    scale: f32,
    st: [*mut f32; H],
) {
    use std::arch::x86_64::*;
    let mut acc: [[__m512; L]; H] = std::array::from_fn(|hh| {
        std::array::from_fn(|j| _mm512_loadu_ps(st[hh].add(RUN_HEADER + 16 * j)))
    });
    let mut max: [f32; H] = std::array::from_fn(|hh| *st[hh]);
    let mut sum: [f32; H] = std::array::from_fn(|hh| *st[hh].add(1));
    let round = |x: __m512| _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
    let mut p0 = 0;
    while p0 < n {
        let m = (n - p0).min(8);
        // Per key: ggml's four 16-lane accumulators (chunk c into c % 4), folded 0+2, 1+3, 0+1,
        // then the halves at distance 8: one 8-lane vector a key.
        let mut w = [[_mm256_setzero_ps(); 8]; H];
        for i in 0..m {
            let kp = k.as_ptr().add((p0 + i) * stride) as *const __m256i;
            let mut s = [[_mm512_setzero_ps(); 4]; H];
            for c in 0..L {
                let kc = _mm512_cvtph_ps(_mm256_loadu_si256(kp.add(c)));
                for (s, q) in s.iter_mut().zip(&q) {
                    s[c % 4] = _mm512_fmadd_ps(kc, _mm512_loadu_ps(q.add(c * 16)), s[c % 4]);
                }
            }
            for (w, s) in w.iter_mut().zip(&s) {
                let x = _mm512_add_ps(_mm512_add_ps(s[0], s[2]), _mm512_add_ps(s[1], s[3]));
                let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
                w[i] = _mm256_add_ps(hi, _mm512_castps512_ps256(x));
            }
        }
        let (sc, before, vs) = block_softmax::<H>(&w, m, scale, &mut max);
        for i in 0..m {
            let mut e = [_mm512_setzero_ps(); H];
            for hh in 0..H {
                if sc[hh][i] > before[hh][i] {
                    let ms = expf(before[hh][i] - sc[hh][i]);
                    let mv = _mm512_set1_ps(ms);
                    for a in acc[hh].iter_mut() {
                        *a = round(_mm512_mul_ps(*a, mv));
                    }
                    sum[hh] = sum[hh].mul_add(ms, 1.0);
                } else {
                    sum[hh] += vs[hh][i];
                }
                e[hh] = _mm512_set1_ps(vs[hh][i]);
            }
            let vp = v.as_ptr().add((p0 + i) * stride) as *const __m256i;
            for j in 0..L {
                let vv = _mm512_cvtph_ps(_mm256_loadu_si256(vp.add(j)));
                for (a, e) in acc.iter_mut().zip(&e) {
                    a[j] = round(_mm512_fmadd_ps(vv, *e, a[j]));
                }
            }
        }
        p0 += m;
    }
    for hh in 0..H {
        *st[hh] = max[hh];
        *st[hh].add(1) = sum[hh];
        for (j, a) in acc[hh].iter().enumerate() {
            _mm512_storeu_ps(st[hh].add(RUN_HEADER + 16 * j), *a);
        }
    }
}

/// The scores of a block of `m` ≤ 8 keys for `H` heads, from each key's 8-lane partial sums `w`
/// (ggml's 16-lane accumulators folded to 8 lanes), and the online softmax's bookkeeping for them:
/// the scores (× `scale`), the running max before each key (`max` moves on to the max after the
/// block), and vs = expf(s − max after) on 8 lanes. Shared by the 256- and 512-bit kernels.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::type_complexity)]
unsafe fn block_softmax<const H: usize>(
    w: &[[std::arch::x86_64::__m256; 8]; H],
    m: usize,
    scale: f32,
    max: &mut [f32; H],
) -> ([[f32; 8]; H], [[f32; 8]; H], [[f32; 8]; H]) {
    use std::arch::x86_64::*;
    // Key i of a block ends in lane UNSCRAMBLE^-1: the tree leaves keys 0,2,4,6 | 1,3,5,7.
    let unscramble = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let mut sv = [_mm256_setzero_ps(); H];
    let mut sc = [[0f32; 8]; H];
    for hh in 0..H {
        let w = &w[hh];
        // Distance 4: two keys a vector, one 128-bit lane each.
        let w2: [__m256; 4] = std::array::from_fn(|j| {
            let (a, b) = (w[2 * j], w[2 * j + 1]);
            _mm256_add_ps(
                _mm256_permute2f128_ps::<0x31>(a, b),
                _mm256_permute2f128_ps::<0x20>(a, b),
            )
        });
        // Distance 2, then 1, inside each 128-bit lane.
        let w3: [__m256; 2] = std::array::from_fn(|j| {
            let (a, b) = (w2[2 * j], w2[2 * j + 1]);
            _mm256_add_ps(
                _mm256_shuffle_ps::<0b11_10_11_10>(a, b),
                _mm256_shuffle_ps::<0b01_00_01_00>(a, b),
            )
        });
        let w4 = _mm256_add_ps(
            _mm256_shuffle_ps::<0b10_00_10_00>(w3[0], w3[1]),
            _mm256_shuffle_ps::<0b11_01_11_01>(w3[0], w3[1]),
        );
        sv[hh] = _mm256_mul_ps(
            _mm256_permutevar8x32_ps(w4, unscramble),
            _mm256_set1_ps(scale),
        );
        _mm256_storeu_ps(sc[hh].as_mut_ptr(), sv[hh]);
    }
    // The running max after each key; vs = expf(s − max after) for all 8 at once. Where the
    // max moves (rare), ms = expf(max before − max after) one at a time.
    let mut after = [[0f32; 8]; H];
    let mut before = [[0f32; 8]; H];
    let mut vs = [[0f32; 8]; H];
    for hh in 0..H {
        for i in 0..m {
            before[hh][i] = max[hh];
            if sc[hh][i] > max[hh] {
                max[hh] = sc[hh][i];
            }
            after[hh][i] = max[hh];
        }
        _mm256_storeu_ps(
            vs[hh].as_mut_ptr(),
            expf8(_mm256_sub_ps(sv[hh], _mm256_loadu_ps(after[hh].as_ptr()))),
        );
    }
    (sc, before, vs)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Online-softmax GQA attention equals a two-pass softmax reference with repeated KV heads.
    #[test]
    fn attention_matches_two_pass_softmax() {
        use super::super::kv::KvRowsMut;
        use KvType::*;
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let all = usize::MAX;
        // (head size, K type, V type, window: a sliding window of 4 for some, with another scale).
        let cases = [
            (16, F16, F16, all),
            (64, F16, F16, all),
            (64, Q8_0, Q8_0, all),
            (64, Q4_0, Q4_0, all),
            (64, Q8_0, F16, all),
            (64, F16, Q4_0, all),
            (128, Q8_0, Q8_0, all),
            (64, F16, F16, 4),
            (16, F16, F16, 4),
            (64, Q8_0, Q8_0, 4),
        ];
        for (hd, ck, cv, window) in cases {
            let scale = if window == all { 1.0 } else { 0.6 } / (hd as f32).sqrt();
            let (n_head, n_kv, t, pos0) = (6, 2, 3, 5);
            let (l, row, qkv) = random_qkv(&mut rng, (hd, n_head, n_kv), t);
            let ctx = pos0 + t;
            // Cache rows as stored (u16-backed, as the KV cache), and what they hold as f32.
            let mut store = |ty: KvType| {
                let rb = ty.row_bytes(hd);
                let mut buf = vec![0u16; n_kv * ctx * rb / 2];
                // SAFETY: the u16s as bytes.
                let bytes = unsafe {
                    std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut u8, buf.len() * 2)
                };
                let mut rows = KvRowsMut {
                    t: ty,
                    data: bytes,
                    row: rb,
                };
                let mut vals = vec![0f32; n_kv * ctx * hd];
                for r in 0..n_kv * ctx {
                    let x: Vec<f32> = (0..hd).map(|_| rng.gen_range(-1.0..1.0)).collect();
                    rows.store(r, &x);
                    rows.as_rows().load(r, &mut vals[r * hd..(r + 1) * hd]);
                }
                (buf, vals)
            };
            let (kb, kf) = store(ck);
            let (vb, vf) = store(cv);
            let view = |b: &Vec<u16>, ty: KvType| KvRows {
                t: ty,
                // SAFETY: the u16s as bytes.
                data: unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u8, b.len() * 2) },
                row: ty.row_bytes(hd),
            };
            let mut out = vec![0f32; t * l.q_dim];
            attention_masked(
                &qkv,
                t,
                &l,
                n_head,
                n_kv,
                pos0,
                view(&kb, ck),
                view(&vb, cv),
                ctx,
                Mask { scale, window },
                false,
                &mut out,
            );
            // A quantized K takes Q as Q8_0 blocks (1/254 of each block's largest value).
            let tol = if ck == F16 { 2e-3 } else { 1e-2 };
            for ti in 0..t {
                for h in 0..n_head {
                    let q = &qkv[ti * row + h * hd..ti * row + (h + 1) * hd];
                    let kvh = h / (n_head / n_kv);
                    let n = pos0 + ti + 1;
                    let lo = n.saturating_sub(window);
                    let scores: Vec<f32> = (0..n)
                        .map(|p| {
                            let k = &kf[(kvh * ctx + p) * hd..][..hd];
                            if p < lo {
                                return f32::NEG_INFINITY;
                            }
                            q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                    let e: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f32 = e.iter().sum();
                    for j in 0..hd {
                        let want: f32 = (0..n)
                            .map(|p| e[p] / z * vf[(kvh * ctx + p) * hd + j])
                            .sum();
                        let got = out[ti * l.q_dim + h * hd + j];
                        assert!(
                            (want - got).abs() < tol,
                            "hd {hd} {ck:?}/{cv:?} t{ti} h{h} j{j}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// `n` random f16 cache values (as their bits) in [-2, 2).
    pub(in crate::kernels) fn random_f16_cache(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<u16> {
        (0..n)
            .map(|_| f16::from_f32(rng.gen_range(-2.0..2.0)).to_bits())
            .collect()
    }

    /// The layout of `n_head` / `n_kv` heads of `hd`, the row width, and `t` rows of Q/K/V in
    /// [-1, 1).
    fn random_qkv(
        rng: &mut rand::rngs::StdRng,
        (hd, n_head, n_kv): (usize, usize, usize),
        t: usize,
    ) -> (QkvLayout, usize, Vec<f32>) {
        let l = QkvLayout {
            q_dim: n_head * hd,
            kv_dim: n_kv * hd,
            head_dim: hd,
        };
        let row = l.q_dim + 2 * l.kv_dim;
        let qkv: Vec<f32> = (0..t * row).map(|_| rng.gen_range(-1.0..1.0)).collect();
        (l, row, qkv)
    }

    /// A random pass: [`random_qkv`], and K and V f16 caches of `cap` positions.
    #[allow(clippy::type_complexity)]
    pub(in crate::kernels) fn random_pass(
        rng: &mut rand::rngs::StdRng,
        heads: (usize, usize, usize),
        t: usize,
        cap: usize,
    ) -> (QkvLayout, usize, Vec<f32>, Vec<u16>, Vec<u16>) {
        let (hd, _, n_kv) = heads;
        let (l, row, qkv) = random_qkv(rng, heads, t);
        let kb = random_f16_cache(rng, n_kv * cap * hd);
        let vb = random_f16_cache(rng, n_kv * cap * hd);
        (l, row, qkv, kb, vb)
    }

    /// Those values as an f16 cache's rows of `hd`.
    pub(in crate::kernels) fn f16_rows(b: &[u16], hd: usize) -> KvRows<'_> {
        KvRows {
            t: KvType::F16,
            // SAFETY: the u16s as bytes.
            data: unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u8, b.len() * 2) },
            row: KvType::F16.row_bytes(hd),
        }
    }

    /// A pass tiled over query blocks and key tiles (`tiled`, from 4 query rows) gives the bits of each token alone (the
    /// per-token path), for head sizes 64 and 128, groups of 6 and 7 heads, causal and
    /// sliding-window masks, blocks that end inside a tile and prompts after a cached prefix.
    #[test]
    fn tiled_prompt_attention_equals_each_token_alone_bit_for_bit() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let all = usize::MAX;
        for (hd, n_head, n_kv, t, pos0, window) in [
            (64, 14, 2, 4, 0, all),
            (64, 14, 2, 70, 5, all),
            (128, 12, 2, 37, 130, all),
            (128, 12, 2, 200, 0, all),
            (64, 6, 2, 90, 40, 37),
            (128, 7, 1, 16, 0, all),
        ] {
            let cap = pos0 + t + 3;
            let (l, row, qkv, kb, vb) = random_pass(&mut rng, (hd, n_head, n_kv), t, cap);
            let mask = Mask {
                scale: 0.7 / (hd as f32).sqrt(),
                window,
            };
            let mut out = vec![f32::NAN; t * l.q_dim];
            tiled(
                &qkv,
                t,
                &l,
                n_head,
                n_kv,
                pos0,
                f16_rows(&kb, hd),
                f16_rows(&vb, hd),
                cap,
                mask,
                &mut out,
            );
            for ti in 0..t {
                let mut alone = vec![0f32; l.q_dim];
                attention_masked(
                    &qkv[ti * row..(ti + 1) * row],
                    1,
                    &l,
                    n_head,
                    n_kv,
                    pos0 + ti,
                    f16_rows(&kb, hd),
                    f16_rows(&vb, hd),
                    cap,
                    mask,
                    false,
                    &mut alone,
                );
                let got = &out[ti * l.q_dim..(ti + 1) * l.q_dim];
                for (j, (a, b)) in got.iter().zip(&alone).enumerate() {
                    assert!(
                        a.to_bits() == b.to_bits(),
                        "hd {hd}, {n_head}/{n_kv} heads, t {t} after {pos0}, window {window}: token {ti} value {j}: {a} tiled, {b} alone"
                    );
                }
            }
        }
    }

    /// `expf` is the system's expf where that is glibc's (same bits on a sweep of [−104, 0]), and
    /// within one f32 rounding of the true value everywhere; `expf8` equals `expf` lane by lane.
    #[test]
    fn expf_matches_glibc_and_the_true_value() {
        let (mut n, mut same) = (0u64, 0u64);
        let mut b = (-0.0f32).to_bits();
        while b <= (-105.0f32).to_bits() {
            let x = f32::from_bits(b);
            let got = expf(x);
            let exact = (x as f64).exp();
            assert!(
                (got as f64 - exact).abs() <= exact * 1.2e-7 + 1e-45,
                "expf({x}) = {got}, want {exact}"
            );
            same += (got.to_bits() == x.exp().to_bits()) as u64;
            n += 1;
            b += 1009;
        }
        assert_eq!(expf(0.0), 1.0);
        assert_eq!(expf(f32::NEG_INFINITY), 0.0);
        assert!(expf(f32::NAN).is_nan());
        eprintln!("expf: {same} of {n} arguments give the same bits as the system expf");
        // The claim: glibc's expf, bit for bit (f32::exp is glibc's on Linux with glibc).
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            assert_eq!(
                same,
                n,
                "expf differs from glibc's on {} arguments",
                n - same
            );
        }
    }

    /// Q·K in ggml's order: equal to an f64 dot product within f32 rounding, and different from a
    /// plain left-to-right f32 sum on some inputs (so the order is really the one written).
    #[test]
    fn dot_ref_is_a_dot_product_in_ggml_order() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut differs = 0;
        for hd in [64, 80, 128] {
            for _ in 0..200 {
                let q: Vec<f32> = (0..hd).map(|_| rng.gen_range(-4.0..4.0)).collect();
                let k: Vec<f16> = (0..hd)
                    .map(|_| f16::from_f32(rng.gen_range(-4.0..4.0)))
                    .collect();
                let exact: f64 = q.iter().zip(&k).map(|(a, b)| *a as f64 * b.to_f64()).sum();
                let got = dot_ref(&q, &k);
                assert!(
                    (got as f64 - exact).abs() < 1e-4 * (1.0 + exact.abs()),
                    "{got} vs {exact}"
                );
                let naive: f32 = q.iter().zip(&k).map(|(a, b)| a * b.to_f32()).sum();
                differs += (naive != got) as usize;
            }
        }
        assert!(differs > 0);
    }

    /// `H` heads of `qs` in one [`Path::run_n`] pass over the keys in two runs: each head's bits
    /// are a single-head reference pass's.
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    fn heads_equal_reference<const H: usize>(
        p: Path,
        qs: &[Vec<f32>],
        k: &[f16],
        v: &[f16],
        stride: usize,
        n: usize,
        scale: f32,
    ) {
        let hd = qs[0].len();
        let mut runs = vec![0f32; H * (RUN_HEADER + hd)];
        runs.chunks_exact_mut(RUN_HEADER + hd).for_each(run_start);
        let cut = n / 2;
        for (from, len) in [(0, cut), (cut, n - cut)] {
            if len == 0 {
                continue;
            }
            let st: [&mut [f32]; H] = split_runs(&mut runs, RUN_HEADER + hd);
            let q: [&[f32]; H] = std::array::from_fn(|h| &qs[h][..]);
            p.run_n(
                q,
                &k[from * stride..],
                &v[from * stride..],
                stride,
                len,
                scale,
                st,
            );
        }
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for (h, st) in runs.chunks_exact(RUN_HEADER + hd).enumerate() {
            let (mut want, mut got) = (vec![0f32; hd], vec![0f32; hd]);
            Path::Reference.attend(&qs[h], k, v, stride, n, scale, &mut want);
            run_finish(st, &mut got);
            assert_eq!(
                bits(&got),
                bits(&want),
                "{p:?} {H} heads, head {h}, hd {hd} n {n}"
            );
        }
    }

    /// The SIMD paths give the same bits as the reference, for every head dimension they take and
    /// key counts around the 8-key blocks of the vector path.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_paths_equal_the_reference_bit_for_bit() {
        use super::super::simd::{level, Level};
        if level() == Level::None {
            eprintln!("SKIP (not run, not passed): no AVX2+FMA+F16C on this CPU");
            return;
        }
        // Both paths wherever the CPU has AVX-512 (`MENS_ATTN=256` must keep its bits too).
        let mut paths = vec![Path::Avx2];
        if level() == Level::Vnni && is_x86_feature_detected!("avx512f") {
            paths.push(Path::Avx512);
        } else {
            eprintln!("no AVX-512: the 512-bit path is not tested here");
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for hd in [64, 128, 192, 256] {
            for n in [1, 2, 7, 8, 9, 15, 16, 17, 37, 300] {
                let stride = 2 * hd;
                let q: Vec<f32> = (0..hd)
                    .map(|_| round_f16(rng.gen_range(-2.0..2.0)))
                    .collect();
                // Scores that rise along the keys, so the running max (and the rescaling) moves.
                let k: Vec<f16> = (0..n * stride)
                    .map(|i| f16::from_f32(rng.gen_range(-2.0..2.0) + (i / stride) as f32 * 0.01))
                    .collect();
                let v: Vec<f16> = (0..n * stride)
                    .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
                    .collect();
                let scale = 1.0 / (hd as f32).sqrt();
                let mut want = vec![0f32; hd];
                Path::Reference.attend(&q, &k, &v, stride, n, scale, &mut want);
                for &p in &paths {
                    let mut got = vec![0f32; hd];
                    p.attend(&q, &k, &v, stride, n, scale, &mut got);
                    let same = want
                        .iter()
                        .zip(&got)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{p:?} hd {hd} n {n}: {got:?} vs {want:?}");
                    // Two, three and four heads in one pass, the keys fed in two runs (as a tiled
                    // pass feeds them): each head's bits are its own.
                    let qs: Vec<Vec<f32>> = (0..4)
                        .map(|h| {
                            q.iter()
                                .map(|x| round_f16(x * (0.5 + 0.3 * h as f32) - 0.1 * h as f32))
                                .collect()
                        })
                        .collect();
                    heads_equal_reference::<2>(p, &qs, &k, &v, stride, n, scale);
                    heads_equal_reference::<3>(p, &qs, &k, &v, stride, n, scale);
                    heads_equal_reference::<4>(p, &qs, &k, &v, stride, n, scale);
                }
            }
        }
    }
}
