//! Shared helpers for the integration tests: real models (fetched once into a cache directory) and
//! the reference data copied from llama.cpp's outputs.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn data(name: &str) -> PathBuf {
    repo_root().join("crates/mens/tests/data").join(name)
}

static FETCH: Mutex<()> = Mutex::new(());

/// Path of a real model, fetched with `scripts/fetch-models.sh` into `$MENS_MODELS` (default
/// `<repo>/.cache/models`) the first time it is needed.
pub fn real_model(name: &str) -> PathBuf {
    let dir = std::env::var_os("MENS_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache/models"));
    let path = dir.join(format!("{name}.gguf"));
    let _guard = FETCH.lock().unwrap_or_else(|e| e.into_inner());
    if !path.exists() {
        eprintln!("fetching {name} into {}", dir.display());
        let status = std::process::Command::new("bash")
            .arg(repo_root().join("scripts/fetch-models.sh"))
            .arg(&dir)
            .arg(name)
            .status()
            .expect("run scripts/fetch-models.sh");
        assert!(status.success(), "fetching {name} failed");
    }
    path
}

pub struct Loaded {
    pub model: Arc<mens::model::Model>,
    pub tokenizer: mens::tokenizer::Tokenizer,
}

pub fn load(name: &str) -> Loaded {
    let model = mens::model::Model::open(&real_model(name)).expect("load model");
    let tokenizer = mens::tokenizer::Tokenizer::from_gguf(&model.gguf).expect("tokenizer");
    Loaded {
        model: Arc::new(model),
        tokenizer,
    }
}

pub fn json(name: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(data(name)).unwrap()).unwrap()
}

/// A greedy scheduler request that runs to `max_tokens` (EOS ignored), its client always there;
/// its events arrive on the returned channel. Tests change the fields they need.
pub fn greedy_request(
    prompt: Vec<u32>,
    max_tokens: usize,
    tenant: u64,
) -> (
    mens::scheduler::Request,
    std::sync::mpsc::Receiver<mens::scheduler::Event>,
) {
    let (tx, rx) = std::sync::mpsc::channel();
    let req = mens::scheduler::Request {
        prompt,
        max_tokens,
        sampler: mens::sample::SamplerConfig::greedy(),
        stop: Vec::new(),
        min_indent: 0,
        on_event: Box::new(move |e| tx.send(e).is_ok()),
        alive: Box::new(|| true),
        tenant,
        deadline: None,
        constraint: None,
        logprobs: None,
        ignore_eos: true,
        think: None,
        embed: None,
    };
    (req, rx)
}
