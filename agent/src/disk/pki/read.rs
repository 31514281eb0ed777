//! Reading a key file safely: a regular file directly in its folder,
//! opened relative to it, never through a symlink, never a hard link, never
//! larger than the cap, holding exactly one public key; its access time
//! left alone where the kernel allows it.

use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::ReadWriteFlags;

use super::Pki;
use crate::core::keyfile::{check_public_key, KeyError, MAX_KEY_BYTES};
use crate::core::observe::Refusal;
use crate::core::{Folder, PublicKey, Slot};

/// Names Salt uses for the master's own keys; never read as minion keys even
/// if someone puts one into a key folder.
const MASTER_KEY_NAMES: [&str; 4] = ["master.pem", "master.pub", "master_sign.pem", "master_sign.pub"];

impl Pki {
    /// Reads one key file: a regular file directly in the folder, never
    /// through a symlink, never a hard link, never larger than the cap, and
    /// holding exactly one public key.
    pub fn read_slot(&self, folder: Folder, name: &str) -> Slot {
        self.open_slot(folder, name).0
    }

    /// [`Pki::read_slot`], also returning the file it read a key from.
    pub(super) fn open_slot(&self, folder: Folder, name: &str) -> (Slot, Option<std::fs::File>) {
        let (slot, opened) = self.open_slot_local(folder, name);
        (slot, opened.map(|(file, _)| file))
    }

    /// [`Pki::open_slot`], and whether the folder the file was opened in
    /// is on a local file system (`pki/token.rs`).
    pub(super) fn open_slot_local(&self, folder: Folder, name: &str) -> (Slot, Option<(std::fs::File, bool)>) {
        let (mut file, size, local) = match self.open_checked(folder, name) {
            Ok(opened) => opened,
            Err(slot) => return (slot, None),
        };
        let bytes = match read_noting(&mut file, size, Some(&self.cold)) {
            Ok(bytes) => bytes,
            Err(e) => return (Slot::Refused(Refusal::Unreadable(e.to_string())), None),
        };
        // One byte over the cap, if it grew since: refused, as too large.
        match check_public_key(&bytes) {
            Ok(()) => (Slot::Key(PublicKey::new(bytes)), Some((file, local))),
            Err(e) => (Slot::Refused(Refusal::Content(e)), None),
        }
    }

    /// Opens a key file that a read may read, and its size as `fstat` gave
    /// it: a regular file with one name, directly in the folder, never
    /// through a symlink, no larger than the cap, never a master key's name.
    /// What else it found is the slot (absent, or refused and why). With
    /// them, whether its folder is on a local file system.
    fn open_checked(&self, folder: Folder, name: &str) -> Result<(std::fs::File, usize, bool), Slot> {
        let (dir, local) = self.folder_local(folder).map_err(|why| Slot::Refused(Refusal::Unreadable(why)))?;
        if MASTER_KEY_NAMES.contains(&name) {
            // Refused without being opened, and only where such a file is:
            // one refusal per file, not one per folder.
            return Err(match rustix::fs::statat(&*dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Err(rustix::io::Errno::NOENT) => Slot::Absent,
                _ => Slot::Refused(Refusal::NotRegular("the name of a master key file")),
            });
        }
        let fd = match self.open_key(&dir, name) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Err(Slot::Absent),
            Err(rustix::io::Errno::LOOP) => return Err(Slot::Refused(Refusal::NotRegular("symbolic link"))),
            Err(e) => return Err(Slot::Refused(Refusal::Unreadable(io::Error::from(e).to_string()))),
        };
        let file = std::fs::File::from(fd);
        let st =
            rustix::fs::fstat(&file).map_err(|e| Slot::Refused(Refusal::Unreadable(io::Error::from(e).to_string())))?;
        let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
        if kind != rustix::fs::FileType::RegularFile {
            return Err(Slot::Refused(Refusal::NotRegular(file_type_name(kind))));
        }
        if st.st_nlink > 1 {
            return Err(Slot::Refused(Refusal::HardLinked(st.st_nlink)));
        }
        if st.st_size as u64 > MAX_KEY_BYTES as u64 {
            return Err(Slot::Refused(Refusal::Content(KeyError::TooLarge(st.st_size as u64))));
        }
        Ok((file, st.st_size as usize, local))
    }

    /// Opens a key file in `dir` for reading, as [`Pki::read_slot`] does.
    fn open_key(&self, dir: &OwnedFd, name: &str) -> rustix::io::Result<OwnedFd> {
        // NONBLOCK: opening a FIFO must not hang the agent. NOATIME: reading
        // a key changes nothing on it (a first read of a file written since
        // its last read dirtied its inode: 1,000,000 inode writes at a first
        // start), where the kernel allows it (the files' owner, or CAP_FOWNER).
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        match self.no_noatime.load(Ordering::Relaxed) {
            true => rustix::fs::openat(dir, name, flags, Mode::empty()),
            false => match rustix::fs::openat(dir, name, flags | OFlags::NOATIME, Mode::empty()) {
                Err(rustix::io::Errno::PERM) => {
                    self.no_noatime.store(true, Ordering::Relaxed);
                    rustix::fs::openat(dir, name, flags, Mode::empty())
                }
                opened => opened,
            },
        }
    }

    /// Asks the kernel to read one key file into memory, without waiting
    /// for it (`disk/pki/ahead.rs`): opened as [`Pki::read_slot`] opens it,
    /// and only a regular file with one name, no larger than the cap; never
    /// a master key's name. Whatever fails is left to the read itself to
    /// find and tell. Returns whether it was opened (`None`: not), and if so
    /// whether it was found not in memory.
    pub(super) fn read_ahead(&self, folder: Folder, name: &str) -> Option<bool> {
        // What a read refuses before reading a byte is not read ahead either.
        let (file, size, _) = self.open_checked(folder, name).ok()?;
        // Counted when not in memory: the files read ahead are read warm,
        // and the reads alone would not tell that the next ones are cold.
        let cold = match self.cold.nowait(&file, &mut [0u8; 1], 0, &self.cold.ahead) {
            NoWait::Read(_) => return Some(false),
            NoWait::WouldWait => true,
            NoWait::Untold => false,
        };
        // No further than the size `fstat` gave: a file grown since is not
        // read past the cap.
        if let Some(len) = std::num::NonZeroU64::new(size as u64) {
            let _ = rustix::fs::fadvise(&file, 0, Some(len), rustix::fs::Advice::WillNeed);
        }
        Some(cold)
    }
}

