//! `mens run` (one prompt) and `mens chat` (a conversation in the terminal, its KV cache kept).

use crate::args::{ChatArgs, RunArgs};
use crate::chat_input::{self, Entry, Input, HELP};
use crate::{load, print_memory, runner, runner_for};
use anyhow::Result;
use mens::chat::Message;
use mens::fim::{fim_prompt, FimInput};
use mens::generate::{generate_with_draft, Stats};
use mens::sample::Sampler;
use mens::stream::reusable_prefix;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

fn print_stats(s: &Stats, seed: u64) {
    eprintln!();
    eprintln!(
        "mens: prompt {} tokens, {:.1} ms, {:.2} tokens/s",
        s.prompt_tokens,
        s.prefill.as_secs_f64() * 1e3,
        s.prefill_tps()
    );
    eprintln!(
        "mens: generated {} tokens, decode {} steps, {:.1} ms, {:.2} tokens/s (stop: {:?}; seed {seed})",
        s.generated,
        s.decode_steps,
        s.decode.as_secs_f64() * 1e3,
        s.decode_tps(),
        s.stop
    );
    if s.proposed > 0 {
        eprintln!(
            "mens: speculation: {} tokens proposed, {} accepted ({:.0}%), {:.2} tokens per step",
            s.proposed,
            s.accepted,
            100.0 * s.accepted as f64 / s.proposed as f64,
            (s.decode_steps + s.accepted) as f64 / s.decode_steps.max(1) as f64
        );
    }
}

/// Set by Ctrl-C while a generation runs; a Ctrl-C at the chat prompt (nothing running) exits.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static GENERATING: AtomicBool = AtomicBool::new(false);

/// The first Ctrl-C stops the current generation (its text and timings are kept); a Ctrl-C when
/// nothing is generating ends the program (exit 130, as a shell expects).
fn handle_ctrl_c() {
    let _ = ctrlc::set_handler(|| {
        if GENERATING.load(Ordering::SeqCst) {
            INTERRUPTED.store(true, Ordering::SeqCst);
        } else {
            std::process::exit(130);
        }
    });
}

/// Prompt tokens per prefill chunk when a long prompt is prefilled with a progress line.
const PREFILL_CHUNK: usize = 512;

/// Prefill all but the last token of a long prompt in chunks (the last is left for `generate`,
/// which samples after it), with a progress line (tokens, rate, time left) on a terminal once it
/// has taken a second. Stops between chunks at Ctrl-C. Returns the tokens done and their time.
fn prefill_with_progress(
    sess: &mut dyn mens::Runner,
    prompt: &[u32],
    no_kv_cache: bool,
) -> Result<(usize, std::time::Duration)> {
    let t0 = std::time::Instant::now();
    // Short prompts, the uncached baseline and prompts that do not fit (generate says so) go whole.
    if no_kv_cache
        || prompt.len() <= PREFILL_CHUNK
        || sess.tokens().len() + prompt.len() >= sess.ctx()
    {
        return Ok((0, t0.elapsed()));
    }
    // The last token (at least: the last `uniform_pass` tokens, so that the final pass computes
    // them as one pass over the whole prompt would) is left to generate, which takes its logits.
    let u = sess.uniform_pass();
    let head = &prompt[..mens::stream::uniform_keep(prompt.len() - 1, prompt.len(), u)];
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(head.len() as u64),
        indicatif::ProgressDrawTarget::hidden(),
    );
    bar.set_style(
        indicatif::ProgressStyle::with_template("prompt {pos}/{len} tokens, {per_sec}, {eta} left")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut done = 0;
    while done < head.len() {
        if INTERRUPTED.load(Ordering::SeqCst) {
            break;
        }
        let n = mens::stream::next_pass(head.len() - done, PREFILL_CHUNK, u);
        sess.forward(&head[done..done + n], mens::Logits::None)?;
        done += n;
        if bar.is_hidden() && t0.elapsed().as_secs_f64() > 1.0 {
            // stderr only: hidden again by indicatif when stderr is not a terminal.
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        }
        bar.set_position(done as u64);
    }
    bar.finish_and_clear();
    Ok((done, t0.elapsed()))
}

fn read_file(p: &std::path::Path) -> Result<String> {
    std::fs::read_to_string(p)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {}", p.display(), e.kind()))
}

/// The draft model of `--spec draft`, on the target's backend and threads, its vocabulary checked.
fn draft_runner(
    model: &crate::args::ModelArgs,
    sample: &crate::args::SampleArgs,
    target: &mens::Tokenizer,
) -> Result<Option<Box<dyn mens::Runner>>> {
    if sample.spec != Some(crate::args::SpecKind::Draft) {
        if sample.model_draft.is_some() {
            anyhow::bail!("invalid argument: --model-draft needs --spec draft");
        }
        return Ok(None);
    }
    let Some(path) = &sample.model_draft else {
        anyhow::bail!("invalid argument: --spec draft needs --model-draft FILE (-md FILE)");
    };
    let args = crate::args::ModelArgs {
        model: Some(path.clone()),
        ..model.clone()
    };
    let d = load(&args, 1)?;
    mens::spec::check_vocab(target, &d.tokenizer)?;
    eprintln!("mens: draft model {}", path.display());
    Ok(Some(runner(&d)?))
}

