//! `doc-block MARKER`: prints the block of the docs that `<!-- MARKER -->`
//! marks (`doc-block 'systemd-test: install'`), read by the docs-as-tests'
//! one reader (`src/docs.rs`), for `tests/systemd/lib.sh`. Fails, naming
//! why, when no document or more than one line marks it, or no block follows.
//!
//! std alone, and `docs.rs` by path rather than through the crate: lib.sh
//! compiles this file with rustc in a second, without building the test
//! crate's dependencies (with `CARGO_MANIFEST_DIR` set to `tests/`, as cargo does).
#![forbid(unsafe_code)]

#[path = "../docs.rs"]
#[allow(dead_code)] // The Rust tests' helpers, unused here.
mod docs;

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [marker] = &args[..] else {
        eprintln!("usage: doc-block MARKER   (doc-block 'systemd-test: install')");
        return std::process::ExitCode::from(2);
    };
    match docs::find(&docs::repo(), marker) {
        Ok((_, block)) => {
            println!("{}", block.text);
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("doc-block: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
