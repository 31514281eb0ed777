//! `<cachedir>/.dfn`: asks the salt-master to rotate its AES key, so a
//! minion whose key was rejected or deleted is cut off at once, as
//! `salt-key` itself does. The cachedir belongs to the salt user: it is
//! opened without following any symlink and everything in it is done
//! relative to its descriptor.

use std::io;
use std::path::Path;

use rustix::fs::AtFlags;

use super::dirs::{self, Trust};
use super::{staged_name, write_new, Owner};

/// Mode Salt gives `.dfn`; exactly this, or the master ignores it.
const DFN_MODE: u32 = 0o400;

/// Checks Salt's cachedir where `.dfn` goes, at start-up and in `check`:
/// a symlink anywhere on its path, a folder another user owns or others may
/// write is refused (the agent would be dropping files through it), so is
/// a path that cannot be looked at; a cachedir not made yet (salt-master
/// not started) is `Ok(false)`.
pub fn check_cachedir(cachedir: &Path, trust: &Trust) -> Result<bool, String> {
    // Not `exists()`: a dangling symlink must be refused, not taken for
    // absent; and only "not found" is absent (not a path it cannot look at).
    match std::fs::symlink_metadata(cachedir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("salt.cachedir {}: {e}", cachedir.display())),
        Ok(_) => {}
    }
    dirs::open_path(cachedir, trust).map(|_| true).map_err(|e| format!("salt.cachedir {e}"))
}

/// Drops `<cachedir>/.dfn` so the master rotates its AES key at its next
/// maintenance run, as `salt-key` does on a reject or delete; an existing one
/// is left alone (a rotation is already due). Returns whether one was written.
///
/// Salt 3008 refuses (and never clears) a `.dfn` whose content is not its id,
/// so the master must never see a half-written one: it is staged complete and
/// hard-linked into place, which also fails if `.dfn` appeared meanwhile.
pub fn drop_dfn(cachedir: &Path, master_id: &str, owner: Owner, trust: &Trust) -> io::Result<bool> {
    let dir = dirs::open_path(cachedir, trust).map_err(|e| io::Error::other(e.to_string()))?;
    if rustix::fs::statat(&dir, ".dfn", AtFlags::SYMLINK_NOFOLLOW).is_ok() {
        return Ok(false);
    }
    let staging = staged_name("dfn");
    let result =
        write_new(&dir, &staging, master_id.as_bytes(), DFN_MODE, owner).and_then(|()| {
            match rustix::fs::linkat(&dir, staging.as_str(), &dir, ".dfn", AtFlags::empty()) {
                Ok(()) => Ok(true),
                Err(rustix::io::Errno::EXIST) => Ok(false),
                Err(e) => Err(e.into()),
            }
        });
    let _ = rustix::fs::unlinkat(&dir, staging.as_str(), AtFlags::empty());
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a cachedir that is not there yet is "not made yet"; a path that
    /// cannot be looked at is refused with its cause, not taken for absent.
    #[test]
    fn a_cachedir_is_absent_only_when_it_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let trust = Trust::of(rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw());
        assert_eq!(check_cachedir(&dir.path().join("missing"), &trust), Ok(false));
        assert_eq!(check_cachedir(dir.path(), &trust), Ok(true));
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let err = check_cachedir(&file.join("master"), &trust).unwrap_err();
        assert!(err.starts_with("salt.cachedir ") && err.contains("Not a directory"), "{err}");
    }
}
