//! The cases of the store contract, each a function generic over the store
//! (listed in [`crate::store_contract_tests!`]).

use std::sync::Arc;

use super::*;
use crate::core::merge::Conflict;
use crate::core::version::LOGICAL_BITS;
use crate::core::{Context, Relays, Verdict};
use crate::testkit::peer;
use crate::PeerName;

const NOW_MS: u64 = 1_700_000_000_000;

/// A new store holds nothing, is no initialized one (its first start is a
/// first start), and says it started afresh when it was made; `recover
/// --from-peers` records a later time.
pub fn a_new_store_holds_nothing_and_started_afresh_when_made<S: ContractStore>() {
    let mut store = S::create(NOW_MS);
    now_and_after_reopening(&mut store, |store| {
        let view = view(store);
        assert!(view.entries.is_empty() && view.journal.is_empty() && view.held.is_empty(), "{view:?}");
        assert!(view.untold.is_empty() && view.forgot.is_empty() && view.putting_back.is_empty(), "{view:?}");
        assert_eq!(view.cold, vec![0; N_BUCKETS]);
        assert_eq!((view.clock, view.initialized, view.last_contact_ms), (0, false, None));
        assert_eq!(view.afresh, NOW_MS << LOGICAL_BITS, "afresh is when the store was made");
        assert!(cold_in(store, &all_buckets()).is_empty());
    });
    let later = (NOW_MS + 60_000) << LOGICAL_BITS;
    store.set_afresh(later).expect("set_afresh");
    now_and_after_reopening(&mut store, |store| assert_eq!(view(store).afresh, later));
}

