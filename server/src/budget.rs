//! Budgets for authenticated peers, mistaken or hostile: how many pushed
//! batches of one peer, and of all peers together, are read and handled at
//! once. A push stream waits for its permits before it reads its next batch,
//! so what a peer sends meanwhile stays in HTTP/2 flow control (a window per
//! stream and per connection) instead of this process's memory: a peer that
//! pushes faster than this master applies is slowed, not served out of
//! memory, however many streams it opens. With the cap on each peer's
//! connections (`control.rs`), the memory peers' pushes take is bounded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Pushed batches of one peer read and handled at once.
pub const CALLS_PER_PEER: usize = 2;
/// Pushed batches of all peers together read and handled at once: each is
/// one message of at most `max_message_bytes`, decoded.
pub const CALLS_IN_ALL: usize = 3;

/// The permits shared by every connection of one listener.
#[derive(Clone)]
pub(crate) struct Budgets {
    all: Arc<Semaphore>,
    per_peer: Arc<Mutex<HashMap<String, Arc<Semaphore>>>>,
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

    /// Waits for `peer`'s permit, then for one of all peers' (a peer over
    /// its budget waits without holding one the others could use).
    pub(crate) async fn acquire(&self, peer: &str) -> Permits {
        let of_peer = {
            let mut map = self.per_peer.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(peer.to_string()).or_insert_with(|| Arc::new(Semaphore::new(CALLS_PER_PEER))).clone()
        };
        // The semaphores are never closed.
        let peer_permit = of_peer.acquire_owned().await.expect("budget semaphore open");
        let all = self.all.clone().acquire_owned().await.expect("budget semaphore open");
        Permits { _peer: peer_permit, _all: all }
    }
}
