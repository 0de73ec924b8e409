//! Q5_0 and Q8_0 weights repacked for AVX-512 VNNI: eight rows interleaved four bytes at a time, so that one
//! `vpdpbusd` multiplies four values of one activation row with the same four values of eight
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
}

impl Packed {
    /// The repacked format of a tensor type, if it has one.
    pub fn of(t: crate::gguf::TensorType) -> Option<Packed> {
        match t {
            crate::gguf::TensorType::Q5_0 => Some(Packed::Q5_0),
            crate::gguf::TensorType::Q8_0 => Some(Packed::Q8_0),
            _ => None,
        }
    }

    pub fn group_bytes(self) -> usize {
        match self {
            Packed::Q5_0 => 176,
            Packed::Q8_0 => 272,
        }
    }
}

/// Row `r` of a repacked matrix (`nb` blocks per row) as f32, the file's values exactly (a tied
/// embedding's lookup, once its mapped pages are given back).
pub fn dequantize_row(p: Packed, g: &[u8], nb: usize, r: usize, out: &mut [f32]) {
    let gb = p.group_bytes();
    let (grp, lane) = (r / 8, r % 8);
    for i in 0..nb {
        let b = &g[(grp * nb + i) * gb..][..gb];
        let d = half::f16::from_bits(u16::from_le_bytes([b[2 * lane], b[2 * lane + 1]])).to_f32();
        for m in 0..32 {
            let (j, byte) = (m / 4, lane * 4 + m % 4);
            let q = match p {
                Packed::Q8_0 => b[16 + 32 * j + byte] as i32 - 128,
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
    assert!(rows % 8 == 0 && src.len() == rows * nb * bb && out.len() == rows / 8 * nb * gb);
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
}
