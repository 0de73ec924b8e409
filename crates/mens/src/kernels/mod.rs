//! CPU kernels: quantized matrix-vector / matrix-matrix products over weights that stay in the GGUF
//! memory map, and the small fused elementwise kernels of a transformer layer.
//!
//! Quantized dot products come from candle's block types (`candle_core::quantized::k_quants`), which
//! carry llama.cpp's AVX2 kernels for Q4_0, Q8_0 and the K-quants. Candle's Q5_0 and Q4_1 dots are
//! scalar, so `simd.rs` has AVX2 versions (checked against candle's scalar code in the tests).

mod act_quant;
#[cfg(target_arch = "x86_64")]
pub mod amx;
pub mod attention;
pub mod k8;
mod kquant;
pub mod kv;
pub mod ops;
pub mod pool;
pub mod profile;
mod prompt_attention;
/// Query rows from which a pass's attention runs the tiled f32 arithmetic.
pub(crate) use prompt_attention::{
    allowed as tiled_prompt_attention, FROM as TILED_ATTENTION_FROM,
};
mod simd;
pub mod x8;

pub use simd::describe as cpu_kernels;

use crate::gguf::TensorType;
use crate::weights::{by_type, cast};
pub use crate::weights::{quantize, QTensor};
use candle_core::quantized::k_quants::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8K, BlockQ8_0, BlockQ8_1, GgmlType,
};
use half::{bf16, f16};
use std::sync::atomic::{AtomicU64, Ordering};

/// Counts kernel dispatches (one per matmul or fused elementwise kernel call), for `mens bench`.
pub static DISPATCHES: AtomicU64 = AtomicU64::new(0);

#[inline]
pub(crate) fn count_dispatch() {
    DISPATCHES.fetch_add(1, Ordering::Relaxed);
}

/// The activation format a weight type's dot product wants.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ActType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q8_1,
    Q8K,
}

pub fn act_type(t: TensorType) -> ActType {
    match t {
        TensorType::F32 => ActType::F32,
        TensorType::F16 => ActType::F16,
        TensorType::BF16 => ActType::BF16,
        TensorType::Q4_0 | TensorType::Q5_0 | TensorType::Q8_0 => ActType::Q8_0,
        TensorType::Q4_1 | TensorType::Q5_1 => ActType::Q8_1,
        _ => ActType::Q8K,
    }
}

/// Bytes one activation row of `cols` values takes in format `a`.
fn act_row_bytes(a: ActType, cols: usize) -> usize {
    match a {
        ActType::F32 => cols * 4,
        ActType::F16 | ActType::BF16 => cols * 2,
        ActType::Q8_0 => cols / 32 * 34,
        ActType::Q8_1 => cols / 32 * 36,
        ActType::Q8K => cols / 256 * std::mem::size_of::<BlockQ8K>(),
    }
}

/// One 64-byte line: the AMX scratch and the activations' tile copy are made of them, so that every
/// tile starts on a line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Line(pub(crate) [u8; 64]);

impl Line {
    pub const ZERO: Line = Line([0; 64]);
}

/// Preallocated buffers holding `rows` activation vectors quantized for the dot products.
/// One per matmul input (the normed hidden state, the attention output, the FFN hidden state).
pub struct QuantizedInput {
    cols: usize,
    rows: usize,
    // u32-backed so that every block type (alignment ≤ 4) can be cast from it.
    bufs: [(ActType, Vec<u32>, bool); 6],
    /// For Q8_0 / Q8_1 rows: each block's scale d, and (Q8_1) d·Σq, as f32 for the SIMD kernels.
    q8_0_d: Vec<f32>,
    /// For Q8_0 rows: each block's integer sum Σq (the repacked kernels' offset correction).
    q8_0_s: Vec<i32>,
    q8_1_d: Vec<f32>,
    q8_1_s: Vec<f32>,
    /// The Q8_K rows' values once more, in the AMX tiles' order (`amx::pack_row`), when this CPU
    /// runs them and the input can hold a prompt pass; empty otherwise.
    tiles: Vec<Line>,
    /// Token tiles of 16 that `tiles` has room for.
    tile_groups: usize,
}

impl QuantizedInput {
    pub fn new(max_rows: usize, cols: usize, types: &[ActType]) -> Self {
        let all = [
            ActType::F32,
            ActType::F16,
            ActType::BF16,
            ActType::Q8_0,
            ActType::Q8_1,
            ActType::Q8K,
        ];
        let bufs = all.map(|a| {
            let used = types.contains(&a);
            let n = if used {
                (act_row_bytes(a, cols) * max_rows).div_ceil(4)
            } else {
                0
            };
            (a, vec![0u32; n], false)
        });
        let blocks = |a| {
            if types.contains(&a) {
                max_rows * cols / 32
            } else {
                0
            }
        };
        #[cfg(target_arch = "x86_64")]
        let tiled = types.contains(&ActType::Q8K)
            && amx::tokens(max_rows) > 0
            && cols.is_multiple_of(256)
            && amx::available();
        #[cfg(not(target_arch = "x86_64"))]
        let tiled = false;
        let tile_groups = if tiled { max_rows.div_ceil(16) } else { 0 };
        #[cfg(target_arch = "x86_64")]
        let tile_lines = tile_groups * cols / 256 * amx::KQ_TILE_BYTES / 64;
        #[cfg(not(target_arch = "x86_64"))]
        let tile_lines = 0;
        QuantizedInput {
            cols,
            rows: 0,
            bufs,
            q8_0_d: vec![0f32; blocks(ActType::Q8_0)],
            q8_0_s: vec![0i32; blocks(ActType::Q8_0)],
            q8_1_d: vec![0f32; blocks(ActType::Q8_1)],
            q8_1_s: vec![0f32; blocks(ActType::Q8_1)],
            tiles: vec![Line::ZERO; tile_lines],
            tile_groups,
        }
    }

    pub fn bytes(&self) -> usize {
        self.bufs.iter().map(|b| b.1.len() * 4).sum::<usize>()
            + 4 * (self.q8_0_d.len() + self.q8_0_s.len() + self.q8_1_d.len() + self.q8_1_s.len())
            + 64 * self.tiles.len()
    }

    /// Activation rows as the SIMD kernels take them.
    fn act_rows(&self, a: ActType) -> (&[u8], usize, &[f32], &[f32]) {
        let (q, rb) = self.get(a);
        match a {
            ActType::Q8_0 => (q, rb, &self.q8_0_d, &self.q8_0_d),
            _ => (q, rb, &self.q8_1_d, &self.q8_1_s),
        }
    }

    /// Quantize `x` (`rows` × `cols`, row-major) into every format this input was built for.
    pub fn set(&mut self, x: &[f32], rows: usize) {
        self.set_at(x, 0, rows)
    }

