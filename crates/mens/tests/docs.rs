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
                (Some(p), Some(item)) if !defines(&std::fs::read_to_string(&p).unwrap(), &item) => {
                    problems.push(format!("{doc}: {file} defines no item {item}"));
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

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The modules ARCHITECTURE.md's table lists (first column, in backticks).
fn table_modules(arch: &str) -> Vec<String> {
    let start = arch.find("| module | owns |").expect("the module table");
    arch[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| code_spans(l).into_iter().next())
        .collect()
}

/// The modules lib.rs declares.
fn declared_modules(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';').to_string())
        .collect()
}

/// Every engine module is in ARCHITECTURE.md's table, and every module there exists.
#[test]
fn the_module_table_matches_the_code() {
    let arch = read("docs/ARCHITECTURE.md");
    let listed = table_modules(&arch);
    let declared = declared_modules(&read("crates/mens/src/lib.rs"));
    assert!(declared.len() > 15, "lib.rs parsed badly: {declared:?}");
    let missing: Vec<_> = declared.iter().filter(|m| !listed.contains(m)).collect();
    let extra: Vec<_> = listed.iter().filter(|m| !declared.contains(m)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "ARCHITECTURE.md's module table: missing {missing:?}, not in lib.rs {extra:?}"
    );
}

/// The numbers of the form "N kernels per layer" in a text.
fn kernels_per_layer(text: &str) -> Vec<usize> {
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .windows(4)
        .filter(|w| w[1] == "kernels" && w[2] == "per" && w[3].starts_with("layer"))
        .filter_map(|w| w[0].parse().ok())
        .collect()
}

/// What the docs state about the code, where a test can see the code: the KV cache layout (the
/// CPU cache's own comment) and the CUDA decode kernels per layer (what the graph capture counts).
#[test]
fn stated_layouts_and_counts_match_the_code() {
    let arch = read("docs/ARCHITECTURE.md");
    let layout = "[layer][kv head][position][head_dim]";
    assert!(arch.contains(layout), "ARCHITECTURE.md states no KV layout");
    let cpu = read("crates/mens/src/cpu.rs");
    let kv_doc = &cpu[..cpu.find("pub struct KvCache").expect("KvCache")];
    assert!(
        kv_doc.ends_with("\n") && kv_doc.rsplit("\n\n").next().unwrap().contains(layout),
        "KvCache's comment no longer states {layout}"
    );
    // The per-layer count the decode graph adds up, in session.rs's layer loop.
    let session = read("crates/mens/src/cuda/session.rs");
    let f = &session[session.find("fn decode_layers").expect("decode_layers")..];
    let f = &f[..f.find("\n    }\n").unwrap()];
    let in_loop = &f[f.find("for (li, l) in m.layers").expect("the layer loop")..];
    let n: usize = in_loop
        .split("n += ")
        .nth(1)
        .and_then(|s| s.split(';').next())
        .and_then(|s| s.trim().parse().ok())
        .expect("n += N in the layer loop");
    for doc in [
        "docs/ARCHITECTURE.md",
        "README.md",
        "crates/mens/src/cuda/mod.rs",
    ] {
        let stated = kernels_per_layer(&read(doc));
        assert!(!stated.is_empty(), "{doc} states no kernels per layer");
        assert!(
            stated.iter().all(|&s| s == n),
            "{doc} states {stated:?} kernels per layer; the decode graph has {n}"
        );
    }
}

#[test]
fn the_checks_catch_drift() {
    assert_eq!(kernels_per_layer("then 9 kernels per layer: a"), vec![9]);
    let table = "| module | owns |\n|---|---|\n| `a` | x |\n| `b` (feature) | y |\n\nafter";
    assert_eq!(table_modules(table), vec!["a", "b"]);
    assert_eq!(
        declared_modules("pub mod a;\n#[cfg(x)]\npub mod b;\nmod c;"),
        vec!["a", "b"]
    );
}
