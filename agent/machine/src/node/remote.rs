//! Peer side of the node: merging peers' decisions, applying the newer ones
//! to the folders durably, remembering the others, telling each conflict
//! exactly once, and forwarding what was applied.

use std::collections::HashSet;
use std::sync::Arc;

use crate::PeerName;

use crate::core::merge::{Conflict, MergeOutcome};
use crate::core::{Decision, MinionId};

use super::event::Event;
use super::runtime::{Runtime, StoreWrite};
use super::{FromPeer, Node, Now};

mod round;

pub(super) use round::tell_discarded_pending;

/// Where decisions handed to [`Node::apply_arrivals`] come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    /// From a peer (or waiting since): the guard judges them.
    Peer,
    /// Let through by the guard: not judged again.
    Guard,
    /// Their write failed and is retried: judged already, and possibly on
    /// disk, so they stay retries whatever waits.
    Retry,
}

/// A peer's decision merged in this round: to apply (it beats what is held)
/// or only to remember (it does not, but this node had not seen it).
pub(super) struct Merged {
    pub decision: Decision,
    /// It beats the decision held: held from now on (else only remembered).
    pub holds: bool,
    pub conflicts: Vec<Conflict>,
    /// The peer it came from ("journal" at start-up; this node for an
    /// operator's release or revert).
    pub from: PeerName,
    /// Which of the arrivals handled together brought it.
    pub arrival: usize,
    /// An operator's release or revert of a held delete (see `held.rs`).
    pub operator: Option<(super::OperatorAction, String, super::HeldDelete)>,
}

impl Node {
    /// Whether `origin` may have made a decision a peer sends: a master of
    /// the site (this node's own are checked apart: `NotOurs`), or a claim.
    fn is_site_origin(&self, origin: &Arc<str>) -> bool {
        **origin == *self.settings.node
            || self.settings.masters.contains(origin)
            || **origin == *crate::core::version::CLAIM_ACCEPT
            || **origin == *crate::core::version::CLAIM_REJECT
    }

    /// Peers' decisions whose origin is no master of the site are refused,
    /// told once per arrival with a count: a peer decides only as itself or
    /// as a master this node knows, never as a name it made up.
    fn refuse_strangers(
        &mut self,
        arrivals: Vec<(PeerName, Vec<Decision>)>,
        rt: &mut impl Runtime,
    ) -> Vec<(PeerName, Vec<Decision>)> {
        arrivals
            .into_iter()
            .map(|(from, decisions)| {
                if decisions.iter().all(|d| self.is_site_origin(&d.version.node)) {
                    return (from, decisions);
                }
                let (kept, refused): (Vec<Decision>, Vec<Decision>) =
                    decisions.into_iter().partition(|d| self.is_site_origin(&d.version.node));
                let mut origins: Vec<Arc<str>> = refused.iter().map(|d| d.version.node.clone()).collect();
                origins.sort();
                origins.dedup();
                let n_origins = origins.len();
                origins.truncate(3);
                let first = refused[0].id.clone();
                rt.audit(Event::UnknownOrigins { from: from.clone(), n: refused.len(), n_origins, origins, first });
                (from, kept)
            })
            .collect()
    }

    /// Whether `decision` is refused for the first time (told once: anti-
    /// entropy offers the same version again and again). The memory of what
    /// was told is bounded: a peer sending ever new versions makes it start
    /// afresh, telling some again (the audit log aggregates a peer's
    /// refusals), never grow without end.
    fn first_report(&mut self, decision: &Decision) -> bool {
        const MAX_REPORTED: usize = 50_000;
        if self.reported.len() >= MAX_REPORTED {
            self.reported = HashSet::new();
        }
        self.reported.insert((decision.id.clone(), decision.version.clone()))
    }

