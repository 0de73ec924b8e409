//! Many requests over one [`Runner`]: a thread that admits requests into free slots, prefills their
//! prompts in chunks and decodes every active slot together, one batched forward pass per step
//! (continuous batching: a request joins at the next step, a finished one leaves). Requests beyond
//! the slots wait in a bounded queue. Output goes back through each request's callback, so the
//! scheduler knows nothing of who asked (HTTP, a test, a CLI).
//!
//! Each step: [`admit`] waiting requests into free slots (reusing a cached prefix of the same
//! tenant), [`plan`] the step (a pure function: one token per decoding slot, then prompt chunks in
//! the room left), run it, and apply the results (sample, stream text, finish).
use crate::cpu::Batch;
use crate::error::{Error, Result};
use crate::grammar::Constraint;
use crate::model::{KvType, Model};
use crate::runner::{Logits, Part, Runner};
use crate::sample::{Sampler, SamplerConfig, TokenLogprobs};
use crate::spec::SpecOptions;
use crate::stream::{
    move_order, next_pass, reusable_prefix, reuse_chunks, uniform_keep, Chunk, TokenStream,
};
use crate::tokenizer::Tokenizer;
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
    /// The log-probabilities of the token whose text comes next (when the request asked for them;
    /// sent before that token's text, which may be held back by stop strings or UTF-8).
    Logprobs(TokenLogprobs),
    /// An embedding request's pooled vector (pooling none: every token's row, one after
    /// another), not normalised; [`Event::Done`] follows.
    Embedding(Vec<f32>),
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
    /// Completion tokens of a leading `<think>` block (when the request watched one).
    pub reasoning_tokens: usize,
    pub finish: Finish,
    /// From admission to the first sampled token.
    pub time_to_first_token: Duration,
    /// From submission to the end.
    pub total: Duration,
    /// The stop string that ended generation (finish `Stop`), if one did.
    pub stop_sequence: Option<String>,
}

pub struct Request {
    pub prompt: Vec<u32>,
    /// At least 1; prompt + max_tokens must fit in the context.
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    /// Generation stops before any of these strings (they are not emitted).
    pub stop: Vec<String>,
    /// llama-server's `n_indent`: after the first line, generation ends (`Finish::Length`, cut
    /// before the line's text) at a line indented by fewer than this many spaces or tabs; 0: off.
    pub min_indent: usize,
    /// Receives the output; returns false when nobody listens any more (the slot is then freed).
    pub on_event: Box<dyn FnMut(Event) -> bool + Send>,
    /// Polled once per step, also while queued: false when the requester has gone away.
    pub alive: Box<dyn Fn() -> bool + Send>,
    /// Who asked: a slot's cached prompt is reused only by a request of the same tenant, so one
    /// client cannot learn (by `cached_tokens` or by timing) what another client's prompt was.
    pub tenant: u64,
    /// Generation ends (finish `Length`) at this time.
    pub deadline: Option<Instant>,
    /// A grammar the output must follow; generation stops when it is complete.
    pub constraint: Option<Constraint>,
    /// Send [`Event::Logprobs`] for each token, with this many alternatives.
    pub logprobs: Option<usize>,
    /// End-of-generation tokens do not end the answer (it runs to max_tokens): benchmarks, as
    /// llama-server's `ignore_eos`.
    pub ignore_eos: bool,
    /// Watch the answer's leading `<think>` block: count it, and close it at a budget.
    pub think: Option<crate::think::Think>,
    /// An embedding request: the prompt is prefilled from nothing (every row is pooled), nothing
    /// is generated (`max_tokens` is ignored), and [`Event::Embedding`] comes before `Done`. It
    /// takes the slot holding least, leaving cached conversations alone.
    pub embed: Option<crate::embed::Pooling>,
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
    /// Reuse cached runs of at least this many tokens that moved in a new prompt (0: only the
    /// common prefix; see [`reuse_chunks`]).
    pub cache_reuse: usize,
    /// Speculative decoding by prompt lookup for greedy requests (no penalties, grammar or
    /// logprobs): each such slot proposes and checks several tokens per step.
    pub spec: Option<SpecOptions>,
    /// What the CPU batch's KV caches store for K and V.
    pub cache: (KvType, KvType),
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
    /// Tokens held in the slots' caches (busy slots, and idle ones kept for prefix reuse).
    pub kv_tokens: AtomicUsize,
    /// Bytes of KV cache the runner allocated.
    pub kv_bytes: AtomicUsize,
    /// A paged KV pool's pages in use (held by busy slots and idle caches) and pages in all (0:
    /// the runner gives each slot its own whole context).
    pub kv_pages_used: AtomicUsize,
    pub kv_pages: AtomicUsize,
    /// Requests preempted (their pages given to others; they resume by computing their text
    /// again).
    pub preempted: AtomicU64,
    /// Speculation: tokens proposed and accepted.
    pub spec_proposed: AtomicU64,
    pub spec_accepted: AtomicU64,
}

pub struct Scheduler {
    tx: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    status: Arc<Status>,
    options: SchedulerOptions,
    vocab: usize,
    /// The runner computes hidden states (embedding requests are served).
    hidden: bool,
}

/// Builds the runner on the scheduler's thread (a GPU context belongs to the thread that made it).
pub type RunnerFactory = Box<dyn FnOnce() -> Result<Box<dyn Runner>> + Send>;

/// A factory of one CPU [`Batch`] of `options`' slots, context and step size.
fn cpu_batch(model: Arc<Model>, options: &SchedulerOptions) -> RunnerFactory {
    let (slots, ctx, batch, cache) = (options.slots, options.ctx, options.batch, options.cache);
    Box::new(move || {
        Ok(Box::new(Batch::with_cache(model, slots, ctx, batch, cache)?) as Box<dyn Runner>)
    })
}

struct Job {
    req: Request,
    submitted: Instant,
}

impl Scheduler {
    /// The CPU server: `options.slots` sequences of `options.ctx` tokens in one [`Batch`].
    pub fn cpu(
        model: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        options: SchedulerOptions,
    ) -> Result<Self> {
        let vocab = model.config.vocab_size;
        let factory = cpu_batch(model, &options);
        Self::start(factory, vocab, tokenizer, options)
    }

