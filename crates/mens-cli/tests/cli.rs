//! The `mens` binary on bad input: a clear message and exit code 2, never a panic.

use mens::synth::{synth_model, SynthSpec};
use std::path::PathBuf;
use std::process::Command;

fn mens() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mens"))
}

fn tmp(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mens-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    // Tests run in parallel and share names: write aside, then rename (atomic), so that no test
    // reads a file another is still writing.
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let part = dir.join(format!("{name}.{n}.part"));
    std::fs::write(&part, bytes).unwrap();
    std::fs::rename(&part, &p).unwrap();
    p
}

fn tiny() -> PathBuf {
    tmp("tiny.gguf", &synth_model(&SynthSpec::tiny_qwen2()))
}

/// Runs mens, expects exit code 2, no panic, and `want` in stderr.
fn fails_with(args: &[&str], want: &str) {
    let out = mens().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "args {args:?}: stderr {err}");
    assert!(!err.contains("panicked"), "args {args:?} panicked: {err}");
    assert!(
        err.contains(want),
        "args {args:?}: expected {want:?} in {err}"
    );
}

#[test]
fn missing_file() {
    fails_with(
        &["run", "-m", "/nonexistent/model.gguf", "-p", "x"],
        "cannot open /nonexistent/model.gguf",
    );
}

#[test]
fn not_a_gguf_file() {
    let p = tmp("not.gguf", b"this is not a model file at all");
    fails_with(
        &["run", "-m", p.to_str().unwrap(), "-p", "x"],
        "not a GGUF file",
    );
}

#[test]
fn truncated_gguf() {
    let bytes = synth_model(&SynthSpec::tiny_qwen2());
    for cut in [10, 100, 5000, bytes.len() / 2, bytes.len() - 1] {
        let p = tmp(&format!("cut{cut}.gguf"), &bytes[..cut]);
        fails_with(
            &["run", "-m", p.to_str().unwrap(), "-p", "x"],
            "invalid GGUF file",
        );
    }
}

#[test]
fn unknown_architecture() {
    let bytes = synth_model(&SynthSpec::tiny_qwen2());
    // Same length, so the rest of the file stays valid: "qwen2" → "qwenX" in the architecture value.
    let needle = b"general.architecture";
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap()
        + needle.len()
        + 4
        + 8;
    let mut bad = bytes.clone();
    assert_eq!(&bad[at..at + 5], b"qwen2");
    bad[at + 4] = b'X';
    let p = tmp("arch.gguf", &bad);
    fails_with(
        &["run", "-m", p.to_str().unwrap(), "-p", "x"],
        "architecture \"qwenX\" is not supported",
    );
}

#[test]
fn prompt_longer_than_context() {
    let m = tiny();
    let long = "word ".repeat(100);
    fails_with(
        &["run", "-m", m.to_str().unwrap(), "-c", "32", "-p", &long],
        "context",
    );
}

#[test]
fn invalid_sampling_values() {
    let m = tiny();
    let m = m.to_str().unwrap();
    fails_with(&["run", "-m", m, "-p", "x", "--temp", "-1"], "temperature");
    fails_with(&["run", "-m", m, "-p", "x", "--top-p", "2"], "top-p");
    fails_with(&["run", "-m", m, "-p", "x", "--min-p", "7"], "min-p");
}

