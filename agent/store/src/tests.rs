//! The store against a temporary folder: what survives reopening, claims,
//! and the list of plain tombstones.

use super::tombstones::tombstone_row;
use super::*;
use crate::core::{Context, PublicKey, Verdict, Version};
use keysync_machine::testkit::PUB;

/// The wall clock when the stores of these tests are made.
const NOW_MS: u64 = 1_700_000_000_000;

fn decision(id: &str, verdict: Verdict, hlc: u64, knew: Option<Version>) -> Decision {
    Decision {
        id: MinionId::parse(id).unwrap(),
        verdict,
        version: Version::new(hlc, "a"),
        context: Context::new(knew),
        relays: Default::default(),
        reached: Default::default(),
    }
}

#[test]
fn records_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let key = PublicKey::new(PUB.as_bytes());
    let accepted = decision("web01", Verdict::Accepted(key.clone()), 7, None);
    let deleted = decision("web02", Verdict::Deleted, 9, Some(Version::new(3, "b")));
    let pending = decision("web03", Verdict::Rejected(key.clone()), 11, None);
    let older = decision("web01", Verdict::Rejected(key), 5, None);
    let conflict =
        crate::core::merge::Conflict { id: accepted.id.clone(), winner: accepted.seen(), loser: older.seen() };
    {
        let store = Store::open(dir.path(), "a", NOW_MS).unwrap();
        assert!(!store.load().unwrap().initialized);
        // A step of a first start: recorded, but still a first start.
        let step = StoreWrite { decisions: std::slice::from_ref(&deleted), clock: 5, ..StoreWrite::default() };
        store.record(&step, "a").unwrap();
        let stepped = store.load().unwrap();
        assert!(!stepped.initialized);
        // A plain tombstone: counted, not loaded into memory.
        assert_eq!((stepped.entries.len(), stepped.cold.iter().sum::<u32>()), (0, 1));
        store.journal(std::slice::from_ref(&pending)).unwrap();
        store.journal(std::slice::from_ref(&accepted)).unwrap();
        let kept = vec![keysync_machine::node::Kept { id: accepted.id.clone(), seen: vec![older.seen()], mine: None }];
        let conflicts = vec![(keysync_machine::testkit::peer("b"), conflict.clone())];
        let write = StoreWrite {
            decisions: &[accepted.clone(), deleted.clone()],
            kept: &kept,
            conflicts: &conflicts,
            done: std::slice::from_ref(&accepted.id),
            clock: 99,
            initialize: true,
            ..StoreWrite::default()
        };
        store.record(&write, "a").unwrap();
    }
    let store = Store::open(dir.path(), "a", NOW_MS).unwrap();
    let loaded = store.load().unwrap();
    assert!(loaded.initialized);
    assert_eq!(loaded.clock, 99);
    assert_eq!(loaded.journal, vec![pending]);
    assert_eq!((loaded.entries.len(), loaded.cold.iter().sum::<u32>()), (1, 1));
    let web01 = loaded.entries.iter().find(|(id, _)| *id == accepted.id).unwrap();
    assert_eq!(web01.1.seen().to_vec(), vec![older.seen()], "what was seen is kept with the decision");
    assert_eq!(loaded.untold, vec![(keysync_machine::testkit::peer("b"), conflict)]);
    assert_eq!(store.get(&[accepted.id.clone(), deleted.id.clone()]).unwrap(), vec![accepted, deleted]);
    store.record(&StoreWrite { conflicts_told: true, clock: 99, ..StoreWrite::default() }, "a").unwrap();
    assert!(store.load().unwrap().untold.is_empty(), "told conflicts are forgotten");
}

