//! Weight layouts for the GPU, made at upload: Q4_K, Q6_K, Q5_0 and Q8_0 with each 32-value
//! chunk's bytes contiguous and aligned, so that a warp's lanes, one chunk each, read consecutive
//! 16-byte words (the GGUF order spreads a Q4_K chunk's nibbles over 32 bytes it shares with its
//! neighbour, and Q6_K's 210-byte superblocks, Q5_0's 22-byte and Q8_0's 34-byte blocks allow only
//! 2-byte loads). Same values, same scales: the kernels' bits do not change (kernels/matvec.cu,
//! `Raw<T_Q4_KR>` and its siblings, read these layouts).
//!
//! A chunk's 32 four-bit values (Q4_K's nibbles, Q6_K's low bits) take 16 bytes: byte b holds
//! value b in its low nibble and value 16 + b in its high one.
//! - Q4_KR: superblocks of 144 bytes: the GGUF header (d, dmin, 12 bytes of scales), then
//!   chunks 0..7.
//! - Q6_KR: a row of n chunks in four parts: low bits (16 n bytes), high bits (8 n: byte 4j + k
//!   of a chunk holds, in bits 2m..2m+1, value 4(4j + m) + k's two high bits), the chunks' int8
//!   scales (2 n: those of values 0..15 and 16..31), each superblock's f16 d (n / 4); the row is
//!   padded to 16 bytes.
//! - Q5_0R: a row of n chunks in three parts: the GGUF blocks' 16 bytes of low nibbles (16 n),
//!   their 32 high bits (4 n), their f16 scales (2 n); padded to 16 bytes.
//! - Q8_0R: the blocks' 32 quants (32 n), then their f16 scales (2 n); padded to 16 bytes.

use crate::gguf::TensorType;
use crate::weights::QTensor;

/// The kernels' type ids of the repacked layouts (100 + the GGUF type's id; kernels/common.cuh).
pub const Q4_KR: u32 = 112;
pub const Q6_KR: u32 = 114;
pub const Q5_0R: u32 = 106;
pub const Q8_0R: u32 = 108;

/// A tensor's bytes in a GPU layout.
pub struct Repacked {
    pub data: Vec<u8>,
    pub row_bytes: usize,
    pub ty: u32,
}

/// Writes one GGUF row (first argument) in the GPU layout (second).
type RowPacker = fn(&[u8], &mut [u8]);

/// Row bytes, kernel type id and row repacker of `t`'s GPU layout for rows of `cols` values, where
/// it has one (rows of whole blocks only; the GGUF reader checks that too).
fn layout(t: TensorType, cols: usize) -> Option<(usize, u32, RowPacker)> {
    let whole = |n: usize| cols > 0 && cols.is_multiple_of(n);
    match t {
        TensorType::Q4K if whole(256) => Some((cols / 256 * 144, Q4_KR, q4k_row)),
        TensorType::Q6K if whole(256) => {
            Some(((cols / 256 * 210).next_multiple_of(16), Q6_KR, q6k_row))
        }
        TensorType::Q5_0 if whole(32) => {
            Some(((cols / 32 * 22).next_multiple_of(16), Q5_0R, q5_0_row))
        }
        TensorType::Q8_0 if whole(32) => {
            Some(((cols / 32 * 34).next_multiple_of(16), Q8_0R, q8_0_row))
        }
        _ => None,
    }
}

/// Bytes `t` takes on the GPU beyond its GGUF bytes (its layout's rows padded to 16 bytes).
pub fn padding(t: &QTensor) -> u64 {
    layout(t.ttype, t.cols).map_or(0, |(rb, _, _)| ((rb - t.row_bytes()) * t.rows) as u64)
}

/// `t` in its GPU layout, or None where it keeps the GGUF one.
pub fn repack(t: &QTensor) -> Option<Repacked> {
    let (out_rb, ty, pack) = layout(t.ttype, t.cols)?;
    let (src, in_rb) = (t.data(), t.row_bytes());
    let mut data = vec![0u8; out_rb * t.rows];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = t.rows.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (i, out) in data.chunks_mut(per * out_rb).enumerate() {
            let src = &src[i * per * in_rb..];
            s.spawn(move || {
                for (r, o) in out.chunks_exact_mut(out_rb).enumerate() {
                    pack(&src[r * in_rb..(r + 1) * in_rb], o);
                }
            });
        }
    });
    Some(Repacked {
        data,
        row_bytes: out_rb,
        ty,
    })
}

