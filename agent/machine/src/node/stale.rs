//! A master that missed deletes its peers have since forgotten (a standby
//! powered off for longer than `tombstone_ttl`, a master cut off that long)
//! must not offer its old decisions as live: its old accepts would meet
//! nothing and bring those keys back everywhere, whether offered as
//! decisions or as first-start claims.
//!
//! Two times decide it, both kept in the store:
//! - this node's *last contact*: its last completed digest comparison with
//!   any peer, or the last decisions a peer sent it ([`Node::on_contact`],
//!   rewritten at most hourly, and at once when it follows a peer's delete
//!   made after the contact on record); whatever its peers held then, it
//!   knows of;
//! - each master's *forgot-through*: when the newest delete it compacted
//!   was made (`cold.rs`), told to every peer in `Hello`, both ways, before
//!   any Diff or push on the link.
//!
//! A peer that forgot a delete made after this node's last contact may have
//! forgotten one this node never heard of ([`Node::on_peer_forgot`]): this
//! node is then *stale*, for the rest of its run and again at the next
//! `Hello` after a restart. It offers nothing (no round, an empty Diff
//! answer, an empty Fetch answer), applies nothing from its peers and
//! judges no folder change. `salt-keysync plan` lists what `salt-keysync
//! rejoin` sets aside, and `rejoin` (the agent stopped) sets the store and
//! the decided keys aside, so that the agent starts again as a new master.
//!
//! A master that ran alone is not stale: its peer, off meanwhile, forgot
//! nothing it had not told it (the peer's forgot-through is older than this
//! master's last contact with it).

use std::sync::Arc;

use crate::PeerName;

use super::{Event, Node, Now, Runtime, StoreWrite};
use crate::core::{Decision, VerdictKind, Version};

/// The durable last contact is rewritten once it is this old, or a 24th of
/// `tombstone_ttl` if that is shorter (the simulation's is seconds): the
/// store sees one write an hour. After a restart the contact is that much
/// older than it was; a peer forgets a delete `tombstone_ttl` (a day at the
/// least) after it was made, so that is far inside it. But the contact that
/// brought a peer's delete made after the contact on record is kept at once
/// (deletes are rare): a master stopped within the hour after hearing a
/// delete, and started again once a peer forgot it, is not found stale for
/// a delete it holds. (One deferred behind a salt-key run, merged later,
/// is kept at the next contact.)
const RECORD_EVERY_MS: u64 = 3_600_000;

/// Why a node offers nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stale {
    /// The last completed comparison with any peer (wall-clock ms).
    pub last_contact_ms: u64,
    /// The peer that told it had forgotten a newer delete.
    pub peer: PeerName,
    /// When that peer's newest forgotten delete was made.
    pub peer_forgot_ms: u64,
}

#[derive(Debug, Default)]
pub(super) struct Contact {
    /// The last completed comparison with any peer, in memory.
    last_ms: Option<u64>,
    /// As the store has it.
    recorded_ms: Option<u64>,
    /// When the newest delete of another master merged here in this run
    /// was made: the next contact is kept at once if that is after the
    /// contact on record.
    merged_delete_ms: u64,
    /// Per origin, when the newest delete this node compacted was made.
    forgot: Vec<(Arc<str>, u64)>,
    stale: Option<Stale>,
}

impl Contact {
    pub(super) fn loaded(last_ms: Option<u64>, forgot: Vec<(Arc<str>, u64)>) -> Contact {
        Contact { last_ms, recorded_ms: last_ms, merged_delete_ms: 0, forgot, stale: None }
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
        // On the hybrid clock, which is past every version this node has
        // seen: a peer's clock running ahead does not make what it sent look
        // newer than this contact.
        let at = now.wall_ms.max(self.replica.clock() >> crate::core::version::LOGICAL_BITS);
        self.contact.last_ms = Some(self.contact.last_ms.map_or(at, |last| last.max(at)));
        let every = RECORD_EVERY_MS.min(self.settings.tombstone_ttl.as_millis() as u64 / 24);
        let due = self
            .contact
            .recorded_ms
            .is_none_or(|was| at.saturating_sub(was) >= every || self.contact.merged_delete_ms > was);
        if due {
            let write = StoreWrite { contact: Some(at), clock: self.replica.clock(), ..StoreWrite::default() };
            // A failed write is tried again at the next contact.
            if rt.record(&write).is_ok() {
                self.contact.recorded_ms = Some(at);
            }
        }
    }

    /// A peer said (in `Hello`) when the newest delete it forgot was made.
    /// Newer than this node's last contact: this node may have missed it,
    /// and becomes stale. A node never in contact (a first start, or a
    /// store of a release before this check) has nothing to go by.
    pub fn on_peer_forgot(&mut self, peer: &PeerName, forgot_ms: u64, now: Now, rt: &mut impl Runtime) {
        self.seen = now.mono;
        if self.contact.stale.is_some() || self.settings.observe {
            return;
        }
        let Some(last_contact_ms) = self.contact.last_ms else { return };
        if forgot_ms <= last_contact_ms {
            return;
        }
        let stale = Stale { last_contact_ms, peer: peer.clone(), peer_forgot_ms: forgot_ms };
        self.contact.stale = Some(stale.clone());
        // Nothing judged or waiting is carried on: it would be offered or
        // applied later as if nothing had happened. The folders are what
        // `rejoin` sets aside.
        self.waiting.retry.clear();
        self.waiting.deferred.clear();
        self.waiting.retry_settling.clear();
        self.waiting.rescan_pending = false;
        // Its listing is memory (tens of MiB at 1,000,000 keys) nothing reads again.
        self.waiting.rescanning = None;
        rt.audit(Event::Stale { stale });
        rt.flush_audit();
    }

    /// When the newest delete this node forgot was made, for `peer`: of the
    /// deletes it did not make itself (it knows its own).
    pub fn forgot_through(&self, peer: &PeerName) -> u64 {
        self.contact
            .forgot
            .iter()
            .filter(|(origin, _)| **origin != *peer.as_str())
            .map(|(_, ms)| *ms)
            .max()
            .unwrap_or(0)
    }

    /// Why this node offers nothing, if it does not.
    pub fn stale(&self) -> Option<&Stale> {
        self.contact.stale.as_ref()
    }

    pub(super) fn is_stale(&self) -> bool {
        self.contact.stale.is_some()
    }

    /// A peer's decision was merged here (whether it holds, loses a
    /// conflict or waits for the guard): a delete made by another master
    /// has the next contact kept at once if it is newer than the contact on
    /// record (this node's own deletes are not in what its peers tell it
    /// they forgot).
    pub(super) fn merged_delete(&mut self, decision: &Decision) {
        if decision.verdict.kind() == VerdictKind::Deleted && *decision.version.node != *self.settings.node {
            self.contact.merged_delete_ms = self.contact.merged_delete_ms.max(decision.version.millis());
        }
    }

    /// Compaction forgot the delete of `version` (the store keeps it too).
    pub(super) fn forgot(&mut self, version: &Version) {
        crate::core::version::note_forgotten(&mut self.contact.forgot, &version.node, version.millis());
    }
}
