//! The blast-radius guard (`guard.rs`, `held.rs`) through the real node
//! machine: one master's mass delete is held on the others, whole, across
//! a restart, while everything else flows; an operator's release or revert
//! then does it everywhere.

use super::*;
use crate::core::{Folder, VerdictKind};

const N_KEYS: usize = 300;

pub(super) fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("m{i:03}")).collect()
}

/// The time `secs` seconds after the tests' `now()`.
pub(super) fn at(base: Instant, secs: f64) -> Now {
    Now { mono: base + Duration::from_secs_f64(secs), wall_ms: NOW_MS + (secs * 1000.0) as u64 }
}

/// A master whose folders hold `n` accepted keys at its agent's first start.
pub(super) fn master(name: &str, n: usize) -> (Node, Recorder) {
    let mut rt = Recorder::default();
    for id in ids(n) {
        rt.folders.put(Folder::Accepted, &id, PUB.as_bytes());
    }
    let node = node_with(name, GuardSettings::default(), Loaded::default(), &mut rt);
    (node, rt)
}

/// The operator of `origin` deletes `names` with salt-key; returns the
/// decisions its agent sends.
pub(super) fn delete_on(
    origin: &mut Node,
    rt: &mut Recorder,
    names: &[String],
    base: Instant,
    secs: f64,
) -> Vec<Decision> {
    for name in names {
        rt.folders.remove(Folder::Accepted, name);
    }
    rt.sent.clear();
    origin.on_lost("salt-key", at(base, secs), rt);
    origin.on_tick(at(base, secs + 6.0), rt);
    rt.sent.iter().flat_map(|(_, d)| d.clone()).collect()
}

pub(super) fn accepted(rt: &Recorder) -> usize {
    rt.folders.files.keys().filter(|(folder, _)| *folder == Folder::Accepted).count()
}

fn count(rt: &Recorder, what: impl Fn(&Event) -> bool) -> usize {
    rt.events.iter().filter(|e| what(e)).count()
}

/// The operator of `origin` deletes `names` one at a time, ten seconds apart.
pub(super) fn delete_each(
    origin: &mut Node,
    rt: &mut Recorder,
    names: &[String],
    base: Instant,
    from: f64,
) -> Vec<Decision> {
    names
        .iter()
        .enumerate()
        .flat_map(|(i, name)| delete_on(origin, rt, std::slice::from_ref(name), base, from + i as f64 * 10.0))
        .collect()
}

/// `deletes` reach `node` from master-a one at a time, 1.1 s apart from
/// `start` (`salt-key -D` with salt-master stopped), each tick after `quiet`.
pub(super) fn one_a_second(node: &mut Node, rt: &mut Recorder, deletes: &[Decision], base: Instant, start: f64) {
    for (i, delete) in deletes.iter().enumerate() {
        let t = start + i as f64 * 1.1;
        node.on_batches(vec![(peer("master-a"), vec![delete.clone()])], at(base, t), rt);
        node.on_tick(at(base, t + 1.05), rt);
    }
}

/// Master-b, holding `n` keys, is sent master-a's deletes of all of them
/// one a second from `start` (a slow `salt-key -D`) and its disk fills as
/// the eleventh arrives: the burst is held, and the ten let through before
/// must be put back, but their files cannot be written yet. Returns
/// master-b with its disk writable again.
pub(super) fn burst_held_on_a_full_disk(n: usize, base: Instant, start: f64) -> (Node, Recorder) {
    let (mut a, mut rt_a) = master("master-a", n);
    let (mut b, mut rt_b) = master("master-b", n);
    let deletes = delete_each(&mut a, &mut rt_a, &ids(n), base, 0.0);
    one_a_second(&mut b, &mut rt_b, &deletes[..10], base, start);
    rt_b.faults.apply = true;
    one_a_second(&mut b, &mut rt_b, &deletes[10..11], base, start + 11.0);
    assert_eq!(b.held().count(), 11, "the burst is held, the ten let through too");
    assert_eq!(accepted(&rt_b), n - 10, "their files could not be written yet");
    assert_eq!(rt_b.store.putting_back.len(), 10, "the store lists them");
    rt_b.faults.apply = false;
    (b, rt_b)
}

