//! The blast-radius guard in the simulation: operators' mass deletes
//! (`salt-key -D`), operators releasing or reverting what the guard held,
//! and the checks that no held delete is ever lost or applied without a
//! release (each leaves the store only with an event that says why, and a
//! held version is applied only once its key is no longer accepted there).

use super::*;
use keysync_machine::core::Verdict;
use keysync_machine::node::{GuardSettings, Settled};

/// The guard as the simulation runs it: small enough that random operators
/// and mass deletes trip it among 30 ids, the default `quiet`.
pub(crate) fn settings() -> GuardSettings {
    GuardSettings { window: Duration::from_secs(10), max_deletes: 3, ..GuardSettings::default() }
}

/// Resolution rounds after the final restart, at most.
const MAX_RESOLVE_ROUNDS: u32 = 6;

impl Sim {
    /// `salt-key -D` on `node`: every id with a file there is removed, one
    /// after another, a few milliseconds apart (see [`Sim::mass_delete_next`]).
    pub(crate) fn mass_delete(&mut self, node: usize) {
        self.stats.mass_deletes += 1;
        let ids: Vec<MinionId> = self
            .ids
            .iter()
            .filter(|id| Folder::ALL.into_iter().any(|f| self.nodes[node].disk.has(f, id.as_str())))
            .cloned()
            .collect();
        trace!(self, "{} operator: salt-key -D ({} ids)", self.nodes[node].name, ids.len());
        self.mass_delete_next(node, ids);
    }

    /// The next id of a `salt-key -D` run: its files removed now (unless
    /// another salt-key run is working on it), the rest a little later.
    pub(crate) fn mass_delete_next(&mut self, node: usize, mut ids: Vec<MinionId>) {
        if ids.is_empty() {
            return;
        }
        let id = ids.remove(0);
        let n = &self.nodes[node];
        let busy = n.in_flight.contains(&id) || (n.up() && n.touched.contains_key(&id));
        let present: Vec<Folder> = Folder::ALL.into_iter().filter(|&f| n.disk.has(f, id.as_str())).collect();
        if !busy && !present.is_empty() {
            let n = &mut self.nodes[node];
            let up = n.up();
            n.undecided_changes.insert(id.clone());
            if up {
                n.in_flight.insert(id.clone());
                n.touched.insert(id.clone(), Expect::AtMost(Verdict::Deleted));
            } else {
                n.touched.remove(&id);
            }
            let n_steps = present.len();
            for (i, folder) in present.into_iter().enumerate() {
                let step = Step::unlink(folder, id.as_str());
                if up {
                    self.step(node, id.clone(), step, i + 1 == n_steps);
                } else {
                    for change in &step.changes {
                        self.nodes[node].disk.change(change);
                    }
                }
            }
        }
        let next = self.now + self.rng.between(1, 8);
        self.schedule(next, Event::MassDelete { node, ids });
    }

    /// An operator on `node` releases or reverts what its guard holds (all
    /// of it, or one origin's): `release` if given, else either. Returns
    /// whether anything was held there.
    pub(crate) fn resolve_held(&mut self, node: usize, release: Option<bool>) -> bool {
        let Some(machine) = self.nodes[node].machine.as_ref() else { return false };
        let held: Vec<(MinionId, std::sync::Arc<str>)> =
            machine.held().map(|h| (h.decision.id.clone(), h.origin().clone())).collect();
        if held.is_empty() {
            return false;
        }
        let origin = self.rng.percent(30).then(|| held[self.rng.index(held.len())].1.clone());
        let release = release.unwrap_or_else(|| self.rng.percent(50));
        let what = if release { "release" } else { "revert" };
        trace!(self, "{} operator: {what} {} held deletes (origin {origin:?})", self.nodes[node].name, held.len());
        // What the store held of each id when the command was given: what
        // its decisions must know, even if a failed write delays them. (Their
        // decisions are the operator's, whatever earlier change of the id
        // awaited one: see `note_recorded`.)
        let n = &mut self.nodes[node];
        for (id, _) in &held {
            if let Some(stored) = n.store.decisions.get(id).cloned() {
                n.commanded.insert(id.clone(), stored);
            }
        }
        let outcome = self.input(node, |machine, rt, now| {
            if release {
                machine.release_held(origin.as_deref(), &[], "operator", now, rt)
            } else {
                machine.revert_held(origin.as_deref(), &[], "operator", now, rt)
            }
        });
        // The ids it skipped keep the expectations they had (an earlier
        // command may still retry them: what it did not decide now is left
        // to whichever decision comes).
        if let Some(Ok(outcome)) = &outcome {
            let n = &mut self.nodes[node];
            n.command_retrying.extend(outcome.retrying.iter().cloned());
            for id in &outcome.skipped {
                if !n.command_retrying.contains(id) {
                    n.commanded.remove(id);
                }
            }
        }
        true
    }

