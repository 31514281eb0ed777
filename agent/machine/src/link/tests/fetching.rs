//! A round's fetches, driven by hand: the next chunk fetched while the last
//! is applied, a full plan, whole buckets, the bucket a Diff answer brings.

use super::*;

/// Connected, a Diff answer naming one bucket read and checked, and the
/// node's comparison handed in: what the link asks for then.
fn to_compared(link: &mut TestLink, compared: Compared) -> Vec<String> {
    to_diff(link);
    feed(link, Input::DiffChunk { buckets: vec![1], summaries: vec![], whole: vec![], first: None });
    feed(link, Input::Answer(Answer::Checked(Ok(()))));
    feed(link, Input::DiffEnd);
    feed(link, Input::Answer(Answer::Compared(Ok(compared))))
}

/// A fetch's decisions are applied while the next fetch travels: the node
/// is asked for the next ids first (the fetched ones stay claimed), and the
/// driver carries the fetch and the apply at once. A joining master's
/// writes and its peer's answers took turns (the link machine lost the
/// overlap the agent's driver had before it): a join of 200,000 keys from
/// one peer took 34.7 s (median of four runs) where it now takes 20.9.
#[test]
fn the_next_fetch_travels_while_the_last_is_applied() {
    let mut link = TestLink::new(settings());
    let compared = || Compared { n_newer_there: 6, ..Compared::default() };
    assert_eq!(to_compared(&mut link, compared()), ["Next"]);
    let fetch = |range| Input::Answer(Answer::Next(Some(Fetch { ids: ids(range), ..Fetch::default() })));
    assert_eq!(feed(&mut link, fetch(0..3)), ["Fetch3"]);
    assert_eq!(feed(&mut link, Input::Fetched(vec![decision(0), decision(1), decision(2)])), ["Next"]);
    link.handle(fetch(3..5), false);
    let out = drain(&mut link);
    match &out[..] {
        [Out::FetchApplying { fetch, applying, decisions }] => {
            assert_eq!((fetch.ids.clone(), applying.ids.clone()), (ids(3..5), ids(0..3)));
            assert_eq!(decisions.len(), 3);
        }
        other => panic!("{:?}", names(other)),
    }
    // The apply's count first, then the fetch's answer.
    assert!(feed(&mut link, Input::Answer(Answer::Applied(3))).is_empty());
    assert_eq!(feed(&mut link, Input::Fetched(vec![decision(3)])), ["Next"]);
    assert_eq!(feed(&mut link, fetch(5..6)), ["Fetch1Applying2"]);
    // The fetch failing while the node applies: the count still comes in, then the session ends.
    assert!(feed(&mut link, Input::Answer(Answer::Applied(1))).is_empty());
    assert_eq!(feed(&mut link, Input::Failed), ["LinkDown"]);

    // Handed in the other way round, it is the driver's bug.
    to_compared(&mut link, compared());
    feed(&mut link, fetch(0..3));
    feed(&mut link, Input::Fetched(vec![decision(0)]));
    assert_eq!(feed(&mut link, fetch(3..5)), ["Fetch2Applying3"]);
    assert_eq!(
        feed(&mut link, Input::Fetched(vec![])),
        ["LinkDown", "Fault(the link got fetched decisions while fetching while applying (a bug in its driver))"]
    );
}

#[test]
fn a_full_plan_brings_the_next_round_sooner() {
    let mut link = TestLink::new(settings());
    let compared = Compared { n_newer_there: 9, newer_here: vec![], full: true, ..Compared::default() };
    assert_eq!(to_compared(&mut link, compared), ["Next"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Next(None))), ["Report(1,9,0,0)", "Up", "Rearm5s"]);
}

