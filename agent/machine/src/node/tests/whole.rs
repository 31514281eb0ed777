//! Buckets sent whole (issue 31): a master that holds nothing in a bucket
//! names it in its Diff, and its peer sends what it holds there whole, with
//! no summaries; a joining master so starts fetching after one small
//! answer, and its links share the buckets as they share ids.

use std::collections::BTreeSet;

use super::*;
use crate::core::digest::{bucket_of, N_BUCKETS};
use crate::node::{
    BadAnswer, Fetch, Whole, FETCH_CHUNK, FIRST_BUCKET_MOST, FIRST_WHOLE, MAX_FETCH, MAX_WHOLE_PER_BUCKET,
};

fn accept(name: &str, ms: u64, origin: &str) -> Decision {
    Decision { id: MinionId::parse(name).unwrap(), ..decision(Verdict::Accepted(key("mwIDAQAB")), ms, origin, &[]) }
}

/// master-a's delete of web01, after its accept of it 1 s before.
fn delete_of_web01() -> Decision {
    Decision {
        version: Version::new((NOW_MS - 4000) << 16, "master-a"),
        verdict: Verdict::Deleted,
        context: Context::new([Version::new((NOW_MS - 5000) << 16, "master-a")]),
        ..accept("web01", NOW_MS - 4000, "master-a")
    }
}

/// A master holding `n` accepts made on master-d.
fn holding(name: &str, n: usize, rt: &mut Recorder) -> Node {
    let mut node = node(name, rt);
    let all: Vec<Decision> = (0..n).map(|i| accept(&format!("m{i:05}"), NOW_MS - 1000, "master-d")).collect();
    push(&mut node, rt, "master-d", all);
    node
}

/// `asker`'s comparison of `answerer`'s Diff answer, as its link runs it.
fn compare(asker: &mut Node, rt_asker: &mut Recorder, name: &str, answerer: &Node, rt: &mut Recorder) -> Compared {
    let asking = asker.asking().unwrap();
    let (buckets, summaries, whole) = answerer.diff_whole(&asking.digests, &asking.empty, rt);
    let link = peer(name);
    asker.repair_begin(&link, &buckets, &whole).unwrap();
    asker.repair_chunk(&link, summaries, rt_asker).unwrap();
    asker.repair_end(&link).unwrap()
}

/// An empty master names every bucket empty; its two peers send all they
/// hold whole (no summary at all), and its links fetch each bucket once,
/// the first fetch small, until it holds what they hold.
#[test]
fn an_empty_joiner_fetches_every_bucket_whole_and_once() {
    let n = 3 * FETCH_CHUNK + 17;
    let (mut rt_a, mut rt_b, mut rt_c) = (Recorder::default(), Recorder::default(), Recorder::default());
    let (a, b) = (holding("master-a", n, &mut rt_a), holding("master-b", n, &mut rt_b));
    let mut c = node("master-c", &mut rt_c);
    assert_eq!(c.asking().unwrap().empty.len(), N_BUCKETS, "an empty master holds nothing in any bucket");
    let asking = c.asking().unwrap();
    let (buckets, summaries, whole) = a.diff_whole(&asking.digests, &asking.empty, &mut rt_a);
    assert!(buckets.is_empty() && summaries.is_empty(), "no summary for a master holding nothing");
    assert_eq!(whole.iter().map(|&(_, n)| n as usize).sum::<usize>(), n, "the sizes of the whole buckets");
    for (name, peer_node, rt) in [("master-a", &a, &mut rt_a), ("master-b", &b, &mut rt_b)] {
        let compared = compare(&mut c, &mut rt_c, name, peer_node, rt);
        assert_eq!((compared.n_newer_there, compared.whole), (n, whole.len()));
        assert!(compared.newer_here.is_empty() && compared.newer_where_empty.is_empty());
    }
    let mut fetched: Vec<u32> = Vec::new();
    let mut first = true;
    loop {
        let next_a = c.repair_next(&peer("master-a"));
        let next_b = c.repair_next(&peer("master-b"));
        if next_a.is_none() && next_b.is_none() {
            break;
        }
        for (fetch, name, from, rt) in [(next_a, "master-a", &a, &mut rt_a), (next_b, "master-b", &b, &mut rt_b)] {
            let Some(fetch) = fetch else { continue };
            assert!(fetch.ids.is_empty(), "ids come from summaries, and there were none");
            if first {
                assert!(fetch.n_in_buckets <= FIRST_WHOLE.max(whole[0].1 as usize), "the first fetch is small");
                first = false;
            }
            assert!(fetch.n_in_buckets <= FETCH_CHUNK || fetch.buckets.len() == 1);
            assert!(fetch.buckets.iter().all(|b| !fetched.contains(b)), "a bucket fetched twice");
            fetched.extend(&fetch.buckets);
            let decisions = from.fetch_whole(&fetch.buckets, rt).unwrap();
            assert_eq!(decisions.len(), fetch.n_in_buckets);
            assert!(decisions.iter().all(|d| fetch.asked(&d.id)));
            c.repair_fetched(&peer(name), &fetch, decisions, now(), &mut rt_c);
        }
    }
    assert_eq!(fetched.len(), whole.len(), "every bucket fetched once");
    assert_eq!(c.len(), n);
    assert_eq!(c.digests(), a.digests());
}