    /// After the final restart: every master's held deletes are released or
    /// reverted, round after round, until none is held and all are quiet.
    /// The operators of a round all release, or all revert, as a site ends
    /// a mass delete one way (masters releasing what others revert in the
    /// same round made new conflicts every round, and seed 5602 ran out of
    /// rounds).
    pub(crate) fn resolve(&mut self, round: u32) {
        let mut busy = false;
        let release = self.rng.percent(50);
        for node in 0..self.nodes.len() {
            busy |= self.resolve_held(node, Some(release));
            busy |= self.nodes[node].machine.as_ref().is_some_and(|m| !m.is_quiet());
        }
        if busy && round < MAX_RESOLVE_ROUNDS {
            self.schedule(self.now + 1_500, Event::FinalRound);
            self.schedule(self.now + 3_000, Event::Resolve { round: round + 1 });
        }
    }

    /// What an input did to the node's held deletes (`before`: the store's
    /// held versions before it): a delete leaves the store only with an event
    /// saying why, and a version held there ever is noted.
    pub(crate) fn check_held(&mut self, node: usize, before: &BTreeMap<MinionId, Version>, killed: bool) {
        let n = &mut self.nodes[node];
        for (id, held) in &n.store.held {
            n.ever_held.insert((id.clone(), held.decision.version.clone()));
        }
        for (id, version) in before {
            if n.store.held.get(id).is_some_and(|h| h.decision.version == *version) {
                continue;
            }
            if killed {
                // Its record may have been buffered and lost with the process.
                n.audit_maybe_lost.insert(id.clone());
                continue;
            }
            // Told in this input, or earlier if the store could not keep up.
            let told = n.audit.iter().any(|e| match e {
                node::Event::HeldSettled { held, .. } | node::Event::Operator { held, .. } => {
                    held.decision.id == *id && held.decision.version == *version
                }
                _ => false,
            });
            if !told {
                let name = n.name.clone();
                self.fail(format!("{name}'s held delete {id} {version} left the store without a word"));
            }
        }
    }

    /// A peer's decision `node` recorded: if the guard ever held that very
    /// version there, it may be applied only once no longer judged (its key
    /// was not accepted there any more).
    pub(crate) fn check_not_held(&self, node: usize, decision: &Decision) {
        let n = &self.nodes[node];
        if !n.ever_held.contains(&(decision.id.clone(), decision.version.clone())) {
            return;
        }
        let let_through = n.audit.iter().any(|e| {
            // No longer judged, or given back to be judged with its origin's
            // own deletes (it came from the origin after it was held as
            // forwarded by another peer) — this version, or a newer held
            // delete of the id that replaced it (the key is no longer
            // accepted here: neither is judged any more).
            matches!(e, node::Event::HeldSettled { held, how: Settled::NotAccepted | Settled::Rejudged }
                if held.decision.id == decision.id && held.decision.version >= decision.version)
        });
        if !let_through && !n.audit_maybe_lost.contains(&decision.id) {
            self.fail(format!(
                "{} applied {} {}, which its guard held, without a release",
                n.name, decision.id, decision.version
            ));
        }
    }

    /// At the end: nothing is held anywhere, in the machine or the store.
    pub(crate) fn check_nothing_held(&mut self, problems: &mut Vec<String>) {
        for event in self.nodes.iter().flat_map(|n| &n.audit) {
            match event {
                node::Event::DeletesHeld { .. } => self.stats.bursts_held += 1,
                node::Event::Operator { action: node::OperatorAction::Release, .. } => self.stats.released += 1,
                node::Event::Operator { action: node::OperatorAction::Revert, .. } => self.stats.reverted += 1,
                node::Event::HeldSettled { .. } => self.stats.settled += 1,
                _ => {}
            }
        }
        for n in &self.nodes {
            let in_machine = n.machine.as_ref().map_or(0, |m| m.held().count());
            if in_machine > 0 || !n.store.held.is_empty() {
                problems.push(format!(
                    "{} still holds {in_machine} deletes ({} in its store)",
                    n.name,
                    n.store.held.len()
                ));
            }
        }
    }
}

/// The store's held deletes, by id and version.
pub(crate) fn held_versions(store: &Store) -> BTreeMap<MinionId, Version> {
    store.held.iter().map(|(id, h)| (id.clone(), h.decision.version.clone())).collect()
}
