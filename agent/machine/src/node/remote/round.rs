//! One round of peers' decisions made durable: what each makes the folders
//! show, journalled, written and synced, then recorded in one store commit,
//! audited and forwarded.

use crate::PeerName;

use crate::core::merge::Conflict;
use crate::core::{Decision, Entry, Fingerprint, MinionId, Seen, VerdictKind};
use crate::node::event::Event;
use crate::node::runtime::{Applied, Failure, Kept, Runtime, StoreWrite};
use crate::node::{Node, Now};

use super::Merged;

impl Node {
    /// Makes one round durable: what each decision makes the folders show
    /// (see [`Node::effect_of`]) journalled, written and synced, then one
    /// store commit holding them, the others remembered, and the round's
    /// conflicts kept until told. Returns the applied count per arrival.
    pub(in crate::node) fn apply_round(
        &mut self,
        round: Vec<Merged>,
        now: Now,
        rt: &mut impl Runtime,
    ) -> Vec<(usize, u32)> {
        if round.is_empty() {
            return Vec::new();
        }
        let planned: Vec<(Merged, Effect)> = round
            .into_iter()
            .map(|merged| {
                let effect = self.effect_of(&merged.decision, rt);
                (merged, effect)
            })
            .collect();
        let writes: Vec<Decision> = planned.iter().filter_map(|(_, e)| e.write.clone()).collect();
        let mut done: Vec<(Merged, Effect, Option<Applied>)> = Vec::with_capacity(planned.len());
        let mut revoked = false;
        if !writes.is_empty() {
            // The peers' decisions are journalled, not what they make the
            // folders show: finishing one merges it again, by the same rule.
            let journal: Vec<Decision> =
                planned.iter().filter(|(_, e)| e.write.is_some()).map(|(m, _)| m.decision.clone()).collect();
            if let Err(e) = rt.journal(&journal) {
                self.trouble.failed(rt, now.mono, "state store journal", &e);
                self.retry_later(planned.into_iter().map(|(m, _)| m));
                return Vec::new();
            }
            let mut results = rt.apply(&writes.iter().collect::<Vec<_>>()).into_iter();
            self.echoes.expire(now.mono);
            for (merged, effect) in planned {
                let Some(target) = &effect.write else {
                    done.push((merged, effect, None));
                    continue;
                };
                match results.next().unwrap_or_else(|| Err(Failure::new("no result"))) {
                    Ok(applied) => {
                        self.echoes.expect(target.id.as_str(), &applied.changes, now.mono);
                        // What reading the echo would have noted: no pending key
                        // left, and nothing refused in the folders now written.
                        self.pending.remove(&target.id);
                        if !self.refused.is_empty() {
                            for folder in crate::core::Folder::ALL {
                                self.refused.remove(&(folder, target.id.to_string()));
                            }
                        }
                        // Revoking: this master showed the id as accepted, or
                        // still had it in minions/. What it showed counts too,
                        // because a retried or journalled decision may find its
                        // own earlier write already there.
                        revoked |= target.verdict.kind() != VerdictKind::Accepted
                            && (applied.removed_accepted()
                                || effect.before.as_ref().is_some_and(|s| s.kind == VerdictKind::Accepted));
                        done.push((merged, effect, Some(applied)));
                    }
                    Err(e) => {
                        // Nothing recorded for it: peers still see this node without it.
                        self.trouble.failed(rt, now.mono, &format!("the key folders, for {}", target.id), &e);
                        self.retry_later(std::iter::once(merged));
                    }
                }
            }
        } else {
            done.extend(planned.into_iter().map(|(m, e)| (m, e, None)));
        }
        if done.is_empty() {
            return Vec::new();
        }
        let held: Vec<Decision> = done.iter().filter(|(m, _, _)| m.holds).map(|(m, _, _)| m.decision.clone()).collect();
        let claims: Vec<Decision> = done
            .iter()
            .filter(|(m, _, _)| !m.holds && m.decision.version.is_claim())
            .map(|(m, _, _)| m.decision.clone())
            .collect();
        let finished: Vec<MinionId> =
            done.iter().filter(|(_, e, _)| e.write.is_some()).map(|(m, _, _)| m.decision.id.clone()).collect();
        let kept: Vec<Kept> = done.iter().map(|(m, e, _)| Kept::of(&m.decision.id, &e.after)).collect();
        let conflicts: Vec<(PeerName, Conflict)> =
            done.iter().flat_map(|(m, _, _)| m.conflicts.iter().map(|c| (m.from.clone(), c.clone()))).collect();
        let unheld: Vec<MinionId> = done
            .iter()
            .filter(|(m, e, _)| self.settles_held(&m.decision.id, &e.after))
            .map(|(m, _, _)| m.decision.id.clone())
            .collect();
        let synced = if finished.is_empty() { Ok(()) } else { rt.sync_folders() };
        let durable = synced.and_then(|()| {
            rt.record(&StoreWrite {
                decisions: &held,
                claims: &claims,
                kept: &kept,
                conflicts: &conflicts,
                conflicts_told: false,
                done: &finished,
                clock: self.replica.clock(),
                initialize: true,
                unheld: &unheld,
                ..StoreWrite::default()
            })
        });
        if let Err(e) = durable {
            // Not held, not forwarded: retried, and the journal finishes it after a crash.
            self.trouble.failed(rt, now.mono, "syncfs or state store", &e);
            self.retry_later(done.into_iter().map(|(m, _, _)| m));
            return Vec::new();
        }
        if self.waiting.retry.is_empty() && !self.waiting.rescan_pending {
            self.trouble.succeeded(rt, now.mono);
        }
        if revoked {
            match rt.drop_dfn() {
                Ok(true) => rt.audit(Event::Rotated),
                Ok(false) => {}
                Err(error) => rt.audit(Event::RotateFailed { error }),
            }
        }
        for (from, conflict) in &conflicts {
            rt.audit(Event::Conflict { conflict: conflict.clone(), from: from.clone() });
        }
        let mut n_applied: Vec<(usize, u32)> = Vec::new();
        let mut forward: Vec<(PeerName, Vec<Decision>)> = Vec::new();
        for (merged, effect, applied) in done {
            let decision = &merged.decision;
            let wrote = effect.write.is_some();
            let follows = effect.shows_incoming(decision);
            if let Some((action, by, held)) = &merged.operator {
                let (action, by, held) = (*action, by.clone(), held.clone());
                rt.audit(Event::Operator { action, decision: decision.clone(), by, held });
            } else if follows && (wrote || merged.holds) {
                let replaced = replaced_key(effect.before.as_ref(), decision);
                rt.audit(Event::Applied { decision: decision.clone(), from: merged.from.clone(), replaced });
            } else if wrote || merged.holds || decision.version.is_claim() {
                rt.audit(Event::Kept {
                    decision: decision.clone(),
                    from: merged.from.clone(),
                    shows: effect.shows.clone(),
                    wrote,
                    why: crate::core::claims::why(&effect.after, effect.shows.as_ref(), &decision.seen()),
                });
            } else if let Some(held) = self.replica.entry(&decision.id) {
                let held = held.version.clone();
                rt.audit(Event::Superseded { decision: decision.clone(), from: merged.from.clone(), held });
            }
            if let (Some(applied), Some(target)) = (&applied, &effect.write) {
                tell_discarded_pending(&merged.from, target, applied, rt);
            }
            // Settles exactly the ids of `unheld`: nothing in this loop
            // changes what the guard holds for another id.
            self.settle_held(decision, &effect.after, merged.operator.is_none(), rt);
            self.guard.forget_waiting(&decision.id, &effect.after.version);
            self.replica.set(&decision.id, effect.after);
            if wrote || merged.holds {
                n_applied.push((merged.arrival, 1));
            }
            // Forwarded per peer of origin, which need not get its own back:
            // what this node holds now, and the claims it learnt.
            if merged.holds || decision.version.is_claim() {
                match forward.iter_mut().find(|(from, _)| *from == merged.from) {
                    Some((_, decisions)) => decisions.push(merged.decision),
                    None => forward.push((merged.from, vec![merged.decision])),
                }
            }
        }
        for (from, decisions) in forward {
            rt.send(Some(&from), decisions);
        }
        // After forwarding: the audit lines are written, the store holds the decisions.
        rt.flush_audit();
        if !conflicts.is_empty() {
            self.forget_told_conflicts(now, rt);
        }
        n_applied
    }

