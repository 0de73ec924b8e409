//! `mens`: the command line. Thin: parse flags, call the engine, print. Every error exits with code 2.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use mens::chat::{ChatTemplate, Message};
use mens::engine::{Runner, Session, SessionOptions};
use mens::generate::{generate, GenerateOptions, Stats};
use mens::model::Model;
use mens::sample::{Sampler, SamplerConfig};
use mens::tokenizer::Tokenizer;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

mod bench;
mod gpu;
mod perplexity;
mod serve;

/// Counts heap allocations (for `mens bench`'s allocations per decode step).
struct CountingAllocator;
pub(crate) static ALLOCATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::alloc::System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        // Forwarded, so that large zeroed buffers (the KV cache) stay lazily backed (calloc).
        ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::alloc::System.alloc_zeroed(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        std::alloc::System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, n: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::alloc::System.realloc(p, l, n)
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

#[derive(Parser)]
#[command(
    name = "mens",
    version,
    about = "Local LLM inference: GGUF models on your own machine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a completion (or, with --chat, a chat answer) for one prompt, streamed to stdout.
    Run(RunArgs),
    /// Interactive multi-turn chat in the terminal; the KV cache is kept between turns.
    Chat(ChatArgs),
    /// Perplexity of a text file over non-overlapping windows, as llama-perplexity computes it.
    Perplexity(PerplexityArgs),
    /// Prefill and decode speed, memory, allocations and dispatches per step (like llama-bench).
    Bench(BenchArgs),
    /// What mens sees of this machine: CPU, memory, limits, GPUs, and the memory budget.
    Probe(ProbeArgs),
    /// An OpenAI-compatible HTTP server (localhost by default) decoding many requests together.
    Serve(serve::ServeArgs),
    /// Write a random-weight Qwen2.5 model of a real shape (0.5b, 1.5b, 7b) in llama.cpp's Q4_K_M
    /// layout, for measurements at sizes whose real file is not at hand.
    Synth(SynthArgs),
    /// Internal: render a chat template in this process, under a memory limit (the helper that
    /// `mens` runs for every chat prompt, so that a hostile template cannot exhaust its memory).
    #[command(hide = true)]
    RenderTemplate {
        #[arg(long)]
        memory_limit: u64,
    },
}

/// Address space of the template helper process: rendering a long conversation needs tens of MiB.
const TEMPLATE_MEMORY: u64 = 1 << 30;

#[derive(Args)]
struct SynthArgs {
    /// 0.5b, 1.5b or 7b.
    #[arg(long)]
    shape: String,
    /// Output GGUF file.
    #[arg(short, long)]
    output: PathBuf,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn synth(a: SynthArgs) -> Result<()> {
    use mens::synth::{synth_q4_k_m, QwenShape};
    let shape = QwenShape::by_name(&a.shape).ok_or_else(|| {
        anyhow::anyhow!(
            "invalid argument: unknown shape {:?} (0.5b, 1.5b or 7b)",
            a.shape
        )
    })?;
    let w = synth_q4_k_m(&shape, a.seed);
    let file = std::fs::File::create(&a.output)
        .with_context(|| format!("cannot create {}", a.output.display()))?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    w.write_to(&mut out)
        .and_then(|_| out.flush())
        .with_context(|| format!("cannot write {}", a.output.display()))?;
    let bytes: usize = w.tensors().map(|t| t.3).sum();
    eprintln!(
        "mens: wrote {} (Qwen2.5 {} shape, Q4_K_M layout, {:.0} MiB of random weights)",
        a.output.display(),
        shape.name,
        bytes as f64 / 1048576.0
    );
    Ok(())
}

#[derive(Args, Clone)]
pub(crate) struct ModelArgs {
    /// Path to a GGUF model file [default: $MENS_MODELS/qwen2.5-coder-0.5b.gguf, where MENS_MODELS
    /// defaults to ~/.cache/mens/models; `scripts/fetch-models.sh` puts it there].
    #[arg(short, long)]
    model: Option<PathBuf>,
    /// Context length in tokens [default: the largest that fits the memory budget, up to the model's
    /// trained context].
    #[arg(short = 'c', long = "ctx-size")]
    ctx_size: Option<usize>,
    /// Memory budget for model + KV cache + buffers, e.g. 3G or 512M [default: from `mens probe`].
    #[arg(long)]
    memory_budget: Option<String>,
    /// Threads for the CPU kernels (default: all logical cores).
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// Compute backend: cpu, or cuda / metal in a build with that feature.
    #[arg(long, default_value = "cpu")]
    pub backend: String,
}

#[derive(Args, Clone)]
struct SampleArgs {
    /// Temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8, allow_negative_numbers = true)]
    temperature: f32,
    /// Top-k (0 disables).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Top-p (1 disables).
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true)]
    top_p: f32,
    /// Min-p (0 disables).
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    min_p: f32,
    /// Repetition penalty (1 disables).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Tokens the repetition penalty looks back over.
    #[arg(long, default_value_t = 64)]
    repeat_last_n: usize,
    /// Random seed (same seed, same output).
    #[arg(long, default_value_t = 0xDEC0DE)]
    seed: u64,
    /// Stop when this string is generated (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 256)]
    n_predict: usize,
    /// Re-run the whole sequence for every token instead of using the KV cache (a baseline).
    #[arg(long)]
    no_kv_cache: bool,
}

