//! Seeded, virtual-time simulation of N masters, each running the node
//! machine the agent ships (`keysync_machine::node`), under chaos.
//!
//! Every effect the machine asks for runs against a simulated world
//! (`runtime.rs`): the masters' folders as Salt 3006 and 3008 leave them
//! (`model.rs`), stores and audit logs that survive a kill -9 at any effect,
//! full disks, skewed clocks, inotify overflows, and a network that drops,
//! duplicates and reorders, with partitions. Each link runs the agent's link
//! machine (`keysync_machine::link`, driven by `world/sessions.rs`); pushes
//! that arrive together are handed to the machine together, as the agent does. Each seed runs twice and the two traces must
//! hash alike; `world/checker.rs` judges each run in Jepsen's set-full terms.
//!
//! `SIM_SEED=n` reruns one seed with its trace, `SIM_SEEDS=n` runs that many
//! (from `SIM_FIRST_SEED`, 0 by default), and the seeds of [`FOUND_BUGS`];
//! the run stops at the first failure unless `SIM_KEEP_GOING=1`.

use std::collections::BTreeSet;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use keysync_machine::core::keyfile::check_public_key;

use model::{key_bytes, Rng};
use world::Sim;

const DEFAULT_SEEDS: u64 = 200;
/// Seeds past the default range that found a bug once, run every time:
/// 46, 195, 780 and 833 found bugs in putting back a slow mass delete
/// (`put_back.rs`), 541 and 701 a held delete whose record a kill lost, 773
/// and 1482 a conflict told about an id compacted since (checker gaps; 1993
/// the same, the id decided again after), 1577 a retried claim's own write
/// read as an operator's delete, 2935 a held delete replaced by a newer one,
/// both let go once the key was not accepted (a checker gap), 5602 masters
/// releasing what others revert in the final rounds (a model gap), 9742 a
/// delete put back that had told a conflict; 3245, 3534 and 5138 a hold
/// made and given back in one offer after a failed write, which no write
/// named, and 7061 a hold whose end's write failed, kept in the store past
/// other writes that succeeded and held again after a kill (checker gaps
/// in counting holds: `world/audited.rs`); 2636 and 9562 a Salt 3008 run
/// read as a delete at the cap of a wait that began before it, every name
/// held by a temporary file whose end an inotify overflow lost
/// (`core/settle.rs`); 7114 (once repair plans of any size were shared
/// between links) a peer's claim written into a Salt 3008 run whose
/// removal of a pending key (an id not held) an inotify overflow lost;
/// 11981 was reported telling a conflict twice: the delete that won it
/// compacted on a master that then took the older accept back from masters
/// whose guard held that delete past tombstone_ttl, and met the delete
/// again once it was let through (a checker gap: `world/checker.rs`; the
/// machine's side is `node/tests/cold.rs`). Not reproduced at the commit
/// that listed it: its schedule there no longer runs into the gap.
/// Not listed: 3993 found a checker gap (a delete made while the agent was
/// down, which its start-up found but could not record on a full disk,
/// decided at the reading of the minion's new pending key and taken for a
/// misread pending key: `world/operators.rs`) only with every node flooding
/// its peers (`reached` disabled); with the shipped forwarding no seed
/// below 50,000 has that schedule.
const FOUND_BUGS: [u64; 21] = [
    46, 195, 541, 701, 773, 780, 833, 1482, 1577, 1993, 2636, 2935, 3245, 3534, 5138, 5602, 7061, 7114, 9562, 9742,
    11981,
];
const N_IDS: usize = 30;
/// Ids 0..N_PREEXISTING already have key files when the masters first start.
const N_PREEXISTING: usize = 8;
/// Operator actions, kills and partitions happen during this phase only.
const CHAOS_MS: u64 = 30_000;
/// After the chaos: long enough for every operator step to finish and settle (max_hold is 5 s).
const CALM_MS: u64 = 6_000;
/// Anti-entropy rounds on the reliable network after the final restart.
const FINAL_ROUNDS: u64 = 3;
/// Ticks further than this after the final restart are not run (the periodic rescan never ends).
const QUIET_AFTER_FINAL_MS: u64 = 30_000;
const EPOCH_MS: u64 = 1_700_000_000_000;
const MAX_SKEW_MS: u64 = 3_600_000;
const RESCAN_MS: u64 = 15_000;
/// Plain tombstones are compacted at a node's (re)start once this old: the
/// deletes of the first part of the chaos are forgotten before the end,
/// and no master is out of contact this long (a crash lasts at most 4 s, a
/// partition 6 s), as the rule in docs/operations.md asks.
const TOMBSTONE_TTL_MS: u64 = 20_000;
const DROP_PCT: u64 = 10;
const DUP_PCT: u64 = 5;
const OVERFLOW_PCT: u64 = 1;

/// Prints one line of a rerun seed's event trace; formats nothing otherwise.
macro_rules! trace {
    ($sim:expr, $($arg:tt)*) => {
        if $sim.trace {
            println!("{:>7} {}", $sim.now, format_args!($($arg)*));
        }
    };
}

