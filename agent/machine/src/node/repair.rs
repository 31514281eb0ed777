//! Anti-entropy, both sides of it: what this node answers a peer's Diff and
//! Fetch, and, on this node's own link to a peer, what to push and what to
//! fetch after comparing digests. The links only carry the messages.
//!
//! A link's round (run by the link machine, `crate::link`): send this
//! node's [`Node::digests`]; the peer answers its [`Node::diff`] (the
//! differing buckets and its summaries in them); [`Node::repair_begin`],
//! [`Node::repair_chunk`] and [`Node::repair_end`] compare the answer chunk
//! by chunk, say what to push (decisions newer here) and plan what to
//! fetch; [`Node::repair_next`] hands out the next chunk of ids to fetch
//! and [`Node::repair_fetched`] applies what came back. Every chunk is
//! first cut to the ids still newer on that peer and not being fetched by
//! another link right now, so a master's links share a repair (a join, or
//! the few hundred decisions missed during an outage) instead of each
//! fetching everything.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};

use crate::PeerName;

use crate::core::causal::Seen;
use crate::core::replica::Summary;
use crate::core::version::{Version, CLAIM_CEILING};
use crate::core::{Decision, Entry, Fingerprint, MinionId};

use super::event::Event;
use super::runtime::Runtime;
use super::{Node, Now};

/// What anti-entropy compares: per id, the version held and what it says.
pub type Summaries = Vec<(MinionId, Summary)>;

/// Most ids one Fetch may ask for: what a peer answers (agents of earlier
/// releases ask for this many).
pub const MAX_FETCH: usize = 5000;

/// Most ids one Fetch of this node asks for. A joining master holds two
/// chunks per link at once (one applied while the next is fetched), each
/// with its keys and, while applied, several copies of each decision's
/// bookkeeping: at 5,000 keys that was 15–20 MiB of its peak.
pub const FETCH_CHUNK: usize = 2000;

/// Most ids one comparison plans to fetch from a peer. The rest of a larger
/// difference waits for the link's next round, which the link runs soon
/// after (see [`Compared::full`]): a peer's Diff answer, however large,
/// costs this node a bounded plan (a hostile peer's 4,000,000 summaries
/// were 400 MiB of plans and rows).
pub const MAX_PLANNED: usize = 200_000;

/// Most rows (the held decision and claims) a peer's Diff answer may give
/// one id: a larger answer is refused.
pub const MAX_ROWS_PER_ID: usize = 64;

/// The fetches planned on each link, and the ids claimed by a link's fetch.
#[derive(Debug, Default)]
pub(super) struct Repairs {
    plans: HashMap<PeerName, Plan>,
    /// Per link, the comparison of a peer's Diff answer in progress.
    comparing: HashMap<PeerName, Comparing>,
    /// Id → the link fetching it now.
    in_flight: HashMap<MinionId, PeerName>,
    /// Keys the [`Tag`]s of this process's plans.
    tags: RandomState,
    /// Observe mode: per peer, what its latest Diff answer gave that this
    /// node does not hold itself (see [`Node::heard`]).
    heard: HashMap<PeerName, Heard>,
}

/// What one peer holds that an observer does not: per id, its rows (the
/// decision it holds and the claims it knows), as its latest Diff answer
/// gave them.
pub(super) type Heard = HashMap<MinionId, Vec<Seen>>;

#[derive(Debug, Default)]
struct Plan {
    /// Ids newer on the peer, with the peer's summary as a [`Tag`], not
    /// fetched yet.
    todo: VecDeque<(MinionId, Tag)>,
}

/// A peer's Diff answer being compared, a chunk at a time: nothing of it is
/// kept but the plan and, per id held here that the peer named, how this
/// node's rows fare against the peer's (bounded by what this node holds).
#[derive(Debug, Default)]
struct Comparing {
    buckets: Vec<u32>,
    /// Per id held here that the peer named: how this node's rows fare.
    mine: HashMap<MinionId, HeldHere>,
    todo: Vec<(MinionId, Tag)>,
    /// More ids are newer on the peer than [`MAX_PLANNED`].
    full: bool,
    /// Observe mode: the peer's rows this node does not hold (at most
    /// [`MAX_PLANNED`] ids).
    heard: Heard,
}

/// An id held here that a peer's Diff answer named.
#[derive(Debug)]
struct HeldHere {
    rows: Vec<MineRow>,
    /// A plain tombstone: in no digest, compared only where the peer names it.
    plain: bool,
    /// Rows the peer gave for it.
    n_theirs: usize,
}

