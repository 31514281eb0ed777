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
//! every file is in memory, nothing is read ahead past a life's first two
//! batches: opening each file twice would cost a warm start's CPU for
//! nothing.
//!
//! A scan after a quiet time (after lost events, a rescan hours after the
//! start) would start cold with nothing to tell it: the reads since the
//! last batch were all warm, and its first two batches (10,000 names) were
//! read one after another. So the first batch named after a quiet second
//! that the rule does not ask for is handed to the thread as a probe: it
//! opens the batch's files in order until [`PROBE_FILES`] have opened (or
//! three times as many names were looked at), and reads the whole batch
//! ahead if one of them, or a read of the agent's meanwhile, found a file
//! not in memory. What it finds counts for the batches after it.
//!
//! It is a hint: a batch the thread has no room for is dropped, a file that
//! cannot be opened is left to the read, which tells what it finds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Pki;
use crate::core::Folder;

/// Batches waiting for the thread: the one it reads ahead and the next.
const QUEUED: usize = 2;
/// Batches asked for whatever the reads found: a life's first, before any
/// read could tell.
const FIRST_BATCHES: u32 = 2;
/// Files of a probed batch the thread opens: when none of them is found
/// not in memory, it reads no further.
const PROBE_FILES: usize = 32;
/// Names of a probed batch the thread looks at, at most (a name named in
/// all three folders is in one, or none after a mass delete).
const PROBE_NAMES: usize = 3 * PROBE_FILES;
/// How long no batch was named before one is probed.
const QUIET: Duration = Duration::from_secs(1);

/// Files named for the thread; a probe's, with the agent's reads that had
/// found a file not in memory when it was handed over.
struct Batch {
    files: Vec<(Folder, String)>,
    probe: Option<u64>,
}

/// What [`ReadAhead::soon`] made of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asked {
    /// Nothing: no file was found not in memory since the last batch, and
    /// no probe is due (named within a quiet second of the last batch,
    /// `RWF_NOWAIT` cannot tell, or nothing named).
    Nothing,
    /// Probed: read ahead whole only where its first files are not in memory.
    Probe,
    /// Read ahead (or dropped while the thread has no room).
    Whole,
}

pub struct ReadAhead {
    pki: Arc<Pki>,
    to: Option<SyncSender<Batch>>,
    /// Batches the thread finished (read ahead, or probed and left).
    finished: Arc<AtomicU64>,
    /// The reads that had found a file not in memory when last told.
    cold_seen: u64,
    batches: u32,
    /// When a batch was last named.
    last: Option<Instant>,
    /// [`QUIET`] (shorter in tests).
    quiet: Duration,
    /// The thread could not be started: not tried again.
    no_thread: bool,
}

impl ReadAhead {
    pub fn new(pki: Arc<Pki>) -> ReadAhead {
        ReadAhead {
            pki,
            to: None,
            finished: Arc::default(),
            cold_seen: 0,
            batches: 0,
            last: None,
            quiet: QUIET,
            no_thread: false,
        }
    }