    /// What committing `decision` does here: the entry afterwards, what the
    /// folders show before and after (see `claims.rs`: not always the
    /// decision held), and the write that makes them show it, if any.
    fn effect_of(&self, decision: &Decision, rt: &mut impl Runtime) -> Effect {
        let before = self.replica.effective(&decision.id);
        let after = self.replica.after(decision);
        let shows = crate::core::claims::effective(&after);
        // A write for the id failed to be recorded (it waits in the retry
        // list): the folders may already show something else than what is
        // held, so they are written whatever they should show.
        let unsure = self.retried(&decision.id).next().is_some();
        let write = match &shows {
            // Nothing decided here: nothing to undo, unless a key was trusted.
            None if !unsure && before.as_ref().is_none_or(|b| b.kind == VerdictKind::Deleted) => None,
            None => Some(Decision {
                id: decision.id.clone(),
                verdict: crate::core::Verdict::Deleted,
                version: decision.version.clone(),
                context: decision.context.clone(),
                relays: Default::default(),
                reached: Default::default(),
            }),
            Some(shows) if !unsure && before.as_ref().is_some_and(|b| b.agrees_with(shows)) => None,
            Some(shows) => Some(self.materialize(decision, shows, rt)),
        };
        Effect { before, shows, after, write }
    }

