//! Checking the hash chain of one or several audit files (oldest first) and
//! naming the first bad record.
//!
//! Rules:
//! - every record's `prev` is the hash of the line before it; the first
//!   record of the first file either starts a chain ([`GENESIS`]) or is a
//!   [`CONTINUE`] marker, which the writer puts first in a file that
//!   continues a rotated one. A lone continued file therefore verifies, with a
//!   note that its link to the older file was not checked;
//! - a later file must continue the file before it, or start a new chain
//!   (the agent found nothing to continue when it started): a note, not an
//!   error;
//! - `seq` tells what happened at a break: no gap means a line was edited, a
//!   gap whose records appear later means reordering, a gap whose records
//!   never appear means removal;
//! - a torn last line (crash during a write) is a warning, not a break.
//!
//! Without a secret key a chain cannot stop someone who rewrites the whole
//! file from the changed record on, and the last record is only protected
//! once another follows it: ship the log off the host for stronger guarantees.

use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;

use time::format_description::well_known::Rfc3339;

use super::reader::each_line;
use super::{AuditError, CONTINUE, GENESIS};

/// The outcome of a verification.
#[derive(Debug, Default)]
pub struct VerifyReport {
    pub n_records: usize,
    pub n_files: usize,
    /// Expected situations worth saying (a file continuing a rotated one).
    pub notes: Vec<String>,
    /// Tolerated damage (a torn last line).
    pub warnings: Vec<String>,
    /// The first bad record, if any.
    pub broken: Option<Break>,
}

/// Where and why the chain breaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Break {
    pub file: PathBuf,
    pub line: usize,
    pub why: String,
}

/// What the walk needs of each record.
struct Meta {
    file: usize,
    line: usize,
    seq: u64,
    prev: String,
    hash: String,
    is_continue: bool,
    time: Option<time::OffsetDateTime>,
}

/// Verifies `paths` as one chain, oldest file first. `Err` only when a file
/// cannot be read.
pub fn verify_files(paths: &[PathBuf]) -> Result<VerifyReport, AuditError> {
    let mut report = VerifyReport { n_files: paths.len(), ..VerifyReport::default() };
    let mut metas: Vec<Meta> = Vec::new();
    let mut malformed: Option<Break> = None;
    for (file_idx, path) in paths.iter().enumerate() {
        let io_err = |cause| AuditError::Io { path: path.clone(), cause };
        let file = File::open(path).map_err(io_err)?;
        let torn = each_line(BufReader::new(file), 1, |line| {
            if malformed.is_some() {
                return;
            }
            match line.record {
                Ok(record) => metas.push(Meta {
                    file: file_idx,
                    line: line.number,
                    seq: record.seq,
                    prev: record.prev,
                    hash: line.hash,
                    is_continue: record.action == CONTINUE,
                    time: time::OffsetDateTime::parse(&record.time, &Rfc3339).ok(),
                }),
                Err(why) => {
                    malformed = Some(Break {
                        file: path.clone(),
                        line: line.number,
                        why: format!("{why} (the line was edited, or this is not an audit log)"),
                    })
                }
            }
        })
        .map_err(io_err)?;
        if let Some(torn) = torn {
            report.warnings.push(torn.warning(path));
        }
        if malformed.is_some() {
            break;
        }
    }
    report.n_records = metas.len();
    // A break before a malformed line is the first bad record.
    report.broken = walk(&metas, paths, &mut report.notes).or(malformed);
    Ok(report)
}

fn walk(metas: &[Meta], paths: &[PathBuf], notes: &mut Vec<String>) -> Option<Break> {
    let at = |m: &Meta, why: String| Some(Break { file: paths[m.file].clone(), line: m.line, why });
    let place = |x: &Meta| format!("{} line {}", paths[x.file].display(), x.line);
    for (idx, m) in metas.iter().enumerate() {
        let Some(p) = idx.checked_sub(1).map(|i| &metas[i]) else {
            if m.prev == GENESIS {
                continue;
            }
            if m.is_continue {
                let path = &paths[m.file];
                // The rotated file that is there, else the name logrotate's dateext gives it.
                let older = super::newest_rotated(path)
                    .filter(|older| !paths.contains(older))
                    .map_or_else(|| format!("{}-YYYYMMDD", path.display()), |older| older.display().to_string());
                notes.push(format!(
                    "{} line {} continues from a rotated file (prev {}…); that link was not checked: \
                     pass the older files first, e.g. `salt-keysync audit verify {older} {}`",
                    path.display(),
                    m.line,
                    &m.prev[..12.min(m.prev.len())],
                    path.display()
                ));
                continue;
            }
            return at(
                m,
                "the chain does not start here and this is not a rotation marker: the records before it were removed"
                    .into(),
            );
        };
        if m.prev == p.hash {
            continue;
        }
        let first_in_file = p.file != m.file;
        if first_in_file && m.prev == GENESIS {
            if m.time.is_some() && m.time < p.time {
                return at(m, format!("starts before {} ends: give the files oldest first", place(p)));
            }
            notes.push(format!(
                "{} starts a new chain instead of continuing {} (the agent found no rotated file to continue when it started)",
                paths[m.file].display(),
                paths[p.file].display()
            ));
            continue;
        }
        return diagnose(metas, idx, paths);
    }
    None
}

/// Explains a break between `metas[idx - 1]` and `metas[idx]`.
fn diagnose(metas: &[Meta], idx: usize, paths: &[PathBuf]) -> Option<Break> {
    let (p, m) = (&metas[idx - 1], &metas[idx]);
    let place = |x: &Meta| format!("{} line {}", paths[x.file].display(), x.line);
    let at = |x: &Meta, why: String| Some(Break { file: paths[x.file].clone(), line: x.line, why });
    if p.seq == 0 || m.seq == 0 {
        return at(
            m,
            format!("prev does not match {}: that line was edited, or records were removed or reordered", place(p)),
        );
    }
    if m.seq == p.seq + 1 {
        // Nothing missing in between: one of the two lines changed.
        return match metas.get(idx + 1).map(|next| next.prev == m.hash) {
            Some(false) => {
                at(m, "this record was edited: neither the line before nor the line after chains to it".into())
            }
            Some(true) => {
                at(p, format!("this record was edited: it no longer hashes to the prev recorded by {}", place(m)))
            }
            None => at(p, format!("this record (or the prev of the last line, {}) was edited", place(m))),
        };
    }
    if m.seq > p.seq + 1 {
        let (first, last) = (p.seq + 1, m.seq - 1);
        if let Some(later) = metas[idx + 1..].iter().find(|x| (first..=last).contains(&x.seq)) {
            return at(
                m,
                format!("records out of order: seq {} comes before seq {} at {}", m.seq, later.seq, place(later)),
            );
        }
        let missing = if first == last { format!("seq {first} is") } else { format!("seq {first}..={last} are") };
        if p.file != m.file {
            return at(
                m,
                format!(
                    "does not continue {}: records {missing} missing between the files (written during a logrotate copytruncate, or removed)",
                    paths[p.file].display()
                ),
            );
        }
        return at(m, format!("records {missing} missing before this line: removed"));
    }
    at(m, format!("records out of order: seq {} follows seq {} at {}", m.seq, p.seq, place(p)))
}
