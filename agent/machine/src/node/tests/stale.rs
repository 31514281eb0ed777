//! A master out of contact for longer than `tombstone_ttl` offers nothing
//! (`stale.rs`; issue 29 item 7: a standby off for months would bring back
//! the keys deleted meanwhile, whose tombstones its peers had forgotten).

use super::*;

fn on(name: &str, verdict: Verdict, ms: u64, origin: &str, knew: &[Version]) -> Decision {
    Decision { id: MinionId::parse(name).unwrap(), ..decision(verdict, ms, origin, knew) }
}

const DAY_MS: u64 = 86_400_000;

fn at(wall_ms: u64) -> Now {
    Now { mono: Instant::now(), wall_ms }
}

fn plain() -> GuardSettings {
    GuardSettings { enabled: false, ..GuardSettings::default() }
}

fn web01() -> MinionId {
    MinionId::parse("web01").unwrap()
}

/// One session of `asker`'s link to `answerer`, as the agent runs it:
/// Hello both ways (each tells when the newest delete it forgot was made),
/// then a round: Diff, compare, push what the asker holds newer, fetch and
/// apply the rest.
fn round(asker: (&mut Node, &mut Recorder), answerer: (&mut Node, &mut Recorder), when: Now) {
    let ((asker, rt_asker), (answerer, rt_answerer)) = (asker, answerer);
    let (asker_name, answerer_name) = (asker.name().to_string(), answerer.name().to_string());
    answerer.on_peer_forgot(&peer(&asker_name), asker.forgot_through(&peer(&answerer_name)), when, rt_answerer);
    asker.on_peer_forgot(&peer(&answerer_name), answerer.forgot_through(&peer(&asker_name)), when, rt_asker);
    let Some(digests) = asker.digests() else { return };
    let (buckets, summaries) = answerer.diff(&digests, rt_answerer);
    let (_, pushed) = asker.repair_compare(&answerer_name, &buckets, summaries, rt_asker);
    if !pushed.is_empty() {
        answerer.on_batches(vec![(peer(&asker_name), pushed)], when, rt_answerer);
    }
    while let Some(fetch) = asker.repair_next(&peer(&answerer_name)) {
        let fetched = answerer.fetch(&fetch.ids, rt_answerer);
        asker.repair_fetched(&peer(&answerer_name), &fetch, fetched, when, rt_asker);
    }
    asker.on_contact(when, rt_asker);
}

/// master-c, a standby, held web01 and was powered off; master-a deleted
/// web01 and forgot the delete after the TTL. When master-c comes back it
/// hears that master-a forgot a delete newer than its last contact, and
/// offers nothing: neither its round nor master-a's brings web01 back.
#[test]
fn a_master_back_after_the_ttl_offers_nothing_and_the_deleted_key_stays_deleted() {
    let (mut rt_a, mut rt_c) = (Recorder::default(), Recorder::default());
    let mut a = node_with("master-a", plain(), Loaded::default(), &mut rt_a);
    let mut c = node_with("master-c", plain(), Loaded::default(), &mut rt_c);
    let accept = decision(Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 60, "master-b", &[]);
    push(&mut a, &mut rt_a, "master-b", vec![accept.clone()]);
    push(&mut c, &mut rt_c, "master-b", vec![accept.clone()]);
    round((&mut c, &mut rt_c), (&mut a, &mut rt_a), now());
    assert_eq!(rt_c.store.last_contact_ms, Some(NOW_MS), "the contact is kept");
    drop(c);

    // master-c is off. master-b deletes web01; master-a forgets it after the TTL.
    let delete = decision(Verdict::Deleted, NOW_MS + 1_000, "master-b", std::slice::from_ref(&accept.version));
    push(&mut a, &mut rt_a, "master-b", vec![delete]);
    let later = at(NOW_MS + 2 * DAY_MS);
    let mut a = node_at("master-a", plain(), rt_a.store.loaded(), later, &mut rt_a);
    a.on_tick(later, &mut rt_a);
    assert_eq!(a.counts(), (0, 0, 0), "the tombstone is compacted");
    assert_eq!(a.forgot_through(&peer("master-c")), NOW_MS + 1_000);
    assert_eq!(a.forgot_through(&peer("master-b")), 0, "master-b knows its own deletes");
    assert_eq!(rt_a.store.loaded().forgot, vec![(Arc::from("master-b"), NOW_MS + 1_000)], "what it forgot is kept");

    // master-c comes back with its folders and store as they were.
    let mut c = node_at("master-c", plain(), rt_c.store.loaded(), later, &mut rt_c);
    round((&mut a, &mut rt_a), (&mut c, &mut rt_c), later);
    let stale = c.stale().expect("stale: master-a forgot a delete newer than its last contact").clone();
    assert_eq!(stale, Stale { last_contact_ms: NOW_MS, peer: peer("master-a"), peer_forgot_ms: NOW_MS + 1_000 });
    assert_eq!(rt_c.events.iter().filter(|e| matches!(e, Event::Stale { .. })).count(), 1);
    round((&mut c, &mut rt_c), (&mut a, &mut rt_a), later);
    assert!(a.stale().is_none(), "master-a ran all along");
    assert!(rt_a.folders.files.is_empty(), "web01 came back on master-a: {:?}", rt_a.folders.list());
    assert_eq!(a.len(), 0);

    // Nothing from the peers is applied either, and its folders are left as they are.
    let newer = decision(Verdict::Rejected(key("mwIDAQAB")), NOW_MS + 2 * DAY_MS - 5, "master-a", &[]);
    assert_eq!(push(&mut c, &mut rt_c, "master-a", vec![newer]), 0);
    assert!(rt_c.folders.get(Folder::Accepted, "web01").is_some());
    assert_eq!(c.poll_at(), None, "nothing is due");

    // `plan` lists what `rejoin` sets aside.
    let rows = c.plan(None);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((&rows[0].id, &rows[0].will, rows[0].why), (&web01(), &Holding::Nothing, Some(plan::STALE_WHY)));
    assert!(rows.iter().all(|row| !row.conflict) && c.conflicts().is_empty(), "and no conflict for `status`");

    // A contact does not end it, and the next Hello after a restart finds it again.
    c.on_contact(later, &mut rt_c);
    assert_eq!(rt_c.store.last_contact_ms, Some(NOW_MS));
    let mut c = node_at("master-c", plain(), rt_c.store.loaded(), at(later.wall_ms + 1), &mut rt_c);
    c.on_peer_forgot(&peer("master-a"), a.forgot_through(&peer("master-c")), later, &mut rt_c);
    assert!(c.stale().is_some());
}

