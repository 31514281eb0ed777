//! A master whose store started afresh (`recover --from-peers`, or a purge
//! and reinstall) meets the decisions it made before, which its peers still
//! hold naming it as their origin: its own forgotten past, taken back like
//! any peer's decision, never refused as decisions it never made (issue 28
//! item 4). What names it and is newer than that start stays refused.

use super::*;
use crate::core::Folder;

fn on(name: &str, verdict: Verdict, ms: u64, origin: &str, knew: &[Version]) -> Decision {
    Decision { id: MinionId::parse(name).unwrap(), ..decision(verdict, ms, origin, knew) }
}

fn plain() -> GuardSettings {
    GuardSettings { enabled: false, ..GuardSettings::default() }
}

/// Rounds of `asker`'s link to `answerer` (Diff, compare, push, fetch)
/// until a round changes nothing.
fn rounds(asker: (&str, &mut Node, &mut Recorder), answerer: (&str, &mut Node, &mut Recorder)) {
    let ((asker_name, asker, rt_asker), (answerer_name, answerer, rt_answerer)) = (asker, answerer);
    for _ in 0..4 {
        let (buckets, summaries) = answerer.diff(&asker.digests().unwrap(), rt_answerer);
        let (_, pushed) = asker.repair_compare(answerer_name, &buckets, summaries, rt_asker);
        if !pushed.is_empty() {
            answerer.on_batches(vec![(peer(asker_name), pushed)], now(), rt_answerer);
        }
        while let Some(fetch) = asker.repair_next(&peer(answerer_name)) {
            let fetched = answerer.fetch(&fetch.ids, rt_answerer);
            asker.repair_fetched(&peer(answerer_name), &fetch, fetched, now(), rt_asker);
        }
    }
}

fn refused(rt: &Recorder) -> Vec<&Event> {
    rt.events.iter().filter(|e| matches!(e, Event::NotOurs { .. } | Event::Doubted { .. })).collect()
}

/// master-a accepted web01 and rejected web02 an hour ago; master-b then
/// deleted web02, knowing that rejection. master-a is purged and installed
/// again with its folders as they were: its first start holds web01 as a
/// claim. Its peer's copies of its own decisions are taken back (before:
/// each refused as "claims this master as its origin, which never made
/// it", and master-b's delete doubted), and both masters end alike.
#[test]
fn a_reinstalled_master_takes_back_what_it_decided_before() {
    let (mut rt_a, mut rt_b) = (Recorder::default(), Recorder::default());
    let mut b = node_with("master-b", plain(), Loaded::default(), &mut rt_b);
    let accept = on("web01", Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 3_600_000, "master-a", &[]);
    let reject = on("web02", Verdict::Rejected(key("mwIDAQAC")), NOW_MS - 3_500_000, "master-a", &[]);
    let delete = on("web02", Verdict::Deleted, NOW_MS - 3_400_000, "master-b", std::slice::from_ref(&reject.version));
    push(&mut b, &mut rt_b, "master-a", vec![accept.clone(), reject.clone()]);
    push(&mut b, &mut rt_b, "master-b", vec![delete.clone()]);

    rt_a.folders.put(Folder::Accepted, "web01", key("mwIDAQAB").bytes());
    let mut a = node_with("master-a", plain(), Loaded::default(), &mut rt_a);
    rounds(("master-a", &mut a, &mut rt_a), ("master-b", &mut b, &mut rt_b));
    // master-b's delete of web02 is a plain tombstone: offered where
    // master-a holds something in its bucket, or pushed as it is made.
    push(&mut a, &mut rt_a, "master-b", vec![reject.clone(), delete.clone()]);

    assert!(refused(&rt_a).is_empty(), "{:#?}", refused(&rt_a));
    // Told once per arrival that brought any, as taken back.
    let told: Vec<(&str, usize)> = rt_a
        .events
        .iter()
        .filter_map(|e| match e {
            Event::TakenBack { from, n, afresh_ms, .. } => {
                assert_eq!(*afresh_ms, NOW_MS, "the first start's time");
                Some((&**from, *n))
            }
            _ => None,
        })
        .collect();
    assert_eq!(told.iter().map(|(_, n)| n).sum::<usize>(), 2, "web01's accept and web02's reject: {told:?}");
    assert!(told.iter().all(|(from, _)| *from == "master-b"));
    let web01 = MinionId::parse("web01").unwrap();
    assert_eq!(a.entry(&web01).map(|e| e.version.clone()), Some(accept.version.clone()), "taken back");
    assert_eq!(rt_a.folders.get(Folder::Accepted, "web01"), Some(&key("mwIDAQAB").bytes().to_vec()));
    assert!(rt_a.folders.get(Folder::Rejected, "web02").is_none());
    assert_eq!(a.digests(), b.digests(), "master-a holds what master-b holds");

    // What names master-a and is newer than its start, it never made: refused still.
    let forged = on("web03", Verdict::Accepted(key("mwIDAQAD")), NOW_MS + 10, "master-a", &[]);
    assert_eq!(push(&mut a, &mut rt_a, "master-b", vec![forged]), 0);
    // So is another content under a version it holds.
    let altered = Decision { verdict: Verdict::Accepted(key("mwIDAQAE")), ..accept.clone() };
    assert_eq!(push(&mut a, &mut rt_a, "master-b", vec![altered]), 0);
    let not_ours = rt_a.events.iter().filter(|e| matches!(e, Event::NotOurs { .. })).count();
    assert_eq!(not_ours, 2, "{:#?}", rt_a.events);
    assert!(rt_a.folders.get(Folder::Accepted, "web03").is_none());
}

