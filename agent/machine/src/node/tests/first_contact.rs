//! First contact (`claims.rs`) through the real node machine and its real
//! anti-entropy: masters that held keys before their agents existed meet,
//! in every order, and end as the rules say, writing only what differs.

use super::*;
use crate::core::{Folder, VerdictKind};

/// One master: its folders, store and audit in memory, and its machine.
struct Master {
    name: &'static str,
    rt: Recorder,
    node: Node,
}

fn id() -> MinionId {
    MinionId::parse("web01").unwrap()
}

/// A master whose folders hold `files` when its agent first starts.
fn master(name: &'static str, files: &[(Folder, &str, &PublicKey)]) -> Master {
    let mut rt = Recorder::default();
    for (folder, name, key) in files {
        rt.folders.put(*folder, name, key.bytes());
    }
    let node = node(name, &mut rt);
    Master { name, rt, node }
}

/// One anti-entropy round of `a`'s link to `b`, as the links run it:
/// digests, the peer's diff, pushes of what `a` has newer, fetches of the rest.
fn round(a: &mut Master, b: &mut Master) {
    let (buckets, summaries) = b.node.diff(&a.node.digests().unwrap(), &mut b.rt);
    let (_, push) = a.node.repair_compare(b.name, &buckets, summaries, &mut a.rt);
    if !push.is_empty() {
        b.node.on_batches(vec![(peer(a.name), push)], now(), &mut b.rt);
    }
    while let Some(fetch) = a.node.repair_next(&peer(b.name)) {
        let decisions = b.node.fetch(&fetch.ids, &mut b.rt);
        a.node.repair_fetched(&peer(b.name), &fetch, decisions, now(), &mut a.rt);
    }
}

/// Rounds between every pair, in the order given, until nothing changes.
fn meet(masters: &mut [Master], order: &[(usize, usize)]) {
    for _ in 0..4 {
        for &(i, j) in order {
            let (a, b) = pair(masters, i, j);
            round(a, b);
        }
    }
}

fn pair(masters: &mut [Master], i: usize, j: usize) -> (&mut Master, &mut Master) {
    assert_ne!(i, j);
    if i < j {
        let (left, right) = masters.split_at_mut(j);
        (&mut left[i], &mut right[0])
    } else {
        let (left, right) = masters.split_at_mut(i);
        (&mut right[0], &mut left[j])
    }
}

/// What a master's folders say for web01: the folder of its accepted or
/// rejected key and which key, or `None`.
fn shows(m: &Master) -> Option<(Folder, Vec<u8>)> {
    [Folder::Accepted, Folder::Rejected]
        .into_iter()
        .find_map(|folder| m.rt.folders.get(folder, "web01").map(|bytes| (folder, bytes.clone())))
}

fn writes(m: &Master) -> usize {
    m.rt.events.iter().filter(|e| matches!(e, Event::Applied { .. } | Event::Kept { wrote: true, .. })).count()
}

/// The files of a master that held `held` for web01.
fn files(held: Option<(Folder, &PublicKey)>) -> Vec<(Folder, &'static str, &PublicKey)> {
    held.map(|(folder, key)| (folder, "web01", key)).into_iter().collect()
}

/// The conflicts `status` shows: the plan's conflict rows, found without
/// making a row of every id.
fn conflicts(m: &Master) -> Vec<crate::node::PlanRow> {
    let conflicts = m.node.conflicts();
    let planned: Vec<_> = m.node.plan(None).into_iter().filter(|row| row.conflict).collect();
    assert_eq!(conflicts, planned, "{}: the plan's conflicts", m.name);
    conflicts
}

/// Every order in which three masters' links can run their rounds.
fn orders() -> Vec<Vec<(usize, usize)>> {
    let links = [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)];
    let mut orders = Vec::new();
    for first in 0..links.len() {
        let mut order = links.to_vec();
        order.rotate_left(first);
        orders.push(order.clone());
        order.reverse();
        orders.push(order);
    }
    orders
}