    /// Peers' decisions, one arrival per push (or fetch) handled together:
    /// merged, and the newer ones applied as one batch — one journal
    /// commit, one syncfs, one store commit and one audit flush for all of
    /// them. Returns, per arrival, how many of its decisions were applied.
    pub fn on_batches(
        &mut self,
        arrivals: Vec<(PeerName, Vec<Decision>)>,
        now: Now,
        rt: &mut impl Runtime,
    ) -> Vec<u32> {
        self.seen = now.mono;
        if self.is_stale() {
            // Nothing is applied, whoever made it: `rejoin` first.
            return vec![0; arrivals.len()];
        }
        let heard = arrivals.iter().any(|(_, decisions)| !decisions.is_empty());
        let n_applied = self.apply_arrivals(arrivals, Source::Peer, now, rt);
        self.cool();
        if heard {
            // A peer's decisions come as they are made: its deletes so far
            // are known here (see `stale.rs`).
            self.on_contact(now, rt);
        }
        n_applied
    }

    /// Merges and applies in rounds, each handling one decision per id, so
    /// several decisions about one id (from several peers, or one peer's
    /// backlog) meet one after the other, as if they had come separately.
    /// Deletes of accepted keys go to the guard first, unless judged already
    /// (retried, or let through by the guard: see [`Source`]).
    pub(super) fn apply_arrivals(
        &mut self,
        arrivals: Vec<(PeerName, Vec<Decision>)>,
        source: Source,
        now: Now,
        rt: &mut impl Runtime,
    ) -> Vec<u32> {
        let judged = source != Source::Peer;
        let max_skew = self.settings.max_clock_skew.as_millis() as u64;
        let mut n_applied = vec![0; arrivals.len()];
        let arrivals = if judged { arrivals } else { self.refuse_strangers(arrivals, rt) };
        if self.waiting.rescan_pending {
            // Operators' changes are not recorded yet (writes failed): a peer's
            // decision written now could cover one of them, silently. Record
            // them first if the backoff allows, else wait with the decisions.
            // (Not for the retries themselves: `retry_failed` rescanned just
            // before, with them still listed as the agent's own writes.)
            if source != Source::Retry && self.trouble.retry_due(now.mono) {
                self.waiting.rescan_pending = false;
                self.rescan("before peers' decisions, after a failed write", now, rt);
            }
            if self.waiting.rescan_pending {
                for (from, decisions) in arrivals {
                    for decision in decisions {
                        if source == Source::Retry {
                            // Possibly on disk: it stays a retry, so that the
                            // rescan does not take its write for an operator's.
                            self.waiting.retry.push((from.clone(), decision));
                        } else {
                            self.wait_for_rescan(from.clone(), decision);
                        }
                    }
                }
                return n_applied;
            }
        }
        let mut todo: Vec<(usize, PeerName, Decision)> = Vec::new();
        // Per arrival: its peer, and the ids of this node's own forgotten
        // decisions it brought back (told once per arrival).
        let mut taken_back: Vec<(PeerName, Vec<MinionId>)> = Vec::new();
        for (arrival, (from, decisions)) in arrivals.into_iter().enumerate() {
            taken_back.push((from.clone(), Vec::new()));
            todo.extend(decisions.into_iter().map(|mut d| {
                // The peer it came from is on its path now (authenticated by TLS).
                d.relays = d.relays.then(&from, &d.version.node);
                (arrival, from.clone(), d)
            }));
        }
        // Plain tombstones among these ids are read back from the store first.
        // If it cannot be read, nothing is decided: the peers still hold
        // these decisions and offer them again (a retry's is retried).
        if let Err(e) = self.warm(todo.iter().map(|(_, _, d)| &d.id), rt) {
            // Retried after the backoff: judged ones (possibly on disk, or let
            // through by the guard) as retries, the others merged afresh.
            self.retry_after_cold_failure(&e, now, rt);
            for (_, from, decision) in todo {
                match source {
                    Source::Retry | Source::Guard => self.waiting.retry.push((from, decision)),
                    Source::Peer => self.wait_for_rescan(from, decision),
                }
            }
            return n_applied;
        }
        let mut guarded: Vec<(PeerName, Decision)> = Vec::new();
        while !todo.is_empty() {
            let mut round: Vec<Merged> = Vec::new();
            let mut ids: HashSet<MinionId> = HashSet::new();
            let mut later = Vec::new();
            for (arrival, from, decision) in todo {
                if ids.contains(&decision.id) {
                    later.push((arrival, from, decision));
                    continue;
                }
                if self.settler.is_unsettled(decision.id.as_str()) {
                    // A salt-key run on this id is in progress here (or may be: events
                    // were lost, and the recheck has not settled): writing now would
                    // mix with it. Merged once its events have settled (apply_deferred).
                    rt.audit(Event::Deferred { id: decision.id.clone(), from: from.clone() });
                    if source == Source::Retry {
                        // Possibly on disk already: still listed as the agent's own
                        // write when the run's events are read, retried after.
                        self.waiting.retry_settling.push((from, decision));
                    } else {
                        self.waiting.deferred.push((from, decision));
                    }
                    continue;
                }
                // A write for this id waits for its retry (it may be on disk,
                // journalled, not recorded): one decision per id in flight, so
                // the journal (one entry per id) never loses it. This one
                // follows once the retry is done (the same one is the retry's).
                let retrying = {
                    let mut retried = self.retried(&decision.id).peekable();
                    retried.peek().is_some().then(|| retried.any(|r| r.version == decision.version))
                };
                if let Some(this_one) = retrying {
                    if !this_one {
                        self.wait_for_rescan(from, decision);
                    }
                    continue;
                }
                if self.compacted(&decision, now) {
                    continue;
                }
                let decision = self.doubt_claims(decision, &from, now, rt);
                // (An operator's release or revert retried after a failed write
                // comes from this node itself: it made it.)
                let retried_own = *from.as_str() == *self.settings.node;
                let mut own_past = false;
                if *decision.version.node == *self.settings.node && !retried_own && !self.issued(&decision) {
                    if self.forgotten_past(&decision, now) {
                        own_past = true;
                    } else {
                        // Claims this node as its origin, and this node never made it.
                        if self.first_report(&decision) {
                            rt.audit(Event::NotOurs { decision, from });
                        }
                        continue;
                    }
                }
                match self.replica.merge(&decision, now.wall_ms, max_skew) {
                    Err(error) => {
                        // Told once: anti-entropy offers the same version again and again.
                        if self.first_report(&decision) {
                            rt.audit(Event::FromTheFuture { decision, from, error });
                        }
                    }
                    Ok(merged) => {
                        if merged.outcome == MergeOutcome::Duplicate {
                            continue;
                        }
                        self.merged_delete(&decision);
                        if own_past && !judged {
                            // Told when it first comes (a retry or what the
                            // guard lets through was told then).
                            taken_back[arrival].1.push(decision.id.clone());
                        }
                        let holds = merged.outcome == MergeOutcome::Apply;
                        if holds && !judged && (self.guards(&decision) || (own_past && self.judges(&decision))) {
                            guarded.push((from, decision));
                            continue;
                        }
                        ids.insert(decision.id.clone());
                        let conflicts = merged.conflicts;
                        round.push(Merged { decision, holds, conflicts, from, arrival, operator: None });
                    }
                }
            }
            round.sort_by(|a, b| a.decision.id.cmp(&b.decision.id));
            for (arrival, n) in self.apply_round(round, now, rt) {
                n_applied[arrival] += n;
            }
            todo = later;
        }
        let afresh_ms = self.afresh >> crate::core::version::LOGICAL_BITS;
        for (from, ids) in taken_back.into_iter().filter(|(_, ids)| !ids.is_empty()) {
            rt.audit(Event::TakenBack { from, n: ids.len(), first: ids[0].clone(), afresh_ms });
        }
        self.offer_guarded(guarded, now, rt);
        n_applied
    }

