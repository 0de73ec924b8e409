//! Q5_0 and Q8_0 weights repacked for AVX-512 VNNI (and AVX2): eight rows interleaved four bytes
//! at a time, so that one `vpdpbusd` multiplies four values of one activation row with the same four values of eight
//! weight rows, and its eight 32-bit lanes are those eight rows' partial dots. A block's whole
//! integer dot is then exact, and the scale is applied once per block for eight rows together,
//! where the row-at-a-time kernels spend a sign fix, a convert and a multiply per row per block
//! and a horizontal sum per row (llama.cpp's `repack` buffer type and ik_llama.cpp's `_r8` types do
//! the same for their formats). Decode and prefill both read this layout, so a token's numbers do
//! not depend on its batch. The copy replaces the mapped pages it came from (`QTensor::x8`).
//!
//! A group of eight rows × one 32-value block is as large as in the file. Q5_0: 176 bytes (8 × 22):
//! the eight scales (f16), then eight 32-bit masks holding each value's fifth bit, then 128 bytes of
//! low nibbles; values stored unsigned (q + 16, 0..31). Q8_0: 272 bytes (8 × 34): the eight scales,
//! then 256 bytes of values stored unsigned (q + 128). The kernel subtracts the offset times Σy per
//! block, Σy being the activation block's integer sum.

/// Which format a repacked matrix holds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Packed {
    Q5_0,
    Q8_0,
    /// Q4_K and Q6_K in `k8`'s layouts (AVX2 and up).
    Q4K,
    Q6K,
}

impl Packed {
    /// The repacked format of a tensor type, if it has one.
    pub fn of(t: crate::gguf::TensorType) -> Option<Packed> {
        match t {
            crate::gguf::TensorType::Q5_0 => Some(Packed::Q5_0),
            crate::gguf::TensorType::Q8_0 => Some(Packed::Q8_0),
            crate::gguf::TensorType::Q4K => Some(Packed::Q4K),
            crate::gguf::TensorType::Q6K => Some(Packed::Q6K),
            _ => None,
        }
    }

    /// Values in one block of the file's format: a row has `cols / block_values()` blocks.
    pub fn block_values(self) -> usize {
        match self {
            Packed::Q5_0 | Packed::Q8_0 => 32,
            Packed::Q4K | Packed::Q6K => 256,
        }
    }

    pub fn group_bytes(self) -> usize {
        match self {
            Packed::Q5_0 => 176,
            Packed::Q8_0 => 272,
            Packed::Q4K => super::k8::GROUP_BYTES,
            Packed::Q6K => super::k8::Q6K_GROUP_BYTES,
        }
    }
}

/// Row `r` of a repacked matrix (`nb` blocks of `p.block_values()` per row) as f32, the file's
/// values exactly (a tied embedding's lookup, once its mapped pages are given back).
pub fn dequantize_row(p: Packed, g: &[u8], nb: usize, r: usize, out: &mut [f32]) {
    match p {
        Packed::Q4K => return super::k8::dequantize_row(g, nb, r, out),
        Packed::Q6K => return super::k8::dequantize_row_q6k(g, nb, r, out),
        _ => {}
    }
    let gb = p.group_bytes();
    let (grp, lane) = (r / 8, r % 8);
    for i in 0..nb {
        let b = &g[(grp * nb + i) * gb..][..gb];
        let d = half::f16::from_bits(u16::from_le_bytes([b[2 * lane], b[2 * lane + 1]])).to_f32();
        for m in 0..32 {
            let (j, byte) = (m / 4, lane * 4 + m % 4);
            let q = match p {
                Packed::Q8_0 => b[16 + 32 * j + byte] as i32 - 128,
                Packed::Q4K | Packed::Q6K => unreachable!(),
                Packed::Q5_0 => {
                    let mask = u32::from_le_bytes([
                        b[16 + 4 * j],
                        b[17 + 4 * j],
                        b[18 + 4 * j],
                        b[19 + 4 * j],
                    ]);
                    let nib = b[48 + 32 * (j / 2) + byte];
                    let lo = if j % 2 == 0 { nib & 15 } else { nib >> 4 };
                    (lo as i32 | (((mask >> byte) & 1) as i32) << 4) - 16
                }
            };
            out[i * 32 + m] = q as f32 * d;
        }
    }
}

/// Repack a Q8_0 matrix (`rows` a multiple of 8, `nb` blocks per row) into groups, into `out`.
pub fn repack_q8_0(src: &[u8], rows: usize, nb: usize, out: &mut [u8]) {
    repack(Packed::Q8_0, src, rows, nb, out, |o, r, b| {
        for m in 0..32 {
            o[16 + 32 * (m / 4) + r * 4 + m % 4] = b[2 + m] ^ 0x80;
        }
    })
}

