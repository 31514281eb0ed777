//! What happened, as the node machine tells it: one typed event per thing an
//! operator, a log reader or a metric may care about. The executor turns
//! each into its audit record, log line and metric in one place, instead of
//! every decision point building records by hand.

use std::sync::Arc;
use std::time::Duration;

use crate::core::merge::Conflict;
use crate::core::version::SkewError;
use crate::core::{Decision, Fingerprint, Folder, MinionId, Version};
use crate::PeerName;

use super::runtime::Failure;

/// Why a local decision was found other than by a folder event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// By a rescan (periodic, or after lost events or a failed write).
    Rescan,
    /// At start-up: changed while the agent was stopped.
    WhileStopped,
    /// At the agent's very first start.
    FirstStart,
}

impl Found {
    pub fn describe(self) -> &'static str {
        match self {
            Found::Rescan => "found by rescan",
            Found::WhileStopped => "changed while the agent was stopped",
            Found::FirstStart => "found at first start",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A file in a key folder that is not a usable key (audited once per reason).
    Refused { folder: Folder, name: String, id: Option<MinionId>, reason: String },
    /// A new pending key (or a pending key that changed).
    PendingSeen { id: MinionId, fingerprint: Fingerprint },
    /// An operator's decision on this master, durable and about to be sent.
    Decided { decision: Decision, found: Option<Found> },
    /// A peer's decision applied here (`from`: the peer, or "journal");
    /// `replaced`: the accepted key it replaced with another accepted key.
    Applied { decision: Decision, from: PeerName, replaced: Option<Fingerprint> },
    /// A peer's decision claiming to have known a decision of this node that
    /// this node never made: the claim is dropped (a conflict it would hide
    /// is told).
    Doubted { decision: Decision, from: PeerName, claimed: Version },
    /// A peer's decision claiming this node as its origin, which this node
    /// never made: refused (told once).
    NotOurs { decision: Decision, from: PeerName },
    /// Decisions in one arrival from `from` naming this node as their
    /// origin, made before its store started afresh at `afresh_ms` (wall
    /// clock) and unknown to it: its own, forgotten with its old store,
    /// taken back (merged like any peer's), `n` of them (`first`: one id).
    TakenBack { from: PeerName, n: usize, first: MinionId, afresh_ms: u64 },
    /// Decisions in one arrival from `from` whose origin is no master of the
    /// site: refused, `n` of them, naming `n_origins` origins (`origins`:
    /// the first few; `first`: one id).
    UnknownOrigins { from: PeerName, n: usize, n_origins: usize, origins: Vec<Arc<str>>, first: MinionId },
    /// A peer's decision for an id whose own events are still settling (a
    /// salt-key run in progress here), or for any id while the folders are
    /// read again after lost events: merged once they have settled.
    Deferred { id: MinionId, from: PeerName },
    /// A peer's decision older than the one held.
    Superseded { decision: Decision, from: PeerName, held: Version },
    /// A peer's decision whose version is beyond the clock-skew bound (audited once).
    FromTheFuture { decision: Decision, from: PeerName, error: SkewError },
    /// Two decisions about one id made without knowledge of each other, that
    /// disagree (or one version carried with two contents): told exactly
    /// once on each master that sees both.
    Conflict { conflict: Conflict, from: PeerName },
    /// A different pending key discarded for the decided one.
    PendingDiscarded {
        id: MinionId,
        from: PeerName,
        origin: Arc<str>,
        pending: Fingerprint,
        decided: Option<Fingerprint>,
    },
    /// `.dfn` dropped: the master rotates its AES key (revoked minions are cut off).
    Rotated,
    /// `.dfn` could not be dropped: revoked minions stay connected until the next rotation.
    RotateFailed { error: Failure },
    /// A write failed; nothing recorded, retried with backoff (once per episode).
    WriteFailed { what: String, error: Failure },
    /// Writes succeed again after an episode of failures.
    WriteRecovered { lasted: Duration, first_error: Failure },
    /// Writes still fail, `lasted` into the episode (told at most once a
    /// minute while it goes on; logged, not audited).
    WritesStillFailing { lasted: Duration, error: Failure },
    /// Inotify events were lost: every name is read again once settled.
    EventsLost { why: String, n_names: usize },
    /// A rescan found changes no event reported.
    RescanFound { n: usize, why: String },
    /// The folders could not be listed for a scan.
    ListFailed { error: Failure },
    /// What this master held at its agent's first start (its claims), told
    /// once instead of one record per key.
    Inventory { held: super::Held },
    /// A peer's decision (a claim, or a live decision meeting one) after
    /// which this master's folders show something other than it, by the
    /// rules of first contact (`claims.rs`): what they show now (`None`: no
    /// key decided), whether that took a write, and why.
    Kept { decision: Decision, from: PeerName, shows: Option<crate::core::Seen>, wrote: bool, why: &'static str },
    /// Start-up reconciliation finished.
    Reconciled { n_held: usize, n_found: usize, found: Found },
    /// Decisions journalled before a stop are being finished.
    FinishingJournal { n: usize },
    /// A journalled decision not finished: its id's files changed after it
    /// was journalled (an operator's change, read as a decision instead).
    JournalCovered { decision: Decision },
    /// Decisions a peer asked for could not be read from the store.
    LoadFailed { error: Failure },
    /// Plain tombstones kept in the store could not be read or compacted
    /// (what needed them waits: a peer's decisions come again, a folder
    /// change is read again at the next rescan).
    ColdFailed { error: Failure },
    /// Plain tombstones issued before `before_ms` were forgotten (`tombstone_ttl`).
    Compacted { n: usize, before_ms: u64 },
    /// A burst of deletes of accepted keys from the peer `via` (the link,
    /// authenticated) went past the guard's limit: held here, with every
    /// later one from that link until it has been quiet for a window. With
    /// `forwarded`, the deletes it forwarded (made elsewhere) went past the
    /// whole master's limit instead (`first`: the first ids held).
    DeletesHeld { via: PeerName, forwarded: bool, n: usize, limit: usize, first: Vec<MinionId> },
    /// A peer's delete let through before its burst went past the limit
    /// (slower than `quiet`) was put back: the key written again from what
    /// this master kept, and the delete held with the burst.
    PutBack { held: super::HeldDelete, key: Fingerprint },
    /// A held burst's link has been quiet for a window: `n` deletes held in all.
    HoldEnded { via: PeerName, n: usize },
    /// This master's operator deleted more accepted keys than the guard lets
    /// through: the peers hold these deletes until released or reverted.
    MassDeleteHere { n: usize, limit: usize },
    /// A held delete settled without an operator here.
    HeldSettled { held: super::HeldDelete, how: Settled },
    /// An operator here released or reverted a held delete: `decision` is
    /// the new decision that does it everywhere.
    Operator { action: super::OperatorAction, decision: Decision, by: String, held: super::HeldDelete },
    /// Deletes held before the agent stopped, held still.
    StillHeld { n: usize, origins: Vec<Arc<str>> },
    /// The last contact with any peer is older than `tombstone_ttl`: this
    /// master offers nothing until `rejoin` (`stale.rs`).
    Stale { stale: super::Stale },
}

/// How a held delete settled without an operator here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settled {
    /// A newer decision about the id (or one that knew the held delete:
    /// an operator's release or revert on another master) is held now.
    By(crate::core::Seen),
    /// The key is no longer accepted here: the delete is applied as any other.
    NotAccepted,
    /// Held as forwarded by one peer, the very delete then came from its
    /// origin: judged again with the origin's own deletes.
    Rejudged,
}
