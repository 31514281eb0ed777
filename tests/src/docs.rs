//! The command blocks the docs give, for tests that run them as written:
//! the block right after an HTML comment marker (`test: NAME` in `<!-- -->`)
//! (fenced, or indented by four spaces), in a file of the repository.

use std::path::Path;

/// The lines of the block after `marker` in `doc` (relative to the
/// repository root), without its fence or indentation.
pub fn block(doc: &str, marker: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(doc);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let after = text.split_once(marker).unwrap_or_else(|| panic!("{doc} has no {marker:?}")).1;
    let mut lines = after.lines().skip(1).skip_while(|l| l.trim().is_empty()).peekable();
    let first = lines.peek().copied().unwrap_or_default();
    let body: Vec<&str> = if first.trim_start().starts_with("```") {
        lines.skip(1).take_while(|l| !l.trim_start().starts_with("```")).collect()
    } else {
        lines.take_while(|l| l.starts_with("    ")).map(|l| &l[4..]).collect()
    };
    assert!(!body.is_empty(), "{doc}: no block after {marker:?}");
    body.join("\n")
}