/// Repack a Q5_0 matrix (`rows` a multiple of 8, `nb` blocks per row) into groups, into `out`.
pub fn repack_q5_0(src: &[u8], rows: usize, nb: usize, out: &mut [u8]) {
    repack(Packed::Q5_0, src, rows, nb, out, |o, r, b| {
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        for m in 0..32 {
            let lo = if m < 16 {
                b[6 + m] & 15
            } else {
                b[6 + m - 16] >> 4
            };
            let hi = (qh >> m) & 1;
            // Value m of row r: register j = m / 4, byte r * 4 + m % 4 of it.
            let (j, byte) = (m / 4, r * 4 + m % 4);
            let mask = &mut o[16 + 4 * j..16 + 4 * j + 4];
            mask[byte / 8] |= (hi as u8) << (byte % 8);
            // Registers 2k and 2k + 1 share 32 bytes: low and high nibbles.
            let nib = &mut o[48 + 32 * (j / 2) + byte];
            *nib |= if j % 2 == 0 { lo } else { lo << 4 };
        }
    })
}

/// The loop both formats share: for each group of eight rows and each block, the eight scales
/// first, then `place(group block, row in the group, the row's block in the file)` for the values.
fn repack(
    p: Packed,
    src: &[u8],
    rows: usize,
    nb: usize,
    out: &mut [u8],
    place: impl Fn(&mut [u8], usize, &[u8]),
) {
    let (gb, bb) = (p.group_bytes(), p.group_bytes() / 8);
    assert!(
        rows.is_multiple_of(8) && src.len() == rows * nb * bb && out.len() == rows / 8 * nb * gb
    );
    for g in 0..rows / 8 {
        for i in 0..nb {
            let o = &mut out[(g * nb + i) * gb..][..gb];
            for r in 0..8 {
                let b = &src[((g * 8 + r) * nb + i) * bb..][..bb];
                o[2 * r..2 * r + 2].copy_from_slice(&b[..2]);
                place(o, r, b);
            }
        }
    }
}

/// Σ over rows `8g..8g+8` of groups: the dot of each with `T` Q8_0 activation rows (quants `q`,
/// per-block scales `d`, per-block integer sums `s`), the eight results per activation row as
/// the eight lanes in row order.
///
/// # Safety
/// AVX-512 VNNI, VL and BW; `g` holds `nb` groups; each activation row `nb` blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl,avx512bw")]
pub unsafe fn dot<const T: usize, const Q8: bool>(
    nb: usize,
    g: *const u8,
    q: &[*const u8; T],
    d: &[*const f32; T],
    s: &[*const i32; T],
    out: &mut [[f32; 8]; T],
) {
    use std::arch::x86_64::*;
    let low = _mm256_set1_epi8(15);
    let sixteen = _mm256_set1_epi8(16);
    let (gb, offset) = if Q8 { (272, 128) } else { (176, 16) };
    let mut acc = [_mm256_setzero_ps(); T];
    for i in 0..nb {
        let b = g.add(i * gb);
        super::simd::prefetch(b, gb);
        let dx = _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i));
        let mut w = [_mm256_setzero_si256(); 8];
        if Q8 {
            for (j, wj) in w.iter_mut().enumerate() {
                *wj = _mm256_loadu_si256(b.add(16 + 32 * j) as *const __m256i);
            }
        } else {
            let masks = b.add(16) as *const u32;
            for k in 0..4 {
                let n = _mm256_loadu_si256(b.add(48 + 32 * k) as *const __m256i);
                let (lo, hi) = (
                    _mm256_and_si256(n, low),
                    _mm256_and_si256(_mm256_srli_epi16(n, 4), low),
                );
                w[2 * k] = _mm256_mask_add_epi8(lo, masks.add(2 * k).read_unaligned(), lo, sixteen);
                w[2 * k + 1] =
                    _mm256_mask_add_epi8(hi, masks.add(2 * k + 1).read_unaligned(), hi, sixteen);
            }
        }
        for t in 0..T {
            let y = q[t].add(i * 34 + 2);
            let mut sum = _mm256_set1_epi32(-offset * *s[t].add(i));
            for (j, wj) in w.iter().enumerate() {
                let yj = _mm256_set1_epi32((y.add(4 * j) as *const i32).read_unaligned());
                sum = _mm256_dpbusd_epi32(sum, *wj, yj);
            }
            let scale = _mm256_mul_ps(dx, _mm256_set1_ps(*d[t].add(i)));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, acc[t]);
        }
    }
    for t in 0..T {
        _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
}

