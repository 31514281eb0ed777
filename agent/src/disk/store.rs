//! The crash-safe decision store under `state_dir` (redb): decisions with
//! their versions and keys, the journal of decisions being applied, and the
//! clock.
//!
//! A peer's decision is journalled before its files are touched and moved to
//! `decisions` only after they are durable, so a crash mid-way is finished at
//! the next start instead of being mistaken for an operator's change.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use keysync_machine::node::{Loaded, StoreWrite};

use crate::core::{Decision, Entry, MinionId, Seen};
use crate::disk::audit::AuditHead;

mod codec;

const DECISIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("decisions");
/// Conflicts committed and maybe not told yet (see `StoreWrite::conflicts`).
const UNTOLD: TableDefinition<&str, &[u8]> = TableDefinition::new("untold");
const JOURNAL: TableDefinition<&str, &[u8]> = TableDefinition::new("journal");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// redb's page cache. Its default (1 GiB) lets an agent holding 100,000
/// keys grow past 100 MiB, and even 16 MiB filled up serving one join; every
/// lookup the agent makes at run time is a batch (fetch, anti-entropy),
/// which the OS page cache serves well enough.
const CACHE_BYTES: usize = 4 * 1024 * 1024;

const META_CLOCK: &str = "clock";
/// The audit log's head when the store last committed (see `audit_guard.rs`).
const META_AUDIT_HEAD: &str = "audit_head";
const META_NODE: &str = "node";
/// A random id made when the store is created; the marker in pki_dir names
/// it, which ties the folders to this store (see `state_guard.rs`).
const META_STORE_ID: &str = "store_id";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state store {path}: {source}")]
    Db { path: PathBuf, source: Box<redb::Error> },
    #[error("state store {path}: record for {id:?} is corrupt")]
    Corrupt { path: PathBuf, id: String },
    #[error("state store {path} belongs to node {found:?}, not {expected:?}")]
    WrongNode { path: PathBuf, found: String, expected: String },
}

pub struct Store {
    db: Database,
    path: PathBuf,
    id: String,
}

/// What `salt-keysync check` can know of a store without opening it for
/// writing (which would create one where there is none).
#[derive(Debug, PartialEq, Eq)]
pub enum Peek {
    Missing,
    /// Held open by the running agent.
    InUse,
    /// Its id, and whether an agent has started with it.
    Found {
        id: String,
        initialized: bool,
    },
}

impl Store {
    pub fn open(state_dir: &Path, node: &str) -> Result<Store, StoreError> {
        let path = state_dir.join("state.redb");
        let db = redb::Builder::new().set_cache_size(CACHE_BYTES).create(&path).map_err(|e| db_error(&path, e))?;
        let mut store = Store { db, path, id: String::new() };
        let txn = store.db.begin_write().map_err(|e| store.err(e))?;
        {
            // Creating the tables up front lets readers assume they exist.
            txn.open_table(DECISIONS).map_err(|e| store.err(e))?;
            txn.open_table(JOURNAL).map_err(|e| store.err(e))?;
            txn.open_table(UNTOLD).map_err(|e| store.err(e))?;
            let meta = txn.open_table(META).map_err(|e| store.err(e))?;
            let found =
                meta.get(META_NODE).map_err(|e| store.err(e))?.map(|v| String::from_utf8_lossy(v.value()).into_owned());
            if let Some(found) = found {
                if found != node {
                    return Err(StoreError::WrongNode { path: store.path.clone(), found, expected: node.into() });
                }
            }
            let mut meta = meta;
            let id = meta
                .get(META_STORE_ID)
                .map_err(|e| store.err(e))?
                .map(|v| String::from_utf8_lossy(v.value()).into_owned());
            store.id = match id {
                Some(id) => id,
                None => {
                    let id = new_store_id(node);
                    meta.insert(META_STORE_ID, id.as_bytes()).map_err(|e| store.err(e))?;
                    id
                }
            };
        }
        txn.commit().map_err(|e| store.err(e))?;
        Ok(store)
    }

