//! Attention of a prompt pass of at least [`FROM`] query rows over an f16 cache, computed the way
//! llama.cpp's CPU flash attention computes such passes (`ggml_compute_forward_flash_attn_ext_tiled`,
//! which it runs from 64 query rows): keys in tiles of 64, scores and V accumulators in f32, the
//! softmax's running max moved once per tile. Passes below 64 rows (decode, a verify pass, a short
//! chunk) keep llama.cpp's one-chunk arithmetic (`attention.rs`), as llama.cpp does; so, as in
//! llama.cpp, a long prompt's logits are close to, not bit-equal to, decoding its tokens one by one.
//! `MENS_PROMPT_ATTN=exact` (or `Session::exact_attention`) runs every pass the one-chunk way.
//!
//! A row's numbers do not depend on the pass it is in: key tiles start at multiples of 64 of the
//! absolute position, and each (token, head) row runs the same operations whatever other rows
//! share its block (tested), so a prompt gives the same bits in one pass or in chunks of 64 rows
//! or more.
//!
//! A task is one KV head and a block of tokens with every query head of the group: each K/V tile
//! is read from memory once per block and widened to f32 once; then on AVX-512 the heads of a
//! token go through it up to six at a time (`rows_tile_avx512`: each loaded key vector serves all
//! of them), elsewhere one at a time.

use super::attention::{run_finish, run_start, Mask, RUN_HEADER};
use super::kv::KvRows;
use super::ops::{QkvLayout, MAX_HEAD_DIM};

/// Query rows from which a pass takes this path (llama.cpp's `GGML_FA_TILE_Q`).
pub const FROM: usize = 64;
/// Keys a tile holds (llama.cpp's `GGML_FA_TILE_KV`).
const KEYS: usize = 64;
/// Tokens of a query block at most.
const TOKENS: usize = 16;

/// Whether long prompt passes may take this path: not when `MENS_PROMPT_ATTN=exact` (for A/B runs
/// in one binary).
pub fn allowed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MENS_PROMPT_ATTN").as_deref() != Ok("exact"))
}

