// Debug helper: prints a backtrace for each heap allocation made during steady decode steps.
use mens::cpu::{Session, SessionOptions};
use mens::runner::Logits;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
struct A;
static ARMED: AtomicBool = AtomicBool::new(false);
thread_local!(static IN: Cell<bool> = const { Cell::new(false) });
unsafe impl GlobalAlloc for A {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) && !IN.with(|c| c.replace(true)) {
            eprintln!(
                "alloc {} bytes:\n{}",
                l.size(),
                std::backtrace::Backtrace::force_capture()
            );
            IN.with(|c| c.set(false));
        }
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
}
#[global_allocator]
static G: A = A;
fn main() {
    let p = std::env::args().nth(1).unwrap();
    let m = std::sync::Arc::new(mens::model::Model::open(p.as_ref()).unwrap());
    let mut s = Session::new(
        m,
        SessionOptions {
            ctx: 64,
            batch: 64,
            logit_rows: 1,
            ..Default::default()
        },
    )
    .unwrap();
    s.forward(&[1, 2, 3], Logits::Last).unwrap();
    for i in 0..4 {
        if i == 2 {
            ARMED.store(true, Ordering::SeqCst);
        }
        s.forward(&[5], Logits::Last).unwrap();
    }
    ARMED.store(false, Ordering::SeqCst);
}
