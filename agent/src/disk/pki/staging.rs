//! The agent's own folder in pki_dir, `.keysync-staging`: where key files
//! are staged before being renamed into place, per-writer subfolders for
//! large batches, and the state marker. The salt user owns pki_dir and can
//! put anything at that name, so the folder is used only if it is a real
//! folder owned by the agent's user with mode 0700; anything else found
//! there is moved aside (and told), and a new one made. Every file in it is
//! created with `O_EXCL|O_NOFOLLOW` relative to its descriptor.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};

use rustix::fs::{AtFlags, Mode, OFlags};

use super::{dirs, read_names, remove_if_present, staged_name, PkiError, STAGING_DIR};

/// The marker naming the state store that synced these folders (`state_guard.rs`).
pub const MARKER: &str = ".salt-keysync-state";
/// Locked (`flock`) by the agent or `recover` serving these folders, and
/// naming its process id: a second one on the same pki_dir is refused.
pub const LOCK: &str = ".salt-keysync-lock";
/// Writer `n > 0` stages in `writer-<n>/`.
const WRITER_DIR_PREFIX: &str = "writer-";
/// The marker is small; anything larger is not one.
const MAX_MARKER_BYTES: u64 = 4096;

pub(super) struct Staging {
    pub(super) fd: Arc<OwnedFd>,
    /// Writers' own folders, made at first use (index n - 1 for writer n).
    lanes: Mutex<Vec<Option<Arc<OwnedFd>>>>,
    /// What was found at the staging folder's name and moved aside, if anything.
    pub(super) refused: Option<String>,
}

impl Staging {
    /// Opens the staging folder of `root`, making it (mode 0700) when
    /// missing if `create`, and replacing whatever else is there.
    pub(super) fn open(root: &OwnedFd, root_path: &Path, create: bool) -> Result<Staging, PkiError> {
        let path = root_path.join(STAGING_DIR);
        let error = |source: io::Error| PkiError::Staging { path: path.display().to_string(), cause: source };
        let mut refused = None;
        let fd = match own_dir_at(root, STAGING_DIR) {
            Ok(fd) => fd,
            Err(Found::Missing) if create => make_own_dir_at(root, STAGING_DIR).map_err(error)?,
            Err(Found::Missing) => return Err(error(io::Error::new(io::ErrorKind::NotFound, "missing"))),
            Err(Found::NotOurs(what)) if create => {
                let nanos =
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
                let aside = format!("{STAGING_DIR}.refused-{}-{nanos}", std::process::id());
                rustix::fs::renameat(root, STAGING_DIR, root, aside.as_str()).map_err(|e| error(e.into()))?;
                refused = Some(format!("{what}; moved aside to {aside} and made anew"));
                make_own_dir_at(root, STAGING_DIR).map_err(error)?
            }
            Err(Found::NotOurs(what)) => return Err(error(io::Error::new(io::ErrorKind::PermissionDenied, what))),
            Err(Found::Io(e)) => return Err(error(e)),
        };
        Ok(Staging { fd: Arc::new(fd), lanes: Mutex::new(Vec::new()), refused })
    }

    /// Writer `lane`'s staging folder (writer 0 uses the staging folder itself).
    pub(super) fn lane(&self, _root: &OwnedFd, lane: usize) -> io::Result<Arc<OwnedFd>> {
        if lane == 0 {
            return Ok(self.fd.clone());
        }
        let mut lanes = self.lanes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if lanes.len() < lane {
            lanes.resize(lane, None);
        }
        if let Some(fd) = &lanes[lane - 1] {
            return Ok(fd.clone());
        }
        let name = format!("{WRITER_DIR_PREFIX}{lane}");
        // Inside a folder only the agent can write in: what is there is its own.
        let fd = match own_dir_at(&*self.fd, &name) {
            Ok(fd) => fd,
            Err(Found::Missing) => make_own_dir_at(&*self.fd, &name)?,
            Err(Found::NotOurs(what)) => return Err(io::Error::new(io::ErrorKind::PermissionDenied, what)),
            Err(Found::Io(e)) => return Err(e),
        };
        let fd = Arc::new(fd);
        lanes[lane - 1] = Some(fd.clone());
        Ok(fd)
    }

