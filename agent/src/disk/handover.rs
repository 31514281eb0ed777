//! Hands the agent's own files that another user left in its folders to the
//! agent's user, for the package's install scripts (`salt-keysync
//! hand-over`, run as root by `/usr/lib/salt-keysync/owners`).
//!
//! An agent or `recover` run as root (0.1.0 ran as root, and its `recover`
//! from a root shell) leaves root's files in folders the agent's user owns:
//! the state marker and the lock in pki_dir's staging folder, the store in
//! state_dir. The agent, running as `salt`, then cannot read or write them
//! and refuses to start (exit 78: "cannot lock …", "cannot read …").
//!
//! Those folders are the agent's user's, who can put anything at any name in
//! them at any moment, so nothing here follows a path: each folder is opened
//! component by component without following a symlink (`pki/dirs.rs`), each
//! file relative to it with `O_NOFOLLOW|O_NONBLOCK`, checked on its
//! descriptor and handed over with `fchown` on that same descriptor. Only
//! root's regular files with one name are handed over (never a hard link to
//! a file elsewhere), only at the names the agent uses, and only when their
//! content is what the agent writes there: that user could move a file of
//! root's it cannot read to such a name (a backup of root's in pki_dir, say),
//! and must not be handed it. A folder of the writers' in the staging folder
//! is root's alone (mode 0700): what is in it was put there by root.
//!
//! A staging folder that is root's itself is left alone: the agent moves it
//! aside at its start and makes its own (SECURITY.md, guarantee 2).

use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{FileType, Mode, OFlags};

use crate::disk::pki::{dirs, Owner, Trust, MARKER, STAGING_DIR};

/// The lock the agent and `recover` hold in the staging folder (`pki/staging.rs`).
const LOCK: &str = ".salt-keysync-lock";
/// Writer `n`'s folder in the staging folder (`pki/staging.rs`).
const WRITER_PREFIX: &str = "writer-";
/// redb's file header.
const REDB_MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];
/// The largest marker or lock the agent writes, with room to spare.
const SMALL: u64 = 4096;

/// What to add to "Permission denied" on one of the agent's own files: root
/// may have left it there (the agent or `recover` run as root), and the
/// packages' owners script hands such files back.
pub fn hint(cause: &io::Error) -> &'static str {
    if cause.kind() == io::ErrorKind::PermissionDenied {
        " (another user's file: an agent or `recover` run as root leaves its files root's; as root, \
         /usr/lib/salt-keysync/owners hands them to the agent's user)"
    } else {
        ""
    }
}

/// What was done, and what was left and why, one line each.
#[derive(Debug, Default)]
pub struct Report {
    pub handed: Vec<String>,
    pub left: Vec<String>,
}

/// Hands root's files of the agent in `state_dir` and in `pki_dir`'s
/// staging folder to `to`. Run as root; `to` is not root.
pub fn hand_over(state_dir: &Path, pki_dir: &Path, to: Owner) -> Report {
    let mut report = Report::default();
    // Folders may be root's or the agent's user's, and nobody else's.
    let trust = Trust { agent_uid: to.uid, salt_uid: to.uid, salt_gid: to.gid };
    match own_folder(state_dir, &trust, to) {
        Ok(Some(dir)) => state_files(&dir, state_dir, to, &mut report),
        Ok(None) => {}
        Err(e) => report.left.push(e),
    }
    let staging = pki_dir.join(STAGING_DIR);
    let pki = match dirs::open_path(pki_dir, &trust) {
        Ok(fd) => fd,
        Err(e) if e.is_not_found() => return report,
        Err(e) => {
            report.left.push(format!("pki_dir {e}: nothing handed over in it"));
            return report;
        }
    };
    match dirs::open_dir_at(&pki, STAGING_DIR.as_bytes(), &staging) {
        Ok(fd) => match rustix::fs::fstat(&fd) {
            Ok(st) if st.st_uid == to.uid && st.st_mode & 0o7777 == 0o700 => {
                staging_files(&fd, &staging, to, &mut report)
            }
            // Root's: the agent moves it aside at its start (SECURITY.md, guarantee 2).
            Ok(_) => {}
            Err(e) => report.left.push(format!("{}: {e}", staging.display())),
        },
        Err(e) if e.is_not_found() => {}
        Err(e) => report.left.push(format!("{e}: nothing handed over in it")),
    }
    report
}

