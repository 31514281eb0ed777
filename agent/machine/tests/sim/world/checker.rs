//! The end of a run, judged in Jepsen's set-full terms over every decision
//! made durable anywhere: lost (the newest decision is held nowhere), stale
//! (a master left on an older version), resurrected (a master trusting a
//! key the final decision deleted or rejected), never applied (a master
//! whose folders do not say what it holds); plus propagation latency in
//! virtual time, and the late joiner's files never overriding the cluster.
//! Conflicts are judged on the events told and on the audit records made of
//! them (`audited.rs`, which judges held deletes' records too).

use super::*;
use keysync_machine::core::merge::conflicting;
use keysync_machine::core::{Entry, PublicKey, Seen, Verdict};
use keysync_machine::node::testing::Stored;

/// What a run found; every count but the latencies must be 0.
#[derive(Clone, Debug, Default)]
pub(crate) struct Verdicts {
    pub(crate) lost: u64,
    pub(crate) stale: u64,
    pub(crate) resurrected: u64,
    pub(crate) never_applied: u64,
    /// Milliseconds from a live decision's durability on its origin to its
    /// application on each other master.
    pub(crate) latencies_ms: Vec<u64>,
    /// Conflicts told, each pair of concurrent, disagreeing decisions a
    /// master holds or remembers told there once: missed and duplicated
    /// (or told without cause) must be 0.
    pub(crate) conflicts_told: u64,
    pub(crate) conflicts_missed: u64,
    pub(crate) conflicts_duplicated: u64,
    /// Conflict pairs recorded once in the audit log as the agent writes
    /// it, and held deletes whose end is recorded once (`audited.rs`).
    pub(crate) conflicts_recorded: u64,
    pub(crate) held_recorded: u64,
    /// Conflict pairs or held deletes with no record, or more than one, and
    /// records without cause: must be 0.
    pub(crate) unaudited: u64,
}

/// How often each key was told, against the keys `expected` once each
/// (and once more for each time it was `forgotten`: compacted, then met
/// again), and the `forgotten` ones no longer expected any number of times.
pub(super) struct Tally<K> {
    pub(super) once: u64,
    pub(super) missed: Vec<K>,
    pub(super) repeated: Vec<(K, u64)>,
    /// Told, neither expected nor forgotten.
    pub(super) unexpected: Vec<(K, u64)>,
}

pub(super) fn tally<K: Ord + Clone>(
    expected: &BTreeSet<K>,
    forgotten: &BTreeMap<K, u64>,
    told: &BTreeMap<K, u64>,
) -> Tally<K> {
    let mut tally = Tally { once: 0, missed: Vec::new(), repeated: Vec::new(), unexpected: Vec::new() };
    for key in expected {
        let times_forgotten = forgotten.get(key).copied().unwrap_or(0);
        match told.get(key) {
            None => tally.missed.push(key.clone()),
            Some(&k) if k <= 1 + times_forgotten => tally.once += 1,
            Some(&k) => tally.repeated.push((key.clone(), k)),
        }
    }
    for (key, &k) in told {
        if !expected.contains(key) && !forgotten.contains_key(key) {
            tally.unexpected.push((key.clone(), k));
        }
    }
    tally
}

