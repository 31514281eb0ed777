//! Key files written ahead: while the node applies one chunk of a join, the
//! link that fetched the next chunk writes its keys into staging folders
//! of their own (`writer-4/` to `writer-7/`, by one thread per core but
//! one, at most 4), on the other cores. When the node applies that chunk, a key
//! whose staged file holds exactly its bytes (the same fingerprint) in the
//! mode keys are written with then, and is still the very file written
//! (same inode, size, owner, mode and change time, one name), is renamed
//! into place instead of written again. Nothing a staged file holds is in a
//! key folder before the node journals and applies its decision: writing
//! ahead changes only when the bytes are written.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use super::identity::Identity;
use super::{remove_if_present, staged_name, write_new_file, Pki, MAX_WRITERS, PARALLEL_FROM};
use crate::core::{Decision, Fingerprint, PublicKey};

/// Chunks smaller than this are not written ahead (nor by several threads).
pub const PRESTAGE_FROM: usize = PARALLEL_FROM;

/// Free space the file system keeps beyond what writing ahead takes: the
/// key folders, the store and the audit log share it, and writing ahead
/// must never be what fills it.
const KEEP_FREE_BYTES: u64 = 64 * 1024 * 1024;

/// The files written ahead for one chunk; those not renamed into place are
/// removed when it is dropped (on a blocking thread where there is a
/// runtime).
pub struct Prestaged {
    /// Each writer's folder (`writer-<MAX_WRITERS + n>/`).
    dirs: Vec<Arc<OwnedFd>>,
    files: HashMap<String, Staged>,
    renamed: AtomicUsize,
    /// A file written ahead was found changed (and told once).
    refused: AtomicBool,
}

struct Staged {
    /// Index in `dirs`.
    dir: usize,
    name: String,
    fingerprint: Fingerprint,
    mode: u32,
    /// What the file was once written (as the agent wrote it, from its own
    /// descriptor: `identity.rs`).
    written: Identity,
    /// Renamed into place, or removed: nothing left to remove.
    taken: AtomicBool,
}

impl Pki {
    /// Writes the key of each of `keys` into the write-ahead staging
    /// folders, by one thread per core but one (the node's core thread
    /// applies the chunk before meanwhile), at least one and at most
    /// [`MAX_WRITERS`]. Nothing is written where the file system lacks
    /// room for it with [`KEEP_FREE_BYTES`] to spare; a writer stops at its
    /// first failure. What was not written ahead is written when applied,
    /// as any other.
    pub fn prestage(&self, keys: &[(String, PublicKey)]) -> Option<Prestaged> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.prestage_by(keys, cores.saturating_sub(1))
    }

    /// [`Pki::prestage`] by `writers` threads.
    pub(super) fn prestage_by(&self, keys: &[(String, PublicKey)], writers: usize) -> Option<Prestaged> {
        if keys.is_empty() || !self.room_to_write_ahead(keys) {
            return None;
        }
        let writers = writers.clamp(1, MAX_WRITERS);
        let dirs: Vec<Arc<OwnedFd>> =
            (0..writers).map(|n| self.staging.lane(&self.root, MAX_WRITERS + n)).collect::<Result<_, _>>().ok()?;
        let mode = self.key_mode();
        let part = keys.len().div_ceil(writers);
        let written: Vec<Vec<(String, Staged)>> = if writers == 1 {
            vec![self.write_ahead(0, &dirs[0], keys, mode)]
        } else {
            std::thread::scope(|scope| {
                let parts: Vec<_> = keys.chunks(part).zip(&dirs).enumerate().collect();
                let mut running = Vec::with_capacity(parts.len());
                let mut inline = Vec::new();
                for (n, (keys, dir)) in parts {
                    // A thread that cannot start (a limit on tasks): its part written here.
                    match std::thread::Builder::new().spawn_scoped(scope, move || self.write_ahead(n, dir, keys, mode))
                    {
                        Ok(writer) => running.push(writer),
                        Err(_) => inline.push(self.write_ahead(n, dir, keys, mode)),
                    }
                }
                let mut written: Vec<_> = running
                    .into_iter()
                    .map(|writer| writer.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
                    .collect();
                written.extend(inline);
                written
            })
        };
        let mut staged = Prestaged {
            dirs,
            files: HashMap::with_capacity(keys.len()),
            renamed: AtomicUsize::new(0),
            refused: AtomicBool::new(false),
        };
        for (id, file) in written.into_iter().flatten() {
            if let Some(earlier) = staged.files.insert(id, file) {
                // The same id twice in one chunk: the first is not used.
                let _ = remove_if_present(&*staged.dirs[earlier.dir], &earlier.name);
            }
        }
        Some(staged)
    }

    /// One writer's part: each key written under a fresh name in `dir`.
    fn write_ahead(&self, n: usize, dir: &OwnedFd, keys: &[(String, PublicKey)], mode: u32) -> Vec<(String, Staged)> {
        let mut written = Vec::with_capacity(keys.len());
        for (id, key) in keys {
            let name = staged_name("keysync");
            let identity = write_new_file(dir, &name, key.bytes(), mode, self.options.owner)
                .ok()
                .and_then(|file| Identity::of_file(&file));
            let Some(identity) = identity else {
                let _ = remove_if_present(dir, &name);
                break;
            };
            let staged = Staged {
                dir: n,
                name,
                fingerprint: key.fingerprint(),
                mode,
                written: identity,
                taken: AtomicBool::new(false),
            };
            written.push((id.clone(), staged));
        }
        written
    }

    /// Whether the file system of the staging folder has room for `keys`
    /// with [`KEEP_FREE_BYTES`] and as many inodes again to spare.
    fn room_to_write_ahead(&self, keys: &[(String, PublicKey)]) -> bool {
        let Ok(fs) = rustix::fs::fstatvfs(&*self.staging.fd) else { return false };
        let bytes: u64 = keys.iter().map(|(_, key)| key.bytes().len() as u64).sum();
        room_for(fs.f_bavail.saturating_mul(fs.f_frsize), fs.f_favail, fs.f_files, keys.len() as u64, bytes)
    }
}

