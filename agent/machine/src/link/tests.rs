//! The link machine, driven by hand: each test plays one session and reads
//! what the link asks for.

use super::*;
use crate::core::replica::Summary;
use crate::core::{Verdict, Version};

const INTERVAL: Duration = Duration::from_secs(60);
const AGAIN: Duration = Duration::from_secs(5);

fn settings() -> LinkSettings {
    LinkSettings { compare_chunk: 3, max_held_back: 10, push_chunk: 2, ..LinkSettings::new(INTERVAL, AGAIN) }
}

fn id(i: usize) -> MinionId {
    MinionId::parse(&format!("web{i}")).unwrap()
}

fn ids(range: std::ops::Range<usize>) -> Vec<MinionId> {
    range.map(id).collect()
}

fn decision(i: usize) -> Decision {
    Decision {
        id: id(i),
        verdict: Verdict::Deleted,
        version: Version::new(1 << 50, "master-c"),
        context: Default::default(),
        relays: Default::default(),
    }
}

fn summaries(range: std::ops::Range<usize>) -> Summaries {
    range.map(|i| (id(i), Summary::tombstone(Version::new(1 << 50, "master-c")))).collect()
}

/// A link with batches named by a number.
type TestLink = Link<u32>;

/// Everything the link asks for now.
fn drain(link: &mut TestLink) -> Vec<Out<u32>> {
    std::iter::from_fn(|| link.poll()).collect()
}

/// A short name per output, to compare whole sequences.
fn names(outs: &[Out<u32>]) -> Vec<String> {
    outs.iter()
        .map(|out| match out {
            Out::Hello => "Hello".into(),
            Out::Call(call) => match call {
                Call::Begin(b) => format!("Begin{b:?}"),
                Call::Compare(s) => format!("Compare{}", s.len()),
                Call::Load(ids) => format!("Load{}", ids.len()),
                Call::Apply { ids, .. } => format!("Apply{}", ids.len()),
                call => format!("{call:?}"),
            },
            Out::Diff(_) => "Diff".into(),
            Out::ReadDiff => "ReadDiff".into(),
            Out::Fetch(ids) => format!("Fetch{}", ids.len()),
            Out::Push(batches) => format!("Push{batches:?}"),
            Out::PushLoaded(d) => format!("PushLoaded{}", d.len()),
            Out::Up => "Up".into(),
            Out::Report(r) => {
                format!("Report({},{},{},{})", r.differing_buckets, r.we_lacked, r.peer_lacked, r.applied)
            }
            Out::Rearm(d) => format!("Rearm{}s", d.as_secs()),
            Out::Fault(f) => format!("Fault({f})"),
        })
        .collect()
}

fn feed(link: &mut TestLink, input: Input<u32>) -> Vec<String> {
    link.handle(input, false);
    names(&drain(link))
}

/// Connected, Hello done, digests sent: the link reads the Diff answer.
fn to_diff(link: &mut TestLink) {
    assert_eq!(feed(link, Input::Connected), ["Hello"]);
    assert_eq!(feed(link, Input::HelloDone), ["Digests"]);
    assert_eq!(feed(link, Input::Answer(Answer::Digests(Some(vec![1, 2])))), ["Diff"]);
}

#[test]
fn a_session_with_nothing_differing_is_up_and_sets_its_timer() {
    let mut link = TestLink::new(settings());
    to_diff(&mut link);
    let empty = Input::DiffChunk { buckets: vec![], summaries: vec![] };
    assert_eq!(feed(&mut link, empty), ["Contact", "Agreed", "Report(0,0,0,0)", "Up", "Rearm60s"]);
    // Live: what the node sends is pushed, queued batches in one push; the
    // peer's own decisions are not pushed back to it.
    link.handle(Input::Outgoing { from_peer: false, n: 1, batch: 1 }, false);
    link.handle(Input::Outgoing { from_peer: true, n: 1, batch: 2 }, false);
    link.handle(Input::Outgoing { from_peer: false, n: 1, batch: 3 }, false);
    assert_eq!(names(&drain(&mut link)), ["Push[1, 3]"]);
    // The timer: Hello again, then a round.
    assert_eq!(feed(&mut link, Input::Due), ["Hello"]);
    assert_eq!(feed(&mut link, Input::HelloDone), ["Digests"]);
}

