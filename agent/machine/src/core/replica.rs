//! One node's replicated state as a plain state machine: decisions held per
//! id, their digests and the clock. The driver feeds it folder readings and
//! peers' decisions and persists what it returns; nothing here does I/O.

use std::collections::HashMap;
use std::sync::Arc;

use super::decision::{Decision, Entry, Verdict};
use super::digest::{bucket_of, Digests};
use super::id::MinionId;
use super::merge::{merge, MergeOutcome};
use super::observe::Seen;
use super::version::{Hlc, SkewError, Version};

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
    pub fn observe(&mut self, id: &MinionId, seen: Seen, wall_ms: u64, mode: ObserveMode) -> Option<Decision> {
        let held = self.entries.get(id);
        let verdict = match seen {
            Seen::Unknown => return None,
            Seen::Decided(verdict) => verdict,
            // Pending or absent: a tombstone, unless nothing was ever decided.
            Seen::Undecided if held.is_none() => return None,
            Seen::Undecided => Verdict::Deleted,
        };
        if held.is_some_and(|entry| entry.same_verdict(&verdict)) {
            return None;
        }
        let version = match mode {
            ObserveMode::Live => Version::new(self.clock.tick(wall_ms), self.node.clone()),
            ObserveMode::FirstStart => Version::bootstrap(self.node.clone(), wall_ms),
        };
        Some(Decision { id: id.clone(), verdict, version, supersedes: held.map(|entry| entry.version.clone()) })
    }

    /// Checks a peer's decision against the skew bound and the decision held.
    /// The decision is not held until [`Replica::commit`].
    pub fn merge(&mut self, incoming: &Decision, wall_ms: u64, max_skew_ms: u64) -> Result<MergeOutcome, SkewError> {
        self.clock.observe(&incoming.version, wall_ms, max_skew_ms)?;
        Ok(merge(self.entries.get(&incoming.id), incoming))
    }

    /// Holds `decision` (its files are durable and it is in the store).
    /// Ignored if something newer is already held.
    pub fn commit(&mut self, decision: &Decision) {
        // A later local decision must outrank whatever is held.
        self.clock.witness(decision.version.hlc);
        let entry = decision.entry();
        match self.entries.get_mut(&decision.id) {
            Some(held) if held.version >= entry.version => {}
            Some(held) => {
                self.digests.replace(&decision.id, Some(&held.version), &entry.version);
                *held = entry;
            }
            None => {
                self.digests.replace(&decision.id, None, &entry.version);
                self.entries.insert(decision.id.clone(), entry);
            }
        }
    }

    /// Loads an entry from the store at start-up.
    pub fn load(&mut self, id: MinionId, entry: Entry) {
        self.clock.witness(entry.version.hlc);
        self.digests.replace(&id, None, &entry.version);
        self.entries.insert(id, entry);
    }

    /// The entries in the given buckets, for a peer's anti-entropy.
    pub fn summaries_in(&self, buckets: &[u32]) -> Vec<(MinionId, Version)> {
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
            .map(|(id, entry)| (id.clone(), entry.version.clone()))
            .collect();
        out.sort();
        out
    }

    /// Of a peer's summaries, the ids where the peer holds something newer.
    pub fn newer_on_peer<'a>(&self, summaries: impl IntoIterator<Item = &'a (MinionId, Version)>) -> Vec<MinionId> {
        summaries
            .into_iter()
            .filter(|(id, version)| self.entries.get(id).is_none_or(|entry| entry.version < *version))
            .map(|(id, _)| id.clone())
            .collect()
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
        let d = replica.observe(&id(), Seen::Decided(accepted()), 1000, ObserveMode::Live).unwrap();
        assert_eq!(d.version, Version::new(Hlc::default().tick(1000), "a"));
        assert_eq!(d.supersedes, None);
        replica.commit(&d);
        // The agent's own write of the same decision comes back as an event: no echo.
        assert_eq!(replica.observe(&id(), Seen::Decided(accepted()), 2000, ObserveMode::Live), None);
        assert_eq!(replica.observe(&id(), Seen::Unknown, 2000, ObserveMode::Live), None);
    }

    #[test]
    fn a_key_gone_from_every_folder_is_a_tombstone() {
        let mut replica = Replica::new("a", Hlc::default());
        assert_eq!(replica.observe(&id(), Seen::Undecided, 1000, ObserveMode::Live), None);
        let accept = replica.observe(&id(), Seen::Decided(accepted()), 1000, ObserveMode::Live).unwrap();
        replica.commit(&accept);
        let delete = replica.observe(&id(), Seen::Undecided, 1001, ObserveMode::Live).unwrap();
        assert_eq!(delete.verdict, Verdict::Deleted);
        assert_eq!(delete.supersedes, Some(accept.version));
    }

    #[test]
    fn a_decision_held_without_a_merge_still_moves_the_clock() {
        let now_ms = 1_700_000_000_000;
        let peer = Decision {
            id: id(),
            verdict: accepted(),
            version: Version::new(Hlc::default().tick(now_ms + 2_000), "b"),
            supersedes: None,
        };
        let mut replica = Replica::new("a", Hlc::resume(0));
        replica.load(id(), peer.entry());
        let delete = replica.observe(&id(), Seen::Undecided, now_ms, ObserveMode::Live).unwrap();
        assert!(delete.version > peer.version, "{} <= {}", delete.version, peer.version);
    }

    #[test]
    fn first_start_uses_the_bootstrap_version() {
        let mut replica = Replica::new("a", Hlc::default());
        let d = replica.observe(&id(), Seen::Decided(accepted()), 1000, ObserveMode::FirstStart).unwrap();
        assert!(d.version.is_bootstrap());
    }

    #[test]
    fn commit_keeps_the_newest_and_digests_follow() {
        let mut replica = Replica::new("a", Hlc::default());
        let newer = Decision { id: id(), verdict: Verdict::Deleted, version: Version::new(9, "b"), supersedes: None };
        let older = Decision { id: id(), verdict: accepted(), version: Version::new(5, "c"), supersedes: None };
        replica.commit(&newer);
        let digests = replica.digests().clone();
        replica.commit(&older);
        assert_eq!(replica.entry(&id()).unwrap().version, newer.version);
        assert_eq!(replica.digests(), &digests);
        let bucket = bucket_of(&id()) as u32;
        assert_eq!(replica.summaries_in(&[bucket]), vec![(id(), newer.version.clone())]);
        assert!(replica.newer_on_peer(&[(id(), Version::new(9, "b"))]).is_empty());
        assert_eq!(replica.newer_on_peer(&[(id(), Version::new(10, "a"))]), vec![id()]);
    }
}
