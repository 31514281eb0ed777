//! Folders owned by someone else, opened once and never trusted (systemd's
//! `chase()`, OpenSSH's `safe_path()`): every component of a path is opened
//! relative to the one before with `O_DIRECTORY|O_NOFOLLOW`, so no symlink is
//! ever followed, and each is checked on its descriptor for an owner this
//! agent trusts and a mode nobody else can write through. Everything after
//! is done with `*at()` calls relative to those descriptors.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use rustix::fs::{AtFlags, Mode, OFlags};

/// Who may own the folders the agent works in: root, the agent's own user,
/// and the user salt-master runs as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trust {
    pub agent_uid: u32,
    pub salt_uid: u32,
    pub salt_gid: u32,
}

impl Trust {
    /// The agent's own user, trusting `salt` (uid, gid) as the master's.
    pub fn of(salt_uid: u32, salt_gid: u32) -> Trust {
        Trust { agent_uid: rustix::process::geteuid().as_raw(), salt_uid, salt_gid }
    }

    fn trusts(&self, uid: u32) -> bool {
        uid == 0 || uid == self.agent_uid || uid == self.salt_uid
    }
}

/// Why a folder was refused.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    #[error("{path}: is a symbolic link (never followed)")]
    Symlink { path: String },
    #[error("{path}: not a folder")]
    NotDir { path: String },
    #[error("{path}: owned by uid {uid}, not root, this agent's user or the salt user")]
    Owner { path: String, uid: u32 },
    #[error("{path}: mode {mode:04o} lets other users write in it")]
    Mode { path: String, mode: u32 },
    /// The cause is in the message, not a `source()`: `{:#}` would print it twice.
    #[error("{path}: {cause}")]
    Io { path: String, cause: io::Error },
}

impl DirError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, DirError::Io { cause, .. } if cause.kind() == io::ErrorKind::NotFound)
    }
}

fn io_error(path: &Path, errno: rustix::io::Errno) -> DirError {
    DirError::Io { path: path.display().to_string(), cause: errno.into() }
}

const DIR_FLAGS: OFlags = OFlags::DIRECTORY.union(OFlags::NOFOLLOW).union(OFlags::CLOEXEC).union(OFlags::RDONLY);

/// Opens the absolute `path` component by component from `/`, never
/// following a symlink, each ancestor owned by a trusted user and not
/// writable by others (unless sticky, as `/tmp`), the folder itself as
/// [`check_dir`] says. Returns its descriptor.
pub fn open_path(path: &Path, trust: &Trust) -> Result<OwnedFd, DirError> {
    if !path.is_absolute() {
        return Err(DirError::Io {
            path: path.display().to_string(),
            cause: io::Error::new(io::ErrorKind::InvalidInput, "not an absolute path"),
        });
    }
    let mut fd = rustix::fs::open("/", DIR_FLAGS, Mode::empty()).map_err(|e| io_error(path, e))?;
    let mut walked = std::path::PathBuf::from("/");
    let components: Vec<&OsStr> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name),
            _ => None,
        })
        .collect();
    if path.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(DirError::Io {
            path: path.display().to_string(),
            cause: io::Error::new(io::ErrorKind::InvalidInput, "`..` in the path"),
        });
    }
    for (i, name) in components.iter().enumerate() {
        walked.push(name);
        let next = open_dir_at(&fd, name.as_bytes(), &walked)?;
        if i + 1 < components.len() {
            check_ancestor(&next, &walked, trust)?;
        } else {
            check_dir(&next, &walked, trust)?;
        }
        fd = next;
    }
    Ok(fd)
}

/// Opens `name` inside `dir` as a folder, never through a symlink.
pub fn open_dir_at(dir: &impl AsFd, name: &[u8], path: &Path) -> Result<OwnedFd, DirError> {
    match rustix::fs::openat(dir, name, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => Ok(fd),
        Err(rustix::io::Errno::LOOP) => Err(DirError::Symlink { path: path.display().to_string() }),
        Err(rustix::io::Errno::NOTDIR) => {
            // A symlink to a file also ends here with O_NOFOLLOW|O_DIRECTORY.
            let is_link = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink);
            if is_link {
                Err(DirError::Symlink { path: path.display().to_string() })
            } else {
                Err(DirError::NotDir { path: path.display().to_string() })
            }
        }
        Err(e) => Err(io_error(path, e)),
    }
}

