//! AVX2 dot products for the 32-value block types (Q4_0, Q4_1, Q5_0, Q8_0).
//! Hand-written because candle's Q5_0 and Q4_1 dots are scalar, and its Q4_0/Q8_0 AVX loops convert
//! the f16 scales through `vpinsrw` into a live register: a false dependency that serialises the loop
//! (measured 15 cycles a block, 5 GMAC/s a core). Q5_0 carries most of Qwen2.5-Coder-0.5B's weights
//! (rows of 896 are not a multiple of 256, so Q4_K_M falls back to Q5_0) and Q8_0 its LM head.
//! Same arithmetic as ggml's `ggml_vec_dot_*`; candle's scalar `vec_dot_unopt` is the reference in
//! the tests.

use std::sync::OnceLock;

pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// f16 at byte offset `i` of `p` → f32 in lane 0, through vmovd + vcvtph2ps (no false dependency).
    #[inline(always)]
    unsafe fn f16_at(p: *const u8, i: usize) -> __m128 {
        let bits = (p.add(i) as *const u16).read_unaligned();
        _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32))
    }

    /// Broadcast of the product of two f16 scales.
    #[inline(always)]
    unsafe fn scale(x: *const u8, y: *const u8) -> __m256 {
        _mm256_broadcastss_ps(_mm_mul_ss(f16_at(x, 0), f16_at(y, 0)))
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

    /// Sum over blocks of scale(i) * dot(x_i, y_i), two independent accumulators; `block` returns
    /// the (scale, int8 pair sums) of block i.
    #[inline(always)]
    unsafe fn blocks2(nb: usize, mut block: impl FnMut(usize) -> __m256) -> __m256 {
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        while i + 1 < nb {
            acc0 = _mm256_add_ps(acc0, block(i));
            acc1 = _mm256_add_ps(acc1, block(i + 1));
            i += 2;
        }
        if i < nb {
            acc0 = _mm256_add_ps(acc0, block(i));
        }
        _mm256_add_ps(acc0, acc1)
    }

    /// x: Q8_0 blocks (d f16, qs[32]) = 34 bytes; y: Q8_0.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot_q8_0_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
        let nb = n / 32;
        assert!(x.len() >= nb * 34 && y.len() >= nb * 34);
        let (xp, yp) = (x.as_ptr(), y.as_ptr());
        let acc = blocks2(nb, |i| {
            let (xb, yb) = (xp.add(i * 34), yp.add(i * 34));
            let qx = _mm256_loadu_si256(xb.add(2) as *const __m256i);
            let qy = _mm256_loadu_si256(yb.add(2) as *const __m256i);
            _mm256_mul_ps(scale(xb, yb), mul_sum_i8_pairs_float(qx, qy))
        });
        hsum_float_8(acc)
    }

    /// x: Q4_0 blocks (d f16, qs[16]) = 18 bytes; y: Q8_0.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot_q4_0_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
        let nb = n / 32;
        assert!(x.len() >= nb * 18 && y.len() >= nb * 34);
        let (xp, yp) = (x.as_ptr(), y.as_ptr());
        let acc = blocks2(nb, |i| {
            let (xb, yb) = (xp.add(i * 18), yp.add(i * 34));
            let qx = _mm256_sub_epi8(bytes_from_nibbles_32(xb.add(2)), _mm256_set1_epi8(8));
            let qy = _mm256_loadu_si256(yb.add(2) as *const __m256i);
            _mm256_mul_ps(scale(xb, yb), mul_sum_i8_pairs_float(qx, qy))
        });
        hsum_float_8(acc)
    }

    /// x: Q5_0 blocks (d f16, qh u32, qs[16]) = 22 bytes; y: Q8_0.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot_q5_0_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
        let nb = n / 32;
        assert!(x.len() >= nb * 22 && y.len() >= nb * 34);
        let (xp, yp) = (x.as_ptr(), y.as_ptr());
        let acc = blocks2(nb, |i| {
            let (xb, yb) = (xp.add(i * 22), yp.add(i * 34));
            let mut qx = bytes_from_nibbles_32(xb.add(6));
            let qh = (xb.add(2) as *const u32).read_unaligned();
            let bxhi = _mm256_andnot_si256(bytes_from_bits_32(qh), _mm256_set1_epi8(0xF0u8 as i8));
            qx = _mm256_or_si256(qx, bxhi);
            let qy = _mm256_loadu_si256(yb.add(2) as *const __m256i);
            _mm256_mul_ps(scale(xb, yb), mul_sum_i8_pairs_float(qx, qy))
        });
        hsum_float_8(acc)
    }

    /// x: Q4_1 blocks (d f16, m f16, qs[16]) = 20 bytes; y: Q8_1 blocks (d f16, s f16, qs[32]) = 36 bytes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn vec_dot_q4_1_q8_1(n: usize, x: &[u8], y: &[u8]) -> f32 {
        let nb = n / 32;
        assert!(x.len() >= nb * 20 && y.len() >= nb * 36);
        let (xp, yp) = (x.as_ptr(), y.as_ptr());
        let mut summs = _mm_setzero_ps();
        let acc = blocks2(nb, |i| {
            let (xb, yb) = (xp.add(i * 20), yp.add(i * 36));
            summs = _mm_add_ss(summs, _mm_mul_ss(f16_at(xb, 2), f16_at(yb, 2)));
            let qx = bytes_from_nibbles_32(xb.add(4));
            let qy = _mm256_loadu_si256(yb.add(4) as *const __m256i);
            let xy = sum_i16_pairs_float(_mm256_maddubs_epi16(qx, qy));
            _mm256_mul_ps(scale(xb, yb), xy)
        });
        hsum_float_8(acc) + _mm_cvtss_f32(summs)
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::{vec_dot_q4_0_q8_0, vec_dot_q4_1_q8_1, vec_dot_q5_0_q8_0, vec_dot_q8_0_q8_0};

#[cfg(not(target_arch = "x86_64"))]
pub unsafe fn vec_dot_q5_0_q8_0(_n: usize, _x: &[u8], _y: &[u8]) -> f32 {
    unreachable!("SIMD kernels are only used when available()")
}
#[cfg(not(target_arch = "x86_64"))]
pub unsafe fn vec_dot_q8_0_q8_0(_n: usize, _x: &[u8], _y: &[u8]) -> f32 {
    unreachable!("SIMD kernels are only used when available()")
}
#[cfg(not(target_arch = "x86_64"))]
pub unsafe fn vec_dot_q4_0_q8_0(_n: usize, _x: &[u8], _y: &[u8]) -> f32 {
    unreachable!("SIMD kernels are only used when available()")
}
#[cfg(not(target_arch = "x86_64"))]
pub unsafe fn vec_dot_q4_1_q8_1(_n: usize, _x: &[u8], _y: &[u8]) -> f32 {
    unreachable!("SIMD kernels are only used when available()")
}
