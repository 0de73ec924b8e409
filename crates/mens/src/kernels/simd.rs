//! x86 dot products for the 32-value block types (Q4_0, Q4_1, Q5_0, Q8_0) against Q8_0/Q8_1
//! activations, each weight block decoded once and dotted with up to R activation rows.
//!
//! Hand-written because candle's Q5_0 and Q4_1 dots are scalar, and its Q4_0/Q8_0 AVX loops convert
//! the f16 scales through `vpinsrw` into a live register, a false dependency that serialised the loop
//! (measured: 15 cycles a block, 5 GMAC/s a core). Q5_0 carries most of Qwen2.5-Coder-0.5B's weights
//! (rows of 896 are not a multiple of 256, so Q4_K_M falls back to Q5_0) and Q8_0 its LM head.
//! Two builds of each kernel: AVX2 (`vpmaddubsw` + `vpmaddwd`) and AVX512-VNNI (`vpdpbusd`), chosen
//! at run time. Same arithmetic as ggml's `ggml_vec_dot_*`; candle's scalar `vec_dot_unopt` is the
//! reference in the tests.

use std::sync::OnceLock;

/// One activation row: its quantized blocks (34 bytes for Q8_0, 36 for Q8_1), the blocks' scales as
/// f32, and (Q8_1) the blocks' d·Σq as f32.
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub struct ActRow {
    pub q: *const u8,
    pub d: *const f32,
    pub s: *const f32,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub enum Level {
    None,
    Avx2,
    Vnni,
}

/// The kernel level this CPU supports, chosen once at run time (the binary is built for the x86-64
/// baseline). `MENS_CPU=avx2` or `MENS_CPU=portable` asks for a lower level (A/B measurements, and the
/// test that the portable path gives the same output as a CPU without AVX2); `MENS_NO_VNNI` is the
/// older spelling of `MENS_CPU=avx2`.
pub fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let best = detect();
        let asked = match std::env::var("MENS_CPU").as_deref() {
            Ok("portable") => Level::None,
            Ok("avx2") => Level::Avx2,
            _ if std::env::var_os("MENS_NO_VNNI").is_some() => Level::Avx2,
            _ => Level::Vnni,
        };
        let rank = |l: Level| l as u8;
        if rank(asked) < rank(best) {
            asked
        } else {
            best
        }
    })
}

fn detect() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        let vnni = is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bw");
        match (avx2, vnni) {
            (true, true) => Level::Vnni,
            (true, false) => Level::Avx2,
            _ => Level::None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Level::None
    }
}

/// What the CPU kernels run on, for the load line.
pub fn describe() -> &'static str {
    match level() {
        #[cfg(target_arch = "x86_64")]
        Level::Vnni if super::amx::available() => {
            "AVX-512 VNNI kernels, AMX-INT8 tiles for prompts"
        }
        Level::Vnni => "AVX-512 VNNI kernels",
        Level::Avx2 => "AVX2 kernels",
        #[cfg(target_arch = "x86_64")]
        Level::None => "portable kernels: no AVX2/FMA/F16C, several times slower",
        #[cfg(not(target_arch = "x86_64"))]
        Level::None => "portable kernels",
    }
}

/// The weight block types with kernels here.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Q4_0,
    Q4_1,
    Q5_0,
    Q8_0,
}

