//! Q4_K weights repacked for AVX2: eight rows interleaved four values at a time, so that one
//! `vpmaddubsw` multiplies four values of one activation row (broadcast) with the same four values
//! of eight weight rows, 32 products an instruction. The products of a 32-value sub-block (16 per
//! 16-bit lane, at most 16 · 15 · 128 = 30,720) are summed in 16-bit lanes, and the sub-block's
//! scale is applied once for eight rows by one `vpmaddwd`. The row-at-a-time kernel (`kquant`)
//! spends a `vpmaddwd` on every 32 products, and this CPU has two ports for both instructions:
//! here the multiply ports do about 1.8 times the work per instruction. Integer sums are exact, so
//! a token's numbers do not depend on its batch, and decode reads this layout too.
//! Hand-written: no crate has a Q4_K GEMM for x86 without VNNI (llama.cpp's `repack` buffer type
//! and ik_llama.cpp's `_r4` types have their own layouts, in C).
//!
//! Q6_K the same way (`repack_q6k`, `dot_q6k`), its values stored unsigned (q + 32, 0..63), four
//! products to a 16-bit lane before each scale's `vpmaddwd`, and 32 · Σ scale · Σ y taken off per
//! block from the activation's sums of 16.
//!
//! A Q4_K group of eight rows × one 256-value block, 1184 bytes (8 × 144 in the file, plus 32):
//! - 0..16: the eight d (f16); 16..32: the eight dmin (f16);
//! - 32..96: the scales, sub-block j's eight at 32 + 8j (one byte each, 0..63);
//! - 96..160: the mins, for p in 0..4 sixteen bytes (m[r][2p], m[r][2p+1]) for r = 0..7;
//! - 160..1184: the values (nibbles): for sub-block j and k in 0..4, 32 bytes at 160 + 128j + 32k,
//!   byte 4r + m holding value 32j + 4k + m of row r in its low nibble and value 32j + 16 + 4k + m
//!   in its high nibble.

/// False when `MENS_NO_K8` is set: Q4_K, Q6_K (and, on AVX2, Q5_0 and Q8_0) stay in the file's
/// layout, for the row-at-a-time kernels (A/B measurements).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("MENS_NO_K8").is_none())
}

/// Bytes of a group of eight rows × one block.
pub const GROUP_BYTES: usize = 1184;
pub(crate) const D: usize = 0;
pub(crate) const DMIN: usize = 16;
pub(crate) const SCALES: usize = 32;
pub(crate) const MINS: usize = 96;
pub(crate) const VALUES: usize = 160;

/// The cache lines of slice `j` of 8 of a group block of `bytes` at `b`: a group block's
/// prefetches spread over its eight steps. (With one burst of 19 at the block's start, decode's
/// profile had half its samples on the nibble loads and decode ran below the file layout's speed.)
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn prefetch_slice(b: *const u8, j: usize, bytes: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let (from, to) = (
        bytes * j / 8 / 64 * 64,
        (bytes * (j + 1) / 8).div_ceil(64) * 64,
    );
    let mut o = from;
    while o < to {
        _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(o) as *const i8);
        o += 64;
    }
}

/// Sub-block j's (scale, min) from a Q4_K block's 12 packed bytes (ggml's `get_scale_min_k4`).
fn scale_min(sc: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (sc[j] & 63, sc[j + 4] & 63)
    } else {
        (
            (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4),
            (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4),
        )
    }
}

/// Value v (0..256) of a Q4_K block's 128 bytes of nibbles.
fn nibble(qs: &[u8], v: usize) -> u8 {
    let (c, w) = (v / 64, v % 64);
    if w < 32 {
        qs[32 * c + w] & 15
    } else {
        qs[32 * c + w - 32] >> 4
    }
}

/// Repack a Q4_K matrix (`rows` a multiple of 8, `nb` blocks per row) into groups, into `out`.
pub fn repack_q4k(src: &[u8], rows: usize, nb: usize, out: &mut [u8]) {
    assert!(
        rows.is_multiple_of(8)
            && src.len() == rows * nb * 144
            && out.len() == rows / 8 * nb * GROUP_BYTES
    );
    out.fill(0);
    for g in 0..rows / 8 {
        for i in 0..nb {
            let o = &mut out[(g * nb + i) * GROUP_BYTES..][..GROUP_BYTES];
            for r in 0..8 {
                let b = &src[((g * 8 + r) * nb + i) * 144..][..144];
                o[D + 2 * r..D + 2 * r + 2].copy_from_slice(&b[0..2]);
                o[DMIN + 2 * r..DMIN + 2 * r + 2].copy_from_slice(&b[2..4]);
                for j in 0..8 {
                    let (s, m) = scale_min(&b[4..16], j);
                    o[SCALES + 8 * j + r] = s;
                    o[MINS + 16 * (j / 2) + 2 * r + j % 2] = m;
                }
                let qs = &b[16..144];
                for j in 0..8 {
                    for k in 0..4 {
                        for m in 0..4 {
                            let lo = nibble(qs, 32 * j + 4 * k + m);
                            let hi = nibble(qs, 32 * j + 16 + 4 * k + m);
                            o[VALUES + 128 * j + 32 * k + 4 * r + m] = lo | hi << 4;
                        }
                    }
                }
            }
        }
    }
}

