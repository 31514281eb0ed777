//! A peer's refusals, aggregated: whatever an authenticated peer sends
//! (invalid decisions, decisions naming a stranger as origin, requests the
//! transport refuses), it adds at most [`TOLD_PER_WINDOW`] `refuse` records
//! per [`WINDOW`] to the audit log, then one record with the count of the
//! rest and the last reason. Strangers' refusals are counted the same way by
//! the transport (per source address); local ones are told once per file.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use keysync_machine::PeerName;

use super::Record;
use super::{Action, Outcome, Via};

/// How long a peer's refusals are counted together.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Refusals of one peer told in full within a window; the rest are counted.
pub const TOLD_PER_WINDOW: u32 = 10;

/// One peer's refusals in the current window.
#[derive(Debug)]
struct Window {
    start: Instant,
    told: u32,
    more: u64,
    last_reason: String,
}

/// The peers' refusal windows (keyed by the peer, `via`).
#[derive(Debug, Default)]
pub struct PeerRefusals {
    windows: BTreeMap<String, Window>,
}

/// Whether `record` is a peer's refusal: `refuse` / `refused` via a peer
/// (not this master's own files, `local`, nor strangers, `network`).
fn is_peers_refusal(record: &Record) -> bool {
    record.action == "refuse" && record.outcome == "refused" && record.via != "local" && record.via != "network"
}

impl PeerRefusals {
    /// Whether `record` is written: anything but a peer's refusal, and a
    /// peer's first [`TOLD_PER_WINDOW`] refusals of a window.
    pub fn admit(&mut self, record: &Record, now: Instant) -> bool {
        if !is_peers_refusal(record) {
            return true;
        }
        let window = self.windows.entry(record.via.clone()).or_insert_with(|| Window {
            start: now,
            told: 0,
            more: 0,
            last_reason: String::new(),
        });
        if window.told < TOLD_PER_WINDOW {
            window.told += 1;
            return true;
        }
        window.more += 1;
        window.last_reason = record.reason.clone().unwrap_or_default();
        false
    }

    /// The records of windows that ended by `now` (all of them with `all`, at
    /// a stop): one per peer that had refusals beyond what was told.
    pub fn ended(&mut self, now: Instant, all: bool) -> Vec<Record> {
        let mut summaries = Vec::new();
        self.windows.retain(|peer, window| {
            if !all && now.saturating_duration_since(window.start) < WINDOW {
                return true;
            }
            if window.more > 0 {
                // The name of records this agent made with `Via::Peer`.
                let peer = PeerName::trusted(peer.as_str());
                summaries.push(Record {
                    reason: Some(format!(
                        "{} more refusals of what {peer} sent in {}s (the first {TOLD_PER_WINDOW} of a window are \
                         told one by one; last: {})",
                        window.more,
                        WINDOW.as_secs(),
                        window.last_reason
                    )),
                    ..Record::new(Action::Refuse, Via::Peer(&peer), Outcome::Refused)
                });
            }
            false
        });
        summaries
    }

    /// Whether a window is open (a later call of [`PeerRefusals::ended`] may
    /// have something to tell).
    pub fn is_counting(&self) -> bool {
        !self.windows.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(peer: &str, n: u32) -> Record {
        Record {
            reason: Some(format!("invalid {n}")),
            ..Record::new(Action::Refuse, Via::Peer(&keysync_machine::testkit::peer(peer)), Outcome::Refused)
        }
    }

    /// However much a peer sends, a window tells ten and then one count.
    #[test]
    fn a_flood_is_ten_records_and_a_count_per_window() {
        let mut r = PeerRefusals::default();
        let t0 = Instant::now();
        let told = (0..100_000).filter(|&n| r.admit(&refusal("master-c", n), t0)).count();
        assert_eq!(told, 10);
        assert!(r.ended(t0 + Duration::from_secs(59), false).is_empty(), "the window is still open");
        let summaries = r.ended(t0 + WINDOW, false);
        assert_eq!(summaries.len(), 1);
        let reason = summaries[0].reason.as_deref().unwrap();
        assert!(reason.starts_with("99990 more refusals of what master-c sent in 60s"), "{reason}");
        assert!(reason.ends_with("last: invalid 99999)"), "{reason}");
        assert_eq!((summaries[0].via.as_str(), summaries[0].outcome.as_str()), ("master-c", "refused"));
        assert!(!r.is_counting());
        assert!(r.admit(&refusal("master-c", 0), t0 + WINDOW), "a new window tells again");
    }

    /// Each peer has its own window; other records are never held back.
    #[test]
    fn peers_are_counted_apart_and_other_records_pass() {
        let mut r = PeerRefusals::default();
        let t0 = Instant::now();
        for n in 0..20 {
            r.admit(&refusal("master-c", n), t0);
        }
        assert!(r.admit(&refusal("master-b", 0), t0), "master-b's first is told");
        assert!(r.admit(&Record::new(Action::Refuse, Via::Local, Outcome::Refused), t0));
        assert!(r.admit(&Record::new(Action::Refuse, Via::Network, Outcome::Refused), t0));
        assert!(r.admit(
            &Record::new(Action::Accept, Via::Peer(&keysync_machine::testkit::peer("master-c")), Outcome::Applied),
            t0
        ));
        assert!(r.ended(t0, true).iter().all(|s| s.via == "master-c"), "master-b had nothing more");
    }
}
