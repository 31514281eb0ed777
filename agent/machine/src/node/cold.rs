//! Plain tombstones (deletes with no claim known about their id) live in the
//! store, not in memory: a peer pushing deletes of 500,000 made-up ids held
//! 200 MiB here. The replica counts them per digest bucket; before the node
//! decides anything about an id that may be one of them, it reads it back
//! ([`Node::warm`]), and once a call is done it leaves them to the store
//! again ([`Replica::cool`](crate::core::replica::Replica::cool)). They are
//! compacted once older than `tombstone_ttl` ([`Node::compact_due`]).

use std::time::Duration;

use crate::core::{Decision, MinionId};

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

    /// Ends a call: the plain tombstones it made or read back are left to the store.
    pub(super) fn cool(&mut self) {
        self.replica.cool();
    }

    /// Whether a peer's `decision` is a delete past `tombstone_ttl` of an id
    /// held neither in memory nor in the store (warmed first): compacted
    /// everywhere by now, or about to be, it has nothing to delete here.
    pub(super) fn compacted(&self, decision: &Decision, now: Now) -> bool {
        decision.verdict.kind() == crate::core::VerdictKind::Deleted
            && decision.version.millis().saturating_add(self.ttl_ms()) < now.wall_ms
            && self.replica.entry(&decision.id).is_none()
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.settings.tombstone_ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// Forgets plain tombstones issued more than `tombstone_ttl` ago, a
    /// chunk per call, when due.
    pub(super) fn compact_due(&mut self, now: Now, rt: &mut impl Runtime) {
        if now.mono < self.next_compact {
            return;
        }
        self.next_compact = now.mono + COMPACT_EVERY;
        let before_ms = now.wall_ms.saturating_sub(self.ttl_ms());
        match rt.compact(before_ms, COMPACT_CHUNK) {
            Ok(ids) => {
                if ids.len() == COMPACT_CHUNK {
                    // More to forget: the next chunk at the next tick.
                    self.next_compact = now.mono;
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
