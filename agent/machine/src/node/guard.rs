//! The blast-radius guard: a peer's deletes of keys this master has
//! accepted are judged per origin before they are applied, so one master's
//! `salt-key -D -y` (or a script, or `manage.key_regen` with auto_accept)
//! is not copied to every master in milliseconds.
//!
//! A delete of an accepted key from a peer waits until its origin has sent
//! no other for `quiet` (a burst has ended), then is applied — unless the
//! burst, with the deletes let through from that origin within `window`,
//! has grown past the limit ([`GuardSettings::limit`]): then the whole burst
//! is held, and so is every later delete of an accepted key from that origin
//! until it has been quiet for `window`. Waiting for the burst to end is
//! what lets the first deletes of a mass delete be held too: they look like
//! any single delete when they arrive.
//!
//! Held deletes are kept in the store, never applied or dropped silently:
//! an operator releases them (a new delete that knew them, which passes the
//! guard everywhere) or reverts them (a new accept of the key held here,
//! which wins everywhere, the origin included); a newer decision about the
//! id settles them too. Rejections, accepts and deletes of keys not
//! accepted here are never judged: in Salt a rejection is the ban and a
//! delete is housekeeping (a deleted minion comes straight back pending).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::core::{Decision, Entry, MinionId};

/// How the guard judges bursts (the agent's `[guard]` table).
#[derive(Clone, Debug, PartialEq)]
pub struct GuardSettings {
    pub enabled: bool,
    /// A burst has ended when its origin sent no delete of an accepted key
    /// for this long; its deletes wait for that before they are applied.
    pub quiet: Duration,
    /// Deletes from one origin counted together; a held burst's origin stays
    /// held until it has been quiet this long.
    pub window: Duration,
    /// Most deletes of accepted keys from one origin within `window`.
    pub max_deletes: usize,
    /// Most deletes of accepted keys from one origin within `window`, as a
    /// share of the keys this master had accepted when they began.
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
    /// Most deletes of accepted keys one origin may make within `window` on
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
    pub from: Arc<str>,
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

/// One origin's deletes of accepted keys, as the guard counts them.
#[derive(Debug)]
struct Burst {
    /// When the last one arrived.
    last: Instant,
    /// Accepted keys here when the burst began: the share is of these.
    base: usize,
    /// Waiting for the origin to go quiet.
    gathered: Vec<(Arc<str>, Decision)>,
    /// When deletes from this origin were let through, within `window`.
    passed: VecDeque<Instant>,
    /// The burst went past the limit: every delete of an accepted key from
    /// this origin is held until it has been quiet for `window`.
    tripped: Option<usize>,
}

/// What the guard has to tell since it was last asked.
#[derive(Debug, Default)]
pub(super) struct News {
    /// Deletes held now, to be kept in the store.
    pub fresh: Vec<HeldDelete>,
    /// Bursts that went past the limit: origin, deletes held so far, limit.
    pub tripped: Vec<(Arc<str>, usize, usize)>,
    /// Held bursts whose origin has been quiet for a window: origin, deletes held.
    pub ended: Vec<(Arc<str>, usize)>,
    /// Held deletes replaced by a newer held delete of the same id.
    pub replaced: Vec<(HeldDelete, Decision)>,
}

#[derive(Debug)]
pub(super) struct Guard {
    pub settings: GuardSettings,
    held: BTreeMap<MinionId, HeldDelete>,
    /// Changes made to `held` so far (see [`Guard::held_changes`]).
    changes: u64,
    /// Per origin, in name order (a run is the same run every time).
    bursts: BTreeMap<Arc<str>, Burst>,
    /// Deletes let through for being judged, or no longer judged (the key
    /// is not accepted here any more): applied at the next tick.
    ready: Vec<(Arc<str>, Decision)>,
    news: News,
    /// This node's own deletes of accepted keys, to warn of a mass delete here.
    local: VecDeque<Instant>,
    local_warned: bool,
    /// Held deletes the store could not keep: written again at the next tick.
    pub unsaved: bool,
}

impl Guard {
    pub fn new(settings: GuardSettings) -> Guard {
        Guard {
            settings,
            held: BTreeMap::new(),
            changes: 0,
            bursts: BTreeMap::new(),
            ready: Vec::new(),
            news: News::default(),
            local: VecDeque::new(),
            local_warned: false,
            unsaved: false,
        }
    }

    /// Holds a delete loaded from the store at start-up.
    pub fn load(&mut self, held: HeldDelete) {
        self.changes += 1;
        self.held.insert(held.decision.id.clone(), held);
    }