#[test]
fn generates_on_a_tiny_model() {
    let m = tiny();
    let out = mens()
        .args([
            "run",
            "-m",
            m.to_str().unwrap(),
            "-p",
            "the",
            "-n",
            "8",
            "--temp",
            "0",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("the"));
    assert!(err.contains("tokens/s"), "timing lines missing: {err}");
    let chat = mens()
        .args([
            "run",
            "-m",
            m.to_str().unwrap(),
            "--chat",
            "-p",
            "hi",
            "-n",
            "4",
        ])
        .output()
        .unwrap();
    assert!(
        chat.status.success(),
        "{}",
        String::from_utf8_lossy(&chat.stderr)
    );
}

fn bench_json(m: &std::path::Path, extra: &[&str], name: &str) -> serde_json::Value {
    let json = std::env::temp_dir().join(format!("mens-bench-{}-{name}.json", std::process::id()));
    let mut args = vec!["bench", "-q", "-m", m.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--json", json.to_str().unwrap()]);
    let out = mens().args(&args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

/// `mens bench` on the tiny model with CI sizes: every JSON field, the Markdown table and the plot.
#[test]
fn bench_reports_every_field() {
    let dir = std::env::temp_dir();
    let md = dir.join(format!("mens-bench-{}.md", std::process::id()));
    let svg = dir.join(format!("mens-bench-{}.svg", std::process::id()));
    let (md_s, svg_s) = (md.to_str().unwrap(), svg.to_str().unwrap());
    let v = bench_json(
        &tiny(),
        &[
            "--prompt",
            "32",
            "--steps",
            "16",
            "--window",
            "4",
            "--reps",
            "2",
            "--compare",
            "--depth",
            "0,16",
            "--gen",
            "8",
            "--md",
            md_s,
            "--plot",
            svg_s,
        ],
        "fields",
    );
    for key in [
        "model",
        "model_name",
        "backend",
        "threads",
        "reps",
        "window",
        "schedule_prompt",
        "prefill",
        "decode",
        "windows",
        "results",
        "memory",
        "counted",
        "machine",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    let p = &v["prefill"][0];
    assert_eq!(p["n_prompt"], 32);
    assert!(p["ttft_ms"].as_f64().unwrap() > 0.0 && p["tokens_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(p["ttft_ms_all"].as_array().unwrap().len(), 2);
    let d = v["decode"].as_array().unwrap();
    assert_eq!(d.len(), 2);
    assert_eq!(d[0]["kv_cache"], true);
    assert_eq!(d[0]["steps"].as_array().unwrap().len(), 16);
    assert!(d[0]["step_ms"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t.as_f64().unwrap() > 0.0));
    assert_eq!(
        d[0]["allocations_per_step"].as_f64().unwrap(),
        0.0,
        "{}",
        d[0]
    );
    assert_eq!(
        d[0]["dispatches_per_step"].as_f64().unwrap(),
        20.0,
        "2 layers × 9 + 2"
    );
    assert_eq!(d[1]["kv_cache"], false);
    // Uncached: only the windows (steps 1–4 and 13–16) are timed.
    let steps: Vec<u64> = d[1]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(steps, vec![1, 2, 3, 4, 13, 14, 15, 16]);
    let w = v["windows"].as_array().unwrap();
    assert_eq!(
        w.len(),
        4,
        "steps 1 and 16 (clamped from 256, 512), two configurations"
    );
    assert!(w.iter().all(|x| x["tokens_per_s"].as_f64().unwrap() > 0.0));
    let r = v["results"].as_array().unwrap();
    assert_eq!(r.len(), 4, "depths 0 and 16 × two configurations");
    let m = &v["memory"];
    for key in [
        "peak_rss_bytes",
        "model_bytes",
        "file_bytes",
        "kv_cache_bytes",
        "session_bytes",
        "ctx",
    ] {
        assert!(m[key].as_u64().unwrap() > 0, "memory.{key}");
    }
    assert!(
        v["machine"]["total_ram"].as_u64().is_some_and(|b| b > 0),
        "{}",
        v["machine"]
    );
    let table = std::fs::read_to_string(&md).unwrap();
    assert!(
        table.contains("| metric | KV cache | no KV cache |"),
        "{table}"
    );
    assert!(table.contains("TTFT, 32-token prompt"));
    assert!(table.contains("decode at step 16"));
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(
        plot.contains("<svg") && plot.contains("KV cache"),
        "not an SVG plot"
    );
}

/// Uncached decode slows down with the step (it re-runs the sequence) while the cached one stays
/// nearly flat, on a model large enough that matmuls, not attention, dominate (d = 1024, 4 layers).
#[test]
fn the_kv_cache_keeps_decode_flat() {
    use mens::gguf::TensorType::Q8_0;
    let spec = SynthSpec {
        n_layer: 4,
        dim: 1024,
        n_head: 16,
        n_kv_head: 4,
        ffn_dim: 2816,
        types: [Q8_0; 7],
        ..SynthSpec::tiny_qwen2()
    };
    let m = tmp("medium.gguf", &synth_model(&spec));
    let run = || {
        bench_json(
            &m,
            &[
                "--prompt",
                "16",
                "--reps",
                "1",
                "--steps",
                "192",
                "--at",
                "1,192",
                "--window",
                "8",
                "--compare",
            ],
            "flat",
        )
    };
    let mut v = run();
    // The other tests of this binary run beside it on two cores: a burst of theirs can land on
    // the far steps only (seen once: 0.73). A second measurement decides then; both must be low
    // to fail.
    if v["paired"]["ratio"].as_f64().unwrap() < FLAT {
        eprintln!(
            "paired ratio {:.2} on the first run: measuring again",
            v["paired"]["ratio"].as_f64().unwrap()
        );
        v = run();
    }
    let tps = |cached: bool, step: u64| {
        v["windows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["kv_cache"] == cached && w["step"] == step)
            .unwrap()["tokens_per_s"]
            .as_f64()
            .unwrap()
    };
    // Cached: the paired measurement (steps at 1 and at 192 alternating), which machine load
    // affects alike; windows of 8 steps swing with whatever else runs (the other tests).
    let cached_ratio = v["paired"]["ratio"].as_f64().unwrap();
    // Uncached: medians of the per-step times in the two windows (a slow phase of a few steps,
    // another test's process say, moves a window's sum but hardly its median).
    let uncached = v["decode"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["kv_cache"] == false)
        .unwrap();
    let median_ms = |from: u64, to: u64| {
        let mut ms: Vec<f64> = uncached["steps"]
            .as_array()
            .unwrap()
            .iter()
            .zip(uncached["step_ms"].as_array().unwrap())
            .filter(|(s, _)| (from..=to).contains(&s.as_u64().unwrap()))
            .map(|(_, t)| t.as_f64().unwrap())
            .collect();
        assert_eq!(ms.len(), 8);
        ms.sort_by(f64::total_cmp);
        (ms[3] + ms[4]) / 2.0
    };
    let uncached_ratio = median_ms(1, 8) / median_ms(185, 192);
    eprintln!(
        "uncached windows: step 192 / step 1 = {:.2}",
        tps(false, 192) / tps(false, 1)
    );
    assert_eq!(v["paired"]["far_step"], 192);
    assert_eq!(v["paired"]["near_step_ms"].as_array().unwrap().len(), 32);
    eprintln!(
        "cached windows: step 192 / step 1 = {:.2}",
        tps(true, 192) / tps(true, 1)
    );
    eprintln!(
        "decode speed at step 192 / step 1: cached {cached_ratio:.2}, uncached {uncached_ratio:.2}"
    );
    assert!(
        uncached_ratio < 0.4,
        "uncached decode should slow down with the step: {uncached_ratio}"
    );
    // CLAIM-06: the paired ratio on this synthetic model (see FLAT).
    assert!(
        cached_ratio >= FLAT,
        "cached decode should stay nearly flat: {cached_ratio}"
    );
}

/// The least paired speed ratio of step 192 to step 1 with the KV cache (uncached: about 0.09).
/// Measured alone: 0.94–0.95 on an AMD VM with AVX2, 0.84–0.85 on an Intel VM with AVX-512 VNNI
/// (2026-12-02), whose Q8_0 kernels make the weights' share of a step smaller and attention's
/// larger; the bound leaves room for that and for the other tests running beside it.
const FLAT: f64 = 0.75;

/// `mens synth` writes a real-size random model (0.5B shape, Q4_K_M layout) that loads and
/// generates; an unknown shape is a clear error.
#[test]
fn synth_writes_a_model_that_runs() {
    let path = std::env::temp_dir().join(format!("mens-synth-{}.gguf", std::process::id()));
    let out = mens()
        .args(["synth", "--shape", "0.5b", "-o", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = mens()
        .args([
            "run",
            "-m",
            path.to_str().unwrap(),
            "-c",
            "64",
            "-n",
            "4",
            "--temp",
            "0",
        ])
        .args(["-p", "hello"])
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{err}");
    assert!(err.contains("24 layers, d=896"), "{err}");
    fails_with(
        &["synth", "--shape", "13b", "-o", "/tmp/x.gguf"],
        "unknown shape",
    );
}

/// The tiny model's bytes with its chat template replaced by `template` (padded with spaces to the
/// original length, so the file stays valid).
fn with_template(template: &str) -> Vec<u8> {
    let mut b = synth_model(&SynthSpec::tiny_qwen2());
    let key = b"tokenizer.chat_template";
    let at = b.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    let n = u64::from_le_bytes(b[at + 4..at + 12].try_into().unwrap()) as usize;
    assert!(template.len() <= n);
    let padded = format!("{template}{}", " ".repeat(n - template.len()));
    b[at + 12..at + 12 + n].copy_from_slice(padded.as_bytes());
    b
}

/// A model file whose template doubles a string until memory runs out (within minijinja's fuel):
/// the template runs in a helper process under a memory limit, so mens answers with a clear error
/// and exit 2 instead of aborting (it aborted at 2.28 GB RSS under a 3 GB limit before).
#[test]
fn a_template_that_exhausts_memory_is_refused() {
    let hostile = "{% set s = namespace(x='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set s.x = s.x ~ s.x %}{% endfor %}{{ s.x | length }}";
    // A template that loops past its fuel is an error too, not a silent fallback to ChatML.
    let runaway =
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}";
    for (name, template, want) in [
        (
            "hostile",
            hostile,
            "rendering needed more than 1024 MiB of memory",
        ),
        ("runaway", runaway, "chat template"),
    ] {
        let p = tmp(&format!("{name}-template.gguf"), &with_template(template));
        let m = p.to_str().unwrap();
        fails_with(&["run", "--chat", "-m", m, "-p", "hi", "-n", "2"], want);
    }
    // The real template still renders through the helper.
    let out = mens()
        .args([
            "run",
            "--chat",
            "-m",
            tiny().to_str().unwrap(),
            "-p",
            "hi",
            "-n",
            "2",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One helper process renders many prompts; when a hostile request kills it (memory limit), the
/// next render starts another.
#[test]
fn the_template_helper_survives_a_hostile_render() {
    use mens::chat::{ChatTemplate, Isolation, Message};
    let src = "{% if messages[0].content == 'boom' %}{% set s = namespace(x='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set s.x = s.x ~ s.x %}{% endfor %}{% endif %}{{ messages[0].content }}";
    let mut t = ChatTemplate::new(Some(src.into()), String::new(), String::new());
    t.isolate(Isolation {
        program: env!("CARGO_BIN_EXE_mens").into(),
        args: vec![
            "render-template".into(),
            "--memory-limit".into(),
            (1u64 << 30).to_string(),
        ],
        memory_limit: 1 << 30,
        timeout: std::time::Duration::from_secs(20),
    });
    let say = |t: &ChatTemplate, s: &str| t.render(&[Message::new("user", s)], false);
    assert_eq!(say(&t, "hi").unwrap(), "hi");
    let t0 = std::time::Instant::now();
    for i in 0..20 {
        assert_eq!(say(&t, &format!("n{i}")).unwrap(), format!("n{i}"));
    }
    eprintln!("20 renders through one helper: {:?}", t0.elapsed());
    let e = say(&t, "boom").unwrap_err().to_string();
    assert!(e.contains("more than 1024 MiB"), "{e}");
    assert_eq!(say(&t, "again").unwrap(), "again");
}

/// Without --seed each run draws a fresh seed and prints it; --seed with that value replays the run.
/// A missing file's OS error is printed once.
#[test]
fn fresh_seeds_are_printed_and_replay() {
    let m = tiny();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "-m",
            m.to_str().unwrap(),
            "-p",
            "the",
            "-n",
            "24",
            "--temp",
            "1.5",
        ];
        args.extend_from_slice(extra);
        let out = mens().args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let seed = err
            .split("seed ")
            .nth(1)
            .and_then(|s| s.split(')').next())
            .unwrap_or_else(|| panic!("no seed printed: {err}"))
            .to_string();
        (String::from_utf8_lossy(&out.stdout).into_owned(), seed)
    };
    let (a, seed_a) = run(&[]);
    let (_, seed_b) = run(&[]);
    assert_ne!(seed_a, seed_b, "the default seed is not fresh");
    let (replay, seed_r) = run(&["--seed", &seed_a]);
    assert_eq!(seed_r, seed_a);
    assert_eq!(replay, a, "--seed {seed_a} did not replay the run");
    let out = mens()
        .args(["run", "-m", "/nonexistent/x.gguf", "-p", "x"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
}

/// Messages name the right thing: a full context says so (not "Length"); a budget above the
/// machine's RAM is warned about; a redirected log has no colour codes.
#[test]
fn messages_name_the_right_thing() {
    let m = tiny();
    let out = mens()
        .args([
            "run",
            "-m",
            m.to_str().unwrap(),
            "-c",
            "16",
            "-n",
            "100",
            "-p",
            "the",
            "--temp",
            "0",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.contains("stop: ContextFull"),
        "{err}"
    );
    let out = mens()
        .args([
            "run",
            "-m",
            m.to_str().unwrap(),
            "--memory-budget",
            "100T",
            "-p",
            "the",
            "-n",
            "2",
        ])
        .env("MENS_LOG", "info")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("more than this machine's"), "{err}");
    assert!(
        !err.contains('\u{1b}'),
        "colour codes in a redirected log: {err:?}"
    );
}

/// `mens bench --concurrency`: N sequences decode together (the server's batched step), one row per
/// N; bad values are refused with a clear error.
#[test]
fn bench_concurrency_decodes_many_sequences_together() {
    let v = bench_json(
        &tiny(),
        &[
            "--prompt",
            "8",
            "--steps",
            "0",
            "--reps",
            "1",
            "--concurrency",
            "1,3,8",
            "--concurrency-prompt",
            "40",
            "--gen",
            "6",
        ],
        "concurrency",
    );
    let c = v["concurrency"].as_array().unwrap();
    assert_eq!(c.len(), 3);
    for (row, n) in c.iter().zip([1u64, 3, 8]) {
        assert_eq!(row["sequences"], n);
        assert_eq!(row["prompt"], 40);
        assert_eq!(row["n_gen"], 6);
        let (all, one) = (
            row["tokens_per_s"].as_f64().unwrap(),
            row["per_sequence_tokens_per_s"].as_f64().unwrap(),
        );
        assert!(
            one > 0.0 && (all / one - n as f64).abs() < 1e-6 * n as f64,
            "{row}"
        );
    }
    let m = tiny();
    let m = m.to_str().unwrap();
    fails_with(
        &["bench", "-m", m, "--concurrency", "0"],
        "--concurrency takes 1 to 1024 sequences",
    );
    fails_with(
        &["bench", "-m", m, "--concurrency", "2000"],
        "--concurrency takes 1 to 1024 sequences",
    );
    // The CPU batch holds at most 64 sequences: a clear error, not a panic.
    fails_with(
        &[
            "bench",
            "-m",
            m,
            "--prompt",
            "8",
            "--steps",
            "0",
            "--concurrency",
            "65",
        ],
        "1..=64 slots",
    );
}

/// `mens chat` through a pipe: a `"""` block with blank lines is one turn, blank lines never end
/// the chat, a line ending in `\` continues, and /help, /save, /reset, /load and unknown commands
/// each say what they did.
#[test]
fn chat_reads_multi_line_turns_and_commands() {
    use std::io::Write;
    let m = tiny();
    let dir = std::env::temp_dir().join(format!("mens-chat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let saved = dir.join("conv.json");
    let script = format!(
        "/help\n\nhello\n\"\"\"\ndef f():\n\n    return 1\n\"\"\"\n\nfirst \\\nsecond\n/nope\n/save {s}\n/reset\n/load {s}\n/load {missing}\nagain\n",
        s = saved.display(),
        missing = dir.join("missing.json").display()
    );
    let mut child = mens()
        .args(["chat", "-m", m.to_str().unwrap(), "-n", "3", "--temp", "0"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Four turns: hello, the block, the continued line, again.
    assert_eq!(err.matches("new prompt tokens").count(), 4, "{err}");
    assert!(err.contains("/save FILE"), "help missing: {err}");
    assert!(err.contains("unknown command /nope"), "{err}");
    assert!(err.contains("saved 6 messages"), "{err}");
    assert!(err.contains("conversation forgotten"), "{err}");
    assert!(err.contains("loaded 6 messages"), "{err}");
    assert!(
        err.contains("missing.json") && err.contains("the conversation is unchanged"),
        "{err}"
    );
    let conv: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    let users: Vec<&str> = conv
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        users,
        ["hello", "def f():\n\n    return 1", "first \nsecond"]
    );
    // A reloaded conversation is prefilled again with the next turn (nothing reused after /reset).
    let last = err
        .lines()
        .rfind(|l| l.contains("new prompt tokens"))
        .unwrap();
    assert!(last.contains("(0 reused)"), "{last}");
    // A file that is not a conversation is refused, the conversation unchanged.
    std::fs::write(&saved, "[{\"role\": \"tool\", \"content\": \"x\"}]").unwrap();
    let out = mens()
        .args(["chat", "-m", m.to_str().unwrap(), "-n", "2"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .and_then(|mut c| {
            c.stdin
                .take()
                .unwrap()
                .write_all(format!("/load {}\n", saved.display()).as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.contains("role \"tool\""),
        "{err}"
    );
}

/// A prompt longer than one prefill chunk (512 tokens) is prefilled chunk by chunk (with a
/// progress line on a terminal): the same text as the uncached baseline, which prefills it whole,
/// and the timing line counts the whole prompt. (That the cache and logits are bit for bit those
/// of one pass is `run::tests::chunked_prefill_equals_one_pass`.)
#[test]
fn a_long_prompt_gives_the_same_text_in_chunks() {
    let m = tiny();
    let words = ["alpha", "beta", "gamma", "delta", "the", "of", "code", "fn"];
    let text: String = (0..300)
        .map(|i| words[(i * 7 + i / 3) % 8])
        .collect::<Vec<_>>()
        .join(" ");
    let f = tmp("long-prompt.txt", text.as_bytes());
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "-m", m.to_str().unwrap(), "-f", f.to_str().unwrap()];
        args.extend_from_slice(&["-n", "8", "--temp", "0", "-c", "4096"]);
        args.extend_from_slice(extra);
        let out = mens().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{err}");
        (String::from_utf8_lossy(&out.stdout).to_string(), err)
    };
    let (chunked, err) = run(&[]);
    let (whole, err_whole) = run(&["--no-kv-cache"]);
    assert_eq!(chunked, whole);
    let prompt_line = |e: &str| {
        e.lines()
            .find(|l| l.starts_with("mens: prompt "))
            .map(|l| l.split(" tokens").next().unwrap().to_string())
            .unwrap()
    };
    assert_eq!(prompt_line(&err), prompt_line(&err_whole));
    let n: usize = prompt_line(&err)
        .trim_start_matches("mens: prompt ")
        .parse()
        .unwrap();
    assert!(n > 1024, "the prompt is {n} tokens: not several chunks");
}

/// Flags out of range name themselves in one line (exit 2): -n below -1, a negative --top-k, a
/// bench prompt larger than any context; -n -1 generates until the context is full.
#[test]
fn out_of_range_flags_name_themselves() {
    let m = tiny();
    let m = m.to_str().unwrap();
    fails_with(
        &["run", "-m", m, "-p", "hi", "-n", "-2"],
        "-n takes a number of tokens",
    );
    fails_with(
        &["run", "-m", m, "-p", "hi", "--top-k", "-5"],
        "--top-k must be 0 (off) or more",
    );
    fails_with(
        &["bench", "-m", m, "--prompt", "100000000"],
        "--prompt 100000000 is more than",
    );
    let out = mens()
        .args([
            "run", "-m", m, "-p", "hi", "-n", "-1", "-c", "48", "--temp", "0",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("stop: ContextFull") || err.contains("stop: Eos"),
        "{err}"
    );
}

/// `mens serve --spec draft` needs a draft model (its vocabulary is checked as in `mens run`:
/// `spec::check_vocab`); a draft without `--spec draft` is refused too.
#[test]
fn serve_draft_flags_are_checked() {
    let m = tiny();
    let m = m.to_str().unwrap();
    fails_with(
        &["serve", "-m", m, "--spec", "draft", "--port", "0"],
        "--spec draft needs --model-draft",
    );
    fails_with(
        &["serve", "-m", m, "-md", m, "--port", "0"],
        "--model-draft needs --spec draft",
    );
}

/// mens is built for the x86-64 baseline and picks its CPU kernels at run time: on a CPU without
/// AVX2 (qemu's Nehalem model, which raises SIGILL on AVX) it runs, says so, and writes what the same
/// binary writes natively when told to use the portable kernels. Needs `qemu-x86_64` (qemu-user);
/// without it the test says SKIP, and fails where `MENS_REQUIRE_QEMU` is set (CI sets it).
#[cfg(target_arch = "x86_64")]
#[test]
fn runs_on_a_cpu_without_avx2() {
    let qemu = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("qemu-x86_64"))
            .find(|q| q.is_file())
    });
    let Some(qemu) = qemu else {
        assert!(
            std::env::var_os("MENS_REQUIRE_QEMU").is_none(),
            "MENS_REQUIRE_QEMU is set but qemu-x86_64 is not on PATH"
        );
        eprintln!("SKIP (not run, not passed): runs_on_a_cpu_without_avx2 needs qemu-x86_64");
        return;
    };
    let model = tiny();
    let args = [
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "def add(a, b):",
        "-n",
        "16",
        "--temp",
        "0",
    ];
    let emulated = Command::new(qemu)
        .args(["-cpu", "Nehalem", env!("CARGO_BIN_EXE_mens")])
        .args(args)
        .env_remove("MENS_CPU")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&emulated.stderr);
    assert!(emulated.status.success(), "under qemu -cpu Nehalem: {err}");
    assert!(err.contains("portable kernels"), "{err}");
    assert!(err.contains("generated 16 tokens"), "{err}");
    let native = mens()
        .args(args)
        .env("MENS_CPU", "portable")
        .output()
        .unwrap();
    assert!(native.status.success());
    assert_eq!(
        String::from_utf8_lossy(&emulated.stdout),
        String::from_utf8_lossy(&native.stdout)
    );
}

/// `-ctk` / `-ctv` as llama.cpp spells them: a quantized cache runs and the load line says so; an
/// unknown type is a clear error.
#[test]
fn cache_types() {
    let model = tiny();
    let m = model.to_str().unwrap();
    let out = mens()
        .args([
            "run", "-m", m, "-p", "the", "-n", "4", "-ctk", "q8_0", "-ctv", "q4_0",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("KV cache q8_0/q4_0"), "{err}");
    assert!(err.contains("generated 4 tokens"), "{err}");
    fails_with(
        &["run", "-m", m, "-p", "x", "-ctk", "q9"],
        "cache type \"q9\" is not one of f16, q8_0, q4_0",
    );
}

/// `--chat-template-file`: a missing file, one too large and one that does not render are refused
/// at load with exit 2, the template rendered in the helper process; a good one replaces the
/// file's template.
#[test]
fn a_chat_template_file_is_checked_at_load() {
    let m = tiny();
    let m = m.to_str().unwrap();
    let big = tmp("big.jinja", &vec![b'x'; (1 << 20) + 1]);
    let bad = tmp(
        "bad.jinja",
        b"{{ raise_exception('this template refuses') }}",
    );
    let hostile = tmp(
        "hostile.jinja",
        b"{% set s = namespace(x='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set s.x = s.x ~ s.x %}{% endfor %}{{ s.x | length }}",
    );
    for (file, want) in [
        (
            PathBuf::from("/nonexistent.jinja"),
            "chat template file /nonexistent.jinja",
        ),
        (big, "more than 1048576 bytes"),
        (bad, "this template refuses"),
        (hostile, "rendering needed more than 1024 MiB of memory"),
    ] {
        let f = file.to_str().unwrap();
        fails_with(
            &[
                "run",
                "--chat",
                "-m",
                m,
                "-p",
                "hi",
                "--chat-template-file",
                f,
            ],
            want,
        );
    }
    // The prompt's length says which template rendered it (ChatML's markup, or none).
    let good = tmp(
        "good.jinja",
        b"{% for m in messages %}<<{{ m.content }}>>{% endfor %}",
    );
    let prompt_tokens = |extra: &[&str]| -> usize {
        let out = mens()
            .args([
                "run", "--chat", "-m", m, "-p", "hi there", "-n", "1", "--temp", "0",
            ])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        let at = err.find("prompt ").expect(&err) + "prompt ".len();
        err[at..].split(' ').next().unwrap().parse().expect(&err)
    };
    let own = prompt_tokens(&["--chat-template-file", good.to_str().unwrap()]);
    let file = prompt_tokens(&[]);
    assert!(
        own < file,
        "{own} tokens with the file given, {file} with the model's"
    );
}