impl Sim {
    pub(crate) fn judge(&mut self) {
        let winners: BTreeMap<MinionId, Decision> = self
            .made
            .iter()
            .map(|(id, ds)| {
                (id.clone(), ds.iter().map(|m| &m.decision).max_by(|a, b| a.version.cmp(&b.version)).unwrap().clone())
            })
            .collect();
        let mut verdicts = Verdicts::default();
        let mut problems = Vec::new();
        for (idx, n) in self.nodes.iter().enumerate() {
            let Some(machine) = &n.machine else {
                self.fail(format!("{} is not running at the end", n.name));
            };
            if !machine.is_quiet() || !n.touched.is_empty() || !n.in_flight.is_empty() {
                let work: Vec<node::Waits> = machine.waits().filter(|w| w.kind == node::Kind::Work).collect();
                self.fail(format!("{} did not come to rest: waits on {work:?}", n.name));
            }
            for id in &self.ids {
                // Plain tombstones stay in the store, not in memory.
                let cold = n.store.decisions.get(id).filter(|s| s.is_plain_tombstone()).map(|s| s.entry());
                let held = machine.entry(id).or(cold.as_ref());
                let winner = winners.get(id);
                match (held, winner) {
                    (None, None) => {}
                    // Deleted: a master holding no tombstone (it never held the id, or
                    // compacted it), or an older one, shows the same and is in the
                    // same digests. The folders are checked below.
                    (held, Some(winner))
                        if winner.verdict == Verdict::Deleted && held.is_none_or(Entry::is_plain_tombstone) => {}
                    (Some(held), Some(winner)) if held.version == winner.version => {}
                    (Some(held), Some(winner)) if held.version < winner.version => {
                        verdicts.stale += 1;
                        problems.push(format!(
                            "{}: {id} stale at {}, the newest is {}",
                            n.name, held.version, winner.version
                        ));
                    }
                    (held, winner) => {
                        verdicts.lost += 1;
                        problems.push(format!(
                            "{}: {id} holds {:?}, the newest made anywhere is {:?}",
                            n.name,
                            held.map(|h| &h.version),
                            winner.map(|w| &w.version)
                        ));
                    }
                }
                // The folders say what the rules of first contact make this
                // master show, byte for byte (computed from everything made
                // anywhere, not from the node's entry).
                let name = id.as_str();
                let (accepted, rejected) = (n.disk.get(Folder::Accepted, name), n.disk.get(Folder::Rejected, name));
                let mine = n.store.decisions.get(id).and_then(|s| s.mine.clone());
                let verdict = expected_shown(self.made.get(id).map(Vec::as_slice).unwrap_or_default(), mine.as_ref());
                let ok = match &verdict {
                    Some(Verdict::Accepted(key)) => {
                        accepted.map(Vec::as_slice) == Some(key.bytes()) && rejected.is_none()
                    }
                    Some(Verdict::Rejected(key)) => {
                        rejected.map(Vec::as_slice) == Some(key.bytes()) && accepted.is_none()
                    }
                    Some(Verdict::Deleted) | None => accepted.is_none() && rejected.is_none(),
                };
                if !ok {
                    let trusts = accepted.is_some() && !matches!(verdict, Some(Verdict::Accepted(_)));
                    if trusts
                        && matches!(winners.get(id).map(|w| &w.verdict), Some(Verdict::Deleted | Verdict::Rejected(_)))
                    {
                        verdicts.resurrected += 1;
                    } else {
                        verdicts.never_applied += 1;
                    }
                    problems.push(format!(
                        "{}: folders for {id} are {:?}, it should show {verdict:?} (its own claim {mine:?})",
                        n.name,
                        n.disk.slots(name)
                    ));
                }
            }
            self.check_first_contact(n, &mut problems);
            for name in n.disk.names() {
                if !self.ids.iter().any(|id| id.as_str() == name) {
                    problems.push(format!("{} has a stray file {name}", n.name));
                }
            }
            // Plain tombstones are in the store only.
            if n.store
                .decisions
                .values()
                .filter(|s| !s.is_plain_tombstone())
                .map(|s| (&s.held.id, &s.held.version))
                .ne(machine_versions(machine).iter().map(|(i, v)| (i, v)))
            {
                problems.push(format!("{}: the store does not hold what the node holds", n.name));
            }
            let _ = idx;
        }
        self.check_nothing_held(&mut problems);
        // Conflicts: exactly the pairs each master saw, each told once there.
        for n in &self.nodes {
            let expected: BTreeSet<(MinionId, Version, Version)> =
                n.store.decisions.iter().flat_map(|(id, stored)| pairs(id, stored)).collect();
            // A plain tombstone past `tombstone_ttl` that won a conflict is
            // compacted with the decisions it saw (operations.md, "Deletes
            // are remembered for tombstone_ttl"): its conflicts were told,
            // then forgotten, whatever the id holds since (seed 1993: a
            // revert of the id came later). If both decisions come back,
            // the pair is met anew and told again, once per compaction
            // (reported for seed 11981: the guard on other masters held the
            // delete past tombstone_ttl, so they still offered the older
            // accept, which this master took back, as operations.md says of
            // deletes held that long, "Held deletes must be settled within
            // tombstone_ttl too", until the delete was let through and came
            // again).
            let mut forgotten: BTreeMap<(MinionId, Version, Version), u64> = BTreeMap::new();
            for pair in n.compacted.iter().flat_map(|(id, stored)| pairs(id, stored)) {
                *forgotten.entry(pair).or_default() += 1;
            }
            let mut told: BTreeMap<(MinionId, Version, Version), u64> = BTreeMap::new();
            for event in &n.audit {
                if let node::Event::Conflict { conflict, .. } = event {
                    let key = (conflict.id.clone(), conflict.winner.version.clone(), conflict.loser.version.clone());
                    *told.entry(key).or_default() += 1;
                }
            }
            let Tally { once, missed, repeated, unexpected } = tally(&expected, &forgotten, &told);
            verdicts.conflicts_told += once;
            for pair in missed {
                verdicts.conflicts_missed += 1;
                problems.push(format!("{}: conflict {pair:?} never told", n.name));
            }
            for (pair, k) in repeated {
                verdicts.conflicts_duplicated += k - 1;
                problems.push(format!("{}: conflict {pair:?} told {k} times", n.name));
            }
            for (pair, k) in unexpected {
                verdicts.conflicts_duplicated += k;
                problems.push(format!("{}: conflict {pair:?} told, but it holds no such pair", n.name));
            }
            // The same, on the records the agent writes of what was told.
            Sim::check_conflict_records(n, &expected, &forgotten, &mut verdicts, &mut problems);
            Sim::check_held_records(n, &mut verdicts, &mut problems);
        }
        // Every master computes the same digests from the same entries.
        let digests: BTreeSet<Option<Vec<u64>>> =
            self.nodes.iter().filter_map(|n| n.machine.as_ref()).map(|m| m.digests()).collect();
        if digests.len() > 1 {
            problems.push(format!("{} different digest sets at the end", digests.len()));
        }
        // A late joiner's claims never override a live decision the cluster
        // held when it joined (only its own rejection of a key accepted live
        // without knowing it stays, on the joiner alone: checked above).
        for (id, held) in &self.held_at_join {
            let winner = &winners[id];
            if !held.version.is_claim() && winner.version.is_claim() {
                problems
                    .push(format!("the late joiner's claim {} overrode {id}'s live {}", winner.version, held.version));
            }
        }
        // Propagation: each live decision, from durable at its origin to applied on each other master.
        for made in self.made.values().flatten() {
            let d = &made.decision;
            if d.version.is_claim() {
                continue;
            }
            for node in 0..self.nodes.len() {
                if *self.nodes[node].name == *d.version.node {
                    continue;
                }
                if let Some(at) = self.applied_at.get(&(node, d.id.clone(), d.version.clone())) {
                    verdicts.latencies_ms.push(at.saturating_sub(made.at));
                }
            }
        }
        if !problems.is_empty() {
            self.fail(format!(
                "lost {}, stale {}, resurrected {}, never applied {}, conflicts missed {}, duplicated {}, unaudited {}: \
                 {problems:#?}",
                verdicts.lost,
                verdicts.stale,
                verdicts.resurrected,
                verdicts.never_applied,
                verdicts.conflicts_missed,
                verdicts.conflicts_duplicated,
                verdicts.unaudited
            ));
        }
        self.stats.verdicts = verdicts;
    }
}

