//! Peer side of the node: merging peers' decisions, applying the newer ones
//! to the folders durably, and forwarding them on.

use std::collections::HashMap;
use std::sync::Arc;

use crate::core::merge::{Conflict, MergeOutcome};
use crate::core::{Decision, MinionId, VerdictKind};

use super::event::{Event, Side};
use super::runtime::{Applied, Runtime, StoreWrite};
use super::{FromPeer, Node, Now};

/// A decision chosen for applying, with what the merge said about it.
struct Chosen {
    decision: Decision,
    conflict: Option<Conflict>,
    /// The peer it came from ("journal" at start-up).
    from: Arc<str>,
    /// Which of the arrivals applied together brought it.
    arrival: usize,
}

impl Node {
    /// Peers' decisions, one arrival per push (or fetch) handled together:
    /// merged, and the newer ones applied as one batch — one journal
    /// commit, one syncfs, one store commit and one audit flush for all of
    /// them. Returns, per arrival, how many of its decisions were applied.
    pub fn on_batches(
        &mut self,
        arrivals: Vec<(Arc<str>, Vec<Decision>)>,
        now: Now,
        rt: &mut impl Runtime,
    ) -> Vec<u32> {
        self.seen = now.mono;
        self.apply_arrivals(arrivals, now, rt)
    }

    fn apply_arrivals(
        &mut self,
        arrivals: Vec<(Arc<str>, Vec<Decision>)>,
        now: Now,
        rt: &mut impl Runtime,
    ) -> Vec<u32> {
        let max_skew = self.settings.max_clock_skew.as_millis() as u64;
        let n_arrivals = arrivals.len();
        let mut chosen: HashMap<MinionId, Chosen> = HashMap::new();
        // Decisions about an id another arrival also brings: merged after this
        // batch is held, against it, as if they had come one after the other
        // (two peers' concurrent decisions are then seen as a conflict).
        let mut later: Vec<Vec<Decision>> = vec![Vec::new(); n_arrivals];
        let mut froms: Vec<Arc<str>> = Vec::with_capacity(n_arrivals);
        for (arrival, (from, decisions)) in arrivals.into_iter().enumerate() {
            froms.push(from.clone());
            for decision in decisions {
                if self.settler.is_unsettled(decision.id.as_str()) {
                    // A salt-key run on this id is in progress here: writing now would
                    // mix with it. Merged once its events have settled (apply_deferred).
                    rt.audit(Event::Deferred { id: decision.id.clone(), from: from.clone() });
                    self.deferred.push((from.clone(), decision));
                    continue;
                }
                match self.replica.merge(&decision, now.wall_ms, max_skew) {
                    Err(error) => {
                        // Told once: anti-entropy offers the same version again and again.
                        if self.reported.insert((decision.id.clone(), decision.version.clone())) {
                            rt.audit(Event::FromTheFuture { decision, from: from.clone(), error });
                        }
                    }
                    Ok(MergeOutcome::Duplicate) => {}
                    Ok(MergeOutcome::Superseded { conflict }) => {
                        if let Some(conflict) = conflict {
                            if let Some(event) = self.conflict_event(&decision, &from, &conflict) {
                                rt.audit(event);
                            }
                        }
                        if let Some(held) = self.replica.entry(&decision.id) {
                            let held = held.version.clone();
                            rt.audit(Event::Superseded { decision, from: from.clone(), held });
                        }
                    }
                    Ok(MergeOutcome::Apply { conflict }) => match chosen.get(&decision.id) {
                        Some(held) if held.arrival != arrival => later[arrival].push(decision),
                        // Several decisions for one id in one arrival: the newest wins.
                        Some(held) if held.decision.version >= decision.version => {}
                        _ => {
                            let id = decision.id.clone();
                            chosen.insert(id, Chosen { decision, conflict, from: from.clone(), arrival });
                        }
                    },
                }
            }
        }
        let mut batch: Vec<Chosen> = chosen.into_values().collect();
        batch.sort_by(|a, b| a.decision.id.cmp(&b.decision.id));
        let mut n_applied = self.apply_batch(batch, n_arrivals, now, rt);
        if later.iter().any(|decisions| !decisions.is_empty()) {
            let again = self.apply_arrivals(froms.into_iter().zip(later).collect(), now, rt);
            n_applied.iter_mut().zip(again).for_each(|(n, more)| *n += more);
        }
        n_applied
    }