/// `path` opened as a folder of `to`'s (`None`: missing, or root's, which
/// systemd's StateDirectory= hands over at the next start).
fn own_folder(path: &Path, trust: &Trust, to: Owner) -> Result<Option<OwnedFd>, String> {
    let fd = match dirs::open_path(path, trust) {
        Ok(fd) => fd,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(format!("{e}: nothing handed over in it")),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((st.st_uid == to.uid).then_some(fd))
}

/// In state_dir: the store, stores set aside by `recover`, the format's copy.
fn state_files(dir: &OwnedFd, path: &Path, to: Owner, report: &mut Report) {
    let Ok(names) = names(dir) else { return };
    for name in names {
        let redb = name == "state.redb" || name.starts_with("state.redb.lost-");
        let expect: fn(&[u8]) -> bool = if redb {
            |head| head.starts_with(&REDB_MAGIC)
        } else if name == crate::disk::store::format::TEXT_NAME {
            |text| std::str::from_utf8(text).ok().and_then(crate::disk::store::format::Format::parse).is_some()
        } else {
            continue;
        };
        // A store is large: its header says what it is.
        let limit = if redb { None } else { Some(SMALL) };
        hand_file(dir, &name, &path.join(&name), to, limit, expect, report);
    }
}

/// In the staging folder: the marker, the lock, and writers' folders.
fn staging_files(dir: &OwnedFd, path: &Path, to: Owner, report: &mut Report) {
    let Ok(names) = names(dir) else { return };
    for name in names {
        let at = path.join(&name);
        if name == MARKER {
            hand_file(dir, &name, &at, to, Some(SMALL), is_marker, report);
        } else if name == LOCK {
            let digits = |text: &[u8]| text.iter().all(|b| b.is_ascii_digit() || b.is_ascii_whitespace());
            hand_file(dir, &name, &at, to, Some(SMALL), digits, report);
        } else if name
            .strip_prefix(WRITER_PREFIX)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        {
            writer_folder(dir, &name, &at, to, report);
        }
    }
}

/// The marker's text as `state_guard.rs` writes it: comments, `store ID`, `node NAME`.
fn is_marker(text: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(text) else { return false };
    let mut fields = (false, false);
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        if line.starts_with('#') {
            continue;
        } else if let Some(id) = line.strip_prefix("store ") {
            fields.0 = id.trim().bytes().all(|b| b.is_ascii_hexdigit());
        } else if line.starts_with("node ") {
            fields.1 = true;
        } else {
            return false;
        }
    }
    fields == (true, true)
}

/// Hands `name` in `dir` to `to` if it is root's, a regular file with one
/// name, at most `limit` bytes (if given), and `expect`ed (its first
/// `SMALL` bytes); narrows it to 0600 on the way.
fn hand_file(
    dir: &OwnedFd,
    name: &str,
    path: &Path,
    to: Owner,
    limit: Option<u64>,
    expect: fn(&[u8]) -> bool,
    report: &mut Report,
) {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
    let fd = match rustix::fs::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::LOOP) => {
            return report.left.push(format!("{}: a symbolic link (never followed)", path.display()))
        }
        Err(e) => return report.left.push(format!("{}: {e}", path.display())),
    };
    let Ok(st) = rustix::fs::fstat(&fd) else { return };
    if st.st_uid != 0 {
        return; // The agent's already, or another user's: not root's to give.
    }
    let refuse = |why: &str| format!("{}: root's, not handed over to uid {}: {why}", path.display(), to.uid);
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return report.left.push(refuse("not a regular file"));
    }
    if st.st_nlink != 1 {
        return report.left.push(refuse("it has other names (a hard link)"));
    }
    if limit.is_some_and(|limit| st.st_size as u64 > limit) {
        return report.left.push(refuse("larger than anything the agent writes there"));
    }
    let mut head = Vec::new();
    if std::fs::File::from(fd.try_clone().expect("dup a descriptor")).take(SMALL).read_to_end(&mut head).is_err()
        || !expect(&head)
    {
        return report.left.push(refuse("not what the agent writes there"));
    }
    match fchown_private(&fd, to, st.st_mode) {
        Ok(()) => report.handed.push(path.display().to_string()),
        Err(e) => report.left.push(format!("{}: {e}", path.display())),
    }
}