/// Dot products of one weight row (`nb` blocks at `x`) with R activation rows.
///
/// # Safety
/// `level()` must not be `None`; `x` must hold `nb` blocks of `kind`, and each row of `ys` `nb`
/// activation blocks and scales.
#[inline]
pub unsafe fn dot<const R: usize>(
    level: Level,
    kind: Kind,
    nb: usize,
    x: *const u8,
    ys: &[ActRow; R],
) -> [f32; R] {
    #[cfg(target_arch = "x86_64")]
    {
        match (level, kind) {
            (Level::Vnni, Kind::Q4_0) => vnni::q4_0(nb, x, ys),
            (Level::Vnni, Kind::Q4_1) => vnni::q4_1(nb, x, ys),
            (Level::Vnni, Kind::Q5_0) => vnni::q5_0(nb, x, ys),
            (Level::Vnni, Kind::Q8_0) => vnni::q8_0(nb, x, ys),
            (_, Kind::Q4_0) => avx2::q4_0(nb, x, ys),
            (_, Kind::Q4_1) => avx2::q4_1(nb, x, ys),
            (_, Kind::Q5_0) => avx2::q5_0(nb, x, ys),
            (_, Kind::Q8_0) => avx2::q8_0(nb, x, ys),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (level, kind, nb, x, ys);
        unreachable!("the x86 kernels are only called when level() is not None")
    }
}

/// Dot products of N weight rows with one activation row (decode): N independent accumulator
/// chains, so short rows are not bound by one chain's latency. Each row's result has the bits of
/// the one-row kernel.
///
/// # Safety
/// As `dot`.
#[inline]
pub unsafe fn dot_rows<const N: usize>(
    level: Level,
    kind: Kind,
    nb: usize,
    xs: &[*const u8; N],
    y: &ActRow,
) -> [f32; N] {
    #[cfg(target_arch = "x86_64")]
    {
        match level {
            Level::Vnni => vnni::rows(kind, nb, xs, y),
            _ => avx2::rows(kind, nb, xs, y),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (level, kind, nb, xs, y);
        unreachable!("the x86 kernels are only called when level() is not None")
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod common {
    pub use std::arch::x86_64::*;

    /// 32 nibbles → 32 bytes: low nibbles in lanes 0..16, high nibbles in lanes 16..32.
    #[inline(always)]
    pub unsafe fn bytes_from_nibbles_32(p: *const u8) -> __m256i {
        let tmp = _mm_loadu_si128(p as *const __m128i);
        let bytes = _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp);
        _mm256_and_si256(_mm256_set1_epi8(0x0F), bytes)
    }

    /// 32 bits → 32 bytes of 0xFF (bit set) or 0x00.
    #[inline(always)]
    pub unsafe fn bytes_from_bits_32(x32: u32) -> __m256i {
        let shuf = _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32 as i32), shuf);
        let bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe_u64 as i64);
        _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit_mask), _mm256_set1_epi64x(-1))
    }

    /// f16 at `p` broadcast to 8 f32 lanes (vmovd + vcvtph2ps: no false dependency).
    #[inline(always)]
    pub unsafe fn f16_bcast(p: *const u8) -> __m256 {
        let bits = (p as *const u16).read_unaligned();
        _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }

    #[inline(always)]
    pub unsafe fn hsum(x: __m256) -> f32 {
        let mut res = _mm256_extractf128_ps(x, 1);
        res = _mm_add_ps(res, _mm256_castps256_ps128(x));
        res = _mm_add_ps(res, _mm_movehl_ps(res, res));
        res = _mm_add_ss(res, _mm_movehdup_ps(res));
        _mm_cvtss_f32(res)
    }

    // Weight block decoders: 32 signed (or, for Q4_1, unsigned) bytes.
    #[inline(always)]
    pub unsafe fn q8_0_block(xb: *const u8) -> __m256i {
        _mm256_loadu_si256(xb.add(2) as *const __m256i)
    }
    #[inline(always)]
    pub unsafe fn q4_0_block(xb: *const u8) -> __m256i {
        _mm256_sub_epi8(bytes_from_nibbles_32(xb.add(2)), _mm256_set1_epi8(8))
    }
    #[inline(always)]
    pub unsafe fn q5_0_block(xb: *const u8) -> __m256i {
        let qx = bytes_from_nibbles_32(xb.add(6));
        let qh = (xb.add(2) as *const u32).read_unaligned();
        let bxhi = _mm256_andnot_si256(bytes_from_bits_32(qh), _mm256_set1_epi8(0xF0u8 as i8));
        _mm256_or_si256(qx, bxhi)
    }
    #[inline(always)]
    pub unsafe fn q4_1_block(xb: *const u8) -> __m256i {
        bytes_from_nibbles_32(xb.add(4))
    }
}