/// As [`dot`] for Q5_0 groups, with AVX2 alone: `vpmaddubsw` (values 0..31, four products a
/// 16-bit lane at most 4 · 31 · 128 = 15,872 after two instructions, 31,744 after four), then one
/// `vpmaddwd` by ones per four registers. The fifth bits are expanded from the masks with a byte
/// shuffle and a compare. Twice the work per multiply instruction of the row-at-a-time kernel,
/// which spends a `vpmaddwd` on every 32 products. (Q8_0's values, 0..255 unsigned, would
/// overflow a 16-bit lane: [`dot_q8_0_avx2`] multiplies them signed.)
///
/// # Safety
/// AVX2, FMA and F16C; `g` holds `nb` Q5_0 groups; each activation row `nb` blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q5_0_avx2<const T: usize>(
    nb: usize,
    g: *const u8,
    q: &[*const u8; T],
    d: &[*const f32; T],
    s: &[*const i32; T],
    out: &mut [[f32; 8]; T],
) {
    use super::simd::common::bytes_from_bits_32;
    use std::arch::x86_64::*;
    let low = _mm256_set1_epi8(15);
    let sixteen = _mm256_set1_epi8(16);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); T];
    for i in 0..nb {
        let b = g.add(i * 176);
        super::simd::prefetch(b, 176);
        let dx = _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i));
        let masks = b.add(16) as *const u32;
        let mut w = [_mm256_setzero_si256(); 8];
        for k in 0..4 {
            let n = _mm256_loadu_si256(b.add(48 + 32 * k) as *const __m256i);
            let (lo, hi) = (
                _mm256_and_si256(n, low),
                _mm256_and_si256(_mm256_srli_epi16(n, 4), low),
            );
            let top = |j: usize| {
                _mm256_and_si256(bytes_from_bits_32(masks.add(j).read_unaligned()), sixteen)
            };
            w[2 * k] = _mm256_or_si256(lo, top(2 * k));
            w[2 * k + 1] = _mm256_or_si256(hi, top(2 * k + 1));
        }
        for t in 0..T {
            let y = q[t].add(i * 34 + 2);
            let yv = |j: usize| _mm256_set1_epi32((y.add(4 * j) as *const i32).read_unaligned());
            let half = |j: usize| {
                let a = _mm256_add_epi16(
                    _mm256_maddubs_epi16(w[j], yv(j)),
                    _mm256_maddubs_epi16(w[j + 1], yv(j + 1)),
                );
                let c = _mm256_add_epi16(
                    _mm256_maddubs_epi16(w[j + 2], yv(j + 2)),
                    _mm256_maddubs_epi16(w[j + 3], yv(j + 3)),
                );
                _mm256_madd_epi16(_mm256_add_epi16(a, c), ones)
            };
            let sum = _mm256_add_epi32(
                _mm256_set1_epi32(-16 * *s[t].add(i)),
                _mm256_add_epi32(half(0), half(4)),
            );
            let scale = _mm256_mul_ps(dx, _mm256_set1_ps(*d[t].add(i)));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, acc[t]);
        }
    }
    for t in 0..T {
        _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
}

/// As [`dot`] for Q8_0 groups, with AVX2 alone. The stored values (q + 128, unsigned) would
/// overflow `vpmaddubsw`'s 16-bit lanes (2 · 255 · 127), so each register is turned back into q
/// (XOR 0x80) and multiplied as llama.cpp's AVX2 Q8_0 dot does: |q| (unsigned) against y with q's
/// sign (`vpsignb`), a pair of products at most 2 · 128 · 127 = 32,512, then `vpmaddwd` by ones.
/// The block's integer dot is exact, as [`dot`]'s (which subtracts 128 · Σy instead), and its float
/// steps are [`dot`]'s, so both give the same bits. Against the file's layout (`simd::dot_rows`, a
/// row at a time: a sign fix, a convert, a scale and an FMA per row and block) on a Zen 3 core the
/// 0.5B's LM head read 12.3 GB/s (docs/benchmarks.md, session 57).
///
/// # Safety
/// AVX2, FMA and F16C; `g` holds `nb` Q8_0 groups; each activation row `nb` blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q8_0_avx2<const T: usize>(
    nb: usize,
    g: *const u8,
    q: &[*const u8; T],
    d: &[*const f32; T],
    out: &mut [[f32; 8]; T],
) {
    use std::arch::x86_64::*;
    let flip = _mm256_set1_epi8(-128);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); T];
    for i in 0..nb {
        let b = g.add(i * 272);
        super::simd::prefetch(b, 272);
        let dx = _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i));
        // Each register: q (signed) and |q|.
        let mut w = [_mm256_setzero_si256(); 8];
        let mut a = [_mm256_setzero_si256(); 8];
        for j in 0..8 {
            w[j] = _mm256_xor_si256(
                _mm256_loadu_si256(b.add(16 + 32 * j) as *const __m256i),
                flip,
            );
            a[j] = _mm256_sign_epi8(w[j], w[j]);
        }
        for t in 0..T {
            let y = q[t].add(i * 34 + 2);
            let mut sum = _mm256_setzero_si256();
            for j in 0..8 {
                let yj = _mm256_set1_epi32((y.add(4 * j) as *const i32).read_unaligned());
                let p = _mm256_maddubs_epi16(a[j], _mm256_sign_epi8(yj, w[j]));
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, ones));
            }
            let scale = _mm256_mul_ps(dx, _mm256_set1_ps(*d[t].add(i)));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, acc[t]);
        }
    }
    for t in 0..T {
        _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
}

