//! What the node waits on (`waiting.rs`): every write that waits is woken
//! by [`Node::poll_at`] and keeps the node from being quiet; the periodic
//! rescan and compaction are always due and never do.

use super::guard::{accepted, at, burst_held_on_a_full_disk, delete_on, ids, master};
use super::*;
use crate::core::Folder;

/// Ticks `node` whenever [`Node::poll_at`] says, until nothing is due
/// before `until` (virtual time: no test waits).
fn tick_until(node: &mut Node, rt: &mut Recorder, base: Instant, until: f64) {
    for _ in 0..100 {
        let Some(due) = node.poll_at().filter(|due| *due <= base + Duration::from_secs_f64(until)) else { return };
        node.on_tick(at(base, due.saturating_duration_since(base).as_secs_f64()), rt);
    }
    panic!("still due after 100 ticks: {:?}", node.waits().collect::<Vec<_>>());
}

/// `k000000`, `k000001`, …: `n` names, sorted.
fn key_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("k{i:06}")).collect()
}

/// [`key_names`], each with its key in `minions/` of a new runtime.
fn accepted_keys(n: usize) -> (Vec<String>, Recorder) {
    let names = key_names(n);
    let mut rt = Recorder::default();
    for name in &names {
        rt.folders.put(Folder::Accepted, name, PUB.as_bytes());
    }
    (names, rt)
}

/// master-a started on `rt`'s folders at `base`, its guard off (the
/// rescans' tests delete keys as lost events would).
fn started_unguarded(rt: &mut Recorder, base: Instant) -> Node {
    node_at("master-a", GuardSettings { enabled: false, ..Default::default() }, Default::default(), at(base, 0.0), rt)
}

/// Held deletes the store could not keep wait to be written: the node is
/// not quiet until they are (the simulation's checker took it for at rest).
#[test]
fn held_deletes_the_store_could_not_keep_are_not_quiet() {
    const N: usize = 100;
    let base = Instant::now();
    let (mut a, mut rt_a) = master("master-a", N);
    let (mut b, mut rt_b) = master("master-b", N);
    let deletes = delete_on(&mut a, &mut rt_a, &ids(N), base, 0.0);
    rt_b.faults.record = true;
    b.on_batches(vec![(peer("master-a"), deletes)], at(base, 6.0), &mut rt_b);
    assert_eq!((b.held().count(), rt_b.store.held.len()), (N, 0), "held, not kept in the store");
    assert!(!b.is_quiet(), "a write waits: {:?}", b.waits().collect::<Vec<_>>());
    rt_b.faults.record = false;
    tick_until(&mut b, &mut rt_b, base, 10.0);
    assert_eq!(rt_b.store.held.len(), N, "written at the retry");
    assert!(b.is_quiet(), "{:?}", b.waits().collect::<Vec<_>>());
}

/// A peer's decision deferred until an operator's unrecorded change is
/// recorded is merged once it is, also when a later peer's decision did
/// the recording (its arrival found the backoff over before a tick did:
/// the agent handles up to 64 requests in one turn of its loop). It waited
/// for some name to settle, with nothing due before the hourly rescan,
/// which did not merge it either.
#[test]
fn a_decision_deferred_for_a_rescan_is_merged_when_another_arrival_rescanned() {
    let mut rt = Recorder::default();
    rt.folders.put(Folder::Accepted, "web01", key("mwIDAQAB").bytes());
    let mut a = node("master-a", &mut rt);
    let base = Instant::now();
    // The operator deletes web01 while the store cannot commit.
    rt.faults.record = true;
    rt.folders.remove(Folder::Accepted, "web01");
    a.on_fs(&FsEvent { folder: Folder::Accepted, name: "web01".into(), change: FsChange::Gone }, at(base, 0.0));
    a.on_tick(at(base, 1.0), &mut rt);
    rt.faults.record = false;
    // A peer's accept of web01 waits for the delete to be recorded.
    let accept = decision(Verdict::Accepted(key("mwIDAQAB")), NOW_MS + 900, "master-b", &[]);
    a.on_batches(vec![(peer("master-b"), vec![accept])], at(base, 1.01), &mut rt);
    assert!(!a.is_quiet());
    // Another peer's decision, about another id, after the backoff and before a tick.
    let mut other = decision(Verdict::Accepted(key("mwIDAQAC")), NOW_MS + 1_500, "master-c", &[]);
    other.id = MinionId::parse("db01").unwrap();
    a.on_batches(vec![(peer("master-c"), vec![other])], at(base, 2.0), &mut rt);
    assert!(rt.folders.get(Folder::Accepted, "db01").is_some(), "applied, after the rescan recorded the delete");
    tick_until(&mut a, &mut rt, base, 60.0);
    assert!(
        rt.events.iter().any(|e| matches!(e, Event::Superseded { .. } | Event::Conflict { .. })),
        "the deferred accept is merged and meets the delete: {:?}",
        rt.events
    );
    assert!(a.is_quiet(), "{:?}", a.waits().collect::<Vec<_>>());
}

