//! A master out of contact for longer than `tombstone_ttl` offers nothing
//! (`stale.rs`; issue 29 item 7: a standby off for months would bring back
//! the keys deleted meanwhile, whose tombstones its peers had forgotten).

use super::*;

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

/// One round of `asker`'s link to `answerer`, as the agent runs it: Diff,
/// compare, push what the asker holds newer, fetch and apply the rest.
fn round(asker: (&mut Node, &mut Recorder), answerer: (&mut Node, &mut Recorder), when: Now) {
    let ((asker, rt_asker), (answerer, rt_answerer)) = (asker, answerer);
    let Some(digests) = asker.digests() else { return };
    let (buckets, summaries) = answerer.diff(&digests, rt_answerer);
    let (_, pushed) = asker.repair_compare(answerer.name().to_string().as_str(), &buckets, summaries, rt_asker);
    let peer: Arc<str> = asker.name().into();
    if !pushed.is_empty() {
        answerer.on_batches(vec![(peer, pushed)], when, rt_answerer);
    }
    let from = answerer.name().to_string();
    while let Some(ids) = asker.repair_next(&from) {
        let fetched = answerer.fetch(&ids, rt_answerer);
        asker.repair_fetched(&from, &ids, fetched, when, rt_asker);
    }
    asker.on_contact(when, rt_asker);
}

/// master-c, a standby, held web01 and was powered off; master-a deleted
/// web01 and forgot the delete after the TTL. When master-c comes back it
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

    // master-c is off. master-a deletes web01, and two days later forgets it.
    let delete = decision(Verdict::Deleted, NOW_MS + 1_000, "master-b", std::slice::from_ref(&accept.version));
    push(&mut a, &mut rt_a, "master-b", vec![delete]);
    let later = at(NOW_MS + 2 * DAY_MS);
    let mut a = node_at("master-a", plain(), rt_a.store.loaded(), later, &mut rt_a);
    a.on_tick(later, &mut rt_a);
    assert_eq!(a.counts(), (0, 0, 0), "the tombstone is compacted");

    // master-c comes back with its folders and store as they were.
    let mut c = node_at("master-c", plain(), rt_c.store.loaded(), later, &mut rt_c);
    let stale = c.stale().expect("stale: out of contact for longer than the TTL");
    assert_eq!((stale.last_contact_ms, stale.ttl), (NOW_MS, TTL));
    assert_eq!(rt_c.events.iter().filter(|e| matches!(e, Event::Stale { .. })).count(), 1);
    round((&mut a, &mut rt_a), (&mut c, &mut rt_c), later);
    round((&mut c, &mut rt_c), (&mut a, &mut rt_a), later);
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

    // A contact does not end it, and a restart finds it again.
    c.on_contact(later, &mut rt_c);
    assert_eq!(rt_c.store.last_contact_ms, Some(NOW_MS));
    let c = node_at("master-c", plain(), rt_c.store.loaded(), at(later.wall_ms + 1), &mut rt_c);
    assert!(c.stale().is_some());
}

/// Within the TTL a master is not stale; one that runs cut off from every
/// peer becomes stale at the tick past it; one never in contact (a first
/// start, or a store of an earlier release) is not.
#[test]
fn stale_is_past_the_ttl_since_the_last_contact_and_only_then() {
    let mut rt = Recorder::default();
    let mut c = node_with("master-c", plain(), Loaded::default(), &mut rt);
    c.on_tick(at(NOW_MS + 3 * DAY_MS), &mut rt);
    assert!(c.stale().is_none(), "never in contact: nothing to go by");
    c.on_contact(now(), &mut rt);
    // Contact is kept hourly, not at every round.
    c.on_contact(at(NOW_MS + 60_000), &mut rt);
    assert_eq!(rt.store.last_contact_ms, Some(NOW_MS));
    c.on_contact(at(NOW_MS + 3_600_000), &mut rt);
    assert_eq!(rt.store.last_contact_ms, Some(NOW_MS + 3_600_000));
    let restarted = node_at("master-c", plain(), rt.store.loaded(), at(NOW_MS + DAY_MS), &mut rt);
    assert!(restarted.stale().is_none(), "23 hours since the last contact kept");
    c.on_tick(at(NOW_MS + 3_600_000 + DAY_MS), &mut rt);
    assert!(c.stale().is_none(), "exactly the TTL");
    c.on_tick(at(NOW_MS + 3_600_000 + DAY_MS + 1), &mut rt);
    assert!(c.stale().is_some(), "running, cut off past the TTL");
    assert_eq!(c.digests(), None, "no round");
    assert_eq!(c.diff(&[0; crate::core::digest::N_BUCKETS], &mut rt), (Vec::new(), Vec::new()));
}
