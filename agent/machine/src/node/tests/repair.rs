//! A peer's Diff answer compared a chunk at a time (`repair.rs`): whatever
//! it holds, the comparison keeps a bounded plan, and an answer no agent
//! would send is refused (issue 27, item 5).

use super::*;
use crate::core::digest::bucket_of;
use crate::core::replica::Summary;
use crate::node::{BadAnswer, MAX_PLANNED, MAX_ROWS_PER_ID};

/// A made-up accept summary of `name`.
fn summary(name: &str, ms: u64) -> (MinionId, Summary) {
    let id = MinionId::parse(name).unwrap();
    let seen = crate::core::Seen {
        version: Version::new(ms << 16, "master-a"),
        kind: crate::core::VerdictKind::Accepted,
        fingerprint: Some(key("mwIDAQAB").fingerprint()),
        context: Default::default(),
    };
    (id, Summary::of(&seen))
}

fn all_buckets() -> Vec<u32> {
    (0..crate::core::digest::N_BUCKETS as u32).collect()
}

/// A peer answering with more ids than one round fetches (the review's
/// 4,000,000): the plan stops at MAX_PLANNED, says it is full, and the
/// next round plans what is still missing.
#[test]
fn a_huge_answer_plans_at_most_max_planned_and_says_so() {
    let mut rt = Recorder::default();
    let mut c = node("master-c", &mut rt);
    let n = MAX_PLANNED + 5_000;
    let mut rows: Vec<(MinionId, Summary)> = (0..n).map(|i| summary(&format!("m{i:07}"), NOW_MS - 1000)).collect();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    c.repair_begin(&peer("master-a"), &all_buckets(), &[]).unwrap();
    for chunk in rows.chunks(2_000) {
        c.repair_chunk(&peer("master-a"), chunk.to_vec(), &mut rt).unwrap();
    }
    let compared = c.repair_end(&peer("master-a")).unwrap();
    assert_eq!(compared.n_newer_there, MAX_PLANNED);
    assert!(compared.full, "the next round follows soon");
    assert!(compared.newer_here.is_empty());
    let mut planned = 0;
    while let Some(ids) = c.repair_next(&peer("master-a")) {
        planned += ids.ids.len();
    }
    assert_eq!(planned, MAX_PLANNED);
}

/// Buckets out of range or named twice, ids outside the named buckets, and
/// an id given more rows than an id can have are refused; a refused or
/// interrupted comparison leaves nothing behind.
#[test]
fn an_answer_no_agent_would_send_is_refused() {
    let mut rt = Recorder::default();
    let mut c = node("master-c", &mut rt);
    assert_eq!(c.repair_begin(&peer("master-a"), &[1024], &[]), Err(BadAnswer::NoSuchBucket(1024)));
    assert_eq!(c.repair_begin(&peer("master-a"), &[3, 7, 3], &[]), Err(BadAnswer::BucketTwice(3)));
    let row = summary("web01", NOW_MS - 1000);
    let bucket = bucket_of(&row.0) as u32;
    let other = (bucket + 1) % 1024;
    c.repair_begin(&peer("master-a"), &[other], &[]).unwrap();
    assert!(matches!(
        c.repair_chunk(&peer("master-a"), vec![row.clone()], &mut rt),
        Err(BadAnswer::OutsideBuckets(..))
    ));
    assert_eq!(c.repair_end(&peer("master-a")), Err(BadAnswer::NotComparing), "the refused comparison is dropped");
    // An id held here, given endless rows.
    push(
        &mut c,
        &mut rt,
        "master-a",
        vec![decision(Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 5000, "master-a", &[])],
    );
    let held = MinionId::parse("web01").unwrap();
    let rows: Vec<(MinionId, Summary)> =
        (0..=MAX_ROWS_PER_ID as u64).map(|i| (held.clone(), summary("web01", NOW_MS - 4000 + i).1)).collect();
    c.repair_begin(&peer("master-a"), &[bucket], &[]).unwrap();
    assert_eq!(c.repair_chunk(&peer("master-a"), rows, &mut rt), Err(BadAnswer::TooManyRows(held)));
    assert_eq!(c.repair_chunk(&peer("master-a"), Vec::new(), &mut rt), Err(BadAnswer::NotComparing));
}

/// Comparing in chunks finds what comparing the whole answer finds, even
/// where one id's rows are split between two chunks.
#[test]
fn chunks_compare_as_the_whole_answer() {
    let (mut rt_a, mut rt_b) = (Recorder::default(), Recorder::default());
    let mut a = node("master-a", &mut rt_a);
    let mut b = node("master-b", &mut rt_b);
    for i in 0..300u64 {
        let mut d = decision(Verdict::Accepted(key("mwIDAQAB")), NOW_MS - 9000 + i, "master-d", &[]);
        d.id = MinionId::parse(&format!("m{i:03}")).unwrap();
        if i % 3 != 0 {
            push(&mut a, &mut rt_a, "master-d", vec![d.clone()]);
        }
        if i % 2 == 0 {
            push(&mut b, &mut rt_b, "master-d", vec![d]);
        }
    }
    let (buckets, summaries) = a.diff(&b.digests().unwrap(), &mut rt_a);
    let whole = b.repair_compare_ids("master-a", &buckets, vec![summaries.clone()], &mut rt_b);
    b.link_down(&peer("master-a"));
    for size in [1, 7, 64] {
        let chunks: Vec<Summaries> = summaries.chunks(size).map(<[_]>::to_vec).collect();
        assert_eq!(b.repair_compare_ids("master-a", &buckets, chunks, &mut rt_b), whole, "chunks of {size}");
        b.link_down(&peer("master-a"));
    }
    assert!(whole.0 > 0 && !whole.1.is_empty(), "something to fetch and to push: {whole:?}");
}