/// Reads that found a key file not in memory (see `ahead.rs`).
#[derive(Debug, Default)]
pub(super) struct ColdReads {
    pub(super) found: AtomicU64,
    /// Files the read-ahead thread found not in memory.
    pub(super) ahead: AtomicU64,
    /// `preadv2(RWF_NOWAIT)` is not there (Linux before 4.14, or a file
    /// system without it): reads are not told apart from now on.
    unsupported: AtomicBool,
}

impl ColdReads {
    /// How many reads so far found their file not in memory.
    pub(super) fn found(&self) -> u64 {
        self.found.load(Ordering::Relaxed)
    }

    /// Whether a read can tell a file not in memory (`RWF_NOWAIT` is there).
    pub(super) fn tells(&self) -> bool {
        !self.unsupported.load(Ordering::Relaxed)
    }

    /// How many files reading ahead found not in memory.
    pub(super) fn found_ahead(&self) -> u64 {
        self.ahead.load(Ordering::Relaxed)
    }

    /// A read of `file` at `offset` (`u64::MAX`: at its offset, which it
    /// moves on) asked not to wait for the disk: how many bytes came, that
    /// it would have waited (counted in `count`), or neither, where it
    /// cannot be asked so (not asked again) or failed (the caller's read
    /// finds that again).
    fn nowait(&self, file: &std::fs::File, buf: &mut [u8], offset: u64, count: &AtomicU64) -> NoWait {
        if self.unsupported.load(Ordering::Relaxed) {
            return NoWait::Untold;
        }
        match rustix::io::preadv2(file, &mut [io::IoSliceMut::new(buf)], offset, ReadWriteFlags::NOWAIT) {
            Ok(n) => NoWait::Read(n),
            Err(rustix::io::Errno::AGAIN) => {
                count.fetch_add(1, Ordering::Relaxed);
                NoWait::WouldWait
            }
            Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS) => {
                self.unsupported.store(true, Ordering::Relaxed);
                NoWait::Untold
            }
            Err(_) => NoWait::Untold,
        }
    }
}

/// What a read asked not to wait for the disk found ([`ColdReads::nowait`]).
enum NoWait {
    /// The bytes that came: the file was in memory.
    Read(usize),
    /// It would have waited: not in memory.
    WouldWait,
    /// It cannot tell (not asked so, or failed).
    Untold,
}

fn file_type_name(kind: rustix::fs::FileType) -> &'static str {
    use rustix::fs::FileType;
    match kind {
        FileType::Directory => "directory",
        FileType::Fifo => "FIFO",
        FileType::Socket => "socket",
        FileType::BlockDevice | FileType::CharacterDevice => "device",
        FileType::Symlink => "symbolic link",
        _ => "special file",
    }
}

/// A key file's bytes, `size` as fstat gave it: read until `size` bytes
/// came (one read(), where reading to the end took two, the second finding
/// the end), or the end came first. A file that grew since the fstat is
/// read on, up to one byte over the cap (refused by the caller).
#[cfg(test)]
pub(super) fn read_key_bytes(file: &mut std::fs::File, size: usize) -> io::Result<Vec<u8>> {
    read_noting(file, size, None)
}

/// [`read_key_bytes`], noting in `cold` a first read that would have waited
/// for the disk: it is asked first not to wait (`RWF_NOWAIT`), then made
/// as any other. Where the file is in memory, that is still one `read`.
/// A count, not a certainty: the read asked not to wait starts the disk's,
/// and on a loaded machine may find it done; of a cold start's thousands
/// of files, enough are counted.
pub(super) fn read_noting(file: &mut std::fs::File, size: usize, cold: Option<&ColdReads>) -> io::Result<Vec<u8>> {
    let mut bytes = vec![0; size + 1];
    let mut got = 0;
    if let Some(NoWait::Read(n)) = cold.map(|cold| cold.nowait(file, &mut bytes, u64::MAX, &cold.found)) {
        if n == size {
            return finish(file, bytes, n, size);
        }
        got = n;
    }
    while got < bytes.len() {
        match file.read(&mut bytes[got..]) {
            Ok(0) => break,
            Ok(n) => {
                got += n;
                if got == size {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    finish(file, bytes, got, size)
}

fn finish(file: &mut std::fs::File, mut bytes: Vec<u8>, got: usize, size: usize) -> io::Result<Vec<u8>> {
    bytes.truncate(got);
    if got > size {
        file.take((MAX_KEY_BYTES + 1).saturating_sub(got) as u64).read_to_end(&mut bytes)?;
    }
    Ok(bytes)
}