#[test]
fn a_round_compares_in_chunks_pushes_then_fetches() {
    let mut link = TestLink::new(settings());
    to_diff(&mut link);
    // The first chunk names the buckets: checked before its summaries are compared.
    let first = Input::DiffChunk { buckets: vec![4, 9], summaries: summaries(0..2) };
    assert_eq!(feed(&mut link, first), ["Begin[4, 9]"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Checked(Ok(())))), ["ReadDiff"]);
    // Compared compare_chunk (3) at a time, the rest at the end.
    let second = Input::DiffChunk { buckets: vec![], summaries: summaries(2..4) };
    assert_eq!(feed(&mut link, second), ["Compare4"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Checked(Ok(())))), ["ReadDiff"]);
    let third = Input::DiffChunk { buckets: vec![], summaries: summaries(4..5) };
    assert_eq!(feed(&mut link, third), ["ReadDiff"]);
    assert_eq!(feed(&mut link, Input::DiffEnd), ["Compare1"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Checked(Ok(())))), ["Contact", "End"]);
    // Three ids newer here: loaded and pushed push_chunk (2) at a time, in order.
    let compared = Compared { n_newer_there: 4, newer_here: ids(10..13), full: false };
    link.handle(Input::Answer(Answer::Compared(Ok(compared))), false);
    let out = drain(&mut link);
    assert!(matches!(&out[..], [Out::Call(Call::Load(first))] if *first == ids(10..12)), "{out:?}");
    let loaded = Input::Answer(Answer::Loaded(vec![decision(10), decision(11)]));
    link.handle(loaded, false);
    let out = drain(&mut link);
    assert!(matches!(&out[..], [Out::PushLoaded(_), Out::Call(Call::Load(rest))] if *rest == ids(12..13)), "{out:?}");
    assert_eq!(feed(&mut link, Input::Answer(Answer::Loaded(vec![decision(12)]))), ["PushLoaded1", "Next"]);
    // Then what the node plans to fetch, chunk by chunk, applied as it comes.
    assert_eq!(feed(&mut link, Input::Answer(Answer::Next(Some(ids(0..2))))), ["Fetch2"]);
    assert_eq!(feed(&mut link, Input::Fetched(vec![decision(0)])), ["Apply2"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Applied(1))), ["Next"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Next(None))), ["Report(2,4,3,1)", "Up", "Rearm60s"]);
}

#[test]
fn a_full_plan_brings_the_next_round_sooner() {
    let mut link = TestLink::new(settings());
    to_diff(&mut link);
    feed(&mut link, Input::DiffChunk { buckets: vec![1], summaries: vec![] });
    feed(&mut link, Input::Answer(Answer::Checked(Ok(()))));
    feed(&mut link, Input::DiffEnd);
    let compared = Compared { n_newer_there: 9, newer_here: vec![], full: true };
    assert_eq!(feed(&mut link, Input::Answer(Answer::Compared(Ok(compared)))), ["Next"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Next(None))), ["Report(1,9,0,0)", "Up", "Rearm5s"]);
}

#[test]
fn a_round_is_left_to_a_peer_fetching_from_this_node() {
    let mut link = TestLink::new(settings());
    feed(&mut link, Input::Connected);
    link.handle(Input::HelloDone, true);
    assert_eq!(names(&drain(&mut link)), ["Up", "Rearm5s"], "left whole: no digests sent");
    // A large push is left once the peer fetches (both rounds began at once):
    // the fetches still run.
    feed(&mut link, Input::Due);
    feed(&mut link, Input::HelloDone);
    feed(&mut link, Input::Answer(Answer::Digests(Some(vec![]))));
    feed(&mut link, Input::DiffChunk { buckets: vec![1], summaries: vec![] });
    feed(&mut link, Input::Answer(Answer::Checked(Ok(()))));
    feed(&mut link, Input::DiffEnd);
    let compared = Compared { n_newer_there: 1, newer_here: ids(0..5), full: false };
    assert_eq!(feed(&mut link, Input::Answer(Answer::Compared(Ok(compared)))), ["Load2"]);
    link.handle(Input::Answer(Answer::Loaded(vec![decision(0), decision(1)])), true);
    assert_eq!(names(&drain(&mut link)), ["PushLoaded2", "Next"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Next(None))), ["Report(1,1,5,0)", "Rearm5s"]);
    // A round that follows a lag is never left: the peer's cannot know what was dropped here.
    link.handle(Input::Lagged, true);
    assert_eq!(names(&drain(&mut link)), ["Digests"]);
}