/// The links share what is left: a link's next fetch of whole buckets asks
/// for its part of what its plan has left (whoever claimed it), not a whole
/// chunk, so the other links are not left idle while one peer sends
/// everything.
#[test]
fn the_links_share_a_joins_whole_buckets() {
    let n = 1500;
    let (mut rt_a, mut rt_b, mut rt_c) = (Recorder::default(), Recorder::default(), Recorder::default());
    let (a, b) = (holding("master-a", n, &mut rt_a), holding("master-b", n, &mut rt_b));
    let mut c = node("master-c", &mut rt_c);
    for (name, peer_node, rt) in [("master-a", &a, &mut rt_a), ("master-b", &b, &mut rt_b)] {
        compare(&mut c, &mut rt_c, name, peer_node, rt);
    }
    let first_a = c.repair_next(&peer("master-a")).unwrap();
    let first_b = c.repair_next(&peer("master-b")).unwrap();
    let largest = (0..N_BUCKETS)
        .map(|bucket| (0..n).filter(|i| bucket_of(&MinionId::parse(&format!("m{i:05}")).unwrap()) == bucket).count())
        .max()
        .unwrap();
    let left = n - first_a.n_in_buckets - first_b.n_in_buckets;
    let second_a = c.repair_next(&peer("master-a")).unwrap();
    let second_b = c.repair_next(&peer("master-b")).unwrap();
    // Each link's part of what its plan holds (the other link's first fetch included).
    for (second, first) in [(&second_a, &first_a), (&second_b, &first_b)] {
        let part = (n - first.n_in_buckets).div_ceil(2) + largest;
        assert!(second.n_in_buckets <= part, "{} of {left}", second.n_in_buckets);
    }
    assert_eq!(second_a.n_in_buckets + second_b.n_in_buckets, left, "two fetches bring the rest");
}