impl SampleArgs {
    fn config(&self) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: self.seed,
        }
    }
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sample: SampleArgs,
    /// The prompt.
    #[arg(short, long)]
    prompt: String,
    /// Render the prompt as a user message with the model's chat template.
    #[arg(long)]
    chat: bool,
    /// System message (with --chat).
    #[arg(long)]
    system: Option<String>,
}

#[derive(Args)]
struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sample: SampleArgs,
    /// System message.
    #[arg(long)]
    system: Option<String>,
}

#[derive(Args)]
pub(crate) struct PerplexityArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The text file.
    #[arg(short = 'f', long)]
    file: PathBuf,
    /// Score only the first N windows.
    #[arg(long)]
    chunks: Option<usize>,
}

#[derive(Args)]
struct ProbeArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt sizes for time to first token (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "512,2048,8192")]
    prompt: Vec<usize>,
    /// Decode steps timed one by one after a 16-token prompt (0 skips the schedule).
    #[arg(long, default_value_t = 512)]
    steps: usize,
    /// Steps at which decode tokens/s is reported, each over a window of --window steps.
    #[arg(long, value_delimiter = ',', default_value = "1,256,512")]
    at: Vec<usize>,
    /// Steps in each reported window.
    #[arg(long, default_value_t = 16)]
    window: usize,
    /// Paired flatness test: this many decode steps on a sequence at step 1 alternating with as
    /// many on a second sequence at the last --at step, so that machine drift hits both alike
    /// (0 skips it).
    #[arg(long, default_value_t = 32)]
    paired: usize,
    /// llama-bench-style decode tests: --gen tokens after a context of each depth (comma-separated).
    #[arg(long, value_delimiter = ',')]
    depth: Vec<usize>,
    /// Tokens generated in each --depth test.
    #[arg(long, default_value_t = 128)]
    gen: usize,
    /// Repetitions of the prefill and depth tests (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Decode by re-running the whole sequence each step (the uncached baseline).
    #[arg(long, conflicts_with = "compare")]
    no_kv_cache: bool,
    /// Run the decode schedule both with and without the KV cache, side by side.
    #[arg(long)]
    compare: bool,
    /// Write every figure and the machine as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the Markdown table to this file.
    #[arg(long)]
    md: Option<PathBuf>,
    /// Write an SVG plot of per-step decode time against step.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
    /// GPU: also time every kernel of a decode step (launched one by one, at the end of the
    /// decode schedule) and print the table.
    #[arg(long)]
    profile: bool,
}

/// A loaded model with its tokenizer and chat template.
pub(crate) struct Loaded {
    pub model: Arc<Model>,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    /// Session options admitted by the memory budget.
    pub options: SessionOptions,
    pub estimate: mens::memory::Estimate,
}

fn init_threads(threads: Option<usize>) -> Result<()> {
    let n = threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    if n == 0 || n > 1024 {
        bail!("invalid argument: --threads must be between 1 and 1024");
    }
    mens::kernels::pool::set_threads(n);
    Ok(())
}

