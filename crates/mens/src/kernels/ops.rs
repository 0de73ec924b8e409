//! Fused elementwise kernels of a transformer layer, each applied to `t` rows at once.
//! Each one is a single pass written for the compiler to vectorise; `tests` checks the fused ones
//! against unfused references.

use super::count_dispatch;
use super::kv::KvRowsMut;
use crate::model::KvType;
pub use crate::rope::{RopeStyle, RopeTable, MAX_HEAD_DIM};
use half::f16;

/// Values an elementwise op of a pass touches from which it runs on the pool (a prompt's; a
/// decode step's stay on the calling thread).
const POOL_FROM: usize = 1 << 15;

/// Runs `f` over 0..n: on the pool in one run per thread, each a multiple of `align` long but the
/// last, when the op touches `size` values or more; else `f(0..n)` on this thread. Runs must touch
/// disjoint data.
fn split(n: usize, size: usize, align: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
    let threads = super::pool::pool().threads();
    if n < 2 || threads == 1 || size < POOL_FROM {
        return f(0..n);
    }
    let per = n.div_ceil(threads).next_multiple_of(align).min(n);
    super::pool::pool().run(n.div_ceil(per), &|j| f(j * per..((j + 1) * per).min(n)));
}

/// [`split`] over `t` rows of `cols` values: row r's work must touch only row r's data.
fn by_rows(t: usize, cols: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
    split(t, t * cols, 1, f)
}

/// out[i] = x[i] / sqrt(mean(x²) + eps) * w[i], for each row of `x`.
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    count_dispatch();
    let d = w.len();
    let t = x.len() / d;
    assert!(out.len() >= t * d);
    let o = super::OutPtr(out.as_mut_ptr());
    by_rows(t, d, &|rows| {
        for r in rows {
            // SAFETY: row r of `out` (in bounds, asserted) is this task's alone.
            let or = unsafe { std::slice::from_raw_parts_mut(o.ptr().add(r * d), d) };
            norm_row(&x[r * d..(r + 1) * d], w, eps, or);
        }
    });
}

#[inline]
fn norm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let scale = inv_rms(x, eps);
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// The residual add fused with the next norm: x += delta; out = rmsnorm(x) * w. With `post`
/// (Gemma's norm after attention or the FFN), delta is normalised first: x += rmsnorm(delta) * post.
pub fn add_rmsnorm(
    x: &mut [f32],
    delta: &[f32],
    post: Option<&[f32]>,
    w: &[f32],
    eps: f32,
    out: &mut [f32],
) {
    count_dispatch();
    let d = w.len();
    let t = x.len() / d;
    assert!(delta.len() >= t * d && out.len() >= t * d);
    let (xp, op) = (
        super::OutPtr(x.as_mut_ptr()),
        super::OutPtr(out.as_mut_ptr()),
    );
    by_rows(t, d, &|rows| {
        for r in rows {
            // SAFETY: row r of `x` and of `out` (in bounds, asserted) are this task's alone.
            let (xr, or) = unsafe {
                (
                    std::slice::from_raw_parts_mut(xp.ptr().add(r * d), d),
                    std::slice::from_raw_parts_mut(op.ptr().add(r * d), d),
                )
            };
            add_norm_row(xr, &delta[r * d..(r + 1) * d], post, w, eps, or);
        }
    });
}

#[inline]
fn add_norm_row(
    xr: &mut [f32],
    dr: &[f32],
    post: Option<&[f32]>,
    w: &[f32],
    eps: f32,
    or: &mut [f32],
) {
    match post {
        None => {
            for (a, b) in xr.iter_mut().zip(dr) {
                *a += b;
            }
        }
        Some(pw) => {
            let s = inv_rms(dr, eps);
            for ((a, &b), &g) in xr.iter_mut().zip(dr).zip(pw) {
                *a += b * s * g;
            }
        }
    }
    norm_row(xr, w, eps, or);
}

