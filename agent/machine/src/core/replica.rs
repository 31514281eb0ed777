//! One node's replicated state as a plain state machine: decisions held per
//! id, their digests and the clock. The driver feeds it folder readings and
//! peers' decisions and persists what it returns; nothing here does I/O.

use std::collections::HashMap;
use std::sync::Arc;

use super::causal::{remember, Seen};
use super::decision::{Decision, Entry, Verdict};
use super::digest::{bucket_of, Digests};
use super::id::MinionId;
use super::merge::{merge, Merged};
use super::observe::Reading;
use super::version::{Hlc, SkewError, Version};

/// An id's summary for anti-entropy: the version held and what it says
/// (`None` from a peer of protocol 1, which sends versions only).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Summary {
    pub version: Version,
    pub content: Option<(u8, Option<super::decision::Fingerprint>)>,
}

impl Summary {
    pub fn of(seen: &Seen) -> Summary {
        Summary { version: seen.version.clone(), content: Some(seen.content_rank()) }
    }

    /// Whether this summary names a decision that beats `other` (unknown
    /// contents compare equal: only the versions decide).
    pub fn beats(&self, other: &Summary) -> bool {
        match (&self.content, &other.content) {
            (Some(mine), Some(theirs)) => (&self.version, mine) > (&other.version, theirs),
            _ => self.version > other.version,
        }
    }
}

/// How a folder reading turns into a version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObserveMode {
    /// The agent is running (or restarting with a store): folder changes are
    /// new decisions.
    Live,
    /// The agent's very first start: what the folders hold is recorded with
    /// the bootstrap version, below anything the cluster decided.
    FirstStart,
}

#[derive(Debug)]
pub struct Replica {
    node: Arc<str>,
    entries: HashMap<MinionId, Entry>,
    digests: Digests,
    clock: Hlc,
}

