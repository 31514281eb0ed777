//! Kills (between inputs or at any effect inside one), restarts, partitions,
//! full disks, a late joiner, and the final calm.

use super::*;

impl Sim {
    pub(crate) fn fault(&mut self) {
        if !self.chaos {
            return;
        }
        let next = self.now + self.rng.between(1_000, 4_000);
        self.schedule(next, Event::Fault);
        let up: Vec<usize> = (0..self.nodes.len()).filter(|&n| self.nodes[n].up()).collect();
        match self.rng.below(100) {
            0..=29 if !up.is_empty() => {
                let node = up[self.rng.index(up.len())];
                self.stats.crashes += 1;
                self.crash(node);
            }
            30..=49 if !up.is_empty() => {
                // Killed inside its next input, at one of its effects (between write and
                // record, between journal and apply, ...).
                let node = up[self.rng.index(up.len())];
                self.nodes[node].kill_after = Some(self.rng.below(12) as u32);
            }
            50..=64 if !up.is_empty() => {
                let node = up[self.rng.index(up.len())];
                trace!(self, "{} disk full", self.nodes[node].name);
                self.stats.full_disks += 1;
                self.nodes[node].disk_full = self.rng.between(30, 100);
                let heals = self.now + self.rng.between(200, 3_000);
                self.schedule(heals, Event::DiskHeals { node });
            }
            65..=99 if self.partition.is_none() => {
                let side: Vec<bool> = loop {
                    let side: Vec<bool> = (0..self.nodes.len()).map(|_| self.rng.percent(50)).collect();
                    if side.iter().any(|&s| s) && side.iter().any(|&s| !s) {
                        break side;
                    }
                };
                self.n_partitions += 1;
                self.stats.partitions += 1;
                trace!(self, "partition {side:?}");
                self.partition = Some((self.n_partitions, side.clone()));
                // Sessions across it break once their keep-alive gives up, if it lasts.
                for node in 0..self.nodes.len() {
                    for peer in (0..self.nodes.len()).filter(|&p| side[p] != side[node]) {
                        if self.nodes[node].up() && self.nodes[node].links[peer].machine_is_up() {
                            let session = self.nodes[node].links[peer].session();
                            let at = self.now + self.rng.between(500, 3_000);
                            self.schedule(at, Event::Broken { node, peer, session });
                        }
                    }
                }
                let heal = self.now + self.rng.between(1_000, 6_000);
                self.schedule(heal, Event::Heal { partition: self.n_partitions });
            }
            _ => {}
        }
    }

    pub(crate) fn heal(&mut self) {
        trace!(self, "partition healed");
        self.partition = None;
        for node in 0..self.nodes.len() {
            self.anti_entropy(node);
        }
    }

    /// kill -9: the agent is gone; its folders, store and written audit log stay.
    pub(crate) fn crash(&mut self, node: usize) {
        trace!(self, "{} stops", self.nodes[node].name);
        let n = &mut self.nodes[node];
        n.machine = None;
        n.epoch += 1;
        n.kill_after = None;
        // Pushes received and not yet applied die with the process.
        n.inbox.clear();
        self.break_links_to(node);
        if self.chaos {
            let back = self.now + self.rng.between(300, 4_000);
            let epoch = self.nodes[node].epoch;
            self.schedule(back, Event::Restart { node, epoch });
        }
    }

    pub(crate) fn first_start(&mut self, node: usize) {
        trace!(self, "{} starts for the first time", self.nodes[node].name);
        if Some(node) == self.joiner {
            for d in self.nodes.iter().flat_map(|n| n.store.decisions.values().map(|s| &s.held)) {
                let held = self.held_at_join.entry(d.id.clone()).or_insert_with(|| d.clone());
                if d.version > held.version {
                    *held = d.clone();
                }
            }
        }
        self.nodes[node].joined = true;
        self.start(node);
    }

    /// The agent starts (from its store), and its links start their first round.
    pub(crate) fn start(&mut self, node: usize) {
        trace!(self, "{} starts with {} entries", self.nodes[node].name, self.nodes[node].store.decisions.len());
        self.boot(node);
        if self.nodes[node].up() {
            self.start_links(node);
        }
    }

    /// Ends the chaos: heal, a reliable network, every agent restarted, a few anti-entropy rounds.
    pub(crate) fn final_restart(&mut self) {
        trace!(self, "final restart");
        self.final_at = Some(self.now);
        self.reliable = true;
        self.partition = None;
        for node in 0..self.nodes.len() {
            if !self.nodes[node].in_flight.is_empty() {
                self.fail(format!("{} still has operator steps in flight", self.nodes[node].name));
            }
            let n = &mut self.nodes[node];
            n.disk_full = 0;
            n.kill_after = None;
            if !n.joined {
                self.first_start(node);
                continue;
            }
            if n.up() {
                self.crash(node);
            }
            self.start(node);
        }
        for round in 1..=FINAL_ROUNDS {
            self.schedule(self.now + round * 1_000, Event::FinalRound);
        }
        self.schedule(self.now + (FINAL_ROUNDS + 1) * 1_000, Event::Resolve { round: 0 });
    }
}