/// Signed weight blocks against Q8_0 rows: Σ_blocks dx·dy·Σ(qx·qy). A macro, so that the ISA's dot
/// instruction expands inside the `target_feature` function that uses it.
#[cfg(target_arch = "x86_64")]
macro_rules! signed_body {
    ($dot:ident, $R:ident, $nb:ident, $x:ident, $ys:ident, $bytes:expr, $decode:path) => {{
        let mut acc = [_mm256_setzero_ps(); $R];
        for i in 0..$nb {
            let xb = $x.add(i * $bytes);
            let qx = $decode(xb);
            let dx = f16_bcast(xb);
            let ax = _mm256_sign_epi8(qx, qx);
            for r in 0..$R {
                let qy = _mm256_loadu_si256($ys[r].q.add(i * 34 + 2) as *const __m256i);
                let sy = _mm256_sign_epi8(qy, qx);
                let p = _mm256_cvtepi32_ps($dot!(ax, sy));
                let d = _mm256_mul_ps(dx, _mm256_broadcast_ss(&*$ys[r].d.add(i)));
                acc[r] = _mm256_fmadd_ps(d, p, acc[r]);
            }
        }
        let mut out = [0f32; $R];
        for r in 0..$R {
            out[r] = hsum(acc[r]);
        }
        out
    }};
}

/// How far ahead of the block being read a decode kernel asks for weight bytes. Decode reads each
/// weight once, and the hardware prefetcher alone left these kernels waiting on loads (perf: the
/// samples sit on the instruction after each weight load) at 11–13 GB/s of the ~29 GB/s two cores
/// read here; prefetching 3 KiB ahead (measured best of 0.6–6 KiB) gives 17–21 GB/s.
/// A prefetch never faults, so reading past the matrix's end is harmless.
pub const PREFETCH_AHEAD: usize = 3072;

/// Ask for the cache lines of the `bytes` of weights `PREFETCH_AHEAD` past `b` (SSE: every x86-64).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn prefetch(b: *const u8, bytes: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let ahead = b.wrapping_add(PREFETCH_AHEAD);
    let mut o = 0;
    while o < bytes {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(o) as *const i8);
        o += 64;
    }
}

/// N weight rows (`$xs`) against one Q8_0 row: the activation block is loaded once for all, and
/// the N accumulators are independent chains (decode, where there is one activation row).
#[cfg(target_arch = "x86_64")]
macro_rules! signed_body_rows {
    ($dot:ident, $n:expr, $nb:ident, $xs:ident, $y:ident, $bytes:expr, $decode:path) => {{
        let mut acc = [_mm256_setzero_ps(); $n];
        for i in 0..$nb {
            let qy = _mm256_loadu_si256($y.q.add(i * 34 + 2) as *const __m256i);
            let dy = _mm256_broadcast_ss(&*$y.d.add(i));
            for r in 0..$n {
                let xb = $xs[r].add(i * $bytes);
                super::prefetch(xb, 1);
                let qx = $decode(xb);
                let p =
                    _mm256_cvtepi32_ps($dot!(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx)));
                acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(f16_bcast(xb), dy), p, acc[r]);
            }
        }
        let mut out = [0f32; $n];
        for r in 0..$n {
            out[r] = hsum(acc[r]);
        }
        out
    }};
}

