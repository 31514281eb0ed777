//! One node's replicated state as a plain state machine: decisions held per
//! id, their digests and the clock. The driver feeds it folder readings and
//! peers' decisions and persists what it returns; nothing here does I/O.

use std::sync::Arc;

use super::causal::{remember, Context, Seen};
use super::claims;
use super::decision::{Decision, Entry, Verdict, VerdictKind};
use super::digest::{bucket_of, Digests, N_BUCKETS};
use super::id::MinionId;
use super::merge::{merge, Merged};
use super::observe::Reading;
use super::version::{Hlc, SkewError, Version};
use entries::Entries;

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

    /// A plain tombstone's summary.
    pub fn tombstone(version: Version) -> Summary {
        Summary { version, content: Some((DELETED_RANK, None)) }
    }

    /// Whether this summary names a delete (unknown from a peer of protocol 1).
    pub fn is_delete(&self) -> bool {
        self.content.is_some_and(|(rank, _)| rank == DELETED_RANK)
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

/// [`Seen::content_rank`]'s rank of a delete.
const DELETED_RANK: u8 = 1;

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
    entries: Entries,
    digests: Digests,
    clock: Hlc,
    /// Ids whose folders should show an accepted key here (kept as entries
    /// change: the guard asks for it on every delete of an accepted key).
    n_accepted: usize,
    /// Plain tombstones kept in the store only, per bucket: an id not held
    /// in `entries` may be one of them only where its bucket counts some.
    /// 500,000 deletes of made-up ids held in memory were 200 MiB.
    cold: Vec<u32>,
    n_cold: usize,
    /// Ids that became plain tombstones (or were brought back from the
    /// store) since the last [`Replica::cool`].
    cooling: Vec<MinionId>,
}

impl Replica {
    pub fn new(node: &str, clock: Hlc) -> Replica {
        Replica {
            node: node.into(),
            entries: Entries::default(),
            digests: Digests::default(),
            clock,
            n_accepted: 0,
            cold: vec![0; N_BUCKETS],
            n_cold: 0,
            cooling: Vec::new(),
        }
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn entry(&self, id: &MinionId) -> Option<&Entry> {
        self.entries.get(id)
    }

    /// The file a scan last read for `id` and decided nothing on, unless
    /// its entry changed since ([`super::observe::FileToken`]).
    pub fn file_token<Q>(&self, id: &Q) -> Option<super::observe::FileToken>
    where
        MinionId: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        self.entries.token(id)
    }