/// Claims keep their keys after a live decision displaces them, or when
/// learnt below another: what a master shows may come to be one of them.
#[test]
fn claims_are_kept_with_their_keys() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), "a", NOW_MS).unwrap();
    let key = PublicKey::new(PUB.as_bytes());
    let claim = |rejected: bool| Decision {
        version: Version::claim(rejected, &key.fingerprint().0),
        verdict: if rejected { Verdict::Rejected(key.clone()) } else { Verdict::Accepted(key.clone()) },
        ..decision("web01", Verdict::Deleted, 0, None)
    };
    let (own, other) = (claim(false), claim(true));
    let kept = |mine: &Decision| {
        vec![keysync_machine::node::Kept { id: own.id.clone(), seen: vec![], mine: Some(mine.version.clone()) }]
    };
    // This master's own claim is held; another master's claim of the same key is learnt below it... or above.
    let (low, high) = if own.version < other.version { (&own, &other) } else { (&other, &own) };
    let write = StoreWrite { decisions: std::slice::from_ref(high), kept: &kept(&own), ..StoreWrite::default() };
    store.record(&write, "a").unwrap();
    let write = StoreWrite { claims: std::slice::from_ref(low), kept: &kept(&own), ..StoreWrite::default() };
    store.record(&write, "a").unwrap();
    // A live delete displaces the held claim.
    let live = decision("web01", Verdict::Deleted, 1 << 50, None);
    let write = StoreWrite { decisions: std::slice::from_ref(&live), kept: &kept(&own), ..StoreWrite::default() };
    store.record(&write, "a").unwrap();
    let mut known = store.get(std::slice::from_ref(&own.id)).unwrap();
    known.sort_by(|a, b| a.version.cmp(&b.version));
    let mut want = vec![own.clone(), other.clone(), live.clone()];
    want.sort_by(|a, b| a.version.cmp(&b.version));
    assert_eq!(known, want, "the live decision and both claims, with their keys");
    drop(store);
    let loaded = Store::open(dir.path(), "a", NOW_MS).unwrap().load().unwrap();
    let (_, entry) = &loaded.entries[0];
    assert_eq!((entry.version.clone(), entry.mine().cloned()), (live.version, Some(own.version)));
}

/// Plain tombstones are listed by bucket, left out of what a start
/// loads into memory, read back by id or by bucket, and compacted once
/// old; a store of an earlier release gets its list at start-up.
#[test]
fn plain_tombstones_are_listed_read_back_and_compacted() {
    let dir = tempfile::tempdir().unwrap();
    let key = PublicKey::new(PUB.as_bytes());
    let old = decision("gone-old", Verdict::Deleted, 1_000 << 16, None);
    let young = decision("gone-young", Verdict::Deleted, 9_000 << 16, None);
    let accepted = decision("web01", Verdict::Accepted(key.clone()), 5_000 << 16, None);
    // A delete with a claim known is no plain tombstone: it stays in memory.
    let claimed = decision("claimed", Verdict::Deleted, 2_000 << 16, None);
    let claim = Decision {
        version: Version::claim(false, &key.fingerprint().0),
        verdict: Verdict::Accepted(key.clone()),
        ..decision("claimed", Verdict::Deleted, 0, None)
    };
    let kept = vec![keysync_machine::node::Kept { id: claimed.id.clone(), seen: vec![claim.seen()], mine: None }];
    let store = Store::open(dir.path(), "a", NOW_MS).unwrap();
    let decisions = [old.clone(), young.clone(), accepted.clone(), claimed.clone()];
    store.record(&StoreWrite { decisions: &decisions, kept: &kept, ..StoreWrite::default() }, "a").unwrap();
    let loaded = store.load().unwrap();
    let mut in_memory: Vec<&str> = loaded.entries.iter().map(|(id, _)| id.as_str()).collect();
    in_memory.sort();
    assert_eq!(in_memory, vec!["claimed", "web01"]);
    assert_eq!(loaded.cold.iter().sum::<u32>(), 2);
    assert_eq!(loaded.cold[bucket_of(&old.id)], 1 + u32::from(bucket_of(&old.id) == bucket_of(&young.id)));
    let cold = store.cold(&[old.id.clone(), accepted.id.clone(), claimed.id.clone()]).unwrap();
    assert_eq!(cold, vec![(old.id.clone(), old.entry())]);
    let bucket = bucket_of(&young.id) as u32;
    assert!(store.cold_in(&[bucket]).unwrap().contains(&(young.id.clone(), young.version.clone())));
    // An accept over a tombstone takes it off the list.
    let back = decision("gone-young", Verdict::Accepted(key), 10_000 << 16, None);
    store.record(&StoreWrite { decisions: std::slice::from_ref(&back), ..StoreWrite::default() }, "a").unwrap();
    assert!(store.cold_in(&[bucket]).unwrap().iter().all(|(id, _)| *id != young.id));
    store.record(&StoreWrite { decisions: std::slice::from_ref(&young), ..StoreWrite::default() }, "a").unwrap();
    // Compaction: only the old one, and not while it is journalled.
    store.journal(std::slice::from_ref(&old)).unwrap();
    assert_eq!(store.compact(5_000, 10).unwrap(), Vec::<MinionId>::new());
    store.record(&StoreWrite { done: std::slice::from_ref(&old.id), ..StoreWrite::default() }, "a").unwrap();
    assert_eq!(store.compact(5_000, 10).unwrap(), vec![old.id.clone()]);
    assert!(store.get(std::slice::from_ref(&old.id)).unwrap().is_empty());
    assert_eq!(store.load().unwrap().cold.iter().sum::<u32>(), 1);
    // A store of an earlier release (no list): listed when loaded at
    // start-up, the plain tombstones only.
    let txn = store.db.begin_write().unwrap();
    txn.delete_table(TOMBSTONES).unwrap();
    txn.commit().unwrap();
    drop(store);
    let store = Store::open(dir.path(), "a", NOW_MS).unwrap();
    store.load().unwrap();
    let all: Vec<u32> = (0..N_BUCKETS as u32).collect();
    assert_eq!(store.cold_in(&all).unwrap(), vec![(young.id.clone(), young.version.clone())]);
    // An earlier release run after this one (a downgrade) accepts the key
    // again without unlisting it: the list is made again at the next
    // start-up, and a compaction never removes the accept anyway.
    let again = decision("gone-young", Verdict::Accepted(PublicKey::new(PUB.as_bytes())), 11_000 << 16, None);
    let txn = store.db.begin_write().unwrap();
    let record = codec::encode_record(&again, &[], None);
    txn.open_table(DECISIONS).unwrap().insert(again.id.as_str(), record.as_slice()).unwrap();
    txn.commit().unwrap();
    assert_eq!(store.compact(u64::MAX, 10).unwrap(), Vec::<MinionId>::new(), "a stale row is no tombstone");
    assert!(store.get(std::slice::from_ref(&again.id)).unwrap().contains(&again));
    assert!(store.cold_in(&all).unwrap().is_empty(), "and the stale row is gone");
    let txn = store.db.begin_write().unwrap();
    let (key, value) = tombstone_row(&young);
    txn.open_table(TOMBSTONES).unwrap().insert(key.as_slice(), value.as_slice()).unwrap();
    txn.commit().unwrap();
    drop(store);
    let store = Store::open(dir.path(), "a", NOW_MS).unwrap();
    store.load().unwrap();
    assert!(store.cold_in(&all).unwrap().is_empty(), "listed again at start-up");
}

