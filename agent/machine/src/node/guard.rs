//! The blast-radius guard: a peer's deletes of keys this master has
//! accepted are judged before they are applied, so one master's
//! `salt-key -D -y` (or a script, or `manage.key_regen` with auto_accept)
//! is not copied to every master in milliseconds.
//!
//! Deletes are counted by the link they arrive on — the peer authenticated
//! by TLS, which no peer can forge — not by the origin a decision names,
//! which a peer writes itself. A delete of an accepted key waits until its
//! link has sent no other for `quiet` (a burst has ended), then is applied —
//! unless the burst, with the deletes let through from that link within
//! `window`, has grown past the limit ([`GuardSettings::limit`]): then the
//! whole burst is held, and so is every later delete of an accepted key from
//! that link until it has been quiet for `window`. Waiting for the burst to
//! end is what lets the first deletes of a mass delete be held too: they
//! look like any single delete when they arrive.
//!
//! A mass delete can be slower than `quiet`: `salt-key -D` while salt-master
//! is stopped deletes about one key a second, each waiting on the event bus,
//! so each delete passes on its own. What this master showed before each
//! delete let through is therefore kept for `window` ([`PutBack`]); when the
//! burst goes past the limit, those deletes are put back (the key written
//! again from what was kept) and held with the rest, so the whole burst is
//! held whatever its speed.
//!
//! A delete a peer forwards (its origin is another master) also counts
//! against the whole master's budget: one that takes the deletes from all
//! links within `window` past the limit is held, so a master cannot spread
//! a mass delete over its peers' links. A delete that comes from its very
//! origin (firsthand) is judged by its own link alone: deletes forged in
//! another master's name, or forwarded faster than the origin's own copy,
//! never hold that master's deletes.
//!
//! Held deletes are kept in the store, never applied or dropped silently:
//! an operator releases them here (a new delete from this master) or
//! reverts them (a new accept of the key held here, which wins everywhere,
//! the origin included); a newer decision about the id settles them too.
//! Nothing a peer sends releases a held delete: a peer's delete that knew
//! it is a delete from that peer, judged like any other. Rejections,
//! accepts and deletes of keys not accepted here are never judged: in Salt
//! a rejection is the ban and a delete is housekeeping (a deleted minion
//! comes straight back pending).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use crate::PeerName;
use std::time::{Duration, Instant};

use crate::core::{Decision, Entry, MinionId};

/// How the guard judges bursts (the agent's `[guard]` table).
#[derive(Clone, Debug, PartialEq)]
pub struct GuardSettings {
    pub enabled: bool,
    /// A burst has ended when its link sent no delete of an accepted key
    /// for this long; its deletes wait for that before they are applied.
    pub quiet: Duration,
    /// Deletes from one link counted together; a held burst's link stays
    /// held until it has been quiet this long.
    pub window: Duration,
    /// Most deletes of accepted keys from one link (and forwarded ones from
    /// all links together) within `window`.
    pub max_deletes: usize,
    /// The same as a share of the keys this master had accepted when they
    /// began.
    pub max_share: f64,
}

impl Default for GuardSettings {
    fn default() -> GuardSettings {
        GuardSettings {
            enabled: true,
            quiet: Duration::from_secs(1),
            window: Duration::from_secs(60),
            max_deletes: 50,
            max_share: 0.5,
        }
    }
}

impl GuardSettings {
    /// Most deletes of accepted keys one link may bring within `window` on
    /// a master that had `n_accepted` accepted keys: `max_deletes`, or
    /// `max_share` of them if that is fewer, but at least one.
    pub fn limit(&self, n_accepted: usize) -> usize {
        let share = (self.max_share * n_accepted as f64).ceil() as usize;
        self.max_deletes.min(share).max(1)
    }
}

/// A peer's delete the guard holds (kept in the store).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldDelete {
    pub decision: Decision,
    /// The peer it came from.
    pub from: PeerName,
    /// When it was held (wall-clock milliseconds).
    pub since_ms: u64,
}

impl HeldDelete {
    /// The master where the delete was made.
    pub fn origin(&self) -> &Arc<str> {
        &self.decision.version.node
    }

