//! The one reader of the docs' blocks, for the docs-as-tests: the Rust tests
//! (`docs::block`), the check that every documented command is accounted for
//! (`tests/it/doc_commands.rs`) and the systemd test (`tests/systemd/lib.sh`,
//! through `src/bin/doc_block.rs`) all see a block as this file reads it.
//!
//! A block is fenced (```` ``` ```` with an optional language, closed by a
//! line of backticks alone) or indented by four spaces or more after a blank
//! line or a comment line. Its marker is the HTML comment on the line before it, blank lines
//! aside (`<!-- test: NAME -->`, `<!-- systemd-test: NAME -->`, …). Its text
//! is its lines without the fences and without the indentation (a fenced
//! block loses as many spaces as its fence is indented, an indented block
//! the indentation its lines share), blank lines at either end dropped,
//! joined by `\n` with no final newline.
//!
//! This file uses std alone: `tests/systemd/lib.sh` compiles the reader
//! with rustc, without the test crate's dependencies.

use std::fmt;
use std::path::{Path, PathBuf};

/// One block of a markdown text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// Line number (from 1) of its opening fence or first indented line.
    pub line: usize,
    /// The comment right before it, without `<!--` and `-->`: `test: demo`.
    pub marker: Option<String>,
    /// A fenced block's language (`""` for none); `None` when indented.
    pub language: Option<String>,
    pub text: String,
}

/// Why a block could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    Unreadable {
        doc: String,
        cause: String,
    },
    /// A fence opened at `line` is never closed.
    Unclosed {
        doc: String,
        line: usize,
    },
    /// No line of `docs` is the marker.
    NoMarker {
        docs: String,
        marker: String,
    },
    /// The marker at `line` is followed by text, or by nothing, not a block.
    NoBlock {
        doc: String,
        line: usize,
        marker: String,
    },
    /// The marker is on several lines (`doc:line` each).
    Twice {
        marker: String,
        at: Vec<String>,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Unreadable { doc, cause } => write!(f, "cannot read {doc}: {cause}"),
            Error::Unclosed { doc, line } => write!(f, "{doc}:{line}: a fenced block that is never closed"),
            Error::NoMarker { docs, marker } => write!(f, "no line of {docs} is <!-- {marker} -->"),
            Error::NoBlock { doc, line, marker } => write!(
                f,
                "{doc}:{line}: <!-- {marker} --> is followed by no block (only blank lines may come between a marker \
                 and its fenced or indented block)"
            ),
            Error::Twice { marker, at } => write!(f, "<!-- {marker} --> marks more than one block: {}", at.join(", ")),
        }
    }
}

impl std::error::Error for Error {}

/// What a markdown text holds: its blocks, and every comment line outside
/// them (a marker, whether a block follows it or not).
struct Scanned {
    blocks: Vec<Block>,
    comments: Vec<(usize, String)>,
}

/// Every block of `markdown` (named `doc` in errors), in order.
pub fn blocks(doc: &str, markdown: &str) -> Result<Vec<Block>, Error> {
    Ok(scan(doc, markdown)?.blocks)
}

/// The block marked `marker` (`<!-- test: demo -->` or `test: demo`) in
/// `markdown`: the marker must be on a line of its own, once, right before
/// its block (blank lines aside).
pub fn block_after(doc: &str, markdown: &str, marker: &str) -> Result<Block, Error> {
    let marker = marker_text(marker);
    let scanned = scan(doc, markdown)?;
    let lines: Vec<usize> = scanned.comments.iter().filter(|(_, c)| c == marker).map(|(line, _)| *line).collect();
    match lines[..] {
        [] => Err(Error::NoMarker { docs: doc.to_string(), marker: marker.to_string() }),
        [line] => scanned.blocks.into_iter().find(|b| b.marker.as_deref() == Some(marker)).ok_or(Error::NoBlock {
            doc: doc.to_string(),
            line,
            marker: marker.to_string(),
        }),
        _ => Err(Error::Twice { marker: marker.to_string(), at: lines.iter().map(|l| format!("{doc}:{l}")).collect() }),
    }
}

/// The repository the tests are built from.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The documents whose commands users follow, relative to the repository:
/// README.md, SECURITY.md, ARCHITECTURE.md and docs/*.md, in that order.
pub fn documents(repo: &Path) -> Result<Vec<String>, Error> {
    let unreadable = |e: std::io::Error| Error::Unreadable { doc: "docs/".into(), cause: e.to_string() };
    let mut in_docs = Vec::new();
    for entry in std::fs::read_dir(repo.join("docs")).map_err(unreadable)? {
        let name = entry.map_err(unreadable)?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            in_docs.push(format!("docs/{name}"));
        }
    }
    in_docs.sort();
    let mut docs: Vec<String> = ["README.md", "SECURITY.md", "ARCHITECTURE.md"].map(String::from).to_vec();
    docs.extend(in_docs);
    Ok(docs)
}

/// The text of `doc` (relative to `repo`).
pub fn read(repo: &Path, doc: &str) -> Result<String, Error> {
    std::fs::read_to_string(repo.join(doc))
        .map_err(|e| Error::Unreadable { doc: doc.to_string(), cause: e.to_string() })
}

