//! Micro-benchmark of the quantized matmul kernels: GMAC/s per weight type, one thread and all threads.
//! `cargo run --release --example kernels`
use mens::gguf::{Storage, TensorType};
use mens::kernels::{act_type, matmul, quantize, QTensor, QuantizedInput};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let rows = 4864;
    for &(t, cols) in &[
        (TensorType::Q5_0, 896),
        (TensorType::Q8_0, 896),
        (TensorType::Q4K, 1536),
        (TensorType::Q6K, 1536),
        (TensorType::Q4_1, 576),
    ] {
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| (i * 7919 % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let bytes = quantize(t, &x);
        let len = bytes.len();
        let w = QTensor::new(t, rows, cols, Arc::new(Storage::Bytes(bytes)), 0, len).unwrap();
        for batch in [1usize, 64] {
            let mut input = QuantizedInput::new(batch, cols, &[act_type(t)]);
            input.set(&x[..batch * cols], batch);
            let mut out = vec![0f32; batch * rows];
            let reps = if batch == 1 { 200 } else { 6 };
            let t0 = Instant::now();
            for _ in 0..reps {
                matmul(&[(&w, 0)], &input, &mut out, rows);
            }
            let s = t0.elapsed().as_secs_f64();
            let macs = (rows * cols * batch * reps) as f64;
            println!(
                "{:5} batch {batch:3}: {:6.2} GMAC/s  {:6.2} GB/s of weights",
                t.name(),
                macs / s / 1e9,
                (len * reps) as f64 / s / 1e9
            );
        }
    }
}
