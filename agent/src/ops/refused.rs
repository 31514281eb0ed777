//! Decisions peers sent that this master refused, counted per peer and
//! cause for `status`: since the agent started, and over the last hour, so
//! that a finding about a peer ends an hour after its last refusal.
//!
//! Two causes: a decision made in the future (its hybrid clock further
//! ahead of this master's than `max_clock_skew`: the sending master's clock,
//! or its origin's, runs ahead), and every other (invalid fields, an origin
//! that is no master of the site, this master claimed as the origin). The
//! audit log has each refusal (ten a minute per peer, then counted); the
//! metrics count them all in `keysync_decisions_refused_total`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use keysync_machine::node::Event;

/// The window a finding looks at.
pub const WINDOW: Duration = Duration::from_secs(3600);
/// One bucket of the window.
const BUCKET: Duration = Duration::from_secs(60);
const N_BUCKETS: usize = (WINDOW.as_secs() / BUCKET.as_secs()) as usize;
/// Peers counted: the configured ones, and peers removed by a reload; past
/// this, a new name is not counted (a bound, not a limit any site reaches).
const MAX_PEERS: usize = 256;

/// Why a peer's decision was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cause {
    /// Made in the future: further ahead than `max_clock_skew`.
    Clock,
    /// Invalid, from no master of the site, or claiming this master as origin.
    Other,
}

/// The refusals of one peer for one cause, as `status --json` shows them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerRefusals {
    /// The peer that sent them (the authenticated link, not an origin it names).
    pub peer: String,
    pub cause: Cause,
    /// Within the last hour.
    pub last_hour: u64,
    /// Since this agent started.
    pub since_start: u64,
}

struct Tally {
    since_start: u64,
    /// Per bucket of the window, ring-indexed: (bucket number, count).
    buckets: [(u64, u64); N_BUCKETS],
}

impl Default for Tally {
    fn default() -> Tally {
        Tally { since_start: 0, buckets: [(0, 0); N_BUCKETS] }
    }
}

impl Tally {
    fn add(&mut self, bucket: u64, n: u64) {
        self.since_start = self.since_start.saturating_add(n);
        let slot = &mut self.buckets[(bucket % N_BUCKETS as u64) as usize];
        if slot.0 != bucket {
            *slot = (bucket, 0);
        }
        slot.1 = slot.1.saturating_add(n);
    }

    /// Refusals in the `N_BUCKETS` buckets up to and including `bucket`.
    fn last_hour(&self, bucket: u64) -> u64 {
        let oldest = bucket.saturating_sub(N_BUCKETS as u64 - 1);
        self.buckets.iter().filter(|(b, _)| (oldest..=bucket).contains(b)).map(|(_, n)| n).sum()
    }
}

/// Shared by the core task (a peer's decisions refused by the node) and
/// the RPC handler (decisions refused as they arrive).
pub struct Refused {
    start: Instant,
    tallies: Mutex<BTreeMap<(String, Cause), Tally>>,
}

impl Default for Refused {
    fn default() -> Refused {
        Refused { start: Instant::now(), tallies: Mutex::default() }
    }
}

impl std::fmt::Debug for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Refused")
    }
}

impl Refused {
    /// `n` decisions from `peer` refused for `cause`, now.
    pub fn count(&self, peer: &str, cause: Cause, n: u64) {
        self.count_at(peer, cause, n, Instant::now());
    }

    /// Counts the refusal `event` tells, if it tells one.
    pub fn count_event(&self, event: &Event) {
        match event {
            Event::FromTheFuture { from, .. } => self.count(from, Cause::Clock, 1),
            Event::NotOurs { from, .. } => self.count(from, Cause::Other, 1),
            Event::UnknownOrigins { from, n, .. } => self.count(from, Cause::Other, *n as u64),
            _ => {}
        }
    }

    fn bucket(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.start).as_secs() / BUCKET.as_secs()
    }

    fn count_at(&self, peer: &str, cause: Cause, n: u64, at: Instant) {
        let bucket = self.bucket(at);
        let mut tallies = self.tallies.lock().unwrap_or_else(|p| p.into_inner());
        let key = (peer.to_string(), cause);
        if !tallies.contains_key(&key) && tallies.len() >= MAX_PEERS * 2 {
            return;
        }
        tallies.entry(key).or_default().add(bucket, n);
    }

    /// Every peer and cause refused since start, by peer name.
    pub fn snapshot(&self) -> Vec<PeerRefusals> {
        self.snapshot_at(Instant::now())
    }

    fn snapshot_at(&self, at: Instant) -> Vec<PeerRefusals> {
        let bucket = self.bucket(at);
        let tallies = self.tallies.lock().unwrap_or_else(|p| p.into_inner());
        tallies
            .iter()
            .map(|((peer, cause), tally)| PeerRefusals {
                peer: peer.clone(),
                cause: *cause,
                last_hour: tally.last_hour(bucket),
                since_start: tally.since_start,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_per_peer_and_cause_over_the_last_hour_and_since_start() {
        let refused = Refused::default();
        let t0 = refused.start;
        let minute = |m: u64| t0 + Duration::from_secs(60 * m);
        refused.count_at("master-b", Cause::Clock, 2, minute(0));
        refused.count_at("master-b", Cause::Clock, 1, minute(30));
        refused.count_at("master-b", Cause::Other, 5, minute(30));
        refused.count_at("master-c", Cause::Other, 1, minute(59));
        let at = |m: u64| -> Vec<(String, Cause, u64, u64)> {
            refused.snapshot_at(minute(m)).into_iter().map(|r| (r.peer, r.cause, r.last_hour, r.since_start)).collect()
        };
        let b = "master-b".to_string();
        let c = "master-c".to_string();
        assert_eq!(
            at(59),
            [(b.clone(), Cause::Clock, 3, 3), (b.clone(), Cause::Other, 5, 5), (c.clone(), Cause::Other, 1, 1)]
        );
        // An hour on, minute 0 has left the window; minute 30 leaves it at 90.
        assert_eq!(
            at(60),
            [(b.clone(), Cause::Clock, 1, 3), (b.clone(), Cause::Other, 5, 5), (c.clone(), Cause::Other, 1, 1)]
        );
        assert_eq!(
            at(90),
            [(b.clone(), Cause::Clock, 0, 3), (b.clone(), Cause::Other, 0, 5), (c.clone(), Cause::Other, 1, 1)]
        );
        // A bucket reused a window later starts from nothing.
        refused.count_at("master-b", Cause::Clock, 4, minute(120));
        assert_eq!(at(120)[0], (b, Cause::Clock, 4, 7));
        assert_eq!(at(200)[2], (c, Cause::Other, 0, 1));
    }

    #[test]
    fn a_bounded_number_of_peers() {
        let refused = Refused::default();
        for i in 0..MAX_PEERS * 3 {
            refused.count(&format!("peer-{i}"), Cause::Clock, 1);
        }
        assert_eq!(refused.snapshot().len(), MAX_PEERS * 2);
        refused.count("peer-0", Cause::Clock, 1);
        assert_eq!(refused.snapshot().iter().find(|r| r.peer == "peer-0").unwrap().since_start, 2);
    }
}
