//! Seeded, virtual-time simulation of N masters running the replication core under chaos.
//!
//! Each node is a bare `Replica` and `Settler` plus an in-memory model of its three key folders;
//! every effect (an operator's system call, a message, a timer) is an event in one queue ordered
//! by virtual time, so a seed replays exactly. `SIM_SEED=n` reruns one seed with its trace,
//! `SIM_SEEDS=n` runs more seeds than the default.
//!
//! `model` is what the masters' folders and Salt's operators do, `world` the nodes, the network
//! and the event loop (`world/replication`, `world/faults`), `world/verdict` the final checks.

use std::collections::BTreeSet;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use salt_keysync::core::keyfile::check_public_key;

use model::{key_bytes, Rng};
use world::Sim;

const DEFAULT_SEEDS: u64 = 200;
const N_IDS: usize = 30;
/// Ids 0..N_PREEXISTING already have key files when the masters first start.
const N_PREEXISTING: usize = 8;
/// Operator actions, crashes and partitions happen during this phase only.
const CHAOS_MS: u64 = 30_000;
/// After the chaos: long enough for every operator step to finish and settle (max_hold is 5 s).
const CALM_MS: u64 = 6_000;
/// Anti-entropy rounds on the reliable network after the final restart.
const FINAL_ROUNDS: u64 = 3;
const EPOCH_MS: u64 = 1_700_000_000_000;
const MAX_SKEW_MS: u64 = 3_600_000;
const DROP_PCT: u64 = 10;
const DUP_PCT: u64 = 5;
/// How soon a remote decision for an id with unsettled events is tried again.
const RETRY_MS: u64 = 25;

/// Prints one line of a rerun seed's event trace; formats nothing otherwise.
macro_rules! trace {
    ($sim:expr, $($arg:tt)*) => {
        if $sim.trace {
            println!("{:>7} {}", $sim.now, format_args!($($arg)*));
        }
    };
}

mod model;
mod world;

#[test]
fn masters_converge_under_chaos() {
    let env = |name: &str| std::env::var(name).ok().map(|v| v.parse::<u64>().expect("a number"));
    let seeds: Vec<u64> = match env("SIM_SEED") {
        Some(seed) => vec![seed],
        None => (0..env("SIM_SEEDS").unwrap_or(DEFAULT_SEEDS)).collect(),
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
                if idx >= seeds.len() || failed.load(Ordering::Relaxed) {
                    break;
                }
                let seed = seeds[idx];
                match catch_unwind(AssertUnwindSafe(|| Sim::new(seed).run())) {
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
    if let Some((seed, msg)) = failures.into_inner().unwrap().into_iter().min_by_key(|(seed, _)| *seed) {
        panic!(
            "simulation failed with seed {seed}: {msg}\n\
             rerun (prints every event): SIM_SEED={seed} cargo test -p salt-keysync --test sim -- --nocapture"
        );
    }
    let t = totals.into_inner().unwrap();
    // Straight to stderr, past the test harness's capture: one line per run.
    let _ = writeln!(
        std::io::stderr(),
        "sim: {} seeds in {:.1?}: {} decisions ({} by operators, {} at start-up), {} conflicts reported by merge \
         ({} distinct per node); \
         {} messages dropped, {} duplicated, {} lost to a down or partitioned node; {} applies deferred, \
         {} crashes, {} partitions; {} decisions overwritten unknowingly without a conflict report (known gap)",
        seeds.len(),
        started.elapsed(),
        t.decisions,
        t.operator_decisions,
        t.startup_decisions,
        t.conflicts,
        t.distinct_conflicts,
        t.dropped,
        t.duplicated,
        t.lost,
        t.deferred,
        t.crashes,
        t.partitions,
        t.unreported_overwrites,
    );
}

#[derive(Debug, Default, Clone)]
struct Stats {
    decisions: u64,
    operator_decisions: u64,
    startup_decisions: u64,
    conflicts: u64,
    distinct_conflicts: u64,
    unreported_overwrites: u64,
    dropped: u64,
    duplicated: u64,
    lost: u64,
    deferred: u64,
    crashes: u64,
    partitions: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.decisions += o.decisions;
        self.operator_decisions += o.operator_decisions;
        self.startup_decisions += o.startup_decisions;
        self.conflicts += o.conflicts;
        self.distinct_conflicts += o.distinct_conflicts;
        self.unreported_overwrites += o.unreported_overwrites;
        self.dropped += o.dropped;
        self.duplicated += o.duplicated;
        self.lost += o.lost;
        self.deferred += o.deferred;
        self.crashes += o.crashes;
        self.partitions += o.partitions;
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