/// The primary of a primary/standby pair runs alone while the standby is
/// off for months: neither is stale when they meet, whatever each forgot
/// meanwhile of the deletes both knew; a peer's decisions count as contact.
#[test]
fn a_master_that_ran_alone_or_heard_everything_is_not_stale() {
    let (mut rt_a, mut rt_c) = (Recorder::default(), Recorder::default());
    let mut a = node_with("master-a", plain(), Loaded::default(), &mut rt_a);
    let mut c = node_with("master-c", plain(), Loaded::default(), &mut rt_c);
    assert_eq!(c.digests().map(|d| d.len()), Some(crate::core::digest::N_BUCKETS));
    // Both know of a delete, which both forget later.
    let accept = on("old", Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 90, "master-b", &[]);
    let delete = on("old", Verdict::Deleted, NOW_MS - 60, "master-b", std::slice::from_ref(&accept.version));
    for (node, rt) in [(&mut a, &mut rt_a), (&mut c, &mut rt_c)] {
        push(node, rt, "master-b", vec![accept.clone(), delete.clone()]);
    }
    round((&mut a, &mut rt_a), (&mut c, &mut rt_c), now());
    // master-c deletes web01 and pushes it to master-a, then goes off
    // before another round: the push counts as contact.
    let web = decision(Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 50, "master-c", &[]);
    let gone = decision(Verdict::Deleted, NOW_MS + 90_000_000, "master-c", std::slice::from_ref(&web.version));
    push(&mut a, &mut rt_a, "master-c", vec![web.clone()]);
    let when = at(NOW_MS + 90_000_000);
    a.on_batches(vec![(peer("master-c"), vec![gone.clone()])], when, &mut rt_a);
    // 40 days on, both compact what they knew.
    let later = at(NOW_MS + 40 * DAY_MS);
    let mut a = node_at("master-a", plain(), rt_a.store.loaded(), later, &mut rt_a);
    a.on_tick(later, &mut rt_a);
    let mut store_c = rt_c.store.clone();
    store_c.record(&StoreWrite { decisions: std::slice::from_ref(&gone), ..StoreWrite::default() });
    rt_c.store = store_c;
    let mut c = node_at("master-c", plain(), rt_c.store.loaded(), later, &mut rt_c);
    c.on_tick(later, &mut rt_c);
    // master-a forgot master-c's own delete: nothing master-c missed.
    assert_eq!(
        (a.forgot_through(&peer("master-c")), c.forgot_through(&peer("master-a"))),
        (NOW_MS - 60, NOW_MS + 90_000_000)
    );
    round((&mut c, &mut rt_c), (&mut a, &mut rt_a), later);
    round((&mut a, &mut rt_a), (&mut c, &mut rt_c), later);
    assert!(a.stale().is_none() && c.stale().is_none(), "{:?} {:?}", a.stale(), c.stale());
    assert_eq!(rt_c.store.last_contact_ms, Some(later.wall_ms), "a round after a restart is kept at once");
    // Kept hourly, not at every round.
    c.on_contact(at(later.wall_ms + 60_000), &mut rt_c);
    assert_eq!(rt_c.store.last_contact_ms, Some(later.wall_ms));
    c.on_contact(at(later.wall_ms + 3_600_000), &mut rt_c);
    assert_eq!(rt_c.store.last_contact_ms, Some(later.wall_ms + 3_600_000));
    // A master never in contact (a first start, an earlier release's store) has nothing to go by.
    let mut rt = Recorder::default();
    let mut fresh = node_with("master-d", plain(), Loaded::default(), &mut rt);
    fresh.on_peer_forgot(&peer("master-a"), u64::MAX, later, &mut rt);
    assert!(fresh.stale().is_none());
}

