//! Correctness against llama.cpp on the real GGUF files (Qwen2.5-Coder 0.5B and 1.5B, Gemma 3 270M;
//! fetched once into a cache directory, see tests/common). The reference outputs in tests/data come
//! from llama.cpp.

mod common;
use common::{json, load};
use mens::cpu::{Session, SessionOptions};
use mens::generate::{generate, GenerateOptions};
use mens::gguf::TensorType;
use mens::model::KvType;
use mens::runner::Logits;
use mens::sample::argmax;
use mens::sample::{Sampler, SamplerConfig};

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Token ids equal llama.cpp's for every reference prompt (special tokens included).
#[test]
fn tokenizer_matches_llama_cpp() {
    tokenizer_matches("qwen2.5-coder-0.5b", "tokens.json");
}

/// Gemma 3's SentencePiece vocabulary (merges by score, byte fallback, user-defined whitespace
/// tokens); llama.cpp adds a BOS for this model.
#[test]
fn tokenizer_matches_llama_cpp_gemma3() {
    tokenizer_matches("gemma3-270m", "tokens_gemma3.json");
}

fn prompt_ids(case: &serde_json::Value) -> Vec<u32> {
    ids(case.get("ids").unwrap_or(&case["tokens"]))
}

fn tokenizer_matches(name: &str, file: &str) {
    let l = load(name);
    let refs = json(file);
    for case in refs.as_array().unwrap() {
        let prompt = case["prompt"].as_str().unwrap();
        let want = prompt_ids(case);
        assert_eq!(
            l.tokenizer.encode(prompt).unwrap(),
            want,
            "prompt {prompt:?}"
        );
        let bos = l.tokenizer.add_bos as usize;
        assert_eq!(l.tokenizer.decode(&want[bos..]), prompt);
    }
}

/// A free-running divergence counts as a near-tie when the reference token is our second choice and
/// our top logit is less than this far above it: there a different summation order flips the greedy
/// choice (llama.cpp's reference notes say so). Measured gaps on the 1.5B moved between 0.0008 and
/// 0.23 with harmless changes in summation order (0.022 and 0.053 on 2026-11-30); the bound is
/// just above the largest seen.
const NEAR_TIE: f32 = 0.25;
/// The same for Gemma 3 270M, whose logits move further with summation order. On an Intel VM with
/// AVX-512 VNNI (2026-12-02) its "class Stack" prompt parts at token 4 by 0.29 logits with the
/// default kernels, 0.14 with the K-quants in the file's layout (`MENS_NO_K8=1`) and not at all
/// with the AVX2 kernels; the portable kernels part elsewhere by up to 0.23: rounding alone moves
/// these gaps by 0.15 or more. The bound is just above the largest seen.
const NEAR_TIE_GEMMA: f32 = 0.35;

