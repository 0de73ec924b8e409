//! Prompt passes on Intel AMX-INT8 tiles: one `tdpbssd` multiplies 16 activation rows × 64 values
//! with 64 values × 16 weight rows, 16,384 products, where an AVX-512 VNNI instruction does 64.
//!
//! The weights stay in `k8`'s and `x8`'s layouts (no second copy: issue 19's memory bound). Each
//! block of a tile of 16 weight rows is unpacked once into int8 tiles in a per-thread scratch and
//! run against every 16-token tile of the pass. The scales multiply the values before the tile
//! product where they are integers, so a block's integer sum comes out of the tiles whole and
//! exact:
//! - Q4_K: a 6-bit scale `sc = 8a + b` (a, b in 0..8) makes two tiles, `a·q` and `b·q` (at most
//!   7 · 15 = 105, an int8), and `8·C₁ + C₂ = Σ sc·q·y`; the mins term comes from the activation's
//!   sums, as in `k8::dot`.
//! - Q6_K: `sc = 16a + b`, `q = 8c + e` make four tiles (`a·c`, `a·e`, `b·c`, `b·e`), and
//!   `sc·q = 128ac + 16ae + 8bc + be`.
//! - Q5_0 and Q8_0: one tile product a 32-value block (its scale is a float).
//!
//! These are the integers the decode kernels compute, and the floats after them go through the
//! same operations in the same order: a token's numbers are bit for bit those of the decode
//! kernels, whatever its batch (tested), so cached = uncached and speculation's verify pass =
//! plain decoding still hold.
//!
//! Hand-written: no Rust crate drives AMX, and Rust's AMX intrinsics are unstable, so the tile
//! instructions are inline assembly. Linux only: the tile data state must be requested from the
//! kernel (`arch_prctl(ARCH_REQ_XCOMP_PERM)`) before the first tile instruction.

/// True when this CPU and OS run AMX-INT8 (and AVX-512BW and VBMI, for unpacking) and
/// `MENS_NO_AMX` is unset. The first call asks the kernel for the tile state, once for the whole
/// process.
pub fn available() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("MENS_NO_AMX").is_none() && detect())
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect() -> bool {
    use std::arch::x86_64::__cpuid_count;
    #[allow(unused_unsafe)]
    // SAFETY: cpuid exists on every x86-64 CPU.
    let (max, l7) = unsafe { (__cpuid_count(0, 0).eax, __cpuid_count(7, 0)) };
    let (tile, int8) = (l7.edx >> 24 & 1 == 1, l7.edx >> 25 & 1 == 1);
    let vbmi = is_x86_feature_detected!("avx512vbmi");
    if max < 7 || !tile || !int8 || !vbmi || super::simd::level() != super::simd::Level::Vnni {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a plain system call with integer arguments.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect() -> bool {
    false
}

/// How many of `t` tokens go through the tiles: none below [`FROM`]; else whole tiles of 16, and a
/// last part tile of 12 or more. A pass unpacks every weight block once, which costs about what
/// the AVX-512 VNNI group kernels spend on 24 tokens: on this VM, 2 threads, a verify pass took
/// 1.5B 124 / 159 / 233 / 307 ms at 12 / 16 / 24 / 32 tokens without the tiles against
/// 172 / 202 / 286 / 274 with them (0.5B: 55 / 69 / 102 / 131 against 61 / 71 / 109 / 112).
pub fn tokens(t: usize) -> usize {
    if t < FROM {
        0
    } else if t % 16 >= 12 {
        t
    } else {
        t / 16 * 16
    }
}

/// Tokens of a pass from which the tiles run.
pub const FROM: usize = 32;

/// The weight formats on the tiles, each in its repacked layout (`k8`, `x8`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Format {
    Q4K,
    Q6K,
    Q5_0,
    Q8_0,
}

impl Format {
    fn kquant(self) -> bool {
        matches!(self, Format::Q4K | Format::Q6K)
    }

    /// Blocks of the file's format in one unpacked block: the K-quants one (256 values), the
    /// 32-value formats four, so that their four sums leave the tiles together.
    fn per_unpacked(self) -> usize {
        if self.kquant() {
            1
        } else {
            4
        }
    }
}

/// The 64-byte tile configuration (palette 1): activation tiles (m × 64 bytes), weight tiles
/// (16 × 64), and tiles 4–7 the sums (m × 16 int32).
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl Config {
    fn new(m: usize, f: Format) -> Config {
        let mut c = Config {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for t in 0..8 {
            c.colsb[t] = 64;
            c.rows[t] = m as u8;
        }
        match f {
            // Tile 0 the activations, 1–3 the weights.
            Format::Q6K => c.rows[1..4].fill(16),
            // Tiles 0–1 two activation tiles, 2–3 the weights.
            Format::Q4K => c.rows[2..4].fill(16),
            // Tile 0 the activations of one 32-value block, tile 1 its weights.
            Format::Q5_0 | Format::Q8_0 => {
                c.colsb[0] = 32;
                c.rows[1] = 8;
            }
        }
        c
    }
}

/// The tiles configured for `m` activation rows on this thread, until dropped (`tilerelease`).
/// Loading a configuration is slow (a fifth of a kernel call when each call loaded one), so a
/// caller loads one for all the calls of the same height.
pub struct Tiles {
    m: usize,
}

impl Tiles {
    /// # Safety
    /// AMX available (see [`available`]); one `Tiles` a thread at a time.
    pub unsafe fn new(m: usize, f: Format) -> Tiles {
        assert!((1..=16).contains(&m));
        let cfg = Config::new(m, f);
        // SAFETY: the tile state was granted (`available`); the configuration is valid.
        unsafe {
            std::arch::asm!("ldtilecfg [{}]", in(reg) &cfg as *const Config, options(nostack, readonly))
        };
        Tiles { m }
    }

    pub fn rows(&self) -> usize {
        self.m
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: tiles were configured by `new`.
        unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) };
    }
}

use super::Line;

/// Bytes of one unpacked Q4_K block of 16 rows: four steps of 64 values, each two 1 KiB tiles
/// (a·q, b·q), then the mins as four registers of 16 rows × two sub-blocks (i16).
const Q4K_BLOCK: usize = 4 * 2 * 1024 + 4 * 64;
const Q4K_MINS16: usize = 4 * 2 * 1024;
/// Bytes of one unpacked Q6_K block of 16 rows: four steps of 64 values, each four 1 KiB tiles.
const Q6K_BLOCK: usize = 4 * 4 * 1024;
/// Bytes of one slot of [`Unpacked`]: the largest unpacked block.
const SLOT: usize = Q6K_BLOCK;
const _: () = assert!(Q4K_BLOCK <= SLOT && 4 * 512 <= SLOT); // Q4_K; four Q5_0/Q8_0 blocks