    /// Whether `entry` settles it: it is newer, or knew it.
    pub fn settled_by(&self, entry: &Entry) -> bool {
        entry.version >= self.decision.version || entry.known().knows(&self.decision.version)
    }
}

/// A peer's delete of an accepted key the guard let through, with what this
/// master held before it: put back, and held, if the burst it belongs to
/// goes past the limit within `window`.
#[derive(Clone, Debug)]
pub(super) struct PutBack {
    /// The delete let through.
    pub delete: Decision,
    /// The id's entry before it.
    pub before: Entry,
    /// The accepted decision that entry held, its key included.
    pub accepted: Decision,
}

/// The deletes of accepted keys one link brought, as the guard counts them.
#[derive(Debug)]
struct Burst {
    /// When the last one arrived.
    last: Instant,
    /// Accepted keys here when the burst began: the share is of these.
    base: usize,
    /// Waiting for the link to go quiet.
    gathered: Vec<Decision>,
    /// When deletes from this link were let through, within `window`.
    passed: VecDeque<Instant>,
    /// What was held before the deletes let through (within `window`), to
    /// put back should the burst go past the limit.
    kept: VecDeque<(Instant, PutBack)>,
    /// Held for going past the whole master's budget, within `window`:
    /// they count against the link's own limit too.
    held: usize,
    /// The burst went past the limit: every delete of an accepted key from
    /// this link is held until it has been quiet for `window`.
    tripped: Option<usize>,
}

impl Burst {
    /// Forgets deletes let through longer than `window` ago.
    fn forget_older(&mut self, now: Instant, window: Duration) {
        while self.passed.front().is_some_and(|at| now.duration_since(*at) > window) {
            self.passed.pop_front();
        }
        while self.kept.front().is_some_and(|(at, _)| now.duration_since(*at) > window) {
            self.kept.pop_front();
        }
    }
}

/// Whether `decision` came from its very origin on link `from`.
fn firsthand(from: &PeerName, decision: &Decision) -> bool {
    *decision.version.node == *from.as_str()
}

/// What the guard has to tell since it was last asked.
#[derive(Debug, Default)]
pub(super) struct News {
    /// Deletes held now, to be kept in the store.
    pub fresh: Vec<HeldDelete>,
    /// Bursts that went past the limit: what they held so far.
    pub tripped: Vec<Tripped>,
    /// Held bursts whose link has been quiet for a window: link, deletes held.
    pub ended: Vec<(PeerName, usize)>,
    /// Held deletes replaced by a newer held delete of the same id.
    pub replaced: Vec<(HeldDelete, Decision)>,
    /// Held deletes given back to be judged again: the very delete came
    /// from its origin after it was held as forwarded by another link.
    pub rejudged: Vec<HeldDelete>,
    /// Deletes let through before their burst went past the limit: to be
    /// put back and held (see [`PutBack`]), with the link they came on.
    pub put_back: Vec<(PeerName, PutBack)>,
}

/// A burst the guard began to hold.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Tripped {
    /// The link its deletes came on.
    pub via: PeerName,
    /// Held for being forwarded past the whole master's budget, not for the
    /// link's own burst.
    pub forwarded: bool,
    /// Deletes held so far, and the limit they went past.
    pub n: usize,
    pub limit: usize,
}

#[derive(Debug)]
pub(super) struct Guard {
    pub settings: GuardSettings,
    held: BTreeMap<MinionId, HeldDelete>,
    /// Changes made to `held` so far (see [`Guard::held_changes`]).
    changes: u64,
    /// Per link, in name order (a run is the same run every time).
    bursts: BTreeMap<PeerName, Burst>,
    /// Forwarded deletes are being held for going past the whole master's
    /// budget (told once until the deletes within `window` are under it).
    forwarded_held: bool,
    /// Deletes let through for being judged, or no longer judged (the key
    /// is not accepted here any more): applied at the next tick.
    ready: Vec<(PeerName, Decision)>,
    news: News,
    /// This node's own deletes of accepted keys, to warn of a mass delete here.
    local: VecDeque<Instant>,
    local_warned: bool,
    /// Held deletes the store could not keep: written again at the next tick.
    pub unsaved: bool,
    /// Ids given back to be judged again that the store could not drop
    /// (with `unsaved`): dropped by the next write.
    pub unsaved_unheld: Vec<MinionId>,
}

