//! The core task's handling of queued requests.

use super::*;
use crate::core::{PublicKey, Verdict, Version};
use crate::disk::audit::AuditLog;
use crate::disk::pki::Owner;
use crate::disk::store::Store;
use keysync_machine::testkit::PUB;

fn core_in(dir: &std::path::Path) -> (Core, CoreHandle, mpsc::Receiver<Request>) {
    start(parts_in(dir)).unwrap()
}

/// What a core over `dir` is made of (its pki_dir, store and audit log there).
fn parts_in(dir: &std::path::Path) -> CoreParts {
    let pki_dir = dir.join("pki");
    std::fs::create_dir(&pki_dir).unwrap();
    let owner = Owner::of_path(dir).unwrap();
    let pki = Arc::new(crate::disk::pki::tests::open(&pki_dir));
    CoreParts {
        settings: CoreSettings {
            node: "b".into(),
            cachedir: dir.to_path_buf(),
            master_id: "b".into(),
            max_clock_skew: Duration::from_secs(60),
            rescan_interval: Duration::from_secs(3600),
            observe: false,
            // The guard's own tests are the machine's; here a delete applies at once.
            guard: keysync_machine::node::GuardSettings { enabled: false, ..Default::default() },
            tombstone_ttl: Duration::from_secs(86_400),
            masters: vec!["a".into(), "c".into()],
        },
        store: {
            std::fs::create_dir(dir.join("state")).unwrap();
            Arc::new(Store::open(&dir.join("state"), "b").unwrap())
        },
        pki,
        owner,
        audit: Arc::new(AuditLog::open(&dir.join("audit.jsonl"), "b").unwrap()),
        settle: crate::core::settle::SettleTimings::default(),
        metrics: Arc::new(crate::ops::metrics::Metrics::new("b")),
        watch: None,
    }
}

fn accept(id: &str, at: u64, node: &str) -> Decision {
    Decision {
        id: MinionId::parse(id).unwrap(),
        verdict: Verdict::Accepted(PublicKey::new(PUB.as_bytes())),
        // An hlc, as a running agent's clock issues it (milliseconds << 16).
        version: Version::new(at << 16, node),
        context: Default::default(),
        relays: Default::default(),
        reached: Default::default(),
    }
}

fn reject(id: &str, at: u64, node: &str) -> Decision {
    Decision { verdict: Verdict::Rejected(PublicKey::new(PUB.as_bytes())), ..accept(id, at, node) }
}