    /// The CPU server with a draft model proposing for greedy requests (`options.spec` must be
    /// set): a second [`Batch`] of the same slots and context holds the draft's caches.
    pub fn cpu_with_draft(
        model: Arc<Model>,
        draft: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        options: SchedulerOptions,
    ) -> Result<Self> {
        if options.spec.is_none() {
            return Err(Error::InvalidArgument(
                "a draft model needs speculation options".into(),
            ));
        }
        let vocab = model.config.vocab_size;
        let factory = cpu_batch(model, &options);
        let draft = cpu_batch(draft, &options);
        Self::start_with(factory, Some(draft), vocab, tokenizer, options)
    }

    /// Start the thread, build the runner on it, and take its slots, context and step size (those
    /// of `options` are replaced by the runner's).
    pub fn start(
        runner: RunnerFactory,
        vocab: usize,
        tokenizer: Arc<Tokenizer>,
        options: SchedulerOptions,
    ) -> Result<Self> {
        Self::start_with(runner, None, vocab, tokenizer, options)
    }

    /// [`Scheduler::start`] with a draft runner (same slots and context) proposing for
    /// speculating slots instead of prompt lookup.
    pub fn start_with(
        runner: RunnerFactory,
        draft: Option<RunnerFactory>,
        vocab: usize,
        tokenizer: Arc<Tokenizer>,
        options: SchedulerOptions,
    ) -> Result<Self> {
        let SchedulerOptions {
            queue,
            cache_reuse,
            spec,
            cache,
            ..
        } = options;
        if queue == 0 {
            return Err(Error::InvalidArgument(
                "the queue must hold ≥ 1 request".into(),
            ));
        }
        // Unbounded channel: `queued` bounds it (submit refuses past `queue`).
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready) = mpsc::channel();
        let status = Arc::new(Status::default());
        let st = status.clone();
        let thread = std::thread::Builder::new()
            .name("mens-scheduler".into())
            .spawn(move || {
                let made = runner().and_then(|r| match draft {
                    Some(d) => {
                        let d = d()?;
                        if d.slots() != r.slots() || d.ctx() != r.ctx() {
                            return Err(Error::InvalidArgument(
                                "the draft runner must have the target's slots and context".into(),
                            ));
                        }
                        Ok((r, Some(d)))
                    }
                    None => Ok((r, None)),
                });
                match made {
                    Ok((r, d)) => {
                        let _ = ready_tx.send(Ok((
                            r.slots(),
                            r.ctx(),
                            r.max_step_tokens(),
                            r.hidden_states(),
                        )));
                        run(r, d, &tokenizer, rx, &st, cache_reuse, spec)
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| {
                Error::InvalidArgument(format!("cannot start the scheduler thread: {e}"))
            })?;
        let (slots, ctx, batch, hidden) = ready
            .recv()
            .map_err(|_| Error::Backend("the scheduler thread ended while starting".into()))??;
        Ok(Scheduler {
            tx: Some(tx),
            thread: Some(thread),
            status,
            vocab,
            hidden,
            options: SchedulerOptions {
                slots,
                ctx,
                batch,
                queue,
                cache_reuse,
                spec,
                cache,
            },
        })
    }

    pub fn options(&self) -> &SchedulerOptions {
        &self.options
    }

    pub fn status(&self) -> &Status {
        &self.status
    }

    /// Whether embedding requests are served (the runner computes hidden states).
    pub fn embeddings(&self) -> bool {
        self.hidden
    }

    /// Check a request and queue it; its output arrives through `on_event`.
    pub fn submit(&self, mut req: Request) -> std::result::Result<(), SubmitError> {
        let ctx = self.options.ctx;
        let invalid = |m: String| Err(SubmitError::Invalid(Error::InvalidArgument(m)));
        req.sampler.validate().map_err(SubmitError::Invalid)?;
        if req.prompt.is_empty() {
            return invalid("the prompt is empty".into());
        }
        if req.embed.is_some() {
            if !self.hidden {
                return invalid("embeddings are not computed on this backend".into());
            }
            req.max_tokens = 0;
        } else if req.max_tokens == 0 {
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
    /// Cached runs placed at their new positions, not yet taken (by `dst`).
    reuse: VecDeque<Chunk>,
    sampler: Sampler,
    stream: TokenStream,
    generated: usize,
    first: Option<Duration>,
    /// Tokens the runner's pool holds pages for (prompt + some answer; grows by [`GROW`]).
    claimed: usize,
    /// When it was admitted or resumed (the latest is preempted first).
    order: u64,
    /// Preempted: its pages went to others; it waits for pages, then feeds `source` again.
    paused: bool,
    /// After a preemption: the tokens to feed (prompt, answer so far, the next token) instead of
    /// the prompt.
    source: Option<Vec<u32>>,
    /// The leading `<think>` block's watch (see [`Request::think`]).
    watch: Option<crate::think::Watch>,
}

impl Active {
    /// The tokens prefill feeds: the prompt, or after a preemption what the slot held.
    fn source(&self) -> &[u32] {
        self.source.as_deref().unwrap_or(&self.req.prompt)
    }

    /// Most tokens the request may hold: prompt + max_tokens.
    fn most(&self) -> usize {
        self.req.prompt.len() + self.req.max_tokens
    }
}

/// Tokens of answer a request's pages are claimed for at a time: a paged pool admits a request for
/// its prompt and this much, and claims more as it grows (preempting the latest admitted request
/// when the pool has no more; it resumes by computing its text again).
pub const GROW: usize = 256;

/// What a request holding (or about to feed) `tokens` tokens claims: room for `GROW` more, never
/// past the `most` it may hold.
fn claim(tokens: usize, most: usize) -> usize {
    most.min(tokens + GROW).max(tokens)
}

/// What the planner sees of a busy slot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlotState {
    pub prompt_len: usize,
    /// Prompt tokens already in the cache.
    pub fed: usize,
    /// Prefill may run up to here (the next reused chunk, or the prompt's end).
    pub prefill_end: usize,
    /// Decoding: one token to feed.
    pub decoding: bool,
    /// Tokens a decode step feeds: 1, or 1 + proposals (speculation).
    pub decode_len: usize,
}

/// One slot's share of a step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Work {
    /// Feed the token sampled last step, and `len - 1` proposed tokens after it (speculation).
    Decode { slot: usize, len: usize },
    /// Feed prompt tokens `start..start + len`; `last`: the prompt is then complete (its last
    /// token's logits start the answer).
    Prefill {
        slot: usize,
        start: usize,
        len: usize,
        last: bool,
    },
}

impl Work {
    pub fn slot(&self) -> usize {
        match *self {
            Work::Decode { slot, .. } | Work::Prefill { slot, .. } => slot,
        }
    }
}

/// Plan a step within `budget` tokens: every decoding slot feeds its one token (decoding streams
/// never wait on a prompt), then prompts are fed in chunks, in slot order, in the room left, each
/// chunk of at least `uniform` rows where the room allows ([`next_pass`]).
pub fn plan(slots: &[Option<SlotState>], budget: usize, uniform: usize, out: &mut Vec<Work>) {
    out.clear();
    let mut room = budget;
    for (slot, s) in slots.iter().enumerate() {
        if let Some(s) = s {
            if s.decoding && room > 0 {
                let len = s.decode_len.clamp(1, room);
                out.push(Work::Decode { slot, len });
                room -= len;
            }
        }
    }
    for (slot, s) in slots.iter().enumerate() {
        if let Some(s) = s {
            if !s.decoding && room > 0 && s.fed < s.prefill_end {
                // Up to a reused chunk the rows are not a cold prefill's anyway.
                let u = if s.prefill_end == s.prompt_len {
                    uniform
                } else {
                    1
                };
                let len = next_pass(s.prefill_end - s.fed, room, u);
                out.push(Work::Prefill {
                    slot,
                    start: s.fed,
                    len,
                    last: s.fed + len == s.prompt_len,
                });
                room -= len;
            }
        }
    }
}

/// The free slot for a prompt: the one whose cache, holding this tenant's tokens, shares the longest
/// prefix with it (the next turn of a chat) less what it would throw away, so a request that shares
/// only a template's first tokens with a long cached conversation (an agent's side request) takes
/// an empty slot, or the one holding least, and leaves the conversation cached; the lowest such slot
/// on a tie. With cache reuse (`cache_reuse` > 0: runs of at least that many tokens move), the
/// runs a slot would give count as kept. Returns the slot, how many cached tokens its prefix
/// keeps, and the runs to move after it (see [`reuse_chunks`]). `free` lists (slot, owner tenant,
/// cached tokens).
pub fn choose_slot<'a>(
    free: impl Iterator<Item = (usize, Option<u64>, &'a [u32])>,
    tenant: u64,
    prompt: &[u32],
    cache_reuse: usize,
) -> Option<(usize, usize, Vec<Chunk>)> {
    free.map(|(i, owner, cached)| {
        let (keep, chunks) = if owner == Some(tenant) {
            let keep = reusable_prefix(cached, prompt);
            (keep, reuse_chunks(cached, prompt, keep, cache_reuse))
        } else {
            (0, Vec::new())
        };
        let kept = keep + chunks.iter().map(|c| c.len).sum::<usize>();
        let score = kept as i64 - (cached.len() - kept) as i64;
        (i, keep, chunks, score)
    })
    .max_by_key(|&(i, _, _, score)| (score, std::cmp::Reverse(i)))
    .map(|(i, keep, chunks, _)| (i, keep, chunks))
}

/// Fewest tokens a copy from another slot must add to what the chosen slot keeps.
const COPY_MIN: usize = 32;

/// Another slot (busy or free) whose cache, holding this tenant's tokens, shares a longer prefix
/// with `prompt` than the chosen slot `keep`s, by [`COPY_MIN`] tokens or more: its rows are copied
/// instead of prefilled (the system prompt of an agent whose other request holds a slot). `others`
/// lists (slot, owner tenant, cached tokens) of the other slots. Returns the slot and how many
/// tokens to take.
pub fn copy_source<'a>(
    others: impl Iterator<Item = (usize, Option<u64>, &'a [u32])>,
    tenant: u64,
    prompt: &[u32],
    keep: usize,
) -> Option<(usize, usize)> {
    others
        .filter(|&(_, owner, _)| owner == Some(tenant))
        .map(|(i, _, cached)| (i, reusable_prefix(cached, prompt)))
        .filter(|&(_, n)| n >= keep + COPY_MIN)
        .max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)))
}