    /// Applies `batch` (decisions about distinct ids, from `n_arrivals`
    /// arrivals); returns how many of each arrival's were applied.
    fn apply_batch(&mut self, batch: Vec<Chosen>, n_arrivals: usize, now: Now, rt: &mut impl Runtime) -> Vec<u32> {
        let mut n_applied = vec![0; n_arrivals];
        if batch.is_empty() {
            return n_applied;
        }
        let decisions: Vec<Decision> = batch.iter().map(|c| c.decision.clone()).collect();
        if let Err(e) = rt.journal(&decisions) {
            self.trouble.failed(rt, now.mono, "state store journal", &e);
            self.retry.extend(batch.into_iter().map(|c| (c.from, c.decision)));
            return n_applied;
        }
        let results = rt.apply(&batch.iter().map(|c| &c.decision).collect::<Vec<_>>());
        self.echoes.expire(now.mono);
        let mut written: Vec<(Chosen, Applied)> = Vec::new();
        let mut revoked = false;
        for (chosen, result) in batch.into_iter().zip(results) {
            let decision = &chosen.decision;
            match result {
                Ok(applied) => {
                    self.echoes.expect(decision.id.as_str(), &applied.changes, now.mono);
                    // What reading the echo would have noted: no pending key
                    // left, and nothing refused in the folders now written.
                    self.pending.remove(&decision.id);
                    if !self.refused.is_empty() {
                        for folder in crate::core::Folder::ALL {
                            self.refused.remove(&(folder, decision.id.to_string()));
                        }
                    }
                    // Revoking: this master held the id as accepted, or still
                    // had it in minions/. The held entry counts too, because a
                    // retried or journalled decision may find its own earlier
                    // write already there.
                    revoked |= decision.verdict.kind() != VerdictKind::Accepted
                        && (applied.removed_accepted()
                            || self.replica.entry(&decision.id).is_some_and(|held| held.kind == VerdictKind::Accepted));
                    written.push((chosen, applied));
                }
                Err(e) => {
                    // Nothing recorded for it: peers still see this node without it.
                    self.trouble.failed(rt, now.mono, &format!("the key folders, for {}", decision.id), &e);
                    self.retry.push((chosen.from, chosen.decision));
                }
            }
        }
        if written.is_empty() {
            return n_applied;
        }
        let decisions: Vec<Decision> = written.iter().map(|(c, _)| c.decision.clone()).collect();
        let ids: Vec<MinionId> = decisions.iter().map(|d| d.id.clone()).collect();
        let durable = rt.sync_folders().and_then(|()| {
            rt.record(&StoreWrite { decisions: &decisions, done: &ids, clock: self.replica.clock(), initialize: true })
        });
        if let Err(e) = durable {
            // Not held, not forwarded: retried, and the journal finishes it after a crash.
            self.trouble.failed(rt, now.mono, "syncfs or state store", &e);
            self.retry.extend(written.into_iter().map(|(c, _)| (c.from, c.decision)));
            return n_applied;
        }
        if self.retry.is_empty() && !self.rescan_pending {
            self.trouble.succeeded(rt, now.mono);
        }
        if revoked {
            match rt.drop_dfn() {
                Ok(true) => rt.audit(Event::Rotated),
                Ok(false) => {}
                Err(error) => rt.audit(Event::RotateFailed { error }),
            }
        }
        for (chosen, applied) in &written {
            // Told first: a conflict describes the decision held before.
            if let Some(conflict) = &chosen.conflict {
                if let Some(event) = self.conflict_event(&chosen.decision, &chosen.from, conflict) {
                    rt.audit(event);
                }
            }
            rt.audit(Event::Applied { decision: chosen.decision.clone(), from: chosen.from.clone() });
            if let Some(pending) = &applied.discarded_pending {
                rt.audit(Event::PendingDiscarded {
                    id: chosen.decision.id.clone(),
                    from: chosen.from.clone(),
                    origin: chosen.decision.version.node.clone(),
                    pending: pending.fingerprint(),
                    decided: chosen.decision.verdict.fingerprint(),
                });
            }
            self.replica.commit(&chosen.decision);
            n_applied[chosen.arrival] += 1;
        }
        // Forwarded per peer of origin, which need not get its own back.
        let mut by_peer: Vec<(Arc<str>, Vec<Decision>)> = Vec::new();
        for ((chosen, _), decision) in written.iter().zip(decisions) {
            match by_peer.iter_mut().find(|(from, _)| *from == chosen.from) {
                Some((_, decisions)) => decisions.push(decision),
                None => by_peer.push((chosen.from.clone(), vec![decision])),
            }
        }
        for (from, decisions) in by_peer {
            rt.send(Some(&from), decisions);
        }
        // After forwarding: the audit lines are written, the store holds the decisions.
        rt.flush_audit();
        n_applied
    }