    /// Removes staged files a crash left behind (here and in the writers'
    /// folders); returns how many.
    pub(super) fn clean(&self, _root: &OwnedFd) -> io::Result<usize> {
        let mut removed = 0;
        let mut folders: Vec<Arc<OwnedFd>> = vec![self.fd.clone()];
        for name in read_names(&*self.fd)? {
            let name = name.to_string_lossy().into_owned();
            if name.starts_with(WRITER_DIR_PREFIX) {
                if let Ok(fd) = own_dir_at(&*self.fd, &name) {
                    folders.push(Arc::new(fd));
                }
            }
        }
        for folder in folders {
            for name in read_names(&*folder)? {
                let name = name.to_string_lossy().into_owned();
                if name.starts_with(".keysync-") && remove_if_present(&*folder, &name)? {
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }

    /// Takes the lock of the folders for this process (held until the
    /// descriptor is closed, at exit whatever the exit): `Ok(Err(pid))` when
    /// another process holds it (its pid as it wrote it, 0 if unreadable).
    pub(super) fn lock(&self) -> io::Result<Result<OwnedFd, u32>> {
        let flags = OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&*self.fd, LOCK, flags, Mode::from_raw_mode(0o600))?;
        if rustix::fs::FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode) != rustix::fs::FileType::RegularFile {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "the lock is not a regular file"));
        }
        match rustix::fs::flock(&fd, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let mut text = String::new();
                let _ = std::fs::File::from(fd).take(32).read_to_string(&mut text);
                return Ok(Err(text.trim().parse().unwrap_or(0)));
            }
            Err(e) => return Err(e.into()),
        }
        rustix::fs::ftruncate(&fd, 0)?;
        let mut file = std::fs::File::from(fd);
        write!(file, "{}", std::process::id())?;
        Ok(Ok(OwnedFd::from(file)))
    }

    pub(super) fn read_marker(&self) -> io::Result<Option<String>> {
        read_marker_at(&*self.fd)
    }

    pub(super) fn write_marker(&self, text: &str) -> io::Result<()> {
        let name = staged_name("marker");
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let written = (|| -> io::Result<()> {
            let fd = rustix::fs::openat(&*self.fd, name.as_str(), flags, Mode::from_raw_mode(0o600))?;
            let mut file = std::fs::File::from(fd);
            file.write_all(text.as_bytes())?;
            file.sync_all()?;
            rustix::fs::renameat(&*self.fd, name.as_str(), &*self.fd, MARKER)?;
            rustix::fs::fsync(&*self.fd)?;
            Ok(())
        })();
        if written.is_err() {
            let _ = rustix::fs::unlinkat(&*self.fd, name.as_str(), AtFlags::empty());
        }
        written
    }
}

/// Whether `root` has a staging folder of the agent's own: `Ok(None)` when
/// there is none yet, `Err` with what stands there instead.
pub(super) fn inspect(root: &OwnedFd) -> Result<Option<()>, String> {
    match own_dir_at(root, STAGING_DIR) {
        Ok(_) => Ok(Some(())),
        Err(Found::Missing) => Ok(None),
        Err(Found::NotOurs(what)) => Err(what),
        Err(Found::Io(e)) => Err(e.to_string()),
    }
}

/// `root`'s staging folder if it is the agent's own: `Ok(None)` when there
/// is none, or something else stands there, which `open` moves aside.
pub(super) fn peek(root: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    match own_dir_at(root, STAGING_DIR) {
        Ok(fd) => Ok(Some(fd)),
        Err(Found::Missing | Found::NotOurs(_)) => Ok(None),
        Err(Found::Io(e)) => Err(e),
    }
}

/// The pid of the process holding the lock of the staging folder `dir`
/// (see [`LOCK`]), found without taking it (a `check` racing a starting
/// agent must not make it refuse): the lock file's inode among the
/// `flock`s the kernel lists in /proc/locks. The pid is the one the file
/// names, else the one /proc/locks gives. `None`: not held, or no lock file.
pub(super) fn lock_holder(dir: &impl AsFd) -> io::Result<Option<u32>> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat(dir, LOCK, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let st = rustix::fs::fstat(&fd)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Ok(None);
    }
    let device = format!("{:02x}:{:02x}:{}", rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev), st.st_ino);
    let mut text = String::new();
    let _ = std::fs::File::from(fd).take(32).read_to_string(&mut text);
    let named: Option<u32> = text.trim().parse().ok();
    let locks = std::fs::read_to_string("/proc/locks")?;
    Ok(holder_in(&locks, &device, named))
}

