//! Deletes of ids held nowhere here (`unheld.rs`): a peer's flood of them
//! grows nothing, masters still agree, and a delete that overtook the
//! decision it deleted still wins.

use super::*;
use crate::core::{Folder, VerdictKind};

fn delete_of(id: &str, ms: u64, knew: &[Version]) -> Decision {
    Decision { id: MinionId::parse(id).unwrap(), ..decision(Verdict::Deleted, ms, "master-a", knew) }
}

fn made_up(n: usize) -> Vec<Decision> {
    (0..n).map(|i| delete_of(&format!("made-up{i:05}"), NOW_MS - 10_000 + i as u64, &[])).collect()
}

/// Issue 17: 100,000 deletes of unknown ids left 120 MB of tombstones per
/// master, never cleaned, and every master passed them on to the others.
#[test]
fn deletes_of_ids_held_nowhere_are_neither_kept_nor_passed_on() {
    let mut rt = Recorder::default();
    let mut b = node("master-b", &mut rt);
    let n = 5000;
    assert_eq!(push(&mut b, &mut rt, "master-a", made_up(n)), 0, "nothing applied");
    assert!(rt.store.decisions.is_empty(), "{} tombstones kept", rt.store.decisions.len());
    assert!(b.entry(&MinionId::parse("made-up00000").unwrap()).is_none());
    assert!(rt.sent.is_empty(), "passed on: {:?}", rt.sent.len());
    assert_eq!(b.unheld.len(), super::super::unheld::REMEMBERED, "only the last are remembered");
    let told: Vec<usize> =
        rt.events.iter().filter_map(|e| if let Event::Unheld { n, .. } = e { Some(*n) } else { None }).collect();
    assert_eq!(told, vec![n], "told once for the push");
    assert!(b.is_quiet());
}

/// A delete that overtook the accept it deleted (another path, a repair)
/// is not kept, yet the accept, when it comes, is superseded, not applied.
#[test]
fn a_delete_that_overtook_its_accept_still_wins() {
    let mut rt = Recorder::default();
    let mut b = node("master-b", &mut rt);
    let accept = decision(Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 30, "master-a", &[]);
    let delete = delete_of("web01", NOW_MS - 20, std::slice::from_ref(&accept.version));
    push(&mut b, &mut rt, "master-a", vec![delete.clone()]);
    assert!(b.entry(&accept.id).is_none());
    push(&mut b, &mut rt, "master-c", vec![accept.clone()]);
    assert!(rt.folders.get(Folder::Accepted, "web01").is_none(), "the deleted key came back");
    let held = b.entry(&accept.id).expect("the delete is held now");
    assert_eq!((held.version.clone(), held.kind), (delete.version.clone(), VerdictKind::Deleted));
    assert!(rt.store.decisions.contains_key(&accept.id));
    assert!(rt
        .events
        .iter()
        .any(|e| matches!(e, Event::Superseded { decision, .. } if decision.version == accept.version)));
    assert!(!rt.events.iter().any(|e| matches!(e, Event::Conflict { .. })), "{:?}", rt.events);
}

/// An operator's accept here, after a peer's delete of the id was ignored,
/// knew that delete: where it is held, the accept is no conflict.
#[test]
fn an_operators_decision_knows_an_ignored_delete() {
    let mut rt = Recorder::default();
    let mut b = node("master-b", &mut rt);
    let delete = delete_of("web01", NOW_MS - 20, &[]);
    push(&mut b, &mut rt, "master-a", vec![delete.clone()]);
    rt.folders.put(Folder::Accepted, "web01", key("mwIDAQAB").bytes());
    b.on_lost("salt-key", now(), &mut rt);
    b.on_tick(Now { mono: now().mono + Duration::from_secs(6), wall_ms: NOW_MS + 6000 }, &mut rt);
    let decided = rt
        .events
        .iter()
        .find_map(|e| if let Event::Decided { decision, .. } = e { Some(decision.clone()) } else { None })
        .expect("the operator's accept");
    assert!(decided.context.iter().any(|v| *v == delete.version), "{:?}", decided.context);
}

/// A master that holds a tombstone and one that never knew the id agree:
/// their digests are equal, and a repair between them moves nothing.
#[test]
fn a_tombstone_and_no_entry_agree() {
    let (mut rt_a, mut rt_b) = (Recorder::default(), Recorder::default());
    let mut a = node("master-a", &mut rt_a);
    let mut b = node("master-b", &mut rt_b);
    let accept = decision(Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 30, "master-c", &[]);
    let delete = decision(Verdict::Deleted, NOW_MS - 20, "master-c", std::slice::from_ref(&accept.version));
    push(&mut a, &mut rt_a, "master-c", vec![accept]);
    push(&mut a, &mut rt_a, "master-c", vec![delete]);
    assert_eq!(a.entry(&MinionId::parse("web01").unwrap()).map(|e| e.kind), Some(VerdictKind::Deleted));
    assert_eq!(a.digests(), b.digests(), "a tombstone is no key, as no entry is");
    // Even with the bucket compared (another id differs), nothing moves.
    push(
        &mut a,
        &mut rt_a,
        "master-c",
        vec![Decision {
            id: MinionId::parse("web02").unwrap(),
            ..decision(Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 10, "master-c", &[])
        }],
    );
    let (buckets, summaries) = a.diff(&b.digests());
    let (n_newer_there, push_back) = b.repair_compare("master-a", &buckets, summaries, &mut rt_b);
    let (buckets, summaries) = b.diff(&a.digests());
    let (_, pushed) = a.repair_compare("master-b", &buckets, summaries, &mut rt_a);
    assert!(push_back.is_empty());
    let ids: Vec<&str> = pushed.iter().map(|d| d.id.as_str()).collect();
    assert!(!ids.contains(&"web01"), "the tombstone was pushed where the id is held nowhere: {ids:?}");
    assert!(n_newer_there <= 1, "only web02 is fetched, not the tombstone: {n_newer_there}");
}
