// Prompt lookup offline: replays scripts/spec-bench.py's tasks with their greedy answers (the plain
// texts of its --json output, tokenized again) through the engine's lookup (`spec::ngram`) and its
// planner, with a verify pass's cost given as ratios to a decode step, and prints the acceptance
// and the modelled speed-up per task. No model runs: what proposals or verify costs would give is
// answered in seconds. NGRAM=N (suffix length, default 3), MAX=K (default 8), ORACLE=1.
// DRAFT=D.gguf DCOST=c: `--spec draft` instead (the draft model does run, on the CPU, for its
// proposals; each of its steps costs c decode steps of the target), choosing between its proposal
// and the lookup's as `generate` does.
//
//   cargo run --release -p mens --example spec_sim -- MODEL.gguf bench/spec/tasks.jsonl RESULTS.json \
//       [COSTS: a verify of 1, 2, 3 … rows ÷ one decode step, comma-separated; default this VM's]
use mens::chat::{ChatTemplate, Message};
use mens::spec::{
    agreeing, draft as draft_steps, lookup_class, next_k, ngram, Planner, DRAFT_CLASS,
};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let g = mens::gguf::Gguf::open(a[1].as_ref()).unwrap();
    let tok = mens::tokenizer::Tokenizer::from_gguf(&g).unwrap();
    let tpl = ChatTemplate::from_gguf(&g, &tok).unwrap();
    let tasks: Vec<serde_json::Value> = std::fs::read_to_string(&a[2])
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let res: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&a[3]).unwrap()).unwrap();
    let costs: Vec<f64> = a
        .get(4)
        .map(|s| s.split(',').map(|x| x.parse().unwrap()).collect())
        .unwrap_or_else(|| vec![1.0, 1.12, 1.24, 1.36, 1.58, 1.83, 2.05, 2.3]);
    let cost = |r: usize| -> f64 {
        if r <= costs.len() {
            costs[r - 1]
        } else {
            let n = costs.len();
            costs[n - 1] + (costs[n - 1] - costs[n - 2]) * (r - n) as f64
        }
    };
    // ORACLE=1: of every earlier occurrence of every suffix, the one the answer follows longest.
    let oracle_rule = std::env::var_os("ORACLE").is_some();
    let n: usize = std::env::var("NGRAM")
        .ok()
        .map_or(3, |v| v.parse().unwrap());
    let max: usize = std::env::var("MAX").ok().map_or(8, |v| v.parse().unwrap());
    let mut drafter = std::env::var("DRAFT").ok().map(|p| {
        let m = std::sync::Arc::new(mens::model::Model::open(p.as_ref()).unwrap());
        let o = mens::cpu::SessionOptions {
            ctx: 4096,
            ..Default::default()
        };
        mens::cpu::Session::new(m, o).unwrap()
    });
    let dcost: f64 = std::env::var("DCOST")
        .ok()
        .map_or(0.4, |v| v.parse().unwrap());
    let mut by_kind: std::collections::BTreeMap<String, (f64, f64, usize, usize)> =
        Default::default();
    for t in &tasks {
        let id = t["id"].as_str().unwrap();
        let kind = t["kind"].as_str().unwrap().to_string();
        let r = res["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .unwrap();
        let text = r["plain"]["text"].as_str().unwrap();
        let msgs = [Message::new("user", t["prompt"].as_str().unwrap())];
        let prompt = tpl.tokens(&tok, &msgs, true, 8192).unwrap();
        let out = tok.encode_text_plain(text, 8192).unwrap();
        let mut planner = Planner::default();
        // Decode steps spent (a verify of r rows counts cost(r)), the first token's included.
        let (mut j, mut spent, mut prop, mut acc) = (1usize, cost(1), 0usize, 0usize);
        let mut hist: Vec<u32> = prompt.clone();
        hist.push(out[0]);
        planner.record_step(1, cost(1));
        let mut draft = Vec::new();
        let mut k = max.min(4);
        while j < out.len() {
            let cap = max.min(out.len() - j);
            let found = if oracle_rule {
                oracle(&hist, &out[j..], n, cap, &mut draft)
            } else {
                ngram(&hist, n, cap, &mut draft)
            };
            let mut class = lookup_class(found);
            let dk = k.min(cap);
            // `generate`: the lookup's proposal where the planner expects more of it, else the draft's.
            let lookup_pays = planner.prefers_lookup(class, draft.len(), dk);
            match drafter.as_mut() {
                Some(d) if !lookup_pays => {
                    class = DRAFT_CLASS;
                    let want = planner.plan(class, dk, true);
                    draft_steps(d, &hist, want, &mut draft).unwrap();
                    spent += want as f64 * dcost;
                    planner.record_draft(want, dcost);
                }
                _ => {
                    let want = planner.plan(class, draft.len(), false);
                    draft.truncate(want);
                }
            }
            let agree = agreeing(&draft, &out[j..]);
            let rows = draft.len() + 1;
            spent += cost(rows);
            planner.record_step(rows, cost(rows));
            if !draft.is_empty() {
                planner.record_accept(class, draft.len(), agree);
                k = next_k(k, draft.len(), agree, max);
                prop += draft.len();
                acc += agree;
            }
            let step = (agree + 1).min(out.len() - j);
            hist.extend_from_slice(&out[j..j + step]);
            j += step;
        }
        let x = out.len() as f64 / spent;
        println!(
            "{id:24} {kind:5} {:4} tokens  {acc:4}/{prop:4} accepted  {x:.2}x",
            out.len()
        );
        let e = by_kind.entry(kind).or_default();
        e.0 += out.len() as f64;
        e.1 += spent;
        e.2 += acc;
        e.3 += prop;
    }
    for (k, (tokens, spent, acc, prop)) in by_kind {
        println!("{k}: {:.2}x overall, {acc}/{prop} accepted", tokens / spent);
    }
}

/// The best candidate of all: among every earlier occurrence of every suffix of up to n tokens,
/// the continuation agreeing longest with the true answer `truth` (an upper bound for choosing
/// among candidates).
fn oracle(hist: &[u32], truth: &[u32], n: usize, cap: usize, out: &mut Vec<u32>) -> usize {
    let len = hist.len();
    let mut best = (0usize, 0usize, 0usize); // agreement, suffix length, start
    for k in (1..=n.min(len - 1)).rev() {
        let pat = &hist[len - k..];
        for i in 0..len - k {
            if &hist[i..i + k] == pat {
                let from = i + k;
                let agree = hist[from..]
                    .iter()
                    .zip(truth)
                    .take(cap)
                    .take_while(|(a, b)| a == b)
                    .count();
                if (agree, k) > (best.0, best.1) {
                    best = (agree, k, from);
                }
            }
        }
    }
    out.clear();
    if best.1 == 0 {
        return 0;
    }
    out.extend_from_slice(&hist[best.2..(best.2 + cap).min(len)]);
    best.1
}
