//! Key files' tokens ([`FileToken`]): a key file's inode, size, owner,
//! mode and change and modification times, hashed with its folder, so that
//! a scan reads again only the files that are not the ones it read last.
//!
//! Every change to a file's bytes, owner, mode or links sets its change
//! time to the kernel's clock, which no user can set back: a file whose
//! token is the one taken is the file read, unchanged. A token is taken
//! only of a file last changed [`SETTLED`] before it is read (git's "racily
//! clean" rule): a change in the same tick of a coarse clock (a second on
//! some file systems) as the read would keep the change time, and a file
//! made in the inode of one removed could have its size and times.

use std::hash::{Hash, Hasher};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::{AtFlags, FileType, Stat};

use super::Pki;
use crate::core::observe::FileToken;
use crate::core::{Folder, Slot};

/// How long before a read a file must have last changed for a token.
const SETTLED: Duration = Duration::from_secs(2);

impl Pki {
    /// [`Pki::read_slot`], and the token of the key file read (none for
    /// anything but a key, or a file changed within [`SETTLED`]).
    pub fn read_slot_token(&self, folder: Folder, name: &str) -> (Slot, Option<FileToken>) {
        let (slot, file) = self.open_slot(folder, name);
        // Taken after the read: a file changed meanwhile changed within
        // `SETTLED` of now, and has no token.
        let token = file
            .and_then(|file| rustix::fs::fstat(&file).ok())
            .and_then(|st| token_of(folder, &st, Some(SystemTime::now())));
        (slot, token)
    }

    /// Whether `name`'s file in the token's folder is the file the token
    /// was taken of, unchanged: one `fstatat`, never through a symlink.
    pub fn unchanged(&self, token: FileToken, name: &str) -> bool {
        let Ok(dir) = self.folder_fd(token.folder()) else { return false };
        let Ok(st) = rustix::fs::statat(&*dir, name, AtFlags::SYMLINK_NOFOLLOW) else { return false };
        token_of(token.folder(), &st, None) == Some(token)
    }
}

/// The token of a regular file with one name in `folder`, as `st` says it
/// is; `read_at`: when it was read, for the [`SETTLED`] rule.
fn token_of(folder: Folder, st: &Stat, read_at: Option<SystemTime>) -> Option<FileToken> {
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || st.st_nlink != 1 {
        return None;
    }
    if let Some(read_at) = read_at {
        let changed = u64::try_from(st.st_ctime).ok()?;
        let read = read_at.duration_since(UNIX_EPOCH).ok()?;
        if Duration::from_secs(changed) + Duration::from_nanos(st.st_ctime_nsec) + SETTLED > read {
            return None;
        }
    }
    // SipHash with fixed keys: tokens live only as long as the process.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (st.st_dev, st.st_ino, st.st_size, st.st_uid, st.st_gid, st.st_mode, st.st_nlink).hash(&mut hasher);
    (st.st_ctime, st.st_ctime_nsec, st.st_mtime, st.st_mtime_nsec).hash(&mut hasher);
    Some(FileToken::new(folder, hasher.finish()))
}

#[cfg(test)]
mod tests;
