//! Appending to the audit log.
//!
//! - One `write()` of whole lines per batch (up to [`BATCH_LINES`] records,
//!   a single record outside bursts) on an `O_APPEND` file: lines are never
//!   interleaved, and a short write is cut back off (its records counted in
//!   the next `lost` record).
//! - Rotation without signals: before each append the open file is compared
//!   with the path. A different inode or a missing path (logrotate's rename,
//!   with or without `create`) reopens the path; a file shorter than what was
//!   written (`copytruncate`) keeps the file. Either way the next record is a
//!   [`CONTINUE`] marker chained to the last record of the old file, whose
//!   hash and `seq` are kept in memory.
//! - A torn last line (crash during a write) found at open is moved to
//!   `<log>.torn-<unix time>` and cut off, and a `repair` record says so; a
//!   last line only missing its newline gets it.
//! - Durability: no fsync per record, and none on the replication path.
//!   Records reach the page cache at once (a killed agent loses none);
//!   [`AuditLog::sync`], called once per batch of decisions, wakes a flusher
//!   thread that runs `fdatasync` (measured ~5 ms p50 on a busy 2-core VM,
//!   the whole replication budget), so only a power cut within those
//!   milliseconds can lose records — as it could before, since decisions are
//!   committed to the store before they are audited.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use prometheus_client::metrics::counter::Counter;

use super::{line_hash, now_rfc3339, AuditError, Record, GENESIS};
use super::{Action, Outcome, Via};

/// Where a log's chain ends: the last record's `seq` and line hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditHead {
    pub seq: u64,
    pub hash: String,
}

impl std::fmt::Display for AuditHead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.seq, self.hash)
    }
}

impl std::str::FromStr for AuditHead {
    type Err = String;

    /// `SEQ:HASH`, as `status` and the gap record print it.
    fn from_str(text: &str) -> Result<AuditHead, String> {
        let (seq, hash) = text.split_once(':').ok_or_else(|| format!("{text:?} is not SEQ:HASH"))?;
        let seq = seq.parse().map_err(|_| format!("{text:?}: {seq:?} is not a sequence number"))?;
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("{text:?}: {hash:?} is not a sha256 in hex"));
        }
        Ok(AuditHead { seq, hash: hash.to_ascii_lowercase() })
    }
}

/// The audit log of this node, shared by every task that records.
pub struct AuditLog {
    node: String,
    path: PathBuf,
    inner: Arc<Mutex<Tail>>,
    flusher: Flusher,
    /// Failed writes and flushes, exported as a metric.
    failures: Counter,
}

struct Tail {
    /// Shared with the flusher thread, which syncs it outside the lock.
    file: Arc<File>,
    /// (device, inode) of `file`, to notice the path now names another file.
    identity: (u64, u64),
    /// Length of `file` as far as this writer knows: what it found plus what
    /// it wrote. A shorter file was truncated under it.
    len: u64,
    last_hash: String,
    seq: u64,
    /// Records that could not be written since the last one that was, and why.
    n_lost: u64,
    lost_error: String,
    /// Each peer's refusals, told ten a minute and then counted.
    refusals: super::refusals::PeerRefusals,
}

/// The end of a file: its last complete line, and a torn tail after it.
struct End {
    last_line: Option<Vec<u8>>,
    torn: Option<(u64, Vec<u8>)>,
}

fn open_append(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    // The audit log: 0600 or 0640, nothing for others.
    let mode = file.metadata()?.permissions().mode() & 0o777;
    if mode & 0o037 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(file)
}

/// Reads backwards from `len` until the last two newlines are found.
fn read_end(file: &File, len: u64) -> io::Result<End> {
    const CHUNK: u64 = 64 * 1024;
    let mut start = len;
    let mut buf: Vec<u8> = Vec::new();
    while start > 0 && buf.iter().filter(|&&b| b == b'\n').take(2).count() < 2 {
        let n = CHUNK.min(start);
        start -= n;
        let mut chunk = vec![0; n as usize];
        file.read_exact_at(&mut chunk, start)?;
        chunk.extend_from_slice(&buf);
        buf = chunk;
    }
    // `start` is 0 here unless buf holds two newlines.
    let Some(last_nl) = buf.iter().rposition(|&b| b == b'\n') else {
        return Ok(End { last_line: None, torn: (!buf.is_empty()).then_some((start, buf)) });
    };
    let torn = (last_nl + 1 < buf.len()).then(|| (start + last_nl as u64 + 1, buf[last_nl + 1..].to_vec()));
    let line_start = buf[..last_nl].iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1);
    Ok(End { last_line: Some(buf[line_start..last_nl].to_vec()), torn })
}