/// `salt-key -D` on one master: the other keeps every key and drops no
/// `.dfn`, whatever pieces the deletes arrive in; a restart keeps them held;
/// rejections keep flowing; a release then deletes them here.
#[test]
fn a_mass_delete_is_held_whole_and_released_by_an_operator() {
    let base = Instant::now();
    let (mut a, mut rt_a) = master("master-a", N_KEYS);
    let (mut b, mut rt_b) = master("master-b", N_KEYS);
    let deletes = delete_on(&mut a, &mut rt_a, &ids(N_KEYS), base, 0.0);
    assert_eq!(deletes.len(), N_KEYS);
    assert_eq!(count(&rt_a, |e| matches!(e, Event::MassDeleteHere { n: 300, limit: 50 })), 1, "the origin warns");
    // The first pieces are no more than a single delete would be.
    for (i, piece) in deletes.chunks(7).enumerate() {
        b.on_batches(vec![(peer("master-a"), piece.to_vec())], at(base, 6.0 + i as f64 * 0.01), &mut rt_b);
    }
    b.on_tick(at(base, 30.0), &mut rt_b);
    assert_eq!(accepted(&rt_b), N_KEYS, "every key kept");
    assert_eq!(rt_b.dfn_dropped, 0, "no .dfn: nothing was revoked");
    assert_eq!(b.held().count(), N_KEYS);
    assert_eq!(count(&rt_b, |e| matches!(e, Event::DeletesHeld { n: 51, limit: 50, .. })), 1);
    assert!(rt_b.sent.iter().all(|(_, d)| d.iter().all(|d| d.verdict.kind() != VerdictKind::Deleted)), "not forwarded");
    // A rejection from the same origin flows meanwhile.
    let mut reject = deletes[0].clone();
    reject.id = MinionId::parse("intruder").unwrap();
    reject.verdict = crate::core::Verdict::Rejected(key("mwIDAQAC"));
    b.on_batches(vec![(peer("master-a"), vec![reject])], at(base, 31.0), &mut rt_b);
    assert!(rt_b.folders.get(Folder::Rejected, "intruder").is_some(), "rejections are never held");

    // A restart keeps them held, and anti-entropy's offers change nothing.
    let mut b = node_with("master-b", GuardSettings::default(), rt_b.store.loaded(), &mut rt_b);
    assert_eq!(b.held().count(), N_KEYS);
    assert_eq!(count(&rt_b, |e| matches!(e, Event::StillHeld { n: 300, .. })), 1);
    b.on_batches(vec![(peer("master-c"), deletes.clone())], at(base, 40.0), &mut rt_b);
    b.on_tick(at(base, 200.0), &mut rt_b);
    assert_eq!(accepted(&rt_b), N_KEYS, "still every key");

    // The operator releases them: deleted here, and sent knowing the held deletes.
    rt_b.sent.clear();
    let released = b.release_held(Some("master-a"), &[], "root", at(base, 201.0), &mut rt_b).unwrap();
    assert_eq!((released.done.len(), released.retrying.len()), (N_KEYS, 0));
    assert_eq!(accepted(&rt_b), 0);
    assert_eq!(b.held().count(), 0);
    assert!(rt_b.store.held.is_empty(), "the store holds nothing either");
    assert_eq!(rt_b.dfn_dropped, 1, "revoked: the master rotates its key");
    let sent: Vec<Decision> = rt_b.sent.iter().flat_map(|(_, d)| d.clone()).collect();
    assert_eq!(sent.len(), N_KEYS);
    let held_version = |id: &MinionId| deletes.iter().find(|d| d.id == *id).unwrap().version.clone();
    assert!(sent.iter().all(|d| d.context.knows(&held_version(&d.id))), "each release knew what it released");
    let told = |e: &Event| matches!(e, Event::Operator { action: OperatorAction::Release, by, .. } if by == "root");
    assert_eq!(count(&rt_b, told), N_KEYS);

    // A third master that held them too is not released by what a peer
    // sends: b's release is b's mass delete there, held in its turn, until
    // c's own operator releases it.
    let (mut c, mut rt_c) = master("master-c", N_KEYS);
    c.on_batches(vec![(peer("master-a"), deletes.clone())], at(base, 6.0), &mut rt_c);
    assert_eq!(c.held().count(), N_KEYS);
    c.on_batches(vec![(peer("master-b"), sent)], at(base, 202.0), &mut rt_c);
    c.on_tick(at(base, 210.0), &mut rt_c);
    assert_eq!(accepted(&rt_c), N_KEYS, "a peer's release releases nothing here");
    assert_eq!(c.held().count(), N_KEYS);
    assert!(c.held().all(|h| &*h.from == "master-b"), "held now as master-b's deletes");
    let replaced = |e: &Event| matches!(e, Event::HeldSettled { how: Settled::By(_), .. });
    assert_eq!(count(&rt_c, replaced), N_KEYS, "each of a's held deletes told as replaced");
    let released = c.release_held(None, &[], "carol", at(base, 211.0), &mut rt_c).unwrap();
    assert_eq!(released.done.len(), N_KEYS);
    assert_eq!((accepted(&rt_c), c.held().count()), (0, 0), "released by c's operator");
}

