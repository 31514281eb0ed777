//! Applying a decision to the key folders: the key staged in the agent's
//! own folder and renamed into place (or the identical pending file linked
//! there), then the id removed from the other folders; by a few writer
//! threads for a large batch. Every call is relative to a folder opened once
//! (`dirs.rs`), never through a symlink.

use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;

use rustix::fs::{AtFlags, Mode, OFlags};

use super::adopt::Adoption;
use super::prestage::Prestaged;
use super::{Applied, Owner, Pki, PARALLEL_FROM, STAGING_DIR, STAGING_SEQ};
use crate::core::settle::FsChange;
use crate::core::{Decision, Folder, PublicKey, Slot, Verdict};

impl Pki {
    /// Makes the folders say `decision`: the key staged in the agent's
    /// folder and renamed into its folder, then the id removed from the
    /// other folders. Not durable until [`Pki::sync`].
    pub fn apply(&self, decision: &Decision) -> io::Result<Applied> {
        self.check_folders();
        self.apply_in(decision, 0, None)
    }

    /// [`Pki::apply`] for many decisions about distinct ids, by a few writer
    /// threads when there are many (a join, a `salt-key -A` burst). Creating
    /// a file is the costly step (ext4 searches its inode bitmaps under the
    /// staging folder's lock), so each writer stages in a folder of its own.
    /// Results are in the order of `decisions`. A key written ahead into
    /// `staged` ([`Pki::prestage`]) is renamed into place from there.
    pub fn apply_all(&self, decisions: &[&Decision], staged: Option<&Prestaged>) -> Vec<io::Result<Applied>> {
        self.check_folders();
        self.apply_by(decisions, super::writers(), staged)
    }

    pub(super) fn apply_by(
        &self,
        decisions: &[&Decision],
        writers: usize,
        staged: Option<&Prestaged>,
    ) -> Vec<io::Result<Applied>> {
        if decisions.len() < PARALLEL_FROM || writers < 2 {
            return decisions.iter().map(|decision| self.apply_in(decision, 0, staged)).collect();
        }
        let chunk = decisions.len().div_ceil(writers);
        std::thread::scope(|scope| {
            let running: Vec<_> = decisions
                .chunks(chunk)
                .enumerate()
                .map(|(lane, part)| {
                    scope.spawn(move || {
                        part.iter().map(|decision| self.apply_in(decision, lane, staged)).collect::<Vec<_>>()
                    })
                })
                .collect();
            running
                .into_iter()
                .flat_map(|writer| writer.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
                .collect()
        })
    }

    /// [`Pki::apply`], staging in writer `lane`'s folder, or renaming the
    /// key's file from `staged` where it was written ahead.
    pub(super) fn apply_in(&self, decision: &Decision, lane: usize, staged: Option<&Prestaged>) -> io::Result<Applied> {
        let id = decision.id.as_str();
        let (target, key) = match &decision.verdict {
            Verdict::Accepted(key) => (Some(Folder::Accepted), Some(key)),
            Verdict::Rejected(key) => (Some(Folder::Rejected), Some(key)),
            Verdict::Deleted => (None, None),
        };
        // Every folder this decision touches must be usable: nothing is half-done.
        let mut fds = Vec::with_capacity(3);
        for folder in Folder::ALL {
            fds.push(self.folder_fd(folder).map_err(|why| io::Error::new(io::ErrorKind::PermissionDenied, why))?);
        }
        let fd_of = |folder: Folder| &fds[folder.index()];
        let mut applied = Applied::default();
        let mut adopted = Adoption::No;
        if let (Some(folder), Some(key)) = (target, key) {
            adopted = match self.open_slot(Folder::Pending, id) {
                (Slot::Key(pending), Some(file)) if pending.fingerprint() == key.fingerprint() => self.adopt_pending(
                    file,
                    (folder, fd_of(folder)),
                    fd_of(Folder::Pending),
                    id,
                    key,
                    lane,
                    &mut applied.changes,
                ),
                (Slot::Key(pending), _) => {
                    applied.discarded_pending = Some(pending);
                    Adoption::No
                }
                _ => Adoption::No,
            };
            if adopted == Adoption::No {
                if !self.rename_staged(staged, fd_of(folder), id, key) {
                    self.write_key(fd_of(folder), folder, id, key.bytes(), lane)?;
                }
                applied.changes.push((folder, FsChange::MovedIn));
            }
        }
        for folder in Folder::ALL {
            // A linked pending file's name was removed already. After a rename
            // the name is removed again: the master may have written a new
            // pending key while the id was in no folder.
            if Some(folder) != target
                && !(adopted == Adoption::Linked && folder == Folder::Pending)
                && remove_if_present(fd_of(folder), id)?
            {
                applied.changes.push((folder, FsChange::Gone));
            }
        }
        Ok(applied)
    }

    /// Renames the file written ahead for `id` into `dir` if `staged` holds
    /// one with exactly `key` in the mode keys are written with now; false
    /// if there is none, or the rename failed (the file is then removed, and
    /// the key is written as if there had been none).
    fn rename_staged(&self, staged: Option<&Prestaged>, dir: &OwnedFd, id: &str, key: &PublicKey) -> bool {
        let Some(staged) = staged else { return false };
        let Some((from, name)) = staged.take(id, key, self.key_mode()) else { return false };
        if rustix::fs::renameat(from, name, dir, id).is_ok() {
            staged.renamed();
            return true;
        }
        let _ = remove_if_present(from, name);
        false
    }

    fn write_key(&self, dir: &OwnedFd, folder: Folder, id: &str, bytes: &[u8], lane: usize) -> io::Result<()> {
        let name = staged_name("keysync");
        let staging = self.staging.lane(&self.root, lane)?;
        let result = write_new(&*staging, &name, bytes, self.key_mode(), self.options.owner)
            .and_then(|()| rustix::fs::renameat(&*staging, &name, dir, id).map_err(io::Error::from));
        if let Err(e) = &result {
            let _ = rustix::fs::unlinkat(&*staging, &name, AtFlags::empty());
            if e.raw_os_error() == Some(libc::EXDEV) {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "{}/{STAGING_DIR} and {}/{} are on different mounts (rename fails with EXDEV): keep the \
                         key folders and the staging folder on one file system (see the packaged unit)",
                        self.root_path.display(),
                        self.root_path.display(),
                        folder.dir_name()
                    ),
                ));
            }
        }
        result
    }
}