/// Row `r` of a repacked matrix (`nb` blocks per row) as f32, as ggml's `dequantize_row_q4_K`.
pub fn dequantize_row(g: &[u8], nb: usize, r: usize, out: &mut [f32]) {
    let (grp, lane) = (r / 8, r % 8);
    let f16_at =
        |b: &[u8], i: usize| half::f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32();
    for i in 0..nb {
        let b = &g[(grp * nb + i) * GROUP_BYTES..][..GROUP_BYTES];
        let (d, dmin) = (f16_at(b, D + 2 * lane), f16_at(b, DMIN + 2 * lane));
        for j in 0..8 {
            let sc = d * b[SCALES + 8 * j + lane] as f32;
            let m = dmin * b[MINS + 16 * (j / 2) + 2 * lane + j % 2] as f32;
            for v in 0..32 {
                let (k, m4, high) = ((v % 16) / 4, v % 4, v >= 16);
                let byte = b[VALUES + 128 * j + 32 * k + 4 * lane + m4];
                let q = if high { byte >> 4 } else { byte & 15 };
                out[i * 256 + 32 * j + v] = sc * q as f32 - m;
            }
        }
    }
}

/// A group block's eight d and −dmin (the mins term is subtracted; negating first gives the same
/// bits as after), and its mins widened to 16 bits, as [`dot`] and [`dot_vnni`] read them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn block_scales(
    b: *const u8,
) -> (
    std::arch::x86_64::__m256,
    std::arch::x86_64::__m256,
    [std::arch::x86_64::__m256i; 4],
) {
    use std::arch::x86_64::*;
    let d = _mm256_cvtph_ps(_mm_loadu_si128(b.add(D) as *const __m128i));
    let neg_dmin = _mm256_xor_ps(
        _mm256_cvtph_ps(_mm_loadu_si128(b.add(DMIN) as *const __m128i)),
        _mm256_set1_ps(-0.0),
    );
    let mins = std::array::from_fn(|p| {
        _mm256_cvtepu8_epi16(_mm_loadu_si128(b.add(MINS + 16 * p) as *const __m128i))
    });
    (d, neg_dmin, mins)
}

/// Σ over sub-blocks of min · the activation's sub-block sum, for the eight rows: the sums of the
/// eight 32-value sub-blocks come from the Q8_K block's 16 sums of 16 (at `yb` + 260).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn mins_dot(
    mins: &[std::arch::x86_64::__m256i; 4],
    yb: *const u8,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let bsums = _mm256_loadu_si256(yb.add(260) as *const __m256i);
    let q8s = _mm_hadd_epi16(
        _mm256_castsi256_si128(bsums),
        _mm256_extracti128_si256(bsums, 1),
    );
    let pairs = [
        _mm256_broadcastd_epi32(q8s),
        _mm256_broadcastd_epi32(_mm_shuffle_epi32(q8s, 0x55)),
        _mm256_broadcastd_epi32(_mm_shuffle_epi32(q8s, 0xAA)),
        _mm256_broadcastd_epi32(_mm_shuffle_epi32(q8s, 0xFF)),
    ];
    let mut ms = _mm256_madd_epi16(mins[0], pairs[0]);
    for p in 1..4 {
        ms = _mm256_add_epi32(ms, _mm256_madd_epi16(mins[p], pairs[p]));
    }
    ms
}

