//! Every Rust block of the documentation is compiled: each one of README,
//! docs/*.md and the crates' READMEs appears, line for line, in an example
//! that the test command builds (`cargo test --all-targets`), and the
//! crates' doc comments are doctests. No Rust hides in a `text` block, and
//! every block says its language.

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown a reader meets.
fn documents() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    for dir in [
        "docs",
        "examples/redis_failover",
        "runtime",
        "sidecar",
        "components",
        "macros",
    ] {
        let Ok(entries) = std::fs::read_dir(root().join(dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.path().extension().is_some_and(|e| e == "md") {
                files.push(entry.path());
            }
        }
    }
    files.sort();
    files
}

/// Rust sources of the examples the test command compiles.
fn compiled_examples() -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![root().join("examples")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() && !path.ends_with("target") {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// A fenced block: its info string, its lines and where it starts.
struct Block {
    info: String,
    lines: Vec<String>,
    line: usize,
}

fn fenced_blocks(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        match open.take() {
            None if trimmed.starts_with("```") => {
                open = Some(Block {
                    info: trimmed.trim_start_matches('`').trim().to_string(),
                    lines: Vec::new(),
                    line: n + 1,
                });
            }
            None => {}
            Some(block) if trimmed.starts_with("```") => blocks.push(block),
            Some(mut block) => {
                block.lines.push(line.to_string());
                open = Some(block);
            }
        }
    }
    blocks
}

/// Whether a block holds Rust items or statements.
fn looks_like_rust(lines: &[String]) -> bool {
    lines.iter().any(|l| {
        let l = l.trim_start();
        ["fn ", "let ", "use ", "impl ", "struct ", "#[derive"]
            .iter()
            .any(|p| l.starts_with(p))
    })
}

/// Lines as compared: indentation and blank lines do not count.
fn significant(lines: &[String]) -> Vec<&str> {
    lines
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect()
}

fn contains_in_order(haystack: &[&str], needle: &[&str]) -> bool {
    needle.is_empty()
        || haystack
            .windows(needle.len())
            .any(|window| window == needle)
}

#[test]
fn every_rust_block_of_the_docs_is_in_a_compiled_example() {
    let sources: Vec<(PathBuf, Vec<String>)> = compiled_examples()
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            (path, text.lines().map(str::to_string).collect())
        })
        .collect();
    let mut checked = 0;
    let mut problems = Vec::new();
    for document in documents() {
        let text = std::fs::read_to_string(&document).unwrap();
        let name = document.strip_prefix(root()).unwrap().display().to_string();
        for block in fenced_blocks(&text) {
            let language = block.info.split(',').next().unwrap_or("");
            match language {
                "" => problems.push(format!("{name}:{}: a block without a language", block.line)),
                "text" if looks_like_rust(&block.lines) => problems.push(format!(
                    "{name}:{}: a `text` block holding Rust: mark it `rust` and compile it",
                    block.line
                )),
                "rust" => {
                    checked += 1;
                    let wanted = significant(&block.lines);
                    let found = sources
                        .iter()
                        .any(|(_, lines)| contains_in_order(&significant(lines), &wanted));
                    if !found {
                        problems.push(format!(
                            "{name}:{}: this Rust block is in no compiled example (examples/guide/main.rs holds the guide's)",
                            block.line
                        ));
                    }
                }
                _ => {}
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(
        checked >= 7,
        "only {checked} Rust blocks found: is the guide still there?"
    );
    println!("{checked} Rust blocks of the docs are compiled as examples");
}

/// `text` blocks in doc comments are not doctests: they must not hold Rust.
#[test]
fn no_doc_comment_hides_rust_in_a_text_block() {
    let mut dirs: Vec<PathBuf> = [
        "src",
        "runtime/src",
        "sidecar/src",
        "components/src",
        "macros/src",
    ]
    .iter()
    .map(|d| root().join(d))
    .collect();
    let mut problems = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let docs: String = text
                .lines()
                .filter_map(|l| {
                    let l = l.trim_start();
                    l.strip_prefix("//!").or_else(|| l.strip_prefix("///"))
                })
                .map(|l| format!("{l}\n"))
                .collect();
            for block in fenced_blocks(&docs) {
                if block.info.starts_with("text") && looks_like_rust(&block.lines) {
                    problems.push(format!("{}: a `text` block holding Rust", path.display()));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