/// The list follows what each write makes of a tombstone: a claim learnt
/// for its id takes it off (it is no plain tombstone then, and must not
/// be compacted); `cold_in` gives a bucket's own only; a held delete of
/// an id keeps its tombstone from compaction.
#[test]
fn the_tombstone_list_follows_claims_and_held_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), "a", NOW_MS).unwrap();
    let key = PublicKey::new(PUB.as_bytes());
    // Two deletes in different buckets.
    let ids: Vec<String> = (0..50).map(|i| format!("gone{i}")).collect();
    let first = MinionId::parse(&ids[0]).unwrap();
    let other = ids.iter().find(|id| bucket_of(&MinionId::parse(id).unwrap()) != bucket_of(&first)).unwrap();
    let (a, b) =
        (decision(&ids[0], Verdict::Deleted, 1_000 << 16, None), decision(other, Verdict::Deleted, 1_000 << 16, None));
    store.record(&StoreWrite { decisions: &[a.clone(), b.clone()], ..StoreWrite::default() }, "a").unwrap();
    let in_a = store.cold_in(&[bucket_of(&a.id) as u32]).unwrap();
    assert_eq!(in_a, vec![(a.id.clone(), a.version.clone())], "only the bucket asked for");
    // A claim learnt for a's id, kept with its delete (a kept-only write).
    let claim = Decision {
        version: Version::claim(false, &key.fingerprint().0),
        verdict: Verdict::Accepted(key.clone()),
        ..decision(&ids[0], Verdict::Deleted, 0, None)
    };
    let kept = vec![keysync_machine::node::Kept { id: a.id.clone(), seen: vec![claim.seen()], mine: None }];
    let write = StoreWrite { claims: std::slice::from_ref(&claim), kept: &kept, ..StoreWrite::default() };
    store.record(&write, "a").unwrap();
    assert!(store.cold_in(&[bucket_of(&a.id) as u32]).unwrap().is_empty(), "no plain tombstone any more");
    assert!(store.cold(std::slice::from_ref(&a.id)).unwrap().is_empty());
    // b held by the guard (its delete of an accepted key, say): not compacted.
    let held = keysync_machine::node::HeldDelete {
        decision: b.clone(),
        from: keysync_machine::testkit::peer("b"),
        since_ms: 0,
    };
    store.record(&StoreWrite { held: std::slice::from_ref(&held), ..StoreWrite::default() }, "a").unwrap();
    assert!(store.compact(u64::MAX, 10).unwrap().is_empty(), "a's is no tombstone, b's is held");
    store.record(&StoreWrite { unheld: std::slice::from_ref(&b.id), ..StoreWrite::default() }, "a").unwrap();
    assert_eq!(store.compact(u64::MAX, 10).unwrap(), vec![b.id.clone()]);
    assert_eq!(store.get(std::slice::from_ref(&a.id)).unwrap().len(), 2, "a's delete and claim stay");
}