/// A folder the agent reads and writes in: owned by root, the agent's user
/// or the salt user; writable by no one else (a group may write only if it
/// is the salt user's or root's).
pub fn check_dir(fd: &impl AsFd, path: &Path, trust: &Trust) -> Result<(u64, u64), DirError> {
    let st = rustix::fs::fstat(fd).map_err(|e| io_error(path, e))?;
    let path_text = || path.display().to_string();
    if !trust.trusts(st.st_uid) {
        return Err(DirError::Owner { path: path_text(), uid: st.st_uid });
    }
    let mode = st.st_mode & 0o7777;
    let group_ok = st.st_gid == 0 || st.st_gid == trust.salt_gid;
    if mode & 0o002 != 0 || (mode & 0o020 != 0 && !group_ok) {
        return Err(DirError::Mode { path: path_text(), mode });
    }
    Ok((st.st_dev, st.st_ino))
}

/// An ancestor of such a folder: owned by a trusted user, and not writable by
/// others unless sticky (nobody can replace an entry they do not own).
fn check_ancestor(fd: &impl AsFd, path: &Path, trust: &Trust) -> Result<(), DirError> {
    let st = rustix::fs::fstat(fd).map_err(|e| io_error(path, e))?;
    if !trust.trusts(st.st_uid) {
        return Err(DirError::Owner { path: path.display().to_string(), uid: st.st_uid });
    }
    let mode = st.st_mode & 0o7777;
    let sticky = mode & 0o1000 != 0;
    let group_ok = st.st_gid == 0 || st.st_gid == trust.salt_gid;
    if !sticky && (mode & 0o002 != 0 || (mode & 0o020 != 0 && !group_ok)) {
        return Err(DirError::Mode { path: path.display().to_string(), mode });
    }
    Ok(())
}

/// The (device, inode) `name` inside `dir` names now, without following it;
/// `None` when it is missing or not a plain folder.
pub fn identity_at(dir: &impl AsFd, name: &str) -> Option<(u64, u64)> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
    (rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory)
        .then_some((st.st_dev, st.st_ino))
}

/// The mount an open folder is on (statx's mount id), `None` where the
/// kernel does not say (before Linux 5.8).
pub fn mount_of(fd: &impl AsFd) -> Option<u64> {
    let stx = rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, rustix::fs::StatxFlags::MNT_ID).ok()?;
    (stx.stx_mask & rustix::fs::StatxFlags::MNT_ID.bits() != 0).then_some(stx.stx_mnt_id)
}

/// The (device, inode) of an open folder.
pub fn identity(fd: &impl AsFd) -> io::Result<(u64, u64)> {
    let st = rustix::fs::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn trust() -> Trust {
        Trust::of(0, 0)
    }

    #[test]
    fn a_symlink_anywhere_on_the_path_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir_all(real.join("pki")).unwrap();
        symlink(&real, dir.path().join("link")).unwrap();
        assert!(open_path(&real.join("pki"), &trust()).is_ok());
        let err = open_path(&dir.path().join("link/pki"), &trust()).unwrap_err();
        assert!(matches!(err, DirError::Symlink { .. }), "{err}");
        symlink(real.join("pki"), dir.path().join("pki-link")).unwrap();
        let err = open_path(&dir.path().join("pki-link"), &trust()).unwrap_err();
        assert!(matches!(err, DirError::Symlink { .. }), "{err}");
        std::fs::write(dir.path().join("file"), "").unwrap();
        assert!(matches!(open_path(&dir.path().join("file"), &trust()).unwrap_err(), DirError::NotDir { .. }));
        assert!(open_path(&dir.path().join("missing"), &trust()).unwrap_err().is_not_found());
    }

    #[test]
    fn owners_and_modes_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("pki");
        std::fs::create_dir(&pki).unwrap();
        std::fs::set_permissions(&pki, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(open_path(&pki, &trust()).unwrap_err(), DirError::Mode { mode: 0o777, .. }));
        std::fs::set_permissions(&pki, std::fs::Permissions::from_mode(0o755)).unwrap();
        rustix::fs::chown(&pki, Some(rustix::fs::Uid::from_raw(4242)), None).unwrap();
        assert!(matches!(open_path(&pki, &trust()).unwrap_err(), DirError::Owner { uid: 4242, .. }));
        assert!(open_path(&pki, &Trust::of(4242, 4242)).is_ok(), "the salt user's folder");
    }
}