/// The contact on record lags the last one by up to an hour, but never
/// behind a peer's delete this node heard: master-c hears master-b's delete
/// 30 minutes after its contact on record (its guard holds it a second, as
/// the agent's does by default) and stops 10 minutes later. It comes back
/// before `tombstone_ttl` has passed since it stopped, after master-a forgot
/// that delete: it missed nothing, and is not stale.
#[test]
fn a_master_that_heard_a_delete_just_before_it_stopped_is_not_stale_when_a_peer_forgets_it() {
    let (mut rt_a, mut rt_c) = (Recorder::default(), Recorder::default());
    let mut a = node_with("master-a", plain(), Loaded::default(), &mut rt_a);
    let mut c = node_with("master-c", GuardSettings::default(), Loaded::default(), &mut rt_c);
    let accept = decision(Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 60, "master-b", &[]);
    push(&mut a, &mut rt_a, "master-b", vec![accept.clone()]);
    push(&mut c, &mut rt_c, "master-b", vec![accept.clone()]);
    round((&mut c, &mut rt_c), (&mut a, &mut rt_a), now());
    assert_eq!(rt_c.store.last_contact_ms, Some(NOW_MS));

    let deleted_ms = NOW_MS + 1_800_000;
    let delete = decision(Verdict::Deleted, deleted_ms, "master-b", std::slice::from_ref(&accept.version));
    let from_b = || vec![(peer("master-b"), vec![delete.clone()])];
    assert_eq!(a.on_batches(from_b(), at(deleted_ms), &mut rt_a), vec![1]);
    assert_eq!(c.on_batches(from_b(), at(deleted_ms), &mut rt_c), vec![0], "the guard holds it a second");
    assert_eq!(rt_c.store.last_contact_ms, Some(deleted_ms), "a contact that brought a delete is kept at once");
    c.on_tick(Now { mono: Instant::now() + Duration::from_secs(2), wall_ms: deleted_ms + 2_000 }, &mut rt_c);
    assert!(rt_c.folders.get(Folder::Accepted, "web01").is_none(), "the guard let it through");
    // Another contact within the hour is not written again.
    c.on_contact(at(deleted_ms + 60_000), &mut rt_c);
    assert_eq!(rt_c.store.last_contact_ms, Some(deleted_ms));
    drop(c); // stopped at deleted_ms + 10 min

    // A day (the TTL) and a minute after the delete, master-a forgets it;
    // master-c, off for 9 minutes less than the TTL, starts again.
    let later = at(deleted_ms + TTL.as_millis() as u64 + 60_000);
    let mut a = node_at("master-a", plain(), rt_a.store.loaded(), later, &mut rt_a);
    a.on_tick(later, &mut rt_a);
    assert_eq!(a.forgot_through(&peer("master-c")), deleted_ms, "the delete is compacted");
    let mut c = node_at("master-c", GuardSettings::default(), rt_c.store.loaded(), later, &mut rt_c);
    round((&mut a, &mut rt_a), (&mut c, &mut rt_c), later);
    round((&mut c, &mut rt_c), (&mut a, &mut rt_a), later);
    assert!(c.stale().is_none(), "{:?}", c.stale());
    assert!(rt_c.events.iter().all(|e| !matches!(e, Event::Stale { .. })));
    assert!(rt_a.folders.files.is_empty() && rt_c.folders.get(Folder::Accepted, "web01").is_none());
}