/// A writer's folder of root's (mode 0700: only root put anything in it):
/// its staged files, then itself.
fn writer_folder(dir: &OwnedFd, name: &str, path: &Path, to: Owner, report: &mut Report) {
    let Ok(fd) = dirs::open_dir_at(dir, name.as_bytes(), path) else { return };
    let Ok(st) = rustix::fs::fstat(&fd) else { return };
    if st.st_uid != 0 {
        return;
    }
    if st.st_mode & 0o7777 != 0o700 {
        return report.left.push(format!(
            "{}: root's with mode {:04o}, not 0700: not handed over",
            path.display(),
            st.st_mode & 0o7777
        ));
    }
    let Ok(names) = names(&fd) else { return };
    for inner in names {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
        let Ok(file) = rustix::fs::openat(&fd, inner.as_str(), flags, Mode::empty()) else { continue };
        let Ok(fst) = rustix::fs::fstat(&file) else { continue };
        if fst.st_uid == 0 && fst.st_nlink == 1 && FileType::from_raw_mode(fst.st_mode) == FileType::RegularFile {
            if let Err(e) = fchown_private(&file, to, fst.st_mode) {
                report.left.push(format!("{}: {e}", path.join(&inner).display()));
            }
        }
    }
    match rustix::fs::fchown(&fd, Some(uid(to.uid)), Some(gid(to.gid))) {
        Ok(()) => report.handed.push(path.display().to_string()),
        Err(e) => report.left.push(format!("{}: {e}", path.display())),
    }
}

/// `fchown` to `to`, and no access for group or others.
fn fchown_private(fd: &impl AsFd, to: Owner, mode: u32) -> io::Result<()> {
    rustix::fs::fchown(fd, Some(uid(to.uid)), Some(gid(to.gid)))?;
    if mode & 0o077 != 0 {
        rustix::fs::fchmod(fd, Mode::from_raw_mode(mode & 0o700))?;
    }
    Ok(())
}

fn uid(raw: u32) -> rustix::fs::Uid {
    rustix::fs::Uid::from_raw(raw)
}

fn gid(raw: u32) -> rustix::fs::Gid {
    rustix::fs::Gid::from_raw(raw)
}

/// The names in an open folder (UTF-8 only: the agent's names are).
fn names(dir: &OwnedFd) -> io::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut entries = rustix::fs::Dir::read_from(dir)?;
    while let Some(entry) = entries.read() {
        let entry = entry?;
        if let Ok(name) = entry.file_name().to_str() {
            if name != "." && name != ".." {
                out.push(name.to_string());
            }
        }
    }
    Ok(out)
}