/// Teacher-forced agreement with llama.cpp's greedy continuations (≥ 98% of positions), and
/// free-running greedy equal to the reference for at least the first 16 tokens of every prompt,
/// unless it first diverges at a near-tie (reported, and checked by teacher forcing).
fn greedy_matches_llama_cpp(name: &str) {
    let l = load(name);
    let gemma = name.starts_with("gemma");
    let refs = json(if gemma {
        "greedy_gemma3.json"
    } else {
        "greedy.json"
    });
    let tokens_ref = json(if gemma {
        "tokens_gemma3.json"
    } else {
        "tokens.json"
    });
    let (mut agree, mut total, mut ties) = (0usize, 0usize, 0usize);
    for (case, tcase) in refs[name]
        .as_array()
        .unwrap()
        .iter()
        .zip(tokens_ref.as_array().unwrap())
    {
        assert_eq!(case["prompt"], tcase["prompt"]);
        let prompt = prompt_ids(tcase);
        let cont = ids(&case["tokens"]);
        let opts = SessionOptions {
            ctx: 256,
            batch: 256,
            logit_rows: 16,
            ..Default::default()
        };
        let mut s = Session::new(l.model.clone(), opts.clone()).unwrap();
        // One pass, bit-equal to decoding the reference tokens one by one (how llama.cpp made
        // them); a pass of 64 rows or more would otherwise run the tiled prompt attention.
        s.exact_attention(true);
        let mut seq = prompt.clone();
        seq.extend_from_slice(&cont[..cont.len() - 1]);
        // (our argmax, our top logit − the reference token's logit, the reference token's rank).
        let mut preds = Vec::new();
        s.forward(
            &seq,
            Logits::All {
                from: prompt.len() - 1,
                f: &mut |i, lg| {
                    let top = argmax(lg);
                    let want = cont[i + 1 - prompt.len()] as usize;
                    let rank = 1 + lg.iter().filter(|&&x| x > lg[want]).count();
                    preds.push((top, lg[top as usize] - lg[want], rank));
                },
            },
        )
        .unwrap();
        assert_eq!(preds.len(), cont.len());
        agree += preds.iter().zip(&cont).filter(|(a, b)| a.0 == **b).count();
        total += cont.len();

        // Free-running greedy through the generation loop.
        let mut s = Session::new(l.model.clone(), opts).unwrap();
        let mut sampler = Sampler::new(SamplerConfig::greedy(), l.model.config.vocab_size).unwrap();
        let n = cont.len().min(24);
        let gen = GenerateOptions {
            max_tokens: n,
            ..Default::default()
        };
        generate(&mut s, &l.tokenizer, &mut sampler, &prompt, &gen, |_| true).unwrap();
        let mut got = s.tokens()[prompt.len()..].to_vec();
        if got.len() < n {
            // The last sampled token is not fed back; take it from the final logits.
            got.push(argmax(s.logits()));
        }
        let same = got.iter().zip(&cont).take_while(|(a, b)| a == b).count();
        let need = 16.min(cont.len());
        let prompt_text = case["prompt"].as_str().unwrap();
        if same >= need {
            eprintln!("{name}: {prompt_text:?}: free-running prefix {same} ≥ {need}");
            continue;
        }
        let (_, gap, rank) = preds[same];
        eprintln!(
            "{name}: {prompt_text:?}: free-running diverges at token {same}: the reference token is our choice #{rank}, {gap:.4} logits below our top"
        );
        let near = if gemma { NEAR_TIE_GEMMA } else { NEAR_TIE };
        assert!(
            rank == 2 && gap < near,
            "{name} {prompt_text:?}: diverges at token {same}: reference token ranked {rank}, {gap} logits below (not a near-tie)"
        );
        ties += 1;
    }
    let rate = agree as f64 / total as f64;
    eprintln!(
        "{name}: teacher-forced agreement {agree}/{total} = {:.2}%; near-tie divergences: {ties}",
        rate * 100.0
    );
    assert!(rate >= 0.98, "{name}: teacher-forced agreement {rate}");
    // At most 3 of the 8 prompts may part at a near-tie. The repacked Q5_0 kernel (kernels/x8.rs)
    // sums each block exactly in integers where llama.cpp sums four-value partials in f32, so the
    // two round differently: on Gemma 3 270M (mostly Q5_0) three prompts part at gaps of 0.0015,
    // 0.018 and 0.14 logits (one before that kernel); on the Qwen files none. The K-quants'
    // repacked kernels (kernels/k8.rs) do the same; on an AVX2 machine (session 14): 1.5B 1 prompt,
    // Gemma 3 3, 0.5B none (file layout: 2, 1, none).
    assert!(ties <= 3, "{name}: {ties} prompts diverge before 16 tokens");
}

#[test]
fn greedy_matches_llama_cpp_0_5b() {
    greedy_matches_llama_cpp("qwen2.5-coder-0.5b");
}

#[test]
fn greedy_matches_llama_cpp_1_5b() {
    greedy_matches_llama_cpp("qwen2.5-coder-1.5b");
}

#[test]
fn greedy_matches_llama_cpp_gemma3() {
    greedy_matches_llama_cpp("gemma3-270m");
}

/// One pass over `seq`; `f(step, logits)` for each position from `from` on (step 0 at `from`).
fn step_logits(s: &mut Session, seq: &[u32], from: usize, mut f: impl FnMut(usize, &[f32])) {
    s.forward(
        seq,
        Logits::All {
            from,
            f: &mut |i, lg| f(i - from, lg),
        },
    )
    .unwrap();
}