    /// Whether `decision` releases a delete held here: an operator's delete
    /// that knew it.
    pub fn releases(&self, decision: &Decision) -> bool {
        self.held.get(&decision.id).is_some_and(|held| decision.context.knows(&held.decision.version))
    }

    /// Whether `decision` is held or waiting already, or a newer delete of
    /// its id is (another peer forwarded it, or anti-entropy offers it again).
    fn knows(&self, decision: &Decision) -> bool {
        let origin = &decision.version.node;
        self.held.get(&decision.id).is_some_and(|held| held.decision.version >= decision.version)
            || self.bursts.get(origin).is_some_and(|burst| {
                burst.gathered.iter().any(|(_, d)| d.id == decision.id && d.version >= decision.version)
            })
    }

    /// A peer's delete of a key accepted here, from `from`: held, or waiting
    /// for its origin to go quiet. `n_accepted`: keys accepted here now.
    pub fn offer(&mut self, from: Arc<str>, decision: Decision, n_accepted: usize, now: Instant, wall_ms: u64) {
        if self.knows(&decision) {
            return;
        }
        let window = self.settings.window;
        let origin = decision.version.node.clone();
        let burst = self.bursts.entry(origin.clone()).or_insert_with(|| Burst {
            last: now,
            base: n_accepted,
            gathered: Vec::new(),
            passed: VecDeque::new(),
            tripped: None,
        });
        if burst.gathered.is_empty() && burst.tripped.is_none() {
            // A new burst: the share is of what was accepted before it, so
            // it does not shrink as the burst goes on.
            burst.base = n_accepted + burst.passed.len();
        }
        burst.last = now;
        while burst.passed.front().is_some_and(|at| now.duration_since(*at) > window) {
            burst.passed.pop_front();
        }
        burst.gathered.retain(|(_, d)| d.id != decision.id);
        burst.gathered.push((from, decision));
        if let Some(n_held) = &mut burst.tripped {
            *n_held += burst.gathered.len();
        } else {
            let limit = self.settings.limit(burst.base);
            if burst.gathered.len() + burst.passed.len() <= limit {
                return;
            }
            burst.tripped = Some(burst.gathered.len());
            self.news.tripped.push((origin.clone(), burst.gathered.len(), limit));
        }
        for (from, decision) in std::mem::take(&mut burst.gathered) {
            // Gathered before a newer delete of the same id was held (from
            // another origin): that one stands, this one is covered by it.
            if self.held.get(&decision.id).is_some_and(|held| held.decision.version > decision.version) {
                continue;
            }
            let held = HeldDelete { decision, from, since_ms: wall_ms };
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
    pub fn due(&mut self, now: Instant) -> Vec<(Arc<str>, Decision)> {
        let mut due = std::mem::take(&mut self.ready);
        let (quiet, window) = (self.settings.quiet, self.settings.window);
        for (origin, burst) in &mut self.bursts {
            let idle = now.saturating_duration_since(burst.last);
            if burst.tripped.is_none() && !burst.gathered.is_empty() && idle >= quiet {
                burst.passed.extend(std::iter::repeat_n(now, burst.gathered.len()));
                due.append(&mut burst.gathered);
            }
            if idle >= window {
                if let Some(n_held) = burst.tripped.take() {
                    self.news.ended.push((origin.clone(), n_held));
                }
                burst.passed.clear();
            }
        }
        self.bursts
            .retain(|_, burst| burst.tripped.is_some() || !burst.gathered.is_empty() || !burst.passed.is_empty());
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
            burst.gathered.retain(|(_, d)| d.id != *id || d.version > *version);
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
mod tests {
    use super::*;
    use crate::core::{Context, Relays, Verdict, Version};

    fn delete(name: &str, origin: &str, ms: u64) -> Decision {
        Decision {
            id: MinionId::parse(name).unwrap(),
            verdict: Verdict::Deleted,
            version: Version::new(ms << 16, origin),
            context: Context::default(),
            relays: Relays::default(),
        }
    }

    fn guard() -> Guard {
        Guard::new(GuardSettings::default())
    }

    #[test]
    fn the_limit_is_a_count_or_a_share_whichever_is_fewer() {
        let settings = GuardSettings::default();
        assert_eq!(settings.limit(300), 50);
        assert_eq!(settings.limit(40), 20);
        assert_eq!(settings.limit(3), 2);
        assert_eq!(settings.limit(0), 1);
    }

    /// Ten deletes in a burst wait for the origin to go quiet, then all pass.
    #[test]
    fn a_small_burst_waits_for_quiet_then_passes() {
        let mut g = guard();
        let t0 = Instant::now();
        for i in 0..10 {
            g.offer("b".into(), delete(&format!("m{i}"), "b", 1), 300, t0 + Duration::from_millis(i * 10), 0);
        }
        assert!(g.due(t0 + Duration::from_millis(500)).is_empty(), "the origin is not quiet yet");
        assert_eq!(g.next_due(t0), Some(t0 + Duration::from_millis(90) + Duration::from_secs(1)));
        assert_eq!(g.due(t0 + Duration::from_secs(2)).len(), 10);
        assert!(g.held().next().is_none() && g.take_news().tripped.is_empty());
    }

    /// A burst past the limit is held whole, from its first delete, and the
    /// origin's later deletes are held until it has been quiet a window.
    #[test]
    fn a_mass_delete_is_held_whole_and_its_origin_stays_held_for_a_window() {
        let mut g = guard();
        let t0 = Instant::now();
        for i in 0..300 {
            g.offer("a".into(), delete(&format!("m{i}"), "a", 1), 300 - i as usize, t0 + Duration::from_millis(i), 7);
        }
        assert_eq!(g.held().count(), 300);
        let news = g.take_news();
        assert_eq!(news.fresh.len(), 300);
        assert_eq!(news.tripped, vec![(Arc::from("a"), 51, 50)]);
        assert!(g.due(t0 + Duration::from_secs(5)).is_empty(), "nothing is let through");
        g.offer("c".into(), delete("late", "a", 2), 10, t0 + Duration::from_secs(30), 7);
        assert!(g.is_held(&MinionId::parse("late").unwrap()), "still held half a window later");
        assert!(g.due(t0 + Duration::from_secs(91)).is_empty());
        assert_eq!(g.take_news().ended, vec![(Arc::from("a"), 301)]);
        // A new burst from the same origin is judged afresh.
        g.offer("a".into(), delete("next", "a", 3), 10, t0 + Duration::from_secs(100), 7);
        assert_eq!(g.due(t0 + Duration::from_secs(102)).len(), 1);
    }

    /// Bursts just under the limit, one after another, are counted together
    /// within the window: the rate is bounded, not only each burst.
    #[test]
    fn bursts_within_the_window_count_together() {
        let mut g = guard();
        let t0 = Instant::now();
        for round in 0..3u64 {
            for i in 0..20u64 {
                let at = t0 + Duration::from_secs(round * 5) + Duration::from_millis(i);
                g.offer("b".into(), delete(&format!("r{round}m{i}"), "b", 1), 1000, at, 0);
            }
            g.due(t0 + Duration::from_secs(round * 5 + 2));
        }
        assert_eq!(g.held().count(), 20, "the third burst went past 50 within a minute");
    }

    /// The same delete offered again (forwarded by another peer, or by
    /// anti-entropy) is neither counted nor held twice.
    #[test]
    fn a_delete_offered_again_counts_once() {
        let mut g = guard();
        let t0 = Instant::now();
        for _ in 0..100 {
            g.offer("b".into(), delete("m0", "b", 1), 300, t0, 0);
        }
        assert_eq!(g.due(t0 + Duration::from_secs(2)).len(), 1);
    }

    /// A delete gathered before a newer delete of the same id was held (from
    /// another origin) never takes that one's place when its own burst is
    /// held later (found by the simulation, seed 3811).
    #[test]
    fn an_older_gathered_delete_never_replaces_a_newer_held_one() {
        let mut g = guard();
        let t0 = Instant::now();
        g.offer("b".into(), delete("x", "b", 5), 300, t0, 0);
        for i in 0..60 {
            g.offer("c".into(), delete(&format!("c{i}"), "c", 9), 300, t0, 0);
        }
        g.offer("c".into(), delete("x", "c", 9), 300, t0, 0);
        assert_eq!(g.held.get(&MinionId::parse("x").unwrap()).unwrap().origin().as_ref(), "c");
        for i in 0..60 {
            g.offer("b".into(), delete(&format!("b{i}"), "b", 5), 300, t0, 0);
        }
        let x = g.held.get(&MinionId::parse("x").unwrap()).unwrap();
        assert_eq!((x.origin().as_ref(), x.decision.version.hlc), ("c", 9 << 16), "the newer one stands");
    }

    /// The origin warns of its own mass delete once per burst.
    #[test]
    fn the_origin_warns_once_per_burst() {
        let mut g = guard();
        let t0 = Instant::now();
        assert_eq!(g.local_deletes(10, 290, t0), None);
        assert_eq!(g.local_deletes(100, 190, t0), Some((110, 50)));
        assert_eq!(g.local_deletes(100, 90, t0), None, "told once");
        assert_eq!(g.local_deletes(60, 30, t0 + Duration::from_secs(120)), Some((60, 45)));
    }
}
