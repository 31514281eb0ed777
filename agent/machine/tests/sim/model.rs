//! The masters' key folders and what Salt does to them: the operator's steps for one `salt-key`
//! run (3006 and 3008 patterns) and the master writing a pending key.

use std::collections::{BTreeMap, BTreeSet};

use keysync_machine::core::keyfile::check_public_key;
use keysync_machine::core::observe::{FileToken, Refusal};
use keysync_machine::core::settle::FsChange;
use keysync_machine::core::{Folder, PublicKey, Slot, Slots, Verdict};

/// splitmix64: small, seedable, and the same on every platform.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    pub(crate) fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }

    pub(crate) fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }
}

/// A valid PEM public key per id and variant. Variant 3 is variant 0 without its trailing
/// newline: the same key to a human, another fingerprint to Salt 3008.
pub(crate) fn key_bytes(id: &str, variant: u64) -> Vec<u8> {
    const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut rng = Rng(id.bytes().fold(variant % 3, |h, b| h.wrapping_mul(131).wrapping_add(u64::from(b))));
    let mut pem = String::from("-----BEGIN PUBLIC KEY-----\n");
    for _ in 0..4 {
        pem.extend((0..64).map(|_| char::from(B64[rng.index(B64.len())])));
        pem.push('\n');
    }
    pem.push_str("-----END PUBLIC KEY-----\n");
    if variant == 3 {
        pem.pop();
    }
    pem.into_bytes()
}

/// One master's `minions/`, `minions_pre/` and `minions_rejected/`: each file's bytes, how
/// the driver reads them (every byte checked, as it will be; computed once per write), and
/// its generation, new at each write as an inode's change time is (its [`FileToken`]).
#[derive(Clone, Debug, Default)]
pub(crate) struct Disk {
    pub(crate) files: BTreeMap<(String, Folder), (Vec<u8>, Slot, u64)>,
    writes: u64,
}

impl Disk {
    pub(crate) fn get(&self, folder: Folder, name: &str) -> Option<&Vec<u8>> {
        self.files.get(&(name.to_string(), folder)).map(|(bytes, _, _)| bytes)
    }

    pub(crate) fn has(&self, folder: Folder, name: &str) -> bool {
        self.get(folder, name).is_some()
    }

    pub(crate) fn slots(&self, name: &str) -> Slots {
        Slots::read(|folder| self.slot(folder, name))
    }

    pub(crate) fn slot(&self, folder: Folder, name: &str) -> Slot {
        self.files.get(&(name.to_string(), folder)).map_or(Slot::Absent, |(_, slot, _)| slot.clone())
    }

    /// The token of a key file: its folder and generation.
    pub(crate) fn token(&self, folder: Folder, name: &str) -> Option<FileToken> {
        match self.files.get(&(name.to_string(), folder))? {
            (_, Slot::Key(_), made) => Some(FileToken::new(folder, made << 2)),
            _ => None,
        }
    }

    /// The id's slots and the token of its one key file, as the agent reads them.
    pub(crate) fn slots_token(&self, name: &str) -> (Slots, Option<FileToken>) {
        let slots = self.slots(name);
        let token = slots.only_key(|folder| self.token(folder, name));
        (slots, token)
    }

    pub(crate) fn names(&self) -> BTreeSet<String> {
        self.files.keys().map(|(name, _)| name.clone()).collect()
    }

    pub(crate) fn change(&mut self, change: &Change) {
        match change {
            Change::Put(folder, name, bytes) => {
                self.writes += 1;
                self.files.insert((name.clone(), *folder), (bytes.clone(), read_key_file(bytes), self.writes));
            }
            Change::Remove(folder, name) => {
                self.files.remove(&(name.clone(), *folder));
            }
        }
    }
}

/// The driver's check of a key file's bytes, memoised: a run writes the same few hundred
/// byte strings thousands of times, and the check is slow in debug builds.
pub(crate) fn read_key_file(bytes: &[u8]) -> Slot {
    thread_local! {
        static CHECKED: std::cell::RefCell<BTreeMap<Vec<u8>, Slot>> = const { std::cell::RefCell::new(BTreeMap::new()) };
    }
    CHECKED.with_borrow_mut(|checked| {
        let slot = checked.entry(bytes.to_vec()).or_insert_with(|| match check_public_key(bytes) {
            Ok(()) => Slot::Key(PublicKey::new(bytes.to_vec())),
            Err(e) => Slot::Refused(Refusal::Content(e)),
        });
        slot.clone()
    })
}

#[derive(Clone, Debug)]
pub(crate) enum Change {
    Put(Folder, String, Vec<u8>),
    Remove(Folder, String),
}

/// One system call: its effect on the folders and the inotify events it raises.
#[derive(Clone, Debug, Default)]
pub(crate) struct Step {
    pub(crate) changes: Vec<Change>,
    pub(crate) events: Vec<(Folder, String, FsChange)>,
    /// Milliseconds after the previous step of the same run.
    pub(crate) after_ms: u64,
}

impl Step {
    pub(crate) fn write(folder: Folder, name: &str, bytes: Vec<u8>) -> Step {
        let changes = vec![Change::Put(folder, name.into(), bytes)];
        Step { changes, events: vec![(folder, name.into(), FsChange::Written)], after_ms: 0 }
    }

    pub(crate) fn close(folder: Folder, name: &str) -> Step {
        Step { events: vec![(folder, name.into(), FsChange::Closed)], ..Step::default() }
    }

    pub(crate) fn unlink(folder: Folder, name: &str) -> Step {
        let changes = vec![Change::Remove(folder, name.into())];
        Step { changes, events: vec![(folder, name.into(), FsChange::Gone)], after_ms: 0 }
    }

