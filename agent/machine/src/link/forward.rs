//! Which of the node's outgoing decisions a link pushes to its peer, and
//! what it tells the peer about who else has it.
//!
//! Each decision crosses each link once in a full mesh: its origin pushes
//! it to every peer whose link follows the node's outgoing decisions, and
//! names them all in the decision's `reached`; a receiver forwards it only
//! to peers outside `reached`, its origin and its relays, so in a full mesh
//! nobody forwards. In a partial mesh it goes on hop by hop, each hop
//! adding the peers it pushes to.
//!
//! A peer named in `reached` that does not get the push after all (its
//! link broke first, or lagged behind the node's outgoing decisions) gets
//! it from the round that follows: a link whose session breaks begins the
//! next with a round, and a lagging link runs one at once. A peer whose
//! link comes up after the push was sent is not named, and its first round
//! brings it too.

use crate::core::{Decision, Relays};
use crate::PeerName;

/// Whether a decision the node sends its peers is pushed to `peer`: never
/// to the master that made it, nor to a master it passed through on its
/// way here (its `relays`), nor to one it was already pushed to (its
/// `reached`), as the peer it came from reported them. Each holds it
/// already. A peer that lied about either only keeps this node from
/// pushing to those it named: they still have it from the origin's own
/// push, and a round finds it by digest otherwise. (A round's pushes are
/// of what the peer lacks by its own summaries, and are not filtered by
/// this rule; both kinds leave out what the session pushed already:
/// [`super::Link::push_live`].)
pub fn pushes_to(decision: &Decision, peer: &PeerName) -> bool {
    let named = |names: &Relays| names.iter().any(|name| name == peer.as_str());
    *decision.version.node != *peer.as_str() && !named(&decision.relays) && !named(&decision.reached)
}

/// The `reached` a decision is pushed with from this node, where `pushing`
/// are the peers whose links followed the node's outgoing decisions when it
/// was sent: those it had reached already, and every one of `pushing` it is
/// pushed to from here. Each link pushing it tells its peer the same list.
pub fn reached(decision: &Decision, pushing: &[PeerName]) -> Relays {
    let onward = pushing.iter().filter(|peer| pushes_to(decision, peer));
    Relays::new(decision.reached.iter().map(Into::into).chain(onward.map(|peer| peer.as_arc().clone())))
}
