//! The crash-safe decision store under `state_dir` (redb): decisions with
//! their versions and keys, the journal of decisions being applied, and the
//! clock — what the node machine commits with a `StoreWrite` and loads at
//! its start.
//!
//! A peer's decision is journalled before its files are touched and moved to
//! `decisions` only after they are durable, so a crash mid-way is finished at
//! the next start instead of being mistaken for an operator's change.
//!
//! Its own crate so that the simulation of `keysync-machine` runs it too
//! (its tests depend on this crate); the agent (`disk/store.rs`) opens it
//! once the file is found to be its own, and notes the audit log's head
//! with each commit. What every store must do is the contract in
//! `keysync_machine::testkit::store_contract`, run here (`contract.rs`) and
//! against the simulation's store.
#![forbid(unsafe_code)]

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use keysync_machine::node::{Kept, Loaded, StoreWrite};

use crate::core::digest::{bucket_of, N_BUCKETS};
use crate::core::{Decision, MinionId};

pub(crate) use keysync_machine::core;

mod codec;
mod db;
pub mod format;
mod tombstones;

/// The command that rebuilds a state store from the peers, as the store's
/// errors (and the agent's) name it.
pub const RECOVER_COMMAND: &str = "salt-keysync recover --from-peers";
/// The recovery guide where the packages install it (messages name this,
/// not the repository's `docs/recovery.md`).
pub const RECOVERY_GUIDE: &str = "/usr/share/doc/salt-keysync/recovery.md";
/// The store's file in `state_dir`.
pub const FILE_NAME: &str = "state.redb";

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
/// The last completed comparison with a peer (wall-clock ms, u64 BE): a
/// master out of contact for longer than `tombstone_ttl` offers nothing.
const META_CONTACT: &str = "last_contact";
/// Per origin, the time the newest compacted delete was made: lines of
/// "origin millis".
const META_FORGOT: &str = "forgot_through";

fn decode_forgot(raw: &[u8]) -> Vec<(std::sync::Arc<str>, u64)> {
    String::from_utf8_lossy(raw)
        .lines()
        .filter_map(|line| {
            let (origin, ms) = line.rsplit_once(' ')?;
            Some((std::sync::Arc::from(origin), ms.parse().ok()?))
        })
        .collect()
}

fn encode_forgot(forgot: &[(std::sync::Arc<str>, u64)]) -> Vec<u8> {
    forgot.iter().map(|(origin, ms)| format!("{origin} {ms}\n")).collect::<String>().into_bytes()
}
/// Keys put back whose files may not be written yet (the node machine's
/// `put_back.rs`): ids separated by NUL, which no id holds.
const META_PUTTING_BACK: &str = "putting_back";

fn decode_ids(raw: &[u8]) -> Vec<MinionId> {
    String::from_utf8_lossy(raw).split('\0').filter_map(|id| MinionId::parse(id).ok()).collect()
}

fn encode_ids(ids: &[MinionId]) -> Vec<u8> {
    ids.iter().map(MinionId::as_str).collect::<Vec<_>>().join("\0").into_bytes()
}

/// The audit log's head when the store last committed (see `audit_guard.rs`).
const META_AUDIT_HEAD: &str = "audit_head";
/// When this store started afresh (an hlc, u64 BE): when it was made, or
/// what `recover --from-peers` recorded. The decisions naming this master
/// as their origin from before then are its own forgotten past
/// (`keysync_machine::node::Loaded::afresh`).
const META_AFRESH: &str = "afresh";
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
    /// A format this release does not read (a downgrade): refused before
    /// anything is written.
    #[error("{}", format::too_new_message(.path, .found))]
    TooNew { path: PathBuf, found: format::Format },
    /// The store file is another user's: the agent checks before it opens
    /// the store (its `disk/store/format.rs`).
    #[error("state store {}", .0.message())]
    Foreign(format::Foreign),
    #[error("{path}: {cause}")]
    File { path: PathBuf, cause: std::io::Error },
}