thread_local! {
    /// A worker's scratch: the widened K (transposed) and V tiles, the block's runs (the layout of
    /// `attention::RUN_HEADER`, with f32 accumulators), a tile's weights.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Causal (or sliding-window) attention of `t` ≥ 1 query rows at positions pos0.. against an f16
/// cache ([kv head][cap][head_dim]) into `out` ([t][q_dim]); see the module comment.
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
    mask: Mask,
    out: &mut [f32],
) {
    let hd = l.head_dim;
    let group = n_head / n_kv_head;
    let row = l.q_dim + 2 * l.kv_dim;
    assert!(pos0 + t <= cap && out.len() >= t * l.q_dim && qkv.len() >= t * row);
    let (kf, vf) = (k_cache.f16(), v_cache.f16());
    assert!(kf.len() >= n_kv_head * cap * hd && vf.len() >= n_kv_head * cap * hd);
    let base = super::OutPtr(out.as_mut_ptr());
    // The AVX2 row kernel takes the accumulator 8 values at a time, the AVX-512 one 64.
    let simd = wide() && hd.is_multiple_of(8);
    let simd512 = wide512() && hd.is_multiple_of(64);
    let sl = RUN_HEADER + hd;
    let work = |kvh: usize, t0: usize, t1: usize| {
        let end = |ti: usize| pos0 + ti + 1;
        let lo = |ti: usize| end(ti).saturating_sub(mask.window);
        let rows = (t1 - t0) * group;
        SCRATCH.with(|sc| {
            let mut sc = sc.borrow_mut();
            let need = 2 * KEYS * hd + rows * sl + 6 * KEYS;
            if sc.len() < need {
                sc.resize(need, 0.0);
            }
            let (kt, rest) = sc.split_at_mut(KEYS * hd);
            let (vt, rest) = rest.split_at_mut(KEYS * hd);
            let (runs, rest) = rest.split_at_mut(rows * sl);
            let p = &mut rest[..6 * KEYS];
            for st in runs.chunks_exact_mut(sl) {
                run_start(st);
            }
            // Tiles at multiples of KEYS of the absolute position, whatever the block.
            let mut k0 = lo(t0) / KEYS * KEYS;
            while k0 < end(t1 - 1) {
                let k1 = (k0 + KEYS).min(end(t1 - 1));
                let n = k1 - k0;
                // The tile widened to f32: K transposed ([d][key], keys contiguous), V as rows.
                let first = kvh * cap + k0;
                let (kr, vr) = (
                    &kf[first * hd..(first + n) * hd],
                    &vf[first * hd..(first + n) * hd],
                );
                widen(vr, &mut vt[..n * hd]);
                for key in 0..n {
                    let mut row = [0f32; MAX_HEAD_DIM];
                    widen(&kr[key * hd..(key + 1) * hd], &mut row[..hd]);
                    for (d, x) in row[..hd].iter().enumerate() {
                        kt[d * KEYS + key] = *x;
                    }
                }
                for key in n..KEYS {
                    for d in 0..hd {
                        kt[d * KEYS + key] = 0.0;
                    }
                }
                for ti in t0..t1 {
                    let (a, b) = (lo(ti).max(k0), end(ti).min(k1));
                    if a >= b {
                        continue;
                    }
                    #[cfg(target_arch = "x86_64")]
                    if simd512 {
                        // The token's heads in one pass up to 6 (the registers hold 6 rows'
                        // 24 accumulators), else four at a time (7 = 4 + 3).
                        let range = (a - k0, b - k0);
                        let most = if group <= 6 { group } else { 4 };
                        let mut h = 0;
                        while h < group {
                            let n = (group - h).min(most);
                            let r = (ti - t0) * group + h;
                            let at = ti * row + (kvh * group + h) * hd;
                            let q = &qkv[at..at + n * hd];
                            let st = &mut runs[r * sl..(r + n) * sl];
                            // SAFETY: `wide512` says AVX-512F, AVX2 and FMA are present; hd % 64 == 0.
                            unsafe { rows_tile_n(n, q, kt, vt, range, mask.scale, st, p) };
                            h += n;
                        }
                        continue;
                    }
                    let _ = simd512;
                    for h in 0..group {
                        let r = (ti - t0) * group + h;
                        let at = ti * row + (kvh * group + h) * hd;
                        let q = &qkv[at..at + hd];
                        let st = &mut runs[r * sl..(r + 1) * sl];
                        let range = (a - k0, b - k0);
                        #[cfg(target_arch = "x86_64")]
                        if simd {
                            // SAFETY: `wide` says AVX2 and FMA are present, and hd % 8 == 0.
                            unsafe { row_tile_avx2(q, kt, vt, range, mask.scale, st, p) };
                            continue;
                        }
                        let _ = simd;
                        row_tile(q, kt, vt, range, mask.scale, st, p);
                    }
                }
                k0 = k1;
            }
            for ti in t0..t1 {
                for h in 0..group {
                    let r = (ti - t0) * group + h;
                    let at = ti * l.q_dim + (kvh * group + h) * hd;
                    // SAFETY: (token, head) spans are disjoint across tasks and inside `out`.
                    let o = unsafe { std::slice::from_raw_parts_mut(base.ptr().add(at), hd) };
                    run_finish(&runs[r * sl..(r + 1) * sl], o);
                }
            }
        });
    };
    super::attention::token_blocks(t, n_kv_head, n_head, pos0, TOKENS, &work);
}

