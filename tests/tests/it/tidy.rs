//! Tidy checks of the repository itself (rust-analyzer's tidy test): every
//! Rust file says what it is for in a `//!` first line, the sans-IO crate
//! depends on nothing that does I/O, and no document links outside the
//! repository (a clone has nothing beside it).

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Files under the repository with `extension`, skipping build output and VCS folders.
fn files_with(extension: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![repo()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if entry.file_type().unwrap().is_dir() {
                if !matches!(&*name, "target" | ".git") && !name.starts_with('.') {
                    todo.push(path);
                }
            } else if path.extension().is_some_and(|e| e == extension) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn every_rust_file_opens_with_a_doc_line() {
    let missing: Vec<String> = files_with("rs")
        .into_iter()
        .filter(|path| !std::fs::read_to_string(path).unwrap().starts_with("//!"))
        .map(|path| path.strip_prefix(repo()).unwrap().display().to_string())
        .collect();
    assert!(missing.is_empty(), "these files do not open with a `//!` line saying what they are for: {missing:#?}");
}

#[test]
fn the_sans_io_crate_depends_on_no_io_crate() {
    let manifest = std::fs::read_to_string(repo().join("agent/machine/Cargo.toml")).unwrap();
    let deps = manifest.split("[dependencies]").nth(1).expect("a [dependencies] table");
    let deps = deps.split("\n[").next().unwrap();
    for forbidden in ["tokio", "tonic", "notify", "redb", "rustix", "libc", "prost", "salt-keysync", "keysync-server"] {
        assert!(
            !deps.lines().any(|line| line.trim_start().starts_with(forbidden)),
            "agent/machine depends on {forbidden}: the node machine must stay free of I/O"
        );
    }
}

#[test]
fn no_document_links_outside_the_repository() {
    let mut offenders = Vec::new();
    for path in files_with("md") {
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            // "DESIGN §7" names sections of a document the repository does not hold.
            if line.contains("../shared")
                || line.contains("](../../")
                || line.contains("DESIGN.md")
                || line.contains("DESIGN §")
            {
                offenders.push(format!("{}:{}: {line}", path.strip_prefix(repo()).unwrap().display(), n + 1));
            }
        }
    }
    assert!(offenders.is_empty(), "documents pointing outside the repository: {offenders:#?}");
}

/// The README's test command runs every test binary even when one fails
/// (a failure in the first must not hide the others), and the README says
/// what it changes on the machine when run as root.
#[test]
fn the_test_command_runs_everything_and_the_readme_says_what_it_installs() {
    let script = std::fs::read_to_string(repo().join("scripts/test.sh")).unwrap();
    let cargo_test: Vec<&str> = script.lines().filter(|l| l.trim_start().starts_with("cargo test")).collect();
    assert_eq!(cargo_test, ["cargo test --workspace --locked --no-fail-fast"], "scripts/test.sh");
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let section = &readme[readme.find("./scripts/test.sh").expect("README names the test command")..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    for told in ["as root", "apt-get", "dpkg", "purge", "systemd-nspawn", "--no-fail-fast"] {
        assert!(section.contains(told), "the README's test command section does not say {told:?}:\n{section}");
    }
}

/// Issue 28 item 8: the binary words every error chain with
/// `text::error_chain` (each cause once, rustls's errors in words), never
/// with anyhow's `{:#}`, which prints a cause again when a message repeats
/// its source ("Connection refused (os error 111): Connection refused (os
/// error 111)").
#[test]
fn error_chains_are_worded_in_one_place() {
    let mut offenders = Vec::new();
    for path in files_with("rs") {
        let relative = path.strip_prefix(repo()).unwrap().display().to_string();
        if !(relative.starts_with("agent/src/") || relative.starts_with("server/src/")) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (n, line) in code.lines().enumerate() {
            let line = line.trim_start();
            if !line.starts_with("//") && (line.contains(":#}") || line.contains("{:#}")) {
                offenders.push(format!("{relative}:{}: {line}", n + 1));
            }
        }
    }
    assert!(offenders.is_empty(), "errors formatted with {{:#}} instead of text::error_chain: {offenders:#?}");
}

/// The shipped code of the Rust files under `dir`: test files (`tests.rs`,
/// `testing.rs`, `testkit`, anything under a `tests/` folder) left out, and
/// each file cut at its `#[cfg(test)]`. Each line with its place.
fn shipped_lines(dir: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for path in files_with("rs") {
        let relative = path.strip_prefix(repo()).unwrap().display().to_string();
        let test_file = relative.contains("/tests/")
            || relative.contains("testkit")
            || relative.ends_with("/tests.rs")
            || relative.ends_with("/testing.rs");
        if !relative.starts_with(dir) || test_file {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (n, line) in code.lines().enumerate() {
            let line = line.trim_start();
            if !line.starts_with("//") {
                out.push((format!("{relative}:{}", n + 1), line.to_string()));
            }
        }
    }
    out
}

/// ARCHITECTURE.md's invariants that `use` lines can break: the node and
/// link machines (keysync-machine) speak no wire format and read no clock,
/// network or disk (time comes in with the inputs); the gRPC server crate
/// touches no filesystem (what it serves comes from the agent's handler,
/// its TLS material as bytes).
#[test]
fn the_machine_and_the_server_keep_to_their_side() {
    let rules: [(&str, &[&str]); 2] = [
        (
            "agent/machine/src/",
            &[
                "keysync_proto",
                "prost",
                "tonic",
                "tokio",
                "std::fs",
                "std::net",
                "std::thread",
                "SystemTime",
                "Instant::now",
                "std::env",
            ],
        ),
        ("server/src/", &["std::fs", "std::os::unix::fs", "File::", "OpenOptions", "rustix", "std::path"]),
    ];
    let mut offenders = Vec::new();
    for (dir, forbidden) in rules {
        let lines = shipped_lines(dir);
        assert!(lines.len() > 1000, "{dir}: only {} lines of shipped code found", lines.len());
        for (place, line) in lines {
            if let Some(word) = forbidden.iter().find(|word| line.contains(*word)) {
                offenders.push(format!("{place}: uses {word}: {line}"));
            }
        }
    }
    assert!(offenders.is_empty(), "{offenders:#?}");
}