/// A private name for a staged file: a dot file (Salt ignores it) unique in
/// this process.
pub(super) fn staged_name(what: &str) -> String {
    format!(".keysync-{what}-{}-{}", std::process::id(), STAGING_SEQ.fetch_add(1, Ordering::Relaxed))
}

/// Creates `name` in `dir`, which must not exist yet (never through a
/// symlink: `O_EXCL|O_NOFOLLOW`), holding `bytes`, with exactly `mode` and
/// owned by `owner`.
pub(super) fn write_new(dir: &impl AsFd, name: &str, bytes: &[u8], mode: u32, owner: Owner) -> io::Result<()> {
    write_new_file(dir, name, bytes, mode, owner).map(drop)
}

/// [`write_new`], the file left open.
pub(super) fn write_new_file(
    dir: &impl AsFd,
    name: &str,
    bytes: &[u8],
    mode: u32,
    owner: Owner,
) -> io::Result<std::fs::File> {
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(mode))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)?;
    // The umask may have narrowed the mode given to open.
    rustix::fs::fchmod(&file, Mode::from_raw_mode(mode))?;
    give_to(&file, owner)?;
    Ok(file)
}

/// Makes `owner` own the file or folder `fd`. Only when it does not
/// already: an agent that runs as the master's user owns what it creates,
/// and its unit denies chown altogether (SystemCallFilter=~@privileged),
/// even a no-op one.
pub(super) fn give_to(fd: &impl AsFd, owner: Owner) -> io::Result<()> {
    let st = rustix::fs::fstat(fd)?;
    if (st.st_uid, st.st_gid) == (owner.uid, owner.gid) {
        return Ok(());
    }
    let (uid, gid) = (rustix::fs::Uid::from_raw(owner.uid), rustix::fs::Gid::from_raw(owner.gid));
    Ok(rustix::fs::fchown(fd, Some(uid), Some(gid))?)
}

/// Removes `name` from `dir` (a symlink itself, never its target); true if
/// there was one.
pub(super) fn remove_if_present(dir: &impl AsFd, name: &str) -> io::Result<bool> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::NOENT) => Ok(false),
        Err(e) => Err(e.into()),
    }
}
