//! Messages between nodes: push, forward, anti-entropy, and applying a peer's decision.

use super::*;

impl Sim {
    // ---- replication ----

    pub(super) fn send(&mut self, from: usize, to: usize, msg: Msg) {
        let copies = if self.reliable {
            1
        } else if self.rng.percent(DROP_PCT) {
            self.stats.dropped += 1;
            0
        } else if self.rng.percent(DUP_PCT) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let at = self.now + self.rng.between(1, 150);
            self.schedule(at, Event::Deliver { from, to, msg: msg.clone() });
        }
    }

    pub(super) fn reachable(&self, a: usize, b: usize) -> bool {
        self.partition.as_ref().is_none_or(|(_, side)| side[a] == side[b])
    }

    pub(super) fn deliver(&mut self, from: usize, to: usize, msg: Msg) {
        if !self.nodes[to].up || !self.reachable(from, to) {
            self.stats.lost += 1;
            return;
        }
        match msg {
            Msg::Push(decision) => self.remote(to, from, decision),
            Msg::Digests(theirs) => {
                let replica = &self.nodes[to].replica;
                let buckets = replica.digests().differing(&theirs);
                if !buckets.is_empty() {
                    let summaries = replica.summaries_in(&buckets);
                    self.send(to, from, Msg::Summaries(summaries));
                }
            }
            Msg::Summaries(summaries) => {
                let ids = self.nodes[to].replica.newer_on_peer(&summaries);
                if !ids.is_empty() {
                    self.send(to, from, Msg::Fetch(ids));
                }
            }
            Msg::Fetch(ids) => {
                let n = &self.nodes[to];
                let decisions: Vec<Decision> = ids.iter().filter_map(|id| n.store.get(id).cloned()).collect();
                for d in &decisions {
                    if n.replica.entry(&d.id).map(|e| &e.version) != Some(&d.version) {
                        self.fail(format!("{}: store and replica disagree on {}", n.name, d.id));
                    }
                }
                self.send(to, from, Msg::Decisions(decisions));
            }
            Msg::Decisions(decisions) => {
                for decision in decisions {
                    self.remote(to, from, decision);
                }
            }
        }
    }

    /// A peer's decision: merge, and on apply write the folders, commit and forward.
    pub(super) fn remote(&mut self, node: usize, from: usize, decision: Decision) {
        let n = &self.nodes[node];
        if n.busy(&decision.id) {
            // The driver does not write an id whose events are still being collected: that
            // would mix its write with a salt-key run in progress.
            let epoch = n.epoch;
            self.stats.deferred += 1;
            self.schedule(self.now + RETRY_MS, Event::Retry { node, epoch, from, decision });
            return;
        }
        let wall = n.wall_ms(self.now);
        let n = &mut self.nodes[node];
        let outcome = match n.replica.merge(&decision, wall, MAX_SKEW_MS) {
            Ok(outcome) => outcome,
            Err(e) => self.fail(format!("{}: {e}", self.nodes[node].name)),
        };
        match outcome {
            MergeOutcome::Duplicate => {}
            MergeOutcome::Superseded { conflict } => self.conflict(node, &decision.id, conflict),
            MergeOutcome::Apply { conflict } => {
                self.conflict(node, &decision.id, conflict);
                let name = self.nodes[node].name.clone();
                trace!(self, "{name} applies {} {:?} {} from n{from}", decision.id, decision.verdict, decision.version);
                let step = plan_apply(&self.nodes[node].disk, &decision);
                for change in &step.changes {
                    self.nodes[node].disk.change(change);
                }
                self.commit(node, &decision);
                // The apply's own events come back through the settler; reading them must not decide.
                self.feed(node, &step.events);
                for peer in 0..self.nodes.len() {
                    if peer != node && peer != from {
                        self.send(node, peer, Msg::Push(decision.clone()));
                    }
                }
            }
        }
    }

    pub(super) fn conflict(&mut self, node: usize, id: &MinionId, conflict: Option<Conflict>) {
        if let Some(Conflict { winner, loser }) = conflict {
            self.stats.conflicts += 1;
            trace!(self, "{} conflict on {id}: {winner} beats {loser}", self.nodes[node].name);
            self.reported.insert((id.clone(), loser, winner, node));
        }
    }

    /// Pulls from every peer: the digests go out, the rest follows in `deliver`.
    pub(super) fn anti_entropy(&mut self, node: usize) {
        if !self.nodes[node].up {
            return;
        }
        let digests = self.nodes[node].replica.digests().as_slice().to_vec();
        for peer in 0..self.nodes.len() {
            if peer != node {
                self.send(node, peer, Msg::Digests(digests.clone()));
            }
        }
    }
}
