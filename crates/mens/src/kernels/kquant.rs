//! AVX2 dot products of Q2_K, Q3_K, Q4_K, Q5_K and Q6_K weight rows with Q8_K activation rows, each weight
//! block decoded once and dotted with up to R activation rows.
//!
//! Hand-written because candle's K-quant dots take one activation row at a time: in a prefill (or a
//! batched server step) every 256-value block is unpacked again for each token. Here the unpacked
//! nibbles and scales of a block are reused for R = 4 tokens. And because mens is built for the
//! x86-64 baseline, candle's AVX2 K-quant dots (chosen at compile time) are not in the binary: these
//! are chosen at run time. The arithmetic is ggml's (`ggml_vec_dot_q2_K_q8_K` … `..._q6_K_q8_K`); candle's `vec_dot` is the reference in the tests.

/// Bytes of one block.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub const Q2K_BYTES: usize = 84;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub const Q3K_BYTES: usize = 110;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub const Q4K_BYTES: usize = 144;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub const Q5K_BYTES: usize = 176;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub const Q6K_BYTES: usize = 210;
pub const Q8K_BYTES: usize = 292;

/// False when `MENS_NO_KQUANT` is set (candle's kernels are used instead: for A/B measurements).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("MENS_NO_KQUANT").is_none())
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum KKind {
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
}

/// Dot products of one weight row (`nb` blocks at `x`) with R Q8_K activation rows.
///
/// # Safety
/// AVX2 and FMA must be available; `x` must hold `nb` blocks of `kind`, each of `ys` `nb` Q8_K blocks.
#[inline]
pub unsafe fn dot<const R: usize>(
    kind: KKind,
    nb: usize,
    x: *const u8,
    ys: &[*const u8; R],
) -> [f32; R] {
    dot_isa(
        super::simd::level() == super::simd::Level::Vnni,
        kind,
        nb,
        x,
        ys,
    )
}

