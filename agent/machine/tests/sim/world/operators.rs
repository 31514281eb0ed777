//! Operators at the masters: `salt-key` runs as Salt 3006 and 3008 make
//! them, system call by system call, on a running agent or a stopped one.

use super::*;
use keysync_machine::core::Verdict;

impl Sim {
    pub(super) fn operator(&mut self) {
        if !self.chaos {
            return;
        }
        let next = self.now + self.rng.between(30, 400);
        self.schedule(next, Event::Operator);
        let roll = self.rng.below(100);
        if roll < 6 {
            // Now and then an operator releases or reverts what a master's guard
            // holds, or runs salt-key -D.
            let up: Vec<usize> = (0..self.nodes.len()).filter(|&n| self.nodes[n].up()).collect();
            if !up.is_empty() {
                let node = up[self.rng.index(up.len())];
                if roll < 1 {
                    self.mass_delete(node);
                } else {
                    self.resolve_held(node, None);
                }
            }
            return;
        }
        let up: Vec<usize> = (0..self.nodes.len()).filter(|&n| self.nodes[n].up()).collect();
        let down: Vec<usize> = (0..self.nodes.len()).filter(|&n| !self.nodes[n].up() && self.nodes[n].joined).collect();
        // Mostly on a running master; sometimes on one whose agent is down (found at its restart).
        let node = if !down.is_empty() && (up.is_empty() || self.rng.percent(15)) {
            down[self.rng.index(down.len())]
        } else if !up.is_empty() {
            up[self.rng.index(up.len())]
        } else {
            return;
        };
        let id = self.ids[self.rng.index(N_IDS)].clone();
        let n = &self.nodes[node];
        if n.in_flight.contains(&id) || (n.up() && n.touched.contains_key(&id)) {
            return;
        }
        let salt = n.salt;
        let Some((what, steps, expect)) = plan_operator(&n.disk, id.as_str(), salt, &mut self.rng) else {
            return;
        };
        let running = if n.up() { "" } else { " (agent down)" };
        trace!(self, "{} operator: {what} {id} ({salt:?}, {} steps){running}", n.name, steps.len());
        let n = &mut self.nodes[node];
        if !n.up() {
            for change in steps.iter().flat_map(|s| &s.changes) {
                n.disk.change(change);
            }
            // Whatever the folders say at the next start is the operator's now.
            n.touched.remove(&id);
            n.undecided_changes.insert(id);
            return;
        }
        // An earlier change the agent has not decided yet (made while it was
        // down, and its start-up could not record it: a full disk) is decided
        // at this run's reading too. Before a new pending key that can only
        // be a delete: the master writes none for an accepted or rejected id.
        let expect = match expect {
            Expect::Nothing if n.undecided_changes.contains(&id) => Expect::AtMost(Verdict::Deleted),
            expect => expect,
        };
        n.in_flight.insert(id.clone());
        n.undecided_changes.insert(id.clone());
        n.touched.insert(id.clone(), expect);
        // The first system call happens now, the others as planned.
        let mut at = self.now;
        let n_steps = steps.len();
        for (i, step) in steps.into_iter().enumerate() {
            let last = i + 1 == n_steps;
            if i == 0 {
                self.step(node, id.clone(), step, last);
            } else {
                at += step.after_ms;
                self.schedule(at, Event::Step { node, id: id.clone(), step, last });
            }
        }
    }

    /// One system call on a master's folders, heard by its agent if it is running.
    pub(super) fn step(&mut self, node: usize, id: MinionId, step: Step, last: bool) {
        let n = &mut self.nodes[node];
        for change in &step.changes {
            n.disk.change(change);
        }
        if last {
            n.in_flight.remove(&id);
        }
        if n.up() && !step.events.is_empty() {
            self.inotify(node, step.events);
        }
    }
}