/// A new store starts afresh when it is made (a first start, a purge and
/// reinstall); `recover` records a later time; reopening keeps it; a store
/// of an earlier release says nothing (0) (issue 28 item 4).
#[test]
fn a_new_store_says_when_it_started_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), "a", NOW_MS).unwrap();
    let made = store.load().unwrap().afresh;
    assert_eq!(made, NOW_MS << 16);
    store.set_afresh(made + (60_000 << 16)).unwrap();
    drop(store);
    let store = Store::open(dir.path(), "a", NOW_MS).unwrap();
    assert_eq!(store.load().unwrap().afresh, made + (60_000 << 16));
    // An earlier release's store has no such record.
    let txn = store.db.begin_write().unwrap();
    txn.open_table(META).unwrap().remove(META_AFRESH).unwrap();
    txn.commit().unwrap();
    assert_eq!(store.load().unwrap().afresh, 0);
}

#[test]
fn refuses_another_nodes_state() {
    let dir = tempfile::tempdir().unwrap();
    Store::open(dir.path(), "a", NOW_MS)
        .unwrap()
        .record(&StoreWrite { initialize: true, ..StoreWrite::default() }, "a")
        .unwrap();
    let err = Store::open(dir.path(), "b", NOW_MS).err().unwrap();
    assert!(err.to_string().contains("belongs to node \"a\", not \"b\""), "{err}");
}

