//! The crash-safe decision store under `state_dir` (redb): decisions with
//! their versions and keys, the journal of decisions being applied, and the
//! clock.
//!
//! A peer's decision is journalled before its files are touched and moved to
//! `decisions` only after they are durable, so a crash mid-way is finished at
//! the next start instead of being mistaken for an operator's change.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::core::{Decision, Entry, MinionId, PublicKey, Verdict, Version};

const DECISIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("decisions");
const JOURNAL: TableDefinition<&str, &[u8]> = TableDefinition::new("journal");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// redb's page cache. Its default (1 GiB) lets an agent holding 100,000
/// keys grow past 100 MiB, and even 16 MiB filled up serving one join; every
/// lookup the agent makes at run time is a batch (fetch, anti-entropy),
/// which the OS page cache serves well enough.
const CACHE_BYTES: usize = 4 * 1024 * 1024;

const META_CLOCK: &str = "clock";
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

/// Everything the store holds, read at start-up.
pub struct Loaded {
    pub entries: Vec<(MinionId, Entry)>,
    pub journal: Vec<Decision>,
    pub clock: u64,
    /// False on the agent's very first start with this state_dir.
    pub initialized: bool,
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

    pub fn load(&self) -> Result<Loaded, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let mut entries = Vec::new();
        for row in txn.open_table(DECISIONS).map_err(|e| self.err(e))?.iter().map_err(|e| self.err(e))? {
            let (id, value) = row.map_err(|e| self.err(e))?;
            let decision = self.decode(id.value(), value.value())?;
            entries.push((decision.id.clone(), decision.entry()));
        }
        let mut journal = Vec::new();
        for row in txn.open_table(JOURNAL).map_err(|e| self.err(e))?.iter().map_err(|e| self.err(e))? {
            let (id, value) = row.map_err(|e| self.err(e))?;
            journal.push(self.decode(id.value(), value.value())?);
        }
        let meta = txn.open_table(META).map_err(|e| self.err(e))?;
        let clock = match meta.get(META_CLOCK).map_err(|e| self.err(e))? {
            Some(raw) => u64::from_be_bytes(raw.value().try_into().unwrap_or_default()),
            None => 0,
        };
        let initialized = meta.get(META_NODE).map_err(|e| self.err(e))?.is_some();
        Ok(Loaded { entries, journal, clock, initialized })
    }

    /// Full decisions (with keys) for the given ids; unknown ids are skipped.
    pub fn get(&self, ids: &[MinionId]) -> Result<Vec<Decision>, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(DECISIONS).map_err(|e| self.err(e))?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(value) = table.get(id.as_str()).map_err(|e| self.err(e))? {
                out.push(self.decode(id.as_str(), value.value())?);
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
                table.insert(decision.id.as_str(), encode(decision).as_slice()).map_err(|e| self.err(e))?;
            }
        }
        txn.commit().map_err(|e| self.err(e))
    }

    /// Durably records decisions whose files are durable, clears them from the
    /// journal, saves the clock and marks the store initialized.
    pub fn record(&self, decisions: &[Decision], done: &[MinionId], node: &str, clock: u64) -> Result<(), StoreError> {
        self.record_with(decisions, done, node, clock, true)
    }

    /// [`Store::record`]; `initialize` false leaves an uninitialized store so
    /// (a first start recorded in steps: until the last step, a restart is
    /// still a first start).
    pub fn record_with(
        &self,
        decisions: &[Decision],
        done: &[MinionId],
        node: &str,
        clock: u64,
        initialize: bool,
    ) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(|e| self.err(e))?;
        {
            let mut table = txn.open_table(DECISIONS).map_err(|e| self.err(e))?;
            for decision in decisions {
                table.insert(decision.id.as_str(), encode(decision).as_slice()).map_err(|e| self.err(e))?;
            }
            let mut journal = txn.open_table(JOURNAL).map_err(|e| self.err(e))?;
            for id in done {
                journal.remove(id.as_str()).map_err(|e| self.err(e))?;
            }
            let mut meta = txn.open_table(META).map_err(|e| self.err(e))?;
            meta.insert(META_CLOCK, clock.to_be_bytes().as_slice()).map_err(|e| self.err(e))?;
            if initialize {
                meta.insert(META_NODE, node.as_bytes()).map_err(|e| self.err(e))?;
            }
        }
        txn.commit().map_err(|e| self.err(e))
    }

    fn decode(&self, id: &str, bytes: &[u8]) -> Result<Decision, StoreError> {
        decode(id, bytes).ok_or_else(|| StoreError::Corrupt { path: self.path.clone(), id: id.into() })
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

// Record layout: kind u8, version, has_supersedes u8, [supersedes], key bytes.
// A version is hlc u64 BE, node length u16 BE, node bytes.

fn encode(decision: &Decision) -> Vec<u8> {
    let key = decision.verdict.key().map(PublicKey::bytes).unwrap_or_default();
    let mut out = Vec::with_capacity(64 + key.len());
    out.push(match decision.verdict {
        Verdict::Accepted(_) => 1,
        Verdict::Rejected(_) => 2,
        Verdict::Deleted => 3,
    });
    encode_version(&mut out, &decision.version);
    match &decision.supersedes {
        Some(version) => {
            out.push(1);
            encode_version(&mut out, version);
        }
        None => out.push(0),
    }
    out.extend_from_slice(key);
    out
}

fn encode_version(out: &mut Vec<u8>, version: &Version) {
    out.extend_from_slice(&version.hlc.to_be_bytes());
    out.extend_from_slice(&(version.node.len() as u16).to_be_bytes());
    out.extend_from_slice(version.node.as_bytes());
}

fn decode(id: &str, bytes: &[u8]) -> Option<Decision> {
    let id = MinionId::parse(id).ok()?;
    let (&kind, rest) = bytes.split_first()?;
    let (version, rest) = decode_version(rest)?;
    let (&has_supersedes, mut rest) = rest.split_first()?;
    let supersedes = if has_supersedes == 1 {
        let (version, after) = decode_version(rest)?;
        rest = after;
        Some(version)
    } else {
        None
    };
    let verdict = match kind {
        1 => Verdict::Accepted(PublicKey::new(rest)),
        2 => Verdict::Rejected(PublicKey::new(rest)),
        3 => Verdict::Deleted,
        _ => return None,
    };
    Some(Decision { id, verdict, version, supersedes })
}

fn decode_version(bytes: &[u8]) -> Option<(Version, &[u8])> {
    let hlc = u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?);
    let len = usize::from(u16::from_be_bytes(bytes.get(8..10)?.try_into().ok()?));
    let node = std::str::from_utf8(bytes.get(10..10 + len)?).ok()?;
    Some((Version { hlc, node: crate::core::version::node_name(node) }, &bytes[10 + len..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use keysync_machine::testkit::PUB;

    fn decision(id: &str, verdict: Verdict, hlc: u64, supersedes: Option<Version>) -> Decision {
        Decision { id: MinionId::parse(id).unwrap(), verdict, version: Version::new(hlc, "a"), supersedes }
    }

    #[test]
    fn records_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let key = PublicKey::new(PUB.as_bytes());
        let accepted = decision("web01", Verdict::Accepted(key.clone()), 7, None);
        let deleted = decision("web02", Verdict::Deleted, 9, Some(Version::new(3, "b")));
        let pending = decision("web03", Verdict::Rejected(key), 11, None);
        {
            let store = Store::open(dir.path(), "a").unwrap();
            assert!(!store.load().unwrap().initialized);
            // A step of a first start: recorded, but still a first start.
            store.record_with(std::slice::from_ref(&deleted), &[], "a", 5, false).unwrap();
            let stepped = store.load().unwrap();
            assert!(!stepped.initialized);
            assert_eq!(stepped.entries.len(), 1);
            store.journal(std::slice::from_ref(&pending)).unwrap();
            store.journal(std::slice::from_ref(&accepted)).unwrap();
            store.record(&[accepted.clone(), deleted.clone()], std::slice::from_ref(&accepted.id), "a", 99).unwrap();
        }
        let store = Store::open(dir.path(), "a").unwrap();
        let loaded = store.load().unwrap();
        assert!(loaded.initialized);
        assert_eq!(loaded.clock, 99);
        assert_eq!(loaded.journal, vec![pending]);
        assert_eq!(loaded.entries.len(), 2);
        assert_eq!(store.get(&[accepted.id.clone(), deleted.id.clone()]).unwrap(), vec![accepted, deleted]);
    }

    #[test]
    fn refuses_another_nodes_state() {
        let dir = tempfile::tempdir().unwrap();
        Store::open(dir.path(), "a").unwrap().record(&[], &[], "a", 1).unwrap();
        let err = Store::open(dir.path(), "b").err().unwrap();
        assert!(err.to_string().contains("belongs to node \"a\", not \"b\""), "{err}");
    }
}
