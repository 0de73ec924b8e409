//! Fused elementwise kernels of a transformer layer, each applied to `t` rows at once.
//! Each one is a single pass written for the compiler to vectorise; `tests` checks the fused ones
//! against unfused references.

use super::count_dispatch;
use half::f16;
use half::slice::HalfFloatSliceExt;

/// out[i] = x[i] / sqrt(mean(x²) + eps) * w[i], for each row of `x`.
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    count_dispatch();
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        norm_row(xr, w, eps, or);
    }
}

#[inline]
fn norm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let scale = 1.0 / (ss + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// The residual add fused with the next norm: x += delta; out = rmsnorm(x) * w.
pub fn add_rmsnorm(x: &mut [f32], delta: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    count_dispatch();
    let d = w.len();
    for ((xr, dr), or) in x
        .chunks_exact_mut(d)
        .zip(delta.chunks_exact(d))
        .zip(out.chunks_exact_mut(d))
    {
        for (a, b) in xr.iter_mut().zip(dr) {
            *a += b;
        }
        norm_row(xr, w, eps, or);
    }
}

/// x += delta.
pub fn add(x: &mut [f32], delta: &[f32]) {
    count_dispatch();
    for (a, b) in x.iter_mut().zip(delta) {
        *a += b;
    }
}

/// How rotary embeddings pair the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (i, i + d/2): GPT-NeoX and Qwen2.
    Neox,
    /// Pairs (2i, 2i+1): Llama as converted to GGUF.
    Normal,
}

/// cos/sin for every (position, frequency): [ctx, head_dim/2] each. Built once per session.
pub struct RopeTable {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    half: usize,
}

impl RopeTable {
    pub fn new(ctx: usize, head_dim: usize, base: f32) -> Self {
        let half = head_dim / 2;
        let mut cos = vec![0f32; ctx * half];
        let mut sin = vec![0f32; ctx * half];
        for p in 0..ctx {
            for i in 0..half {
                let freq = 1.0 / (base as f64).powf(2.0 * i as f64 / head_dim as f64);
                let a = p as f64 * freq;
                cos[p * half + i] = a.cos() as f32;
                sin[p * half + i] = a.sin() as f32;
            }
        }
        RopeTable { cos, sin, half }
    }

    #[inline]
    pub fn rotate(&self, v: &mut [f32], pos: usize, style: RopeStyle) {
        let half = self.half;
        let c = &self.cos[pos * half..(pos + 1) * half];
        let s = &self.sin[pos * half..(pos + 1) * half];
        match style {
            RopeStyle::Neox => {
                let (a, b) = v.split_at_mut(half);
                for i in 0..half {
                    let (x0, x1) = (a[i], b[i]);
                    a[i] = x0 * c[i] - x1 * s[i];
                    b[i] = x0 * s[i] + x1 * c[i];
                }
            }
            RopeStyle::Normal => {
                for i in 0..half {
                    let (x0, x1) = (v[2 * i], v[2 * i + 1]);
                    v[2 * i] = x0 * c[i] - x1 * s[i];
                    v[2 * i + 1] = x0 * s[i] + x1 * c[i];
                }
            }
        }
    }
}

/// Where the Q, K, V projections of `t` tokens lie in one [t, q_dim + 2 kv_dim] buffer.
pub struct QkvLayout {
    pub q_dim: usize,
    pub kv_dim: usize,
    pub head_dim: usize,
}

/// The fused step after the QKV matmul: add the biases, rotate Q and K, and write K and V into
/// the f16 cache rows `pos0..pos0+t` (cache rows are kv_dim long). Q is rounded to f16 as well, as
/// llama.cpp does before its Q·K dot with an f16 cache.
#[allow(clippy::too_many_arguments)]
pub fn bias_rope_store(
    qkv: &mut [f32],
    t: usize,
    l: &QkvLayout,
    bias: Option<&[f32]>,
    rope: &RopeTable,
    style: RopeStyle,
    pos0: usize,
    k_cache: &mut [f16],
    v_cache: &mut [f16],
) {
    count_dispatch();
    let row = l.q_dim + 2 * l.kv_dim;
    for ti in 0..t {
        let r = &mut qkv[ti * row..(ti + 1) * row];
        if let Some(b) = bias {
            for (a, b) in r.iter_mut().zip(b) {
                *a += b;
            }
        }
        let pos = pos0 + ti;
        let (q, kv) = r.split_at_mut(l.q_dim);
        for h in q.chunks_exact_mut(l.head_dim) {
            rope.rotate(h, pos, style);
            for x in h.iter_mut() {
                *x = f16::from_f32(*x).to_f32();
            }
        }
        let (k, v) = kv.split_at_mut(l.kv_dim);
        for h in k.chunks_exact_mut(l.head_dim) {
            rope.rotate(h, pos, style);
        }
        k_cache[pos * l.kv_dim..(pos + 1) * l.kv_dim].convert_from_f32_slice(k);
        v_cache[pos * l.kv_dim..(pos + 1) * l.kv_dim].convert_from_f32_slice(v);
    }
}

