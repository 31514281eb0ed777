//! The end of a run: every node holds the same decisions, digests and folders.

use super::*;

impl Sim {
    // ---- the verdict ----

    pub(super) fn check_converged(&self) {
        let winners: BTreeMap<MinionId, Decision> = self
            .decided
            .iter()
            .map(|(id, ds)| (id.clone(), ds.iter().max_by(|a, b| a.version.cmp(&b.version)).unwrap().clone()))
            .collect();
        let mut reference = Replica::new("reference", Hlc::default());
        for (id, d) in &winners {
            reference.load(id.clone(), d.entry());
        }
        for n in &self.nodes {
            if !n.up || !n.settler.is_idle() || !n.touched.is_empty() || !n.in_flight.is_empty() {
                self.fail(format!("{} did not come to rest", n.name));
            }
            let entries: BTreeMap<_, _> = n.replica.entries().map(|(id, e)| (id.clone(), e.clone())).collect();
            let want: BTreeMap<_, _> = winners.iter().map(|(id, d)| (id.clone(), d.entry())).collect();
            if entries != want {
                let diff: Vec<_> = want
                    .iter()
                    .filter(|(id, e)| entries.get(*id) != Some(*e))
                    .map(|(id, e)| format!("{id}: want {}, has {:?}", e.version, entries.get(id).map(|e| &e.version)))
                    .collect();
                self.fail(format!("{} did not converge on the highest versions: {diff:?}", n.name));
            }
            if n.store != winners {
                self.fail(format!("{}: the store does not hold the winning decisions", n.name));
            }
            if n.replica.digests() != reference.digests() {
                self.fail(format!("{}: digests differ from those of its entries", n.name));
            }
            self.check_folders(n, &winners);
        }
        // A master's first-start files must never override what the cluster held when it joined.
        for (id, held) in &self.held_at_join {
            let winner = &winners[id];
            if winner.verdict != held.verdict && self.by_joiner_files(winner) {
                self.fail(format!("the late joiner's files overrode {id}: {:?} {}", winner.verdict, winner.version));
            }
        }
    }

    pub(super) fn by_joiner_files(&self, decision: &Decision) -> bool {
        let joiner = self.joiner.map(|j| self.nodes[j].name.as_str());
        decision.version.is_bootstrap() && Some(&*decision.version.node) == joiner
    }

    /// The folders say exactly what the entries say, byte for byte; no temporary file is left.
    pub(super) fn check_folders(&self, n: &Node, winners: &BTreeMap<MinionId, Decision>) {
        for name in n.disk.names() {
            let id = MinionId::parse(&name).unwrap();
            if !self.ids.contains(&id) {
                let what = if looks_like_salt_tmp(&name) { "salt-key temporary file" } else { "file" };
                self.fail(format!("{} has a stray {what} {name}", n.name));
            }
        }
        for id in &self.ids {
            let name = id.as_str();
            let (accepted, rejected) = (n.disk.get(Folder::Accepted, name), n.disk.get(Folder::Rejected, name));
            let verdict = winners.get(id).map(|d| &d.verdict);
            let ok = match verdict {
                Some(Verdict::Accepted(key)) => accepted.map(Vec::as_slice) == Some(key.bytes()) && rejected.is_none(),
                Some(Verdict::Rejected(key)) => rejected.map(Vec::as_slice) == Some(key.bytes()) && accepted.is_none(),
                Some(Verdict::Deleted) | None => accepted.is_none() && rejected.is_none(),
            };
            if !ok {
                self.fail(format!(
                    "{}: folders for {id} are {:?}, the decision is {verdict:?}",
                    n.name,
                    n.disk.slots(name)
                ));
            }
        }
    }

    /// Counts live decisions lost silently: overruled, with another verdict, by a winner made
    /// without knowledge of them, and no conflict reported about them or about any decision that
    /// knowingly overruled them. A known gap, not asserted: `supersedes` cannot tell "knew it"
    /// from "knew something newer" (see the report).
    pub(super) fn count_unreported_overwrites(&mut self) {
        for (id, ds) in &self.decided {
            let history = |d: &Decision| &self.history[&(id.clone(), d.version.clone())];
            let mut newest_first: Vec<&Decision> = ds.iter().collect();
            newest_first.sort_by(|a, b| b.version.cmp(&a.version));
            let winner = newest_first[0];
            let mut accounted: BTreeSet<&Version> = BTreeSet::new();
            for d in newest_first {
                let ok = d.verdict == winner.verdict
                    || history(winner).contains(&d.version)
                    // Said the same as a decision the winner knew (concurrent agreeing ones collapse).
                    || ds.iter().any(|k| k.verdict == d.verdict && history(winner).contains(&k.version))
                    || self.reported.iter().any(|(i, loser, ..)| i == id && *loser == d.version)
                    || ds.iter().any(|k| {
                        // Knowingly overruled, or merged as an agreeing one, by an accounted decision.
                        let overruled = history(k).contains(&d.version) || k.verdict == d.verdict;
                        k != d && accounted.contains(&k.version) && overruled
                    })
                    // First-start files losing to the cluster is the design, not a loss.
                    || d.version.is_bootstrap();
                if ok {
                    accounted.insert(&d.version);
                } else {
                    trace!(
                        self,
                        "GAP lost silently: {id} {:?} {} to {:?} {}",
                        d.verdict,
                        d.version,
                        winner.verdict,
                        winner.version
                    );
                    self.stats.unreported_overwrites += 1;
                }
            }
        }
    }
}
