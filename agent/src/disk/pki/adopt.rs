//! Adopting a pending file that holds exactly the decided key: moved into
//! its folder, as `salt-key` does, instead of a copy being written.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;

use rustix::fs::{AtFlags, Mode};

use super::{remove_if_present, staged_name, Pki};
use crate::core::settle::FsChange;
use crate::core::{Folder, PublicKey};

/// How a pending file holding the decided key was moved into place, if it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Adoption {
    No,
    /// Hard-linked into place and its pending name removed.
    Linked,
    /// Renamed into place through the staging folder.
    Renamed,
}

impl Pki {
    /// Moves the pending key file, which holds exactly the decided key, into
    /// `folder`, as `salt-key` itself does: no new file is written. The very
    /// inode that was read is hard-linked into place through its open file
    /// (`/proc/self/fd/N`: nothing swapped in under its name can be linked
    /// instead), checked to still hold exactly the key, and its pending name
    /// removed. A link takes no file-system-wide lock, unlike a rename from
    /// one folder to another, which every rename on the disk waits for.
    /// When the name is taken in `folder` (a link never replaces), or links
    /// cannot be made, see [`Pki::adopt_by_renaming`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn adopt_pending(
        &self,
        file: File,
        (folder, dir): (Folder, &OwnedFd),
        pending_dir: &OwnedFd,
        id: &str,
        key: &PublicKey,
        lane: usize,
        changes: &mut Vec<(Folder, FsChange)>,
    ) -> Adoption {
        if self.no_adopt.load(Ordering::Relaxed) {
            return Adoption::No;
        }
        let renamed = |changes: &mut Vec<(Folder, FsChange)>| {
            if self.adopt_by_renaming(&file, (folder, dir), pending_dir, id, key, lane, changes) {
                Adoption::Renamed
            } else {
                Adoption::No
            }
        };
        if self.no_link.load(Ordering::Relaxed) {
            return renamed(changes);
        }
        // Only a file with no other name, still holding exactly the key, is
        // linked; its mode and owner are made the agent's first.
        if !one_name(&file) || !holds_exactly(&file, key) || self.fix_mode_and_owner(&file).is_err() {
            return Adoption::No;
        }
        use std::os::fd::AsRawFd;
        let linked = rustix::fs::linkat(
            rustix::fs::CWD,
            format!("/proc/self/fd/{}", file.as_raw_fd()),
            dir,
            id,
            AtFlags::SYMLINK_FOLLOW,
        );
        match linked {
            Ok(()) => changes.push((folder, FsChange::Written)),
            Err(rustix::io::Errno::EXIST) => return renamed(changes),
            Err(rustix::io::Errno::XDEV) => {
                self.stop_adopting();
                return Adoption::No;
            }
            // The file read has no name left (removed or replaced since): the
            // caller writes the key. With a name left, /proc is unusable.
            Err(rustix::io::Errno::NOENT) if file.metadata().is_ok_and(|meta| meta_nlink(&meta) == 0) => {
                return Adoption::No
            }
            Err(
                e @ (rustix::io::Errno::NOENT
                | rustix::io::Errno::PERM
                | rustix::io::Errno::ACCESS
                | rustix::io::Errno::INVAL
                | rustix::io::Errno::OPNOTSUPP),
            ) => {
                if !self.no_link.swap(true, Ordering::Relaxed) {
                    tracing::info!(error = %e, "pending keys are adopted by renaming: an open file cannot be linked");
                }
                return renamed(changes);
            }
            // Out of space, I/O errors: the caller writes the key, and its
            // failure is retried.
            Err(_) => return Adoption::No,
        }
        let pending = remove_if_present(pending_dir, id);
        if matches!(pending, Ok(true)) {
            changes.push((Folder::Pending, FsChange::Gone));
        }
        // Now in place under that one name, holding the key (written to, or
        // linked elsewhere, meanwhile?); otherwise the caller writes the key
        // over it, and removes the pending name if still there.
        if pending.is_ok() && one_name(&file) && holds_exactly(&file, key) {
            Adoption::Linked
        } else {
            Adoption::No
        }
    }

    /// [`Pki::adopt_pending`] by renaming. The file is first renamed to a
    /// private name in writer `lane`'s staging folder (outside the watched
    /// folders, and a small folder: ext4 pays for every entry added to or
    /// removed from a folder of thousands), and only moved on if that name is
    /// the very inode that was read (a regular file with one link) still
    /// holding exactly the key; whatever else was swapped in meanwhile is
    /// removed there, never moved. Returns false, and the caller writes the
    /// key, when anything differs or fails.
    #[allow(clippy::too_many_arguments)]
    fn adopt_by_renaming(
        &self,
        file: &File,
        (folder, dir): (Folder, &OwnedFd),
        pending_dir: &OwnedFd,
        id: &str,
        key: &PublicKey,
        lane: usize,
        changes: &mut Vec<(Folder, FsChange)>,
    ) -> bool {
        let Ok(staging) = self.staging.lane(&self.root, lane) else { return false };
        let private = staged_name("adopt");
        if let Err(e) = rustix::fs::renameat(pending_dir, id, &*staging, private.as_str()) {
            if e == rustix::io::Errno::XDEV {
                self.stop_adopting();
            }
            return false;
        }
        changes.push((Folder::Pending, FsChange::Gone));
        let adopted = (|| -> std::io::Result<bool> {
            let read = rustix::fs::fstat(file)?;
            let moved = rustix::fs::statat(&*staging, private.as_str(), AtFlags::SYMLINK_NOFOLLOW)?;
            if rustix::fs::FileType::from_raw_mode(moved.st_mode) != rustix::fs::FileType::RegularFile
                || (moved.st_dev, moved.st_ino) != (read.st_dev, read.st_ino)
                || moved.st_nlink != 1
            {
                return Ok(false);
            }
            if !holds_exactly(file, key) {
                return Ok(false);
            }
            self.fix_mode_and_owner(file)?;
            match rustix::fs::renameat(&*staging, private.as_str(), dir, id) {
                Ok(()) => Ok(true),
                Err(rustix::io::Errno::XDEV) => {
                    self.stop_adopting();
                    Ok(false)
                }
                Err(e) => Err(e.into()),
            }
        })();
        if matches!(adopted, Ok(true)) {
            changes.push((folder, FsChange::MovedIn));
            return true;
        }
        // The pending copy is superseded by the decision either way; a
        // leftover is removed by the next start's staging clean-up.
        let _ = rustix::fs::unlinkat(&*staging, private.as_str(), AtFlags::empty());
        false
    }

    /// Gives an adopted file the mode and owner the agent writes keys with.
    fn fix_mode_and_owner(&self, file: &File) -> std::io::Result<()> {
        let st = rustix::fs::fstat(file)?;
        if st.st_mode & 0o7777 != self.key_mode() {
            rustix::fs::fchmod(file, Mode::from_raw_mode(self.key_mode()))?;
        }
        let owner = self.options.owner;
        if (st.st_uid, st.st_gid) != (owner.uid, owner.gid) {
            rustix::fs::fchown(
                file,
                Some(rustix::fs::Uid::from_raw(owner.uid)),
                Some(rustix::fs::Gid::from_raw(owner.gid)),
            )?;
        }
        Ok(())
    }

    fn stop_adopting(&self) {
        if !self.no_adopt.swap(true, Ordering::Relaxed) {
            tracing::info!(pki_dir = %self.root_path.display(), "pending keys are copied: the key folders are on different mounts");
        }
    }
}

fn meta_nlink(meta: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    meta.nlink()
}

fn one_name(file: &File) -> bool {
    file.metadata().is_ok_and(|meta| meta_nlink(&meta) == 1)
}

/// True if `file` holds exactly the key's bytes, read through it.
fn holds_exactly(file: &File, key: &PublicKey) -> bool {
    use std::os::unix::fs::FileExt;
    let mut bytes = vec![0; key.bytes().len() + 1];
    file.read_at(&mut bytes, 0).is_ok_and(|n| &bytes[..n] == key.bytes())
}
