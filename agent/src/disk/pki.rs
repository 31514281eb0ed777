//! The master's key folders on disk: reading an id's three files without
//! trusting them, and applying a decision with staged, atomic writes
//! (`apply.rs`).
//!
//! Everything under pki_dir belongs to another user (salt-master runs as
//! `salt`), so nothing here takes a path: pki_dir, each key folder and the
//! agent's staging folder are opened once, never through a symlink, and
//! checked on their descriptors (`dirs.rs`); every read, write, link,
//! rename and unlink is an `*at()` call relative to those descriptors. A key
//! folder replaced while the agent runs is noticed (its inode changed):
//! reopened if the new one is a plain folder of a trusted owner, refused
//! otherwise, and the others keep being served.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rustix::fs::{Mode, OFlags};

use crate::core::Folder;
pub use keysync_machine::node::Applied;

mod adopt;
pub mod ahead;
mod apply;
mod dfn;
pub mod dirs;
mod identity;
mod owner;
pub mod prestage;
mod read;
mod staging;
mod token;

use apply::{give_to, remove_if_present, staged_name, write_new, write_new_file};
pub use dfn::{check_cachedir, drop_dfn};
pub use dirs::{DirError, Trust};
pub use owner::{user_name, Owner};

/// Mode of the key files the agent writes as Salt 3006 and 3007 leave
/// accepted keys (their master's auth writes pending keys 0644, and salt-key
/// renames them); see [`key_mode_for`].
pub const KEY_MODE: u32 = 0o644;

/// Mode of the key files Salt 3008 writes (mkstemp, then rename), and the
/// agent's choice while the master's version is unknown: every Salt line
/// reads it, as the files belong to the master's user.
pub const KEY_MODE_3008: u32 = 0o600;

/// The mode the master's own salt-key gives key files, from its version as
/// `salt-master --version` prints it ("3008.3"): 0600 from 3008 on, 0644
/// before; `None` when the version does not say.
pub fn key_mode_for(salt_version: &str) -> Option<u32> {
    let major: u32 = salt_version.split(['.', ' ']).next()?.parse().ok()?;
    Some(if major >= 3008 { KEY_MODE_3008 } else { KEY_MODE })
}

static STAGING_SEQ: AtomicU64 = AtomicU64::new(0);

/// Batches at least this large are written by several threads.
const PARALLEL_FROM: usize = 256;
/// At most this many writer threads (and no more than the machine's cores).
const MAX_WRITERS: usize = 4;

/// How many threads write a large batch: one per core, at most [`MAX_WRITERS`].
fn writers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_WRITERS)
}

/// The agent's own folder in pki_dir (same file system as the keys, ignored
/// by Salt): staged files are renamed from here into their folder, so the
/// agent's own writes stay out of its inotify watch and off the folders'
/// large directory indexes until the final rename. Private to the agent.
pub const STAGING_DIR: &str = ".keysync-staging";
pub use staging::MARKER;

/// How to open the key folders.
#[derive(Clone, Copy, Debug)]
pub struct PkiOptions {
    pub owner: Owner,
    pub trust: Trust,
    /// Mode of the key files written.
    pub key_mode: u32,
    /// Create missing key folders (the agent does; `check` does not).
    pub create: bool,
}

/// One key folder, as opened.
#[derive(Debug)]
struct KeyFolder {
    /// `None` while refused (replaced by something the agent will not use).
    fd: Option<Arc<OwnedFd>>,
    /// The (device, inode) opened: a replacement shows as another.
    identity: (u64, u64),
    /// Why it is refused, if it is.
    refused: Option<String>,
    /// On a local file system: its key files may get tokens (`pki/token.rs`).
    local: bool,
}

/// A key folder that changed under the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replaced {
    pub folder: Folder,
    /// Reopened (a plain folder of a trusted owner), or why it is refused.
    pub outcome: Result<(), String>,
}

