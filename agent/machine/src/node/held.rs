//! The node's side of the blast-radius guard (`guard.rs`): peers' deletes
//! of accepted keys offered to it, held deletes kept in the store and
//! settled as decisions change, and an operator's release or revert turned
//! into a new decision from this node that does it on every master.

use std::collections::HashMap;
use std::sync::Arc;

use crate::PeerName;

use crate::core::{Decision, Entry, Fingerprint, MinionId, PublicKey, Verdict, VerdictKind};

use super::event::{Event, Settled};
use super::remote::{by_peer, Merged, Source};
use super::runtime::{Runtime, StoreWrite};
use super::{HeldDelete, Node, Now};

/// What an operator does with held deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperatorAction {
    /// Applies them everywhere: a new delete that knew them, which every
    /// master's guard lets through.
    Release,
    /// Restores the keys on their origin: a new accept of the key this
    /// master still holds, which wins everywhere.
    Revert,
}

impl OperatorAction {
    /// The audit action name.
    pub fn name(self) -> &'static str {
        match self {
            OperatorAction::Release => "release",
            OperatorAction::Revert => "revert",
        }
    }
}

/// What an operator's release or revert did here.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Applied here and sent to the peers.
    pub done: Vec<MinionId>,
    /// Writes fail here: retried with backoff (and finished after a restart
    /// if journalled), as peers' decisions are.
    pub retrying: Vec<MinionId>,
    /// A salt-key run is working on them here, or their folders changed
    /// without the change being recorded yet: still held.
    pub skipped: Vec<MinionId>,
}

/// Whether an entry makes this master's folders show an accepted key.
fn shows_accepted(entry: Option<&Entry>) -> bool {
    entry.and_then(crate::core::claims::effective).is_some_and(|s| s.kind == VerdictKind::Accepted)
}

impl Node {
    /// Whether the guard judges a peer's `decision`, which beats what is
    /// held: a delete of a key accepted here. One that knew a delete held
    /// here is judged too: only this master's operator releases what its
    /// guard holds, and a peer's delete is that peer's, whatever it knew.
    pub(super) fn guards(&self, decision: &Decision) -> bool {
        *decision.version.node != *self.settings.node && self.judges(decision)
    }

    /// Whether the guard judges `decision` whatever master it names: a
    /// delete of a key accepted here. Also this master's own forgotten past
    /// a peer brings back (`remote.rs`): a peer could stamp a mass delete
    /// so, and it is judged like that peer's own.
    pub(super) fn judges(&self, decision: &Decision) -> bool {
        self.guard.settings.enabled
            && decision.verdict.kind() == VerdictKind::Deleted
            && shows_accepted(self.replica.entry(&decision.id))
    }

    /// Offers peers' deletes of accepted keys to the guard, and tells what it did.
    pub(super) fn offer_guarded(&mut self, guarded: Vec<(PeerName, Decision)>, now: Now, rt: &mut impl Runtime) {
        // Judged as they came; a later round of the same arrivals may have
        // changed what the id shows here (a claim rejecting the key).
        let (guarded, unjudged): (Vec<_>, Vec<_>) = guarded.into_iter().partition(|(_, d)| self.judges(d));
        if !unjudged.is_empty() {
            self.apply_arrivals(by_peer(unjudged), Source::Guard, now, rt);
        }
        if guarded.is_empty() {
            return;
        }
        let n_accepted = self.n_accepted();
        for (from, decision) in guarded {
            self.guard.offer(from, decision, n_accepted, now.mono, now.wall_ms);
        }
        self.tell_guard(now, rt);
    }

    /// The guard's part of a tick: deletes let through (their origin went
    /// quiet under the limit, or their key is no longer accepted here) are
    /// applied, ended holds told, held deletes the store lost written again.
    pub(super) fn guard_tick(&mut self, now: Now, rt: &mut impl Runtime) {
        let due = self.guard.due(now.mono);
        if !due.is_empty() {
            let kept = self.keep_before(&due, rt);
            self.apply_arrivals(by_peer(due), Source::Guard, now, rt);
            self.keep_passed(kept, now);
        }
        self.tell_guard(now, rt);
    }