#[inline]
fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let ss: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    1.0 / (ss + eps).sqrt()
}

/// Where the Q, K, V projections of `t` tokens lie in one [t, q_dim + 2 kv_dim] buffer.
pub struct QkvLayout {
    pub q_dim: usize,
    pub kv_dim: usize,
    pub head_dim: usize,
}

/// The fused step after the QKV matmul: add the biases, RMS-normalise each Q and K head (`qk_norm`:
/// the Q weights, the K weights, epsilon), rotate Q and K, and write K and V into the cache rows
/// `pos0..pos0+t` of each head (head-major: row `h * cap + pos`). With an f16 K cache, Q is rounded
/// to f16 as well, as llama.cpp does before its Q·K dot; with a quantized one Q stays f32 (attention
/// quantizes it as llama.cpp does).
#[allow(clippy::too_many_arguments)]
pub fn bias_rope_store(
    qkv: &mut [f32],
    t: usize,
    l: &QkvLayout,
    bias: Option<&[f32]>,
    qk_norm: Option<(&[f32], &[f32], f32)>,
    rope: &RopeTable,
    style: RopeStyle,
    pos0: usize,
    k_cache: &mut KvRowsMut,
    v_cache: &mut KvRowsMut,
    cap: usize,
) {
    count_dispatch();
    let row = l.q_dim + 2 * l.kv_dim;
    let hd = l.head_dim;
    let round_q = k_cache.t == KvType::F16;
    assert!(qkv.len() >= t * row);
    let base = super::OutPtr(qkv.as_mut_ptr());
    by_rows(t, row, &|rows| {
        for ti in rows {
            // SAFETY: token ti's row (in bounds, asserted) is this task's alone.
            let r = unsafe { std::slice::from_raw_parts_mut(base.ptr().add(ti * row), row) };
            bias_rope_row(r, l, bias, qk_norm, rope, style, pos0 + ti, round_q);
        }
    });
    for ti in 0..t {
        let kv = &qkv[ti * row + l.q_dim..(ti + 1) * row];
        let (k, v) = kv.split_at(l.kv_dim);
        for (h, (k, v)) in k.chunks_exact(hd).zip(v.chunks_exact(hd)).enumerate() {
            k_cache.store(h * cap + pos0 + ti, k);
            v_cache.store(h * cap + pos0 + ti, v);
        }
    }
}

/// One token's row of [`bias_rope_store`], before the cache stores.
#[allow(clippy::too_many_arguments)]
fn bias_rope_row(
    r: &mut [f32],
    l: &QkvLayout,
    bias: Option<&[f32]>,
    qk_norm: Option<(&[f32], &[f32], f32)>,
    rope: &RopeTable,
    style: RopeStyle,
    pos: usize,
    round_q: bool,
) {
    let hd = l.head_dim;
    if let Some(b) = bias {
        for (a, b) in r.iter_mut().zip(b) {
            *a += b;
        }
    }
    let (q, kv) = r.split_at_mut(l.q_dim);
    if let Some((wq, wk, eps)) = qk_norm {
        let mut tmp = [0f32; MAX_HEAD_DIM];
        let tmp = &mut tmp[..hd];
        for (part, w) in [(&mut *q, wq), (&mut kv[..l.kv_dim], wk)] {
            for h in part.chunks_exact_mut(hd) {
                norm_row(h, w, eps, tmp);
                h.copy_from_slice(tmp);
            }
        }
    }
    for h in q.chunks_exact_mut(l.head_dim) {
        rope.rotate(h, pos, style);
        if round_q {
            for x in h.iter_mut() {
                *x = f16::from_f32(*x).to_f32();
            }
        }
    }
    for h in kv[..l.kv_dim].chunks_exact_mut(l.head_dim) {
        rope.rotate(h, pos, style);
    }
}

