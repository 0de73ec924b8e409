//! AVX2 dot products for the block types whose candle kernels are scalar (Q5_0 · Q8_0, Q4_1 · Q8_1).
//! Hand-written because Q5_0 carries most of Qwen2.5-Coder-0.5B's weights (rows of 896 are not a
//! multiple of 256, so llama.cpp's Q4_K_M falls back to Q5_0) and the scalar loop took half of decode.
//! Same arithmetic as ggml's `ggml_vec_dot_q5_0_q8_0` / `ggml_vec_dot_q4_1_q8_1`; candle's scalar
//! `vec_dot_unopt` is the reference in the tests.

use std::sync::OnceLock;

pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::f16;
    use std::arch::x86_64::*;

    #[inline(always)]
    fn f16_at(b: &[u8], i: usize) -> f32 {
        f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
    }

    /// 32 nibbles → 32 bytes: low nibbles in lanes 0..16, high nibbles in lanes 16..32.
    #[inline(always)]
    unsafe fn bytes_from_nibbles_32(p: *const u8) -> __m256i {
        let tmp = _mm_loadu_si128(p as *const __m128i);
        let bytes = _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp);
        _mm256_and_si256(_mm256_set1_epi8(0x0F), bytes)
    }

    /// 32 bits → 32 bytes of 0xFF (bit set) or 0x00.
    #[inline(always)]
    unsafe fn bytes_from_bits_32(x32: u32) -> __m256i {
        let shuf = _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0x0000000000000000,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32 as i32), shuf);
        let bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe_u64 as i64);
        _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit_mask), _mm256_set1_epi64x(-1))
    }

    #[inline(always)]
    unsafe fn sum_i16_pairs_float(x: __m256i) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), x))
    }

    #[inline(always)]
    unsafe fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
        let ax = _mm256_sign_epi8(x, x);
        let sy = _mm256_sign_epi8(y, x);
        sum_i16_pairs_float(_mm256_maddubs_epi16(ax, sy))
    }

    #[inline(always)]
    unsafe fn hsum_float_8(x: __m256) -> f32 {
        let mut res = _mm256_extractf128_ps(x, 1);
        res = _mm_add_ps(res, _mm256_castps256_ps128(x));
        res = _mm_add_ps(res, _mm_movehl_ps(res, res));
        res = _mm_add_ss(res, _mm_movehdup_ps(res));
        _mm_cvtss_f32(res)
    }

    /// x: Q5_0 blocks (d f16, qh u32, qs[16]) = 22 bytes; y: Q8_0 blocks (d f16, qs[32]) = 34 bytes.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn vec_dot_q5_0_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
        let nb = n / 32;
        assert!(x.len() >= nb * 22 && y.len() >= nb * 34);
        let mut acc = _mm256_setzero_ps();
        for i in 0..nb {
            let xb = &x[i * 22..i * 22 + 22];
            let yb = &y[i * 34..i * 34 + 34];
            let d = _mm256_set1_ps(f16_at(xb, 0) * f16_at(yb, 0));
            let mut qx = bytes_from_nibbles_32(xb.as_ptr().add(6));
            let qh = u32::from_le_bytes([xb[2], xb[3], xb[4], xb[5]]);
            let bxhi = _mm256_andnot_si256(bytes_from_bits_32(qh), _mm256_set1_epi8(0xF0u8 as i8));
            qx = _mm256_or_si256(qx, bxhi);
            let qy = _mm256_loadu_si256(yb.as_ptr().add(2) as *const __m256i);
            acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs_float(qx, qy), acc);
        }
        hsum_float_8(acc)
    }

    /// x: Q4_1 blocks (d f16, m f16, qs[16]) = 20 bytes; y: Q8_1 blocks (d f16, s f16, qs[32]) = 36 bytes.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn vec_dot_q4_1_q8_1(n: usize, x: &[u8], y: &[u8]) -> f32 {
        let nb = n / 32;
        assert!(x.len() >= nb * 20 && y.len() >= nb * 36);
        let mut acc = _mm256_setzero_ps();
        let mut summs = 0f32;
        for i in 0..nb {
            let xb = &x[i * 20..i * 20 + 20];
            let yb = &y[i * 36..i * 36 + 36];
            summs += f16_at(xb, 2) * f16_at(yb, 2);
            let d0d1 = _mm256_set1_ps(f16_at(xb, 0) * f16_at(yb, 0));
            let qx = bytes_from_nibbles_32(xb.as_ptr().add(4));
            let qy = _mm256_loadu_si256(yb.as_ptr().add(4) as *const __m256i);
            let xy = sum_i16_pairs_float(_mm256_maddubs_epi16(qx, qy));
            acc = _mm256_fmadd_ps(d0d1, xy, acc);
        }
        hsum_float_8(acc) + summs
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::{vec_dot_q4_1_q8_1, vec_dot_q5_0_q8_0};

#[cfg(not(target_arch = "x86_64"))]
pub unsafe fn vec_dot_q5_0_q8_0(_n: usize, _x: &[u8], _y: &[u8]) -> f32 {
    unreachable!("SIMD kernels are only used when available()")
}
#[cfg(not(target_arch = "x86_64"))]
pub unsafe fn vec_dot_q4_1_q8_1(_n: usize, _x: &[u8], _y: &[u8]) -> f32 {
    unreachable!("SIMD kernels are only used when available()")
}