    /// Keeps newly held deletes in the store and tells what the guard did.
    fn tell_guard(&mut self, now: Now, rt: &mut impl Runtime) {
        let mut news = self.guard.take_news();
        let put_back = self.put_back(std::mem::take(&mut news.put_back), now, rt);
        let retry = self.guard.unsaved && self.trouble.retry_due(now.mono);
        // Given back to be judged again and not held again at once.
        let mut unheld: Vec<MinionId> =
            news.rejudged.iter().map(|held| held.decision.id.clone()).filter(|id| !self.guard.is_held(id)).collect();
        if !news.fresh.is_empty() || !unheld.is_empty() || retry {
            // After a failed write, all of them: the store may have none,
            // and may still have those given back since (unless held again).
            let everything: Vec<HeldDelete> =
                if self.guard.unsaved { self.guard.held().cloned().collect() } else { Vec::new() };
            let held = if self.guard.unsaved { &everything } else { &news.fresh };
            let given_back: Vec<MinionId> = std::mem::take(&mut self.guard.unsaved_unheld)
                .into_iter()
                .filter(|id| !self.guard.is_held(id) && !unheld.contains(id))
                .collect();
            unheld.extend(given_back);
            let write = StoreWrite { held, unheld: &unheld, clock: self.replica.clock(), ..StoreWrite::default() };
            match rt.record(&write) {
                Ok(()) => {
                    self.guard.unsaved = false;
                    if self.waiting.retry.is_empty() && !self.waiting.rescan_pending {
                        self.trouble.succeeded(rt, now.mono);
                    }
                }
                Err(e) => {
                    // Held all the same (never applied): written again later.
                    self.trouble.failed(rt, now.mono, "state store, for held deletes", &e);
                    self.guard.unsaved = true;
                    self.guard.unsaved_unheld = unheld;
                }
            }
        }
        for held in news.rejudged {
            rt.audit(Event::HeldSettled { held, how: Settled::Rejudged });
        }
        for tripped in news.tripped {
            let via = tripped.via;
            let first = self.guard.held().filter(|h| h.from == via).take(10).map(|h| h.decision.id.clone());
            // The burst's deletes put back here are held with it.
            let n_back =
                if tripped.forwarded { 0 } else { put_back.iter().find(|(l, _)| *l == via).map_or(0, |(_, n)| *n) };
            let (n, limit, forwarded, first) = (tripped.n + n_back, tripped.limit, tripped.forwarded, first.collect());
            rt.audit(Event::DeletesHeld { via, forwarded, n, limit, first });
        }
        for (via, n) in news.ended {
            rt.audit(Event::HoldEnded { via, n });
        }
        for (held, by) in news.replaced {
            rt.audit(Event::HeldSettled { held, how: Settled::By(by.seen()) });
        }
    }

    /// Whether committing `after` as `id`'s entry settles a delete held for it.
    pub(super) fn settles_held(&self, id: &MinionId, after: &Entry) -> bool {
        self.guard.would_settle(id, Some(after), shows_accepted(Some(after)))
    }

    /// `decision` was committed and `after` is its id's entry now: the
    /// delete held for the id is settled (told unless `tell` is false: an
    /// operator's own release or revert tells itself).
    pub(super) fn settle_held(&mut self, decision: &Decision, after: &Entry, tell: bool, rt: &mut impl Runtime) {
        let Some(held) = self.guard.settle(&decision.id, Some(after), shows_accepted(Some(after))) else { return };
        if tell {
            // Its very version applied: it was let through, no longer judged.
            let by_another = held.settled_by(after) && decision.version != held.decision.version;
            let how = if by_another { Settled::By(decision.seen()) } else { Settled::NotAccepted };
            rt.audit(Event::HeldSettled { held, how });
        }
    }

    /// Start-up: the deletes held before the stop are judged again against
    /// what is held now. Those a newer decision settled are dropped, those
    /// whose key is no longer accepted here are applied as any other; the
    /// others stay held (told).
    pub(super) fn recheck_held(&mut self, now: Now, rt: &mut impl Runtime) {
        let held_ids: Vec<MinionId> = self.guard.held().map(|held| held.decision.id.clone()).collect();
        if self.warm(&held_ids, rt).is_err() {
            return;
        }
        let unheld: Vec<MinionId> = self
            .guard
            .held()
            .map(|held| &held.decision.id)
            .filter(|id| {
                let entry = self.replica.entry(id);
                self.guard.would_settle(id, entry, shows_accepted(entry))
            })
            .cloned()
            .collect();
        if !unheld.is_empty() {
            match rt.record(&StoreWrite { unheld: &unheld, clock: self.replica.clock(), ..StoreWrite::default() }) {
                Ok(()) => {
                    for id in &unheld {
                        let entry = self.replica.entry(id).cloned();
                        let still = shows_accepted(entry.as_ref());
                        if let Some(held) = self.guard.settle(id, entry.as_ref(), still) {
                            let how = match entry {
                                Some(entry) if held.settled_by(&entry) => Settled::By(entry.held()),
                                _ => Settled::NotAccepted,
                            };
                            rt.audit(Event::HeldSettled { held, how });
                        }
                    }
                }
                Err(e) => self.trouble.failed(rt, now.mono, "state store, for held deletes", &e),
            }
        }
        let mut origins: Vec<Arc<str>> = self.guard.held().map(|held| held.origin().clone()).collect();
        if !origins.is_empty() {
            let n = origins.len();
            origins.sort();
            origins.dedup();
            rt.audit(Event::StillHeld { n, origins });
        }
    }