    pub(crate) fn rename(from: Folder, from_name: &str, to: Folder, to_name: &str, bytes: Vec<u8>) -> Step {
        Step {
            changes: vec![Change::Remove(from, from_name.into()), Change::Put(to, to_name.into(), bytes)],
            events: vec![(from, from_name.into(), FsChange::Gone), (to, to_name.into(), FsChange::MovedIn)],
            after_ms: 0,
        }
    }

    pub(crate) fn after(self, after_ms: u64) -> Step {
        Step { after_ms, ..self }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Salt {
    /// `salt-key -a/-r` renames between folders.
    V3006,
    /// `salt-key -a/-r` removes the id everywhere, then renames a `tmpXXXXXXXX` file into place.
    V3008,
}

/// What the first reading of an id after an operator touched it may decide.
#[derive(Clone, Debug)]
pub(crate) enum Expect {
    /// A new pending key: never a decision.
    Nothing,
    /// Accept, reject or delete: this verdict or nothing (if already held), never an intermediate one.
    AtMost(Verdict),
}

/// Plans one `salt-key` run or one pending key written by the master, from the folders as they are.
pub(crate) fn plan_operator(
    disk: &Disk,
    id: &str,
    salt: Salt,
    rng: &mut Rng,
) -> Option<(&'static str, Vec<Step>, Expect)> {
    use Folder::*;
    let present: Vec<Folder> = Folder::ALL.into_iter().filter(|&f| disk.has(f, id)).collect();
    let roll = rng.below(100);
    if roll < 35 {
        // The master writes a new pending key in place; it never does for an accepted or rejected id.
        if disk.has(Accepted, id) || disk.has(Rejected, id) {
            return None;
        }
        let bytes = key_bytes(id, rng.below(4));
        let half = bytes[..bytes.len() / 2].to_vec();
        // Quicker than the settler's write grace between writes, as the master's auth is.
        let steps = vec![
            Step::write(Pending, id, vec![]),
            Step::write(Pending, id, half).after(rng.between(0, 10)),
            Step::write(Pending, id, bytes).after(rng.between(0, 10)),
            Step::close(Pending, id).after(rng.between(0, 10)),
        ];
        return Some(("new pending key", steps, Expect::Nothing));
    }
    if roll < 40 && present.len() == 1 && matches!(present[0], Accepted | Rejected) {
        // An operator copies another key over a decided one by hand (`cp`
        // truncates and writes in place): the file changes, its name and
        // folder do not. Salt never does; a scan that took the file for the
        // one it read before would miss it.
        let folder = present[0];
        let bytes = key_bytes(id, rng.below(4));
        if disk.get(folder, id) == Some(&bytes) {
            return None;
        }
        let key = PublicKey::new(bytes.clone());
        let verdict = if folder == Accepted { Verdict::Accepted(key) } else { Verdict::Rejected(key) };
        let steps = vec![
            Step::write(folder, id, vec![]),
            Step::write(folder, id, bytes).after(rng.between(0, 10)),
            Step::close(folder, id).after(rng.between(0, 10)),
        ];
        return Some(("key copied over in place", steps, Expect::AtMost(verdict)));
    }
    if roll >= 80 {
        let steps: Vec<Step> = present.iter().map(|&f| Step::unlink(f, id).after(rng.between(0, 2))).collect();
        return (!steps.is_empty()).then_some(("delete", steps, Expect::AtMost(Verdict::Deleted)));
    }
    // Accept or reject a pending key, or (--include-rejected / --include-accepted) the other decided one.
    let (what, target, other) = if roll < 65 { ("accept", Accepted, Rejected) } else { ("reject", Rejected, Accepted) };
    let source = if disk.has(Pending, id) {
        Pending
    } else if disk.has(other, id) && rng.percent(50) {
        other
    } else {
        return None;
    };
    let bytes = disk.get(source, id)?.clone();
    let key = PublicKey::new(bytes.clone());
    let verdict = if target == Accepted { Verdict::Accepted(key) } else { Verdict::Rejected(key) };
    let steps = match salt {
        Salt::V3006 => vec![Step::rename(source, id, target, id, bytes)],
        Salt::V3008 => {
            // The removals and mkstemp follow each other at once; writing, closing and renaming
            // the temporary file can be slow (a loaded master), with the key in no folder meanwhile.
            let mut steps: Vec<Step> = present.iter().map(|&f| Step::unlink(f, id).after(rng.between(0, 2))).collect();
            let tmp = tmp_name(disk, target, rng);
            steps.push(Step::write(target, &tmp, vec![]).after(rng.between(0, 2)));
            let slow = rng.percent(25);
            let mut pause = || if slow { rng.between(0, 400) } else { rng.between(0, 3) };
            let (write_after, close_after, rename_after) = (pause(), pause(), pause());
            steps.push(Step::write(target, &tmp, bytes.clone()).after(write_after));
            steps.push(Step::close(target, &tmp).after(close_after));
            steps.push(Step::rename(target, &tmp, target, id, bytes).after(rename_after));
            steps
        }
    };
    Some((what, steps, Expect::AtMost(verdict)))
}

/// `mkstemp(dir=folder)`: "tmp" and eight characters of `[a-z0-9_]`, unused in that folder.
pub(crate) fn tmp_name(disk: &Disk, folder: Folder, rng: &mut Rng) -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789_";
    loop {
        let name: String = "tmp".chars().chain((0..8).map(|_| char::from(CHARS[rng.index(CHARS.len())]))).collect();
        if !disk.has(folder, &name) {
            return name;
        }
    }
}
