//! What first contact does on this master, before it does it: per id, what
//! the master holds and what its folders will show (`claims.rs`), for
//! `salt-keysync plan`. In observe mode nothing is written, so "holds" is
//! what the folders held at the agent's start; in normal mode the folders
//! already show what the rules say, and only unresolved conflicts remain.

use std::borrow::Cow;

use crate::core::causal::remember;
use crate::core::{claims, Entry, Fingerprint, MinionId, Seen, VerdictKind};

use super::Node;

/// What a master holds or will hold for one id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holding {
    /// No key in any folder (or only a tombstone: deleted).
    Nothing,
    Pending(Fingerprint),
    Accepted(Fingerprint),
    Rejected(Fingerprint),
}

/// One id on this master.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanRow {
    pub id: MinionId,
    pub holds: Holding,
    pub will: Holding,
    /// Masters may show different things for it until an operator decides.
    pub conflict: bool,
    /// Why it will show what it will, when that is not what it holds.
    pub why: Option<&'static str>,
}

impl Node {
    /// Rows for the ids whose state differs between masters as far as this
    /// master can tell (it would change, the claims it knows disagree, or a
    /// conflict is unresolved), or for exactly `ids` when given (another
    /// master's rows name them: the plan shows every master for each).
    pub fn plan(&self, ids: Option<&[MinionId]>) -> Vec<PlanRow> {
        let row = |id: &MinionId| self.plan_row(id);
        if self.is_stale() {
            return self.plan_stale(ids);
        }
        let mut rows: Vec<PlanRow> = match ids {
            Some(ids) => ids.iter().map(row).collect(),
            None => {
                let mut ids: Vec<&MinionId> = self.replica.entries().map(|(id, _)| id).collect();
                ids.extend(self.pending.keys());
                if self.settings.observe {
                    ids.extend(self.heard_ids());
                }
                ids.sort_unstable();
                ids.dedup();
                ids.into_iter()
                    .filter(|id| {
                        let entry = self.plan_entry(id);
                        let entry = entry.as_deref();
                        let disputed = entry.is_some_and(|e| {
                            let claims = claims::claims(e);
                            claims.iter().any(|c| !c.agrees_with(&claims[0]))
                        });
                        disputed || entry.is_some_and(claims::unsettled) || {
                            let row = row(id);
                            row.holds != row.will
                        }
                    })
                    .map(row)
                    .collect()
            }
        };
        rows.sort_by(|a, b| a.id.cmp(&b.id));
        rows
    }

    /// The rows of [`Node::plan`] that are conflicts, for `status`: there
    /// only the ids whose entry is unsettled are looked at, where the plan
    /// sorts every id held and makes a row of each (at 1,000,000 keys, 5.6 %
    /// of the agents' CPU in a profile of first contact, the benchmark
    /// asking for `status` twice a second).
    pub fn conflicts(&self) -> Vec<PlanRow> {
        if self.is_stale() {
            // A stale master's rows are no conflicts (`plan_stale`).
            return Vec::new();
        }
        if self.settings.observe {
            // Observe mode judges what peers hold too, ids it may not hold
            // among them.
            return self.plan(None).into_iter().filter(|row| row.conflict).collect();
        }
        let mut rows: Vec<PlanRow> = self.replica.unsettled().map(|(id, _)| self.plan_row(id)).collect();
        rows.sort_by(|a, b| a.id.cmp(&b.id));
        rows
    }

