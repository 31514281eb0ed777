//! Salt 3008 `salt-key` runs are read once over (`core/settle.rs`), also
//! after lost events: a key between its removal and its rename into place is
//! in no folder, which read too early is a false delete.

use super::*;
use crate::core::Folder;

/// `ms` milliseconds of virtual time after `t0`.
fn ms(t0: Instant, ms: u64) -> Now {
    Now { mono: t0 + Duration::from_millis(ms), wall_ms: NOW_MS + ms }
}

fn fs(node: &mut Node, folder: Folder, name: &str, change: FsChange, at: Now) {
    node.on_fs(&FsEvent { folder, name: name.into(), change }, at);
}

/// Ticks `node` whenever [`Node::poll_at`] says, up to `until` ms after `t0`.
fn tick_until(node: &mut Node, rt: &mut Recorder, t0: Instant, until: u64) {
    for _ in 0..1000 {
        let Some(due) = node.poll_at().filter(|due| *due <= t0 + Duration::from_millis(until)) else { return };
        let due = due.max(t0);
        let wall_ms = NOW_MS + due.duration_since(t0).as_millis() as u64;
        node.on_tick(Now { mono: due, wall_ms }, rt);
    }
    panic!("still due after 1000 ticks");
}

/// The verdicts this node's operators' changes of `id` were read as.
fn decided(rt: &Recorder, id: &str) -> Vec<Verdict> {
    let decided = rt.events.iter().filter_map(|e| match e {
        Event::Decided { decision, found: None } if decision.id.as_str() == id => Some(decision.verdict.clone()),
        _ => None,
    });
    decided.collect()
}

/// The slow part of a Salt 3008 accept of `id` from minions_rejected/: the
/// key is removed at `from` ms and a temporary file made in minions/; the
/// key is written into it 400 ms later (a loaded master).
fn accept_begins(node: &mut Node, rt: &mut Recorder, t0: Instant, from: u64, id: &str, tmp: &str) {
    rt.folders.remove(Folder::Rejected, id);
    fs(node, Folder::Rejected, id, FsChange::Gone, ms(t0, from));
    rt.folders.put(Folder::Accepted, tmp, b"");
    fs(node, Folder::Accepted, tmp, FsChange::Written, ms(t0, from + 1));
    tick_until(node, rt, t0, from + 400);
    rt.folders.put(Folder::Accepted, tmp, key("mwIDAQAB").bytes());
    fs(node, Folder::Accepted, tmp, FsChange::Written, ms(t0, from + 400));
}

/// The end of it, at `at` ms: closed and renamed over the id.
fn accept_ends(node: &mut Node, rt: &mut Recorder, t0: Instant, at: u64, id: &str, tmp: &str) {
    fs(node, Folder::Accepted, tmp, FsChange::Closed, ms(t0, at));
    rt.folders.remove(Folder::Accepted, tmp);
    rt.folders.put(Folder::Accepted, id, key("mwIDAQAB").bytes());
    fs(node, Folder::Accepted, tmp, FsChange::Gone, ms(t0, at + 1));
    fs(node, Folder::Accepted, id, FsChange::MovedIn, ms(t0, at + 1));
}

/// A slow accept of web01 from `from` ms, past the 5 s cap of a wait begun
/// at `t0`: nothing is decided mid-way (5.5 s), and once renamed into
/// place (5.6 s) it is read as the accept it is.
fn slow_accept_is_read_after_its_rename(node: &mut Node, rt: &mut Recorder, t0: Instant, from: u64) {
    accept_begins(node, rt, t0, from, "web01", "tmpzlv7ir2y");
    tick_until(node, rt, t0, 5_500);
    assert_eq!(decided(rt, "web01"), [], "web01 is mid-way: {:?}", rt.events);
    accept_ends(node, rt, t0, 5_600, "web01", "tmpzlv7ir2y");
    tick_until(node, rt, t0, 12_000);
    assert_eq!(decided(rt, "web01"), [Verdict::Accepted(key("mwIDAQAB"))]);
}