/// The model path: `-m`, or the default model in the models directory.
pub(crate) fn model_path(args: &ModelArgs) -> Result<PathBuf> {
    if let Some(p) = &args.model {
        return Ok(p.clone());
    }
    let dir = match std::env::var_os("MENS_MODELS") {
        Some(d) => PathBuf::from(d),
        None => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/mens/models")
        }
    };
    let p = dir.join("qwen2.5-coder-0.5b.gguf");
    if !p.exists() {
        bail!(
            "no model given and the default model {} is missing: run scripts/fetch-models.sh, or pass -m MODEL.gguf",
            p.display()
        );
    }
    Ok(p)
}

pub(crate) fn load(args: &ModelArgs) -> Result<Loaded> {
    load_slots(args, 1)
}

/// Load a model admitted for `slots` sequences (the server's `--parallel`).
pub(crate) fn load_slots(args: &ModelArgs, slots: usize) -> Result<Loaded> {
    init_threads(args.threads)?;
    gpu::check_backend(&args.backend)?;
    let t0 = Instant::now();
    let model = Model::open(&model_path(args)?)?;
    let on_cpu = args.backend == "cpu";
    // Admission: before any weight page is touched. A GPU backend admits against device memory
    // when it uploads (gpu.rs); the file stays mapped on the host.
    let options = if on_cpu {
        admit_slots(&model, args, args.ctx_size, slots)?
    } else {
        SessionOptions {
            ctx: args.ctx_size.unwrap_or(0),
            ..Default::default()
        }
    };
    let estimate = mens::memory::estimate(&model, &options);
    let tokenizer = Tokenizer::from_gguf(&model.gguf)?;
    tokenizer.check_model(model.config.vocab_size)?;
    if on_cpu {
        prefault(&model);
    }
    let mut template = ChatTemplate::from_gguf(&model.gguf, &tokenizer)?;
    template.isolate(mens::chat::Isolation {
        program: std::env::current_exe().context("cannot find the mens executable")?,
        args: vec![
            "render-template".into(),
            "--memory-limit".into(),
            TEMPLATE_MEMORY.to_string(),
        ],
        memory_limit: TEMPLATE_MEMORY,
        timeout: std::time::Duration::from_secs(10),
    });
    let c = &model.config;
    eprintln!(
        "mens: loaded {} ({:?}, {} layers, d={}, {} heads / {} kv, vocab {}) — {:.0} MiB of weights in {:.2} s",
        c.name,
        c.arch,
        c.n_layer,
        c.dim,
        c.n_head,
        c.n_kv_head,
        c.vocab_size,
        model.weight_bytes() as f64 / (1 << 20) as f64,
        t0.elapsed().as_secs_f64()
    );
    Ok(Loaded {
        model: Arc::new(model),
        tokenizer,
        template,
        options,
        estimate,
    })
}

fn budget(args: &ModelArgs) -> Result<mens::memory::Budget> {
    use mens::memory::{Backend, Budget};
    Ok(match &args.memory_budget {
        Some(s) => {
            let bytes = mens::memory::parse_size(s)?;
            Budget {
                backend: Backend::Cpu,
                bytes,
                base: bytes,
                how: "--memory-budget".into(),
            }
        }
        None => mens::memory::budget(&mens::memory::probe(), Backend::Cpu)?,
    })
}

/// Check that the model and a context of `ctx` tokens (or, when None, the largest that fits) fit the
/// memory budget; say what was chosen.
/// Admission for `slots` sequences of one context each (the server).
pub(crate) fn admit_slots(
    model: &Model,
    args: &ModelArgs,
    ctx: Option<usize>,
    slots: usize,
) -> Result<SessionOptions> {
    if let Some(c) = ctx {
        if c == 0 || c > 1 << 20 {
            bail!(
                "invalid argument: --ctx-size must be between 1 and {}",
                1 << 20
            );
        }
        if c > model.config.train_ctx {
            eprintln!(
                "mens: warning: context {c} is larger than the model's trained context {}",
                model.config.train_ctx
            );
        }
    }
    let b = budget(args)?;
    let options = mens::memory::fit_context_slots(model, &b, ctx, 512, slots)?;
    let e = mens::memory::estimate_slots(model, &options, slots);
    eprintln!(
        "mens: memory budget {} MiB ({}); context {} tokens{}{}; estimated use {} MiB",
        b.bytes >> 20,
        b.how,
        options.ctx,
        if slots > 1 {
            format!(" × {slots} slots")
        } else {
            String::new()
        },
        if ctx.is_none() {
            " (the largest that fits, up to the trained context)"
        } else {
            ""
        },
        e.total() >> 20
    );
    Ok(options)
}

