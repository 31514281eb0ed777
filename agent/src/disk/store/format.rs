//! The state store's files as the agent's user finds them: the format
//! (`keysync_store::format`, re-exported here: what the store and its
//! `state.format` beside it record), the store file narrowed to 0600 or
//! refused when another user's before the store is opened, and what
//! `salt-keysync check` says of both.

use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

pub use keysync_store::format::*;

/// At open: a store file of this agent's user wider than 0600 (a `recover`
/// run from a root shell with umask 022 left 0644) is narrowed, through its
/// own descriptor, never following a link. Returns its mode before, if it
/// was narrowed. A store of another user is refused: the agent could not
/// write it (only said when the agent is not root, who can).
pub fn own_and_narrow(path: &Path) -> Result<Option<u32>, Foreign> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(_) => return Ok(None),
    };
    let euid = rustix::process::geteuid().as_raw();
    if !meta.file_type().is_file() {
        return Ok(None);
    }
    if meta.uid() != euid {
        return if euid == 0 { Ok(None) } else { Err(foreign(path, meta.uid(), euid)) };
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(None);
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|_| foreign(path, meta.uid(), euid))?;
    let st = file.metadata().map_err(|_| foreign(path, meta.uid(), euid))?;
    if st.uid() != euid || !st.file_type().is_file() {
        return Ok(None);
    }
    match file.set_permissions(std::fs::Permissions::from_mode(st.mode() & 0o700)) {
        Ok(()) => Ok(Some(st.mode() & 0o7777)),
        Err(_) => Ok(None),
    }
}

/// A store file of `uid`, which is not this agent's user `euid`.
fn foreign(path: &Path, uid: u32, euid: u32) -> Foreign {
    let names = (crate::disk::pki::user_name(uid), crate::disk::pki::user_name(euid));
    Foreign { path: path.into(), uid, euid, names }
}

/// What `salt-keysync check` says of the store's files, run as the agent's
/// user: a format this release does not read (FAIL: `run` refuses), a store
/// of another user (FAIL: `run` cannot write it), a store or `state.format`
/// wider than 0600 (WARN: `run` narrows the store; the text is rewritten).
pub fn check_files(state_dir: &Path) -> (Vec<String>, Vec<String>) {
    let (mut problems, mut warnings) = (Vec::new(), Vec::new());
    let store = state_dir.join(super::FILE_NAME);
    match peek(state_dir) {
        Ok(Some(found)) if !found.is_readable() => problems.push(too_new_message(&store, &found)),
        Ok(_) => {}
        // Said where the store is looked at for the state marker.
        Err(_) => {}
    }
    let euid = rustix::process::geteuid().as_raw();
    for (path, what) in [(store, "the state store"), (state_dir.join(TEXT_NAME), "the state format's copy")] {
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        let mode = meta.mode() & 0o7777;
        if !meta.file_type().is_file() {
            problems.push(format!("{}: {what} is not a regular file", path.display()));
        } else if meta.uid() != euid && euid != 0 {
            let foreign = foreign(&path, meta.uid(), euid);
            if what == "the state store" {
                problems.push(foreign.message());
            } else {
                warnings.push(format!("{} (the agent replaces it at start)", foreign.message()));
            }
        } else if mode & 0o077 != 0 {
            let fix = if what == "the state store" {
                "the agent narrows it to 0600 at start"
            } else {
                "rewritten 0600 at start"
            };
            warnings.push(format!(
                "{}: {what} has mode {mode:04o}, wider than 0600 ({fix}; or chmod 600 it)",
                path.display()
            ));
        }
    }
    (problems, warnings)
}

#[cfg(test)]
mod tests {
    use super::super::Store;

    /// Issue 29 item 5: `recover` run from a root shell (umask 022) left
    /// state.redb 0644; the agent narrows its own store to 0600 when it opens it.
    #[test]
    fn a_store_wider_than_0600_is_narrowed_when_opened() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        Store::open(dir.path(), "a").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        Store::open(dir.path(), "a").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777, 0o600);
    }
}