/// An inotify overflow lost the end of a Salt 3008 reject (its temporary
/// file's rename over the id): the folders are read once settled, and the
/// temporary file, gone by then, holds nothing. It held every name for
/// `max_hold` (5 s): an accept of another id begun meanwhile was cut short
/// at that cap, its key in no folder, and read as a delete (found by the
/// simulation, seeds 2636 and 9562 of a 10,000-seed run).
#[test]
fn a_temporary_file_whose_end_was_lost_holds_no_later_salt_key_run_to_the_cap() {
    let mut rt = Recorder::default();
    rt.folders.put(Folder::Rejected, "web01", key("mwIDAQAB").bytes());
    rt.folders.put(Folder::Accepted, "web02", key("mwIDAQAC").bytes());
    let mut a = node("master-a", &mut rt);
    let t0 = Instant::now();
    // The operator rejects web02; its rename into place is among the events lost.
    rt.folders.remove(Folder::Accepted, "web02");
    fs(&mut a, Folder::Accepted, "web02", FsChange::Gone, ms(t0, 0));
    rt.folders.put(Folder::Rejected, "tmpgs03c2ca", b"");
    fs(&mut a, Folder::Rejected, "tmpgs03c2ca", FsChange::Written, ms(t0, 1));
    rt.folders.remove(Folder::Rejected, "tmpgs03c2ca");
    rt.folders.put(Folder::Rejected, "web02", key("mwIDAQAC").bytes());
    a.on_lost("inotify queue overflow", ms(t0, 5), &mut rt);
    tick_until(&mut a, &mut rt, t0, 200);
    assert_eq!(decided(&rt, "web02"), [Verdict::Rejected(key("mwIDAQAC"))], "read once settled, not 5 s later");
    // Four seconds on, another operator accepts web01, slowly.
    slow_accept_is_read_after_its_rename(&mut a, &mut rt, t0, 4_000);
}

/// A temporary file a crashed salt-key left behind holds every name the
/// node reads again after lost events, up to `max_hold`; a salt-key run
/// that removes one of them meanwhile is read after its own rename, not at
/// the cap of that earlier wait (its key then in no folder: a false delete).
#[test]
fn a_salt_key_run_begun_while_names_are_held_is_read_after_its_rename() {
    let mut rt = Recorder::default();
    rt.folders.put(Folder::Rejected, "web01", key("mwIDAQAB").bytes());
    rt.folders.put(Folder::Accepted, "tmpleftover", b"");
    let mut a = node("master-a", &mut rt);
    let t0 = Instant::now();
    a.on_lost("inotify queue overflow", ms(t0, 0), &mut rt);
    tick_until(&mut a, &mut rt, t0, 4_500);
    slow_accept_is_read_after_its_rename(&mut a, &mut rt, t0, 4_500);
}

/// An inotify overflow lost a Salt 3008 accept's removal of a pending key,
/// which the node does not hold (pending keys are no decision): no folder
/// lists it and nothing held names it, so the recheck did not either. A
/// peer's first-contact claim for the id arriving mid-run was written at
/// once, into the folder the run was about to rename its key into (found
/// by the simulation, seed 7114). It waits until the recheck has settled
/// (here, until the run is over), then meets the operator's accept, which
/// it does not beat.
#[test]
fn a_peers_decision_waits_for_a_recheck_after_lost_events() {
    let mut rt = Recorder::default();
    rt.folders.put(Folder::Pending, "web01", key("mwIDAQAB").bytes());
    let mut a = node("master-a", &mut rt);
    // master-b holds another key for web01 in minions/ at its first start: a claim.
    let mut rt_b = Recorder::default();
    rt_b.folders.put(Folder::Accepted, "web01", key("mwIDAQAC").bytes());
    let b = node("master-b", &mut rt_b);
    let claim = b.fetch(&[MinionId::parse("web01").unwrap()], &mut rt_b);
    assert!(claim.len() == 1 && claim[0].version.is_claim(), "{claim:?}");
    let t0 = Instant::now();
    // The operator accepts web01; the removal of its pending key is lost.
    rt.folders.remove(Folder::Pending, "web01");
    a.on_lost("inotify queue overflow", ms(t0, 0), &mut rt);
    rt.folders.put(Folder::Accepted, "tmpq0x8lbn2", b"");
    fs(&mut a, Folder::Accepted, "tmpq0x8lbn2", FsChange::Written, ms(t0, 1));
    a.on_batches(vec![(peer("master-b"), claim)], ms(t0, 2), &mut rt);
    tick_until(&mut a, &mut rt, t0, 400);
    assert!(rt.folders.get(Folder::Accepted, "web01").is_none(), "written mid-run: {:?}", rt.events);
    rt.folders.put(Folder::Accepted, "tmpq0x8lbn2", key("mwIDAQAB").bytes());
    fs(&mut a, Folder::Accepted, "tmpq0x8lbn2", FsChange::Written, ms(t0, 400));
    tick_until(&mut a, &mut rt, t0, 550);
    assert!(rt.folders.get(Folder::Accepted, "web01").is_none(), "written mid-run: {:?}", rt.events);
    accept_ends(&mut a, &mut rt, t0, 600, "web01", "tmpq0x8lbn2");
    tick_until(&mut a, &mut rt, t0, 12_000);
    assert_eq!(decided(&rt, "web01"), [Verdict::Accepted(key("mwIDAQAB"))]);
    assert_eq!(rt.folders.get(Folder::Accepted, "web01"), Some(&key("mwIDAQAB").bytes().to_vec()));
    let id = MinionId::parse("web01").unwrap();
    assert_eq!(&*a.entry(&id).unwrap().version.node, "master-a", "the operator's accept holds");
    assert!(a.is_quiet(), "the claim was merged: {:?}", a.waits().collect::<Vec<_>>());
}

