//! Weights as the file stores them: a quantized tensor view into the memory map ([`QTensor`]), the
//! GGUF block types behind each [`TensorType`], row dequantization and quantization. Every backend
//! reads weights through this; the CPU kernels add their products in `kernels`.

use crate::error::{Error, Result};
use crate::gguf::{Storage, TensorType};
use candle_core::quantized::k_quants::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8_0, GgmlType,
};
use half::{bf16, f16};
use std::sync::Arc;

/// Calls `$f::<BlockType>` for the block type of tensor type `$t` (one place for the 13-way match).
macro_rules! by_type {
    ($t:expr, $f:ident) => {
        match $t {
            TensorType::F32 => $f::<f32>,
            TensorType::F16 => $f::<f16>,
            TensorType::BF16 => $f::<bf16>,
            TensorType::Q4_0 => $f::<BlockQ4_0>,
            TensorType::Q4_1 => $f::<BlockQ4_1>,
            TensorType::Q5_0 => $f::<BlockQ5_0>,
            TensorType::Q5_1 => $f::<BlockQ5_1>,
            TensorType::Q8_0 => $f::<BlockQ8_0>,
            TensorType::Q2K => $f::<BlockQ2K>,
            TensorType::Q3K => $f::<BlockQ3K>,
            TensorType::Q4K => $f::<BlockQ4K>,
            TensorType::Q5K => $f::<BlockQ5K>,
            TensorType::Q6K => $f::<BlockQ6K>,
        }
    };
}
pub(crate) use by_type;

/// A 2-D weight matrix (`rows` outputs × `cols` inputs) stored as in the file, inside the mmap.
#[derive(Clone)]
pub struct QTensor {
    pub ttype: TensorType,
    pub rows: usize,
    pub cols: usize,
    storage: Arc<Storage>,
    offset: usize,
    len: usize,
    /// The CPU kernels' repacked copy (`kernels::x8`), made on first use, shared by clones.
    x8: Arc<std::sync::OnceLock<Option<Box<[u8]>>>>,
}

impl QTensor {
    pub fn new(
        ttype: TensorType,
        rows: usize,
        cols: usize,
        storage: Arc<Storage>,
        offset: usize,
        len: usize,
    ) -> Result<Self> {
        let need = ttype.bytes_for((rows * cols) as u64);
        if need != Some(len as u64) || offset + len > storage.len() {
            return Err(Error::Model(format!(
                "tensor of {rows}x{cols} {} has {len} bytes",
                ttype.name()
            )));
        }
        let align = match ttype {
            TensorType::F32
            | TensorType::Q2K
            | TensorType::Q3K
            | TensorType::Q4K
            | TensorType::Q5K
            | TensorType::Q6K => 4,
            _ => 2,
        };
        if !(storage.as_ptr() as usize + offset).is_multiple_of(align) {
            return Err(Error::Model(format!(
                "tensor data at offset {offset} is not {align}-byte aligned"
            )));
        }
        Ok(QTensor {
            ttype,
            rows,
            cols,
            storage,
            offset,
            len,
            x8: Default::default(),
        })
    }

    /// Rows `r0..r0 + n` as a matrix of their own (one expert of a stacked expert tensor).
    pub fn row_range(&self, r0: usize, n: usize) -> Result<QTensor> {
        if r0 + n > self.rows || n == 0 {
            return Err(Error::Model(format!(
                "rows {r0}..{} of a {}-row tensor",
                r0 + n,
                self.rows
            )));
        }
        let rb = self.row_bytes();
        QTensor::new(
            self.ttype,
            n,
            self.cols,
            self.storage.clone(),
            self.offset + r0 * rb,
            n * rb,
        )
    }

    /// The repacked copy, made by `make` the first time (None: this tensor is not repacked).
    pub(crate) fn repacked(
        &self,
        make: impl FnOnce(&QTensor) -> Option<Box<[u8]>>,
    ) -> Option<&[u8]> {
        self.x8.get_or_init(|| make(self)).as_deref()
    }

