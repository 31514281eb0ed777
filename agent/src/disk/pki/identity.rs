//! What tells one key file from any other put at its name, or from itself
//! changed: the write-ahead's staged files (`prestage.rs`) and the files a
//! scan read (`token.rs`) are both told by it. The `salt` user owns the
//! folders. A change time is set by the kernel on every write, chmod, chown
//! or link, and no user can set it back.

use std::os::fd::OwnedFd;

use rustix::fs::{AtFlags, FileType, Stat};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Identity {
    dev: u64,
    ino: u64,
    size: i64,
    uid: u32,
    gid: u32,
    mode: u32,
    ctime: (i64, u64),
    mtime: (i64, u64),
}

impl Identity {
    /// `None` unless a regular file with one name.
    pub(super) fn of(st: &Stat) -> Option<Identity> {
        (FileType::from_raw_mode(st.st_mode) == FileType::RegularFile && st.st_nlink == 1).then_some(Identity {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size,
            uid: st.st_uid,
            gid: st.st_gid,
            mode: st.st_mode & 0o7777,
            ctime: (st.st_ctime, st.st_ctime_nsec),
            mtime: (st.st_mtime, st.st_mtime_nsec),
        })
    }

    /// The file at `name` in `dir`, never through a symlink.
    pub(super) fn at(dir: &OwnedFd, name: &str) -> Option<Identity> {
        Identity::of(&rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok()?)
    }

    /// The file open as `file`, from its own descriptor.
    pub(super) fn of_file(file: &std::fs::File) -> Option<Identity> {
        Identity::of(&rustix::fs::fstat(file).ok()?)
    }

    /// When the file last changed (its change time), since the epoch.
    pub(super) fn changed(&self) -> Option<std::time::Duration> {
        let secs = u64::try_from(self.ctime.0).ok()?;
        Some(std::time::Duration::from_secs(secs) + std::time::Duration::from_nanos(self.ctime.1))
    }
}
