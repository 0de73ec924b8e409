//! The `mens` binary on the real 0.5B model (fetched once; see crates/mens/tests/common).

#[path = "../../mens/tests/common/mod.rs"]
mod common;

use std::process::Command;

/// After loading and a full-context prefill, the peak RSS is within 10% of the admission estimate.
#[test]
fn memory_estimate_is_honest() {
    let model = common::real_model("qwen2.5-coder-0.5b");
    let text = std::fs::read_to_string(common::data("difflib.py.txt")).unwrap();
    let ctx = 512;
    // About 490 tokens: the prompt fills the context but for the tokens generated.
    let prompt: String = text.chars().take(2050).collect();
    let out = Command::new(env!("CARGO_BIN_EXE_mens"))
        .args([
            "run",
            "-m",
            model.to_str().unwrap(),
            "-c",
            &ctx.to_string(),
            "-n",
            "2",
            "--temp",
            "0",
            "-p",
            &prompt,
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let num = |key: &str| -> f64 {
        let line = err
            .lines()
            .find(|l| l.contains("mens: memory:"))
            .expect("memory line");
        let at = line.find(key).unwrap() + key.len();
        line[at..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let prompt_tokens: usize = err
        .lines()
        .find(|l| l.starts_with("mens: prompt"))
        .unwrap()
        .split_whitespace()
        .nth(2)
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        prompt_tokens > ctx * 9 / 10 && prompt_tokens < ctx,
        "prompt of {prompt_tokens} tokens"
    );
    let (estimate, peak) = (num("estimated "), num("peak RSS "));
    eprintln!("estimate {estimate} MiB, peak RSS {peak} MiB, {prompt_tokens} prompt tokens in a {ctx} context");
    assert!(
        (peak - estimate).abs() <= 0.10 * estimate,
        "peak RSS {peak} MiB vs estimate {estimate} MiB"
    );
}

/// Prompts from a file and from standard input give the same greedy text as `-p`; a closed output
/// pipe (`| head -c 10`) stops generation at once, quietly.
#[test]
fn prompts_from_files_and_pipes() {
    use std::io::{Read, Write};
    use std::process::Stdio;
    let model = common::real_model("qwen2.5-coder-0.5b");
    let m = model.to_str().unwrap();
    let prompt = "def fibonacci(n):";
    let dir = std::env::temp_dir().join(format!("mens-prompt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("prompt.txt");
    std::fs::write(&file, prompt).unwrap();
    let greedy = ["-n", "12", "--temp", "0", "-c", "256"];
    let run = |extra: &[&str], stdin: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_mens"));
        c.args(["run", "-m", m]).args(greedy).args(extra);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        if let Some(s) = stdin {
            child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
        } else {
            drop(child.stdin.take());
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let a = run(&["-p", prompt], None);
    assert!(a.starts_with(prompt) && a.len() > prompt.len() + 5, "{a:?}");
    assert_eq!(run(&["-f", file.to_str().unwrap()], None), a);
    assert_eq!(run(&["-p", "-"], Some(prompt)), a);
    // Fill in the middle from two files: only the middle is printed.
    let (pre, suf) = (dir.join("pre.py"), dir.join("suf.py"));
    std::fs::write(&pre, "def add(a, b):\n    ").unwrap();
    std::fs::write(&suf, "\n    return result\n").unwrap();
    let mid = run(
        &[
            "--fim-prefix",
            pre.to_str().unwrap(),
            "--fim-suffix",
            suf.to_str().unwrap(),
        ],
        None,
    );
    assert!(mid.contains("a + b") && !mid.contains("def add"), "{mid:?}");

    // | head -c 10: the reader leaves after 10 bytes of a 400-token answer.
    let mut child = Command::new(env!("CARGO_BIN_EXE_mens"))
        .args([
            "run", "-m", m, "-p", prompt, "-n", "400", "--temp", "0", "-c", "512",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 10];
    stdout.read_exact(&mut first).unwrap();
    let t0 = std::time::Instant::now();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("stopped {:?} after the pipe closed", t0.elapsed());
    assert!(out.status.success(), "{err}");
    assert!(
        !err.contains("Broken pipe") && !err.contains("error"),
        "{err}"
    );
    let generated = generated_tokens(&err);
    assert!(
        generated < 100,
        "{generated} tokens generated after the pipe closed"
    );
}

/// The first Ctrl-C (SIGINT) stops `mens run`'s generation: what was generated and the timings are
/// printed, and the exit code is 130, as for a program a shell interrupted.
#[test]
fn ctrl_c_stops_generation_and_keeps_the_timings() {
    use std::io::Read;
    use std::process::Stdio;
    let model = common::real_model("qwen2.5-coder-0.5b");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mens"))
        .args([
            "run",
            "-m",
            model.to_str().unwrap(),
            "-p",
            "def quicksort(a):",
        ])
        .args(["-n", "400", "--temp", "0", "-c", "512"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 40];
    stdout.read_exact(&mut first).unwrap();
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("stop: Cancelled"), "{err}");
    let generated = generated_tokens(&err);
    assert!(generated < 400, "{generated} tokens: not stopped");
}

/// In `mens chat`, Ctrl-C during an answer stops that answer and returns to the prompt with the
/// conversation kept (the next turn reuses the cache); end of input then leaves normally.
#[test]
fn ctrl_c_in_chat_returns_to_the_prompt() {
    use std::io::{Read, Write};
    use std::process::Stdio;
    let model = common::real_model("qwen2.5-coder-0.5b");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mens"))
        .args([
            "chat",
            "-m",
            model.to_str().unwrap(),
            "-n",
            "300",
            "--temp",
            "0",
            "-c",
            "1024",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "Write a long Python program with many functions.").unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 40];
    stdout.read_exact(&mut first).unwrap();
    let id = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &id])
        .status()
        .unwrap()
        .success());
    writeln!(stdin, "Thanks.").unwrap();
    drop(stdin);
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let turns: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("tokens/s decode"))
        .collect();
    assert_eq!(turns.len(), 2, "{err}");
    // The second turn prefilled only its new part.
    assert!(!turns[1].contains("(0 reused)"), "{}", turns[1]);
}

/// The token count of the "mens: generated N tokens" timing line.
fn generated_tokens(stderr: &str) -> usize {
    stderr
        .split("generated ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .expect("timing line")
}