pub struct Store {
    db: db::Db,
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
    /// Opens the store of `node` in `state_dir`, or makes it; `now_ms` is
    /// the wall clock (a store made now starts afresh then).
    pub fn open(state_dir: &Path, node: &str, now_ms: u64) -> Result<Store, StoreError> {
        let path = state_dir.join(FILE_NAME);
        let db = db::Db::file(path.clone()).map_err(|e| db_error(&path, e))?;
        Store::init(Store { db, path, id: String::new() }, node, Some(state_dir), now_ms)
    }

    /// A store in memory, gone when the agent stops: observe mode keeps no
    /// state, so the first start in normal mode afterwards is a first start.
    pub fn in_memory(node: &str, now_ms: u64) -> Result<Store, StoreError> {
        let path = PathBuf::from("(in memory: observe mode)");
        let db = redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .map_err(|e| db_error(&path, e))?;
        let store = Store { db: db::Db::memory(path.clone(), db), path, id: String::new() };
        Store::init(store, node, None, now_ms)
    }

    /// Checks the store's format (a newer one is refused before anything is
    /// written), makes the tables, and marks it with this release's format,
    /// in `state.format` beside it first (`state_dir`, for a file).
    fn init(mut store: Store, node: &str, state_dir: Option<&Path>, now_ms: u64) -> Result<Store, StoreError> {
        let txn = store.db.begin_write().map_err(|e| store.err(e))?;
        {
            let mut meta = txn.open_table(META).map_err(|e| store.err(e))?;
            let found = format::read_meta(&meta).map_err(|e| store.err(e))?;
            if let Some(found) = found.as_ref().filter(|found| !found.is_readable()) {
                return Err(StoreError::TooNew { path: store.path.clone(), found: found.clone() });
            }
            let ours = format::Format::this_release();
            if let Some(dir) = state_dir {
                format::write_text(dir, &ours)
                    .map_err(|cause| StoreError::File { path: dir.join(format::TEXT_NAME), cause })?;
            }
            if found.as_ref() != Some(&ours) {
                format::write_meta(&mut meta, &ours).map_err(|e| store.err(e))?;
            }
        }
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
                    // A new store starts afresh now (a first start, or a purge and reinstall).
                    let afresh = now_ms << keysync_machine::core::version::LOGICAL_BITS;
                    meta.insert(META_AFRESH, afresh.to_be_bytes().as_slice()).map_err(|e| store.err(e))?;
                    id
                }
            };
        }
        txn.commit().map_err(|e| store.err(e))?;
        Ok(store)
    }

    /// A read-only look at the store in `state_dir`.
    pub fn peek(state_dir: &Path) -> Result<Peek, StoreError> {
        let path = state_dir.join(FILE_NAME);
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

    /// A redb error as the store's, noted (an I/O error makes the next
    /// transaction reopen the database: `db.rs`).
    fn err(&self, e: impl Into<redb::Error>) -> StoreError {
        db_error(&self.path, self.db.noted(e.into()))
    }

    /// How many times the database was reopened after an I/O error.
    pub fn reopened(&self) -> u64 {
        self.db.reopened()
    }

    /// Everything the store holds, read at start-up.
    pub fn load(&self) -> Result<Loaded, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let mut entries = Vec::new();
        let mut cold = vec![0u32; N_BUCKETS];
        let mut plain = tombstones::RowSum::default();
        for row in txn.open_table(DECISIONS).map_err(|e| self.err(e))?.iter().map_err(|e| self.err(e))? {
            let (id, value) = row.map_err(|e| self.err(e))?;
            let record = self.decode(id.value(), value.value())?;
            if record.is_plain_tombstone() {
                cold[bucket_of(&record.decision.id)] += 1;
                plain.add_decision(&record.decision);
                continue;
            }
            entries.push(record.into_entry());
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
        let last_contact_ms = meta
            .get(META_CONTACT)
            .map_err(|e| self.err(e))?
            .and_then(|raw| raw.value().try_into().ok().map(u64::from_be_bytes));
        let forgot =
            meta.get(META_FORGOT).map_err(|e| self.err(e))?.map(|raw| decode_forgot(raw.value())).unwrap_or_default();
        let afresh = meta
            .get(META_AFRESH)
            .map_err(|e| self.err(e))?
            .and_then(|raw| raw.value().try_into().ok().map(u64::from_be_bytes))
            .unwrap_or(0);
        let putting_back = meta
            .get(META_PUTTING_BACK)
            .map_err(|e| self.err(e))?
            .map(|raw| decode_ids(raw.value()))
            .unwrap_or_default();
        let mut held = Vec::new();
        for row in txn.open_table(HELD).map_err(|e| self.err(e))?.iter().map_err(|e| self.err(e))? {
            let (id, value) = row.map_err(|e| self.err(e))?;
            let corrupt = || StoreError::Corrupt { path: self.path.clone(), id: id.value().to_string() };
            held.push(codec::decode_held(id.value(), value.value()).ok_or_else(corrupt)?);
        }
        drop(txn);
        self.check_tombstone_list(plain)?;
        Ok(Loaded {
            entries,
            cold,
            journal,
            clock,
            initialized,
            untold,
            held,
            last_contact_ms,
            forgot,
            putting_back,
            afresh,
        })
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
        self.record_noting(write, node, None)
    }

    /// [`Store::record`], noting in the same commit where the audit log's
    /// chain ends now (its head, as the audit log writes it), so that
    /// records removed while the agent is stopped are noticed at its next
    /// start.
    pub fn record_noting(
        &self,
        write: &StoreWrite<'_>,
        node: &str,
        audit_head: Option<&str>,
    ) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(|e| self.err(e))?;
        {
            let mut table = txn.open_table(DECISIONS).map_err(|e| self.err(e))?;
            let mut claims = txn.open_table(CLAIMS).map_err(|e| self.err(e))?;
            let mut tombstones = txn.open_table(TOMBSTONES).map_err(|e| self.err(e))?;
            let kept = KeptById::new(write);
            for (at, decision) in write.decisions.iter().enumerate() {
                let (seen, mine) =
                    kept.get(at, &decision.id).map(|k| (k.seen.as_slice(), k.mine.as_ref())).unwrap_or_default();
                let record = codec::encode_record(decision, seen, mine);
                tombstones::index(&mut tombstones, decision, seen, mine).map_err(|e| self.err(e))?;
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
                // No row to remove from an empty table of displaced claims
                // (a first start's): its key is not formatted nor looked up.
                if decision.version.is_claim() && !claims.is_empty().map_err(|e| self.err(e))? {
                    claims.remove(claim_key(decision).as_str()).map_err(|e| self.err(e))?;
                }
            }
            for claim in write.claims {
                let bytes = codec::encode_record(claim, &[], None);
                claims.insert(claim_key(claim).as_str(), bytes.as_slice()).map_err(|e| self.err(e))?;
            }
            // Ids whose held decision stays and whose seen list or claim
            // changed: none when each kept is a decision's.
            let others = if kept.in_step() { &[][..] } else { write.kept };
            let decided: HashSet<&MinionId> =
                if others.is_empty() { HashSet::new() } else { write.decisions.iter().map(|d| &d.id).collect() };
            for k in others.iter().filter(|k| !decided.contains(&k.id)) {
                let held = table.get(k.id.as_str()).map_err(|e| self.err(e))?.map(|v| v.value().to_vec());
                if let Some(held) = held {
                    let decision = self.decode(k.id.as_str(), &held)?.decision;
                    let record = codec::encode_record(&decision, &k.seen, k.mine.as_ref());
                    tombstones::index(&mut tombstones, &decision, &k.seen, k.mine.as_ref()).map_err(|e| self.err(e))?;
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
                    .insert(key.as_str(), codec::encode_conflict(from.as_str(), conflict).as_slice())
                    .map_err(|e| self.err(e))?;
            }
            let mut held = txn.open_table(HELD).map_err(|e| self.err(e))?;
            for h in write.held {
                held.insert(h.decision.id.as_str(), codec::encode_held(h).as_slice()).map_err(|e| self.err(e))?;
            }
            // Settled after those held: an id both held and settled by one
            // commit is not held (the machine settles only what its guard
            // no longer holds).
            for id in write.unheld {
                held.remove(id.as_str()).map_err(|e| self.err(e))?;
            }
            let mut meta = txn.open_table(META).map_err(|e| self.err(e))?;
            meta.insert(META_CLOCK, write.clock.to_be_bytes().as_slice()).map_err(|e| self.err(e))?;
            if write.initialize {
                meta.insert(META_NODE, node.as_bytes()).map_err(|e| self.err(e))?;
            }
            if let Some(contact) = write.contact {
                meta.insert(META_CONTACT, contact.to_be_bytes().as_slice()).map_err(|e| self.err(e))?;
            }
            if let Some(head) = audit_head {
                meta.insert(META_AUDIT_HEAD, head.as_bytes()).map_err(|e| self.err(e))?;
            }
            match write.putting_back {
                Some([]) => {
                    meta.remove(META_PUTTING_BACK).map_err(|e| self.err(e))?;
                }
                Some(ids) => {
                    meta.insert(META_PUTTING_BACK, encode_ids(ids).as_slice()).map_err(|e| self.err(e))?;
                }
                None => {}
            }
        }
        txn.commit().map_err(|e| self.err(e))
    }

    /// Records when this store started afresh (`recover --from-peers`: after
    /// its peers' clocks; see [`META_AFRESH`]).
    pub fn set_afresh(&self, hlc: u64) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(|e| self.err(e))?;
        {
            let mut meta = txn.open_table(META).map_err(|e| self.err(e))?;
            meta.insert(META_AFRESH, hlc.to_be_bytes().as_slice()).map_err(|e| self.err(e))?;
        }
        txn.commit().map_err(|e| self.err(e))
    }

    /// Where the audit log's chain ended at the last commit that noted it,
    /// as the audit log wrote it (`None` too for text that is no UTF-8).
    pub fn audit_head_text(&self) -> Result<Option<String>, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.err(e))?;
        let meta = txn.open_table(META).map_err(|e| self.err(e))?;
        let head = meta.get(META_AUDIT_HEAD).map_err(|e| self.err(e))?;
        Ok(head.and_then(|v| std::str::from_utf8(v.value()).ok().map(str::to_string)))
    }

    /// Notes where the audit log's chain ends (at a clean stop).
    pub fn set_audit_head_text(&self, head: &str) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(|e| self.err(e))?;
        {
            let mut meta = txn.open_table(META).map_err(|e| self.err(e))?;
            meta.insert(META_AUDIT_HEAD, head.as_bytes()).map_err(|e| self.err(e))?;
        }
        txn.commit().map_err(|e| self.err(e))
    }

    fn decode(&self, id: &str, bytes: &[u8]) -> Result<codec::Record, StoreError> {
        codec::decode_record(id, bytes).ok_or_else(|| StoreError::Corrupt { path: self.path.clone(), id: id.into() })
    }
}