/// A Diff answer brings one small whole bucket, picked by the answering
/// master's name (two peers, two buckets), with what a fetch of it brings;
/// applied as that fetch, it is not fetched again.
#[test]
fn a_diff_answer_brings_a_small_bucket_whole() {
    let n = 1500;
    let (mut rt_a, mut rt_b, mut rt_c) = (Recorder::default(), Recorder::default(), Recorder::default());
    let (a, b) = (holding("master-a", n, &mut rt_a), holding("master-b", n, &mut rt_b));
    let mut c = node("master-c", &mut rt_c);
    let asking = c.asking().unwrap();
    let (buckets, _, whole) = a.diff_whole(&asking.digests, &asking.empty, &mut rt_a);
    let ((bucket, count), decisions) = a.first_bucket(&whole, &mut rt_a).unwrap();
    assert!(whole.contains(&(bucket, count)) && count <= FIRST_BUCKET_MOST);
    assert_eq!(decisions, a.fetch_whole(&[bucket], &mut rt_a).unwrap(), "what a fetch of it brings");
    assert_eq!(decisions.len(), count as usize);
    let (_, _, whole_b) = b.diff_whole(&asking.digests, &asking.empty, &mut rt_b);
    let ((bucket_b, _), _) = b.first_bucket(&whole_b, &mut rt_b).unwrap();
    assert_ne!(bucket, bucket_b, "each peer its own bucket");
    let huge: Vec<Whole> = whole.iter().map(|&(b, _)| (b, FIRST_BUCKET_MOST + 1)).collect();
    assert!(a.first_bucket(&huge, &mut rt_a).is_none(), "none too large to slow the answer");
    // c applies it as a fetch of that bucket, and its plan drops it; but
    // not before the answer named it whole, nor once c holds something there.
    let link = peer("master-a");
    let fetch = Fetch { buckets: vec![bucket], n_in_buckets: count as usize, ..Fetch::default() };
    assert_eq!(c.repair_brought(&link, &fetch, decisions.clone(), now(), &mut rt_c), 0, "not asked");
    c.repair_begin(&link, &buckets, &whole).unwrap();
    assert_eq!(c.repair_brought(&link, &fetch, decisions.clone(), now(), &mut rt_c), count);
    assert_eq!(c.repair_brought(&link, &fetch, decisions, now(), &mut rt_c), 0, "held something there");
    c.repair_end(&link).unwrap();
    let mut first = true;
    while let Some(fetch) = c.repair_next(&link) {
        assert!(!fetch.buckets.contains(&bucket), "fetched again");
        // c holds its first keys: no small first fetch.
        assert!(!first || fetch.n_in_buckets > FIRST_WHOLE, "{} decisions", fetch.n_in_buckets);
        first = false;
        let decisions = a.fetch_whole(&fetch.buckets, &mut rt_a).unwrap();
        c.repair_fetched(&link, &fetch, decisions, now(), &mut rt_c);
    }
    assert_eq!(c.digests(), a.digests());
}

/// The room made for what whole buckets bring is bounded: a peer's counts
/// are its word, and every bucket said to hold 65,536 decisions made room
/// for 67,000,000 ids (gigabytes) before any was fetched.
#[test]
fn whole_buckets_claimed_huge_make_bounded_room() {
    let mut rt = Recorder::default();
    let mut c = node("master-c", &mut rt);
    let link = peer("master-a");
    let huge: Vec<Whole> = (0..N_BUCKETS as u32).map(|b| (b, MAX_WHOLE_PER_BUCKET)).collect();
    c.repair_begin(&link, &[], &huge).unwrap();
    c.repair_end(&link).unwrap();
    assert!(c.capacity() <= 2 * crate::node::MAX_PLANNED, "room for {} ids", c.capacity());
}

/// A bucket is named empty only where this master holds nothing at all:
/// a plain tombstone is in no digest, but a peer sending that bucket whole
/// would never learn of the delete (it is pushed only where it deletes
/// something, which only summaries show).
#[test]
fn a_bucket_holding_only_a_delete_is_not_named_empty() {
    let (mut rt_a, mut rt_c) = (Recorder::default(), Recorder::default());
    let mut c = node("master-c", &mut rt_c);
    push(&mut c, &mut rt_c, "master-a", vec![accept("web01", NOW_MS - 5000, "master-a")]);
    push(&mut c, &mut rt_c, "master-a", vec![delete_of_web01()]);
    let bucket = bucket_of(&MinionId::parse("web01").unwrap()) as u32;
    assert_eq!(c.digests().unwrap()[bucket as usize], 0, "a plain tombstone is in no digest");
    let asking = c.asking().unwrap();
    assert!(!asking.empty.contains(&bucket), "its bucket is not empty");
    assert_eq!(asking.empty.len(), N_BUCKETS - 1);
    // A peer still holding the accept answers that bucket with summaries,
    // and c's comparison pushes the delete.
    let mut a = node("master-a", &mut rt_a);
    push(&mut a, &mut rt_a, "master-a", vec![accept("web01", NOW_MS - 5000, "master-a")]);
    let (buckets, summaries, whole) = a.diff_whole(&asking.digests, &asking.empty, &mut rt_a);
    assert_eq!((buckets, whole), (vec![bucket], vec![]));
    let link = peer("master-a");
    c.repair_begin(&link, &[bucket], &[]).unwrap();
    c.repair_chunk(&link, summaries, &mut rt_c).unwrap();
    let compared = c.repair_end(&link).unwrap();
    assert_eq!(compared.newer_here, [MinionId::parse("web01").unwrap()], "the delete is pushed");
}

