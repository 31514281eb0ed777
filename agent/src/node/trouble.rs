//! Write trouble (a full disk, an I/O error, a store that cannot commit):
//! what failed is retried with exponential backoff, nothing is recorded that
//! is not on disk, and the episode is logged and audited once when it starts
//! and once when it ends, not once per retry.

use std::time::{Duration, Instant};

use crate::audit::{AuditLog, Record};

const FIRST_DELAY: Duration = Duration::from_millis(250);
const MAX_DELAY: Duration = Duration::from_secs(5);

#[derive(Default)]
pub(super) struct WriteTrouble {
    /// Set while writes fail: since when, and the first error.
    failing: Option<(Instant, String)>,
    next_try: Option<Instant>,
    delay: Duration,
}

impl WriteTrouble {
    /// Notes a failed write of `what`; the first failure of an episode is
    /// logged and audited, later ones only lengthen the backoff.
    pub(super) fn failed(&mut self, audit: &AuditLog, what: &str, error: &str) {
        let now = Instant::now();
        self.delay = if self.failing.is_some() { (self.delay * 2).min(MAX_DELAY) } else { FIRST_DELAY };
        self.next_try = Some(now + self.delay);
        if self.failing.is_some() {
            tracing::debug!(what, error, retry_in = ?self.delay, "write still failing");
            return;
        }
        tracing::error!(what, error, "cannot write; nothing recorded, retrying with backoff");
        audit.record(Record {
            reason: Some(format!("{what}: {error}; nothing recorded, retrying with backoff")),
            ..Record::new("write", "local", "failed")
        });
        audit.sync();
        self.failing = Some((now, format!("{what}: {error}")));
    }

    /// Notes a write that succeeded: ends an episode (logged and audited).
    pub(super) fn succeeded(&mut self, audit: &AuditLog) {
        self.next_try = None;
        if let Some((since, first)) = self.failing.take() {
            let lasted = since.elapsed();
            tracing::info!(lasted = ?lasted, first_error = %first, "writes succeed again");
            audit.record(Record {
                reason: Some(format!("writes succeed again after {lasted:.1?} (first error: {first})")),
                ..Record::new("write", "local", "recovered")
            });
        }
    }

    /// Whether a retry is due now.
    pub(super) fn retry_due(&self) -> bool {
        self.next_try.is_none_or(|at| Instant::now() >= at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::read_verified;

    #[test]
    fn an_episode_is_audited_once_and_backs_off() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let audit = AuditLog::open(&path, "a").unwrap();
        let mut trouble = WriteTrouble::default();
        assert!(trouble.retry_due());
        trouble.failed(&audit, "pki", "No space left on device (os error 28)");
        assert!(!trouble.retry_due(), "the first retry waits {FIRST_DELAY:?}");
        for _ in 0..10 {
            trouble.failed(&audit, "pki", "No space left on device (os error 28)");
        }
        assert_eq!(trouble.delay, MAX_DELAY);
        trouble.succeeded(&audit);
        trouble.succeeded(&audit);
        assert!(trouble.retry_due());
        audit.sync();
        let outcomes: Vec<String> =
            read_verified(&path).unwrap().into_iter().filter(|r| r.action == "write").map(|r| r.outcome).collect();
        assert_eq!(outcomes, ["failed", "recovered"]);
    }
}