pub const MAX_HEAD_DIM: usize = 256;

/// Causal attention of `t` query rows (at positions pos0..pos0+t) against the f16 cache, one pass per
/// (token, head) with an online softmax, so it needs no score buffer. The V accumulator is rounded
/// to f16 after each update, as in llama.cpp's CPU flash-attention path with an f16 cache: this keeps
/// greedy choices at near-ties closer to llama.cpp's (measured on Qwen2.5-Coder-1.5B). GQA: query head h reads KV head
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
    out: &mut [f32],
) {
    count_dispatch();
    let hd = l.head_dim;
    let group = n_head / n_kv_head;
    let row = l.q_dim + 2 * l.kv_dim;
    let scale = 1.0 / (hd as f32).sqrt();
    let simd = cfg!(target_arch = "x86_64")
        && super::simd::level() != super::simd::Level::None
        && hd % 8 == 0;
    let work = |(i, o): (usize, &mut [f32])| {
        let (ti, h) = (i / n_head, i % n_head);
        let q = &qkv[ti * row + h * hd..ti * row + (h + 1) * hd];
        let (kvh, n) = (h / group, pos0 + ti + 1);
        let k = &k_cache[kvh * hd..];
        let v = &v_cache[kvh * hd..];
        if simd {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX2+FMA+F16C checked; q, o are hd long and the cache holds n rows of kv_dim.
            unsafe {
                attend_x86(q, k, v, l.kv_dim, n, scale, o)
            }
        } else {
            attend(q, k, v, l.kv_dim, n, scale, o);
        }
    };
    let out = &mut out[..t * l.q_dim];
    if t * n_head * (pos0 + t) < 4096 {
        out.chunks_exact_mut(hd).enumerate().for_each(work);
    } else {
        let base = super::OutPtr(out.as_mut_ptr());
        super::pool::pool().run(t * n_head, &|i| {
            // SAFETY: task i writes only its own head_dim slice of `out`.
            let o = unsafe { std::slice::from_raw_parts_mut(base.ptr().add(i * hd), hd) };
            work((i, o));
        });
    }
}

/// One query head against `n` cached positions (rows `stride` apart): online softmax, V
/// accumulated in f16 precision as llama.cpp's CPU flash attention does. The reference for `attend_x86`.
fn attend(q: &[f32], k: &[f16], v: &[f16], stride: usize, n: usize, scale: f32, out: &mut [f32]) {
    let hd = q.len();
    let mut acc = [0f32; MAX_HEAD_DIM];
    let acc = &mut acc[..hd];
    let mut kbuf = [0f32; MAX_HEAD_DIM];
    let kf = &mut kbuf[..hd];
    let mut vbuf = [0f32; MAX_HEAD_DIM];
    let vf = &mut vbuf[..hd];
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
    for p in 0..n {
        k[p * stride..p * stride + hd].convert_to_f32_slice(kf);
        let s = dot(q, kf) * scale;
        v[p * stride..p * stride + hd].convert_to_f32_slice(vf);
        if s > max {
            let c = (max - s).exp();
            sum *= c;
            for a in acc.iter_mut() {
                *a = f16::from_f32(*a * c).to_f32();
            }
            max = s;
        }
        let e = (s - max).exp();
        sum += e;
        for (a, &vv) in acc.iter_mut().zip(vf.iter()) {
            *a = f16::from_f32(*a + e * vv).to_f32();
        }
    }
    let inv = 1.0 / sum;
    for (o, a) in out.iter_mut().zip(acc.iter()) {
        *o = a * inv;
    }
}