/// Keys put back whose files could not be written are due at once when
/// another write succeeded meanwhile (which ended the backoff): they waited
/// for the held burst's end, or for the hourly rescan.
#[test]
fn keys_put_back_are_written_once_another_write_ended_the_backoff() {
    const N: usize = 20;
    let (base, start) = (Instant::now(), 300.0);
    let (mut b, mut rt_b) = burst_held_on_a_full_disk(N, base, start);
    // A peer's accept of a new key is written.
    let mut accept = decision(Verdict::Accepted(key("mwIDAQAC")), NOW_MS + 312_000, "master-c", &[]);
    accept.id = MinionId::parse("new01").unwrap();
    b.on_batches(vec![(peer("master-c"), vec![accept])], at(base, start + 13.0), &mut rt_b);
    assert!(rt_b.folders.get(Folder::Accepted, "new01").is_some());
    let due = b.poll_at().unwrap();
    assert!(due <= base + Duration::from_secs_f64(start + 13.0), "due now: {:?}", b.waits().collect::<Vec<_>>());
    tick_until(&mut b, &mut rt_b, base, start + 14.0);
    assert_eq!(accepted(&rt_b), N + 1, "every key put back is written");
    assert!(rt_b.store.putting_back.is_empty());
    assert!(b.is_quiet(), "{:?}", b.waits().collect::<Vec<_>>());
}

/// The periodic rescan reads [`RESCAN_STEP`] names per turn of the node, so
/// that peers' decisions and salt-key's changes are taken between two (at
/// 1,000,000 keys, the whole rescan in one turn held the node for tens of
/// seconds every `rescan_interval`). What it finds is recorded at each step.
#[test]
fn the_periodic_rescan_reads_a_step_of_names_per_turn() {
    use super::super::local::RESCAN_STEP;
    let n = 2 * RESCAN_STEP + 10;
    let (names, mut rt) = accepted_keys(n);
    let base = Instant::now();
    let mut node = started_unguarded(&mut rt, base);
    assert_eq!(node.len(), n);
    // Deleted while their events were lost: the first name and the last.
    let (first, last) = (&names[0], &names[n - 1]);
    assert!(rt.folders.remove(Folder::Accepted, first) && rt.folders.remove(Folder::Accepted, last));
    let gone = |node: &Node, name: &str| {
        node.entry(&MinionId::parse(name).unwrap()).is_some_and(|e| e.kind == crate::core::VerdictKind::Deleted)
    };

    let due = base + Duration::from_secs(3601);
    assert!(
        node.waits().any(|w| w.what == Wait::Rescan && w.due.at().is_some_and(|at| at <= due)),
        "the hourly rescan"
    );
    node.on_tick(at(base, 3601.0), &mut rt);
    assert!(gone(&node, first), "the first step found the first name gone");
    assert!(!gone(&node, last), "the last name waits for a later step");
    let (mut turns, mut ticked) = (1, 3601.0);
    while !gone(&node, last) {
        let next = node.poll_at().expect("the rescan's next step is due");
        assert!(next <= at(base, ticked).mono, "the next step is due at once: {:?}", node.waits().collect::<Vec<_>>());
        ticked += 0.001;
        node.on_tick(at(base, ticked), &mut rt);
        turns += 1;
        assert!(turns <= 3, "{n} names take three steps");
    }
    assert_eq!(turns, 3);
    assert!(node.poll_at().is_none_or(|next| next > due + Duration::from_secs(60)), "over until the next rescan");
    let found: usize = rt.events.iter().map(|e| if let Event::RescanFound { n, .. } = e { *n } else { 0 }).sum();
    assert_eq!(found, 2, "each deletion found once: {:?}", rt.events);
}