    /// Whether `decision`, naming this node as its origin and not held
    /// here, is its own forgotten past: made before this node's store
    /// started afresh (`recover --from-peers`, or a purge and reinstall),
    /// under a version this node knows nothing of (another content under a
    /// version it knows is not its own), and within `tombstone_ttl` of that
    /// start (by then its peers have forgotten its earlier deletes, and
    /// its other earlier decisions came at the first rounds). No peer can
    /// speak for this node in anything it decides after that start, nor
    /// for long.
    fn forgotten_past(&self, decision: &Decision, now: Now) -> bool {
        let version = &decision.version;
        let known = self.replica.entry(&decision.id).is_some_and(|entry| {
            entry.version == *version
                || entry.seen().iter().any(|s| s.version == *version)
                || entry.mine() == Some(version)
        });
        version.hlc < self.afresh
            && now.wall_ms < (self.afresh >> crate::core::version::LOGICAL_BITS).saturating_add(self.ttl_ms())
            && !known
    }

    /// A decision may claim to have known one of this node's own decisions
    /// only if this node made it: a claim of one it never made (an hlc it
    /// never issued for this id) would hide a conflict this node can see for
    /// itself, so it is dropped from the context (and told).
    fn doubt_claims(&self, decision: Decision, from: &PeerName, now: Now, rt: &mut impl Runtime) -> Decision {
        let node = &*self.settings.node;
        let Some(claimed) = decision.context.iter().find(|v| &*v.node == node).cloned() else { return decision };
        if self.past_ttl(&claimed, now) || claimed.hlc < self.afresh {
            // This node may have compacted it (a delete), or made it before
            // its store started afresh: it cannot tell.
            return decision;
        }
        let made = self
            .replica
            .entry(&decision.id)
            .is_some_and(|entry| entry.version == claimed || entry.seen().iter().any(|s| s.version == claimed));
        if made {
            return decision;
        }
        let context = crate::core::Context::new(decision.context.iter().filter(|v| **v != claimed).cloned());
        rt.audit(Event::Doubted { decision: decision.clone(), from: from.clone(), claimed });
        Decision { context, ..decision }
    }