    /// The entry the plan judges `id` by: the one held, and in observe mode
    /// also what each peer holds now (see [`Node::heard`]).
    fn plan_entry(&self, id: &MinionId) -> Option<Cow<'_, Entry>> {
        let held = self.replica.entry(id);
        if !self.settings.observe {
            return held.map(Cow::Borrowed);
        }
        let mut rows: Vec<Seen> = held.map(|e| e.decisions().collect()).unwrap_or_default();
        let mut heard = self.heard(id).peekable();
        if heard.peek().is_none() {
            return held.map(Cow::Borrowed);
        }
        for seen in heard {
            if !rows.iter().any(|s| s.same_as(seen)) {
                rows.push(seen.clone());
            }
        }
        // The highest row is held, the others remembered (as a merge would leave them).
        rows.sort_by(|a, b| (&a.version, a.content_rank()).cmp(&(&b.version, b.content_rank())));
        let top = rows.pop()?;
        let mut seen = Vec::new();
        for row in rows {
            remember(&mut seen, row);
        }
        let entry = Entry::new(top.kind, top.fingerprint, top.version, top.context)
            .with_seen(seen)
            .with_mine(held.and_then(|e| e.mine().cloned()));
        Some(Cow::Owned(entry))
    }

    fn plan_row(&self, id: &MinionId) -> PlanRow {
        let entry = self.plan_entry(id);
        let entry = entry.as_deref();
        let shown = entry.and_then(claims::effective);
        let will = shown.as_ref().map_or(Holding::Nothing, holding);
        let pending = self.pending.get(id).map(|fp| Holding::Pending(*fp));
        // Observe mode writes nothing: the folders still hold this master's
        // own claim (or its pending key, or nothing). In normal mode they
        // show what the rules say.
        let holds = if self.settings.observe {
            let mine = entry.and_then(|e| e.mine()).and_then(|mine| {
                let e = entry?;
                e.decisions().find(|s| s.version == *mine)
            });
            mine.as_ref().map(holding).or(pending.clone()).unwrap_or(Holding::Nothing)
        } else {
            match &will {
                Holding::Nothing => pending.clone().unwrap_or(Holding::Nothing),
                shown => shown.clone(),
            }
        };
        // A pending key stays pending where nothing is decided.
        let will = match (will, &pending) {
            (Holding::Nothing, Some(pending)) => pending.clone(),
            (will, _) => will,
        };
        let live = entry.is_some_and(|e| !e.version.is_claim());
        let why = (holds != will).then(|| reason(&holds, &will, live));
        PlanRow { id: id.clone(), holds, will, conflict: entry.is_some_and(claims::unsettled), why }
    }
}

/// Why a stale master's key is set aside (`stale.rs`).
pub const STALE_WHY: &str = "this master may have missed deletes its peers have forgotten (tombstone_ttl): `salt-keysync rejoin` sets its keys aside, and what the other masters hold comes back from them";

impl Node {
    /// A stale master's rows: every key `rejoin` sets aside (all it holds
    /// accepted or rejected); pending keys stay.
    fn plan_stale(&self, ids: Option<&[MinionId]>) -> Vec<PlanRow> {
        let row = |id: &MinionId| {
            let pending = self.pending.get(id).map(|fp| Holding::Pending(*fp));
            let holds = self.replica.effective(id).as_ref().map_or(Holding::Nothing, holding);
            let holds = match holds {
                Holding::Nothing => pending.clone().unwrap_or(Holding::Nothing),
                holds => holds,
            };
            let will = pending.unwrap_or(Holding::Nothing);
            let why = (holds != will).then_some(STALE_WHY);
            PlanRow { id: id.clone(), holds, will, conflict: false, why }
        };
        let mut rows: Vec<PlanRow> = match ids {
            Some(ids) => ids.iter().map(row).collect(),
            None => self.replica.entries().map(|(id, _)| row(id)).filter(|r| r.holds != r.will).collect(),
        };
        rows.sort_by(|a, b| a.id.cmp(&b.id));
        rows
    }
}

/// Why a master holding `holds` will show `will` (`live`: a decision made
/// while agents ran is held for the id).
fn reason(holds: &Holding, will: &Holding, live: bool) -> &'static str {
    match (holds, will) {
        (_, Holding::Accepted(_) | Holding::Rejected(_) | Holding::Nothing) if live => {
            "a live decision beats every claim"
        }
        (_, Holding::Nothing | Holding::Pending(_)) => {
            "two different keys were held for this id: a master that held neither trusts neither until an operator decides"
        }
        (Holding::Accepted(a), Holding::Rejected(b)) if a == b => "a rejection beats an acceptance of the same key",
        (Holding::Nothing | Holding::Pending(_), _) => "accepted or rejected beats pending and absent",
        _ => "two different keys were held for this id: this master keeps its own (rejected, if another master rejected it)",
    }
}

fn holding(seen: &Seen) -> Holding {
    match (seen.kind, seen.fingerprint) {
        (VerdictKind::Accepted, Some(fp)) => Holding::Accepted(fp),
        (VerdictKind::Rejected, Some(fp)) => Holding::Rejected(fp),
        _ => Holding::Nothing,
    }
}