impl Sim {
    /// First contact, as the issue words it: no master trusts a key it did
    /// not hold unless every claim agreed on it (where no live decision was
    /// made), and every disagreement of claims is audited on every master.
    fn check_first_contact(&self, n: &SimNode, problems: &mut Vec<String>) {
        for id in &self.ids {
            let made = self.made.get(id).map(Vec::as_slice).unwrap_or_default();
            let claims: Vec<&Decision> = made.iter().map(|m| &m.decision).filter(|d| d.version.is_claim()).collect();
            if claims.is_empty() {
                continue;
            }
            let mine = n.store.decisions.get(id).and_then(|s| s.mine.clone());
            let own = mine.as_ref().and_then(|v| claims.iter().find(|c| c.version == *v));
            let live = made.iter().any(|m| !m.decision.version.is_claim());
            if let (false, Some(bytes)) = (live, n.disk.get(Folder::Accepted, id.as_str())) {
                let held_it = own.is_some_and(|o| o.verdict == Verdict::Accepted(PublicKey::new(bytes.clone())));
                let all_agree = claims.iter().all(|c| c.verdict == Verdict::Accepted(PublicKey::new(bytes.clone())));
                if !held_it && !all_agree {
                    problems
                        .push(format!("{}: trusts a key for {id} it did not hold, and the claims disagree", n.name));
                }
            }
            let disagrees = claims.iter().any(|c| own.is_none_or(|o| o.verdict != c.verdict));
            let audited = n.audit.iter().any(|e| match e {
                node::Event::Applied { decision, .. }
                | node::Event::Kept { decision, .. }
                | node::Event::Superseded { decision, .. } => decision.id == *id,
                node::Event::Conflict { conflict, .. } => conflict.id == *id,
                _ => false,
            });
            if disagrees && !audited && !n.audit_maybe_lost.contains(id) {
                problems.push(format!(
                    "{}: the claims about {id} disagree with its own ({:?}), and it audited nothing: claims {:?}, held {:?}",
                    n.name,
                    own.map(|o| &o.version),
                    claims.iter().map(|c| c.version.to_string()).collect::<Vec<_>>(),
                    n.store.decisions.get(id).map(|s| (&s.held.version, s.seen.iter().map(|x| x.version.to_string()).collect::<Vec<_>>()))
                ));
            }
        }
    }
}

