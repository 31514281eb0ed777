//! Crashes, restarts, partitions, a late joiner, and the final calm.

use super::*;

impl Sim {
    // ---- faults and restarts ----

    pub(super) fn fault(&mut self) {
        if !self.chaos {
            return;
        }
        let next = self.now + self.rng.between(1_500, 5_000);
        self.schedule(next, Event::Fault);
        if self.rng.percent(50) {
            let up: Vec<usize> = (0..self.nodes.len()).filter(|&n| self.nodes[n].up).collect();
            if up.is_empty() {
                return;
            }
            let node = up[self.rng.index(up.len())];
            self.stats.crashes += 1;
            self.crash(node);
            let back = self.now + self.rng.between(300, 4_000);
            let epoch = self.nodes[node].epoch;
            self.schedule(back, Event::Restart { node, epoch });
        } else if self.partition.is_none() {
            let side: Vec<bool> = loop {
                let side: Vec<bool> = (0..self.nodes.len()).map(|_| self.rng.percent(50)).collect();
                if side.iter().any(|&s| s) && side.iter().any(|&s| !s) {
                    break side;
                }
            };
            self.n_partitions += 1;
            self.stats.partitions += 1;
            trace!(self, "partition {side:?}");
            self.partition = Some((self.n_partitions, side));
            let heal = self.now + self.rng.between(1_000, 6_000);
            self.schedule(heal, Event::Heal { partition: self.n_partitions });
        }
    }

    pub(super) fn heal(&mut self) {
        trace!(self, "partition healed");
        self.partition = None;
        for node in 0..self.nodes.len() {
            self.anti_entropy(node);
        }
    }

    pub(super) fn crash(&mut self, node: usize) {
        trace!(self, "{} stops", self.nodes[node].name);
        let n = &mut self.nodes[node];
        n.up = false;
        n.epoch += 1;
    }

    /// Back from the store with a fresh settler; the folders are scanned for offline changes.
    pub(super) fn restart(&mut self, node: usize) {
        let n = &mut self.nodes[node];
        let last = n.store.values().map(|d| d.version.hlc).max().unwrap_or(0);
        n.replica = Replica::new(&n.name, Hlc::resume(last));
        for (id, decision) in &n.store {
            n.replica.load(id.clone(), decision.entry());
        }
        trace!(self, "{} restarts with {} entries", self.nodes[node].name, self.nodes[node].store.len());
        self.start(node, ObserveMode::Live);
    }

    pub(super) fn first_start(&mut self, node: usize) {
        trace!(self, "{} starts for the first time", self.nodes[node].name);
        if Some(node) == self.joiner {
            for d in self.nodes.iter().flat_map(|n| n.store.values()) {
                let held = self.held_at_join.entry(d.id.clone()).or_insert_with(|| d.clone());
                if d.version > held.version {
                    *held = d.clone();
                }
            }
        }
        self.nodes[node].joined = true;
        self.start(node, ObserveMode::FirstStart);
    }

    pub(super) fn start(&mut self, node: usize, mode: ObserveMode) {
        let n = &mut self.nodes[node];
        n.up = true;
        n.epoch += 1;
        n.settler = Settler::new(SettleTimings::default());
        n.settle_at = None;
        let mut names: BTreeSet<String> = n.disk.names();
        names.extend(n.store.keys().map(|id| id.to_string()));
        for name in names {
            let id = MinionId::parse(&name).unwrap_or_else(|e| self.fail(format!("{name:?} on disk: {e}")));
            self.observe(node, &id, mode);
        }
        self.nodes[node].touched.clear();
        self.anti_entropy(node);
        let epoch = self.nodes[node].epoch;
        let next = self.now + self.rng.between(1_000, 3_000);
        self.schedule(next, Event::AntiEntropy { node, epoch });
    }

    /// Ends the chaos: heal, a reliable network, every agent restarted, a few anti-entropy rounds.
    pub(super) fn final_restart(&mut self) {
        trace!(self, "final restart");
        self.final_at = Some(self.now);
        self.reliable = true;
        self.partition = None;
        for node in 0..self.nodes.len() {
            if !self.nodes[node].in_flight.is_empty() {
                self.fail(format!("{} still has operator steps in flight", self.nodes[node].name));
            }
            if !self.nodes[node].joined {
                self.first_start(node);
                continue;
            }
            if self.nodes[node].up {
                self.crash(node);
            }
            self.restart(node);
        }
        for round in 1..=FINAL_ROUNDS {
            self.schedule(self.now + round * 1_000, Event::FinalRound);
        }
    }
}
