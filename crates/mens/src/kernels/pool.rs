//! The thread pool the kernels run on. Hand-written rather than rayon because a decode step is ~100
//! short parallel regions (a few hundred microseconds each) and rayon's workers go to sleep between
//! them: waking them through futexes took ~8% of decode time (measured with perf). Here the calling
//! thread takes a share of the work, and workers spin for a bounded time (`SPIN`) before parking, so
//! back-to-back regions start at once, while an idle or oversubscribed machine is not burned.

use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_micros(200);

type Job<'a> = dyn Fn(usize) + Sync + 'a;

struct Shared {
    /// (generation << 32) | next task index: a claim is a compare-exchange within one generation.
    state: AtomicU64,
    /// (generation << 32) | number of tasks: tagged, so that a worker still in the previous
    /// generation never reads the next job's task count as its own.
    tasks: AtomicU64,
    done: AtomicUsize,
    /// The current job, `*const &Job` (valid while its generation runs).
    job: AtomicPtr<()>,
    sleepers: AtomicUsize,
    /// Workers that have started (`Pool::new` waits for all, so no start-up work happens later).
    started: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

pub struct Pool {
    shared: Arc<Shared>,
    threads: usize,
    /// One job at a time (several sessions may share the pool).
    running: Mutex<()>,
}

impl Shared {
    /// Claim and run tasks of generation `gen` until none is left.
    fn work(&self, gen: u64) {
        loop {
            let s = self.state.load(SeqCst);
            if s >> 32 != gen {
                return;
            }
            let i = s & 0xFFFF_FFFF;
            let t = self.tasks.load(SeqCst);
            if t >> 32 != gen || i >= t & 0xFFFF_FFFF {
                return;
            }
            let i = i as usize;
            if self
                .state
                .compare_exchange(s, s + 1, SeqCst, SeqCst)
                .is_ok()
            {
                // SAFETY: a successful claim in generation `gen` means `run` for `gen` is still waiting
                // for this task, so the job it published is alive.
                let job = unsafe { &*(self.job.load(SeqCst) as *const &Job) };
                job(i);
                self.done.fetch_add(1, SeqCst);
            }
        }
    }
}

fn worker(shared: Arc<Shared>) {
    let mut seen = 0u64;
    shared.started.fetch_add(1, SeqCst);
    loop {
        let t0 = Instant::now();
        let mut spins = 0u32;
        loop {
            let gen = shared.state.load(SeqCst) >> 32;
            if gen != seen {
                seen = gen;
                shared.work(gen);
                break;
            }
            spins += 1;
            if spins.is_multiple_of(64) && t0.elapsed() > SPIN {
                let guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
                shared.sleepers.fetch_add(1, SeqCst);
                let _g = if shared.state.load(SeqCst) >> 32 == seen {
                    shared.wake.wait(guard).unwrap_or_else(|e| e.into_inner())
                } else {
                    guard
                };
                shared.sleepers.fetch_sub(1, SeqCst);
                break;
            }
            std::hint::spin_loop();
        }
    }
}

impl Pool {
    /// A pool of `threads` threads in all: the caller and `threads - 1` workers.
    pub fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            tasks: AtomicU64::new(0),
            done: AtomicUsize::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            sleepers: AtomicUsize::new(0),
            started: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        for i in 1..threads {
            let s = shared.clone();
            std::thread::Builder::new()
                .name(format!("mens-worker-{i}"))
                .spawn(move || worker(s))
                .expect("spawn worker thread");
        }
        while shared.started.load(SeqCst) < threads - 1 {
            std::thread::yield_now();
        }
        Pool {
            shared,
            threads,
            running: Mutex::new(()),
        }
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Run `f(0..tasks)` across the pool; returns when every task is done.
    pub fn run(&self, tasks: usize, f: &Job) {
        if tasks == 0 {
            return;
        }
        if tasks == 1 || self.threads == 1 {
            (0..tasks).for_each(f);
            return;
        }
        let _one = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let s = &self.shared;
        assert!(tasks < 1 << 32, "too many tasks");
        let job: &Job = f;
        let gen = ((s.state.load(SeqCst) >> 32) + 1) & 0xFFFF_FFFF;
        s.job.store(&job as *const &Job as *mut (), SeqCst);
        s.tasks.store(gen << 32 | tasks as u64, SeqCst);
        s.done.store(0, SeqCst);
        s.state.store(gen << 32, SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        s.work(gen);
        while s.done.load(SeqCst) < tasks {
            std::hint::spin_loop();
        }
    }
}

static POOL: OnceLock<Pool> = OnceLock::new();

/// Set the number of threads of the global pool; only the first call (before any kernel runs) counts.
pub fn set_threads(n: usize) -> bool {
    POOL.set(Pool::new(n)).is_ok()
}

/// The global pool (by default as many threads as logical cores).
pub fn pool() -> &'static Pool {
    POOL.get_or_init(|| {
        Pool::new(
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_across_many_jobs() {
        let p = Pool::new(3);
        for n in [1usize, 2, 7, 100, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            p.run(n, &|i| {
                hits[i].fetch_add(1, SeqCst);
            });
            assert!(hits.iter().all(|h| h.load(SeqCst) == 1), "n = {n}");
        }
        // After the workers have parked, a job still completes.
        std::thread::sleep(Duration::from_millis(5));
        let sum = AtomicUsize::new(0);
        p.run(64, &|i| {
            sum.fetch_add(i, SeqCst);
        });
        assert_eq!(sum.load(SeqCst), 64 * 63 / 2);
    }

    /// Back-to-back jobs with more workers than cores (so that workers are preempted between
    /// reading the pool's state and claiming a task): every task of every job runs exactly once,
    /// and never after its `run` returned. A worker late from the previous job once claimed a task
    /// of the next one with the previous generation's ticket (seen as a CPU result corrupted on a
    /// 16-core machine).
    #[test]
    fn late_workers_never_run_a_task_twice() {
        let p = Pool::new(8);
        for job in 0..20_000usize {
            let n = 1 + job % 13;
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            let live = std::sync::atomic::AtomicBool::new(true);
            p.run(n, &|i| {
                assert!(
                    live.load(SeqCst),
                    "job {job}: task {i} ran after run() returned"
                );
                hits[i].fetch_add(1, SeqCst);
            });
            live.store(false, SeqCst);
            for (i, h) in hits.iter().enumerate() {
                assert_eq!(h.load(SeqCst), 1, "job {job}: task {i} of {n}");
            }
        }
    }

    #[test]
    fn a_parked_pool_still_completes() {
        let p = Pool::new(3);
        std::thread::sleep(Duration::from_millis(5));
        let sum = AtomicUsize::new(0);
        p.run(64, &|i| {
            sum.fetch_add(i, SeqCst);
        });
        assert_eq!(sum.load(SeqCst), 64 * 63 / 2);
    }
}
