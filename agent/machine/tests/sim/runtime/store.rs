//! A master's state store in the simulation: the model (`MemoryStore`),
//! which the checkers read, and, for the seeds run with the real store
//! ([`with_real_store`]), the agent's redb store (`keysync-store`) on a
//! temporary folder beside it. Then every write goes to both, every read
//! the node makes is answered by the real store and checked against the
//! model, and every start reopens the real store and loads from it what the
//! model says it holds: a difference fails the seed. (Both must keep the
//! store contract, `keysync_machine::testkit::store_contract`; this runs
//! the real one under the machine's own sequences of writes.)

use std::cell::Cell;
use std::ops::Deref;

use keysync_machine::core::digest::N_BUCKETS;
use keysync_machine::core::{Decision, Entry, MinionId, Version};
use keysync_machine::node::testing::MemoryStore;
use keysync_machine::node::{Loaded, StoreWrite};
use keysync_machine::testkit::store_contract::View;

/// The node name every real store is made for (each has its own folder).
const NODE: &str = "sim";

thread_local! {
    /// Whether the stores made on this thread are real ones (`None`: as
    /// `SIM_REAL_STORE=all` says, for all seeds or none).
    static REAL: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Runs `run` (a seed's simulation, both its runs) with the masters' stores
/// made real (`real`) or modelled only: the runner's switch, with
/// [`real_store_for`] (`main.rs`: `with_real_store(real_store_for(seed), || …)`).
pub(crate) fn with_real_store<T>(real: bool, run: impl FnOnce() -> T) -> T {
    struct Restore(Option<bool>);
    impl Drop for Restore {
        fn drop(&mut self) {
            REAL.set(self.0);
        }
    }
    let _restore = Restore(REAL.replace(Some(real)));
    run()
}

/// Whether `seed` runs with the real store: every tenth seed, or as
/// `SIM_REAL_STORE` says (`all`, `none`, or `N`: every Nth seed).
pub(crate) fn real_store_for(seed: u64) -> bool {
    let every = match std::env::var("SIM_REAL_STORE").as_deref() {
        Ok("all") => 1,
        Ok("none") => return false,
        Ok(n) => n.parse().expect("SIM_REAL_STORE: all, none or a number"),
        Err(_) => 10,
    };
    every != 0 && seed.is_multiple_of(every)
}

/// Whether a store made now is a real one.
fn real_now() -> bool {
    REAL.get().unwrap_or_else(|| std::env::var("SIM_REAL_STORE").is_ok_and(|v| v == "all"))
}

/// The real store and its folder.
struct Real {
    /// `None` only while it is reopened.
    store: Option<keysync_store::Store>,
    dir: tempfile::TempDir,
}

impl Real {
    fn new() -> Real {
        // On tmpfs where there is one: a commit's fsync costs nothing there.
        let shm = std::path::Path::new("/dev/shm");
        let builder = tempfile::Builder::new().prefix("keysync-sim-").to_owned();
        let dir = if shm.is_dir() { builder.tempdir_in(shm) } else { builder.tempdir() };
        let dir = dir.expect("a temporary folder for the store");
        // Made at time 0, as the model's store says it started afresh (0: not known).
        let store = keysync_store::Store::open(dir.path(), NODE, 0).expect("a new store");
        Real { store: Some(store), dir }
    }

    fn store(&self) -> &keysync_store::Store {
        self.store.as_ref().expect("the store is open")
    }
}

pub(crate) struct Store {
    model: MemoryStore,
    real: Option<Real>,
}

impl Default for Store {
    fn default() -> Store {
        Store { model: MemoryStore::default(), real: real_now().then(Real::new) }
    }
}

/// The model, for the checkers (written only through [`Store`]'s methods).
impl Deref for Store {
    type Target = MemoryStore;

    fn deref(&self) -> &MemoryStore {
        &self.model
    }
}

/// Panics (fails the seed) when the real store and the model disagree.
fn agree<T: PartialEq + std::fmt::Debug>(what: &str, real: &T, model: &T) {
    assert!(real == model, "the real store and the model differ: {what}\nreal:  {real:?}\nmodel: {model:?}");
}

impl Store {
    pub(crate) fn journal(&mut self, decisions: &[Decision]) {
        self.model.journal(decisions);
        if let Some(real) = &self.real {
            real.store().journal(decisions).expect("the real store journals");
        }
    }

    pub(crate) fn record(&mut self, write: &StoreWrite<'_>) {
        self.model.record(write);
        if let Some(real) = &self.real {
            real.store().record(write, NODE).expect("the real store records");
        }
    }

    pub(crate) fn get(&self, ids: &[MinionId]) -> Vec<Decision> {
        let model = self.model.get(ids);
        let Some(real) = &self.real else { return model };
        let found = real.store().get(ids).expect("the real store reads");
        let sorted = |mut found: Vec<Decision>| {
            found.sort_by(|a, b| (&a.id, &a.version).cmp(&(&b.id, &b.version)));
            found
        };
        agree(&format!("the decisions known of {ids:?}"), &sorted(found.clone()), &sorted(model));
        found
    }

    pub(crate) fn cold(&self, ids: &[MinionId]) -> Vec<(MinionId, Entry)> {
        let model = self.model.cold(ids);
        let Some(real) = &self.real else { return model };
        let found = real.store().cold(ids).expect("the real store reads");
        agree(&format!("the plain tombstones of {ids:?}"), &found, &model);
        found
    }

    pub(crate) fn cold_in(&self, buckets: &[u32]) -> Vec<(MinionId, Version)> {
        let mut model = self.model.cold_in(buckets);
        let Some(real) = &self.real else { return model };
        let found = real.store().cold_in(buckets).expect("the real store reads");
        let mut sorted = found.clone();
        sorted.sort();
        model.sort();
        let named =
            if buckets.len() >= N_BUCKETS { "every bucket".to_string() } else { format!("buckets {buckets:?}") };
        agree(&format!("the plain tombstones in {named}"), &sorted, &model);
        found
    }

    /// The real store chooses which tombstones it forgets (in its own
    /// order); the model checks each may be, and forgets the same.
    pub(crate) fn compact(&mut self, before_ms: u64, max: usize) -> Vec<(MinionId, Version)> {
        let Some(real) = &self.real else { return self.model.compact(before_ms, max) };
        let compacted = real.store().compact_versions(before_ms, max).expect("the real store compacts");
        let may: Vec<(MinionId, Version)> = self.model.compactable(before_ms).collect();
        let wrong: Vec<&(MinionId, Version)> = compacted.iter().filter(|c| !may.contains(c)).collect();
        agree("tombstones compacted that the model keeps", &wrong, &Vec::new());
        agree("how many tombstones were compacted", &compacted.len(), &may.len().min(max));
        self.model.forget(&compacted);
        compacted
    }

    /// What a start loads: the real store is closed and opened again first,
    /// as a restart does. Its list of plain tombstones is compared whole
    /// first (a load makes it again when it is wrong).
    pub(crate) fn loaded(&mut self) -> Loaded {
        if self.real.is_some() {
            let all: Vec<u32> = (0..N_BUCKETS as u32).collect();
            self.cold_in(&all);
        }
        let model = self.model.loaded();
        let Some(real) = &mut self.real else { return model };
        real.store = None;
        real.store = Some(keysync_store::Store::open(real.dir.path(), NODE, 0).expect("the real store opens again"));
        let loaded = real.store().load().expect("the real store loads");
        let view = |loaded: &Loaded| {
            View::of(Loaded {
                entries: loaded.entries.clone(),
                cold: loaded.cold.clone(),
                journal: loaded.journal.clone(),
                untold: loaded.untold.clone(),
                held: loaded.held.clone(),
                forgot: loaded.forgot.clone(),
                putting_back: loaded.putting_back.clone(),
                ..*loaded
            })
        };
        agree("what a start loads", &view(&loaded), &view(&model));
        loaded
    }
}
