//! What a link holds back for its peer while a round runs (see `link.rs`).

/// Most decisions a link holds back for its peer during a round. Held with
/// their keys: a master joining two peers forwards to each the decisions
/// fetched from the other, and each link held 10,000 of them (~7 MiB)
/// before dropping them for another round anyway; a burst larger than this
/// during a round costs one more comparison of digests.
pub const MAX_HELD_BACK: usize = 1000;

/// What the node sent its peers while a round ran.
#[derive(Debug)]
pub(super) struct HeldBack<B> {
    /// For the peer, in order.
    pub(super) batches: Vec<B>,
    n_decisions: usize,
    /// Some were dropped (too many, or the stream lagged): another round.
    pub(super) dropped: bool,
}

impl<B> Default for HeldBack<B> {
    fn default() -> Self {
        HeldBack { batches: Vec::new(), n_decisions: 0, dropped: false }
    }
}

impl<B> HeldBack<B> {
    pub(super) fn take(&mut self, n: usize, batch: B, max: usize) {
        self.n_decisions += n;
        if self.dropped || self.n_decisions > max {
            self.drop_all();
        } else {
            self.batches.push(batch);
        }
    }

    pub(super) fn drop_all(&mut self) {
        self.dropped = true;
        self.batches = Vec::new();
    }
}