/// A gated activation in place: row t of `gate_up` ([gate | up], 2 × ffn values) becomes
/// act(gate) * up, written to values t·ffn.. (the first t × ffn values end up as the [t, ffn]
/// result; no separate output buffer: 18 MiB at 512 rows of the 1.5B). Row t's output lies in rows
/// before it (or, for row 0, in its own gate half, each value written after it is read).
///
/// A prompt's rows are split by columns across the pool: value c of row t is written over value
/// c of row t / 2's gate or up half, the same column, which the same task read before (its rows go
/// in order), so no task writes what another still has to read.
/// `row(g, u, out, n)` computes n values; `out` is `g` itself for row 0, else disjoint from both.
fn glu_in_place(
    gate_up: &mut [f32],
    t: usize,
    ffn: usize,
    row: &(dyn Fn(*const f32, *const f32, *mut f32, usize) + Sync),
) {
    count_dispatch();
    assert!(gate_up.len() >= 2 * t * ffn);
    let base = super::OutPtr(gate_up.as_mut_ptr());
    // Runs of whole 8-value vectors (16: two) but the last.
    split(ffn, t * ffn, 16, &|cols| {
        let (c0, c1) = (cols.start, cols.end);
        for ti in 0..t {
            let p = base.ptr();
            // SAFETY: in bounds (asserted); see the comment above for why tasks do not collide.
            unsafe {
                row(
                    p.add(2 * ti * ffn + c0),
                    p.add((2 * ti + 1) * ffn + c0),
                    p.add(ti * ffn + c0),
                    c1 - c0,
                )
            };
        }
    });
}

/// SwiGLU in place: silu(gate) * up of each [gate | up] row of `gate_up`, the [t, ffn] result in
/// its first t × ffn values. Each value is `g / (1 + expf(-g)) * u` with glibc's expf (8 at a
/// time on AVX2, 16 in passes of 16 rows or more on AVX-512, with the same bits:
/// `attention::expf8`, `attention::expf16`).
pub fn swiglu(gate_up: &mut [f32], t: usize, ffn: usize) {
    // 512-bit vectors in prompt passes only: their matmuls are 512-bit too, where a decode step's
    // 512-bit op between 256-bit matmuls would pay the core's wide-vector warm-up (see
    // `attention::attend_avx2`).
    let wide = t >= WIDE_FROM;
    glu_in_place(gate_up, t, ffn, &|g, u, o, n| {
        // SAFETY: `glu_in_place` passes n readable values at g and u and n writable at o.
        unsafe { silu_row(g, u, o, n, wide) }
    });
}

/// Rows of a pass from which SwiGLU runs on 16 lanes where the CPU has AVX-512.
const WIDE_FROM: usize = 16;

/// silu(g) · u for n values (out may be g itself), on 16 lanes where `wide` and the CPU has
/// AVX-512, then 8 (AVX2), then one at a time: the same bits each way.
///
/// # Safety
/// n values readable at g and u and writable at out; out is g or disjoint from both.
unsafe fn silu_row(g: *const f32, u: *const f32, out: *mut f32, n: usize, wide: bool) {
    let mut i = 0;
    #[cfg(not(target_arch = "x86_64"))]
    let _ = wide;
    #[cfg(target_arch = "x86_64")]
    {
        use super::simd::{level, Level};
        if wide && level() == Level::Vnni {
            i = silu_avx512(g, u, out, n);
        }
        if level() != Level::None {
            i += silu_avx2(g.add(i), u.add(i), out.add(i), n - i);
        }
    }
    while i < n {
        let (gv, uv) = (*g.add(i), *u.add(i));
        *out.add(i) = gv / (1.0 + (-gv).exp()) * uv;
        i += 1;
    }
}