/// Decisions journalled (about to be applied) are loaded by the next start
/// until a commit says they are done; a newer one for the same id replaces
/// the one journalled; the journal holds no decision and starts nothing.
pub fn the_journal_keeps_decisions_being_applied_until_done<S: ContractStore>() {
    let mut store = S::create(NOW_MS);
    let (web01, web02) = (id("web01"), id("web02"));
    let first = Decision {
        context: Context::new([at(5, "b"), at(6, "c")]),
        relays: Relays::new(["c".into(), "d".into()]),
        reached: Default::default(),
        ..accepted(&web01, &key(1), 10, "b")
    };
    let gone = deleted(&web02, 11, "b");
    store.journal(&[first.clone(), gone.clone()]).expect("journal");
    now_and_after_reopening(&mut store, |store| {
        let view = view(store);
        assert_eq!(view.journal, vec![first.clone(), gone.clone()]);
        assert!(view.entries.is_empty() && view.n_cold() == 0, "journalled is not held: {view:?}");
        assert!(!view.initialized && view.clock == 0, "{view:?}");
        assert!(get(store, &[&web01, &web02]).is_empty());
    });
    let newer = Decision { version: at(12, "c"), ..first.clone() };
    store.journal(std::slice::from_ref(&newer)).expect("journal");
    assert_eq!(view(&mut store).journal, vec![newer.clone(), gone.clone()], "one entry per id: the newer");
    // Recorded and done; done for an id not journalled is no error.
    let done = [web01.clone(), id("never")];
    record(&mut store, StoreWrite { decisions: std::slice::from_ref(&newer), done: &done, ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| {
        let view = view(store);
        assert_eq!(view.journal, vec![gone.clone()]);
        assert_eq!(view.entries, vec![(web01.clone(), newer.entry())]);
    });
    record(&mut store, StoreWrite { done: std::slice::from_ref(&web02), ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| assert!(view(store).journal.is_empty()));
}

/// A decision is kept as it came (key, context with claims in it, relays;
/// not the peers it was pushed to on its way, `reached`), with the other decisions seen and this master's own claim beside it;
/// ids Salt allows (spaces, any script, 255 bytes) are kept as they are.
pub fn a_decision_is_kept_whole_with_what_was_seen_beside_it<S: ContractStore>() {
    let mut store = S::create(NOW_MS);
    let long = "x".repeat(crate::core::id::NAME_MAX);
    let ids = [id("web01"), id("web 02 ünï"), id(&long)];
    let mine = claim(&ids[0], false, &key(1));
    let held = Decision {
        context: Context::new([at(5, "b"), at(7, "c"), mine.version.clone()]),
        relays: Relays::new(["c".into(), "master-d".into()]),
        reached: Relays::new(["e".into()]),
        ..accepted(&ids[0], &key(1), 10, "b")
    };
    let rejected =
        Decision { context: Context::new([at(2, "a")]), ..decision(&ids[0], Verdict::Rejected(key(2)), at(8, "c")) };
    let seen = vec![deleted(&ids[0], 3, "a").seen(), rejected.seen(), mine.seen()];
    let others = [accepted(&ids[1], &key(3), 20, "a"), decision(&ids[2], Verdict::Rejected(key(4)), at(21, "a"))];
    let kept_with = [kept(&ids[0], seen.clone(), Some(mine.version.clone()))];
    let decisions = [held.clone(), others[0].clone(), others[1].clone()];
    record(&mut store, StoreWrite { decisions: &decisions, kept: &kept_with, clock: 9, ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| {
        let view = view(store);
        let mut want = vec![
            (ids[0].clone(), entry(&held, seen.clone(), Some(mine.version.clone()))),
            (ids[1].clone(), others[0].entry()),
            (ids[2].clone(), others[1].entry()),
        ];
        want.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(view.entries, want);
        let unrouted = Decision { reached: Relays::default(), ..held.clone() };
        assert_eq!(get(store, &[&ids[0]]), vec![unrouted], "the decision, key and all");
        assert_eq!(get(store, &[&ids[2], &ids[1]]), vec![others[0].clone(), others[1].clone()]);
        assert!(get(store, &[&id("web0"), &id("web011")]).is_empty(), "unknown ids are skipped");
    });
}

/// A decision's context names one version per node and every claim it
/// knew: the wire lets 256 through, and the store keeps each of them (a
/// version lost changes what the decision knew after the next start).
pub fn a_decision_keeps_a_context_longer_than_255_versions<S: ContractStore>() {
    let mut store = S::create(NOW_MS);
    let (web01, web02) = (id("web01"), id("web02"));
    let context = Context::new((0..300u64).map(|n| at(n + 1, &format!("node{n:03}"))));
    let held = Decision { context: context.clone(), ..accepted(&web01, &key(1), 1_000, "b") };
    let other = Decision { context: context.clone(), ..decision(&web01, Verdict::Rejected(key(2)), at(999, "c")) };
    let seen = vec![other.seen()];
    let kept_with = [kept(&web01, seen.clone(), None)];
    let conflict = Conflict { id: web01.clone(), winner: other.seen(), loser: held.seen() };
    let conflicts = [(peer("c"), conflict)];
    let delete = Decision { context, ..deleted(&web02, 1_001, "c") };
    let held_delete = HeldDelete { decision: delete, from: peer("c"), since_ms: NOW_MS };
    let write = StoreWrite {
        decisions: std::slice::from_ref(&held),
        kept: &kept_with,
        conflicts: &conflicts,
        held: std::slice::from_ref(&held_delete),
        ..StoreWrite::default()
    };
    record(&mut store, write);
    store.journal(std::slice::from_ref(&other)).expect("journal");
    now_and_after_reopening(&mut store, |store| {
        let view = view(store);
        let lengths = |entry: &Entry| (entry.context().len(), entry.seen().iter().map(|s| s.context.len()).collect());
        let found: Vec<(usize, Vec<usize>)> = view.entries.iter().map(|(_, e)| lengths(e)).collect();
        assert_eq!(found, vec![(300, vec![300])], "the versions of the context held and of the one seen");
        assert_eq!(view.entries, vec![(web01.clone(), entry(&held, seen.clone(), None))]);
        assert_eq!(view.journal, vec![other.clone()]);
        assert_eq!(view.untold, conflicts.to_vec());
        assert_eq!(view.held, vec![held_delete.clone()]);
        assert_eq!(get(store, &[&web01]), vec![held.clone()]);
    });
}

/// Each commit of a decision writes what is kept beside it anew: a write
/// without a `kept` for its id keeps nothing seen and no claim of this
/// master's.
pub fn each_decision_written_replaces_what_was_kept_beside_it<S: ContractStore>() {
    let mut store = S::create(NOW_MS);
    let web01 = id("web01");
    let first = accepted(&web01, &key(1), 10, "b");
    let seen = vec![deleted(&web01, 9, "c").seen()];
    let mine = claim(&web01, false, &key(1)).version;
    let kept_with = [kept(&web01, seen.clone(), Some(mine.clone()))];
    record(
        &mut store,
        StoreWrite { decisions: std::slice::from_ref(&first), kept: &kept_with, ..StoreWrite::default() },
    );
    assert_eq!(view(&mut store).entries, vec![(web01.clone(), entry(&first, seen, Some(mine)))]);
    let second = accepted(&web01, &key(2), 11, "c");
    record(&mut store, StoreWrite { decisions: std::slice::from_ref(&second), ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| {
        assert_eq!(view(store).entries, vec![(web01.clone(), second.entry())]);
        assert_eq!(get(store, &[&web01]), vec![second.clone()], "a decision no longer held is no claim: gone");
    });
}

/// A commit with a `kept` and no decision for its id changes what is kept
/// beside the decision held, not the decision; for an id not held it keeps
/// nothing.
pub fn kept_alone_changes_only_what_is_kept_beside_the_decision<S: ContractStore>() {
    let mut store = S::create(NOW_MS);
    let (web01, unknown) = (id("web01"), id("unknown"));
    let held = accepted(&web01, &key(1), 10, "b");
    record(&mut store, StoreWrite { decisions: std::slice::from_ref(&held), ..StoreWrite::default() });
    let seen = vec![decision(&web01, Verdict::Rejected(key(2)), at(9, "c")).seen()];
    let mine = claim(&web01, false, &key(1)).version;
    let kept_with = [kept(&web01, seen.clone(), Some(mine.clone())), kept(&unknown, seen.clone(), None)];
    record(&mut store, StoreWrite { kept: &kept_with, ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| {
        let view = view(store);
        assert_eq!(view.entries, vec![(web01.clone(), entry(&held, seen.clone(), Some(mine.clone())))]);
        assert_eq!(get(store, &[&web01, &unknown]), vec![held.clone()]);
    });
}

/// Claims learnt and not held are kept with their keys; a claim held and
/// then displaced by a live decision stays known; a claim held is not
/// also listed as a claim.
pub fn claims_stay_known_with_their_keys<S: ContractStore>() {
    let mut store = S::create(NOW_MS);
    let (web01, web02) = (id("web01"), id("web02"));
    let own = claim(&web01, false, &key(1));
    let other = claim(&web01, true, &key(1));
    let third = claim(&web01, false, &key(2));
    let mine = [kept(&web01, Vec::new(), Some(own.version.clone()))];
    // This master's own claim held, two others learnt below or beside it.
    record(&mut store, StoreWrite { decisions: std::slice::from_ref(&own), kept: &mine, ..StoreWrite::default() });
    let learnt = [other.clone(), third.clone()];
    record(&mut store, StoreWrite { claims: &learnt, kept: &mine, ..StoreWrite::default() });
    let mut all = vec![own.clone(), other.clone(), third.clone()];
    all.sort_by(|a, b| a.version.cmp(&b.version));
    now_and_after_reopening(&mut store, |store| assert_eq!(get(store, &[&web01]), all));
    // One of the claims learnt comes to be held: listed once.
    record(&mut store, StoreWrite { decisions: std::slice::from_ref(&other), kept: &mine, ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| assert_eq!(get(store, &[&web01]), all));
    // A live delete displaces the claim held: every claim stays known.
    let live = deleted(&web01, 100, "b");
    record(&mut store, StoreWrite { decisions: std::slice::from_ref(&live), kept: &mine, ..StoreWrite::default() });
    let mut known = all.clone();
    known.push(live.clone());
    now_and_after_reopening(&mut store, |store| {
        assert_eq!(get(store, &[&web01]), known);
        assert!(get(store, &[&web02]).is_empty(), "another id's claims are its own");
        let view = view(store);
        assert_eq!(view.entries, vec![(web01.clone(), entry(&live, Vec::new(), Some(own.version.clone())))]);
    });
}

/// Plain tombstones (deletes with no claim known) are counted by bucket
/// and left out of what a start loads into memory, read back by id or by
/// bucket, and follow every write that makes a delete one or not one.
pub fn plain_tombstones_stay_in_the_store_and_are_read_back_cold<S: ContractStore>() {
    let mut store = S::create(NOW_MS);
    let ids: Vec<MinionId> = (0..6).map(|n| id(&format!("gone{n}"))).collect();
    let (plain_a, plain_b, claimed, minded, live) = (&ids[0], &ids[1], &ids[2], &ids[3], &ids[4]);
    let a = deleted(plain_a, 10, "b");
    let b = deleted(plain_b, 11, "c");
    let c = deleted(claimed, 12, "b");
    let m = deleted(minded, 13, "b");
    let l = accepted(live, &key(1), 14, "b");
    let its_claim = claim(claimed, false, &key(2));
    let kept_with = [
        kept(claimed, vec![its_claim.seen(), deleted(claimed, 2, "c").seen()], None),
        kept(minded, Vec::new(), Some(claim(minded, true, &key(3)).version)),
        // Decisions seen that are no claims leave a delete plain.
        kept(plain_b, vec![accepted(plain_b, &key(4), 3, "b").seen()], None),
    ];
    let decisions = [a.clone(), b.clone(), c.clone(), m.clone(), l.clone()];
    record(&mut store, StoreWrite { decisions: &decisions, kept: &kept_with, ..StoreWrite::default() });
    let plain = |store: &mut S| -> Vec<MinionId> {
        let mut ids: Vec<MinionId> = cold_in(store, &all_buckets()).into_iter().map(|(id, _)| id).collect();
        ids.sort();
        ids
    };
    now_and_after_reopening(&mut store, |store| {
        let view = view(store);
        let in_memory: Vec<&MinionId> = view.entries.iter().map(|(id, _)| id).collect();
        assert_eq!(in_memory, vec![claimed, minded, live]);
        let mut per_bucket = vec![0u32; N_BUCKETS];
        per_bucket[bucket_of(plain_a)] += 1;
        per_bucket[bucket_of(plain_b)] += 1;
        assert_eq!(view.cold, per_bucket);
        let mut want = vec![(plain_a.clone(), a.version.clone()), (plain_b.clone(), b.version.clone())];
        want.sort();
        assert_eq!(cold_in(store, &all_buckets()), want);
        for (id, version) in &want {
            let mine = cold_in(store, &[bucket(id)]);
            assert!(mine.contains(&(id.clone(), version.clone())), "{mine:?}");
            assert!(mine.iter().all(|(other, _)| bucket(other) == bucket(id)), "{mine:?}: only the bucket asked for");
        }
        let asked = [plain_a.clone(), claimed.clone(), live.clone(), plain_b.clone(), ids[5].clone()];
        let cold = store.cold(&asked).expect("cold");
        assert_eq!(
            cold,
            vec![(plain_a.clone(), a.entry()), (plain_b.clone(), entry(&b, kept_with[2].seen.clone(), None))]
        );
        assert_eq!(get(store, &[plain_a]), vec![a.clone()], "a plain tombstone is held all the same");
    });
    // An accept over a plain tombstone takes it off; a delete again puts it back.
    let back = accepted(plain_a, &key(1), 20, "b");
    record(&mut store, StoreWrite { decisions: std::slice::from_ref(&back), ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| {
        assert_eq!(plain(store), vec![plain_b.clone()]);
        assert_eq!(view(store).n_cold(), 1);
        assert!(store.cold(std::slice::from_ref(plain_a)).expect("cold").is_empty());
    });
    let again = deleted(plain_a, 21, "c");
    record(&mut store, StoreWrite { decisions: std::slice::from_ref(&again), ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| {
        assert_eq!(plain(store), vec![plain_a.clone(), plain_b.clone()]);
        assert_eq!(
            cold_in(store, &[bucket(plain_a)]).iter().find(|(id, _)| id == plain_a),
            Some(&(plain_a.clone(), again.version.clone()))
        );
    });
    // A claim learnt for a tombstone's id (a write of what is kept only)
    // takes it off; forgetting the claim again puts it back.
    let learnt = claim(plain_b, false, &key(5));
    let with_claim = [kept(plain_b, vec![learnt.seen()], None)];
    record(
        &mut store,
        StoreWrite { claims: std::slice::from_ref(&learnt), kept: &with_claim, ..StoreWrite::default() },
    );
    now_and_after_reopening(&mut store, |store| {
        assert_eq!(plain(store), vec![plain_a.clone()]);
        assert!(view(store).entry(plain_b).is_some(), "in memory now");
        assert!(store.cold(std::slice::from_ref(plain_b)).expect("cold").is_empty());
    });
    let without = [kept(plain_b, Vec::new(), None)];
    record(&mut store, StoreWrite { kept: &without, ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| {
        assert_eq!(plain(store), vec![plain_a.clone(), plain_b.clone()]);
        assert!(view(store).entry(plain_b).is_none());
    });
    // A delete beside this master's own claim is no plain tombstone either.
    record(
        &mut store,
        StoreWrite { kept: &[kept(plain_a, Vec::new(), Some(its_claim.version.clone()))], ..StoreWrite::default() },
    );
    now_and_after_reopening(&mut store, |store| assert_eq!(plain(store), vec![plain_b.clone()]));
}

/// Compaction forgets plain tombstones issued before the time given, at
/// most as many as asked, none journalled or held by the guard, and
/// nothing else.
pub fn compaction_forgets_old_plain_tombstones_only<S: ContractStore>() {
    let mut store = S::create(NOW_MS);
    let id_of = |n: usize| id(&format!("gone{n}"));
    let old: Vec<Decision> = (0..4).map(|n| deleted(&id_of(n), 1_000 + n as u64, "b")).collect();
    let at_limit = deleted(&id_of(4), 3_000, "b");
    let young = deleted(&id_of(5), 5_000, "b");
    let journalled = deleted(&id_of(6), 1_000, "b");
    let held = deleted(&id_of(7), 1_000, "c");
    let claimed = deleted(&id_of(8), 1_000, "b");
    let accept = accepted(&id_of(9), &key(1), 1_000, "b");
    let mut decisions = old.clone();
    decisions.extend([
        at_limit.clone(),
        young.clone(),
        journalled.clone(),
        held.clone(),
        claimed.clone(),
        accept.clone(),
    ]);
    let kept_with = [kept(&claimed.id, vec![claim(&claimed.id, false, &key(2)).seen()], None)];
    let holding = [HeldDelete { decision: held.clone(), from: peer("c"), since_ms: NOW_MS }];
    record(&mut store, StoreWrite { decisions: &decisions, kept: &kept_with, held: &holding, ..StoreWrite::default() });
    store.journal(std::slice::from_ref(&journalled)).expect("journal");
    let n_cold = view(&mut store).n_cold();
    assert_eq!(n_cold, 8);
    // At most as many as asked: none for none.
    assert_eq!(store.compact(u64::MAX, 0).expect("compact"), Vec::new(), "max 0 forgets none");
    assert_eq!(view(&mut store).n_cold(), n_cold);
    // Two of the four old ones, then the other two; the one issued at the limit is not before it.
    let mut forgotten = store.compact(ms(3_000), 2).expect("compact");
    assert_eq!(forgotten.len(), 2, "{forgotten:?}");
    forgotten.extend(store.compact(ms(3_000), 10).expect("compact"));
    forgotten.sort();
    let mut want: Vec<(MinionId, Version)> = old.iter().map(|d| (d.id.clone(), d.version.clone())).collect();
    want.sort();
    assert_eq!(forgotten, want);
    assert_eq!(store.compact(ms(3_000), 10).expect("compact"), Vec::new(), "nothing more before 3,000 ms");
    now_and_after_reopening(&mut store, |store| {
        let view = view(store);
        assert_eq!(view.n_cold(), n_cold - 4);
        let gone: Vec<&MinionId> = old.iter().map(|d| &d.id).collect();
        assert!(get(store, &gone).is_empty(), "forgotten");
        assert!(store.cold(&old.iter().map(|d| d.id.clone()).collect::<Vec<_>>()).expect("cold").is_empty());
        assert!(cold_in(store, &all_buckets()).iter().all(|(id, _)| !gone.contains(&id)));
    });
    // The rest once old enough, but what is journalled, held or no plain tombstone.
    let mut rest = store.compact(u64::MAX, 10).expect("compact");
    rest.sort();
    assert_eq!(rest, vec![(at_limit.id.clone(), at_limit.version.clone()), (young.id.clone(), young.version.clone())]);
    now_and_after_reopening(&mut store, |store| {
        assert_eq!(store.compact(u64::MAX, 10).expect("compact"), Vec::new());
        let left = get(store, &[&journalled.id, &held.id, &claimed.id, &accept.id]);
        assert_eq!(left.len(), 4, "{left:?}");
    });
    // Done and settled: compacted then.
    let (done, unheld) = ([journalled.id.clone()], [held.id.clone()]);
    record(&mut store, StoreWrite { done: &done, unheld: &unheld, ..StoreWrite::default() });
    let mut last = store.compact(u64::MAX, 10).expect("compact");
    last.sort();
    assert_eq!(
        last,
        vec![(journalled.id.clone(), journalled.version.clone()), (held.id.clone(), held.version.clone())]
    );
    now_and_after_reopening(&mut store, |store| {
        assert_eq!(view(store).n_cold(), 0);
        assert_eq!(get(store, &[&claimed.id, &accept.id]), vec![claimed.clone(), accept.clone()]);
    });
}

/// Per origin, the newest delete ever compacted (`forgot_through`), in the
/// same commit: an older one forgotten later does not lower it.
pub fn compaction_notes_per_origin_the_newest_delete_forgotten<S: ContractStore>() {
    let mut store = S::create(NOW_MS);
    let decisions = [deleted(&id("a1"), 1_000, "b"), deleted(&id("a2"), 2_000, "b"), deleted(&id("a3"), 1_500, "c")];
    record(&mut store, StoreWrite { decisions: &decisions, ..StoreWrite::default() });
    assert_eq!(store.compact(ms(5_000), 10).expect("compact").len(), 3);
    let want: Vec<(Arc<str>, u64)> = vec![("b".into(), ms(2_000)), ("c".into(), ms(1_500))];
    now_and_after_reopening(&mut store, |store| assert_eq!(view(store).forgot, want));
    let older = deleted(&id("a4"), 500, "b");
    let newer = deleted(&id("a5"), 700, "d");
    record(&mut store, StoreWrite { decisions: &[older, newer], ..StoreWrite::default() });
    assert_eq!(store.compact(ms(5_000), 10).expect("compact").len(), 2);
    let want: Vec<(Arc<str>, u64)> = vec![("b".into(), ms(2_000)), ("c".into(), ms(1_500)), ("d".into(), ms(700))];
    now_and_after_reopening(&mut store, |store| assert_eq!(view(store).forgot, want));
    // Nothing compacted: nothing noted.
    assert!(store.compact(ms(5_000), 10).expect("compact").is_empty());
    assert_eq!(view(&mut store).forgot, want);
}

/// Held deletes are kept (with the peer they came from and since when)
/// until a commit settles them; a newer delete held for an id replaces
/// the one held; an id a commit both holds and settles is not held after
/// it (the machine settles only what its guard no longer holds).
pub fn held_deletes_are_kept_until_settled<S: ContractStore>() {
    let mut store = S::create(NOW_MS);
    let (web01, web02, web03) = (id("web01"), id("web02"), id("web03"));
    let h1 = HeldDelete { decision: deleted(&web01, 10, "c"), from: peer("c"), since_ms: NOW_MS };
    let h2 = HeldDelete {
        decision: Decision { relays: Relays::new(["d".into()]), ..deleted(&web02, 11, "c") },
        from: peer("d"),
        since_ms: NOW_MS + 1,
    };
    record(&mut store, StoreWrite { held: &[h1.clone(), h2.clone()], ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| {
        let view = view(store);
        assert_eq!(view.held, vec![h1.clone(), h2.clone()]);
        assert!(view.entries.is_empty() && view.n_cold() == 0, "held is not applied: {view:?}");
    });
    let newer = HeldDelete { decision: deleted(&web01, 12, "c"), from: peer("b"), since_ms: NOW_MS + 2 };
    let unheld = [web02.clone(), web03.clone()];
    record(&mut store, StoreWrite { held: std::slice::from_ref(&newer), unheld: &unheld, ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| assert_eq!(view(store).held, vec![newer.clone()]));
    // Held and settled in one commit (held as it came, given back to be judged again).
    let h3 = HeldDelete { decision: deleted(&web03, 13, "c"), from: peer("d"), since_ms: NOW_MS + 3 };
    let unheld = [web03.clone()];
    record(&mut store, StoreWrite { held: std::slice::from_ref(&h3), unheld: &unheld, ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| assert_eq!(view(store).held, vec![newer.clone()]));
    record(&mut store, StoreWrite { unheld: std::slice::from_ref(&web01), ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| assert!(view(store).held.is_empty()));
}

/// Conflicts are kept until a commit says every one is told: each once
/// (per id and pair of decisions), with the peer it came from.
pub fn conflicts_are_kept_until_told<S: ContractStore>() {
    let mut store = S::create(NOW_MS);
    let (web01, web02) = (id("web01"), id("web02"));
    let conflict = |id: &MinionId, ms: u64| Conflict {
        id: id.clone(),
        winner: decision(id, Verdict::Rejected(key(1)), at(ms, "b")).seen(),
        loser: Decision { context: Context::new([at(1, "a")]), ..accepted(id, &key(2), ms - 1, "c") }.seen(),
    };
    let (c1, c2, c3) = (conflict(&web01, 10), conflict(&web02, 20), conflict(&web01, 30));
    let first: Vec<(PeerName, Conflict)> = vec![(peer("b"), c1.clone()), (peer("c"), c2.clone())];
    record(&mut store, StoreWrite { conflicts: &first, ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| assert_eq!(view(store).untold, first));
    // The same conflict again (told by another peer too): kept once.
    let again: Vec<(PeerName, Conflict)> = vec![(peer("b"), c1.clone())];
    record(&mut store, StoreWrite { conflicts: &again, ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| assert_eq!(view(store).untold, first));
    // All told: forgotten, but those of the same commit.
    let later: Vec<(PeerName, Conflict)> = vec![(peer("d"), c3.clone())];
    record(&mut store, StoreWrite { conflicts: &later, conflicts_told: true, ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| assert_eq!(view(store).untold, later));
    record(&mut store, StoreWrite { conflicts_told: true, ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| assert!(view(store).untold.is_empty()));
}

/// The clock is each commit's; a store once initialized stays so (the
/// journal initializes nothing); the last contact with a peer stays until
/// a later one is given.
pub fn the_clock_the_first_start_and_the_contact_are_kept<S: ContractStore>() {
    let mut store = S::create(NOW_MS);
    record(&mut store, StoreWrite { clock: 5 << LOGICAL_BITS, ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| {
        let view = view(store);
        assert_eq!((view.clock, view.initialized), (5 << LOGICAL_BITS, false));
    });
    store.journal(&[deleted(&id("web01"), 6, "b")]).expect("journal");
    record(
        &mut store,
        StoreWrite { clock: 9 << LOGICAL_BITS, initialize: true, contact: Some(NOW_MS), ..StoreWrite::default() },
    );
    record(&mut store, StoreWrite { clock: 10 << LOGICAL_BITS, ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| {
        let view = view(store);
        assert_eq!((view.clock, view.initialized, view.last_contact_ms), (10 << LOGICAL_BITS, true, Some(NOW_MS)));
    });
    record(&mut store, StoreWrite { clock: 11 << LOGICAL_BITS, contact: Some(NOW_MS + 5), ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| {
        let view = view(store);
        assert_eq!((view.clock, view.initialized, view.last_contact_ms), (11 << LOGICAL_BITS, true, Some(NOW_MS + 5)));
        assert_eq!(view.afresh, NOW_MS << LOGICAL_BITS, "no commit changes when the store started afresh");
    });
}

/// The list of keys being put back is replaced by each commit that gives
/// one (an empty one clears it), kept by the others.
pub fn the_keys_being_put_back_are_kept<S: ContractStore>() {
    let mut store = S::create(NOW_MS);
    let ids = [id("web01"), id("web 02"), id("web03")];
    record(&mut store, StoreWrite { putting_back: Some(&ids[..2]), ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| assert_eq!(view(store).putting_back, ids[..2].to_vec()));
    record(&mut store, StoreWrite { clock: 1, ..StoreWrite::default() });
    assert_eq!(view(&mut store).putting_back, ids[..2].to_vec(), "a commit without a list keeps it");
    record(&mut store, StoreWrite { putting_back: Some(&ids[1..]), ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| assert_eq!(view(store).putting_back, ids[1..].to_vec()));
    record(&mut store, StoreWrite { putting_back: Some(&[]), ..StoreWrite::default() });
    now_and_after_reopening(&mut store, |store| assert!(view(store).putting_back.is_empty()));
}
