//! The link machine, driven by hand: each test plays one session and reads
//! what the link asks for.

use super::*;
use crate::core::replica::Summary;
use crate::core::{Verdict, Version};

/// A round's fetches: chunk after chunk, whole buckets, the bucket a Diff answer brings.
mod fetching;

const INTERVAL: Duration = Duration::from_secs(60);
const AGAIN: Duration = Duration::from_secs(5);

fn settings() -> LinkSettings {
    LinkSettings { compare_chunk: 3, push_chunk: 2, ..LinkSettings::new(INTERVAL, AGAIN) }
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
        reached: Default::default(),
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
                Call::Begin { buckets: b, .. } => format!("Begin{b:?}"),
                Call::Compare(s) => format!("Compare{}", s.len()),
                Call::Load(ids) => format!("Load{}", ids.len()),
                Call::Apply { fetch, .. } => format!("Apply{}", fetch.ids.len()),
                Call::ApplyBrought { fetch, .. } => format!("ApplyBrought{:?}", fetch.buckets),
                call => format!("{call:?}"),
            },
            Out::Diff { .. } => "Diff".into(),
            Out::ReadDiff => "ReadDiff".into(),
            Out::Fetch(fetch) => format!("Fetch{}", fetch.ids.len()),
            Out::FetchApplying { fetch, applying, .. } => {
                format!("Fetch{}Applying{}", fetch.ids.len(), applying.ids.len())
            }
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
    assert_eq!(
        feed(link, Input::Answer(Answer::Digests(Some(Asking { digests: vec![1, 2], empty: vec![] })))),
        ["Diff"]
    );
}

#[test]
fn a_session_with_nothing_differing_is_up_and_sets_its_timer() {
    let mut link = TestLink::new(settings());
    to_diff(&mut link);
    let empty = Input::DiffChunk { buckets: vec![], summaries: vec![], whole: vec![], first: None };
    assert_eq!(feed(&mut link, empty), ["Contact", "Agreed", "Report(0,0,0,0)", "Up", "Rearm60s"]);
    // Live: what the node sends is pushed, queued batches in one push; the
    // peer's own decisions are not pushed back to it.
    link.handle(Input::Outgoing { from_peer: false, batch: 1 }, false);
    link.handle(Input::Outgoing { from_peer: true, batch: 2 }, false);
    link.handle(Input::Outgoing { from_peer: false, batch: 3 }, false);
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
    let first = Input::DiffChunk { buckets: vec![4, 9], summaries: summaries(0..2), whole: vec![], first: None };
    assert_eq!(feed(&mut link, first), ["Begin[4, 9]"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Checked(Ok(())))), ["ReadDiff"]);
    // Compared compare_chunk (3) at a time, the rest at the end.
    let second = Input::DiffChunk { buckets: vec![], summaries: summaries(2..4), whole: vec![], first: None };
    assert_eq!(feed(&mut link, second), ["Compare4"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Checked(Ok(())))), ["ReadDiff"]);
    let third = Input::DiffChunk { buckets: vec![], summaries: summaries(4..5), whole: vec![], first: None };
    assert_eq!(feed(&mut link, third), ["ReadDiff"]);
    assert_eq!(feed(&mut link, Input::DiffEnd), ["Compare1"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Checked(Ok(())))), ["Contact", "End"]);
    // Three ids newer here: loaded and pushed push_chunk (2) at a time, in order.
    let compared = Compared { n_newer_there: 4, newer_here: ids(10..13), full: false, ..Compared::default() };
    link.handle(Input::Answer(Answer::Compared(Ok(compared))), false);
    let out = drain(&mut link);
    assert!(matches!(&out[..], [Out::Call(Call::Load(first))] if *first == ids(10..12)), "{out:?}");
    let loaded = Input::Answer(Answer::Loaded(vec![decision(10), decision(11)]));
    link.handle(loaded, false);
    let out = drain(&mut link);
    assert!(matches!(&out[..], [Out::PushLoaded(_), Out::Call(Call::Load(rest))] if *rest == ids(12..13)), "{out:?}");
    assert_eq!(feed(&mut link, Input::Answer(Answer::Loaded(vec![decision(12)]))), ["PushLoaded1", "Next"]);
    // Then what the node plans to fetch, chunk by chunk, applied as it comes.
    assert_eq!(
        feed(&mut link, Input::Answer(Answer::Next(Some(Fetch { ids: ids(0..2), ..Fetch::default() })))),
        ["Fetch2"]
    );
    // The next ids are asked before these are applied: none are left.
    assert_eq!(feed(&mut link, Input::Fetched(vec![decision(0)])), ["Next"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Next(None))), ["Apply2"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Applied(1))), ["Report(2,4,3,1)", "Up", "Rearm60s"]);
}

