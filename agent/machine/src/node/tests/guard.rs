//! The blast-radius guard (`guard.rs`, `held.rs`) through the real node
//! machine: one master's mass delete is held on the others, whole, across
//! a restart, while everything else flows; an operator's release or revert
//! then does it everywhere.

use super::*;
use crate::core::{Folder, VerdictKind};

const N_KEYS: usize = 300;

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("m{i:03}")).collect()
}

/// The time `secs` seconds after the tests' `now()`.
fn at(base: Instant, secs: f64) -> Now {
    Now { mono: base + Duration::from_secs_f64(secs), wall_ms: NOW_MS + (secs * 1000.0) as u64 }
}

/// A master whose folders hold `n` accepted keys at its agent's first start.
fn master(name: &str, n: usize) -> (Node, Recorder) {
    let mut rt = Recorder::default();
    for id in ids(n) {
        rt.folders.put(Folder::Accepted, &id, PUB.as_bytes());
    }
    let node = node_with(name, GuardSettings::default(), Loaded::default(), &mut rt);
    (node, rt)
}

/// The operator of `origin` deletes `names` with salt-key; returns the
/// decisions its agent sends.
fn delete_on(origin: &mut Node, rt: &mut Recorder, names: &[String], base: Instant, secs: f64) -> Vec<Decision> {
    for name in names {
        rt.folders.remove(Folder::Accepted, name);
    }
    rt.sent.clear();
    origin.on_lost("salt-key", at(base, secs), rt);
    origin.on_tick(at(base, secs + 6.0), rt);
    rt.sent.iter().flat_map(|(_, d)| d.clone()).collect()
}

fn accepted(rt: &Recorder) -> usize {
    rt.folders.files.keys().filter(|(folder, _)| *folder == Folder::Accepted).count()
}

fn count(rt: &Recorder, what: impl Fn(&Event) -> bool) -> usize {
    rt.events.iter().filter(|e| what(e)).count()
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
        b.on_batches(vec![("master-a".into(), piece.to_vec())], at(base, 6.0 + i as f64 * 0.01), &mut rt_b);
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
    b.on_batches(vec![("master-a".into(), vec![reject])], at(base, 31.0), &mut rt_b);
    assert!(rt_b.folders.get(Folder::Rejected, "intruder").is_some(), "rejections are never held");

    // A restart keeps them held, and anti-entropy's offers change nothing.
    let mut b = node_with("master-b", GuardSettings::default(), rt_b.store.loaded(), &mut rt_b);
    assert_eq!(b.held().count(), N_KEYS);
    assert_eq!(count(&rt_b, |e| matches!(e, Event::StillHeld { n: 300, .. })), 1);
    b.on_batches(vec![("master-c".into(), deletes.clone())], at(base, 40.0), &mut rt_b);
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

    // A third master that held them too lets the release through at once.
    let (mut c, mut rt_c) = master("master-c", N_KEYS);
    c.on_batches(vec![("master-a".into(), deletes.clone())], at(base, 6.0), &mut rt_c);
    assert_eq!(c.held().count(), N_KEYS);
    c.on_batches(vec![("master-b".into(), sent)], at(base, 202.0), &mut rt_c);
    assert_eq!(accepted(&rt_c), 0, "released everywhere");
    assert_eq!(c.held().count(), 0);
    let settled = |e: &Event| matches!(e, Event::HeldSettled { how: Settled::By(_), .. });
    assert_eq!(count(&rt_c, settled), N_KEYS);
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
    b.on_batches(vec![("master-a".into(), deletes.clone())], at(base, 6.0), &mut rt_b);
    c.on_batches(vec![("master-a".into(), deletes)], at(base, 6.0), &mut rt_c);
    rt_b.sent.clear();
    let reverted = b.revert_held(None, &[], "alice", at(base, 10.0), &mut rt_b).unwrap();
    assert_eq!(reverted.done.len(), N_KEYS);
    assert_eq!(accepted(&rt_b), N_KEYS, "nothing to write here: the keys are still accepted");
    let sent: Vec<Decision> = rt_b.sent.iter().flat_map(|(_, d)| d.clone()).collect();
    assert!(sent.iter().all(|d| d.verdict.kind() == VerdictKind::Accepted));
    a.on_batches(vec![("master-b".into(), sent.clone())], at(base, 11.0), &mut rt_a);
    assert_eq!(accepted(&rt_a), N_KEYS, "back on the origin");
    assert_eq!(rt_a.folders.files.keys().filter(|(f, _)| *f == Folder::Pending).count(), 0, "adopted");
    c.on_batches(vec![("master-b".into(), sent)], at(base, 11.0), &mut rt_c);
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
    b.on_batches(vec![("master-a".into(), deletes)], at(base, 6.0), &mut rt_b);
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
    b.on_batches(vec![("master-a".into(), deletes)], at(base, 6.0), &mut rt_b);
    assert_eq!(b.held().count(), N_KEYS);
    rt_a.folders.put(Folder::Accepted, "m007", PUB.as_bytes());
    rt_a.sent.clear();
    a.on_lost("salt-key -a", at(base, 20.0), &mut rt_a);
    a.on_tick(at(base, 26.0), &mut rt_a);
    let accept: Vec<Decision> = rt_a.sent.iter().flat_map(|(_, d)| d.clone()).collect();
    assert_eq!(accept.len(), 1);
    b.on_batches(vec![("master-a".into(), accept)], at(base, 27.0), &mut rt_b);
    assert_eq!(b.held().count(), N_KEYS - 1);
    assert!(!rt_b.store.held.contains_key(&MinionId::parse("m007").unwrap()));
    assert_eq!(count(&rt_b, |e| matches!(e, Event::HeldSettled { .. })), 1);
}