    /// Whether this node made `decision` (it claims this node as origin):
    /// the node holds it, or remembers it.
    fn issued(&self, decision: &Decision) -> bool {
        let mine = decision.seen();
        self.replica
            .entry(&decision.id)
            .is_some_and(|entry| entry.held().same_as(&mine) || entry.seen().iter().any(|s| s.same_as(&mine)))
    }

    /// The conflicts kept in the store until told are told now (the audit
    /// log was flushed): the store forgets them. Should this fail, they are
    /// checked against the audit log at the next start instead.
    fn forget_told_conflicts(&mut self, now: Now, rt: &mut impl Runtime) {
        let write = StoreWrite { conflicts_told: true, clock: self.replica.clock(), ..StoreWrite::default() };
        if let Err(e) = rt.record(&write) {
            self.trouble.failed(rt, now.mono, "state store", &e);
        }
    }

    /// Start-up: conflicts kept in the store and not found in the audit log
    /// (a stop between the store commit and the audit write) are told now.
    pub(super) fn tell_untold(&mut self, untold: Vec<(PeerName, Conflict)>, now: Now, rt: &mut impl Runtime) {
        if untold.is_empty() {
            return;
        }
        for (from, conflict) in untold {
            if !rt.was_told(&conflict) {
                rt.audit(Event::Conflict { conflict, from });
            }
        }
        rt.flush_audit();
        self.forget_told_conflicts(now, rt);
    }
}

/// Peers' decisions grouped by the peer they came from, one arrival each,
/// in the order the peers first appear (the same run always merges alike).
pub(super) fn by_peer(decisions: Vec<FromPeer>) -> Vec<(PeerName, Vec<Decision>)> {
    let mut grouped: Vec<(PeerName, Vec<Decision>)> = Vec::new();
    for (from, decision) in decisions {
        match grouped.iter_mut().find(|(peer, _)| *peer == from) {
            Some((_, decisions)) => decisions.push(decision),
            None => grouped.push((from, vec![decision])),
        }
    }
    grouped
}
