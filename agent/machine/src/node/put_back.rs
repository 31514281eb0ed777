//! Putting back the deletes a mass delete slower than `quiet` got through
//! the guard (see [`super::guard::PutBack`]): `salt-key -D` while
//! salt-master is stopped deletes about one key a second, so its first
//! deletes are applied one by one before the burst goes past the limit.
//! What this master held before each is kept for `window`; once the burst
//! is held, those keys are written back from it and their deletes held with
//! the rest, so `held`, `release` and `revert` cover the whole burst.
//!
//! Putting back rewinds the id's entry here to what it was, as if the
//! delete had been held from the start: the origin and the masters that
//! applied it hold a newer delete, exactly as for any held delete, and an
//! operator's release or revert settles it everywhere. Nothing is sent.

use crate::PeerName;

use crate::core::causal::remember;
use crate::core::observe::{interpret, Reading};
use crate::core::{Decision, MinionId, VerdictKind};

use super::event::Event;
use super::guard::PutBack;
use super::runtime::{Kept, Runtime, StoreWrite};
use super::{HeldDelete, Node, Now};

impl Node {
    /// Before the guard's due deletes are applied: what each one's id holds
    /// here, with its key, to be kept should it be put back.
    pub(super) fn keep_before(&self, due: &[(PeerName, Decision)], rt: &mut impl Runtime) -> Vec<(PeerName, PutBack)> {
        let judged: Vec<&(PeerName, Decision)> = due.iter().filter(|(_, d)| self.guards(d)).collect();
        if judged.is_empty() {
            return Vec::new();
        }
        let ids: Vec<MinionId> = judged.iter().map(|(_, d)| d.id.clone()).collect();
        let Ok(known) = rt.load(&ids) else {
            // The store cannot be read: these deletes are applied all the
            // same, and cannot be put back should their burst be held.
            return Vec::new();
        };
        judged
            .into_iter()
            .filter_map(|(link, delete)| {
                let before = self.replica.entry(&delete.id)?;
                let shows = self.replica.effective(&delete.id)?;
                // What the folders show is the decision held (not another
                // master's first-contact claim): that one is put back.
                if shows.kind != VerdictKind::Accepted || shows.version != before.version {
                    return None;
                }
                // Only a delete made knowing the accept it replaces (as
                // `salt-key -D` does): a concurrent one was told as a
                // conflict when applied, and putting it back would tell it
                // again when it is applied for good.
                if !delete.context.knows(&before.version) {
                    return None;
                }
                let accepted = known.iter().find(|d| {
                    d.id == delete.id && d.version == before.version && d.verdict.fingerprint() == shows.fingerprint
                })?;
                let put_back = PutBack { delete: delete.clone(), before: before.clone(), accepted: accepted.clone() };
                Some((link.clone(), put_back))
            })
            .collect()
    }

    /// After the due deletes were applied: those that were (the id holds
    /// that very delete now) are given to the guard to keep for `window`.
    pub(super) fn keep_passed(&mut self, kept: Vec<(PeerName, PutBack)>, now: Now) {
        for (link, put_back) in kept {
            if self.replica.entry(&put_back.delete.id).is_some_and(|e| e.version == put_back.delete.version) {
                self.guard.keep(&link, put_back, now.mono);
            }
        }
    }