impl Replica {
    pub fn new(node: &str, clock: Hlc) -> Replica {
        Replica { node: node.into(), entries: HashMap::new(), digests: Digests::default(), clock }
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn entry(&self, id: &MinionId) -> Option<&Entry> {
        self.entries.get(id)
    }

    pub fn entries(&self) -> impl Iterator<Item = (&MinionId, &Entry)> {
        self.entries.iter()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn clock(&self) -> u64 {
        self.clock.last()
    }

    pub fn digests(&self) -> &Digests {
        &self.digests
    }

    /// Turns a settled folder reading into a new local decision, if it says
    /// something other than the decision held. The decision is not held until
    /// [`Replica::commit`].
    pub fn observe(&mut self, id: &MinionId, reading: Reading, wall_ms: u64, mode: ObserveMode) -> Option<Decision> {
        let held = self.entries.get(id);
        let verdict = match reading {
            Reading::Unknown => return None,
            Reading::Decided(verdict) => verdict,
            // Pending or absent: a tombstone, unless nothing was ever decided.
            Reading::Undecided if held.is_none() => return None,
            Reading::Undecided => Verdict::Deleted,
        };
        if held.is_some_and(|entry| entry.same_verdict(&verdict)) {
            return None;
        }
        let version = match mode {
            ObserveMode::Live => Version::new(self.clock.tick(wall_ms), self.node.clone()),
            ObserveMode::FirstStart => Version::bootstrap(self.node.clone(), wall_ms),
        };
        // It knowingly replaces everything this node has seen of the id.
        let context = held.map(Entry::known).unwrap_or_default();
        Some(Decision { id: id.clone(), verdict, version, context, relays: Default::default() })
    }

    /// Checks a peer's decision against the skew bound and the decision held.
    /// The decision is not held until [`Replica::commit`].
    pub fn merge(&mut self, incoming: &Decision, wall_ms: u64, max_skew_ms: u64) -> Result<Merged, SkewError> {
        self.clock.observe(&incoming.version, wall_ms, max_skew_ms)?;
        Ok(merge(self.entries.get(&incoming.id), incoming))
    }

    /// Holds `decision` (its files are durable and it is in the store) if
    /// it beats the decision held, which is then remembered as seen; a
    /// decision that does not is only remembered.
    pub fn commit(&mut self, decision: &Decision) {
        // A later local decision must outrank whatever is held.
        self.clock.witness(decision.version.hlc);
        let incoming = decision.seen();
        match self.entries.get_mut(&decision.id) {
            Some(held) if held.held().same_as(&incoming) => {}
            Some(held) if incoming.beats(&held.held()) => {
                let old = held.held();
                self.digests.replace(&decision.id, Some(&old), &incoming);
                let mut seen = std::mem::take(&mut held.seen).into_vec();
                remember(&mut seen, old);
                *held = Entry { seen: seen.into_boxed_slice(), ..decision.entry() };
            }
            Some(held) => {
                let mut seen = std::mem::take(&mut held.seen).into_vec();
                remember(&mut seen, incoming);
                held.seen = seen.into_boxed_slice();
            }
            None => {
                self.digests.replace(&decision.id, None, &incoming);
                self.entries.insert(decision.id.clone(), decision.entry());
            }
        }
    }

    /// The other decisions seen for `decision`'s id once it is committed
    /// (what the store keeps with it).
    pub fn seen_after(&self, decision: &Decision) -> Vec<Seen> {
        let incoming = decision.seen();
        let Some(held) = self.entries.get(&decision.id) else { return Vec::new() };
        let mut seen = held.seen.to_vec();
        if held.held().same_as(&incoming) {
            return seen;
        }
        remember(&mut seen, if incoming.beats(&held.held()) { held.held() } else { incoming });
        seen
    }

    /// Loads an entry from the store at start-up.
    pub fn load(&mut self, id: MinionId, entry: Entry) {
        self.clock.witness(entry.version.hlc);
        self.digests.replace(&id, None, &entry.held());
        self.entries.insert(id, entry);
    }

    /// The entries in the given buckets, for a peer's anti-entropy.
    pub fn summaries_in(&self, buckets: &[u32]) -> Vec<(MinionId, Summary)> {
        let mut wanted = vec![false; self.digests.as_slice().len()];
        for &bucket in buckets {
            if let Some(slot) = wanted.get_mut(bucket as usize) {
                *slot = true;
            }
        }
        let mut out: Vec<_> = self
            .entries
            .iter()
            .filter(|(id, _)| wanted[bucket_of(id)])
            .map(|(id, entry)| (id.clone(), Summary::of(&entry.held())))
            .collect();
        out.sort();
        out
    }

    /// Whether a peer's summary names a decision that beats the one held.
    pub fn is_newer_on_peer(&self, id: &MinionId, theirs: &Summary) -> bool {
        self.entries.get(id).is_none_or(|entry| theirs.beats(&Summary::of(&entry.held())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::decision::PublicKey;
    use crate::testkit::PUB;

    fn id() -> MinionId {
        MinionId::parse("web01").unwrap()
    }

    fn accepted() -> Verdict {
        Verdict::Accepted(PublicKey::new(PUB.as_bytes()))
    }

    #[test]
    fn observing_an_unchanged_folder_decides_nothing() {
        let mut replica = Replica::new("a", Hlc::default());
        let d = replica.observe(&id(), Reading::Decided(accepted()), 1000, ObserveMode::Live).unwrap();
        assert_eq!(d.version, Version::new(Hlc::default().tick(1000), "a"));
        assert!(d.context.is_empty(), "nothing was known of web01");
        replica.commit(&d);
        // The agent's own write of the same decision comes back as an event: no echo.
        assert_eq!(replica.observe(&id(), Reading::Decided(accepted()), 2000, ObserveMode::Live), None);
        assert_eq!(replica.observe(&id(), Reading::Unknown, 2000, ObserveMode::Live), None);
    }

    #[test]
    fn a_key_gone_from_every_folder_is_a_tombstone() {
        let mut replica = Replica::new("a", Hlc::default());
        assert_eq!(replica.observe(&id(), Reading::Undecided, 1000, ObserveMode::Live), None);
        let accept = replica.observe(&id(), Reading::Decided(accepted()), 1000, ObserveMode::Live).unwrap();
        replica.commit(&accept);
        let delete = replica.observe(&id(), Reading::Undecided, 1001, ObserveMode::Live).unwrap();
        assert_eq!(delete.verdict, Verdict::Deleted);
        assert_eq!(delete.context.highest(), Some(&accept.version));
        assert!(delete.context.knows(&accept.version));
    }

    #[test]
    fn a_decision_held_without_a_merge_still_moves_the_clock() {
        let now_ms = 1_700_000_000_000;
        let peer = Decision {
            id: id(),
            verdict: accepted(),
            version: Version::new(Hlc::default().tick(now_ms + 2_000), "b"),
            context: Default::default(),
            relays: Default::default(),
        };
        let mut replica = Replica::new("a", Hlc::resume(0));
        replica.load(id(), peer.entry());
        let delete = replica.observe(&id(), Reading::Undecided, now_ms, ObserveMode::Live).unwrap();
        assert!(delete.version > peer.version, "{} <= {}", delete.version, peer.version);
    }

    #[test]
    fn first_start_uses_the_bootstrap_version() {
        let mut replica = Replica::new("a", Hlc::default());
        let d = replica.observe(&id(), Reading::Decided(accepted()), 1000, ObserveMode::FirstStart).unwrap();
        assert!(d.version.is_bootstrap());
    }

    #[test]
    fn commit_keeps_the_newest_and_digests_follow() {
        let mut replica = Replica::new("a", Hlc::default());
        let newer = Decision {
            id: id(),
            verdict: Verdict::Deleted,
            version: Version::new(9, "b"),
            context: Default::default(),
            relays: Default::default(),
        };
        let older = Decision {
            id: id(),
            verdict: accepted(),
            version: Version::new(5, "c"),
            context: Default::default(),
            relays: Default::default(),
        };
        replica.commit(&newer);
        let digests = replica.digests().clone();
        replica.commit(&older);
        assert_eq!(replica.entry(&id()).unwrap().version, newer.version);
        assert_eq!(replica.digests(), &digests);
        let bucket = bucket_of(&id()) as u32;
        assert_eq!(replica.summaries_in(&[bucket]), vec![(id(), Summary::of(&newer.seen()))]);
        assert!(!replica.is_newer_on_peer(&id(), &Summary::of(&newer.seen())));
        assert!(!replica.is_newer_on_peer(&id(), &Summary { version: Version::new(9, "b"), content: None }));
        assert!(replica.is_newer_on_peer(&id(), &Summary { version: Version::new(10, "a"), content: None }));
        // The older decision is remembered, for conflicts, not held.
        assert_eq!(replica.entry(&id()).unwrap().seen.len(), 1);
    }

    #[test]
    fn a_local_decision_knows_everything_seen() {
        let mut replica = Replica::new("a", Hlc::default());
        let from_b = Decision {
            id: id(),
            verdict: accepted(),
            version: Version::new(5 << 16, "b"),
            context: Default::default(),
            relays: Default::default(),
        };
        let from_c = Decision {
            id: id(),
            verdict: Verdict::Deleted,
            version: Version::new(4 << 16, "c"),
            context: Default::default(),
            relays: Default::default(),
        };
        replica.commit(&from_b);
        replica.commit(&from_c);
        let delete = replica.observe(&id(), Reading::Undecided, 1000, ObserveMode::Live).unwrap();
        assert!(delete.context.knows(&from_b.version) && delete.context.knows(&from_c.version));
    }
}