/// Generates one ISA's kernels; `$dot!(a_u8, b_i8)` sums groups of four u8·i8 products into i32 lanes.
#[cfg(target_arch = "x86_64")]
macro_rules! isa_kernels {
    ($feat:literal, $dot:ident, $q5_0_block:path) => {
        use super::common::*;
        use super::ActRow;

        #[target_feature(enable = $feat)]
        pub unsafe fn q8_0<const R: usize>(nb: usize, x: *const u8, ys: &[ActRow; R]) -> [f32; R] {
            signed_body!($dot, R, nb, x, ys, 34, q8_0_block)
        }
        #[target_feature(enable = $feat)]
        pub unsafe fn q4_0<const R: usize>(nb: usize, x: *const u8, ys: &[ActRow; R]) -> [f32; R] {
            signed_body!($dot, R, nb, x, ys, 18, q4_0_block)
        }
        #[target_feature(enable = $feat)]
        pub unsafe fn q5_0<const R: usize>(nb: usize, x: *const u8, ys: &[ActRow; R]) -> [f32; R] {
            signed_body!($dot, R, nb, x, ys, 22, $q5_0_block)
        }

        #[target_feature(enable = $feat)]
        pub unsafe fn rows<const N: usize>(
            kind: super::Kind,
            nb: usize,
            xs: &[*const u8; N],
            y: &ActRow,
        ) -> [f32; N] {
            match kind {
                super::Kind::Q5_0 => signed_body_rows!($dot, N, nb, xs, y, 22, $q5_0_block),
                super::Kind::Q8_0 => signed_body_rows!($dot, N, nb, xs, y, 34, q8_0_block),
                super::Kind::Q4_0 => signed_body_rows!($dot, N, nb, xs, y, 18, q4_0_block),
                super::Kind::Q4_1 => std::array::from_fn(|r| q4_1::<1>(nb, xs[r], &[*y])[0]),
            }
        }

        /// Q4_1 (unsigned nibbles, scale d and minimum m) against Q8_1 rows (scale d, s = d·Σq):
        /// Σ_blocks dx·dy·Σ(qx·qy) + mx·sy.
        #[target_feature(enable = $feat)]
        pub unsafe fn q4_1<const R: usize>(nb: usize, x: *const u8, ys: &[ActRow; R]) -> [f32; R] {
            let mut acc = [_mm256_setzero_ps(); R];
            let mut mins = [0f32; R];
            for i in 0..nb {
                let xb = x.add(i * 20);
                let qx = q4_1_block(xb);
                let dx = f16_bcast(xb);
                let mx = _mm_cvtss_f32(_mm256_castps256_ps128(f16_bcast(xb.add(2))));
                for r in 0..R {
                    let qy = _mm256_loadu_si256(ys[r].q.add(i * 36 + 4) as *const __m256i);
                    let p = _mm256_cvtepi32_ps($dot!(qx, qy));
                    let d = _mm256_mul_ps(dx, _mm256_broadcast_ss(&*ys[r].d.add(i)));
                    acc[r] = _mm256_fmadd_ps(d, p, acc[r]);
                    mins[r] += mx * *ys[r].s.add(i);
                }
            }
            let mut out = [0f32; R];
            for r in 0..R {
                out[r] = hsum(acc[r]) + mins[r];
            }
            out
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    macro_rules! dot_u8i8 {
        ($a:expr, $b:expr) => {
            _mm256_madd_epi16(_mm256_set1_epi16(1), _mm256_maddubs_epi16($a, $b))
        };
    }
    isa_kernels!("avx2,fma,f16c", dot_u8i8, q5_0_block);
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    macro_rules! dot_u8i8 {
        ($a:expr, $b:expr) => {
            _mm256_dpbusd_epi32(_mm256_setzero_si256(), $a, $b)
        };
    }
    /// Q5_0 block decoded with AVX-512BW masks: the 32 high bits, as a mask register, pick the
    /// bytes whose value is nibble − 16 (one masked subtract instead of a shuffle, an OR, a
    /// compare and an AND-NOT). The same bytes as `common::q5_0_block`, so every result keeps
    /// its bits.
    #[inline(always)]
    unsafe fn q5_0_block_bw(xb: *const u8) -> __m256i {
        let qx = bytes_from_nibbles_32(xb.add(6));
        let qh = (xb.add(2) as *const u32).read_unaligned();
        _mm256_mask_sub_epi8(qx, !qh, qx, _mm256_set1_epi8(16))
    }
    isa_kernels!(
        "avx2,fma,f16c,avx512vnni,avx512vl,avx512bw",
        dot_u8i8,
        q5_0_block_bw
    );
}
