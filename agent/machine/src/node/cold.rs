//! Plain tombstones (deletes with no claim known about their id) live in the
//! store, not in memory: a peer pushing deletes of 500,000 made-up ids held
//! 200 MiB here. The replica counts them per digest bucket; before the node
//! decides anything about an id that may be one of them, it reads it back
//! ([`Node::warm`]), and once a call is done it leaves them to the store
//! again ([`Replica::cool`](crate::core::replica::Replica::cool)). They are
//! compacted once older than `tombstone_ttl` ([`Node::compact_due`]).

use std::time::Duration;

use crate::core::{Decision, MinionId};

/// Most plain tombstones read back from the store for one Diff answer. Past
/// it the answer carries none: this master's own round pushes each one to
/// a peer that names its id, so nothing is lost, and a flood of deletes
/// does not come back into memory all at once.
pub(super) const MAX_COLD_IN_DIFF: usize = 20_000;

use super::event::Event;
use super::runtime::{Failure, Runtime};
use super::{Node, Now};

/// Most plain tombstones one compaction forgets (one store commit); the
/// next follows at once while there are more.
pub(super) const COMPACT_CHUNK: usize = 10_000;

/// How often the store is searched for plain tombstones past their time.
pub(super) const COMPACT_EVERY: Duration = Duration::from_secs(3600);

impl Node {
    /// Reads back from the store the plain tombstones among `ids` (those
    /// not held in memory whose bucket has some), so that what is decided
    /// about them knows them. Told and returned when the store cannot be read.
    pub(super) fn warm<'a>(
        &mut self,
        ids: impl IntoIterator<Item = &'a MinionId>,
        rt: &mut impl Runtime,
    ) -> Result<(), Failure> {
        if self.replica.n_cold() == 0 {
            return Ok(());
        }
        let mut wanted: Vec<MinionId> = ids.into_iter().filter(|id| self.replica.may_be_cold(id)).cloned().collect();
        if wanted.is_empty() {
            return Ok(());
        }
        wanted.sort_unstable();
        wanted.dedup();
        match rt.load_cold(&wanted) {
            Ok(found) => {
                for (id, entry) in found {
                    self.replica.warm(id, entry);
                }
                Ok(())
            }
            Err(error) => {
                rt.audit(Event::ColdFailed { error: error.clone() });
                Err(error)
            }
        }
    }

    /// Tombstones a decision needed could not be read: the store is tried
    /// again after the write backoff (`retry_failed`, which rescans the
    /// folders first).
    pub(super) fn retry_after_cold_failure(&mut self, error: &Failure, now: Now, rt: &mut impl Runtime) {
        self.trouble.failed(rt, now.mono, "state store, reading tombstones", error);
        self.waiting.rescan_pending = true;
    }

    /// Ends a call: the plain tombstones it made or read back are left to the store.
    pub(super) fn cool(&mut self) {
        self.replica.cool();
    }

    /// Whether a peer's `decision` is a delete past `tombstone_ttl` of an id
    /// held neither in memory nor in the store (warmed first), made knowing
    /// no claim: compacted everywhere by now, or about to be, it has
    /// nothing to delete here. (A delete that knew a claim is never
    /// compacted: a master joining late may be sent the claim with it.)
    pub(super) fn compacted(&self, decision: &Decision, now: Now) -> bool {
        decision.verdict.kind() == crate::core::VerdictKind::Deleted
            && self.past_ttl(&decision.version, now)
            && decision.context.iter().all(|known| !known.is_claim())
            && self.replica.entry(&decision.id).is_none()
    }

    /// Whether `version` was issued longer than `tombstone_ttl` before `now`.
    pub(super) fn past_ttl(&self, version: &crate::core::Version, now: Now) -> bool {
        version.millis().saturating_add(self.ttl_ms()) < now.wall_ms
    }

    pub(super) fn ttl_ms(&self) -> u64 {
        u64::try_from(self.settings.tombstone_ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// Forgets plain tombstones issued more than `tombstone_ttl` ago, a
    /// chunk per call, when due.
    pub(super) fn compact_due(&mut self, now: Now, rt: &mut impl Runtime) {
        if now.mono < self.waiting.next_compact {
            return;
        }
        self.waiting.next_compact = now.mono + COMPACT_EVERY;
        let before_ms = now.wall_ms.saturating_sub(self.ttl_ms());
        match rt.compact(before_ms, COMPACT_CHUNK) {
            Ok(compacted) => {
                for (_, version) in &compacted {
                    self.forgot(version);
                }
                let ids: Vec<MinionId> = compacted.into_iter().map(|(id, _)| id).collect();
                if ids.len() == COMPACT_CHUNK {
                    // More to forget: the next chunk at the next tick.
                    self.waiting.next_compact = now.mono;
                }
                if !ids.is_empty() {
                    self.replica.forget_cold(&ids);
                    rt.audit(Event::Compacted { n: ids.len(), before_ms });
                }
            }
            Err(error) => rt.audit(Event::ColdFailed { error }),
        }
    }
}