/// One of this node's rows for an id (the held decision, or a claim).
#[derive(Debug)]
struct MineRow {
    mine: Summary,
    /// The peer holds this very row.
    known: bool,
    /// It beats every row the peer holds.
    beats: bool,
}

impl MineRow {
    /// Whether it is pushed: the peer does not hold it, and (for a decision,
    /// not a claim) holds no row it does not beat.
    fn is_newer(&self) -> bool {
        !self.known && (self.mine.version.is_claim() || self.beats)
    }
}

/// What comparing a peer's Diff answer found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Compared {
    /// Ids the peer holds newer (planned for [`Node::repair_next`]).
    pub n_newer_there: usize,
    /// Ids whose decisions are newer here (or unknown there), sorted: to push.
    pub newer_here: Vec<MinionId>,
    /// The plan is full: more differs than one round fetches; run the next
    /// round soon.
    pub full: bool,
}

/// A peer's Diff answer that no agent would send.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadAnswer {
    #[error("the Diff answer names bucket {0}, of {n} buckets", n = crate::core::digest::N_BUCKETS)]
    NoSuchBucket(u32),
    #[error("the Diff answer names bucket {0} twice")]
    BucketTwice(u32),
    #[error("the Diff answer gives {0:?} in bucket {1}, which it did not name")]
    OutsideBuckets(MinionId, usize),
    #[error("the Diff answer gives {0:?} more than {MAX_ROWS_PER_ID} rows")]
    TooManyRows(MinionId),
    #[error("the Diff answer names buckets after its first chunk")]
    BucketsLate,
    #[error("no comparison is in progress on this link")]
    NotComparing,
}

/// A peer's summary of one id as a plan keeps it: a keyed hash of its
/// version and content, and the version's clock, 16 bytes where the
/// summary takes 64. A joining master plans 100,000 ids on each link: two
/// plans of whole summaries were 15 MiB of its peak. When a chunk is cut,
/// the tag tells whether the peer's decision is still newer than what this
/// node holds (the other link may have fetched it, or something newer):
/// exactly, but for a held decision of the very same clock value from
/// another origin, which is fetched and merged like any push.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tag {
    hash: u64,
    hlc: u64,
}

impl Tag {
    /// The lowest bit of the hash says whether the peer named the content
    /// (protocol 1 peers send versions only, and are then matched on
    /// versions only).
    fn of(keys: &RandomState, version: &Version, content: Option<&(u8, Option<Fingerprint>)>) -> Tag {
        Tag { hash: keys.hash_one((version, content)) & !1 | u64::from(content.is_some()), hlc: version.hlc }
    }

    fn of_summary(keys: &RandomState, summary: &Summary) -> Tag {
        Tag::of(keys, &summary.version, summary.content.as_ref())
    }

    /// Whether `seen` is the decision this tag was made from.
    fn names(self, keys: &RandomState, seen: &Seen) -> bool {
        let content = (self.hash & 1 == 1).then(|| seen.content_rank());
        Tag::of(keys, &seen.version, content.as_ref()) == self
    }

    /// [`Replica::is_newer_on_peer`] for the summary this tag was made
    /// from: a claim or a decision not beaten by the one held, and known
    /// neither as held nor as seen.
    fn still_newer(self, keys: &RandomState, held: Option<&Entry>) -> bool {
        let Some(held) = held else { return true };
        let known = held.decisions().any(|seen| self.names(keys, &seen));
        !known && (self.hlc < CLAIM_CEILING || held.version.hlc <= self.hlc)
    }
}

/// Notes one row of a peer's Diff answer in `heard` unless this node holds
/// the very same row itself (a protocol 1 peer's rows, versions only, are
/// not kept).
fn hear(heard: &mut Heard, here: Option<&Entry>, id: MinionId, theirs: &Summary) -> Result<(), BadAnswer> {
    let Some((rank, fingerprint)) = theirs.content else { return Ok(()) };
    let kind = match rank {
        0 => crate::core::VerdictKind::Accepted,
        2 => crate::core::VerdictKind::Rejected,
        _ => crate::core::VerdictKind::Deleted,
    };
    let seen = Seen { version: theirs.version.clone(), kind, fingerprint, context: Default::default() };
    if here.is_some_and(|entry| entry.decisions().any(|s| s.same_as(&seen))) {
        return Ok(());
    }
    if heard.len() >= MAX_PLANNED && !heard.contains_key(&id) {
        return Ok(());
    }
    let rows = heard.entry(id.clone()).or_default();
    if rows.len() >= MAX_ROWS_PER_ID {
        return Err(BadAnswer::TooManyRows(id));
    }
    rows.push(seen);
    Ok(())
}