/// [`silu_row`] 8 values at a time; returns how many it did. expf's argument is capped at 100:
/// above 88.73 glibc's expf is infinite, and the table arithmetic needs a bounded argument.
///
/// # Safety
/// As [`silu_row`], and AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_avx2(g: *const f32, u: *const f32, out: *mut f32, n: usize) -> usize {
    use std::arch::x86_64::*;
    let mut i = 0;
    while i + 8 <= n {
        let gv = _mm256_loadu_ps(g.add(i));
        let uv = _mm256_loadu_ps(u.add(i));
        let neg = _mm256_sub_ps(_mm256_setzero_ps(), gv);
        let e = super::attention::expf8(_mm256_min_ps(neg, _mm256_set1_ps(100.0)));
        let s = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0), e));
        _mm256_storeu_ps(out.add(i), _mm256_mul_ps(s, uv));
        i += 8;
    }
    i
}

/// [`silu_avx2`] on 16 lanes ([`super::attention::expf16`]); returns how many it did.
///
/// # Safety
/// As [`silu_row`], and AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn silu_avx512(g: *const f32, u: *const f32, out: *mut f32, n: usize) -> usize {
    use std::arch::x86_64::*;
    let mut i = 0;
    while i + 16 <= n {
        let gv = _mm512_loadu_ps(g.add(i));
        let uv = _mm512_loadu_ps(u.add(i));
        let neg = _mm512_sub_ps(_mm512_setzero_ps(), gv);
        let e = super::attention::expf16(_mm512_min_ps(neg, _mm512_set1_ps(100.0)));
        let s = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0), e));
        _mm512_storeu_ps(out.add(i), _mm512_mul_ps(s, uv));
        i += 16;
    }
    i
}

/// GeGLU in place, as [`swiglu`], with GELU as llama.cpp's CPU computes it (`ggml_vec_geglu_f32`):
/// the tanh approximation looked up by the input rounded to f16, its result stored as f16, identity
/// above 10 and zero below -10.
pub fn geglu(gate_up: &mut [f32], t: usize, ffn: usize) {
    let table = gelu_table();
    glu_in_place(gate_up, t, ffn, &|g, u, o, n| {
        for i in 0..n {
            // SAFETY: `glu_in_place` passes n readable values at g and u and n writable at o;
            // value i is read before it is written.
            unsafe {
                let (g, u) = (*g.add(i), *u.add(i));
                *o.add(i) = if g <= -10.0 {
                    0.0
                } else if g >= 10.0 {
                    g * u
                } else {
                    table[f16::from_f32(g).to_bits() as usize].to_f32() * u
                };
            }
        }
    });
}

/// The tanh-approximated GELU in f32, as ggml writes it.
pub fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh())
}

/// GELU of every f16 value, as f16 (llama.cpp's `ggml_table_gelu_f16`): 128 KiB, built once.
fn gelu_table() -> &'static [f16] {
    static TABLE: std::sync::OnceLock<Vec<f16>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|b| f16::from_f32(gelu(f16::from_bits(b).to_f32())))
            .collect()
    })
}

