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

mod fetching;
mod first;

pub use fetching::{Fetch, FIRST_WHOLE};
pub use first::{DiffAnswer, FIRST_BUCKET_MOST};

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

/// Most decisions a peer's Diff answer may say one bucket it sends whole
/// holds (a site of 1,000,000 keys has about 1,000 per bucket).
pub const MAX_WHOLE_PER_BUCKET: u32 = 1 << 16;

/// A bucket a peer's Diff answer sends whole, and how many decisions it
/// holds there (the one held for each id, and every claim).
pub type Whole = (u32, u32);

/// What this node's Diff asks a peer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Asking {
    /// This node's bucket digests.
    pub digests: Vec<u64>,
    /// Buckets it holds nothing in, not even a plain tombstone (whose digest
    /// is zero too): the peer sends what it holds there whole, without
    /// summaries (see [`Node::diff_whole`]). None in observe mode, which
    /// fetches nothing.
    pub empty: Vec<u32>,
}

/// The fetches planned on each link, and the ids claimed by a link's fetch.
#[derive(Debug, Default)]
pub(super) struct Repairs {
    plans: HashMap<PeerName, Plan>,
    /// Per link, the comparison of a peer's Diff answer in progress.
    comparing: HashMap<PeerName, Comparing>,
    /// Id → the link fetching it now.
    in_flight: HashMap<MinionId, PeerName>,
    /// Bucket fetched whole → the link fetching it now.
    buckets_in_flight: HashMap<u32, PeerName>,
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
    /// Buckets the peer sends whole, not fetched yet.
    whole: VecDeque<Whole>,
    /// Of those, buckets another link was fetching when this one came to
    /// them: fetched here at the end if that link gave them back.
    deferred: Vec<Whole>,
    /// Decisions the next fetch of whole buckets asks for at most.
    whole_chunk: usize,
}

/// A peer's Diff answer being compared, a chunk at a time: nothing of it is
/// kept but the plan and, per id held here that the peer named, how this
/// node's rows fare against the peer's (bounded by what this node holds).
#[derive(Debug, Default)]
struct Comparing {
    buckets: Vec<u32>,
    /// Buckets the peer sends whole (this node held nothing in them).
    whole: Vec<Whole>,
    /// Per bucket: the peer's answer gave a row in it.
    given: Vec<bool>,
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
    /// Ids the peer holds newer, and the decisions in the buckets it sends
    /// whole (planned for [`Node::repair_next`]).
    pub n_newer_there: usize,
    /// Ids whose decisions are newer here (or unknown there), sorted: to push.
    pub newer_here: Vec<MinionId>,
    /// Ids newer here in buckets where the peer holds nothing, sorted: to
    /// push unless the peer fetches such buckets whole from this node.
    pub newer_where_empty: Vec<MinionId>,
    /// The plan is full: more differs than one round fetches; run the next
    /// round soon.
    pub full: bool,
    /// Buckets the peer sends whole (planned for [`Node::repair_next`]).
    pub whole: usize,
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
    #[error("the Diff answer says bucket {0} holds {1} decisions, more than {MAX_WHOLE_PER_BUCKET}")]
    WholeTooLarge(u32, u32),
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

    /// What this node's own anti-entropy round asks: its digests and the
    /// buckets it holds nothing in; `None` when it runs none (stale).
    pub fn asking(&self) -> Option<Asking> {
        let digests = self.digests()?;
        let empty = if self.settings.observe { Vec::new() } else { self.replica.empty_buckets() };
        Some(Asking { digests, empty })
    }

    /// A joining master: it holds nothing at all (no decision, no delete,
    /// in memory or in the store), and its rounds fetch what its peers hold,
    /// whole (it is neither stale nor observing). Its Hello answer says so:
    /// its peers leave their rounds to its fetches.
    pub fn joining(&self) -> bool {
        !self.is_stale() && !self.settings.observe && self.holds_nothing()
    }

    /// Whether this node's rounds have something to offer a peer: it holds
    /// something, and is not stale.
    pub fn offers_something(&self) -> bool {
        !self.is_stale() && !self.holds_nothing()
    }

    fn holds_nothing(&self) -> bool {
        self.replica.is_empty() && self.replica.n_cold() == 0
    }

    /// A peer's Diff: the buckets whose digests differ from `theirs`, and
    /// this node's summaries of the entries in them. Plain tombstones (in
    /// memory or in the store) are among them only in buckets where the
    /// peer holds something: where it holds nothing they delete nothing (a
    /// joining master is sent none).
    pub fn diff(&self, theirs: &[u64], rt: &mut impl Runtime) -> (Vec<u32>, Summaries) {
        let (buckets, summaries, _) = self.answer_diff(theirs, &[], rt);
        (buckets, summaries)
    }

    /// A peer's Diff that names the buckets it holds nothing in
    /// ([`Asking::empty`]): [`Node::diff`], but the differing buckets among
    /// them are named apart with how many decisions this node holds in each,
    /// and not summarised: the peer fetches them whole
    /// ([`Node::fetch_whole`]). A joining master so downloads no summaries
    /// (75 bytes per id from every peer) before its first fetch.
    pub fn diff_whole(
        &self,
        theirs: &[u64],
        empty: &[u32],
        rt: &mut impl Runtime,
    ) -> (Vec<u32>, Summaries, Vec<Whole>) {
        self.answer_diff(theirs, empty, rt)
    }

