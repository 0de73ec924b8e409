//! `mens serve`: load the model, start the engine's scheduler and the HTTP server.

use crate::args::ModelArgs;
use crate::load;
use anyhow::{bail, Context, Result};
use clap::Args;
use mens::load::Backend;
use mens::scheduler::{RunnerFactory, Scheduler, SchedulerOptions};

/// Where `--spec draft`'s model runs: beside the target on the CPU, or as a second GPU batch.
enum Draft {
    Cpu(Arc<mens::model::Model>),
    Gpu(mens::load::Target),
}
use mens_server::{AppState, ServerConfig};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Args, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to bind; anything but loopback exposes the model to the network.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port (0 picks a free one; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on /v1/ routes (repeatable: each
    /// key is its own tenant, whose cached prompts no other key can reuse).
    #[arg(long)]
    api_key: Vec<String>,
    /// Read API keys from this file, one per line.
    #[arg(long)]
    api_key_file: Option<PathBuf>,
    /// A browser origin allowed to call the API, e.g. http://localhost:3000 (repeatable; `*` for
    /// any). Requests from other origins get 403; non-browser clients send no origin.
    #[arg(long)]
    cors_origin: Vec<String>,
    /// Host header values to answer (DNS rebinding protection) [default: localhost, 127.0.0.1 and
    /// ::1 when bound to loopback; any otherwise].
    #[arg(long, value_delimiter = ',')]
    allowed_hosts: Vec<String>,
    /// Connections from one client address at once; when reached, its oldest idle one is closed.
    #[arg(long, default_value_t = 128)]
    max_connections_per_client: usize,
    /// Most tokens one request may generate [default: the rest of the context].
    #[arg(long)]
    max_tokens_cap: Option<usize>,
    /// Cut a request's max_tokens to what the context (or --max-tokens-cap) holds, as
    /// llama-server does, instead of refusing it (agents such as OpenCode send 32000 whatever the
    /// model; the answer then ends with finish_reason "length" where the room ends).
    #[arg(long)]
    fit_max_tokens: bool,
    /// Seconds a request may generate for; then it ends with finish_reason "length".
    #[arg(long)]
    request_timeout: Option<u64>,
    /// Chat answers of reasoning models: `deepseek` puts a leading <think> block in
    /// `reasoning_content` (streamed as `delta.reasoning_content`), `none` leaves it in the text.
    #[arg(long, default_value = "deepseek", value_parser = ["deepseek", "none"])]
    reasoning_format: String,
    /// Most tokens a reasoning model's leading <think> block may hold; then its closing tag is
    /// forced and the answer follows (-1: unbounded, 0: closed at once). A request's
    /// `thinking_budget_tokens` (Anthropic: `thinking.budget_tokens`) overrides it.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    reasoning_budget: i64,
    /// Text forced before the closing tag when the reasoning budget is spent.
    #[arg(long, default_value = "")]
    reasoning_budget_message: String,
    /// How an embedding request's token rows become one vector (/v1/embeddings, /embedding,
    /// Ollama's /api/embed): mean, last (decoder embedding models such as Qwen3-Embedding), cls,
    /// or none (every token's row, /embedding only) [default: the file's pooling_type, else mean].
    #[arg(long, value_parser = ["none", "mean", "cls", "last"])]
    pooling: Option<String>,
    /// Accepted for llama-server's command lines: mens serves embeddings on the CPU backend
    /// whether or not it is given.
    #[arg(long, alias = "embedding")]
    embeddings: bool,
    /// Most tokens one batched step takes (decode tokens + prompt chunks): smaller keeps decoding
    /// streams smooth while a long prompt is prefilled, larger prefills faster. Default: 128 on the
    /// CPU, 8192 on a GPU (at least --parallel).
    #[arg(long)]
    step_tokens: Option<usize>,
    /// Sequences decoded together, each with its own KV cache of --ctx-size tokens.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Requests that may wait for a free slot; more get 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Reuse cached runs of at least N tokens that moved in a new prompt (an edit before them), as
    /// llama-server's --cache-reuse; 0 keeps only the common prefix. Editors: 256. On CUDA with
    /// an f16 cache.
    #[arg(long, default_value_t = 0, value_name = "N")]
    cache_reuse: usize,
    /// Speculative decoding for greedy requests (temperature 0, no penalties, grammar or
    /// logprobs): each such slot proposes up to --spec-max tokens per step (`ngram`: prompt
    /// lookup; `draft`: a small model of the same vocabulary, --model-draft), checked in the same
    /// batched step; the output is unchanged. CPU and CUDA (a CUDA draft needs -c).
    #[arg(long, value_enum)]
    spec: Option<crate::args::SpecKind>,
    /// The draft model for `--spec draft` (also `-md`), with its own cache for every slot.
    #[arg(long = "model-draft", value_name = "GGUF")]
    model_draft: Option<PathBuf>,
    /// Most tokens proposed per step (at most 48: a verify pass stays below the 64 rows from which
    /// prompt attention runs other arithmetic).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=48))]
    spec_max: u32,
    /// Speculate even in steps where it measures slower than plain decoding (by default the
    /// server switches it off there for 64 steps, then tries again): for benchmarks.
    #[arg(long)]
    spec_always: bool,
    /// Longest run of last tokens looked up.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=16))]
    spec_ngram: u32,
    /// Largest request body, e.g. 8M.
    #[arg(long, default_value = "8M")]
    body_limit: String,
    /// Model name in /v1/models and responses [default: the file name without .gguf].
    #[arg(long)]
    alias: Option<String>,
    /// Seconds a connection may take to send a request header (idle keep-alive connections close).
    #[arg(long, default_value_t = 30)]
    timeout: u64,
}

pub fn run(a: ServeArgs) -> Result<()> {
    if a.reasoning_budget < -1 {
        bail!("invalid argument: --reasoning-budget must be -1 (unbounded) or a number of tokens");
    }
    if a.parallel == 0 || a.parallel > 64 {
        bail!("invalid argument: --parallel must be between 1 and 64");
    }
    if a.queue == 0 || a.queue > 1 << 16 {
        bail!("invalid argument: --queue must be between 1 and 65536");
    }
    let body_limit = mens::memory::parse_size(&a.body_limit)?;
    if body_limit == 0 || body_limit > 1 << 30 {
        bail!("invalid argument: --body-limit must be between 1 byte and 1G");
    }
    let mut api_keys: Vec<String> = a.api_key.clone();
    if let Some(f) = &a.api_key_file {
        let s = std::fs::read_to_string(f)
            .with_context(|| format!("cannot read the API key file {}", f.display()))?;
        let keys: Vec<String> = s
            .lines()
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(str::to_string)
            .collect();
        if keys.is_empty() {
            bail!("the API key file {} is empty", f.display());
        }
        api_keys.extend(keys);
    }
    if api_keys.iter().any(|k| k.is_empty()) {
        bail!("invalid argument: --api-key is empty");
    }
    let backend = crate::backend(&a.model);
    let step_tokens = a.step_tokens.unwrap_or(if backend == Backend::Cpu {
        128.max(a.parallel)
    } else {
        // Measured on the H200 (synth 7B, 64 streams of 256 + 256 tokens arriving at once, prompt
        // chunks packed into passes of 2048): TTFT p99 436–471 ms at 8192 over four runs on two
        // leases, 458–545 at 4096, 565–578 at 2048 (llama-server's p50: 527–538 ms); p50 rises
        // to 300–360 ms, and a burst holds decoding streams up to ~0.22 s (four passes). vLLM's
        // API server takes 8192 tokens a step on such GPUs too (docs/benchmarks.md, session 24).
        8192.max(a.parallel)
    });
    if step_tokens < a.parallel || step_tokens > 8192 {
        bail!("invalid argument: --step-tokens must be between --parallel and 8192");
    }
    if a.max_connections_per_client == 0 {
        bail!("invalid argument: --max-connections-per-client must be ≥ 1");
    }
    if a.max_tokens_cap == Some(0) || a.request_timeout == Some(0) {
        bail!("invalid argument: --max-tokens-cap and --request-timeout must be ≥ 1");
    }
    let allowed_hosts = if !a.allowed_hosts.is_empty() {
        let mut h = a.allowed_hosts.clone();
        if a.host.is_loopback() {
            h.extend(mens_server::loopback_hosts());
        }
        Some(h)
    } else if a.host.is_loopback() {
        Some(mens_server::loopback_hosts())
    } else {
        None
    };
    if backend == Backend::Metal && a.parallel > 1 {
        bail!("invalid argument: --backend metal serves one sequence at a time for now (--parallel 1)");
    }
    let l = load(&a.model, a.parallel)?;
    let name = a.alias.clone().unwrap_or_else(|| {
        crate::model_path(&a.model)
            .ok()
            .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "mens".into())
    });
    let target = l.target();
    let tokenizer = Arc::new(l.tokenizer);
    let draft = match (a.spec, &a.model_draft) {
        (Some(crate::args::SpecKind::Draft), Some(path)) if backend == Backend::Cuda => {
            // On the GPU the draft is a second batch of the same slots and context, made on the
            // scheduler's thread after the target's: the context must be given, not fitted.
            let Some(ctx) = a.model.ctx_size else {
                bail!("invalid argument: --spec draft with --backend cuda needs -c (the draft model's context is the target's)");
            };
            let args = crate::args::ModelArgs {
                model: Some(path.clone()),
                ctx_size: Some(ctx),
                ..a.model.clone()
            };
            let d = load(&args, a.parallel)?;
            mens::spec::check_vocab(&tokenizer, &d.tokenizer)?;
            eprintln!(
                "mens: draft model {} on the GPU ({} slots of {ctx} tokens)",
                path.display(),
                a.parallel
            );
            Some(Draft::Gpu(d.target()))
        }
        (Some(crate::args::SpecKind::Draft), Some(path)) => {
            if backend != Backend::Cpu {
                bail!("invalid argument: --spec draft in the server runs on the CPU and CUDA only");
            }
            let args = crate::args::ModelArgs {
                model: Some(path.clone()),
                ctx_size: Some(l.options.ctx),
                ..a.model.clone()
            };
            let d = load(&args, a.parallel)?;
            mens::spec::check_vocab(&tokenizer, &d.tokenizer)?;
            // Both models and both sets of caches must fit the one budget.
            let budget = match &a.model.memory_budget {
                Some(s) => mens::memory::parse_size(s)?,
                None => mens::memory::budget(&mens::memory::probe(), Backend::Cpu)?.bytes,
            };
            let need = l.estimate.total() + d.estimate.total();
            if need > budget {
                bail!(
                    "out of memory: the model and the draft model with {} slots of {} tokens need {} MiB, more than the {} MiB budget; use fewer --parallel slots or a smaller --ctx-size",
                    a.parallel,
                    l.options.ctx,
                    need >> 20,
                    budget >> 20
                );
            }
            eprintln!(
                "mens: draft model {} ({} slots of {} tokens)",
                path.display(),
                a.parallel,
                l.options.ctx
            );
            Some(Draft::Cpu(d.model))
        }
        (Some(crate::args::SpecKind::Draft), None) => {
            bail!("invalid argument: --spec draft needs --model-draft FILE (-md FILE)")
        }
        (_, Some(_)) => bail!("invalid argument: --model-draft needs --spec draft"),
        _ => None,
    };
    let options = SchedulerOptions {
        slots: a.parallel,
        ctx: l.options.ctx,
        batch: step_tokens,
        queue: a.queue,
        cache_reuse: a.cache_reuse,
        spec: a.spec.map(|_| mens::spec::SpecOptions {
            max: a.spec_max as usize,
            ngram: a.spec_ngram as usize,
            gate: !a.spec_always,
        }),
        cache: l.options.cache(),
    };
    let scheduler = match draft {
        Some(Draft::Cpu(d)) => {
            Scheduler::cpu_with_draft(l.model.clone(), d, tokenizer.clone(), options)?
        }
        None if backend == Backend::Cpu => {
            Scheduler::cpu(l.model.clone(), tokenizer.clone(), options)?
        }
        gpu_draft => {
            // The GPU runners are made (and their weights uploaded) on the scheduler's thread.
            let (slots, step) = (a.parallel, step_tokens);
            let batch = move |t: mens::load::Target| -> RunnerFactory {
                Box::new(move || {
                    t.batch_runner(slots, step, &mut |m| eprintln!("mens: {m}"), &mut |_, _| {})
                })
            };
            let vocab = l.model.config.vocab_size;
            let draft = match gpu_draft {
                Some(Draft::Gpu(d)) => Some(batch(d)),
                _ => None,
            };
            // The batched runner verifies a slot's proposals as rows of the decode step (an f16
            // pool; a quantized pool verifies position by position, where the gate turns it off).
            Scheduler::start_with(batch(target), draft, vocab, tokenizer.clone(), options)?
        }
    };
    let config = ServerConfig {
        api_keys,
        body_limit: body_limit as usize,
        model_name: name.clone(),
        header_timeout: Duration::from_secs(a.timeout.max(1)),
        max_connections_per_client: a.max_connections_per_client,
        cors_origins: a.cors_origin.clone(),
        allowed_hosts,
        max_tokens_cap: a.max_tokens_cap,
        fit_max_tokens: a.fit_max_tokens,
        request_timeout: a.request_timeout.map(Duration::from_secs),
        split_reasoning: a.reasoning_format == "deepseek",
        reasoning_budget: usize::try_from(a.reasoning_budget).ok(),
        reasoning_budget_message: a.reasoning_budget_message.clone(),
        model: mens_server::ModelCard::of(&l.model, crate::model_path(&a.model).ok().as_deref()),
        pooling: match &a.pooling {
            Some(p) => mens::embed::Pooling::parse(p)?,
            None => l.model.config.pooling.unwrap_or(mens::embed::Pooling::Mean),
        },
        ..Default::default()
    };
    let state = Arc::new(AppState::new(scheduler, tokenizer, l.template, config));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let addr = SocketAddr::new(a.host, a.port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let bound = listener.local_addr()?;
        if !a.host.is_loopback() && state.config.api_keys.is_empty() {
            eprintln!(
                "mens: WARNING: listening on {bound} without an API key: anyone who can reach this address can use the model (set --api-key or --api-key-file)"
            );
        }
        eprintln!(
            "mens: serving {name} on http://{bound} ({} slots × {} tokens, queue {})",
            a.parallel, state.scheduler.options().ctx, a.queue
        );
        mens_server::serve(listener, state, async {
            let _ = tokio::signal::ctrl_c().await;
            eprintln!("mens: shutting down");
        })
        .await?;
        Ok(())
    })
}
