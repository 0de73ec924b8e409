//! `mens`: the command line. Thin: parse flags, call the engine, print. Every error exits with code 2.

use anyhow::{bail, Context, Result};
use args::{BenchArgs, ChatArgs, ModelArgs, PerplexityArgs, ProbeArgs, RunArgs, SynthArgs};
use clap::{Parser, Subcommand};
use mens::load::{Backend, LoadOptions, Loaded};
use mens::runner::Runner;
use std::path::PathBuf;

mod args;
mod bench;
mod chat_input;
mod perplexity;
mod probe;
mod run;
mod serve;

#[global_allocator]
static GLOBAL: mens::alloc::Counting = mens::alloc::Counting;

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

/// The backend `--backend` names (auto: the best this build and machine have).
pub(crate) fn backend(args: &ModelArgs) -> Backend {
    args.backend.resolve()
}

/// Load and admit a model for `slots` sequences (the server's `--parallel`; 1 elsewhere), with chat
/// templates rendered in the `render-template` helper.
pub(crate) fn load(args: &ModelArgs, slots: usize) -> Result<Loaded> {
    let n = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    if n == 0 || n > 1024 {
        bail!("invalid argument: --threads must be between 1 and 1024");
    }
    mens::cpu::set_threads(n);
    let memory_budget = args
        .memory_budget
        .as_deref()
        .map(mens::memory::parse_size)
        .transpose()?;
    if let Some(b) = memory_budget {
        let ram = mens::memory::probe().total_ram;
        if b > ram {
            eprintln!(
                "mens: warning: --memory-budget {} MiB is more than this machine's {} MiB of RAM",
                b >> 20,
                ram >> 20
            );
        }
    }
    let chat_template = match &args.chat_template_file {
        Some(f) => Some(mens::chat::read_template_file(f)?),
        None => None,
    };
    let options = LoadOptions {
        chat_template,
        path: model_path(args)?,
        backend: backend(args),
        ctx: args.ctx_size,
        memory_budget,
        slots,
        cache: (
            mens::model::KvType::parse(&args.cache_type_k)?,
            mens::model::KvType::parse(&args.cache_type_v)?,
        ),
        isolation: Some(mens::chat::Isolation {
            program: std::env::current_exe().context("cannot find the mens executable")?,
            args: vec![
                "render-template".into(),
                "--memory-limit".into(),
                TEMPLATE_MEMORY.to_string(),
            ],
            memory_limit: TEMPLATE_MEMORY,
            timeout: std::time::Duration::from_secs(10),
        }),
    };
    let l = mens::load::load(&options)?;
    let c = &l.model.config;
    if let Some(ctx) = args.ctx_size.filter(|&x| x > c.train_ctx) {
        eprintln!(
            "mens: warning: context {ctx} is larger than the model's trained context {}",
            c.train_ctx
        );
    }
    if !l.plan.is_empty() {
        eprintln!("mens: {}", l.plan);
    }
    eprintln!(
        "mens: loaded {} ({:?}, {} layers, d={}, {} heads / {} kv, vocab {}) on {} — {:.0} MiB of weights in {:.2} s",
        c.name,
        c.arch,
        c.n_layer,
        c.dim,
        c.n_head,
        c.n_kv_head,
        c.vocab_size,
        match l.backend {
            mens::load::Backend::Cpu => format!("cpu ({})", mens::kernels::cpu_kernels()),
            b => b.name().to_string(),
        },
        l.model.weight_bytes() as f64 / (1 << 20) as f64,
        l.load_time.as_secs_f64()
    );
    Ok(l)
}

/// A sequence on the loaded backend, with a progress bar while a GPU is loaded.
pub(crate) fn runner(l: &Loaded) -> Result<Box<dyn Runner>> {
    runner_for(l, false)
}

/// [`runner`], for speculative decoding when `spec`: on CUDA a batch of one slot, whose decode
/// graph verifies the proposals as rows at consecutive positions (a CUDA session verifies them
/// one position at a time).
pub(crate) fn runner_for(l: &Loaded, spec: bool) -> Result<Box<dyn Runner>> {
    let bar = indicatif::ProgressBar::new(l.model.config.n_layer as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("uploading {bar:40} {pos}/{len} layers")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut log = |m| eprintln!("mens: {m}");
    let mut progress = |i, _| bar.set_position(i as u64);
    let r = if spec && l.backend == Backend::Cuda {
        l.target().batch_runner(1, 512, &mut log, &mut progress)
    } else {
        l.runner(&mut log, &mut progress)
    };
    bar.finish_and_clear();
    Ok(r?)
}

/// The memory line printed after a run: the estimate against the measured peak (CPU).
pub(crate) fn print_memory(l: &Loaded) {
    if l.backend != Backend::Cpu {
        return;
    }
    if let Some(peak) = mens::memory::peak_rss() {
        eprintln!(
            "mens: memory: estimated {} MiB, peak RSS {} MiB",
            l.estimate.total() >> 20,
            peak >> 20
        );
    }
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MENS_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // llama.cpp spells the draft model `-md` and the cache types `-ctk` / `-ctv`: short flags of
    // more than one letter, which clap cannot declare.
    let argv = std::env::args_os().map(|a| match a.to_str() {
        Some("-md") => "--model-draft".into(),
        Some("-ctk") => "--cache-type-k".into(),
        Some("-ctv") => "--cache-type-v".into(),
        _ => a,
    });
    let cli = Cli::parse_from(argv);
    let r = match cli.command {
        Command::Run(a) => run::run(a),
        Command::Chat(a) => run::chat(a),
        Command::Perplexity(a) => perplexity::run(a).context("perplexity"),
        Command::Bench(a) => bench::run(a),
        Command::Probe(a) => probe::probe(a),
        Command::Serve(a) => serve::run(a),
        Command::Synth(a) => probe::synth(a),
        Command::RenderTemplate { memory_limit } => {
            mens::chat::render_isolated_main(memory_limit).context("render-template")
        }
    };
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}
