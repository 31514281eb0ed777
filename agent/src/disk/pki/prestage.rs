//! Key files written ahead: while the node applies one chunk of a join, the
//! link that fetched the next chunk writes its keys into a staging folder
//! of their own (`writer-<MAX_WRITERS>`), on another core. When the node
//! applies that chunk, a key whose staged file holds exactly its bytes (the
//! same fingerprint) in the mode keys are written with then is renamed into
//! place instead of written again. Nothing a staged file holds is in a key
//! folder before the node applies it: writing ahead changes only when the
//! bytes are written, not what is decided or when it is journalled.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rustix::fs::AtFlags;

use super::{staged_name, write_new, Pki, MAX_WRITERS, PARALLEL_FROM};
use crate::core::{Decision, Fingerprint, PublicKey};

/// Chunks smaller than this are not written ahead (nor by several threads).
pub const PRESTAGE_FROM: usize = PARALLEL_FROM;

/// The files written ahead for one chunk; those not renamed into place are
/// removed when it is dropped.
pub struct Prestaged {
    dir: Arc<OwnedFd>,
    files: HashMap<String, Staged>,
}

struct Staged {
    name: String,
    fingerprint: Fingerprint,
    mode: u32,
    /// Renamed into place, or removed: nothing left to remove.
    taken: AtomicBool,
}

impl Pki {
    /// Writes the key of each decision that has one into the write-ahead
    /// staging folder. Stops at the first failure (a full disk): what was
    /// not written ahead is written when applied, as any other.
    pub fn prestage(&self, keys: &[(String, PublicKey)]) -> Option<Prestaged> {
        let dir = self.staging.lane(&self.root, MAX_WRITERS).ok()?;
        let mode = self.key_mode();
        let mut files = HashMap::with_capacity(keys.len());
        for (id, key) in keys {
            let name = staged_name("keysync");
            if write_new(&*dir, &name, key.bytes(), mode, self.options.owner).is_err() {
                let _ = rustix::fs::unlinkat(&*dir, name.as_str(), AtFlags::empty());
                break;
            }
            let staged = Staged { name, fingerprint: key.fingerprint(), mode, taken: AtomicBool::new(false) };
            if let Some(earlier) = files.insert(id.clone(), staged) {
                let _ = rustix::fs::unlinkat(&*dir, earlier.name.as_str(), AtFlags::empty());
            }
        }
        Some(Prestaged { dir, files })
    }
}

/// The keys of `decisions` to write ahead: those of accepted and rejected ids.
pub fn keys_of(decisions: &[Decision]) -> Vec<(String, PublicKey)> {
    decisions.iter().filter_map(|d| d.verdict.key().map(|key| (d.id.as_str().to_owned(), key.clone()))).collect()
}

impl Prestaged {
    /// The staged file written ahead for `id` if it holds exactly `key` in
    /// `mode`: its folder and name, given once.
    pub(super) fn take(&self, id: &str, key: &PublicKey, mode: u32) -> Option<(&OwnedFd, &str)> {
        let staged = self.files.get(id)?;
        if staged.fingerprint != key.fingerprint() || staged.mode != mode || staged.taken.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some((&*self.dir, staged.name.as_str()))
    }

    /// Removes the staged file named `name` (a rename of it failed).
    pub(super) fn remove(&self, name: &str) {
        let _ = rustix::fs::unlinkat(&*self.dir, name, AtFlags::empty());
    }

    /// The name of the file written ahead for `id`.
    #[cfg(test)]
    pub(super) fn name_of(&self, id: &str) -> Option<&str> {
        self.files.get(id).map(|staged| staged.name.as_str())
    }

    /// How many files were written ahead.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

impl Drop for Prestaged {
    fn drop(&mut self) {
        for staged in self.files.values() {
            if !staged.taken.load(Ordering::Acquire) {
                let _ = rustix::fs::unlinkat(&*self.dir, staged.name.as_str(), AtFlags::empty());
            }
        }
    }
}
