use half::f16;
use mens::kernels::ops::{attention, QkvLayout};
use rand::{Rng, SeedableRng};
use std::time::Instant;
#[test]
fn scratch_attn() {
    mens::kernels::pool::set_threads(2);
    let (nh, nkv, hd, n_layer) = (14usize, 2usize, 64usize, 24usize);
    let l = QkvLayout {
        q_dim: nh * hd,
        kv_dim: nkv * hd,
        head_dim: hd,
    };
    let mut r = rand::rngs::StdRng::seed_from_u64(1);
    let ctx = 1024;
    let kc: Vec<f16> = (0..ctx * l.kv_dim)
        .map(|_| f16::from_f32(r.gen_range(-1.0..1.0)))
        .collect();
    let vc: Vec<f16> = (0..ctx * l.kv_dim)
        .map(|_| f16::from_f32(r.gen_range(-1.0..1.0)))
        .collect();
    let qkv: Vec<f32> = (0..l.q_dim + 2 * l.kv_dim)
        .map(|_| r.gen_range(-1.0..1.0))
        .collect();
    let mut out = vec![0f32; l.q_dim];
    for pos in [16usize, 512] {
        let t0 = Instant::now();
        let reps = 50;
        for _ in 0..reps {
            for _ in 0..n_layer {
                attention(&qkv, 1, &l, nh, nkv, pos, &kc, &vc, &mut out);
            }
        }
        let per_step = t0.elapsed().as_secs_f64() / reps as f64;
        eprintln!(
            "pos {pos}: attention per decode step (24 layers) {:.3} ms",
            per_step * 1e3
        );
    }
}