/// The timer's round, up to the end of a Diff answer naming one bucket.
fn timed_round_to_its_end(link: &mut TestLink) {
    feed(link, Input::Due);
    feed(link, Input::HelloDone);
    feed(link, Input::Answer(Answer::Digests(Some(Asking { digests: vec![], empty: vec![] }))));
    feed(link, Input::DiffChunk { buckets: vec![1], summaries: vec![], whole: vec![], first: None });
    feed(link, Input::Answer(Answer::Checked(Ok(()))));
    feed(link, Input::DiffEnd);
}

#[test]
fn a_round_is_left_to_a_peer_fetching_from_this_node() {
    let mut link = TestLink::new(settings());
    feed(&mut link, Input::Connected);
    link.handle(Input::HelloDone, true);
    assert_eq!(names(&drain(&mut link)), ["Up", "Rearm5s"], "left whole: no digests sent");
    // A large push is left once the peer fetches (both rounds began at
    // once): the fetches still run.
    timed_round_to_its_end(&mut link);
    let compared = Compared { n_newer_there: 1, newer_here: ids(0..5), full: false, ..Compared::default() };
    assert_eq!(feed(&mut link, Input::Answer(Answer::Compared(Ok(compared)))), ["Load2"]);
    link.handle(Input::Answer(Answer::Loaded(vec![decision(0), decision(1)])), true);
    assert_eq!(names(&drain(&mut link)), ["PushLoaded2", "Next"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Next(None))), ["Report(1,1,5,0)", "Rearm5s"]);
    // A small push is not left: the peer's round may not fetch all this
    // node knows it lacks (an observer's claims did not reach the others).
    timed_round_to_its_end(&mut link);
    let compared = Compared { n_newer_there: 0, newer_here: ids(0..1), full: false, ..Compared::default() };
    link.handle(Input::Answer(Answer::Compared(Ok(compared))), true);
    assert_eq!(names(&drain(&mut link)), ["Load1"]);
    link.handle(Input::Answer(Answer::Loaded(vec![decision(5)])), true);
    assert_eq!(names(&drain(&mut link)), ["PushLoaded1", "Next"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Next(None))), ["Report(1,0,1,0)", "Rearm60s"]);
    // A round that follows a lag is never left: the peer's cannot know what was dropped here.
    link.handle(Input::Lagged, true);
    assert_eq!(names(&drain(&mut link)), ["Digests"]);
}

/// A round never holds a live push back, the session's first included:
/// what the node sends during a Hello or while the link waits for an
/// answer is pushed at once (a driver awaiting the answer takes it with
/// `poll_push`), however much. Before, a round held it back until it was
/// over, which with each decision pushed once, by its origin, was the
/// peer's whole delay.
#[test]
fn what_the_node_sends_during_a_round_is_pushed_at_once() {
    let mut link = TestLink::new(settings());
    assert_eq!(feed(&mut link, Input::Connected), ["Hello"]);
    link.handle(Input::Outgoing { from_peer: false, batch: 1 }, false);
    assert_eq!(names(&drain(&mut link)), ["Push[1]"], "during the first Hello");
    assert_eq!(feed(&mut link, Input::HelloDone), ["Digests"]);
    assert_eq!(
        feed(&mut link, Input::Answer(Answer::Digests(Some(Asking { digests: vec![1], empty: vec![] })))),
        ["Diff"]
    );
    // Awaiting the Diff answer: pushed one at a time or queued together,
    // never the peer's own.
    link.handle(Input::Outgoing { from_peer: false, batch: 2 }, false);
    assert_eq!(link.poll_push(), Some(vec![2]));
    assert_eq!(link.poll_push(), None);
    link.handle(Input::Outgoing { from_peer: false, batch: 3 }, false);
    link.handle(Input::Outgoing { from_peer: true, batch: 4 }, false);
    link.handle(Input::Outgoing { from_peer: false, batch: 5 }, false);
    assert_eq!(link.poll_push(), Some(vec![3, 5]));
    let empty = Input::DiffChunk { buckets: vec![], summaries: vec![], whole: vec![], first: None };
    assert_eq!(feed(&mut link, empty), ["Contact", "Agreed", "Report(0,0,0,0)", "Up", "Rearm60s"]);
    // A later round, the timer's: the same.
    assert_eq!(feed(&mut link, Input::Due), ["Hello"]);
    link.handle(Input::Outgoing { from_peer: false, batch: 6 }, false);
    assert_eq!(link.poll_push(), Some(vec![6]));
    assert_eq!(feed(&mut link, Input::HelloDone), ["Digests"]);
    assert_eq!(
        feed(&mut link, Input::Answer(Answer::Digests(Some(Asking { digests: vec![1], empty: vec![] })))),
        ["Diff"]
    );
    link.handle(Input::Outgoing { from_peer: false, batch: 7 }, false);
    assert_eq!(link.poll_push(), Some(vec![7]));
}

