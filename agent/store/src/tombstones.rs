//! The store's list of plain tombstones (`TOMBSTONES`, see
//! `core::decision::is_plain_tombstone`): kept in step with `decisions` by
//! every commit ([`index`]), compared with it at every load, read back by
//! id or by bucket and compacted (what `node/cold.rs` asks for).

use redb::{ReadableTable, ReadableTableMetadata};

use super::{Store, StoreError, DECISIONS, HELD, JOURNAL, META, META_FORGOT, TOMBSTONES};
use crate::core::decision::is_plain_tombstone;
use crate::core::digest::bucket_of;
use crate::core::{Decision, Entry, MinionId, Seen, Version};

/// A sum of `TOMBSTONES` rows (their count, and the sum of their hashes):
/// equal sums, equal lists, with no list of ids in memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct RowSum {
    n: u64,
    sum: u64,
}

impl RowSum {
    /// Adds one row.
    fn add(&mut self, key: &[u8], value: &[u8]) {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        hasher.update((key.len() as u64).to_be_bytes());
        hasher.update(key);
        hasher.update(value);
        let hash = hasher.finalize();
        self.n += 1;
        self.sum = self.sum.wrapping_add(u64::from_be_bytes(hash[..8].try_into().expect("sha256 is 32 bytes")));
    }

    /// Adds the row a plain tombstone `decision` should have.
    pub(super) fn add_decision(&mut self, decision: &Decision) {
        let (key, value) = tombstone_row(decision);
        self.add(&key, &value);
    }
}

impl Store {
    /// Makes `TOMBSTONES` list exactly the plain tombstones of `DECISIONS`
    /// (summed in `plain` as `load` read them): a store of an earlier
    /// release has no list, and a downgraded release writes decisions
    /// without keeping it.
    pub(super) fn check_tombstone_list(&self, plain: RowSum) -> Result<(), StoreError> {
        let mut listed = RowSum::default();
        {
            let txn = self.db.begin_read().map_err(|e| self.err(e))?;
            for row in txn.open_table(TOMBSTONES).map_err(|e| self.err(e))?.iter().map_err(|e| self.err(e))? {
                let (key, value) = row.map_err(|e| self.err(e))?;
                listed.add(key.value(), value.value());
            }
        }
        if listed == plain {
            return Ok(());
        }
        let txn = self.db.begin_write().map_err(|e| self.err(e))?;
        {
            let mut tombstones = txn.open_table(TOMBSTONES).map_err(|e| self.err(e))?;
            tombstones.retain(|_, _| false).map_err(|e| self.err(e))?;
            for row in txn.open_table(DECISIONS).map_err(|e| self.err(e))?.iter().map_err(|e| self.err(e))? {
                let (id, value) = row.map_err(|e| self.err(e))?;
                let record = self.decode(id.value(), value.value())?;
                if record.is_plain_tombstone() {
                    let (key, value) = tombstone_row(&record.decision);
                    tombstones.insert(key.as_slice(), value.as_slice()).map_err(|e| self.err(e))?;
                }
            }
        }
        txn.commit().map_err(|e| self.err(e))?;
        tracing::info!("state store: the list of tombstones was made again (a store of another release)");
        Ok(())
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
                    out.push(record.into_entry());
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
        Ok(self.compact_versions(before_ms, max)?.into_iter().map(|(id, _)| id).collect())
    }

    /// [`Store::compact`], with each forgotten delete's version: per origin,
    /// the newest is what peers are told this master forgot (`stale.rs`).
    pub fn compact_versions(&self, before_ms: u64, max: usize) -> Result<Vec<(MinionId, Version)>, StoreError> {
        let txn = self.db.begin_write().map_err(|e| self.err(e))?;
        let mut old = Vec::new();
        {
            let mut tombstones = txn.open_table(TOMBSTONES).map_err(|e| self.err(e))?;
            let mut decisions = txn.open_table(DECISIONS).map_err(|e| self.err(e))?;
            let journal = txn.open_table(JOURNAL).map_err(|e| self.err(e))?;
            let held = txn.open_table(HELD).map_err(|e| self.err(e))?;
            let mut stale = Vec::new();
            for row in tombstones.iter().map_err(|e| self.err(e))? {
                if old.len() >= max {
                    break;
                }
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
                        old.push((key.value().to_vec(), id, version));
                    }
                    _ => stale.push(key.value().to_vec()),
                }
            }
            for key in &stale {
                tombstones.remove(key.as_slice()).map_err(|e| self.err(e))?;
            }
            for (key, id, _) in &old {
                tombstones.remove(key.as_slice()).map_err(|e| self.err(e))?;
                decisions.remove(id.as_str()).map_err(|e| self.err(e))?;
            }
            // Per origin, the newest delete ever forgotten, in the same
            // commit: a peer whose last contact is older may have missed it
            // (`stale.rs`).
            if !old.is_empty() {
                let mut meta = txn.open_table(META).map_err(|e| self.err(e))?;
                let mut forgot = match meta.get(META_FORGOT).map_err(|e| self.err(e))? {
                    Some(raw) => super::decode_forgot(raw.value()),
                    None => Vec::new(),
                };
                for (_, _, version) in &old {
                    crate::core::version::note_forgotten(&mut forgot, &version.node, version.millis());
                }
                meta.insert(META_FORGOT, super::encode_forgot(&forgot).as_slice()).map_err(|e| self.err(e))?;
            }
        }
        txn.commit().map_err(|e| self.err(e))?;
        Ok(old.into_iter().map(|(_, id, version)| (id, version)).collect())
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
}

/// Keeps `TOMBSTONES` listing `decision`'s id exactly when the decision,
/// held with `seen` and `mine`, is a plain tombstone.
pub(super) fn index(
    tombstones: &mut redb::Table<&[u8], &[u8]>,
    decision: &Decision,
    seen: &[Seen],
    mine: Option<&Version>,
) -> Result<(), redb::StorageError> {
    let plain = is_plain_tombstone(decision.verdict.kind(), seen, mine);
    // No row to remove from an empty table: a first start's 1,000,000
    // claims are not hashed for their buckets and looked up one by one.
    if !plain && tombstones.is_empty()? {
        return Ok(());
    }
    let (key, value) = tombstone_row(decision);
    if plain {
        tombstones.insert(key.as_slice(), value.as_slice())?;
    } else {
        tombstones.remove(key.as_slice())?;
    }
    Ok(())
}

/// `decision`'s row in `TOMBSTONES`: (bucket, id) → version.
pub(super) fn tombstone_row(decision: &Decision) -> (Vec<u8>, Vec<u8>) {
    let bucket = u16::try_from(bucket_of(&decision.id)).unwrap_or(u16::MAX);
    let mut key = bucket.to_be_bytes().to_vec();
    key.extend_from_slice(decision.id.as_str().as_bytes());
    let mut value = decision.version.hlc.to_be_bytes().to_vec();
    value.extend_from_slice(decision.version.node.as_bytes());
    (key, value)
}