    /// Give the mapped file pages of bytes `from..to` of this tensor back to the kernel (after a
    /// repacked copy replaced them): clean file pages, read again from the file if anything touches
    /// them later.
    pub(crate) fn release_pages(&self, from: usize, to: usize) {
        if let Storage::Mmap(m) = &*self.storage {
            let page = 4096usize;
            let start = m.as_ptr() as usize + self.offset;
            let (a, b) = (
                (start + from).div_ceil(page) * page,
                (start + to.min(self.len)) / page * page,
            );
            if b > a {
                // SAFETY: a range of whole pages inside the read-only private file mapping; the
                // pages stay mapped and are re-read from the file on the next access.
                // MADV_RANDOM: a later read of one row (a tied embedding's lookup) brings in its
                // page, not the kernel's 128 KiB read-ahead around it.
                unsafe {
                    libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_DONTNEED);
                    libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_RANDOM);
                }
            }
        }
    }

    pub fn data(&self) -> &[u8] {
        &self.storage[self.offset..self.offset + self.len]
    }

    pub fn row_bytes(&self) -> usize {
        self.len / self.rows
    }

    pub fn bytes(&self) -> usize {
        self.len
    }

    /// Dequantize row `r` into `out` (len = cols).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        // From the repacked copy when there is one: the mapped pages were given back.
        if let Some(Some(g)) = self.x8.get() {
            use crate::kernels::x8::{dequantize_row, Packed};
            if let Some(p) = Packed::of(self.ttype) {
                return dequantize_row(p, g, self.cols / p.block_values(), r, out);
            }
        }
        let rb = self.row_bytes();
        let row = &self.data()[r * rb..(r + 1) * rb];
        fn deq<T: GgmlType>(row: &[u8], out: &mut [f32]) {
            T::to_float(cast::<T>(row), out)
        }
        match self.ttype {
            // Own code for the Q4_K_M types: candle's K-quant to_float allocates on every call.
            TensorType::Q4K => dequantize_q4k(row, out),
            TensorType::Q6K => dequantize_q6k(row, out),
            t => by_type!(t, deq)(row, out),
        }
    }
}

fn f16_le(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// Q4_K blocks (d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles) → f32, as ggml's
/// `dequantize_row_q4_K`.
fn dequantize_q4k(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(144).zip(out.chunks_exact_mut(256)) {
        let (d, dmin) = (f16_le(b, 0), f16_le(b, 2));
        let sc = &b[4..16];
        let scale_min = |j: usize| -> (f32, f32) {
            if j < 4 {
                ((sc[j] & 63) as f32, (sc[j + 4] & 63) as f32)
            } else {
                (
                    ((sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4)) as f32,
                    ((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)) as f32,
                )
            }
        };
        for g in 0..4 {
            let q = &b[16 + 32 * g..16 + 32 * (g + 1)];
            let (s1, m1) = scale_min(2 * g);
            let (s2, m2) = scale_min(2 * g + 1);
            let y = &mut y[64 * g..64 * (g + 1)];
            for l in 0..32 {
                y[l] = d * s1 * (q[l] & 0xF) as f32 - dmin * m1;
                y[l + 32] = d * s2 * (q[l] >> 4) as f32 - dmin * m2;
            }
        }
    }
}

/// Q6_K blocks (128 bytes low nibbles, 64 bytes high bits, 16 int8 scales, d) → f32, as ggml's
/// `dequantize_row_q6_K`.
fn dequantize_q6k(row: &[u8], out: &mut [f32]) {
    for (b, y) in row.chunks_exact(210).zip(out.chunks_exact_mut(256)) {
        let d = f16_le(b, 208);
        for h in 0..2 {
            let ql = &b[64 * h..64 * h + 64];
            let qh = &b[128 + 32 * h..128 + 32 * h + 32];
            let sc = &b[192 + 8 * h..192 + 8 * h + 8];
            let y = &mut y[128 * h..128 * (h + 1)];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
            }
        }
    }
}

/// Quantize f32 values (whole blocks) to `t`'s bytes, as stored in GGUF (tests, `mens synth`, benches).
pub fn quantize(t: TensorType, x: &[f32]) -> Vec<u8> {
    fn q<T: GgmlType>(x: &[f32]) -> Vec<u8> {
        let nb = x.len() / T::BLCK_SIZE;
        let mut blocks = vec![T::zeros(); nb];
        T::from_float(x, &mut blocks);
        // SAFETY: plain-old-data blocks viewed as bytes.
        unsafe {
            std::slice::from_raw_parts(blocks.as_ptr() as *const u8, nb * std::mem::size_of::<T>())
                .to_vec()
        }
    }
    by_type!(t, q)(x)
}

/// Reinterpret bytes as a slice of blocks. Callers guarantee length is a whole number of blocks and
/// alignment (checked in `QTensor::new` and by `Vec` allocation for activations).
#[inline]
pub(crate) fn cast<T>(bytes: &[u8]) -> &[T] {
    debug_assert_eq!(bytes.len() % std::mem::size_of::<T>(), 0);
    debug_assert_eq!(bytes.as_ptr() as usize % std::mem::align_of::<T>(), 0);
    // SAFETY: T is a plain-old-data block type (repr(C), no invalid bit patterns), length and alignment as above.
    unsafe {
        std::slice::from_raw_parts(
            bytes.as_ptr() as *const T,
            bytes.len() / std::mem::size_of::<T>(),
        )
    }
}