/// When the node's outgoing stream falls behind during a round, what was
/// dropped after the round's digests is found by another round, which
/// follows at once and is never left to the peer; before the digests, the
/// round itself finds it.
#[test]
fn a_lag_during_a_round_brings_another_after_it() {
    let mut link = TestLink::new(settings());
    to_diff(&mut link);
    link.handle(Input::Lagged, true);
    let first = Input::DiffChunk { buckets: vec![4], summaries: summaries(0..1), whole: vec![], first: None };
    assert_eq!(feed(&mut link, first), ["Begin[4]"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Checked(Ok(())))), ["ReadDiff"]);
    assert_eq!(feed(&mut link, Input::DiffEnd), ["Compare1"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Checked(Ok(())))), ["Contact", "End"]);
    let compared = Compared { n_newer_there: 0, newer_here: vec![], full: false, ..Compared::default() };
    assert_eq!(feed(&mut link, Input::Answer(Answer::Compared(Ok(compared)))), ["Next"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Next(None))), ["Report(1,0,0,0)", "Digests"]);
    assert_eq!(
        feed(&mut link, Input::Answer(Answer::Digests(Some(Asking { digests: vec![], empty: vec![] })))),
        ["Diff"]
    );
    let empty = Input::DiffChunk { buckets: vec![], summaries: vec![], whole: vec![], first: None };
    assert_eq!(feed(&mut link, empty), ["Contact", "Agreed", "Report(0,0,0,0)", "Up", "Rearm60s"]);

    // During the Hello, before the digests: the round that follows finds it.
    assert_eq!(feed(&mut link, Input::Due), ["Hello"]);
    link.handle(Input::Lagged, false);
    assert_eq!(feed(&mut link, Input::HelloDone), ["Digests"]);
    assert_eq!(
        feed(&mut link, Input::Answer(Answer::Digests(Some(Asking { digests: vec![], empty: vec![] })))),
        ["Diff"]
    );
    let empty = Input::DiffChunk { buckets: vec![], summaries: vec![], whole: vec![], first: None };
    assert_eq!(feed(&mut link, empty), ["Contact", "Agreed", "Report(0,0,0,0)", "Rearm60s"]);
}