    /// The files read next, in order: read ahead when a file was found not
    /// in memory since the last call; else, the first named after a quiet
    /// second, probed (see the module's doc). Says which.
    pub fn soon(&mut self, files: &[(Folder, &str)]) -> Asked {
        let cold = self.pki.cold.found() + self.pki.cold.found_ahead();
        let wanted = cold != self.cold_seen || self.batches < FIRST_BATCHES;
        self.cold_seen = cold;
        let now = Instant::now();
        let after_quiet = self.last.is_none_or(|last| now.duration_since(last) >= self.quiet);
        self.last = Some(now);
        // Where a read cannot tell a file not in memory, nor can a probe.
        let asked = match (wanted, after_quiet && self.pki.cold.tells()) {
            _ if files.is_empty() => Asked::Nothing,
            (true, _) => Asked::Whole,
            (false, true) => Asked::Probe,
            (false, false) => Asked::Nothing,
        };
        if asked == Asked::Nothing {
            return asked;
        }
        if wanted {
            self.batches = self.batches.saturating_add(1);
        }
        let probe = (asked == Asked::Probe).then(|| self.pki.cold.found());
        let batch = Batch { files: files.iter().map(|&(folder, name)| (folder, name.to_string())).collect(), probe };
        if self.to.is_none() && !self.no_thread {
            self.to = spawn(self.pki.clone(), self.finished.clone());
            self.no_thread = self.to.is_none();
        }
        if let Some(to) = &self.to {
            if let Err(TrySendError::Disconnected(_)) = to.try_send(batch) {
                self.to = None;
            }
        }
        asked
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
        // A probe reads on past its first files only when one was found not
        // in memory, by this thread or by the agent's reads meanwhile (the
        // core reads the batch's first files as this thread looks at them).
        let (mut opened, mut looked, mut cold) = (0, 0, false);
        for (folder, name) in files {
            if let Some(found) = probe {
                cold |= pki.cold.found() != found;
                if !cold && (opened == PROBE_FILES || looked == PROBE_NAMES) {
                    break;
                }
            }
            looked += 1;
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
        assert_eq!(
            ahead.soon(&[(Folder::Accepted, "web01"), (Folder::Accepted, "web02")]),
            Asked::Whole,
            "a first batch"
        );
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

    /// The first batch named after a quiet time that the rule does not ask
    /// for (no file found not in memory since the last one) is probed: read
    /// ahead whole when one of its first files is not in memory, left after
    /// its first [`PROBE_FILES`] files when every one of them is, or after
    /// [`PROBE_NAMES`] names; within the quiet time, not even probed.
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
        ahead.quiet = Duration::ZERO;
        let absent = [(Folder::Accepted, "absent")];
        assert_eq!(ahead.soon(&absent), Asked::Whole, "a first batch");
        assert_eq!(ahead.soon(&absent), Asked::Whole, "a second batch");
        wait_finished(&ahead, 2);

        // Every file on the disk only, nothing read since the last batch.
        for path in &paths {
            evict(path);
        }
        assert_eq!(ahead.soon(&files), Asked::Probe, "no file found not in memory since the last batch");
        let asked = Instant::now();
        while !paths.iter().all(|path| in_memory(path)) {
            assert!(asked.elapsed() < Duration::from_secs(120), "the batch probed was never read ahead whole");
            std::thread::sleep(Duration::from_millis(5));
        }
        wait_finished(&ahead, 3);
        assert_eq!(pki.cold.found(), 0, "the agent read nothing");

        // Its first files in memory, the others not: left after the first.
        for path in &paths[PROBE_FILES..] {
            evict(path);
        }
        assert_eq!(ahead.soon(&[]), Asked::Nothing, "nothing named (the probe's finds counted)");
        assert_eq!(ahead.soon(&files), Asked::Probe);
        wait_finished(&ahead, 4);
        for path in &paths[PROBE_FILES..] {
            assert!(!in_memory(path), "{} was read ahead past the probe", path.display());
        }

        // Names that open nothing (a mass delete's): left after as many.
        let gone: Vec<String> = (0..PROBE_NAMES).map(|i| format!("gone{i:03}")).collect();
        let batch: Vec<(Folder, &str)> =
            gone.iter().map(|name| (Folder::Accepted, name.as_str())).chain(files.iter().copied()).collect();
        for path in &paths {
            evict(path);
        }
        assert_eq!(ahead.soon(&batch), Asked::Probe);
        wait_finished(&ahead, 5);
        for path in &paths {
            assert!(!in_memory(path), "{} was read ahead past the names probed", path.display());
        }

        // Within the quiet time: nothing asked, the files left to the reads.
        ahead.quiet = Duration::from_secs(3600);
        assert_eq!(ahead.soon(&files), Asked::Nothing, "named within the quiet time");
    }

    /// Past a life's first two batches, a batch is read ahead when a file
    /// was found not in memory since the last, by a read or by reading
    /// ahead: within the quiet time, warm reads ask for nothing.
    #[test]
    fn files_are_read_ahead_only_while_files_are_found_not_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Arc::new(super::super::tests::open(dir.path()));
        let mut ahead = ReadAhead::new(pki.clone());
        ahead.quiet = Duration::from_secs(3600);
        let absent = [(Folder::Accepted, "web02")];
        assert_eq!(ahead.soon(&absent), Asked::Whole, "a first batch");
        assert_eq!(ahead.soon(&absent), Asked::Whole, "a second batch");
        assert_eq!(ahead.soon(&absent), Asked::Nothing, "no file found not in memory since");
        assert_eq!(ahead.soon(&[]), Asked::Nothing, "nothing named");

        pki.cold.found.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(ahead.soon(&[]), Asked::Nothing, "nothing named");
        pki.cold.found.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(ahead.soon(&absent), Asked::Whole, "a read waited for the disk");
        assert_eq!(ahead.soon(&absent), Asked::Nothing, "none since");

        // The files read ahead are read warm: what reading ahead finds counts.
        pki.cold.ahead.fetch_add(3, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(ahead.soon(&absent), Asked::Whole, "reading ahead found files not in memory");
        assert_eq!(ahead.soon(&absent), Asked::Nothing, "none since");
    }
}