/// Pushes queued together from two peers are handled in one call, which
/// answers each with how many of its own decisions were applied. Decisions
/// about the same id from two of them are merged one after the other, as if
/// they had come separately: the later one meets the earlier as held (here:
/// concurrent, so a conflict is audited), and each peer's decisions are
/// forwarded to the others, never back to it.
#[test]
fn queued_pushes_are_applied_together_and_answered_each() {
    let dir = tempfile::tempdir().unwrap();
    let (mut core, handle, mut queue) = core_in(dir.path());
    // The link to "d" follows what the node sends: every batch names it.
    let mut outgoing = handle.follow(&keysync_machine::testkit::peer("d"));
    let now = wall_ms();
    let pushes = [
        ("c", vec![reject("web01", now - 10, "c"), accept("web03", now, "c")]),
        ("a", vec![accept("web01", now, "a"), accept("web02", now, "a")]),
        // Held by then: nothing new.
        ("a", vec![accept("web02", now, "a")]),
    ];
    let mut replies = Vec::new();
    let mut requests = Vec::new();
    for (from, decisions) in pushes {
        let (reply, rx) = oneshot::channel();
        replies.push(rx);
        requests.push(Request::Remote { from: keysync_machine::testkit::peer(from), decisions, reply });
    }
    let mut requests = requests.into_iter();
    let first = requests.next().unwrap();
    for request in requests {
        handle.requests.try_send(request).map_err(|_| "queue full").unwrap();
    }
    core.on_requests(first, &mut queue);
    assert!(queue.try_recv().is_err(), "every queued request handled");

    let counts: Vec<u32> = replies.into_iter().map(|mut rx| rx.try_recv().unwrap()).collect();
    assert_eq!(counts, [2, 2, 0]);
    assert_eq!(core.node.entry(&MinionId::parse("web01").unwrap()).unwrap().version, Version::new(now << 16, "a"));
    assert_eq!(core.effects.pki.list().unwrap().len(), 3);
    let audit = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    assert_eq!(audit.matches(r#""action":"conflict""#).count(), 1, "{audit}");
    let mut sent = Vec::new();
    while let Ok(out) = outgoing.receiver.try_recv() {
        assert_eq!(out.pushing.iter().map(|p| p.as_str()).collect::<Vec<_>>(), ["d"]);
        let ids: Vec<String> = out.decisions.iter().map(|d| d.id.to_string()).collect();
        sent.push((out.from.clone().unwrap(), ids));
    }
    sent.sort();
    let sent: Vec<(&str, Vec<&str>)> =
        sent.iter().map(|(from, ids)| (from.as_str(), ids.iter().map(String::as_str).collect())).collect();
    assert_eq!(sent, [("a", vec!["web01"]), ("a", vec!["web02"]), ("c", vec!["web01", "web03"])]);
}

/// Threads the core waited for work on (`on_park`), by name.
static PARKED_ON: std::sync::Mutex<Vec<Option<String>>> = std::sync::Mutex::new(Vec::new());

fn note_park() {
    PARKED_ON.lock().unwrap().push(std::thread::current().name().map(str::to_string));
}

fn stopped(core: CoreThread) -> Result<(), CoreStopped> {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(core.stopped())
}

/// The core runs on a thread of its own (issue 30: its writes and commits
/// block): driven here with no async runtime on the caller's side at all,
/// it applies and answers, waits for work on its own thread, and stops at
/// shutdown, after which its handle finds it gone.
#[test]
fn the_core_runs_on_a_thread_of_its_own_until_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let (starting, handle, requests) = prepare(parts_in(dir.path()));
    let (_events, events) = mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();
    let (core, started) = starting.spawn(events, requests, shutdown.clone(), Some(note_park)).unwrap();
    started.blocking_recv().unwrap().unwrap();

    let (reply, applied) = oneshot::channel();
    let decisions = vec![accept("web01", wall_ms(), "a")];
    handle
        .requests
        .blocking_send(Request::Remote { from: keysync_machine::testkit::peer("a"), decisions, reply })
        .map_err(|_| "gone")
        .unwrap();
    assert_eq!(applied.blocking_recv(), Ok(1));
    assert_eq!(core_count(&handle), Some(1));
    // With nothing left to do, it waits for work on its own thread.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !PARKED_ON.lock().unwrap().contains(&Some("keysync-core".into())) {
        assert!(std::time::Instant::now() < deadline, "{:?}", PARKED_ON.lock().unwrap());
        std::thread::sleep(Duration::from_millis(10));
    }

    shutdown.cancel();
    assert!(stopped(core).is_ok());
    assert_eq!(core_count(&handle), None, "the core is gone after shutdown");
    let audit = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    assert!(audit.contains(r#""minion":"web01""#), "{audit}");
}

/// The number of decisions the core holds, `None` once it is gone.
fn core_count(handle: &CoreHandle) -> Option<usize> {
    let (reply, count) = oneshot::channel();
    handle.requests.blocking_send(Request::Count { reply }).ok()?;
    count.blocking_recv().ok()
}

/// A core that stops while the agent is not stopping is told, so the agent
/// stops instead of running on without it: its folder events ended, or it
/// panicked.
#[test]
fn a_core_stopping_on_its_own_is_told() {
    let dir = tempfile::tempdir().unwrap();
    let (starting, _handle, requests) = prepare(parts_in(dir.path()));
    let (events_tx, events) = mpsc::unbounded_channel();
    let (core, _started) = starting.spawn(events, requests, CancellationToken::new(), None).unwrap();
    drop(events_tx);
    assert!(matches!(stopped(core), Err(CoreStopped::InputsEnded)));

    let panicking = async { panic!("a bug in the core") };
    let core = thread::spawn(panicking, CancellationToken::new(), None).unwrap();
    match stopped(core) {
        Err(CoreStopped::Panicked(message)) => assert_eq!(message, "a bug in the core"),
        other => panic!("{other:?}"),
    }
}

/// While the periodic rescan is under way its next step is due at once
/// (`keysync_machine::node::RESCAN_STEP` names per turn), and the loop
/// takes the timer before requests (`biased`): requests that came meanwhile
/// must still be handled between two steps, not after the last. Here a
/// rescan is always due (every millisecond, over three steps' worth of
/// keys), and a request is still answered.
#[test]
fn a_request_is_answered_while_the_rescan_is_always_due() {
    let dir = tempfile::tempdir().unwrap();
    let mut parts = parts_in(dir.path());
    parts.settings.rescan_interval = Duration::from_millis(1);
    let minions = dir.path().join("pki").join("minions");
    for i in 0..3 * keysync_machine::node::RESCAN_STEP {
        std::fs::write(minions.join(format!("k{i:06}")), PUB).unwrap();
    }
    let (starting, handle, requests) = prepare(parts);
    let (_events, events) = mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();
    let (core, started) = starting.spawn(events, requests, shutdown.clone(), None).unwrap();
    started.blocking_recv().unwrap().unwrap();

    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let (reply, count) = oneshot::channel();
    handle.requests.blocking_send(Request::Count { reply }).map_err(|_| "gone").unwrap();
    let answered = runtime.block_on(async { tokio::time::timeout(Duration::from_secs(60), count).await });
    assert_eq!(answered.ok().and_then(Result::ok), Some(3 * keysync_machine::node::RESCAN_STEP));
    shutdown.cancel();
    assert!(stopped(core).is_ok());
}

/// Events lost several times in one burst are listed and read again at
/// the last loss only, its reason naming each reason once and how many;
/// once, or never, the burst says so.
#[test]
fn a_burst_with_events_lost_several_times_lists_every_name_at_the_last() {
    let change = |name: &str| WatchEvent::Change {
        folder: keysync_machine::core::Folder::Pending,
        name: name.to_string(),
        change: keysync_machine::core::settle::FsChange::Closed,
    };
    let lost = |why: &str| WatchEvent::Rescan(why.to_string());
    let overflow = "inotify queue overflow";
    let burst = [change("web01"), lost(overflow), change("web02"), lost(overflow), lost(overflow), change("web03")];
    assert_eq!(
        Losses::of(&burst),
        Losses { last: Some(4), why: "inotify queue overflow (3 times in one burst of events)".into() }
    );
    let burst = [lost("the watch failed"), change("web01"), lost(overflow)];
    assert_eq!(
        Losses::of(&burst),
        Losses {
            last: Some(2),
            why: "the watch failed; inotify queue overflow (2 times in one burst of events)".into()
        }
    );
    assert_eq!(Losses::of(&[change("web01"), lost(overflow)]), Losses { last: Some(1), why: overflow.into() });
    assert_eq!(Losses::of(&[change("web01")]), Losses { last: None, why: String::new() });
}
