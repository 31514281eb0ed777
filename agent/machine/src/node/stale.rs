//! A master out of contact for longer than `tombstone_ttl` (a standby
//! powered off for months, a master cut off from every peer) must not offer
//! its old decisions as live: its peers have forgotten the deletes it
//! missed (`cold.rs`), so its old accepts would meet nothing and bring
//! those keys back everywhere, whether offered as decisions or as
//! first-start claims.
//!
//! The node keeps the wall-clock time of its last completed comparison with
//! any peer ([`Node::on_contact`]), durably (rewritten at most hourly). At
//! start and at every tick it compares that time with `tombstone_ttl`; once
//! past it the node is *stale*, for good in this process and, since the
//! time no longer moves, at every later start: it offers nothing (no round,
//! an empty Diff answer, an empty Fetch answer), applies nothing from its
//! peers and judges no folder change. `salt-keysync plan` lists what
//! `salt-keysync rejoin` would set aside, and `rejoin` (the agent stopped)
//! sets the store and the decided keys aside, so that the agent starts
//! again as a new master that learns the site's state before it offers
//! any of its own.

use std::time::Duration;

use super::{Event, Node, Now, Runtime, StoreWrite};

/// The durable last contact is rewritten once it is this old: the store
/// sees one write an hour, and the check is that much early at most
/// (`tombstone_ttl` is a day at the least).
const RECORD_EVERY_MS: u64 = 3_600_000;

/// Why a node offers nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stale {
    /// The last completed comparison with any peer (wall-clock ms).
    pub last_contact_ms: u64,
    /// When the node found it so long ago.
    pub found_ms: u64,
    pub ttl: Duration,
}

#[derive(Debug, Default)]
pub(super) struct Contact {
    /// The last completed comparison with any peer, in memory.
    last_ms: Option<u64>,
    /// As the store has it.
    recorded_ms: Option<u64>,
    stale: Option<Stale>,
}

impl Contact {
    pub(super) fn loaded(last_ms: Option<u64>) -> Contact {
        Contact { last_ms, recorded_ms: last_ms, stale: None }
    }
}

impl Node {
    /// This node's link finished comparing digests with a peer: whatever
    /// the peer had not forgotten, this node now knows of (or fetches).
    /// Ignored once stale: only `rejoin` ends that.
    pub fn on_contact(&mut self, now: Now, rt: &mut impl Runtime) {
        self.seen = now.mono;
        if self.contact.stale.is_some() || self.settings.observe {
            return;
        }
        self.contact.last_ms = Some(self.contact.last_ms.map_or(now.wall_ms, |last| last.max(now.wall_ms)));
        let due = self.contact.recorded_ms.is_none_or(|at| now.wall_ms.saturating_sub(at) >= RECORD_EVERY_MS);
        if due {
            let write = StoreWrite { contact: Some(now.wall_ms), clock: self.replica.clock(), ..StoreWrite::default() };
            // A failed write is tried again at the next contact.
            if rt.record(&write).is_ok() {
                self.contact.recorded_ms = Some(now.wall_ms);
            }
        }
    }

    /// Why this node offers nothing, if it does not.
    pub fn stale(&self) -> Option<Stale> {
        self.contact.stale
    }

    pub(super) fn is_stale(&self) -> bool {
        self.contact.stale.is_some()
    }

    /// Becomes stale when the last contact is older than `tombstone_ttl`.
    pub(super) fn check_stale(&mut self, now: Now, rt: &mut impl Runtime) {
        if self.contact.stale.is_some() || self.settings.observe {
            return;
        }
        let Some(last) = self.contact.last_ms else { return };
        let ttl = self.settings.stale_after;
        if now.wall_ms.saturating_sub(last) <= ttl.as_millis() as u64 {
            return;
        }
        let stale = Stale { last_contact_ms: last, found_ms: now.wall_ms, ttl };
        self.contact.stale = Some(stale);
        // Nothing judged or waiting is carried on: it would be offered or
        // applied later as if nothing had happened. The folders are what
        // `rejoin` sets aside.
        self.retry.clear();
        self.deferred.clear();
        self.retry_settling.clear();
        self.rescan_pending = false;
        rt.audit(Event::Stale { stale });
        rt.flush_audit();
    }
}