fn seq_of(line: &[u8]) -> u64 {
    serde_json::from_slice::<Record>(line).map_or(0, |r| r.seq)
}

impl AuditLog {
    /// Opens (or creates, mode 0600) the log and picks the chain up from its
    /// last line; an empty log continues the newest rotated file when there is one (rotated
    /// while the agent was stopped).
    pub fn open(path: &Path, node: &str) -> Result<AuditLog, AuditError> {
        let io_err = |cause| AuditError::Io { path: path.into(), cause };
        if let Some(parent) = path.parent() {
            // A folder made here is the agent's own: nobody else reads the log.
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(parent).map_err(io_err)?;
        }
        let file = open_append(path).map_err(io_err)?;
        let meta = file.metadata().map_err(io_err)?;
        let mut tail = Tail {
            file: Arc::new(file),
            identity: (meta.dev(), meta.ino()),
            len: meta.len(),
            last_hash: GENESIS.into(),
            seq: 0,
            n_lost: 0,
            lost_error: String::new(),
            refusals: Default::default(),
        };
        let end = read_end(&tail.file, tail.len).map_err(io_err)?;
        let mut first: Vec<Record> = Vec::new();
        if let Some(line) = &end.last_line {
            tail.last_hash = line_hash(line);
            tail.seq = seq_of(line);
        }
        if let Some((at, torn)) = end.torn {
            if let Some(record) = whole_record(&torn, &tail.last_hash) {
                // Only the newline was lost: the record is whole and chained.
                (&*tail.file).write_all(b"\n").map_err(io_err)?;
                tail.len += 1;
                tail.last_hash = line_hash(&torn);
                tail.seq = record.seq;
            } else {
                first.push(set_torn_aside(path, &mut tail, at, &torn).map_err(io_err)?);
            }
        }
        if end.last_line.is_none() && tail.len == 0 {
            if let Some(record) = continue_rotated(path, &mut tail) {
                // The marker must be the file's first record (see verify.rs).
                first.insert(0, record);
            }
        }
        let inner = Arc::new(Mutex::new(tail));
        let failures = Counter::default();
        let flusher = Flusher::start(path, inner.clone(), failures.clone()).map_err(io_err)?;
        let log = AuditLog { node: node.into(), path: path.into(), inner, flusher, failures };
        for record in first {
            log.record(record);
        }
        Ok(log)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The last record written: its `seq` and the hash of its line (what
    /// the next record's `prev` will be).
    pub fn head(&self) -> AuditHead {
        let tail = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        AuditHead { seq: tail.seq, hash: tail.last_hash.clone() }
    }

    /// Counts every failed write or flush from open on (shared, for the metrics).
    pub fn write_failures(&self) -> Counter {
        self.failures.clone()
    }

    /// Appends a record, filling in time, node, `seq` and `prev`. A failure to
    /// write is logged and counted in a later `lost` record, never fatal: the
    /// agent keeps replicating.
    pub fn record(&self, record: Record) {
        self.record_all(vec![record]);
    }

    /// Tells the counts of peers' refusal windows that ended (called
    /// periodically: a peer that stopped sending still gets its count
    /// told), or of every window (`all`, at a stop).
    pub fn flush_refusals(&self, all: bool) {
        let mut tail = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !tail.refusals.is_counting() {
            return;
        }
        let summaries = tail.refusals.ended(std::time::Instant::now(), all);
        drop(tail);
        self.record_all(summaries);
    }

    /// Collects records and appends them [`BATCH_LINES`] at a time.
    pub fn batch(&self) -> Batch<'_> {
        Batch { log: self, records: Vec::new() }
    }

    /// Appends records in order, as [`AuditLog::record`] does one, with one
    /// rotation check and one write for all of them: a burst of 10,000
    /// decisions costs a few system calls, not 30,000.
    /// A peer's refusals past the first ten of a minute are only counted
    /// (`refusals.rs`), then told as one record with the count.
    pub fn record_all(&self, mut records: Vec<Record>) {
        if records.is_empty() {
            return;
        }
        let mut tail = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = std::time::Instant::now();
        let mut summaries = tail.refusals.ended(now, false);
        records.retain(|record| tail.refusals.admit(record, now));
        summaries.append(&mut records);
        let records = summaries;
        if records.is_empty() {
            return;
        }
        if let Some(how) = self.follow_rotation(&mut tail) {
            tracing::info!(path = %self.path.display(), how, "audit log rotated; continuing the chain");
            let marker = Record {
                reason: Some(format!(
                    "audit log {how} by log rotation; this file continues the chain of the previous one"
                )),
                ..Record::new(Action::Continue, Via::Local, Outcome::Rotated)
            };
            self.append(&mut tail, marker);
        }
        if tail.n_lost > 0 {
            let lost = Record {
                reason: Some(format!("{} audit records could not be written: {}", tail.n_lost, tail.lost_error)),
                ..Record::new(Action::Lost, Via::Local, Outcome::Failed)
            };
            let n_lost = std::mem::take(&mut tail.n_lost);
            if !self.append(&mut tail, lost) {
                tail.n_lost += n_lost;
            }
        }
        self.append_all(&mut tail, records);
    }

    /// Writes one line.
    fn append(&self, tail: &mut Tail, record: Record) -> bool {
        self.append_all(tail, vec![record])
    }

    /// Writes the records' lines with one write; false (and all counted as
    /// lost) when it could not.
    fn append_all(&self, tail: &mut Tail, records: Vec<Record>) -> bool {
        let time = now_rfc3339();
        let (mut seq, mut last_hash) = (tail.seq, tail.last_hash.clone());
        let n = records.len();
        // Each line serialized in place, at the end of the batch's buffer.
        let mut lines: Vec<u8> = Vec::with_capacity(n.saturating_mul(LINE_BYTES));
        let first_action = records.first().map(|r| r.action.clone()).unwrap_or_default();
        for mut record in records {
            record.time.clone_from(&time);
            record.node.clone_from(&self.node);
            seq += 1;
            record.seq = seq;
            record.prev = last_hash;
            let start = lines.len();
            serde_json::to_writer(&mut lines, &record).expect("records serialize");
            last_hash = line_hash(&lines[start..]);
            lines.push(b'\n');
        }
        let result = match (&*tail.file).write(&lines) {
            Ok(written) if written == lines.len() => Ok(()),
            Ok(written) => {
                // A short write (disk full): cut it off so the file keeps whole lines.
                let _ = tail.file.set_len(tail.len);
                Err(io::Error::new(io::ErrorKind::WriteZero, format!("wrote {written} of {} bytes", lines.len())))
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => {
                tail.len += lines.len() as u64;
                tail.last_hash = last_hash;
                tail.seq = seq;
                true
            }
            Err(e) => {
                self.failures.inc();
                tracing::error!(path = %self.path.display(), error = %e, action = first_action, n, "cannot write audit records");
                tail.n_lost += n as u64;
                tail.lost_error = e.to_string();
                false
            }
        }
    }

    /// Notices rotation since the last append and reopens when the path names
    /// another file now. Returns how the log was rotated.
    fn follow_rotation(&self, tail: &mut Tail) -> Option<&'static str> {
        let open_len = tail.file.metadata().map(|m| m.len()).ok()?;
        let renamed = match std::fs::symlink_metadata(&self.path) {
            Ok(meta) => (meta.dev(), meta.ino()) != tail.identity,
            Err(e) if e.kind() == io::ErrorKind::NotFound => true,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot stat the audit log");
                false
            }
        };
        if renamed {
            match open_append(&self.path).and_then(|f| f.metadata().map(|m| (f, m))) {
                Ok((file, meta)) => {
                    tail.file = Arc::new(file);
                    tail.identity = (meta.dev(), meta.ino());
                    tail.len = meta.len();
                    return Some("renamed");
                }
                Err(e) => {
                    // Keep writing to the old file rather than lose records.
                    tracing::error!(path = %self.path.display(), error = %e, "cannot reopen the rotated audit log");
                }
            }
        }
        let truncated = open_len < tail.len;
        tail.len = open_len;
        truncated.then_some("truncated")
    }