#[test]
fn the_timer_firing_during_a_round_starts_another_after_it() {
    let mut link = TestLink::new(settings());
    to_diff(&mut link);
    assert_eq!(feed(&mut link, Input::Due), Vec::<String>::new());
    let empty = Input::DiffChunk { buckets: vec![], summaries: vec![], whole: vec![], first: None };
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
    feed(&mut link, Input::DiffChunk { buckets: vec![1], summaries: vec![], whole: vec![], first: None });
    feed(&mut link, Input::Answer(Answer::Checked(Ok(()))));
    let late = Input::DiffChunk { buckets: vec![2], summaries: vec![], whole: vec![], first: None };
    assert_eq!(
        feed(&mut link, late),
        ["LinkDown", "Fault(refused the peer's answer: the Diff answer names buckets after its first chunk)"]
    );
    assert!(!link.is_up());
    // Down, nothing more is asked: outgoing decisions, the timer, stale answers are ignored.
    link.handle(Input::Outgoing { from_peer: false, batch: 1 }, false);
    link.handle(Input::Due, false);
    link.handle(Input::Fetched(vec![]), false);
    link.handle(Input::Failed, false);
    assert_eq!(drain(&mut link).len(), 0);

    // The node refusing a chunk.
    to_diff(&mut link);
    feed(&mut link, Input::DiffChunk { buckets: vec![1], summaries: vec![], whole: vec![], first: None });
    let refused = Input::Answer(Answer::Checked(Err(BadAnswer::BucketTwice(1))));
    assert_eq!(
        feed(&mut link, refused),
        ["LinkDown", "Fault(refused the peer's answer: the Diff answer names bucket 1 twice)"]
    );

    // A fetch failing: the session's plan is dropped and its claims released.
    to_diff(&mut link);
    feed(&mut link, Input::DiffChunk { buckets: vec![1], summaries: vec![], whole: vec![], first: None });
    feed(&mut link, Input::Answer(Answer::Checked(Ok(()))));
    feed(&mut link, Input::DiffEnd);
    feed(&mut link, Input::Answer(Answer::Compared(Ok(Compared { n_newer_there: 1, ..Compared::default() }))));
    assert_eq!(
        feed(&mut link, Input::Answer(Answer::Next(Some(Fetch { ids: ids(0..1), ..Fetch::default() })))),
        ["Fetch1"]
    );
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
    feed(&mut link, Input::DiffChunk { buckets: vec![], summaries: vec![], whole: vec![], first: None });
    assert_eq!(feed(&mut link, Input::Lagged), ["Digests"]);
    feed(&mut link, Input::Answer(Answer::Digests(Some(Asking { digests: vec![], empty: vec![] }))));
    let empty = Input::DiffChunk { buckets: vec![], summaries: vec![], whole: vec![], first: None };
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

/// Each decision crosses each link once. Its origin names every peer it
/// pushes to in `reached`; a receiver forwards it only to peers outside
/// that list, its origin and its relays: in a full mesh, to none. In a
/// partial mesh it goes on, each hop naming the peers it adds. A decision
/// from an older agent names none: its receiver forwards it as before.
#[test]
fn a_decision_reaches_each_peer_once() {
    use crate::core::Relays;
    use crate::testkit::peer;
    let names = |r: &Relays| r.iter().map(str::to_string).collect::<Vec<_>>();
    let (b, c, d) = (peer("master-b"), peer("master-c"), peer("master-d"));
    // master-a made it; its links to b, c and d follow its outgoing decisions.
    let made = Decision { version: Version::new(1 << 50, "master-a"), ..decision(1) };
    let sent = Decision { reached: reached(&made, &[b.clone(), c.clone(), d.clone()]), ..made.clone() };
    assert_eq!(names(&sent.reached), ["master-b", "master-c", "master-d"]);
    // At master-b (it came from a, its origin): forwarded to nobody.
    for to in [&c, &d] {
        assert!(!pushes_to(&sent, to), "b pushes it to {to:?}");
    }
    // A partial mesh: a reached only b; b forwards to c and d, naming them.
    let sent = Decision { reached: reached(&made, std::slice::from_ref(&b)), ..made.clone() };
    assert!(pushes_to(&sent, &c) && pushes_to(&sent, &d));
    let onward = reached(&sent, &[peer("master-a"), c.clone(), d.clone()]);
    assert_eq!(names(&onward), ["master-b", "master-c", "master-d"], "not its origin, named apart");
    // From an agent that names no one: forwarded to every peer but its origin.
    assert!(pushes_to(&made, &c) && pushes_to(&made, &d) && !pushes_to(&made, &peer("master-a")));
}

/// The wait after a session's first round is `interval / 2` plus the
/// link's phase, drawn at random in `[0, interval)` by its driver; the
/// rounds after it come every `interval`. Links that connect together (an
/// agent's start, a site after an outage) thus run their rounds apart.
#[test]
fn a_links_rounds_keep_the_phase_its_driver_drew() {
    for (random, first) in [(0, 30), (45_000, 75), (60_000 * 7 + 10_000, 40)] {
        let mut link = TestLink::new(settings().with_phase(random));
        to_diff(&mut link);
        let empty = || Input::DiffChunk { buckets: vec![], summaries: vec![], whole: vec![], first: None };
        let outs = feed(&mut link, empty());
        assert_eq!(outs.last().map(String::as_str), Some(format!("Rearm{first}s").as_str()), "{random}");
        feed(&mut link, Input::Due);
        feed(&mut link, Input::HelloDone);
        feed(&mut link, Input::Answer(Answer::Digests(Some(Asking { digests: vec![], empty: vec![] }))));
        assert_eq!(feed(&mut link, empty()).last().map(String::as_str), Some("Rearm60s"));
    }
}

/// What the peer lacks in buckets where it holds nothing is pushed last,
/// and left, whatever its size, to a peer that fetches from this node (a
/// joining master asked for those buckets whole): one peer sends it each
/// key, not every peer. To a peer not fetching it is pushed.
#[test]
fn what_a_peer_lacks_where_it_holds_nothing_is_left_to_its_fetch() {
    let mut link = TestLink::new(settings());
    feed(&mut link, Input::Connected);
    feed(&mut link, Input::HelloDone);
    feed(&mut link, Input::Answer(Answer::Digests(Some(Asking { digests: vec![], empty: vec![] }))));
    feed(&mut link, Input::DiffChunk { buckets: vec![1], summaries: vec![], whole: vec![], first: None });
    feed(&mut link, Input::Answer(Answer::Checked(Ok(()))));
    feed(&mut link, Input::DiffEnd);
    let compared = Compared { newer_here: ids(0..1), newer_where_empty: ids(1..2), ..Compared::default() };
    link.handle(Input::Answer(Answer::Compared(Ok(compared))), true);
    assert_eq!(names(&drain(&mut link)), ["Load1"], "what it holds older is pushed");
    link.handle(Input::Answer(Answer::Loaded(vec![decision(0)])), true);
    assert_eq!(names(&drain(&mut link)), ["PushLoaded1", "Next"], "what it lacks where it holds nothing is left");
    assert_eq!(feed(&mut link, Input::Answer(Answer::Next(None))), ["Report(1,0,2,0)", "Up", "Rearm5s"]);
    // Not fetching: pushed, after the rest.
    timed_round_to_its_end(&mut link);
    let compared = Compared { newer_here: ids(0..1), newer_where_empty: ids(1..2), ..Compared::default() };
    assert_eq!(feed(&mut link, Input::Answer(Answer::Compared(Ok(compared)))), ["Load1"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Loaded(vec![decision(2)]))), ["PushLoaded1", "Load1"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Loaded(vec![decision(1)]))), ["PushLoaded1", "Next"]);
    assert_eq!(feed(&mut link, Input::Answer(Answer::Next(None))), ["Report(1,0,2,0)", "Rearm60s"]);
}