#[test]
fn what_the_node_sends_during_a_round_is_pushed_after_it_up_to_a_bound() {
    let mut link = TestLink::new(settings());
    to_diff(&mut link);
    for (batch, n) in [(1, 3), (2, 4), (3, 3)] {
        link.handle(Input::Outgoing { from_peer: false, n, batch }, false);
    }
    link.handle(Input::Outgoing { from_peer: true, n: 50, batch: 4 }, false);
    assert_eq!(drain(&mut link).len(), 0, "held back");
    let empty = Input::DiffChunk { buckets: vec![], summaries: vec![] };
    assert_eq!(feed(&mut link, empty), ["Contact", "Agreed", "Report(0,0,0,0)", "Push[1, 2, 3]", "Up", "Rearm60s"]);

    // Past max_held_back (10), nothing is kept: another round, not to be left.
    feed(&mut link, Input::Due);
    feed(&mut link, Input::HelloDone);
    link.handle(Input::Outgoing { from_peer: false, n: 6, batch: 5 }, false);
    link.handle(Input::Outgoing { from_peer: false, n: 6, batch: 6 }, false);
    link.handle(Input::Answer(Answer::Digests(Some(vec![]))), true);
    let out = drain(&mut link);
    assert_eq!(names(&out), ["Diff"]);
    link.handle(Input::DiffChunk { buckets: vec![], summaries: vec![] }, true);
    assert_eq!(names(&drain(&mut link)), ["Contact", "Agreed", "Report(0,0,0,0)", "Digests"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Digests(Some(vec![])))), ["Diff"]);
    let empty = Input::DiffChunk { buckets: vec![], summaries: vec![] };
    assert_eq!(feed(&mut link, empty), ["Contact", "Agreed", "Report(0,0,0,0)", "Rearm60s"]);

    // A lag during a round drops what was held, too.
    feed(&mut link, Input::Due);
    feed(&mut link, Input::HelloDone);
    link.handle(Input::Outgoing { from_peer: false, n: 1, batch: 7 }, false);
    link.handle(Input::Lagged, false);
    feed(&mut link, Input::Answer(Answer::Digests(Some(vec![]))));
    let empty = Input::DiffChunk { buckets: vec![], summaries: vec![] };
    assert_eq!(feed(&mut link, empty), ["Contact", "Agreed", "Report(0,0,0,0)", "Digests"]);
}

#[test]
fn the_timer_firing_during_a_round_starts_another_after_it() {
    let mut link = TestLink::new(settings());
    to_diff(&mut link);
    assert_eq!(feed(&mut link, Input::Due), Vec::<String>::new());
    let empty = Input::DiffChunk { buckets: vec![], summaries: vec![] };
    assert_eq!(feed(&mut link, empty), ["Contact", "Agreed", "Report(0,0,0,0)", "Up", "Rearm60s", "Hello"]);
}

#[test]
fn a_stale_node_ends_its_round_at_once() {
    let mut link = TestLink::new(settings());
    feed(&mut link, Input::Connected);
    feed(&mut link, Input::HelloDone);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Digests(None))), ["Up", "Rearm60s"]);
}