    /// [`QuantizedInput::set`] for rows `first..first + rows`, keeping the rows before `first`: the
    /// input then holds `first + rows` rows.
    pub fn set_at(&mut self, x: &[f32], first: usize, rows: usize) {
        let cols = self.cols;
        self.rows = first + rows;
        for (a, buf, valid) in self.bufs.iter_mut() {
            *valid = false;
            if buf.is_empty() {
                continue;
            }
            let rb = act_row_bytes(*a, cols);
            let bytes: &mut [u8] = bytemuck_mut(buf);
            let bytes = &mut bytes[rb * first..rb * (first + rows)];
            let a = *a;
            // The tiles' copy of the Q8_K rows, written beside them.
            let tiles = (a == ActType::Q8K && !self.tiles.is_empty())
                .then_some(OutPtr(self.tiles.as_mut_ptr() as *mut f32));
            let (groups, nb) = (self.tile_groups, cols / 256);
            let pack = |r: usize, row: &[u8]| {
                #[cfg(target_arch = "x86_64")]
                if let Some(t) = tiles {
                    // SAFETY: `tiles` exists only where AMX (so AVX-512F) runs; it has room for
                    // `groups` × 16 rows of `nb` blocks, and each row writes its own bytes.
                    unsafe {
                        amx::pack_row(row.as_ptr(), nb, first + r, groups, t.ptr() as *mut u8)
                    }
                }
                #[cfg(not(target_arch = "x86_64"))]
                let _ = (r, row, tiles, groups, nb);
            };
            let quantize = |(dst, src): (&mut [u8], &[f32])| {
                fn q<T: GgmlType>(src: &[f32], dst: &mut [u8]) {
                    let n = dst.len() / std::mem::size_of::<T>();
                    // SAFETY: as `cast`, mutable.
                    let d =
                        unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr() as *mut T, n) };
                    T::from_float(src, d)
                }
                match a {
                    ActType::F32 => q::<f32>(src, dst),
                    ActType::F16 => q::<f16>(src, dst),
                    ActType::BF16 => q::<bf16>(src, dst),
                    ActType::Q8_0 => act_quant::q8_0(src, dst),
                    ActType::Q8_1 => q::<BlockQ8_1>(src, dst),
                    ActType::Q8K => act_quant::q8k(src, dst),
                }
            };
            if rows < 8 {
                for (r, pair) in bytes.chunks_mut(rb).zip(x.chunks(cols)).enumerate() {
                    quantize((&mut *pair.0, pair.1));
                    pack(r, pair.0);
                }
            } else {
                let dst = OutPtr(bytes.as_mut_ptr() as *mut f32);
                pool::pool().run(rows, &|r| {
                    // SAFETY: each task writes its own row of the buffer.
                    let d = unsafe {
                        std::slice::from_raw_parts_mut((dst.ptr() as *mut u8).add(r * rb), rb)
                    };
                    quantize((&mut *d, &x[r * cols..(r + 1) * cols]));
                    pack(r, d);
                });
            }
            *valid = true;
        }
        // f32 copies of the Q8_0 / Q8_1 block scales.
        let (b0, nb) = (first * cols / 32, (first + rows) * cols / 32);
        let f16_at =
            |b: &[u8], i: usize| f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32();
        for (a, buf, _) in self.bufs.iter() {
            let q: &[u8] = bytemuck_ref(buf);
            if *a == ActType::Q8_0 && !q.is_empty() {
                for i in b0..nb {
                    self.q8_0_d[i] = f16_at(q, i * 34);
                    self.q8_0_s[i] = q[i * 34 + 2..i * 34 + 34]
                        .iter()
                        .map(|&v| v as i8 as i32)
                        .sum();
                }
            }
            if *a == ActType::Q8_1 && !q.is_empty() {
                for i in b0..nb {
                    self.q8_1_d[i] = f16_at(q, i * 36);
                    self.q8_1_s[i] = f16_at(q, i * 36 + 2);
                }
            }
        }
    }

    /// The tiles' copy of the Q8_K rows and its token tiles of 16 (see `amx::pack_row`), where
    /// there is one.
    #[cfg(target_arch = "x86_64")]
    fn tiles(&self) -> Option<(*const u8, usize)> {
        (!self.tiles.is_empty()).then_some((self.tiles.as_ptr() as *const u8, self.tile_groups))
    }

    fn get(&self, a: ActType) -> (&[u8], usize) {
        let b = self
            .bufs
            .iter()
            .find(|b| b.0 == a)
            .expect("activation type");
        assert!(
            b.2,
            "activation format {a:?} was not prepared for this input"
        );
        let rb = act_row_bytes(a, self.cols);
        let bytes: &[u8] = bytemuck_ref(&b.1);
        (&bytes[..rb * self.rows], rb)
    }
}

fn bytemuck_mut(v: &mut [u32]) -> &mut [u8] {
    // SAFETY: u8 has no alignment or validity requirements.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, v.len() * 4) }
}
fn bytemuck_ref(v: &[u32]) -> &[u8] {
    // SAFETY: as above.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 4) }
}

/// A raw output pointer shared by the matmul tasks, each writing a disjoint set of elements.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);

impl OutPtr {
    /// The pointer (a method, so that closures capture the whole Sync wrapper).
    #[inline]
    pub(crate) fn ptr(self) -> *mut f32 {
        self.0
    }
}
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// For each weight matrix `(w, offset)` in `ws`: out[t * stride + offset + r] = dot(w.row(r), input.row(t))
/// for every row r and input row t. Several matrices sharing one input (Q, K, V; gate, up) run in one
/// parallel region and write side by side into one buffer: one dispatch instead of three.
pub fn matmul(ws: &[(&QTensor, usize)], input: &QuantizedInput, out: &mut [f32], stride: usize) {
    assert!(!ws.is_empty() && ws.len() <= 4);
    let t = input.rows;
    assert!(t > 0);
    for (w, off) in ws {
        assert_eq!(w.cols, input.cols, "matmul shape mismatch");
        assert!(
            out.len() >= (t - 1) * stride + off + w.rows,
            "matmul output too small"
        );
    }
    count_dispatch();
    let threads = pool::pool().threads();
    let total_rows: usize = ws.iter().map(|(w, _)| w.rows).sum();
    // Enough chunks to balance the threads, each long enough to amortise scheduling.
    let min_rows = if t == 1 { 16 } else { 8 };
    #[cfg(target_arch = "x86_64")]
    let tiles = amx::tokens(t) > 0 && amx::available();
    #[cfg(not(target_arch = "x86_64"))]
    let tiles = false;
    let chunk = if tiles {
        // One task a thread, in whole tiles of 16 rows: each task reads all the activations once,
        // so small tasks made 16 threads stream them from L3 (1.5B: 196 → 238 tokens/s from 8
        // to 16 threads, where llama.cpp doubles).
        total_rows.div_ceil(threads).next_multiple_of(16)
    } else {
        // A multiple of 8: the repacked layouts hold groups of eight rows.
        (total_rows / (threads * 4))
            .max(min_rows)
            .next_multiple_of(8)
    };
    let mut ends = [0usize; 4];
    let mut total = 0;
    for (i, (w, _)) in ws.iter().enumerate() {
        total += w.rows.div_ceil(chunk);
        ends[i] = total;
    }
    let out = OutPtr(out.as_mut_ptr());
    let work = |c: usize| {
        let mi = ends.iter().position(|&e| c < e).unwrap_or(0);
        let first = if mi == 0 { 0 } else { ends[mi - 1] };
        let (w, off) = ws[mi];
        let r0 = (c - first) * chunk;
        let r1 = (r0 + chunk).min(w.rows);
        rows(w, input, out, stride, off, r0, r1);
    };
    if total == 1 {
        work(0);
    } else {
        pool::pool().run(total, &work);
    }
}

