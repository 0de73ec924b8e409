//! Embeddings on the real 0.5B against llama-server's (`tests/data/embeddings.json`: mean and last
//! pooling of four inputs, one of 430 tokens), through the scheduler as the server runs them.

mod common;

use mens::cpu::{Session, SessionOptions};
use mens::embed::{normalize, Pooling};
use mens::runner::Logits;
use mens::scheduler::{Event, Request, Scheduler, SchedulerOptions, Usage};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn request(
    prompt: Vec<u32>,
    embed: Option<Pooling>,
    tenant: u64,
) -> (Request, mpsc::Receiver<Event>) {
    let (mut req, rx) = common::greedy_request(prompt, 8, tenant);
    req.embed = embed;
    (req, rx)
}

/// The embedding (if one came) and the usage a request ends with.
fn outcome(rx: &mpsc::Receiver<Event>) -> (Option<Vec<f32>>, Usage) {
    let mut v = None;
    loop {
        match rx.recv_timeout(Duration::from_secs(300)).expect("an event") {
            Event::Embedding(e) => v = Some(e),
            Event::Done(u) => return (v, u),
            Event::Error(e) => panic!("request failed: {e}"),
            Event::Text(_) | Event::Logprobs(_) => {}
        }
    }
}

/// `ids` through one CPU session (one pass), pooled.
fn pooled_alone(model: &Arc<mens::model::Model>, ids: &[u32], pooling: Pooling) -> Vec<f32> {
    let options = SessionOptions {
        ctx: 1024,
        ..Default::default()
    };
    let mut s = Session::new(model.clone(), options).unwrap();
    let mut pool = mens::embed::Pool::new(pooling);
    let mut f = |i: usize, row: &[f32]| pool.add(i, row);
    s.forward(ids, Logits::Hidden { from: 0, f: &mut f })
        .unwrap();
    pool.finish()
}

fn scheduler(l: &common::Loaded, slots: usize, batch: usize) -> Scheduler {
    let tok = Arc::new(mens::tokenizer::Tokenizer::from_gguf(&l.model.gguf).unwrap());
    let options = SchedulerOptions {
        slots,
        ctx: 1024,
        batch,
        queue: 16,
        cache_reuse: 0,
        spec: None,
        cache: Default::default(),
    };
    Scheduler::cpu(l.model.clone(), tok, options).unwrap()
}

/// Mean and last pooling follow llama-server's vectors (cosine ≥ 0.999 each, where two different
/// inputs are far apart), with the same token counts; the 430-token input is prefilled in steps
/// of 128 and its mean taken over every pass. A single sequence (`Session`, one pass) gives the
/// scheduler's vectors.
#[test]
fn pooled_embeddings_match_llama_server() {
    let l = common::load("qwen2.5-coder-0.5b");
    let reference = common::json("embeddings.json");
    let inputs: Vec<String> = serde_json::from_value(reference["inputs"].clone()).unwrap();
    let ids: Vec<Vec<u32>> = inputs
        .iter()
        .map(|t| l.tokenizer.encode_embedding(t, usize::MAX).unwrap())
        .collect();
    assert!(ids[3].len() > 256, "{}", ids[3].len());
    let s = scheduler(&l, 2, 128);
    for pooling in [Pooling::Mean, Pooling::Last] {
        let r = &reference[pooling.name()];
        let want: Vec<Vec<f32>> = serde_json::from_value(r["vectors"].clone()).unwrap();
        let rxs: Vec<_> = ids
            .iter()
            .map(|p| {
                let (req, rx) = request(p.clone(), Some(pooling), 7);
                s.submit(req).unwrap();
                rx
            })
            .collect();
        let mut tokens = 0;
        let mut got = Vec::new();
        for (i, rx) in rxs.iter().enumerate() {
            let (v, u) = outcome(rx);
            let mut v = v.expect("an embedding");
            assert_eq!(v.len(), l.model.config.dim);
            assert_eq!(
                (u.prompt_tokens, u.completion_tokens, u.cached_tokens),
                (ids[i].len(), 0, 0)
            );
            tokens += u.prompt_tokens;
            normalize(&mut v, 2);
            let c = cosine(&v, &want[i]);
            assert!(c >= 0.999, "{pooling:?} input {i}: cosine {c}");
            got.push(v);
        }
        assert_eq!(tokens as u64, r["prompt_tokens"].as_u64().unwrap());
        let apart = cosine(&got[0], &got[1]);
        assert!(
            apart < 0.9,
            "{pooling:?}: different inputs at cosine {apart}"
        );

        // One sequence, one pass: the same rows.
        let mut alone = pooled_alone(&l.model, &ids[3], pooling);
        normalize(&mut alone, 2);
        let c = cosine(&alone, &got[3]);
        assert!(
            c >= 0.9999,
            "{pooling:?}: one pass against steps of 128: cosine {c}"
        );
    }
}