/// The same 32 bytes of two groups of 8 rows (at `p0`, `p1`): 64 bytes, rows 0–7 then 8–15.
///
/// # Safety
/// AVX-512F; 32 bytes readable at each.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn two_groups(p0: *const u8, p1: *const u8) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_loadu_si256(p0 as *const __m256i)),
        _mm256_loadu_si256(p1 as *const __m256i),
    )
}

/// The eight f16 scales of two groups of 8 rows (at `p0`, `p1`) as 16 f32.
///
/// # Safety
/// AVX-512F and F16C; 16 bytes readable at each.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn two_groups_f16(p0: *const u8, p1: *const u8) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let half = |p: *const u8| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
    _mm512_insertf32x8::<1>(_mm512_castps256_ps512(half(p0)), half(p1))
}

/// One block (256 values; four blocks of the 32-value formats) of several tiles of 16 weight rows,
/// unpacked for the tiles: slot k holds row tile k's int8 tiles, its 16 d (64: 16 a 32-value
/// block) and (Q4_K) its 16 −dmin as f32.
pub struct Unpacked {
    tiles: Vec<Line>,
    d: Vec<f32>,
    neg_dmin: Vec<f32>,
    /// The running sums, row tile by row tile, 16 per token: contiguous, where the output's rows
    /// are a page or more apart.
    sums: Vec<Line>,
    /// The current block's activation values, tile by tile ([`pack`]).
    acts: Vec<Line>,
}

impl Unpacked {
    pub const fn new() -> Unpacked {
        Unpacked {
            tiles: Vec::new(),
            d: Vec::new(),
            neg_dmin: Vec::new(),
            sums: Vec::new(),
            acts: Vec::new(),
        }
    }

    /// Room for `slots` row tiles.
    fn reserve(&mut self, slots: usize) {
        let lines = slots * SLOT / 64;
        if self.tiles.len() < lines {
            self.tiles.resize(lines, Line([0; 64]));
            self.d.resize(slots * 64, 0.0);
            self.neg_dmin.resize(slots * 16, 0.0);
        }
    }
}

impl Default for Unpacked {
    fn default() -> Self {
        Self::new()
    }
}

/// Unpack one block of the 16 rows of two `k8` Q4_K groups (`b0`, `b1`: their group blocks) into
/// slot `k` of `u`.
///
/// # Safety
/// AVX-512BW, AVX-512VBMI and F16C; `b0` and `b1` point at group blocks; `u` has room for slot
/// `k`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,f16c")]
unsafe fn unpack_q4k(b0: *const u8, b1: *const u8, u: &mut Unpacked, k: usize) {
    use super::k8::{D, DMIN, MINS, SCALES, VALUES};
    use std::arch::x86_64::*;
    debug_assert!(u.d.len() >= 64 * (k + 1));
    let low = _mm512_set1_epi8(15);
    let even = _mm512_set1_epi16(0x00FF);
    let odd = _mm512_set1_epi16(-256);
    // Each byte of x times the same byte of y, both below 128 and their product below 256.
    let mul = |x: __m512i, y: __m512i| {
        let e = _mm512_maddubs_epi16(x, _mm512_and_si512(y, even));
        let o = _mm512_maddubs_epi16(x, _mm512_and_si512(y, odd));
        _mm512_or_si512(e, _mm512_slli_epi16(o, 8))
    };
    // Byte 4n + e of the result = byte n of the 16 (8 from each group) at `p0`, `p1`.
    let spread = |p0: *const u8, p1: *const u8| {
        let s = _mm_unpacklo_epi64(
            _mm_loadl_epi64(p0 as *const __m128i),
            _mm_loadl_epi64(p1 as *const __m128i),
        );
        _mm512_permutexvar_epi8(
            _mm512_set_epi32(
                0x0F0F0F0F, 0x0E0E0E0E, 0x0D0D0D0D, 0x0C0C0C0C, 0x0B0B0B0B, 0x0A0A0A0A, 0x09090909,
                0x08080808, 0x07070707, 0x06060606, 0x05050505, 0x04040404, 0x03030303, 0x02020202,
                0x01010101, 0x00000000,
            ),
            _mm512_castsi128_si512(s),
        )
    };
    let block = (u.tiles.as_mut_ptr() as *mut u8).add(k * SLOT);
    let d = two_groups_f16(b0.add(D), b1.add(D));
    let dmin = two_groups_f16(b0.add(DMIN), b1.add(DMIN));
    _mm512_storeu_ps(u.d.as_mut_ptr().add(64 * k), d);
    // −dmin, as `k8::dot` negates it.
    _mm512_storeu_ps(
        u.neg_dmin.as_mut_ptr().add(16 * k),
        _mm512_xor_ps(dmin, _mm512_set1_ps(-0.0)),
    );
    for j in 0..8 {
        let sc = spread(b0.add(SCALES + 8 * j), b1.add(SCALES + 8 * j));
        let a = _mm512_and_si512(_mm512_srli_epi16(sc, 3), _mm512_set1_epi8(7));
        let b = _mm512_and_si512(sc, _mm512_set1_epi8(7));
        // Sub-block j is values 32j..32j + 32: step j / 2, tile rows 8(j % 2)..8(j % 2) + 8.
        let step = block.add((j / 2) * 2 * 1024);
        for k in 0..4 {
            let n = two_groups(
                b0.add(VALUES + 128 * j + 32 * k),
                b1.add(VALUES + 128 * j + 32 * k),
            );
            let lo = _mm512_and_si512(n, low);
            let hi = _mm512_and_si512(_mm512_srli_epi16(n, 4), low);
            // Values 32j + 4k + e (low nibbles) and 32j + 16 + 4k + e (high): tile rows
            // 8(j % 2) + k and 8(j % 2) + 4 + k.
            for (q, row) in [(lo, 8 * (j % 2) + k), (hi, 8 * (j % 2) + 4 + k)] {
                let at = step.add(64 * row);
                _mm512_storeu_si512(at as *mut __m512i, mul(q, a));
                _mm512_storeu_si512(at.add(1024) as *mut __m512i, mul(q, b));
            }
        }
    }
    // The mins, as `k8::dot` reads them: register p holds (m[r][2p], m[r][2p + 1]), r = 0..15.
    for p in 0..4 {
        let m = _mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(b0.add(MINS + 16 * p) as *const __m128i)),
            _mm_loadu_si128(b1.add(MINS + 16 * p) as *const __m128i),
        );
        _mm512_storeu_si512(
            block.add(Q4K_MINS16 + 64 * p) as *mut __m512i,
            _mm512_cvtepu8_epi16(m),
        );
    }
}

