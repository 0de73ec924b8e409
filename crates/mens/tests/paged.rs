//! The scheduler over a paged KV pool, on the CPU: a CPU batch wrapped with the page bookkeeping
//! the CUDA batch keeps ([`PagePool`]), so admission, prefix sharing, and pages given back on
//! finish and on disconnect are checked in CI without a GPU. The wrapper fails a step that would
//! need more pages than the pool has, so a scheduler that admitted too much fails these tests.

mod common;

use mens::cpu::Batch;
use mens::gguf::Gguf;
use mens::model::Model;
use mens::pages::PagePool;
use mens::runner::{Memory, Part, Runner};
use mens::sample::Sampler;
use mens::scheduler::{Event, Request, Scheduler, SchedulerOptions, SubmitError};
use mens::synth::{synth_model, SynthSpec};
use mens::tokenizer::Tokenizer;
use mens::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const PAGE: usize = 16;

/// What the wrapper saw: most slots busy at once, pages shared by a prefix, the pool at the end.
#[derive(Default)]
struct Seen {
    most_busy: AtomicUsize,
    shared_pages: AtomicUsize,
    pool: Mutex<Option<PagePool>>,
}

struct Paged {
    inner: Batch,
    pool: PagePool,
    seen: Arc<Seen>,
}

impl Paged {
    fn busy(&self) -> usize {
        (0..self.inner.slots())
            .filter(|&s| self.pool.is_busy(s))
            .count()
    }
}

impl Runner for Paged {
    fn slots(&self) -> usize {
        self.inner.slots()
    }
    fn ctx(&self) -> usize {
        self.inner.ctx()
    }
    fn max_step_tokens(&self) -> usize {
        self.inner.max_step_tokens()
    }
    fn slot_tokens(&self, slot: usize) -> &[u32] {
        self.inner.slot_tokens(slot)
    }
    fn truncate_slot(&mut self, slot: usize, n: usize) {
        self.inner.truncate_slot(slot, n);
        self.pool.truncate(slot, self.inner.slot_tokens(slot).len());
    }
    fn can_copy_prefix(&self) -> bool {
        true
    }
    fn copy_prefix(&mut self, src: usize, dst: usize, n: usize) -> Result<()> {
        self.pool.share(src, dst, n)?;
        let shared = self.pool.table(dst).len();
        self.seen.shared_pages.fetch_add(shared, Ordering::SeqCst);
        self.inner.copy_prefix(src, dst, n)
    }
    fn admit(&mut self, slot: usize, tokens: usize) -> bool {
        let ok = self.pool.admit(slot, tokens);
        let busy = self.busy();
        self.seen.most_busy.fetch_max(busy, Ordering::SeqCst);
        ok
    }
    fn release(&mut self, slot: usize) {
        self.pool.release(slot);
        *self.seen.pool.lock().unwrap() = Some(self.pool.clone());
    }
    fn pages(&self) -> Option<(usize, usize)> {
        Some((self.pool.used(), self.pool.pages()))
    }
    fn step(&mut self, parts: &mut [Part]) -> Result<()> {
        for p in parts.iter() {
            if !self.pool.is_busy(p.slot) {
                return Err(Error::Backend(format!(
                    "slot {} stepped without admission",
                    p.slot
                )));
            }
            let len = self.inner.slot_tokens(p.slot).len();
            let prep = self.pool.prepare(p.slot, len, len + p.tokens.len())?;
            for v in prep.evicted {
                assert!(!self.pool.is_busy(v), "a busy slot's pages were taken");
                self.inner.truncate_slot(v, 0);
            }
        }
        self.inner.step(parts)
    }
    fn sample_slot(&mut self, slot: usize, sampler: &mut Sampler) -> Result<u32> {
        self.inner.sample_slot(slot, sampler)
    }
    fn memory(&self) -> Memory {
        self.inner.memory()
    }
    fn sibling(&self, ctx: usize) -> Result<Box<dyn Runner>> {
        self.inner.sibling(ctx)
    }
}

fn tiny() -> (Arc<Model>, Arc<Tokenizer>) {
    let g = Gguf::from_bytes(synth_model(&SynthSpec::tiny_qwen2())).unwrap();
    let (model, tok, _) = mens::load::from_gguf(g).unwrap();
    (Arc::new(model), Arc::new(tok))
}

fn options(slots: usize, queue: usize, ctx: usize) -> SchedulerOptions {
    SchedulerOptions {
        slots,
        ctx,
        batch: 512,
        queue,
        cache_reuse: 0,
        spec: None,
        cache: Default::default(),
    }
}