/// master-a's clock ran 40 s ahead: master-b took its accept of web02 and
/// its later delete of it (within the 60 s bound), and its clock went along.
/// master-a's time is fixed and its store rebuilt by `recover
/// --from-peers`, which fetched web01 but not the delete (a plain tombstone
/// is offered where the asker holds something in its bucket) and recorded
/// the start afresh after master-b's clock. The delete, stamped after the
/// recovery's wall clock, comes later: taken back all the same; what
/// master-a decides next is stamped after it.
#[test]
fn a_recovered_master_takes_back_what_it_decided_with_its_clock_ahead() {
    let (mut rt_a, mut rt_b) = (Recorder::default(), Recorder::default());
    let mut b = node_with("master-b", plain(), Loaded::default(), &mut rt_b);
    let web01 = on("web01", Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 60_000, "master-a", &[]);
    let web02 = on("web02", Verdict::Accepted(key("mwIDAQAC")), NOW_MS + 30_000, "master-a", &[]);
    let gone = on("web02", Verdict::Deleted, NOW_MS + 40_000, "master-a", std::slice::from_ref(&web02.version));
    push(&mut b, &mut rt_b, "master-a", vec![web01.clone(), web02.clone()]);
    push(&mut b, &mut rt_b, "master-a", vec![gone.clone()]);
    assert!(b.clock() >= gone.version.hlc, "master-b's clock went along");

    // recover --from-peers: the decisions master-b holds, journalled; the start afresh after its clock.
    let journal = b.fetch(&[MinionId::parse("web01").unwrap()], &mut rt_b);
    let afresh = ((b.clock() >> crate::core::version::LOGICAL_BITS) + 1) << crate::core::version::LOGICAL_BITS;
    rt_a.folders.put(Folder::Accepted, "web01", key("mwIDAQAB").bytes());
    let loaded = Loaded { journal, afresh, ..Loaded::default() };
    let mut a = node_with("master-a", plain(), loaded, &mut rt_a);
    assert!(rt_a.events.iter().any(|e| matches!(e, Event::Applied { .. })), "{:#?}", rt_a.events);

    push(&mut a, &mut rt_a, "master-b", vec![gone.clone()]);
    assert!(refused(&rt_a).is_empty(), "{:#?}", refused(&rt_a));
    let taken = rt_a.events.iter().find(|e| matches!(e, Event::TakenBack { .. }));
    assert!(
        matches!(taken, Some(Event::TakenBack { n: 1, first, .. }) if first.as_str() == "web02"),
        "{:#?}",
        rt_a.events
    );
    assert_eq!(a.digests(), b.digests());

    // An operator on master-a rejects web03 now: stamped after all that.
    rt_a.folders.put(Folder::Rejected, "web03", key("mwIDAQAD").bytes());
    a.on_lost("test", now(), &mut rt_a);
    a.on_tick(Now { mono: Instant::now() + Duration::from_secs(1), wall_ms: NOW_MS }, &mut rt_a);
    let web03 = a.entry(&MinionId::parse("web03").unwrap()).unwrap().version.clone();
    assert_eq!(&*web03.node, "master-a");
    assert!(web03.hlc > afresh && web03 > gone.version, "{web03}");
    // Whatever names master-a after the start afresh, it never made.
    let forged = on("web04", Verdict::Accepted(key("mwIDAQAE")), NOW_MS + 50_000, "master-a", &[]);
    assert_eq!(push(&mut a, &mut rt_a, "master-b", vec![forged]), 0);
    assert_eq!(rt_a.events.iter().filter(|e| matches!(e, Event::NotOurs { .. })).count(), 1);
}

