//! What waits, in one place: the node's waiting work and its timers
//! ([`Waiting`]), and the one answer to what waits and when it is next due
//! ([`Node::waits`]), which [`Node::on_tick`], [`Node::poll_at`] and
//! [`Node::is_quiet`] all read (three hand-kept checks disagreed: held
//! deletes the store could not keep were quiet, deferred decisions and keys
//! put back could wait with nothing due to wake them).
//!
//! What waits: peers' decisions whose write failed (retried with backoff,
//! still the agent's own writes to the rescan), decisions waiting for a
//! salt-key run or for the operators' unrecorded changes to be recorded
//! (deferred), and the journal of decisions a stop interrupted, finished at
//! the next start unless the files changed since.

use std::collections::HashSet;

use crate::PeerName;
use std::time::Instant;

use crate::core::merge::MergeOutcome;
use crate::core::{Decision, MinionId, Seen, VerdictKind};

use super::event::Event;
use super::remote::{by_peer, Merged, Source};
use super::runtime::{Runtime, StoreWrite};
use super::{FromPeer, Node, Now};

/// The node's waiting work and its timers. The settler's unsettled names,
/// the guard's and the write backoff are kept by those; [`Node::waits`]
/// reads them all.
#[derive(Debug)]
pub(super) struct Waiting {
    /// Peers' decisions whose files could not be written; retried.
    pub retry: Vec<FromPeer>,
    /// Peers' decisions for ids whose own events were still settling (a
    /// salt-key run in progress), for an id whose write waits for its retry,
    /// or waiting for the operators' unrecorded changes to be recorded.
    pub deferred: Vec<FromPeer>,
    /// Retried writes (possibly on disk) of ids a salt-key run is working
    /// on: still the agent's own writes, retried once the id has settled.
    pub retry_settling: Vec<FromPeer>,
    /// Local decisions could not be made durable: the folders are scanned
    /// again when the backoff allows.
    pub rescan_pending: bool,
    /// The journal a stop left, not finished yet: its tombstones could not
    /// be read at start-up (finished by `retry_failed`).
    pub journal: Vec<Decision>,
    /// Keys put back (`put_back.rs`) whose files are not written yet, as
    /// the store lists them.
    pub putting_back: Vec<MinionId>,
    /// The store's list of keys put back could not be written after their
    /// files were: written again at the retry (else the next start would
    /// write back a key an operator deleted meanwhile).
    pub put_back_uncleared: bool,
    /// When every name is next compared with the store anyway.
    pub next_rescan: Instant,
    /// The periodic rescan under way, read a step at a time.
    pub(super) rescanning: Option<super::local::Rescanning>,
    /// When plain tombstones past `tombstone_ttl` are next looked for.
    pub next_compact: Instant,
    /// When the files' tokens were last all forgotten (the start, or a
    /// periodic rescan that read every file: `local::FULL_READ_EVERY`).
    pub tokens_since: Instant,
}

impl Waiting {
    /// Waiting for nothing yet at `now`, the start: compaction due at once.
    pub(super) fn new(next_rescan: Instant, now: Instant, putting_back: Vec<MinionId>) -> Waiting {
        Waiting {
            retry: Vec::new(),
            deferred: Vec::new(),
            retry_settling: Vec::new(),
            rescan_pending: false,
            journal: Vec::new(),
            putting_back,
            put_back_uncleared: false,
            next_rescan,
            rescanning: None,
            next_compact: now,
            tokens_since: now,
        }
    }
}

/// What the node can wait on, in the order [`Node::on_tick`] runs them:
/// the operators' changes are read and recorded before peers' decisions
/// are written over them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Names whose folder events are still coming (a salt-key run).
    Settling,
    /// Writes to try again once the backoff allows: peers' decisions, a
    /// rescan for the operators' changes that could not be recorded, the
    /// journal a stop left.
    Retry,
    /// Peers' decisions (and retried writes) waiting for their id to
    /// settle, for that id's retry, or for the retry's rescan.
    Deferred,
    /// Keys put back whose files are not written yet, or whose list the
    /// store could not clear.
    PutBack,
    /// The periodic rescan, the safety net for lost events.
    Rescan,
    /// The guard: held deletes the store could not keep, deletes waiting
    /// for their origin to go quiet or let through, a held burst's end.
    Guard,
    /// Forgetting plain tombstones past `tombstone_ttl`.
    Compaction,
}