/// Whether `n` files of `bytes` in all (each taking at least a 4 KiB block)
/// fit in `avail_bytes` and `avail_inodes` with room to spare: at least
/// [`KEEP_FREE_BYTES`] and twice what they take, and twice as many inodes
/// (a file system that counts none, `total_inodes` 0, has no such limit).
fn room_for(avail_bytes: u64, avail_inodes: u64, total_inodes: u64, n: u64, bytes: u64) -> bool {
    let takes = bytes.max(n.saturating_mul(4096));
    avail_bytes >= KEEP_FREE_BYTES.saturating_add(takes.saturating_mul(2))
        && (total_inodes == 0 || avail_inodes >= n.saturating_mul(2))
}

/// The keys of `decisions` to write ahead: those of accepted and rejected ids.
pub fn keys_of(decisions: &[Decision]) -> Vec<(String, PublicKey)> {
    decisions.iter().filter_map(|d| d.verdict.key().map(|key| (d.id.as_str().to_owned(), key.clone()))).collect()
}

impl Prestaged {
    /// The staged file written ahead for `id` if it holds exactly `key` in
    /// `mode` and is still the file written: its folder and name, given once.
    pub(super) fn take(&self, id: &str, key: &PublicKey, mode: u32) -> Option<(&OwnedFd, &str)> {
        let staged = self.files.get(id)?;
        if staged.fingerprint != key.fingerprint() || staged.mode != mode || staged.taken.swap(true, Ordering::AcqRel) {
            return None;
        }
        let dir = &*self.dirs[staged.dir];
        if Identity::at(dir, &staged.name) != Some(staged.written) {
            // Only the agent's user writes its staging folder: where that is
            // the salt user, something of the salt user's changed it.
            if !self.refused.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    id,
                    "a key file written ahead in the staging folder was changed or replaced since: \
                     not used, the key is written anew"
                );
            }
            let _ = remove_if_present(dir, &staged.name);
            return None;
        }
        Some((dir, staged.name.as_str()))
    }

    /// A file given by [`Prestaged::take`] was renamed into place.
    pub(super) fn renamed(&self) {
        self.renamed.fetch_add(1, Ordering::Relaxed);
    }

    /// How many of them were renamed into place so far.
    pub fn n_renamed(&self) -> usize {
        self.renamed.load(Ordering::Relaxed)
    }

    /// The name of the file written ahead for `id`, and its folder's index.
    #[cfg(test)]
    pub(super) fn name_of(&self, id: &str) -> Option<(usize, &str)> {
        self.files.get(id).map(|staged| (staged.dir, staged.name.as_str()))
    }
}

impl Drop for Prestaged {
    fn drop(&mut self) {
        let left = Leftovers {
            dirs: std::mem::take(&mut self.dirs),
            names: self
                .files
                .drain()
                .filter(|(_, staged)| !staged.taken.load(Ordering::Acquire))
                .map(|(_, staged)| (staged.dir, staged.name))
                .collect(),
        };
        if left.names.is_empty() {
            return;
        }
        // Not on the core's thread nor a runtime's worker, where one is.
        // Removed when dropped: also if the runtime, shutting down, drops
        // the task without running it.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(move || drop(left))),
            Err(_) => drop(left),
        }
    }
}