/// The block `marker` marks in one of [`documents`] (the systemd test's
/// way: it names a block, not a document): marked once in them all.
pub fn find(repo: &Path, marker: &str) -> Result<(String, Block), Error> {
    let marker = marker_text(marker);
    let docs = documents(repo)?;
    let mut marked: Vec<(&str, String)> = Vec::new();
    let mut at: Vec<String> = Vec::new();
    for doc in &docs {
        let text = read(repo, doc)?;
        let lines: Vec<usize> =
            scan(doc, &text)?.comments.into_iter().filter(|(_, c)| c == marker).map(|(line, _)| line).collect();
        at.extend(lines.iter().map(|line| format!("{doc}:{line}")));
        if !lines.is_empty() {
            marked.push((doc, text));
        }
    }
    match (&marked[..], at.len()) {
        ([], _) => Err(Error::NoMarker { docs: docs.join(", "), marker: marker.to_string() }),
        ([(doc, text)], 1) => Ok((doc.to_string(), block_after(doc, text, marker)?)),
        _ => Err(Error::Twice { marker: marker.to_string(), at }),
    }
}

/// The text of the block after `marker` in `doc` (relative to the
/// repository root); panics with the reason when there is none.
pub fn block(doc: &str, marker: &str) -> String {
    read(&repo(), doc).and_then(|text| block_after(doc, &text, marker)).unwrap_or_else(|e| panic!("{e}")).text
}

/// `test: demo` from `<!-- test: demo -->` (or from `test: demo`).
fn marker_text(marker: &str) -> &str {
    let marker = marker.trim();
    marker.strip_prefix("<!--").and_then(|m| m.strip_suffix("-->")).unwrap_or(marker).trim()
}

/// The text of an HTML comment that is a whole line.
fn comment(line: &str) -> Option<&str> {
    line.trim().strip_prefix("<!--").and_then(|c| c.strip_suffix("-->")).map(str::trim)
}

fn is_fence(line: &str) -> bool {
    line.trim_start().starts_with("```")
}

/// A closing fence: backticks alone.
fn is_closing_fence(line: &str) -> bool {
    let trimmed = line.trim();
    trimmed.len() >= 3 && trimmed.bytes().all(|b| b == b'`')
}

fn indentation(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// `lines` without blank lines at either end, blank ones emptied, joined.
fn joined(lines: &[String]) -> String {
    let lines: Vec<&str> = lines.iter().map(|l| if l.trim().is_empty() { "" } else { l.as_str() }).collect();
    let start = lines.iter().position(|l| !l.is_empty()).unwrap_or(lines.len());
    let end = lines.iter().rposition(|l| !l.is_empty()).map_or(start, |e| e + 1);
    lines[start..end].join("\n")
}

fn scan(doc: &str, markdown: &str) -> Result<Scanned, Error> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut scanned = Scanned { blocks: Vec::new(), comments: Vec::new() };
    // The last comment line seen, while only blank lines followed it.
    let mut marker: Option<String> = None;
    // An indented block starts after a blank line or a comment line (in a
    // paragraph, indented lines are its continuation; the docs indent list
    // continuations by two or three spaces, code by four or more).
    let mut may_start_indented = true;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if is_fence(line) {
            let start = i;
            let indent = indentation(line);
            let language = line.trim().trim_start_matches('`').trim().to_string();
            i += 1;
            let mut body = Vec::new();
            while i < lines.len() && !is_closing_fence(lines[i]) {
                // As CommonMark: the fence's indentation, no more, comes off each line.
                let strip = indentation(lines[i]).min(indent);
                body.push(lines[i][strip..].to_string());
                i += 1;
            }
            if i == lines.len() {
                return Err(Error::Unclosed { doc: doc.to_string(), line: start + 1 });
            }
            scanned.blocks.push(Block {
                line: start + 1,
                marker: marker.take(),
                language: Some(language),
                text: joined(&body),
            });
            i += 1;
            may_start_indented = false;
            continue;
        }
        if indentation(line) >= 4 && !line.trim().is_empty() && may_start_indented {
            let start = i;
            let mut body = Vec::new();
            while i < lines.len() && (indentation(lines[i]) >= 4 || lines[i].trim().is_empty()) && !is_fence(lines[i]) {
                body.push(lines[i]);
                i += 1;
            }
            let shared = body.iter().filter(|l| !l.trim().is_empty()).map(|l| indentation(l)).min().unwrap_or(0);
            let body: Vec<String> = body.iter().map(|l| l.get(shared..).unwrap_or_default().to_string()).collect();
            scanned.blocks.push(Block { line: start + 1, marker: marker.take(), language: None, text: joined(&body) });
            // The blank lines the block took end it; what follows is a new paragraph.
            may_start_indented = lines[i - 1].trim().is_empty();
            continue;
        }
        if let Some(text) = comment(line) {
            scanned.comments.push((i + 1, text.to_string()));
            marker = Some(text.to_string());
            may_start_indented = true;
        } else if line.trim().is_empty() {
            may_start_indented = true;
        } else {
            marker = None;
            may_start_indented = false;
        }
        i += 1;
    }
    Ok(scanned)
}