impl Wait {
    pub const ALL: [Wait; 7] =
        [Wait::Settling, Wait::Retry, Wait::Deferred, Wait::PutBack, Wait::Rescan, Wait::Guard, Wait::Compaction];
}

/// Whether what waits keeps the node from being quiet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A decision or a file not where it belongs yet.
    Work,
    /// Always due some time (the periodic rescan, compaction), or only
    /// telling (a held burst's end): the node is at rest all the same.
    Housekeeping,
}

/// When what waits is next due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    At(Instant),
    /// Once the other wait has run (which is due itself).
    After(Wait),
}

impl Due {
    pub fn at(self) -> Option<Instant> {
        match self {
            Due::At(at) => Some(at),
            Due::After(_) => None,
        }
    }
}

/// One thing the node waits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waits {
    pub what: Wait,
    pub kind: Kind,
    pub due: Due,
}

impl Node {
    /// Everything the node waits on, each once, in [`Wait::ALL`]'s order.
    pub fn waits(&self) -> impl Iterator<Item = Waits> + '_ {
        let waits = Wait::ALL.into_iter().filter_map(|what| self.waits_on(what));
        debug_assert!(
            waits.clone().all(|w| match w.due {
                Due::At(_) => true,
                Due::After(other) => self.waits_on(other).is_some_and(|o| o.due.at().is_some()),
            }),
            "a wait behind one that is not due: {:?}",
            waits.clone().collect::<Vec<_>>()
        );
        waits
    }

    /// What waits on `what`, if anything.
    fn waits_on(&self, what: Wait) -> Option<Waits> {
        let waiting = &self.waiting;
        // A write to try again: when the backoff allows, at once if none is pending.
        let retry = || self.trouble.next_try().unwrap_or(self.seen);
        let (kind, due) = match what {
            Wait::Settling => (Kind::Work, Due::At(self.settler.next_due()?)),
            Wait::Retry => {
                let any = !waiting.retry.is_empty() || waiting.rescan_pending || !waiting.journal.is_empty();
                (Kind::Work, Due::At(any.then(retry)?))
            }
            Wait::Deferred => (Kind::Work, self.deferred_due()?),
            Wait::PutBack => {
                if waiting.putting_back.is_empty() && !waiting.put_back_uncleared {
                    return None;
                }
                // An id a salt-key run is working on waits for the run.
                let settled = waiting.putting_back.iter().any(|id| !self.settler.is_unsettled(id.as_str()));
                let due =
                    if settled || waiting.put_back_uncleared { Due::At(retry()) } else { Due::After(Wait::Settling) };
                (Kind::Work, due)
            }
            // A rescan under way takes its next step at once.
            Wait::Rescan if waiting.rescanning.is_some() => (Kind::Housekeeping, Due::At(self.seen)),
            Wait::Rescan => (Kind::Housekeeping, Due::At(waiting.next_rescan)),
            Wait::Guard => {
                let unsaved = self.guard.unsaved.then(retry);
                let due = self.guard.next_due(self.seen).into_iter().chain(unsaved).min()?;
                // A held burst's end only tells that it ended.
                let work = self.guard.unsaved || self.guard.is_waiting();
                (if work { Kind::Work } else { Kind::Housekeeping }, Due::At(due))
            }
            Wait::Compaction => (Kind::Housekeeping, Due::At(waiting.next_compact)),
        };
        Some(Waits { what, kind, due })
    }

    /// When the deferred decisions are next merged: a decision waits for
    /// the operators' changes to be recorded (the retry's rescan), for its
    /// id to settle, or for the retry of its id (one write per id in flight).
    fn deferred_due(&self) -> Option<Due> {
        let waiting = &self.waiting;
        if waiting.deferred.is_empty() && waiting.retry_settling.is_empty() {
            return None;
        }
        if waiting.rescan_pending {
            return Some(Due::After(Wait::Retry));
        }
        let settled = |(_, d): &&FromPeer| !self.settler.is_unsettled(d.id.as_str());
        let retried: HashSet<&MinionId> =
            waiting.retry.iter().map(|(_, d)| &d.id).chain(waiting.journal.iter().map(|d| &d.id)).collect();
        let ready = waiting.retry_settling.iter().any(|r| settled(&r))
            || waiting.deferred.iter().filter(settled).any(|(_, d)| !retried.contains(&d.id));
        Some(if ready {
            Due::At(self.seen)
        } else if waiting.deferred.iter().chain(&waiting.retry_settling).any(|r| !settled(&r)) {
            Due::After(Wait::Settling)
        } else {
            Due::After(Wait::Retry)
        })
    }

    /// Whether `what` is due at `now`.
    pub(super) fn is_due(&self, what: Wait, now: Instant) -> bool {
        self.waits_on(what).and_then(|waits| waits.due.at()).is_some_and(|at| at <= now)
    }

    /// Runs what `what` waits for ([`Node::on_tick`]).
    pub(super) fn run(&mut self, what: Wait, now: Now, rt: &mut impl Runtime) {
        match what {
            Wait::Settling => self.process_due(now, rt),
            Wait::Retry => self.retry_failed(now, rt),
            Wait::Deferred => self.apply_deferred(now, rt),
            Wait::PutBack => self.finish_put_back(now, rt),
            Wait::Rescan => self.rescan_step(now, rt),
            Wait::Guard => self.guard_tick(now, rt),
            Wait::Compaction => self.compact_due(now, rt),
        }
    }
}

