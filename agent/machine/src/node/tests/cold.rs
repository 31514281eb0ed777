//! Plain tombstones live in the store, not in memory (`cold.rs`), and are
//! compacted after `tombstone_ttl` (issue 17: a peer's deletes of made-up
//! ids grew memory and the store without limit).

use super::*;
use crate::core::digest::{bucket_of, N_BUCKETS};

fn id(name: &str) -> MinionId {
    MinionId::parse(name).unwrap()
}

fn on(name: &str, verdict: Verdict, ms: u64, origin: &str, knew: &[Version]) -> Decision {
    Decision { id: id(name), ..decision(verdict, ms, origin, knew) }
}

/// Deletes of ids this master never held are kept in the store only; a
/// later, older decision about one of them still meets its tombstone.
#[test]
fn a_delete_of_an_unknown_id_stays_in_the_store_and_still_beats_older_decisions() {
    let mut rt = Recorder::default();
    let mut a = node("master-a", &mut rt);
    let deletes: Vec<Decision> =
        (0..100).map(|i| on(&format!("made-up-{i}"), Verdict::Deleted, NOW_MS - 50, "master-b", &[])).collect();
    assert_eq!(push(&mut a, &mut rt, "master-b", deletes), 100);
    assert_eq!(a.len(), 0, "no tombstone is held in memory");
    assert_eq!(a.counts(), (0, 0, 100), "but every one is counted");
    assert_eq!(rt.store.decisions.len(), 100, "and kept in the store");
    assert_eq!(a.digests(), Some(vec![0; N_BUCKETS]), "plain tombstones are in no digest");
    // An accept made before the delete, arriving late: the tombstone is read back and wins.
    let older = on("made-up-7", Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 60, "master-c", &[]);
    assert_eq!(push(&mut a, &mut rt, "master-c", vec![older]), 0);
    assert!(rt.folders.files.is_empty(), "the older accept was not applied: {:?}", rt.folders.files);
    assert_eq!(a.len(), 0, "read back, then left to the store again");
    // A newer accept is applied, and held in memory.
    let newer = on("made-up-7", Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 40, "master-c", &[]);
    assert_eq!(push(&mut a, &mut rt, "master-c", vec![newer.clone()]), 1);
    let held = a.entry(&id("made-up-7")).expect("the accept is held");
    assert_eq!(held.version, newer.version);
    assert!(held.seen().iter().any(|s| s.kind == VerdictKind::Deleted), "it knows the tombstone it replaced");
    assert_eq!(a.counts(), (1, 0, 99));
    // After a restart, the same.
    let mut b = node_with("master-a", GuardSettings::default(), rt.store.loaded(), &mut rt);
    assert_eq!((b.len(), b.counts()), (1, (1, 0, 99)));
    let older = on("made-up-8", Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 60, "master-c", &[]);
    assert_eq!(push(&mut b, &mut rt, "master-c", vec![older]), 0);
}

