//! Key files' tokens ([`FileToken`]): a key file's identity (`identity.rs`:
//! its device, inode, size, owner, mode and change and modification times)
//! hashed with its folder, so that a scan reads again only the files that
//! are not the ones it read last.
//!
//! Every change to a file's bytes, owner, mode or links sets its change
//! time to the kernel's clock, which no user can set back: a file whose
//! token is the one taken is the file read, unchanged. A token is taken
//! only of a file last changed [`SETTLED`] before it is read (git's "racily
//! clean" rule): a change in the same tick of a coarse clock (a second on
//! some file systems) as the read would keep the change time, and a file
//! made in the inode of one removed could have its size and times.
//!
//! Tokens are given only on the local file systems listed in
//! [`LOCAL_FILE_SYSTEMS`] (a network file system may answer `fstatat` from
//! a cache, with the server's clock), and all are void once the wall clock
//! is seen to step back (a change after the step could get the change time
//! a token holds): they carry an epoch the step ends.

use std::hash::{BuildHasher, RandomState};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::identity::Identity;
use super::Pki;
use crate::core::observe::FileToken;
use crate::core::{Folder, Slot};

/// How long before a read a file must have last changed for a token.
const SETTLED: Duration = Duration::from_secs(2);

/// The file systems whose key files get tokens (`statfs` magic numbers):
/// ext2/3/4, XFS, Btrfs, tmpfs, F2FS, ZFS, bcachefs, overlayfs.
const LOCAL_FILE_SYSTEMS: [u64; 8] =
    [0xEF53, 0x5846_5342, 0x9123_683E, 0x0102_1994, 0xF2F5_2010, 0x2FC1_2FC1, 0xCA45_1A4E, 0x794C_7630];

/// Whether a folder is on one of [`LOCAL_FILE_SYSTEMS`]: its files may
/// get tokens (asked of each key folder as it is opened, or opened again).
pub(super) fn is_local(dir: &OwnedFd) -> bool {
    rustix::fs::fstatfs(dir).is_ok_and(|fs| {
        // A 32-bit magic number, whatever the type holding it (signed on
        // some targets, where a cast to 64 bits would extend the sign).
        #[allow(clippy::unnecessary_cast)]
        let kind = u64::from(fs.f_type as u32);
        LOCAL_FILE_SYSTEMS.contains(&kind)
    })
}

/// The tokens' epoch and key.
#[derive(Debug, Default)]
pub(super) struct Tokens {
    /// Steps of the wall clock back seen so far.
    epoch: AtomicU64,
    /// The latest wall clock seen (ns since the epoch).
    latest: AtomicU64,
    /// Keyed per `Pki` (one a process): the `salt` user chooses much of
    /// what is hashed.
    key: RandomState,
}

impl Tokens {
    /// The epoch at `now`: a new one once the clock is a second or more
    /// behind the latest time seen (less cannot bring it back to a change
    /// time a token holds, taken [`SETTLED`] before its read).
    fn epoch_at(&self, now: SystemTime) -> u64 {
        let now = now.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let latest = self.latest.fetch_max(now, Ordering::SeqCst);
        if now.saturating_add(1_000_000_000) <= latest {
            // Seen once per step: from now on the latest is the new time.
            self.latest.store(now, Ordering::SeqCst);
            return self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        }
        self.epoch.load(Ordering::SeqCst)
    }

    /// The token of a file in `folder` as `identity` tells it, in `epoch`;
    /// `read_from`: when its read began, for the [`SETTLED`] rule (`None`
    /// to compare with a token taken before).
    fn token_of(
        &self,
        folder: Folder,
        identity: Identity,
        epoch: u64,
        read_from: Option<SystemTime>,
    ) -> Option<FileToken> {
        if let Some(read_from) = read_from {
            let read = read_from.duration_since(UNIX_EPOCH).ok()?;
            if identity.changed()? + SETTLED > read {
                return None;
            }
        }
        Some(FileToken::new(folder, self.key.hash_one((epoch, identity))))
    }
}

impl Pki {
    /// [`Pki::read_slot`], and the token of the key file read (none for
    /// anything but a key, a file changed within [`SETTLED`] of the read's
    /// start, or a folder not on a local file system).
    pub fn read_slot_token(&self, folder: Folder, name: &str) -> (Slot, Option<FileToken>) {
        // Before the read: a file changed while it is read changed after
        // this, within `SETTLED` of it, and gets no token.
        let read_from = SystemTime::now();
        let epoch = self.tokens.epoch_at(read_from);
        let (slot, opened) = self.open_slot_local(folder, name);
        let Some((file, true)) = opened else { return (slot, None) };
        let Some(identity) = Identity::of_file(&file) else { return (slot, None) };
        // A step of the clock back during the read: no token.
        let token = self
            .tokens
            .token_of(folder, identity, epoch, Some(read_from))
            .filter(|_| self.tokens.epoch_at(SystemTime::now()) == epoch);
        (slot, token)
    }

    /// Whether `name`'s file in the token's folder is the file the token
    /// was taken of, unchanged: one `fstatat`, never through a symlink.
    pub fn unchanged(&self, token: FileToken, name: &str) -> bool {
        let epoch = self.tokens.epoch_at(SystemTime::now());
        let Ok(dir) = self.folder_fd(token.folder()) else { return false };
        let Some(identity) = Identity::at(&dir, name) else { return false };
        self.tokens.token_of(token.folder(), identity, epoch, None) == Some(token)
    }
}

#[cfg(test)]
mod tests;
