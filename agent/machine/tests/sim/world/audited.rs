//! The end of a run, judged on the audit records: what each master's log
//! says as the agent writes it (`keysync_audit::record` of every event the
//! node told, `runtime.rs`), not on the events. Each conflict its store
//! holds is recorded there once as a conflict, and each hold of a delete
//! its guard held has one record of how it ended.

use super::checker::{tally, Tally};
use super::*;
use keysync_audit::{Action, Outcome, Record};
use keysync_machine::node::StoreWrite;

/// Conflicts as a record names them: minion, the winner's version and the
/// loser's (`version`, `other_version`).
type Named = (String, String, String);

/// How a held delete's hold ends, as its record says: settled by a newer
/// decision, or no longer judged (`delete`, `superseded` or `unheld`), or
/// an operator's release or revert (`applied`); `other_version` names it.
const HOLD_ENDS: [(Action, Outcome); 4] = [
    (Action::Delete, Outcome::Superseded),
    (Action::Delete, Outcome::Unheld),
    (Action::Release, Outcome::Applied),
    (Action::Revert, Outcome::Applied),
];

impl Sim {
    /// `n`'s records tell each conflict pair of `expected` once (once more
    /// for each time it was compacted and met again), and none but those or
    /// the `forgotten` ones (compacted since, counted per compaction).
    pub(crate) fn check_conflict_records(
        n: &SimNode,
        expected: &BTreeSet<(MinionId, Version, Version)>,
        forgotten: &BTreeMap<(MinionId, Version, Version), u64>,
        verdicts: &mut Verdicts,
        problems: &mut Vec<String>,
    ) {
        let named = |(id, winner, loser): &(MinionId, Version, Version)| -> Named {
            (id.to_string(), winner.to_string(), loser.to_string())
        };
        let expected: BTreeSet<Named> = expected.iter().map(named).collect();
        let forgotten: BTreeMap<Named, u64> = forgotten.iter().map(|(pair, &k)| (named(pair), k)).collect();
        let mut told: BTreeMap<Named, u64> = BTreeMap::new();
        for record in n.records.iter().filter(|r| r.action == Action::Conflict.as_str()) {
            let (Some(minion), Some(version), Some(other)) = (&record.minion, &record.version, &record.other_version)
            else {
                problems.push(format!("{}: a conflict record names no minion or versions: {record:?}", n.name));
                verdicts.unaudited += 1;
                continue;
            };
            *told.entry((minion.clone(), version.clone(), other.clone())).or_default() += 1;
        }
        let Tally { once, missed, repeated, unexpected } = tally(&expected, &forgotten, &told);
        verdicts.conflicts_recorded += once;
        for pair in missed {
            verdicts.unaudited += 1;
            problems.push(format!("{}: conflict {pair:?} has no audit record", n.name));
        }
        for (pair, k) in repeated {
            verdicts.unaudited += 1;
            problems.push(format!("{}: conflict {pair:?} is recorded {k} times", n.name));
        }
        for (pair, k) in unexpected {
            verdicts.unaudited += 1;
            problems.push(format!("{}: conflict {pair:?} recorded {k} times, but it holds no such pair", n.name));
        }
    }

    /// Each hold of a delete `n`'s guard made has one record of how it
    /// ended (at the end nothing is held: `check_nothing_held`), unless a
    /// kill lost it ([`Holds`] counts them).
    pub(crate) fn check_held_records(n: &SimNode, verdicts: &mut Verdicts, problems: &mut Vec<String>) {
        let mut ended: BTreeMap<(String, String), u64> = BTreeMap::new();
        for record in n.records.iter().filter(|r| ends_a_hold(r)) {
            let (Some(minion), Some(version)) = (&record.minion, &record.other_version) else {
                problems.push(format!("{}: a held delete's record names no minion or version: {record:?}", n.name));
                verdicts.unaudited += 1;
                continue;
            };
            *ended.entry((minion.clone(), version.clone())).or_default() += 1;
        }
        for (id, version) in &n.ever_held {
            if !n.holds.counts.contains_key(&(id.clone(), version.clone())) {
                problems.push(format!("{}: the held delete {id} {version} was never seen held", n.name));
            }
        }
        for ((id, version), &holds) in &n.holds.counts {
            let k = ended.remove(&(id.to_string(), version.to_string())).unwrap_or(0);
            // Its record may have been buffered and lost with the process.
            let lost = n.audit_maybe_lost.contains(id) || n.holds.lost.contains(&(id.clone(), version.clone()));
            if k == holds || (k < holds && lost) {
                verdicts.held_recorded += k;
                continue;
            }
            verdicts.unaudited += holds.abs_diff(k);
            problems.push(format!(
                "{}: the held delete {id} {version}, held {holds} times, has {k} records of an end",
                n.name
            ));
        }
        for ((id, version), k) in ended {
            verdicts.unaudited += k;
            problems.push(format!("{}: the held delete {id} {version}, never held, has {k} records of an end", n.name));
        }
    }
}

