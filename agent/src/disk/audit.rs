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
mod kinds;
mod reader;
pub mod refusals;
mod verify;
mod writer;

use std::io;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use filter::{parse_time_bound, Filter};
pub use kinds::{Action, Outcome, Via};
pub use reader::{each_line, scan, Follower, Line, Polled, Scan, Torn};
pub use verify::{verify_files, Break, VerifyReport};
pub use writer::{AuditHead, AuditLog, Batch};

/// The `prev` of the first record of a chain.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The action of the record the writer puts first in a file that continues
/// the chain of a rotated one.
pub const CONTINUE: &str = Action::Continue.as_str();

/// One audit record. Field names are part of the user-facing contract.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// RFC 3339, UTC.
    pub time: String,
    /// The node that recorded this line.
    pub node: String,
    /// accept, reject, delete, pending, conflict, refuse, connect, ...
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minion: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// Where the decision was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// `local`, or the peer it arrived from.
    pub via: String,
    /// applied, superseded, refused, failed, ...
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// For conflicts and discarded pending keys: the other side.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_fingerprint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_version: Option<String>,
    /// The agents a decision passed through before the one it came from
    /// (`via`), origin excluded, as each forwarder reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relays: Option<Vec<String>>,
    /// The peer name a connection presented or was identified as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// The remote socket address of a connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
    /// Position in the chain: one more than the record before, also across
    /// rotated files. A gap means removed records, a step back reordering.
    #[serde(default)]
    pub seq: u64,
    /// sha256 of the previous line (hex).
    #[serde(default)]
    pub prev: String,
}

impl Record {
    pub fn new(action: Action, via: Via<'_>, outcome: Outcome) -> Record {
        Record {
            action: action.as_str().into(),
            via: via.as_str().into(),
            outcome: outcome.as_str().into(),
            ..Record::default()
        }
    }
}

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