impl Node {
    /// Observe mode: what the peers hold for `id` that this node does not,
    /// as each peer's latest Diff answer gave it. An observer fetches
    /// nothing and pushes nothing: what it holds is only what its own
    /// folders held at its start (and what agents in normal mode pushed),
    /// so it never passes on a claim of another master, and a claim that
    /// master no longer holds is gone with that master's next answer.
    pub(super) fn heard<'a>(&'a self, id: &'a MinionId) -> impl Iterator<Item = &'a Seen> + 'a {
        self.repairs.heard.values().filter_map(move |heard| heard.get(id)).flatten()
    }

    /// Observe mode: every id some peer holds something for that this node does not.
    pub(super) fn heard_ids(&self) -> impl Iterator<Item = &MinionId> {
        self.repairs.heard.values().flat_map(HashMap::keys)
    }

    /// This node's bucket digests, for its own anti-entropy round; `None`
    /// when it runs none (stale: `stale.rs`).
    pub fn digests(&self) -> Option<Vec<u64>> {
        (!self.is_stale()).then(|| self.replica.digests().as_slice().to_vec())
    }

    /// A peer's Diff: the buckets whose digests differ from `theirs`, and
    /// this node's summaries of the entries in them. Plain tombstones (in
    /// memory or in the store) are among them only in buckets where the
    /// peer holds something: where it holds nothing they delete nothing (a
    /// joining master is sent none).
    pub fn diff(&self, theirs: &[u64], rt: &mut impl Runtime) -> (Vec<u32>, Summaries) {
        if self.is_stale() {
            // Offers nothing: to the peer this master holds what it holds.
            return (Vec::new(), Vec::new());
        }
        let buckets = self.replica.digests().differing(theirs);
        let tombstones: Vec<u32> =
            buckets.iter().copied().filter(|&b| theirs.get(b as usize).is_some_and(|&d| d != 0)).collect();
        let cold_buckets = self.replica.cold_buckets(&tombstones);
        let cold = if cold_buckets.is_empty() || self.replica.n_cold_in(&cold_buckets) > super::cold::MAX_COLD_IN_DIFF {
            Vec::new()
        } else {
            rt.cold_in(&cold_buckets).unwrap_or_else(|error| {
                // The peer's own round, or the next, finds them.
                rt.audit(Event::ColdFailed { error });
                Vec::new()
            })
        };
        let summaries = self.replica.summaries_in(&buckets, &tombstones, cold);
        (buckets, summaries)
    }

    /// A peer's Fetch: the full decisions known for `ids` (the one held and
    /// every claim).
    pub fn fetch(&self, ids: &[MinionId], rt: &mut impl Runtime) -> Vec<Decision> {
        if self.is_stale() {
            return Vec::new();
        }
        match rt.load(ids) {
            Ok(decisions) => decisions,
            Err(error) => {
                rt.audit(Event::LoadFailed { error });
                Vec::new()
            }
        }
    }

    /// On this node's link to `peer`, the first chunk of the peer's Diff
    /// answer named the differing `buckets`: a comparison begins (its
    /// chunks follow with [`Node::repair_chunk`], then [`Node::repair_end`]).
    pub fn repair_begin(&mut self, peer: &PeerName, buckets: &[u32]) -> Result<(), BadAnswer> {
        let mut named = vec![false; crate::core::digest::N_BUCKETS];
        for &bucket in buckets {
            let slot = named.get_mut(bucket as usize).ok_or(BadAnswer::NoSuchBucket(bucket))?;
            if std::mem::replace(slot, true) {
                return Err(BadAnswer::BucketTwice(bucket));
            }
        }
        self.repairs.comparing.insert(peer.clone(), Comparing { buckets: buckets.to_vec(), ..Comparing::default() });
        Ok(())
    }

    /// One chunk of the peer's Diff answer, compared as it comes: what this
    /// node lacks is planned (up to [`MAX_PLANNED`]), and how this node's rows
    /// fare against the peer's noted for the ids held here. An answer giving
    /// ids outside the buckets it named is refused (the comparison dropped).
    pub fn repair_chunk(&mut self, peer: &PeerName, chunk: Summaries, rt: &mut impl Runtime) -> Result<(), BadAnswer> {
        let Some(mut comparing) = self.repairs.comparing.remove(peer) else { return Err(BadAnswer::NotComparing) };
        // The plain tombstones the peer holds something else for are read
        // back from the store: they may beat it, or it may be newer. (Where
        // the peer holds a delete too, both show nothing.) If the store
        // cannot be read, the chunk is compared without them: their ids are
        // fetched or pushed again at worst, never lost.
        let named = chunk.iter().filter(|(_, theirs)| !theirs.is_delete());
        let _ = self.warm(named.map(|(id, _)| id), rt);
        let outcome = self.compare_chunk(&mut comparing, chunk);
        self.cool();
        if outcome.is_ok() {
            self.repairs.comparing.insert(peer.clone(), comparing);
        }
        outcome
    }

    fn compare_chunk(&self, comparing: &mut Comparing, chunk: Summaries) -> Result<(), BadAnswer> {
        let keys = &self.repairs.tags;
        for (id, theirs) in chunk {
            let bucket = crate::core::digest::bucket_of(&id);
            if !comparing.buckets.contains(&(bucket as u32)) {
                return Err(BadAnswer::OutsideBuckets(id, bucket));
            }
            if let Some(entry) = self.replica.entry(&id) {
                let held = comparing.mine.entry(id.clone()).or_insert_with(|| {
                    let plain = entry.is_plain_tombstone();
                    let mine: Vec<Summary> = if plain {
                        vec![Summary::of(&entry.held())]
                    } else {
                        crate::core::replica::Replica::summaries_of(entry).collect()
                    };
                    let rows = mine.into_iter().map(|mine| MineRow { mine, known: false, beats: true }).collect();
                    HeldHere { rows, plain, n_theirs: 0 }
                });
                held.n_theirs += 1;
                if held.n_theirs > MAX_ROWS_PER_ID {
                    return Err(BadAnswer::TooManyRows(id));
                }
                for row in &mut held.rows {
                    row.known |= theirs.version == row.mine.version && theirs.content == row.mine.content;
                    row.beats &= row.mine.beats(&theirs);
                }
            }
            if self.settings.observe {
                hear(&mut comparing.heard, self.replica.entry(&id), id, &theirs)?;
                continue;
            }
            if self.replica.is_newer_on_peer(&id, &theirs) {
                // One fetch per id brings all it has (summaries come sorted by id).
                if comparing.todo.last().is_some_and(|(last, _)| *last == id) {
                    continue;
                }
                if comparing.todo.len() < MAX_PLANNED {
                    comparing.todo.push((id, Tag::of_summary(keys, &theirs)));
                } else {
                    comparing.full = true;
                }
            }
        }
        Ok(())
    }

    /// The peer's Diff answer was read whole: what to push, and the plan of
    /// what to fetch.
    pub fn repair_end(&mut self, peer: &PeerName) -> Result<Compared, BadAnswer> {
        let comparing = self.repairs.comparing.remove(peer).ok_or(BadAnswer::NotComparing)?;
        if self.settings.observe {
            // What the peer holds now replaces what it held before: a claim
            // its master no longer holds (deleted with salt-key, its agent
            // restarted) is gone from this node's plan, and never passed on.
            self.repairs.heard.insert(peer.clone(), comparing.heard);
            return Ok(Compared::default());
        }
        let Comparing { buckets, mine, todo, full, heard: _ } = comparing;
        // Per row held here: pushed unless the peer holds it, or (for a
        // decision, not a claim) holds a row it does not beat.
        let mut newer_here: Vec<MinionId> = self
            .replica
            .summarise_in(&buckets)
            .filter(|(id, row)| match mine.get(*id) {
                None => true,
                Some(held) => held.rows.iter().find(|r| r.mine == *row).is_none_or(MineRow::is_newer),
            })
            .map(|(id, _)| id.clone())
            .collect();
        // A plain tombstone is pushed where it deletes something (it is in no
        // digest, and a peer holding nothing for its id shows the same).
        newer_here.extend(mine.iter().filter_map(|(id, held)| {
            let row = held.rows.first()?;
            (held.plain && !row.known && row.beats).then(|| id.clone())
        }));
        newer_here.sort_unstable();
        newer_here.dedup();
        drop(mine);
        let todo = VecDeque::from(todo);
        let n_newer_there = todo.len();
        // The ids new here are held once fetched: room for them now.
        self.replica.reserve(todo.iter().filter(|(id, _)| !self.replica.holds(id.as_str())).count());
        self.repairs.plans.insert(peer.clone(), Plan { todo });
        Ok(Compared { n_newer_there, newer_here, full })
    }

    /// The peer's Diff answer could not be read whole (or was refused): the
    /// comparison is dropped; the next round compares again.
    pub fn repair_abort(&mut self, peer: &PeerName) {
        self.repairs.comparing.remove(peer);
    }

    /// The peer's Diff answer named no bucket: it holds what this node
    /// holds (in observe mode, nothing more is heard of it).
    pub fn repair_agreed(&mut self, peer: &PeerName) {
        self.repairs.heard.remove(peer);
    }

    /// The next ids to fetch from `peer` (at most [`FETCH_CHUNK`]); `None`
    /// when the plan is done. The ids are claimed for this link until
    /// [`Node::repair_fetched`] (or the link goes down).
    pub fn repair_next(&mut self, peer: &PeerName) -> Option<Vec<MinionId>> {
        let plan = self.repairs.plans.get_mut(peer)?;
        let link = peer.clone();
        while !plan.todo.is_empty() {
            let n = plan.todo.len().min(FETCH_CHUNK);
            let chunk: Vec<(MinionId, Tag)> = plan.todo.drain(..n).collect();
            if plan.todo.len() < plan.todo.capacity() / 2 {
                // A joining master's plans shrink as its map of held ids grows.
                plan.todo.shrink_to_fit();
            }
            let (in_flight, keys) = (&mut self.repairs.in_flight, &self.repairs.tags);
            let ids: Vec<MinionId> = chunk
                .into_iter()
                .filter(|(id, theirs)| theirs.still_newer(keys, self.replica.entry(id)))
                .filter_map(|(id, _)| match in_flight.entry(id.clone()) {
                    std::collections::hash_map::Entry::Occupied(_) => None,
                    std::collections::hash_map::Entry::Vacant(slot) => {
                        slot.insert(link.clone());
                        Some(id)
                    }
                })
                .collect();
            if !ids.is_empty() {
                return Some(ids);
            }
        }
        self.repairs.plans.remove(peer);
        None
    }

    /// Applies what a fetch of `ids` from `peer` brought, and releases the
    /// ids' claims; returns how many were applied.
    ///
    /// What a round brings is not forwarded: the other peers hold it, or
    /// their own rounds find it. (Forwarded, a joining master would push
    /// its whole catch-up from one peer to every other, which holds it.)
    /// Each decision counts as having reached the whole site.
    pub fn repair_fetched(
        &mut self,
        peer: &PeerName,
        ids: &[MinionId],
        mut decisions: Vec<Decision>,
        now: Now,
        rt: &mut impl Runtime,
    ) -> u32 {
        let site = &self.settings.masters;
        let everyone = crate::core::Relays::new(site.iter().chain(Some(&self.settings.node)).cloned());
        for decision in &mut decisions {
            decision.reached = everyone.clone();
        }
        let n_applied = self.on_batches(vec![(peer.clone(), decisions)], now, rt).first().copied().unwrap_or(0);
        self.release(peer, ids);
        n_applied
    }

    /// A fetch from `peer` failed: its ids are released for other links (a
    /// later round repairs what is still missing).
    pub fn release(&mut self, peer: &PeerName, ids: &[MinionId]) {
        for id in ids {
            if self.repairs.in_flight.get(id).is_some_and(|link| link == peer) {
                self.repairs.in_flight.remove(id);
            }
        }
        if self.repairs.in_flight.is_empty() && self.repairs.in_flight.capacity() > 1024 {
            self.repairs.in_flight.shrink_to_fit();
        }
    }

    /// The link to `peer` is down: its plan is dropped and its claims released.
    pub fn link_down(&mut self, peer: &PeerName) {
        self.repairs.plans.remove(peer);
        self.repairs.comparing.remove(peer);
        self.repairs.in_flight.retain(|_, link| link != peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::decision::VerdictKind;

    fn seen(hlc: u64, node: &str, kind: VerdictKind, key: u8) -> Seen {
        let fingerprint = (kind != VerdictKind::Deleted).then_some(Fingerprint([key; 32]));
        Seen { version: Version::new(hlc, node), kind, fingerprint, context: Default::default() }
    }

    #[test]
    fn a_tag_names_the_decision_its_summary_was_made_from_and_no_other() {
        let keys = RandomState::new();
        let accepted = seen(7, "a", VerdictKind::Accepted, 1);
        let tag = Tag::of_summary(&keys, &Summary::of(&accepted));
        assert!(tag.names(&keys, &accepted));
        assert!(!tag.names(&keys, &seen(8, "a", VerdictKind::Accepted, 1)), "another version");
        assert!(!tag.names(&keys, &seen(7, "b", VerdictKind::Accepted, 1)), "another origin");
        assert!(!tag.names(&keys, &seen(7, "a", VerdictKind::Accepted, 2)), "another key");
        assert!(!tag.names(&keys, &seen(7, "a", VerdictKind::Rejected, 1)), "another kind");
        // A protocol 1 peer names versions only: matched on the version.
        let bare = Tag::of_summary(&keys, &Summary { version: accepted.version.clone(), content: None });
        assert!(bare.names(&keys, &accepted) && bare.names(&keys, &seen(7, "a", VerdictKind::Deleted, 0)));
        assert!(!bare.names(&keys, &seen(9, "a", VerdictKind::Accepted, 1)));
    }

    /// Observe mode keeps of a peer's answer only the rows this node does not
    /// hold itself, each as the peer named it, and no more per id than a
    /// comparison allows.
    #[test]
    fn an_observer_hears_only_what_it_does_not_hold() {
        let id = MinionId::parse("mail01").unwrap();
        let claim = |kind, key| {
            let rejected = kind == VerdictKind::Rejected;
            Seen { version: Version::claim(rejected, &[key; 32]), ..seen(0, "", kind, key) }
        };
        let (mine, theirs) = (claim(VerdictKind::Accepted, 1), claim(VerdictKind::Accepted, 2));
        let here = Entry::new(mine.kind, mine.fingerprint, mine.version.clone(), Default::default());
        let mut heard = Heard::new();
        hear(&mut heard, Some(&here), id.clone(), &Summary::of(&mine)).unwrap();
        assert!(heard.is_empty(), "the very row held here");
        hear(&mut heard, Some(&here), id.clone(), &Summary::of(&theirs)).unwrap();
        assert_eq!(heard[&id], vec![theirs.clone()]);
        let bare = Summary { version: theirs.version.clone(), content: None };
        hear(&mut heard, None, MinionId::parse("web01").unwrap(), &bare).unwrap();
        assert_eq!(heard.len(), 1, "a protocol 1 row names no content: not kept");
        for key in 3..(MAX_ROWS_PER_ID as u8 + 4) {
            let row = Summary::of(&claim(VerdictKind::Rejected, key));
            if let Err(e) = hear(&mut heard, None, id.clone(), &row) {
                assert_eq!(e, BadAnswer::TooManyRows(id.clone()));
                return;
            }
        }
        panic!("more than {MAX_ROWS_PER_ID} rows for one id were kept");
    }

    /// What the tag says when a chunk is cut is what the whole summary said.
    #[test]
    fn a_tag_is_still_newer_exactly_when_its_summary_is() {
        let keys = RandomState::new();
        let live = |ms: u64, node: &str, key: u8| seen(CLAIM_CEILING + (ms << 16), node, VerdictKind::Accepted, key);
        let entry = |held: &Seen, seen: Vec<Seen>| {
            Entry::new(held.kind, held.fingerprint, held.version.clone(), held.context.clone()).with_seen(seen)
        };
        let claim = seen(5, crate::core::version::CLAIM_ACCEPT, VerdictKind::Accepted, 3);
        let mut replica = crate::core::replica::Replica::new("c", Default::default());
        let id = MinionId::parse("web01").unwrap();
        for (theirs, held) in [
            (live(10, "a", 1), None),
            (live(10, "a", 1), Some(entry(&live(10, "a", 1), vec![]))),
            (live(10, "a", 1), Some(entry(&live(20, "b", 2), vec![live(10, "a", 1)]))),
            (live(10, "a", 1), Some(entry(&live(20, "b", 2), vec![]))),
            (live(20, "b", 2), Some(entry(&live(10, "a", 1), vec![]))),
            (claim.clone(), Some(entry(&live(20, "b", 2), vec![]))),
            (claim.clone(), Some(entry(&live(20, "b", 2), vec![claim.clone()]))),
        ] {
            if let Some(held) = &held {
                replica.load(id.clone(), held.clone());
            }
            let summary = Summary::of(&theirs);
            let tag = Tag::of_summary(&keys, &summary);
            assert_eq!(
                tag.still_newer(&keys, held.as_ref()),
                held.is_none() || replica.is_newer_on_peer(&id, &summary),
                "{theirs:?} against {held:?}"
            );
        }
    }
}