/// 32 four-bit values → 16 bytes (value b low, 16 + b high).
fn pack_nibbles(v: &[u8; 32], out: &mut [u8]) {
    for b in 0..16 {
        out[b] = (v[b] & 15) | (v[16 + b] & 15) << 4;
    }
}

fn q4k_row(row: &[u8], out: &mut [u8]) {
    for (b, o) in row.chunks_exact(144).zip(out.chunks_exact_mut(144)) {
        o[..16].copy_from_slice(&b[..16]);
        for sub in 0..8 {
            let (qs, shift) = (&b[16 + 32 * (sub >> 1)..], 4 * (sub & 1));
            let v: [u8; 32] = std::array::from_fn(|l| (qs[l] >> shift) & 15);
            pack_nibbles(&v, &mut o[16 + 16 * sub..]);
        }
    }
}

fn q6k_row(row: &[u8], out: &mut [u8]) {
    let n = row.len() / 210 * 8;
    for (sb, b) in row.chunks_exact(210).enumerate() {
        for sub in 0..8 {
            let (c, h, g) = (8 * sb + sub, sub >> 2, sub & 3);
            let ql = &b[64 * h + 32 * (g & 1)..];
            let qh = &b[128 + 32 * h..];
            let lo: [u8; 32] = std::array::from_fn(|l| (ql[l] >> (4 * (g >> 1))) & 15);
            let hi: [u8; 32] = std::array::from_fn(|l| (qh[l] >> (2 * g)) & 3);
            pack_nibbles(&lo, &mut out[16 * c..]);
            for j in 0..2 {
                for k in 0..4 {
                    out[16 * n + 8 * c + 4 * j + k] =
                        (0..4).fold(0, |x, m| x | hi[4 * (4 * j + m) + k] << (2 * m));
                }
            }
            out[24 * n + 2 * c..24 * n + 2 * c + 2]
                .copy_from_slice(&b[192 + 2 * sub..194 + 2 * sub]);
        }
        out[26 * n + 2 * sb..26 * n + 2 * sb + 2].copy_from_slice(&b[208..210]);
    }
}

fn q5_0_row(row: &[u8], out: &mut [u8]) {
    let n = row.len() / 22;
    for (c, b) in row.chunks_exact(22).enumerate() {
        out[16 * c..16 * c + 16].copy_from_slice(&b[6..22]);
        out[16 * n + 4 * c..16 * n + 4 * c + 4].copy_from_slice(&b[2..6]);
        out[20 * n + 2 * c..20 * n + 2 * c + 2].copy_from_slice(&b[..2]);
    }
}