/// A peer cannot release what the guard holds here by sending the held
/// deletes again knowing them (an independent review applied 60 that way).
#[test]
fn a_peer_naming_held_deletes_in_its_context_releases_nothing() {
    let base = Instant::now();
    let (mut a, mut rt_a) = master("master-a", N_KEYS);
    let (mut b, mut rt_b) = master("master-b", N_KEYS);
    let deletes = delete_on(&mut a, &mut rt_a, &ids(60), base, 0.0);
    b.on_batches(vec![(peer("master-a"), deletes.clone())], at(base, 6.0), &mut rt_b);
    assert_eq!(b.held().count(), 60);
    // The hostile peer (master-c's certificate) re-issues each delete, newer,
    // knowing the held one, in master-a's name and in its own.
    let forged: Vec<Decision> = deletes
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let mut f = d.clone();
            f.context.add(&d.version);
            f.version = Version::new(d.version.hlc + 1, if i % 2 == 0 { "master-a" } else { "master-c" });
            f
        })
        .collect();
    b.on_batches(vec![(peer("master-c"), forged)], at(base, 7.0), &mut rt_b);
    b.on_tick(at(base, 20.0), &mut rt_b);
    assert_eq!(accepted(&rt_b), N_KEYS, "nothing applied");
    assert_eq!(b.held().count(), 60);
    assert_eq!(count(&rt_b, |e| matches!(e, Event::Operator { .. })), 0);
}

/// Deletes forged in master-a's name by another peer never hold master-a's
/// own: its operator's deletes apply once a is quiet, as without them.
#[test]
fn forged_deletes_never_hold_the_named_masters_own() {
    let base = Instant::now();
    let (mut a, mut rt_a) = master("master-a", N_KEYS);
    let (mut b, mut rt_b) = master("master-b", N_KEYS);
    let real = delete_on(&mut a, &mut rt_a, &ids(3), base, 0.0);
    let forged: Vec<Decision> = (3..60)
        .map(|i| {
            let mut f = real[0].clone();
            f.id = MinionId::parse(&format!("m{i:03}")).unwrap();
            f
        })
        .collect();
    b.on_batches(vec![(peer("master-c"), forged)], at(base, 6.0), &mut rt_b);
    b.on_batches(vec![(peer("master-a"), real)], at(base, 6.1), &mut rt_b);
    b.on_tick(at(base, 8.0), &mut rt_b);
    for id in ids(3) {
        assert!(rt_b.folders.get(Folder::Accepted, &id).is_none(), "{id}: master-a's own delete applied");
    }
    assert_eq!(b.held().count(), 57, "the forged ones are held");
    assert!(b.held().all(|h| &*h.from == "master-c"));
}

/// Decisions naming an origin that is no master of the site are refused,
/// told once per arrival with a count; the others in it are applied.
#[test]
fn made_up_origins_are_refused_once_per_arrival() {
    let base = Instant::now();
    let (mut a, mut rt_a) = master("master-a", N_KEYS);
    let (mut b, mut rt_b) = master("master-b", N_KEYS);
    let real = delete_on(&mut a, &mut rt_a, &ids(1), base, 0.0);
    let mut arrival = real.clone();
    for (i, origin) in ["m61.example", "master-a.", "MASTER-A", "master-e"].iter().enumerate() {
        let mut f = real[0].clone();
        f.id = MinionId::parse(&format!("m{:03}", i + 10)).unwrap();
        f.version = Version::new(f.version.hlc, *origin);
        arrival.push(f);
    }
    b.on_batches(vec![(peer("master-c"), arrival)], at(base, 6.0), &mut rt_b);
    b.on_tick(at(base, 8.0), &mut rt_b);
    assert_eq!(accepted(&rt_b), N_KEYS - 1, "only master-a's delete applied");
    let refused: Vec<&Event> = rt_b.events.iter().filter(|e| matches!(e, Event::UnknownOrigins { .. })).collect();
    assert_eq!(refused.len(), 1, "told once");
    assert!(matches!(refused[0], Event::UnknownOrigins { n: 4, n_origins: 4, origins, .. } if origins.len() == 3));
}