/// As [`dot`], choosing the build: `wide` = the AVX-512VL one (the tests run both).
///
/// # Safety
/// As [`dot`]; `wide` needs AVX-512F and AVX-512VL.
#[inline]
pub unsafe fn dot_isa<const R: usize>(
    wide: bool,
    kind: KKind,
    nb: usize,
    x: *const u8,
    ys: &[*const u8; R],
) -> [f32; R] {
    #[cfg(target_arch = "x86_64")]
    {
        // With AVX-512VL the same code gets 32 vector registers instead of 16 (no spills at R = 4).
        match (wide, kind) {
            (true, KKind::Q2K) => avx512::q2k(nb, x, ys),
            (true, KKind::Q3K) => avx512::q3k(nb, x, ys),
            (false, KKind::Q2K) => avx2::q2k(nb, x, ys),
            (false, KKind::Q3K) => avx2::q3k(nb, x, ys),
            (true, KKind::Q4K) => avx512::q4k::<R, false>(nb, x, ys),
            (true, KKind::Q5K) => avx512::q4k::<R, true>(nb, x, ys),
            (true, KKind::Q6K) => avx512::q6k(nb, x, ys),
            (false, KKind::Q4K) => avx2::q4k::<R, false>(nb, x, ys),
            (false, KKind::Q5K) => avx2::q4k::<R, true>(nb, x, ys),
            (false, KKind::Q6K) => avx2::q6k(nb, x, ys),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (wide, kind, nb, x, ys);
        unreachable!("the x86 kernels are only called on x86_64 with AVX2")
    }
}

#[cfg(target_arch = "x86_64")]
macro_rules! kquant_kernels {
    ($feat:literal, $acc16:ident) => {
        use super::*;
        use std::arch::x86_64::*;

        #[inline(always)]
        unsafe fn f16_at(p: *const u8) -> f32 {
            // A fresh register (movd), not an insert into a live one (a false dependency).
            let bits = u16::from_le_bytes([*p, *p.add(1)]) as i32;
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
        }

        #[inline(always)]
        unsafe fn hsum(v: __m256) -> f32 {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }

        /// The Q8_K block's scale d (f32, its first 4 bytes).
        #[inline(always)]
        unsafe fn q8k_d(yb: *const u8) -> f32 {
            f32::from_le_bytes([*yb, *yb.add(1), *yb.add(2), *yb.add(3)])
        }

        /// acc + m·mins + s·sums, the mins term first (ggml's order).
        #[inline(always)]
        unsafe fn mins_then_sums(
            acc: __m256,
            m: f32,
            mins: __m256i,
            s: f32,
            sums: __m256i,
        ) -> __m256 {
            let acc = _mm256_fmadd_ps(_mm256_set1_ps(m), _mm256_cvtepi32_ps(mins), acc);
            _mm256_fmadd_ps(_mm256_set1_ps(s), _mm256_cvtepi32_ps(sums), acc)
        }

        #[inline(always)]
        unsafe fn hsums<const R: usize>(acc: &[__m256; R]) -> [f32; R] {
            let mut out = [0f32; R];
            for r in 0..R {
                out[r] = hsum(acc[r]);
            }
            out
        }

        /// Byte shuffles: `K4_SHUF[i]` broadcasts 16-bit lane i to every lane; `K6_SHUF[i]` spreads
        /// bytes 2i and 2i+1 over 8 lanes each.
        const K4_SHUF: [[u8; 32]; 8] = {
            let mut t = [[0u8; 32]; 8];
            let mut i = 0;
            while i < 8 {
                let mut k = 0;
                while k < 16 {
                    t[i][2 * k] = (2 * i) as u8;
                    t[i][2 * k + 1] = (2 * i + 1) as u8;
                    k += 1;
                }
                i += 1;
            }
            t
        };
        const K6_SHUF: [[u8; 16]; 8] = {
            let mut t = [[0u8; 16]; 8];
            let mut i = 0;
            while i < 8 {
                let mut k = 0;
                while k < 8 {
                    t[i][k] = (2 * i) as u8;
                    t[i][k + 8] = (2 * i + 1) as u8;
                    k += 1;
                }
                i += 1;
            }
            t
        };

        /// `Q3_SHUF[k]`: 16-bit lane 2k to the low 128 bits, lane 2k + 1 to the high 128 bits (the
        /// scales of the two 16-value groups that 32 bytes of Q2_K / Q3_K values cover).
        const Q3_SHUF: [[u8; 32]; 4] = {
            let mut t = [[0u8; 32]; 4];
            let mut k = 0;
            while k < 4 {
                let mut l = 0;
                while l < 8 {
                    t[k][2 * l] = (4 * k) as u8;
                    t[k][2 * l + 1] = (4 * k + 1) as u8;
                    t[k][16 + 2 * l] = (4 * k + 2) as u8;
                    t[k][16 + 2 * l + 1] = (4 * k + 3) as u8;
                    l += 1;
                }
                k += 1;
            }
            t
        };

        /// 16 signed 16-bit scales as the two halves broadcast, then shuffled for the 4 shifts.
        #[inline(always)]
        unsafe fn q3_scales(all: __m256i) -> [[__m256i; 4]; 2] {
            let half = [
                _mm256_broadcastsi128_si256(_mm256_castsi256_si128(all)),
                _mm256_broadcastsi128_si256(_mm256_extracti128_si256(all, 1)),
            ];
            std::array::from_fn(|j| {
                std::array::from_fn(|k| {
                    let m = _mm256_loadu_si256(Q3_SHUF[k].as_ptr() as *const __m256i);
                    _mm256_shuffle_epi8(half[j], m)
                })
            })
        }

        /// Q2_K: 2-bit values, a 4-bit scale and a 4-bit min per 16 values.
        #[target_feature(enable = $feat)]
        pub unsafe fn q2k<const R: usize>(
            nb: usize,
            x: *const u8,
            ys: &[*const u8; R],
        ) -> [f32; R] {
            let m3 = _mm256_set1_epi8(3);
            let m4 = _mm_set1_epi8(0x0F);
            let mut acc = [_mm256_setzero_ps(); R];
            for i in 0..nb {
                let b = x.add(i * Q2K_BYTES);
                super::super::simd::prefetch(b, Q2K_BYTES);
                let (d, dmin) = (f16_at(b.add(80)), f16_at(b.add(82)));
                let ms = _mm_loadu_si128(b as *const __m128i);
                let mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(ms, 4), m4));
                let sc = q3_scales(_mm256_cvtepi8_epi16(_mm_and_si128(ms, m4)));
                let mut sumi = [_mm256_setzero_si256(); R];
                for j in 0..2 {
                    let bits = _mm256_loadu_si256(b.add(16 + 32 * j) as *const __m256i);
                    let q = [
                        _mm256_and_si256(bits, m3),
                        _mm256_and_si256(_mm256_srli_epi16(bits, 2), m3),
                        _mm256_and_si256(_mm256_srli_epi16(bits, 4), m3),
                        _mm256_and_si256(_mm256_srli_epi16(bits, 6), m3),
                    ];
                    for r in 0..R {
                        let y = ys[r].add(i * Q8K_BYTES + 4 + 128 * j);
                        for k in 0..4 {
                            let q8 = _mm256_loadu_si256(y.add(32 * k) as *const __m256i);
                            sumi[r] = $acc16!(sumi[r], sc[j][k], _mm256_maddubs_epi16(q[k], q8));
                        }
                    }
                }
                for r in 0..R {
                    let yb = ys[r].add(i * Q8K_BYTES);
                    let yd = q8k_d(yb);
                    let bsums = _mm256_loadu_si256(yb.add(4 + 256) as *const __m256i);
                    let prod = _mm256_madd_epi16(mins, bsums);
                    acc[r] = mins_then_sums(acc[r], -yd * dmin, prod, yd * d, sumi[r]);
                }
            }
            hsums(&acc)
        }

        /// Q3_K: 2 low bits, a high bit (clear = minus 4), a 6-bit signed scale per 16 values.
        #[target_feature(enable = $feat)]
        pub unsafe fn q3k<const R: usize>(
            nb: usize,
            x: *const u8,
            ys: &[*const u8; R],
        ) -> [f32; R] {
            const KM1: u32 = 0x03030303;
            const KM2: u32 = 0x0f0f0f0f;
            let m3 = _mm256_set1_epi8(3);
            let one = _mm256_set1_epi8(1);
            let mut acc = [_mm256_setzero_ps(); R];
            for i in 0..nb {
                let b = x.add(i * Q3K_BYTES);
                super::super::simd::prefetch(b, Q3K_BYTES);
                let d = f16_at(b.add(108));
                let mut a = [0u32; 3];
                std::ptr::copy_nonoverlapping(b.add(96), a.as_mut_ptr() as *mut u8, 12);
                let sc8 = _mm_set_epi32(
                    (((a[1] >> 4) & KM2) | (((a[2] >> 6) & KM1) << 4)) as i32,
                    (((a[0] >> 4) & KM2) | (((a[2] >> 4) & KM1) << 4)) as i32,
                    ((a[1] & KM2) | (((a[2] >> 2) & KM1) << 4)) as i32,
                    ((a[0] & KM2) | ((a[2] & KM1) << 4)) as i32,
                );
                let sc = q3_scales(_mm256_cvtepi8_epi16(_mm_sub_epi8(sc8, _mm_set1_epi8(32))));
                let hbits = _mm256_loadu_si256(b as *const __m256i);
                let mut sumi = [_mm256_setzero_si256(); R];
                for j in 0..2 {
                    let bits = _mm256_loadu_si256(b.add(32 + 32 * j) as *const __m256i);
                    let (mut q, mut h) = ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4]);
                    for k in 0..4 {
                        let shift = _mm_cvtsi32_si128(2 * k as i32);
                        q[k] = _mm256_and_si256(_mm256_srl_epi16(bits, shift), m3);
                        // 4 where the value's high bit is clear.
                        let bit = _mm_cvtsi32_si128((4 * j + k) as i32);
                        let clear = _mm256_andnot_si256(hbits, _mm256_sll_epi16(one, bit));
                        h[k] = _mm256_slli_epi16(_mm256_srl_epi16(clear, bit), 2);
                    }
                    for r in 0..R {
                        let y = ys[r].add(i * Q8K_BYTES + 4 + 128 * j);
                        for k in 0..4 {
                            let q8 = _mm256_loadu_si256(y.add(32 * k) as *const __m256i);
                            let p = _mm256_sub_epi16(
                                _mm256_maddubs_epi16(q[k], q8),
                                _mm256_maddubs_epi16(h[k], q8),
                            );
                            sumi[r] = $acc16!(sumi[r], sc[j][k], p);
                        }
                    }
                }
                for r in 0..R {
                    let yb = ys[r].add(i * Q8K_BYTES);
                    let yd = q8k_d(yb);
                    acc[r] = _mm256_fmadd_ps(
                        _mm256_set1_ps(yd * d),
                        _mm256_cvtepi32_ps(sumi[r]),
                        acc[r],
                    );
                }
            }
            hsums(&acc)
        }

        /// The 8 six-bit scales and 8 mins of a Q4_K block, as bytes (ggml's `utmp` unpacking).
        #[inline(always)]
        unsafe fn q4k_scales(p: *const u8) -> [u32; 4] {
            const K1: u32 = 0x3f3f3f3f;
            const K2: u32 = 0x0f0f0f0f;
            const K3: u32 = 0x03030303;
            let mut u = [0u32; 4];
            std::ptr::copy_nonoverlapping(p, u.as_mut_ptr() as *mut u8, 12);
            u[3] = ((u[2] >> 4) & K2) | (((u[1] >> 6) & K3) << 4);
            let aux = u[1] & K1;
            u[1] = (u[2] & K2) | (((u[0] >> 6) & K3) << 4);
            u[2] = aux;
            u[0] &= K1;
            u
        }

        /// Q4_K, or with `Q5` Q5_K: the same scales and mins, plus a fifth bit per value from `qh`.
        #[target_feature(enable = $feat)]
        pub unsafe fn q4k<const R: usize, const Q5: bool>(
            nb: usize,
            x: *const u8,
            ys: &[*const u8; R],
        ) -> [f32; R] {
            let m4 = _mm256_set1_epi8(0x0F);
            let m1 = _mm256_set1_epi8(0x01);
            let mut acc = [_mm256_setzero_ps(); R];
            let block = if Q5 { Q5K_BYTES } else { Q4K_BYTES };
            for i in 0..nb {
                let b = x.add(i * block);
                super::super::simd::prefetch(b, block);
                let (d, dmin) = (f16_at(b), f16_at(b.add(2)));
                let u = q4k_scales(b.add(4));
                let mins_scales = _mm256_cvtepu8_epi16(_mm_set_epi32(
                    u[3] as i32,
                    u[2] as i32,
                    u[1] as i32,
                    u[0] as i32,
                ));
                let mins = _mm256_extracti128_si256(mins_scales, 1);
                let sc128 = _mm256_castsi256_si128(mins_scales);
                let scales = _mm256_set_m128i(sc128, sc128);
                let qs = b.add(if Q5 { 48 } else { 16 });
                let hbits = if Q5 {
                    _mm256_loadu_si256(b.add(16) as *const __m256i)
                } else {
                    _mm256_setzero_si256()
                };
                let mut sumi = [_mm256_setzero_si256(); R];
                for j in 0..4 {
                    let sl = _mm256_loadu_si256(K4_SHUF[2 * j].as_ptr() as *const __m256i);
                    let sh = _mm256_loadu_si256(K4_SHUF[2 * j + 1].as_ptr() as *const __m256i);
                    let scale_l = _mm256_shuffle_epi8(scales, sl);
                    let scale_h = _mm256_shuffle_epi8(scales, sh);
                    let bits = _mm256_loadu_si256(qs.add(32 * j) as *const __m256i);
                    let mut q4l = _mm256_and_si256(bits, m4);
                    let mut q4h = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                    if Q5 {
                        // Bit 2j of each qh byte tops the low nibbles, bit 2j + 1 the high ones.
                        let hl = _mm256_and_si256(
                            _mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * j as i32)),
                            m1,
                        );
                        let hh = _mm256_and_si256(
                            _mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * j as i32 + 1)),
                            m1,
                        );
                        q4l = _mm256_add_epi8(q4l, _mm256_slli_epi16(hl, 4));
                        q4h = _mm256_add_epi8(q4h, _mm256_slli_epi16(hh, 4));
                    }
                    for r in 0..R {
                        let y = ys[r].add(i * Q8K_BYTES + 4 + 64 * j);
                        let q8l = _mm256_loadu_si256(y as *const __m256i);
                        let q8h = _mm256_loadu_si256(y.add(32) as *const __m256i);
                        sumi[r] = $acc16!(sumi[r], scale_l, _mm256_maddubs_epi16(q4l, q8l));
                        sumi[r] = $acc16!(sumi[r], scale_h, _mm256_maddubs_epi16(q4h, q8h));
                    }
                }
                for r in 0..R {
                    let yb = ys[r].add(i * Q8K_BYTES);
                    let yd = q8k_d(yb);
                    // Sums of the 16 groups of 16 activations, paired into the 8 sub-blocks of 32.
                    let bsums = _mm256_loadu_si256(yb.add(4 + 256) as *const __m256i);
                    let q8s = _mm_hadd_epi16(
                        _mm256_castsi256_si128(bsums),
                        _mm256_extracti128_si256(bsums, 1),
                    );
                    // The mins term (4 lanes) joins the same accumulator, upper lanes zero.
                    let prod = _mm256_zextsi128_si256(_mm_madd_epi16(mins, q8s));
                    acc[r] = mins_then_sums(acc[r], -yd * dmin, prod, yd * d, sumi[r]);
                }
            }
            hsums(&acc)
        }

        #[target_feature(enable = $feat)]
        pub unsafe fn q6k<const R: usize>(
            nb: usize,
            x: *const u8,
            ys: &[*const u8; R],
        ) -> [f32; R] {
            let m4 = _mm256_set1_epi8(0x0F);
            let m2 = _mm256_set1_epi8(0x03);
            let mut acc = [_mm256_setzero_ps(); R];
            for i in 0..nb {
                let b = x.add(i * Q6K_BYTES);
                super::super::simd::prefetch(b, Q6K_BYTES);
                let (ql, qh, sc) = (b, b.add(128), b.add(192));
                let d = f16_at(b.add(208));
                let scales = _mm_loadu_si128(sc as *const __m128i);
                let mut sumi = [_mm256_setzero_si256(); R];
                for j in 0..2 {
                    let hb = _mm256_loadu_si256(qh.add(32 * j) as *const __m256i);
                    let h0 = _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4);
                    let h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4);
                    let h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4);
                    let h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4);
                    let b1 = _mm256_loadu_si256(ql.add(64 * j) as *const __m256i);
                    let b2 = _mm256_loadu_si256(ql.add(64 * j + 32) as *const __m256i);
                    let q = [
                        _mm256_or_si256(_mm256_and_si256(b1, m4), h0),
                        _mm256_or_si256(_mm256_and_si256(b2, m4), h1),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4), h2),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4), h3),
                    ];
                    // Scales 2k, 2k+1 of this 128-value half, one per 16 values.
                    let mut sc = [_mm256_setzero_si256(); 4];
                    for (k, s) in sc.iter_mut().enumerate() {
                        let m = _mm_loadu_si128(K6_SHUF[4 * j + k].as_ptr() as *const __m128i);
                        *s = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, m));
                    }
                    for r in 0..R {
                        let y = ys[r].add(i * Q8K_BYTES + 4 + 128 * j);
                        for k in 0..4 {
                            let q8 = _mm256_loadu_si256(y.add(32 * k) as *const __m256i);
                            // (q + 32) · y: maddubs needs the unsigned operand; the 32 · y part
                            // is taken off once per block below, from the activation group sums.
                            sumi[r] = $acc16!(sumi[r], sc[k], _mm256_maddubs_epi16(q[k], q8));
                        }
                    }
                }
                // Σ_g scale_g · 32 · Σ_{16 values of g} y.
                let sc16 = _mm256_cvtepi8_epi16(scales);
                for r in 0..R {
                    let yb = ys[r].add(i * Q8K_BYTES);
                    let bsums = _mm256_loadu_si256(yb.add(4 + 256) as *const __m256i);
                    let corr = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsums), 5);
                    let yd = q8k_d(yb);
                    acc[r] = _mm256_fmadd_ps(
                        _mm256_set1_ps(yd * d),
                        _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[r], corr)),
                        acc[r],
                    );
                }
            }
            hsums(&acc)
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    /// acc + Σ pairs of i16 products.
    macro_rules! acc16 {
        ($acc:expr, $a:expr, $b:expr) => {
            _mm256_add_epi32($acc, _mm256_madd_epi16($a, $b))
        };
    }
    kquant_kernels!("avx2,fma,f16c", acc16);
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    /// The same in one instruction (AVX-512 VNNI).
    macro_rules! acc16 {
        ($acc:expr, $a:expr, $b:expr) => {
            _mm256_dpwssd_epi32($acc, $a, $b)
        };
    }
    kquant_kernels!("avx2,fma,f16c,avx512f,avx512vl,avx512vnni", acc16);
}
