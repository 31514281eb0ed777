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

use crate::core::decision::is_plain_tombstone;
use crate::core::digest::{bucket_of, N_BUCKETS};
use crate::core::{Decision, Entry, MinionId, Seen, Version};
use crate::disk::audit::AuditHead;

mod codec;

const DECISIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("decisions");
/// Claims known and not held (see `claims.rs`), with their keys: what a
/// master shows after first contact may be one of them. Key: the id, NUL,
/// the claim's version.
const CLAIMS: TableDefinition<&str, &[u8]> = TableDefinition::new("claims");
/// Conflicts committed and maybe not told yet (see `StoreWrite::conflicts`).
const UNTOLD: TableDefinition<&str, &[u8]> = TableDefinition::new("untold");
const JOURNAL: TableDefinition<&str, &[u8]> = TableDefinition::new("journal");
/// Peers' deletes the blast-radius guard holds, by id.
const HELD: TableDefinition<&str, &[u8]> = TableDefinition::new("held");
/// The plain tombstones among `decisions` (deletes with no claim known,
/// kept out of memory: `node/cold.rs`), by digest bucket. Key: the bucket
/// (two bytes, big-endian), then the id; value: the delete's version (its
/// hlc, eight bytes big-endian, then the origin's name).
const TOMBSTONES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("tombstones");
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
    /// The cause is in the message, not a `source()`: `{:#}` would print it twice.
    #[error("state store {path}: {cause}")]
    Db { path: PathBuf, cause: Box<redb::Error> },
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
        Store::init(Store { db, path, id: String::new() }, node)
    }

    /// A store in memory, gone when the agent stops: observe mode keeps no
    /// state, so the first start in normal mode afterwards is a first start.
    pub fn in_memory(node: &str) -> Result<Store, StoreError> {
        let path = PathBuf::from("(in memory: observe mode)");
        let db = redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .map_err(|e| db_error(&path, e))?;
        Store::init(Store { db, path, id: String::new() }, node)
    }

    fn init(mut store: Store, node: &str) -> Result<Store, StoreError> {
        let txn = store.db.begin_write().map_err(|e| store.err(e))?;
        {
            // Creating the tables up front lets readers assume they exist.
            txn.open_table(DECISIONS).map_err(|e| store.err(e))?;
            txn.open_table(CLAIMS).map_err(|e| store.err(e))?;
            txn.open_table(JOURNAL).map_err(|e| store.err(e))?;
            txn.open_table(UNTOLD).map_err(|e| store.err(e))?;
            txn.open_table(HELD).map_err(|e| store.err(e))?;
            txn.open_table(TOMBSTONES).map_err(|e| store.err(e))?;
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
        store.list_tombstones(&txn)?;
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

    /// Makes `TOMBSTONES` list exactly the plain tombstones of `DECISIONS`,
    /// checked at every open: a store of an earlier release has no list,
    /// and a downgraded release writes decisions without keeping it.
    /// (Compared by a sum of hashes: no list of ids in memory.)
    fn list_tombstones(&self, txn: &redb::WriteTransaction) -> Result<(), StoreError> {
        let mut decisions_sum = (0u64, 0u64);
        for row in txn.open_table(DECISIONS).map_err(|e| self.err(e))?.iter().map_err(|e| self.err(e))? {
            let (id, value) = row.map_err(|e| self.err(e))?;
            let record = self.decode(id.value(), value.value())?;
            if record.is_plain_tombstone() {
                let row = tombstone_row(&record.decision);
                decisions_sum = add_row(decisions_sum, &row.0, &row.1);
            }
        }
        let mut listed_sum = (0u64, 0u64);
        let mut tombstones = txn.open_table(TOMBSTONES).map_err(|e| self.err(e))?;
        for row in tombstones.iter().map_err(|e| self.err(e))? {
            let (key, value) = row.map_err(|e| self.err(e))?;
            listed_sum = add_row(listed_sum, key.value(), value.value());
        }
        if decisions_sum == listed_sum {
            return Ok(());
        }
        tombstones.retain(|_, _| false).map_err(|e| self.err(e))?;
        for row in txn.open_table(DECISIONS).map_err(|e| self.err(e))?.iter().map_err(|e| self.err(e))? {
            let (id, value) = row.map_err(|e| self.err(e))?;
            let record = self.decode(id.value(), value.value())?;
            if record.is_plain_tombstone() {
                let (key, value) = tombstone_row(&record.decision);
                tombstones.insert(key.as_slice(), value.as_slice()).map_err(|e| self.err(e))?;
            }
        }
        tracing::info!("state store: the list of tombstones was made again (a store of another release)");
        Ok(())
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
        let mut cold = vec![0u32; N_BUCKETS];
        for row in txn.open_table(DECISIONS).map_err(|e| self.err(e))?.iter().map_err(|e| self.err(e))? {
            let (id, value) = row.map_err(|e| self.err(e))?;
            let record = self.decode(id.value(), value.value())?;
            if record.is_plain_tombstone() {
                cold[bucket_of(&record.decision.id)] += 1;
                continue;
            }
            let entry = record.decision.entry().with_seen(record.seen).with_mine(record.mine);
            entries.push((record.decision.id, entry));
        }
        let mut journal = Vec::new();
        for row in txn.open_table(JOURNAL).map_err(|e| self.err(e))?.iter().map_err(|e| self.err(e))? {
            let (id, value) = row.map_err(|e| self.err(e))?;
            journal.push(self.decode(id.value(), value.value())?.decision);
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
        let mut held = Vec::new();
        for row in txn.open_table(HELD).map_err(|e| self.err(e))?.iter().map_err(|e| self.err(e))? {
            let (id, value) = row.map_err(|e| self.err(e))?;
            let corrupt = || StoreError::Corrupt { path: self.path.clone(), id: id.value().to_string() };
            held.push(codec::decode_held(id.value(), value.value()).ok_or_else(corrupt)?);
        }
        Ok(Loaded { entries, cold, journal, clock, initialized, untold, held })
    }

    /// The plain tombstones kept for those of `ids` held (see `TOMBSTONES`).
    pub fn cold(&self, ids: &[MinionId]) -> Result<Vec<(MinionId, Entry)>, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(DECISIONS).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for id in ids {
            if let Some(value) = table.get(id.as_str()).map_err(|e| self.err(e))? {
                let record = self.decode(id.as_str(), value.value())?;
                if record.is_plain_tombstone() {
                    out.push((id.clone(), record.decision.entry().with_seen(record.seen)));
                }
            }
        }
        Ok(out)
    }

    /// The plain tombstones kept in `buckets`, with their versions.
    pub fn cold_in(&self, buckets: &[u32]) -> Result<Vec<(MinionId, Version)>, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(TOMBSTONES).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for &bucket in buckets {
            let Ok(bucket) = u16::try_from(bucket) else { continue };
            let from = bucket.to_be_bytes();
            let rows = match bucket.checked_add(1) {
                Some(next) => table.range(from.as_slice()..next.to_be_bytes().as_slice()),
                None => table.range(from.as_slice()..),
            };
            for row in rows.map_err(|e| self.err(e))? {
                let (key, value) = row.map_err(|e| self.err(e))?;
                out.push(self.tombstone(key.value(), value.value())?);
            }
        }
        Ok(out)
    }

    /// Forgets at most `max` plain tombstones issued before `before_ms`
    /// (none journalled or held by the guard), in one commit; returns their ids.
    pub fn compact(&self, before_ms: u64, max: usize) -> Result<Vec<MinionId>, StoreError> {
        let txn = self.db.begin_write().map_err(|e| self.err(e))?;
        let mut old = Vec::new();
        {
            let mut tombstones = txn.open_table(TOMBSTONES).map_err(|e| self.err(e))?;
            let mut decisions = txn.open_table(DECISIONS).map_err(|e| self.err(e))?;
            let journal = txn.open_table(JOURNAL).map_err(|e| self.err(e))?;
            let held = txn.open_table(HELD).map_err(|e| self.err(e))?;
            let mut stale = Vec::new();
            for row in tombstones.iter().map_err(|e| self.err(e))? {
                let (key, value) = row.map_err(|e| self.err(e))?;
                let (id, version) = self.tombstone(key.value(), value.value())?;
                if version.millis() >= before_ms
                    || journal.get(id.as_str()).map_err(|e| self.err(e))?.is_some()
                    || held.get(id.as_str()).map_err(|e| self.err(e))?.is_some()
                {
                    continue;
                }
                // Only what the decisions table holds as this very tombstone.
                let record = match decisions.get(id.as_str()).map_err(|e| self.err(e))? {
                    Some(value) => Some(self.decode(id.as_str(), value.value())?),
                    None => None,
                };
                match record {
                    Some(record) if record.is_plain_tombstone() && record.decision.version == version => {
                        old.push((key.value().to_vec(), id));
                    }
                    _ => stale.push(key.value().to_vec()),
                }
                if old.len() == max {
                    break;
                }
            }
            for key in &stale {
                tombstones.remove(key.as_slice()).map_err(|e| self.err(e))?;
            }
            for (key, id) in &old {
                tombstones.remove(key.as_slice()).map_err(|e| self.err(e))?;
                decisions.remove(id.as_str()).map_err(|e| self.err(e))?;
            }
        }
        txn.commit().map_err(|e| self.err(e))?;
        Ok(old.into_iter().map(|(_, id)| id).collect())
    }

    /// A `TOMBSTONES` row read back.
    fn tombstone(&self, key: &[u8], value: &[u8]) -> Result<(MinionId, Version), StoreError> {
        let corrupt = || StoreError::Corrupt { path: self.path.clone(), id: String::from_utf8_lossy(key).into_owned() };
        let id = key.get(2..).and_then(|id| std::str::from_utf8(id).ok()).and_then(|id| MinionId::parse(id).ok());
        let hlc = value.get(..8).and_then(|hlc| hlc.try_into().ok()).map(u64::from_be_bytes);
        let node = value.get(8..).and_then(|node| std::str::from_utf8(node).ok());
        match (id, hlc, node) {
            (Some(id), Some(hlc), Some(node)) => {
                Ok((id, Version::new(hlc, keysync_machine::core::version::node_name(node))))
            }
            _ => Err(corrupt()),
        }
    }

    /// Full decisions (with keys) for the given ids: the one held and every
    /// claim known; unknown ids are skipped.
    pub fn get(&self, ids: &[MinionId]) -> Result<Vec<Decision>, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let table = txn.open_table(DECISIONS).map_err(|e| self.err(e))?;
        let claims = txn.open_table(CLAIMS).map_err(|e| self.err(e))?;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(value) = table.get(id.as_str()).map_err(|e| self.err(e))? {
                out.push(self.decode(id.as_str(), value.value())?.decision);
            }
            let (from, to) = (format!("{id}\0"), format!("{id}\u{1}"));
            for row in claims.range(from.as_str()..to.as_str()).map_err(|e| self.err(e))? {
                let (_, value) = row.map_err(|e| self.err(e))?;
                out.push(self.decode(id.as_str(), value.value())?.decision);
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
                    .insert(decision.id.as_str(), codec::encode_record(decision, &[], None).as_slice())
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
            let mut claims = txn.open_table(CLAIMS).map_err(|e| self.err(e))?;
            let mut tombstones = txn.open_table(TOMBSTONES).map_err(|e| self.err(e))?;
            let kept = |id: &MinionId| write.kept.iter().find(|k| k.id == *id);
            for decision in write.decisions {
                let (seen, mine) = kept(&decision.id).map(|k| (k.seen.as_slice(), k.mine.as_ref())).unwrap_or_default();
                let record = codec::encode_record(decision, seen, mine);
                index(&mut tombstones, decision, seen, mine).map_err(|e| self.err(e))?;
                let old = table.insert(decision.id.as_str(), record.as_slice()).map_err(|e| self.err(e))?;
                let old = old.map(|v| v.value().to_vec());
                // A claim no longer held is still known, with its key.
                if let Some(old) = old {
                    let old = self.decode(decision.id.as_str(), &old)?.decision;
                    if old.version.is_claim() && old.version != decision.version {
                        let bytes = codec::encode_record(&old, &[], None);
                        claims.insert(claim_key(&old).as_str(), bytes.as_slice()).map_err(|e| self.err(e))?;
                    }
                }
                if decision.version.is_claim() {
                    claims.remove(claim_key(decision).as_str()).map_err(|e| self.err(e))?;
                }
            }
            for claim in write.claims {
                let bytes = codec::encode_record(claim, &[], None);
                claims.insert(claim_key(claim).as_str(), bytes.as_slice()).map_err(|e| self.err(e))?;
            }
            // Ids whose held decision stays and whose seen list or claim changed.
            for k in write.kept.iter().filter(|k| !write.decisions.iter().any(|d| d.id == k.id)) {
                let held = table.get(k.id.as_str()).map_err(|e| self.err(e))?.map(|v| v.value().to_vec());
                if let Some(held) = held {
                    let decision = self.decode(k.id.as_str(), &held)?.decision;
                    let record = codec::encode_record(&decision, &k.seen, k.mine.as_ref());
                    index(&mut tombstones, &decision, &k.seen, k.mine.as_ref()).map_err(|e| self.err(e))?;
                    table.insert(k.id.as_str(), record.as_slice()).map_err(|e| self.err(e))?;
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
            let mut held = txn.open_table(HELD).map_err(|e| self.err(e))?;
            for id in write.unheld {
                held.remove(id.as_str()).map_err(|e| self.err(e))?;
            }
            for h in write.held {
                held.insert(h.decision.id.as_str(), codec::encode_held(h).as_slice()).map_err(|e| self.err(e))?;
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

    fn decode(&self, id: &str, bytes: &[u8]) -> Result<codec::Record, StoreError> {
        codec::decode_record(id, bytes).ok_or_else(|| StoreError::Corrupt { path: self.path.clone(), id: id.into() })
    }
}

/// Keeps `TOMBSTONES` listing `decision`'s id exactly when the decision,
/// held with `seen` and `mine`, is a plain tombstone.
fn index(
    tombstones: &mut redb::Table<&[u8], &[u8]>,
    decision: &Decision,
    seen: &[Seen],
    mine: Option<&Version>,
) -> Result<(), redb::StorageError> {
    let (key, value) = tombstone_row(decision);
    if is_plain_tombstone(decision.verdict.kind(), seen, mine) {
        tombstones.insert(key.as_slice(), value.as_slice())?;
    } else {
        tombstones.remove(key.as_slice())?;
    }
    Ok(())
}

/// `decision`'s row in `TOMBSTONES`: (bucket, id) → version.
fn tombstone_row(decision: &Decision) -> (Vec<u8>, Vec<u8>) {
    let bucket = u16::try_from(bucket_of(&decision.id)).unwrap_or(u16::MAX);
    let mut key = bucket.to_be_bytes().to_vec();
    key.extend_from_slice(decision.id.as_str().as_bytes());
    let mut value = decision.version.hlc.to_be_bytes().to_vec();
    value.extend_from_slice(decision.version.node.as_bytes());
    (key, value)
}

/// Adds one `TOMBSTONES` row to a sum of rows (count, and the sum of their
/// hashes): equal sums, equal lists.
fn add_row((n, sum): (u64, u64), key: &[u8], value: &[u8]) -> (u64, u64) {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update((key.len() as u64).to_be_bytes());
    hasher.update(key);
    hasher.update(value);
    let hash = hasher.finalize();
    (n + 1, sum.wrapping_add(u64::from_be_bytes(hash[..8].try_into().expect("sha256 is 32 bytes"))))
}

/// The claims table's key for a claim.
fn claim_key(claim: &Decision) -> String {
    format!("{}\0{}", claim.id, claim.version)
}

/// 128 random-enough bits: the node, the time and the process, hashed.
fn new_store_id(node: &str) -> String {
    use sha2::{Digest, Sha256};
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let digest = Sha256::digest(format!("{node}/{nanos}/{}", std::process::id()));
    hex::encode(&digest[..16])
}

fn db_error(path: &Path, e: impl Into<redb::Error>) -> StoreError {
    StoreError::Db { path: path.into(), cause: Box::new(e.into()) }
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
            // A plain tombstone: counted, not loaded into memory.
            assert_eq!((stepped.entries.len(), stepped.cold.iter().sum::<u32>()), (0, 1));
            store.journal(std::slice::from_ref(&pending)).unwrap();
            store.journal(std::slice::from_ref(&accepted)).unwrap();
            let kept =
                vec![keysync_machine::node::Kept { id: accepted.id.clone(), seen: vec![older.seen()], mine: None }];
            let conflicts = vec![(std::sync::Arc::from("b"), conflict.clone())];
            let write = StoreWrite {
                decisions: &[accepted.clone(), deleted.clone()],
                kept: &kept,
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
        assert_eq!((loaded.entries.len(), loaded.cold.iter().sum::<u32>()), (1, 1));
        let web01 = loaded.entries.iter().find(|(id, _)| *id == accepted.id).unwrap();
        assert_eq!(web01.1.seen().to_vec(), vec![older.seen()], "what was seen is kept with the decision");
        assert_eq!(loaded.untold, vec![(std::sync::Arc::from("b"), conflict)]);
        assert_eq!(store.get(&[accepted.id.clone(), deleted.id.clone()]).unwrap(), vec![accepted, deleted]);
        store.record(&StoreWrite { conflicts_told: true, clock: 99, ..StoreWrite::default() }, "a").unwrap();
        assert!(store.load().unwrap().untold.is_empty(), "told conflicts are forgotten");
    }

    /// Claims keep their keys after a live decision displaces them, or when
    /// learnt below another: what a master shows may come to be one of them.
    #[test]
    fn claims_are_kept_with_their_keys() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), "a").unwrap();
        let key = PublicKey::new(PUB.as_bytes());
        let claim = |rejected: bool| Decision {
            version: Version::claim(rejected, &key.fingerprint().0),
            verdict: if rejected { Verdict::Rejected(key.clone()) } else { Verdict::Accepted(key.clone()) },
            ..decision("web01", Verdict::Deleted, 0, None)
        };
        let (own, other) = (claim(false), claim(true));
        let kept = |mine: &Decision| {
            vec![keysync_machine::node::Kept { id: own.id.clone(), seen: vec![], mine: Some(mine.version.clone()) }]
        };
        // This master's own claim is held; another master's claim of the same key is learnt below it... or above.
        let (low, high) = if own.version < other.version { (&own, &other) } else { (&other, &own) };
        let write = StoreWrite { decisions: std::slice::from_ref(high), kept: &kept(&own), ..StoreWrite::default() };
        store.record(&write, "a").unwrap();
        let write = StoreWrite { claims: std::slice::from_ref(low), kept: &kept(&own), ..StoreWrite::default() };
        store.record(&write, "a").unwrap();
        // A live delete displaces the held claim.
        let live = decision("web01", Verdict::Deleted, 1 << 50, None);
        let write = StoreWrite { decisions: std::slice::from_ref(&live), kept: &kept(&own), ..StoreWrite::default() };
        store.record(&write, "a").unwrap();
        let mut known = store.get(std::slice::from_ref(&own.id)).unwrap();
        known.sort_by(|a, b| a.version.cmp(&b.version));
        let mut want = vec![own.clone(), other.clone(), live.clone()];
        want.sort_by(|a, b| a.version.cmp(&b.version));
        assert_eq!(known, want, "the live decision and both claims, with their keys");
        drop(store);
        let loaded = Store::open(dir.path(), "a").unwrap().load().unwrap();
        let (_, entry) = &loaded.entries[0];
        assert_eq!((entry.version.clone(), entry.mine().cloned()), (live.version, Some(own.version)));
    }

    /// Plain tombstones are listed by bucket, left out of what a start
    /// loads into memory, read back by id or by bucket, and compacted once
    /// old; a store of an earlier release gets its list at open.
    #[test]
    fn plain_tombstones_are_listed_read_back_and_compacted() {
        let dir = tempfile::tempdir().unwrap();
        let key = PublicKey::new(PUB.as_bytes());
        let old = decision("gone-old", Verdict::Deleted, 1_000 << 16, None);
        let young = decision("gone-young", Verdict::Deleted, 9_000 << 16, None);
        let accepted = decision("web01", Verdict::Accepted(key.clone()), 5_000 << 16, None);
        // A delete with a claim known is no plain tombstone: it stays in memory.
        let claimed = decision("claimed", Verdict::Deleted, 2_000 << 16, None);
        let claim = Decision {
            version: Version::claim(false, &key.fingerprint().0),
            verdict: Verdict::Accepted(key.clone()),
            ..decision("claimed", Verdict::Deleted, 0, None)
        };
        let kept = vec![keysync_machine::node::Kept { id: claimed.id.clone(), seen: vec![claim.seen()], mine: None }];
        let store = Store::open(dir.path(), "a").unwrap();
        let decisions = [old.clone(), young.clone(), accepted.clone(), claimed.clone()];
        store.record(&StoreWrite { decisions: &decisions, kept: &kept, ..StoreWrite::default() }, "a").unwrap();
        let loaded = store.load().unwrap();
        let mut in_memory: Vec<&str> = loaded.entries.iter().map(|(id, _)| id.as_str()).collect();
        in_memory.sort();
        assert_eq!(in_memory, vec!["claimed", "web01"]);
        assert_eq!(loaded.cold.iter().sum::<u32>(), 2);
        assert_eq!(loaded.cold[bucket_of(&old.id)], 1 + u32::from(bucket_of(&old.id) == bucket_of(&young.id)));
        let cold = store.cold(&[old.id.clone(), accepted.id.clone(), claimed.id.clone()]).unwrap();
        assert_eq!(cold, vec![(old.id.clone(), old.entry())]);
        let bucket = bucket_of(&young.id) as u32;
        assert!(store.cold_in(&[bucket]).unwrap().contains(&(young.id.clone(), young.version.clone())));
        // An accept over a tombstone takes it off the list.
        let back = decision("gone-young", Verdict::Accepted(key), 10_000 << 16, None);
        store.record(&StoreWrite { decisions: std::slice::from_ref(&back), ..StoreWrite::default() }, "a").unwrap();
        assert!(store.cold_in(&[bucket]).unwrap().iter().all(|(id, _)| *id != young.id));
        store.record(&StoreWrite { decisions: std::slice::from_ref(&young), ..StoreWrite::default() }, "a").unwrap();
        // Compaction: only the old one, and not while it is journalled.
        store.journal(std::slice::from_ref(&old)).unwrap();
        assert_eq!(store.compact(5_000, 10).unwrap(), Vec::<MinionId>::new());
        store.record(&StoreWrite { done: std::slice::from_ref(&old.id), ..StoreWrite::default() }, "a").unwrap();
        assert_eq!(store.compact(5_000, 10).unwrap(), vec![old.id.clone()]);
        assert!(store.get(std::slice::from_ref(&old.id)).unwrap().is_empty());
        assert_eq!(store.load().unwrap().cold.iter().sum::<u32>(), 1);
        // A store of an earlier release (no list): listed when opened, the
        // plain tombstones only.
        let txn = store.db.begin_write().unwrap();
        txn.delete_table(TOMBSTONES).unwrap();
        txn.commit().unwrap();
        drop(store);
        let store = Store::open(dir.path(), "a").unwrap();
        let all: Vec<u32> = (0..N_BUCKETS as u32).collect();
        assert_eq!(store.cold_in(&all).unwrap(), vec![(young.id.clone(), young.version.clone())]);
        // An earlier release run after this one (a downgrade) accepts the key
        // again without unlisting it: the list is made again at the next
        // open, and a compaction never removes the accept anyway.
        let again = decision("gone-young", Verdict::Accepted(PublicKey::new(PUB.as_bytes())), 11_000 << 16, None);
        let txn = store.db.begin_write().unwrap();
        let record = codec::encode_record(&again, &[], None);
        txn.open_table(DECISIONS).unwrap().insert(again.id.as_str(), record.as_slice()).unwrap();
        txn.commit().unwrap();
        assert_eq!(store.compact(u64::MAX, 10).unwrap(), Vec::<MinionId>::new(), "a stale row is no tombstone");
        assert!(store.get(std::slice::from_ref(&again.id)).unwrap().contains(&again));
        assert!(store.cold_in(&all).unwrap().is_empty(), "and the stale row is gone");
        let txn = store.db.begin_write().unwrap();
        let (key, value) = tombstone_row(&young);
        txn.open_table(TOMBSTONES).unwrap().insert(key.as_slice(), value.as_slice()).unwrap();
        txn.commit().unwrap();
        drop(store);
        let store = Store::open(dir.path(), "a").unwrap();
        assert!(store.cold_in(&all).unwrap().is_empty(), "listed again at open");
    }

    /// The list follows what each write makes of a tombstone: a claim learnt
    /// for its id takes it off (it is no plain tombstone then, and must not
    /// be compacted); `cold_in` gives a bucket's own only; a held delete of
    /// an id keeps its tombstone from compaction.
    #[test]
    fn the_tombstone_list_follows_claims_and_held_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), "a").unwrap();
        let key = PublicKey::new(PUB.as_bytes());
        // Two deletes in different buckets.
        let ids: Vec<String> = (0..50).map(|i| format!("gone{i}")).collect();
        let first = MinionId::parse(&ids[0]).unwrap();
        let other = ids.iter().find(|id| bucket_of(&MinionId::parse(id).unwrap()) != bucket_of(&first)).unwrap();
        let (a, b) = (
            decision(&ids[0], Verdict::Deleted, 1_000 << 16, None),
            decision(other, Verdict::Deleted, 1_000 << 16, None),
        );
        store.record(&StoreWrite { decisions: &[a.clone(), b.clone()], ..StoreWrite::default() }, "a").unwrap();
        let in_a = store.cold_in(&[bucket_of(&a.id) as u32]).unwrap();
        assert_eq!(in_a, vec![(a.id.clone(), a.version.clone())], "only the bucket asked for");
        // A claim learnt for a's id, kept with its delete (a kept-only write).
        let claim = Decision {
            version: Version::claim(false, &key.fingerprint().0),
            verdict: Verdict::Accepted(key.clone()),
            ..decision(&ids[0], Verdict::Deleted, 0, None)
        };
        let kept = vec![keysync_machine::node::Kept { id: a.id.clone(), seen: vec![claim.seen()], mine: None }];
        let write = StoreWrite { claims: std::slice::from_ref(&claim), kept: &kept, ..StoreWrite::default() };
        store.record(&write, "a").unwrap();
        assert!(store.cold_in(&[bucket_of(&a.id) as u32]).unwrap().is_empty(), "no plain tombstone any more");
        assert!(store.cold(std::slice::from_ref(&a.id)).unwrap().is_empty());
        // b held by the guard (its delete of an accepted key, say): not compacted.
        let held = keysync_machine::node::HeldDelete { decision: b.clone(), from: "b".into(), since_ms: 0 };
        store.record(&StoreWrite { held: std::slice::from_ref(&held), ..StoreWrite::default() }, "a").unwrap();
        assert!(store.compact(u64::MAX, 10).unwrap().is_empty(), "a's is no tombstone, b's is held");
        store.record(&StoreWrite { unheld: std::slice::from_ref(&b.id), ..StoreWrite::default() }, "a").unwrap();
        assert_eq!(store.compact(u64::MAX, 10).unwrap(), vec![b.id.clone()]);
        assert_eq!(store.get(std::slice::from_ref(&a.id)).unwrap().len(), 2, "a's delete and claim stay");
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