/// The dot of the eight rows of one group (`nb` blocks at `g`) with `T` Q8_K activation rows: the
/// eight results per activation row, in row order. The arithmetic of each (row, activation row)
/// pair is the same whatever `T` is.
///
/// # Safety
/// AVX2, FMA and F16C; `g` holds `nb` group blocks, each of `ys` `nb` Q8_K blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot<const T: usize>(
    nb: usize,
    g: *const u8,
    ys: &[*const u8; T],
    out: &mut [[f32; 8]; T],
) {
    use std::arch::x86_64::*;
    let low = _mm256_set1_epi8(15);
    let mut acc = [_mm256_setzero_ps(); T];
    let ahead = super::simd::PREFETCH_AHEAD;
    for i in 0..nb {
        let b = g.add(i * GROUP_BYTES);
        let mut sum = [_mm256_setzero_si256(); T];
        for j in 0..8 {
            prefetch_slice(b.wrapping_add(ahead), j, GROUP_BYTES);
            let s8 = _mm_loadl_epi64(b.add(SCALES + 8 * j) as *const __m128i);
            let sc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(s8, s8));
            let mut p = [_mm256_setzero_si256(); T];
            for k in 0..4 {
                let n = _mm256_loadu_si256(b.add(VALUES + 128 * j + 32 * k) as *const __m256i);
                let lo = _mm256_and_si256(n, low);
                let hi = _mm256_and_si256(_mm256_srli_epi16(n, 4), low);
                for t in 0..T {
                    let y = ys[t].add(i * 292 + 4 + 32 * j + 4 * k);
                    let ylo = _mm256_set1_epi32((y as *const i32).read_unaligned());
                    let yhi = _mm256_set1_epi32((y.add(16) as *const i32).read_unaligned());
                    p[t] = _mm256_add_epi16(p[t], _mm256_maddubs_epi16(lo, ylo));
                    p[t] = _mm256_add_epi16(p[t], _mm256_maddubs_epi16(hi, yhi));
                }
            }
            for t in 0..T {
                sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(p[t], sc));
            }
        }
        let (d, neg_dmin, mins) = block_scales(b);
        for t in 0..T {
            let yb = ys[t].add(i * 292);
            let dy = _mm256_set1_ps((yb as *const f32).read_unaligned());
            let ms = mins_dot(&mins, yb);
            // The mins term first, as ggml adds it.
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_mul_ps(neg_dmin, dy), acc[t]);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[t]), _mm256_mul_ps(d, dy), acc[t]);
        }
    }
    for t in 0..T {
        _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
}

/// Bytes of a Q6_K group of eight rows × one block (8 × 210, as in the file):
/// - 0..16: the eight d (f16);
/// - 16..144: the scales, for p in 0..8 sixteen bytes (s[r][2p], s[r][2p+1]) for r = 0..7 (i8);
/// - 144..1168: low four bits of the values: sub-block g (16 values) at 144 + 64g, two 32-byte
///   registers k' = 0, 1, byte 4r + m holding value 16g + 4k' + m of row r in its low nibble and
///   value 16g + 8 + 4k' + m in its high nibble;
/// - 1168..1680: the values' top two bits: sub-block g at 1168 + 32g, byte 4r + m holding those of
///   value 16g + 4k + m of row r at bits 2k, 2k + 1 (k = 0..3).
pub const Q6K_GROUP_BYTES: usize = 1680;
pub(crate) const Q6_SCALES: usize = 16;
pub(crate) const Q6_LOW: usize = 144;
pub(crate) const Q6_HIGH: usize = 1168;

/// Value v (0..256) of a Q6_K block, unsigned (q + 32, 0..63), and its scale index.
fn q6k_value(b: &[u8], v: usize) -> u8 {
    let (h, w) = (v / 128, v % 128);
    let (ql, qh) = (&b[64 * h..64 * h + 64], &b[128 + 32 * h..128 + 32 * h + 32]);
    let (quarter, l) = (w / 32, w % 32);
    let low = match quarter {
        0 => ql[l] & 15,
        1 => ql[l + 32] & 15,
        2 => ql[l] >> 4,
        _ => ql[l + 32] >> 4,
    };
    low | ((qh[l] >> (2 * quarter)) & 3) << 4
}

/// Repack a Q6_K matrix (`rows` a multiple of 8, `nb` blocks per row) into groups, into `out`.
pub fn repack_q6k(src: &[u8], rows: usize, nb: usize, out: &mut [u8]) {
    const GB: usize = Q6K_GROUP_BYTES;
    assert!(
        rows.is_multiple_of(8) && src.len() == rows * nb * 210 && out.len() == rows / 8 * nb * GB
    );
    out.fill(0);
    for g in 0..rows / 8 {
        for i in 0..nb {
            let o = &mut out[(g * nb + i) * GB..][..GB];
            for r in 0..8 {
                let b = &src[((g * 8 + r) * nb + i) * 210..][..210];
                o[2 * r..2 * r + 2].copy_from_slice(&b[208..210]);
                for sb in 0..16 {
                    o[Q6_SCALES + 16 * (sb / 2) + 2 * r + sb % 2] = b[192 + sb];
                }
                for sb in 0..16 {
                    for k in 0..4 {
                        for m in 0..4 {
                            let u = q6k_value(b, 16 * sb + 4 * k + m);
                            let byte = 4 * r + m;
                            let (reg, high) = (k % 2, k / 2);
                            o[Q6_LOW + 64 * sb + 32 * reg + byte] |= (u & 15) << (4 * high);
                            o[Q6_HIGH + 32 * sb + byte] |= (u >> 4) << (2 * k);
                        }
                    }
                }
            }
        }
    }
}