/// A peer's Diff gets this master's tombstones where it holds something
/// they may delete, not where it holds nothing; its own round pushes a
/// tombstone to a peer still holding what it deletes.
#[test]
fn tombstones_reach_a_peer_that_holds_what_they_delete_and_no_other() {
    let (mut rt_a, mut rt_b) = (Recorder::default(), Recorder::default());
    let mut a = node("master-a", &mut rt_a);
    let mut b = node("master-b", &mut rt_b);
    let accept = on("web07", Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 60, "master-c", &[]);
    let delete = on("web07", Verdict::Deleted, NOW_MS - 50, "master-c", std::slice::from_ref(&accept.version));
    let unknown = on("ghost", Verdict::Deleted, NOW_MS - 50, "master-c", &[]);
    push(&mut a, &mut rt_a, "master-c", vec![accept.clone(), delete.clone(), unknown]);
    assert_eq!(a.len(), 0);
    // A key in ghost's bucket, held here: that bucket differs from an empty peer's.
    let ghost_bucket = bucket_of(&id("ghost"));
    let neighbour = (0..).map(|i| format!("live{i}")).find(|n| bucket_of(&id(n)) == ghost_bucket).unwrap();
    let live = on(&neighbour, Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 60, "master-c", &[]);
    push(&mut a, &mut rt_a, "master-c", vec![live.clone()]);
    // An empty peer (a joining master) is sent no tombstone, not even there.
    let (buckets, summaries) = a.diff(&b.digests().unwrap(), &mut rt_a);
    assert_eq!(buckets, vec![ghost_bucket as u32]);
    assert_eq!(summaries.iter().map(|(i, _)| i.as_str()).collect::<Vec<_>>(), vec![neighbour.as_str()]);
    // A peer still holding the accept learns of the delete from a's Diff answer...
    push(&mut b, &mut rt_b, "master-c", vec![accept, live]);
    let (buckets, summaries) = a.diff(&b.digests().unwrap(), &mut rt_a);
    assert_eq!(buckets, vec![bucket_of(&id("web07")) as u32]);
    assert!(summaries.iter().any(|(i, s)| *i == id("web07") && s.version == delete.version), "{summaries:?}");
    assert!(summaries.iter().all(|(i, _)| *i != id("ghost") || bucket_of(i) == bucket_of(&id("web07"))));
    let (n_newer, push_back) = b.repair_compare("master-a", &buckets, summaries, &mut rt_b);
    assert_eq!((n_newer, push_back.len()), (1, 0));
    // ...and from a's own round, which pushes it.
    let (buckets, summaries) = b.diff(&a.digests().unwrap(), &mut rt_b);
    let (n_newer, pushed) = a.repair_compare("master-b", &buckets, summaries, &mut rt_a);
    assert_eq!(n_newer, 0);
    assert_eq!(pushed.iter().map(|d| d.version.clone()).collect::<Vec<_>>(), vec![delete.version.clone()]);
    assert_eq!(a.len(), 1, "read back for the round, left to the store after it (only the live key held)");
    assert_eq!(push(&mut b, &mut rt_b, "master-a", pushed), 1);
    assert_eq!(b.digests(), a.digests());
}

/// Tombstones older than `tombstone_ttl` are forgotten; a delete that old
/// of an id not held is not kept at all.
#[test]
fn tombstones_past_their_time_are_compacted_and_not_taken_again() {
    let mut rt = Recorder::default();
    let mut a = node("master-a", &mut rt);
    let ttl_ms = TTL.as_millis() as u64;
    let old = on("old", Verdict::Deleted, NOW_MS - ttl_ms + 1000, "master-b", &[]);
    let young = on("young", Verdict::Deleted, NOW_MS + 3_700_000 - ttl_ms, "master-b", &[]);
    assert_eq!(push(&mut a, &mut rt, "master-b", vec![old, young]), 2);
    assert_eq!(a.counts().2, 2);
    // The first tick after the start compacts; two seconds later the first
    // delete is past its time, and the next compaction, an hour later, forgets it.
    let later = |secs: u64| Now { mono: Instant::now() + Duration::from_secs(secs), wall_ms: NOW_MS + 1000 * secs };
    a.on_tick(later(0), &mut rt);
    assert_eq!(a.counts().2, 2, "none past its time yet");
    a.on_tick(later(10), &mut rt);
    assert_eq!(a.counts().2, 2, "past its time, but no compaction is due");
    a.on_tick(later(3601), &mut rt);
    assert_eq!(a.counts().2, 1);
    assert_eq!(rt.store.decisions.keys().map(MinionId::as_str).collect::<Vec<_>>(), vec!["young"]);
    assert!(rt.events.iter().any(|e| matches!(e, Event::Compacted { n: 1, .. })), "{:?}", rt.events);
    // A peer that still holds it offers it again: not taken.
    let ancient = on("old", Verdict::Deleted, NOW_MS - ttl_ms - 1000, "master-b", &[]);
    assert_eq!(push(&mut a, &mut rt, "master-b", vec![ancient]), 0);
    assert_eq!(rt.store.decisions.len(), 1);
    // But a delete that old of an id held here still deletes it.
    let accept = on("kept", Verdict::Accepted(key("mwIDAQAB")), NOW_MS - ttl_ms - 5000, "master-b", &[]);
    push(&mut a, &mut rt, "master-b", vec![accept.clone()]);
    let delete = on("kept", Verdict::Deleted, NOW_MS - ttl_ms - 1000, "master-b", &[accept.version]);
    assert_eq!(push(&mut a, &mut rt, "master-b", vec![delete]), 1);
}