mod model;
mod runtime;
mod world;

#[test]
fn masters_converge_under_chaos() {
    let env = |name: &str| std::env::var(name).ok().map(|v| v.parse::<u64>().expect("a number"));
    let one = env("SIM_SEED");
    // SIM_KEEP_GOING=1: run every seed and list every failing one.
    let keep_going = env("SIM_KEEP_GOING").is_some_and(|v| v != 0);
    let seeds: Vec<u64> = match one {
        Some(seed) => vec![seed],
        None => {
            let first = env("SIM_FIRST_SEED").unwrap_or(0);
            let mut seeds: Vec<u64> = (first..first + env("SIM_SEEDS").unwrap_or(DEFAULT_SEEDS)).collect();
            let more: Vec<u64> = FOUND_BUGS.iter().copied().filter(|seed| !seeds.contains(seed)).collect();
            seeds.extend(more);
            seeds
        }
    };
    let started = Instant::now();
    let next = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let totals = Mutex::new(Stats::default());
    let failures = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism().map_or(1, usize::from).min(seeds.len());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let idx = next.fetch_add(1, Ordering::Relaxed) as usize;
                if idx >= seeds.len() || (failed.load(Ordering::Relaxed) && !keep_going) {
                    break;
                }
                let seed = seeds[idx];
                let outcome = catch_unwind(AssertUnwindSafe(|| {
                    // Some seeds run the agent's redb store beside the model (`runtime/store.rs`).
                    runtime::with_real_store(runtime::real_store_for(seed), || {
                        let (stats, first) = Sim::new(seed, one.is_some()).run();
                        // The same seed must be the same run: no hidden source of nondeterminism.
                        let (_, second) = Sim::new(seed, false).run();
                        assert_eq!(first, second, "two runs of seed {seed} differ (trace hashes)");
                        stats
                    })
                }));
                match outcome {
                    Ok(stats) => totals.lock().unwrap().add(&stats),
                    Err(payload) => {
                        failed.store(true, Ordering::Relaxed);
                        let msg = payload
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        failures.lock().unwrap().push((seed, msg));
                    }
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort_by_key(|(seed, _)| *seed);
    if failures.len() > 1 {
        let seeds: Vec<u64> = failures.iter().map(|(seed, _)| *seed).collect();
        let _ = writeln!(std::io::stderr(), "sim: {} seeds failed: {seeds:?}", seeds.len());
    }
    if let Some((seed, msg)) = failures.into_iter().next() {
        panic!(
            "simulation failed with seed {seed}: {msg}\n\
             rerun (prints every event): SIM_SEED={seed} cargo test -p keysync-machine --test sim -- --nocapture"
        );
    }
    let t = totals.into_inner().unwrap();
    let mut latencies = t.latencies_ms.clone();
    latencies.sort_unstable();
    let quantile = |q: f64| latencies.get(((latencies.len() as f64 - 1.0) * q) as usize).copied().unwrap_or(0);
    // Straight to stderr, past the test harness's capture: one line per run.
    let _ = writeln!(
        std::io::stderr(),
        "sim: {} seeds in {:.1?}: {} decisions ({} by operators, {} at first starts); \
         lost 0, stale 0, resurrected 0, never applied 0; {} conflicts told, 0 missed, 0 duplicated; \
         audit records: {} conflicts and {} held deletes' ends recorded once, 0 unaudited; \
         propagation p50 {} ms, p99 {} ms, max {} ms (virtual); \
         {} messages dropped, {} duplicated, {} lost to a down or partitioned node, {} link timeouts, {} rounds, {} lags, {} grouped arrivals, {} decisions pushed live and {} by rounds, {} partial meshes, {} agents of an earlier release, {} empty joiners, {} buckets fetched whole and {} sent with a Diff answer, {} fetches made while the last was applied ({} of ids); \
         {} kills between inputs, {} inside one, {} full disks, {} partitions, {} inotify overflows; {} .dfn drops; \
         guard: {} mass deletes, {} bursts held, {} held deletes released and {} reverted by operators, \
         {} settled otherwise, 0 lost or applied unreleased; \
         tombstones: {} read back from the store, {} compacted; {} key files unchanged since a scan read them, not read again",
        seeds.len(),
        started.elapsed(),
        t.decisions,
        t.operator_decisions,
        t.startup_decisions,
        t.conflicts,
        t.conflict_records,
        t.held_records,
        quantile(0.5),
        quantile(0.99),
        latencies.last().copied().unwrap_or(0),
        t.dropped,
        t.duplicated,
        t.lost,
        t.timeouts,
        t.rounds,
        t.lagged,
        t.grouped,
        t.pushed,
        t.round_pushed,
        t.partial_meshes,
        t.earlier_release,
        t.empty_joiners,
        t.buckets_whole,
        t.buckets_sent_first,
        t.overlapped,
        t.overlapped_ids,
        t.crashes,
        t.kills_mid_input,
        t.full_disks,
        t.partitions,
        t.overflows,
        t.dfn,
        t.mass_deletes,
        t.bursts_held,
        t.released,
        t.reverted,
        t.settled,
        t.cold_read,
        t.compacted,
        t.unchanged,
    );
    if seeds.len() >= DEFAULT_SEEDS as usize {
        // The seeds must exercise what they check: tombstones left to the
        // store and read back, and tombstones compacted.
        assert!(t.cold_read > 0 && t.compacted > 0, "no tombstone was read back or compacted");
        // And a fetch made while the last one is applied.
        assert!(t.overlapped > 0, "no fetch was made while the last was applied");
        // Of ids too, not only of whole buckets (a plan several chunks long).
        assert!(t.overlapped_ids > 0, "no fetch of ids was made while the last was applied");
        // And scans that found key files unchanged since they read them.
        assert!(t.unchanged > 0, "no scan found a key file unchanged since it read it");
    }
}

#[derive(Debug, Default, Clone)]
pub(crate) struct Stats {
    decisions: u64,
    operator_decisions: u64,
    startup_decisions: u64,
    dropped: u64,
    duplicated: u64,
    lost: u64,
    timeouts: u64,
    rounds: u64,
    lagged: u64,
    grouped: u64,
    /// Decisions in the links' live pushes (not a round's).
    pub(crate) pushed: u64,
    /// Decisions in the rounds' pushes.
    pub(crate) round_pushed: u64,
    /// Seeds whose masters were not all peers of each other.
    pub(crate) partial_meshes: u64,
    /// Masters that neither ask for nor send whole buckets (as agents before 0.2).
    pub(crate) earlier_release: u64,
    /// Late joiners that started with empty folders (a new master).
    pub(crate) empty_joiners: u64,
    /// Buckets fetched whole (a master held nothing in them).
    pub(crate) buckets_whole: u64,
    /// Buckets sent with a Diff answer (`Node::first_bucket`).
    pub(crate) buckets_sent_first: u64,
    /// Fetches made while the node applied the last one (`Out::FetchApplying`).
    pub(crate) overlapped: u64,
    /// Of those, fetches of ids (not whole buckets).
    pub(crate) overlapped_ids: u64,
    crashes: u64,
    kills_mid_input: u64,
    full_disks: u64,
    partitions: u64,
    overflows: u64,
    dfn: u64,
    conflicts: u64,
    conflict_records: u64,
    held_records: u64,
    pub(crate) mass_deletes: u64,
    bursts_held: u64,
    released: u64,
    reverted: u64,
    settled: u64,
    pub(crate) cold_read: u64,
    pub(crate) compacted: u64,
    /// Key files a scan did not read again: unchanged since it read them.
    pub(crate) unchanged: u64,
    latencies_ms: Vec<u64>,
    verdicts: world::Verdicts,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.decisions += o.decisions;
        self.operator_decisions += o.operator_decisions;
        self.startup_decisions += o.startup_decisions;
        self.dropped += o.dropped;
        self.duplicated += o.duplicated;
        self.lost += o.lost;
        self.timeouts += o.timeouts;
        self.rounds += o.rounds;
        self.lagged += o.lagged;
        self.grouped += o.grouped;
        self.pushed += o.pushed;
        self.round_pushed += o.round_pushed;
        self.partial_meshes += o.partial_meshes;
        self.earlier_release += o.earlier_release;
        self.buckets_whole += o.buckets_whole;
        self.buckets_sent_first += o.buckets_sent_first;
        self.overlapped += o.overlapped;
        self.overlapped_ids += o.overlapped_ids;
        self.empty_joiners += o.empty_joiners;
        self.crashes += o.crashes;
        self.kills_mid_input += o.kills_mid_input;
        self.full_disks += o.full_disks;
        self.partitions += o.partitions;
        self.overflows += o.overflows;
        self.dfn += o.dfn;
        self.conflicts += o.verdicts.conflicts_told;
        self.conflict_records += o.verdicts.conflicts_recorded;
        self.held_records += o.verdicts.held_recorded;
        self.mass_deletes += o.mass_deletes;
        self.bursts_held += o.bursts_held;
        self.released += o.released;
        self.reverted += o.reverted;
        self.settled += o.settled;
        self.cold_read += o.cold_read;
        self.compacted += o.compacted;
        self.unchanged += o.unchanged;
        self.latencies_ms.extend(&o.verdicts.latencies_ms);
    }
}

#[test]
fn the_rng_is_stable() {
    // A seed must mean the same run everywhere: pin splitmix64's first outputs for seed 0.
    let mut rng = Rng(0);
    assert_eq!([rng.next(), rng.next()], [0xe220_a839_7b1d_cdaf, 0x6e78_9e6a_a1b9_65f4]);
}

#[test]
fn key_variants_are_valid_and_distinct() {
    let keys: BTreeSet<Vec<u8>> = (0..4).map(|v| key_bytes("m01", v)).collect();
    assert_eq!(keys.len(), 4);
    for key in &keys {
        assert_eq!(check_public_key(key), Ok(()));
    }
    assert!(check_public_key(&key_bytes("m01", 0)[..100]).is_err());
}