/// What a commit keeps beside each of its decisions ([`StoreWrite::kept`]).
enum KeptById<'w> {
    /// The `i`th is the `i`th decision's, and their ids are sorted and
    /// distinct: a scan's step, where every id's entry changed with its
    /// decision (5,000 at a time on a first start; each id was hashed four
    /// times, into and out of two hash tables, before).
    InStep(&'w [Kept]),
    /// Looked up by id (a scan per decision was most of a first start's CPU):
    /// the first for an id, as a scan found it.
    ById(HashMap<&'w MinionId, &'w Kept>),
}

impl<'w> KeptById<'w> {
    fn new(write: &StoreWrite<'w>) -> KeptById<'w> {
        let in_step = write.kept.len() == write.decisions.len()
            && write.kept.iter().zip(write.decisions).all(|(k, d)| k.id == d.id)
            && write.decisions.windows(2).all(|pair| pair[0].id < pair[1].id);
        if in_step {
            return KeptById::InStep(write.kept);
        }
        let mut kept = HashMap::with_capacity(write.kept.len());
        for k in write.kept {
            kept.entry(&k.id).or_insert(k);
        }
        KeptById::ById(kept)
    }

    /// What is kept beside the decision at `at`, whose id is `id`.
    fn get(&self, at: usize, id: &MinionId) -> Option<&'w Kept> {
        match self {
            KeptById::InStep(kept) => kept.get(at),
            KeptById::ById(kept) => kept.get(id).copied(),
        }
    }

    /// Whether every kept is a decision's.
    fn in_step(&self) -> bool {
        matches!(self, KeptById::InStep(_))
    }
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
mod contract;
#[cfg(test)]
mod tests;
