//! Micro-benchmark of decode attention (one query row per head against the KV cache, f16 or q8_0),
//! the part of a decode step that grows with the context: per layer its own cache, read hot (just
//! used) and cold (64 MiB streamed through the caches before each layer, as a layer's weights do in
//! a real step). `cargo run --release --example attention [threads]`
use half::f16;
use mens::kernels::attention::attention;
use mens::kernels::kv::{KvRows, KvRowsMut};
use mens::kernels::ops::QkvLayout;
use mens::model::KvType;
use std::time::Instant;

fn bytes(b: &[u16]) -> &[u8] {
    // SAFETY: u16s viewed as bytes.
    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const u8, b.len() * 2) }
}

fn main() {
    let threads = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2);
    // Query rows a pass (ROWS=8: a verify pass of 8 tokens; the default 1, a decode step).
    let rows: usize = std::env::var("ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    mens::kernels::pool::set_threads(threads);
    // Pseudo-random values in [-0.5, 0.5) (a hash of the index), so that the running max of the
    // scores changes rarely, as in real attention.
    let val = |i: usize| {
        let h = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        ((h >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    };
    let junk = vec![1u8; 64 << 20];
    // (name, layers, heads, kv heads, head dim): the shapes of Qwen2.5-Coder 0.5B and 1.5B.
    for (name, layers, n_head, n_kv, hd) in [("0.5B", 24, 14, 2, 64), ("1.5B", 28, 12, 2, 128)] {
        let l = QkvLayout {
            q_dim: n_head * hd,
            kv_dim: n_kv * hd,
            head_dim: hd,
        };
        let ctx = 2048;
        for t in [KvType::F16, KvType::Q8_0] {
            let rb = t.row_bytes(hd);
            let cache = |seed: usize| -> Vec<Vec<u16>> {
                (0..layers)
                    .map(|li| {
                        let mut buf = vec![0u16; n_kv * ctx * rb / 2];
                        // SAFETY: u16s viewed as bytes.
                        let data = unsafe {
                            std::slice::from_raw_parts_mut(
                                buf.as_mut_ptr() as *mut u8,
                                buf.len() * 2,
                            )
                        };
                        let mut rows = KvRowsMut { t, data, row: rb };
                        let mut x = vec![0f32; hd];
                        for r in 0..n_kv * ctx {
                            for (j, x) in x.iter_mut().enumerate() {
                                *x = val(r * hd + j + li * 1_000_003 + seed);
                            }
                            rows.store(r, &x);
                        }
                        buf
                    })
                    .collect()
            };
            fn view(b: &[u16], t: KvType, row: usize) -> KvRows<'_> {
                KvRows {
                    t,
                    data: bytes(b),
                    row,
                }
            }
            let (kc, vc) = (cache(0), cache(7));
            let qkv: Vec<f32> = (0..rows * (l.q_dim + 2 * l.kv_dim))
                .map(|i| f16::from_f32(val(i + 11)).to_f32())
                .collect();
            let mut out = vec![0f32; rows * l.q_dim];
            for n in [16usize, 512, 2048] {
                for cold in [false, true] {
                    let reps = 10;
                    let mut s = 0.0;
                    for _ in 0..reps {
                        for li in 0..layers {
                            if cold {
                                // Both threads stream half of the junk each (so the pool's workers stay
                                // awake, as between the kernels of a real step).
                                let half = junk.len() / 2;
                                mens::kernels::pool::pool().run(2, &|i| {
                                    let x: u64 = junk[i * half..(i + 1) * half]
                                        .iter()
                                        .step_by(64)
                                        .map(|&b| b as u64)
                                        .sum();
                                    std::hint::black_box(x);
                                });
                            }
                            let t0 = Instant::now();
                            attention(
                                &qkv,
                                rows,
                                &l,
                                n_head,
                                n_kv,
                                n - rows,
                                view(&kc[li], t, rb),
                                view(&vc[li], t, rb),
                                ctx,
                                &mut out,
                            );
                            s += t0.elapsed().as_secs_f64();
                        }
                    }
                    let s = s / reps as f64;
                    println!(
                    "{name} {} {n:5} keys, {}: {:6.3} ms per pass of {rows} rows ({layers} layers), {:5.1} ns per head and key",
                    t.name(),
                    if cold { "cold" } else { "hot " },
                    s * 1e3,
                    s * 1e9 * threads as f64 / (rows * layers * n_head * n) as f64
                );
                }
            }
        }
    }
}