fn probe(args: ProbeArgs) -> Result<()> {
    use mens::memory::{budget, probe, Backend};
    let m = probe();
    let b = budget(&m, Backend::Cpu);
    let cuda = m
        .gpus
        .iter()
        .any(|g| g.api == "cuda")
        .then(|| budget(&m, Backend::Cuda));
    if args.json {
        let v = serde_json::json!({
            "machine": m,
            "default_backend": "cpu",
            "budget": b.as_ref().ok(),
            "budget_error": b.as_ref().err().map(|e| e.to_string()),
            "cuda_budget": cuda.as_ref().and_then(|c| c.as_ref().ok()),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let gib = |x: u64| format!("{:.1} GiB", x as f64 / (1u64 << 30) as f64);
    println!("os:              {}", m.os);
    println!(
        "cpu:             {} ({} physical / {} logical cores)",
        m.cpu, m.physical_cores, m.logical_cores
    );
    println!(
        "simd:            {}",
        if m.simd.is_empty() {
            "none used".into()
        } else {
            m.simd.join(" ")
        }
    );
    println!(
        "memory:          {} total, {} available{}",
        gib(m.total_ram),
        gib(m.available_ram),
        if m.unified_memory { " (unified)" } else { "" }
    );
    if let Some(c) = m.cgroup_limit {
        println!("cgroup limit:    {}", gib(c));
    }
    if m.gpus.is_empty() {
        println!("gpus:            none found");
    }
    for g in &m.gpus {
        println!(
            "gpu:             {} ({}), {} total, {} free",
            g.name,
            g.api,
            gib(g.total),
            gib(g.free)
        );
    }
    println!(
        "default backend: cpu (this build has: {}; --backend picks one)",
        gpu::backends().join(", ")
    );
    match b {
        Ok(b) => println!("memory budget:   {} = {}", gib(b.bytes), b.how),
        Err(e) => println!("memory budget:   none: {e}"),
    }
    if let Some(Ok(c)) = &cuda {
        println!("cuda budget:     {} = {}", gib(c.bytes), c.how);
    }
    Ok(())
}

/// Touch every page of the mapped file so the first token does not pay for disk reads; with a progress
/// bar, since a cold multi-GB file takes a while.
fn prefault(model: &Model) {
    let bytes: &[u8] = &model.gguf.storage;
    let bar = indicatif::ProgressBar::new(bytes.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("loading {bar:40} {bytes}/{total_bytes} ({eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    // Only draw when loading takes more than a moment.
    bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    let t0 = Instant::now();
    let mut sum = 0u8;
    for (i, chunk) in bytes.chunks(16 << 20).enumerate() {
        for p in chunk.iter().step_by(4096) {
            sum = sum.wrapping_add(*p);
        }
        if i == 0 || t0.elapsed().as_millis() > 300 {
            if bar.is_hidden() && t0.elapsed().as_millis() > 300 {
                bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            }
            bar.set_position((i as u64 + 1) * (16 << 20));
        }
    }
    std::hint::black_box(sum);
    bar.finish_and_clear();
}

fn session(l: &Loaded) -> Result<Session> {
    Ok(Session::new(l.model.clone(), l.options.clone())?)
}

/// A sequence on the backend `--backend` names.
pub(crate) fn runner(l: &Loaded, args: &ModelArgs) -> Result<Box<dyn Runner>> {
    if args.backend == "cpu" {
        return Ok(Box::new(session(l)?));
    }
    gpu::session(l, args)
}

/// The memory line printed after a run: the estimate against the measured peak.
fn print_memory(l: &Loaded) {
    if let Some(peak) = mens::memory::peak_rss() {
        eprintln!(
            "mens: memory: estimated {} MiB, peak RSS {} MiB",
            l.estimate.total() >> 20,
            peak >> 20
        );
    }
}

fn print_stats(s: &Stats) {
    eprintln!();
    eprintln!(
        "mens: prompt {} tokens, {:.1} ms, {:.2} tokens/s",
        s.prompt_tokens,
        s.prefill.as_secs_f64() * 1e3,
        s.prefill_tps()
    );
    eprintln!(
        "mens: generated {} tokens, decode {} steps, {:.1} ms, {:.2} tokens/s (stop: {:?})",
        s.generated,
        s.decode_steps,
        s.decode.as_secs_f64() * 1e3,
        s.decode_tps(),
        s.stop
    );
}

fn gen_options(a: &SampleArgs) -> GenerateOptions {
    GenerateOptions {
        max_tokens: a.n_predict,
        stop: a.stop.clone(),
        no_kv_cache: a.no_kv_cache,
    }
}

fn run(args: RunArgs) -> Result<()> {
    let config = args.sample.config();
    config.validate()?;
    let l = load(&args.model)?;
    let mut sess = runner(&l, &args.model)?;
    let mut sampler = Sampler::new(config, l.model.config.vocab_size)?;
    let tokens = if args.chat {
        let mut msgs = Vec::new();
        if let Some(s) = &args.system {
            msgs.push(Message::new("system", s));
        }
        msgs.push(Message::new("user", &args.prompt));
        l.template
            .tokens(&l.tokenizer, &msgs, true, l.options.ctx)?
    } else {
        l.tokenizer.encode(&args.prompt)?
    };
    let mut out = std::io::stdout().lock();
    if !args.chat {
        write!(out, "{}", args.prompt)?;
    }
    let stats = generate(
        &mut *sess,
        &l.tokenizer,
        &mut sampler,
        &tokens,
        &gen_options(&args.sample),
        |t| {
            let _ = write!(out, "{t}");
            let _ = out.flush();
            true
        },
    )?;
    writeln!(out)?;
    print_stats(&stats);
    print_memory(&l);
    Ok(())
}

fn chat(args: ChatArgs) -> Result<()> {
    let config = args.sample.config();
    config.validate()?;
    let l = load(&args.model)?;
    let mut sess = runner(&l, &args.model)?;
    let mut sampler = Sampler::new(config, l.model.config.vocab_size)?;
    let mut messages = Vec::new();
    if let Some(s) = &args.system {
        messages.push(Message::new("system", s));
    }
    eprintln!("mens: chat; an empty line or end of input quits, /reset forgets the conversation");
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let Some(line) = lines.next() else { break };
        let line = line?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if line == "/reset" {
            messages.retain(|m: &Message| m.role == "system");
            sess.truncate(0);
            continue;
        }
        messages.push(Message::new("user", line));
        let all = l
            .template
            .tokens(&l.tokenizer, &messages, true, usize::MAX)?;
        // Reuse the cached prefix: only the new turn is prefilled.
        let common = sess
            .tokens()
            .iter()
            .zip(&all)
            .take_while(|(a, b)| a == b)
            .count()
            .min(all.len() - 1);
        sess.truncate(common);
        let mut answer = String::new();
        let mut out = std::io::stdout().lock();
        let stats = generate(
            &mut *sess,
            &l.tokenizer,
            &mut sampler,
            &all[common..],
            &gen_options(&args.sample),
            |t| {
                answer.push_str(t);
                let _ = write!(out, "{t}");
                let _ = out.flush();
                true
            },
        );
        let stats = match stats {
            Ok(s) => s,
            Err(mens::Error::Context(m)) => {
                eprintln!("mens: {m}; the conversation is reset");
                messages.retain(|m: &Message| m.role == "system");
                sess.truncate(0);
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        writeln!(out)?;
        eprintln!(
            "mens: [{} new prompt tokens ({} reused), {:.1} tokens/s decode]",
            stats.prompt_tokens,
            common,
            stats.decode_tps()
        );
        messages.push(Message::new("assistant", &answer));
    }
    Ok(())
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MENS_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Run(a) => run(a),
        Command::Chat(a) => chat(a),
        Command::Perplexity(a) => perplexity::run(a).context("perplexity"),
        Command::Bench(a) => bench::run(a),
        Command::Probe(a) => probe(a),
        Command::Serve(a) => serve::run(a),
        Command::Synth(a) => synth(a),
        Command::RenderTemplate { memory_limit } => {
            mens::chat::render_isolated_main(memory_limit).context("render-template")
        }
    };
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}
