//! Issue 20: every shell command in README.md, SECURITY.md, ARCHITECTURE.md and docs/*.md is
//! either run by a test, as written, or marked as an example that cannot run
//! there, with the reason. A command block is a fenced block (```` ```sh ````,
//! ```` ```bash ````, ```` ```console ````, or no language) or an indented
//! one; the HTML comment right before it (blank lines aside) says which:
//!
//! - `<!-- systemd-test: NAME -->`: run verbatim in a minimal Debian under
//!   systemd by `tests/systemd` (`run_doc_block NAME`);
//! - `<!-- ci: SCRIPT -->`: run by that script (or CI entry point) in CI;
//! - `<!-- example: REASON -->`: cannot run in a test, and why;
//! - any other `<!-- KIND: NAME -->` (`openssl: CA`, `test: certs`, …): a
//!   Rust test reads the block after that very marker and runs it as written
//!   (the marker text must appear in a test's source).
//!
//! Blocks in other languages (toml, yaml, json, text output) are not commands.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The documents whose commands users follow.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![repo().join("README.md"), repo().join("SECURITY.md"), repo().join("ARCHITECTURE.md")];
    let mut in_docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    in_docs.sort();
    docs.extend(in_docs);
    docs
}

/// A command block: its first line number and the marker before it.
#[derive(Debug)]
struct Block {
    line: usize,
    marker: Option<String>,
    text: String,
}

const NOT_COMMANDS: [&str; 9] = ["toml", "yaml", "yml", "json", "text", "ini", "promql", "jinja", "sls"];

/// The command blocks of one markdown text.
fn command_blocks(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    // The last HTML comment seen, and whether only blank lines followed it.
    let mut marker: Option<String> = None;
    let mut previous_blank = true;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim();
        if let Some(fence) = trimmed.strip_prefix("```") {
            let language = fence.trim();
            let start = i;
            i += 1;
            let mut body = Vec::new();
            while i < lines.len() && !lines[i].trim().starts_with("```") {
                body.push(lines[i]);
                i += 1;
            }
            if !NOT_COMMANDS.contains(&language) {
                blocks.push(Block { line: start + 1, marker: marker.take(), text: body.join("\n") });
            }
            marker = None;
            i += 1;
            previous_blank = false;
            continue;
        }
        // An indented block starts after a blank line (the docs indent list
        // continuations by two or three spaces, code by four or more).
        if line.starts_with("    ") && !trimmed.is_empty() && previous_blank {
            let start = i;
            let mut body = Vec::new();
            while i < lines.len() && (lines[i].starts_with("    ") || lines[i].trim().is_empty()) {
                // A fence inside a list item ends the indented block.
                if lines[i].trim().starts_with("```") {
                    break;
                }
                body.push(lines[i].trim_start());
                i += 1;
            }
            blocks.push(Block { line: start + 1, marker: marker.take(), text: body.join("\n").trim().to_string() });
            previous_blank = false;
            continue;
        }
        if let Some(comment) = trimmed.strip_prefix("<!--").and_then(|c| c.strip_suffix("-->")) {
            marker = Some(comment.trim().to_string());
        } else if !trimmed.is_empty() {
            marker = None;
        }
        previous_blank = trimmed.is_empty();
        i += 1;
    }
    blocks
}

/// The sources tests and CI scripts are made of.
fn test_sources() -> String {
    let mut text = String::new();
    let mut stack = vec![repo().join("tests"), repo().join("scripts"), repo().join("agent/tests")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.ends_with("tests/it/doc_commands.rs") {
                // This checker names markers in its own test; it reads no block.
            } else if path.extension().is_some_and(|e| e == "rs" || e == "sh") {
                text.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
            }
        }
    }
    text
}

#[test]
fn every_documented_command_is_run_by_a_test_or_marked_as_an_example() {
    let sources = test_sources();
    let mut problems = Vec::new();
    let mut n_blocks = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let name = doc.strip_prefix(repo()).unwrap_or(&doc).display().to_string();
        for block in command_blocks(&text) {
            n_blocks += 1;
            let at = format!("{name}:{}", block.line);
            let first = block.text.lines().next().unwrap_or_default();
            match block.marker.as_deref().and_then(|m| m.split_once(':')) {
                Some(("systemd-test", name)) => {
                    let call = format!("run_doc_block {}", name.trim());
                    if !sources.contains(&call) {
                        problems.push(format!("{at}: marked systemd-test {name:?}, but no `{call}` in tests/systemd"));
                    }
                }
                Some(("ci", script)) => {
                    if !repo().join(script.trim()).exists() {
                        problems.push(format!("{at}: marked as run by {script:?}, which does not exist"));
                    }
                }
                Some(("example", reason)) if reason.trim().len() >= 10 => {}
                Some(("example", _)) => problems.push(format!("{at}: an example must say why it cannot run in a test")),
                Some((kind, name)) => {
                    let marker = format!("<!-- {kind}: {} -->", name.trim());
                    if !sources.contains(&marker) {
                        problems.push(format!("{at}: marked {marker}, but no test reads the block after it"));
                    }
                }
                _ => problems.push(format!(
                    "{at}: `{first}` is neither run by a test nor marked <!-- example: why it cannot run -->"
                )),
            }
        }
    }
    assert!(n_blocks > 30, "only {n_blocks} command blocks found: the parser missed them");
    assert!(problems.is_empty(), "{} command blocks unaccounted for:\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn the_block_parser_finds_fenced_and_indented_blocks_and_their_markers() {
    let text = "Intro.\n\n<!-- example: needs a running master -->\n```sh\nsalt-key -L\n```\n\nText.\n\n    \
                salt-keysync status\n    salt-keysync held\n\n```toml\nnode = \"a\"\n```\n\n- a list item\n\n\
                <!-- test: the words -->\n\n    cargo test\n";
    let blocks = command_blocks(text);
    let found: Vec<(usize, Option<&str>, &str)> =
        blocks.iter().map(|b| (b.line, b.marker.as_deref(), b.text.as_str())).collect();
    assert_eq!(
        found,
        vec![
            (4, Some("example: needs a running master"), "salt-key -L"),
            (10, None, "salt-keysync status\nsalt-keysync held"),
            (21, Some("test: the words"), "cargo test"),
        ]
    );
}