/// What a later release writes into `meta` when it marks the store as its
/// own (format 3 here): the format's number, the release, the first
/// release that reads it.
fn mark_as_written_by(dir: &std::path::Path, number: u32, release: &str) {
    let db = redb::Database::create(dir.join("state.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut meta = txn.open_table(META).unwrap();
        meta.insert("format", number.to_be_bytes().as_slice()).unwrap();
        meta.insert("format_written_by", release.as_bytes()).unwrap();
        meta.insert("format_read_since", release.as_bytes()).unwrap();
    }
    txn.commit().unwrap();
}

fn meta_text(dir: &std::path::Path, key: &str) -> Option<Vec<u8>> {
    let db = redb::Database::create(dir.join("state.redb")).unwrap();
    let txn = db.begin_read().unwrap();
    let meta = txn.open_table(META).unwrap();
    let value = meta.get(key).unwrap().map(|v| v.value().to_vec());
    value
}

/// Issue 29 item 5: a release that finds a store of a newer format refuses
/// it before it writes anything, naming the release that wrote it, its own,
/// and the way out (0.1.0 called 0.2.0's store corrupt, and its advice,
/// `recover`, was the only way it gave).
#[test]
fn a_store_of_a_newer_format_is_refused_naming_both_releases_and_the_way_out() {
    let dir = tempfile::tempdir().unwrap();
    let accepted = decision("web01", Verdict::Accepted(PublicKey::new(PUB.as_bytes())), 7, None);
    Store::open(dir.path(), "a", NOW_MS)
        .unwrap()
        .record(
            &StoreWrite { decisions: std::slice::from_ref(&accepted), initialize: true, ..StoreWrite::default() },
            "a",
        )
        .unwrap();
    mark_as_written_by(dir.path(), 3, "0.3.0");
    let err = match Store::open(dir.path(), "a", NOW_MS) {
        Ok(_) => panic!("a store of format 3 was opened by a release that reads format 2"),
        Err(e) => e.to_string(),
    };
    for said in [
        "format 3",
        "written by salt-keysync 0.3.0",
        env!("CARGO_PKG_VERSION"),
        "install salt-keysync 0.3.0 or later",
        "recover --from-peers",
    ] {
        assert!(err.contains(said), "no {said:?} in: {err}");
    }
    assert_eq!(meta_text(dir.path(), "format"), Some(3u32.to_be_bytes().to_vec()), "the store was changed");
}

/// A store of 0.1.0 (no format recorded) is read and becomes this release's
/// format; `state.format` beside it says so in plain text, for the package
/// scripts, mode 0600.
#[test]
fn a_store_records_its_format_and_says_it_in_plain_text_beside() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    Store::open(dir.path(), "a", NOW_MS).unwrap();
    let txn_dir = dir.path();
    {
        let db = redb::Database::create(txn_dir.join("state.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        for key in ["format", "format_written_by", "format_read_since"] {
            txn.open_table(META).unwrap().remove(key).unwrap();
        }
        txn.commit().unwrap();
    }
    let _ = std::fs::remove_file(dir.path().join("state.format"));
    Store::open(dir.path(), "a", NOW_MS).unwrap();
    assert_eq!(meta_text(dir.path(), "format"), Some(2u32.to_be_bytes().to_vec()));
    assert_eq!(meta_text(dir.path(), "format_written_by"), Some(env!("CARGO_PKG_VERSION").as_bytes().to_vec()));
    let text = std::fs::read_to_string(dir.path().join("state.format")).expect("state.format beside the store");
    assert!(text.contains("\nformat 2\n") && text.contains("\nread-since 0.2.0\n"), "{text}");
    assert!(text.contains(&format!("\nwritten-by {}\n", env!("CARGO_PKG_VERSION"))), "{text}");
    let mode = std::fs::metadata(dir.path().join("state.format")).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o600);
}

/// Two kept entries for one id in a write (the node writes none today):
/// the store and the simulation's model of it (`node/testing.rs`) keep the
/// same one, for an id decided in that write and for one held before.
#[test]
fn the_store_and_its_model_keep_the_same_of_two_kept_entries() {
    let dir = tempfile::tempdir().unwrap();
    let key = PublicKey::new(PUB.as_bytes());
    let decided = decision("web01", Verdict::Accepted(key.clone()), 7, None);
    let earlier = decision("web02", Verdict::Accepted(key.clone()), 5, None);
    let seen = decision("web01", Verdict::Rejected(key.clone()), 3, None).seen();
    let seen_2 = decision("web02", Verdict::Rejected(key), 2, None).seen();
    let kept = |id: &Decision, seen: Vec<crate::core::Seen>| keysync_machine::node::Kept {
        id: id.id.clone(),
        seen,
        mine: None,
    };
    let first = StoreWrite { decisions: std::slice::from_ref(&earlier), initialize: true, ..StoreWrite::default() };
    let kept = [
        kept(&decided, vec![seen.clone()]),
        kept(&decided, vec![]),
        kept(&earlier, vec![]),
        kept(&earlier, vec![seen_2.clone()]),
    ];
    let second = StoreWrite { decisions: std::slice::from_ref(&decided), kept: &kept, ..StoreWrite::default() };
    let store = Store::open(dir.path(), "a", NOW_MS).unwrap();
    let mut model = keysync_machine::node::testing::MemoryStore::made_at(NOW_MS);
    for write in [&first, &second] {
        store.record(write, "a").unwrap();
        model.record(write);
    }
    let loaded = store.load().unwrap();
    for (id, want) in [(&decided.id, vec![seen]), (&earlier.id, vec![seen_2])] {
        let stored = loaded.entries.iter().find(|(held, _)| held == id).unwrap().1.seen().to_vec();
        assert_eq!(stored, want, "{id} in the store");
        assert_eq!(model.decisions[id].seen, want, "{id} in the model");
    }
}