/// Format `p`'s group kernel (Q5_0 or Q8_0): [`dot`] on AVX-512 VNNI, the `_avx2` kernels with
/// `avx2`. The one dispatch of `kernels::rows_x8` and of the tests.
///
/// # Safety
/// As the kernel it calls: with `avx2` AVX2, FMA and F16C, else AVX-512 VNNI, VL and BW; `g` holds
/// `nb` groups; each activation row `nb` blocks.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn group_dot<const T: usize>(
    p: Packed,
    avx2: bool,
    nb: usize,
    g: *const u8,
    q: &[*const u8; T],
    d: &[*const f32; T],
    s: &[*const i32; T],
    out: &mut [[f32; 8]; T],
) {
    match (p, avx2) {
        (Packed::Q5_0, true) => dot_q5_0_avx2::<T>(nb, g, q, d, s, out),
        (Packed::Q5_0, false) => dot::<T, false>(nb, g, q, d, s, out),
        (Packed::Q8_0, true) => dot_q8_0_avx2::<T>(nb, g, q, d, out),
        (Packed::Q8_0, false) => dot::<T, true>(nb, g, q, d, s, out),
        (Packed::Q4K | Packed::Q6K, _) => unreachable!("K-quant groups go through rows_k8"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::TensorType;
    use crate::weights::quantize;
    use rand::{Rng, SeedableRng};

    /// The repacked layout gives back every value of every row.
    #[test]
    fn repack_keeps_every_value() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        let (rows, cols) = (16, 96);
        let x: Vec<f32> = (0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let src = quantize(TensorType::Q5_0, &x);
        let nb = cols / 32;
        let mut p = vec![0u8; rows / 8 * nb * Packed::Q5_0.group_bytes()];
        repack_q5_0(&src, rows, nb, &mut p);
        for r in 0..rows {
            for i in 0..nb {
                let b = &src[(r * nb + i) * 22..][..22];
                let gb = Packed::Q5_0.group_bytes();
                let o = &p[((r / 8) * nb + i) * gb..][..gb];
                let rr = r % 8;
                assert_eq!(&o[2 * rr..2 * rr + 2], &b[..2]);
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                for m in 0..32 {
                    let want = if m < 16 {
                        b[6 + m] & 15
                    } else {
                        b[6 + m - 16] >> 4
                    } | (((qh >> m) & 1) as u8) << 4;
                    let (j, byte) = (m / 4, rr * 4 + m % 4);
                    let mask = u32::from_le_bytes(o[16 + 4 * j..20 + 4 * j].try_into().unwrap());
                    let nib = o[48 + 32 * (j / 2) + byte];
                    let lo = if j % 2 == 0 { nib & 15 } else { nib >> 4 };
                    let got = lo | (((mask >> byte) & 1) as u8) << 4;
                    assert_eq!(got, want, "row {r} block {i} value {m}");
                }
            }
        }
    }

    /// The AVX2 Q5_0 group kernel against candle's scalar reference, every tile height giving the
    /// same bits for the same pair (and, where the CPU has VNNI, the bits of [`dot`]).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_q5_0_matches_reference() {
        avx2_group_kernel_matches_reference(TensorType::Q5_0);
    }

    /// As above for the AVX2 Q8_0 group kernel.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_q8_0_matches_reference() {
        avx2_group_kernel_matches_reference(TensorType::Q8_0);
    }

    #[cfg(target_arch = "x86_64")]
    fn avx2_group_kernel_matches_reference(ttype: TensorType) {
        use crate::kernels::simd::{level, Level};
        use candle_core::quantized::k_quants::{BlockQ5_0, BlockQ8_0, GgmlType};
        if level() == Level::None {
            eprintln!("SKIP: no AVX2 on this CPU");
            return;
        }
        let q8 = ttype == TensorType::Q8_0;
        let (p, bb) = if q8 {
            (Packed::Q8_0, 34)
        } else {
            (Packed::Q5_0, 22)
        };
        let gb = p.group_bytes();
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let (rows, cols) = (16, 320);
        let nb = cols / 32;
        let x: Vec<f32> = (0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let src = quantize(ttype, &x);
        let mut g = vec![0u8; rows / 8 * nb * gb];
        if q8 {
            repack_q8_0(&src, rows, nb, &mut g);
        } else {
            repack_q5_0(&src, rows, nb, &mut g);
        }
        // Random rows and one at the extremes (-128 and 127 in every block).
        let acts: Vec<Vec<u8>> = (0..4)
            .map(|a| {
                let y: Vec<f32> = (0..cols)
                    .map(|i| {
                        if a == 3 {
                            if i % 2 == 0 {
                                -4.0
                            } else {
                                3.97
                            }
                        } else {
                            rng.gen_range(-2.0..2.0)
                        }
                    })
                    .collect();
                crate::weights::quantize(TensorType::Q8_0, &y)
            })
            .collect();
        let d: Vec<Vec<f32>> = acts
            .iter()
            .map(|a| {
                (0..nb)
                    .map(|i| half::f16::from_le_bytes([a[34 * i], a[34 * i + 1]]).to_f32())
                    .collect()
            })
            .collect();
        let s: Vec<Vec<i32>> = acts
            .iter()
            .map(|a| {
                (0..nb)
                    .map(|i| {
                        a[34 * i + 2..34 * i + 34]
                            .iter()
                            .map(|&v| v as i8 as i32)
                            .sum()
                    })
                    .collect()
            })
            .collect();
        let (qp, dp, sp): ([*const u8; 4], [*const f32; 4], [*const i32; 4]) = (
            std::array::from_fn(|t| acts[t].as_ptr()),
            std::array::from_fn(|t| d[t].as_ptr()),
            std::array::from_fn(|t| s[t].as_ptr()),
        );
        let vnni = level() == Level::Vnni;
        for grp in 0..rows / 8 {
            let gp = g[grp * nb * gb..].as_ptr();
            let mut four = [[0f32; 8]; 4];
            let mut one = [[0f32; 8]; 1];
            // SAFETY: AVX2 checked above (VNNI for `dot`); the buffers hold `nb` blocks.
            unsafe {
                group_dot::<4>(p, true, nb, gp, &qp, &dp, &sp, &mut four);
                if vnni {
                    let mut wide = [[0f32; 8]; 4];
                    group_dot::<4>(p, false, nb, gp, &qp, &dp, &sp, &mut wide);
                    assert_eq!(wide, four, "{ttype:?}: the VNNI kernel's bits");
                }
            }
            for t in 0..4 {
                unsafe { group_dot::<1>(p, true, nb, gp, &[qp[t]], &[dp[t]], &[sp[t]], &mut one) };
                assert_eq!(one[0], four[t], "T=1 and T=4 differ");
                for l in 0..8 {
                    let r = grp * 8 + l;
                    let w = &src[r * nb * bb..(r + 1) * nb * bb];
                    let y: &[BlockQ8_0] = crate::weights::cast(&acts[t]);
                    let want = if q8 {
                        BlockQ8_0::vec_dot_unopt(cols, crate::weights::cast::<BlockQ8_0>(w), y)
                    } else {
                        BlockQ5_0::vec_dot_unopt(cols, crate::weights::cast::<BlockQ5_0>(w), y)
                    };
                    // Rounding relative to the terms' size: Σ |dx · dy| · 32 · max|q| · 128.
                    let f16_at = |b: &[u8], o: usize| {
                        half::f16::from_le_bytes([b[o], b[o + 1]]).to_f32().abs()
                    };
                    let qmax = if q8 { 128.0 } else { 16.0 };
                    let size: f32 = (0..nb)
                        .map(|i| {
                            f16_at(&src, (r * nb + i) * bb) * d[t][i].abs() * 32.0 * qmax * 128.0
                        })
                        .sum();
                    assert!(
                        (four[t][l] - want).abs() <= 1e-6 * size,
                        "{ttype:?} row {r} act {t}: {} against {want}",
                        four[t][l]
                    );
                }
            }
        }
    }
}