/// Unpack one block of the 16 rows of two `k8` Q6_K groups into slot `k` of `u`. A value q
/// (−32..31) times its scale sc (−128..127) does not fit a byte, so both are split: sc = 16a + b
/// (a in −8..7, b in 0..15), q = 8c + e (c in −4..3, e in 0..7), and the four tiles hold a·c,
/// a·e, b·c and b·e (each within −60..105); then sc·q = 128·ac + 16·ae + 8·bc + be.
///
/// # Safety
/// As [`unpack_q4k`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,f16c")]
unsafe fn unpack_q6k(b0: *const u8, b1: *const u8, u: &mut Unpacked, k: usize) {
    use super::k8::{Q6_HIGH, Q6_LOW, Q6_SCALES};
    use std::arch::x86_64::*;
    debug_assert!(u.d.len() >= 64 * (k + 1));
    let low = _mm512_set1_epi8(15);
    let three = _mm512_set1_epi8(3);
    let seven = _mm512_set1_epi8(7);
    // Bytes times bytes, both signed, products within a byte: through 16-bit lanes.
    let mul = |x: __m512i, y: __m512i| {
        let half = |x: __m256i, y: __m256i| {
            _mm512_cvtepi16_epi8(_mm512_mullo_epi16(
                _mm512_cvtepi8_epi16(x),
                _mm512_cvtepi8_epi16(y),
            ))
        };
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(half(_mm512_castsi512_si256(x), _mm512_castsi512_si256(y))),
            half(
                _mm512_extracti64x4_epi64::<1>(x),
                _mm512_extracti64x4_epi64::<1>(y),
            ),
        )
    };
    let block = (u.tiles.as_mut_ptr() as *mut u8).add(k * SLOT);
    _mm512_storeu_ps(u.d.as_mut_ptr().add(64 * k), two_groups_f16(b0, b1));
    for sb in 0..16 {
        // Sub-block sb's scale of row r at SCALES + 16(sb / 2) + 2r + sb % 2, as bytes 4n..4n + 4.
        let (mut a, mut b) = ([0i8; 64], [0i8; 64]);
        for n in 0..16 {
            let g = if n < 8 { b0 } else { b1 };
            let sc = *g.add(Q6_SCALES + 16 * (sb / 2) + 2 * (n % 8) + sb % 2) as i8;
            a[4 * n..4 * n + 4].fill(sc >> 4);
            b[4 * n..4 * n + 4].fill(sc & 15);
        }
        let (a, b) = (
            _mm512_loadu_si512(a.as_ptr() as *const __m512i),
            _mm512_loadu_si512(b.as_ptr() as *const __m512i),
        );
        let n0 = two_groups(b0.add(Q6_LOW + 64 * sb), b1.add(Q6_LOW + 64 * sb));
        let n1 = two_groups(b0.add(Q6_LOW + 64 * sb + 32), b1.add(Q6_LOW + 64 * sb + 32));
        let hb = two_groups(b0.add(Q6_HIGH + 32 * sb), b1.add(Q6_HIGH + 32 * sb));
        // Sub-block sb is values 16sb..16sb + 16: step sb / 4, tile rows 4(sb % 4)..+4.
        let step = block.add((sb / 4) * 4 * 1024);
        for k in 0..4 {
            let nib = match k {
                0 => n0,
                1 => n1,
                2 => _mm512_srli_epi16(n0, 4),
                _ => _mm512_srli_epi16(n1, 4),
            };
            let shifted = match k {
                0 => hb,
                1 => _mm512_srli_epi16(hb, 2),
                2 => _mm512_srli_epi16(hb, 4),
                _ => _mm512_srli_epi16(hb, 6),
            };
            let top = _mm512_and_si512(shifted, three);
            // u = q + 32 (0..63); c = (u >> 3) − 4, e = u & 7.
            let uq = _mm512_or_si512(_mm512_and_si512(nib, low), _mm512_slli_epi16(top, 4));
            let c = _mm512_sub_epi8(
                _mm512_and_si512(_mm512_srli_epi16(uq, 3), seven),
                _mm512_set1_epi8(4),
            );
            let e = _mm512_and_si512(uq, seven);
            let at = step.add(64 * (4 * (sb % 4) + k));
            _mm512_storeu_si512(at as *mut __m512i, mul(a, c));
            _mm512_storeu_si512(at.add(1024) as *mut __m512i, mul(a, e));
            _mm512_storeu_si512(at.add(2048) as *mut __m512i, mul(b, c));
            _mm512_storeu_si512(at.add(3072) as *mut __m512i, mul(b, e));
        }
    }
}

