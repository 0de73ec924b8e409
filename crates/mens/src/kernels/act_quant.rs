//! Activation rows quantized for the dot products: Q8_0 (for Q4_0/Q5_0/Q8_0 weights) and Q8_K (for
//! the K-quants), byte for byte what candle's `from_float` writes.
//!
//! Written here because mens is built for the x86-64 baseline: candle's versions are compiled
//! without SSE4.1, so each rounding is a libm call (measured: 3% of a 0.5B prefill). The same scalar
//! code is compiled twice, once with AVX2 enabled (vectorised) and once for the baseline, and chosen
//! at run time.

use super::simd::{level, Level};
use half::f16;

/// Quantize `src` (a multiple of 32 values) into Q8_0 blocks (34 bytes each) in `dst`.
pub fn q8_0(src: &[f32], dst: &mut [u8]) {
    q8_0_isa(level() == Level::None, src, dst)
}

/// Quantize `src` (a multiple of 256 values) into Q8_K blocks (292 bytes each) in `dst`.
pub fn q8k(src: &[f32], dst: &mut [u8]) {
    q8k_isa(level() == Level::None, src, dst)
}

/// Quantize `src` into Q8_0 blocks as ggml's x86 `quantize_row_q8_0` does (1 / scale computed as
/// 127 / max, halves rounded to even): how llama.cpp writes a q8_0 KV cache and quantizes Q for it.
/// (Candle's rounding, in [`q8_0`], is what the matmul tests were built on; the two differ by one
/// step in a few values.)
pub fn q8_0_ggml(src: &[f32], dst: &mut [u8]) {
    assert_eq!(dst.len(), src.len() / 32 * 34);
    #[cfg(target_arch = "x86_64")]
    if level() != Level::None {
        // SAFETY: the level says AVX2 + FMA + F16C are present.
        return unsafe { q8_0_ggml_avx2(src, dst) };
    }
    q8_0_ggml_body(src, dst)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_ggml_avx2(src: &[f32], dst: &mut [u8]) {
    q8_0_ggml_body(src, dst)
}

#[inline(always)]
fn q8_0_ggml_body(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(34)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        b[..2].copy_from_slice(&f16::from_f32(amax / 127.0).to_le_bytes());
        for (q, &v) in b[2..].iter_mut().zip(x) {
            *q = (v * id).round_ties_even() as i8 as u8;
        }
    }
}

/// As [`q8_0`], with the build chosen (`portable`: the baseline one; the tests run both).
pub fn q8_0_isa(portable: bool, src: &[f32], dst: &mut [u8]) {
    assert_eq!(dst.len(), src.len() / 32 * 34);
    #[cfg(target_arch = "x86_64")]
    if !portable {
        // SAFETY: not `portable` means the caller saw AVX2 + FMA + F16C (or is the test on such a CPU).
        return unsafe { q8_0_avx2(src, dst) };
    }
    let _ = portable;
    q8_0_body(src, dst)
}

/// As [`q8k`], with the build chosen.
pub fn q8k_isa(portable: bool, src: &[f32], dst: &mut [u8]) {
    assert_eq!(dst.len(), src.len() / 256 * 292);
    #[cfg(target_arch = "x86_64")]
    if !portable {
        // SAFETY: as above.
        return unsafe { q8k_avx2(src, dst) };
    }
    let _ = portable;
    q8k_body(src, dst)
}

/// [`q8_0_body`] through [`quant32`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_avx2(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(34)) {
        let d = amax(x) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        quant32(
            std::arch::x86_64::_mm256_set1_ps(id),
            x.as_ptr(),
            b.as_mut_ptr().add(2),
        );
    }
}

/// Round half away from zero (as `f32::round`), clamp to i8 and convert, on 8 lanes: the
/// truncation plus one step where the exact remainder is at least a half; NaN becomes 0, as `as
/// i8` makes it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn round_i8(p: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let sign = _mm256_set1_ps(-0.0);
    let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(p);
    let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(p, t));
    let step = _mm256_or_ps(_mm256_and_ps(p, sign), _mm256_set1_ps(1.0));
    let half = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5));
    let r = _mm256_add_ps(t, _mm256_and_ps(half, step));
    let c = _mm256_min_ps(
        _mm256_max_ps(r, _mm256_set1_ps(-128.0)),
        _mm256_set1_ps(127.0),
    );
    _mm256_cvttps_epi32(_mm256_and_ps(c, _mm256_cmp_ps::<_CMP_ORD_Q>(r, r)))
}

