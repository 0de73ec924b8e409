//! The command line's arguments (clap), shared by the subcommands.

use clap::{Args, ValueEnum};
use mens::generate::GenerateOptions;
use mens::load::Backend;
use mens::sample::SamplerConfig;
use std::path::PathBuf;

/// llama.cpp's sampling defaults, in one place (the engine's).
const DEFAULTS: SamplerConfig = SamplerConfig::DEFAULT;

/// A seed nobody chose: the clock and the process id, mixed.
fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (t ^ (std::process::id() as u64) << 32).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum BackendArg {
    Auto,
    Cpu,
    Cuda,
    Metal,
}

impl BackendArg {
    pub(crate) fn resolve(self) -> Backend {
        match self {
            BackendArg::Auto => Backend::best(),
            BackendArg::Cpu => Backend::Cpu,
            BackendArg::Cuda => Backend::Cuda,
            BackendArg::Metal => Backend::Metal,
        }
    }
}

#[derive(Args)]
pub(crate) struct SynthArgs {
    /// 0.5b, 1.5b or 7b.
    #[arg(long, required_unless_present = "tiny", conflicts_with = "tiny")]
    pub(crate) shape: Option<String>,
    /// Instead: the tiny test model of an architecture (qwen2, qwen3, qwen3moe, llama, llama3, gemma3, qwen3-embed), as the tests
    /// build it (for checking an architecture against llama.cpp on the same file).
    #[arg(long)]
    pub(crate) tiny: Option<String>,
    /// Output GGUF file.
    #[arg(short, long)]
    pub(crate) output: PathBuf,
    /// Random seed (default: 1, or the tiny model's own).
    #[arg(long)]
    pub(crate) seed: Option<u64>,
}

#[derive(Args, Clone)]
pub(crate) struct ModelArgs {
    /// Path to a GGUF model file [default: $MENS_MODELS/qwen2.5-coder-0.5b.gguf, where MENS_MODELS
    /// defaults to ~/.cache/mens/models; `scripts/fetch-models.sh` puts it there].
    #[arg(short, long)]
    pub(crate) model: Option<PathBuf>,
    /// Context length in tokens [default: the largest that fits the memory budget, up to the model's
    /// trained context].
    #[arg(short = 'c', long = "ctx-size")]
    pub(crate) ctx_size: Option<usize>,
    /// Memory budget for model + KV cache + buffers, e.g. 3G or 512M [default: from `mens probe`].
    #[arg(long)]
    pub(crate) memory_budget: Option<String>,
    /// Threads for the CPU kernels (default: all logical cores).
    #[arg(short = 't', long)]
    pub(crate) threads: Option<usize>,
    /// Compute backend: auto (CUDA when this build has it and a GPU is found, Metal in a Metal
    /// build, else the CPU), cpu, cuda or metal.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub(crate) backend: BackendArg,
    /// What the KV cache stores for K (also `-ctk`): f16, q8_0 (about half the memory) or q4_0
    /// (about a quarter). CUDA takes one type for K and V; Metal f16 only.
    #[arg(long, default_value = "f16")]
    pub(crate) cache_type_k: String,
    /// What the KV cache stores for V (also `-ctv`): f16, q8_0 or q4_0.
    #[arg(long, default_value = "f16")]
    pub(crate) cache_type_v: String,
    /// A Jinja chat template to use instead of the model file's (as llama-server's
    /// `--chat-template-file`); its tool-call format follows it (see README, tool calls).
    #[arg(long, value_name = "FILE")]
    pub(crate) chat_template_file: Option<PathBuf>,
}

/// `ID=BIAS` of `--logit-bias`.
fn parse_bias(s: &str) -> Result<(u32, f32), String> {
    let (id, b) = s
        .split_once('=')
        .ok_or_else(|| format!("expected ID=BIAS, got {s:?}"))?;
    let id = id
        .trim()
        .parse()
        .map_err(|_| format!("{id:?} is not a token id"))?;
    let b = b
        .trim()
        .parse()
        .map_err(|_| format!("{b:?} is not a number"))?;
    Ok((id, b))
}