fn q8_0_row(row: &[u8], out: &mut [u8]) {
    let n = row.len() / 34;
    for (c, b) in row.chunks_exact(34).enumerate() {
        out[32 * c..32 * c + 32].copy_from_slice(&b[2..34]);
        out[32 * n + 2 * c..32 * n + 2 * c + 2].copy_from_slice(&b[..2]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Storage;
    use crate::weights::quantize;
    use half::f16;
    use std::sync::Arc;

    fn tensor(t: TensorType, rows: usize, cols: usize, bytes: Vec<u8>) -> QTensor {
        let len = bytes.len();
        QTensor::new(t, rows, cols, Arc::new(Storage::Bytes(bytes)), 0, len).unwrap()
    }

    /// Chunk c of a repacked row as the kernels unpack it (`raw_unpack`): 32 signed values and
    /// the float scales of values 0..15 and 16..31 (value = scale · q − min).
    fn unpack(ty: u32, row: &[u8], c: usize, n: usize) -> ([i32; 32], [f32; 2], [f32; 2]) {
        let f = |i: usize| f16::from_bits(u16::from_le_bytes([row[i], row[i + 1]])).to_f32();
        let nib = |base: usize, i: usize| (row[base + i % 16] >> (4 * (i / 16))) as i32 & 15;
        if ty == Q4_KR {
            let (b, sub) = (c / 8 * 144, c % 8);
            let h = &row[b + 4..b + 16];
            let (sc, m) = if sub < 4 {
                (h[sub] & 63, h[sub + 4] & 63)
            } else {
                (
                    (h[sub + 4] & 15) | (h[sub - 4] >> 6) << 4,
                    (h[sub + 4] >> 4) | (h[sub] >> 6) << 4,
                )
            };
            let (d, dmin) = (f(b) * sc as f32, f(b + 2) * m as f32);
            (
                std::array::from_fn(|i| nib(b + 16 + 16 * sub, i)),
                [d; 2],
                [dmin; 2],
            )
        } else if ty == Q5_0R {
            let qh =
                u32::from_le_bytes(row[16 * n + 4 * c..16 * n + 4 * c + 4].try_into().unwrap());
            let q = std::array::from_fn(|i| (nib(16 * c, i) | ((qh >> i) as i32 & 1) << 4) - 16);
            let d = f(20 * n + 2 * c);
            (q, [d; 2], [0.0; 2])
        } else if ty == Q8_0R {
            let q = std::array::from_fn(|i| row[32 * c + i] as i8 as i32);
            let d = f(32 * n + 2 * c);
            (q, [d; 2], [0.0; 2])
        } else {
            let q = std::array::from_fn(|i| {
                let (j, m, k) = (i / 16, (i / 4) % 4, i % 4);
                let hi = (row[16 * n + 8 * c + 4 * j + k] >> (2 * m)) as i32 & 3;
                (nib(16 * c, i) | hi << 4) - 32
            });
            let d = f(26 * n + 2 * (c / 8));
            let s = |i: usize| d * row[24 * n + 2 * c + i] as i8 as f32;
            (q, [s(0), s(1)], [0.0; 2])
        }
    }

    #[test]
    fn repacked_rows_hold_the_gguf_values() {
        // Three rows of 768 values (3 superblocks: a Q6_K row of 630 bytes, padded to 640), and
        // of 896 (28 blocks of 32, no whole superblocks: a Q5_0 row of 616 bytes, padded to 624).
        let cases = [
            (TensorType::Q4K, 768),
            (TensorType::Q6K, 768),
            (TensorType::Q5_0, 768),
            (TensorType::Q5_0, 896),
            (TensorType::Q8_0, 896),
        ];
        for (t, cols) in cases {
            let rows = 3;
            let x: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * (1.0 + (i % 97) as f32 / 8.0))
                .collect();
            let q = tensor(t, rows, cols, quantize(t, &x));
            let r = repack(&q).unwrap();
            assert_eq!(r.row_bytes % 16, 0);
            assert_eq!(padding(&q) as usize, r.data.len() - q.data().len());
            assert_eq!(r.data.len(), r.row_bytes * rows);
            let mut want = vec![0f32; cols];
            for row in 0..rows {
                q.dequantize_row(row, &mut want);
                let bytes = &r.data[row * r.row_bytes..(row + 1) * r.row_bytes];
                for c in 0..cols / 32 {
                    let (v, s, m) = unpack(r.ty, bytes, c, cols / 32);
                    for i in 0..32 {
                        let got = s[i / 16] * v[i] as f32 - m[i / 16];
                        assert_eq!(
                            got,
                            want[32 * c + i],
                            "{t:?} row {row} value {}",
                            32 * c + i
                        );
                    }
                }
            }
        }
        // Other types keep their GGUF layout.
        let x: Vec<f32> = (0..64).map(|i| i as f32 / 64.0 - 0.5).collect();
        let q = tensor(TensorType::Q4_0, 1, 64, quantize(TensorType::Q4_0, &x));
        assert!(repack(&q).is_none());
    }

    /// How fast the upload's repacking runs (a measurement, not a check): every Q4_K and Q6_K
    /// matrix of `MODEL` (a GGUF path): `MODEL=… cargo test --release -p mens --lib repack_speed
    /// -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn repack_speed() {
        let Ok(path) = std::env::var("MODEL") else {
            return;
        };
        let m = crate::model::Model::open(std::path::Path::new(&path)).unwrap();
        let mut mats: Vec<&QTensor> = vec![&m.embedding, &m.output];
        for l in &m.layers {
            mats.extend([&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]);
        }
        let t = std::time::Instant::now();
        let bytes: usize = mats
            .iter()
            .filter_map(|q| repack(q))
            .map(|r| r.data.len())
            .sum();
        let s = t.elapsed().as_secs_f64();
        eprintln!(
            "repacked {} MB in {:.3} s: {:.0} MB/s",
            bytes >> 20,
            s,
            bytes as f64 / s / 1e6
        );
    }
}
