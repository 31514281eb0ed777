//! The periodic rescan's memory: what it holds beyond the folders' listing.
//!
//! At 1,000,000 keys the rescan (every 5 minutes by default) held 120 MiB
//! above the agent's resident memory: beside the listing, one copy of every
//! listed name and one of every id held, before their dedup. A master
//! serving a join peaked at 258–262 MiB because its rescan fell inside it.
//! This binary counts the heap (its own global allocator) and runs one test,
//! so nothing else allocates meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keysync_machine::core::settle::SettleTimings;
use keysync_machine::core::Folder;
use keysync_machine::node::testing::Recorder;
use keysync_machine::node::{GuardSettings, Loaded, Node, Now, Settings};
use keysync_machine::testkit::PUB;

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes allocated at most while `f` runs, above what was allocated before.
fn peak_above<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = CURRENT.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed) - before)
}

const N_KEYS: usize = 20_000;

#[test]
fn a_rescan_holds_little_more_than_the_listing_of_the_folders() {
    let mut rt = Recorder::default();
    for i in 0..N_KEYS {
        // Names a little longer than a short host name, as on real sites.
        rt.folders.put(Folder::Accepted, &format!("minion-{i:06}.dc1.example.com"), PUB.as_bytes());
    }
    let settings = Settings {
        node: "master-a".into(),
        max_clock_skew: Duration::from_secs(60),
        rescan_interval: Duration::from_secs(300),
        rescan_step: keysync_machine::node::RESCAN_STEP,
        fetch_chunk: keysync_machine::node::FETCH_CHUNK,
        settle: SettleTimings::default(),
        observe: false,
        guard: GuardSettings { enabled: false, ..GuardSettings::default() },
        tombstone_ttl: Duration::from_secs(86_400),
        masters: [Arc::from("master-a")].into_iter().collect(),
    };
    let t0 = Instant::now();
    let wall_ms = 1_800_000_000_000;
    let mut node = Node::start(settings, Loaded::default(), Now { mono: t0, wall_ms }, &mut rt);
    assert_eq!(node.len(), N_KEYS, "the first start holds every key");
    rt.events.clear();

    // What a listing of the folders takes by itself (the runtime's, as the
    // rescan gets it).
    let (listing, listed) = peak_above(|| rt.folders.list());
    assert_eq!(listing.len(), N_KEYS);
    drop(listing);

    let later = Now { mono: t0 + Duration::from_secs(301), wall_ms: wall_ms + 301_000 };
    let ((), rescan) = peak_above(|| node.on_tick(later, &mut rt));
    eprintln!("a rescan of {N_KEYS} keys: {rescan} bytes at most above before; the listing alone {listed}");
    assert!(rescan >= listed, "the rescan ran: it listed the folders ({rescan} bytes at most, listing {listed})");
    assert!(rt.events.is_empty(), "nothing changed, nothing told: {:?}", rt.events);
    // The listing, and per name read at most what reading one takes.
    assert!(
        rescan <= listed + listed / 4,
        "the rescan of {N_KEYS} keys held {rescan} bytes at most, the listing alone {listed}"
    );
}