/// f16 values as f32 (F16C where the CPU has it).
fn widen(x: &[half::f16], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if wide() {
        // SAFETY: AVX2 and F16C are present (the level says so); the lengths are equal.
        unsafe { widen_f16c(x, out) };
        return;
    }
    for (o, v) in out.iter_mut().zip(x) {
        *o = v.to_f32();
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn widen_f16c(x: &[half::f16], out: &mut [f32]) {
    use std::arch::x86_64::*;
    assert_eq!(x.len(), out.len());
    let n8 = x.len() / 8 * 8;
    for i in (0..n8).step_by(8) {
        let h = _mm_loadu_si128(x.as_ptr().add(i) as *const __m128i);
        _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
    }
    for i in n8..x.len() {
        out[i] = x[i].to_f32();
    }
}

/// Whether the AVX2 kernel runs (on x86-64 with AVX2 and FMA).
fn wide() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::simd::level() != super::simd::Level::None
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the AVX-512 kernel runs (the VNNI level implies AVX-512F; `MENS_CPU=avx2` turns it off).
fn wide512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::simd::level() == super::simd::Level::Vnni
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// One query row against keys `range` of a tile: scores, then the run `st` (running max, sum and
/// an f32 accumulator) updated as llama.cpp's tiled kernel updates them (the reference).
fn row_tile(
    q: &[f32],
    kt: &[f32],
    vt: &[f32],
    (a, b): (usize, usize),
    scale: f32,
    st: &mut [f32],
    p: &mut [f32],
) {
    let hd = q.len();
    let (st, acc) = st.split_at_mut(RUN_HEADER);
    let mut tmax = f32::NEG_INFINITY;
    for key in a..b {
        let s: f32 = (0..hd).map(|d| q[d] * kt[d * KEYS + key]).sum::<f32>() * scale;
        p[key] = s;
        tmax = tmax.max(s);
    }
    let (m, sum) = (st[0], st[1]);
    let mnew = m.max(tmax);
    let mut sum = sum;
    if mnew > m {
        let f = (m - mnew).exp();
        acc.iter_mut().for_each(|x| *x *= f);
        sum *= f;
    }
    for key in a..b {
        let e = (p[key] - mnew).exp();
        sum += e;
        for (x, v) in acc.iter_mut().zip(&vt[key * hd..(key + 1) * hd]) {
            *x = v.mul_add(e, *x);
        }
    }
    st[0] = mnew;
    st[1] = sum;
}

/// [`row_tile`] on 256-bit vectors: the scores of 8 keys a vector over the transposed K tile,
/// `expf` 8 lanes at a time, the accumulator 64 values at a time in registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_tile_avx2(
    q: &[f32],
    kt: &[f32],
    vt: &[f32],
    (a, b): (usize, usize),
    scale: f32,
    st: &mut [f32],
    p: &mut [f32],
) {
    use std::arch::x86_64::*;
    let hd = q.len();
    let (st, acc) = st.split_at_mut(RUN_HEADER);
    debug_assert!(
        hd.is_multiple_of(8) && kt.len() >= hd * KEYS && vt.len() >= KEYS * hd && p.len() >= KEYS
    );
    // Scores of the tile's 64 keys (vectors past `b` are not needed).
    let nv = b.div_ceil(8);
    let mut s = [_mm256_setzero_ps(); KEYS / 8];
    let ktp = kt.as_ptr();
    for d in 0..hd {
        let qd = _mm256_set1_ps(*q.get_unchecked(d));
        let kr = ktp.add(d * KEYS);
        for (j, s) in s.iter_mut().enumerate().take(nv) {
            *s = _mm256_fmadd_ps(qd, _mm256_loadu_ps(kr.add(8 * j)), *s);
        }
    }
    let sc = _mm256_set1_ps(scale);
    for (j, s) in s.iter().enumerate().take(nv) {
        _mm256_storeu_ps(p.as_mut_ptr().add(8 * j), _mm256_mul_ps(*s, sc));
    }
    let mut tmax = f32::NEG_INFINITY;
    for &x in &p[a..b] {
        tmax = tmax.max(x);
    }
    let m = st[0];
    let mnew = m.max(tmax);
    let mut sum = st[1];
    if mnew > m {
        let f = super::attention::expf(m - mnew);
        let fv = _mm256_set1_ps(f);
        for c in acc.chunks_exact_mut(8) {
            _mm256_storeu_ps(
                c.as_mut_ptr(),
                _mm256_mul_ps(_mm256_loadu_ps(c.as_ptr()), fv),
            );
        }
        sum *= f;
    }
    // Keys outside [a, b) get no weight.
    for x in &mut p[..a] {
        *x = f32::NEG_INFINITY;
    }
    for x in &mut p[b..nv * 8] {
        *x = f32::NEG_INFINITY;
    }
    let mv = _mm256_set1_ps(mnew);
    let mut sv = _mm256_setzero_ps();
    for j in 0..nv {
        let e = super::attention::expf8(_mm256_sub_ps(_mm256_loadu_ps(p.as_ptr().add(8 * j)), mv));
        sv = _mm256_add_ps(sv, e);
        _mm256_storeu_ps(p.as_mut_ptr().add(8 * j), e);
    }
    let h = _mm_add_ps(_mm256_castps256_ps128(sv), _mm256_extractf128_ps::<1>(sv));
    let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    let h = _mm_add_ss(h, _mm_shuffle_ps::<1>(h, h));
    sum += _mm_cvtss_f32(h);
    // acc += Σ p[key] · V[key], 64 values of the row at a time in 8 registers.
    let vp = vt.as_ptr();
    for c0 in (0..hd).step_by(64) {
        let w = (hd - c0).min(64) / 8;
        let mut r = [_mm256_setzero_ps(); 8];
        for (i, r) in r.iter_mut().enumerate().take(w) {
            *r = _mm256_loadu_ps(acc.as_ptr().add(c0 + 8 * i));
        }
        for key in a..b {
            let e = _mm256_set1_ps(*p.get_unchecked(key));
            let vr = vp.add(key * hd + c0);
            for (i, r) in r.iter_mut().enumerate().take(w) {
                *r = _mm256_fmadd_ps(_mm256_loadu_ps(vr.add(8 * i)), e, *r);
            }
        }
        for (i, r) in r.iter().enumerate().take(w) {
            _mm256_storeu_ps(acc.as_mut_ptr().add(c0 + 8 * i), *r);
        }
    }
    st[0] = mnew;
    st[1] = sum;
}

/// [`row_tile`] for `R` ≤ 6 query rows of one token (the same keys `range`) on 512-bit vectors:
/// the scores of the tile's 64 keys as 4 vectors a row, each loaded key vector serving every
/// row; the softmax in registers (`exp16`); then `acc += p · V` 64 values of each row at a time,
/// each loaded V vector serving every row. Each row's operations are those it gets alone (a key's
/// score summed over d in order, the accumulator updated key by key), so its bits do not depend on
/// the other rows. hd % 64 == 0.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn rows_tile_avx512<const R: usize>(
    q: &[f32],
    kt: &[f32],
    vt: &[f32],
    (a, b): (usize, usize),
    scale: f32,
    runs: &mut [f32],
    p: &mut [f32],
) {
    use std::arch::x86_64::*;
    let hd = q.len() / R;
    let sl = RUN_HEADER + hd;
    debug_assert!(hd.is_multiple_of(64) && a < b && b <= KEYS);
    debug_assert!(kt.len() >= hd * KEYS && vt.len() >= b * hd && runs.len() >= R * sl);
    debug_assert!(p.len() >= R * KEYS);
    let (ktp, qp) = (kt.as_ptr(), q.as_ptr());
    let mut s = [[_mm512_setzero_ps(); 4]; R];
    for d in 0..hd {
        let kr = ktp.add(d * KEYS);
        let k = [
            _mm512_loadu_ps(kr),
            _mm512_loadu_ps(kr.add(16)),
            _mm512_loadu_ps(kr.add(32)),
            _mm512_loadu_ps(kr.add(48)),
        ];
        for (r, s) in s.iter_mut().enumerate() {
            let qd = _mm512_set1_ps(*qp.add(r * hd + d));
            for (s, k) in s.iter_mut().zip(k) {
                *s = _mm512_fmadd_ps(qd, k, *s);
            }
        }
    }
    // Lanes of keys outside [a, b) get -inf, then weight 0.
    let iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let inside: [__mmask16; 4] = std::array::from_fn(|j| {
        let key = _mm512_add_epi32(iota, _mm512_set1_epi32(16 * j as i32));
        _mm512_cmpge_epi32_mask(key, _mm512_set1_epi32(a as i32))
            & _mm512_cmplt_epi32_mask(key, _mm512_set1_epi32(b as i32))
    });
    let (sc, ninf) = (_mm512_set1_ps(scale), _mm512_set1_ps(f32::NEG_INFINITY));
    let rp = runs.as_mut_ptr();
    for (r, s) in s.iter().enumerate() {
        let x: [__m512; 4] =
            std::array::from_fn(|j| _mm512_mask_blend_ps(inside[j], ninf, _mm512_mul_ps(s[j], sc)));
        let tmax = _mm512_reduce_max_ps(_mm512_max_ps(
            _mm512_max_ps(x[0], x[1]),
            _mm512_max_ps(x[2], x[3]),
        ));
        let st = rp.add(r * sl);
        let m = *st;
        let mnew = m.max(tmax);
        let mut sum = *st.add(1);
        if mnew > m {
            let f = super::attention::expf(m - mnew);
            let fv = _mm512_set1_ps(f);
            let acc = st.add(RUN_HEADER);
            for c in (0..hd).step_by(16) {
                _mm512_storeu_ps(acc.add(c), _mm512_mul_ps(_mm512_loadu_ps(acc.add(c)), fv));
            }
            sum *= f;
        }
        let mv = _mm512_set1_ps(mnew);
        let e: [__m512; 4] = std::array::from_fn(|j| exp16(_mm512_sub_ps(x[j], mv)));
        sum += _mm512_reduce_add_ps(_mm512_add_ps(
            _mm512_add_ps(e[0], e[1]),
            _mm512_add_ps(e[2], e[3]),
        ));
        for (j, e) in e.iter().enumerate() {
            _mm512_storeu_ps(p.as_mut_ptr().add(r * KEYS + 16 * j), *e);
        }
        *st = mnew;
        *st.add(1) = sum;
    }
    // acc += Σ p[key] · V[key], 64 values of each row at a time.
    let (vp, pp) = (vt.as_ptr(), p.as_ptr());
    for c0 in (0..hd).step_by(64) {
        let mut acc = [[_mm512_setzero_ps(); 4]; R];
        for (r, acc) in acc.iter_mut().enumerate() {
            let at = rp.add(r * sl + RUN_HEADER + c0);
            for (i, x) in acc.iter_mut().enumerate() {
                *x = _mm512_loadu_ps(at.add(16 * i));
            }
        }
        for key in a..b {
            let vr = vp.add(key * hd + c0);
            let v = [
                _mm512_loadu_ps(vr),
                _mm512_loadu_ps(vr.add(16)),
                _mm512_loadu_ps(vr.add(32)),
                _mm512_loadu_ps(vr.add(48)),
            ];
            for (r, acc) in acc.iter_mut().enumerate() {
                let e = _mm512_set1_ps(*pp.add(r * KEYS + key));
                for (x, v) in acc.iter_mut().zip(v) {
                    *x = _mm512_fmadd_ps(v, e, *x);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let at = rp.add(r * sl + RUN_HEADER + c0);
            for (i, x) in acc.iter().enumerate() {
                _mm512_storeu_ps(at.add(16 * i), *x);
            }
        }
    }
}

/// [`rows_tile_avx512`] for `n` (1 to 6) rows: `q` and `runs` hold `n` rows.
///
/// # Safety
/// As [`rows_tile_avx512`].
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_tile_n(
    n: usize,
    q: &[f32],
    kt: &[f32],
    vt: &[f32],
    range: (usize, usize),
    scale: f32,
    runs: &mut [f32],
    p: &mut [f32],
) {
    match n {
        6 => rows_tile_avx512::<6>(q, kt, vt, range, scale, runs, p),
        5 => rows_tile_avx512::<5>(q, kt, vt, range, scale, runs, p),
        4 => rows_tile_avx512::<4>(q, kt, vt, range, scale, runs, p),
        3 => rows_tile_avx512::<3>(q, kt, vt, range, scale, runs, p),
        2 => rows_tile_avx512::<2>(q, kt, vt, range, scale, runs, p),
        1 => rows_tile_avx512::<1>(q, kt, vt, range, scale, runs, p),
        _ => unreachable!("1 to 6 rows a pass"),
    }
}

/// e^x on 16 lanes for x ≤ 0 (a score minus the running max; -inf and anything below the f32
/// range give 0): x = n ln 2 + r with |r| ≤ ln 2 / 2, e^r by its Taylor series to r^6 (error
/// below 2e-7 relative), scaled by 2^n. Not glibc's bits: this path needs no bit agreement with
/// the one-chunk kernel.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn exp16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let keep = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(-87.0));
    let x = _mm512_max_ps(x, _mm512_set1_ps(-87.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    // ln 2 in two parts, the first exact in few bits, so that n · LN2_HI is exact.
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut y = _mm512_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(c));
    }
    _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(y, n))
}