/// Row `r` of a repacked Q6_K matrix (`nb` blocks per row) as f32, as ggml's `dequantize_row_q6_K`.
pub fn dequantize_row_q6k(g: &[u8], nb: usize, r: usize, out: &mut [f32]) {
    const GB: usize = Q6K_GROUP_BYTES;
    let (grp, lane) = (r / 8, r % 8);
    for i in 0..nb {
        let b = &g[(grp * nb + i) * GB..][..GB];
        let d = half::f16::from_bits(u16::from_le_bytes([b[2 * lane], b[2 * lane + 1]])).to_f32();
        for sb in 0..16 {
            let sc = b[Q6_SCALES + 16 * (sb / 2) + 2 * lane + sb % 2] as i8 as f32;
            for v in 0..16 {
                let (k, m) = (v / 4, v % 4);
                let byte = 4 * lane + m;
                let low = (b[Q6_LOW + 64 * sb + 32 * (k % 2) + byte] >> (4 * (k / 2))) & 15;
                let high = (b[Q6_HIGH + 32 * sb + byte] >> (2 * k)) & 3;
                let q = (low | high << 4) as i32 - 32;
                out[i * 256 + 16 * sb + v] = d * (sc * q as f32);
            }
        }
    }
}

/// As [`dot`], for a Q6_K group (`nb` blocks at `g`).
///
/// # Safety
/// As [`dot`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q6k<const T: usize>(
    nb: usize,
    g: *const u8,
    ys: &[*const u8; T],
    out: &mut [[f32; 8]; T],
) {
    use std::arch::x86_64::*;
    const GB: usize = Q6K_GROUP_BYTES;
    let low = _mm256_set1_epi8(15);
    let two = _mm256_set1_epi8(0x30);
    // Spread 16-bit lane 2r (or 2r + 1) over lanes 2r and 2r + 1: sub-block 2p's (or 2p + 1's)
    // scale for both halves of row r's products.
    let even = _mm256_setr_epi8(
        0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12,
        13, 12, 13,
    );
    let odd = _mm256_setr_epi8(
        2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15, 2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10,
        11, 14, 15, 14, 15,
    );
    let mut acc = [_mm256_setzero_ps(); T];
    let ahead = super::simd::PREFETCH_AHEAD;
    for i in 0..nb {
        let b = g.add(i * GB);
        let mut sum = [_mm256_setzero_si256(); T];
        let mut corr = [_mm256_setzero_si256(); T];
        for p in 0..8 {
            prefetch_slice(b.wrapping_add(ahead), p, GB);
            let pair =
                _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(Q6_SCALES + 16 * p) as *const __m128i));
            for t in 0..T {
                let bs = (ys[t].add(i * 292 + 260 + 4 * p) as *const i32).read_unaligned();
                corr[t] = _mm256_add_epi32(corr[t], _mm256_madd_epi16(pair, _mm256_set1_epi32(bs)));
            }
            for e in 0..2 {
                let sb = 2 * p + e;
                let sc = _mm256_shuffle_epi8(pair, if e == 0 { even } else { odd });
                let n0 = _mm256_loadu_si256(b.add(Q6_LOW + 64 * sb) as *const __m256i);
                let n1 = _mm256_loadu_si256(b.add(Q6_LOW + 64 * sb + 32) as *const __m256i);
                let hb = _mm256_loadu_si256(b.add(Q6_HIGH + 32 * sb) as *const __m256i);
                let w = [
                    _mm256_or_si256(
                        _mm256_and_si256(n0, low),
                        _mm256_and_si256(_mm256_slli_epi16(hb, 4), two),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(n1, low),
                        _mm256_and_si256(_mm256_slli_epi16(hb, 2), two),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(n0, 4), low),
                        _mm256_and_si256(hb, two),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(n1, 4), low),
                        _mm256_and_si256(_mm256_srli_epi16(hb, 2), two),
                    ),
                ];
                for t in 0..T {
                    let y = ys[t].add(i * 292 + 4 + 16 * sb);
                    let yv =
                        |k: usize| _mm256_set1_epi32((y.add(4 * k) as *const i32).read_unaligned());
                    // Four products a lane at most 4 · 63 · 128 = 32,256: two instructions, then the scale.
                    let a = _mm256_add_epi16(
                        _mm256_maddubs_epi16(w[0], yv(0)),
                        _mm256_maddubs_epi16(w[1], yv(1)),
                    );
                    let c = _mm256_add_epi16(
                        _mm256_maddubs_epi16(w[2], yv(2)),
                        _mm256_maddubs_epi16(w[3], yv(3)),
                    );
                    sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(a, sc));
                    sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(c, sc));
                }
            }
        }
        let d = _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i));
        for t in 0..T {
            let dy = _mm256_set1_ps((ys[t].add(i * 292) as *const f32).read_unaligned());
            let s = _mm256_sub_epi32(sum[t], _mm256_slli_epi32(corr[t], 5));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, dy), acc[t]);
        }
    }
    for t in 0..T {
        _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
}