/// One block of row tile `k` of `u` against `n` tiles of `tiles.rows()` Q8_K activation rows
/// each, `act` pointing at the block in the first row (rows `arb` bytes apart: the scales and
/// sums) and `packed` at its values in tile order ([`pack`]): token t's 16 sums carried from
/// `from + 16t` (from +0 when null) to `out + t * stride`. Each (row, token) pair's arithmetic is
/// `k8::dot`'s (`k8::dot_q6k`'s with `Q6`).
///
/// # Safety
/// AVX-512F and tiles configured; `act` and `packed` hold `n · tiles.rows()` rows; `out` has
/// room.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
#[allow(clippy::too_many_arguments)]
unsafe fn dot<const Q6: bool>(
    tiles: &Tiles,
    u: &Unpacked,
    k: usize,
    from: *const f32,
    act: *const u8,
    arb: usize,
    packed: *const u8,
    n: usize,
    out: *mut f32,
    stride: usize,
) {
    use std::arch::asm;
    use std::arch::x86_64::*;
    let m = tiles.rows();
    debug_assert!(u.d.len() >= 64 * (k + 1));
    let mut c = [Line([0; 64]); 64];
    let cp = c.as_ptr() as *const __m512i;
    let tp = (u.tiles.as_ptr() as *const u8).add(k * SLOT);
    let d = _mm512_loadu_ps(u.d.as_ptr().add(64 * k));
    let neg_dmin = _mm512_loadu_ps(u.neg_dmin.as_ptr().add(16 * k));
    let store = |c: &mut [Line; 64]| {
        asm!(
            "tilestored [{c} + {s}*1], tmm4",
            "tilestored [{c} + {s}*1 + 1024], tmm5",
            "tilestored [{c} + {s}*1 + 2048], tmm6",
            "tilestored [{c} + {s}*1 + 3072], tmm7",
            c = in(reg) c.as_mut_ptr(),
            s = in(reg) 64usize,
            options(nostack)
        )
    };
    // Token tok's activation scale, and its sums so far (the first block from +0, as the decode
    // kernels' sums start).
    let start = |tok: usize| {
        let dy = _mm512_set1_ps((act.add(tok * arb) as *const f32).read_unaligned());
        let acc = if from.is_null() {
            _mm512_setzero_ps()
        } else {
            _mm512_loadu_ps(from.add(16 * tok))
        };
        (dy, acc)
    };
    if Q6 {
        for tt in 0..n {
            let a = packed.add(tt * KQ_TILE_BYTES);
            asm!(
                "tilezero tmm4",
                "tilezero tmm5",
                "tilezero tmm6",
                "tilezero tmm7",
                options(nostack, nomem)
            );
            for s in 0..4 {
                asm!(
                    "tileloadd tmm0, [{a} + {sa}*1]",
                    "tileloadd tmm1, [{b} + {sb}*1]",
                    "tileloadd tmm2, [{b} + {sb}*1 + 1024]",
                    "tdpbssd tmm4, tmm0, tmm1",
                    "tdpbssd tmm5, tmm0, tmm2",
                    "tileloadd tmm3, [{b} + {sb}*1 + 2048]",
                    "tileloadd tmm1, [{b} + {sb}*1 + 3072]",
                    "tdpbssd tmm6, tmm0, tmm3",
                    "tdpbssd tmm7, tmm0, tmm1",
                    a = in(reg) a.add(s * 1024),
                    sa = in(reg) 64usize,
                    b = in(reg) tp.add(s * 4 * 1024),
                    sb = in(reg) 64usize,
                    options(nostack, readonly)
                );
            }
            store(&mut c);
            for t in 0..m {
                let tok = tt * m + t;
                let at = |k: usize| _mm512_loadu_si512(cp.add(16 * k + t));
                let sum = _mm512_add_epi32(
                    _mm512_add_epi32(_mm512_slli_epi32(at(0), 7), _mm512_slli_epi32(at(1), 4)),
                    _mm512_add_epi32(_mm512_slli_epi32(at(2), 3), at(3)),
                );
                let (dy, mut acc) = start(tok);
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, dy), acc);
                _mm512_storeu_ps(out.add(tok * stride), acc);
            }
        }
        return;
    }
    // Q4_K: one token tile at a time into one of two pairs of sum tiles, alternating, so that the
    // float work on tile tt - 1's sums (AVX-512) runs while the tile unit multiplies tile tt: the
    // sums of tt - 1 are stored before tt's products are issued, then worked on after.
    let mins: [__m512i; 4] =
        std::array::from_fn(|p| _mm512_loadu_si512(tp.add(Q4K_MINS16 + 64 * p) as *const __m512i));
    let finish = |tt: usize| {
        for t in 0..m {
            let tok = tt * m + t;
            let at = |k: usize| _mm512_loadu_si512(cp.add(16 * k + t));
            let sum = _mm512_add_epi32(_mm512_slli_epi32(at(0), 3), at(1));
            // The mins term from the activation's sums of 32, as `k8::dot` computes it.
            let bs = _mm256_loadu_si256(act.add(tok * arb + 260) as *const __m256i);
            let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            let pair = |p: __m128i| _mm512_broadcastd_epi32(p);
            let mut ms = _mm512_madd_epi16(mins[0], pair(q8s));
            ms = _mm512_add_epi32(
                ms,
                _mm512_madd_epi16(mins[1], pair(_mm_shuffle_epi32(q8s, 0x55))),
            );
            ms = _mm512_add_epi32(
                ms,
                _mm512_madd_epi16(mins[2], pair(_mm_shuffle_epi32(q8s, 0xAA))),
            );
            ms = _mm512_add_epi32(
                ms,
                _mm512_madd_epi16(mins[3], pair(_mm_shuffle_epi32(q8s, 0xFF))),
            );
            let (dy, mut acc) = start(tok);
            // The mins term first, as `k8::dot` (and ggml) add it.
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ms), _mm512_mul_ps(neg_dmin, dy), acc);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, dy), acc);
            _mm512_storeu_ps(out.add(tok * stride), acc);
        }
    };
    let cm = c.as_mut_ptr();
    // The two sum tiles $s0, $s1 into the scratch.
    macro_rules! store2 {
        ($s0:literal, $s1:literal) => {
            asm!(
                concat!("tilestored [{c} + {s}*1], ", $s0),
                concat!("tilestored [{c} + {s}*1 + 1024], ", $s1),
                c = in(reg) cm,
                s = in(reg) 64usize,
                options(nostack)
            )
        };
    }
    // Token tile `a`'s products into the sum tiles $s0, $s1.
    macro_rules! products {
        ($a:expr, $s0:literal, $s1:literal) => {
            asm!(concat!("tilezero ", $s0), concat!("tilezero ", $s1), options(nostack, nomem));
            for s in 0..4 {
                asm!(
                    "tileloadd tmm0, [{a} + {sa}*1]",
                    "tileloadd tmm2, [{b} + {sb}*1]",
                    "tileloadd tmm3, [{b} + {sb}*1 + 1024]",
                    concat!("tdpbssd ", $s0, ", tmm0, tmm2"),
                    concat!("tdpbssd ", $s1, ", tmm0, tmm3"),
                    a = in(reg) $a.add(s * 1024),
                    sa = in(reg) 64usize,
                    b = in(reg) tp.add(s * 2 * 1024),
                    sb = in(reg) 64usize,
                    options(nostack, readonly)
                );
            }
        };
    }
    for tt in 0..n {
        let a = packed.add(tt * KQ_TILE_BYTES);
        if tt % 2 == 0 {
            if tt > 0 {
                store2!("tmm6", "tmm7");
            }
            products!(a, "tmm4", "tmm5");
        } else {
            store2!("tmm4", "tmm5");
            products!(a, "tmm6", "tmm7");
        }
        if tt > 0 {
            finish(tt - 1);
        }
    }
    if (n - 1).is_multiple_of(2) {
        store2!("tmm4", "tmm5");
    } else {
        store2!("tmm6", "tmm7");
    }
    finish(n - 1);
}

/// Unpack four 32-value blocks of the 16 rows of two `x8` groups (`b0`, `b1`: their first group
/// blocks) into slot `k` of `u`: for block b, an 8 × 64-byte tile at 512b (value 4j + e of row n
/// at row j, byte 4n + e, the signed value q), and its 16 scales at `d[64k + 16b..]`.
///
/// # Safety
/// AVX-512BW and F16C; `b0` and `b1` point at four group blocks; `u` has room for slot `k`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,f16c")]
unsafe fn unpack_x8<const Q8: bool>(b0: *const u8, b1: *const u8, u: &mut Unpacked, k: usize) {
    use std::arch::x86_64::*;
    debug_assert!(u.d.len() >= 64 * (k + 1));
    let gb = if Q8 { 272 } else { 176 };
    let slot = (u.tiles.as_mut_ptr() as *mut u8).add(k * SLOT);
    for b in 0..4 {
        let (g0, g1) = (b0.add(b * gb), b1.add(b * gb));
        _mm512_storeu_ps(
            u.d.as_mut_ptr().add(64 * k + 16 * b),
            two_groups_f16(g0, g1),
        );
        let tile = slot.add(512 * b);
        for j in 0..8 {
            let q = if Q8 {
                // Stored q + 128.
                _mm512_xor_si512(
                    two_groups(g0.add(16 + 32 * j), g1.add(16 + 32 * j)),
                    _mm512_set1_epi8(-128),
                )
            } else {
                // Stored q + 16: a nibble (low for even j) and a fifth bit from mask j.
                let n = two_groups(g0.add(48 + 32 * (j / 2)), g1.add(48 + 32 * (j / 2)));
                let n = if j % 2 == 0 {
                    n
                } else {
                    _mm512_srli_epi16(n, 4)
                };
                let lo = _mm512_and_si512(n, _mm512_set1_epi8(15));
                let mask = (g0.add(16 + 4 * j) as *const u32).read_unaligned() as u64
                    | ((g1.add(16 + 4 * j) as *const u32).read_unaligned() as u64) << 32;
                let sixteen = _mm512_set1_epi8(16);
                _mm512_sub_epi8(_mm512_mask_add_epi8(lo, mask, lo, sixteen), sixteen)
            };
            _mm512_storeu_si512(tile.add(64 * j) as *mut __m512i, q);
        }
    }
}

