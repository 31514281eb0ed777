//! The replica's own tests: what observing folders decides, and what
//! committing keeps.

use super::*;
use crate::core::decision::PublicKey;
use crate::testkit::PUB;

fn id() -> MinionId {
    MinionId::parse("web01").unwrap()
}

fn accepted() -> Verdict {
    Verdict::Accepted(PublicKey::new(PUB.as_bytes()))
}

#[test]
fn observing_an_unchanged_folder_decides_nothing() {
    let mut replica = Replica::new("a", Hlc::default());
    let d = replica.observe(&id(), Reading::Decided(accepted()), 1000, ObserveMode::Live).unwrap();
    assert_eq!(d.version, Version::new(Hlc::default().tick(1000), "a"));
    assert!(d.context.is_empty(), "nothing was known of web01");
    replica.commit(&d);
    // The agent's own write of the same decision comes back as an event: no echo.
    assert_eq!(replica.observe(&id(), Reading::Decided(accepted()), 2000, ObserveMode::Live), None);
    assert_eq!(replica.observe(&id(), Reading::Unknown, 2000, ObserveMode::Live), None);
}

#[test]
fn a_key_gone_from_every_folder_is_a_tombstone() {
    let mut replica = Replica::new("a", Hlc::default());
    assert_eq!(replica.observe(&id(), Reading::Undecided, 1000, ObserveMode::Live), None);
    let accept = replica.observe(&id(), Reading::Decided(accepted()), 1000, ObserveMode::Live).unwrap();
    replica.commit(&accept);
    let delete = replica.observe(&id(), Reading::Undecided, 1001, ObserveMode::Live).unwrap();
    assert_eq!(delete.verdict, Verdict::Deleted);
    assert_eq!(delete.context.highest(), Some(&accept.version));
    assert!(delete.context.knows(&accept.version));
}

#[test]
fn a_decision_held_without_a_merge_still_moves_the_clock() {
    let now_ms = 1_700_000_000_000;
    let peer = Decision {
        id: id(),
        verdict: accepted(),
        version: Version::new(Hlc::default().tick(now_ms + 2_000), "b"),
        context: Default::default(),
        relays: Default::default(),
        reached: Default::default(),
    };
    let mut replica = Replica::new("a", Hlc::resume(0));
    replica.load(id(), peer.entry());
    let delete = replica.observe(&id(), Reading::Undecided, now_ms, ObserveMode::Live).unwrap();
    assert!(delete.version > peer.version, "{} <= {}", delete.version, peer.version);
}

#[test]
fn a_first_start_finds_claims_named_by_their_content() {
    let mut a = Replica::new("a", Hlc::default());
    let mut b = Replica::new("b", Hlc::default());
    let d = a.observe(&id(), Reading::Decided(accepted()), 1000, ObserveMode::FirstStart).unwrap();
    assert!(d.version.is_claim() && d.context.is_empty());
    // Another master holding the same key at another time: the very same claim.
    let e = b.observe(&id(), Reading::Decided(accepted()), 99_000, ObserveMode::FirstStart).unwrap();
    assert_eq!(d, e);
    a.commit(&d);
    b.commit(&e);
    assert_eq!(a.digests(), b.digests(), "masters that agree compare equal");
    // A key in no folder is no claim.
    let mut c = Replica::new("c", Hlc::default());
    assert_eq!(c.observe(&id(), Reading::Undecided, 1000, ObserveMode::FirstStart), None);
}

#[test]
fn commit_keeps_the_newest_and_digests_follow() {
    let mut replica = Replica::new("a", Hlc::default());
    let newer = Decision {
        id: id(),
        verdict: Verdict::Deleted,
        version: Version::new(crate::core::version::CLAIM_CEILING + (9), "b"),
        context: Default::default(),
        relays: Default::default(),
        reached: Default::default(),
    };
    let older = Decision {
        id: id(),
        verdict: accepted(),
        version: Version::new(crate::core::version::CLAIM_CEILING + (5), "c"),
        context: Default::default(),
        relays: Default::default(),
        reached: Default::default(),
    };
    replica.commit(&newer);
    let digests = replica.digests().clone();
    replica.commit(&older);
    assert_eq!(replica.entry(&id()).unwrap().version, newer.version);
    assert_eq!(replica.digests(), &digests);
    let bucket = bucket_of(&id()) as u32;
    assert_eq!(replica.summaries_in(&[bucket], &[bucket], Vec::new()), vec![(id(), Summary::of(&newer.seen()))]);
    assert!(!replica.is_newer_on_peer(&id(), &Summary::of(&newer.seen())));
    assert!(!replica.is_newer_on_peer(
        &id(),
        &Summary { version: Version::new(crate::core::version::CLAIM_CEILING + (9), "b"), content: None }
    ));
    assert!(replica.is_newer_on_peer(
        &id(),
        &Summary { version: Version::new(crate::core::version::CLAIM_CEILING + (10), "a"), content: None }
    ));
    // The older decision is remembered, for conflicts, not held.
    assert_eq!(replica.entry(&id()).unwrap().seen().len(), 1);
}

#[test]
fn room_reserved_for_new_ids_is_not_grown_again() {
    let mut replica = Replica::new("a", Hlc::default());
    replica.reserve(1000);
    let room = replica.entries.capacity();
    assert!(room >= 1000);
    for i in 0..1000 {
        let id = MinionId::parse(&format!("web{i}")).unwrap();
        assert!(!replica.holds(id.as_str()));
        let d = replica.observe(&id, Reading::Decided(accepted()), 1000, ObserveMode::FirstStart).unwrap();
        replica.commit(&d);
        assert!(replica.holds(id.as_str()));
    }
    assert_eq!(replica.entries.capacity(), room, "the map was grown while it had room");
}

#[test]
fn a_local_decision_knows_everything_seen() {
    let mut replica = Replica::new("a", Hlc::default());
    let from_b = Decision {
        id: id(),
        verdict: accepted(),
        version: Version::new(crate::core::version::CLAIM_CEILING + (5 << 16), "b"),
        context: Default::default(),
        relays: Default::default(),
        reached: Default::default(),
    };
    let from_c = Decision {
        id: id(),
        verdict: Verdict::Deleted,
        version: Version::new(crate::core::version::CLAIM_CEILING + (4 << 16), "c"),
        context: Default::default(),
        relays: Default::default(),
        reached: Default::default(),
    };
    replica.commit(&from_b);
    replica.commit(&from_c);
    let delete = replica.observe(&id(), Reading::Undecided, 1000, ObserveMode::Live).unwrap();
    assert!(delete.context.knows(&from_b.version) && delete.context.knows(&from_c.version));
}