/// `salt-keysync hand-over --user NAME`: in the folders the config at
/// `config_path` names, or the packaged defaults where it does not load (a
/// first install's example). Prints what it handed over on stdout, what it
/// left on stderr (and returns Ok: what is left is the operator's to look at).
pub fn run(config_path: &Path, user: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    let to = Owner::from_user(user).with_context(|| format!("the agent's user {user:?}"))?;
    if to.uid == 0 {
        return Ok(());
    }
    let (state_dir, pki_dir) = match crate::config::Config::load(config_path) {
        Ok(config) => (config.state_dir, config.pki_dir),
        Err(_) => (crate::config::DEFAULT_STATE_DIR.into(), std::path::PathBuf::from("/etc/salt/pki/master")),
    };
    let report = hand_over(&state_dir, &pki_dir, to);
    for path in &report.handed {
        crate::say!("salt-keysync: {path} handed over to {user} (left by an agent or recover run as root)");
    }
    for left in &report.left {
        eprintln!("salt-keysync: {left}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

    const USER: Owner = Owner { uid: 4242, gid: 4242 };

    fn mkdir(path: &Path, mode: u32, owner: Owner) {
        std::fs::create_dir(path).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        std::os::unix::fs::chown(path, Some(owner.uid), Some(owner.gid)).unwrap();
    }

    /// A file of root's (the tests run as root, as the packages' scripts do).
    fn roots(path: &Path, text: &[u8], mode: u32) {
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn owner_mode(path: &Path) -> (u32, u32) {
        let meta = std::fs::symlink_metadata(path).unwrap();
        (meta.uid(), meta.mode() & 0o7777)
    }

    /// What an agent and `recover` run as root leave in the folders of the
    /// agent's user is handed over on its descriptor, narrowed to 0600;
    /// what that user put at those names is not: a symlink (not followed),
    /// a second name of root's file elsewhere, a file of root's that is not
    /// what the agent writes there (the salt user renamed it there).
    #[test]
    fn roots_files_of_the_agent_are_handed_over_and_nothing_else() {
        assert!(rustix::process::geteuid().is_root(), "these tests give files away: run them as root, as CI does");
        let top = tempfile::tempdir().unwrap();
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (state, pki) = (top.path().join("state"), top.path().join("pki"));
        let root = Owner { uid: 0, gid: 0 };
        mkdir(&state, 0o700, USER);
        mkdir(&pki, 0o700, USER);
        let staging = pki.join(STAGING_DIR);
        mkdir(&staging, 0o700, USER);
        let mut redb = REDB_MAGIC.to_vec();
        redb.extend_from_slice(&[0; 64]);
        roots(&state.join("state.redb"), &redb, 0o644);
        roots(&state.join("state.format"), crate::disk::store::format::Format::this_release().text().as_bytes(), 0o600);
        roots(&state.join("state.redb.lost-1"), &redb, 0o644);
        // Root's files elsewhere, which the salt user links or names in its folders.
        let outside = top.path().join("outside");
        roots(&outside, &redb, 0o600);
        symlink(&outside, state.join("state.redb.lost-2")).unwrap();
        std::fs::hard_link(&outside, state.join("state.redb.lost-3")).unwrap();
        roots(&state.join("notes"), b"not the agent's", 0o600);
        roots(&staging.join(MARKER), b"# salt-keysync: ...\nstore 0123abcd\nnode master-a\n", 0o600);
        roots(&staging.join(LOCK), b"4711", 0o600);
        let writer = staging.join("writer-1");
        mkdir(&writer, 0o700, root);
        roots(&writer.join(".keysync-1-0"), b"-----BEGIN PUBLIC KEY-----\n", 0o600);

        let report = hand_over(&state, &pki, USER);
        for handed in ["state/state.redb", "state/state.format", "state/state.redb.lost-1"] {
            assert_eq!(owner_mode(&top.path().join(handed)), (4242, 0o600), "{handed}: {report:?}");
        }
        for handed in [MARKER, LOCK] {
            assert_eq!(owner_mode(&staging.join(handed)), (4242, 0o600), "{handed}: {report:?}");
        }
        assert_eq!(owner_mode(&writer), (4242, 0o700));
        assert_eq!(owner_mode(&writer.join(".keysync-1-0")).0, 4242);
        assert_eq!(owner_mode(&outside), (0, 0o600), "root's file elsewhere was given away: {report:?}");
        assert_eq!(owner_mode(&state.join("notes")).0, 0, "a name the agent does not use");
        assert!(report.left.iter().any(|l| l.contains("lost-2") && l.contains("symbolic link")), "{report:?}");
        assert!(report.left.iter().any(|l| l.contains("lost-3") && l.contains("hard link")), "{report:?}");

        // The salt user renames a file of root's it cannot read to the marker's name.
        std::fs::remove_file(staging.join(MARKER)).unwrap();
        roots(&staging.join(MARKER), b"-----BEGIN RSA PRIVATE KEY-----\nroot's\n", 0o600);
        let report = hand_over(&state, &pki, USER);
        assert_eq!(owner_mode(&staging.join(MARKER)), (0, 0o600), "{report:?}");
        assert!(
            report.left.iter().any(|l| l.contains(MARKER) && l.contains("not what the agent writes")),
            "{report:?}"
        );
    }

    /// A staging folder of root's (an agent that ran as root all along) is
    /// not handed over: the agent moves it aside itself. A state folder of
    /// root's is left to systemd (StateDirectory= hands it over at start).
    #[test]
    fn folders_of_roots_are_left_alone() {
        let top = tempfile::tempdir().unwrap();
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (state, pki) = (top.path().join("state"), top.path().join("pki"));
        let root = Owner { uid: 0, gid: 0 };
        mkdir(&state, 0o700, root);
        mkdir(&pki, 0o700, USER);
        let staging = pki.join(STAGING_DIR);
        mkdir(&staging, 0o700, root);
        roots(&staging.join(MARKER), b"store 01\nnode a\n", 0o600);
        roots(&state.join("state.redb"), &REDB_MAGIC, 0o600);
        let report = hand_over(&state, &pki, USER);
        assert!(report.handed.is_empty(), "{report:?}");
        assert_eq!(owner_mode(&staging.join(MARKER)).0, 0);
        assert_eq!(owner_mode(&state.join("state.redb")).0, 0);
    }
}