/// 256 greedy steps with the KV cache against the uncached computation (the whole sequence re-run):
/// the same tokens, logits within 1e-3. The first 48 steps re-run the sequence literally every step
/// (what `--no-kv-cache` does, quadratic in cost); all 256 are then checked against one uncached pass
/// over the whole sequence, whose logits at position i are those of a re-run ending at i (causal
/// attention; `all_logits_match_last_logits` shows the two are bit-identical).
#[test]
fn kv_cache_parity_0_5b() {
    let l = load("qwen2.5-coder-0.5b");
    let prompt = l.tokenizer.encode("def quicksort(arr):").unwrap();
    let steps = 256;
    let opts = SessionOptions {
        ctx: 512,
        batch: 512,
        logit_rows: 16,
        ..Default::default()
    };
    let mut cached = Session::new(l.model.clone(), opts.clone()).unwrap();
    let mut uncached = Session::new(l.model.clone(), opts.clone()).unwrap();
    // Every pass with decode's attention arithmetic: this checks the cache, not the prompt path.
    uncached.exact_attention(true);
    cached.forward(&prompt, Logits::Last).unwrap();
    let mut seq = prompt.clone();
    let mut cached_logits = Vec::with_capacity(steps);
    let mut max_diff = 0f32;
    for step in 0..steps {
        if step < 48 {
            uncached.reset();
            uncached.forward(&seq, Logits::Last).unwrap();
            let d = cached
                .logits()
                .iter()
                .zip(uncached.logits())
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            max_diff = max_diff.max(d);
            assert_eq!(
                argmax(cached.logits()),
                argmax(uncached.logits()),
                "step {step}"
            );
        }
        cached_logits.push(cached.logits().to_vec());
        let next = argmax(cached.logits());
        seq.push(next);
        cached.forward(&[next], Logits::Last).unwrap();
    }
    uncached.reset();
    let from = prompt.len() - 1;
    let mut checked = 0;
    step_logits(&mut uncached, &seq[..seq.len() - 1], from, |step, lg| {
        let c = &cached_logits[step];
        let d = c
            .iter()
            .zip(lg)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        max_diff = max_diff.max(d);
        assert_eq!(argmax(c), argmax(lg), "step {step}");
        checked += 1;
    });
    assert_eq!(checked, steps);
    eprintln!("0.5B: max |logit difference| cached vs uncached over {steps} steps: {max_diff:e}");
    assert!(max_diff < 1e-3);

    // The same uncached pass with the default prompt attention (tiled, f32, as llama.cpp runs
    // passes of 64 rows or more): close to decoding, not equal; a near-tie may flip.
    let mut tiled = Session::new(l.model.clone(), opts).unwrap();
    let (mut agree, mut worst) = (0, 0f32);
    step_logits(&mut tiled, &seq[..seq.len() - 1], from, |step, lg| {
        let c = &cached_logits[step];
        let d: f32 = c.iter().zip(lg).map(|(a, b)| (a - b) * (a - b)).sum();
        let n: f32 = c.iter().map(|a| a * a).sum();
        worst = worst.max((d / n).sqrt());
        agree += usize::from(argmax(c) == argmax(lg));
    });
    eprintln!(
        "0.5B, tiled prompt attention: argmax equal at {agree}/{steps} steps, worst relative L2 of the logits {worst:e}"
    );
    assert!(agree * 100 >= steps * 98 && worst < 0.08);
}

/// Perplexity on CPython's difflib.py with 512-token windows within 1% of llama-perplexity's 6.1134;
/// with a q8_0 K and V cache within 1% of llama-perplexity run with `-ctk q8_0 -ctv q8_0 -fa on` on
/// the same text (6.1579, measured 2026-11-30, docs/benchmarks.md), and close to the f16 cache's:
/// issue 21's bar is 0.5% (measured +0.49% on an AVX2 machine, 6.1430 against 6.1128); the bound
/// here is 0.75%, for other kernel sets' rounding, which the cache without its rotation (+1.12%)
/// fails.
#[test]
fn perplexity_matches_llama_cpp_0_5b() {
    let f16 = ppl_0_5b(KvType::F16, 6.1134);
    let q8 = ppl_0_5b(KvType::Q8_0, 6.1579);
    let cost = q8 / f16 - 1.0;
    eprintln!("q8_0 cache against f16: {:+.2}%", 100.0 * cost);
    assert!(cost < 0.0075, "q8_0 costs {:+.2}% perplexity", 100.0 * cost);
}