impl Node {
    /// Keeps a peer's decision until the operators' unrecorded changes are
    /// recorded, or the retried write of its id is done, with the deferred
    /// ones: nothing was written for it, so it is merged and judged by the
    /// guard afresh then (what held for it when it came may have changed). The
    /// same decision offered again meanwhile is kept once.
    pub(super) fn wait_for_rescan(&mut self, from: PeerName, decision: Decision) {
        if !self.waiting.deferred.iter().any(|(_, d)| d.id == decision.id && d.version == decision.version) {
            self.waiting.deferred.push((from, decision));
        }
    }

    /// Decisions whose apply failed, retried after the backoff: peers', and
    /// an operator's release or revert (from this node: its command stands,
    /// and the folders may already show part of it).
    pub(super) fn retry_later(&mut self, failed: impl Iterator<Item = Merged>) {
        self.waiting.retry.extend(failed.map(|m| (m.from, m.decision)));
    }

    /// Start-up: applies decisions journalled before a crash, unless
    /// something newer is held by now.
    pub(super) fn finish_journal(&mut self, journal: Vec<Decision>, now: Now, rt: &mut impl Runtime) {
        if journal.is_empty() {
            return;
        }
        rt.audit(Event::FinishingJournal { n: journal.len() });
        if let Err(e) = self.warm(journal.iter().map(|d| &d.id), rt) {
            // Finished once the store can be read (`retry_failed`): still the
            // agent's own writes (possibly half done) to the scans until then.
            self.retry_after_cold_failure(&e, now, rt);
            self.waiting.journal = journal;
            return;
        }
        // A decision whose id's files show neither what was held nor what the
        // decision makes them show was overtaken by an operator after it was
        // journalled (its write failed, the files changed, the agent
        // stopped): not finished over that change, which the start-up scan
        // reads as the operator's decision. A peer still holding it offers it
        // again, and it meets that decision as any other.
        let (journal, covered): (Vec<Decision>, Vec<Decision>) =
            journal.into_iter().partition(|decision| !self.covered_since_journalled(decision, rt));
        if !covered.is_empty() {
            let done: Vec<MinionId> = covered.iter().map(|d| d.id.clone()).collect();
            let write = StoreWrite { done: &done, clock: self.replica.clock(), ..StoreWrite::default() };
            match rt.record(&write) {
                Ok(()) => covered.into_iter().for_each(|decision| rt.audit(Event::JournalCovered { decision })),
                Err(e) => self.trouble.failed(rt, now.mono, "state store journal", &e),
            }
        }
        let from = PeerName::journal();
        // Merged again (no clock check: it passed before the stop), so the
        // conflicts it brings are told as they would have been.
        let round = journal
            .into_iter()
            .filter_map(|decision| {
                let merged = crate::core::merge::merge(self.replica.entry(&decision.id), &decision);
                (merged.outcome != MergeOutcome::Duplicate).then(|| Merged {
                    decision,
                    holds: merged.outcome == MergeOutcome::Apply,
                    conflicts: merged.conflicts,
                    from: from.clone(),
                    arrival: 0,
                    operator: None,
                })
            })
            .collect();
        self.apply_round(round, now, rt);
    }