/// A scheduler over a paged pool of `pages` pages, or over the plain CPU batch (None).
fn scheduler(slots: usize, queue: usize, pages: Option<usize>) -> (Scheduler, Arc<Seen>) {
    scheduler_ctx(slots, queue, pages, 256)
}

fn scheduler_ctx(
    slots: usize,
    queue: usize,
    pages: Option<usize>,
    ctx: usize,
) -> (Scheduler, Arc<Seen>) {
    // Every pass with decode's attention arithmetic: a preempted request computes its text again
    // in a prompt pass, and must get the bits decoding gave.
    std::env::set_var("MENS_PROMPT_ATTN", "exact");
    let (model, tok) = tiny();
    let vocab = model.config.vocab_size;
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    let factory: mens::scheduler::RunnerFactory = Box::new(move || {
        let inner = Batch::new(model, slots, ctx, 512)?;
        Ok(match pages {
            Some(n) => Box::new(Paged {
                inner,
                pool: PagePool::new(n, PAGE, slots)?,
                seen: s,
            }) as Box<dyn Runner>,
            None => Box::new(inner),
        })
    });
    let sched = Scheduler::start(factory, vocab, tok, options(slots, queue, ctx)).unwrap();
    (sched, seen)
}

/// A greedy request; its text and usage (or error) arrive on the returned channel. `alive` false:
/// its client has gone.
fn request(
    prompt: Vec<u32>,
    max_tokens: usize,
    tenant: u64,
    alive: Arc<AtomicBool>,
) -> (Request, mpsc::Receiver<Event>) {
    let (mut req, rx) = common::greedy_request(prompt, max_tokens, tenant);
    req.alive = Box::new(move || alive.load(Ordering::SeqCst));
    (req, rx)
}

/// The text a request produced and its cached prompt tokens.
fn finish(rx: &mpsc::Receiver<Event>) -> (String, usize) {
    let mut text = String::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(120)).expect("an event") {
            Event::Text(t) => text.push_str(&t),
            Event::Done(u) => return (text, u.cached_tokens),
            Event::Error(e) => panic!("request failed: {e}"),
            Event::Logprobs(_) | Event::Embedding(_) => {}
        }
    }
}

/// Every prompt submitted at once (tenant = index), greedy, `max_tokens` each: the answers.
fn answers(s: &Scheduler, ps: &[Vec<u32>], max_tokens: usize) -> Vec<String> {
    let rxs: Vec<_> = ps
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let alive = Arc::new(AtomicBool::new(true));
            let (req, rx) = request(p.clone(), max_tokens, i as u64, alive);
            s.submit(req).unwrap();
            rx
        })
        .collect();
    rxs.iter().map(|rx| finish(rx).0).collect()
}

fn prompts(n: usize, len: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            (0..len)
                .map(|j| (7 + 13 * i + 31 * j) as u32 % 200 + 10)
                .collect()
        })
        .collect()
}