fn rows(
    w: &QTensor,
    input: &QuantizedInput,
    out: OutPtr,
    stride: usize,
    off: usize,
    r0: usize,
    r1: usize,
) {
    let level = simd::level();
    if level != simd::Level::None {
        let kind = match w.ttype {
            TensorType::Q4_0 => Some(simd::Kind::Q4_0),
            TensorType::Q4_1 => Some(simd::Kind::Q4_1),
            TensorType::Q5_0 => Some(simd::Kind::Q5_0),
            TensorType::Q8_0 => Some(simd::Kind::Q8_0),
            _ => None,
        };
        if let Some(kind) = kind {
            return rows_simd(level, kind, w, input, out, stride, off, r0, r1);
        }
        let kkind = match w.ttype {
            TensorType::Q2K if kquant::enabled() => Some(kquant::KKind::Q2K),
            TensorType::Q3K if kquant::enabled() => Some(kquant::KKind::Q3K),
            TensorType::Q4K if kquant::enabled() => Some(kquant::KKind::Q4K),
            TensorType::Q5K if kquant::enabled() => Some(kquant::KKind::Q5K),
            TensorType::Q6K if kquant::enabled() => Some(kquant::KKind::Q6K),
            _ => None,
        };
        if let Some(kind) = kkind {
            return rows_kquant(kind, w, input, out, stride, off, r0, r1);
        }
    }
    let f = by_type!(w.ttype, rows_typed);
    f(w, input, out, stride, off, r0, r1)
}

/// Weight rows `b0..b1` against the R activation rows from `ti` on: `dot(r)` gives row r's R results,
/// written at out[(ti + k) * stride + off + r].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tile<const R: usize>(
    out: OutPtr,
    stride: usize,
    off: usize,
    ti: usize,
    b0: usize,
    b1: usize,
    dot: impl Fn(usize) -> [f32; R],
) {
    for r in b0..b1 {
        let v = dot(r);
        for (k, v) in v.iter().enumerate() {
            // SAFETY: (ti + k, r) pairs are disjoint across tasks and in bounds (asserted in `matmul`).
            unsafe { *out.0.add((ti + k) * stride + off + r) = *v };
        }
    }
}

/// Rows `r0..r1` through the x86 kernels: each weight block is decoded once for four activation rows.
#[allow(clippy::too_many_arguments)]
fn rows_simd(
    level: simd::Level,
    kind: simd::Kind,
    w: &QTensor,
    input: &QuantizedInput,
    out: OutPtr,
    stride: usize,
    off: usize,
    r0: usize,
    r1: usize,
) {
    let (acts, arb, d, s) = input.act_rows(act_type(w.ttype));
    let nb = w.cols / 32;
    #[cfg(target_arch = "x86_64")]
    if r0.is_multiple_of(8) && r1.is_multiple_of(8) {
        if let Some((g, p)) = repacked(level, w) {
            return rows_x8(g, p, input, nb, out, stride, off, r0, r1);
        }
    }
    let rb = w.row_bytes();
    let data = w.data();
    assert!(
        data.len() >= r1 * rb
            && acts.len() >= input.rows * arb
            && d.len() >= input.rows * nb
            && s.len() >= input.rows * nb
    );
    let act = |ti: usize| simd::ActRow {
        q: acts[ti * arb..].as_ptr(),
        d: d[ti * nb..].as_ptr(),
        s: s[ti * nb..].as_ptr(),
    };
    const ROW_BLOCK: usize = 8;
    let t = input.rows;
    let mut b0 = r0;
    while b0 < r1 {
        let b1 = (b0 + ROW_BLOCK).min(r1);
        let mut ti = 0;
        // Eight activation rows per decoded block with AVX-512's 32 registers.
        // SAFETY (the dots): level checked by the caller; bounds asserted above.
        while level == simd::Level::Vnni && ti + 8 <= t {
            let ys: [simd::ActRow; 8] = std::array::from_fn(|k| act(ti + k));
            tile(out, stride, off, ti, b0, b1, |r| unsafe {
                simd::dot::<8>(level, kind, nb, data.as_ptr().add(r * rb), &ys)
            });
            ti += 8;
        }
        while ti + 4 <= t {
            let ys = [act(ti), act(ti + 1), act(ti + 2), act(ti + 3)];
            tile(out, stride, off, ti, b0, b1, |r| unsafe {
                simd::dot::<4>(level, kind, nb, data.as_ptr().add(r * rb), &ys)
            });
            ti += 4;
        }
        while ti < t {
            let y = act(ti);
            let mut r = b0;
            let row = |r: usize| unsafe { data.as_ptr().add(r * rb) };
            while r + 4 <= b1 {
                // SAFETY: as above.
                unsafe {
                    let xs = [row(r), row(r + 1), row(r + 2), row(r + 3)];
                    let v = simd::dot_rows::<4>(level, kind, nb, &xs, &y);
                    for (k, v) in v.iter().enumerate() {
                        *out.0.add(ti * stride + off + r + k) = *v;
                    }
                }
                r += 4;
            }
            while r + 2 <= b1 {
                // SAFETY: as above.
                unsafe {
                    let v = simd::dot_rows::<2>(level, kind, nb, &[row(r), row(r + 1)], &y);
                    *out.0.add(ti * stride + off + r) = v[0];
                    *out.0.add(ti * stride + off + r + 1) = v[1];
                }
                r += 2;
            }
            if r < b1 {
                // SAFETY: as above.
                unsafe {
                    *out.0.add(ti * stride + off + r) =
                        simd::dot::<1>(level, kind, nb, data.as_ptr().add(r * rb), &[y])[0]
                };
            }
            ti += 1;
        }
        b0 = b1;
    }
}

/// Make `w`'s repacked copy now if the kernels will use one (see [`x8`]).
pub fn prepare(w: &QTensor) {
    #[cfg(target_arch = "x86_64")]
    repacked(simd::level(), w);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = w;
}

