//! Text that others choose, shown to a person. A minion id is anything Salt
//! accepts (a newline and `ESC[8m` included), a peer names itself in its
//! certificate and its `Hello`: printed raw, such text can forge a row of a
//! table or hide the real one from the terminal. Every human view (`audit`,
//! `status`, the text log) shows it through [`shown`]; JSON output stays as
//! it is (JSON escapes control characters itself).

use std::borrow::Cow;

/// `text` with every control character, and every character that reorders
/// text on screen (bidirectional overrides and isolates), written as a
/// `\u{…}` escape; anything else as it is.
pub fn shown(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if needs_escape(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{061c}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `error: cause: cause`, for `status`: the transport's top-level message
/// alone ("connecting to peer …") does not say why.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_and_reordering_characters_are_escaped() {
        assert!(matches!(shown("web01.example.com"), Cow::Borrowed(_)));
        assert_eq!(shown("evil\n2026-01-01 accept\u{1b}[8m"), "evil\\u{a}2026-01-01 accept\\u{1b}[8m");
        assert_eq!(shown("a\u{202e}b\u{7f}\u{9b}"), "a\\u{202e}b\\u{7f}\\u{9b}");
        assert_eq!(shown("ünïcödé ✓"), "ünïcödé ✓");
    }
}
