//! Where CPU forward passes spend their time, by section, when `MENS_CPU_PROFILE=1`: the wall time
//! of each section on the calling thread (it waits for the pool's tasks, so a section's time is
//! what the pass waits for). Off, a section costs one load of a cached flag. `mens bench` prints
//! the table at its end.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// The sections of a forward pass.
#[derive(Clone, Copy, Debug)]
pub enum Section {
    Embed,
    Quantize,
    Qkv,
    RopeStore,
    Attention,
    Output,
    Norm,
    GateUp,
    Activation,
    Down,
    Moe,
    LmHead,
}

const NAMES: [&str; 12] = [
    "embedding rows",
    "activation quantization",
    "Q/K/V matmul",
    "bias, RoPE, KV store",
    "attention",
    "attention output matmul",
    "residual + RMS norm",
    "gate/up matmul",
    "SwiGLU/GeGLU",
    "down matmul",
    "MoE FFN",
    "LM head",
];

static NANOS: [AtomicU64; 12] = [const { AtomicU64::new(0) }; 12];
static CALLS: [AtomicU64; 12] = [const { AtomicU64::new(0) }; 12];

/// Whether `MENS_CPU_PROFILE=1`.
pub fn on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MENS_CPU_PROFILE").as_deref() == Ok("1"))
}

/// Times a section until dropped (nothing when profiling is off).
pub struct Timer(Option<(Section, Instant)>);

impl Drop for Timer {
    fn drop(&mut self) {
        if let Some((s, t0)) = self.0 {
            NANOS[s as usize].fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
            CALLS[s as usize].fetch_add(1, Relaxed);
        }
    }
}

/// Start timing `s`.
#[inline]
pub fn time(s: Section) -> Timer {
    Timer(on().then(|| (s, Instant::now())))
}

/// Every section with time recorded: (name, seconds, calls), in pass order.
pub fn report() -> Vec<(&'static str, f64, u64)> {
    (0..NAMES.len())
        .filter(|&i| CALLS[i].load(Relaxed) > 0)
        .map(|i| {
            (
                NAMES[i],
                NANOS[i].load(Relaxed) as f64 * 1e-9,
                CALLS[i].load(Relaxed),
            )
        })
        .collect()
}

/// Forget what was recorded.
pub fn reset() {
    for i in 0..NAMES.len() {
        NANOS[i].store(0, Relaxed);
        CALLS[i].store(0, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_add_only_when_on() {
        reset();
        {
            let _t = time(Section::Embed);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let r = report();
        if on() {
            assert_eq!(r.len(), 1);
            assert!(r[0].1 >= 0.002 && r[0].2 == 1, "{r:?}");
        } else {
            assert!(r.is_empty(), "{r:?}");
        }
    }
}
