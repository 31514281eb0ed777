//! What a node's store gains in each input, checked as it happens: its own
//! decisions against what the operator did and what it may know, a peer's
//! decision against the guard.

use super::*;

impl Sim {
    /// What the node's store gained in an input: its own new decisions (checked
    /// against what the operator did) and peers' decisions it applied.
    pub(super) fn note_recorded(&mut self, node: usize, recorded: Vec<crate::runtime::Recorded>) {
        let name = self.nodes[node].name.clone();
        for (decision, before, mine) in recorded {
            if before.as_ref().is_some_and(|stored| stored.held.version == decision.version) {
                continue;
            }
            let id = decision.id.clone();
            // Its own: a live decision it made, or a claim of its first start.
            let own = if decision.version.is_claim() { mine } else { *decision.version.node == *name };
            if own && !self.applied_at.contains_key(&(node, id.clone(), decision.version.clone())) {
                let commanded = self.nodes[node].commanded.remove(&id);
                self.nodes[node].command_retrying.remove(&id);
                if commanded.is_some() {
                    // An operator's release or revert: what the operator asked
                    // for, whatever earlier change of the id awaited a decision.
                    self.nodes[node].touched.remove(&id);
                    self.nodes[node].undecided_changes.insert(id.clone());
                }
                self.check_local(node, &decision);
                self.check_context(node, &decision, commanded.as_ref().or(before.as_ref()));
                self.delivered[node].entry(id.clone()).or_default().insert(decision.version.clone());
                self.made.entry(id.clone()).or_default().push(Made { decision: decision.clone(), at: self.now });
                self.stats.decisions += 1;
            } else if !own {
                self.check_not_held(node, &decision);
            }
            self.applied_at.entry((node, id, decision.version.clone())).or_insert(self.now);
        }
    }

    /// A local decision must be what the operator did, never an echo or an intermediate state.
    fn check_local(&mut self, node: usize, decision: &Decision) {
        let n = &mut self.nodes[node];
        let id = &decision.id;
        let verdict = &decision.verdict;
        let expect = n.touched.remove(id);
        let name = n.name.clone();
        if !self.ids.contains(id) {
            self.fail(format!("{name} decided {verdict:?} for a file that is no minion: {id}"));
        }
        if decision.version.is_claim() {
            self.stats.startup_decisions += 1;
            return;
        }
        let changed = self.nodes[node].undecided_changes.remove(id);
        match &expect {
            // Found by a rescan or at a start-up: whatever the operator left there.
            None if changed => {}
            None => self.fail(format!(
                "{name} decided {verdict:?} for {id} that no operator changed since (its own write taken for an \
                 operator's?), slots {:?}",
                self.nodes[node].disk.slots(id.as_str())
            )),
            Some(Expect::Nothing) => self.fail(format!("{name} decided {verdict:?} for {id} on a new pending key")),
            Some(Expect::AtMost(want)) if want != verdict => {
                self.fail(format!("{name} decided {verdict:?} for {id}, the operator's change was {want:?}"))
            }
            _ => self.stats.operator_decisions += 1,
        }
        trace!(self, "{name} decides {id} {verdict:?} {}", decision.version);
    }

    /// A local decision knows exactly what it may: everything the node's
    /// store held of the id (complete), and nothing it was never handed (sound:
    /// no conflict hidden behind a claim of knowledge).
    fn check_context(&self, node: usize, decision: &Decision, before: Option<&keysync_machine::node::testing::Stored>) {
        let name = &self.nodes[node].name;
        let delivered = self.delivered[node].get(&decision.id);
        for known in decision.context.iter() {
            // Its own versions it made (an operator's release or revert that
            // lost to a concurrent decision is remembered, never held).
            let own = *known.node == **name;
            if !own && !delivered.is_some_and(|d| d.contains(known)) {
                self.fail(format!(
                    "{name}'s {} for {} claims to know {known}, never handed to it",
                    decision.version, decision.id
                ));
            }
        }
        if let Some(stored) = before {
            for version in std::iter::once(&stored.held.version).chain(stored.seen.iter().map(|s| &s.version)) {
                if !decision.context.knows(version) {
                    self.fail(format!(
                        "{name}'s {} for {} does not know {version}, which it held",
                        decision.version, decision.id
                    ));
                }
            }
        }
    }
}