/// Dword lane order that puts register half 0's lane r at 2r and half 1's lane r at 2r + 1: two
/// 32-byte rows of a group block (eight rows each) become pairs per row, so that one 8-byte
/// broadcast of the activation (two 4-value steps) meets both.
#[cfg(target_arch = "x86_64")]
const PAIRS: [i32; 16] = [0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15];

/// Row r's sum from lanes 2r and 2r + 1, as eight lanes in row order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn fold_pairs(s: std::arch::x86_64::__m512i) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    _mm512_cvtepi64_epi32(_mm512_add_epi32(s, _mm512_srli_epi64::<32>(s)))
}

/// As [`dot`], on AVX-512 VNNI: the same integers, from a quarter of the instructions. Two 4-value
/// steps of eight rows share a 512-bit register ([`PAIRS`]); `vpdpbusd` sums each lane's four
/// products into 32 bits, and `vpdpwssd` multiplies a sub-block's sum (16 products a lane, at most
/// 16 · 15 · 128 = 30,720, so it fits 16 bits) by its scale and adds it. The integer sums are
/// exact, so every result is bit for bit [`dot`]'s, whatever `T` is (tested); eight activation rows
/// fit the 32 registers.
///
/// # Safety
/// AVX-512 F, BW, VL and VNNI, FMA and F16C; `g` holds `nb` group blocks, each of `ys` `nb` Q8_K
/// blocks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn dot_vnni<const T: usize>(
    nb: usize,
    g: *const u8,
    ys: &[*const u8; T],
    out: &mut [[f32; 8]; T],
) {
    use std::arch::x86_64::*;
    let low = _mm512_set1_epi8(15);
    let pairs = _mm512_loadu_si512(PAIRS.as_ptr() as *const _);
    let mut acc = [_mm256_setzero_ps(); T];
    let ahead = super::simd::PREFETCH_AHEAD;
    for i in 0..nb {
        let b = g.add(i * GROUP_BYTES);
        let mut sum = [_mm512_setzero_si512(); T];
        for j in 0..8 {
            prefetch_slice(b.wrapping_add(ahead), j, GROUP_BYTES);
            let s8 = _mm_loadl_epi64(b.add(SCALES + 8 * j) as *const __m128i);
            let sc = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(s8, s8));
            let v = b.add(VALUES + 128 * j);
            let n01 = _mm512_permutexvar_epi32(pairs, _mm512_loadu_si512(v as *const _));
            let n23 = _mm512_permutexvar_epi32(pairs, _mm512_loadu_si512(v.add(64) as *const _));
            let w = [
                _mm512_and_si512(n01, low),
                _mm512_and_si512(_mm512_srli_epi16::<4>(n01), low),
                _mm512_and_si512(n23, low),
                _mm512_and_si512(_mm512_srli_epi16::<4>(n23), low),
            ];
            for t in 0..T {
                let y = ys[t].add(i * 292 + 4 + 32 * j);
                let yv = |o: usize| _mm512_set1_epi64((y.add(o) as *const i64).read_unaligned());
                let mut p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], yv(0));
                p = _mm512_dpbusd_epi32(p, w[1], yv(16));
                p = _mm512_dpbusd_epi32(p, w[2], yv(8));
                p = _mm512_dpbusd_epi32(p, w[3], yv(24));
                sum[t] = _mm512_dpwssd_epi32(sum[t], p, sc);
            }
        }
        let (d, neg_dmin, mins) = block_scales(b);
        for t in 0..T {
            let yb = ys[t].add(i * 292);
            let dy = _mm256_set1_ps((yb as *const f32).read_unaligned());
            let ms = mins_dot(&mins, yb);
            // As in `dot`: the mins term first, then the values'.
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_mul_ps(neg_dmin, dy), acc[t]);
            let s = fold_pairs(sum[t]);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, dy), acc[t]);
        }
    }
    for t in 0..T {
        _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
}