    /// A read-only look at the store in `state_dir`.
    pub fn peek(state_dir: &Path) -> Result<Peek, StoreError> {
        let path = state_dir.join("state.redb");
        if !path.exists() {
            return Ok(Peek::Missing);
        }
        let db = match redb::ReadOnlyDatabase::open(&path) {
            Ok(db) => db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => return Ok(Peek::InUse),
            Err(e) => return Err(db_error(&path, e)),
        };
        let txn = db.begin_read().map_err(|e| db_error(&path, e))?;
        let meta = match txn.open_table(META) {
            Ok(meta) => meta,
            Err(redb::TableError::TableDoesNotExist(_)) => {
                return Ok(Peek::Found { id: String::new(), initialized: false })
            }
            Err(e) => return Err(db_error(&path, e)),
        };
        let text = |key: &str| -> Result<Option<String>, StoreError> {
            Ok(meta.get(key).map_err(|e| db_error(&path, e))?.map(|v| String::from_utf8_lossy(v.value()).into_owned()))
        };
        Ok(Peek::Found { id: text(META_STORE_ID)?.unwrap_or_default(), initialized: text(META_NODE)?.is_some() })
    }

    /// This store's random id (see `state_guard.rs`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether an agent has started with this store before (reconciled or
    /// recorded anything); false for a new store.
    pub fn is_initialized(&self) -> Result<bool, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let meta = txn.open_table(META).map_err(|e| self.err(e))?;
        Ok(meta.get(META_NODE).map_err(|e| self.err(e))?.is_some())
    }

    fn err(&self, e: impl Into<redb::Error>) -> StoreError {
        db_error(&self.path, e)
    }

    /// Everything the store holds, read at start-up.
    pub fn load(&self) -> Result<Loaded, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let mut entries = Vec::new();
        for row in txn.open_table(DECISIONS).map_err(|e| self.err(e))?.iter().map_err(|e| self.err(e))? {
            let (id, value) = row.map_err(|e| self.err(e))?;
            let (decision, seen) = self.decode(id.value(), value.value())?;
            entries.push((decision.id.clone(), Entry { seen: seen.into_boxed_slice(), ..decision.entry() }));
        }
        let mut journal = Vec::new();
        for row in txn.open_table(JOURNAL).map_err(|e| self.err(e))?.iter().map_err(|e| self.err(e))? {
            let (id, value) = row.map_err(|e| self.err(e))?;
            journal.push(self.decode(id.value(), value.value())?.0);
        }
        let mut untold = Vec::new();
        for row in txn.open_table(UNTOLD).map_err(|e| self.err(e))?.iter().map_err(|e| self.err(e))? {
            let (key, value) = row.map_err(|e| self.err(e))?;
            let conflict = codec::decode_conflict(value.value())
                .ok_or_else(|| StoreError::Corrupt { path: self.path.clone(), id: key.value().replace('\0', " ") })?;
            untold.push(conflict);
        }
        let meta = txn.open_table(META).map_err(|e| self.err(e))?;
        let clock = match meta.get(META_CLOCK).map_err(|e| self.err(e))? {
            Some(raw) => u64::from_be_bytes(raw.value().try_into().unwrap_or_default()),
            None => 0,
        };
        let initialized = meta.get(META_NODE).map_err(|e| self.err(e))?.is_some();
        Ok(Loaded { entries, journal, clock, initialized, untold })
    }

    /// Full decisions (with keys) for the given ids; unknown ids are skipped.
    pub fn get(&self, ids: &[MinionId]) -> Result<Vec<Decision>, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(DECISIONS).map_err(|e| self.err(e))?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(value) = table.get(id.as_str()).map_err(|e| self.err(e))? {
                out.push(self.decode(id.as_str(), value.value())?.0);
            }
        }
        Ok(out)
    }

    /// Notes decisions about to be applied, durably. It must survive a
    /// crash: without it, a peer's key written just before a kill -9 is read
    /// at restart as an operator's new decision, whose fresh version could
    /// resurrect a key the cluster deleted meanwhile (found by the fault
    /// suite's kill -9 test).
    pub fn journal(&self, decisions: &[Decision]) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(|e| self.err(e))?;
        {
            let mut table = txn.open_table(JOURNAL).map_err(|e| self.err(e))?;
            for decision in decisions {
                table
                    .insert(decision.id.as_str(), codec::encode_record(decision, &[]).as_slice())
                    .map_err(|e| self.err(e))?;
            }
        }
        txn.commit().map_err(|e| self.err(e))
    }

    /// One durable commit (see [`StoreWrite`]): decisions held with the other
    /// decisions seen for their ids, seen lists changed, journal entries
    /// finished, conflicts kept until told (or forgotten once told), the
    /// clock, and whether the store is initialized.
    pub fn record(&self, write: &StoreWrite<'_>, node: &str) -> Result<(), StoreError> {
        self.record_at(write, node, None)
    }

    /// [`Store::record`], noting in the same commit where the audit log's
    /// chain ends now, so that records removed while the agent is stopped
    /// are noticed at its next start.
    pub fn record_at(&self, write: &StoreWrite<'_>, node: &str, head: Option<&AuditHead>) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(|e| self.err(e))?;
        {
            let mut table = txn.open_table(DECISIONS).map_err(|e| self.err(e))?;
            let seen_of =
                |id: &MinionId| write.seen.iter().find(|(seen_id, _)| seen_id == id).map(|(_, s)| s.as_slice());
            for decision in write.decisions {
                let record = codec::encode_record(decision, seen_of(&decision.id).unwrap_or_default());
                table.insert(decision.id.as_str(), record.as_slice()).map_err(|e| self.err(e))?;
            }
            // Ids whose held decision stays and whose seen list grew.
            for (id, seen) in write.seen.iter().filter(|(id, _)| !write.decisions.iter().any(|d| d.id == *id)) {
                let held = table.get(id.as_str()).map_err(|e| self.err(e))?.map(|v| v.value().to_vec());
                if let Some(held) = held {
                    let (decision, _) = self.decode(id.as_str(), &held)?;
                    table
                        .insert(id.as_str(), codec::encode_record(&decision, seen).as_slice())
                        .map_err(|e| self.err(e))?;
                }
            }
            let mut journal = txn.open_table(JOURNAL).map_err(|e| self.err(e))?;
            for id in write.done {
                journal.remove(id.as_str()).map_err(|e| self.err(e))?;
            }
            let mut untold = txn.open_table(UNTOLD).map_err(|e| self.err(e))?;
            if write.conflicts_told {
                untold.retain(|_, _| false).map_err(|e| self.err(e))?;
            }
            for (from, conflict) in write.conflicts {
                let key = codec::conflict_key(conflict);
                untold
                    .insert(key.as_str(), codec::encode_conflict(from, conflict).as_slice())
                    .map_err(|e| self.err(e))?;
            }
            let mut meta = txn.open_table(META).map_err(|e| self.err(e))?;
            meta.insert(META_CLOCK, write.clock.to_be_bytes().as_slice()).map_err(|e| self.err(e))?;
            if write.initialize {
                meta.insert(META_NODE, node.as_bytes()).map_err(|e| self.err(e))?;
            }
            if let Some(head) = head {
                meta.insert(META_AUDIT_HEAD, head.to_string().as_bytes()).map_err(|e| self.err(e))?;
            }
        }
        txn.commit().map_err(|e| self.err(e))
    }

    /// Where the audit log's chain ended at the last commit that noted it.
    pub fn audit_head(&self) -> Result<Option<AuditHead>, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let meta = txn.open_table(META).map_err(|e| self.err(e))?;
        let head = meta.get(META_AUDIT_HEAD).map_err(|e| self.err(e))?;
        Ok(head.and_then(|v| std::str::from_utf8(v.value()).ok()?.parse().ok()))
    }

    /// Notes where the audit log's chain ends (at a clean stop).
    pub fn set_audit_head(&self, head: &AuditHead) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(|e| self.err(e))?;
        {
            let mut meta = txn.open_table(META).map_err(|e| self.err(e))?;
            meta.insert(META_AUDIT_HEAD, head.to_string().as_bytes()).map_err(|e| self.err(e))?;
        }
        txn.commit().map_err(|e| self.err(e))
    }

    fn decode(&self, id: &str, bytes: &[u8]) -> Result<(Decision, Vec<Seen>), StoreError> {
        codec::decode_record(id, bytes).ok_or_else(|| StoreError::Corrupt { path: self.path.clone(), id: id.into() })
    }
}

