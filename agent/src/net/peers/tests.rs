//! A link's pieces: the protocol an older peer speaks, and what is held back during a round.

use super::*;
use crate::core::{MinionId, Verdict, Version};
use crate::node::Outgoing;

/// An agent of 0.1.0 (protocol 1) refuses protocol 2's Hello naming what
/// it speaks: the link speaks it (issue 29 item 1); other refusals, and
/// protocols this agent does not speak, are not taken for one.
#[test]
fn an_older_servers_refusal_names_the_protocol_to_speak() {
    let old = tonic::Status::failed_precondition("protocol version 2 is not supported (this server speaks 1)");
    assert_eq!(older_server(&old), Some(1));
    let unknown = tonic::Status::failed_precondition("protocol version 2 is not supported (this server speaks 0)");
    assert_eq!(older_server(&unknown), None, "older than this agent speaks");
    let newer = tonic::Status::failed_precondition("protocol version 2 is not supported (this server speaks 9)");
    assert_eq!(older_server(&newer), None);
    let other = tonic::Status::permission_denied("Hello names node \"x\" but the client certificate is for \"y\"");
    assert_eq!(older_server(&other), None);
}

fn batch(from: &str, n: usize) -> Arc<Outgoing> {
    let decisions = (0..n)
        .map(|i| Decision {
            id: MinionId::parse(&format!("web{i}")).unwrap(),
            verdict: Verdict::Deleted,
            version: Version::new(1 << 50, "master-c"),
            context: Default::default(),
            relays: Default::default(),
        })
        .collect();
    Arc::new(Outgoing { from: Some(from.to_string()), decisions })
}

#[test]
fn held_back_keeps_what_the_peer_lacks_up_to_its_bound() {
    use broadcast::error::RecvError::{Closed, Lagged};
    type Arrivals = Vec<Result<Arc<Outgoing>, broadcast::error::RecvError>>;
    // (what arrives during the round, decisions kept for the peer, dropped)
    let cases: Vec<(Arrivals, usize, bool)> = vec![
        (vec![], 0, false),
        // The peer's own decisions are never pushed back to it.
        (vec![Ok(batch("master-b", MAX_HELD_BACK + 1))], 0, false),
        (vec![Ok(batch("master-a", 3)), Ok(batch("master-b", 5)), Ok(batch("master-a", 4))], 7, false),
        (vec![Ok(batch("master-a", MAX_HELD_BACK))], MAX_HELD_BACK, false),
        // Past the bound, or lagging: nothing kept, another round instead.
        (vec![Ok(batch("master-a", MAX_HELD_BACK)), Ok(batch("master-a", 1))], 0, true),
        (vec![Ok(batch("master-a", MAX_HELD_BACK + 1)), Ok(batch("master-a", 1))], 0, true),
        (vec![Ok(batch("master-a", 2)), Err(Lagged(3)), Ok(batch("master-a", 1))], 0, true),
    ];
    for (i, (arrivals, kept, dropped)) in cases.into_iter().enumerate() {
        let mut held = HeldBack::default();
        for out in arrivals {
            held.take(out, "master-b");
        }
        assert_eq!((decisions_of(&held.batches).len(), held.dropped, held.closed), (kept, dropped, false), "case {i}");
    }
    let mut held = HeldBack::default();
    held.take(Err(Closed), "master-b");
    assert!(held.closed && !held.dropped);
}