/// Each decision crosses the link once: a round leaves out what this
/// session pushed live (on its way, not applied there when the peer
/// answered the Diff), and a live push what a round pushed first (the node
/// decided it while the round compared). Not across sessions, nor another
/// version, nor what was pushed before the last round began.
#[test]
fn what_the_session_pushed_is_not_pushed_again() {
    let peer = PeerName::new("master-b").unwrap();
    let mut link = TestLink::new(settings());
    feed(&mut link, Input::Connected);
    feed(&mut link, Input::HelloDone);
    // Pushed live during the first round (the driver asks for each).
    assert!(link.push_live(&decision(0), &peer));
    assert!(!link.push_live(&decision(0), &peer), "pushed once");
    feed(&mut link, Input::Answer(Answer::Digests(Some(Asking { digests: vec![], empty: vec![] }))));
    feed(&mut link, Input::DiffChunk { buckets: vec![1], summaries: vec![], whole: vec![], first: None });
    feed(&mut link, Input::Answer(Answer::Checked(Ok(()))));
    feed(&mut link, Input::DiffEnd);
    let compared = Compared { newer_here: ids(0..2), ..Compared::default() };
    assert_eq!(feed(&mut link, Input::Answer(Answer::Compared(Ok(compared)))), ["Load2"]);
    let newer = Decision { version: Version::new(1 << 51, "master-a"), ..decision(0) };
    let loaded = vec![decision(0), decision(1), newer.clone()];
    let outs = drain_after(&mut link, Input::Answer(Answer::Loaded(loaded)));
    let pushed: Vec<&Decision> = outs
        .iter()
        .filter_map(|out| match out {
            Out::PushLoaded(d) => Some(d),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(pushed, [&decision(1), &newer], "what was pushed live is left out; another version is not");
    // The node's outgoing stream brings what the round pushed: not again.
    assert!(!link.push_live(&decision(1), &peer));
    assert_eq!(feed(&mut link, Input::Answer(Answer::Next(None))), ["Report(1,0,2,0)", "Up", "Rearm60s"]);
    // Two rounds later, what the first noted is forgotten (acknowledged
    // long ago: a peer lacking it then lost it, and is pushed it again).
    timed_round_to_its_end(&mut link);
    assert!(!link.push_live(&decision(1), &peer), "noted during the round before");
    feed(&mut link, Input::Answer(Answer::Compared(Ok(Compared::default()))));
    feed(&mut link, Input::Answer(Answer::Next(None)));
    timed_round_to_its_end(&mut link);
    assert!(link.push_live(&decision(1), &peer));
    // A new session forgets what the last one pushed: it may not have arrived.
    assert!(link.push_live(&decision(2), &peer));
    feed(&mut link, Input::Failed);
    feed(&mut link, Input::Connected);
    assert!(link.push_live(&decision(2), &peer));
    // Nor is a decision pushed to a peer that made it.
    let theirs = Decision { version: Version::new(1 << 50, "master-b"), ..decision(3) };
    assert!(!link.push_live(&theirs, &peer));
}

fn drain_after(link: &mut TestLink, input: Input<u32>) -> Vec<Out<u32>> {
    link.handle(input, false);
    drain(link)
}
