//! The master's key folders on disk: reading an id's three files without
//! trusting them, and applying a decision with staged, atomic writes.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::core::keyfile::{check_public_key, KeyError, MAX_KEY_BYTES};
use crate::core::observe::Refusal;
use crate::core::settle::FsChange;
use crate::core::{Decision, Folder, MinionId, PublicKey, Slot, Slots, Verdict};
pub use keysync_machine::node::Applied;

mod adopt;
use adopt::Adoption;

/// Mode of the key files the agent writes, as Salt leaves accepted keys.
pub const KEY_MODE: u32 = 0o644;
/// Mode Salt gives `.dfn`; exactly this, or the master ignores it.
const DFN_MODE: u32 = 0o400;

/// Names Salt uses for the master's own keys; never read as minion keys even
/// if someone puts one into a key folder.
const MASTER_KEY_NAMES: [&str; 4] = ["master.pem", "master.pub", "master_sign.pem", "master_sign.pub"];

static STAGING_SEQ: AtomicU64 = AtomicU64::new(0);

/// Batches at least this large are written by several threads.
const PARALLEL_FROM: usize = 256;
/// At most this many writer threads (and no more than the machine's cores).
const MAX_WRITERS: usize = 4;
/// Writer `n > 0` stages in `.keysync-staging/writer-<n>/`.
const WRITER_DIR_PREFIX: &str = "writer-";

/// Where key files are staged before being renamed into their folder: a dot
/// folder in pki_dir (same file system, ignored by Salt). Staging outside the
/// key folders keeps the agent's own writes out of its inotify watch and off
/// the folders' large directory indexes until the final rename.
pub const STAGING_DIR: &str = ".keysync-staging";

/// A file owner: the salt master user.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

impl Owner {
    /// Looks a user up in /etc/passwd (the salt user is a local system user).
    pub fn from_user(name: &str) -> io::Result<Owner> {
        let passwd = fs::read_to_string("/etc/passwd")?;
        passwd
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split(':').collect();
                (fields.len() >= 4 && fields[0] == name).then(|| (fields[2].parse().ok(), fields[3].parse().ok()))
            })
            .find_map(|ids| match ids {
                (Some(uid), Some(gid)) => Some(Owner { uid, gid }),
                _ => None,
            })
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no user {name:?} in /etc/passwd")))
    }

    pub fn of_path(path: &Path) -> io::Result<Owner> {
        let meta = fs::metadata(path)?;
        Ok(Owner { uid: meta.uid(), gid: meta.gid() })
    }
}

pub struct Pki {
    root: PathBuf,
    owner: Owner,
    /// Per key folder (in `Folder::ALL` order): a rename from the staging
    /// folder failed with EXDEV (another file system, or a bind mount of its
    /// own as systemd's ReadWritePaths= makes), so stage beside the key.
    stage_beside: [AtomicBool; 3],
    /// A pending file could not be linked or renamed into another key folder
    /// (EXDEV): pending keys are copied like any other from now on.
    no_adopt: AtomicBool,
    /// Linking an open file by its /proc/self/fd name failed other than by
    /// EEXIST (no /proc, a hard-link restriction): pending keys are adopted
    /// by renaming from now on.
    no_link: AtomicBool,
}

