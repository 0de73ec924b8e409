//! One layer's K or V cache as rows of one head's values (head-major: row `h * cap + pos`), stored as
//! f16 or as Q8_0 / Q4_0 blocks (`KvType`): writing a row, reading it back as f32, and the f16 view
//! the f16 attention kernel reads.

use super::act_quant;
use super::ops::MAX_HEAD_DIM;
use crate::model::KvType;
use candle_core::quantized::k_quants::{BlockQ4_0, GgmlType};
use half::f16;
use half::slice::HalfFloatSliceExt;

/// Rows of `row` bytes each (`t.row_bytes(head_dim)`), read-only.
#[derive(Clone, Copy)]
pub struct KvRows<'a> {
    pub t: KvType,
    pub data: &'a [u8],
    pub row: usize,
}

/// The same, writable.
pub struct KvRowsMut<'a> {
    pub t: KvType,
    pub data: &'a mut [u8],
    pub row: usize,
}

/// `data` as f16 values (the backing store is u16-aligned).
fn f16s(data: &[u8]) -> &[f16] {
    assert!((data.as_ptr() as usize).is_multiple_of(2) && data.len().is_multiple_of(2));
    // SAFETY: aligned and sized as asserted; every bit pattern is an f16.
    unsafe { std::slice::from_raw_parts(data.as_ptr() as *const f16, data.len() / 2) }
}

fn f16s_mut(data: &mut [u8]) -> &mut [f16] {
    assert!((data.as_ptr() as usize).is_multiple_of(2) && data.len().is_multiple_of(2));
    // SAFETY: as `f16s`, and the borrow is unique.
    unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr() as *mut f16, data.len() / 2) }
}

impl<'a> KvRows<'a> {
    /// Rows `r0..r0 + n`.
    pub fn rows(self, r0: usize, n: usize) -> KvRows<'a> {
        KvRows {
            data: &self.data[r0 * self.row..(r0 + n) * self.row],
            ..self
        }
    }
    /// The f16 values (for `KvType::F16`).
    pub fn f16(self) -> &'a [f16] {
        assert_eq!(self.t, KvType::F16);
        f16s(self.data)
    }
    /// Values in a row (the head dimension).
    pub fn row_len(self) -> usize {
        match self.t {
            KvType::F16 => self.row / 2,
            KvType::Q8_0 => self.row / 34 * 32,
            KvType::Q4_0 => self.row / 18 * 32,
        }
    }
    /// Row `r`'s bytes.
    pub fn row_bytes(self, r: usize) -> &'a [u8] {
        &self.data[r * self.row..(r + 1) * self.row]
    }
    /// Row `r` as f32 into `out` (its length is the head dimension): the values stored.
    pub fn load(self, r: usize, out: &mut [f32]) {
        load(self.t, self.row_bytes(r), out);
        if self.t.rotated() {
            hadamard32(out);
        }
    }
}

impl KvRowsMut<'_> {
    pub fn as_rows(&self) -> KvRows<'_> {
        KvRows {
            t: self.t,
            data: self.data,
            row: self.row,
        }
    }
    /// Write `x` (one head's values, or any multiple of 32) as row `r`; a block type's blocks
    /// rotated first (`hadamard32`).
    pub fn store(&mut self, r: usize, x: &[f32]) {
        let d = &mut self.data[r * self.row..(r + 1) * self.row];
        if !self.t.rotated() {
            return f16s_mut(d).convert_from_f32_slice(x);
        }
        let per = self.t.row_bytes(MAX_HEAD_DIM);
        let mut rot = [0f32; MAX_HEAD_DIM];
        for (x, d) in x.chunks(MAX_HEAD_DIM).zip(d.chunks_mut(per)) {
            let rot = &mut rot[..x.len()];
            rot.copy_from_slice(x);
            hadamard32(rot);
            match self.t {
                KvType::F16 => unreachable!("f16 rows are not rotated"),
                KvType::Q8_0 => act_quant::q8_0_ggml(rot, d),
                KvType::Q4_0 => {
                    // SAFETY: `d` holds whole 18-byte blocks at an even address (BlockQ4_0: align 2).
                    let b = unsafe {
                        std::slice::from_raw_parts_mut(
                            d.as_mut_ptr() as *mut BlockQ4_0,
                            d.len() / 18,
                        )
                    };
                    BlockQ4_0::from_float(rot, b)
                }
            }
        }
    }
    /// Copy rows `src..src + n` to `dst..dst + n` (any overlap).
    pub fn copy_rows(&mut self, src: usize, dst: usize, n: usize) {
        let r = self.row;
        self.data.copy_within(src * r..(src + n) * r, dst * r);
    }
}

/// The normalised Walsh–Hadamard transform of each 32-value block of `x`, in place. It is
/// orthogonal and its own inverse, so dot products survive it; applied to a block before it is
/// quantized, it spreads one large value (Qwen's K carries a few channels far above the rest) over
/// the whole block, so the other values keep their precision. A quantized cache stores its rows
/// rotated; attention rotates Q the same way and its output back.
#[inline(always)]
pub fn hadamard32(x: &mut [f32]) {
    const NORM: f32 = 0.176_776_69; // 1/sqrt(32)
    for b in x.chunks_exact_mut(32) {
        let mut h = 1;
        while h < 32 {
            for i in (0..32).step_by(2 * h) {
                for j in i..i + h {
                    let (a, c) = (b[j], b[j + h]);
                    b[j] = a + c;
                    b[j + h] = a - c;
                }
            }
            h *= 2;
        }
        for v in b.iter_mut() {
            *v *= NORM;
        }
    }
}

