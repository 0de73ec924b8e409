//! Causal attention against the f16 KV cache, written to give the same numbers as llama.cpp's CPU
//! flash-attention kernel (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`, its path for decode
//! and for short prompts), the oracle of the tests:
//! - Q is rounded to f16 (done when Q is stored, `ops::bias_rope_store`);
//! - Q·K is summed in the order of ggml's AVX-512 `ggml_vec_dot_f16`: four 16-lane accumulators
//!   over 64-wide steps, reduced 0+2, 1+3, 0+1, then lanes at distance 8, 4, 2, 1; any tail of the
//!   head dimension beyond a multiple of 64 added in f64;
//! - an online softmax over the keys in order, with glibc's `expf` (ported here, `expf`, so that the
//!   AVX-512 path can run it 16 lanes at a time with the same bits), and the V accumulator rounded to f16
//!   after every update; the running sum as `S = S·ms + vs` with one rounding (an FMA).
//!
//! `attend_ref` is the plain reference; `attend_avx2` and `attend_avx512` give bit-identical results
//! (tested). The AVX-512 one is the fast path: Q·K and `expf` for 16 keys at a time, then the
//! sequential accumulator updates (no function call in the loop, so the accumulators stay in registers).

use super::count_dispatch;
use super::ops::{QkvLayout, MAX_HEAD_DIM};
use half::f16;