    /// Asks for the log to be flushed to disk (after a batch of records) and
    /// returns at once; the flusher thread runs `fdatasync`. Dropping the log
    /// flushes it before returning.
    pub fn sync(&self) {
        self.flusher.request(false);
    }
}

/// Lines appended per write by a [`Batch`]: few system calls for a burst of
/// 10,000 decisions, and no 100,000-line buffer for a first start.
pub const BATCH_LINES: usize = 1024;

/// Room kept per line in a write's buffer: a decision's line is about 400
/// bytes (a join of 200,000 keys wrote 76.7 MB); longer lines grow it.
const LINE_BYTES: usize = 512;

/// Records appended in order, [`BATCH_LINES`] per write; the rest when dropped.
pub struct Batch<'a> {
    log: &'a AuditLog,
    records: Vec<Record>,
}

impl Batch<'_> {
    pub fn push(&mut self, record: Record) {
        self.records.push(record);
        if self.records.len() >= BATCH_LINES {
            self.log.record_all(std::mem::take(&mut self.records));
        }
    }
}

impl Extend<Record> for Batch<'_> {
    fn extend<I: IntoIterator<Item = Record>>(&mut self, records: I) {
        records.into_iter().for_each(|record| self.push(record));
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        self.log.record_all(std::mem::take(&mut self.records));
    }
}