#[derive(Args, Clone)]
pub(crate) struct SampleArgs {
    /// Temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = DEFAULTS.temperature, allow_negative_numbers = true)]
    pub(crate) temperature: f32,
    /// Top-k (0 disables).
    #[arg(long, default_value_t = DEFAULTS.top_k as i64, allow_negative_numbers = true)]
    pub(crate) top_k: i64,
    /// Top-p (1 disables).
    #[arg(long, default_value_t = DEFAULTS.top_p, allow_negative_numbers = true)]
    pub(crate) top_p: f32,
    /// Min-p (0 disables).
    #[arg(long, default_value_t = DEFAULTS.min_p, allow_negative_numbers = true)]
    pub(crate) min_p: f32,
    /// Repetition penalty (1 disables).
    #[arg(long, default_value_t = DEFAULTS.repeat_penalty)]
    pub(crate) repeat_penalty: f32,
    /// Tokens the repetition penalty looks back over.
    #[arg(long, default_value_t = DEFAULTS.repeat_last_n)]
    pub(crate) repeat_last_n: usize,
    /// Random seed: the same seed gives the same output [default: a fresh one each run, printed
    /// with the timings so a run can be replayed].
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Stop when this string is generated (repeatable).
    #[arg(long)]
    pub(crate) stop: Vec<String>,
    /// Add BIAS (-100 to 100) to token ID's logit, as `ID=BIAS` (repeatable; -100 bans it).
    #[arg(long, value_name = "ID=BIAS", value_parser = parse_bias, allow_hyphen_values = true)]
    pub(crate) logit_bias: Vec<(u32, f32)>,
    /// Tokens to generate at most (-1: until the context is full, as llama.cpp).
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 256,
        allow_negative_numbers = true
    )]
    n_predict: i64,
    /// Re-run the whole sequence for every token instead of using the KV cache (a baseline).
    #[arg(long)]
    pub(crate) no_kv_cache: bool,
    /// Speculative decoding: `ngram` proposes the continuation of the latest earlier match of the
    /// last tokens (prompt lookup), `draft` lets a small model of the same vocabulary propose
    /// (--model-draft); the proposals are checked in one pass. Greedy: the output is exactly that of
    /// plain decoding; sampling: each token is drawn from the same distribution. Ignored with
    /// repetition penalties.
    #[arg(long, value_enum)]
    pub(crate) spec: Option<SpecKind>,
    /// The draft model for `--spec draft` (also `-md`, as llama.cpp spells it).
    #[arg(long = "model-draft", value_name = "GGUF")]
    pub(crate) model_draft: Option<std::path::PathBuf>,
    /// Most tokens proposed per step (at most 48: a verify pass stays below the 64 rows from which
    /// prompt attention runs other arithmetic).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=48))]
    pub(crate) spec_max: u32,
    /// Longest run of last tokens looked up (shorter ones are tried after it).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub(crate) spec_ngram: u32,
    /// Propose every step, as many tokens as found (up to --spec-max), even where that measures
    /// slower than plain decoding; by default the tokens proposed are chosen from the measured cost
    /// of a verify pass and the measured acceptance, and none when nothing pays.
    #[arg(long)]
    pub(crate) spec_always: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum SpecKind {
    /// Prompt lookup: no draft model.
    Ngram,
    /// A small draft model (--model-draft) proposes.
    Draft,
}

impl SampleArgs {
    /// The values clap cannot check: one clear line each.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        if self.n_predict < -1 {
            anyhow::bail!(
                "invalid argument: -n takes a number of tokens, or -1 for as many as the context holds (got {})",
                self.n_predict
            );
        }
        if self.top_k < 0 {
            anyhow::bail!(
                "invalid argument: --top-k must be 0 (off) or more (got {})",
                self.top_k
            );
        }
        Ok(())
    }

    /// Tokens to generate at most (-1: unbounded, the context stops it).
    pub(crate) fn n_predict(&self) -> usize {
        usize::try_from(self.n_predict).unwrap_or(usize::MAX)
    }

    pub(crate) fn config(&self) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k.max(0) as usize,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed: self.seed.unwrap_or_else(fresh_seed),
            logit_bias: self.logit_bias.clone(),
            ..DEFAULTS
        }
    }

    pub(crate) fn generate_options(&self) -> GenerateOptions {
        GenerateOptions {
            max_tokens: self.n_predict(),
            stop: self.stop.clone(),
            no_kv_cache: self.no_kv_cache,
            spec: self.spec.map(|_| mens::spec::SpecOptions {
                max: self.spec_max as usize,
                ngram: self.spec_ngram as usize,
                gate: !self.spec_always,
            }),
        }
    }
}