#[test]
fn a_small_pool_admits_what_fits_and_the_rest_wait_with_the_same_output() {
    // 6 requests of 40 + 24 tokens: 4 pages each, a claim of 5. A pool of 12 pages holds two
    // claims at once; four slots would take every request at once without pages.
    let ps = prompts(6, 40);
    let run = |pages| {
        let (s, seen) = scheduler(4, 16, pages);
        (answers(&s, &ps, 24), seen)
    };
    let (free, _) = run(None);
    let (paged, seen) = run(Some(12));
    assert_eq!(
        paged, free,
        "greedy output with pages equals the output without"
    );
    let most = seen.most_busy.load(Ordering::SeqCst);
    assert_eq!(most, 2, "at most two claims of 5 pages fit 12 pages");
    // Finished requests give their claims back (after the step that finished them); their pages
    // stay as idle caches.
    let mut released = false;
    for _ in 0..100 {
        let pool = seen
            .pool
            .lock()
            .unwrap()
            .clone()
            .expect("a release was seen");
        assert!(pool.used() <= 12);
        released = (0..4).all(|s| !pool.is_busy(s));
        if released {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(released, "every claim was given back");
}

#[test]
fn a_shared_prompt_prefix_takes_pages_another_slot_holds() {
    // Request A (tenant 1) holds a 100-token prompt; B (tenant 1) starts with the same 96 tokens:
    // its slot is given A's pages instead of prefilling them. Tenant 2 with the same text is not.
    let (s, seen) = scheduler(3, 8, Some(40));
    let a: Vec<u32> = prompts(1, 100).remove(0);
    let mut b = a[..96].to_vec();
    b.extend([3, 4, 5, 6]);
    let (ra, rxa) = request(a.clone(), 40, 1, Arc::new(AtomicBool::new(true)));
    s.submit(ra).unwrap();
    let (ta, _) = finish(&rxa);
    let (rb, rxb) = request(b.clone(), 8, 1, Arc::new(AtomicBool::new(true)));
    s.submit(rb).unwrap();
    let (_, cached_b) = finish(&rxb);
    // B went to the slot A used (the longest prefix of its tenant): its cache is reused in place.
    assert_eq!(cached_b, 96);
    // A third request of the tenant while B's slot holds the prefix: another slot, pages shared.
    let (rc, rxc) = request(b.clone(), 8, 1, Arc::new(AtomicBool::new(true)));
    let (rd, rxd) = request(b.clone(), 8, 1, Arc::new(AtomicBool::new(true)));
    s.submit(rc).unwrap();
    s.submit(rd).unwrap();
    let (tc, cc) = finish(&rxc);
    let (td, cd) = finish(&rxd);
    assert_eq!(tc, td, "a shared prefix decodes as the computed one");
    assert!(cc >= 96 && cd >= 96, "cached {cc} and {cd}");
    assert!(
        seen.shared_pages.load(Ordering::SeqCst) >= 96 / PAGE,
        "pages were shared, not copied"
    );
    // Another tenant's identical prompt shares nothing (nor learns anything by timing).
    let (re, rxe) = request(b, 8, 2, Arc::new(AtomicBool::new(true)));
    s.submit(re).unwrap();
    assert_eq!(finish(&rxe).1, 0);
    assert!(!ta.is_empty());
}

#[test]
fn a_disconnect_gives_its_pages_back_and_a_full_queue_refuses() {
    // Two slots, a pool of 20 pages: A (60 + 190 tokens, a claim of 17) leaves no room for B or
    // C (60 + 20, claims of 6) although a slot is free: they wait, and with the queue bound of 2
    // a fourth request is refused. A's client leaves: its pages come back and B and C run.
    let (s, _) = scheduler(2, 2, Some(20));
    let alive = Arc::new(AtomicBool::new(true));
    let (tx, rxa) = mpsc::channel();
    let (mut ra, _) = request(prompts(1, 60).remove(0), 190, 1, alive.clone());
    // A slow client: each event takes 5 ms, so A decodes for about a second.
    ra.on_event = Box::new(move |e| {
        std::thread::sleep(Duration::from_millis(5));
        tx.send(e).is_ok()
    });
    s.submit(ra).unwrap();
    loop {
        if let Event::Text(_) = rxa.recv_timeout(Duration::from_secs(60)).unwrap() {
            break;
        }
    }
    let ps = prompts(4, 60);
    let (rb, rxb) = request(ps[1].clone(), 20, 2, Arc::new(AtomicBool::new(true)));
    let (rc, rxc) = request(ps[2].clone(), 20, 3, Arc::new(AtomicBool::new(true)));
    s.submit(rb).unwrap();
    s.submit(rc).unwrap();
    // While A runs, B and C stay queued beside a free slot: no pages for them.
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(s.status().active.load(Ordering::SeqCst), 1);
        assert_eq!(s.status().queued.load(Ordering::SeqCst), 2);
    }
    let (rd, _) = request(ps[3].clone(), 20, 4, Arc::new(AtomicBool::new(true)));
    match s.submit(rd) {
        Err(SubmitError::QueueFull) => {}
        other => panic!("expected a full queue, got {:?}", other.map(|_| ())),
    }
    assert!(
        rxa.try_iter().all(|e| !matches!(e, Event::Done(_))),
        "A was still running"
    );
    alive.store(false, Ordering::SeqCst);
    assert!(!finish(&rxb).0.is_empty(), "B ran once A's pages came back");
    assert!(!finish(&rxc).0.is_empty());
}

#[test]
fn requests_that_outgrow_the_pool_are_preempted_and_resume_with_the_same_output() {
    // 3 requests of 40 prompt tokens and 600 answer tokens, claimed 256 at a time (`GROW`): all
    // three are admitted (20 pages each of a 64-page pool) and outgrow it; the latest admitted is
    // preempted, resumes by computing its text again, and every answer is the one decoded alone.
    let ps = prompts(3, 40);
    let run = |pages| {
        let (s, seen) = scheduler_ctx(3, 8, pages, 1024);
        let out = answers(&s, &ps, 600);
        (out, s.status().preempted.load(Ordering::SeqCst), seen)
    };
    let (free, none, _) = run(None);
    assert_eq!(none, 0);
    let (paged, preempted, seen) = run(Some(64));
    assert!(preempted > 0, "nothing was preempted");
    assert_eq!(seen.most_busy.load(Ordering::SeqCst), 3);
    assert_eq!(
        paged, free,
        "greedy output with preemption equals the output without"
    );
    eprintln!("{preempted} preemptions; every answer as decoded alone");
}