/// A first start whose store writes failed is recorded by the periodic
/// rescan in one write that marks the store initialized. Read a step at a
/// time, a step's write marked it while later steps' files were still
/// unrecorded: a restart would have taken those for live decisions (found
/// by review).
#[test]
fn a_first_start_left_unrecorded_is_not_marked_initialized_by_one_step() {
    let n = 2 * super::super::local::RESCAN_STEP + 10;
    let mut rt = Recorder::default();
    for i in 0..n {
        rt.folders.put(Folder::Accepted, &format!("k{i:06}"), PUB.as_bytes());
    }
    rt.faults.record = true;
    let base = Instant::now();
    let mut node = started_unguarded(&mut rt, base);
    assert!(!rt.store.initialized, "nothing recorded");
    // The retries fail until the periodic rescan is due, which fails too.
    node.on_tick(at(base, 3601.0), &mut rt);
    assert!(!rt.store.initialized);
    rt.faults.record = false;
    let mut ticked = 3601.0;
    for _ in 0..10 {
        ticked += 0.001;
        node.on_tick(at(base, ticked), &mut rt);
        assert!(
            !rt.store.initialized || rt.store.decisions.len() == n,
            "marked initialized with {} of {n} files recorded",
            rt.store.decisions.len()
        );
    }
    tick_until(&mut node, &mut rt, base, 3700.0);
    assert!(rt.store.initialized && rt.store.decisions.len() == n, "recorded at the retry");
}

/// `n` keys `k000000`, `k000001`, …, one in twenty rejected, the others
/// accepted; `k000001` pending as well.
fn put_keys_one_in_two_folders(rt: &mut Recorder, n: usize) {
    for i in 0..n {
        let folder = if i % 20 == 0 { Folder::Rejected } else { Folder::Accepted };
        rt.folders.put(folder, &format!("k{i:06}"), PUB.as_bytes());
    }
    rt.folders.put(Folder::Pending, "k000001", PUB.as_bytes());
}

/// A scan reads each key where its listing names it: one file for a key in
/// one folder, not one in each of the three (two thirds of the start-up's
/// opens at 1,000,000 keys were of files that were not there). An id held
/// in no folder is read in all three.
#[test]
fn a_scan_reads_each_key_in_the_folders_its_listing_names() {
    let n = 2 * super::super::local::RESCAN_STEP + 10;
    let mut rt = Recorder::default();
    // A key in two folders is read in both.
    put_keys_one_in_two_folders(&mut rt, n);
    let base = Instant::now();
    let mut node = started_unguarded(&mut rt, base);
    assert_eq!(node.len(), n);
    assert_eq!(rt.files_read, n + 1, "each file once at the start");

    // The periodic rescan, in steps; one key's file is gone.
    assert!(rt.folders.remove(Folder::Accepted, "k000003"));
    rt.files_read = 0;
    tick_until(&mut node, &mut rt, base, 3601.0);
    assert_eq!(rt.files_read, n + 1 + 2, "each file once, and the three folders of the one gone");
    let gone = node.entry(&MinionId::parse("k000003").unwrap()).map(|e| e.kind);
    assert_eq!(gone, Some(crate::core::VerdictKind::Deleted));
}