/// As [`dot_q6k`], on AVX-512 VNNI, as [`dot_vnni`] does for Q4_K: the two 32-byte registers of
/// a sub-block's low bits in one ([`PAIRS`]), the top bits spread to match by a variable shift,
/// four products a lane by `vpdpbusd` (at most 4 · 63 · 128 = 32,256) and the scale by `vpdpwssd`.
///
/// # Safety
/// As [`dot_vnni`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn dot_q6k_vnni<const T: usize>(
    nb: usize,
    g: *const u8,
    ys: &[*const u8; T],
    out: &mut [[f32; 8]; T],
) {
    use std::arch::x86_64::*;
    const GB: usize = Q6K_GROUP_BYTES;
    let low = _mm512_set1_epi8(15);
    let two = _mm512_set1_epi8(0x30);
    let pairs = _mm512_loadu_si512(PAIRS.as_ptr() as *const _);
    // The top bits' dword of row r in lanes 2r and 2r + 1.
    let twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    // Bits 2k, 2k + 1 to bits 4, 5: k = 0 (lane 2r) and 1 (2r + 1) up, then k = 2 and 3 down.
    let up = _mm512_setr_epi32(4, 2, 4, 2, 4, 2, 4, 2, 4, 2, 4, 2, 4, 2, 4, 2);
    let down = _mm512_setr_epi32(0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2);
    let sixteen_bits = _mm512_set1_epi32(0xFFFF);
    let mut acc = [_mm256_setzero_ps(); T];
    let ahead = super::simd::PREFETCH_AHEAD;
    for i in 0..nb {
        let b = g.add(i * GB);
        let mut sum = [_mm512_setzero_si512(); T];
        let mut corr = [_mm256_setzero_si256(); T];
        for p in 0..8 {
            prefetch_slice(b.wrapping_add(ahead), p, GB);
            let s16 = _mm_loadu_si128(b.add(Q6_SCALES + 16 * p) as *const __m128i);
            let pair = _mm256_cvtepi8_epi16(s16);
            for t in 0..T {
                let bs = (ys[t].add(i * 292 + 260 + 4 * p) as *const i32).read_unaligned();
                corr[t] = _mm256_add_epi32(corr[t], _mm256_madd_epi16(pair, _mm256_set1_epi32(bs)));
            }
            // Lane 2r + e: s[r][2p + e], kept to its low 16 bits for `vpdpwssd`.
            let s32 = _mm512_and_si512(_mm512_cvtepi8_epi32(s16), sixteen_bits);
            for e in 0..2 {
                let sb = 2 * p + e;
                let sc = if e == 0 {
                    _mm512_shuffle_epi32::<0xA0>(s32)
                } else {
                    _mm512_shuffle_epi32::<0xF5>(s32)
                };
                let n = _mm512_permutexvar_epi32(
                    pairs,
                    _mm512_loadu_si512(b.add(Q6_LOW + 64 * sb) as *const _),
                );
                let hb = _mm512_permutexvar_epi32(
                    twice,
                    _mm512_castsi256_si512(_mm256_loadu_si256(
                        b.add(Q6_HIGH + 32 * sb) as *const __m256i
                    )),
                );
                let w01 = _mm512_or_si512(
                    _mm512_and_si512(n, low),
                    _mm512_and_si512(_mm512_sllv_epi32(hb, up), two),
                );
                let w23 = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(n), low),
                    _mm512_and_si512(_mm512_srlv_epi32(hb, down), two),
                );
                for t in 0..T {
                    let y = ys[t].add(i * 292 + 4 + 16 * sb);
                    let yv =
                        |o: usize| _mm512_set1_epi64((y.add(o) as *const i64).read_unaligned());
                    let a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w01, yv(0));
                    let c = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w23, yv(8));
                    sum[t] = _mm512_dpwssd_epi32(sum[t], a, sc);
                    sum[t] = _mm512_dpwssd_epi32(sum[t], c, sc);
                }
            }
        }
        let d = _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i));
        for t in 0..T {
            let dy = _mm256_set1_ps((ys[t].add(i * 292) as *const f32).read_unaligned());
            let s = _mm256_sub_epi32(fold_pairs(sum[t]), _mm256_slli_epi32(corr[t], 5));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, dy), acc[t]);
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
    use candle_core::quantized::k_quants::{BlockQ4K, BlockQ6K, BlockQ8K, GgmlType};
    use rand::{Rng, SeedableRng};

    /// The two formats, each as (type, file block bytes, group bytes, repack, dequantize).
    type Repack = fn(&[u8], usize, usize, &mut [u8]);
    type Dequant = fn(&[u8], usize, usize, &mut [f32]);
    const FORMATS: [(TensorType, usize, usize, Repack, Dequant); 2] = [
        (
            TensorType::Q4K,
            144,
            GROUP_BYTES,
            repack_q4k,
            dequantize_row,
        ),
        (
            TensorType::Q6K,
            210,
            Q6K_GROUP_BYTES,
            repack_q6k,
            dequantize_row_q6k,
        ),
    ];

    fn matrix(t: TensorType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        // Rows of different magnitudes, and some outliers, so that scales and mins vary.
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| {
                let v: f32 = rng.gen_range(-1.0..1.0);
                let big = if rng.gen_range(0..50) == 0 { 8.0 } else { 1.0 };
                v * big * (1 + i / cols % 3) as f32
            })
            .collect();
        quantize(t, &x)
    }

    fn row_f32(t: TensorType, row: &[u8], cols: usize) -> Vec<f32> {
        let mut out = vec![0f32; cols];
        match t {
            TensorType::Q4K => BlockQ4K::to_float(crate::weights::cast(row), &mut out),
            _ => BlockQ6K::to_float(crate::weights::cast(row), &mut out),
        }
        out
    }

    /// The repacked layouts give back every value of every row, as the file's blocks dequantize.
    #[test]
    fn repack_keeps_every_value() {
        for (t, bb, gbytes, repack, deq) in FORMATS {
            let (rows, cols) = (16, 512);
            let src = matrix(t, rows, cols, 3);
            let nb = cols / 256;
            let mut g = vec![0u8; rows / 8 * nb * gbytes];
            repack(&src, rows, nb, &mut g);
            for r in 0..rows {
                let want = row_f32(t, &src[r * nb * bb..(r + 1) * nb * bb], cols);
                let mut got = vec![0f32; cols];
                deq(&g, nb, r, &mut got);
                assert_eq!(got, want, "{t:?} row {r}");
            }
        }
    }

    /// Q8_K rows for `cols` values: random ones, one at the extremes (-128 appears in Q8_K), one
    /// all zero.
    fn act_rows(n: usize, cols: usize, seed: u64) -> Vec<Vec<u8>> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let nb = cols / 256;
        (0..n)
            .map(|a| {
                let y: Vec<f32> = (0..cols)
                    .map(|i| match a {
                        2 => {
                            if i % 2 == 0 {
                                -5.0
                            } else {
                                4.9
                            }
                        }
                        3 => 0.0,
                        _ => rng.gen_range(-3.0..3.0),
                    })
                    .collect();
                let mut q = vec![BlockQ8K::zeros(); nb];
                BlockQ8K::from_float(&y, &mut q);
                // SAFETY: plain-old-data blocks viewed as bytes.
                unsafe { std::slice::from_raw_parts(q.as_ptr() as *const u8, nb * 292) }.to_vec()
            })
            .collect()
    }

    /// The AVX-512 VNNI kernels give the AVX2 kernels' bits, for every tile height 1..=8, on
    /// matrices whose values and scales reach their extremes.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vnni_kernels_equal_the_avx2_kernels() {
        if crate::kernels::simd::level() != crate::kernels::simd::Level::Vnni {
            eprintln!("SKIP: no AVX-512 VNNI on this CPU");
            return;
        }
        for (t, _, gbytes, repack, _) in FORMATS {
            let (rows, cols) = (24, 1024);
            let nb = cols / 256;
            let src = matrix(t, rows, cols, 11);
            let mut g = vec![0u8; rows / 8 * nb * gbytes];
            repack(&src, rows, nb, &mut g);
            let acts = act_rows(8, cols, 13);
            for grp in 0..rows / 8 {
                let gp = g[grp * nb * gbytes..].as_ptr();
                // SAFETY: AVX-512 VNNI checked above; `gp` holds `nb` group blocks, each
                // activation row `nb` blocks.
                unsafe {
                    macro_rules! go {
                        ($T:literal) => {{
                            let y: [*const u8; $T] =
                                std::array::from_fn(|k| acts[8 - $T + k].as_ptr());
                            let (mut a, mut b) = ([[0f32; 8]; $T], [[0f32; 8]; $T]);
                            if t == TensorType::Q4K {
                                dot_vnni::<$T>(nb, gp, &y, &mut a);
                            } else {
                                dot_q6k_vnni::<$T>(nb, gp, &y, &mut a);
                            }
                            for k in 0..$T {
                                let one = [y[k]];
                                let mut o = [[0f32; 8]; 1];
                                if t == TensorType::Q4K {
                                    dot::<1>(nb, gp, &one, &mut o);
                                } else {
                                    dot_q6k::<1>(nb, gp, &one, &mut o);
                                }
                                b[k] = o[0];
                            }
                            for k in 0..$T {
                                let bits = |v: &[f32; 8]| v.map(f32::to_bits);
                                assert_eq!(
                                    bits(&a[k]),
                                    bits(&b[k]),
                                    "{t:?} group {grp} T={} row {k}",
                                    $T
                                );
                            }
                        }};
                    }
                    go!(1);
                    go!(2);
                    go!(3);
                    go!(4);
                    go!(5);
                    go!(6);
                    go!(7);
                    go!(8);
                }
            }
        }
    }

    /// The kernels against the scalar reference (candle's `vec_dot_unopt`, ggml's arithmetic), for
    /// every tile height; and every tile height gives the same bits for the same pair.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn dot_matches_reference_for_every_tile() {
        if crate::kernels::simd::level() == crate::kernels::simd::Level::None {
            eprintln!("SKIP: no AVX2 on this CPU");
            return;
        }
        for (t, bb, gbytes, repack, _) in FORMATS {
            let (rows, cols) = (16, 768);
            let nb = cols / 256;
            let src = matrix(t, rows, cols, 5);
            let mut g = vec![0u8; rows / 8 * nb * gbytes];
            repack(&src, rows, nb, &mut g);
            let acts = act_rows(4, cols, 9);
            let ys: [*const u8; 4] = std::array::from_fn(|a| acts[a].as_ptr());
            let run = |n: usize, gp: *const u8, ys: &[*const u8]| -> Vec<[f32; 8]> {
                // SAFETY: AVX2 checked above; `gp` holds `nb` group blocks, each row `nb` blocks.
                unsafe {
                    macro_rules! go {
                        ($T:literal) => {{
                            let mut o = [[0f32; 8]; $T];
                            let y: [*const u8; $T] = std::array::from_fn(|k| ys[k]);
                            if t == TensorType::Q4K {
                                dot::<$T>(nb, gp, &y, &mut o)
                            } else {
                                dot_q6k::<$T>(nb, gp, &y, &mut o)
                            }
                            o.to_vec()
                        }};
                    }
                    match n {
                        1 => go!(1),
                        2 => go!(2),
                        3 => go!(3),
                        _ => go!(4),
                    }
                }
            };
            for grp in 0..rows / 8 {
                let gp = g[grp * nb * gbytes..].as_ptr();
                let four = run(4, gp, &ys);
                for n in 1..4 {
                    let part = run(n, gp, &ys[4 - n..]);
                    for k in 0..n {
                        assert_eq!(part[k], four[4 - n + k], "{t:?}: T={n} and T=4 differ");
                    }
                }
                for (a, act) in acts.iter().enumerate() {
                    for l in 0..8 {
                        let r = grp * 8 + l;
                        let w = &src[r * nb * bb..(r + 1) * nb * bb];
                        let y: &[BlockQ8K] = crate::weights::cast(act);
                        let want = match t {
                            TensorType::Q4K => {
                                BlockQ4K::vec_dot_unopt(cols, crate::weights::cast(w), y)
                            }
                            _ => BlockQ6K::vec_dot_unopt(cols, crate::weights::cast(w), y),
                        };
                        // Rounding is relative to the terms' size (the mins term cancels much).
                        let (wf, mut yf) = (row_f32(t, w, cols), vec![0f32; cols]);
                        BlockQ8K::to_float(y, &mut yf);
                        let size: f32 = wf.iter().zip(&yf).map(|(a, b)| (a * b).abs()).sum();
                        let got = four[a][l];
                        assert!(
                            (got - want).abs() <= 1e-6 * size + 1e-6,
                            "{t:?} row {r} act {a}: {got} against {want}"
                        );
                    }
                }
            }
        }
    }

    /// Single-thread speed of the group kernels, MACs per ns for tile heights 1, 4 and 8, on a
    /// matrix of ROWS rows × 1536 values (default 64: it stays in L2; 65536 streams from memory):
    /// `ROWS=65536 cargo test --release -p mens --lib k8_speed -- --ignored --nocapture`.
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[ignore]
    fn k8_speed() {
        if crate::kernels::simd::level() != crate::kernels::simd::Level::Vnni {
            return;
        }
        let rows: usize = std::env::var("ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(64);
        let nb = 6;
        let acts = act_rows(8, nb * 256, 3);
        for (t, _, gbytes, _, _) in FORMATS {
            let g = vec![0x5Au8; rows / 8 * nb * gbytes];
            for vnni in [false, true] {
                let mut line = format!("{t:?} vnni {vnni}:");
                macro_rules! go {
                    ($T:literal) => {{
                        let y: [*const u8; $T] = std::array::from_fn(|k| acts[k].as_ptr());
                        let mut o = [[0f32; 8]; $T];
                        let reps = (1 << 26) / (rows * nb * 256) + 1;
                        let start = std::time::Instant::now();
                        for _ in 0..reps {
                            for grp in 0..rows / 8 {
                                let gp = g[grp * nb * gbytes..].as_ptr();
                                // SAFETY: VNNI checked above; sizes as made above.
                                unsafe {
                                    match (t == TensorType::Q4K, vnni) {
                                        (true, false) => dot::<$T>(nb, gp, &y, &mut o),
                                        (true, true) => dot_vnni::<$T>(nb, gp, &y, &mut o),
                                        (false, false) => dot_q6k::<$T>(nb, gp, &y, &mut o),
                                        (false, true) => dot_q6k_vnni::<$T>(nb, gp, &y, &mut o),
                                    }
                                }
                                std::hint::black_box(&o);
                            }
                        }
                        let ns = start.elapsed().as_nanos() as f64;
                        let macs = (reps * rows * nb * 256 * $T) as f64;
                        line += &format!(" T={}: {:.1} MAC/ns", $T, macs / ns);
                    }};
                }
                go!(1);
                go!(4);
                go!(8);
                eprintln!("{line}");
            }
        }
    }
}
