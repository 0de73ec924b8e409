//! Speculative decoding by prompt lookup on the real Qwen2.5-Coder-0.5B: greedy output token for
//! token equal to decoding one token per step, and proposals accepted where the answer repeats the
//! prompt (a rename in a function).

mod common;
use mens::cpu::{Session, SessionOptions};
use mens::generate::{generate, GenerateOptions};
use mens::sample::{Sampler, SamplerConfig};
use mens::spec::SpecOptions;

const RENAME: &str = "<|im_start|>user\nRename the variable `total` to `acc` and return the whole function:\n\n```python\ndef summarize(items):\n    total = 0\n    for item in items:\n        if item.value > 0:\n            total += item.value * item.weight\n        else:\n            total -= item.penalty\n    return total\n```<|im_end|>\n<|im_start|>assistant\n";

#[test]
fn speculation_gives_exactly_the_plain_greedy_output() {
    let l = common::load("qwen2.5-coder-0.5b");
    let opts = SessionOptions {
        ctx: 1024,
        batch: 256,
        logit_rows: 16,
        ..Default::default()
    };
    for (prompt, want_accepted) in [(RENAME, true), ("def fibonacci(n):", false)] {
        let ids = l.tokenizer.encode(prompt).unwrap();
        let run = |spec: Option<SpecOptions>| {
            let mut s = Session::new(l.model.clone(), opts.clone()).unwrap();
            let mut sampler =
                Sampler::new(SamplerConfig::greedy(), l.model.config.vocab_size).unwrap();
            let gen = GenerateOptions {
                max_tokens: 80,
                spec,
                ..Default::default()
            };
            let mut text = String::new();
            let st = generate(&mut s, &l.tokenizer, &mut sampler, &ids, &gen, |t| {
                text.push_str(t);
                true
            })
            .unwrap();
            (text, st, s.tokens().to_vec())
        };
        let (plain, ps, plain_cache) = run(None);
        // gate: the planner mixes plain steps and shorter proposals, as it measures.
        for (max, gate) in [(1, false), (4, false), (8, false), (8, true)] {
            let (spec, ss, spec_cache) = run(Some(SpecOptions {
                max,
                ngram: 3,
                gate,
            }));
            assert_eq!(spec, plain, "max {max}: the text differs");
            assert_eq!(ss.generated, ps.generated);
            assert_eq!(ss.stop, ps.stop);
            // The cache ends as plain decoding leaves it.
            assert_eq!(spec_cache, plain_cache, "max {max}: the cache differs");
            assert!(
                ss.decode_steps + ss.accepted == ps.decode_steps,
                "max {max}: {ss:?} vs {ps:?}"
            );
            eprintln!(
                "max {max}: {} proposed, {} accepted, {} steps instead of {}",
                ss.proposed, ss.accepted, ss.decode_steps, ps.decode_steps
            );
            if want_accepted && max > 1 && !gate {
                assert!(ss.accepted * 4 > ps.decode_steps, "few accepted: {ss:?}");
            }
        }
    }
}

/// A draft model (the 0.5B) proposing for the 1.5B: greedy output equal to the 1.5B's own, most
/// proposals of the rename accepted; a model of another vocabulary is refused by name.
#[test]
fn a_draft_model_proposes_and_the_output_is_unchanged() {
    let target = common::load("qwen2.5-coder-1.5b");
    let small = common::load("qwen2.5-coder-0.5b");
    mens::spec::check_vocab(&target.tokenizer, &small.tokenizer).unwrap();
    let tiny = mens::synth::synth_model(&mens::synth::SynthSpec::tiny_qwen2());
    let (_, tiny_tok, _) =
        mens::load::from_gguf(mens::gguf::Gguf::from_bytes(tiny).unwrap()).unwrap();
    let e = mens::spec::check_vocab(&target.tokenizer, &tiny_tok).unwrap_err();
    assert!(
        e.to_string().contains("differs from the target's at token"),
        "{e}"
    );

    let opts = SessionOptions {
        ctx: 1024,
        batch: 256,
        logit_rows: 16,
        ..Default::default()
    };
    let ids = target.tokenizer.encode(RENAME).unwrap();
    let run = |draft: bool| {
        let mut s = Session::new(target.model.clone(), opts.clone()).unwrap();
        let mut d = Session::new(small.model.clone(), opts.clone()).unwrap();
        let mut sampler =
            Sampler::new(SamplerConfig::greedy(), target.model.config.vocab_size).unwrap();
        let gen = GenerateOptions {
            max_tokens: 48,
            spec: draft.then_some(SpecOptions {
                max: 8,
                ngram: 3,
                gate: false,
            }),
            ..Default::default()
        };
        let mut text = String::new();
        let st = mens::generate::generate_with_draft(
            &mut s,
            draft.then_some(&mut d as &mut dyn mens::Runner),
            &target.tokenizer,
            &mut sampler,
            &ids,
            &gen,
            |t| {
                text.push_str(t);
                true
            },
        )
        .unwrap();
        (text, st)
    };
    let (plain, ps) = run(false);
    let (spec, ss) = run(true);
    eprintln!(
        "draft 0.5B for 1.5B: {} proposed, {} accepted, {} steps instead of {}",
        ss.proposed, ss.accepted, ss.decode_steps, ps.decode_steps
    );
    assert_eq!(spec, plain);
    assert_eq!(ss.decode_steps + ss.accepted, ps.decode_steps);
    assert!(ss.accepted * 2 > ss.proposed, "{ss:?}");
}

/// Sampling with speculation: with top-k 1 the draw is deterministic, so the text equals greedy
/// decoding's; at temperature 0.5 proposals are still accepted (the acceptance rule keeps each
/// token's distribution: `speculative_sampling_keeps_the_distribution`).
#[test]
fn sampled_speculation_accepts_and_keeps_deterministic_draws() {
    let l = common::load("qwen2.5-coder-0.5b");
    let opts = SessionOptions {
        ctx: 1024,
        batch: 256,
        logit_rows: 16,
        ..Default::default()
    };
    let ids = l.tokenizer.encode(RENAME).unwrap();
    let run = |cfg: SamplerConfig, spec: Option<SpecOptions>| {
        let mut s = Session::new(l.model.clone(), opts.clone()).unwrap();
        let mut sampler = Sampler::new(cfg, l.model.config.vocab_size).unwrap();
        let gen = GenerateOptions {
            max_tokens: 60,
            spec,
            ..Default::default()
        };
        let mut text = String::new();
        let st = generate(&mut s, &l.tokenizer, &mut sampler, &ids, &gen, |t| {
            text.push_str(t);
            true
        })
        .unwrap();
        (text, st)
    };
    let spec = Some(SpecOptions {
        max: 8,
        ngram: 3,
        gate: false,
    });
    let (greedy, _) = run(SamplerConfig::greedy(), None);
    let top1 = SamplerConfig {
        temperature: 0.8,
        top_k: 1,
        seed: 3,
        ..Default::default()
    };
    let (t1, s1) = run(top1, spec);
    assert_eq!(t1, greedy);
    assert!(s1.accepted > 0, "{s1:?}");
    let warm = SamplerConfig {
        temperature: 0.5,
        seed: 11,
        ..Default::default()
    };
    let (_, s2) = run(warm, spec);
    eprintln!(
        "temperature 0.5: {} of {} proposals accepted",
        s2.accepted, s2.proposed
    );
    assert!(s2.accepted * 5 > s2.proposed, "{s2:?}");
}