/// Logit soft-capping: x = cap · tanh(x / cap).
pub fn softcap(x: &mut [f32], cap: f32) {
    count_dispatch();
    for v in x {
        *v = cap * (*v / cap).tanh();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn add_rmsnorm_equals_add_then_norm() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let d = 64;
        let x: Vec<f32> = (0..2 * d).map(|_| rng.gen_range(-3.0..3.0)).collect();
        let delta: Vec<f32> = (0..2 * d).map(|_| rng.gen_range(-3.0..3.0)).collect();
        let w: Vec<f32> = (0..d).map(|_| rng.gen_range(0.5..1.5)).collect();
        let (mut x1, mut o1) = (x.clone(), vec![0f32; 2 * d]);
        add_rmsnorm(&mut x1, &delta, None, &w, 1e-6, &mut o1);
        let (mut x2, mut o2) = (x.clone(), vec![0f32; 2 * d]);
        for (a, b) in x2.iter_mut().zip(&delta) {
            *a += b;
        }
        rmsnorm(&x2, &w, 1e-6, &mut o2);
        assert_eq!(x1, x2);
        assert_eq!(o1, o2);
        // The norm itself: unit RMS before the gain.
        let r: Vec<f32> = o2[..d].iter().zip(&w).map(|(o, g)| o / g).collect();
        let rms = (r.iter().map(|v| v * v).sum::<f32>() / d as f32).sqrt();
        assert!((rms - 1.0).abs() < 1e-3);
    }

    #[test]
    fn post_norm_equals_norm_then_add() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let d = 48;
        let x: Vec<f32> = (0..2 * d).map(|_| rng.gen_range(-3.0..3.0)).collect();
        let delta: Vec<f32> = (0..2 * d).map(|_| rng.gen_range(-30.0..30.0)).collect();
        let post: Vec<f32> = (0..d).map(|_| rng.gen_range(0.5..1.5)).collect();
        let w: Vec<f32> = (0..d).map(|_| rng.gen_range(0.5..1.5)).collect();
        let (mut x1, mut o1) = (x.clone(), vec![0f32; 2 * d]);
        add_rmsnorm(&mut x1, &delta, Some(&post), &w, 1e-6, &mut o1);
        let mut normed = vec![0f32; 2 * d];
        rmsnorm(&delta, &post, 1e-6, &mut normed);
        let (mut x2, mut o2) = (x.clone(), vec![0f32; 2 * d]);
        add_rmsnorm(&mut x2, &normed, None, &w, 1e-6, &mut o2);
        assert_eq!(x1, x2);
        assert_eq!(o1, o2);
        assert_ne!(x1, x, "the residual changed");
    }

    #[test]
    fn geglu_is_ggml_gelu_through_f16() {
        // Reference values of the exact tanh-GELU; the f16 lookup is within f16 rounding of them.
        for (x, want) in [
            (1.0f32, 0.841_192),
            (-0.5, -0.154_286),
            (3.0, 2.996_363),
            (0.0, 0.0),
        ] {
            assert!((gelu(x) - want).abs() < 1e-5, "gelu({x}) = {}", gelu(x));
            let mut gu = [x, 2.0];
            geglu(&mut gu, 1, 1);
            assert!((gu[0] - 2.0 * want).abs() <= 2.0 * want.abs() * 1e-3 + 1e-6);
        }
        let mut gu = [-11.0, 12.0, 3.0, 0.5];
        geglu(&mut gu, 1, 2);
        assert_eq!(gu[..2], [0.0, 6.0]);
        let mut l = [100.0f32, -3.0];
        softcap(&mut l, 30.0);
        assert!((l[0] - 30.0 * (100f32 / 30.0).tanh()).abs() < 1e-5 && l[0] < 30.0);
    }

    #[test]
    fn rope_rotation_preserves_norm_and_matches_angle() {
        let table = RopeTable::new(8, 4, 10000.0, None);
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

    /// SwiGLU and GeGLU over `t` rows of [gate | up] (`f` each) in place equal each row alone.
    fn glu_rows_equal_each_row_alone(rows: &[f32], t: usize, f: usize) {
        type Glu = fn(&mut [f32], usize, usize);
        for (name, glu) in [("swiglu", swiglu as Glu), ("geglu", geglu as Glu)] {
            let mut all = rows.to_vec();
            glu(&mut all, t, f);
            for ti in 0..t {
                let mut one = rows[ti * 2 * f..(ti + 1) * 2 * f].to_vec();
                glu(&mut one, 1, f);
                assert_eq!(all[ti * f..(ti + 1) * f], one[..f], "{name} row {ti}");
            }
        }
    }

    #[test]
    fn swiglu_and_argmax() {
        use crate::sample::argmax;
        let silu = |x: f32| x / (1.0 + (-x).exp());
        let mut gu = [1.0f32, -2.0, 3.0, 4.0];
        swiglu(&mut gu, 1, 2);
        assert!((gu[0] - silu(1.0) * 3.0).abs() < 1e-6);
        assert!((gu[1] - silu(-2.0) * 4.0).abs() < 1e-6);
        // In place over many rows: each row's result is what that row alone gives, bit for bit.
        let (t, f) = (7, 5);
        let rows: Vec<f32> = (0..t * 2 * f)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 3.0)
            .collect();
        glu_rows_equal_each_row_alone(&rows, t, f);
        // SwiGLU's value itself, in place in the gate half.
        let mut one = rows[..2 * f].to_vec();
        swiglu(&mut one, 1, f);
        assert_eq!(one[1], silu(rows[1]) * rows[f + 1]);
        assert_eq!(argmax(&[0.5, 2.0, 2.0, -1.0]), 1);
    }

    /// The vector SwiGLU gives the scalar formula's bits (glibc's expf) on a sweep of arguments
    /// both sides of zero and past expf's overflow and underflow, and on the special values.
    #[test]
    fn silu_rows_equal_the_scalar_formula() {
        let mut g = vec![
            0.0f32,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e30,
            -1e30,
        ];
        g.extend([
            88.7f32, 88.73, 88.8, -88.7, -88.73, -88.8, 103.9, -103.9, 104.0, -104.0,
        ]);
        for sign in [1.0f32, -1.0] {
            let mut b = 0f32.to_bits();
            while b <= 110f32.to_bits() {
                g.push(sign * f32::from_bits(b));
                b += 997;
            }
        }
        let u: Vec<f32> = (0..g.len())
            .map(|i| ((i * 31 % 17) as f32 - 8.0) / 3.0)
            .collect();
        let mut differ = 0;
        for wide in [false, true] {
            let mut out = vec![0f32; g.len()];
            // SAFETY: three buffers of g.len() values.
            unsafe { silu_row(g.as_ptr(), u.as_ptr(), out.as_mut_ptr(), g.len(), wide) };
            for ((&g, &u), &o) in g.iter().zip(&u).zip(&out) {
                let want = g / (1.0 + (-g).exp()) * u;
                if !(want.to_bits() == o.to_bits() || (want.is_nan() && o.is_nan())) {
                    differ += 1;
                    eprintln!("silu({g}) * {u}: {o} against {want}");
                }
            }
        }
        assert_eq!(differ, 0, "of {} values", g.len());
    }

    /// A prompt's gated activation, split by columns over the pool (odd width, so tasks end
    /// mid-vector), and its norms, split by rows, give each row's bits alone.
    #[test]
    fn prompt_ops_split_over_the_pool_equal_each_row_alone() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        let (t, f) = (40, 1203);
        let rows: Vec<f32> = (0..t * 2 * f).map(|_| rng.gen_range(-6.0..6.0)).collect();
        glu_rows_equal_each_row_alone(&rows, t, f);
        let d = 1536;
        let x: Vec<f32> = (0..t * d).map(|_| rng.gen_range(-3.0..3.0)).collect();
        let delta: Vec<f32> = (0..t * d).map(|_| rng.gen_range(-3.0..3.0)).collect();
        let w: Vec<f32> = (0..d).map(|_| rng.gen_range(0.5..1.5)).collect();
        let (mut xa, mut oa, mut na) = (x.clone(), vec![0f32; t * d], vec![0f32; t * d]);
        add_rmsnorm(&mut xa, &delta, Some(&w), &w, 1e-6, &mut oa);
        rmsnorm(&x, &w, 1e-6, &mut na);
        for r in 0..t {
            let span = r * d..(r + 1) * d;
            let (mut x1, mut o1, mut n1) = (x[span.clone()].to_vec(), vec![0f32; d], vec![0f32; d]);
            add_rmsnorm(&mut x1, &delta[span.clone()], Some(&w), &w, 1e-6, &mut o1);
            rmsnorm(&x[span.clone()], &w, 1e-6, &mut n1);
            assert_eq!(xa[span.clone()], x1[..], "row {r}");
            assert_eq!(oa[span.clone()], o1[..], "row {r}");
            assert_eq!(na[span], n1[..], "row {r}");
        }
    }
}
