//! CPU references for the CUDA kernels (tests compare the two on random inputs).

use crate::weights::QTensor;

/// the kernels' q8 activation format: int8 in blocks of 32, one (d, s) per block,
/// d = max|x| / 127, s = d * sum(q).
pub fn quantize_q8(x: &[f32]) -> (Vec<i8>, Vec<[f32; 2]>) {
    let mut q = vec![0i8; x.len()];
    let mut ds = Vec::with_capacity(x.len() / 32);
    for (b, qb) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let mut sum = 0i32;
        for (v, o) in b.iter().zip(qb.iter_mut()) {
            let r = if d > 0.0 {
                (v / d).round_ties_even() as i32
            } else {
                0
            };
            *o = r as i8;
            sum += r;
        }
        ds.push([d, d * sum as f32]);
    }
    (q, ds)
}

/// y = W · x̂ in f64, where x̂ is the dequantized q8 activation (what the GPU multiplies).
pub fn matvec(w: &QTensor, q: &[i8], ds: &[[f32; 2]]) -> Vec<f32> {
    let mut row = vec![0f32; w.cols];
    (0..w.rows)
        .map(|r| {
            w.dequantize_row(r, &mut row);
            row.iter()
                .enumerate()
                .map(|(i, &a)| a as f64 * ds[i / 32][0] as f64 * q[i] as f64)
                .sum::<f64>() as f32
        })
        .collect()
}

/// RMS norm times weight, as the engine computes it.
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ss = x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ss + eps as f64).sqrt();
    x.iter()
        .zip(w)
        .map(|(v, g)| (*v as f64 * s * *g as f64) as f32)
        .collect()
}

/// ‖a − b‖ / ‖b‖.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-300)).sqrt()
}