/// An embedding request takes the slot holding least and computes every row: a conversation
/// cached in another slot stays cached, even when the input shares most of its prompt (a policy
/// that took the best-matching slot, as a chat request does, would overwrite it).
#[test]
fn an_embedding_leaves_a_cached_conversation_alone() {
    let l = common::load("qwen2.5-coder-0.5b");
    let s = scheduler(&l, 2, 128);
    let code = "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n    pivot, rest = xs[0], xs[1:]\n    return quicksort([x for x in rest if x < pivot]) + [pivot] + quicksort([x for x in rest if x >= pivot])\n";
    let ids = |tail: &str| {
        l.tokenizer
            .encode_text(&format!("{code}{tail}"), 1024)
            .unwrap()
    };
    let (chat, input) = (
        ids("# Explain this function.\n"),
        ids("# Sorting, in one line.\n"),
    );
    assert!(chat.len() < 128 && input.len() > 40);
    let (req, rx) = request(chat.clone(), None, 1);
    s.submit(req).unwrap();
    let (_, first) = outcome(&rx);
    assert_eq!(first.cached_tokens, 0);
    let (req, rx) = request(input.clone(), Some(Pooling::Mean), 1);
    s.submit(req).unwrap();
    let (v, u) = outcome(&rx);
    assert_eq!(u.cached_tokens, 0, "an embedding reuses no rows");
    // Every row pooled: the vector of a scheduler that never saw the prompt.
    let fresh = scheduler(&l, 1, 128);
    let (req, rx) = request(input.clone(), Some(Pooling::Mean), 1);
    fresh.submit(req).unwrap();
    assert_eq!(v, outcome(&rx).0);
    let (req, rx) = request(chat.clone(), None, 1);
    s.submit(req).unwrap();
    let (_, again) = outcome(&rx);
    assert!(
        again.cached_tokens + 1 >= chat.len(),
        "the conversation's slot was taken: {} of {} cached",
        again.cached_tokens,
        chat.len()
    );
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

/// A Qwen3-Embedding-style file (the tiny random-weight one: `pooling_type` last, `add_eos_token`)
/// against llama-server on the same file (`tests/data/arch/qwen3-embed.json`): the pooling comes from
/// the file, each input ends with EOS (the token counts agree), and the vectors (not normalised)
/// agree to cosine ≥ 0.9999. Mean pooling, or the input without its EOS, misses by far.
#[test]
fn a_qwen3_embedding_file_pools_its_last_token_as_llama_cpp() {
    let bytes = mens::synth::synth_model(&mens::synth::SynthSpec::tiny_qwen3_embed());
    let reference = common::json("arch/qwen3-embed.json");
    assert_eq!(
        reference["gguf_fnv1a64"].as_str().unwrap(),
        format!("{:016x}", fnv1a64(&bytes)),
        "the tiny qwen3-embed model is not the file llama.cpp saw: run scripts/embed-reference.sh"
    );
    let g = mens::gguf::Gguf::from_bytes(bytes).unwrap();
    let (model, tok, _) = mens::load::from_gguf(g).unwrap();
    assert_eq!(model.config.pooling, Some(Pooling::Last));
    assert!(tok.add_eos);
    let model = Arc::new(model);
    let embed = |ids: &[u32], pooling: Pooling| pooled_alone(&model, ids, pooling);
    let inputs: Vec<String> = serde_json::from_value(reference["inputs"].clone()).unwrap();
    let counts: Vec<usize> = serde_json::from_value(reference["prompt_tokens"].clone()).unwrap();
    let want: Vec<Vec<f32>> = serde_json::from_value(reference["vectors"].clone()).unwrap();
    for (i, text) in inputs.iter().enumerate() {
        let ids = tok.encode_embedding(text, 256).unwrap();
        assert_eq!(ids.len(), counts[i], "input {i}");
        assert_eq!(ids.last(), Some(&tok.eos));
        let v = embed(&ids, Pooling::Last);
        let c = cosine(&v, &want[i]);
        assert!(c >= 0.9999, "input {i}: cosine {c}");
        if ids.len() > 2 {
            let mean = cosine(&embed(&ids, Pooling::Mean), &want[i]);
            let no_eos = cosine(&embed(&ids[..ids.len() - 1], Pooling::Last), &want[i]);
            assert!(
                mean < 0.99 && no_eos < 0.99,
                "input {i}: mean {mean}, without EOS {no_eos}"
            );
        }
    }
}