    /// A burst went past the limit: the deletes it got through before are
    /// put back here and held. Those whose id changed since (a newer
    /// decision, a salt-key run, a write waiting for its retry) are left as
    /// they are. Returns how many were put back per link.
    ///
    /// The store first: one commit holds the accepted decisions again, the
    /// held deletes, and the ids whose files are still to be written
    /// ([`StoreWrite::putting_back`]); then the files. A stop or a failed
    /// write between the two leaves the ids listed, and the files are
    /// written at the next start or retry ([`Node::finish_put_back`]):
    /// never read as this master's own decision meanwhile.
    pub(super) fn put_back(
        &mut self,
        list: Vec<(PeerName, PutBack)>,
        now: Now,
        rt: &mut impl Runtime,
    ) -> Vec<(PeerName, usize)> {
        if list.is_empty() {
            return Vec::new();
        }
        if self.warm(list.iter().map(|(_, p)| &p.delete.id), rt).is_err() {
            return Vec::new();
        }
        let chosen: Vec<(PeerName, PutBack)> = list
            .into_iter()
            .filter(|(_, p)| {
                let id = &p.delete.id;
                // The id holds that very delete, and it told no conflict when
                // applied (it knew every other decision seen of the id):
                // putting back one that did would leave a conflict told
                // about a decision this master no longer holds.
                self.replica.entry(id).is_some_and(|e| {
                    e.version == p.delete.version && e.seen().iter().all(|s| p.delete.context.knows(&s.version))
                }) && !self.settler.is_unsettled(id.as_str())
                    && self.retried(id).next().is_none()
                    && !self.guard.is_held(id)
                    && interpret(&rt.read_slots(id)) == Reading::Undecided
            })
            .collect();
        if chosen.is_empty() {
            return Vec::new();
        }
        // The entry as if the delete had been held from the start: what it
        // was, knowing too what was learnt of the id since (claims seen).
        let chosen: Vec<(PeerName, PutBack)> = chosen
            .into_iter()
            .map(|(link, mut p)| {
                if let Some(now_held) = self.replica.entry(&p.delete.id) {
                    let mut seen = p.before.seen().to_vec();
                    for s in now_held.seen() {
                        if s.version != p.before.version && s.version != p.delete.version {
                            remember(&mut seen, s.clone());
                        }
                    }
                    let mine = p.before.mine().or(now_held.mine()).cloned();
                    p.before = p.before.with_seen(seen).with_mine(mine);
                }
                (link, p)
            })
            // What was learnt since may change what the id shows (a claim
            // rejecting the key): only a key the entry still shows is put back.
            .filter(|(_, p)| {
                crate::core::claims::effective(&p.before).is_some_and(|s| {
                    s.kind == VerdictKind::Accepted
                        && s.version == p.before.version
                        && s.fingerprint == p.accepted.verdict.fingerprint()
                })
            })
            .collect();
        if chosen.is_empty() {
            return Vec::new();
        }
        let held: Vec<HeldDelete> = chosen
            .iter()
            .map(|(link, p)| HeldDelete { decision: p.delete.clone(), from: link.clone(), since_ms: now.wall_ms })
            .collect();
        let decisions: Vec<Decision> = chosen.iter().map(|(_, p)| p.accepted.clone()).collect();
        let kept: Vec<Kept> = chosen.iter().map(|(_, p)| Kept::of(&p.delete.id, &p.before)).collect();
        let mut putting_back = self.waiting.putting_back.clone();
        putting_back.extend(chosen.iter().map(|(_, p)| p.delete.id.clone()));
        let write = StoreWrite {
            decisions: &decisions,
            kept: &kept,
            held: &held,
            putting_back: Some(&putting_back),
            clock: self.replica.clock(),
            ..StoreWrite::default()
        };
        if let Err(e) = rt.record(&write) {
            // Nothing changed: the deletes stay applied here.
            self.trouble.failed(rt, now.mono, "state store, putting back deleted keys", &e);
            return Vec::new();
        }
        self.waiting.putting_back = putting_back;
        let mut per_link: Vec<(PeerName, usize)> = Vec::new();
        for ((link, put_back), held) in chosen.into_iter().zip(held) {
            self.replica.set(&put_back.delete.id, put_back.before);
            self.guard.hold_put_back(held.clone());
            let key = put_back.accepted.verdict.fingerprint().expect("an accepted key has a fingerprint");
            rt.audit(Event::PutBack { held, key });
            match per_link.iter_mut().find(|(l, _)| *l == link) {
                Some((_, n)) => *n += 1,
                None => per_link.push((link, 1)),
            }
        }
        rt.flush_audit();
        self.finish_put_back(now, rt);
        per_link
    }