/// One row's values as f32, as stored (a quantized row still rotated): ggml's dequantization (d · q; Q4_0: d · (nibble − 8), low nibbles
/// first). Inlined, so that attention's AVX2 build vectorises it.
#[inline(always)]
pub fn load(t: KvType, bytes: &[u8], out: &mut [f32]) {
    match t {
        KvType::F16 => f16s(bytes).convert_to_f32_slice(out),
        KvType::Q8_0 => {
            for (b, o) in bytes.chunks_exact(34).zip(out.chunks_exact_mut(32)) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                for (o, &q) in o.iter_mut().zip(&b[2..]) {
                    *o = d * (q as i8) as f32;
                }
            }
        }
        KvType::Q4_0 => {
            for (b, o) in bytes.chunks_exact(18).zip(out.chunks_exact_mut(32)) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                let (lo, hi) = o.split_at_mut(16);
                for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(&b[2..]) {
                    *l = d * ((q & 0x0F) as i32 - 8) as f32;
                    *h = d * ((q >> 4) as i32 - 8) as f32;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::cast;
    use candle_core::quantized::k_quants::BlockQ8_0;

    /// A row's bytes are ggml's blocks of the rotated values (the raw load is candle's
    /// dequantization of them); reading a row back rotates them again and gives the values
    /// written within the blocks' rounding (per block, an L2 error of at most half a step per
    /// value: the rotation keeps lengths).
    #[test]
    fn rows_round_trip_through_the_rotation() {
        let x: Vec<f32> = (0..128)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        for t in [KvType::F16, KvType::Q8_0, KvType::Q4_0] {
            let row = t.row_bytes(128);
            let mut buf = vec![0u16; row];
            // SAFETY: the u16s as bytes.
            let data =
                unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut u8, row * 2) };
            let mut rows = KvRowsMut { t, data, row };
            rows.store(1, &x);
            let b = rows.as_rows().row_bytes(1);
            let mut raw = vec![0f32; 128];
            load(t, b, &mut raw);
            let mut want = vec![0f32; 128];
            match t {
                KvType::F16 => f16s(b).convert_to_f32_slice(&mut want),
                KvType::Q8_0 => BlockQ8_0::to_float(cast::<BlockQ8_0>(b), &mut want),
                KvType::Q4_0 => BlockQ4_0::to_float(cast::<BlockQ4_0>(b), &mut want),
            }
            assert_eq!(raw, want, "{t:?}");
            let mut got = vec![0f32; 128];
            rows.as_rows().load(1, &mut got);
            if t.rotated() {
                hadamard32(&mut want);
            }
            assert_eq!(got, want, "{t:?}");
            for blk in 0..4 {
                let r = blk * 32..blk * 32 + 32;
                let e2: f32 = x[r.clone()]
                    .iter()
                    .zip(&got[r])
                    .map(|(a, b)| (a - b).powi(2))
                    .sum();
                // The block's step: its stored scale (Q4_0 clips one end, a whole step there).
                let step = match t {
                    KvType::F16 => 0.01,
                    KvType::Q8_0 => f16::from_le_bytes([b[blk * 34], b[blk * 34 + 1]]).to_f32(),
                    KvType::Q4_0 => {
                        2.0 * f16::from_le_bytes([b[blk * 18], b[blk * 18 + 1]])
                            .to_f32()
                            .abs()
                    }
                };
                assert!(
                    e2.sqrt() <= step / 2.0 * 32f32.sqrt() * 1.001,
                    "{t:?} block {blk}: L2 error {}",
                    e2.sqrt()
                );
            }
        }
    }

    /// The transform is the normalised Hadamard matrix (H[i][j] = (-1)^popcount(i & j) / sqrt(32)),
    /// per block, and its own inverse.
    #[test]
    fn hadamard32_is_the_normalised_hadamard_matrix() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 29 % 53) as f32 - 26.0) / 5.0)
            .collect();
        let mut y = x.clone();
        hadamard32(&mut y);
        for blk in 0..2 {
            for i in 0..32usize {
                let want: f64 = (0..32)
                    .map(|j| {
                        let sign = if (i & j).count_ones().is_multiple_of(2) {
                            1.0
                        } else {
                            -1.0
                        };
                        sign * x[blk * 32 + j] as f64
                    })
                    .sum::<f64>()
                    / 32f64.sqrt();
                assert!(
                    (y[blk * 32 + i] as f64 - want).abs() < 1e-5,
                    "block {blk}, value {i}"
                );
            }
        }
        hadamard32(&mut y);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 1e-5);
        }
    }

    /// What the rotation is for: a block with one large value (as Qwen's K has) keeps the other
    /// values' precision. Without it, q8_0's step is the large value / 127 for all 32; with it,
    /// the L2 error of the block falls several times.
    #[test]
    fn the_rotation_keeps_precision_beside_a_large_value() {
        let mut x: Vec<f32> = (0..32)
            .map(|i| ((i * 13 % 31) as f32 - 15.0) / 15.0)
            .collect();
        x[5] = 40.0;
        let err = |rotate: bool| {
            let mut y = x.clone();
            if rotate {
                hadamard32(&mut y);
            }
            let mut b = [0u8; 34];
            act_quant::q8_0_ggml(&y, &mut b);
            load(KvType::Q8_0, &b, &mut y);
            if rotate {
                hadamard32(&mut y);
            }
            x.iter()
                .zip(&y)
                .map(|(a, b)| (a - b).powi(2))
                .sum::<f32>()
                .sqrt()
        };
        let (plain, rotated) = (err(false), err(true));
        assert!(
            rotated * 3.0 < plain,
            "L2 error {rotated} rotated against {plain} plain"
        );
    }
}