/// A master joins (its Hello answer says so, and its peers leave their
/// rounds to its fetches) only while it holds nothing at all: a delete
/// alone, in no digest, is something. A master offers something to its
/// peers' rounds once it holds anything.
#[test]
fn a_master_joins_while_it_holds_nothing_at_all() {
    let mut rt = Recorder::default();
    let mut c = node("master-c", &mut rt);
    assert!(c.joining() && !c.offers_something());
    push(&mut c, &mut rt, "master-a", vec![accept("web01", NOW_MS - 5000, "master-a")]);
    assert!(!c.joining() && c.offers_something());
    push(&mut c, &mut rt, "master-a", vec![delete_of_web01()]);
    assert_eq!(c.digests().unwrap().iter().filter(|&&d| d != 0).count(), 0, "only a plain tombstone");
    assert!(!c.joining() && c.offers_something(), "a delete is something");
}

/// What a master holds newer in buckets where its peer's answer gave
/// nothing is told apart: a peer asking for such buckets whole (a joining
/// master) fetches it, and the link leaves that push to it.
#[test]
fn what_a_peer_lacks_where_it_holds_nothing_is_told_apart() {
    let (mut rt_a, mut rt_c) = (Recorder::default(), Recorder::default());
    let mut a = holding("master-a", 50, &mut rt_a);
    // c holds one of a's ids, older.
    let mut c = node("master-c", &mut rt_c);
    push(&mut c, &mut rt_c, "master-d", vec![accept("m00007", NOW_MS - 2000, "master-d")]);
    let held = MinionId::parse("m00007").unwrap();
    let compared = compare(&mut a, &mut rt_a, "master-c", &c, &mut rt_c);
    assert_eq!(compared.newer_here, std::slice::from_ref(&held), "newer where c holds something");
    let shared = bucket_of(&held);
    let expected: BTreeSet<MinionId> =
        (0..50).map(|i| MinionId::parse(&format!("m{i:05}")).unwrap()).filter(|id| bucket_of(id) != shared).collect();
    assert_eq!(compared.newer_where_empty.iter().cloned().collect::<BTreeSet<_>>(), expected);
}

/// A peer's Fetch of whole buckets: plain tombstones are not sent (the
/// asker held nothing there), and several buckets holding more than a
/// Fetch's worth of ids together are refused, one is not.
#[test]
fn a_fetch_of_whole_buckets_is_bounded() {
    let mut rt = Recorder::default();
    let n = MAX_FETCH + 1;
    let a = holding("master-a", n, &mut rt);
    let all: Vec<u32> = (0..N_BUCKETS as u32).collect();
    assert_eq!(a.fetch_whole(&all, &mut rt), None, "more than MAX_FETCH ids in many buckets");
    let one = a.fetch_whole(&[3], &mut rt).unwrap();
    assert!(!one.is_empty() && one.iter().all(|d| bucket_of(&d.id) == 3));
    assert_eq!(a.fetch_whole(&[], &mut rt), Some(vec![]));
}

/// A Diff answer naming a bucket both summarised and whole, or a whole
/// bucket larger than any site, is refused.
#[test]
fn a_whole_bucket_no_agent_would_send_is_refused() {
    let mut rt = Recorder::default();
    let mut c = node("master-c", &mut rt);
    let link = peer("master-a");
    assert_eq!(c.repair_begin(&link, &[5], &[(5, 1)]), Err(BadAnswer::BucketTwice(5)));
    assert_eq!(c.repair_begin(&link, &[], &[(2000, 1)]), Err(BadAnswer::NoSuchBucket(2000)));
    let huge = MAX_WHOLE_PER_BUCKET + 1;
    assert_eq!(c.repair_begin(&link, &[], &[(7, huge)]), Err(BadAnswer::WholeTooLarge(7, huge)));
    // A summary in a bucket the answer sends whole.
    c.repair_begin(&link, &[], &[(bucket_of(&MinionId::parse("web01").unwrap()) as u32, 1)]).unwrap();
    let row = (
        MinionId::parse("web01").unwrap(),
        crate::core::replica::Summary::of(&accept("web01", NOW_MS, "master-a").seen()),
    );
    assert!(matches!(c.repair_chunk(&link, vec![row], &mut rt), Err(BadAnswer::OutsideBuckets(..))));
}