impl Drop for AuditLog {
    fn drop(&mut self) {
        self.flusher.request(true);
        if let Some(thread) = self.flusher.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The thread that syncs the log to disk off the replication path.
struct Flusher {
    shared: Arc<(Mutex<FlushState>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct FlushState {
    requested: bool,
    stop: bool,
}

impl Flusher {
    fn start(path: &Path, inner: Arc<Mutex<Tail>>, failures: Counter) -> io::Result<Flusher> {
        let shared: Arc<(Mutex<FlushState>, Condvar)> = Arc::default();
        let theirs = shared.clone();
        let path = path.to_path_buf();
        let thread = std::thread::Builder::new().name("audit-flush".into()).spawn(move || {
            let (state, wake) = &*theirs;
            loop {
                let mut st = state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                while !st.requested && !st.stop {
                    st = wake.wait(st).unwrap_or_else(|poisoned| poisoned.into_inner());
                }
                let stop = st.stop;
                st.requested = false;
                drop(st);
                // Clone the handle and sync outside the lock: writers never wait for the disk.
                let file = inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).file.clone();
                if let Err(e) = file.sync_data() {
                    failures.inc();
                    tracing::error!(path = %path.display(), error = %e, "cannot flush audit log");
                }
                if stop {
                    return;
                }
            }
        })?;
        Ok(Flusher { shared, thread: Some(thread) })
    }

    fn request(&self, stop: bool) {
        let (state, wake) = &*self.shared;
        let mut st = state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        st.requested = true;
        st.stop |= stop;
        wake.notify_one();
    }
}

/// `bytes` as a complete record chained to `prev`, if it is one.
fn whole_record(bytes: &[u8], prev: &str) -> Option<Record> {
    serde_json::from_slice::<Record>(bytes).ok().filter(|r| r.prev == prev)
}

/// Moves a torn tail to a side file, cuts it off, and returns the record
/// that says so.
fn set_torn_aside(path: &Path, tail: &mut Tail, at: u64, torn: &[u8]) -> io::Result<Record> {
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut aside = path.as_os_str().to_owned();
    aside.push(format!(".torn-{stamp}"));
    let aside = PathBuf::from(aside);
    let mut side = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&aside)?;
    side.write_all(torn)?;
    side.sync_all()?;
    tail.file.set_len(at)?;
    tail.len = at;
    tracing::warn!(path = %path.display(), aside = %aside.display(), n_bytes = torn.len(), "audit log ended in a torn line (crash during a write); moved it aside");
    Ok(Record {
        reason: Some(format!(
            "the log ended in an incomplete line ({} bytes, sha256 {}) from a crash during a write; moved to {}",
            torn.len(),
            line_hash(torn),
            aside.display()
        )),
        ..Record::new(Action::Repair, Via::Local, Outcome::Truncated)
    })
}

/// For an empty log: the chain of the newest rotated file (`<path>.1`, or
/// `<path>-YYYYMMDD` with logrotate's `dateext`, as packaged), and the
/// marker that says the file continues it.
fn continue_rotated(path: &Path, tail: &mut Tail) -> Option<Record> {
    let rotated = super::newest_rotated(path)?;
    let file = File::open(&rotated).ok()?;
    let len = file.metadata().ok()?.len();
    let last = read_end(&file, len).ok()?.last_line?;
    tail.last_hash = line_hash(&last);
    tail.seq = seq_of(&last);
    Some(Record {
        reason: Some(format!("audit log found empty at start; this file continues the chain of {}", rotated.display())),
        ..Record::new(Action::Continue, Via::Local, Outcome::Rotated)
    })
}