/// The scheduler thread's state.
struct Loop<'t> {
    runner: Box<dyn Runner>,
    tok: &'t Tokenizer,
    status: &'t Status,
    vocab: usize,
    slots: Vec<Option<Active>>,
    /// Whose prompt each slot's cache holds (prefix reuse stays within a tenant).
    owner: Vec<Option<u64>>,
    waiting: VecDeque<Job>,
    /// Minimum moved run to reuse (0: off).
    cache_reuse: usize,
    /// Copy a prompt prefix another slot holds ([`copy_source`]); `MENS_NO_PREFIX_COPY=1` turns it
    /// off, for comparisons.
    copy_prefix: bool,
    spec: Option<SpecOptions>,
    /// Per slot: the tokens its decode step feeds (the next token, then proposals), and the model's
    /// greedy picks at each of them.
    feed: Vec<Vec<u32>>,
    picks: Vec<Vec<u32>>,
    /// Per slot: an embedding request's pooled rows (set at admission).
    pools: Vec<Option<crate::embed::Pool>>,
    /// Scratch for a slot's history (its cache and next token) while proposing.
    history: Vec<u32>,
    /// A draft model's runner (same slots), proposing instead of prompt lookup, and each slot's
    /// number of draft tokens (adaptive: grows while all are accepted, else the accepted + 1).
    draft: Option<Box<dyn Runner>>,
    draft_k: Vec<usize>,
    /// Speculation only where it measures faster than plain decoding.
    gate: crate::spec::Gate,
    /// Tokens the last step gave (verified proposals included).
    emitted: usize,
    /// Admissions and resumptions so far (a request's `order`).
    order: u64,
}

/// A callback taking a position's row (an embedding's hidden state).
type RowFn<'a> = dyn FnMut(usize, &[f32]) + 'a;

/// Draft tokens a slot starts with.
const DRAFT_K0: usize = 4;