    /// Keeps (or forgets) the file a scan read for `id`, while its entry
    /// stays as it is (nothing when none is held).
    pub fn set_file_token<Q>(&mut self, id: &Q, token: Option<super::observe::FileToken>)
    where
        MinionId: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        self.entries.set_token(id, token);
    }

    /// Forgets every file a scan read ([`Replica::file_token`]).
    pub fn forget_file_tokens(&mut self) {
        self.entries.forget_tokens();
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

    /// How many plain tombstones are kept in the store only.
    pub fn n_cold(&self) -> usize {
        self.n_cold
    }

    /// Whether `id` may be a plain tombstone kept in the store only (it is
    /// not held here, and its bucket has some): look it up before deciding
    /// anything about it, and [`Replica::warm`] what is found.
    pub fn may_be_cold(&self, id: &MinionId) -> bool {
        self.n_cold > 0 && !self.entries.contains_key(id) && self.cold[bucket_of(id)] > 0
    }

    /// Buckets among `buckets` holding plain tombstones kept in the store only.
    pub fn cold_buckets(&self, buckets: &[u32]) -> Vec<u32> {
        buckets.iter().copied().filter(|&b| self.cold.get(b as usize).is_some_and(|&n| n > 0)).collect()
    }

    /// How many plain tombstones the store keeps in `buckets`.
    pub fn n_cold_in(&self, buckets: &[u32]) -> usize {
        buckets.iter().filter_map(|&b| self.cold.get(b as usize)).map(|&n| n as usize).sum()
    }

    /// The store's plain tombstones, counted per bucket at start-up.
    pub fn set_cold(&mut self, per_bucket: Vec<u32>) {
        self.n_cold = per_bucket.iter().map(|&n| n as usize).sum();
        self.cold = per_bucket;
        self.cold.resize(N_BUCKETS, 0);
    }

    /// Holds a plain tombstone read back from the store (it stays in the
    /// digests as it was: plain tombstones are not in them) until the next
    /// [`Replica::cool`].
    pub fn warm(&mut self, id: MinionId, entry: Entry) {
        if self.entries.contains_key(&id) {
            return;
        }
        let bucket = &mut self.cold[bucket_of(&id)];
        if *bucket > 0 {
            *bucket -= 1;
            self.n_cold -= 1;
        }
        self.load(id, entry);
    }

    /// Leaves in the store only the plain tombstones made or warmed since
    /// the last call (the store holds them: [`Replica::commit`] and
    /// [`Replica::set`] come after a store commit).
    pub fn cool(&mut self) {
        for id in std::mem::take(&mut self.cooling) {
            if self.entries.get(&id).is_some_and(Entry::is_plain_tombstone) {
                self.entries.remove(&id);
                self.cold[bucket_of(&id)] += 1;
                self.n_cold += 1;
            }
        }
    }

    /// Plain tombstones the store compacted (see `tombstone_ttl`).
    pub fn forget_cold(&mut self, ids: &[MinionId]) {
        for id in ids {
            if self.entries.get(id).is_some_and(Entry::is_plain_tombstone) {
                self.entries.remove(id);
                continue;
            }
            let bucket = &mut self.cold[bucket_of(id)];
            if *bucket > 0 {
                *bucket -= 1;
                self.n_cold -= 1;
            }
        }
    }

    /// How many ids this master's folders should show as accepted.
    pub fn n_accepted(&self) -> usize {
        self.n_accepted
    }

    /// Makes room for `additional` more ids at once (see
    /// `Entries::reserve`): grown a step at a time, the hash table of
    /// positions holds its old and new table while it moves them (a
    /// `HashMap` of 100,000 ids held 9 MiB beside 18).
    pub fn reserve(&mut self, additional: usize) {
        self.entries.reserve(additional);
    }

    /// Ids the map has room for.
    pub fn capacity(&self) -> usize {
        self.entries.capacity()
    }

    /// Whether a decision is held for the id named `name`.
    pub fn holds(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    pub fn clock(&self) -> u64 {
        self.clock.last()
    }

    /// Moves the clock to at least `hlc` (where this node's store started
    /// afresh: every decision it issues from then on is later).
    pub fn witness(&mut self, hlc: u64) {
        self.clock.witness(hlc);
    }

    pub fn digests(&self) -> &Digests {
        &self.digests
    }

    /// What this master's folders should say for `id` now (see `claims.rs`).
    pub fn effective(&self, id: &MinionId) -> Option<Seen> {
        self.entries.get(id).and_then(claims::effective)
    }

    /// Turns a settled folder reading into a new local decision, if it says
    /// something other than what the folders should say. The decision is
    /// not held until [`Replica::commit`] (or [`Replica::set`]).
    /// On a first start the reading is a claim, naming its content.
    pub fn observe(&mut self, id: &MinionId, reading: Reading, wall_ms: u64, mode: ObserveMode) -> Option<Decision> {
        let verdict = self.differs(id, &reading)?;
        let held = self.entries.get(id);
        let (version, context) = match (mode, verdict.fingerprint()) {
            (ObserveMode::FirstStart, Some(fingerprint)) => {
                (Version::claim(verdict.kind() == VerdictKind::Rejected, &fingerprint.0), Context::default())
            }
            // A first start finds no delete: a key in no folder is no claim.
            (ObserveMode::FirstStart, None) => return None,
            // It knowingly replaces everything this node has seen of the id.
            (ObserveMode::Live, _) => {
                (Version::new(self.clock.tick(wall_ms), self.node.clone()), held.map(Entry::known).unwrap_or_default())
            }
        };
        Some(Decision {
            id: id.clone(),
            verdict,
            version,
            context,
            relays: Default::default(),
            reached: Default::default(),
        })
    }

    /// Whether a folder reading says something other than what the folders
    /// should say ([`Replica::observe`] would decide), changing nothing.
    pub fn would_observe(&self, id: &MinionId, reading: &Reading) -> bool {
        self.differs(id, reading).is_some()
    }

    /// The verdict `reading` amounts to, if it is not what the folders
    /// should say for `id`.
    fn differs(&self, id: &MinionId, reading: &Reading) -> Option<Verdict> {
        let shown = self.entries.get(id).and_then(claims::effective);
        let verdict = match reading {
            Reading::Unknown => return None,
            Reading::Decided(verdict) => verdict,
            // Pending or absent: a tombstone, unless nothing is decided here.
            Reading::Undecided if shown.as_ref().is_none_or(|s| s.kind == VerdictKind::Deleted) => return None,
            Reading::Undecided => &Verdict::Deleted,
        };
        let same = shown.as_ref().is_some_and(|s| s.kind == verdict.kind() && s.fingerprint == verdict.fingerprint());
        (!same).then(|| verdict.clone())
    }

    /// A fresh version from this node, above every version seen (for an
    /// operator's decision not read from the folders).
    pub fn next_version(&mut self, wall_ms: u64) -> Version {
        Version::new(self.clock.tick(wall_ms), self.node.clone())
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
        let after = committed(self.entries.get(&decision.id), decision);
        self.replace(&decision.id, after);
    }

    /// What the entry for `decision`'s id would be once it is committed.
    pub fn after(&self, decision: &Decision) -> Entry {
        committed(self.entries.get(&decision.id), decision)
    }

    /// Makes `after` (from [`Replica::after`]) the entry for `id`.
    pub fn set(&mut self, id: &MinionId, after: Entry) {
        self.clock.witness(after.version.hlc);
        self.replace(id, after);
    }

    fn replace(&mut self, id: &MinionId, after: Entry) {
        if let Some(before) = self.entries.get(id) {
            for part in digested(before) {
                self.digests.toggle(id, &part);
            }
            self.n_accepted -= usize::from(shows_accepted(before));
        }
        for part in digested(&after) {
            self.digests.toggle(id, &part);
        }
        self.n_accepted += usize::from(shows_accepted(&after));
        if after.is_plain_tombstone() {
            self.cooling.push(id.clone());
        }
        self.entries.insert(id.clone(), after);
    }

    /// The other decisions seen for `decision`'s id once it is committed
    /// (what the store keeps with it).
    pub fn seen_after(&self, decision: &Decision) -> Vec<Seen> {
        committed(self.entries.get(&decision.id), decision).seen().to_vec()
    }

    /// Ids whose masters may show different things until an operator decides.
    pub fn unsettled(&self) -> impl Iterator<Item = (&MinionId, &Entry)> {
        self.entries.iter().filter(|(_, entry)| claims::unsettled(entry))
    }

    /// Loads an entry from the store at start-up.
    pub fn load(&mut self, id: MinionId, entry: Entry) {
        self.clock.witness(entry.version.hlc);
        for part in digested(&entry) {
            self.digests.toggle(&id, &part);
        }
        self.n_accepted += usize::from(shows_accepted(&entry));
        if entry.is_plain_tombstone() {
            self.cooling.push(id.clone());
        }
        self.entries.insert(id, entry);
    }

    /// The entries in the given buckets, for a peer's anti-entropy: per id
    /// the decision held and every claim known; plain tombstones held in
    /// memory only in `tombstones` (a subset of `buckets`), and `cold` (those
    /// the store keeps, read by the caller) added.
    pub fn summaries_in(
        &self,
        buckets: &[u32],
        tombstones: &[u32],
        cold: Vec<(MinionId, Version)>,
    ) -> Vec<(MinionId, Summary)> {
        let plain = self.in_buckets(tombstones).filter(|(_, entry)| entry.is_plain_tombstone());
        // Counted first: a joining master asks for all 100,000, and a list
        // grown by doubling would have room for 131,072.
        let parts = |entry: &Entry| match entry.is_plain_tombstone() {
            true => 0,
            false => 1 + entry.seen().iter().filter(|s| s.version.is_claim()).count(),
        };
        let n =
            self.in_buckets(buckets).map(|(_, entry)| parts(entry)).sum::<usize>() + plain.clone().count() + cold.len();
        let mut out = Vec::with_capacity(n);
        out.extend(self.summarise_in(buckets).map(|(id, summary)| (id.clone(), summary)));
        out.extend(plain.map(|(id, entry)| (id.clone(), Summary::of(&entry.held()))));
        out.extend(cold.into_iter().map(|(id, version)| (id, Summary::tombstone(version))));
        // Unstable: equal rows are identical, and a stable sort takes a
        // scratch copy as large as the list (7.6 MiB at 100,000 rows).
        out.sort_unstable();
        out
    }

    /// [`Replica::summaries_in`] unsorted, made as they are read: comparing
    /// a peer's summaries with 100,000 of this node's needs no list of them.
    pub fn summarise_in(&self, buckets: &[u32]) -> impl Iterator<Item = (&MinionId, Summary)> {
        self.in_buckets(buckets)
            .flat_map(|(id, entry)| digested(entry).into_iter().map(move |part| (id, Summary::of(&part))))
    }

    /// The summaries of `entry` a Diff shows (none for a plain tombstone).
    pub fn summaries_of(entry: &Entry) -> impl Iterator<Item = Summary> {
        digested(entry).into_iter().map(|part| Summary::of(&part))
    }

    /// Buckets this node holds nothing in: no digested entry, no plain
    /// tombstone in memory or in the store.
    pub fn empty_buckets(&self) -> Vec<u32> {
        let mut empty: Vec<bool> =
            (0..N_BUCKETS).map(|b| self.digests.as_slice()[b] == 0 && self.cold[b] == 0).collect();
        if empty.iter().any(|&e| e) {
            // A plain tombstone held in memory is in no digest (every other
            // entry is).
            for (bucket, _, _) in self.entries.with_buckets().filter(|(_, _, entry)| entry.is_plain_tombstone()) {
                empty[bucket] = false;
            }
        }
        (0u32..).zip(empty).filter(|&(_, e)| e).map(|(b, _)| b).collect()
    }

    /// The entries in the given buckets but plain tombstones: what a peer
    /// holding nothing there lacks.
    pub fn live_in(&self, buckets: &[u32]) -> impl Iterator<Item = (&MinionId, &Entry)> {
        self.live_by_bucket(buckets).map(|(_, id, entry)| (id, entry))
    }

    /// [`Replica::live_in`], with each entry's bucket.
    pub fn live_by_bucket(&self, buckets: &[u32]) -> impl Iterator<Item = (usize, &MinionId, &Entry)> {
        self.by_bucket(buckets).filter(|(_, _, entry)| !entry.is_plain_tombstone())
    }

    /// The entries in the given buckets.
    fn in_buckets(&self, buckets: &[u32]) -> impl Iterator<Item = (&MinionId, &Entry)> + Clone {
        self.by_bucket(buckets).map(|(_, id, entry)| (id, entry))
    }

    /// The entries in the given buckets, with their buckets.
    fn by_bucket(&self, buckets: &[u32]) -> impl Iterator<Item = (usize, &MinionId, &Entry)> + Clone {
        let mut wanted = vec![false; self.digests.as_slice().len()];
        for &bucket in buckets {
            if let Some(slot) = wanted.get_mut(bucket as usize) {
                *slot = true;
            }
        }
        self.entries.with_buckets().filter(move |(bucket, _, _)| wanted[*bucket])
    }

    /// Whether a peer's summary names a decision this node lacks: a claim it
    /// does not know, or a decision that beats the one held. A delete of an
    /// id not held here is not: it has nothing to delete (see
    /// [`super::decision::is_plain_tombstone`]).
    pub fn is_newer_on_peer(&self, id: &MinionId, theirs: &Summary) -> bool {
        let Some(entry) = self.entries.get(id) else { return !theirs.is_delete() };
        let known = entry
            .decisions()
            .any(|s| s.version == theirs.version && theirs.content.is_none_or(|content| content == s.content_rank()));
        if known {
            return false;
        }
        theirs.version.is_claim() || theirs.beats(&Summary::of(&entry.held()))
    }
}

/// The entry `held` becomes once `decision` is committed: held if it beats
/// what is held (which is then remembered), remembered otherwise.
fn committed(held: Option<&Entry>, decision: &Decision) -> Entry {
    let incoming = decision.seen();
    let Some(held) = held else { return decision.entry() };
    if held.held().same_as(&incoming) {
        return held.clone();
    }
    let mut seen = held.seen().to_vec();
    if incoming.beats(&held.held()) {
        remember(&mut seen, held.held());
        decision.entry().with_seen(seen).with_mine(held.mine().cloned())
    } else {
        remember(&mut seen, incoming);
        held.clone().with_seen(seen)
    }
}

/// Whether `entry` makes this master's folders show an accepted key.
fn shows_accepted(entry: &Entry) -> bool {
    claims::effective(entry).is_some_and(|s| s.kind == VerdictKind::Accepted)
}

/// What of an entry the digests cover (the state masters must agree on):
/// the decision held and every claim known; not the other decisions a node
/// happens to have seen, nor a plain tombstone (a master holding one and a
/// master holding nothing for the id show the same).
fn digested(entry: &Entry) -> Vec<Seen> {
    if entry.is_plain_tombstone() {
        return Vec::new();
    }
    let held = entry.held();
    let mut parts: Vec<Seen> = entry.seen().iter().filter(|s| s.version.is_claim()).cloned().collect();
    parts.push(held);
    parts
}

mod chunked;
mod entries;
#[cfg(test)]
mod tests;