    fn answer_diff(&self, theirs: &[u64], empty: &[u32], rt: &mut impl Runtime) -> (Vec<u32>, Summaries, Vec<Whole>) {
        if self.is_stale() {
            // Offers nothing: to the peer this master holds what it holds.
            return (Vec::new(), Vec::new(), Vec::new());
        }
        let mut buckets = self.replica.digests().differing(theirs);
        let mut wholes = Vec::new();
        if !empty.is_empty() && theirs.len() == crate::core::digest::N_BUCKETS {
            let mut is_empty = vec![false; crate::core::digest::N_BUCKETS];
            for &b in empty {
                if let Some(slot) = is_empty.get_mut(b as usize) {
                    *slot = true;
                }
            }
            let (empty, rest): (Vec<u32>, Vec<u32>) =
                buckets.into_iter().partition(|&b| is_empty[b as usize] && theirs[b as usize] == 0);
            buckets = rest;
            let mut counts = vec![0u32; crate::core::digest::N_BUCKETS];
            for (bucket, _, entry) in self.replica.live_by_bucket(&empty) {
                let rows = 1 + entry.seen().iter().filter(|s| s.version.is_claim()).count();
                let count = &mut counts[bucket];
                *count = count.saturating_add(rows as u32);
            }
            wholes = empty.into_iter().map(|b| (b, counts[b as usize])).filter(|&(_, n)| n > 0).collect();
        }
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
        (buckets, summaries, wholes)
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

    /// A peer's Fetch of whole buckets: the full decisions known for every
    /// id held in `buckets` but plain tombstones (the peer held nothing
    /// there: they delete nothing). `None` when several buckets hold more
    /// than [`MAX_FETCH`] ids together: the peer asks for fewer at once.
    pub fn fetch_whole(&self, buckets: &[u32], rt: &mut impl Runtime) -> Option<Vec<Decision>> {
        if self.is_stale() || buckets.is_empty() {
            return Some(Vec::new());
        }
        let ids: Vec<MinionId> = self.replica.live_in(buckets).map(|(id, _)| id.clone()).collect();
        if buckets.len() > 1 && ids.len() > MAX_FETCH {
            return None;
        }
        Some(self.fetch(&ids, rt))
    }

    /// On this node's link to `peer`, the first chunk of the peer's Diff
    /// answer named the differing `buckets`: a comparison begins (its
    /// chunks follow with [`Node::repair_chunk`], then [`Node::repair_end`]).
    ///
    /// `whole`: the buckets the peer sends whole, and how many decisions it
    /// holds in each (see [`Node::diff_whole`]); none from a peer asked for
    /// none, or of an earlier release.
    pub fn repair_begin(&mut self, peer: &PeerName, buckets: &[u32], whole: &[Whole]) -> Result<(), BadAnswer> {
        let named = buckets.iter().copied().chain(whole.iter().map(|&(b, _)| b));
        crate::core::digest::check_buckets(named).map_err(|bad| match bad {
            crate::core::digest::BadBuckets::NoSuchBucket(b) => BadAnswer::NoSuchBucket(b),
            crate::core::digest::BadBuckets::Twice(b) => BadAnswer::BucketTwice(b),
        })?;
        if let Some(&(bucket, n)) = whole.iter().find(|(_, n)| *n > MAX_WHOLE_PER_BUCKET) {
            return Err(BadAnswer::WholeTooLarge(bucket, n));
        }
        let comparing = Comparing {
            buckets: buckets.to_vec(),
            whole: whole.to_vec(),
            given: vec![false; crate::core::digest::N_BUCKETS],
            ..Comparing::default()
        };
        self.repairs.comparing.insert(peer.clone(), comparing);
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
            if let Some(given) = comparing.given.get_mut(bucket) {
                *given = true;
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
        let Comparing { buckets, whole, given, mine, todo, full, heard: _ } = comparing;
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
        // Where the peer's answer gave no row, it holds nothing.
        let (newer_where_empty, newer_here): (Vec<MinionId>, Vec<MinionId>) = newer_here
            .into_iter()
            .partition(|id| !given.get(crate::core::digest::bucket_of(id)).copied().unwrap_or(true));
        let todo = VecDeque::from(todo);
        let n_newer_there = todo.len();
        // The ids new here are held once fetched: room for them now, as
        // far as a plan of ids goes (a peer's counts of its whole buckets
        // are its word: 1,024 of 65,536 would make room for 67,000,000).
        let n_whole: usize = whole.iter().map(|&(_, n)| n as usize).sum();
        let n_new = todo.iter().filter(|(id, _)| !self.replica.holds(id.as_str())).count();
        self.replica.reserve((n_whole + n_new).min(MAX_PLANNED));
        let n_buckets_whole = whole.len();
        // A small first fetch only while this node holds nothing at all: its
        // first keys come sooner. A bucket a Diff answer brought is a first key.
        let whole_chunk = if self.holds_nothing() { FIRST_WHOLE } else { self.settings.ids_per_fetch() };
        let plan = Plan { todo, whole: VecDeque::from(whole), deferred: Vec::new(), whole_chunk };
        self.repairs.plans.insert(peer.clone(), plan);
        Ok(Compared {
            n_newer_there: n_newer_there + n_whole,
            newer_here,
            newer_where_empty,
            full,
            whole: n_buckets_whole,
        })
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
}

#[cfg(test)]
mod tests;