/// A leftover Salt 3008 temporary file in minions/ at start-up is no minion
/// (found by the simulation, seed 229 of issue 16's run: an agent restarted
/// while a salt-key run was between its mkstemp and its rename).
#[test]
fn a_salt_temporary_file_at_start_up_is_no_minion() {
    let k1 = key("mwIDAQAB");
    let m = master("master-a", &[(Folder::Accepted, "tmpk2_0az9q", &k1), (Folder::Accepted, "web01", &k1)]);
    assert!(m.node.entry(&MinionId::parse("tmpk2_0az9q").unwrap()).is_none(), "{:?}", m.rt.events);
    assert!(m.node.entry(&id()).is_some());
}

/// Masters that already agree write nothing and send nothing: their claims
/// are one and the same, so their digests are equal.
#[test]
fn masters_that_agree_exchange_nothing_and_write_nothing() {
    let k1 = key("mwIDAQAB");
    let mut masters = vec![
        master("master-a", &[(Folder::Accepted, "web01", &k1)]),
        master("master-b", &[(Folder::Accepted, "web01", &k1)]),
        master("master-c", &[(Folder::Accepted, "web01", &k1)]),
    ];
    assert!(masters.windows(2).all(|w| w[0].node.digests() == w[1].node.digests()));
    meet(&mut masters, &orders()[0]);
    for m in &masters {
        assert_eq!(writes(m), 0, "{}: {:?}", m.name, m.rt.events);
        assert!(m.rt.sent.is_empty(), "{} sent {:?}", m.name, m.rt.sent);
        let inventory = m.rt.events.iter().filter(|e| matches!(e, Event::Inventory { .. })).count();
        assert_eq!(inventory, 1, "one inventory record, not one per key");
        assert!(!m.rt.events.iter().any(|e| matches!(e, Event::Decided { .. })), "no per-key record");
    }
}