/// `attend` with AVX2/F16C: 8 lanes at a time, the f16 rounding of the accumulator through
/// vcvtps2ph/vcvtph2ps. The same operations per lane as `attend` (up to the Q·K summation order and
/// fused multiply-adds).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_x86(
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
    assert!(
        lanes <= MAX_HEAD_DIM / 8
            && k.len() >= (n - 1) * stride + hd
            && v.len() >= (n - 1) * stride + hd
    );
    let mut acc = [_mm256_setzero_ps(); MAX_HEAD_DIM / 8];
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
    let round = |x: __m256| _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
    for p in 0..n {
        let kp = k.as_ptr().add(p * stride) as *const __m128i;
        let mut s0 = _mm256_setzero_ps();
        let mut s1 = _mm256_setzero_ps();
        let mut j = 0;
        while j + 1 < lanes {
            s0 = _mm256_fmadd_ps(
                _mm256_loadu_ps(q.as_ptr().add(j * 8)),
                _mm256_cvtph_ps(_mm_loadu_si128(kp.add(j))),
                s0,
            );
            s1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(q.as_ptr().add(j * 8 + 8)),
                _mm256_cvtph_ps(_mm_loadu_si128(kp.add(j + 1))),
                s1,
            );
            j += 2;
        }
        if j < lanes {
            s0 = _mm256_fmadd_ps(
                _mm256_loadu_ps(q.as_ptr().add(j * 8)),
                _mm256_cvtph_ps(_mm_loadu_si128(kp.add(j))),
                s0,
            );
        }
        let sv = _mm256_add_ps(s0, s1);
        let mut r = _mm_add_ps(_mm256_extractf128_ps(sv, 1), _mm256_castps256_ps128(sv));
        r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        r = _mm_add_ss(r, _mm_movehdup_ps(r));
        let s = _mm_cvtss_f32(r) * scale;
        if s > max {
            let c = (max - s).exp();
            sum *= c;
            let cv = _mm256_set1_ps(c);
            for a in acc[..lanes].iter_mut() {
                *a = round(_mm256_mul_ps(*a, cv));
            }
            max = s;
        }
        let e = (s - max).exp();
        sum += e;
        let ev = _mm256_set1_ps(e);
        let vp = v.as_ptr().add(p * stride) as *const __m128i;
        for (j, a) in acc[..lanes].iter_mut().enumerate() {
            *a = round(_mm256_fmadd_ps(
                ev,
                _mm256_cvtph_ps(_mm_loadu_si128(vp.add(j))),
                *a,
            ));
        }
    }
    let inv = _mm256_set1_ps(1.0 / sum);
    for (j, a) in acc[..lanes].iter().enumerate() {
        _mm256_storeu_ps(out.as_mut_ptr().add(j * 8), _mm256_mul_ps(*a, inv));
    }
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent accumulators so that the compiler vectorises the reduction.
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// SwiGLU: out[t, i] = silu(gate_up[t, i]) * gate_up[t, ffn + i], gate and up side by side per row.
pub fn swiglu(gate_up: &[f32], t: usize, ffn: usize, out: &mut [f32]) {
    count_dispatch();
    for ti in 0..t {
        let r = &gate_up[ti * 2 * ffn..(ti + 1) * 2 * ffn];
        let (g, u) = r.split_at(ffn);
        for ((o, &g), &u) in out[ti * ffn..(ti + 1) * ffn].iter_mut().zip(g).zip(u) {
            *o = g / (1.0 + (-g).exp()) * u;
        }
    }
}

