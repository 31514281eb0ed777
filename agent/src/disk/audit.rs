//! The audit log: one JSON object per line, append-only, each line carrying
//! the sha256 of the line before it (`prev`) and a sequence number (`seq`),
//! so editing, removing or reordering records breaks the chain
//! (`salt-keysync audit verify`).
//!
//! - `writer.rs` appends (one `write()` per whole line), follows log rotation
//!   and repairs a line torn by a crash;
//! - `reader.rs` splits files into lines, tolerating a torn last line, and
//!   tails a file across rotations;
//! - `verify.rs` checks the chain over one or several files and names the
//!   first bad record;
//! - `filter.rs` selects records for `salt-keysync audit`;
//! - `refusals.rs` aggregates each peer's refusals (ten a minute, then a count).

mod filter;
mod reader;
pub mod refusals;
mod verify;
mod writer;

use std::io;
use std::path::PathBuf;

use sha2::{Digest, Sha256};

pub use filter::{parse_time_bound, Filter};
/// A record and what it says, as types, and what each event of the node
/// machine is recorded as: `keysync-audit`, which the simulation runs too.
pub use keysync_audit::{Action, Outcome, Record, Via};
pub use reader::{each_line, scan, Follower, Line, Polled, Scan, Torn};
pub use verify::{verify_files, Break, VerifyReport};
pub use writer::{AuditHead, AuditLog, Batch};

/// The `prev` of the first record of a chain.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The action of the record the writer puts first in a file that continues
/// the chain of a rotated one.
pub const CONTINUE: &str = Action::Continue.as_str();

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The cause is in the message, not a `source()`: `{:#}` would print it twice.
    #[error("audit log {path}: {cause}")]
    Io { path: PathBuf, cause: io::Error },
    #[error("audit log {path}: line {line}: {why}")]
    Broken { path: PathBuf, line: usize, why: String },
}

/// The hash a following record puts in `prev`: sha256 of the line's bytes
/// without its newline, hex.
pub fn line_hash(line: &[u8]) -> String {
    hex::encode(Sha256::digest(line))
}

/// Reads one file and checks its chain; returns its records in order. A
/// file continuing a rotated one is accepted (see [`verify_files`]); a torn
/// last line is left out.
pub fn read_verified(path: &std::path::Path) -> Result<Vec<Record>, AuditError> {
    let report = verify_files(&[path.to_path_buf()])?;
    if let Some(bad) = report.broken {
        return Err(AuditError::Broken { path: bad.file, line: bad.line, why: bad.why });
    }
    read_all(path)
}

/// Reads a log without checking the chain; lines that are not records are
/// left out.
pub fn read_all(path: &std::path::Path) -> Result<Vec<Record>, AuditError> {
    let scan = scan(path).map_err(|cause| AuditError::Io { path: path.into(), cause })?;
    Ok(scan.lines.into_iter().filter_map(|line| line.record.ok()).collect())
}

/// The newest file logrotate made of `path`, in its folder: `<name>.N`, or
/// `<name>-<digits>` as `dateext` names it (`-YYYYMMDD` by default, any
/// `dateformat` of digits), uncompressed; the most recently modified one.
pub fn newest_rotated(path: &std::path::Path) -> Option<std::path::PathBuf> {
    let name = path.file_name()?.to_str()?;
    let folder = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let rotated = |entry: &std::fs::DirEntry| {
        let file = entry.file_name();
        let rest = file.to_str()?.strip_prefix(name)?;
        let suffix = rest.strip_prefix('.').or_else(|| rest.strip_prefix('-'))?;
        let ok = suffix.bytes().any(|b| b.is_ascii_digit())
            && suffix.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'-' | b'_'));
        let meta = entry.metadata().ok().filter(|meta| meta.is_file())?;
        ok.then(|| (meta.modified().ok(), file.to_string_lossy().into_owned(), entry.path()))
    };
    let entries = std::fs::read_dir(folder).ok()?;
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| rotated(&entry))
        .max_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)))
        .map(|(_, _, path)| path)
}

pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod reserved {
    use super::Via;

    /// The names the config refuses are the ones `via` uses itself.
    #[test]
    fn reserved_names_are_vias() {
        let fixed = [Via::Journal, Via::Local, Via::Network];
        let names: Vec<&str> = fixed.iter().map(|via| via.as_str()).collect();
        assert_eq!(names, crate::config::RESERVED_NAMES, "every fixed `via` is reserved, and only those");
    }
}