#[cfg(test)]
mod tests {
    use super::super::attention::tests::{f16_rows, random_pass};
    use super::*;
    use half::f16;
    use rand::{Rng, SeedableRng};

    /// Against a two-pass softmax in f64 over the same cache values, for head sizes 64, 128 and
    /// 256, groups of 6 and 7, causal and sliding-window masks, a cached prefix, and blocks and
    /// tiles that end anywhere; every output written (poisoned first).
    #[test]
    fn prompt_attention_matches_a_two_pass_softmax() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let all = usize::MAX;
        for (hd, n_head, n_kv, t, pos0, window) in [
            (64, 14, 2, 64, 0, all),
            (64, 14, 2, 150, 37, all),
            (128, 12, 2, 100, 130, all),
            (256, 4, 1, 70, 5, all),
            (64, 6, 2, 90, 40, 37),
        ] {
            let cap = pos0 + t + 3;
            let (l, row, qkv, kb, vb) = random_pass(&mut rng, (hd, n_head, n_kv), t, cap);
            let scale = 0.7 / (hd as f32).sqrt();
            let mask = Mask { scale, window };
            let mut out = vec![f32::NAN; t * l.q_dim];
            attention(
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
            let f = |b: &Vec<u16>, i: usize| f16::from_bits(b[i]).to_f32() as f64;
            let mut worst = 0f64;
            for ti in 0..t {
                for h in 0..n_head {
                    let kvh = h / (n_head / n_kv);
                    let q = &qkv[ti * row + h * hd..ti * row + (h + 1) * hd];
                    let end = pos0 + ti + 1;
                    let lo = end.saturating_sub(window);
                    let sc: Vec<f64> = (lo..end)
                        .map(|p| {
                            (0..hd)
                                .map(|d| q[d] as f64 * f(&kb, (kvh * cap + p) * hd + d))
                                .sum::<f64>()
                                * scale as f64
                        })
                        .collect();
                    let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for d in 0..hd {
                        let want: f64 = (lo..end)
                            .zip(&e)
                            .map(|(p, e)| e / z * f(&vb, (kvh * cap + p) * hd + d))
                            .sum();
                        let got = out[ti * l.q_dim + h * hd + d] as f64;
                        worst = worst.max((got - want).abs());
                        assert!(
                            (got - want).abs() < 1e-4,
                            "hd {hd}, t {t} after {pos0}, window {window}: token {ti} head {h} value {d}: {got} against {want}"
                        );
                    }
                }
            }
            eprintln!(
                "hd {hd}, {n_head}/{n_kv} heads, t {t} after {pos0}: worst |error| {worst:.2e}"
            );
        }
    }

