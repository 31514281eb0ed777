//! What a session has pushed to its peer, so each decision crosses the link
//! once: a round's push leaves out what was pushed live, and a live push
//! what the round pushed first.
//!
//! A round compares the peer's summaries as they were when it answered the
//! Diff. What was pushed live before and not applied yet there (the peer
//! makes each batch durable before acknowledging it), or decided here
//! meanwhile, shows as lacking there although it is on its way: pushed by
//! the round too, it crossed the link twice. The other way round, what the
//! node decided while a round compared is pushed by the round, then again
//! when the driver comes to it in the node's outgoing stream (a driver with
//! two batches unacknowledged reads that stream no further meanwhile).
//!
//! A push on this session reaches the peer in order, or the session fails:
//! the next session starts with nothing noted, and with a round. So the
//! same decision (id, version and content) need not be pushed twice on
//! one session. A peer that got it and did not apply it (its guard holds
//! it, its clock bound refuses it) would do the same again.
//!
//! Only hashes are kept, from the last two rounds' starts on, and at most
//! [`MAX_NOTED`] per round: past that, pushes are not noted (and may cross
//! twice, as they did before). A hash shared by two decisions would leave
//! one unpushed by this link; the peer's own round fetches it.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};

use crate::core::Decision;

/// Decisions noted per round at most (16 bytes or so each).
pub const MAX_NOTED: usize = 1 << 18;

#[derive(Debug, Default)]
pub(super) struct Sent {
    keys: RandomState,
    /// Noted since the current round began.
    current: HashSet<u64>,
    /// Noted during the round before.
    previous: HashSet<u64>,
}

impl Sent {
    /// Notes a decision about to be pushed: whether it was not noted
    /// already.
    pub(super) fn first(&mut self, decision: &Decision) -> bool {
        let hash = self.keys.hash_one((
            &decision.id,
            &decision.version,
            decision.verdict.kind(),
            decision.verdict.fingerprint(),
        ));
        if self.current.contains(&hash) || self.previous.contains(&hash) {
            return false;
        }
        if self.current.len() < MAX_NOTED {
            self.current.insert(hash);
        }
        true
    }

    /// A round begins: what was noted before the last one is forgotten.
    pub(super) fn round(&mut self) {
        self.previous = std::mem::take(&mut self.current);
    }

    /// A session begins or ends.
    pub(super) fn clear(&mut self) {
        self.current = HashSet::new();
        self.previous = HashSet::new();
    }
}