/// The window is bounded: a store of an earlier release (it does not say
/// when it started) takes nothing back, nor does a store that started
/// afresh longer than `tombstone_ttl` ago.
#[test]
fn nothing_is_taken_back_without_a_start_afresh_or_long_after_it() {
    let old = on("web01", Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 3_600_000, "master-a", &[]);
    let not_ours = |rt: &Recorder| rt.events.iter().filter(|e| matches!(e, Event::NotOurs { .. })).count();

    let mut rt = Recorder::default();
    let mut a = node_with("master-a", plain(), Loaded { initialized: true, ..Loaded::default() }, &mut rt);
    assert_eq!(push(&mut a, &mut rt, "master-b", vec![old.clone()]), 0);
    assert_eq!(not_ours(&rt), 1, "{:#?}", rt.events);

    let mut rt = Recorder::default();
    let later = Now { mono: Instant::now(), wall_ms: NOW_MS + TTL.as_millis() as u64 + 1 };
    let loaded = Loaded { initialized: true, afresh: NOW_MS << 16, ..Loaded::default() };
    let mut a = node_at("master-a", plain(), loaded, later, &mut rt);
    assert_eq!(a.on_batches(vec![(peer("master-b"), vec![old])], later, &mut rt), vec![0]);
    assert_eq!(not_ours(&rt), 1, "{:#?}", rt.events);
}

/// A compromised peer cannot get a mass delete past the guard by stamping
/// it as this master's own forgotten past: deletes taken back are judged
/// like any peer's (an independent review found them applied at once, no
/// `quiet`, no limit, with every key gone and only `take-back` audited).
#[test]
fn deletes_taken_back_are_judged_by_the_guard() {
    const N: usize = 60;
    let mut rt_a = Recorder::default();
    let names: Vec<String> = (0..N).map(|i| format!("web{i:02}")).collect();
    for name in &names {
        rt_a.folders.put(Folder::Accepted, name, key("mwIDAQAB").bytes());
    }
    let mut a = node_with("master-a", GuardSettings::default(), Loaded::default(), &mut rt_a);
    let forged: Vec<Decision> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let id = MinionId::parse(name).unwrap();
            let claim = a.entry(&id).unwrap().version.clone();
            on(name, Verdict::Deleted, NOW_MS - 1_000 - i as u64, "master-a", &[claim])
        })
        .collect();
    a.on_batches(vec![(peer("master-b"), forged)], now(), &mut rt_a);
    a.on_tick(Now { mono: now().mono + Duration::from_secs(5), wall_ms: NOW_MS + 5_000 }, &mut rt_a);
    let accepted = rt_a.folders.files.keys().filter(|(folder, _)| *folder == Folder::Accepted).count();
    assert_eq!(accepted, N, "every key kept");
    assert_eq!(a.held().count(), N, "held as a mass delete brought by master-b");
    assert_eq!(rt_a.dfn_dropped, 0);
}