/// Causal attention of `t` query rows (at positions pos0..pos0+t) against the f16 cache (head-major:
/// [kv head][cap][head_dim]), one pass per (token, head), so it needs no score buffer. GQA: query head h reads KV head
/// h / (n_head / n_kv_head) straight from the cache, without copies.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    qkv: &[f32],
    t: usize,
    l: &QkvLayout,
    n_head: usize,
    n_kv_head: usize,
    pos0: usize,
    k_cache: &[f16],
    v_cache: &[f16],
    cap: usize,
    out: &mut [f32],
) {
    count_dispatch();
    let hd = l.head_dim;
    let group = n_head / n_kv_head;
    let row = l.q_dim + 2 * l.kv_dim;
    let scale = 1.0 / (hd as f32).sqrt();
    let path = Path::get(hd);
    // A task is a run of query heads of one KV group for one token: the heads of a group read the
    // same K/V rows, so one thread reads them from memory once and then from its own cache. Groups
    // are split only when there are fewer (token, group) pairs than threads.
    let threads = super::pool::pool().threads();
    let parts = threads.div_ceil(t * n_kv_head).clamp(1, group);
    let per = group.div_ceil(parts);
    let parts = group.div_ceil(per);
    let work = |j: usize, o: &mut [f32]| {
        let (ti, kvh, c) = (j / (n_kv_head * parts), j / parts % n_kv_head, j % parts);
        let h0 = kvh * group + c * per;
        let n = pos0 + ti + 1;
        assert!(n <= cap);
        let k = &k_cache[kvh * cap * hd..(kvh * cap + n) * hd];
        let v = &v_cache[kvh * cap * hd..(kvh * cap + n) * hd];
        for (i, o) in o.chunks_exact_mut(hd).enumerate() {
            let h = h0 + i;
            let q = &qkv[ti * row + h * hd..ti * row + (h + 1) * hd];
            path.attend(q, k, v, hd, n, scale, o);
        }
    };
    // Task j's output: heads h0..h0+len of token ti, contiguous in `out`.
    let span = |j: usize| {
        let (ti, kvh, c) = (j / (n_kv_head * parts), j / parts % n_kv_head, j % parts);
        let h0 = kvh * group + c * per;
        let len = per.min(group - c * per);
        (ti * l.q_dim + h0 * hd, len * hd)
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

/// Which implementation runs for a head dimension on this CPU.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    Reference,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Path {
    fn get(hd: usize) -> Path {
        #[cfg(target_arch = "x86_64")]
        {
            use super::simd::{avx512f, level, Level};
            if hd % 64 == 0 && hd <= MAX_HEAD_DIM {
                if avx512f() {
                    return Path::Avx512;
                }
                if level() != Level::None {
                    return Path::Avx2;
                }
            }
        }
        let _ = hd;
        Path::Reference
    }

    /// One query head against `n` cached positions (rows `stride` apart), into `out`.
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
        match self {
            Path::Reference => attend_ref(q, k, v, stride, n, scale, out),
            // SAFETY: the paths are chosen by CPU features (`Path::get`), hd % 64 == 0, and the
            // caller checked that the cache holds n rows.
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => unsafe { attend_avx2(q, k, v, stride, n, scale, out) },
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => unsafe {
                match q.len() {
                    64 => attend_avx512::<4>(q, k, v, stride, n, scale, out),
                    128 => attend_avx512::<8>(q, k, v, stride, n, scale, out),
                    192 => attend_avx512::<12>(q, k, v, stride, n, scale, out),
                    _ => attend_avx512::<16>(q, k, v, stride, n, scale, out),
                }
            },
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
/// argument tested; written out so that the AVX-512 path can compute 16 at a time identically.
#[inline]
fn expf(x: f32) -> f32 {
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

/// `expf` on 16 lanes.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn expf16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let tab = |i: usize| _mm512_loadu_si512(EXP2_TAB.as_ptr().add(i * 8) as *const _);
    let (t0, t1, t2, t3) = (tab(0), tab(1), tab(2), tab(3));
    let half = |xd: __m512d| -> __m256 {
        let k = _mm512_fmadd_pd(_mm512_set1_pd(INV_LN2_N), xd, _mm512_set1_pd(SHIFT));
        let ki = _mm512_castpd_si512(k);
        let kd = _mm512_sub_pd(k, _mm512_set1_pd(SHIFT));
        let r = _mm512_fmadd_pd(
            _mm512_set1_pd(INV_LN2_N),
            xd,
            _mm512_sub_pd(_mm512_setzero_pd(), kd),
        );
        let lo = _mm512_permutex2var_epi64(t0, ki, t1);
        let hi = _mm512_permutex2var_epi64(t2, ki, t3);
        let t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(ki, _mm512_set1_epi64(16)), lo, hi);
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

/// The reference: llama.cpp's one-chunk flash attention for one query row.
fn attend_ref(
    q: &[f32],
    k: &[f16],
    v: &[f16],
    stride: usize,
    n: usize,
    scale: f32,
    out: &mut [f32],
) {
    let hd = q.len();
    let mut acc = [0f32; MAX_HEAD_DIM];
    let acc = &mut acc[..hd];
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
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
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for (o, a) in out.iter_mut().zip(acc.iter()) {
        *o = a * inv;
    }
}

/// `attend_ref` with AVX2/F16C, for CPUs without AVX-512: each 16-lane vector of ggml's order is two
/// 8-lane halves. Requires hd % 64 == 0.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_avx2(
    q: &[f32],
    k: &[f16],
    v: &[f16],
    stride: usize,
    n: usize,
    scale: f32,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let hd = q.len();
    let lanes = hd / 8;
    let mut acc = [_mm256_setzero_ps(); MAX_HEAD_DIM / 8];
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
    let round = |x: __m256| _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
    for p in 0..n {
        let kp = k.as_ptr().add(p * stride) as *const __m128i;
        // s[j][h]: accumulator j (of four), half h (of the 16 lanes).
        let mut s = [[_mm256_setzero_ps(); 2]; 4];
        for c in 0..lanes {
            let (j, h) = ((c / 2) % 4, c % 2);
            s[j][h] = _mm256_fmadd_ps(
                _mm256_cvtph_ps(_mm_loadu_si128(kp.add(c))),
                _mm256_loadu_ps(q.as_ptr().add(c * 8)),
                s[j][h],
            );
        }
        let mut x = [_mm256_setzero_ps(); 2];
        for (h, x) in x.iter_mut().enumerate() {
            *x = _mm256_add_ps(
                _mm256_add_ps(s[0][h], s[2][h]),
                _mm256_add_ps(s[1][h], s[3][h]),
            );
        }
        let b = _mm256_add_ps(x[1], x[0]);
        let c = _mm_add_ps(_mm256_extractf128_ps(b, 1), _mm256_castps256_ps128(b));
        let d = _mm_add_ps(c, _mm_movehl_ps(c, c));
        let s = _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d))) * scale;
        let (mut ms, mut vs) = (1f32, 1f32);
        if s > max {
            ms = expf(max - s);
            max = s;
            let m = _mm256_set1_ps(ms);
            for a in acc[..lanes].iter_mut() {
                *a = round(_mm256_mul_ps(*a, m));
            }
        } else {
            vs = expf(s - max);
        }
        let e = _mm256_set1_ps(vs);
        let vp = v.as_ptr().add(p * stride) as *const __m128i;
        for (j, a) in acc[..lanes].iter_mut().enumerate() {
            *a = round(_mm256_fmadd_ps(
                _mm256_cvtph_ps(_mm_loadu_si128(vp.add(j))),
                e,
                *a,
            ));
        }
        sum = sum.mul_add(ms, vs);
    }
    let inv = _mm256_set1_ps(if sum == 0.0 { 0.0 } else { 1.0 / sum });
    for (j, a) in acc[..lanes].iter().enumerate() {
        _mm256_storeu_ps(out.as_mut_ptr().add(j * 8), _mm256_mul_ps(*a, inv));
    }
}

