//! Key files read ahead where they are not in memory.
//!
//! A start reads every key file, and a rescan every one listed, one after
//! another on the core's thread. Where they are on the disk only (after a
//! reboot, or on a master holding more keys than its memory keeps), each
//! read waits for the disk, and the disk has one read to do at a time: 70 µs
//! a file on the build machine's virtual disk, 14 s for 200,000 keys.
//!
//! The node machine names the files it reads next (`Runtime::read_soon`).
//! When a file was found not in memory since it was last told (by a read,
//! whose first `read` is asked not to wait, `RWF_NOWAIT`; or by this
//! thread), a thread of its own opens each file named, as a read opens it,
//! and where a one-byte read that does not wait finds it not in memory,
//! asks the kernel to read it (`POSIX_FADV_WILLNEED`), which does not wait
//! either: the disk then has many reads at once (4.6 s for the same 200,000
//! keys). The thread's own finds count: the files it read ahead are read
//! warm, and the reads alone would turn it off every other batch. Where
//! every file is in memory, nothing is asked past a life's first two
//! batches: opening each file twice would cost a warm start's CPU for
//! nothing. A batch not asked for by that rule is still handed to the
//! thread as a probe: it looks at its first [`PROBE_FILES`] files, and
//! reads the whole batch ahead only if one of them is not in memory. A
//! scan after a quiet time (lost events, a rescan hours after the start)
//! then has its first files read ahead too, where the reads, all warm
//! since the last batch, could not tell (its first two batches, 10,000
//! names, were read one after another).
//!
//! It is a hint: a batch the thread has no room for is dropped, a file that
//! cannot be opened is left to the read, which tells what it finds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;

use super::Pki;
use crate::core::Folder;

/// Batches waiting for the thread: the one it reads ahead and the next.
const QUEUED: usize = 2;
/// Batches asked for whatever the reads found: a life's first, before any
/// read could tell.
const FIRST_BATCHES: u32 = 2;
/// Files of a batch the rule did not ask for that the thread looks at:
/// when none of them is found not in memory, it reads no further.
pub const PROBE_FILES: usize = 32;

/// Files named for the thread, and whether only to probe them.
struct Batch {
    files: Vec<(Folder, String)>,
    probe: bool,
}

pub struct ReadAhead {
    pki: Arc<Pki>,
    to: Option<SyncSender<Batch>>,
    /// Batches the thread finished (read ahead, or probed and left).
    finished: Arc<AtomicU64>,
    /// The reads that had found a file not in memory when last told.
    cold_seen: u64,
    batches: u32,
    /// The thread could not be started: not tried again.
    no_thread: bool,
}

impl ReadAhead {
    pub fn new(pki: Arc<Pki>) -> ReadAhead {
        ReadAhead { pki, to: None, finished: Arc::default(), cold_seen: 0, batches: 0, no_thread: false }
    }

    /// The files read next, in order: read ahead when a file was found not
    /// in memory since the last call, else probed ([`PROBE_FILES`]).
    /// Returns whether they were wanted (handed to the thread to read
    /// ahead, or dropped while it has no room), not only probed.
    pub fn soon(&mut self, files: &[(Folder, &str)]) -> bool {
        let cold = self.pki.cold.found() + self.pki.cold.found_ahead();
        let wanted = cold != self.cold_seen || self.batches < FIRST_BATCHES;
        self.cold_seen = cold;
        if files.is_empty() {
            return false;
        }
        if wanted {
            self.batches = self.batches.saturating_add(1);
        }
        let batch =
            Batch { files: files.iter().map(|&(folder, name)| (folder, name.to_string())).collect(), probe: !wanted };
        if self.to.is_none() && !self.no_thread {
            self.to = spawn(self.pki.clone(), self.finished.clone());
            self.no_thread = self.to.is_none();
        }
        if let Some(to) = &self.to {
            if let Err(TrySendError::Disconnected(_)) = to.try_send(batch) {
                self.to = None;
            }
        }
        wanted
    }

    /// How many batches the thread finished.
    #[cfg(test)]
    fn finished(&self) -> u64 {
        self.finished.load(Ordering::Relaxed)
    }
}

/// The thread, ended when its [`ReadAhead`] is dropped. `None` when it
/// cannot be started: files are then read as they come.
fn spawn(pki: Arc<Pki>, finished: Arc<AtomicU64>) -> Option<SyncSender<Batch>> {
    let (to, from) = mpsc::sync_channel(QUEUED);
    match std::thread::Builder::new().name("keysync-read-ahead".into()).spawn(move || run(&pki, &from, &finished)) {
        Ok(_) => Some(to),
        Err(e) => {
            tracing::debug!(error = %e, "no thread to read key files ahead: they are read as they come");
            None
        }
    }
}