/// The repacked copy of a matrix of whole 8-row groups: Q4_K, Q6_K, Q5_0 and Q8_0 on a CPU with
/// AVX2 (made on first use, replacing the mapped pages), or None.
#[cfg(target_arch = "x86_64")]
fn repacked(level: simd::Level, w: &QTensor) -> Option<(&[u8], x8::Packed)> {
    let p = x8::Packed::of(w.ttype)?;
    let wanted = match p {
        x8::Packed::Q4K | x8::Packed::Q6K => {
            level != simd::Level::None && kquant::enabled() && k8::enabled()
        }
        x8::Packed::Q5_0 | x8::Packed::Q8_0 => {
            level == simd::Level::Vnni || (level == simd::Level::Avx2 && k8::enabled())
        }
    };
    if !wanted || !w.rows.is_multiple_of(8) {
        return None;
    }
    let g = w.repacked(|w| {
        // A chunk of rows at a time, each chunk's mapped pages given back as soon as it is copied,
        // so that the source and the copy of a large matrix (an LM head) are never both resident.
        let (nb, rb) = (w.cols / p.block_values(), w.row_bytes());
        let gb = p.group_bytes() * nb;
        let mut g = vec![0u8; w.rows / 8 * gb];
        const CHUNK: usize = 1024;
        for (c, out) in g.chunks_mut(CHUNK / 8 * gb).enumerate() {
            let rows = out.len() / gb * 8;
            let (from, to) = (c * CHUNK * rb, (c * CHUNK + rows) * rb);
            let src = &w.data()[from..to];
            match p {
                x8::Packed::Q5_0 => x8::repack_q5_0(src, rows, nb, out),
                x8::Packed::Q8_0 => x8::repack_q8_0(src, rows, nb, out),
                x8::Packed::Q4K => k8::repack_q4k(src, rows, nb, out),
                x8::Packed::Q6K => k8::repack_q6k(src, rows, nb, out),
            }
            w.release_pages(from, to);
        }
        Some(g.into_boxed_slice())
    })?;
    Some((g, p))
}

/// `$call!(N)` with N the literal of `$n` (1 to 8): the group kernels' tile height is a const.
#[cfg(target_arch = "x86_64")]
macro_rules! by_height {
    ($n:expr, $call:ident) => {
        match $n {
            1 => $call!(1),
            2 => $call!(2),
            3 => $call!(3),
            4 => $call!(4),
            5 => $call!(5),
            6 => $call!(6),
            7 => $call!(7),
            _ => $call!(8),
        }
    };
}

/// Rows `r0..r1` (whole groups of 8) of a repacked matrix, up to eight activation rows at a time
/// ([`group_tiles`]).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn rows_x8(
    g: &[u8],
    p: x8::Packed,
    input: &QuantizedInput,
    nb: usize,
    out: OutPtr,
    stride: usize,
    off: usize,
    r0: usize,
    r1: usize,
) {
    let (acts, arb) = input.get(ActType::Q8_0);
    let (d, s) = (&input.q8_0_d, &input.q8_0_s);
    let t = input.rows;
    let gb = p.group_bytes();
    assert!(g.len() >= r1 / 8 * nb * gb && acts.len() >= t * arb);
    assert!(d.len() >= t * nb && s.len() >= t * nb);
    let q = |ti: usize| acts[ti * arb..].as_ptr();
    let avx2 = simd::level() == simd::Level::Avx2;
    let tiles = |tokens: std::ops::Range<usize>, r0: usize, r1: usize| {
        group_tiles(tokens, r0, r1, out, stride, off, |grp, ti, n, o| {
            let gp = g[grp * nb * gb..].as_ptr();
            macro_rules! call {
                ($T:literal) => {{
                    let o: &mut [[f32; 8]; $T] = (&mut o[..$T]).try_into().unwrap();
                    let (qs, ds, ss) = (
                        &std::array::from_fn(|k| q(ti + k)),
                        &std::array::from_fn(|k| d[(ti + k) * nb..].as_ptr()),
                        &std::array::from_fn(|k| s[(ti + k) * nb..].as_ptr()),
                    );
                    // SAFETY: AVX-512 VNNI (or AVX2, for the `_avx2` kernels) checked by `repacked`;
                    // bounds asserted above.
                    unsafe { x8::group_dot::<$T>(p, avx2, nb, gp, qs, ds, ss, o) }
                }};
            }
            by_height!(n, call)
        })
    };
    // Four blocks a pass on the tiles (a CPU with AMX has VNNI, so never the AVX2 kernels).
    let f = match p {
        x8::Packed::Q8_0 if !avx2 => Some(amx::Format::Q8_0),
        x8::Packed::Q5_0 if !avx2 => Some(amx::Format::Q5_0),
        _ => None,
    }
    .filter(|_| nb.is_multiple_of(4));
    let dys = d.as_ptr();
    with_tiles(
        f,
        g,
        nb,
        nb * gb,
        acts,
        arb,
        None,
        dys,
        out,
        stride,
        off,
        r0,
        r1,
        t,
        tiles,
    );
}

/// Rows `r0..r1` of a K-quant matrix: each weight block unpacked once for four activation rows.
#[allow(clippy::too_many_arguments)]
fn rows_kquant(
    kind: kquant::KKind,
    w: &QTensor,
    input: &QuantizedInput,
    out: OutPtr,
    stride: usize,
    off: usize,
    r0: usize,
    r1: usize,
) {
    let (acts, arb) = input.get(ActType::Q8K);
    let nb = w.cols / 256;
    #[cfg(target_arch = "x86_64")]
    if r0.is_multiple_of(8) && r1.is_multiple_of(8) {
        // Some for Q4_K and Q6_K only.
        if let Some((g, p)) = repacked(simd::level(), w) {
            let packed = input.tiles();
            return rows_k8(
                g, p, acts, arb, packed, input.rows, nb, out, stride, off, r0, r1,
            );
        }
    }
    let rb = w.row_bytes();
    let data = w.data();
    let t = input.rows;
    assert!(data.len() >= r1 * rb && acts.len() >= t * arb && arb >= nb * kquant::Q8K_BYTES);
    let act = |ti: usize| acts[ti * arb..].as_ptr();
    const ROW_BLOCK: usize = 8;
    // Eight activation rows per unpacked block where the kernel has 32 registers (AVX-512).
    let wide = simd::level() == simd::Level::Vnni;
    let mut b0 = r0;
    while b0 < r1 {
        let b1 = (b0 + ROW_BLOCK).min(r1);
        let mut ti = 0;
        // SAFETY (the dots): AVX2+FMA checked by the caller, AVX-512 by `wide`; bounds asserted above.
        while wide && ti + 8 <= t {
            let ys: [*const u8; 8] = std::array::from_fn(|k| act(ti + k));
            tile(out, stride, off, ti, b0, b1, |r| unsafe {
                kquant::dot::<8>(kind, nb, data.as_ptr().add(r * rb), &ys)
            });
            ti += 8;
        }
        while ti + 4 <= t {
            let ys = [act(ti), act(ti + 1), act(ti + 2), act(ti + 3)];
            tile(out, stride, off, ti, b0, b1, |r| unsafe {
                kquant::dot::<4>(kind, nb, data.as_ptr().add(r * rb), &ys)
            });
            ti += 4;
        }
        // Left-over rows, and decode (one row): the same kernel at R = 1, so that a token's numbers
        // do not depend on how many rows its batch had (cached and uncached decoding agree exactly).
        while ti < t {
            let ys = [act(ti)];
            tile(out, stride, off, ti, b0, b1, |r| unsafe {
                kquant::dot::<1>(kind, nb, data.as_ptr().add(r * rb), &ys)
            });
            ti += 1;
        }
        b0 = b1;
    }
}

