//! Which of the node's outgoing decisions a link pushes to its peer.

use crate::core::Decision;
use crate::PeerName;

/// Whether a decision the node sends its peers is pushed to `peer`: never
/// to the master that made it, nor to a master it passed through on its way
/// here (its `relays`, as the peer it came from reported them). Each holds
/// it already; before, a decision relayed here was pushed back to its
/// origin. A peer that lied about relays only keeps this node from pushing
/// to those it named: they still have it from the origin's own push, and a
/// round finds it by digest otherwise. (A round's pushes are of what the
/// peer lacks by its own summaries, and are not filtered.)
pub fn pushes_to(decision: &Decision, peer: &PeerName) -> bool {
    *decision.version.node != *peer.as_str() && !decision.relays.iter().any(|relay| relay == peer.as_str())
}