/// 32 values at `x` times `scale`, rounded to i8 ([`round_i8`]) and stored in order at `q`;
/// returns them as 16-bit lanes (values 0..16, 16..32).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn quant32(
    scale: std::arch::x86_64::__m256,
    x: *const f32,
    q: *mut u8,
) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
    use std::arch::x86_64::*;
    let v: [__m256i; 4] =
        std::array::from_fn(|k| round_i8(_mm256_mul_ps(scale, _mm256_loadu_ps(x.add(8 * k)))));
    let w0 = _mm256_permute4x64_epi64::<0xD8>(_mm256_packs_epi32(v[0], v[1]));
    let w1 = _mm256_permute4x64_epi64::<0xD8>(_mm256_packs_epi32(v[2], v[3]));
    let b = _mm256_permute4x64_epi64::<0xD8>(_mm256_packs_epi16(w0, w1));
    _mm256_storeu_si256(q as *mut __m256i, b);
    (w0, w1)
}

/// [`q8k_body`] with the rounding and packing written out on 8 lanes ([`quant32`]): the compiler
/// kept the saturating `as i8` scalar, a value at a time (5% of a 1.5B prefill).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8k_avx2(src: &[f32], dst: &mut [u8]) {
    use std::arch::x86_64::*;
    for (x, b) in src.chunks_exact(256).zip(dst.chunks_exact_mut(292)) {
        let Some(iscale) = q8k_iscale(x) else {
            b.fill(0);
            continue;
        };
        let is = _mm256_set1_ps(iscale);
        let xp = x.as_ptr();
        let qp = b.as_mut_ptr().add(4);
        let ones = _mm256_set1_epi16(1);
        let mut sums = [0i16; 16];
        for g in 0..8 {
            let (w0, w1) = quant32(is, xp.add(32 * g), qp.add(32 * g));
            // The two sums of 16: w0 holds values 0..16, w1 values 16..32.
            for (h, w) in [w0, w1].into_iter().enumerate() {
                let m = _mm256_madd_epi16(w, ones);
                let m = _mm_add_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256::<1>(m));
                let m = _mm_add_epi32(m, _mm_shuffle_epi32::<0x4E>(m));
                let m = _mm_add_epi32(m, _mm_shuffle_epi32::<0xB1>(m));
                sums[2 * g + h] = _mm_cvtsi128_si32(m) as i16;
            }
        }
        for (i, s) in sums.iter().enumerate() {
            b[260 + 2 * i..262 + 2 * i].copy_from_slice(&s.to_le_bytes());
        }
        b[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

/// The largest magnitude in `x` (a multiple of 16 values; NaN ignored), over 16 independent
/// lanes: a loop the compiler vectorizes, where a one-at-a-time search was a tenth of a prompt
/// pass once the matmuls ran on AMX.
#[inline(always)]
fn amax(x: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    for c in x.chunks_exact(16) {
        for (l, &v) in lanes.iter_mut().zip(c) {
            let a = v.abs();
            *l = if a > *l { a } else { *l };
        }
    }
    lanes.iter().fold(0f32, |m, &l| if l > m { l } else { m })
}

/// Per block of 32: d = max|x| / 127 (stored f16), q = round(x / d).
#[inline(always)]
fn q8_0_body(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(34)) {
        let amax = amax(x);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        for (q, &v) in b[2..].iter_mut().zip(x) {
            *q = (v * id).round() as i8 as u8;
        }
    }
}

/// A Q8_K block's scale: the first value of the largest magnitude (as a one-at-a-time search
/// picks it) maps to -127; None for a block of zeros.
#[inline(always)]
fn q8k_iscale(x: &[f32]) -> Option<f32> {
    let amax = amax(x);
    let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
    (amax != 0.0).then(|| -127f32 / max)
}

/// Per block of 256: the value of largest magnitude maps to -127, d = 1 / scale (f32), then the
/// 16 sums of 16 quantized values (i16).
#[inline(always)]
fn q8k_body(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(256).zip(dst.chunks_exact_mut(292)) {
        let Some(iscale) = q8k_iscale(x) else {
            b.fill(0);
            continue;
        };
        let (d, rest) = b.split_at_mut(4);
        let (qs, sums) = rest.split_at_mut(256);
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = (iscale * v).round().clamp(-128.0, 127.0) as i8 as u8;
        }
        for (s, g) in sums.chunks_exact_mut(2).zip(qs.chunks_exact(16)) {
            let sum: i32 = g.iter().map(|&q| q as i8 as i32).sum();
            s.copy_from_slice(&(sum as i16).to_le_bytes());
        }
        d.copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}
