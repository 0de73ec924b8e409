//! Many requests over one [`Batch`]: a thread that admits requests into free slots, prefills their
//! prompts in chunks and decodes every active slot together, one batched forward pass per step
//! (continuous batching: a request joins at the next step, a finished one leaves). Requests beyond
//! the slots wait in a bounded queue. Output goes back through each request's callback, so the
//! scheduler knows nothing of who asked (HTTP, a test, a CLI).

use crate::engine::{Batch, Part};
use crate::error::{Error, Result};
use crate::generate::StopMatcher;
use crate::model::Model;
use crate::sample::{Sampler, SamplerConfig};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a request receives.
#[derive(Debug, Clone)]
pub enum Event {
    /// A piece of complete UTF-8 text.
    Text(String),
    /// The end: counts and why it stopped.
    Done(Usage),
    /// The request failed after it was admitted.
    Error(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` or the context.
    Length,
}

#[derive(Debug, Clone)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens found in the slot's cache and not prefilled again.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub finish: Finish,
    /// From admission to the first sampled token.
    pub time_to_first_token: Duration,
    /// From submission to the end.
    pub total: Duration,
}

pub struct Request {
    pub prompt: Vec<u32>,
    /// At least 1; prompt + max_tokens must fit in the context.
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    /// Generation stops before any of these strings (they are not emitted).
    pub stop: Vec<String>,
    /// Receives the output; returns false when nobody listens any more (the slot is then freed).
    pub on_event: Box<dyn FnMut(Event) -> bool + Send>,
    /// Polled once per step, also while queued: false when the requester has gone away.
    pub alive: Box<dyn Fn() -> bool + Send>,
    /// Who asked: a slot's cached prompt is reused only by a request of the same tenant, so one
    /// client cannot learn (by `cached_tokens` or by timing) what another client's prompt was.
    pub tenant: u64,
    /// Generation ends (finish `Length`) at this time.
    pub deadline: Option<Instant>,
}

#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// Sequences decoded together, each with its own KV cache of `ctx` tokens.
    pub slots: usize,
    pub ctx: usize,
    /// Most tokens one forward pass takes (decode tokens of every slot + prompt chunks).
    pub batch: usize,
    /// Requests that may wait for a free slot; more are refused.
    pub queue: usize,
}

/// Why a request was not taken.
#[derive(Debug)]
pub enum SubmitError {
    /// The request itself is wrong (bad sampling values, too long for the context...).
    Invalid(Error),
    /// Every slot is busy and the queue is full: try again later.
    QueueFull,
    /// The scheduler thread has ended.
    Stopped,
}

impl std::fmt::Display for SubmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubmitError::Invalid(e) => write!(f, "{e}"),
            SubmitError::QueueFull => write!(f, "every slot is busy and the queue is full"),
            SubmitError::Stopped => write!(f, "the scheduler has stopped"),
        }
    }
}

/// Counters shared with the scheduler thread.
#[derive(Default)]
pub struct Status {
    pub queued: AtomicUsize,
    pub active: AtomicUsize,
    pub steps: AtomicU64,
    pub generated: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
}

pub struct Scheduler {
    tx: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    status: Arc<Status>,
    options: SchedulerOptions,
    vocab: usize,
    kv_bytes: usize,
}

struct Job {
    req: Request,
    submitted: Instant,
}

impl Scheduler {
    /// Allocate every slot's KV cache and the shared run state, then start the thread.
    pub fn start(
        model: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        options: SchedulerOptions,
    ) -> Result<Self> {
        if options.queue == 0 {
            return Err(Error::InvalidArgument(
                "the queue must hold ≥ 1 request".into(),
            ));
        }
        let batch = Batch::new(model.clone(), options.slots, options.ctx, options.batch)?;
        let kv_bytes = batch.bytes();
        // Unbounded channel: `queued` bounds it (submit refuses past options.queue).
        let (tx, rx) = mpsc::channel();
        let status = Arc::new(Status::default());
        let st = status.clone();
        let thread = std::thread::Builder::new()
            .name("mens-scheduler".into())
            .spawn(move || run(batch, &tokenizer, rx, &st))
            .map_err(|e| {
                Error::InvalidArgument(format!("cannot start the scheduler thread: {e}"))
            })?;
        Ok(Scheduler {
            tx: Some(tx),
            thread: Some(thread),
            status,
            vocab: model.config.vocab_size,
            options,
            kv_bytes,
        })
    }

    pub fn options(&self) -> &SchedulerOptions {
        &self.options
    }

    pub fn status(&self) -> &Status {
        &self.status
    }

    /// Bytes of the slots' KV caches and the run state.
    pub fn bytes(&self) -> usize {
        self.kv_bytes
    }

    /// Check a request and queue it; its output arrives through `on_event`.
    pub fn submit(&self, req: Request) -> std::result::Result<(), SubmitError> {
        let ctx = self.options.ctx;
        let invalid = |m: String| Err(SubmitError::Invalid(Error::InvalidArgument(m)));
        req.sampler.validate().map_err(SubmitError::Invalid)?;
        if req.prompt.is_empty() {
            return invalid("the prompt is empty".into());
        }
        if req.max_tokens == 0 {
            return invalid("max_tokens must be ≥ 1".into());
        }
        if let Some(&t) = req.prompt.iter().find(|&&t| t as usize >= self.vocab) {
            return invalid(format!("token id {t} is outside the vocabulary"));
        }
        if req.prompt.len() + req.max_tokens > ctx {
            return Err(SubmitError::Invalid(Error::Context(format!(
                "the prompt ({} tokens) + max_tokens ({}) exceed the context of {ctx} tokens",
                req.prompt.len(),
                req.max_tokens
            ))));
        }
        let tx = self.tx.as_ref().ok_or(SubmitError::Stopped)?;
        let queue = self.options.queue;
        let taken = self
            .status
            .queued
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| {
                (q < queue).then_some(q + 1)
            });
        if taken.is_err() {
            return Err(SubmitError::QueueFull);
        }
        let job = Job {
            req,
            submitted: Instant::now(),
        };
        tx.send(job).map_err(|_| {
            self.status.queued.fetch_sub(1, Ordering::SeqCst);
            SubmitError::Stopped
        })
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A request in a slot.
struct Active {
    req: Request,
    submitted: Instant,
    admitted: Instant,
    /// Prompt tokens in the cache (reused or prefilled).
    fed: usize,
    cached: usize,
    /// The token to feed at the next step (decoding), once the prompt is in.
    next: Option<u32>,
    sampler: Sampler,
    decoder: StreamDecoder,
    matcher: StopMatcher,
    generated: usize,
    first: Option<Duration>,
    piece: String,
    emit: String,
}

/// Length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn run(mut batch: Batch, tok: &Tokenizer, rx: Receiver<Job>, status: &Status) {
    let n = batch.slots();
    let ctx = batch.slot(0).ctx();
    let vocab = batch.model.config.vocab_size;
    let mut slots: Vec<Option<Active>> = (0..n).map(|_| None).collect();
    // Whose prompt each slot's cache holds (prefix reuse stays within a tenant).
    let mut owner: Vec<Option<u64>> = vec![None; n];
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut one = vec![0u32; n];
    // (slot, prompt start, length, decoding, wants logits) of the current step.
    let mut plan: Vec<(usize, usize, usize, bool, bool)> = Vec::with_capacity(n);
    loop {
        // Take what was submitted; block when there is nothing to do.
        if waiting.is_empty() && slots.iter().all(|s| s.is_none()) {
            match rx.recv() {
                Ok(j) => waiting.push_back(j),
                Err(_) => return,
            }
        }
        waiting.extend(rx.try_iter());
        // A queued request whose client left gives its place up now, not when a slot frees.
        waiting.retain(|j| {
            let alive = (j.req.alive)();
            if !alive {
                status.queued.fetch_sub(1, Ordering::SeqCst);
            }
            alive
        });
        // Admit waiting requests into free slots.
        while let Some(free) = slots.iter().position(|s| s.is_none()) {
            let Some(job) = waiting.pop_front() else {
                break;
            };
            status.queued.fetch_sub(1, Ordering::SeqCst);
            // The free slot whose cache shares the longest prefix with the prompt (multi-turn chat),
            // among those holding this tenant's tokens, keeping at least the last prompt token to
            // prefill (its logits start the answer).
            let p = &job.req.prompt;
            let tenant = job.req.tenant;
            let (slot, common) = (0..n)
                .filter(|&i| slots[i].is_none())
                .map(|i| {
                    let c = if owner[i] == Some(tenant) {
                        common_prefix(batch.slot(i).tokens(), p).min(p.len() - 1)
                    } else {
                        0
                    };
                    (i, c)
                })
                .max_by_key(|&(i, c)| (c, std::cmp::Reverse(i)))
                .unwrap_or((free, 0));
            batch.slot_mut(slot).truncate(common);
            owner[slot] = Some(tenant);
            status
                .prompt_tokens
                .fetch_add(p.len() as u64, Ordering::Relaxed);
            status
                .cached_tokens
                .fetch_add(common as u64, Ordering::Relaxed);
            let sampler = match Sampler::new(job.req.sampler.clone(), vocab) {
                Ok(s) => s,
                Err(e) => {
                    let mut req = job.req;
                    (req.on_event)(Event::Error(e.to_string()));
                    continue;
                }
            };
            let stop = job.req.stop.clone();
            slots[slot] = Some(Active {
                submitted: job.submitted,
                admitted: Instant::now(),
                fed: common,
                cached: common,
                next: None,
                sampler,
                decoder: StreamDecoder::new(),
                matcher: StopMatcher::new(stop),
                generated: 0,
                first: None,
                piece: String::with_capacity(64),
                emit: String::with_capacity(64),
                req: job.req,
            });
        }

        // Drop requests whose requester has gone.
        for s in slots.iter_mut() {
            if s.as_ref().is_some_and(|a| !(a.req.alive)()) {
                *s = None;
            }
        }
        status.active.store(
            slots.iter().filter(|s| s.is_some()).count(),
            Ordering::SeqCst,
        );

        // Plan the step: one token per decoding slot, then prompt chunks in the room left.
        plan.clear();
        let mut room = batch.max_tokens_per_step();
        for (i, s) in slots.iter().enumerate() {
            if let Some(a) = s {
                if let Some(t) = a.next {
                    one[i] = t;
                    plan.push((i, 0, 1, true, true));
                    room -= 1;
                }
            }
        }
        for (i, s) in slots.iter().enumerate() {
            if let Some(a) = s {
                if a.next.is_none() && room > 0 {
                    let len = (a.req.prompt.len() - a.fed).min(room);
                    let last = a.fed + len == a.req.prompt.len();
                    plan.push((i, a.fed, len, false, last));
                    room -= len;
                }
            }
        }
        if plan.is_empty() {
            continue;
        }
        let parts: Vec<Part> = plan
            .iter()
            .map(|&(i, start, len, decoding, logits)| Part {
                slot: i,
                tokens: if decoding {
                    std::slice::from_ref(&one[i])
                } else {
                    &slots[i].as_ref().expect("planned slot").req.prompt[start..start + len]
                },
                logits,
            })
            .collect();
        let result = batch.step(&parts);
        drop(parts);
        status.steps.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = result {
            for &(i, ..) in &plan {
                if let Some(mut a) = slots[i].take() {
                    (a.req.on_event)(Event::Error(e.to_string()));
                }
            }
            continue;
        }

        for &(i, _, len, decoding, logits) in &plan {
            let a = slots[i].as_mut().expect("planned slot");
            if !decoding {
                a.fed += len;
            }
            if !logits {
                continue;
            }
            let (l, history) = batch.logits_and_tokens(i).expect("logits were asked for");
            let t = a.sampler.sample(l, history);
            a.generated += 1;
            status.generated.fetch_add(1, Ordering::Relaxed);
            a.first.get_or_insert_with(|| a.admitted.elapsed());
            let mut finish = None;
            let mut stop_string = false;
            if tok.is_stop(t) {
                finish = Some(Finish::Stop);
            } else {
                a.piece.clear();
                a.emit.clear();
                a.decoder.push(tok, t, &mut a.piece);
                stop_string = a.matcher.push(&a.piece, &mut a.emit);
                if !a.emit.is_empty() && !(a.req.on_event)(Event::Text(a.emit.clone())) {
                    slots[i] = None;
                    continue;
                }
                if stop_string {
                    finish = Some(Finish::Stop);
                } else if a.generated >= a.req.max_tokens
                    || batch.slot(i).pos() + 1 >= ctx
                    || a.req.deadline.is_some_and(|d| Instant::now() >= d)
                {
                    finish = Some(Finish::Length);
                }
            }
            match finish {
                None => a.next = Some(t),
                Some(finish) => {
                    let mut a = slots[i].take().expect("planned slot");
                    // Free before the final event: a client that has its answer sees the slot free.
                    status.active.fetch_sub(1, Ordering::SeqCst);
                    a.piece.clear();
                    a.emit.clear();
                    if !stop_string {
                        a.decoder.finish(&mut a.piece);
                        a.matcher.push(&a.piece, &mut a.emit);
                        a.matcher.finish(&mut a.emit);
                        if !a.emit.is_empty() {
                            (a.req.on_event)(Event::Text(std::mem::take(&mut a.emit)));
                        }
                    }
                    let usage = Usage {
                        prompt_tokens: a.req.prompt.len(),
                        cached_tokens: a.cached,
                        completion_tokens: a.generated,
                        finish,
                        time_to_first_token: a.first.unwrap_or_default(),
                        total: a.submitted.elapsed(),
                    };
                    (a.req.on_event)(Event::Done(usage));
                }
            }
        }
        status.active.store(
            slots.iter().filter(|s| s.is_some()).count(),
            Ordering::SeqCst,
        );
    }
}
