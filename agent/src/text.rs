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

/// One line for `error` and its causes, each said once: `error: cause:
/// cause`. A cause whose text the line holds already is left out (a wrapper
/// that repeats its source: anyhow's `{:#}` printed "Connection refused (os
/// error 111): Connection refused (os error 111)"), and so is the transport's
/// bare "transport error"; a tonic `Status` is told by its message, rustls's
/// errors in words (`keysync_server::tls_error_words`). The binary words
/// every error chain it prints with this.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = String::new();
    for error in std::iter::successors(Some(error), |&error| error.source()) {
        let part = said(error);
        if part.is_empty() || part == "transport error" || text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

/// What `error` says by itself, without its source.
fn said(error: &(dyn std::error::Error + 'static)) -> String {
    if let Some(status) = error.downcast_ref::<tonic::Status>() {
        return match status.message() {
            "" => status.code().description().to_string(),
            message => message.to_string(),
        };
    }
    keysync_server::error_words(error).unwrap_or_else(|| error.to_string())
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

    /// Wraps an error, saying `what` and, with `repeat`, its source's text too.
    #[derive(Debug)]
    struct Wrapper {
        what: &'static str,
        repeat: bool,
        source: Box<dyn std::error::Error + Send + Sync>,
    }

    impl std::fmt::Display for Wrapper {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self.repeat {
                true => write!(f, "{}: {}", self.what, self.source),
                false => f.write_str(self.what),
            }
        }
    }

    impl std::error::Error for Wrapper {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&*self.source)
        }
    }

    /// Issue 28 item 8: one cause per message, in words.
    #[test]
    fn each_cause_is_said_once_and_in_words() {
        let refused = || Box::new(std::io::Error::from_raw_os_error(111));
        let transport = Wrapper { what: "transport error", repeat: false, source: refused() };
        let connecting = Wrapper { what: "connecting to peer master-b", repeat: false, source: Box::new(transport) };
        let error = anyhow::Error::new(connecting).context("cannot recover");
        let said = error_chain(error.as_ref());
        assert_eq!(said, "cannot recover: connecting to peer master-b: Connection refused (os error 111)");

        let repeating = Wrapper { what: "cannot connect", repeat: true, source: refused() };
        let said = error_chain(&repeating);
        assert_eq!(said, "cannot connect: Connection refused (os error 111)");

        // rustls's errors: keysync_server's words.rs tests them.
        let status = tonic::Status::unavailable("the agent is stopping");
        assert_eq!(error_chain(&status), "the agent is stopping");
    }
}