impl Guard {
    pub fn new(settings: GuardSettings) -> Guard {
        Guard {
            settings,
            held: BTreeMap::new(),
            changes: 0,
            bursts: BTreeMap::new(),
            forwarded_held: false,
            ready: Vec::new(),
            news: News::default(),
            local: VecDeque::new(),
            local_warned: false,
            unsaved: false,
            unsaved_unheld: Vec::new(),
        }
    }

    /// Holds a delete loaded from the store at start-up.
    pub fn load(&mut self, held: HeldDelete) {
        self.changes += 1;
        self.held.insert(held.decision.id.clone(), held);
    }

    /// Whether `decision` is held or waiting already, or a newer delete of
    /// its id is (another peer forwarded it, or anti-entropy offers it again).
    fn knows(&self, decision: &Decision) -> bool {
        self.held.get(&decision.id).is_some_and(|held| held.decision.version >= decision.version)
            || self
                .bursts
                .values()
                .any(|burst| burst.gathered.iter().any(|d| d.id == decision.id && d.version >= decision.version))
    }

    /// `decision` came from its origin on its own link: if that very delete
    /// waits or is held as forwarded by another link (which may have raced
    /// the origin, or be the one flooding), it is taken from there to be
    /// judged with its origin's own deletes.
    fn take_forwarded_copy(&mut self, from: &PeerName, decision: &Decision) {
        for (link, burst) in &mut self.bursts {
            if link != from {
                burst.gathered.retain(|d| d.version != decision.version || d.id != decision.id);
            }
        }
        if self
            .held
            .get(&decision.id)
            .is_some_and(|held| held.from != *from && held.decision.version == decision.version)
        {
            if let Some(held) = self.held.remove(&decision.id) {
                self.changes += 1;
                self.news.rejudged.push(held);
            }
        }
    }

    /// Deletes of accepted keys from all links within `window`: let through,
    /// and waiting.
    fn all_links(&self) -> (usize, usize) {
        self.bursts
            .values()
            .fold((0, 0), |(passed, gathered), b| (passed + b.passed.len(), gathered + b.gathered.len()))
    }

    /// A peer's delete of a key accepted here, from link `from`: held, or
    /// waiting for its link to go quiet. `n_accepted`: keys accepted here now.
    pub fn offer(&mut self, from: PeerName, decision: Decision, n_accepted: usize, now: Instant, wall_ms: u64) {
        let firsthand = firsthand(&from, &decision);
        if firsthand {
            self.take_forwarded_copy(&from, &decision);
        }
        if self.knows(&decision) {
            return;
        }
        let window = self.settings.window;
        let burst = self.bursts.entry(from.clone()).or_insert_with(|| Burst {
            last: now,
            base: n_accepted,
            gathered: Vec::new(),
            passed: VecDeque::new(),
            kept: VecDeque::new(),
            held: 0,
            tripped: None,
        });
        if burst.gathered.is_empty() && burst.tripped.is_none() {
            // A new burst: the share is of what was accepted before it, so
            // it does not shrink as the burst goes on.
            burst.base = n_accepted + burst.passed.len();
        }
        burst.last = now;
        burst.forget_older(now, window);
        burst.gathered.retain(|d| d.id != decision.id);
        burst.gathered.push(decision);
        if let Some(n_held) = &mut burst.tripped {
            *n_held += burst.gathered.len();
        } else {
            let limit = self.settings.limit(burst.base);
            if burst.gathered.len() + burst.passed.len() + burst.held > limit {
                burst.tripped = Some(burst.gathered.len());
                let n = burst.gathered.len();
                self.news.tripped.push(Tripped { via: from.clone(), forwarded: false, n, limit });
                // The burst's first deletes were let through one by one
                // (slower than `quiet`): put back and held with the rest.
                let kept = std::mem::take(&mut burst.kept);
                self.news.put_back.extend(kept.into_iter().map(|(_, put_back)| (from.clone(), put_back)));
            } else if !firsthand {
                self.judge_forwarded(n_accepted, wall_ms);
                return;
            } else {
                return;
            }
        }
        let gathered = std::mem::take(&mut self.bursts.get_mut(&from).expect("just used").gathered);
        self.hold(&from, gathered, wall_ms);
    }