    /// The AVX2 kernel and the scalar reference agree on one tile (same arithmetic up to the
    /// order of the score sums and the exp).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx2_row_kernel_matches_the_reference() {
        if !wide() {
            eprintln!("SKIP (not run, not passed): no AVX2 on this CPU");
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for hd in [64, 128, 256] {
            for (a, b) in [(0, 64), (5, 40), (63, 64), (0, 1)] {
                let q: Vec<f32> = (0..hd).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let kt: Vec<f32> = (0..hd * KEYS).map(|_| rng.gen_range(-2.0..2.0)).collect();
                let vt: Vec<f32> = (0..hd * KEYS).map(|_| rng.gen_range(-2.0..2.0)).collect();
                // A run in progress: max 0.3, sum 2.5, then the accumulator.
                let run: Vec<f32> = [0.3f32, 2.5]
                    .into_iter()
                    .chain((0..hd).map(|_| rng.gen_range(-1.0..1.0)))
                    .collect();
                let (mut s1, mut s2) = (run.clone(), run);
                let (mut p1, mut p2) = (vec![0f32; KEYS], vec![0f32; KEYS]);
                row_tile(&q, &kt, &vt, (a, b), 0.1, &mut s1, &mut p1);
                // SAFETY: AVX2 and FMA are present (checked above).
                unsafe { row_tile_avx2(&q, &kt, &vt, (a, b), 0.1, &mut s2, &mut p2) };
                assert!(
                    (s1[0] - s2[0]).abs() < 1e-5
                        && (s1[1] - s2[1]).abs() < 1e-4 * s1[1].abs().max(1.0)
                );
                for (x, y) in s1[RUN_HEADER..].iter().zip(&s2[RUN_HEADER..]) {
                    assert!(
                        (x - y).abs() < 1e-4 * x.abs().max(1.0),
                        "hd {hd} [{a}, {b}): {x} against {y}"
                    );
                }
            }
        }
    }