/// A scan names the files it reads next before it reads them (the agent
/// has the kernel read them ahead: `disk/pki/ahead.rs`): a start each
/// chunk's, the next one's while it reads one, each step of the periodic
/// rescan its own, and a whole rescan (after a failed write) and the
/// names read again after lost events as a start.
/// Every file read was named, every file named is read, and no more than
/// two chunks are named ahead; one name settled alone asks for nothing.
#[test]
fn a_scan_names_the_files_it_reads_next_before_it_reads_them() {
    use super::super::local::{RECONCILE_CHUNK, RESCAN_STEP};
    use std::collections::HashSet;
    fn check(log: &[(bool, Folder, String)], ahead: usize) {
        let (mut named, mut read) = (HashSet::new(), HashSet::new());
        for (soon, folder, name) in log {
            if *soon {
                named.insert((*folder, name.clone()));
            } else {
                assert!(named.contains(&(*folder, name.clone())), "{folder:?}/{name} read before it was named");
                read.insert((*folder, name.clone()));
            }
            assert!(named.len() - read.len() <= ahead, "{} named ahead", named.len() - read.len());
        }
        assert_eq!(named, read, "each file named is read");
        assert!(!read.is_empty());
    }
    let n = 2 * RECONCILE_CHUNK + 10;
    let mut rt = Recorder { read_log: Some(Vec::new()), ..Recorder::default() };
    put_keys_one_in_two_folders(&mut rt, n);
    let base = Instant::now();
    let mut node = started_unguarded(&mut rt, base);
    assert_eq!(node.len(), n);
    let log = rt.read_log.replace(Vec::new()).unwrap();
    assert_eq!(log.iter().filter(|(soon, ..)| !soon).count(), n + 1);
    check(&log, 2 * RECONCILE_CHUNK + 1);

    tick_until(&mut node, &mut rt, base, 3601.0);
    let log = rt.read_log.replace(Vec::new()).unwrap();
    assert_eq!(log.iter().filter(|(soon, ..)| !soon).count(), n + 1);
    check(&log, RESCAN_STEP + 1);

    node.rescan("retry after a failed write", at(base, 3602.0), &mut rt);
    let log = rt.read_log.replace(Vec::new()).unwrap();
    assert_eq!(log.iter().filter(|(soon, ..)| !soon).count(), n + 1);
    check(&log, 2 * RECONCILE_CHUNK + 1);

    // Lost events: every name read again once settled, in all three folders.
    node.on_lost("inotify queue overflow", at(base, 3603.0), &mut rt);
    tick_until(&mut node, &mut rt, base, 3610.0);
    let log = rt.read_log.replace(Vec::new()).unwrap();
    assert_eq!(log.iter().filter(|(soon, ..)| !soon).count(), 3 * n);
    check(&log, 3 * 2 * RECONCILE_CHUNK);

    // One file event, the common case: read, nothing asked for.
    rt.folders.put(Folder::Accepted, "web01", PUB.as_bytes());
    node.on_fs(
        &FsEvent { folder: Folder::Accepted, name: "web01".into(), change: FsChange::MovedIn },
        at(base, 3611.0),
    );
    tick_until(&mut node, &mut rt, base, 3620.0);
    let log = rt.read_log.take().unwrap();
    assert!(log.iter().any(|(soon, _, name)| !soon && name == "web01"), "read: {log:?}");
    assert!(log.iter().all(|(soon, ..)| !soon), "nothing named ahead for one name: {log:?}");
}

