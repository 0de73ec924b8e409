//! Keeps docs/ARCHITECTURE.md and docs/CLAIMS.md true: every referenced file and `file.rs::Item`
//! exists, every test named as evidence (`test:NAME`) exists as a #[test], and Markdown links between
//! documents resolve. Reads text only; builds nothing.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "target") {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Spans between backticks.
fn code_spans(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// Targets of Markdown links `[..](target)`.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(j) = rest.find(')') {
            out.push(rest[..j].to_string());
        }
    }
    out
}

fn defines(src: &str, item: &str) -> bool {
    [
        "struct", "enum", "fn", "trait", "type", "const", "static", "mod",
    ]
    .iter()
    .any(|kw| {
        src.match_indices(&format!("{kw} {item}")).any(|(i, m)| {
            let next = src[i + m.len()..].chars().next().unwrap_or(' ');
            !(next.is_alphanumeric() || next == '_')
        })
    })
}

fn is_test(sources: &[(PathBuf, String)], name: &str) -> bool {
    sources.iter().any(|(_, src)| {
        let lines: Vec<&str> = src.lines().collect();
        lines.iter().enumerate().any(|(i, l)| {
            l.trim_start().starts_with(&format!("fn {name}("))
                && lines[i.saturating_sub(4)..i]
                    .iter()
                    .any(|p| p.trim() == "#[test]")
        })
    })
}

#[test]
fn docs_reference_what_exists() {
    let root = root();
    let mut files = Vec::new();
    rust_files(&root.join("crates"), &mut files);
    let sources: Vec<(PathBuf, String)> = files
        .into_iter()
        .map(|p| (p.clone(), std::fs::read_to_string(&p).unwrap()))
        .collect();
    let mut problems = Vec::new();
    let mut checked = 0;
    for doc in [
        "docs/ARCHITECTURE.md",
        "docs/CLAIMS.md",
        "docs/benchmarks.md",
        "README.md",
    ] {
        let path = root.join(doc);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{doc}: {e}"));
        for span in code_spans(&text) {
            if let Some(name) = span.strip_prefix("test:") {
                checked += 1;
                if !is_test(&sources, name) {
                    problems.push(format!("{doc}: test {name} does not exist"));
                }
                continue;
            }
            let (file, item) = match span.split_once("::") {
                Some((f, i)) if f.ends_with(".rs") => (f.to_string(), Some(i.to_string())),
                _ => (span.clone(), None),
            };
            let is_path = file.contains('/')
                && !file.starts_with("../")
                && !file.contains(' ')
                && [".rs", ".sh", ".md", ".toml", ".json"]
                    .iter()
                    .any(|e| file.ends_with(e));
            if !is_path {
                continue;
            }
            checked += 1;
            let full = [root.join(&file), root.join("crates/mens/src").join(&file)]
                .into_iter()
                .find(|p| p.exists());
            match (full, item) {
                (None, _) => problems.push(format!("{doc}: file {file} does not exist")),
                (Some(p), Some(item)) => {
                    if !defines(&std::fs::read_to_string(&p).unwrap(), &item) {
                        problems.push(format!("{doc}: {file} defines no item {item}"));
                    }
                }
                _ => {}
            }
        }
        for target in links(&text) {
            if target.starts_with("http") || target.starts_with('#') || target.starts_with("../") {
                continue;
            }
            checked += 1;
            let target = target.split('#').next().unwrap();
            if !path.parent().unwrap().join(target).exists() {
                problems.push(format!("{doc}: link {target} does not resolve"));
            }
        }
    }
    eprintln!("checked {checked} references");
    assert!(
        checked > 20,
        "too few references found ({checked}): is the parser broken?"
    );
    assert!(
        problems.is_empty(),
        "stale references:\n{}",
        problems.join("\n")
    );
}

#[test]
fn a_stale_reference_is_caught() {
    let src = "pub struct Session {}\nfn run() {}";
    assert!(defines(src, "Session"));
    assert!(!defines(src, "Sess"));
    assert!(!defines(src, "Missing"));
    assert_eq!(code_spans("a `x` b `y`"), vec!["x", "y"]);
    assert_eq!(
        links("see [a](b.md) and [c](d.md#e)"),
        vec!["b.md", "d.md#e"]
    );
}