    /// The AVX-512 kernel against the reference on one tile, for 1 to 6 rows, head sizes 64, 128
    /// and 256, and ranges that start and end anywhere; each row equals itself run alone, bit for
    /// bit (its numbers do not depend on the rows beside it).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx512_rows_kernel_matches_the_reference() {
        if !wide512() {
            eprintln!("SKIP (not run, not passed): no AVX-512 on this CPU");
            return;
        }
        const N: usize = 6;
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for hd in [64, 128, 256] {
            for (a, b) in [(0, 64), (5, 40), (63, 64), (0, 1), (17, 18)] {
                let sl = RUN_HEADER + hd;
                let q: Vec<f32> = (0..N * hd).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let kt: Vec<f32> = (0..hd * KEYS).map(|_| rng.gen_range(-2.0..2.0)).collect();
                let vt: Vec<f32> = (0..hd * KEYS).map(|_| rng.gen_range(-2.0..2.0)).collect();
                // Runs in progress (max 0.3 or 9, sum 2.5), and fresh ones.
                let mut runs: Vec<f32> = Vec::new();
                for r in 0..N {
                    let head = match r {
                        0 => [0.3f32, 2.5],
                        1 => [9.0, 2.5],
                        _ => [f32::NEG_INFINITY, 0.0],
                    };
                    runs.extend(head);
                    runs.extend((0..hd).map(|_| {
                        if r >= 2 {
                            0.0
                        } else {
                            rng.gen_range(-1.0..1.0)
                        }
                    }));
                }
                let mut want = runs.clone();
                let mut p = vec![0f32; KEYS];
                for r in 0..N {
                    let st = &mut want[r * sl..(r + 1) * sl];
                    row_tile(&q[r * hd..(r + 1) * hd], &kt, &vt, (a, b), 0.1, st, &mut p);
                }
                let mut alone = runs.clone();
                let mut pn = vec![0f32; N * KEYS];
                for r in 0..N {
                    // SAFETY: AVX-512F, AVX2 and FMA are present (checked above).
                    unsafe {
                        rows_tile_avx512::<1>(
                            &q[r * hd..(r + 1) * hd],
                            &kt,
                            &vt,
                            (a, b),
                            0.1,
                            &mut alone[r * sl..(r + 1) * sl],
                            &mut pn,
                        )
                    };
                }
                for (i, (x, y)) in alone.iter().zip(&want).enumerate() {
                    assert!(
                        (x - y).abs() <= 1e-4 * y.abs().max(1.0),
                        "hd {hd} [{a}, {b}) value {i}: {x} against the reference {y}"
                    );
                }
                // 2 to 6 rows together: each row's bits as alone.
                for n in 2..=N {
                    let mut together = runs.clone();
                    let (q, st) = (&q[..n * hd], &mut together[..n * sl]);
                    // SAFETY: as above.
                    unsafe { rows_tile_n(n, q, &kt, &vt, (a, b), 0.1, st, &mut pn) };
                    for (i, (x, y)) in together[..n * sl].iter().zip(&alone).enumerate() {
                        assert_eq!(
                            x.to_bits(),
                            y.to_bits(),
                            "hd {hd} [{a}, {b}) value {i}: {n} rows"
                        );
                    }
                }
            }
        }
    }

    /// A row's output is the same, bit for bit, whether its pass starts at position 0 or later,
    /// and whatever block it falls in: a prompt in one pass equals the same prompt in chunks of
    /// 64 rows or more (causal and sliding-window masks; head sizes 64 and 128).
    #[test]
    fn a_rows_output_does_not_depend_on_its_pass() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for (hd, n_head, n_kv, window) in [
            (64, 14, 2, usize::MAX),
            (128, 12, 2, usize::MAX),
            (64, 6, 2, 100),
        ] {
            let t = 300;
            let (l, row, qkv, kb, vb) = random_pass(&mut rng, (hd, n_head, n_kv), t, t);
            let mask = Mask {
                scale: 1.0 / (hd as f32).sqrt(),
                window,
            };
            let run = |from: usize, to: usize| {
                let mut out = vec![f32::NAN; (to - from) * l.q_dim];
                attention(
                    &qkv[from * row..to * row],
                    to - from,
                    &l,
                    n_head,
                    n_kv,
                    from,
                    f16_rows(&kb, hd),
                    f16_rows(&vb, hd),
                    t,
                    mask,
                    &mut out,
                );
                out
            };
            let whole = run(0, t);
            for (from, to) in [(0, 70), (70, 137), (137, 300), (101, 300)] {
                let part = run(from, to);
                let same = &whole[from * l.q_dim..to * l.q_dim];
                for (i, (x, y)) in part.iter().zip(same).enumerate() {
                    assert_eq!(
                        x.to_bits(),
                        y.to_bits(),
                        "hd {hd}, window {window}: rows {from}..{to}, value {i}: {x} in the chunk, {y} in one pass"
                    );
                }
            }
        }
    }
}
