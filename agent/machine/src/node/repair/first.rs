//! A whole bucket sent with a Diff answer: a joining master's first keys
//! come with its peers' Diff answers, a round trip before its first fetch
//! would bring them (across a WAN its first key came 4.3 round trips after
//! its first packet, with the first fetch leaving at 3.1).
//!
//! Each peer picks the bucket by its own name among the small ones, so the
//! peers of a joiner send different buckets; the asker applies them as it
//! applies a fetch of that bucket, and its plan then drops the bucket (it
//! holds something there). Two peers picking the same bucket cost the
//! asker one small bucket twice.

use super::*;

/// Most decisions the bucket sent with a Diff answer may hold: it must not
/// slow the answer down (a bucket of a 1,000,000-key site holds about
/// 1,000, some 450 KB).
pub const FIRST_BUCKET_MOST: u32 = 64;

/// This node's answer to a peer's Diff naming the buckets it holds nothing
/// in: [`Node::diff_whole`]'s, and the bucket [`Node::first_bucket`] sends
/// with it.
#[derive(Debug, Default)]
pub struct DiffAnswer {
    pub buckets: Vec<u32>,
    pub summaries: Summaries,
    pub whole: Vec<Whole>,
    /// A bucket of `whole` sent with the answer, and its decisions.
    pub first: Option<(Whole, Vec<Decision>)>,
}

impl Node {
    /// A peer's Diff naming its `empty` buckets, answered whole: what both
    /// drivers send (see [`DiffAnswer`]).
    pub fn diff_answer(&self, theirs: &[u64], empty: &[u32], rt: &mut impl Runtime) -> DiffAnswer {
        let (buckets, summaries, whole) = self.diff_whole(theirs, empty, rt);
        let first = self.first_bucket(&whole, rt);
        DiffAnswer { buckets, summaries, whole, first }
    }

    /// The whole bucket this node sends with its Diff answer, among the
    /// `whole` ones it answers, and every decision it holds there (what
    /// [`Node::fetch_whole`] of it brings): one holding at most
    /// [`FIRST_BUCKET_MOST`] decisions, picked by this node's name. `None`
    /// when there is none that small.
    pub fn first_bucket(&self, whole: &[Whole], rt: &mut impl Runtime) -> Option<(Whole, Vec<Decision>)> {
        let small: Vec<Whole> = whole.iter().copied().filter(|&(_, n)| n > 0 && n <= FIRST_BUCKET_MOST).collect();
        if small.is_empty() {
            return None;
        }
        // FNV-1a: the same pick in every process, a different one per name.
        let pick = self
            .settings
            .node
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
        let bucket = small[(pick % small.len() as u64) as usize];
        let decisions = self.fetch_whole(&[bucket.0], rt)?;
        // A store that could not be read brings nothing: the peer fetches it.
        (!decisions.is_empty()).then_some((bucket, decisions))
    }

    /// Applies the bucket `peer`'s Diff answer brought, as a fetch of it
    /// (`fetch` names it), and returns how many decisions were applied: only
    /// when the comparison begun with that answer names it whole, and this
    /// node holds nothing there (no decision, not even a delete) and is not
    /// observing. Anything else is dropped unapplied: an answer to a
    /// question this node did not ask.
    pub fn repair_brought(
        &mut self,
        peer: &PeerName,
        fetch: &Fetch,
        decisions: Vec<Decision>,
        now: Now,
        rt: &mut impl Runtime,
    ) -> u32 {
        let &[bucket] = fetch.buckets.as_slice() else { return 0 };
        let asked = self.repairs.comparing.get(peer).is_some_and(|c| c.whole.iter().any(|&(b, _)| b == bucket));
        if self.settings.observe || !asked || !fetch.ids.is_empty() || !self.replica.empty_buckets().contains(&bucket) {
            return 0;
        }
        self.repair_fetched(peer, fetch, decisions, now, rt)
    }
}