pub struct Pki {
    root_path: PathBuf,
    root: OwnedFd,
    options: PkiOptions,
    folders: [RwLock<KeyFolder>; 3],
    staging: staging::Staging,
    /// Replacements noticed and not yet taken by the caller.
    replaced: Mutex<Vec<Replaced>>,
    /// A pending file could not be linked or renamed into another key folder
    /// (EXDEV): pending keys are copied like any other from now on.
    no_adopt: AtomicBool,
    /// Linking an open file by its /proc/self/fd name failed other than by
    /// EEXIST (no /proc, a hard-link restriction): pending keys are adopted
    /// by renaming from now on.
    no_link: AtomicBool,
    /// Mode of the key files written from now on (see [`Pki::set_key_mode`]).
    key_mode: AtomicU32,
    /// The key files' tokens: their epoch and key (`pki/token.rs`).
    tokens: token::Tokens,
    /// Opening a key file with `O_NOATIME` was refused (EPERM: the files
    /// are another user's, and the agent lacks CAP_FOWNER): key files are
    /// opened without it from now on.
    no_noatime: AtomicBool,
    /// Reads that found their key file not in memory (`ahead.rs`).
    cold: read::ColdReads,
}

/// Why the key folders cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    // Causes are in the messages, not `source()`s: `{:#}` would print them twice.
    #[error("pki_dir {0}")]
    Dir(DirError),
    #[error("the agent's staging folder {path}: {cause}")]
    Staging { path: String, cause: io::Error },
    #[error(
        "{folder} is a mount of its own, apart from {staging}: keys staged there cannot be renamed into \
         place atomically, and staging beside the keys would put the agent's files in a folder tools watch; \
         keep pki_dir's key folders and {STAGING_DIR} on one mount (the packaged unit makes pki_dir writable \
         as one, not each key folder)"
    )]
    Mounts { folder: String, staging: String },
}

impl From<DirError> for PkiError {
    fn from(error: DirError) -> Self {
        PkiError::Dir(error)
    }
}