fn run(pki: &Pki, from: &Receiver<Batch>, finished: &AtomicU64) {
    while let Ok(Batch { files, probe }) = from.recv() {
        // A probe reads on past its first files only when one was not in memory.
        let (mut opened, mut cold) = (0, false);
        for (folder, name) in files {
            if probe && !cold && opened == PROBE_FILES {
                break;
            }
            if let Some(found_cold) = pki.read_ahead(folder, &name) {
                opened += 1;
                cold |= found_cold;
            }
        }
        finished.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::fd::AsFd;
    use std::path::Path;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::core::Slot;
    use keysync_machine::testkit::PUB;

    /// A folder on the disk: a tmpfs `/tmp` keeps every page in memory.
    fn on_disk() -> tempfile::TempDir {
        tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap()
    }

    /// Whether any of `path`'s pages is in memory, as `fincore` (util-linux)
    /// tells: it looks without reading, where a read asked not to wait
    /// would start reading the file.
    fn in_memory(path: &Path) -> bool {
        let out = std::process::Command::new("fincore")
            .args(["--raw", "--noheadings", "--output", "PAGES"])
            .arg(path)
            .output()
            .expect("fincore (util-linux)");
        assert!(out.status.success(), "fincore: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim() != "0"
    }

    /// Drops `path`'s pages from memory (written out first): its next read
    /// waits for the disk. Asked again while a page stays (one the kernel
    /// held a moment).
    fn evict(path: &Path) {
        let file = fs::File::open(path).unwrap();
        file.sync_all().unwrap();
        let asked = Instant::now();
        while in_memory(path) {
            assert!(asked.elapsed() < Duration::from_secs(60), "{} stays in memory", path.display());
            rustix::fs::fadvise(file.as_fd(), 0, None, rustix::fs::Advice::DontNeed).unwrap();
        }
    }

    /// Asked, the thread has the kernel read a file that nothing else
    /// reads; a read of a file not in memory reads it all the same. (Whether
    /// that read is counted as one that waited is the kernel's to say: a
    /// read asked not to wait starts the disk's read, and on a loaded
    /// machine finds it done often enough. The rule the counts drive is
    /// checked below with counts set by hand.)
    #[test]
    fn a_file_named_is_read_ahead_and_one_not_in_memory_is_read_all_the_same() {
        let dir = on_disk();
        let pki = Arc::new(super::super::tests::open(dir.path()));
        let path = dir.path().join("minions/web01");
        fs::write(&path, PUB).unwrap();
        evict(&path);
        assert!(matches!(pki.read_slot(Folder::Accepted, "web01"), Slot::Key(key) if key.bytes() == PUB.as_bytes()));
        assert!(pki.cold.found() <= 1);

        evict(&path);
        let mut ahead = ReadAhead::new(pki.clone());
        assert!(ahead.soon(&[(Folder::Accepted, "web01"), (Folder::Accepted, "web02")]), "a first batch");
        // Only the thread reads it; in memory once the disk answered.
        let asked = Instant::now();
        while !in_memory(&path) {
            assert!(asked.elapsed() < Duration::from_secs(120), "never read ahead");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(pki.cold.found() <= 1, "reading ahead is no read of the agent's");
    }

    /// What a read refuses before reading a byte is not read ahead: a
    /// symbolic link, a second name of a file, a file over the cap, a master
    /// key's name; a FIFO is opened without waiting and passed over.
    #[test]
    fn what_a_read_refuses_is_not_read_ahead() {
        let dir = on_disk();
        let pki = super::super::tests::open(dir.path());
        let outside = dir.path().join("outside");
        fs::write(&outside, PUB).unwrap();
        std::os::unix::fs::symlink(&outside, dir.path().join("minions/link")).unwrap();
        fs::hard_link(&outside, dir.path().join("minions/linked")).unwrap();
        let big = dir.path().join("minions/big");
        fs::write(&big, vec![b'x'; crate::core::keyfile::MAX_KEY_BYTES + 1]).unwrap();
        let master = dir.path().join("minions/master.pub");
        fs::write(&master, PUB).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            dir.path().join("minions/fifo").as_path(),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        for path in [&outside, &big, &master] {
            evict(path);
        }
        for name in ["link", "linked", "big", "master.pub", "fifo", "absent"] {
            pki.read_ahead(Folder::Accepted, name);
        }
        assert_eq!(pki.cold.found_ahead(), 0, "none of them was opened and read");
        for path in [&outside, &big, &master] {
            assert!(!in_memory(path), "{} was not asked for", path.display());
        }
        // The control: a key file like the others is.
        let key = dir.path().join("minions/web01");
        fs::write(&key, PUB).unwrap();
        evict(&key);
        pki.read_ahead(Folder::Accepted, "web01");
        let asked = Instant::now();
        while !in_memory(&key) {
            assert!(asked.elapsed() < Duration::from_secs(120), "never read ahead");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until the thread finished `n` batches.
    fn wait_finished(ahead: &ReadAhead, n: u64) {
        let asked = Instant::now();
        while ahead.finished() < n {
            assert!(asked.elapsed() < Duration::from_secs(120), "{} batches of {n} finished", ahead.finished());
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A batch the rule does not ask for (no file found not in memory since
    /// the last one, as after a quiet time) is probed: read ahead whole when
    /// one of its first files is not in memory, left after its first
    /// [`PROBE_FILES`] when every one of them is.
    #[test]
    fn a_batch_not_asked_for_is_read_ahead_when_its_first_files_are_not_in_memory() {
        let dir = on_disk();
        let pki = Arc::new(super::super::tests::open(dir.path()));
        let names: Vec<String> = (0..PROBE_FILES + 8).map(|i| format!("web{i:03}")).collect();
        let paths: Vec<std::path::PathBuf> = names.iter().map(|name| dir.path().join("minions").join(name)).collect();
        for path in &paths {
            fs::write(path, PUB).unwrap();
        }
        let files: Vec<(Folder, &str)> = names.iter().map(|name| (Folder::Accepted, name.as_str())).collect();
        let mut ahead = ReadAhead::new(pki.clone());
        let absent = [(Folder::Accepted, "absent")];
        assert!(ahead.soon(&absent) && ahead.soon(&absent), "the first two batches");
        wait_finished(&ahead, 2);

        // Every file on the disk only, nothing read since the last batch.
        for path in &paths {
            evict(path);
        }
        assert!(!ahead.soon(&files), "no file found not in memory since the last batch");
        let last = paths.last().unwrap();
        let asked = Instant::now();
        while !in_memory(last) {
            assert!(asked.elapsed() < Duration::from_secs(120), "the batch probed was never read ahead");
            std::thread::sleep(Duration::from_millis(5));
        }
        wait_finished(&ahead, 3);
        assert_eq!(pki.cold.found(), 0, "the agent read nothing");

        // Its first files in memory, the others not: left after the first.
        for path in &paths[..PROBE_FILES] {
            fs::read(path).unwrap();
        }
        for path in &paths[PROBE_FILES..] {
            evict(path);
        }
        assert!(!ahead.soon(&[]), "nothing named (the probe's finds counted)");
        assert!(!ahead.soon(&files), "no file found not in memory since the last batch");
        wait_finished(&ahead, 4);
        for path in &paths[PROBE_FILES..] {
            assert!(!in_memory(path), "{} was read ahead past the probe", path.display());
        }
    }

    /// Past a life's first two batches, a batch is read ahead when a file
    /// was found not in memory since the last, by a read or by reading
    /// ahead: warm reads ask for nothing.
    #[test]
    fn files_are_read_ahead_only_while_files_are_found_not_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Arc::new(super::super::tests::open(dir.path()));
        let mut ahead = ReadAhead::new(pki.clone());
        let absent = [(Folder::Accepted, "web02")];
        assert!(ahead.soon(&absent) && ahead.soon(&absent), "the first two batches");
        assert!(!ahead.soon(&absent), "no file found not in memory since");
        assert!(!ahead.soon(&[]), "nothing named");

        pki.cold.found.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        assert!(!ahead.soon(&[]), "nothing named");
        pki.cold.found.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        assert!(ahead.soon(&absent), "a read waited for the disk");
        assert!(!ahead.soon(&absent), "none since");

        // The files read ahead are read warm: what reading ahead finds counts.
        pki.cold.ahead.fetch_add(3, std::sync::atomic::Ordering::Relaxed);
        assert!(ahead.soon(&absent), "reading ahead found files not in memory");
        assert!(!ahead.soon(&absent), "none since");
    }
}
