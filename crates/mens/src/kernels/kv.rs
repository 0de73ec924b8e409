//! One layer's K or V cache as rows of one head's values (head-major: row `h * cap + pos`), stored as
//! f16 or as Q8_0 / Q4_0 blocks (`KvType`): writing a row, reading it back as f32, and the f16 view
//! the f16 attention kernel reads.

use super::act_quant;
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
    assert!(data.as_ptr() as usize % 2 == 0 && data.len() % 2 == 0);
    // SAFETY: aligned and sized as asserted; every bit pattern is an f16.
    unsafe { std::slice::from_raw_parts(data.as_ptr() as *const f16, data.len() / 2) }
}

fn f16s_mut(data: &mut [u8]) -> &mut [f16] {
    assert!(data.as_ptr() as usize % 2 == 0 && data.len() % 2 == 0);
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
    /// Row `r` as f32 into `out` (its length is the head dimension).
    pub fn load(self, r: usize, out: &mut [f32]) {
        load(self.t, self.row_bytes(r), out)
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
    /// Write `x` (one head's values) as row `r`.
    pub fn store(&mut self, r: usize, x: &[f32]) {
        let d = &mut self.data[r * self.row..(r + 1) * self.row];
        match self.t {
            KvType::F16 => f16s_mut(d).convert_from_f32_slice(x),
            KvType::Q8_0 => act_quant::q8_0_ggml(x, d),
            KvType::Q4_0 => {
                // SAFETY: `d` holds whole 18-byte blocks at an even address (BlockQ4_0: align 2).
                let b = unsafe {
                    std::slice::from_raw_parts_mut(d.as_mut_ptr() as *mut BlockQ4_0, d.len() / 18)
                };
                BlockQ4_0::from_float(x, b)
            }
        }
    }
    /// Copy rows `src..src + n` to `dst..dst + n` (any overlap).
    pub fn copy_rows(&mut self, src: usize, dst: usize, n: usize) {
        let r = self.row;
        self.data.copy_within(src * r..(src + n) * r, dst * r);
    }
}

/// One row's values as f32: ggml's dequantization (d · q; Q4_0: d · (nibble − 8), low nibbles
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

    /// Writing then reading a row gives candle's dequantization of the blocks written.
    #[test]
    fn rows_round_trip_as_candle_dequantizes() {
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
            let mut got = vec![0f32; 128];
            rows.as_rows().load(1, &mut got);
            let mut want = vec![0f32; 128];
            let b = rows.as_rows().row_bytes(1);
            match t {
                KvType::F16 => f16s(b).convert_to_f32_slice(&mut want),
                KvType::Q8_0 => BlockQ8_0::to_float(cast::<BlockQ8_0>(b), &mut want),
                KvType::Q4_0 => BlockQ4_0::to_float(cast::<BlockQ4_0>(b), &mut want),
            }
            assert_eq!(got, want, "{t:?}");
            let err = x
                .iter()
                .zip(&got)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            // Within a step of the block's scale (|x| ≤ 50/7; Q4_0 clips one end at 7 steps).
            let step = match t {
                KvType::F16 => 0.01,
                KvType::Q8_0 => 50.0 / 7.0 / 127.0,
                KvType::Q4_0 => 50.0 / 7.0 / 8.0,
            };
            assert!(err <= step * 1.001, "{t:?}: error {err}");
        }
    }
}
