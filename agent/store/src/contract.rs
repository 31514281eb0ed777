//! The state store's contract (`keysync_machine::testkit::store_contract`),
//! run against the redb store on a temporary folder; reopening it closes
//! the database and opens it again, as a restart does (an hour later: a
//! store opened again keeps when it started afresh).

use keysync_machine::node::{Failure, Loaded, StoreWrite};
use keysync_machine::testkit::store_contract::ContractStore;

use super::Store;
use crate::core::{Decision, Entry, MinionId, Version};

const NODE: &str = "a";

struct OnDisk {
    dir: tempfile::TempDir,
    made_ms: u64,
    /// `None` only while it is reopened.
    store: Option<Store>,
}

impl OnDisk {
    fn store(&self) -> &Store {
        self.store.as_ref().expect("the store is open")
    }
}

impl ContractStore for OnDisk {
    fn create(now_ms: u64) -> OnDisk {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let store = Store::open(dir.path(), NODE, now_ms).expect("a new store");
        OnDisk { dir, made_ms: now_ms, store: Some(store) }
    }

    fn journal(&mut self, decisions: &[Decision]) -> Result<(), Failure> {
        self.store().journal(decisions).map_err(Failure::new)
    }

    fn record(&mut self, write: &StoreWrite<'_>) -> Result<(), Failure> {
        self.store().record(write, NODE).map_err(Failure::new)
    }

    fn load(&mut self) -> Result<Loaded, Failure> {
        self.store().load().map_err(Failure::new)
    }

    fn get(&mut self, ids: &[MinionId]) -> Result<Vec<Decision>, Failure> {
        self.store().get(ids).map_err(Failure::new)
    }

    fn cold(&mut self, ids: &[MinionId]) -> Result<Vec<(MinionId, Entry)>, Failure> {
        self.store().cold(ids).map_err(Failure::new)
    }

    fn cold_in(&mut self, buckets: &[u32]) -> Result<Vec<(MinionId, Version)>, Failure> {
        self.store().cold_in(buckets).map_err(Failure::new)
    }

    fn compact(&mut self, before_ms: u64, max: usize) -> Result<Vec<(MinionId, Version)>, Failure> {
        self.store().compact_versions(before_ms, max).map_err(Failure::new)
    }

    fn set_afresh(&mut self, hlc: u64) -> Result<(), Failure> {
        self.store().set_afresh(hlc).map_err(Failure::new)
    }

    fn reopen(&mut self) {
        // Closed first: redb holds a lock on its file.
        self.store = None;
        let later = self.made_ms + 3_600_000;
        self.store = Some(Store::open(self.dir.path(), NODE, later).expect("the store opens again"));
    }
}

keysync_machine::store_contract_tests!(OnDisk);