/// Index of the largest value (the first one on ties), as llama.cpp's greedy sampler.
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    let mut bv = f32::NEG_INFINITY;
    for (i, &v) in x.iter().enumerate() {
        if v > bv {
            bv = v;
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Online-softmax GQA attention equals a two-pass softmax reference with repeated KV heads.
    #[test]
    fn attention_matches_reference() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let (n_head, n_kv, hd, t, pos0) = (6, 2, 16, 3, 5);
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
        attention(&qkv, t, &l, n_head, n_kv, pos0, &kc, &vc, &mut out);
        for ti in 0..t {
            for h in 0..n_head {
                let q = &qkv[ti * row + h * hd..ti * row + (h + 1) * hd];
                let kvh = h / (n_head / n_kv);
                let n = pos0 + ti + 1;
                let scores: Vec<f32> = (0..n)
                    .map(|p| {
                        let k = &kc[p * l.kv_dim + kvh * hd..][..hd];
                        q.iter().zip(k).map(|(a, b)| a * b.to_f32()).sum::<f32>()
                            / (hd as f32).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for j in 0..hd {
                    let want: f32 = (0..n)
                        .map(|p| e[p] / z * vc[p * l.kv_dim + kvh * hd + j].to_f32())
                        .sum();
                    let got = out[ti * l.q_dim + h * hd + j];
                    assert!(
                        (want - got).abs() < 2e-3,
                        "t{ti} h{h} j{j}: {got} vs {want}"
                    );
                }
            }
        }
    }

    /// The AVX2 attention equals the scalar one.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn attend_x86_matches_attend() {
        if crate::kernels::simd::level() == crate::kernels::simd::Level::None {
            eprintln!("SKIP: no AVX2+FMA+F16C on this CPU");
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for (hd, n) in [(64, 1), (64, 37), (128, 300), (24, 9)] {
            let stride = 2 * hd;
            let q: Vec<f32> = (0..hd).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let k: Vec<f16> = (0..n * stride)
                .map(|_| f16::from_f32(rng.gen_range(-2.0..2.0)))
                .collect();
            let v: Vec<f16> = (0..n * stride)
                .map(|_| f16::from_f32(rng.gen_range(-1.0..1.0)))
                .collect();
            let (mut a, mut b) = (vec![0f32; hd], vec![0f32; hd]);
            attend(&q, &k, &v, stride, n, 0.125, &mut a);
            unsafe { attend_x86(&q, &k, &v, stride, n, 0.125, &mut b) };
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() < 2e-3, "hd {hd} n {n}: {x} vs {y}");
            }
        }
    }

    #[test]
    fn add_rmsnorm_equals_add_then_norm() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let d = 64;
        let x: Vec<f32> = (0..2 * d).map(|_| rng.gen_range(-3.0..3.0)).collect();
        let delta: Vec<f32> = (0..2 * d).map(|_| rng.gen_range(-3.0..3.0)).collect();
        let w: Vec<f32> = (0..d).map(|_| rng.gen_range(0.5..1.5)).collect();
        let (mut x1, mut o1) = (x.clone(), vec![0f32; 2 * d]);
        add_rmsnorm(&mut x1, &delta, &w, 1e-6, &mut o1);
        let (mut x2, mut o2) = (x.clone(), vec![0f32; 2 * d]);
        add(&mut x2, &delta);
        rmsnorm(&x2, &w, 1e-6, &mut o2);
        assert_eq!(x1, x2);
        assert_eq!(o1, o2);
        // The norm itself: unit RMS before the gain.
        let r: Vec<f32> = o2[..d].iter().zip(&w).map(|(o, g)| o / g).collect();
        let rms = (r.iter().map(|v| v * v).sum::<f32>() / d as f32).sqrt();
        assert!((rms - 1.0).abs() < 1e-3);
    }

    #[test]
    fn rope_rotation_preserves_norm_and_matches_angle() {
        let table = RopeTable::new(8, 4, 10000.0);
        for style in [RopeStyle::Neox, RopeStyle::Normal] {
            let mut v = [1.0f32, 0.0, 0.0, 0.0];
            if style == RopeStyle::Normal {
                v = [1.0, 0.0, 0.0, 0.0];
            }
            table.rotate(&mut v, 3, style);
            let n: f32 = v.iter().map(|x| x * x).sum();
            assert!((n - 1.0).abs() < 1e-6);
            // First frequency is 1 rad/position: cos(3) lands in the first slot for both styles.
            assert!((v[0] - 3f32.cos()).abs() < 1e-6);
            let partner = if style == RopeStyle::Neox { v[2] } else { v[1] };
            assert!((partner - 3f32.sin()).abs() < 1e-6);
        }
    }

    #[test]
    fn swiglu_and_argmax() {
        let gu = [1.0f32, -2.0, 3.0, 4.0];
        let mut out = [0f32; 2];
        swiglu(&gu, 1, 2, &mut out);
        let silu = |x: f32| x / (1.0 + (-x).exp());
        assert!((out[0] - silu(1.0) * 3.0).abs() < 1e-6);
        assert!((out[1] - silu(-2.0) * 4.0).abs() < 1e-6);
        assert_eq!(argmax(&[0.5, 2.0, 2.0, -1.0]), 1);
    }
}
