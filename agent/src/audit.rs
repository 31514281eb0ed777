//! The audit log: one JSON object per line, append-only, each line carrying
//! the sha256 of the line before it so that editing or removing a record
//! breaks the chain (`salt-keysync audit --verify`).

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Seek, SeekFrom, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The hash a chain starts from.
const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

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
    /// The peer name a connection presented or was identified as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// The remote socket address of a connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
    /// sha256 of the previous line (hex).
    #[serde(default)]
    pub prev: String,
}

impl Record {
    pub fn new(action: &str, via: &str, outcome: &str) -> Record {
        Record { action: action.into(), via: via.into(), outcome: outcome.into(), ..Record::default() }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("audit log {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("audit log {path}: line {line} is not a record: {message}")]
    Malformed { path: PathBuf, line: usize, message: String },
    #[error("audit log {path}: chain broken at line {line} (edited, removed or reordered records)")]
    Broken { path: PathBuf, line: usize },
}

/// The audit log of this node, shared by every task that records.
pub struct AuditLog {
    node: String,
    path: PathBuf,
    inner: Mutex<Tail>,
}

struct Tail {
    file: File,
    last_hash: String,
}

impl AuditLog {
    /// Opens (or creates, mode 0600) the log and picks the chain up from its
    /// last line.
    pub fn open(path: &Path, node: &str) -> Result<AuditLog, AuditError> {
        let io_err = |source| AuditError::Io { path: path.into(), source };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io_err)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(io_err)?;
        let mode = file.metadata().map_err(io_err)?.permissions().mode() & 0o777;
        if mode & 0o037 != 0 {
            file.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(io_err)?;
        }
        let last_hash = last_line_hash(&mut file).map_err(io_err)?;
        Ok(AuditLog { node: node.into(), path: path.into(), inner: Mutex::new(Tail { file, last_hash }) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends a record, filling in time, node and the chain. A failure to
    /// write is logged, never fatal: the agent keeps replicating.
    pub fn record(&self, mut record: Record) {
        record.time = now_rfc3339();
        record.node.clone_from(&self.node);
        let mut tail = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        record.prev.clone_from(&tail.last_hash);
        let mut line = serde_json::to_string(&record).expect("records serialize");
        let hash = hex::encode(Sha256::digest(line.as_bytes()));
        line.push('\n');
        // One write per line: O_APPEND keeps concurrent lines whole.
        match tail.file.write_all(line.as_bytes()) {
            Ok(()) => tail.last_hash = hash,
            Err(e) => tracing::error!(path = %self.path.display(), error = %e, "cannot write audit record"),
        }
    }

    /// Flushes the log to disk (after a batch of records).
    pub fn sync(&self) {
        let tail = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Err(e) = tail.file.sync_data() {
            tracing::error!(path = %self.path.display(), error = %e, "cannot flush audit log");
        }
    }
}

fn last_line_hash(file: &mut File) -> io::Result<String> {
    let len = file.seek(SeekFrom::End(0))?;
    if len == 0 {
        return Ok(GENESIS.into());
    }
    // Records are short: the last 64 KiB hold the last line.
    let start = len.saturating_sub(64 * 1024);
    file.seek(SeekFrom::Start(start))?;
    let mut tail = Vec::new();
    io::Read::read_to_end(file, &mut tail)?;
    let trimmed = tail.strip_suffix(b"\n").unwrap_or(&tail);
    let last = trimmed.rsplit(|&b| b == b'\n').next().unwrap_or(trimmed);
    Ok(hex::encode(Sha256::digest(last)))
}

/// Reads and checks a whole log; returns its records in order.
pub fn read_verified(path: &Path) -> Result<Vec<Record>, AuditError> {
    read(path, true)
}

/// Reads a log without checking the chain.
pub fn read_all(path: &Path) -> Result<Vec<Record>, AuditError> {
    read(path, false)
}

fn read(path: &Path, verify: bool) -> Result<Vec<Record>, AuditError> {
    let file = File::open(path).map_err(|source| AuditError::Io { path: path.into(), source })?;
    let mut expected = GENESIS.to_string();
    let mut records = Vec::new();
    for (idx, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|source| AuditError::Io { path: path.into(), source })?;
        let record: Record = serde_json::from_str(&line).map_err(|e| AuditError::Malformed {
            path: path.into(),
            line: idx + 1,
            message: e.to_string(),
        })?;
        if verify && record.prev != expected {
            return Err(AuditError::Broken { path: path.into(), line: idx + 1 });
        }
        expected = hex::encode(Sha256::digest(line.as_bytes()));
        records.push(record);
    }
    Ok(records)
}

pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_survives_reopening_and_detects_tampering() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        {
            let log = AuditLog::open(&path, "a").unwrap();
            log.record(Record { minion: Some("web01".into()), ..Record::new("accept", "local", "applied") });
        }
        let log = AuditLog::open(&path, "a").unwrap();
        log.record(Record { minion: Some("web02".into()), ..Record::new("reject", "b", "applied") });
        let records = read_verified(&path).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(records[1].via, "b");
        assert_eq!(records[0].prev, GENESIS);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);

        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("web01", "web99")).unwrap();
        let err = read_verified(&path).unwrap_err();
        assert!(err.to_string().contains("chain broken at line 2"), "{err}");
        assert_eq!(read_all(&path).unwrap().len(), 2);
    }
}