/// Four 32-value blocks of row tile `k` of `u` (unpacked by [`unpack_x8`]) against `n` tiles of
/// `tiles.rows()` Q8_0 activation rows, `act` pointing at the first block in the first row, `dy`
/// at its f32 scale (a row's scales `nb` apart): the sums carried as in [`dot`]. Each (row,
/// token) pair's arithmetic is `x8::dot`'s: per block, the exact integer sum times dx·dy.
///
/// # Safety
/// As [`dot`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_x8(
    tiles: &Tiles,
    u: &Unpacked,
    k: usize,
    from: *const f32,
    packed: *const u8,
    dy: *const f32,
    nb: usize,
    n: usize,
    out: *mut f32,
    stride: usize,
) {
    use std::arch::asm;
    use std::arch::x86_64::*;
    let m = tiles.rows();
    let mut c = [Line([0; 64]); 64];
    let cp = c.as_ptr() as *const __m512i;
    let tp = (u.tiles.as_ptr() as *const u8).add(k * SLOT);
    let dx: [__m512; 4] =
        std::array::from_fn(|b| _mm512_loadu_ps(u.d.as_ptr().add(64 * k + 16 * b)));
    for tt in 0..n {
        let a = packed.add(tt * X8_TILE_BYTES);
        asm!(
            "tilezero tmm4",
            "tilezero tmm5",
            "tilezero tmm6",
            "tilezero tmm7",
            "tileloadd tmm0, [{a} + {sa}*1]",
            "tileloadd tmm1, [{b} + {sb}*1]",
            "tdpbssd tmm4, tmm0, tmm1",
            "tileloadd tmm0, [{a1} + {sa}*1]",
            "tileloadd tmm1, [{b} + {sb}*1 + 512]",
            "tdpbssd tmm5, tmm0, tmm1",
            "tileloadd tmm0, [{a2} + {sa}*1]",
            "tileloadd tmm1, [{b} + {sb}*1 + 1024]",
            "tdpbssd tmm6, tmm0, tmm1",
            "tileloadd tmm0, [{a3} + {sa}*1]",
            "tileloadd tmm1, [{b} + {sb}*1 + 1536]",
            "tdpbssd tmm7, tmm0, tmm1",
            "tilestored [{c} + {sb}*1], tmm4",
            "tilestored [{c} + {sb}*1 + 1024], tmm5",
            "tilestored [{c} + {sb}*1 + 2048], tmm6",
            "tilestored [{c} + {sb}*1 + 3072], tmm7",
            a = in(reg) a,
            a1 = in(reg) a.add(512),
            a2 = in(reg) a.add(1024),
            a3 = in(reg) a.add(1536),
            sa = in(reg) 32usize,
            b = in(reg) tp,
            sb = in(reg) 64usize,
            c = in(reg) c.as_mut_ptr(),
            options(nostack)
        );
        for t in 0..m {
            let tok = tt * m + t;
            let mut acc = if from.is_null() {
                _mm512_setzero_ps()
            } else {
                _mm512_loadu_ps(from.add(16 * tok))
            };
            for (b, dx) in dx.iter().enumerate() {
                let sum = _mm512_loadu_si512(cp.add(16 * b + t));
                let scale = _mm512_mul_ps(*dx, _mm512_set1_ps(*dy.add(tok * nb + b)));
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc);
            }
            _mm512_storeu_ps(out.add(tok * stride), acc);
        }
    }
}

/// Bytes of a K-quant block's 16-token activation tile group in the packed layout: four parts
/// of 64 values, each 16 rows of 64 bytes.
pub const KQ_TILE_BYTES: usize = 4096;
/// The same for four blocks of the 32-value formats: four parts of 16 rows of 32 bytes.
const X8_TILE_BYTES: usize = 2048;
/// Where the four parts of an activation tile start in a row's block: a Q8_K block's 64-value
/// quarters (after its f32 scale), and four Q8_0 blocks' 32 values (after each f16 scale).
const KQ_PARTS: [usize; 4] = [4, 68, 132, 196];
const X8_PARTS: [usize; 4] = [2, 36, 70, 104];

/// The activation values of one unpacked block of `count` rows (`act`, `arb` bytes apart) into
/// `dst`, in the order the tiles load them ([`pack_row`]'s layout): an activation tile is then
/// whole, aligned lines, where the rows themselves load it from as many pairs of lines, two to
/// three times slower out of L2 (measured, `amx_raw`).
///
/// # Safety
/// AVX-512F; `count` rows readable at `act`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pack(
    act: *const u8,
    arb: usize,
    count: usize,
    offs: [usize; 4],
    w: usize,
    dst: &mut Vec<Line>,
) {
    // A tile group is four parts of 16 rows of w bytes: w lines.
    let lines = count.div_ceil(16) * w;
    if dst.len() < lines {
        dst.resize(lines, Line([0; 64]));
    }
    let d = dst.as_mut_ptr() as *mut u8;
    for tok in 0..count {
        let to = d.add(tok / 16 * 64 * w + tok % 16 * w);
        pack_parts(act.add(tok * arb), offs, w, to);
    }
}

/// One row's four `w`-byte parts (at `offs` in the row) to `to`, part p at `to + 16 · w · p`.
///
/// # Safety
/// AVX-512F; the parts readable, their places writable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn pack_parts(row: *const u8, offs: [usize; 4], w: usize, to: *mut u8) {
    use std::arch::x86_64::*;
    for (p, off) in offs.iter().enumerate() {
        let (from, to) = (row.add(*off), to.add(16 * w * p));
        if w == 64 {
            _mm512_storeu_si512(
                to as *mut __m512i,
                _mm512_loadu_si512(from as *const __m512i),
            );
        } else {
            _mm256_storeu_si256(
                to as *mut __m256i,
                _mm256_loadu_si256(from as *const __m256i),
            );
        }
    }
}

/// Token `tok`'s Q8_K row (`row`, `nb` blocks) into a packed copy `dst` of a matrix of at most
/// `tiles` × 16 rows: block i's values of token tile tt at `(i · tiles + tt) · KQ_TILE_BYTES`,
/// laid out as [`pack`] lays a tile out. Written once when the activations are quantized, it
/// serves every row tile and thread of every matrix that reads them.
///
/// # Safety
/// AVX-512F; `row` holds `nb` blocks; `dst` has room for `nb · tiles` tile groups.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub unsafe fn pack_row(row: *const u8, nb: usize, tok: usize, tiles: usize, dst: *mut u8) {
    for i in 0..nb {
        let to = dst.add((i * tiles + tok / 16) * KQ_TILE_BYTES + tok % 16 * 64);
        pack_parts(row.add(i * 292), KQ_PARTS, 64, to);
    }
}