    /// The full decision (key bytes included) that `shows` stands for: the
    /// incoming one, or another known with the same key.
    fn materialize(&self, incoming: &Decision, shows: &Seen, rt: &mut impl Runtime) -> Decision {
        if incoming.seen().same_as(shows) {
            return incoming.clone();
        }
        let key = match (shows.kind, incoming.verdict.key()) {
            (VerdictKind::Deleted, _) => None,
            (_, Some(key)) if incoming.verdict.fingerprint() == shows.fingerprint => Some(key.clone()),
            _ => match rt.load(std::slice::from_ref(&incoming.id)) {
                Ok(known) => known
                    .into_iter()
                    .find(|d| d.verdict.fingerprint() == shows.fingerprint)
                    .and_then(|d| d.verdict.key().cloned()),
                Err(error) => {
                    rt.audit(Event::LoadFailed { error });
                    None
                }
            },
        };
        let verdict = match (shows.kind, key) {
            (VerdictKind::Accepted, Some(key)) => crate::core::Verdict::Accepted(key),
            (VerdictKind::Rejected, Some(key)) => crate::core::Verdict::Rejected(key),
            // A key no longer known (the store lost it): trusted by no one here.
            _ => crate::core::Verdict::Deleted,
        };
        Decision {
            id: incoming.id.clone(),
            verdict,
            version: shows.version.clone(),
            context: shows.context.clone(),
            relays: Default::default(),
            reached: Default::default(),
        }
    }
}

/// Tells the pending key `applied` discarded for `target`, the decision
/// written (brought by `from`), if it discarded one.
pub(in crate::node) fn tell_discarded_pending(
    from: &PeerName,
    target: &Decision,
    applied: &Applied,
    rt: &mut impl Runtime,
) {
    if let Some(pending) = &applied.discarded_pending {
        rt.audit(Event::PendingDiscarded {
            id: target.id.clone(),
            from: from.clone(),
            origin: target.version.node.clone(),
            pending: pending.fingerprint(),
            decided: target.verdict.fingerprint(),
        });
    }
}

/// The fingerprint of an accepted key that `decision` replaces with another
/// accepted key (its own outcome in the audit log, not a plain accept).
fn replaced_key(before: Option<&Seen>, decision: &Decision) -> Option<Fingerprint> {
    let before = before?;
    let new = decision.verdict.fingerprint();
    (before.kind == VerdictKind::Accepted
        && decision.verdict.kind() == VerdictKind::Accepted
        && before.fingerprint != new)
        .then_some(before.fingerprint)
        .flatten()
}

/// What one peer's decision does to this master (see [`Node::effect_of`]).
struct Effect {
    /// What the folders showed.
    before: Option<Seen>,
    /// What they show once it is committed.
    shows: Option<Seen>,
    /// The id's entry once it is committed.
    after: Entry,
    /// What is written to make them show it (`None`: they show it already).
    write: Option<Decision>,
}

impl Effect {
    /// Whether the folders end up saying what `decision` says.
    fn shows_incoming(&self, decision: &Decision) -> bool {
        self.shows.as_ref().is_some_and(|s| s.agrees_with(&decision.seen()))
    }
}