    /// Whether `decision`'s id's files changed after it was journalled: they
    /// show neither what this node held nor what the decision makes them show.
    fn covered_since_journalled(&self, decision: &Decision, rt: &mut impl Runtime) -> bool {
        use crate::core::observe::{interpret, Reading};
        let held = self.replica.effective(&decision.id);
        let after = crate::core::claims::effective(&self.replica.after(decision));
        let shows = |seen: Option<&Seen>, reading: &Reading| match (reading, seen) {
            (Reading::Decided(v), Some(s)) => v.kind() == s.kind && v.fingerprint() == s.fingerprint,
            (Reading::Undecided, None) => true,
            (Reading::Undecided, Some(s)) => s.kind == VerdictKind::Deleted,
            (Reading::Decided(_), None) => false,
            // A refused file: nothing can be read from it, the journal decides.
            (Reading::Unknown, _) => true,
        };
        let reading = interpret(&rt.read_slots(&decision.id));
        !shows(held.as_ref(), &reading) && !shows(after.as_ref(), &reading)
    }

    /// Retries failed writes once the backoff allows: a scan for local
    /// decisions that could not be recorded, and peers' decisions.
    pub(super) fn retry_failed(&mut self, now: Now, rt: &mut impl Runtime) {
        // The operator's unrecorded changes first (the agent's own half-done
        // writes for the retried decisions are not taken for them: see
        // `observe_name`), so a peer's decision retried next meets them as a
        // conflict instead of overwriting them.
        let journal = std::mem::take(&mut self.waiting.journal);
        if !journal.is_empty() {
            self.finish_journal(journal, now, rt);
        }
        if std::mem::take(&mut self.waiting.rescan_pending) {
            self.rescan("retry after a failed write", now, rt);
        }
        let retry = std::mem::take(&mut self.waiting.retry);
        if !retry.is_empty() {
            // Judged already: a held delete never reaches the retry list.
            self.apply_arrivals(by_peer(retry), Source::Retry, now, rt);
        }
        if !self.waiting.rescan_pending {
            self.apply_deferred(now, rt);
        }
        if self.waiting.retry.is_empty() && !self.waiting.rescan_pending && self.waiting.journal.is_empty() {
            self.trouble.succeeded(rt, now.mono);
        }
    }

    /// Merges the peers' decisions deferred while their ids were settling,
    /// for the ids that have settled since (the local decision, if any, is
    /// recorded first, so a concurrent one is seen as a conflict).
    pub(super) fn apply_deferred(&mut self, now: Now, rt: &mut impl Runtime) {
        let retries = self.take_settled(|node| &mut node.waiting.retry_settling);
        if !retries.is_empty() {
            self.apply_arrivals(by_peer(retries), Source::Retry, now, rt);
        }
        let deferred = self.take_settled(|node| &mut node.waiting.deferred);
        if !deferred.is_empty() {
            self.apply_arrivals(by_peer(deferred), Source::Peer, now, rt);
        }
    }

    /// Takes out of `list` the decisions whose ids have settled.
    fn take_settled(&mut self, list: impl Fn(&mut Node) -> &mut Vec<FromPeer>) -> Vec<FromPeer> {
        let (ready, waiting): (Vec<_>, Vec<_>) =
            std::mem::take(list(self)).into_iter().partition(|(_, d)| !self.settler.is_unsettled(d.id.as_str()));
        *list(self) = waiting;
        ready
    }
}
