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

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_avx2(src: &[f32], dst: &mut [u8]) {
    q8_0_body(src, dst)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8k_avx2(src: &[f32], dst: &mut [u8]) {
    q8k_body(src, dst)
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

/// Per block of 256: the value of largest magnitude maps to -127, d = 1 / scale (f32), then the
/// 16 sums of 16 quantized values (i16).
#[inline(always)]
fn q8k_body(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(256).zip(dst.chunks_exact_mut(292)) {
        // The first value of the largest magnitude, as a one-at-a-time search picks it.
        let amax = amax(x);
        let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
        if amax == 0.0 {
            b.fill(0);
            continue;
        }
        let iscale = -127f32 / max;
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