/// Files written ahead and not renamed: removed when dropped.
struct Leftovers {
    dirs: Vec<Arc<OwnedFd>>,
    names: Vec<(usize, String)>,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        for (dir, name) in &self.names {
            let _ = remove_if_present(&*self.dirs[*dir], name);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::path::Path;

    use keysync_machine::testkit::PUB;

    use super::{keys_of, room_for, KEEP_FREE_BYTES};
    use crate::core::{Decision, PublicKey, Version};
    use crate::disk::pki::tests::{batch, setup};
    use crate::disk::pki::{KEY_MODE, KEY_MODE_3008, MAX_WRITERS, PARALLEL_FROM, STAGING_DIR};

    #[test]
    fn nothing_is_written_ahead_where_it_would_leave_too_little_room() {
        let (n, bytes) = (2_000, 2_000 * 451);
        let takes = n * 4096;
        assert!(room_for(KEEP_FREE_BYTES + 2 * takes, 2 * n, 1_000_000, n, bytes));
        assert!(!room_for(KEEP_FREE_BYTES + 2 * takes - 1, 2 * n, 1_000_000, n, bytes), "bytes");
        assert!(!room_for(u64::MAX, 2 * n - 1, 1_000_000, n, bytes), "inodes");
        assert!(room_for(u64::MAX, 0, 0, n, bytes), "a file system that counts no inodes");
        let large = 16 * 1024;
        assert!(!room_for(KEEP_FREE_BYTES + 2 * n * 4096, 2 * n, 1_000_000, n, n * large), "large keys count whole");
    }

    /// Keys written ahead are renamed into place when the decision applied
    /// holds exactly that key in the mode of then, and the file is still the
    /// one written; any other is written from the decision's own bytes, and
    /// what was not renamed is removed.
    #[test]
    fn keys_written_ahead_are_renamed_into_place_and_the_rest_removed() {
        let (dir, pki) = setup();
        let key = PublicKey::new(PUB.as_bytes());
        let other = PublicKey::new(PUB.replace("mwIDAQAB", "mwIDAQAC").as_bytes());
        let n = PARALLEL_FROM * 2;
        let decisions = batch(n, &key);
        // m0005 was written ahead with another key; m9999 is not applied.
        let mut keys = keys_of(&decisions);
        keys[5].1 = other.clone();
        keys.push(("m9999".to_owned(), key.clone()));
        let staged = pki.prestage_by(&keys, 2).expect("written ahead (needs 64 MiB free in TMPDIR)");
        let ahead: Vec<_> =
            (0..2).map(|n| dir.path().join(STAGING_DIR).join(format!("writer-{}", MAX_WRITERS + n))).collect();
        let n_ahead = || ahead.iter().map(|dir| fs::read_dir(dir).unwrap().count()).sum::<usize>();
        assert_eq!(n_ahead(), n + 1);
        assert!(ahead.iter().all(|dir| fs::read_dir(dir).unwrap().count() > 0), "both writers wrote");
        let staged_path = |id: &str| {
            let (lane, name) = staged.name_of(id).unwrap();
            ahead[lane].join(name)
        };
        let inode_of = |id: &str| fs::metadata(staged_path(id)).unwrap().ino();
        let (renamed, mismatched) = (inode_of("m0001"), inode_of("m0005"));
        // m0002's file is written again in place (as the salt user could where
        // the agent runs as salt): no longer the file written, not renamed (its
        // content below is the decision's; its inode may be reused). Written
        // until its change time moves: the file system's clock ticks coarsely.
        let ctime = |path: &Path| {
            let meta = fs::metadata(path).unwrap();
            (meta.ctime(), meta.ctime_nsec())
        };
        let (changed, before) = (staged_path("m0002"), ctime(&staged_path("m0002")));
        for _ in 0..300 {
            fs::write(&changed, PUB.replace("mwIDAQAB", "mwIDAQAD")).unwrap();
            if ctime(&changed) != before {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_ne!(ctime(&changed), before, "m0002's change time never moved");

        let results = pki.apply_by(&decisions.iter().collect::<Vec<_>>(), 2, Some(&staged));
        assert!(results.iter().all(Result::is_ok));
        assert_eq!(staged.n_renamed(), n - 2, "all but m0005 and m0002");
        let accepted = dir.path().join("minions");
        assert_eq!(fs::metadata(accepted.join("m0001")).unwrap().ino(), renamed, "the file written ahead, renamed");
        assert_ne!(fs::metadata(accepted.join("m0005")).unwrap().ino(), mismatched, "another key: written anew");
        for i in 0..n {
            let folder = if i % 3 == 0 { "minions_rejected" } else { "minions" };
            let path = dir.path().join(folder).join(format!("m{i:04}"));
            assert_eq!(fs::read(&path).unwrap(), PUB.as_bytes(), "{}", path.display());
            assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, KEY_MODE);
        }
        assert_eq!(n_ahead(), 2, "m0005's and m9999's, until dropped (m0002's was removed when refused)");
        drop(staged);
        assert_eq!(n_ahead(), 0, "what was not renamed is removed");

        // Written ahead 0644, applied after the mode became 0600: written anew.
        let again: Vec<Decision> =
            decisions.iter().map(|d| Decision { version: Version::new(2, "a"), ..d.clone() }).collect();
        let staged = pki.prestage_by(&keys_of(&again), 2).expect("written ahead (needs 64 MiB free)");
        pki.set_key_mode(KEY_MODE_3008);
        let results = pki.apply_by(&again.iter().collect::<Vec<_>>(), 2, Some(&staged));
        assert!(results.iter().all(Result::is_ok));
        assert_eq!(staged.n_renamed(), 0);
        let mode = fs::metadata(accepted.join("m0001")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, KEY_MODE_3008);
        drop(staged);
        assert_eq!(n_ahead(), 0);
    }
}