/// What a master whose own claim is `mine` must show for an id, given every
/// decision made about it anywhere (`None`: no key decided): the newest live
/// decision, unless the master's own claim rejects the very key it accepted
/// without knowing that rejection; with no live decision, the claims by
/// rule: one key, rejected if any master rejected it, else accepted; two
/// keys, the master's own (rejected if any master rejected that key), or
/// none.
fn expected_shown(made: &[Made], mine: Option<&Version>) -> Option<Verdict> {
    let claims: Vec<&Decision> = made.iter().map(|m| &m.decision).filter(|d| d.version.is_claim()).collect();
    let own = mine.and_then(|v| claims.iter().find(|c| c.version == *v).copied());
    let of_key = |key: &Decision| -> Verdict {
        let fp = key.verdict.fingerprint();
        claims
            .iter()
            .find(|c| c.verdict.fingerprint() == fp && matches!(c.verdict, Verdict::Rejected(_)))
            .map_or_else(|| key.verdict.clone(), |c| c.verdict.clone())
    };
    let live =
        made.iter().map(|m| &m.decision).filter(|d| !d.version.is_claim()).max_by(|a, b| a.version.cmp(&b.version));
    if let Some(live) = live {
        if let (Some(own), Verdict::Accepted(key)) = (own, &live.verdict) {
            if own.verdict == Verdict::Rejected(key.clone()) && !live.context.knows(&own.version) {
                return Some(own.verdict.clone());
            }
        }
        return Some(live.verdict.clone());
    }
    let first = claims.first()?;
    if claims.iter().all(|c| c.verdict.fingerprint() == first.verdict.fingerprint()) {
        return Some(of_key(first));
    }
    own.map(of_key)
}

/// The conflicts a master holding `stored` for `id` has seen: each pair of
/// concurrent, disagreeing decisions among the one held and those seen
/// (id, winner, loser).
fn pairs(id: &MinionId, stored: &Stored) -> Vec<(MinionId, Version, Version)> {
    let all: Vec<Seen> = std::iter::once(stored.held.seen()).chain(stored.seen.iter().cloned()).collect();
    let mut pairs = Vec::new();
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            if conflicting(a, b) {
                let (w, l) = if a.beats(b) { (a, b) } else { (b, a) };
                pairs.push((id.clone(), w.version.clone(), l.version.clone()));
            }
        }
    }
    pairs
}

fn machine_versions(machine: &Node) -> Vec<(MinionId, Version)> {
    let mut versions: Vec<(MinionId, Version)> =
        machine.entries().map(|(id, e)| (id.clone(), e.version.clone())).collect();
    versions.sort();
    versions
}

/// A pair still held is told once, and once more for each time it was
/// compacted and met again (seed 11981); a pair compacted and not held
/// again may have been told any number of times before it was forgotten.
#[test]
fn a_pair_compacted_and_met_again_may_be_told_once_more() {
    let expected: BTreeSet<&str> = ["held", "held-compacted-once"].into();
    let forgotten: BTreeMap<&str, u64> = [("held-compacted-once", 1), ("gone", 1)].into();
    let told: BTreeMap<&str, u64> = [("held", 1), ("held-compacted-once", 2), ("gone", 3)].into();
    let t = tally(&expected, &forgotten, &told);
    assert_eq!((t.once, t.missed.len(), t.repeated.len(), t.unexpected.len()), (2, 0, 0, 0));
    // Told a third time after one compaction, or twice with none, is a duplicate.
    let told: BTreeMap<&str, u64> = [("held", 2), ("held-compacted-once", 3)].into();
    let t = tally(&expected, &forgotten, &told);
    assert_eq!(t.repeated, vec![("held", 2), ("held-compacted-once", 3)]);
}