impl Pki {
    pub fn new(root: PathBuf, owner: Owner) -> Pki {
        Pki {
            root,
            owner,
            stage_beside: Default::default(),
            no_adopt: AtomicBool::new(false),
            no_link: AtomicBool::new(false),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn folder_path(&self, folder: Folder) -> PathBuf {
        self.root.join(folder.dir_name())
    }

    /// Creates missing key folders (Salt creates them when the master starts)
    /// and the agent's private staging folder.
    pub fn ensure_folders(&self) -> io::Result<()> {
        for folder in Folder::ALL {
            let path = self.folder_path(folder);
            if !path.is_dir() {
                fs::create_dir_all(&path)?;
                fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
                std::os::unix::fs::chown(&path, Some(self.owner.uid), Some(self.owner.gid))?;
            }
        }
        let staging = self.root.join(STAGING_DIR);
        match fs::create_dir(&staging) {
            Ok(()) => fs::set_permissions(&staging, fs::Permissions::from_mode(0o700)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(e),
        }
    }

    pub fn read_slots(&self, id: &MinionId) -> Slots {
        Slots {
            accepted: self.read_slot(Folder::Accepted, id.as_str()),
            pending: self.read_slot(Folder::Pending, id.as_str()),
            rejected: self.read_slot(Folder::Rejected, id.as_str()),
        }
    }

    /// Reads one key file: a regular file directly in the folder, never
    /// through a symlink, never a hard link, never larger than the cap, and
    /// holding exactly one public key.
    pub fn read_slot(&self, folder: Folder, name: &str) -> Slot {
        self.open_slot(folder, name).0
    }

    /// [`Pki::read_slot`], also returning the file it read a key from.
    fn open_slot(&self, folder: Folder, name: &str) -> (Slot, Option<File>) {
        let path = self.folder_path(folder).join(name);
        if MASTER_KEY_NAMES.contains(&name) {
            // Refused without being opened, and only where such a file is:
            // one refusal per file, not one per folder.
            return (
                match path.symlink_metadata() {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Slot::Absent,
                    _ => Slot::Refused(Refusal::NotRegular("the name of a master key file")),
                },
                None,
            );
        }
        let file = OpenOptions::new()
            .read(true)
            // NONBLOCK: opening a FIFO must not hang the agent.
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(&path);
        let mut file = match file {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return (Slot::Absent, None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return (Slot::Refused(Refusal::NotRegular("symbolic link")), None)
            }
            Err(e) => return (Slot::Refused(Refusal::Unreadable(e.to_string())), None),
        };
        let meta = match file.metadata() {
            Ok(meta) => meta,
            Err(e) => return (Slot::Refused(Refusal::Unreadable(e.to_string())), None),
        };
        if !meta.file_type().is_file() {
            return (Slot::Refused(Refusal::NotRegular(file_type_name(&meta))), None);
        }
        if meta.nlink() > 1 {
            return (Slot::Refused(Refusal::HardLinked(meta.nlink())), None);
        }
        if meta.len() > MAX_KEY_BYTES as u64 {
            return (Slot::Refused(Refusal::Content(KeyError::TooLarge(meta.len()))), None);
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        if let Err(e) = (&mut file).take(MAX_KEY_BYTES as u64 + 1).read_to_end(&mut bytes) {
            return (Slot::Refused(Refusal::Unreadable(e.to_string())), None);
        }
        match check_public_key(&bytes) {
            Ok(()) => (Slot::Key(PublicKey::new(bytes)), Some(file)),
            Err(e) => (Slot::Refused(Refusal::Content(e)), None),
        }
    }

    /// Names present in each folder (dot files skipped, as Salt does).
    pub fn list(&self) -> io::Result<Vec<(Folder, String)>> {
        let mut out = Vec::new();
        for folder in Folder::ALL {
            for dirent in fs::read_dir(self.folder_path(folder))? {
                let name = dirent?.file_name();
                match name.to_str() {
                    Some(name) if !name.starts_with('.') => out.push((folder, name.to_string())),
                    Some(_) => {}
                    None => out.push((folder, name.to_string_lossy().into_owned())),
                }
            }
        }
        Ok(out)
    }

    /// Makes the folders say `decision`: the key staged in a dot file and
    /// renamed into its folder, then the id removed from the other folders.
    /// Not durable until [`Pki::sync`].
    pub fn apply(&self, decision: &Decision) -> io::Result<Applied> {
        self.apply_in(decision, 0)
    }

    /// [`Pki::apply`] for many decisions about distinct ids, by a few writer
    /// threads when there are many (a join, a `salt-key -A` burst). Creating
    /// a file is the costly step (ext4 searches its inode bitmaps under the
    /// staging folder's lock), so each writer stages in a folder of its own.
    /// Results are in the order of `decisions`.
    pub fn apply_all(&self, decisions: &[&Decision]) -> Vec<io::Result<Applied>> {
        let writers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_WRITERS);
        self.apply_by(decisions, writers)
    }

    fn apply_by(&self, decisions: &[&Decision], writers: usize) -> Vec<io::Result<Applied>> {
        if decisions.len() < PARALLEL_FROM || writers < 2 {
            return decisions.iter().map(|decision| self.apply_in(decision, 0)).collect();
        }
        let chunk = decisions.len().div_ceil(writers);
        std::thread::scope(|scope| {
            let running: Vec<_> = decisions
                .chunks(chunk)
                .enumerate()
                .map(|(lane, part)| {
                    scope.spawn(move || part.iter().map(|decision| self.apply_in(decision, lane)).collect::<Vec<_>>())
                })
                .collect();
            running
                .into_iter()
                .flat_map(|writer| writer.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
                .collect()
        })
    }

    /// [`Pki::apply`], staging in writer `lane`'s folder.
    fn apply_in(&self, decision: &Decision, lane: usize) -> io::Result<Applied> {
        let id = decision.id.as_str();
        let (target, key) = match &decision.verdict {
            Verdict::Accepted(key) => (Some(Folder::Accepted), Some(key)),
            Verdict::Rejected(key) => (Some(Folder::Rejected), Some(key)),
            Verdict::Deleted => (None, None),
        };
        let mut applied = Applied::default();
        let mut adopted = Adoption::No;
        if let (Some(folder), Some(key)) = (target, key) {
            adopted = match self.open_slot(Folder::Pending, id) {
                (Slot::Key(pending), Some(file)) if pending.fingerprint() == key.fingerprint() => {
                    self.adopt_pending(file, folder, id, key, lane, &mut applied.changes)
                }
                (Slot::Key(pending), _) => {
                    applied.discarded_pending = Some(pending);
                    Adoption::No
                }
                _ => Adoption::No,
            };
            if adopted == Adoption::No {
                self.write_key(folder, id, key.bytes(), lane)?;
                applied.changes.push((folder, FsChange::MovedIn));
            }
        }
        for folder in Folder::ALL {
            // A linked pending file's name was removed already. After a rename
            // the name is removed again: the master may have written a new
            // pending key while the id was in no folder.
            if Some(folder) != target
                && !(adopted == Adoption::Linked && folder == Folder::Pending)
                && remove_if_present(&self.folder_path(folder).join(id))?
            {
                applied.changes.push((folder, FsChange::Gone));
            }
        }
        Ok(applied)
    }

    /// Writer `lane`'s staging folder (writer 0 uses the staging folder itself).
    fn staging_dir(&self, lane: usize) -> PathBuf {
        let mut staging = self.root.join(STAGING_DIR);
        if lane > 0 {
            staging.push(format!("{WRITER_DIR_PREFIX}{lane}"));
        }
        staging
    }

    /// Runs `op` on writer `lane`'s staging folder, which is made at its
    /// first use (writer 0's, the staging folder itself, at start).
    fn in_staging<T>(&self, lane: usize, op: impl Fn(&Path) -> io::Result<T>) -> io::Result<T> {
        let staging = self.staging_dir(lane);
        let result = op(&staging);
        if lane > 0 && result.as_ref().is_err_and(|e| e.kind() == io::ErrorKind::NotFound) && !staging.is_dir() {
            match fs::DirBuilder::new().mode(0o700).create(&staging) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => return op(&staging),
            }
        }
        result
    }

    fn write_key(&self, folder: Folder, id: &str, bytes: &[u8], lane: usize) -> io::Result<()> {
        let dir = self.folder_path(folder);
        let name = format!(".keysync-{}-{}", std::process::id(), STAGING_SEQ.fetch_add(1, Ordering::Relaxed));
        let beside = &self.stage_beside[Folder::ALL.iter().position(|&f| f == folder).unwrap_or(0)];
        if beside.load(Ordering::Relaxed) {
            return self.stage(&dir.join(&name), &dir.join(id), bytes);
        }
        let staged = self.in_staging(lane, |staging| self.stage(&staging.join(&name), &dir.join(id), bytes));
        match staged {
            // Not the staging folder's mount: stage beside the key, from now on.
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                beside.store(true, Ordering::Relaxed);
                tracing::info!(folder = %dir.display(), "staging beside the keys: the folder is a mount of its own");
                self.stage(&dir.join(&name), &dir.join(id), bytes)
            }
            result => result,
        }
    }

    fn stage(&self, staging: &Path, target: &Path, bytes: &[u8]) -> io::Result<()> {
        let result = write_new(staging, bytes, KEY_MODE, self.owner).and_then(|()| fs::rename(staging, target));
        if result.is_err() {
            let _ = fs::remove_file(staging);
        }
        result
    }

    /// Flushes everything written to the file system holding pki_dir.
    pub fn sync(&self) -> io::Result<()> {
        let dir = File::open(&self.root)?;
        rustix::fs::syncfs(&dir)?;
        Ok(())
    }

    /// Removes staging files a crash left behind.
    pub fn clean_staging(&self) -> io::Result<usize> {
        let mut removed = 0;
        let staging = self.root.join(STAGING_DIR);
        let mut dirs: Vec<PathBuf> = Folder::ALL.iter().map(|&f| self.folder_path(f)).collect();
        if staging.is_dir() {
            for dirent in fs::read_dir(&staging)? {
                let dirent = dirent?;
                if dirent.file_name().to_string_lossy().starts_with(WRITER_DIR_PREFIX) && dirent.file_type()?.is_dir() {
                    dirs.push(dirent.path());
                }
            }
            dirs.push(staging);
        }
        for dir in dirs {
            for dirent in fs::read_dir(dir)? {
                let dirent = dirent?;
                if dirent.file_name().to_string_lossy().starts_with(".keysync-") {
                    remove_if_present(&dirent.path())?;
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }
}

/// Drops `<cachedir>/.dfn` so the master rotates its AES key at its next
/// maintenance run, as `salt-key` does on a reject or delete; an existing one
/// is left alone (a rotation is already due). Returns whether one was written.
///
/// Salt 3008 refuses (and never clears) a `.dfn` whose content is not its id,
/// so the master must never see a half-written one: it is staged complete and
/// hard-linked into place, which also fails if `.dfn` appeared meanwhile.
pub fn drop_dfn(cachedir: &Path, master_id: &str, owner: Owner) -> io::Result<bool> {
    let path = cachedir.join(".dfn");
    if path.symlink_metadata().is_ok() {
        return Ok(false);
    }
    let staging = cachedir.join(format!(".dfn-keysync-{}", std::process::id()));
    remove_if_present(&staging)?;
    let result = write_new(&staging, master_id.as_bytes(), DFN_MODE, owner).and_then(|()| {
        match fs::hard_link(&staging, &path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    });
    let _ = fs::remove_file(&staging);
    result
}

/// Creates a staging file that must not exist yet (never through a symlink)
/// holding `bytes`, with exactly `mode` and owned by `owner`.
fn write_new(path: &Path, bytes: &[u8], mode: u32, owner: Owner) -> io::Result<()> {
    let mut file =
        OpenOptions::new().write(true).create_new(true).mode(mode).custom_flags(libc::O_NOFOLLOW).open(path)?;
    file.write_all(bytes)?;
    // The umask may have narrowed the mode given to open.
    file.set_permissions(fs::Permissions::from_mode(mode))?;
    std::os::unix::fs::fchown(&file, Some(owner.uid), Some(owner.gid))
}

/// Removes a file; true if there was one.
fn remove_if_present(path: &Path) -> io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

fn file_type_name(meta: &fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let kind = meta.file_type();
    if kind.is_dir() {
        "directory"
    } else if kind.is_fifo() {
        "FIFO"
    } else if kind.is_socket() {
        "socket"
    } else if kind.is_block_device() || kind.is_char_device() {
        "device"
    } else {
        "special file"
    }
}

#[cfg(test)]
mod tests;