    /// Start-up: applies decisions journalled before a crash, unless
    /// something newer is held by now.
    pub(super) fn finish_journal(&mut self, journal: Vec<Decision>, now: Now, rt: &mut impl Runtime) {
        if journal.is_empty() {
            return;
        }
        rt.audit(Event::FinishingJournal { n: journal.len() });
        let from: Arc<str> = "journal".into();
        let batch = journal
            .into_iter()
            .filter(|d| self.replica.entry(&d.id).is_none_or(|held| held.version < d.version))
            .map(|decision| Chosen { decision, conflict: None, from: from.clone(), arrival: 0 })
            .collect();
        self.apply_batch(batch, 1, now, rt);
    }

    /// Retries failed writes once the backoff allows: a scan for local
    /// decisions that could not be recorded, and peers' decisions.
    pub(super) fn retry_failed(&mut self, now: Now, rt: &mut impl Runtime) {
        // The operator's unrecorded changes first (the agent's own half-done
        // writes for the retried decisions are not taken for them: see
        // `observe_name`), so a peer's decision retried next meets them as a
        // conflict instead of overwriting them.
        if std::mem::take(&mut self.rescan_pending) {
            self.rescan("retry after a failed write", now, rt);
        }
        let retry = std::mem::take(&mut self.retry);
        if !retry.is_empty() {
            self.apply_arrivals(by_peer(retry), now, rt);
        }
        if !self.rescan_pending {
            self.apply_deferred(now, rt);
        }
        if self.retry.is_empty() && !self.rescan_pending {
            self.trouble.succeeded(rt, now.mono);
        }
    }

    /// Merges the peers' decisions deferred while their ids were settling,
    /// for the ids that have settled since (the local decision, if any, is
    /// recorded first, so a concurrent one is seen as a conflict).
    pub(super) fn apply_deferred(&mut self, now: Now, rt: &mut impl Runtime) {
        if self.deferred.is_empty() {
            return;
        }
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|(_, d)| !self.settler.is_unsettled(d.id.as_str()));
        self.deferred = waiting;
        if !ready.is_empty() {
            self.apply_arrivals(by_peer(ready), now, rt);
        }
    }

    /// The event of a conflict, once per losing version: the loser arriving
    /// again (from another peer, or by anti-entropy) is the same conflict.
    fn conflict_event(&mut self, decision: &Decision, from: &Arc<str>, conflict: &Conflict) -> Option<Event> {
        if !self.reported.insert((decision.id.clone(), conflict.loser.clone())) {
            return None;
        }
        let held = self.replica.entry(&decision.id);
        let incoming = Side {
            version: decision.version.clone(),
            kind: Some(decision.verdict.kind()),
            fingerprint: decision.verdict.fingerprint(),
        };
        let held = Side {
            version: held.map_or_else(|| conflict.loser.clone(), |h| h.version.clone()),
            kind: held.map(|h| h.kind),
            fingerprint: held.and_then(|h| h.fingerprint),
        };
        let (winner, loser) = if conflict.winner == decision.version { (incoming, held) } else { (held, incoming) };
        Some(Event::Conflict { id: decision.id.clone(), from: from.clone(), winner, loser })
    }
}

/// Peers' decisions grouped by the peer they came from, one arrival each,
/// in the order the peers first appear (the same run always merges alike).
fn by_peer(decisions: Vec<FromPeer>) -> Vec<(Arc<str>, Vec<Decision>)> {
    let mut grouped: Vec<(Arc<str>, Vec<Decision>)> = Vec::new();
    for (from, decision) in decisions {
        match grouped.iter_mut().find(|(peer, _)| *peer == from) {
            Some((_, decisions)) => decisions.push(decision),
            None => grouped.push((from, vec![decision])),
        }
    }
    grouped
}