/// Rows `r0..r1` (whole tiles of 16) of a matrix in its repacked layout (`g`, `nb` blocks of the
/// file's format a row, `gb` bytes a group of 8 rows) against `t` activation rows (`acts`, `arb`
/// bytes apart; Q8_K for the K-quants, Q8_0 with their f32 scales `dys` for the others): token
/// t's result for row r at `out + t * stride + r`. Blocks go in the outer loop: each block of the
/// task's row tiles is unpacked once (into `u`), then each row tile's block is read from L1 for
/// every token tile, and the activations' block from L2 for every row tile; the sums carry from
/// block to block in `u`, the last block writing the results. Full 16-token tiles first, then one
/// pass for the tokens left over. The 32-value formats need `nb` a multiple of 4.
///
/// # Safety
/// AMX available ([`available`]); `g` holds rows `r0..r1`, `acts` (and `dys`) `t` rows of `nb`
/// blocks, `out` has room; no other `Tiles` on this thread.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul(
    f: Format,
    g: *const u8,
    nb: usize,
    gb: usize,
    r0: usize,
    r1: usize,
    acts: *const u8,
    arb: usize,
    packed: Option<(*const u8, usize)>,
    dys: *const f32,
    t: usize,
    out: *mut f32,
    stride: usize,
    u: &mut Unpacked,
) {
    debug_assert!(
        r0.is_multiple_of(16) && r1.is_multiple_of(16) && nb.is_multiple_of(f.per_unpacked())
    );
    // At most 16 row tiles (256 rows) a pass: their unpacked block (256 KiB) and the running sums
    // stay in L2, and the scratch stays small beside an LM head's 150,000 rows.
    let mut r0 = r0;
    while r1 - r0 > 256 {
        matmul(
            f,
            g,
            nb,
            gb,
            r0,
            r0 + 256,
            acts,
            arb,
            packed,
            dys,
            t,
            out,
            stride,
            u,
        );
        r0 += 256;
    }
    let rts = (r1 - r0) / 16;
    u.reserve(rts);
    if u.sums.len() < rts * t {
        u.sums.resize(rts * t, Line([0; 64]));
    }
    let sums = u.sums.as_mut_ptr() as *mut f32;
    let nu = nb / f.per_unpacked();
    // Bytes of one unpacked block in a group's run, and in an activation row.
    let (ub, ab) = (gb / nu, if f.kquant() { 292 } else { 4 * 34 });
    let full = t / 16;
    for (t0, m, n) in [(0, 16, full), (full * 16, t % 16, 1)] {
        if m == 0 || n == 0 {
            continue;
        }
        let tiles = Tiles::new(m, f);
        let acts = acts.add(t0 * arb);
        for i in 0..nu {
            for k in 0..rts {
                let grp = r0 / 8 + 2 * k;
                let (b0, b1) = (g.add(grp * gb + i * ub), g.add((grp + 1) * gb + i * ub));
                match f {
                    Format::Q4K => unpack_q4k(b0, b1, u, k),
                    Format::Q6K => unpack_q6k(b0, b1, u, k),
                    Format::Q5_0 => unpack_x8::<false>(b0, b1, u, k),
                    Format::Q8_0 => unpack_x8::<true>(b0, b1, u, k),
                }
            }
            // The block's activation tiles: the copy made with the activations, or one made here.
            let p = match packed {
                Some((base, tiles)) => base.add((i * tiles + t0 / 16) * KQ_TILE_BYTES),
                None => {
                    let (offs, w) = if f.kquant() {
                        (KQ_PARTS, 64)
                    } else {
                        (X8_PARTS, 32)
                    };
                    pack(acts.add(i * ab), arb, n * m, offs, w, &mut u.acts);
                    u.acts.as_ptr() as *const u8
                }
            };
            for k in 0..rts {
                let a = acts.add(i * ab);
                let s = sums.add(16 * (k * t + t0));
                let from = if i == 0 {
                    std::ptr::null()
                } else {
                    s as *const f32
                };
                // The last block writes the results in place.
                let (o, os) = if i + 1 == nu {
                    (out.add(t0 * stride + r0 + 16 * k), stride)
                } else {
                    (s, 16)
                };
                match f {
                    Format::Q4K => dot::<false>(&tiles, u, k, from, a, arb, p, n, o, os),
                    Format::Q6K => dot::<true>(&tiles, u, k, from, a, arb, p, n, o, os),
                    Format::Q5_0 | Format::Q8_0 => {
                        let dy = dys.add(t0 * nb + 4 * i);
                        dot_x8(&tiles, u, k, from, p, dy, nb, n, o, os)
                    }
                }
            }
        }
    }
}