/// The prompt text: `-p TEXT`, `-p -` (standard input) or `-f FILE`.
fn prompt_text(args: &RunArgs) -> Result<String> {
    match (&args.prompt, &args.file) {
        (Some(p), _) if p == "-" => {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                .map_err(|e| anyhow::anyhow!("cannot read the prompt from standard input: {e}"))?;
            Ok(s)
        }
        (Some(p), _) => Ok(p.clone()),
        (None, Some(f)) => read_file(f),
        (None, None) => Ok(String::new()),
    }
}

pub(crate) fn run(args: RunArgs) -> Result<()> {
    args.sample.check()?;
    let config = args.sample.config();
    config.validate()?;
    let prompt = prompt_text(&args)?;
    let l = load(&args.model, 1)?;
    let mut sess = runner_for(&l, args.sample.spec.is_some())?;
    let mut draft = draft_runner(&args.model, &args.sample, &l.tokenizer)?;
    let ctx = sess.ctx();
    let mut sampler = Sampler::new(config, l.model.config.vocab_size)?;
    let fim = args.fim_prefix.is_some();
    let tokens = if let (Some(pre), Some(suf)) = (&args.fim_prefix, &args.fim_suffix) {
        let f = l
            .tokenizer
            .fim
            .ok_or_else(|| anyhow::anyhow!("this model has no fill-in-the-middle tokens"))?;
        let input = FimInput {
            prefix: read_file(pre)?,
            suffix: read_file(suf)?,
            prompt: prompt.clone(),
            extra: Vec::new(),
        };
        fim_prompt(
            &l.tokenizer,
            &f,
            &input,
            2048.min(ctx / 2),
            args.sample.n_predict(),
            ctx,
        )?
    } else if args.chat {
        let mut msgs = Vec::new();
        if let Some(s) = &args.system {
            msgs.push(Message::new("system", s));
        }
        msgs.push(Message::new("user", &prompt));
        l.template.tokens(&l.tokenizer, &msgs, true, ctx)?
    } else {
        l.tokenizer.encode(&prompt)?
    };
    // Refuse a prompt that cannot fit before echoing anything.
    if tokens.len() >= ctx {
        return Err(mens::Error::Context(format!(
            "the prompt is {} tokens but the context holds {ctx}; use a shorter prompt or a larger --ctx-size",
            tokens.len()
        ))
        .into());
    }
    let mut out = std::io::stdout().lock();
    // Raw completion echoes the prompt; chat and fill-in-the-middle print only the answer.
    let mut open = args.chat || fim || write!(out, "{prompt}").is_ok();
    handle_ctrl_c();
    GENERATING.store(true, Ordering::SeqCst);
    let opts = args.sample.generate_options();
    let (pre, pre_time) = prefill_with_progress(&mut *sess, &tokens, opts.no_kv_cache)?;
    if INTERRUPTED.load(Ordering::SeqCst) {
        eprintln!(
            "\nmens: stopped during the prompt ({pre} of {} tokens)",
            tokens.len()
        );
        std::process::exit(130);
    }
    let mut stats = generate_with_draft(
        &mut *sess,
        draft.as_deref_mut(),
        &l.tokenizer,
        &mut sampler,
        &tokens[pre..],
        &opts,
        |t| {
            // A closed pipe (`| head`) stops generation at once, quietly.
            open = open && write!(out, "{t}").and_then(|_| out.flush()).is_ok();
            open && !INTERRUPTED.load(Ordering::SeqCst)
        },
    )?;
    stats.prompt_tokens += pre;
    stats.prefill += pre_time;
    GENERATING.store(false, Ordering::SeqCst);
    if open {
        let _ = writeln!(out);
    }
    print_stats(&stats, sampler.config.seed);
    print_memory(&l);
    if INTERRUPTED.load(Ordering::SeqCst) {
        // As a shell reports a program stopped by SIGINT.
        std::process::exit(130);
    }
    Ok(())
}