/// Tombstones that cannot be read back at start-up leave the journal's
/// decisions the agent's own writes, finished once the store can be read
/// (found by review: the half-done write of a peer's accept was read as an
/// operator's new decision, with a fresh version that beat later deletes).
#[test]
fn a_journal_is_finished_after_tombstones_could_not_be_read() {
    let mut rt = Recorder::default();
    let a = node("master-a", &mut rt);
    let gone = on("y", Verdict::Deleted, NOW_MS - 90, "master-b", &[]);
    push_to(a, &mut rt, gone.clone());
    // Killed after journalling and writing a peer's accept of y, before recording it.
    let accept = on("y", Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 80, "master-b", &[gone.version]);
    rt.store.journal.insert(accept.id.clone(), accept.clone());
    rt.folders.apply(&accept);
    rt.faults.load_cold = true;
    let mut a = node_with("master-a", GuardSettings::default(), rt.store.loaded(), &mut rt);
    assert!(a.entry(&id("y")).is_none(), "nothing decided about y while its tombstone cannot be read");
    rt.faults.load_cold = false;
    a.on_tick(Now { mono: Instant::now() + Duration::from_secs(10), wall_ms: NOW_MS }, &mut rt);
    assert_eq!(a.entry(&id("y")).map(|e| e.version.clone()), Some(accept.version.clone()), "{:?}", rt.events);
    assert!(rt.store.journal.is_empty());
    assert!(!rt.events.iter().any(|e| matches!(e, Event::Decided { .. })), "no operator's decision: {:?}", rt.events);
}

fn push_to(mut node: Node, rt: &mut Recorder, decision: Decision) {
    assert_eq!(push(&mut node, rt, "master-b", vec![decision]), 1);
}

/// A Diff answer reads back at most `MAX_COLD_IN_DIFF` tombstones: past it,
/// none (this master's own round pushes each to a peer naming its id).
#[test]
fn a_diff_answer_does_not_bring_a_flood_of_tombstones_back_into_memory() {
    let mut rt = Recorder::default();
    let mut a = node("master-a", &mut rt);
    let n = crate::node::cold::MAX_COLD_IN_DIFF + 1;
    let deletes: Vec<Decision> =
        (0..n).map(|i| on(&format!("made-up-{i}"), Verdict::Deleted, NOW_MS - 50, "master-b", &[])).collect();
    assert_eq!(push(&mut a, &mut rt, "master-b", deletes) as usize, n);
    let (buckets, summaries) = a.diff(&[u64::MAX; N_BUCKETS], &mut rt);
    assert_eq!((buckets.len(), summaries.len()), (N_BUCKETS, 0));
    // Fewer, and they are read back (what `recover` asks for).
    let compacted: Vec<MinionId> = rt.store.compact(u64::MAX, 2).into_iter().map(|(id, _)| id).collect();
    a.replica.forget_cold(&compacted);
    let (_, summaries) = a.diff(&[u64::MAX; N_BUCKETS], &mut rt);
    assert_eq!(summaries.len(), n - 2);
}