    /// The whole master's budget: forwarded deletes that take the deletes
    /// from all links within `window` past the limit are held, on every link.
    fn judge_forwarded(&mut self, n_accepted: usize, wall_ms: u64) {
        let (passed, gathered) = self.all_links();
        let limit = self.settings.limit(n_accepted + passed);
        if passed + gathered <= limit {
            return;
        }
        let links: Vec<PeerName> = self.bursts.keys().cloned().collect();
        for link in links {
            let burst = self.bursts.get_mut(&link).expect("listed");
            let (forwarded, own): (Vec<Decision>, Vec<Decision>) =
                std::mem::take(&mut burst.gathered).into_iter().partition(|d| !firsthand(&link, d));
            burst.gathered = own;
            if forwarded.is_empty() {
                continue;
            }
            burst.held += forwarded.len();
            if !self.forwarded_held {
                self.forwarded_held = true;
                self.news.tripped.push(Tripped { via: link.clone(), forwarded: true, n: forwarded.len(), limit });
            }
            self.hold(&link, forwarded, wall_ms);
        }
    }

    /// Holds deletes that came on link `from`.
    fn hold(&mut self, from: &PeerName, decisions: Vec<Decision>, wall_ms: u64) {
        for decision in decisions {
            // Gathered before a newer delete of the same id was held (from
            // another link): that one stands, this one is covered by it.
            if self.held.get(&decision.id).is_some_and(|held| held.decision.version > decision.version) {
                continue;
            }
            let held = HeldDelete { decision, from: from.clone(), since_ms: wall_ms };
            self.changes += 1;
            self.news.fresh.push(held.clone());
            if let Some(old) = self.held.insert(held.decision.id.clone(), held.clone()) {
                self.news.replaced.push((old, held.decision));
            }
        }
    }

    /// Deletes to apply now: those whose origin has gone quiet without
    /// passing the limit, and those no longer judged. Ends held bursts whose
    /// origin has been quiet for a window.
    pub fn due(&mut self, now: Instant) -> Vec<(PeerName, Decision)> {
        let mut due = std::mem::take(&mut self.ready);
        let (quiet, window) = (self.settings.quiet, self.settings.window);
        for (link, burst) in &mut self.bursts {
            let idle = now.saturating_duration_since(burst.last);
            if burst.tripped.is_none() && !burst.gathered.is_empty() && idle >= quiet {
                burst.passed.extend(std::iter::repeat_n(now, burst.gathered.len()));
                due.extend(burst.gathered.drain(..).map(|d| (link.clone(), d)));
            }
            burst.forget_older(now, window);
            if idle >= window {
                if let Some(n_held) = burst.tripped.take() {
                    self.news.ended.push((link.clone(), n_held));
                }
                burst.passed.clear();
                burst.kept.clear();
                burst.held = 0;
            }
        }
        self.bursts.retain(|_, b| b.tripped.is_some() || !b.gathered.is_empty() || !b.passed.is_empty() || b.held > 0);
        if self.all_links() == (0, 0) {
            self.forwarded_held = false;
        }
        due
    }

    /// When [`Guard::due`] next has something to do (`seen`: the latest
    /// time an input came with, when something is ready now).
    pub fn next_due(&self, seen: Instant) -> Option<Instant> {
        let soonest = self
            .bursts
            .values()
            .map(|burst| {
                if burst.tripped.is_none() && !burst.gathered.is_empty() {
                    burst.last + self.settings.quiet
                } else {
                    burst.last + self.settings.window
                }
            })
            .min();
        if self.ready.is_empty() {
            soonest
        } else {
            Some(seen.min(soonest.unwrap_or(seen)))
        }
    }

