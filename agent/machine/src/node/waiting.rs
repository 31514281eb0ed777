//! What waits before it is applied, and what a stop left half-done: peers'
//! decisions whose write failed (retried with backoff, still the agent's own
//! writes to the rescan), decisions waiting for a salt-key run or for the
//! operators' unrecorded changes to be recorded (deferred), and the journal
//! of decisions a stop interrupted, finished at the next start unless the
//! files changed since.

use std::sync::Arc;

use crate::core::merge::MergeOutcome;
use crate::core::{Decision, MinionId, Seen, VerdictKind};

use super::event::Event;
use super::remote::{by_peer, Merged, Source};
use super::runtime::{Runtime, StoreWrite};
use super::{FromPeer, Node, Now};

impl Node {
    /// Keeps a peer's decision until the operators' unrecorded changes are
    /// recorded, or the retried write of its id is done, with the deferred
    /// ones: nothing was written for it, so it is merged and judged by the
    /// guard afresh then (what held for it when it came may have changed). The
    /// same decision offered again meanwhile is kept once.
    pub(super) fn wait_for_rescan(&mut self, from: Arc<str>, decision: Decision) {
        if !self.deferred.iter().any(|(_, d)| d.id == decision.id && d.version == decision.version) {
            self.deferred.push((from, decision));
        }
    }

    /// Decisions whose apply failed, retried after the backoff: peers', and
    /// an operator's release or revert (from this node: its command stands,
    /// and the folders may already show part of it).
    pub(super) fn retry_later(&mut self, failed: impl Iterator<Item = Merged>) {
        self.retry.extend(failed.map(|m| (m.from, m.decision)));
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
            self.journal_waiting = journal;
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
        let from: Arc<str> = "journal".into();
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
        let journal = std::mem::take(&mut self.journal_waiting);
        if !journal.is_empty() {
            self.finish_journal(journal, now, rt);
        }
        if std::mem::take(&mut self.rescan_pending) {
            self.rescan("retry after a failed write", now, rt);
        }
        let retry = std::mem::take(&mut self.retry);
        if !retry.is_empty() {
            // Judged already: a held delete never reaches the retry list.
            self.apply_arrivals(by_peer(retry), Source::Retry, now, rt);
        }
        if !self.rescan_pending {
            self.apply_deferred(now, rt);
        }
        if self.retry.is_empty() && !self.rescan_pending && self.journal_waiting.is_empty() {
            self.trouble.succeeded(rt, now.mono);
        }
    }

    /// Merges the peers' decisions deferred while their ids were settling,
    /// for the ids that have settled since (the local decision, if any, is
    /// recorded first, so a concurrent one is seen as a conflict).
    pub(super) fn apply_deferred(&mut self, now: Now, rt: &mut impl Runtime) {
        let retries = self.take_settled(|node| &mut node.retry_settling);
        if !retries.is_empty() {
            self.apply_arrivals(by_peer(retries), Source::Retry, now, rt);
        }
        let deferred = self.take_settled(|node| &mut node.deferred);
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