/// A revert on a master that held the deletes puts the keys back on the
/// origin, and settles them on every master that held them.
#[test]
fn a_revert_restores_the_keys_on_the_origin() {
    let base = Instant::now();
    let (mut a, mut rt_a) = master("master-a", N_KEYS);
    let (mut b, mut rt_b) = master("master-b", N_KEYS);
    let (mut c, mut rt_c) = master("master-c", N_KEYS);
    let deletes = delete_on(&mut a, &mut rt_a, &ids(N_KEYS), base, 0.0);
    assert_eq!(accepted(&rt_a), 0);
    // The minions come straight back pending on master-a.
    for id in ids(N_KEYS) {
        rt_a.folders.put(Folder::Pending, &id, PUB.as_bytes());
    }
    b.on_batches(vec![(peer("master-a"), deletes.clone())], at(base, 6.0), &mut rt_b);
    c.on_batches(vec![(peer("master-a"), deletes)], at(base, 6.0), &mut rt_c);
    rt_b.sent.clear();
    let reverted = b.revert_held(None, &[], "alice", at(base, 10.0), &mut rt_b).unwrap();
    assert_eq!(reverted.done.len(), N_KEYS);
    assert_eq!(accepted(&rt_b), N_KEYS, "nothing to write here: the keys are still accepted");
    let sent: Vec<Decision> = rt_b.sent.iter().flat_map(|(_, d)| d.clone()).collect();
    assert!(sent.iter().all(|d| d.verdict.kind() == VerdictKind::Accepted));
    a.on_batches(vec![(peer("master-b"), sent.clone())], at(base, 11.0), &mut rt_a);
    assert_eq!(accepted(&rt_a), N_KEYS, "back on the origin");
    assert_eq!(rt_a.folders.files.keys().filter(|(f, _)| *f == Folder::Pending).count(), 0, "adopted");
    c.on_batches(vec![(peer("master-b"), sent)], at(base, 11.0), &mut rt_c);
    assert_eq!((c.held().count(), accepted(&rt_c)), (0, N_KEYS));
    let told = |e: &Event| matches!(e, Event::Operator { action: OperatorAction::Revert, by, .. } if by == "alice");
    assert_eq!(count(&rt_b, told), N_KEYS);
    assert_eq!(count(&rt_a, |e| matches!(e, Event::Conflict { .. })), 0, "the revert knew the deletes");
}

/// Deleting ten keys is not held: applied once the origin has been quiet
/// for `quiet`, not before.
#[test]
fn a_few_deletes_wait_for_quiet_then_apply() {
    let base = Instant::now();
    let (mut a, mut rt_a) = master("master-a", N_KEYS);
    let (mut b, mut rt_b) = master("master-b", N_KEYS);
    let deletes = delete_on(&mut a, &mut rt_a, &ids(10), base, 0.0);
    b.on_batches(vec![(peer("master-a"), deletes)], at(base, 6.0), &mut rt_b);
    assert_eq!(accepted(&rt_b), N_KEYS, "waiting for the origin to go quiet");
    assert!(!b.is_quiet());
    let due = b.poll_at().unwrap();
    assert!(due <= base + Duration::from_secs(7), "due when the origin has been quiet a second");
    b.on_tick(at(base, 7.0), &mut rt_b);
    assert_eq!(accepted(&rt_b), N_KEYS - 10);
    assert_eq!(b.held().count(), 0);
    assert_eq!(rt_b.dfn_dropped, 1);
    assert_eq!(count(&rt_b, |e| matches!(e, Event::DeletesHeld { .. })), 0);
}

/// A newer decision about a held id settles its held delete: the origin's
/// operator accepts the key again.
#[test]
fn a_newer_decision_settles_a_held_delete() {
    let base = Instant::now();
    let (mut a, mut rt_a) = master("master-a", N_KEYS);
    let (mut b, mut rt_b) = master("master-b", N_KEYS);
    let deletes = delete_on(&mut a, &mut rt_a, &ids(N_KEYS), base, 0.0);
    b.on_batches(vec![(peer("master-a"), deletes)], at(base, 6.0), &mut rt_b);
    assert_eq!(b.held().count(), N_KEYS);
    rt_a.folders.put(Folder::Accepted, "m007", PUB.as_bytes());
    rt_a.sent.clear();
    a.on_lost("salt-key -a", at(base, 20.0), &mut rt_a);
    a.on_tick(at(base, 26.0), &mut rt_a);
    let accept: Vec<Decision> = rt_a.sent.iter().flat_map(|(_, d)| d.clone()).collect();
    assert_eq!(accept.len(), 1);
    b.on_batches(vec![(peer("master-a"), accept)], at(base, 27.0), &mut rt_b);
    assert_eq!(b.held().count(), N_KEYS - 1);
    assert!(!rt_b.store.held.contains_key(&MinionId::parse("m007").unwrap()));
    assert_eq!(count(&rt_b, |e| matches!(e, Event::HeldSettled { .. })), 1);
}

