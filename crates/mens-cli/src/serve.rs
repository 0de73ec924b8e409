//! `mens serve`: load the model, start the engine's scheduler and the HTTP server.

use crate::{load_slots, ModelArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use mens::scheduler::{Scheduler, SchedulerOptions};
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
    /// Require `Authorization: Bearer KEY` on /v1/ routes.
    #[arg(long, conflicts_with = "api_key_file")]
    api_key: Option<String>,
    /// Read the API key from this file (first line).
    #[arg(long)]
    api_key_file: Option<PathBuf>,
    /// Sequences decoded together, each with its own KV cache of --ctx-size tokens.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Requests that may wait for a free slot; more get 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    queue: usize,
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
    let api_key = match (&a.api_key, &a.api_key_file) {
        (Some(k), _) => Some(k.clone()),
        (None, Some(f)) => {
            let s = std::fs::read_to_string(f)
                .with_context(|| format!("cannot read the API key file {}", f.display()))?;
            let k = s.lines().next().unwrap_or("").trim().to_string();
            if k.is_empty() {
                bail!("the API key file {} is empty", f.display());
            }
            Some(k)
        }
        (None, None) => None,
    };
    if api_key.as_deref() == Some("") {
        bail!("invalid argument: --api-key is empty");
    }
    let l = load_slots(&a.model, a.parallel)?;
    let name = a.alias.clone().unwrap_or_else(|| {
        crate::model_path(&a.model)
            .ok()
            .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "mens".into())
    });
    let tokenizer = Arc::new(l.tokenizer);
    let options = SchedulerOptions {
        slots: a.parallel,
        ctx: l.options.ctx,
        batch: l.options.batch.max(a.parallel),
        queue: a.queue,
    };
    let scheduler = Scheduler::start(l.model.clone(), tokenizer.clone(), options)?;
    let state = Arc::new(AppState {
        scheduler,
        tokenizer,
        template: l.template,
        config: ServerConfig {
            api_key,
            body_limit: body_limit as usize,
            model_name: name.clone(),
            header_timeout: Duration::from_secs(a.timeout.max(1)),
            ..Default::default()
        },
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    });
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
        if !a.host.is_loopback() && state.config.api_key.is_none() {
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
