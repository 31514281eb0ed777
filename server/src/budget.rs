//! Budgets for authenticated peers, mistaken or hostile: how many push
//! streams one peer may have open, and how many pushed batches of one peer,
//! and of all peers together, are handled at once. A stream reads its next
//! batch as it comes (an idle live stream, between decisions, holds no
//! budget: with four peers or more, idle streams once held it all and a
//! peer's decision waited for another's), then waits for its permits before
//! the batch is handled; meanwhile it reads nothing more, so what a peer
//! sends stays in HTTP/2 flow control (a window per stream and per
//! connection) instead of this process's memory. A peer's fifth push
//! stream at once is refused (an agent keeps one per link, and a second on
//! its other connection while that link loses packets or has not told yet,
//! at a session's start; as many again cover
//! a session ending unseen as the next begins): each open
//! stream holds at most one batch, so with the cap on each peer's
//! connections (`control.rs`) the memory peers' pushes take is bounded by
//! the number of peers, and a peer that pushes faster than this master
//! applies is slowed, not served out of memory.

//!
//! Answers (Diff and Fetch streams) are budgeted too: a peer may have
//! [`ANSWERS_PER_PEER`] of them in flight at once (a further one is
//! refused), and each must be read whole within the answer deadline
//! ([`crate::ServeOptions::answer_deadline`]): a peer that stops reading
//! (an HTTP/2 window of 0) is cut off and the answer's memory given back,
//! so what stalled answers hold is bounded by the number of peers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::identity::PeerName;

/// Diff and Fetch answers of one peer in flight at once (an agent's link
/// reads one at a time).
pub const ANSWERS_PER_PEER: usize = 2;

/// Pushed batches of one peer handled at once.
pub const CALLS_PER_PEER: usize = 2;
/// Push streams of one peer open at once: a link's session keeps one, and
/// a second for the copies of its live pushes while the path loses
/// packets or has not told yet (a session's first seconds); two more let the next session open its streams while the
/// server has not seen the last one's end yet (a connection lost without
/// a word stays open here until its keep-alive ends it), so a reconnect
/// on a lossy path is not refused, nor audited as a refusal.
pub const PUSH_STREAMS_PER_PEER: usize = 4;
/// Pushed batches of all peers together handled at once: each is one
/// message of at most `max_message_bytes`, decoded.
pub const CALLS_IN_ALL: usize = 3;

/// The permits shared by every connection of one listener.
#[derive(Clone)]
pub(crate) struct Budgets {
    all: Arc<Semaphore>,
    per_peer: Arc<Mutex<HashMap<PeerName, PeerBudget>>>,
}

/// One peer's permits: batches handled, push streams open, answers in flight.
#[derive(Clone)]
struct PeerBudget {
    calls: Arc<Semaphore>,
    streams: Arc<Semaphore>,
    answers: Arc<Semaphore>,
}

/// One of a peer's answers in flight: its place is given back when dropped.
pub(crate) struct AnswerPlace {
    _place: OwnedSemaphorePermit,
}

/// One of a peer's open push streams: its place is given back when dropped.
pub(crate) struct PushStream {
    _place: OwnedSemaphorePermit,
}

/// Held while one batch is read and handled.
pub(crate) struct Permits {
    _peer: OwnedSemaphorePermit,
    _all: OwnedSemaphorePermit,
}

impl Budgets {
    pub(crate) fn new() -> Budgets {
        Budgets { all: Arc::new(Semaphore::new(CALLS_IN_ALL)), per_peer: Arc::default() }
    }

    fn of_peer(&self, peer: &PeerName) -> PeerBudget {
        let mut map = self.per_peer.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(peer.clone())
            .or_insert_with(|| PeerBudget {
                calls: Arc::new(Semaphore::new(CALLS_PER_PEER)),
                streams: Arc::new(Semaphore::new(PUSH_STREAMS_PER_PEER)),
                answers: Arc::new(Semaphore::new(ANSWERS_PER_PEER)),
            })
            .clone()
    }

    /// A place for one more Diff or Fetch answer to `peer`; `None` when it
    /// has [`ANSWERS_PER_PEER`] in flight already.
    pub(crate) fn open_answer(&self, peer: &PeerName) -> Option<AnswerPlace> {
        self.of_peer(peer).answers.try_acquire_owned().ok().map(|place| AnswerPlace { _place: place })
    }

    /// A place for one more push stream of `peer`; `None` when it has
    /// [`PUSH_STREAMS_PER_PEER`] open already.
    pub(crate) fn open_push(&self, peer: &PeerName) -> Option<PushStream> {
        self.of_peer(peer).streams.try_acquire_owned().ok().map(|place| PushStream { _place: place })
    }

    /// Waits for `peer`'s permit, then for one of all peers' (a peer over
    /// its budget waits without holding one the others could use).
    pub(crate) async fn acquire(&self, peer: &PeerName) -> Permits {
        // The semaphores are never closed.
        let peer_permit = self.of_peer(peer).calls.acquire_owned().await.expect("budget semaphore open");
        let all = self.all.clone().acquire_owned().await.expect("budget semaphore open");
        Permits { _peer: peer_permit, _all: all }
    }
}
