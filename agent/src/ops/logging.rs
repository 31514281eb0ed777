//! Text log output: for journald, a `<N>` syslog priority before each line
//! (the sd-daemon convention journald reads from stderr by default), so
//! `journalctl -p warning` selects the agent's warnings and errors; and
//! everywhere, minion ids and peer names shown safely (`text.rs`): one
//! event, one line, no escape sequence reaching the terminal. The same
//! prefix on the lines the binary prints itself (a refused start, `check`),
//! when their stream is the journal's.

use std::ffi::OsStr;
use std::fmt;
use std::os::fd::BorrowedFd;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Wraps an event format and prefixes each event with its syslog priority.
pub struct JournaldPriority<F>(pub F);

/// syslog priority of a tracing level: err, warning, info, debug.
pub fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

impl<S, N, F> FormatEvent<S, N> for JournaldPriority<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        write!(writer, "<{}>", priority(event.metadata().level()))?;
        self.0.format_event(ctx, writer, event)
    }
}

/// Wraps an event format: the line it writes has every control character
/// escaped (but its final newline), so an id holding a newline or an escape
/// sequence can neither forge a log line nor reach the terminal.
pub struct Escaped<F>(pub F);

impl<S, N, F> FormatEvent<S, N> for Escaped<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        let body = line.strip_suffix('\n').unwrap_or(&line);
        writeln!(writer, "{}", crate::text::shown(body))
    }
}

/// Whether `stream` (stdout or stderr) is the journal's: systemd sets
/// `JOURNAL_STREAM=<dev>:<inode>` for a service whose output goes to the
/// journal, and a child that inherited the variable but writes elsewhere (a
/// terminal, a pipe) must not get the prefixes, so the stream itself is
/// compared, as sd_journal_stream_fd(3) advises.
pub fn is_journal(stream: BorrowedFd<'_>) -> bool {
    names_stream(std::env::var_os("JOURNAL_STREAM").as_deref(), stream)
}

fn names_stream(journal_stream: Option<&OsStr>, stream: BorrowedFd<'_>) -> bool {
    let (Some(expected), Ok(stat)) = (journal_stream, rustix::fs::fstat(stream)) else { return false };
    expected.to_str() == Some(&format!("{}:{}", stat.st_dev, stat.st_ino))
}

/// `line` as journald should file it when `stream` is the journal's: with
/// the `<N>` prefix of `level`; unchanged otherwise.
pub fn with_priority(stream: BorrowedFd<'_>, level: Level, line: &str) -> String {
    prefixed(is_journal(stream), level, line)
}

fn prefixed(journal: bool, level: Level, line: &str) -> String {
    if journal {
        format!("<{}>{line}", priority(&level))
    } else {
        line.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Issue 14 item 6: a minion id with a newline and `ESC[8m` stays one
    /// line with its control characters escaped.
    #[test]
    fn an_event_is_one_line_without_control_characters() {
        let captured = Captured::default();
        let writer = captured.clone();
        let plain = tracing_subscriber::fmt::format().without_time().with_ansi(false);
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .event_format(JournaldPriority(Escaped(plain)))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(minion = %"evil\n<3>forged line\u{1b}[8m", "refused key file");
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text:?}");
        assert!(text.starts_with("<4>") && text.contains("evil\\u{a}<3>forged line\\u{1b}[8m"), "{text:?}");
    }

    #[test]
    fn only_the_stream_systemd_named_gets_priorities() {
        use std::os::fd::AsFd;
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let journal = std::fs::File::create(dir.path().join("journal")).unwrap();
        let other = std::fs::File::create(dir.path().join("other")).unwrap();
        let meta = journal.metadata().unwrap();
        let named = std::ffi::OsString::from(format!("{}:{}", meta.dev(), meta.ino()));
        assert!(names_stream(Some(&named), journal.as_fd()));
        assert!(!names_stream(Some(&named), other.as_fd()), "inherited, but this stream is not the journal");
        assert!(!names_stream(None, journal.as_fd()));
        assert!(!names_stream(Some(OsStr::new("garbage")), journal.as_fd()));
        assert_eq!(prefixed(true, Level::ERROR, "salt-keysync: x"), "<3>salt-keysync: x");
        assert_eq!(prefixed(true, Level::INFO, "ok   y"), "<6>ok   y");
        assert_eq!(prefixed(false, Level::ERROR, "salt-keysync: x"), "salt-keysync: x");
    }
}
