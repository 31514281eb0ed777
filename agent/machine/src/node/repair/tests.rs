//! The comparison's own parts: tags, and what an observer hears.

use super::*;
use crate::core::decision::VerdictKind;

fn seen(hlc: u64, node: &str, kind: VerdictKind, key: u8) -> Seen {
    let fingerprint = (kind != VerdictKind::Deleted).then_some(Fingerprint([key; 32]));
    Seen { version: Version::new(hlc, node), kind, fingerprint, context: Default::default() }
}

#[test]
fn a_tag_names_the_decision_its_summary_was_made_from_and_no_other() {
    let keys = RandomState::new();
    let accepted = seen(7, "a", VerdictKind::Accepted, 1);
    let tag = Tag::of_summary(&keys, &Summary::of(&accepted));
    assert!(tag.names(&keys, &accepted));
    assert!(!tag.names(&keys, &seen(8, "a", VerdictKind::Accepted, 1)), "another version");
    assert!(!tag.names(&keys, &seen(7, "b", VerdictKind::Accepted, 1)), "another origin");
    assert!(!tag.names(&keys, &seen(7, "a", VerdictKind::Accepted, 2)), "another key");
    assert!(!tag.names(&keys, &seen(7, "a", VerdictKind::Rejected, 1)), "another kind");
    // A protocol 1 peer names versions only: matched on the version.
    let bare = Tag::of_summary(&keys, &Summary { version: accepted.version.clone(), content: None });
    assert!(bare.names(&keys, &accepted) && bare.names(&keys, &seen(7, "a", VerdictKind::Deleted, 0)));
    assert!(!bare.names(&keys, &seen(9, "a", VerdictKind::Accepted, 1)));
}

/// Observe mode keeps of a peer's answer only the rows this node does not
/// hold itself, each as the peer named it, and no more per id than a
/// comparison allows.
#[test]
fn an_observer_hears_only_what_it_does_not_hold() {
    let id = MinionId::parse("mail01").unwrap();
    let claim = |kind, key| {
        let rejected = kind == VerdictKind::Rejected;
        Seen { version: Version::claim(rejected, &[key; 32]), ..seen(0, "", kind, key) }
    };
    let (mine, theirs) = (claim(VerdictKind::Accepted, 1), claim(VerdictKind::Accepted, 2));
    let here = Entry::new(mine.kind, mine.fingerprint, mine.version.clone(), Default::default());
    let mut heard = Heard::new();
    hear(&mut heard, Some(&here), id.clone(), &Summary::of(&mine)).unwrap();
    assert!(heard.is_empty(), "the very row held here");
    hear(&mut heard, Some(&here), id.clone(), &Summary::of(&theirs)).unwrap();
    assert_eq!(heard[&id], vec![theirs.clone()]);
    let bare = Summary { version: theirs.version.clone(), content: None };
    hear(&mut heard, None, MinionId::parse("web01").unwrap(), &bare).unwrap();
    assert_eq!(heard.len(), 1, "a protocol 1 row names no content: not kept");
    for key in 3..(MAX_ROWS_PER_ID as u8 + 4) {
        let row = Summary::of(&claim(VerdictKind::Rejected, key));
        if let Err(e) = hear(&mut heard, None, id.clone(), &row) {
            assert_eq!(e, BadAnswer::TooManyRows(id.clone()));
            return;
        }
    }
    panic!("more than {MAX_ROWS_PER_ID} rows for one id were kept");
}

/// What the tag says when a chunk is cut is what the whole summary said.
#[test]
fn a_tag_is_still_newer_exactly_when_its_summary_is() {
    let keys = RandomState::new();
    let live = |ms: u64, node: &str, key: u8| seen(CLAIM_CEILING + (ms << 16), node, VerdictKind::Accepted, key);
    let entry = |held: &Seen, seen: Vec<Seen>| {
        Entry::new(held.kind, held.fingerprint, held.version.clone(), held.context.clone()).with_seen(seen)
    };
    let claim = seen(5, crate::core::version::CLAIM_ACCEPT, VerdictKind::Accepted, 3);
    let mut replica = crate::core::replica::Replica::new("c", Default::default());
    let id = MinionId::parse("web01").unwrap();
    for (theirs, held) in [
        (live(10, "a", 1), None),
        (live(10, "a", 1), Some(entry(&live(10, "a", 1), vec![]))),
        (live(10, "a", 1), Some(entry(&live(20, "b", 2), vec![live(10, "a", 1)]))),
        (live(10, "a", 1), Some(entry(&live(20, "b", 2), vec![]))),
        (live(20, "b", 2), Some(entry(&live(10, "a", 1), vec![]))),
        (claim.clone(), Some(entry(&live(20, "b", 2), vec![]))),
        (claim.clone(), Some(entry(&live(20, "b", 2), vec![claim.clone()]))),
    ] {
        if let Some(held) = &held {
            replica.load(id.clone(), held.clone());
        }
        let summary = Summary::of(&theirs);
        let tag = Tag::of_summary(&keys, &summary);
        assert_eq!(
            tag.still_newer(&keys, held.as_ref()),
            held.is_none() || replica.is_newer_on_peer(&id, &summary),
            "{theirs:?} against {held:?}"
        );
    }
}
