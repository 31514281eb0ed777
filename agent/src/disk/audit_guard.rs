//! The tail of the audit log, checked at start-up. The chain makes edits
//! and removals in the middle visible, but records cut off the end leave a
//! shorter chain that still verifies. So every store commit notes where the
//! chain ended (and a clean stop notes it once more), and a start compares:
//! a log whose chain ends before that point, or at it with another hash, lost
//! or changed records while the agent was stopped. That is recorded (a
//! `gap` record naming both heads, and an error in the log) and the agent
//! goes on: `audit verify --head SEQ:HASH` then fails on the cut log. Records
//! written after the last commit and cut after a kill -9 are not noticed.

use super::audit::{AuditHead, AuditLog, Record};
use super::store::Store;
use crate::disk::audit::{Action, Outcome, Via};

/// What the log's end says against what the store noted.
#[derive(Debug, PartialEq, Eq)]
pub enum Tail {
    /// Nothing noted yet, or the log reaches at least as far.
    Whole,
    /// The chain ends before the noted head (records removed).
    Cut { noted: AuditHead, found: AuditHead },
    /// The chain ends at the noted seq with another line (records replaced).
    Changed { noted: AuditHead, found: AuditHead },
}

pub fn compare(noted: Option<AuditHead>, found: AuditHead) -> Tail {
    match noted {
        Some(noted) if found.seq < noted.seq => Tail::Cut { noted, found },
        Some(noted) if found.seq == noted.seq && found.hash != noted.hash => Tail::Changed { noted, found },
        _ => Tail::Whole,
    }
}

/// At start-up: records a gap if the log lost or changed records since the
/// store last noted its head; returns what it found.
pub fn check(store: &Store, audit: &AuditLog) -> Tail {
    let noted = match store.audit_head() {
        Ok(noted) => noted,
        Err(e) => {
            tracing::error!(error = %e, "cannot read where the audit log ended; its tail is not checked");
            return Tail::Whole;
        }
    };
    let tail = compare(noted, audit.head());
    let why = match &tail {
        Tail::Whole => return tail,
        Tail::Cut { noted, found } => format!(
            "the audit log ends at record {found} but this agent had written up to {noted}: records were removed \
             while it was stopped (check with `salt-keysync audit verify --head {noted}` on any copy of the log)"
        ),
        Tail::Changed { noted, found } => format!(
            "the audit log's record {} is not the one this agent wrote ({noted}, found {found}): records were \
             replaced while it was stopped",
            noted.seq
        ),
    };
    tracing::error!(path = %audit.path().display(), reason = %why, "the audit log's tail was tampered with");
    audit.record(Record { reason: Some(why), ..Record::new(Action::Gap, Via::Local, Outcome::Detected) });
    audit.sync();
    tail
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(seq: u64, c: char) -> AuditHead {
        AuditHead { seq, hash: c.to_string().repeat(64) }
    }

    #[test]
    fn a_cut_or_replaced_tail_is_told_a_longer_one_is_not() {
        assert_eq!(compare(None, head(3, 'a')), Tail::Whole);
        assert_eq!(compare(Some(head(3, 'a')), head(3, 'a')), Tail::Whole);
        assert_eq!(compare(Some(head(3, 'a')), head(9, 'b')), Tail::Whole, "records after the last commit");
        assert_eq!(compare(Some(head(9, 'b')), head(3, 'a')), Tail::Cut { noted: head(9, 'b'), found: head(3, 'a') });
        assert_eq!(
            compare(Some(head(9, 'b')), head(9, 'c')),
            Tail::Changed { noted: head(9, 'b'), found: head(9, 'c') }
        );
    }
}