    /// Writes the keys put back whose files are not written yet (see
    /// [`Node::put_back`]), and forgets those done. An id whose entry no
    /// longer shows an accepted key, or whose folders show a decision, is
    /// done with; one a salt-key run is working on waits.
    pub(super) fn finish_put_back(&mut self, now: Now, rt: &mut impl Runtime) {
        if self.waiting.putting_back.is_empty() && !self.waiting.put_back_uncleared {
            return;
        }
        let ids = std::mem::take(&mut self.waiting.putting_back);
        if let Err(e) = self.warm(&ids, rt) {
            self.waiting.putting_back = ids;
            self.trouble.failed(rt, now.mono, "state store, putting back deleted keys", &e);
            return;
        }
        let mut waiting: Vec<MinionId> = Vec::new();
        let mut todo: Vec<MinionId> = Vec::new();
        for id in ids {
            let shows = self.replica.effective(&id).filter(|s| s.kind == VerdictKind::Accepted);
            if shows.is_none() {
                continue;
            }
            if self.settler.is_unsettled(id.as_str()) {
                waiting.push(id);
            } else if interpret(&rt.read_slots(&id)) == Reading::Undecided {
                todo.push(id);
            }
        }
        let writes: Vec<Decision> = match rt.load(&todo) {
            Ok(known) => todo
                .iter()
                .filter_map(|id| {
                    let shows = self.replica.effective(id)?;
                    known.iter().find(|d| d.id == *id && d.version == shows.version).cloned()
                })
                .collect(),
            Err(e) => {
                self.waiting.putting_back = waiting.into_iter().chain(todo).collect();
                self.trouble.failed(rt, now.mono, "state store, reading keys to put back", &e);
                return;
            }
        };
        let mut failed = false;
        let results = rt.apply(&writes.iter().collect::<Vec<_>>());
        for (decision, result) in writes.iter().zip(results) {
            match result {
                Ok(applied) => {
                    self.echoes.expect(decision.id.as_str(), &applied.changes, now.mono);
                    self.pending.remove(&decision.id);
                    super::remote::tell_discarded_pending(
                        &PeerName::trusted(self.settings.node.clone()),
                        decision,
                        &applied,
                        rt,
                    );
                }
                Err(e) => {
                    failed = true;
                    self.trouble.failed(rt, now.mono, &format!("the key folders, putting back {}", decision.id), &e);
                    waiting.push(decision.id.clone());
                }
            }
        }
        let synced = writes.is_empty() || rt.sync_folders().is_ok();
        if !synced {
            // Not durable yet: written again (to the same effect) at the retry.
            failed = true;
            waiting = waiting.into_iter().chain(writes.iter().map(|d| d.id.clone())).collect();
        }
        let cleared = StoreWrite { putting_back: Some(&waiting), clock: self.replica.clock(), ..StoreWrite::default() };
        // Until this is written, the store lists keys whose files are
        // written: written again at the retry.
        self.waiting.put_back_uncleared = match rt.record(&cleared) {
            Ok(()) => false,
            Err(e) => {
                self.trouble.failed(rt, now.mono, "state store, putting back deleted keys", &e);
                true
            }
        };
        failed |= self.waiting.put_back_uncleared;
        self.waiting.putting_back = waiting;
        if !failed && self.waiting.retry.is_empty() && !self.waiting.rescan_pending {
            self.trouble.succeeded(rt, now.mono);
        }
    }

    /// Whether `id` is a key put back whose file is not written yet: its
    /// absence from the folders is the agent's own unfinished write, not an
    /// operator's delete.
    pub(super) fn putting_back(&self, id: &MinionId) -> bool {
        self.waiting.putting_back.contains(id)
    }
}