/// `salt-key -D` while salt-master is stopped deletes about one key a
/// second, each waiting on the event bus: every delete passes `quiet` on
/// its own. Once the burst goes past the limit, the deletes let through
/// before are put back from what this master kept, and held with the
/// rest: every key stays here, and `held` and `revert` cover the burst.
#[test]
fn a_mass_delete_at_one_key_a_second_is_held_whole() {
    const N: usize = 20;
    let base = Instant::now();
    let (mut a, mut rt_a) = master("master-a", N);
    let (mut b, mut rt_b) = master("master-b", N);
    let deletes = delete_each(&mut a, &mut rt_a, &ids(N), base, 0.0);
    assert_eq!(deletes.len(), N);
    let start = 300.0;
    one_a_second(&mut b, &mut rt_b, &deletes, base, start);
    b.on_tick(at(base, start + 200.0), &mut rt_b);
    assert_eq!(accepted(&rt_b), N, "every key is here, the first ones put back");
    assert_eq!(b.held().count(), N, "the whole burst is held");
    assert_eq!(rt_b.store.held.len(), N, "and kept in the store");
    let put_back = |e: &Event| matches!(e, Event::PutBack { held, .. } if &*held.from == "master-a");
    assert_eq!(count(&rt_b, put_back), 10, "each key put back is told");
    let tripped = |e: &Event| matches!(e, Event::DeletesHeld { n: 11, limit: 10, .. });
    assert_eq!(count(&rt_b, tripped), 1, "the burst held counts the keys put back");
    // A restart keeps the burst held with every key in place.
    let mut b = node_with("master-b", GuardSettings::default(), rt_b.store.loaded(), &mut rt_b);
    b.on_tick(at(base, start + 300.0), &mut rt_b);
    assert_eq!((b.held().count(), accepted(&rt_b)), (N, N));
    // Anti-entropy offering the deletes again changes nothing.
    b.on_batches(vec![(peer("master-a"), deletes.clone())], at(base, start + 301.0), &mut rt_b);
    b.on_tick(at(base, start + 400.0), &mut rt_b);
    assert_eq!((b.held().count(), accepted(&rt_b)), (N, N));
    // One revert covers the whole burst: every key accepted again on the origin.
    rt_b.sent.clear();
    let reverted = b.revert_held(Some("master-a"), &[], "root", at(base, start + 401.0), &mut rt_b).unwrap();
    assert_eq!(reverted.done.len(), N, "{reverted:?}");
    let sent: Vec<Decision> = rt_b.sent.iter().flat_map(|(_, d)| d.clone()).collect();
    a.on_batches(vec![(peer("master-b"), sent)], at(base, start + 402.0), &mut rt_a);
    assert_eq!(accepted(&rt_a), N, "back on the origin");
}

/// Keys put back whose files cannot be written (a full disk) are listed in
/// the store: a rescan meanwhile does not read their absence as this
/// master's own deletes, and the next start writes them.
#[test]
fn keys_put_back_are_written_after_a_full_disk_and_a_restart() {
    const N: usize = 20;
    let (base, start) = (Instant::now(), 300.0);
    let (mut b, mut rt_b) = burst_held_on_a_full_disk(N, base, start);
    rt_b.faults.apply = true;
    rt_b.sent.clear();
    b.on_lost("overflow", at(base, start + 20.0), &mut rt_b);
    b.on_tick(at(base, start + 30.0), &mut rt_b);
    assert!(rt_b.sent.is_empty(), "their absence is not master-b's own delete: {:?}", rt_b.sent);
    rt_b.faults.apply = false;
    let b = node_with("master-b", GuardSettings::default(), rt_b.store.loaded(), &mut rt_b);
    assert_eq!((accepted(&rt_b), b.held().count()), (N, 11), "written at the next start");
    assert!(rt_b.store.putting_back.is_empty());
    assert!(rt_b.sent.is_empty(), "nothing decided by the start either: {:?}", rt_b.sent);
}