/// A peer's decision that knew a delete of this master older than
/// `tombstone_ttl` (compacted here) is not doubted: this master cannot
/// tell whether it made it.
#[test]
fn knowing_a_compacted_delete_of_this_master_is_not_doubted() {
    let mut rt = Recorder::default();
    // Its store is its own from long before (not a first start: what
    // names it from before that is its forgotten past, `afresh.rs`).
    let plain = GuardSettings { enabled: false, ..GuardSettings::default() };
    let mut a = node_with("master-a", plain, Loaded { initialized: true, ..Loaded::default() }, &mut rt);
    let ancient = Version::new((NOW_MS - TTL.as_millis() as u64 - 1000) << 16, "master-a");
    let accept = on("web09", Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 10, "master-b", &[ancient]);
    assert_eq!(push(&mut a, &mut rt, "master-b", vec![accept]), 1);
    assert!(!rt.events.iter().any(|e| matches!(e, Event::Doubted { .. })), "{:?}", rt.events);
    let recent = Version::new((NOW_MS - 1000) << 16, "master-a");
    let accept = on("web10", Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 10, "master-b", &[recent]);
    assert_eq!(push(&mut a, &mut rt, "master-b", vec![accept]), 1);
    assert!(rt.events.iter().any(|e| matches!(e, Event::Doubted { .. })), "a recent one still is");
}

/// A conflict a plain tombstone won is forgotten with it after
/// `tombstone_ttl`: when both decisions come back (a peer whose guard held
/// the delete past that time still holds the older accept and offers it,
/// then lets the delete through), the node meets them as new and tells the
/// conflict again. This is what docs/operations.md says of deletes held
/// longer than `tombstone_ttl` ("the origin then takes the keys back from
/// the masters still holding them"), and what the simulation's checker
/// allows (`world/checker.rs`; what seed 11981 was reported to fail on).
#[test]
fn a_conflict_forgotten_with_its_tombstone_is_told_again_when_both_come_back() {
    let mut rt = Recorder::default();
    let mut a = node("master-a", &mut rt);
    // master-c accepts web01; master-b deletes it, not knowing that accept.
    let accept = decision(Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 17, "master-c", &[]);
    let delete = decision(Verdict::Deleted, NOW_MS, "master-b", &[]);
    assert_eq!(push(&mut a, &mut rt, "master-c", vec![accept.clone()]), 1);
    assert_eq!(push(&mut a, &mut rt, "master-b", vec![delete.clone()]), 1);
    let told = |rt: &Recorder| {
        rt.events
            .iter()
            .filter(|e| {
                matches!(e, Event::Conflict { conflict, .. }
                    if conflict.winner.version == delete.version && conflict.loser.version == accept.version)
            })
            .count()
    };
    assert_eq!(told(&rt), 1);
    assert_eq!((a.len(), a.counts().2), (0, 1), "a plain tombstone, in the store only");
    // Restarted past tombstone_ttl: the first tick compacts it, and the pair with it.
    let ttl_ms = TTL.as_millis() as u64;
    let at = Now { mono: Instant::now(), wall_ms: NOW_MS + ttl_ms + 1000 };
    let mut a = node_at(
        "master-a",
        GuardSettings { enabled: false, ..GuardSettings::default() },
        rt.store.loaded(),
        at,
        &mut rt,
    );
    a.on_tick(at, &mut rt);
    assert!(rt.store.decisions.is_empty(), "compacted: {:?}", rt.store.decisions.keys().collect::<Vec<_>>());
    // A peer still holding the older accept offers it: taken back, as documented.
    assert_eq!(a.on_batches(vec![(peer("master-c"), vec![accept.clone()])], at, &mut rt), vec![1]);
    assert_eq!(told(&rt), 1);
    // The delete comes again (let through by that peer's guard): it wins
    // again, and the conflict, forgotten, is told again.
    assert_eq!(a.on_batches(vec![(peer("master-d"), vec![delete.clone()])], at, &mut rt), vec![1]);
    assert_eq!(told(&rt), 2);
}