/// A round that fetched whole buckets and applied something is followed by
/// another soon: what the peer decided meanwhile, or left to this node's
/// fetch after its answer, is compared then. One that applied nothing (all
/// refused, or already held) waits the whole interval.
#[test]
fn a_round_that_fetched_whole_buckets_is_followed_soon() {
    for (applied, rearm) in [(3, "Rearm5s"), (0, "Rearm60s")] {
        let mut link = TestLink::new(settings());
        feed(&mut link, Input::Connected);
        feed(&mut link, Input::HelloDone);
        let asking = Asking { digests: vec![0; 4], empty: vec![0, 1, 2, 3] };
        assert_eq!(feed(&mut link, Input::Answer(Answer::Digests(Some(asking)))), ["Diff"]);
        let chunk = Input::DiffChunk { buckets: vec![], summaries: vec![], whole: vec![(2, 3)], first: None };
        assert_eq!(feed(&mut link, chunk), ["Begin[]"], "whole buckets alone are a difference");
        feed(&mut link, Input::Answer(Answer::Checked(Ok(()))));
        feed(&mut link, Input::DiffEnd);
        let compared = Compared { n_newer_there: 3, whole: 1, ..Compared::default() };
        assert_eq!(feed(&mut link, Input::Answer(Answer::Compared(Ok(compared)))), ["Next"]);
        let fetch = Fetch { buckets: vec![2], n_in_buckets: 3, ..Fetch::default() };
        assert_eq!(feed(&mut link, Input::Answer(Answer::Next(Some(fetch)))), ["Fetch0"]);
        assert_eq!(feed(&mut link, Input::Fetched(vec![])), ["Next"]);
        assert_eq!(feed(&mut link, Input::Answer(Answer::Next(None))), ["Apply0"]);
        let end = feed(&mut link, Input::Answer(Answer::Applied(applied)));
        assert_eq!(end.last().map(String::as_str), Some(rearm), "{applied} applied: {end:?}");
    }
}

/// The bucket a Diff answer brings is applied as a fetch of it, once the
/// buckets are checked and before the first chunk's summaries are compared;
/// what it applied counts in the round's report. Only the first chunk may
/// bring one.
#[test]
fn the_bucket_a_diff_answer_brings_is_applied_first() {
    let mut link = TestLink::new(settings());
    feed(&mut link, Input::Connected);
    feed(&mut link, Input::HelloDone);
    let asking = Asking { digests: vec![0; 4], empty: vec![2, 3] };
    feed(&mut link, Input::Answer(Answer::Digests(Some(asking))));
    let fetch = Fetch { buckets: vec![2], n_in_buckets: 2, ..Fetch::default() };
    let first = Some((fetch, vec![decision(0), decision(1)]));
    let chunk = Input::DiffChunk { buckets: vec![1], summaries: summaries(5..8), whole: vec![(2, 2), (3, 9)], first };
    assert_eq!(feed(&mut link, chunk), ["Begin[1]"]);
    assert_eq!(
        feed(&mut link, Input::Answer(Answer::Checked(Ok(())))),
        ["ApplyBrought[2]"],
        "applied as a fetch of bucket 2"
    );
    assert_eq!(feed(&mut link, Input::Answer(Answer::Applied(2))), ["Compare3"], "then the summaries held");
    feed(&mut link, Input::Answer(Answer::Checked(Ok(()))));
    feed(&mut link, Input::DiffEnd);
    let compared = Compared { n_newer_there: 9, whole: 2, ..Compared::default() };
    assert_eq!(feed(&mut link, Input::Answer(Answer::Compared(Ok(compared)))), ["Next"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Next(None))), ["Report(3,9,0,2)", "Up", "Rearm5s"]);
    // A later chunk bringing a bucket is an answer no agent sends.
    let mut link = TestLink::new(settings());
    feed(&mut link, Input::Connected);
    feed(&mut link, Input::HelloDone);
    feed(&mut link, Input::Answer(Answer::Digests(Some(Asking::default()))));
    feed(&mut link, Input::DiffChunk { buckets: vec![1], summaries: vec![], whole: vec![], first: None });
    feed(&mut link, Input::Answer(Answer::Checked(Ok(()))));
    let fetch = Fetch { buckets: vec![2], n_in_buckets: 1, ..Fetch::default() };
    let late = Input::DiffChunk { buckets: vec![], summaries: vec![], whole: vec![], first: Some((fetch, vec![])) };
    let outs = feed(&mut link, late);
    assert!(outs.last().is_some_and(|out| out.starts_with("Fault")), "{outs:?}");
}