/// Gemma 3 270M over the first 12 windows of the same text (BOS first in each, as llama.cpp does
/// for this model): within 1% of `llama-perplexity -c 512 --chunks 12` (7.9349, 2026-12-01; all 44
/// windows: mens 8.4216, llama.cpp 8.4147, docs/benchmarks.md).
#[test]
fn perplexity_matches_llama_cpp_gemma3() {
    ppl("gemma3-270m", KvType::F16, Some(12), 7.9349);
}

fn ppl_0_5b(cache: KvType, reference: f64) -> f64 {
    ppl("qwen2.5-coder-0.5b", cache, None, reference)
}

/// A model's perplexity on the reference text with K and V cached as `cache` (over the first
/// `windows` windows, or all), within 1% of llama.cpp's `reference`.
fn ppl(name: &str, cache: KvType, windows: Option<usize>, reference: f64) -> f64 {
    let l = load(name);
    let text = std::fs::read_to_string(common::data("difflib.py.txt")).unwrap();
    let tokens = l.tokenizer.encode(&text).unwrap();
    let bos = l.tokenizer.bos.filter(|_| l.tokenizer.add_bos);
    let mut s = Session::new(
        l.model.clone(),
        SessionOptions {
            ctx: 512,
            batch: 512,
            logit_rows: 16,
            cache_k: cache,
            cache_v: cache,
        },
    )
    .unwrap();
    let r = mens::perplexity::perplexity(&mut s, &tokens, bos, windows, |_, _| {}).unwrap();
    eprintln!(
        "{name} perplexity, {} cache: {:.4} ± {:.4} over {} windows (llama.cpp {reference})",
        cache.name(),
        r.ppl,
        r.error,
        r.windows
    );
    assert_eq!(r.windows, windows.unwrap_or(40));
    assert!(
        (r.ppl - reference).abs() / reference < 0.01,
        "perplexity {} vs {reference}",
        r.ppl
    );
    r.ppl
}

/// `synth_q4_k_m` reproduces the real files' layout: the same tensors, shapes, byte sizes and types,
/// and the same number of layers whose attn_v / ffn_down get Q6_K (Q8_0 where rows are not a multiple
/// of 256). Which layers those are differs: these files were not quantized with llama.cpp's plain
/// `use_more_bits` rule, which synth follows (0.5B real: layers 0,1,3,6–10,13,16,19,21; rule: 0–2,
/// 5,8,11,14,17,20–23).
#[test]
fn synth_q4_k_m_matches_real_layouts() {
    use mens::synth::{synth_q4_k_m, QwenShape};
    for (name, shape) in [
        ("qwen2.5-coder-0.5b", "0.5b"),
        ("qwen2.5-coder-1.5b", "1.5b"),
    ] {
        let real = load(name);
        let g = &real.model.gguf;
        let w = synth_q4_k_m(&QwenShape::by_name(shape).unwrap(), 1);
        let mut n = 0;
        let (mut wide_real, mut wide_synth) = (0, 0);
        for (tname, dims, t, len) in w.tensors() {
            let r = g
                .tensor(tname)
                .unwrap_or_else(|| panic!("{name}: no {tname} in the real file"));
            assert_eq!(r.dims.as_slice(), dims, "{name} {tname} shape");
            let per_layer_choice =
                tname.ends_with("attn_v.weight") || tname.ends_with("ffn_down.weight");
            if per_layer_choice {
                let is_wide = |t| matches!(t, TensorType::Q6K | TensorType::Q8_0);
                wide_real += is_wide(r.ttype) as usize;
                wide_synth += is_wide(t) as usize;
            } else {
                assert_eq!(r.ttype, t, "{name} {tname} type");
                assert_eq!(r.bytes as usize, len, "{name} {tname} bytes");
            }
            n += 1;
        }
        assert_eq!(n, g.tensors.len(), "{name}: tensor count");
        assert_eq!(
            wide_real, wide_synth,
            "{name}: layers with wide attn_v/ffn_down"
        );
    }
}