/// The same at a start-up that finds a Salt 3008 run half-way (its
/// temporary file listed): the pending key it removed while the agent was
/// stopped is in no folder and not held, and a peer's claim for it waits
/// until the run is over.
#[test]
fn a_peers_decision_waits_for_a_run_found_half_way_at_start_up() {
    let mut rt = Recorder::default();
    rt.folders.put(Folder::Accepted, "tmpq0x8lbn2", b"");
    let mut a = node("master-a", &mut rt);
    let t0 = Instant::now();
    let mut rt_b = Recorder::default();
    rt_b.folders.put(Folder::Accepted, "web01", key("mwIDAQAC").bytes());
    let b = node("master-b", &mut rt_b);
    let claim = b.fetch(&[MinionId::parse("web01").unwrap()], &mut rt_b);
    a.on_batches(vec![(peer("master-b"), claim)], ms(t0, 2), &mut rt);
    tick_until(&mut a, &mut rt, t0, 400);
    assert!(rt.folders.get(Folder::Accepted, "web01").is_none(), "written mid-run: {:?}", rt.events);
    rt.folders.put(Folder::Accepted, "tmpq0x8lbn2", key("mwIDAQAB").bytes());
    fs(&mut a, Folder::Accepted, "tmpq0x8lbn2", FsChange::Written, ms(t0, 400));
    accept_ends(&mut a, &mut rt, t0, 600, "web01", "tmpq0x8lbn2");
    tick_until(&mut a, &mut rt, t0, 12_000);
    assert_eq!(decided(&rt, "web01"), [Verdict::Accepted(key("mwIDAQAB"))]);
    assert_eq!(rt.folders.get(Folder::Accepted, "web01"), Some(&key("mwIDAQAB").bytes().to_vec()));
    assert!(a.is_quiet(), "the claim was merged: {:?}", a.waits().collect::<Vec<_>>());
}

/// A delete made while the agent was stopped, which its start-up found but
/// could not record (syncfs failed: a full disk), is decided at the first
/// reading of the id that succeeds: also when that reading is the new
/// pending key of the minion asking again. The accepted key is gone, and
/// that is the operator's delete, not a misread pending key. (The
/// simulation's checker once took it for one: seed 3993 with every node
/// flooding its peers, `tests/sim/world/operators.rs`.)
#[test]
fn a_delete_made_while_stopped_and_unrecorded_is_decided_at_a_new_pending_keys_reading() {
    let mut rt = Recorder::default();
    rt.folders.put(Folder::Accepted, "web01", key("mwIDAQAB").bytes());
    let web01 = MinionId::parse("web01").unwrap();
    let claim = node("master-a", &mut rt).entry(&web01).unwrap().version.clone();
    assert!(claim.is_claim());
    // Stopped, the operator deletes web01; the restart cannot sync the folders.
    rt.folders.remove(Folder::Accepted, "web01");
    rt.faults.sync = true;
    let t0 = Instant::now();
    let guard = GuardSettings { enabled: false, ..GuardSettings::default() };
    let mut a = node_at("master-a", guard, rt.store.loaded(), ms(t0, 0), &mut rt);
    // The retry after the first backoff (250 ms) fails too.
    tick_until(&mut a, &mut rt, t0, 300);
    let made = |rt: &Recorder| -> Vec<(Verdict, Option<Found>, bool)> {
        let made = rt.events.iter().filter_map(|e| match e {
            Event::Decided { decision, found } if decision.id == web01 => {
                Some((decision.verdict.clone(), *found, decision.context.knows(&claim)))
            }
            _ => None,
        });
        made.collect()
    };
    assert_eq!(made(&rt), [], "nothing recorded yet");
    assert_eq!(a.entry(&web01).unwrap().version, claim);
    // The disk has room again; before the next retry (750 ms) the minion
    // authenticates again and the master writes its new pending key.
    rt.faults.sync = false;
    rt.folders.put(Folder::Pending, "web01", b"");
    fs(&mut a, Folder::Pending, "web01", FsChange::Written, ms(t0, 310));
    rt.folders.put(Folder::Pending, "web01", key("mwIDAQAC").bytes());
    fs(&mut a, Folder::Pending, "web01", FsChange::Written, ms(t0, 315));
    fs(&mut a, Folder::Pending, "web01", FsChange::Closed, ms(t0, 318));
    tick_until(&mut a, &mut rt, t0, 5_000);
    assert_eq!(made(&rt), [(Verdict::Deleted, None, true)], "the delete, once, knowing the accept it ends");
    assert_eq!(rt.folders.get(Folder::Pending, "web01").map(Vec::as_slice), Some(key("mwIDAQAC").bytes()));
    assert!(rt.folders.get(Folder::Accepted, "web01").is_none(), "nothing written back");
    assert!(a.is_quiet(), "{:?}", a.waits().collect::<Vec<_>>());
}