#[derive(Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    #[command(flatten)]
    pub(crate) sample: SampleArgs,
    /// The prompt; `-` reads it from standard input.
    #[arg(short, long, required_unless_present_any = ["file", "fim_prefix"])]
    pub(crate) prompt: Option<String>,
    /// Read the prompt from this file.
    #[arg(short = 'f', long, conflicts_with = "prompt")]
    pub(crate) file: Option<PathBuf>,
    /// Fill in the middle: the code before the gap (a file; with --fim-suffix). The prompt, if any,
    /// is the text of the cursor's line before the cursor. Prints only the middle.
    #[arg(long, requires = "fim_suffix", conflicts_with = "chat")]
    pub(crate) fim_prefix: Option<PathBuf>,
    /// Fill in the middle: the code after the gap (a file).
    #[arg(long, requires = "fim_prefix")]
    pub(crate) fim_suffix: Option<PathBuf>,
    /// Render the prompt as a user message with the model's chat template.
    #[arg(long)]
    pub(crate) chat: bool,
    /// System message (with --chat).
    #[arg(long)]
    pub(crate) system: Option<String>,
}

#[derive(Args)]
pub(crate) struct ChatArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    #[command(flatten)]
    pub(crate) sample: SampleArgs,
    /// System message.
    #[arg(long)]
    pub(crate) system: Option<String>,
}

#[derive(Args)]
pub(crate) struct PerplexityArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// The text file.
    #[arg(short = 'f', long)]
    pub(crate) file: PathBuf,
    /// Score only the first N windows.
    #[arg(long)]
    pub(crate) chunks: Option<usize>,
}

#[derive(Args)]
pub(crate) struct ProbeArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also show, for this model, the context that fits the CPU budget with each KV cache type.
    #[arg(short, long)]
    pub(crate) model: Option<std::path::PathBuf>,
}

#[derive(Args)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Prompt sizes for time to first token (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "512,2048,8192")]
    pub(crate) prompt: Vec<usize>,
    /// Decode steps timed one by one after a 16-token prompt (0 skips the schedule).
    #[arg(long, default_value_t = 512)]
    pub(crate) steps: usize,
    /// Steps at which decode tokens/s is reported, each over a window of --window steps.
    #[arg(long, value_delimiter = ',', default_value = "1,256,512")]
    pub(crate) at: Vec<usize>,
    /// Steps in each reported window.
    #[arg(long, default_value_t = 16)]
    pub(crate) window: usize,
    /// Paired flatness test: this many decode steps on a sequence at step 1 alternating with as
    /// many on a second sequence at the last --at step, so that machine drift hits both alike
    /// (0 skips it).
    #[arg(long, default_value_t = 32)]
    pub(crate) paired: usize,
    /// llama-bench-style decode tests: --gen tokens after a context of each depth (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub(crate) depth: Vec<usize>,
    /// Tokens generated in each --depth test.
    #[arg(long, default_value_t = 128)]
    pub(crate) gen: usize,
    /// Repetitions of the prefill and depth tests (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub(crate) reps: usize,
    /// Decode by re-running the whole sequence each step (the uncached baseline).
    #[arg(long, conflicts_with = "compare")]
    pub(crate) no_kv_cache: bool,
    /// Run the decode schedule both with and without the KV cache, side by side.
    #[arg(long)]
    pub(crate) compare: bool,
    /// Write every figure and the machine as JSON to this file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Write the Markdown table to this file.
    #[arg(long)]
    pub(crate) md: Option<PathBuf>,
    /// Write an SVG plot of per-step decode time against step.
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    pub(crate) quiet: bool,
    /// GPU: also time every kernel of a decode step (launched one by one, at the end of the
    /// decode schedule) and print the table.
    #[arg(long)]
    pub(crate) profile: bool,
    /// Many sequences decoding together (as `mens serve --parallel N` steps them): for each N,
    /// N prompts of --concurrency-prompt tokens, then --gen tokens each, all N in every step
    /// (comma-separated; at most 64 on the CPU, 1024 on a GPU).
    #[arg(long, value_delimiter = ',')]
    pub(crate) concurrency: Vec<usize>,
    /// Prompt tokens of each sequence in the --concurrency test.
    #[arg(long, default_value_t = 256)]
    pub(crate) concurrency_prompt: usize,
    /// Speculative decoding's verify pass: for each K, the time of one forward pass over K tokens
    /// with every position's greedy pick, after a context of --verify-depth tokens, against one decode
    /// step (comma-separated K, 1 to 64).
    #[arg(long, value_delimiter = ',')]
    pub(crate) verify: Vec<usize>,
    /// Context before the --verify passes.
    #[arg(long, default_value_t = 512)]
    pub(crate) verify_depth: usize,
}
