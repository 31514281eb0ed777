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
//! Blocks and markers are read by the one reader of the docs-as-tests,
//! `keysync_tests::docs` (the Rust tests' `docs::block`, and lib.sh's
//! `doc_block` through `src/bin/doc_block.rs`); its own tests are here too.

use std::path::PathBuf;

use keysync_tests::docs::{self, Block, Error};

fn repo() -> PathBuf {
    docs::repo()
}

const NOT_COMMANDS: [&str; 9] = ["toml", "yaml", "yml", "json", "text", "ini", "promql", "jinja", "sls"];

/// The command blocks of one markdown text, as the one reader of the docs sees them.
fn command_blocks(doc: &str, text: &str) -> Vec<Block> {
    let blocks = docs::blocks(doc, text).unwrap_or_else(|e| panic!("{e}"));
    blocks.into_iter().filter(|b| !b.language.as_deref().is_some_and(|l| NOT_COMMANDS.contains(&l))).collect()
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
    for name in docs::documents(&repo()).unwrap() {
        let text = docs::read(&repo(), &name).unwrap();
        for block in command_blocks(&name, &text) {
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
    let blocks = command_blocks("t.md", text);
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

/// Markdown with every form of block the docs use, and the edge cases.
const FORMS: &str = "\
# Forms

<!-- test: fenced -->
```sh
apt-get install -y ./x.deb
  --indented-continuation
```

<!-- ci: scripts/x.sh -->

    ./scripts/package.sh
      # a deeper line keeps its extra indentation

    ./scripts/check.sh


Text. A marker quoted in prose is none: `<!-- test: fenced -->`.

<!-- systemd-test: trailing-blanks -->
```

dpkg -P salt-keysync


```

1. In a list:

   <!-- example: in a list item, a fence indented as the item -->
   ```sh
   systemctl restart salt-keysync
     --more
   ```

<!-- test: right after -->
    cd fuzz && cargo fuzz run wire

<!-- test: no block -->
A paragraph, not a block.

<!-- test: at the end -->
";

fn after(marker: &str) -> Result<String, Error> {
    docs::block_after("forms.md", FORMS, marker).map(|b| b.text)
}

/// Issue 30: the one reader returns exactly the text of a block, whatever
/// its form: fence and indentation off, blank lines at either end dropped,
/// inner ones and deeper indentation kept; a marker is a line of its own.
#[test]
fn the_reader_returns_exactly_the_text_of_each_form_of_block() {
    let ok = |text: &str| Ok(text.to_string());
    assert_eq!(after("<!-- test: fenced -->"), ok("apt-get install -y ./x.deb\n  --indented-continuation"));
    assert_eq!(after("test: fenced"), after("<!-- test: fenced -->"), "with or without <!-- -->");
    assert_eq!(
        after("ci: scripts/x.sh"),
        ok("./scripts/package.sh\n  # a deeper line keeps its extra indentation\n\n./scripts/check.sh")
    );
    assert_eq!(after("systemd-test: trailing-blanks"), ok("dpkg -P salt-keysync"));
    assert_eq!(
        after("example: in a list item, a fence indented as the item"),
        ok("systemctl restart salt-keysync\n  --more")
    );
    assert_eq!(after("test: right after"), ok("cd fuzz && cargo fuzz run wire"), "no blank line needed after a marker");
    let blocks = docs::blocks("forms.md", FORMS).unwrap();
    let languages: Vec<Option<&str>> = blocks.iter().map(|b| b.language.as_deref()).collect();
    assert_eq!(languages, [Some("sh"), None, Some(""), Some("sh"), None]);
    let lines: Vec<usize> = blocks.iter().map(|b| b.line).collect();
    assert_eq!(lines, [4, 11, 20, 30, 36]);
}

/// Issue 30: a marker that marks nothing, is missing, is on two lines, or
/// a fence never closed: an error that names the line, never a block of
/// someone else's text or an empty one.
#[test]
fn the_reader_names_why_there_is_no_block() {
    let no_block = after("test: no block").unwrap_err();
    assert_eq!(no_block, Error::NoBlock { doc: "forms.md".into(), line: 38, marker: "test: no block".into() });
    assert_eq!(
        no_block.to_string(),
        "forms.md:38: <!-- test: no block --> is followed by no block (only blank lines may come between a marker \
         and its fenced or indented block)"
    );
    assert!(
        matches!(after("test: at the end"), Err(Error::NoBlock { line: 41, .. })),
        "{:?}",
        after("test: at the end")
    );
    assert_eq!(
        after("test: nowhere").unwrap_err().to_string(),
        "no line of forms.md is <!-- test: nowhere -->",
        "the marker quoted in prose or shown in a block is none"
    );
    let twice = format!("{FORMS}\n<!-- test: fenced -->\n```sh\nfalse\n```\n");
    assert_eq!(
        docs::block_after("forms.md", &twice, "test: fenced").unwrap_err().to_string(),
        "<!-- test: fenced --> marks more than one block: forms.md:3, forms.md:43"
    );
    let unclosed = "Text.\n\n```sh\nrm -rf /tmp/x\n";
    assert_eq!(docs::blocks("u.md", unclosed).unwrap_err().to_string(), "u.md:3: a fenced block that is never closed");
    let shown = "```markdown\n<!-- test: shown -->\n    not a block\n```\n";
    assert!(matches!(docs::block_after("s.md", shown, "test: shown"), Err(Error::NoMarker { .. })));
}

/// Issue 30: for every marker kind the docs use, each marked block of the
/// real docs is, line for line, text of the document after its marker
/// (less leading spaces only), ending where the block ends; and a block of
/// each kind the tests run, exactly.
#[test]
fn every_marked_block_of_the_docs_is_its_text() {
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for doc in docs::documents(&repo()).unwrap() {
        let text = docs::read(&repo(), &doc).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for block in docs::blocks(&doc, &text).unwrap() {
            let Some((kind, _)) = block.marker.as_deref().and_then(|m| m.split_once(':')) else { continue };
            *kinds.entry(kind.to_string()).or_default() += 1;
            let at = format!("{doc}:{}", block.line);
            let fenced = block.language.is_some();
            // The line after the opening fence, or the first indented one.
            let start = if fenced { block.line } else { block.line - 1 };
            let mut rest = lines[start..].iter().copied().skip_while(|l| l.trim().is_empty());
            for want in block.text.lines() {
                let line = rest.next().unwrap_or_else(|| panic!("{at}: the document ends before {want:?}"));
                let indent = line.strip_suffix(want).unwrap_or_else(|| panic!("{at}: {line:?} is not {want:?}"));
                assert!(indent.trim().is_empty(), "{at}: {line:?} is not {want:?}");
            }
            let next = rest.find(|l| !l.trim().is_empty()).unwrap_or_default();
            if fenced {
                assert!(next.trim().starts_with("```"), "{at}: the block ends before its fence: {next:?}");
            } else {
                assert!(!next.starts_with("    "), "{at}: the block ends before its last indented line: {next:?}");
            }
            // What the systemd test reads by name: the block, marked once
            // in all the docs (an example's reason may mark several).
            match docs::find(&repo(), block.marker.as_deref().unwrap()) {
                Ok(found) => assert_eq!(found, (doc.clone(), block.clone()), "{at}"),
                Err(Error::Twice { .. }) if kind == "example" => {}
                Err(e) => panic!("{at}: {e}"),
            }
        }
    }
    for kind in ["test", "ci", "systemd-test", "example", "openssl", "first-contact"] {
        assert!(kinds.contains_key(kind), "no block marked {kind}: in the docs ({kinds:?})");
    }
    for (marker, text) in [
        ("test: demo", "cargo run --release -p salt-keysync -- demo"),
        ("ci: .ci/run", "./scripts/test.sh"),
        ("systemd-test: purge", "dpkg -P salt-keysync"),
    ] {
        assert_eq!(docs::find(&repo(), marker).map(|(_, b)| b.text), Ok(text.to_string()), "{marker}");
    }
}

/// Issue 30: tests/systemd reads its blocks with this very reader: lib.sh's
/// `doc_block NAME` prints what `docs::find` returns for every
/// `systemd-test` marker of the docs, and fails naming the reason for one
/// that marks nothing.
#[test]
fn the_systemd_test_reads_the_blocks_the_rust_tests_read() {
    let work = tempfile::tempdir().unwrap();
    let mut names = Vec::new();
    for doc in docs::documents(&repo()).unwrap() {
        for block in docs::blocks(&doc, &docs::read(&repo(), &doc).unwrap()).unwrap() {
            if let Some(name) = block.marker.as_deref().and_then(|m| m.strip_prefix("systemd-test:")) {
                names.push((name.trim().to_string(), block.text));
            }
        }
    }
    assert!(names.len() >= 10, "{names:?}");
    let script = names
        .iter()
        .map(|(name, _)| format!("doc_block '{name}'; echo '<end>'\n"))
        .chain(["doc_block no-such-block || echo \"failed: $?\"\n".to_string()])
        .collect::<String>();
    let out = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &format!("source tests/systemd/lib.sh\n{script}")])
        .current_dir(repo())
        .env("repo", repo())
        .env("work", work.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let mut want: String = names.iter().map(|(_, text)| format!("{text}\n<end>\n")).collect();
    want.push_str("failed: 1\n");
    assert_eq!(stdout, want, "{stderr}");
    assert!(stderr.contains("doc-block: no line of README.md, SECURITY.md, ARCHITECTURE.md, docs/"), "{stderr}");
    assert!(stderr.contains(" is <!-- systemd-test: no-such-block -->"), "{stderr}");
}