/// A delete let through that did not know the accept it replaced was a
/// conflict, told when it was applied: it is not put back (it would be
/// told again when applied for good), the rest of the burst is.
#[test]
fn a_concurrent_delete_let_through_is_not_put_back() {
    const N: usize = 20;
    let base = Instant::now();
    let (mut a, mut rt_a) = master("master-a", N);
    let (mut b, mut rt_b) = master("master-b", N);
    // master-b's operator replaces m000's key; master-a never hears of it.
    rt_b.folders.put(Folder::Accepted, "m000", PUB.replace("mwIDAQAB", "mwIDAQAC").as_bytes());
    b.on_lost("salt-key", at(base, 1.0), &mut rt_b);
    b.on_tick(at(base, 7.0), &mut rt_b);
    // master-a deletes every key, m000 last (newer than master-b's accept).
    let names = ids(N);
    let mut deletes = delete_each(&mut a, &mut rt_a, &names[1..], base, 10.0);
    deletes.insert(0, delete_on(&mut a, &mut rt_a, &names[..1], base, 250.0).remove(0));
    one_a_second(&mut b, &mut rt_b, &deletes, base, 300.0);
    let m000 = MinionId::parse("m000").unwrap();
    let conflicts = |rt: &Recorder| count(rt, |e| matches!(e, Event::Conflict { conflict, .. } if conflict.id == m000));
    assert_eq!(conflicts(&rt_b), 1, "told when applied");
    assert!(!b.held().any(|h| h.decision.id == m000), "not put back");
    assert_eq!((b.held().count(), accepted(&rt_b)), (N - 1, N - 1), "the rest is");
}

/// The hold's end tells the whole burst, the deletes put back included.
#[test]
fn the_end_of_a_slow_burst_counts_the_keys_put_back() {
    const N: usize = 20;
    let base = Instant::now();
    let (mut a, mut rt_a) = master("master-a", N);
    let (mut b, mut rt_b) = master("master-b", N);
    let deletes = delete_each(&mut a, &mut rt_a, &ids(N), base, 0.0);
    one_a_second(&mut b, &mut rt_b, &deletes, base, 300.0);
    b.on_tick(at(base, 500.0), &mut rt_b);
    let ended: Vec<usize> =
        rt_b.events.iter().filter_map(|e| if let Event::HoldEnded { n, .. } = e { Some(*n) } else { None }).collect();
    assert_eq!(ended, [N], "the ten put back and the ten held as they came");
}

/// A delete held as forwarded by another peer, given back when its origin
/// sent it too (to be judged with the origin's own deletes) while the store
/// could not drop it, leaves the store with the next write: a restart does
/// not hold it again. Found by the simulation's audit records (seeds 138,
/// 139 and 267): the restart held it again and told its end a second time.
#[test]
fn a_delete_given_back_leaves_the_store_after_a_failed_write() {
    const N: usize = 20;
    let base = Instant::now();
    let (mut a, mut rt_a) = master("master-a", N);
    let (mut b, mut rt_b) = master("master-b", N);
    let deletes = delete_on(&mut a, &mut rt_a, &ids(N), base, 0.0);
    b.on_batches(vec![(peer("master-c"), deletes.clone())], at(base, 10.0), &mut rt_b);
    assert_eq!((b.held().count(), rt_b.store.held.len()), (N, N), "forwarded past the limit: held");
    let id = deletes[0].id.clone();
    rt_b.faults.record = true;
    b.on_batches(vec![(peer("master-a"), vec![deletes[0].clone()])], at(base, 11.0), &mut rt_b);
    let given_back =
        |e: &Event| matches!(e, Event::HeldSettled { held, how: Settled::Rejudged } if held.decision.id == id);
    assert_eq!(count(&rt_b, given_back), 1);
    assert!(b.held().all(|h| h.decision.id != id) && rt_b.store.held.contains_key(&id), "given back; the write failed");
    rt_b.faults.record = false;
    b.on_tick(at(base, 100.0), &mut rt_b);
    assert_eq!(rt_b.store.held.len(), N - 1, "the next write drops it: {:?}", rt_b.store.held.get(&id));
    let b = node_with("master-b", GuardSettings::default(), rt_b.store.loaded(), &mut rt_b);
    assert_eq!(b.held().count(), N - 1, "not held again at the next start");
    assert_eq!(count(&rt_b, |e| matches!(e, Event::HeldSettled { held, .. } if held.decision.id == id)), 1);
}