/// The tiles of a repacked matmul over rows `r0..r1` (whole groups of 8) and `t` activation rows:
/// `dot(group, first row, n, out)` fills `out[..n]`, the eight results of each activation row
/// (n ≤ 8 on AVX-512 VNNI, whose 32 registers hold eight rows' sums; else ≤ 4), written at out[(row) * stride + off + group * 8 + lane]. Activation rows go in blocks of 64,
/// each block passing every group of the task's rows before the next: a block (at most 64 · 292
/// bytes per 256 columns) stays in L2 beside the task's weights, where a whole 512-row prompt
/// would stream from L3 once per group, by every thread at once.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn group_tiles(
    tokens: std::ops::Range<usize>,
    r0: usize,
    r1: usize,
    out: OutPtr,
    stride: usize,
    off: usize,
    dot: impl Fn(usize, usize, usize, &mut [[f32; 8]; 8]),
) {
    let most = if simd::level() == simd::Level::Vnni {
        8
    } else {
        4
    };
    let t = tokens.end;
    for t0 in tokens.step_by(64) {
        let t1 = (t0 + 64).min(t);
        for grp in r0 / 8..r1 / 8 {
            let mut ti = t0;
            while ti < t1 {
                let n = (t1 - ti).min(most);
                let mut o = [[0f32; 8]; 8];
                dot(grp, ti, n, &mut o);
                for (k, row) in o[..n].iter().enumerate() {
                    for (l, v) in row.iter().enumerate() {
                        // SAFETY: (row, column) pairs are disjoint across tasks and in bounds
                        // (asserted in `matmul`).
                        unsafe { *out.0.add((ti + k) * stride + off + grp * 8 + l) = *v };
                    }
                }
                ti += n;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// Each thread's unpacked weight blocks and running sums for the AMX tiles.
    static AMX_SCRATCH: std::cell::RefCell<amx::Unpacked> =
        const { std::cell::RefCell::new(amx::Unpacked::new()) };
}

/// Rows `r0..r1` × `t` tokens of a repacked matrix (`g`, `gb` bytes a group of 8 rows): whole
/// tiles of 16 rows and the tokens `amx::tokens` gives on the AMX tiles in format `f` (None: not
/// on this CPU or for this matrix), then `rest(tokens, r0, r1)` for what is left, with the same
/// bits. `dys`: the Q8_0 activations' f32 scales (32-value formats).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn with_tiles(
    f: Option<amx::Format>,
    g: &[u8],
    nb: usize,
    gb: usize,
    acts: &[u8],
    arb: usize,
    packed: Option<(*const u8, usize)>,
    dys: *const f32,
    out: OutPtr,
    stride: usize,
    off: usize,
    r0: usize,
    r1: usize,
    t: usize,
    rest: impl Fn(std::ops::Range<usize>, usize, usize),
) {
    let (ra, ta) = (r0 + (r1 - r0) / 16 * 16, amx::tokens(t));
    let Some(f) = f.filter(|_| ta > 0 && ra > r0 && amx::available()) else {
        return rest(0..t, r0, r1);
    };
    AMX_SCRATCH.with_borrow_mut(|u| {
        // SAFETY: AMX checked by `available`; the callers assert `g` and `acts` (and `dys`) in
        // bounds, and (row, column) pairs are disjoint across tasks and in bounds (asserted in
        // `matmul`).
        unsafe {
            let (a, o) = (acts.as_ptr(), out.0.add(off));
            amx::matmul(
                f,
                g.as_ptr(),
                nb,
                gb,
                r0,
                ra,
                a,
                arb,
                packed,
                dys,
                ta,
                o,
                stride,
                u,
            )
        }
    });
    if ta < t {
        rest(ta..t, r0, ra);
    }
    if ra < r1 {
        rest(0..t, ra, r1);
    }
}

/// Rows `r0..r1` (whole groups of 8) of a Q4_K or Q6_K matrix in `k8`'s layout, against `t`
/// Q8_K rows.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn rows_k8(
    g: &[u8],
    p: x8::Packed,
    acts: &[u8],
    arb: usize,
    packed: Option<(*const u8, usize)>,
    t: usize,
    nb: usize,
    out: OutPtr,
    stride: usize,
    off: usize,
    r0: usize,
    r1: usize,
) {
    let gb = p.group_bytes() * nb;
    assert!(g.len() >= r1 / 8 * gb && acts.len() >= t * arb && arb >= nb * kquant::Q8K_BYTES);
    let vnni = simd::level() == simd::Level::Vnni;
    let k8 = |tokens: std::ops::Range<usize>, r0: usize, r1: usize| {
        group_tiles(tokens, r0, r1, out, stride, off, |grp, ti, n, o| {
            let gp = g[grp * gb..].as_ptr();
            macro_rules! call {
                ($T:literal) => {{
                    let o: &mut [[f32; 8]; $T] = (&mut o[..$T]).try_into().unwrap();
                    let ys = std::array::from_fn(|k| acts[(ti + k) * arb..].as_ptr());
                    // SAFETY: AVX2 checked by `repacked`, AVX-512 VNNI by `level`; bounds
                    // asserted above.
                    unsafe {
                        match (p == x8::Packed::Q6K, vnni) {
                            (true, true) => k8::dot_q6k_vnni::<$T>(nb, gp, &ys, o),
                            (true, false) => k8::dot_q6k::<$T>(nb, gp, &ys, o),
                            (false, true) => k8::dot_vnni::<$T>(nb, gp, &ys, o),
                            (false, false) => k8::dot::<$T>(nb, gp, &ys, o),
                        }
                    }
                }};
            }
            by_height!(n, call)
        })
    };
    let f = if p == x8::Packed::Q6K {
        amx::Format::Q6K
    } else {
        amx::Format::Q4K
    };
    with_tiles(
        Some(f),
        g,
        nb,
        gb,
        acts,
        arb,
        packed,
        std::ptr::null(),
        out,
        stride,
        off,
        r0,
        r1,
        t,
        k8,
    );
}

/// One dot product of a weight row with an activation row, through candle's kernels.
#[inline]
fn dot<T: GgmlType>(n: usize, row: &[u8], act: &[u8]) -> f32 {
    T::vec_dot(n, cast::<T>(row), cast::<T::VecDotType>(act))
}

fn rows_typed<T: GgmlType>(
    w: &QTensor,
    input: &QuantizedInput,
    out: OutPtr,
    stride: usize,
    off: usize,
    r0: usize,
    r1: usize,
) {
    let (acts, arb) = input.get(act_type(w.ttype));
    let n = w.cols;
    let rb = w.row_bytes();
    let data = w.data();
    // Blocks of ROW_BLOCK weight rows stay in L1 while every activation row passes by; the outputs of
    // one activation row are then contiguous (a strided store per output misses the cache).
    const ROW_BLOCK: usize = 8;
    let mut b0 = r0;
    while b0 < r1 {
        let b1 = (b0 + ROW_BLOCK).min(r1);
        for ti in 0..input.rows {
            let a = &acts[ti * arb..(ti + 1) * arb];
            let base = ti * stride + off;
            for r in b0..b1 {
                let v = dot::<T>(n, &data[r * rb..(r + 1) * rb], a);
                // SAFETY: (ti, r) pairs are disjoint across tasks and in bounds (asserted in `matmul`).
                unsafe { *out.0.add(base + r) = v };
            }
        }
        b0 = b1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Storage;
    use rand::{Rng, SeedableRng};
    use std::sync::Arc;

    fn random_tensor(rows: usize, cols: usize, ttype: TensorType, seed: u64) -> QTensor {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let x: Vec<f32> = (0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let bytes = quantize(ttype, &x);
        let len = bytes.len();
        QTensor::new(ttype, rows, cols, Arc::new(Storage::Bytes(bytes)), 0, len).unwrap()
    }

    /// The x86 kernels (AVX2 and, where the CPU has it, VNNI; one and four rows at a time) equal
    /// candle's scalar reference on random blocks.
    #[test]
    fn simd_dots_match_scalar_reference() {
        if simd::level() == simd::Level::None {
            eprintln!("SKIP: no AVX2+FMA+F16C on this CPU, the x86 kernels are not used");
            return;
        }
        let cols = 1024;
        let nb = cols / 32;
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let ys: Vec<f32> = (0..4 * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let levels: &[simd::Level] = if simd::level() == simd::Level::Vnni {
            &[simd::Level::Avx2, simd::Level::Vnni]
        } else {
            &[simd::Level::Avx2]
        };
        fn check<T: GgmlType>(
            kind: simd::Kind,
            ttype: TensorType,
            levels: &[simd::Level],
            ys: &[f32],
            cols: usize,
            nb: usize,
        ) {
            let w = random_tensor(3, cols, ttype, kind as u64 + 1);
            let mut input = QuantizedInput::new(4, cols, &[act_type(ttype)]);
            input.set(ys, 4);
            let (q, arb, d, s) = input.act_rows(act_type(ttype));
            let act = |ti: usize| simd::ActRow {
                q: q[ti * arb..].as_ptr(),
                d: d[ti * nb..].as_ptr(),
                s: s[ti * nb..].as_ptr(),
            };
            for r in 0..3 {
                let row = &w.data()[r * w.row_bytes()..(r + 1) * w.row_bytes()];
                let reference: Vec<f32> = (0..4)
                    .map(|ti| {
                        T::vec_dot_unopt(
                            cols,
                            cast::<T>(row),
                            cast::<T::VecDotType>(&q[ti * arb..(ti + 1) * arb]),
                        )
                    })
                    .collect();
                for &level in levels {
                    let four = unsafe {
                        simd::dot::<4>(
                            level,
                            kind,
                            nb,
                            row.as_ptr(),
                            &[act(0), act(1), act(2), act(3)],
                        )
                    };
                    let eight = unsafe {
                        simd::dot::<8>(
                            level,
                            kind,
                            nb,
                            row.as_ptr(),
                            &std::array::from_fn(|k| act(k % 4)),
                        )
                    };
                    for ti in 0..4 {
                        let one =
                            unsafe { simd::dot::<1>(level, kind, nb, row.as_ptr(), &[act(ti)]) }[0];
                        for e in [eight[ti], eight[ti + 4]] {
                            assert!(
                                (e - reference[ti]).abs() <= 1e-4 * reference[ti].abs().max(1.0),
                                "{kind:?} {level:?} x8 row {r} act {ti}: {e} vs {}",
                                reference[ti]
                            );
                        }
                        let want = reference[ti];
                        let tol = 1e-4 * want.abs().max(1.0);
                        assert!(
                            (one - want).abs() <= tol,
                            "{kind:?} {level:?} row {r} act {ti}: {one} vs {want}"
                        );
                        assert!(
                            (four[ti] - want).abs() <= tol,
                            "{kind:?} {level:?} x4 row {r} act {ti}: {} vs {want}",
                            four[ti]
                        );
                        // Two different rows at once (this one and the next): each gives the bits of
                        // the one-row kernel (decode and a verify pass must agree bit for bit).
                        let r2 = (r + 1) % 3;
                        let other = &w.data()[r2 * w.row_bytes()..(r2 + 1) * w.row_bytes()];
                        let two = unsafe {
                            simd::dot_rows::<2>(
                                level,
                                kind,
                                nb,
                                &[row.as_ptr(), other.as_ptr()],
                                &act(ti),
                            )
                        };
                        let one_other =
                            unsafe { simd::dot::<1>(level, kind, nb, other.as_ptr(), &[act(ti)]) }
                                [0];
                        // Four rows at once: the same bits again.
                        let xs4 = [other.as_ptr(), row.as_ptr(), other.as_ptr(), row.as_ptr()];
                        let four_rows =
                            unsafe { simd::dot_rows::<4>(level, kind, nb, &xs4, &act(ti)) };
                        assert_eq!(
                            four_rows.map(f32::to_bits),
                            [one_other, one, one_other, one].map(f32::to_bits),
                            "{kind:?} {level:?} 4 rows"
                        );
                        assert!(
                            two[0].to_bits() == one.to_bits()
                                && two[1].to_bits() == one_other.to_bits(),
                            "{kind:?} {level:?} 2 rows: {two:?} vs one row at a time {one}, {one_other}"
                        );
                    }
                }
            }
        }
        check::<BlockQ5_0>(simd::Kind::Q5_0, TensorType::Q5_0, levels, &ys, cols, nb);
        check::<BlockQ8_0>(simd::Kind::Q8_0, TensorType::Q8_0, levels, &ys, cols, nb);
        check::<BlockQ4_0>(simd::Kind::Q4_0, TensorType::Q4_0, levels, &ys, cols, nb);
        check::<BlockQ4_1>(simd::Kind::Q4_1, TensorType::Q4_1, levels, &ys, cols, nb);
    }

    /// The Q4_K / Q6_K kernels (one and four activation rows) equal candle's scalar reference.
    #[test]
    fn kquant_dots_match_scalar_reference() {
        if simd::level() == simd::Level::None {
            eprintln!("SKIP: no AVX2+FMA on this CPU, the K-quant kernels are not used");
            return;
        }
        let cols = 1024;
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let ys: Vec<f32> = (0..4 * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
        fn check<T: GgmlType>(kind: kquant::KKind, ttype: TensorType, ys: &[f32], cols: usize) {
            let w = random_tensor(3, cols, ttype, kind as u64 + 11);
            let mut input = QuantizedInput::new(4, cols, &[ActType::Q8K]);
            input.set(ys, 4);
            let (q, arb) = input.get(ActType::Q8K);
            let act = |ti: usize| q[ti * arb..].as_ptr();
            let wides: &[bool] = if simd::level() == simd::Level::Vnni {
                &[false, true]
            } else {
                &[false]
            };
            for &wide in wides {
                for r in 0..3 {
                    let row = &w.data()[r * w.row_bytes()..(r + 1) * w.row_bytes()];
                    let nb = cols / 256;
                    let four = unsafe {
                        kquant::dot_isa::<4>(
                            wide,
                            kind,
                            nb,
                            row.as_ptr(),
                            &[act(0), act(1), act(2), act(3)],
                        )
                    };
                    let eight = unsafe {
                        kquant::dot_isa::<8>(
                            wide,
                            kind,
                            nb,
                            row.as_ptr(),
                            &std::array::from_fn(|k| act(k % 4)),
                        )
                    };
                    for ti in 0..4 {
                        let want = T::vec_dot_unopt(
                            cols,
                            cast::<T>(row),
                            cast::<T::VecDotType>(&q[ti * arb..(ti + 1) * arb]),
                        );
                        let one = unsafe {
                            kquant::dot_isa::<1>(wide, kind, nb, row.as_ptr(), &[act(ti)])
                        }[0];
                        let tol = 1e-4 * want.abs().max(1.0);
                        assert!(
                            (one - want).abs() <= tol,
                            "{kind:?} wide={wide} row {r} act {ti}: {one} vs {want}"
                        );
                        assert!(
                            (four[ti] - want).abs() <= tol,
                            "{kind:?} wide={wide} x4 row {r} act {ti}: {} vs {want}",
                            four[ti]
                        );
                        for e in [eight[ti], eight[ti + 4]] {
                            assert!(
                                (e - want).abs() <= tol,
                                "{kind:?} wide={wide} x8: {e} vs {want}"
                            );
                        }
                    }
                }
            }
        }
        check::<BlockQ2K>(kquant::KKind::Q2K, TensorType::Q2K, &ys, cols);
        check::<BlockQ3K>(kquant::KKind::Q3K, TensorType::Q3K, &ys, cols);
        check::<BlockQ4K>(kquant::KKind::Q4K, TensorType::Q4K, &ys, cols);
        check::<BlockQ5K>(kquant::KKind::Q5K, TensorType::Q5K, &ys, cols);
        check::<BlockQ6K>(kquant::KKind::Q6K, TensorType::Q6K, &ys, cols);
    }

    /// The activation quantizers write the bytes candle's `from_float` writes, on every kernel level
    /// (values on rounding ties, zeros and a zero block included).
    #[test]
    fn activation_quantizers_equal_candles() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let cols = 8192;
        // Blocks of different magnitudes, some with one large outlier.
        let mut x: Vec<f32> = (0..cols)
            .map(|i| rng.gen_range(-3.0..3.0) * [1.0, 1e-3, 40.0, 7.0][i / 256 % 4])
            .collect();
        for i in (1024..cols).step_by(700) {
            x[i] *= 50.0;
        }
        x[..256].fill(0.0);
        // Ties: with amax 127 in a block, q = x exactly; x.5 rounds away from zero.
        for (i, v) in x[256..288].iter_mut().enumerate() {
            *v = i as f32 - 15.5;
        }
        x[300] = 127.0;
        for (i, v) in x[512..768].iter_mut().enumerate() {
            *v = (i as f32 - 127.5) * 0.5;
        }
        let want8 = quantize(TensorType::Q8_0, &x);
        let want_k = {
            let mut b = vec![BlockQ8K::zeros(); cols / 256];
            BlockQ8K::from_float(&x, &mut b);
            // SAFETY: plain-old-data blocks viewed as bytes.
            unsafe {
                std::slice::from_raw_parts(b.as_ptr() as *const u8, std::mem::size_of_val(&b[..]))
                    .to_vec()
            }
        };
        for portable in [false, true] {
            let mut got8 = vec![0u8; want8.len()];
            let mut got_k = vec![0u8; want_k.len()];
            act_quant::q8_0_isa(portable, &x, &mut got8);
            act_quant::q8k_isa(portable, &x, &mut got_k);
            assert_eq!(got8, want8, "Q8_0, portable = {portable}");
            assert_eq!(got_k, want_k, "Q8_K, portable = {portable}");
        }
    }

    /// The allocation-free K-quant dequantizers equal candle's.
    #[test]
    fn k_quant_dequantize_matches_candle() {
        let w = random_tensor(2, 512, TensorType::Q4K, 21);
        let (mut a, mut b) = (vec![0f32; 512], vec![0f32; 512]);
        for r in 0..2 {
            w.dequantize_row(r, &mut a);
            BlockQ4K::to_float(
                cast::<BlockQ4K>(&w.data()[r * w.row_bytes()..(r + 1) * w.row_bytes()]),
                &mut b,
            );
            assert_eq!(a, b);
        }
        let w = random_tensor(2, 512, TensorType::Q6K, 22);
        for r in 0..2 {
            w.dequantize_row(r, &mut a);
            BlockQ6K::to_float(
                cast::<BlockQ6K>(&w.data()[r * w.row_bytes()..(r + 1) * w.row_bytes()]),
                &mut b,
            );
            assert_eq!(a, b);
        }
    }

    /// The repacked kernels through `matmul` (Q4_K, Q6_K, Q5_0 and Q8_0 on AVX2 and up): against a
    /// scalar reference on the same quantized numbers (exact integer block dots, so within f32
    /// rounding of the scale products), every activation row giving the same bits
    /// alone as in a batch of 1 to 9 rows or of 70 (past a block of 64: decode = prefill).
    #[test]
    fn repacked_matrices_match_the_scalar_dot() {
        #[cfg(target_arch = "x86_64")]
        for ttype in [
            TensorType::Q5_0,
            TensorType::Q8_0,
            TensorType::Q4K,
            TensorType::Q6K,
        ] {
            let probe = random_tensor(8, 256, ttype, 1);
            if repacked(simd::level(), &probe).is_none() {
                eprintln!("SKIP (not run, not passed): {ttype:?} is not repacked on this CPU");
                continue;
            }
            repacked_matches(ttype);
        }
    }

    /// The value of element `m` of a Q5_0 or Q8_0 block `b`, as an integer.
    #[cfg(target_arch = "x86_64")]
    fn block_value(ttype: TensorType, b: &[u8], m: usize) -> i64 {
        if ttype == TensorType::Q8_0 {
            return b[2 + m] as i8 as i64;
        }
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let lo = if m < 16 {
            b[6 + m] & 15
        } else {
            b[6 + m - 16] >> 4
        };
        (lo as i64 | (((qh >> m) & 1) as i64) << 4) - 16
    }

    #[cfg(target_arch = "x86_64")]
    fn repacked_matches(ttype: TensorType) {
        let kquant = matches!(ttype, TensorType::Q4K | TensorType::Q6K);
        // More rows than one repacking chunk (1024), and not a multiple of it.
        let (rows, cols) = (1040, if kquant { 512 } else { 96 });
        let w = random_tensor(rows, cols, ttype, 21);
        let p = x8::Packed::of(ttype).unwrap();
        assert!(
            repacked(simd::level(), &w).is_some(),
            "the matrix is repacked"
        );
        let nb = cols / p.block_values();
        let bb = w.row_bytes() / nb;
        // Rows read back from the copy (a tied embedding's lookups) equal the file's.
        let plain = QTensor::new(
            ttype,
            rows,
            cols,
            Arc::new(Storage::Bytes(w.data().to_vec())),
            0,
            w.bytes(),
        )
        .unwrap();
        let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
        for r in [0, 7, 8, 1039] {
            w.dequantize_row(r, &mut a);
            plain.dequantize_row(r, &mut b);
            assert_eq!(a, b, "{ttype:?} row {r} from the repacked copy");
        }
        let at = act_type(ttype);
        let mut rng = rand::rngs::StdRng::seed_from_u64(22);
        let x: Vec<f32> = (0..70 * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let mut alone = vec![vec![0f32; rows]; 70];
        for (ti, a) in alone.iter_mut().enumerate() {
            let mut input = QuantizedInput::new(1, cols, &[at]);
            input.set(&x[ti * cols..(ti + 1) * cols], 1);
            matmul(&[(&w, 0)], &input, a, rows);
            if ti >= 9 {
                continue;
            }
            let (yq, _) = input.get(at);
            for r in 0..rows {
                let row = &w.data()[r * nb * bb..(r + 1) * nb * bb];
                let got = a[r] as f64;
                if kquant {
                    // The scalar reference: candle's `vec_dot_unopt` (ggml's arithmetic); rounding
                    // relative to the terms' size (Q4_K's mins term cancels much of its sum).
                    let y: &[BlockQ8K] = cast(yq);
                    let (want, wf) = if ttype == TensorType::Q4K {
                        let blocks: &[BlockQ4K] = cast(row);
                        let mut wf = vec![0f32; cols];
                        BlockQ4K::to_float(blocks, &mut wf);
                        (BlockQ4K::vec_dot_unopt(cols, blocks, y), wf)
                    } else {
                        let blocks: &[BlockQ6K] = cast(row);
                        let mut wf = vec![0f32; cols];
                        BlockQ6K::to_float(blocks, &mut wf);
                        (BlockQ6K::vec_dot_unopt(cols, blocks, y), wf)
                    };
                    let mut yf = vec![0f32; cols];
                    BlockQ8K::to_float(y, &mut yf);
                    let size: f64 = wf.iter().zip(&yf).map(|(a, b)| (a * b).abs() as f64).sum();
                    assert!(
                        (got - want as f64).abs() <= 1e-6 * size + 1e-6,
                        "{ttype:?} row {r} act {ti}: {got} vs {want}"
                    );
                    continue;
                }
                // The scalar reference: Σ_blocks dx·dy·Σ q·y over the same quantized values.
                let mut want = 0f64;
                for i in 0..nb {
                    let b = &row[i * bb..(i + 1) * bb];
                    let dx = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
                    let yb = &yq[i * 34..(i + 1) * 34];
                    let dy = f16::from_bits(u16::from_le_bytes([yb[0], yb[1]])).to_f32();
                    let sumi: i64 = (0..32)
                        .map(|m| block_value(ttype, b, m) * yb[2 + m] as i8 as i64)
                        .sum();
                    want += dx as f64 * dy as f64 * sumi as f64;
                }
                assert!(
                    (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "{ttype:?} row {r} act {ti}: {got} vs {want}"
                );
            }
        }
        // From 32 rows the AMX tiles run where the CPU has them: 32 and 70 (whole tiles, the rest
        // through the group kernels), 44 (a part tile); 16 and 30 stay on the group kernels.
        for t in (1..=9).chain([16, 30, 32, 44, 70]) {
            let mut input = QuantizedInput::new(t, cols, &[at]);
            input.set(&x[..t * cols], t);
            let mut out = vec![0f32; t * rows];
            matmul(&[(&w, 0)], &input, &mut out, rows);
            for ti in 0..t {
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&out[ti * rows..(ti + 1) * rows]),
                    bits(&alone[ti]),
                    "{ttype:?} batch of {t}, row {ti}"
                );
            }
        }
    }

    /// Quantized matmul against an f32 reference on the dequantized weights, batched and single-row.
    #[test]
    fn matmul_matches_f32_reference() {
        let (rows, cols, t) = (37, 512, 5);
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let x: Vec<f32> = (0..t * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
        for w in [
            random_tensor(rows, cols, TensorType::Q4K, 4),
            random_tensor(rows, cols, TensorType::Q6K, 5),
            random_tensor(rows, cols, TensorType::Q5_0, 6),
            random_tensor(rows, cols, TensorType::Q8_0, 7),
            random_tensor(rows, cols, TensorType::Q4_1, 8),
            random_tensor(rows, cols, TensorType::Q4_0, 9),
            random_tensor(rows, cols, TensorType::F16, 10),
            random_tensor(rows, cols, TensorType::F32, 11),
        ] {
            let mut input = QuantizedInput::new(t, cols, &[act_type(w.ttype)]);
            input.set(&x, t);
            let mut out = vec![0f32; t * rows];
            matmul(&[(&w, 0)], &input, &mut out, rows);
            let mut wrow = vec![0f32; cols];
            let (mut err, mut norm) = (0f64, 0f64);
            for r in 0..rows {
                w.dequantize_row(r, &mut wrow);
                for ti in 0..t {
                    let reference: f32 = wrow
                        .iter()
                        .zip(&x[ti * cols..(ti + 1) * cols])
                        .map(|(a, b)| a * b)
                        .sum();
                    err += ((out[ti * rows + r] - reference) as f64).powi(2);
                    norm += (reference as f64).powi(2);
                }
            }
            let rel = (err / norm).sqrt();
            assert!(rel < 2e-2, "{}: relative L2 error {rel}", w.ttype.name());
            // Single-row matmul gives the same numbers as the batched one.
            input.set(&x[..cols], 1);
            let mut one = vec![0f32; rows];
            matmul(&[(&w, 0)], &input, &mut one, rows);
            assert_eq!(&one[..], &out[..rows], "{}", w.ttype.name());
        }
    }
}