/// `attend_ref` with AVX-512 for head dimension `16 * L` (L a multiple of 4): Q·K of 16 keys at a
/// time, their 16 lane-reductions done together in the same order (a transposing tree), then the
/// sequential softmax and f16 accumulator updates.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn attend_avx512<const L: usize>(
    q: &[f32],
    k: &[f16],
    v: &[f16],
    stride: usize,
    n: usize,
    scale: f32,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let qv: [__m512; L] = std::array::from_fn(|j| _mm512_loadu_ps(q.as_ptr().add(j * 16)));
    let mut acc = [_mm512_setzero_ps(); L];
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
    let round = |x: __m512| _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
    // Lane 4t + u of the tree's result holds key t + 4u; this index puts key i in lane i.
    let unscramble = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let mut p0 = 0;
    while p0 < n {
        let m = (n - p0).min(16);
        // One 16-lane vector per key: the four accumulators already folded (0+2, 1+3, 0+1).
        let mut w = [_mm512_setzero_ps(); 16];
        for (i, w) in w[..m].iter_mut().enumerate() {
            let kp = k.as_ptr().add((p0 + i) * stride) as *const __m256i;
            let mut s = [_mm512_setzero_ps(); 4];
            for j in 0..L {
                s[j % 4] = _mm512_fmadd_ps(
                    _mm512_cvtph_ps(_mm256_loadu_si256(kp.add(j))),
                    qv[j],
                    s[j % 4],
                );
            }
            *w = _mm512_add_ps(_mm512_add_ps(s[0], s[2]), _mm512_add_ps(s[1], s[3]));
        }
        // Distance 8: pairs of keys share a vector, 8 lanes each.
        let w1: [__m512; 8] = std::array::from_fn(|j| {
            let (a, b) = (w[2 * j], w[2 * j + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
                _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
            )
        });
        // Distance 4: four keys a vector, one 128-bit quarter each.
        let w2: [__m512; 4] = std::array::from_fn(|j| {
            let (a, b) = (w1[2 * j], w1[2 * j + 1]);
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
                _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            )
        });
        // Distance 2, then 1, inside each quarter.
        let w3: [__m512; 2] = std::array::from_fn(|j| {
            let (a, b) = (w2[2 * j], w2[2 * j + 1]);
            _mm512_add_ps(
                _mm512_shuffle_ps::<0b11_10_11_10>(a, b),
                _mm512_shuffle_ps::<0b01_00_01_00>(a, b),
            )
        });
        let w4 = _mm512_add_ps(
            _mm512_shuffle_ps::<0b10_00_10_00>(w3[0], w3[1]),
            _mm512_shuffle_ps::<0b11_01_11_01>(w3[0], w3[1]),
        );
        let sv = _mm512_mul_ps(_mm512_permutexvar_ps(unscramble, w4), _mm512_set1_ps(scale));
        let mut sc = [0f32; 16];
        _mm512_storeu_ps(sc.as_mut_ptr(), sv);
        // The running max before and after each key, then all the exponentials at once:
        // vs = expf(s − max after), ms = expf(max before − max after) (1 where the max stays).
        let (mut before, mut after) = ([0f32; 16], [0f32; 16]);
        for i in 0..m {
            before[i] = max;
            if sc[i] > max {
                max = sc[i];
            }
            after[i] = max;
        }
        let (bv, av) = (
            _mm512_loadu_ps(before.as_ptr()),
            _mm512_loadu_ps(after.as_ptr()),
        );
        let mut vs = [0f32; 16];
        let mut ms = [0f32; 16];
        _mm512_storeu_ps(vs.as_mut_ptr(), expf16(_mm512_sub_ps(sv, av)));
        _mm512_storeu_ps(ms.as_mut_ptr(), expf16(_mm512_sub_ps(bv, av)));
        for i in 0..m {
            if sc[i] > before[i] {
                let mv = _mm512_set1_ps(ms[i]);
                for a in acc.iter_mut() {
                    *a = round(_mm512_mul_ps(*a, mv));
                }
                sum = sum.mul_add(ms[i], 1.0);
            } else {
                sum += vs[i];
            }
            let e = _mm512_set1_ps(vs[i]);
            let vp = v.as_ptr().add((p0 + i) * stride) as *const __m256i;
            for (j, a) in acc.iter_mut().enumerate() {
                *a = round(_mm512_fmadd_ps(
                    _mm512_cvtph_ps(_mm256_loadu_si256(vp.add(j))),
                    e,
                    *a,
                ));
            }
        }
        p0 += m;
    }
    let inv = _mm512_set1_ps(if sum == 0.0 { 0.0 } else { 1.0 / sum });
    for (j, a) in acc.iter().enumerate() {
        _mm512_storeu_ps(out.as_mut_ptr().add(j * 16), _mm512_mul_ps(*a, inv));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Online-softmax GQA attention equals a two-pass softmax reference with repeated KV heads.
    #[test]
    fn attention_matches_two_pass_softmax() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for hd in [16, 64] {
            let (n_head, n_kv, t, pos0) = (6, 2, 3, 5);
            let l = QkvLayout {
                q_dim: n_head * hd,
                kv_dim: n_kv * hd,
                head_dim: hd,
            };
            let row = l.q_dim + 2 * l.kv_dim;
            let qkv: Vec<f32> = (0..t * row).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let ctx = pos0 + t;
            let kc: Vec<f16> = (0..ctx * l.kv_dim)
                .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
                .collect();
            let vc: Vec<f16> = (0..ctx * l.kv_dim)
                .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
                .collect();
            let mut out = vec![0f32; t * l.q_dim];
            attention(&qkv, t, &l, n_head, n_kv, pos0, &kc, &vc, ctx, &mut out);
            for ti in 0..t {
                for h in 0..n_head {
                    let q = &qkv[ti * row + h * hd..ti * row + (h + 1) * hd];
                    let kvh = h / (n_head / n_kv);
                    let n = pos0 + ti + 1;
                    let scores: Vec<f32> = (0..n)
                        .map(|p| {
                            let k = &kc[(kvh * ctx + p) * hd..][..hd];
                            q.iter().zip(k).map(|(a, b)| a * b.to_f32()).sum::<f32>()
                                / (hd as f32).sqrt()
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                    let e: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f32 = e.iter().sum();
                    for j in 0..hd {
                        let want: f32 = (0..n)
                            .map(|p| e[p] / z * vc[(kvh * ctx + p) * hd + j].to_f32())
                            .sum();
                        let got = out[ti * l.q_dim + h * hd + j];
                        assert!(
                            (want - got).abs() < 2e-3,
                            "hd {hd} t{ti} h{h} j{j}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// `expf` is the system's expf where that is glibc's (same bits on a sweep of [−104, 0]), and
    /// within one f32 rounding of the true value everywhere; `expf16` equals `expf` lane by lane.
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
        #[cfg(target_arch = "x86_64")]
        if super::super::simd::avx512f() {
            let xs: Vec<f32> = (0..4096)
                .map(|i| -(i as f32) * 0.0254 - 1e-3 * (i % 7) as f32)
                .collect();
            for c in xs.chunks_exact(16) {
                let mut out = [0f32; 16];
                // SAFETY: AVX-512F checked.
                unsafe {
                    use std::arch::x86_64::*;
                    _mm512_storeu_ps(out.as_mut_ptr(), expf16(_mm512_loadu_ps(c.as_ptr())));
                }
                for (x, y) in c.iter().zip(out) {
                    assert_eq!(expf(*x).to_bits(), y.to_bits(), "expf16({x})");
                }
            }
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

    /// The SIMD paths give the same bits as the reference, for every head dimension they take and
    /// key counts around the 16-key blocks of the AVX-512 path.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_paths_equal_the_reference_bit_for_bit() {
        use super::super::simd::{avx512f, level, Level};
        let mut paths = Vec::new();
        if level() != Level::None {
            paths.push(Path::Avx2);
        }
        if avx512f() {
            paths.push(Path::Avx512);
        }
        if paths.is_empty() {
            eprintln!("SKIP: no AVX2 or AVX-512 on this CPU");
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for hd in [64, 128, 192, 256] {
            for n in [1, 2, 15, 16, 17, 37, 300] {
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
                attend_ref(&q, &k, &v, stride, n, scale, &mut want);
                for &p in &paths {
                    let mut got = vec![0f32; hd];
                    p.attend(&q, &k, &v, stride, n, scale, &mut got);
                    let same = want
                        .iter()
                        .zip(&got)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{p:?} hd {hd} n {n}: {got:?} vs {want:?}");
                }
            }
        }
    }
}
