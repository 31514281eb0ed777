//! What the node sends its peers: one broadcast channel that every link
//! follows, and the names of the peers whose links follow it, which each
//! batch carries so that every link tells its peer the same `reached`
//! (`keysync_machine::link::reached`).

use std::sync::{Arc, Mutex};

use keysync_machine::PeerName;
use tokio::sync::broadcast;

use crate::core::Decision;

/// Decisions leaving this node for its peers. `from`: the peer they came
/// from, which need not get them back. `pushing`: the peers whose links
/// followed the node's outgoing decisions when these were sent.
#[derive(Debug)]
pub struct Outgoing {
    pub from: Option<PeerName>,
    pub decisions: Vec<Decision>,
    pub pushing: Arc<[PeerName]>,
}

/// The channel and who follows it.
#[derive(Clone)]
pub(super) struct Channel {
    sender: broadcast::Sender<Arc<Outgoing>>,
    /// One entry per following link (a link's next session may begin
    /// before the last one's receiver is dropped, so a name may be twice).
    followers: Arc<Mutex<Vec<PeerName>>>,
}

/// A link's receiver of the node's outgoing decisions; its peer counts as
/// following until it is dropped.
pub struct Following {
    pub receiver: broadcast::Receiver<Arc<Outgoing>>,
    peer: PeerName,
    followers: Arc<Mutex<Vec<PeerName>>>,
}

impl Drop for Following {
    fn drop(&mut self) {
        let mut followers = self.followers.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(at) = followers.iter().position(|name| *name == self.peer) {
            followers.swap_remove(at);
        }
    }
}

impl Channel {
    pub(super) fn new(capacity: usize) -> Channel {
        Channel { sender: broadcast::channel(capacity).0, followers: Arc::default() }
    }

    /// Follows the outgoing decisions for `peer`'s link. The receiver is
    /// made before the name is listed: a batch sent in between reaches the
    /// link without naming its peer, which only means a peer further on
    /// may push it there too.
    pub(super) fn follow(&self, peer: &PeerName) -> Following {
        let receiver = self.sender.subscribe();
        self.lock().push(peer.clone());
        Following { receiver, peer: peer.clone(), followers: self.followers.clone() }
    }

    /// Sends decisions to every following link.
    pub(super) fn send(&self, from: Option<PeerName>, decisions: Vec<Decision>) {
        let mut pushing: Vec<PeerName> = self.lock().clone();
        pushing.sort_unstable();
        pushing.dedup();
        // No receiver just means no peer is connected right now.
        let _ = self.sender.send(Arc::new(Outgoing { from, decisions, pushing: pushing.into() }));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<PeerName>> {
        self.followers.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