impl Pki {
    /// Opens pki_dir, its three key folders (created when missing if
    /// `options.create`) and the agent's staging folder, checking each.
    pub fn open(root_path: &Path, options: PkiOptions) -> Result<Pki, PkiError> {
        let root = dirs::open_path(root_path, &options.trust)?;
        let mut opened = Vec::new();
        for folder in Folder::ALL {
            opened.push(open_folder(&root, root_path, folder, &options)?);
        }
        let staging = staging::Staging::open(&root, root_path, options.create)?;
        if let Some(folder) = apart_from(&staging.fd, opened.iter().map(|f| f.fd.as_deref())) {
            return Err(PkiError::Mounts {
                folder: root_path.join(folder.dir_name()).display().to_string(),
                staging: root_path.join(STAGING_DIR).display().to_string(),
            });
        }
        let [accepted, pending, rejected]: [KeyFolder; 3] = opened.try_into().expect("three folders");
        let key_mode = AtomicU32::new(options.key_mode);
        Ok(Pki {
            root_path: root_path.to_path_buf(),
            root,
            options,
            folders: [RwLock::new(accepted), RwLock::new(pending), RwLock::new(rejected)],
            staging,
            replaced: Mutex::new(Vec::new()),
            no_adopt: AtomicBool::new(false),
            no_noatime: AtomicBool::new(false),
            cold: read::ColdReads::default(),
            no_link: AtomicBool::new(false),
            key_mode,
            tokens: token::Tokens::default(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root_path
    }

    /// Writes key files with `mode` from now on (the master's Salt line, once known).
    pub fn set_key_mode(&self, mode: u32) {
        self.key_mode.store(mode, Ordering::Relaxed);
    }

    pub fn key_mode(&self) -> u32 {
        self.key_mode.load(Ordering::Relaxed)
    }

    /// Who may own the folders the agent works in.
    pub fn trust(&self) -> Trust {
        self.options.trust
    }

    /// What staging found at start that was not the agent's own (moved aside).
    pub fn staging_refused(&self) -> Option<&str> {
        self.staging.refused.as_deref()
    }

    /// The descriptor of a key folder, or why it is refused.
    fn folder_fd(&self, folder: Folder) -> Result<Arc<OwnedFd>, String> {
        self.folder_local(folder).map(|(fd, _)| fd)
    }

    /// [`Pki::folder_fd`], and whether that folder is on a local file
    /// system (`pki/token.rs`): read together, as a reopen changes both.
    fn folder_local(&self, folder: Folder) -> Result<(Arc<OwnedFd>, bool), String> {
        let state = self.folders[folder.index()].read().unwrap_or_else(std::sync::PoisonError::into_inner);
        match (&state.fd, &state.refused) {
            (Some(fd), None) => Ok((fd.clone(), state.local)),
            (_, Some(why)) => Err(why.clone()),
            (None, None) => Err(format!("{}/ is not open", folder.dir_name())),
        }
    }

    /// Narrows decided key files (`minions/`, `minions_rejected/`) left
    /// 0644 by earlier releases, or by Salt before 3008, to 0600 when this
    /// master's Salt writes 0600: done once the mode is known, through each
    /// file's own descriptor (opened `O_NOFOLLOW`, regular files with one
    /// name only, never widened). Returns how many were narrowed and how many could not be.
    pub fn narrow_key_modes(&self) -> (usize, usize) {
        if self.key_mode() != KEY_MODE_3008 {
            return (0, 0);
        }
        let (mut narrowed, mut failed) = (0, 0);
        for folder in [Folder::Accepted, Folder::Rejected] {
            let Ok(dir) = self.folder_fd(folder) else { continue };
            let Ok(names) = read_names(&*dir) else { continue };
            for name in names.iter().filter(|n| !n.as_encoded_bytes().starts_with(b".")) {
                let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
                let Ok(fd) = rustix::fs::openat(&*dir, name.as_os_str(), flags, Mode::empty()) else { continue };
                let Ok(st) = rustix::fs::fstat(&fd) else { continue };
                let mode = st.st_mode & 0o7777;
                // A second name of another file (a hard link) is never touched.
                if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile
                    || st.st_nlink != 1
                    || mode & 0o077 == 0
                {
                    continue;
                }
                match rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & 0o700)) {
                    Ok(()) => narrowed += 1,
                    Err(_) => failed += 1,
                }
            }
        }
        (narrowed, failed)
    }

    /// Compares each key folder with what pki_dir names now: a folder
    /// replaced by a plain folder of a trusted owner is reopened, one
    /// replaced by anything else (a symlink, another owner) is refused.
    /// Changes are kept for [`Pki::take_replaced`].
    pub fn check_folders(&self) {
        for folder in Folder::ALL {
            let slot = &self.folders[folder.index()];
            let now = dirs::identity_at(&self.root, folder.dir_name());
            let before = slot.read().unwrap_or_else(std::sync::PoisonError::into_inner).identity;
            if now == Some(before) {
                continue;
            }
            let outcome =
                match open_folder(&self.root, &self.root_path, folder, &PkiOptions { create: false, ..self.options }) {
                    Ok(reopened) => {
                        let mut state = slot.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                        if state.refused.is_none() && state.identity == reopened.identity {
                            continue;
                        }
                        *state = reopened;
                        Ok(())
                    }
                    Err(e) => {
                        let why = format!("{}/ was replaced and is refused: {e}", folder.dir_name());
                        let mut state = slot.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                        if state.refused.as_deref() == Some(why.as_str()) {
                            continue;
                        }
                        state.fd = None;
                        state.refused = Some(why.clone());
                        state.identity = (0, 0);
                        state.local = false;
                        Err(why)
                    }
                };
            self.replaced.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(Replaced { folder, outcome });
        }
    }

    /// Key folders replaced since the last call.
    pub fn take_replaced(&self) -> Vec<Replaced> {
        std::mem::take(&mut *self.replaced.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Names present in each usable folder (dot files skipped, as Salt does).
    pub fn list(&self) -> io::Result<Vec<(Folder, String)>> {
        Ok(self.list_usable()?.0)
    }

    /// [`Pki::list`], and whether every folder was listed (none is refused).
    pub fn list_usable(&self) -> io::Result<(Vec<(Folder, String)>, bool)> {
        self.check_folders();
        let mut out = Vec::new();
        let mut complete = true;
        for folder in Folder::ALL {
            let Ok(dir) = self.folder_fd(folder) else {
                complete = false;
                continue;
            };
            for name in read_names(&*dir)? {
                match name.into_string() {
                    Ok(name) if !name.starts_with('.') => out.push((folder, name)),
                    Ok(_) => {}
                    Err(name) => out.push((folder, name.to_string_lossy().into_owned())),
                }
            }
        }
        Ok((out, complete))
    }

    /// Flushes everything written to the file system holding pki_dir.
    pub fn sync(&self) -> io::Result<()> {
        rustix::fs::syncfs(&self.root)?;
        Ok(())
    }

    /// Removes staging files a crash left behind.
    pub fn clean_staging(&self) -> io::Result<usize> {
        self.staging.clean(&self.root)
    }

    /// The state marker's text, if there is one (in the staging folder).
    pub fn read_marker(&self) -> io::Result<Option<String>> {
        self.staging.read_marker()
    }

    /// Writes the state marker (staged under a fresh name, renamed, synced).
    pub fn write_marker(&self, text: &str) -> io::Result<()> {
        self.staging.write_marker(text)
    }

    /// Locks these folders for this process while it serves them (the agent,
    /// or `recover`): a second agent on the same pki_dir (another state_dir
    /// or port) is refused, naming the one that serves it.
    pub fn lock_serving(&self) -> Result<ServingLock, String> {
        let path = self.root_path.join(STAGING_DIR).join(staging::LOCK);
        match self.staging.lock() {
            Ok(Ok(fd)) => Ok(ServingLock { _fd: fd }),
            Ok(Err(pid)) => Err(format!(
                "another agent (pid {pid}) serves this pki_dir ({}): stop the agent first (its lock: {})",
                self.root_path.display(),
                path.display()
            )),
            Err(e) => Err(format!("cannot lock {}: {e}{}", path.display(), crate::disk::handover::hint(&e))),
        }
    }

    /// Where the marker is, for messages.
    pub fn marker_path(&self) -> PathBuf {
        self.root_path.join(STAGING_DIR).join(staging::MARKER)
    }
}

/// This process serves a pki_dir while it holds this (see [`Pki::lock_serving`]).
#[derive(Debug)]
pub struct ServingLock {
    _fd: OwnedFd,
}

/// The first key folder on another mount than the staging folder, if any
/// (in `Folder::ALL` order; unknown mounts compare equal).
fn apart_from<'a>(staging: &OwnedFd, folders: impl Iterator<Item = Option<&'a OwnedFd>>) -> Option<Folder> {
    let staging = dirs::mount_of(staging)?;
    Folder::ALL
        .into_iter()
        .zip(folders)
        .find(|(_, fd)| fd.and_then(dirs::mount_of).is_some_and(|mount| mount != staging))
        .map(|(folder, _)| folder)
}

/// The state marker's text, read for `salt-keysync check` without opening
/// the folders for work (which may make or replace the staging folder):
/// pki_dir checked as `open` checks it, nothing followed through a symlink.
/// A staging folder not the agent's own has no marker for it: `run` moves
/// it aside and starts without one.
pub fn peek_marker(root_path: &Path, trust: &Trust) -> io::Result<Option<String>> {
    let root = dirs::open_path(root_path, trust).map_err(|e| io::Error::other(e.to_string()))?;
    match staging::peek(&root)? {
        Some(staging) => staging::read_marker_at(&staging),
        None => Ok(None),
    }
}

/// The pid of the agent (or `recover`) serving `root_path`'s folders now, if
/// one does: its lock is held (see [`Pki::lock_serving`]). Read without
/// taking the lock or changing anything, for `salt-keysync check`.
pub fn serving_pid(root_path: &Path, trust: &Trust) -> io::Result<Option<u32>> {
    let root = dirs::open_path(root_path, trust).map_err(|e| io::Error::other(e.to_string()))?;
    match staging::peek(&root)? {
        Some(staging) => staging::lock_holder(&staging),
        None => Ok(None),
    }
}

/// What `salt-keysync check` finds of the folders `run` would use, without
/// changing anything: problems that stop `run`, and notes.
pub fn inspect(root_path: &Path, trust: &Trust) -> (Vec<String>, Vec<String>) {
    let (mut problems, mut notes) = (Vec::new(), Vec::new());
    let root = match dirs::open_path(root_path, trust) {
        Ok(root) => root,
        Err(e) => {
            problems.push(format!("pki_dir {e}"));
            return (problems, notes);
        }
    };
    let mut opened = Vec::new();
    for folder in Folder::ALL {
        let path = root_path.join(folder.dir_name());
        let fd = dirs::open_dir_at(&root, folder.dir_name().as_bytes(), &path);
        match fd.and_then(|fd| dirs::check_dir(&fd, &path, trust).map(|_| fd)) {
            Ok(fd) => opened.push((folder, fd)),
            // `run` makes a missing key folder (as the salt-master would).
            Err(e) if e.is_not_found() => {
                notes.push(format!("{} is missing: the agent makes it at start", path.display()))
            }
            Err(e) => problems.push(e.to_string()),
        }
    }
    // The staging folder is made in pki_dir itself: on pki_dir's mount.
    if let Some(root_mount) = dirs::mount_of(&root) {
        for (folder, fd) in &opened {
            if dirs::mount_of(fd).is_some_and(|mount| mount != root_mount) {
                problems.push(
                    PkiError::Mounts {
                        folder: root_path.join(folder.dir_name()).display().to_string(),
                        staging: root_path.join(STAGING_DIR).display().to_string(),
                    }
                    .to_string(),
                );
            }
        }
    }
    match staging::inspect(&root) {
        Ok(None) => notes.push(format!("{}/{STAGING_DIR} is made at the first start", root_path.display())),
        Ok(Some(())) => {}
        Err(what) => notes.push(format!(
            "{}/{STAGING_DIR}: {what}; the agent moves it aside and makes its own at start (audited)",
            root_path.display()
        )),
    }
    (problems, notes)
}

/// Opens (creating when asked and missing) one key folder of `root`.
fn open_folder(root: &OwnedFd, root_path: &Path, folder: Folder, options: &PkiOptions) -> Result<KeyFolder, DirError> {
    let name = folder.dir_name();
    let path = root_path.join(name);
    let fd = match dirs::open_dir_at(root, name.as_bytes(), &path) {
        Err(e) if e.is_not_found() && options.create => {
            // Salt makes them when the master first starts.
            match rustix::fs::mkdirat(root, name, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(DirError::Io { path: path.display().to_string(), cause: e.into() }),
            }
            let fd = dirs::open_dir_at(root, name.as_bytes(), &path)?;
            give_to(&fd, options.owner)
                .and_then(|()| Ok(rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o755))?))
                .map_err(|cause| DirError::Io { path: path.display().to_string(), cause })?;
            fd
        }
        other => other?,
    };
    let identity = dirs::check_dir(&fd, &path, &options.trust)?;
    let local = token::is_local(&fd);
    Ok(KeyFolder { fd: Some(Arc::new(fd)), identity, refused: None, local })
}

/// Every name in a folder (not `.` and `..`).
fn read_names(dir: &impl AsFd) -> io::Result<Vec<OsString>> {
    // A description of its own (opened as "." relative to the folder): its
    // read offset is shared with no one.
    let mut names = Vec::new();
    let mut listing = rustix::fs::Dir::read_from(dir)?;
    while let Some(entry) = listing.read() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(OsString::from_vec(name.to_vec()));
        }
    }
    Ok(names)
}

#[cfg(test)]
pub(crate) mod tests;