/// The holder /proc/locks (`locks`) gives for the lock file at `device`
/// (`major:minor:inode`, hex:hex:decimal, as fstat gives it), which names
/// pid `named`: the pid the file names if it holds a `flock` there, else
/// the one listed. On overlayfs (a container's root) the kernel lists the
/// upper layer's device and inode, not the ones fstat gives, so a `flock`
/// held by the pid the file names counts too.
fn holder_in(locks: &str, device: &str, named: Option<u32>) -> Option<u32> {
    // `1: FLOCK  ADVISORY  WRITE 4242 00:2d:1234 0 EOF` (waiters have `->` after the number).
    let listed = locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1) != Some(&"FLOCK") {
            return None;
        }
        let pid = fields.get(4).and_then(|pid| pid.parse::<u32>().ok());
        (fields.get(5) == Some(&device) || (named.is_some() && pid == named)).then(|| pid.unwrap_or(0))
    });
    listed.map(|listed| named.unwrap_or(listed))
}

/// What stands at a name where the agent expects a folder of its own.
enum Found {
    Missing,
    NotOurs(String),
    Io(io::Error),
}

/// The marker's text in the staging folder `dir` (never through a symlink,
/// a regular file of at most MAX_MARKER_BYTES), if there is one.
pub(super) fn read_marker_at(dir: &impl AsFd) -> io::Result<Option<String>> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat(dir, MARKER, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let st = rustix::fs::fstat(&fd)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "the marker is not a regular file"));
    }
    let mut text = String::new();
    std::fs::File::from(fd).take(MAX_MARKER_BYTES).read_to_string(&mut text)?;
    Ok(Some(text))
}

/// Opens `name` in `dir` if it is a folder of the agent's user with mode 0700.
fn own_dir_at(dir: &impl AsFd, name: &str) -> Result<OwnedFd, Found> {
    let fd = match dirs::open_dir_at(dir, name.as_bytes(), Path::new(name)) {
        Ok(fd) => fd,
        Err(e) if e.is_not_found() => return Err(Found::Missing),
        Err(e @ (dirs::DirError::Symlink { .. } | dirs::DirError::NotDir { .. })) => {
            return Err(Found::NotOurs(e.to_string()))
        }
        // A folder this user may not even open is another user's: the one
        // an agent that ran as root left (0700), found by the same agent
        // now running as salt.
        Err(dirs::DirError::Io { cause, .. }) if cause.kind() == io::ErrorKind::PermissionDenied => {
            let owner = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                .map_or_else(|e| format!("unknown ({e})"), |st| st.st_uid.to_string());
            let euid = rustix::process::geteuid().as_raw();
            return Err(Found::NotOurs(format!(
                "{name}: owned by uid {owner}, not this agent's user ({euid}), who cannot open it"
            )));
        }
        Err(dirs::DirError::Io { cause, .. }) => return Err(Found::Io(cause)),
        Err(e) => return Err(Found::NotOurs(e.to_string())),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| Found::Io(e.into()))?;
    let euid = rustix::process::geteuid().as_raw();
    if st.st_uid != euid {
        return Err(Found::NotOurs(format!("{name}: owned by uid {}, not this agent's user ({euid})", st.st_uid)));
    }
    if st.st_mode & 0o7777 != 0o700 {
        return Err(Found::NotOurs(format!("{name}: mode {:04o}, not 0700", st.st_mode & 0o7777)));
    }
    Ok(fd)
}

/// Makes `name` in `dir` a folder of the agent's own, mode 0700, and opens it.
fn make_own_dir_at(dir: &impl AsFd, name: &str) -> io::Result<OwnedFd> {
    rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o700))?;
    let fd = dirs::open_dir_at(dir, name.as_bytes(), Path::new(name)).map_err(|e| io::Error::other(e.to_string()))?;
    // The umask may have narrowed it; never widened.
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o700))?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::holder_in;

    /// Seen in the systemd test (`--volatile=overlay`): /proc/locks lists
    /// the agent's lock at the overlay's upper layer, fstat names another
    /// device and inode; `check` took the agent's own socket for another
    /// program's and failed.
    #[test]
    fn the_holder_is_found_on_overlayfs_too() {
        let locks = "1: POSIX  ADVISORY  WRITE 77 fd:00:42 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 1471 00:3b:1050 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 1500 00:3b:1050 0 EOF\n";
        assert_eq!(holder_in(locks, "00:3b:1050", None), Some(1471), "same device and inode");
        assert_eq!(holder_in(locks, "00:2d:9", Some(1471)), Some(1471), "overlayfs: the pid the file names");
        assert_eq!(holder_in(locks, "00:2d:9", Some(1500)), None, "a waiter holds nothing");
        assert_eq!(holder_in(locks, "00:2d:9", Some(77)), None, "a POSIX lock is no agent's");
        assert_eq!(holder_in(locks, "00:2d:9", None), None, "not held");
    }
}