/// The table of docs/adopting.md, whatever the order the links run in.
#[test]
fn claims_meet_by_one_rule_in_every_order() {
    let (k1, k2) = (key("mwIDAQAB"), key("mwIDAQAC"));
    let accepted = |k: &PublicKey| Some((Folder::Accepted, k.bytes().to_vec()));
    let rejected = |k: &PublicKey| Some((Folder::Rejected, k.bytes().to_vec()));
    let (a, r, p) = (Folder::Accepted, Folder::Rejected, Folder::Pending);
    // What each of three masters held for web01, and what each shows after.
    type Case<'a> = (&'a str, [Option<(Folder, &'a PublicKey)>; 3], [Option<(Folder, Vec<u8>)>; 3]);
    let cases: Vec<Case> = vec![
        (
            "accepted beats absent and pending",
            [Some((a, &k1)), None, Some((p, &k1))],
            [accepted(&k1), accepted(&k1), accepted(&k1)],
        ),
        (
            "a rejection beats an acceptance of the same key",
            [Some((a, &k1)), Some((r, &k1)), None],
            [rejected(&k1), rejected(&k1), rejected(&k1)],
        ),
        (
            "two keys: each keeps its own, a master that held neither trusts neither",
            [Some((a, &k1)), Some((a, &k2)), Some((p, &k2))],
            [accepted(&k1), accepted(&k2), None],
        ),
        (
            "two keys, one of them rejected elsewhere",
            [Some((a, &k1)), Some((r, &k1)), Some((a, &k2))],
            [rejected(&k1), rejected(&k1), accepted(&k2)],
        ),
    ];
    for (what, held, expected) in cases {
        for order in orders() {
            let mut masters = vec![
                master("master-a", &files(held[0])),
                master("master-b", &files(held[1])),
                master("master-c", &files(held[2])),
            ];
            meet(&mut masters, &order);
            let got: Vec<_> = masters.iter().map(shows).collect();
            assert_eq!(got, expected, "{what}, order {order:?}");
            let digests: Vec<_> = masters.iter().map(|m| m.node.digests()).collect();
            assert!(digests.windows(2).all(|w| w[0] == w[1]), "{what}: the masters agree on what they know");
            let two_keys = held.iter().flatten().any(|(_, k)| *k == &k2);
            for m in &masters {
                assert_eq!(conflicts(m).len(), usize::from(two_keys), "{what}, order {order:?}: {}", m.name);
            }
        }
    }
}

/// Two keys are a conflict told once on each master, and a live decision
/// on any master settles it everywhere.
#[test]
fn two_keys_are_told_once_and_settled_by_a_live_decision() {
    let (k1, k2) = (key("mwIDAQAB"), key("mwIDAQAC"));
    let mut masters = vec![
        master("master-a", &[(Folder::Accepted, "web01", &k1)]),
        master("master-b", &[(Folder::Accepted, "web01", &k2)]),
        master("master-c", &[]),
    ];
    meet(&mut masters, &orders()[3]);
    for m in &masters {
        let told = m.rt.events.iter().filter(|e| matches!(e, Event::Conflict { .. })).count();
        assert_eq!(told, 1, "{}: {:?}", m.name, m.rt.events);
        assert!(m.node.replica.unsettled().count() == 1, "{} shows it unsettled", m.name);
        assert_eq!(conflicts(m).iter().map(|row| row.id.clone()).collect::<Vec<_>>(), [id()], "{}", m.name);
    }
    // master-c's operator accepts k2 (the minion's key, checked by hand).
    let c = &mut masters[2];
    c.rt.folders.put(Folder::Accepted, "web01", k2.bytes());
    c.node.on_lost("test", now(), &mut c.rt);
    c.node.on_tick(Now { mono: Instant::now() + Duration::from_secs(6), wall_ms: NOW_MS + 6_000 }, &mut c.rt);
    let live = c.node.entry(&id()).unwrap().clone();
    assert!(!live.version.is_claim(), "a live decision: {:?}", c.rt.events);
    meet(&mut masters, &orders()[0]);
    for m in &masters {
        assert_eq!(shows(m), Some((Folder::Accepted, k2.bytes().to_vec())), "{}", m.name);
        assert_eq!(m.node.replica.unsettled().count(), 0, "{}: settled", m.name);
        assert!(conflicts(m).is_empty(), "{}: settled", m.name);
        let told = m.rt.events.iter().filter(|e| matches!(e, Event::Conflict { .. })).count();
        assert_eq!(told, 1, "{}: no new conflict: the live decision knew both claims", m.name);
    }
}

/// A live decision beats every claim whenever the claim arrives, but a
/// master whose claim rejects the very key accepted live, by a decision
/// that did not know the rejection, keeps its rejection (a conflict).
#[test]
fn a_late_claim_never_overrides_a_live_decision_but_a_rejection_stays() {
    let (k1, k2) = (key("mwIDAQAB"), key("mwIDAQAC"));
    // master-a and master-b run; master-b's operator deletes web01 live.
    let mut masters = vec![
        master("master-a", &[(Folder::Accepted, "web01", &k1)]),
        master("master-b", &[(Folder::Accepted, "web01", &k1)]),
    ];
    let b = &mut masters[1];
    b.rt.folders.remove(Folder::Accepted, "web01");
    b.node.on_lost("test", now(), &mut b.rt);
    b.node.on_tick(Now { mono: Instant::now() + Duration::from_secs(6), wall_ms: NOW_MS + 6_000 }, &mut b.rt);
    assert_eq!(b.node.entry(&id()).unwrap().kind, VerdictKind::Deleted);
    meet(&mut masters, &[(0, 1), (1, 0)]);
    assert_eq!(shows(&masters[0]), None, "the live delete is applied");
    // A stale master joins days later, still holding k1 (and one rejecting k2 later still).
    masters.push(master("master-c", &[(Folder::Accepted, "web01", &k1)]));
    meet(&mut masters, &orders()[5]);
    for m in &masters {
        assert_eq!(shows(m), None, "{}: the stale claim resurrects nothing", m.name);
    }
    // Now a live accept of k2 that no one rejected, and a late master that rejected k2.
    let a = &mut masters[0];
    a.rt.folders.put(Folder::Accepted, "web01", k2.bytes());
    a.node.on_lost("test", now(), &mut a.rt);
    a.node.on_tick(Now { mono: Instant::now() + Duration::from_secs(6), wall_ms: NOW_MS + 7_000 }, &mut a.rt);
    meet(&mut masters, &orders()[1]);
    let mut d = master("master-d", &[(Folder::Rejected, "web01", &k2)]);
    for m in masters.iter_mut() {
        round(&mut d, m);
        round(m, &mut d);
    }
    assert_eq!(shows(&d), Some((Folder::Rejected, k2.bytes().to_vec())), "the rejection stays: {:?}", d.rt.events);
    assert!(d.rt.events.iter().any(|e| matches!(e, Event::Conflict { .. })), "and is told");
    for m in &masters {
        assert_eq!(
            shows(m),
            Some((Folder::Accepted, k2.bytes().to_vec())),
            "{}: the others keep the live accept",
            m.name
        );
        assert!(m.rt.events.iter().any(|e| matches!(e, Event::Conflict { .. })), "{}: told there too", m.name);
    }
}

/// A first start is recorded in steps of `RECONCILE_CHUNK` names; a stop
/// after some of them leaves the store a first start's, so the files not
/// recorded yet are claims at the next start, never live decisions that
/// would beat what the other masters decided.
#[test]
fn a_first_start_cut_short_is_a_first_start_again() {
    let k1 = key("mwIDAQAB");
    let n = super::super::local::RECONCILE_CHUNK + 1;
    let mut rt = Recorder::default();
    for i in 0..n {
        rt.folders.put(Folder::Accepted, &format!("m{i:05}"), k1.bytes());
    }
    rt.faults.records_before_failing = Some(1);
    let cut = node("master-a", &mut rt);
    assert_eq!(cut.len(), n - 1, "one step recorded");
    assert!(!rt.store.initialized, "still a first start");
    drop(cut);
    rt.faults.records_before_failing = None;
    let settings = node("master-a", &mut Recorder::default()).settings.clone();
    let again = Node::start(settings, rt.store.loaded(), now(), &mut rt);
    assert_eq!(again.len(), n);
    assert!(again.entries().all(|(_, e)| e.version.is_claim()), "every file a claim");
    assert!(rt.store.initialized);
}

/// A master joining long after keys it never saw were adopted (first-start
/// claims) and then deleted live: it is sent each claim with the delete that
/// knew it, past `tombstone_ttl`, and must take the delete, not only the
/// claim (found by review: it wrote the old keys, then held their deletes
/// in the guard).
#[test]
fn a_joiner_takes_an_old_delete_of_a_claimed_key_with_the_claim() {
    let ttl_ms = TTL.as_millis() as u64;
    let names: Vec<String> = (0..10).map(|i| format!("old{i}")).collect();
    let keys: Vec<PublicKey> = (0..10).map(|i| key(&format!("mwIDAQA{i}"))).collect();
    let files: Vec<(Folder, &str, &PublicKey)> =
        names.iter().zip(&keys).map(|(n, k)| (Folder::Accepted, n.as_str(), k)).collect();
    let mut b = master("master-b", &files);
    let deletes: Vec<Decision> = names
        .iter()
        .map(|n| {
            let id = MinionId::parse(n).unwrap();
            let claim = b.node.entry(&id).unwrap().version.clone();
            Decision { id, ..decision(Verdict::Deleted, NOW_MS - ttl_ms - 10_000, "master-c", &[claim]) }
        })
        .collect();
    b.node.on_batches(vec![(peer("master-c"), deletes)], now(), &mut b.rt);
    assert!(b.rt.folders.files.is_empty());
    let mut rt = Recorder::default();
    let node = node_with("master-a", GuardSettings::default(), Loaded::default(), &mut rt);
    let mut a = Master { name: "master-a", rt, node };
    round(&mut a, &mut b);
    assert!(a.rt.folders.files.is_empty(), "the joiner shows {} old keys", a.rt.folders.files.len());
    assert_eq!(a.node.held().count(), 0, "and holds no delete in the guard");
    assert_eq!(a.node.digests(), b.node.digests());
}