/// A scan's step writes what is kept beside each decision in step with
/// them (the `i`th is the `i`th decision's, ids sorted): taken by place,
/// not looked up. The same write with its kept in another order is looked
/// up by id; both record the same, each decision with its own.
#[test]
fn kept_in_step_with_the_decisions_is_recorded_as_kept_found_by_id() {
    let key = PublicKey::new(PUB.as_bytes());
    let decisions: Vec<Decision> =
        (0..6).map(|i| decision(&format!("web{i:02}"), Verdict::Accepted(key.clone()), 10 + i, None)).collect();
    let kept: Vec<keysync_machine::node::Kept> = decisions
        .iter()
        .zip(1..)
        .map(|(d, i)| keysync_machine::node::Kept {
            id: d.id.clone(),
            seen: vec![decision(d.id.as_str(), Verdict::Rejected(key.clone()), i, None).seen()],
            mine: (i % 2 == 0).then(|| Version::claim(false, &key.fingerprint().0)),
        })
        .collect();
    let recorded = |kept: &[keysync_machine::node::Kept]| {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), "a", NOW_MS).unwrap();
        store.record(&StoreWrite { decisions: &decisions, kept, ..StoreWrite::default() }, "a").unwrap();
        let mut entries: Vec<_> = store
            .load()
            .unwrap()
            .entries
            .into_iter()
            .map(|(id, entry)| (id, entry.seen().to_vec(), entry.mine().cloned()))
            .collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries
    };
    let in_step = |kept: &[keysync_machine::node::Kept]| {
        KeptById::new(&StoreWrite { decisions: &decisions, kept, ..StoreWrite::default() }).in_step()
    };
    assert!(in_step(&kept));
    let want: Vec<_> = kept.iter().map(|k| (k.id.clone(), k.seen.clone(), k.mine.clone())).collect();
    assert_eq!(recorded(&kept), want, "each decision with what was kept for its id");
    let mut shuffled = kept.clone();
    shuffled.rotate_left(2);
    assert!(!in_step(&shuffled));
    assert_eq!(recorded(&shuffled), want, "the same, looked up by id");
}

/// Two decisions of one id in one commit, each with a kept: not in step
/// (their ids are not distinct), the first kept for the id is taken for
/// both, as a lookup by id takes it.
#[test]
fn two_decisions_of_one_id_in_one_commit_keep_the_first_kept() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), "a", NOW_MS).unwrap();
    let key = PublicKey::new(PUB.as_bytes());
    let (earlier, later) = (
        decision("web01", Verdict::Accepted(key.clone()), 10, None),
        decision("web01", Verdict::Rejected(key.clone()), 11, None),
    );
    let seen = |hlc| vec![decision("web01", Verdict::Deleted, hlc, None).seen()];
    let kept = [
        keysync_machine::node::Kept { id: earlier.id.clone(), seen: seen(3), mine: None },
        keysync_machine::node::Kept { id: earlier.id.clone(), seen: seen(4), mine: None },
    ];
    let decisions = [earlier, later.clone()];
    let write = StoreWrite { decisions: &decisions, kept: &kept, ..StoreWrite::default() };
    assert!(!KeptById::new(&write).in_step());
    store.record(&write, "a").unwrap();
    let loaded = store.load().unwrap();
    assert_eq!(loaded.entries.len(), 1);
    let (_, entry) = &loaded.entries[0];
    assert_eq!((&entry.version, entry.seen().to_vec()), (&later.version, seen(3)));
}

/// A claim displaced by a live decision is kept in the claims table; when
/// the same commit then holds that claim again, its row there is removed,
/// though the table was empty when the commit began.
#[test]
fn a_claim_displaced_and_held_again_in_one_commit_leaves_no_row_behind() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), "a", NOW_MS).unwrap();
    let key = PublicKey::new(PUB.as_bytes());
    let claim = Decision {
        version: Version::claim(false, &key.fingerprint().0),
        verdict: Verdict::Accepted(key.clone()),
        ..decision("web01", Verdict::Deleted, 0, None)
    };
    store.record(&StoreWrite { decisions: std::slice::from_ref(&claim), ..StoreWrite::default() }, "a").unwrap();
    let live = decision("web01", Verdict::Rejected(key), 1 << 50, None);
    let both = [live, claim.clone()];
    store.record(&StoreWrite { decisions: &both, ..StoreWrite::default() }, "a").unwrap();
    // Held, and known once: not a second time as a claim displaced.
    assert_eq!(store.get(std::slice::from_ref(&claim.id)).unwrap(), vec![claim]);
}