fn run(
    runner: Box<dyn Runner>,
    draft: Option<Box<dyn Runner>>,
    tok: &Tokenizer,
    rx: Receiver<Job>,
    status: &Status,
    cache_reuse: usize,
    spec: Option<SpecOptions>,
) {
    let n = runner.slots();
    let mut l = Loop {
        cache_reuse,
        copy_prefix: matches!(
            std::env::var("MENS_NO_PREFIX_COPY").as_deref(),
            Err(_) | Ok("") | Ok("0")
        ),
        spec,
        feed: vec![Vec::new(); n],
        picks: vec![Vec::new(); n],
        pools: vec![None; n],
        history: Vec::new(),
        draft,
        draft_k: vec![DRAFT_K0; n],
        gate: Default::default(),
        emitted: 0,
        order: 0,
        vocab: tok.vocab_size(),
        runner,
        tok,
        status,
        slots: (0..n).map(|_| None).collect(),
        owner: vec![None; n],
        waiting: VecDeque::new(),
    };
    status
        .kv_bytes
        .store(l.runner.memory().kv_cache, Ordering::Relaxed);
    if let Some((_, pages)) = l.runner.pages() {
        status.kv_pages.store(pages, Ordering::Relaxed);
    }
    let mut states: Vec<Option<SlotState>> = vec![None; n];
    let mut work = Vec::with_capacity(n);
    loop {
        // Take what was submitted; block when there is nothing to do.
        if l.waiting.is_empty() && l.slots.iter().all(|s| s.is_none()) {
            match rx.recv() {
                Ok(j) => l.waiting.push_back(j),
                Err(_) => return,
            }
        }
        l.waiting.extend(rx.try_iter());
        l.admit();
        let t0 = Instant::now();
        l.propose();
        l.claim_growth();
        for ((st, s), f) in states.iter_mut().zip(&l.slots).zip(&l.feed) {
            *st = s.as_ref().filter(|a| !a.paused).map(|a| SlotState {
                prompt_len: a.source().len(),
                fed: a.fed,
                prefill_end: a.reuse.front().map_or(a.source().len(), |c| c.dst),
                decoding: a.next.is_some(),
                decode_len: f.len().max(1),
            });
        }
        plan(
            &states,
            l.runner.max_step_tokens(),
            l.runner.uniform_pass(),
            &mut work,
        );
        if work.is_empty() {
            continue;
        }
        l.step(&work);
        l.release_ended();
        if l.spec.is_some() && work.iter().all(|w| matches!(w, Work::Decode { .. })) {
            let speculated = work
                .iter()
                .any(|w| matches!(w, Work::Decode { len, .. } if *len > 1));
            let secs = t0.elapsed().as_secs_f64();
            l.gate.record(work.len(), speculated, l.emitted, secs);
        }
        l.status.active.store(l.busy(), Ordering::SeqCst);
        let held = (0..n).map(|i| l.runner.slot_tokens(i).len()).sum();
        l.status.kv_tokens.store(held, Ordering::Relaxed);
        if let Some((used, _)) = l.runner.pages() {
            l.status.kv_pages_used.store(used, Ordering::Relaxed);
        }
    }
}