    /// An operator here releases held deletes (from `origin`, of `ids` if
    /// any are given): each becomes a new delete from this node that knew it,
    /// applied here and sent to every peer, whose guard lets it through.
    pub fn release_held(
        &mut self,
        origin: Option<&str>,
        ids: &[MinionId],
        by: &str,
        now: Now,
        rt: &mut impl Runtime,
    ) -> Result<Outcome, String> {
        self.seen = now.mono;
        let (chosen, skipped) = self.chosen(origin, ids, rt);
        let round = chosen
            .into_iter()
            .map(|held| self.operator_decision(held, Verdict::Deleted, OperatorAction::Release, by, now))
            .collect();
        let outcome = self.run_operator(round, skipped, now, rt);
        self.cool();
        Ok(outcome)
    }

    /// An operator here reverts held deletes (from `origin`, of `ids` if any
    /// are given): each becomes a new accept of the key this master still
    /// holds, from this node, which wins everywhere — the origin writes the
    /// key back. `Err` when the keys cannot be read from the store.
    pub fn revert_held(
        &mut self,
        origin: Option<&str>,
        ids: &[MinionId],
        by: &str,
        now: Now,
        rt: &mut impl Runtime,
    ) -> Result<Outcome, String> {
        self.seen = now.mono;
        let (chosen, skipped) = self.chosen(origin, ids, rt);
        let wanted: Vec<MinionId> = chosen.iter().map(|held| held.decision.id.clone()).collect();
        let known = rt.load(&wanted).map_err(|e| format!("cannot read the held keys from the state store: {e}"))?;
        // Every key the store knows for these ids (a fingerprint names one key).
        let keys: HashMap<(&MinionId, Fingerprint), &PublicKey> =
            known.iter().filter_map(|d| d.verdict.key().map(|key| ((&d.id, key.fingerprint()), key))).collect();
        let mut round = Vec::new();
        for held in chosen {
            let id = &held.decision.id;
            let shown = self.replica.effective(id);
            let key = shown
                .as_ref()
                .filter(|s| s.kind == VerdictKind::Accepted)
                .and_then(|s| keys.get(&(id, s.fingerprint?)))
                .map(|&key| key.clone());
            // Without the key (the store lost it) there is nothing to restore.
            if let Some(key) = key {
                round.push(self.operator_decision(held, Verdict::Accepted(key), OperatorAction::Revert, by, now));
            }
        }
        let outcome = self.run_operator(round, skipped, now, rt);
        self.cool();
        Ok(outcome)
    }

    /// The held deletes an operator's command names, and those skipped (left
    /// held: run the command again): ids a salt-key run is working on here,
    /// and ids whose folders changed without the change being recorded yet
    /// (writes failing): the command must not decide over an operator's
    /// change this node has not read.
    fn chosen(
        &self,
        origin: Option<&str>,
        ids: &[MinionId],
        rt: &mut impl Runtime,
    ) -> (Vec<HeldDelete>, Vec<MinionId>) {
        let (chosen, busy): (Vec<_>, Vec<_>) = self.guard.select(origin, ids).into_iter().partition(|held| {
            let id = &held.decision.id;
            let shows = self.replica.effective(id);
            let on_disk = crate::core::observe::interpret(&rt.read_slots(id));
            !self.settler.is_unsettled(id.as_str())
                && matches!((&on_disk, &shows), (crate::core::observe::Reading::Decided(v), Some(s))
                    if v.kind() == s.kind && v.fingerprint() == s.fingerprint)
        });
        (chosen, busy.into_iter().map(|held| held.decision.id).collect())
    }

    /// The decision that releases or reverts `held`: from this node, newer
    /// than everything seen, knowing the held delete and what it knew.
    fn operator_decision(
        &mut self,
        held: HeldDelete,
        verdict: Verdict,
        action: OperatorAction,
        by: &str,
        now: Now,
    ) -> Merged {
        let id = held.decision.id.clone();
        let mut context = self.replica.entry(&id).map(Entry::known).unwrap_or_default();
        context.join(&held.decision.context);
        context.add(&held.decision.version);
        let version = self.replica.next_version(now.wall_ms);
        let decision =
            Decision { id, verdict, version, context, relays: Default::default(), reached: Default::default() };
        Merged {
            decision,
            holds: true,
            conflicts: Vec::new(),
            from: PeerName::trusted(self.settings.node.clone()),
            arrival: 0,
            operator: Some((action, by.to_string(), held)),
        }
    }

    /// Applies an operator's decisions here and sends them on: done now, or
    /// retried with the peers' decisions while writes fail here.
    fn run_operator(&mut self, round: Vec<Merged>, skipped: Vec<MinionId>, now: Now, rt: &mut impl Runtime) -> Outcome {
        let ids: Vec<MinionId> = round.iter().map(|m| m.decision.id.clone()).collect();
        if !ids.is_empty() {
            // An earlier command on these ids still retried (writes failed)
            // is replaced: the operator's latest word stands, not both.
            let node = PeerName::trusted(self.settings.node.clone());
            self.waiting.retry.retain(|(from, d)| *from != node || !ids.contains(&d.id));
            self.apply_round(round, now, rt);
        }
        let (done, retrying) = ids.into_iter().partition(|id| !self.guard.is_held(id));
        Outcome { done, retrying, skipped }
    }
}
