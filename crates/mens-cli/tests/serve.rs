//! `mens serve` as a user runs it: the binary on the real 0.5B model, driven by the official `openai`,
//! `anthropic` and `ollama` Python clients (installed once into `<repo>/.cache/venv` from the package
//! index).

#[path = "../../mens/tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The Python packages the client tests import.
const PACKAGES: [&str; 5] = [
    "openai",
    "anthropic",
    "ollama",
    "jsonschema",
    "prometheus_client",
];

/// A Python with the client packages: `$MENS_PYTHON`, or a venv made (once) under .cache/venv.
fn python_with_openai() -> PathBuf {
    if let Some(p) = std::env::var_os("MENS_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = common::repo_root().join(".cache/venv");
    let py = venv.join("bin/python");
    let has = |py: &PathBuf| {
        Command::new(py)
            .args([
                "-c",
                "import openai, anthropic, ollama, jsonschema, prometheus_client",
            ])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !has(&py) {
        let ok = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "python3 -m venv failed");
        let ok = Command::new(&py)
            .args(["-m", "pip", "install", "--quiet"])
            .args(PACKAGES)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "pip install openai failed");
    }
    assert!(
        has(&py),
        "the client packages ({PACKAGES:?}) are not importable by {}",
        py.display()
    );
    py
}

struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start `mens serve` on a free port; returns the child and its base URL.
fn serve(args: &[&str]) -> (Serve, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mens"))
        .arg("serve")
        .args(args)
        .args(["--port", "0"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let t0 = Instant::now();
    loop {
        let mut line = String::new();
        let n = err.read_line(&mut line).unwrap();
        assert!(n > 0, "mens serve exited: {seen}");
        seen.push_str(&line);
        if let Some(at) = line.find("http://") {
            let url = line[at..].split_whitespace().next().unwrap().to_string();
            // Keep draining stderr so the server never blocks on a full pipe.
            std::thread::spawn(move || for _ in err.lines() {});
            return (Serve(child), url);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no address: {seen}"
        );
    }
}

#[test]
fn openai_anthropic_and_ollama_python_clients_work_against_mens_serve() {
    let model = common::real_model("qwen2.5-coder-0.5b");
    let py = python_with_openai();
    let (_server, url) = serve(&[
        "-m",
        model.to_str().unwrap(),
        "-c",
        "2048",
        "--parallel",
        "2",
        "--api-key",
        "test-key",
    ]);
    for (script, done) in [
        ("openai_compat.py", "openai client: all checks passed"),
        ("anthropic_compat.py", "anthropic client: all checks passed"),
        ("ollama_compat.py", "ollama client: all checks passed"),
    ] {
        run_client(&py, script, &url, done);
    }

    // A thinking model's shapes: the same model behind its own template changed to open
    // `<think>` in the assistant's turn (`--chat-template-file`).
    let props: serde_json::Value = serde_json::from_str(&get(&url, "/props", "test-key")).unwrap();
    let source = props["chat_template"].as_str().unwrap();
    let turn = "{{- '<|im_start|>assistant\\n' }}";
    assert!(source.contains(turn), "{source}");
    let dir = common::repo_root().join("target/tmp");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("think-template.jinja");
    std::fs::write(
        &file,
        source.replace(turn, "{{- '<|im_start|>assistant\\n<think>\\n' }}"),
    )
    .unwrap();
    let (_thinking, url) = serve(&[
        "-m",
        model.to_str().unwrap(),
        "-c",
        "2048",
        "--parallel",
        "1",
        "--api-key",
        "test-key",
        "--chat-template-file",
        file.to_str().unwrap(),
    ]);
    run_client(
        &py,
        "thinking_compat.py",
        &url,
        "thinking clients: all checks passed",
    );
}

/// Run a client script of tests/ against `url` (key `test-key`); it must pass and say `done`.
fn run_client(py: &PathBuf, script: &str, url: &str, done: &str) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(script);
    let out = Command::new(py)
        .arg(&script)
        .arg(url)
        .arg("test-key")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "{} failed:\n{stdout}\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(done));
}

/// A GET's body (HTTP/1.0: the body as sent, not chunked).
fn get(url: &str, path: &str, key: &str) -> String {
    use std::io::{Read, Write};
    let host = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(host).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.0 200"), "{head}");
    body.to_string()
}

#[test]
fn serve_refuses_bad_flags_and_warns_on_open_binds() {
    let bad = Command::new(env!("CARGO_BIN_EXE_mens"))
        .args(["serve", "--parallel", "0"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--parallel"));
    // Binding beyond loopback without a key prints a warning (the server still starts).
    let model = common::real_model("qwen2.5-coder-0.5b");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mens"))
        .args([
            "serve",
            "-m",
            model.to_str().unwrap(),
            "-c",
            "256",
            "--parallel",
            "1",
        ])
        .args(["--host", "0.0.0.0", "--port", "0"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("serving") {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            break;
        }
        seen.push_str(&line);
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        seen.contains("WARNING") && seen.contains("without an API key"),
        "{seen}"
    );
}