/// A key moved to another folder between the periodic rescan's listing and
/// its step (`salt-key -r` on an accepted key) is read where it went: a
/// file the listing named that is gone sends the scan to all three
/// folders, and the key is taken for rejected, never for deleted.
#[test]
fn a_key_moved_after_the_rescan_listed_it_is_read_where_it_went() {
    use super::super::local::RESCAN_STEP;
    let n = 2 * RESCAN_STEP + 10;
    let (names, mut rt) = accepted_keys(n);
    let base = Instant::now();
    let mut node = started_unguarded(&mut rt, base);
    node.on_tick(at(base, 3601.0), &mut rt);
    // Listed, not read yet: in the rescan's last step. Its event was lost.
    let moved = &names[n - 1];
    assert!(rt.folders.remove(Folder::Accepted, moved));
    rt.folders.put(Folder::Rejected, moved, PUB.as_bytes());
    tick_until(&mut node, &mut rt, base, 3602.0);
    let kind = node.entry(&MinionId::parse(moved).unwrap()).map(|e| e.kind);
    assert_eq!(kind, Some(crate::core::VerdictKind::Rejected));
    assert!(
        !rt.events.iter().any(|e| matches!(e, Event::Decided { decision, .. } if decision.id.as_str() == moved && decision.verdict.kind() == crate::core::VerdictKind::Deleted)),
        "never taken for deleted: {:?}",
        rt.events
    );
}

/// The periodic rescan's listing can be minutes old by its last step: a
/// key listed only in `minions_pre/`, then accepted by a copy into
/// `minions/` (its pending file left, as Salt 3006's auth leaves it) and
/// recorded from the copy's event, is not taken for deleted by the step
/// that reads it where the old listing put it (found by review: the step
/// read only `minions_pre/`, found a pending key, and decided a delete).
#[test]
fn a_rescan_step_never_undoes_what_an_event_recorded_since_its_listing() {
    use super::super::local::RESCAN_STEP;
    use crate::core::settle::FsChange;
    let n = 2 * RESCAN_STEP + 10;
    let names = key_names(n);
    let mut rt = Recorder::default();
    for name in &names[..n - 1] {
        rt.folders.put(Folder::Accepted, name, PUB.as_bytes());
    }
    let x = &names[n - 1];
    rt.folders.put(Folder::Pending, x, PUB.as_bytes());
    let base = Instant::now();
    let mut node = started_unguarded(&mut rt, base);
    node.on_tick(at(base, 3601.0), &mut rt);
    // Listed in minions_pre/ only; accepted by a copy, heard and recorded
    // before the rescan's last step reads it.
    rt.folders.put(Folder::Accepted, x, PUB.as_bytes());
    node.on_fs(&FsEvent { folder: Folder::Accepted, name: x.clone(), change: FsChange::MovedIn }, at(base, 3601.0));
    let kind = |node: &Node| node.entry(&MinionId::parse(x).unwrap()).map(|e| e.kind);
    let mut t = 3601.0;
    while kind(&node) != Some(crate::core::VerdictKind::Accepted) {
        t += 0.05;
        assert!(t < 3610.0, "the event's read records the accept");
        node.on_tick(at(base, t), &mut rt);
    }
    tick_until(&mut node, &mut rt, base, 3700.0);
    assert_eq!(kind(&node), Some(crate::core::VerdictKind::Accepted), "{:?}", rt.events);
    let deleted = rt.events.iter().any(|e| {
        matches!(e, Event::Decided { decision, .. }
            if decision.id.as_str() == x && decision.verdict.kind() == crate::core::VerdictKind::Deleted)
    });
    assert!(!deleted, "never taken for deleted: {:?}", rt.events);
}

/// A folder the listing left out (refused: replaced by a symlink, another
/// owner's folder) is no empty folder: a scan then reads every name in all
/// three, and a key whose decision that folder would hold is no
/// conclusion, as before (found by review: a first start with
/// `minions_rejected/` refused read each key in `minions/` alone and
/// claimed it accepted, where a read of all three concludes nothing).
#[test]
fn a_scan_whose_listing_left_a_folder_out_reads_all_three() {
    let mut rt = Recorder::default();
    for i in 0..10 {
        rt.folders.put(Folder::Accepted, &format!("k{i:02}"), PUB.as_bytes());
    }
    rt.faults.refused_folder = Some(Folder::Rejected);
    let base = Instant::now();
    let node = started_unguarded(&mut rt, base);
    assert_eq!(rt.files_read, 3 * 10, "every name in all three folders");
    assert_eq!(node.len(), 0, "no claim while minions_rejected/ is refused: {:?}", rt.events);
}