/// The holds of deletes one master's guard made, as its store writes and
/// the events it tells show them: each ends with one record. A hold begins
/// when a write names a held delete the store does not keep as such: held
/// afresh, or again (from its origin after it was held as forwarded by
/// another peer), not one written again after a failed write. Failed
/// writes make two more: a hold the store never kept, and one the store
/// kept after the guard had ended it (the write of its end failed and the
/// node was killed before it was written again), which the next start
/// holds again. And one no write names: the guard held it and ended it in
/// the same offer (`guard.rs`: held as forwarded and given back when its
/// origin sent it too, or replaced by a newer delete of its id), before the
/// write that follows; once a write of held deletes has failed, that write
/// names what the guard holds, not what it held since (`tell_guard`), so
/// such a hold is seen only by the record of its end.
#[derive(Debug, Default)]
pub(crate) struct Holds {
    /// How many holds of each delete.
    pub(crate) counts: BTreeMap<(MinionId, Version), u64>,
    /// Held deletes whose end was told by a process killed before it wrote
    /// it: the record is lost.
    pub(crate) lost: BTreeSet<(MinionId, Version)>,
    /// Holds a failed write named, neither kept nor ended since (counted).
    unkept: BTreeSet<Hold>,
    /// Holds whose end was written.
    ended: BTreeSet<Hold>,
    /// Holds a write named, or counted from their end.
    named: BTreeSet<Hold>,
    /// The node's life (epoch) these were last brought up to.
    epoch: u64,
}

/// One hold: the delete, the peer it came from, since when.
type Hold = (MinionId, Version, keysync_machine::PeerName, u64);

fn hold(held: &node::HeldDelete) -> Hold {
    (held.decision.id.clone(), held.decision.version.clone(), held.from.clone(), held.since_ms)
}

/// The hold an event tells the end of.
fn ended(event: &node::Event) -> Option<Hold> {
    match event {
        node::Event::HeldSettled { held, .. } | node::Event::Operator { held, .. } => Some(hold(held)),
        _ => None,
    }
}

/// Whether `event` may end a hold the guard made in the same offer, which
/// no write need name: given back to be judged again, or replaced.
fn ends_in_its_offer(event: &node::Event) -> bool {
    matches!(event, node::Event::HeldSettled { how: node::Settled::Rejudged | node::Settled::By(_), .. })
}

impl Holds {
    /// A store write, before the store takes it (`ok`: it does).
    pub(crate) fn write(&mut self, store: &Store, write: &StoreWrite<'_>, ok: bool) {
        // Keys put back hold their deletes only once written (`put_back.rs`).
        let holds_anyway = write.putting_back.is_none();
        for held in write.held {
            let key = hold(held);
            self.named.insert(key.clone());
            if store.held.get(&key.0).is_some_and(|h| hold(h) == key) {
                continue;
            }
            let counted = if ok { self.unkept.remove(&key) } else { !holds_anyway || !self.unkept.insert(key.clone()) };
            if !counted {
                *self.counts.entry((key.0, key.1)).or_default() += 1;
            }
        }
    }

    /// `events` are written to the audit log.
    pub(crate) fn written(&mut self, events: &[node::Event]) {
        self.unnamed(events);
        for key in events.iter().filter_map(ended) {
            self.unkept.remove(&key);
            self.ended.insert(key);
        }
    }

    /// `events` were told by a process killed before it wrote them.
    pub(crate) fn killed(&mut self, events: &[node::Event]) {
        self.unnamed(events);
        for key in events.iter().filter_map(ended) {
            self.unkept.remove(&key);
            self.lost.insert((key.0, key.1));
        }
    }

    /// Counts the holds `events` end that no write named: made and ended
    /// in one offer.
    fn unnamed(&mut self, events: &[node::Event]) {
        for key in events.iter().filter(|e| ends_in_its_offer(e)).filter_map(ended) {
            if self.named.insert(key.clone()) {
                *self.counts.entry((key.0, key.1)).or_default() += 1;
            }
        }
    }

    /// Brings these up to the node's life `epoch`: after a kill and a start,
    /// holds never kept nor ended are gone with the process, and those the
    /// store kept after their end was written are held again (`recheck_held`
    /// holds all the store keeps, and tells each one's end). The store may
    /// keep one however many writes succeeded since the write of its end
    /// failed: the guard writes it again when its backoff allows, and writes
    /// of decisions drop only their own ids' holds.
    pub(crate) fn started(&mut self, epoch: u64, store: &Store) {
        if epoch == self.epoch {
            return;
        }
        self.epoch = epoch;
        for (id, version, _, _) in std::mem::take(&mut self.unkept) {
            if let Some(count) = self.counts.get_mut(&(id, version)) {
                *count -= 1;
            }
        }
        for held in store.held.values() {
            if self.ended.remove(&hold(held)) {
                *self.counts.entry((held.decision.id.clone(), held.decision.version.clone())).or_default() += 1;
            }
        }
    }
}

/// Whether `record` tells the end of a held delete's hold.
fn ends_a_hold(record: &Record) -> bool {
    record.other_version.is_some()
        && HOLD_ENDS
            .iter()
            .any(|(action, outcome)| record.action == action.as_str() && record.outcome == outcome.as_str())
}