/// The tile copy of `tokens` Q8_K rows of `nb` blocks (`arb` bytes apart), as `QuantizedInput`
/// makes it for a prompt pass, and its token tiles of 16.
#[cfg(all(test, target_arch = "x86_64"))]
fn tile_copy(acts: &[u8], arb: usize, nb: usize, tokens: usize) -> (Vec<Line>, usize) {
    assert!(available() && acts.len() >= (tokens - 1) * arb + nb * 292);
    let groups = tokens.div_ceil(16);
    let mut copy = vec![Line::ZERO; groups * nb * KQ_TILE_BYTES / 64];
    for tok in 0..tokens {
        // SAFETY: AMX CPUs have AVX-512F; the rows and the copy's room asserted and made above.
        unsafe {
            let to = copy.as_mut_ptr() as *mut u8;
            pack_row(acts[tok * arb..].as_ptr(), nb, tok, groups, to)
        }
    }
    (copy, groups)
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::gguf::TensorType;
    use crate::weights::quantize;
    use candle_core::quantized::k_quants::{BlockQ8K, GgmlType};
    use rand::{Rng, SeedableRng};

    /// Every token's results in `out` (rows `stride` apart) for the groups of 8 rows `groups` have
    /// the bits `want(token, group)` gives.
    pub(super) fn same_bits(
        out: &[f32],
        stride: usize,
        t: usize,
        groups: std::ops::Range<usize>,
        label: &str,
        want: impl Fn(usize, usize) -> [f32; 8],
    ) {
        for tok in 0..t {
            for grp in groups.clone() {
                let want = want(tok, grp);
                for (l, w) in want.iter().enumerate() {
                    let got = out[tok * stride + 8 * grp + l];
                    assert_eq!(
                        got.to_bits(),
                        w.to_bits(),
                        "{label} token {tok} row {}: {got} against {w}",
                        8 * grp + l
                    );
                }
            }
        }
    }

    /// The tile kernels give, for every token and row, the bits of `k8`'s kernels on the same
    /// data, for every tile height 1..=16, Q4_K and Q6_K.
    #[test]
    fn tiles_equal_the_decode_kernels() {
        if !available() {
            eprintln!("SKIP: no AMX-INT8 on this CPU (or MENS_NO_AMX set)");
            return;
        }
        use super::super::k8;
        for ttype in [TensorType::Q4K, TensorType::Q6K] {
            let q6 = ttype == TensorType::Q6K;
            let (rows, cols) = (32, 1024);
            let nb = cols / 256;
            let mut rng = rand::rngs::StdRng::seed_from_u64(11);
            // Rows of different sizes, and outliers, so that scales and mins vary.
            let x: Vec<f32> = (0..rows * cols)
                .map(|i| {
                    let big = if rng.gen_range(0..50) == 0 { 8.0 } else { 1.0 };
                    rng.gen_range(-1.0f32..1.0) * big * (1 + i / cols % 5) as f32
                })
                .collect();
            let src = quantize(ttype, &x);
            let gbytes = if q6 {
                k8::Q6K_GROUP_BYTES
            } else {
                k8::GROUP_BYTES
            };
            let mut g = vec![0u8; rows / 8 * nb * gbytes];
            if q6 {
                k8::repack_q6k(&src, rows, nb, &mut g);
            } else {
                k8::repack_q4k(&src, rows, nb, &mut g);
            }
            let arb = nb * 292 + 36; // rows further apart than a row, as in the session buffers
            let tokens = 40;
            let mut acts = vec![0u8; tokens * arb];
            for t in 0..tokens {
                // One row at the extremes (−128 appears in Q8_K), one all zero.
                let y: Vec<f32> = (0..cols)
                    .map(|i| match t {
                        3 if i % 2 == 0 => -5.0,
                        3 => 4.9,
                        5 => 0.0,
                        _ => rng.gen_range(-3.0..3.0),
                    })
                    .collect();
                let mut q = vec![BlockQ8K::zeros(); nb];
                BlockQ8K::from_float(&y, &mut q);
                // SAFETY: plain-old-data blocks viewed as bytes.
                let bytes =
                    unsafe { std::slice::from_raw_parts(q.as_ptr() as *const u8, nb * 292) };
                acts[t * arb..t * arb + nb * 292].copy_from_slice(bytes);
            }
            let gb = nb * gbytes;
            let mut u = Unpacked::new();
            let (copy, groups) = tile_copy(&acts, arb, nb, tokens);
            // Every tile height alone, runs of full tiles, full tiles and a rest; rows from 16;
            // the tiles from a copy made here and from the activations' copy.
            let heights = (1..=16).map(|t| (t, 0)).chain([(32, 0), (40, 16), (33, 0)]);
            for ((t, r0), whole) in heights.flat_map(|h| [(h, false), (h, true)]) {
                let packed = whole.then_some((copy.as_ptr() as *const u8, groups));
                let stride = rows + 5;
                let mut out = vec![f32::NAN; t * stride];
                // SAFETY: AMX checked by `available`; sizes as made above.
                unsafe {
                    matmul(
                        if q6 { Format::Q6K } else { Format::Q4K },
                        g.as_ptr(),
                        nb,
                        gb,
                        r0,
                        rows,
                        acts.as_ptr(),
                        arb,
                        packed,
                        std::ptr::null(),
                        t,
                        out.as_mut_ptr(),
                        stride,
                        &mut u,
                    )
                };
                let label = format!("{ttype:?} t {t} copy {whole}");
                same_bits(&out, stride, t, r0 / 8..rows / 8, &label, |tok, grp| {
                    let mut want = [[0f32; 8]; 1];
                    let ys = [acts[tok * arb..].as_ptr()];
                    let gp = g[grp * gb..].as_ptr();
                    // SAFETY: AVX2 (AMX CPUs have it); sizes as made above.
                    unsafe {
                        if q6 {
                            k8::dot_q6k::<1>(nb, gp, &ys, &mut want)
                        } else {
                            k8::dot::<1>(nb, gp, &ys, &mut want)
                        }
                    };
                    want[0]
                });
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod x8_tests {
    use super::*;
    use crate::gguf::TensorType;
    use crate::weights::quantize;
    use rand::{Rng, SeedableRng};

    /// Q5_0 and Q8_0 on the tiles give, for every token and row, the bits of `x8::dot` on the same
    /// data, for whole and part tiles.
    #[test]
    fn x8_tiles_equal_the_decode_kernel() {
        if !available() {
            eprintln!("SKIP: no AMX-INT8 on this CPU (or MENS_NO_AMX set)");
            return;
        }
        use super::super::x8;
        for (ttype, f, gbytes) in [
            (TensorType::Q5_0, Format::Q5_0, 176),
            (TensorType::Q8_0, Format::Q8_0, 272),
        ] {
            let (rows, cols) = (32, 512);
            let nb = cols / 32;
            let mut rng = rand::rngs::StdRng::seed_from_u64(13);
            let x: Vec<f32> = (0..rows * cols)
                .map(|i| rng.gen_range(-1.0f32..1.0) * (1 + i / cols % 5) as f32)
                .collect();
            let src = quantize(ttype, &x);
            let mut g = vec![0u8; rows / 8 * nb * gbytes];
            if f == Format::Q8_0 {
                x8::repack_q8_0(&src, rows, nb, &mut g);
            } else {
                x8::repack_q5_0(&src, rows, nb, &mut g);
            }
            // Q8_0 activation rows (34 bytes a block), their f32 scales and integer sums.
            let tokens = 40;
            let arb = nb * 34 + 6;
            let mut acts = vec![0u8; tokens * arb];
            let (mut ds, mut ss) = (vec![0f32; tokens * nb], vec![0i32; tokens * nb]);
            for t in 0..tokens {
                let y: Vec<f32> = (0..cols)
                    .map(|i| {
                        if t == 5 {
                            0.0
                        } else if t == 3 {
                            if i % 2 == 0 {
                                -5.0
                            } else {
                                4.9
                            }
                        } else {
                            rng.gen_range(-3.0..3.0)
                        }
                    })
                    .collect();
                let q = quantize(TensorType::Q8_0, &y);
                acts[t * arb..t * arb + nb * 34].copy_from_slice(&q);
                for i in 0..nb {
                    let b = &q[i * 34..(i + 1) * 34];
                    ds[t * nb + i] =
                        half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
                    ss[t * nb + i] = b[2..].iter().map(|&v| v as i8 as i32).sum();
                }
            }
            let gb = nb * gbytes;
            let mut u = Unpacked::new();
            for (t, r0) in [(1, 0), (7, 0), (16, 0), (32, 16), (40, 0)] {
                let stride = rows + 3;
                let mut out = vec![f32::NAN; t * stride];
                // SAFETY: AMX checked by `available`; sizes as made above.
                unsafe {
                    matmul(
                        f,
                        g.as_ptr(),
                        nb,
                        gb,
                        r0,
                        rows,
                        acts.as_ptr(),
                        arb,
                        None,
                        ds.as_ptr(),
                        t,
                        out.as_mut_ptr(),
                        stride,
                        &mut u,
                    )
                };
                let label = format!("{ttype:?} t {t}");
                super::tests::same_bits(&out, stride, t, r0 / 8..rows / 8, &label, |tok, grp| {
                    let mut want = [[0f32; 8]; 1];
                    let (q, d, s) = (
                        [acts[tok * arb..].as_ptr()],
                        [ds[tok * nb..].as_ptr()],
                        [ss[tok * nb..].as_ptr()],
                    );
                    let gp = g[grp * gb..].as_ptr();
                    // SAFETY: AVX-512 VNNI (AMX CPUs have it); sizes as made above.
                    unsafe {
                        if f == Format::Q8_0 {
                            x8::dot::<1, true>(nb, gp, &q, &d, &s, &mut want)
                        } else {
                            x8::dot::<1, false>(nb, gp, &q, &d, &s, &mut want)
                        }
                    };
                    want[0]
                });
            }
        }
    }
}

/// Timings by hand (ignored tests), measurements behind the kernel's design.
#[cfg(all(test, target_arch = "x86_64"))]
mod speed {
    use super::*;

    /// Nanoseconds per (16 tokens × 16 rows × 256 values) for the two formats, 512 tokens, 128
    /// rows, NB blocks a row (default 6), REPS passes (default 20): `NB=35 cargo test --release -p mens --lib amx_speed --
    /// --ignored --nocapture`.
    #[test]
    #[ignore]
    fn amx_speed() {
        if !available() {
            return;
        }
        let nb: usize = std::env::var("NB")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(6);
        let tokens: usize = std::env::var("TOKENS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(512);
        let (rows, arb) = (128, nb * 292 + 36);
        let acts = vec![1u8; tokens * arb];
        let mut out = vec![0f32; tokens * rows];
        let (copy, groups) = tile_copy(&acts, arb, nb, tokens);
        for q6 in [false, true] {
            let mut u = Unpacked::new();
            let gb = nb
                * if q6 {
                    super::super::k8::Q6K_GROUP_BYTES
                } else {
                    super::super::k8::GROUP_BYTES
                };
            let g = vec![0u8; rows / 8 * gb];
            let reps: usize = std::env::var("REPS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(20);
            let t = std::time::Instant::now();
            for _ in 0..reps {
                // SAFETY: AMX checked; sizes as made above.
                unsafe {
                    matmul(
                        if q6 { Format::Q6K } else { Format::Q4K },
                        g.as_ptr(),
                        nb,
                        gb,
                        0,
                        rows,
                        acts.as_ptr(),
                        arb,
                        Some((copy.as_ptr() as *const u8, groups)),
                        std::ptr::null(),
                        tokens,
                        out.as_mut_ptr(),
                        rows,
                        &mut u,
                    )
                };
            }
            let per = t.elapsed().as_nanos() as f64 / (reps * nb * tokens / 16 * rows / 16) as f64;
            eprintln!(
                "q6 {q6}: {per:.1} ns a tile block ({:.0} MAC/ns)",
                65536.0 / per
            );
        }
    }

    #[test]
    #[ignore]
    fn amx_raw() {
        if !available() {
            return;
        }
        let buf = vec![Line([1; 64]); 64];
        unsafe {
            let _t = Tiles::new(16, Format::Q6K);
            let n = 1_000_000;
            let t = std::time::Instant::now();
            for _ in 0..n {
                std::arch::asm!(
                    "tdpbssd tmm4, tmm0, tmm1",
                    "tdpbssd tmm5, tmm0, tmm2",
                    "tdpbssd tmm6, tmm0, tmm3",
                    "tdpbssd tmm7, tmm0, tmm1",
                    options(nostack, nomem)
                );
            }
            eprintln!(
                "dp (4 chains): {:.2} ns each",
                t.elapsed().as_nanos() as f64 / (4 * n) as f64
            );
            let t = std::time::Instant::now();
            for _ in 0..n {
                std::arch::asm!("tdpbssd tmm4, tmm0, tmm1", options(nostack, nomem));
            }
            eprintln!(
                "dp (1 chain): {:.2} ns each",
                t.elapsed().as_nanos() as f64 / n as f64
            );
            let t = std::time::Instant::now();
            for _ in 0..n {
                std::arch::asm!(
                    "tileloadd tmm1, [{b} + {s}*1]",
                    "tileloadd tmm2, [{b} + {s}*1 + 1024]",
                    b = in(reg) buf.as_ptr(), s = in(reg) 64usize,
                    options(nostack, readonly)
                );
            }
            eprintln!(
                "tileloadd (L1): {:.2} ns each",
                t.elapsed().as_nanos() as f64 / (2 * n) as f64
            );
            let t = std::time::Instant::now();
            for _ in 0..n {
                std::arch::asm!(
                    "tileloadd tmm1, [{b} + {s}*1]",
                    "tdpbssd tmm4, tmm0, tmm1",
                    "tileloadd tmm2, [{b} + {s}*1 + 1024]",
                    "tdpbssd tmm5, tmm0, tmm2",
                    "tileloadd tmm3, [{b} + {s}*1 + 2048]",
                    "tdpbssd tmm6, tmm0, tmm3",
                    b = in(reg) buf.as_ptr(), s = in(reg) 64usize,
                    options(nostack, readonly)
                );
            }
            eprintln!(
                "load+dp (3 chains): {:.2} ns a pair",
                t.elapsed().as_nanos() as f64 / (3 * n) as f64
            );
            // Activation tiles out of L2 (512 tokens): rows of a Q8_K matrix (strided, off the
            // line: 22 ns on this VM) against `pack`'s layout (whole lines: 10–11 ns).
            let big = vec![Line([1; 64]); 512 * 1792 / 64 + 64];
            for (stride, off, tstep) in [(1788usize, 4usize, 16 * 1788usize), (64, 0, 4096)] {
                let t = std::time::Instant::now();
                for i in 0..n {
                    let b = (big.as_ptr() as *const u8).add(off + tstep * (i % 32));
                    std::arch::asm!(
                        "tileloadd tmm0, [{b} + {s}*1]",
                        "tdpbssd tmm4, tmm0, tmm1",
                        "tdpbssd tmm5, tmm0, tmm2",
                        b = in(reg) b, s = in(reg) stride,
                        options(nostack, readonly)
                    );
                }
                eprintln!(
                    "activation tile (stride {stride}) + 2 dp: {:.2} ns",
                    t.elapsed().as_nanos() as f64 / n as f64
                );
            }
            let mut c = vec![Line([0; 64]); 64];
            let t = std::time::Instant::now();
            for _ in 0..n {
                std::arch::asm!(
                    "tilestored [{b} + {s}*1], tmm4",
                    b = in(reg) c.as_mut_ptr(), s = in(reg) 64usize,
                    options(nostack)
                );
            }
            eprintln!(
                "tilestored: {:.2} ns each",
                t.elapsed().as_nanos() as f64 / n as f64
            );
        }
    }
}
