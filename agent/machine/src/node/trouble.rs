//! Write trouble (a full disk, an I/O error, a store that cannot commit):
//! what failed is retried with exponential backoff, nothing is recorded that
//! is not on disk, and the episode is told once when it starts and once when
//! it ends, not once per retry.

use std::time::{Duration, Instant};

use super::event::Event;
use super::runtime::{Failure, Runtime};

const FIRST_DELAY: Duration = Duration::from_millis(250);
const MAX_DELAY: Duration = Duration::from_secs(5);
/// While writes keep failing, told again at most this often (the log then
/// says so, not only its first line of the episode).
const REMIND_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
pub(super) struct WriteTrouble {
    /// Set while writes fail: since when, and the first error.
    failing: Option<(Instant, Failure)>,
    next_try: Option<Instant>,
    delay: Duration,
    /// When the episode was last told, and the last error since.
    told: Option<Instant>,
    last_error: Option<Failure>,
}

impl WriteTrouble {
    /// Notes a failed write of `what`; the first failure of an episode is
    /// told, later ones only lengthen the backoff.
    pub(super) fn failed(&mut self, rt: &mut impl Runtime, now: Instant, what: &str, error: &Failure) {
        self.delay = if self.failing.is_some() { (self.delay * 2).min(MAX_DELAY) } else { FIRST_DELAY };
        self.next_try = Some(now + self.delay);
        let last_error = Failure::new(format_args!("{what}: {error}"));
        self.last_error = Some(last_error.clone());
        if let Some((since, _)) = &self.failing {
            if self.told.is_some_and(|told| now.saturating_duration_since(told) >= REMIND_EVERY) {
                self.told = Some(now);
                let lasted = now.saturating_duration_since(*since);
                rt.audit(Event::WritesStillFailing { lasted, error: last_error });
            }
            return;
        }
        rt.audit(Event::WriteFailed { what: what.to_string(), error: error.clone() });
        rt.flush_audit();
        self.failing = Some((now, last_error));
        self.told = Some(now);
    }

    /// While writes fail: since when, and the last error.
    pub(super) fn failing(&self) -> Option<(Instant, &str)> {
        let last_error = self.last_error.as_ref().map_or("", Failure::as_str);
        self.failing.as_ref().map(|(since, _)| (*since, last_error))
    }

    /// Notes a write that succeeded: ends an episode.
    pub(super) fn succeeded(&mut self, rt: &mut impl Runtime, now: Instant) {
        self.next_try = None;
        if let Some((since, first_error)) = self.failing.take() {
            rt.audit(Event::WriteRecovered { lasted: now.saturating_duration_since(since), first_error });
        }
    }

    /// When the next retry may run (`None`: no backoff pending).
    pub(super) fn next_try(&self) -> Option<Instant> {
        self.next_try
    }

    /// Whether a retry is due at `now`.
    pub(super) fn retry_due(&self, now: Instant) -> bool {
        self.next_try.is_none_or(|at| now >= at)
    }

    pub(super) fn is_failing(&self) -> bool {
        self.failing.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::testing::Recorder;

    #[test]
    fn an_episode_is_told_once_and_backs_off() {
        let mut rt = Recorder::default();
        let mut trouble = WriteTrouble::default();
        let now = Instant::now();
        assert!(trouble.retry_due(now));
        trouble.failed(&mut rt, now, "pki", &Failure::new("No space left on device (os error 28)"));
        assert!(!trouble.retry_due(now), "the first retry waits {FIRST_DELAY:?}");
        assert!(trouble.retry_due(now + FIRST_DELAY));
        for _ in 0..10 {
            trouble.failed(&mut rt, now, "pki", &Failure::new("No space left on device (os error 28)"));
        }
        assert_eq!(trouble.delay, MAX_DELAY);
        trouble.succeeded(&mut rt, now + Duration::from_secs(3));
        trouble.succeeded(&mut rt, now + Duration::from_secs(4));
        assert!(trouble.retry_due(now));
        let told: Vec<&str> = rt
            .events
            .iter()
            .map(|e| match e {
                Event::WriteFailed { .. } => "failed",
                Event::WriteRecovered { lasted, .. } => {
                    assert_eq!(*lasted, Duration::from_secs(3));
                    "recovered"
                }
                _ => "other",
            })
            .collect();
        assert_eq!(told, ["failed", "recovered"]);
    }

    /// Issue 29 item 2: a stuck agent said so once, then nothing. While the
    /// episode goes on it is told again once a minute, whatever the retries,
    /// with the latest error; `failing` says since when, for `status`.
    #[test]
    fn a_long_episode_is_told_again_once_a_minute() {
        let mut rt = Recorder::default();
        let mut trouble = WriteTrouble::default();
        let t0 = Instant::now();
        for s in 0..=150u64 {
            let error = if s < 100 { "No space left on device" } else { "Previous I/O error occurred" };
            trouble.failed(&mut rt, t0 + Duration::from_secs(s), "state store", &Failure::new(error));
        }
        let reminders: Vec<(Duration, &str)> = rt
            .events
            .iter()
            .filter_map(|e| match e {
                Event::WritesStillFailing { lasted, error } => Some((*lasted, error.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(
            reminders,
            [
                (Duration::from_secs(60), "state store: No space left on device"),
                (Duration::from_secs(120), "state store: Previous I/O error occurred")
            ]
        );
        let (since, error) = trouble.failing().unwrap();
        assert_eq!((since, error), (t0, "state store: Previous I/O error occurred"));
        trouble.succeeded(&mut rt, t0 + Duration::from_secs(151));
        assert!(trouble.failing().is_none());
    }
}