    /// A delete from link `from` that [`Guard::due`] let through was applied:
    /// what was held before it is kept for `window`, to be put back should
    /// the burst go past the limit.
    pub fn keep(&mut self, from: &PeerName, put_back: PutBack, now: Instant) {
        if let Some(burst) = self.bursts.get_mut(from).filter(|burst| burst.tripped.is_none()) {
            burst.kept.push_back((now, put_back));
        }
    }

    /// A delete let through was put back here ([`News::put_back`]): held
    /// from now on (the caller kept it in the store with the key).
    pub fn hold_put_back(&mut self, held: HeldDelete) {
        self.changes += 1;
        // Counted with its burst (told when the burst ends).
        if let Some(n_held) = self.bursts.get_mut(&held.from).and_then(|burst| burst.tripped.as_mut()) {
            *n_held += 1;
        }
        self.held.insert(held.decision.id.clone(), held);
    }

    /// Whether deletes are waiting to be judged or applied.
    pub fn is_waiting(&self) -> bool {
        !self.ready.is_empty() || self.bursts.values().any(|burst| !burst.gathered.is_empty())
    }

    /// The held delete for `id`, if `entry` (its new entry here) settles it
    /// (removed from the guard; the caller removes it from the store). One
    /// whose key is no longer accepted here and that is not settled is no
    /// longer judged: it is applied at the next tick.
    pub fn settle(&mut self, id: &MinionId, entry: Option<&Entry>, still_accepted: bool) -> Option<HeldDelete> {
        let held = self.held.get(id)?;
        if entry.is_some_and(|entry| held.settled_by(entry)) {
            self.changes += 1;
            return self.held.remove(id);
        }
        if !still_accepted {
            self.changes += 1;
            let held = self.held.remove(id)?;
            self.ready.push((held.from.clone(), held.decision.clone()));
            return Some(held);
        }
        None
    }

    /// `id` now holds `version` here: deletes of it waiting for their origin
    /// to go quiet that it beats are done with (applied, or superseded).
    pub fn forget_waiting(&mut self, id: &MinionId, version: &crate::core::Version) {
        for burst in self.bursts.values_mut() {
            burst.gathered.retain(|d| d.id != *id || d.version > *version);
        }
    }

    /// Whether [`Guard::settle`] would settle the delete held for `id`.
    pub fn would_settle(&self, id: &MinionId, entry: Option<&Entry>, still_accepted: bool) -> bool {
        self.held.get(id).is_some_and(|held| !still_accepted || entry.is_some_and(|entry| held.settled_by(entry)))
    }

    /// Held deletes chosen by an operator: from `origin` if given, and of
    /// `ids` if any are given.
    pub fn select(&self, origin: Option<&str>, ids: &[MinionId]) -> Vec<HeldDelete> {
        self.held
            .values()
            .filter(|held| origin.is_none_or(|o| &**held.origin() == o))
            .filter(|held| ids.is_empty() || ids.contains(&held.decision.id))
            .cloned()
            .collect()
    }

    pub fn held(&self) -> impl Iterator<Item = &HeldDelete> {
        self.held.values()
    }

    /// Grows whenever a delete is held or let go: the same number means
    /// the same held deletes, so what is shown of them need not be redone.
    pub fn held_changes(&self) -> u64 {
        self.changes
    }

    pub fn is_held(&self, id: &MinionId) -> bool {
        self.held.contains_key(id)
    }

    pub fn take_news(&mut self) -> News {
        std::mem::take(&mut self.news)
    }

    /// This node's operator deleted `n` accepted keys: returns the count once
    /// they go past the limit (once per burst), for the origin's own warning.
    pub fn local_deletes(&mut self, n: usize, n_accepted: usize, now: Instant) -> Option<(usize, usize)> {
        let window = self.settings.window;
        while self.local.front().is_some_and(|at| now.duration_since(*at) > window) {
            self.local.pop_front();
        }
        if self.local.is_empty() {
            self.local_warned = false;
        }
        let base = n_accepted + self.local.len() + n;
        self.local.extend(std::iter::repeat_n(now, n));
        let limit = self.settings.limit(base);
        if self.local.len() > limit && !self.local_warned {
            self.local_warned = true;
            return Some((self.local.len(), limit));
        }
        None
    }
}

#[cfg(test)]
mod tests;
