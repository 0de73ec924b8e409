//! Fused elementwise kernels of a transformer layer, each applied to `t` rows at once.
//! Each one is a single pass written for the compiler to vectorise; `tests` checks the fused ones
//! against unfused references.

use super::count_dispatch;
use super::kv::KvRowsMut;
use crate::model::KvType;
pub use crate::rope::{RopeStyle, RopeTable, MAX_HEAD_DIM};
use half::f16;

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
    for ((xr, dr), or) in x
        .chunks_exact_mut(d)
        .zip(delta.chunks_exact(d))
        .zip(out.chunks_exact_mut(d))
    {
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
    for ti in 0..t {
        let r = &mut qkv[ti * row..(ti + 1) * row];
        if let Some(b) = bias {
            for (a, b) in r.iter_mut().zip(b) {
                *a += b;
            }
        }
        let pos = pos0 + ti;
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
        let (k, v) = kv.split_at_mut(l.kv_dim);
        for h in k.chunks_exact_mut(l.head_dim) {
            rope.rotate(h, pos, style);
        }
        for (h, (k, v)) in k.chunks_exact(hd).zip(v.chunks_exact(hd)).enumerate() {
            k_cache.store(h * cap + pos, k);
            v_cache.store(h * cap + pos, v);
        }
    }
}

/// A gated activation in place: row t of `gate_up` ([gate | up], 2 × ffn values) becomes
/// act(gate) * up, written to values t·ffn.. (the first t × ffn values end up as the [t, ffn]
/// result; no separate output buffer: 18 MiB at 512 rows of the 1.5B). Row t's output lies in rows
/// before it (or, for row 0, in its own gate half, each value written after it is read).
fn glu_in_place(gate_up: &mut [f32], t: usize, ffn: usize, act: impl Fn(f32, f32) -> f32) {
    count_dispatch();
    for ti in 0..t {
        if ti == 0 {
            let (g, u) = gate_up[..2 * ffn].split_at_mut(ffn);
            for (g, &u) in g.iter_mut().zip(u.iter()) {
                *g = act(*g, u);
            }
        } else {
            let (done, rest) = gate_up.split_at_mut(2 * ti * ffn);
            let (g, u) = rest[..2 * ffn].split_at(ffn);
            for ((o, &g), &u) in done[ti * ffn..(ti + 1) * ffn].iter_mut().zip(g).zip(u) {
                *o = act(g, u);
            }
        }
    }
}

/// SwiGLU in place: silu(gate) * up of each [gate | up] row of `gate_up`, the [t, ffn] result in
/// its first t × ffn values.
pub fn swiglu(gate_up: &mut [f32], t: usize, ffn: usize) {
    glu_in_place(gate_up, t, ffn, |g, u| g / (1.0 + (-g).exp()) * u);
}

/// GeGLU in place, as [`swiglu`], with GELU as llama.cpp's CPU computes it (`ggml_vec_geglu_f32`):
/// the tanh approximation looked up by the input rounded to f16, its result stored as f16, identity
/// above 10 and zero below -10.
pub fn geglu(gate_up: &mut [f32], t: usize, ffn: usize) {
    let table = gelu_table();
    glu_in_place(gate_up, t, ffn, |g, u| {
        if g <= -10.0 {
            0.0
        } else if g >= 10.0 {
            g * u
        } else {
            table[f16::from_f32(g).to_bits() as usize].to_f32() * u
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
        type Glu = fn(&mut [f32], usize, usize);
        for (name, glu) in [("swiglu", swiglu as Glu), ("geglu", geglu as Glu)] {
            let mut all = rows.clone();
            glu(&mut all, t, f);
            for ti in 0..t {
                let mut one = rows[ti * 2 * f..(ti + 1) * 2 * f].to_vec();
                glu(&mut one, 1, f);
                assert_eq!(all[ti * f..(ti + 1) * f], one[..f], "{name} row {ti}");
            }
        }
        // SwiGLU's value itself, in place in the gate half.
        let mut one = rows[..2 * f].to_vec();
        swiglu(&mut one, 1, f);
        assert_eq!(one[1], silu(rows[1]) * rows[f + 1]);
        assert_eq!(argmax(&[0.5, 2.0, 2.0, -1.0]), 1);
    }
}
