//! The fetching side of a repair: what a link fetches next (whole buckets
//! first, then ids), claimed for it until applied or released, so a
//! master's links share a repair.

use super::*;

/// Decisions the first fetch of whole buckets on a link asks for at most
/// (unless one bucket holds more) while this node holds nothing at all: a
/// joining master holds its first keys after one small answer, which TCP's
/// first window carries, instead of after a chunk's worth of round trips.
/// The next ask for up to `fetch_chunk` ([`FETCH_CHUNK`] in the agent).
/// (Doubling from here cost a 100,000-key join on loopback six more
/// fetches per link, each applied and synced alone.) A joiner whose peers' Diff answers brought a bucket each
/// (`first.rs`) holds something by then, and skips it.
pub const FIRST_WHOLE: usize = 16;

/// What one fetch asks a peer for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fetch {
    /// These ids (every decision known for each).
    pub ids: Vec<MinionId>,
    /// Every decision in these buckets, where this node held nothing when
    /// it asked (see [`Node::diff_whole`]).
    pub buckets: Vec<u32>,
    /// How many decisions the peer said those buckets hold.
    pub n_in_buckets: usize,
}

impl Fetch {
    /// Whether a decision for `id` answers this fetch (the agent's driver
    /// checks each decision of an answer with sets of the same).
    #[cfg(test)]
    pub(crate) fn asked(&self, id: &MinionId) -> bool {
        self.ids.contains(id)
            || (!self.buckets.is_empty() && self.buckets.contains(&(crate::core::digest::bucket_of(id) as u32)))
    }

    /// Most decisions a peer may answer it with: every row an id can have,
    /// and twice what the peer said its buckets hold (decisions made since
    /// its Diff answer) and a little more.
    pub fn most_rows(&self) -> usize {
        let whole = if self.buckets.is_empty() { 0 } else { 2 * self.n_in_buckets + MAX_ROWS_PER_ID };
        self.ids.len().saturating_mul(MAX_ROWS_PER_ID).saturating_add(whole)
    }
}

impl Node {
    /// What to fetch next from `peer`: whole buckets first (at most the
    /// link's part of what its plan has left and `fetch_chunk` decisions,
    /// [`FIRST_WHOLE`] at first while this node holds nothing at all, unless
    /// one bucket holds more), then at most `fetch_chunk` ids (see
    /// [`Settings::fetch_chunk`](super::super::Settings::fetch_chunk));
    /// `None` when the plan is done. What it names is claimed for this link until
    /// [`Node::repair_fetched`] (or the link goes down).
    ///
    /// A whole bucket this node holds something in by now (another link
    /// fetched it, or a push came) is dropped from the plan: the round that
    /// follows a fetch of whole buckets compares it by summaries if it
    /// still differs.
    pub fn repair_next(&mut self, peer: &PeerName) -> Option<Fetch> {
        if let Some(fetch) = self.next_whole(peer) {
            return Some(fetch);
        }
        let plan = self.repairs.plans.get_mut(peer)?;
        let link = peer.clone();
        while !plan.todo.is_empty() {
            let n = plan.todo.len().min(self.settings.ids_per_fetch());
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
                return Some(Fetch { ids, ..Fetch::default() });
            }
        }
        self.repairs.plans.remove(peer);
        None
    }

    /// The next whole buckets to fetch from `peer`, claimed for its link:
    /// at most its part of what is left, shared among the links with whole
    /// buckets still to fetch (so the tail of a join comes from every peer
    /// at once, not from the link that asked first: at 1,500 keys one link
    /// took all but the first 16 of each other link's keys in one answer,
    /// while they had nothing left to do).
    fn next_whole(&mut self, peer: &PeerName) -> Option<Fetch> {
        let n_links = self.repairs.plans.values().filter(|plan| !plan.whole.is_empty()).count().max(1);
        let plan = self.repairs.plans.get_mut(peer)?;
        if plan.whole.is_empty() {
            // The buckets another link was fetching: this one's if it gave them back.
            plan.whole.extend(
                std::mem::take(&mut plan.deferred)
                    .into_iter()
                    .filter(|(bucket, _)| !self.repairs.buckets_in_flight.contains_key(bucket)),
            );
        }
        // What this plan has left, whoever claimed it: each link takes its
        // part of the same whole (a part of what is unclaimed would halve
        // at each ask, and the tail come in ever smaller fetches).
        let left: usize = plan.whole.iter().map(|&(_, n)| n as usize).sum();
        let limit = plan.whole_chunk.min(left.div_ceil(n_links).max(FIRST_WHOLE));
        let digests = self.replica.digests().as_slice();
        let mut fetch = Fetch::default();
        while let Some(&(bucket, n)) = plan.whole.front() {
            let n = n as usize;
            if !fetch.buckets.is_empty() && fetch.n_in_buckets + n > limit {
                break;
            }
            plan.whole.pop_front();
            if digests.get(bucket as usize).is_some_and(|&d| d != 0) {
                continue;
            }
            match self.repairs.buckets_in_flight.entry(bucket) {
                std::collections::hash_map::Entry::Occupied(_) => plan.deferred.push((bucket, n as u32)),
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(peer.clone());
                    fetch.buckets.push(bucket);
                    fetch.n_in_buckets += n;
                }
            }
        }
        if fetch.buckets.is_empty() {
            return None;
        }
        plan.whole_chunk = self.settings.ids_per_fetch();
        Some(fetch)
    }

    /// Applies what `fetch` from `peer` brought, and releases its claims;
    /// returns how many were applied.
    ///
    /// What a round brings is not forwarded: the other peers hold it, or
    /// their own rounds find it. (Forwarded, a joining master would push
    /// its whole catch-up from one peer to every other, which holds it.)
    /// Each decision counts as having reached the whole site.
    pub fn repair_fetched(
        &mut self,
        peer: &PeerName,
        fetch: &Fetch,
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
        self.release(peer, fetch);
        n_applied
    }

    /// A fetch from `peer` failed: what it named is released for other
    /// links (a later round repairs what is still missing).
    pub fn release(&mut self, peer: &PeerName, fetch: &Fetch) {
        for id in &fetch.ids {
            if self.repairs.in_flight.get(id).is_some_and(|link| link == peer) {
                self.repairs.in_flight.remove(id);
            }
        }
        for bucket in &fetch.buckets {
            if self.repairs.buckets_in_flight.get(bucket).is_some_and(|link| link == peer) {
                self.repairs.buckets_in_flight.remove(bucket);
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
        self.repairs.buckets_in_flight.retain(|_, link| link != peer);
    }
}