/// 128 random-enough bits: the node, the time and the process, hashed.
fn new_store_id(node: &str) -> String {
    use sha2::{Digest, Sha256};
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let digest = Sha256::digest(format!("{node}/{nanos}/{}", std::process::id()));
    hex::encode(&digest[..16])
}

fn db_error(path: &Path, e: impl Into<redb::Error>) -> StoreError {
    StoreError::Db { path: path.into(), source: Box::new(e.into()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Context, PublicKey, Verdict, Version};
    use keysync_machine::testkit::PUB;

    fn decision(id: &str, verdict: Verdict, hlc: u64, knew: Option<Version>) -> Decision {
        Decision {
            id: MinionId::parse(id).unwrap(),
            verdict,
            version: Version::new(hlc, "a"),
            context: Context::new(knew),
            relays: Default::default(),
        }
    }

    #[test]
    fn records_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let key = PublicKey::new(PUB.as_bytes());
        let accepted = decision("web01", Verdict::Accepted(key.clone()), 7, None);
        let deleted = decision("web02", Verdict::Deleted, 9, Some(Version::new(3, "b")));
        let pending = decision("web03", Verdict::Rejected(key.clone()), 11, None);
        let older = decision("web01", Verdict::Rejected(key), 5, None);
        let conflict =
            crate::core::merge::Conflict { id: accepted.id.clone(), winner: accepted.seen(), loser: older.seen() };
        {
            let store = Store::open(dir.path(), "a").unwrap();
            assert!(!store.load().unwrap().initialized);
            // A step of a first start: recorded, but still a first start.
            let step = StoreWrite { decisions: std::slice::from_ref(&deleted), clock: 5, ..StoreWrite::default() };
            store.record(&step, "a").unwrap();
            let stepped = store.load().unwrap();
            assert!(!stepped.initialized);
            assert_eq!(stepped.entries.len(), 1);
            store.journal(std::slice::from_ref(&pending)).unwrap();
            store.journal(std::slice::from_ref(&accepted)).unwrap();
            let seen = vec![(accepted.id.clone(), vec![older.seen()])];
            let conflicts = vec![(std::sync::Arc::from("b"), conflict.clone())];
            let write = StoreWrite {
                decisions: &[accepted.clone(), deleted.clone()],
                seen: &seen,
                conflicts: &conflicts,
                done: std::slice::from_ref(&accepted.id),
                clock: 99,
                initialize: true,
                ..StoreWrite::default()
            };
            store.record(&write, "a").unwrap();
        }
        let store = Store::open(dir.path(), "a").unwrap();
        let loaded = store.load().unwrap();
        assert!(loaded.initialized);
        assert_eq!(loaded.clock, 99);
        assert_eq!(loaded.journal, vec![pending]);
        assert_eq!(loaded.entries.len(), 2);
        let web01 = loaded.entries.iter().find(|(id, _)| *id == accepted.id).unwrap();
        assert_eq!(web01.1.seen.to_vec(), vec![older.seen()], "what was seen is kept with the decision");
        assert_eq!(loaded.untold, vec![(std::sync::Arc::from("b"), conflict)]);
        assert_eq!(store.get(&[accepted.id.clone(), deleted.id.clone()]).unwrap(), vec![accepted, deleted]);
        store.record(&StoreWrite { conflicts_told: true, clock: 99, ..StoreWrite::default() }, "a").unwrap();
        assert!(store.load().unwrap().untold.is_empty(), "told conflicts are forgotten");
    }

    #[test]
    fn refuses_another_nodes_state() {
        let dir = tempfile::tempdir().unwrap();
        Store::open(dir.path(), "a")
            .unwrap()
            .record(&StoreWrite { initialize: true, ..StoreWrite::default() }, "a")
            .unwrap();
        let err = Store::open(dir.path(), "b").err().unwrap();
        assert!(err.to_string().contains("belongs to node \"a\", not \"b\""), "{err}");
    }
}