pub(crate) fn chat(args: ChatArgs) -> Result<()> {
    args.sample.check()?;
    let config = args.sample.config();
    config.validate()?;
    let l = load(&args.model, 1)?;
    let mut sess = runner_for(&l, args.sample.spec.is_some())?;
    let mut draft = draft_runner(&args.model, &args.sample, &l.tokenizer)?;
    let mut sampler = Sampler::new(config, l.model.config.vocab_size)?;
    let mut messages = Vec::new();
    if let Some(s) = &args.system {
        messages.push(Message::new("system", s));
    }
    handle_ctrl_c();
    eprintln!("mens: chat; Ctrl-C during an answer stops it; Ctrl-D, end of input or Ctrl-C at the prompt leaves; /help lists the commands and how to enter several lines");
    let mut input = Input::new();
    while let Some(entry) = input.next()? {
        let line = match entry {
            Entry::Turn(t) => t,
            Entry::Quit => break,
            Entry::Help => {
                eprintln!("{HELP}");
                continue;
            }
            Entry::Unknown(c) => {
                eprintln!("mens: unknown command {c} (/help lists them); nothing was sent");
                continue;
            }
            Entry::Reset => {
                messages.retain(|m: &Message| m.role == "system");
                sess.truncate(0);
                eprintln!(
                    "mens: conversation forgotten{}",
                    if messages.is_empty() {
                        ""
                    } else {
                        " (system prompt kept)"
                    }
                );
                continue;
            }
            Entry::Save(path) => {
                match chat_input::save(&path, &messages) {
                    Ok(()) => eprintln!("mens: saved {} messages to {path}", messages.len()),
                    Err(e) => eprintln!("mens: {e:#}"),
                }
                continue;
            }
            Entry::Load(path) => {
                match chat_input::load(&path) {
                    Ok(m) => {
                        eprintln!("mens: loaded {} messages from {path}; they are read again with the next turn", m.len());
                        messages = m;
                    }
                    Err(e) => eprintln!("mens: {e:#}; the conversation is unchanged"),
                }
                continue;
            }
        };
        messages.push(Message::new("user", &line));
        let all = l
            .template
            .tokens(&l.tokenizer, &messages, true, usize::MAX)?;
        // Reuse the cached prefix: only the new turn is prefilled.
        let common = reusable_prefix(sess.tokens(), &all);
        sess.truncate(common);
        let mut answer = String::new();
        let mut out = std::io::stdout().lock();
        INTERRUPTED.store(false, Ordering::SeqCst);
        GENERATING.store(true, Ordering::SeqCst);
        let opts = args.sample.generate_options();
        let new = &all[common..];
        let pre = match prefill_with_progress(&mut *sess, new, opts.no_kv_cache) {
            Ok((pre, _)) => pre,
            Err(e) => {
                GENERATING.store(false, Ordering::SeqCst);
                return Err(e);
            }
        };
        if INTERRUPTED.load(Ordering::SeqCst) {
            // Stopped in the prompt: the turn is dropped; the cache keeps what was done.
            GENERATING.store(false, Ordering::SeqCst);
            messages.pop();
            eprintln!(
                "\nmens: stopped during the prompt ({pre} of {} tokens); the turn is dropped",
                new.len()
            );
            continue;
        }
        let stats = generate_with_draft(
            &mut *sess,
            draft.as_deref_mut(),
            &l.tokenizer,
            &mut sampler,
            &new[pre..],
            &opts,
            |t| {
                answer.push_str(t);
                let _ = write!(out, "{t}");
                let _ = out.flush();
                // Ctrl-C ends this answer; the conversation and its cache stay.
                !INTERRUPTED.load(Ordering::SeqCst)
            },
        );
        GENERATING.store(false, Ordering::SeqCst);
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
            stats.prompt_tokens + pre,
            common,
            stats.decode_tps()
        );
        messages.push(Message::new("assistant", &answer));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mens::cpu::{Session, SessionOptions};
    use mens::gguf::Gguf;
    use mens::model::Model;
    use mens::synth::{synth_model, SynthSpec};
    use mens::Runner;

    /// Chunked prefill leaves the cache and the last logits a one-pass prefill leaves, bit for bit.
    #[test]
    fn chunked_prefill_equals_one_pass() {
        let model = std::sync::Arc::new(
            Model::from_gguf(Gguf::from_bytes(synth_model(&SynthSpec::tiny_qwen2())).unwrap())
                .unwrap(),
        );
        let options = SessionOptions {
            ctx: 2048,
            batch: 256,
            logit_rows: 1,
            ..Default::default()
        };
        let prompt: Vec<u32> = (0..1300u32).map(|i| (i * 37 + i / 5) % 250 + 3).collect();
        let mut a = Session::new(model.clone(), options.clone()).unwrap();
        let (pre, _) = prefill_with_progress(&mut a, &prompt, false).unwrap();
        assert_eq!(pre, prompt.len() - 64);
        a.forward(&prompt[pre..], mens::Logits::Last).unwrap();
        let mut b = Session::new(model.clone(), options.clone()).unwrap();
        b.forward(&prompt, mens::Logits::Last).unwrap();
        assert_eq!(Runner::tokens(&a), &prompt[..]);
        assert!(a
            .logits()
            .iter()
            .zip(b.logits())
            .all(|(x, y)| x.to_bits() == y.to_bits()));
        // Short prompts and the uncached baseline are left whole.
        let mut c = Session::new(model, options).unwrap();
        assert_eq!(
            prefill_with_progress(&mut c, &prompt[..400], false)
                .unwrap()
                .0,
            0
        );
        assert_eq!(prefill_with_progress(&mut c, &prompt, true).unwrap().0, 0);
    }
}