#[test]
fn a_bad_answer_or_a_failure_ends_the_session_and_releases_its_claims() {
    let mut link = TestLink::new(settings());
    to_diff(&mut link);
    feed(&mut link, Input::DiffChunk { buckets: vec![1], summaries: vec![] });
    feed(&mut link, Input::Answer(Answer::Checked(Ok(()))));
    let late = Input::DiffChunk { buckets: vec![2], summaries: vec![] };
    assert_eq!(
        feed(&mut link, late),
        ["LinkDown", "Fault(refused the peer's answer: the Diff answer names buckets after its first chunk)"]
    );
    assert!(!link.is_up());
    // Down, nothing more is asked: outgoing decisions, the timer, stale answers are ignored.
    link.handle(Input::Outgoing { from_peer: false, n: 1, batch: 1 }, false);
    link.handle(Input::Due, false);
    link.handle(Input::Fetched(vec![]), false);
    link.handle(Input::Failed, false);
    assert_eq!(drain(&mut link).len(), 0);

    // The node refusing a chunk.
    to_diff(&mut link);
    feed(&mut link, Input::DiffChunk { buckets: vec![1], summaries: vec![] });
    let refused = Input::Answer(Answer::Checked(Err(BadAnswer::BucketTwice(1))));
    assert_eq!(
        feed(&mut link, refused),
        ["LinkDown", "Fault(refused the peer's answer: the Diff answer names bucket 1 twice)"]
    );

    // A fetch failing: the session's plan is dropped and its claims released.
    to_diff(&mut link);
    feed(&mut link, Input::DiffChunk { buckets: vec![1], summaries: vec![] });
    feed(&mut link, Input::Answer(Answer::Checked(Ok(()))));
    feed(&mut link, Input::DiffEnd);
    feed(&mut link, Input::Answer(Answer::Compared(Ok(Compared { n_newer_there: 1, ..Compared::default() }))));
    assert_eq!(feed(&mut link, Input::Answer(Answer::Next(Some(ids(0..1))))), ["Fetch1"]);
    assert_eq!(feed(&mut link, Input::Failed), ["LinkDown"]);

    // An answer the link did not ask for is its driver's bug: refused the same way.
    to_diff(&mut link);
    let wrong = feed(&mut link, Input::Fetched(vec![]));
    assert_eq!(
        wrong,
        ["LinkDown", "Fault(the link got fetched decisions while reading the Diff answer (a bug in its driver))"]
    );
}

#[test]
fn a_lag_between_rounds_runs_a_round_at_once_without_hello_or_timer() {
    let mut link = TestLink::new(settings());
    to_diff(&mut link);
    feed(&mut link, Input::DiffChunk { buckets: vec![], summaries: vec![] });
    assert_eq!(feed(&mut link, Input::Lagged), ["Digests"]);
    feed(&mut link, Input::Answer(Answer::Digests(Some(vec![]))));
    let empty = Input::DiffChunk { buckets: vec![], summaries: vec![] };
    assert_eq!(feed(&mut link, empty), ["Contact", "Agreed", "Report(0,0,0,0)"], "the timer keeps its time");
}

#[test]
fn what_wants_an_answer() {
    assert!(Out::<u32>::Call(Call::Next).wants_answer());
    assert!(!Out::<u32>::Call(Call::Contact).wants_answer());
    assert!(Out::<u32>::ReadDiff.wants_answer());
    assert!(!Out::<u32>::Push(vec![1]).wants_answer());
}

/// A decision the node sends its peers goes to every peer but the master
/// that made it and those it passed through on its way here: a decision
/// master-c made, relayed by master-d, reached this node from master-e.
#[test]
fn a_decision_is_never_pushed_to_its_origin_or_back_along_its_path() {
    use crate::core::Relays;
    use crate::testkit::peer;
    let mine = Decision { version: Version::new(1 << 50, "master-a"), ..decision(1) };
    assert!(pushes_to(&mine, &peer("master-c")), "this node's own decision goes to every peer");
    let relayed = Decision { relays: Relays::new(["master-d".into(), "master-e".into()]), ..decision(2) };
    for (to, pushed) in [("master-c", false), ("master-d", false), ("master-e", false), ("master-f", true)] {
        assert_eq!(pushes_to(&relayed, &peer(to)), pushed, "to {to}");
    }
}