impl Loop<'_> {
    fn busy(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// What ended requests (finished, failed, gone) held goes back to the runner's pool.
    fn release_ended(&mut self) {
        for (i, s) in self.slots.iter().enumerate() {
            if s.is_none() {
                self.runner.release(i);
            }
        }
    }

    /// Drop requests whose client left (queued or running), then fill free slots from the queue.
    fn admit(&mut self) {
        let status = self.status;
        // A queued request whose client left gives its place up now, not when a slot frees.
        self.waiting.retain(|j| {
            let alive = (j.req.alive)();
            if !alive {
                status.queued.fetch_sub(1, Ordering::SeqCst);
            }
            alive
        });
        for s in self.slots.iter_mut() {
            if s.as_ref().is_some_and(|a| !(a.req.alive)()) {
                *s = None;
            }
        }
        self.release_ended();
        // Preempted requests first, the earliest first; new ones wait while any cannot resume.
        let resumed = self.resume();
        while resumed && self.slots.iter().any(|s| s.is_none()) {
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            let runner = &self.runner;
            let free = (0..self.slots.len())
                .filter(|&i| self.slots[i].is_none())
                .map(|i| (i, self.owner[i], runner.slot_tokens(i)));
            // Runs move (and count) where this runner can move them.
            let min_run = if runner.can_shift_kv() {
                self.cache_reuse
            } else {
                0
            };
            // An embedding pools every row: nothing is reused, and it takes the slot holding least.
            let embed = job.req.embed.is_some();
            let wanted: &[u32] = if embed { &[] } else { &job.req.prompt };
            let (slot, mut keep, chunks) =
                choose_slot(free, job.req.tenant, wanted, min_run).expect("a slot is free");
            let copy = if self.copy_prefix && runner.can_copy_prefix() && !embed {
                let others = (0..self.slots.len())
                    .filter(|&i| i != slot)
                    .map(|i| (i, self.owner[i], runner.slot_tokens(i)));
                copy_source(others, job.req.tenant, &job.req.prompt, keep)
            } else {
                None
            };
            let mut reuse = VecDeque::new();
            if let Some((src, n)) = copy {
                self.runner.truncate_slot(slot, 0);
                keep = if self.runner.copy_prefix(src, slot, n).is_ok() {
                    n
                } else {
                    0
                };
            } else if !chunks.is_empty() {
                // The runs `choose_slot` found after the kept prefix (this tenant's slot).
                let moved = move_order(&chunks)
                    .iter()
                    .all(|c| self.runner.shift_kv(slot, c.src, c.dst, c.len).is_ok());
                if moved {
                    reuse.extend(chunks);
                }
            }
            if reuse.is_empty() {
                // The prompt's last pass as long as a cold request's would be: the same bits.
                keep = uniform_keep(keep, job.req.prompt.len(), self.runner.uniform_pass());
            }
            self.runner.truncate_slot(slot, keep);
            self.owner[slot] = Some(job.req.tenant);
            // A paged pool must be able to give the request pages for its prompt and `GROW`
            // answer tokens; if it cannot yet, the request waits at the head of the queue for
            // pages to free (the slot keeps what it holds of this tenant's prompt; the request
            // stays counted in the queue's bound meanwhile).
            let claim = claim(
                job.req.prompt.len(),
                job.req.prompt.len() + job.req.max_tokens,
            );
            if !self.runner.admit(slot, claim) {
                self.waiting.push_front(job);
                break;
            }
            self.order += 1;
            status.queued.fetch_sub(1, Ordering::SeqCst);
            let mut job = job;
            let mut sampler = match Sampler::new(job.req.sampler.clone(), self.vocab) {
                Ok(mut s) => {
                    s.constraint = job.req.constraint.take();
                    s.logprobs = job.req.logprobs;
                    s
                }
                Err(e) => {
                    let mut req = job.req;
                    (req.on_event)(Event::Error(e.to_string()));
                    continue;
                }
            };
            let watch = job.req.think.as_ref().map(|t| {
                let mut w = crate::think::Watch::new(t.open, t.budget);
                if w.close_at_start() {
                    sampler.force(&t.close);
                }
                sampler.hold = w.pending();
                w
            });
            self.draft_k[slot] = DRAFT_K0;
            self.pools[slot] = job.req.embed.map(crate::embed::Pool::new);
            if let Some(d) = self.draft.as_mut() {
                // The draft keeps no more of the old request than the target does (the same
                // tenant's prefix): proposals' speed must not tell one tenant another's text.
                // After a copy from another slot its old tokens are not the prompt's: none.
                let n = if copy.is_some() {
                    0
                } else {
                    d.slot_tokens(slot).len().min(keep)
                };
                d.truncate_slot(slot, n);
            }
            self.slots[slot] = Some(Active {
                submitted: job.submitted,
                admitted: Instant::now(),
                fed: keep,
                cached: keep,
                next: None,
                reuse,
                sampler,
                stream: TokenStream::new(job.req.stop.clone()).with_min_indent(job.req.min_indent),
                generated: 0,
                first: None,
                claimed: claim,
                order: self.order,
                paused: false,
                source: None,
                watch,
                req: job.req,
            });
        }
        for slot in 0..self.slots.len() {
            self.take_reused(slot);
        }
        self.status.active.store(self.busy(), Ordering::SeqCst);
    }

    /// Resume preempted requests whose pages the pool can give again (what their slot still
    /// caches is kept; the rest is fed again). False while one cannot.
    fn resume(&mut self) -> bool {
        let mut paused: Vec<(u64, usize)> = (0..self.slots.len())
            .filter_map(|i| {
                self.slots[i]
                    .as_ref()
                    .filter(|a| a.paused)
                    .map(|a| (a.order, i))
            })
            .collect();
        paused.sort_unstable();
        for (_, slot) in paused {
            let a = self.slots[slot].as_ref().expect("paused slot");
            let claim = claim(a.source().len(), a.most());
            let keep = match self.pools[slot].as_mut() {
                // Its rows are pooled as they are computed: all of them again.
                Some(pool) => {
                    pool.clear();
                    0
                }
                None => reusable_prefix(self.runner.slot_tokens(slot), a.source()),
            };
            self.runner.truncate_slot(slot, keep);
            if !self.runner.admit(slot, claim) {
                return false;
            }
            self.order += 1;
            let a = self.slots[slot].as_mut().expect("paused slot");
            a.paused = false;
            a.claimed = claim;
            a.order = self.order;
            a.fed = keep;
        }
        true
    }

    /// Before a step: claim pages for every busy slot's next tokens (its feed), preempting the
    /// latest admitted requests when the pool has none left (a request that is itself the latest
    /// pauses).
    fn claim_growth(&mut self) {
        for slot in 0..self.slots.len() {
            let Some(a) = self.slots[slot].as_ref() else {
                continue;
            };
            if a.paused || a.next.is_none() {
                continue;
            }
            let need = self.runner.slot_tokens(slot).len() + self.feed[slot].len().max(1);
            if need <= a.claimed {
                continue;
            }
            let claim = claim(need, a.most());
            loop {
                if self.runner.admit(slot, claim) {
                    self.slots[slot].as_mut().expect("busy slot").claimed = claim;
                    break;
                }
                let victim = (0..self.slots.len())
                    .filter_map(|i| {
                        self.slots[i]
                            .as_ref()
                            .filter(|a| !a.paused)
                            .map(|a| (a.order, i))
                    })
                    .max()
                    .map(|(_, i)| i)
                    .expect("the slot itself is busy");
                self.preempt(victim);
                if victim == slot {
                    break;
                }
            }
        }
    }

    /// Give a request's pages back and pause it: it resumes by feeding its prompt, its answer so far
    /// and its next token again (what its slot still caches then is reused).
    fn preempt(&mut self, slot: usize) {
        let a = self.slots[slot].as_mut().expect("busy slot");
        let source = match a.next.take() {
            // Decoding: what the slot holds, then the token it was to feed.
            Some(t) => {
                let mut s = self.runner.slot_tokens(slot).to_vec();
                s.push(t);
                s
            }
            // Still in its prompt (or its resumed text): that again.
            None => a.source().to_vec(),
        };
        a.source = Some(source);
        a.paused = true;
        a.reuse.clear();
        self.feed[slot].clear();
        self.runner.release(slot);
        self.status.preempted.fetch_add(1, Ordering::Relaxed);
    }

    /// Take the reused chunks that start where a slot's prompt has reached: their rows are in
    /// place, so the tokens join the cache without computing.
    fn take_reused(&mut self, slot: usize) {
        let Some(a) = self.slots[slot].as_mut() else {
            return;
        };
        while let Some(c) = a.reuse.front().copied().filter(|c| c.dst == a.fed) {
            a.reuse.pop_front();
            let tokens = &a.req.prompt[c.dst..c.dst + c.len];
            if let Err(e) = self.runner.assume_tokens(slot, tokens) {
                let mut a = self.slots[slot].take().expect("busy slot");
                (a.req.on_event)(Event::Error(e.to_string()));
                return;
            }
            a.fed += c.len;
            a.cached += c.len;
        }
    }

    /// Each decoding slot's feed: its next token, then (speculation, greedy requests) the tokens
    /// that followed the latest earlier occurrence of its last tokens.
    fn propose(&mut self) {
        let ctx = self.runner.ctx();
        let mut drafting: Vec<(usize, usize)> = Vec::new();
        let decoding = self
            .slots
            .iter()
            .filter(|s| s.as_ref().is_some_and(|a| a.next.is_some()))
            .count();
        let allowed = match self.spec {
            Some(sp) if sp.gate => self.gate.allow(decoding),
            Some(_) => true,
            None => false,
        };
        for slot in 0..self.slots.len() {
            let f = &mut self.feed[slot];
            f.clear();
            let Some(a) = self.slots[slot].as_ref() else {
                continue;
            };
            let Some(next) = a.next else { continue };
            f.push(next);
            let Some(sp) = self.spec else { continue };
            if !allowed || !a.sampler.is_greedy() || a.sampler.needs_logits() {
                continue;
            }
            let held = self.runner.slot_tokens(slot);
            // The step yields the accepted proposals and one more token: within ctx and max_tokens.
            let room = ctx.saturating_sub(held.len() + 2);
            let left = a.req.max_tokens.saturating_sub(a.generated + 1);
            let max = sp.most().min(room).min(left);
            if max == 0 {
                continue;
            }
            if self.draft.is_some() {
                drafting.push((slot, max.min(self.draft_k[slot])));
                continue;
            }
            self.history.clear();
            self.history.extend_from_slice(held);
            self.history.push(next);
            crate::spec::ngram_append(&self.history, sp.ngram, max, f);
        }
        if !drafting.is_empty() {
            if let Err(e) = self.draft_proposals(&drafting) {
                // The draft model failed: these slots go on without proposals.
                tracing::warn!("draft model: {e}");
                for &(slot, _) in &drafting {
                    self.feed[slot].truncate(1);
                    if let Some(d) = self.draft.as_mut() {
                        d.truncate_slot(slot, 0);
                    }
                }
            }
        }
    }

    /// Greedy proposals of the draft model for `slots` ((slot, most tokens)): each slot's draft
    /// cache is brought to its history (what it shares is kept; long catch-ups in chunks alone),
    /// then every slot drafts one token per batched draft step.
    fn draft_proposals(&mut self, slots: &[(usize, usize)]) -> Result<()> {
        let d = self.draft.as_mut().expect("a draft runner");
        let step = d.max_step_tokens();
        let mut greedy = crate::sample::Sampler::new(crate::sample::SamplerConfig::greedy(), 1)?;
        // Catch up: what each draft cache lacks of (target cache + next token).
        let mut rest: Vec<(usize, Vec<u32>)> = Vec::with_capacity(slots.len());
        for &(slot, _) in slots {
            self.history.clear();
            self.history
                .extend_from_slice(self.runner.slot_tokens(slot));
            self.history.extend_from_slice(&self.feed[slot][..1]);
            let keep = crate::stream::reusable_prefix(d.slot_tokens(slot), &self.history);
            d.truncate_slot(slot, keep);
            let mut missing = &self.history[keep..];
            // All but the last `step / slots` tokens alone, so the batched part below fits a step.
            let share = (step / slots.len()).max(1);
            while missing.len() > share {
                let n = (missing.len() - share).min(step);
                d.step(&mut [Part {
                    slot,
                    tokens: &missing[..n],
                    logits: Logits::None,
                }])?;
                missing = &missing[n..];
            }
            rest.push((slot, missing.to_vec()));
        }
        let mut parts: Vec<Part> = rest
            .iter()
            .map(|(slot, t)| Part {
                slot: *slot,
                tokens: t,
                logits: Logits::Last,
            })
            .collect();
        d.step(&mut parts)?;
        drop(parts);
        // Draft: one token per slot per step; a slot stops at its own count.
        let most = slots.iter().map(|s| s.1).max().unwrap_or(0);
        let mut last: Vec<[u32; 1]> = vec![[0]; slots.len()];
        for i in 0..most {
            for (j, &(slot, k)) in slots.iter().enumerate() {
                if i < k {
                    let t = d.sample_slot(slot, &mut greedy)?;
                    self.feed[slot].push(t);
                    last[j] = [t];
                }
            }
            if i + 1 == most {
                break;
            }
            let mut parts: Vec<Part> = slots
                .iter()
                .zip(&last)
                .filter(|(&(_, k), _)| i + 1 < k)
                .map(|(&(slot, _), t)| Part {
                    slot,
                    tokens: t,
                    logits: Logits::Last,
                })
                .collect();
            if parts.is_empty() {
                break;
            }
            d.step(&mut parts)?;
        }
        Ok(())
    }

    /// Run the planned step and apply its results.
    fn step(&mut self, work: &[Work]) {
        self.emitted = 0;
        // One callback per speculating slot, collecting the greedy pick at each position.
        let mut pick_refs: Vec<Option<&mut Vec<u32>>> = self.picks.iter_mut().map(Some).collect();
        let mut fs: Vec<Box<dyn FnMut(usize, u32) + '_>> = Vec::new();
        for w in work {
            if let Work::Decode { slot, len } = *w {
                if len > 1 {
                    let p = pick_refs[slot].take().expect("one part per slot");
                    p.clear();
                    fs.push(Box::new(move |_, t| p.push(t)));
                }
            }
        }
        // One callback per embedding slot's prompt chunk, pooling its rows.
        let mut pool_refs: Vec<Option<&mut crate::embed::Pool>> =
            self.pools.iter_mut().map(|p| p.as_mut()).collect();
        let mut hs: Vec<Box<RowFn<'_>>> = Vec::new();
        for w in work {
            if let Work::Prefill { slot, start, .. } = *w {
                if let Some(pool) = pool_refs[slot].take() {
                    hs.push(Box::new(move |i, row| pool.add(start + i, row)));
                }
            }
        }
        let mut hs_iter = hs.iter_mut();
        let mut fs_iter = fs.iter_mut();
        let mut parts: Vec<Part> = Vec::with_capacity(work.len());
        for w in work {
            let a = self.slots[w.slot()].as_ref().expect("planned slot");
            parts.push(match *w {
                Work::Decode { slot, len } => Part {
                    slot,
                    tokens: &self.feed[slot][..len],
                    logits: if len > 1 {
                        Logits::Argmax {
                            from: 0,
                            f: &mut **fs_iter.next().expect("a callback per speculating slot"),
                        }
                    } else {
                        Logits::Last
                    },
                },
                Work::Prefill {
                    slot,
                    start,
                    len,
                    last,
                } => Part {
                    slot,
                    tokens: &a.source()[start..start + len],
                    logits: if a.req.embed.is_some() {
                        Logits::Hidden {
                            from: 0,
                            f: &mut **hs_iter.next().expect("a callback per embedding slot"),
                        }
                    } else if last {
                        Logits::Last
                    } else {
                        Logits::None
                    },
                },
            });
        }
        let result = self.runner.step(&mut parts);
        drop(parts);
        drop(fs);
        drop(hs);
        self.status.steps.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = result {
            for w in work {
                if let Some(mut a) = self.slots[w.slot()].take() {
                    (a.req.on_event)(Event::Error(e.to_string()));
                }
            }
            return;
        }
        for w in work {
            let slot = w.slot();
            let a = self.slots[slot].as_mut().expect("planned slot");
            match *w {
                Work::Prefill { len, last, .. } => {
                    a.fed += len;
                    if !last {
                        self.take_reused(slot);
                        continue;
                    }
                    // A resumed request's text is in again: it decodes on.
                    a.source = None;
                    if a.req.embed.is_some() {
                        self.finish_embedding(slot);
                        continue;
                    }
                }
                Work::Decode { len, .. } if len > 1 => {
                    self.verify(slot, len);
                    continue;
                }
                Work::Decode { .. } => self.emitted += 1,
            }
            self.sample(slot);
        }
    }

    /// After a speculating decode step: keep the proposals the model agrees with and its own next
    /// token; drop the rest from the cache.
    fn verify(&mut self, slot: usize, len: usize) {
        let draft = &self.feed[slot][1..len];
        let agree = crate::spec::agreeing(draft, &self.picks[slot]);
        let mut out: Vec<u32> = draft[..agree].to_vec();
        out.push(self.picks[slot][agree]);
        self.emitted += out.len();
        let held = self.runner.slot_tokens(slot).len();
        self.runner.truncate_slot(slot, held - len + 1 + agree);
        self.status
            .spec_proposed
            .fetch_add((len - 1) as u64, Ordering::Relaxed);
        self.status
            .spec_accepted
            .fetch_add(agree as u64, Ordering::Relaxed);
        if let Some(sp) = self.spec {
            self.draft_k[slot] = crate::spec::next_k(self.draft_k[slot], len - 1, agree, sp.max);
        }
        for t in out {
            if !self.take(slot, t) {
                break;
            }
        }
    }

    /// An embedding request's prompt is in: send its pooled vector and end it.
    fn finish_embedding(&mut self, slot: usize) {
        let mut a = self.slots[slot].take().expect("planned slot");
        let v = self.pools[slot]
            .take()
            .map(|mut p| p.finish())
            .unwrap_or_default();
        self.status.active.fetch_sub(1, Ordering::SeqCst);
        let usage = Usage {
            prompt_tokens: a.req.prompt.len(),
            cached_tokens: a.cached,
            completion_tokens: 0,
            reasoning_tokens: 0,
            finish: Finish::Stop,
            time_to_first_token: a.admitted.elapsed(),
            total: a.submitted.elapsed(),
            stop_sequence: None,
        };
        if (a.req.on_event)(Event::Embedding(v)) {
            (a.req.on_event)(Event::Done(usage));
        }
    }

    /// Sample a slot's next token, stream its text, and finish it when it is done.
    fn sample(&mut self, slot: usize) {
        let a = self.slots[slot].as_mut().expect("planned slot");
        match self.runner.sample_slot(slot, &mut a.sampler) {
            Ok(t) => {
                self.take(slot, t);
            }
            Err(e) => {
                let mut a = self.slots[slot].take().expect("planned slot");
                (a.req.on_event)(Event::Error(e.to_string()));
            }
        }
    }

    /// A slot's next token: stream its text, finish the request when it is done. False when the
    /// slot was freed.
    fn take(&mut self, slot: usize, t: u32) -> bool {
        let ctx = self.runner.ctx();
        let a = self.slots[slot].as_mut().expect("planned slot");
        a.generated += 1;
        self.status.generated.fetch_add(1, Ordering::Relaxed);
        if let Some(w) = a.watch.as_mut() {
            if w.push(self.tok.token_bytes(t)) {
                if let Some(think) = &a.req.think {
                    a.sampler.force(&think.close);
                }
            }
            a.sampler.hold = w.pending();
        }
        a.first.get_or_insert_with(|| a.admitted.elapsed());
        let finish = if self.tok.is_stop(t) && !a.req.ignore_eos {
            Some(Finish::Stop)
        } else {
            if let Some(lp) = a.sampler.last.take() {
                if !(a.req.on_event)(Event::Logprobs(lp)) {
                    self.slots[slot] = None;
                    return false;
                }
            }
            let (text, hit) = a.stream.push(self.tok, t);
            if !text.is_empty() && !(a.req.on_event)(Event::Text(text.to_string())) {
                self.slots[slot] = None;
                return false;
            }
            if hit && a.stream.indent_hit() {
                Some(Finish::Length)
            } else if hit || a.sampler.grammar_done() {
                Some(Finish::Stop)
            } else if a.generated >= a.req.max_tokens
                || self.runner.slot_tokens(slot).len() + 1 >= ctx
                || a.req.deadline.is_some_and(|d| Instant::now() >= d)
            {
                Some(Finish::Length)
            } else {
                None
            }
        };
        let Some(finish) = finish else {
            a.next = Some(t);
            return true;
        };
        let mut a = self.slots[slot].take().expect("planned slot");
        // Free before the final event: a client that has its answer sees the slot free.
        self.status.active.fetch_sub(1, Ordering::SeqCst);
        let rest = a.stream.finish();
        if !rest.is_empty() {
            let rest = rest.to_string();
            (a.req.on_event)(Event::Text(rest));
        }
        let usage = Usage {
            prompt_tokens: a.req.prompt.len(),
            cached_tokens: a.cached,
            completion_tokens: a.generated,
            reasoning_tokens: a.watch.as_ref().map_or(0, |w| w.tokens()),
            finish,
            time_to_first_token: a.first.unwrap_or_default(),
            total: a.submitted.elapsed(),
            stop_sequence: a.stream.stop_hit().map(str::to_string),
        };
        (a.req.on_event)(Event::Done(usage));
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy(prompt_len: usize, fed: usize, decoding: bool) -> Option<SlotState> {
        Some(SlotState {
            prompt_len,
            fed,
            prefill_end: prompt_len,
            decoding,
            decode_len: 1,
        })
    }

    #[test]
    fn decoding_slots_always_get_their_token_first() {
        let mut w = Vec::new();
        let slots = [
            busy(4000, 0, false),
            busy(10, 10, true),
            None,
            busy(7, 7, true),
        ];
        plan(&slots, 128, 1, &mut w);
        assert_eq!(
            w,
            vec![
                Work::Decode { slot: 1, len: 1 },
                Work::Decode { slot: 3, len: 1 },
                Work::Prefill {
                    slot: 0,
                    start: 0,
                    len: 126,
                    last: false
                },
            ]
        );
        let total: usize = w
            .iter()
            .map(|w| match w {
                Work::Decode { .. } => 1,
                Work::Prefill { len, .. } => *len,
            })
            .sum();
        assert_eq!(total, 128);
    }

    #[test]
    fn prompts_fill_the_room_in_chunks_and_finish() {
        let mut w = Vec::new();
        plan(&[busy(300, 256, false), busy(50, 0, false)], 64, 1, &mut w);
        assert_eq!(
            w,
            vec![
                Work::Prefill {
                    slot: 0,
                    start: 256,
                    len: 44,
                    last: true
                },
                Work::Prefill {
                    slot: 1,
                    start: 0,
                    len: 20,
                    last: false
                },
            ]
        );
        plan(&[None, None], 64, 1, &mut w);
        assert!(w.is_empty());
        // More decoding slots than room: the budget holds.
        plan(
            &[busy(1, 1, true), busy(1, 1, true), busy(1, 1, true)],
            2,
            1,
            &mut w,
        );
        assert_eq!(w.len(), 2);
    }

    /// With a runner whose passes of 64 rows and more compute every row alike, no prompt chunk
    /// of a prompt of 128 tokens or more is shorter than 64 rows where the room allows.
    #[test]
    fn prompt_chunks_keep_the_uniform_pass_length() {
        let mut w = Vec::new();
        let lens = |w: &[Work]| -> Vec<usize> {
            w.iter()
                .map(|x| match x {
                    Work::Prefill { len, .. } => *len,
                    Work::Decode { len, .. } => *len,
                })
                .collect()
        };
        // 530 tokens in steps of 512: 466 then 64, not 512 then 18.
        plan(&[busy(530, 0, false)], 512, 64, &mut w);
        assert_eq!(lens(&w), vec![466]);
        plan(&[busy(530, 466, false)], 512, 64, &mut w);
        assert_eq!(lens(&w), vec![64]);
        // Without the promise, the room decides.
        plan(&[busy(530, 0, false)], 512, 1, &mut w);
        assert_eq!(lens(&w), vec![512]);
        // Room for less than 64 rows: the chunk takes the room (the prompt still advances).
        plan(&[busy(1, 1, true), busy(300, 0, false)], 40, 64, &mut w);
        assert_eq!(lens(&w), vec![1, 39]);
        // A prompt below 128 tokens is split as the room falls.
        plan(&[busy(100, 0, false)], 80, 64, &mut w);
        assert_eq!(lens(&w), vec![80]);
        // Up to a reused chunk (moved rows) the room decides too.
        let mut s = busy(530, 0, false);
        s.as_mut().unwrap().prefill_end = 520;
        plan(&[s], 512, 64, &mut w);
        assert_eq!(lens(&w), vec![512]);
    }

    /// `choose_slot`'s slot and kept prefix.
    fn pick<'a>(
        free: impl Iterator<Item = (usize, Option<u64>, &'a [u32])>,
        tenant: u64,
        prompt: &[u32],
        cache_reuse: usize,
    ) -> Option<(usize, usize)> {
        choose_slot(free, tenant, prompt, cache_reuse).map(|(s, k, _)| (s, k))
    }

    #[test]
    fn a_slot_is_chosen_by_the_longest_prefix_of_the_same_tenant() {
        let a: &[u32] = &[1, 2, 3, 4];
        let b: &[u32] = &[1, 2, 9];
        let free = || vec![(0, Some(7), a), (1, Some(8), b), (2, None, &[][..])].into_iter();
        // Tenant 7 keeps 3 tokens of slot 0.
        assert_eq!(pick(free(), 7, &[1, 2, 3, 4, 5], 0), Some((0, 4)));
        // Tenant 8 cannot reuse slot 0's tokens, only its own slot 1's.
        assert_eq!(pick(free(), 8, &[1, 2, 3, 4, 5], 0), Some((1, 2)));
        // A stranger reuses nothing and takes the empty slot: the others stay cached.
        assert_eq!(pick(free(), 9, &[1, 2, 3], 0), Some((2, 0)));
        assert_eq!(pick(std::iter::empty(), 9, &[1], 0), None);
        // A side request sharing a template's first tokens with a long conversation takes the
        // empty slot; the conversation's next turn takes its own.
        let talk: Vec<u32> = (1..200).collect();
        let free = || vec![(0, Some(7), &talk[..]), (1, Some(7), &[][..])].into_iter();
        assert_eq!(pick(free(), 7, &[1, 2, 3, 900, 901], 0), Some((1, 0)));
        let next: Vec<u32> = (1..230).collect();
        assert_eq!(pick(free(), 7, &next, 0), Some((0, 199)));
        // With no empty slot, the one that throws least away.
        let short: &[u32] = &[50, 51, 52];
        let full = vec![(0, Some(7), &talk[..]), (1, Some(8), short)].into_iter();
        assert_eq!(pick(full, 7, &[1, 2, 3, 900], 0), Some((1, 0)));
        // An edit near the top of a cached file: a short prefix, the rest moved with cache reuse
        // (runs of 16 or more): the file's slot, not the empty one.
        let mut edited: Vec<u32> = vec![1, 2, 3, 900];
        edited.extend(5..200);
        assert_eq!(pick(free(), 7, &edited, 16), Some((0, 3)));
        // ... and the runs it found are the ones admission moves.
        let (_, _, chunks) = choose_slot(free(), 7, &edited, 16).unwrap();
        assert_eq!(chunks, reuse_chunks(&talk, &edited, 3, 16));
        assert!(!chunks.is_empty());
        assert_eq!(pick(free(), 7, &edited, 0), Some((1, 0)));
    }

    #[test]
    fn a_longer_prefix_in_another_slot_of_the_same_tenant_is_copied() {
        let sys: Vec<u32> = (0..100).collect();
        let mut a = sys.clone();
        a.extend([500, 501]);
        let mut b = sys[..40].to_vec();
        b.push(600);
        let mut prompt = sys.clone();
        prompt.extend([700, 701, 702]);
        let others = || vec![(1, Some(7), &a[..]), (2, Some(7), &b[..])].into_iter();
        // Tenant 7 takes slot 1's 100 tokens (the longest), whatever the chosen slot keeps below
        // that by COPY_MIN.
        assert_eq!(copy_source(others(), 7, &prompt, 0), Some((1, 100)));
        assert_eq!(copy_source(others(), 7, &prompt, 68), Some((1, 100)));
        // Too little to gain: the chosen slot keeps 69 or more.
        assert_eq!(copy_source(others(), 7, &prompt, 69), None);
        // Another tenant's slots are never read.
        assert_eq!(copy_source(others(), 8, &prompt, 0), None);
        let stranger = vec![(1, Some(8), &a[..]), (2, None, &a[..])];
        assert_eq!(copy_source(stranger.into_iter(), 7, &prompt, 0), None);
        // The prompt's last token is always run (its logits start the answer).
        assert_eq!(copy_source(others(), 7, &sys, 0), Some((1, 99)));
    }
}
