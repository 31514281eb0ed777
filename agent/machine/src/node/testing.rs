//! An in-memory [`Runtime`] for tests (feature `testkit`): three folders of
//! files, a store, the journal, and everything told and sent, recorded.
//! Effects can be made to fail. The simulation builds on it.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::PeerName;

use crate::core::keyfile::check_public_key;
use crate::core::merge::Conflict;
use crate::core::observe::{FileToken, Refusal, Slot};
use crate::core::settle::FsChange;
use crate::core::{Decision, Entry, Folder, MinionId, PublicKey, Seen, Verdict, Version};

use super::event::Event;
use super::runtime::{Applied, Failure, Listing, Runtime, StoreWrite};

/// A master's three key folders: `(folder, name)` → file bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Folders {
    pub files: BTreeMap<(Folder, String), Vec<u8>>,
}

impl Folders {
    pub fn put(&mut self, folder: Folder, name: &str, bytes: &[u8]) {
        self.files.insert((folder, name.to_string()), bytes.to_vec());
    }

    pub fn remove(&mut self, folder: Folder, name: &str) -> bool {
        self.files.remove(&(folder, name.to_string())).is_some()
    }

    pub fn get(&self, folder: Folder, name: &str) -> Option<&Vec<u8>> {
        self.files.get(&(folder, name.to_string()))
    }

    /// What the agent reads for one id in one folder.
    pub fn slot(&self, folder: Folder, name: &str) -> Slot {
        match self.get(folder, name) {
            None => Slot::Absent,
            Some(bytes) => match check_public_key(bytes) {
                Ok(()) => Slot::Key(PublicKey::new(bytes.as_slice())),
                Err(e) => Slot::Refused(Refusal::Content(e)),
            },
        }
    }

    /// Every file in the folders (dot files left out).
    pub fn list(&self) -> Vec<(Folder, String)> {
        self.files.keys().filter(|(_, name)| !name.starts_with('.')).cloned().collect()
    }

    /// Makes the folders say `decision`, as the agent's pki does; returns
    /// what it changed.
    pub fn apply(&mut self, decision: &Decision) -> Applied {
        let id = decision.id.as_str();
        let mut applied = Applied::default();
        let target = match &decision.verdict {
            Verdict::Accepted(_) => Some(Folder::Accepted),
            Verdict::Rejected(_) => Some(Folder::Rejected),
            Verdict::Deleted => None,
        };
        if let (Some(folder), Some(key)) = (target, decision.verdict.key()) {
            match self.get(Folder::Pending, id).cloned() {
                // The pending file holding the decided key is moved into place.
                Some(bytes) if bytes == key.bytes() => {
                    self.remove(Folder::Pending, id);
                    applied.changes.push((Folder::Pending, FsChange::Gone));
                }
                Some(bytes) if check_public_key(&bytes).is_ok() => {
                    applied.discarded_pending = Some(PublicKey::new(bytes.as_slice()));
                }
                _ => {}
            }
            self.put(folder, id, key.bytes());
            applied.changes.push((folder, FsChange::MovedIn));
        }
        for folder in Folder::ALL {
            if Some(folder) != target && self.remove(folder, id) {
                applied.changes.push((folder, FsChange::Gone));
            }
        }
        applied
    }
}

/// Which effect fails next (each `true` fails every call until cleared).
#[derive(Clone, Debug, Default)]
pub struct Faults {
    pub apply: bool,
    pub sync: bool,
    pub journal: bool,
    pub record: bool,
    /// Store commits that succeed before every later one fails.
    pub records_before_failing: Option<u32>,
    /// Plain tombstones cannot be read back from the store.
    pub load_cold: bool,
    /// A folder refused (replaced by something the agent will not use):
    /// left out of the listing, each of its files read as refused.
    pub refused_folder: Option<Folder>,
}

/// A state store in memory: what the agent's redb store keeps.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    /// Per id, the decision held (with its key), the other decisions seen
    /// and this master's own claim.
    pub decisions: BTreeMap<MinionId, Stored>,
    /// Claims known and not held, with their keys.
    pub claims: BTreeMap<(MinionId, Version), Decision>,
    pub journal: BTreeMap<MinionId, Decision>,
    pub clock: u64,
    pub initialized: bool,
    /// Conflicts kept until told.
    pub untold: Vec<(PeerName, Conflict)>,
    /// Peers' deletes the guard holds.
    pub held: BTreeMap<MinionId, super::HeldDelete>,
    /// The last completed comparison with a peer (`stale.rs`).
    pub last_contact_ms: Option<u64>,
    /// Per origin, when the newest delete compacted was made.
    pub forgot: Vec<(Arc<str>, u64)>,
    /// When the store started afresh (see [`super::Loaded::afresh`]).
    pub afresh: u64,
    /// Keys put back whose files may not be written yet.
    pub putting_back: Vec<MinionId>,
}

/// What the store keeps for one id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub held: Decision,
    pub seen: Vec<Seen>,
    pub mine: Option<Version>,
}

impl Stored {
    pub fn entry(&self) -> Entry {
        self.held.entry().with_seen(self.seen.clone()).with_mine(self.mine.clone())
    }

    pub fn is_plain_tombstone(&self) -> bool {
        crate::core::decision::is_plain_tombstone(self.held.verdict.kind(), &self.seen, self.mine.as_ref())
    }
}

/// A decision as a store keeps it: without the agents it was pushed to on
/// its way (`reached`), which only its forwarding needed.
fn unrouted(decision: &Decision) -> Decision {
    Decision { reached: Default::default(), ..decision.clone() }
}

impl MemoryStore {
    /// A new store made at wall-clock `now_ms` (it starts afresh then, as
    /// the agent's store does; [`MemoryStore::default`] says nothing, as a
    /// store of an earlier release).
    pub fn made_at(now_ms: u64) -> MemoryStore {
        MemoryStore { afresh: now_ms << crate::core::version::LOGICAL_BITS, ..MemoryStore::default() }
    }

    /// Notes decisions about to be applied.
    pub fn journal(&mut self, decisions: &[Decision]) {
        for d in decisions {
            self.journal.insert(d.id.clone(), unrouted(d));
        }
    }

    /// One commit, as the agent's store makes it.
    pub fn record(&mut self, write: &StoreWrite<'_>) {
        let mut kept: std::collections::HashMap<&MinionId, &super::Kept> = std::collections::HashMap::new();
        for k in write.kept {
            kept.entry(&k.id).or_insert(k);
        }
        for d in write.decisions {
            let (seen, mine) = kept.get(&d.id).map(|k| (k.seen.clone(), k.mine.clone())).unwrap_or_default();
            let old = self.decisions.insert(d.id.clone(), Stored { held: unrouted(d), seen, mine });
            // A claim no longer held is still known.
            if let Some(old) = old.filter(|old| old.held.version.is_claim() && old.held.version != d.version) {
                self.claims.insert((d.id.clone(), old.held.version.clone()), old.held);
            }
            self.claims.remove(&(d.id.clone(), d.version.clone()));
        }
        for claim in write.claims {
            self.claims.insert((claim.id.clone(), claim.version.clone()), unrouted(claim));
        }
        // Ids whose held decision stays: each kept entry in turn, as the
        // agent's store (an id decided here kept its first, above).
        let decided: std::collections::HashSet<&MinionId> = write.decisions.iter().map(|d| &d.id).collect();
        for k in write.kept.iter().filter(|k| !decided.contains(&k.id)) {
            if let Some(stored) = self.decisions.get_mut(&k.id) {
                stored.seen = k.seen.clone();
                stored.mine = k.mine.clone();
            }
        }
        for id in write.done {
            self.journal.remove(id);
        }
        if write.conflicts_told {
            self.untold.clear();
        }
        for (from, conflict) in write.conflicts {
            // One per id and pair of decisions, as the agent's store keys them.
            let same = |(_, kept): &(PeerName, Conflict)| {
                kept.id == conflict.id
                    && kept.winner.version == conflict.winner.version
                    && kept.loser.version == conflict.loser.version
            };
            match self.untold.iter_mut().find(|kept| same(kept)) {
                Some(kept) => *kept = (from.clone(), conflict.clone()),
                None => self.untold.push((from.clone(), conflict.clone())),
            }
        }
        // Settled after those held: an id both held and settled by one
        // commit is not held (the machine settles only what its guard no
        // longer holds).
        for held in write.held {
            let held = super::HeldDelete { decision: unrouted(&held.decision), ..held.clone() };
            self.held.insert(held.decision.id.clone(), held);
        }
        for id in write.unheld {
            self.held.remove(id);
        }
        self.clock = write.clock;
        self.initialized |= write.initialize;
        if write.contact.is_some() {
            self.last_contact_ms = write.contact;
        }
        if let Some(ids) = write.putting_back {
            self.putting_back = ids.to_vec();
        }
    }

    /// What a start loads from this store.
    pub fn loaded(&self) -> super::Loaded {
        let mut cold = vec![0; crate::core::digest::N_BUCKETS];
        for (id, _) in self.decisions.iter().filter(|(_, s)| s.is_plain_tombstone()) {
            cold[crate::core::digest::bucket_of(id)] += 1;
        }
        super::Loaded {
            entries: self
                .decisions
                .iter()
                .filter(|(_, s)| !s.is_plain_tombstone())
                .map(|(id, s)| (id.clone(), s.entry()))
                .collect(),
            cold,
            journal: self.journal.values().cloned().collect(),
            clock: self.clock,
            initialized: self.initialized,
            untold: self.untold.clone(),
            held: self.held.values().cloned().collect(),
            last_contact_ms: self.last_contact_ms,
            forgot: self.forgot.clone(),
            afresh: self.afresh,
            putting_back: self.putting_back.clone(),
        }
    }

    /// The plain tombstones kept for those of `ids` held.
    pub fn cold(&self, ids: &[MinionId]) -> Vec<(MinionId, Entry)> {
        ids.iter()
            .filter_map(|id| self.decisions.get(id).filter(|s| s.is_plain_tombstone()).map(|s| (id.clone(), s.entry())))
            .collect()
    }

    /// The plain tombstones kept in `buckets`, with their versions.
    pub fn cold_in(&self, buckets: &[u32]) -> Vec<(MinionId, Version)> {
        self.decisions
            .iter()
            .filter(|(id, s)| s.is_plain_tombstone() && buckets.contains(&(crate::core::digest::bucket_of(id) as u32)))
            .map(|(id, s)| (id.clone(), s.held.version.clone()))
            .collect()
    }

    /// Forgets at most `max` plain tombstones issued before `before_ms`,
    /// none journalled or held by the guard.
    pub fn compact(&mut self, before_ms: u64, max: usize) -> Vec<(MinionId, Version)> {
        let old: Vec<(MinionId, Version)> = self.compactable(before_ms).take(max).collect();
        self.forget(&old);
        old
    }

    /// The plain tombstones a compaction may forget: issued before
    /// `before_ms`, none journalled or held by the guard.
    pub fn compactable(&self, before_ms: u64) -> impl Iterator<Item = (MinionId, Version)> + '_ {
        self.decisions
            .iter()
            .filter(move |(id, s)| {
                s.is_plain_tombstone()
                    && s.held.version.millis() < before_ms
                    && !self.journal.contains_key(*id)
                    && !self.held.contains_key(*id)
            })
            .map(|(id, s)| (id.clone(), s.held.version.clone()))
    }

    /// Forgets tombstones a compaction chose, noting per origin the newest.
    pub fn forget(&mut self, compacted: &[(MinionId, Version)]) {
        for (id, version) in compacted {
            self.decisions.remove(id);
            crate::core::version::note_forgotten(&mut self.forgot, &version.node, version.millis());
        }
    }

    /// The decisions held and the claims known, with their keys.
    pub fn get(&self, ids: &[MinionId]) -> Vec<Decision> {
        let mut out = Vec::new();
        for id in ids {
            if let Some(stored) = self.decisions.get(id) {
                out.push(stored.held.clone());
            }
            out.extend(
                self.claims
                    .range((id.clone(), Version::new(0, ""))..)
                    .take_while(|((i, _), _)| i == id)
                    .map(|(_, d)| d.clone()),
            );
        }
        out
    }
}

/// Whether `events` tell `conflict` (same id and the same two decisions).
pub fn tells(events: &[Event], conflict: &Conflict) -> bool {
    events.iter().any(|e| {
        matches!(e, Event::Conflict { conflict: told, .. }
        if told.id == conflict.id && told.winner.same_as(&conflict.winner) && told.loser.same_as(&conflict.loser))
    })
}

/// A runtime that keeps everything in memory and records what it was asked.
#[derive(Debug, Default)]
pub struct Recorder {
    pub folders: Folders,
    pub store: MemoryStore,
    pub events: Vec<Event>,
    /// What was sent, and to whom not.
    pub sent: Vec<(Option<crate::PeerName>, Vec<Decision>)>,
    pub dfn_dropped: u32,
    pub faults: Faults,
    /// Key files read (each folder an id is read in counts one).
    pub files_read: usize,
    /// When set, the files named by [`Runtime::read_soon`] (true) and those
    /// read (false), in order.
    pub read_log: Option<Vec<(bool, Folder, String)>>,
    /// Key files read are given a token ([`FileToken`]), here of their
    /// folder and bytes, as the agent gives one of their inode and change
    /// time; off, none is (each scan reads every file).
    pub file_tokens: bool,
    /// Files asked about with [`Runtime::unchanged`].
    pub files_asked: usize,
}

impl Recorder {
    /// The token of `id`'s file in `folder` (see [`Recorder::file_tokens`]).
    fn token(&self, folder: Folder, id: &MinionId) -> Option<FileToken> {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let bytes = self.folders.get(folder, id.as_str()).filter(|_| self.file_tokens)?;
        let identity = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(bytes);
        Some(FileToken::new(folder, identity))
    }
}

impl Runtime for Recorder {
    fn read_slot(&mut self, folder: Folder, id: &MinionId) -> Slot {
        self.files_read += 1;
        if let Some(log) = &mut self.read_log {
            log.push((false, folder, id.as_str().to_string()));
        }
        match self.faults.refused_folder {
            Some(refused) if refused == folder => Slot::Refused(Refusal::Unreadable("refused folder".to_string())),
            _ => self.folders.slot(folder, id.as_str()),
        }
    }

    fn read_slot_token(&mut self, folder: Folder, id: &MinionId) -> (Slot, Option<FileToken>) {
        let slot = self.read_slot(folder, id);
        let token = if matches!(slot, Slot::Key(_)) { self.token(folder, id) } else { None };
        (slot, token)
    }

    fn unchanged(&mut self, token: FileToken, id: &MinionId) -> bool {
        self.files_asked += 1;
        self.token(token.folder(), id) == Some(token)
    }

    fn read_soon(&mut self, files: &[(Folder, &str)]) {
        if let Some(log) = &mut self.read_log {
            log.extend(files.iter().map(|(folder, name)| (true, *folder, name.to_string())));
        }
    }

    fn list(&mut self) -> Result<Listing, Failure> {
        let refused = self.faults.refused_folder;
        let files = self.folders.list().into_iter().filter(|(folder, _)| Some(*folder) != refused).collect();
        Ok(Listing { files, complete: refused.is_none() })
    }

    fn apply(&mut self, decisions: &[&Decision]) -> Vec<Result<Applied, Failure>> {
        decisions
            .iter()
            .map(|d| {
                if self.faults.apply {
                    Err(Failure::new("No space left on device"))
                } else {
                    Ok(self.folders.apply(d))
                }
            })
            .collect()
    }

    fn sync_folders(&mut self) -> Result<(), Failure> {
        if self.faults.sync {
            return Err(Failure::new("syncfs: Input/output error"));
        }
        Ok(())
    }

    fn drop_dfn(&mut self) -> Result<bool, Failure> {
        self.dfn_dropped += 1;
        Ok(true)
    }

    fn journal(&mut self, decisions: &[Decision]) -> Result<(), Failure> {
        if self.faults.journal {
            return Err(Failure::new("journal: No space left on device"));
        }
        self.store.journal(decisions);
        Ok(())
    }

    fn record(&mut self, write: &StoreWrite<'_>) -> Result<(), Failure> {
        if let Some(n) = &mut self.faults.records_before_failing {
            if *n == 0 {
                return Err(Failure::new("store: No space left on device"));
            }
            *n -= 1;
        }
        if self.faults.record {
            return Err(Failure::new("store: No space left on device"));
        }
        self.store.record(write);
        Ok(())
    }

    fn load(&mut self, ids: &[MinionId]) -> Result<Vec<Decision>, Failure> {
        Ok(self.store.get(ids))
    }

    fn load_cold(&mut self, ids: &[MinionId]) -> Result<Vec<(MinionId, Entry)>, Failure> {
        if self.faults.load_cold {
            return Err(Failure::new("state store: Input/output error"));
        }
        Ok(self.store.cold(ids))
    }

    fn cold_in(&mut self, buckets: &[u32]) -> Result<Vec<(MinionId, Version)>, Failure> {
        Ok(self.store.cold_in(buckets))
    }

    fn compact(&mut self, before_ms: u64, max: usize) -> Result<Vec<(MinionId, Version)>, Failure> {
        Ok(self.store.compact(before_ms, max))
    }

    fn was_told(&mut self, conflict: &Conflict) -> bool {
        tells(&self.events, conflict)
    }

    fn audit(&mut self, event: Event) {
        self.events.push(event);
    }

    fn flush_audit(&mut self) {}

    fn send(&mut self, except: Option<&crate::PeerName>, decisions: Vec<Decision>) {
        self.sent.push((except.cloned(), decisions));
    }
}

/// The store contract's view of the in-memory store: reopening it keeps
/// everything (it models what survives a restart).
impl crate::testkit::store_contract::ContractStore for MemoryStore {
    fn create(now_ms: u64) -> MemoryStore {
        MemoryStore::made_at(now_ms)
    }

    fn journal(&mut self, decisions: &[Decision]) -> Result<(), Failure> {
        MemoryStore::journal(self, decisions);
        Ok(())
    }

    fn record(&mut self, write: &StoreWrite<'_>) -> Result<(), Failure> {
        MemoryStore::record(self, write);
        Ok(())
    }

    fn load(&mut self) -> Result<super::Loaded, Failure> {
        Ok(self.loaded())
    }

    fn get(&mut self, ids: &[MinionId]) -> Result<Vec<Decision>, Failure> {
        Ok(MemoryStore::get(self, ids))
    }

    fn cold(&mut self, ids: &[MinionId]) -> Result<Vec<(MinionId, Entry)>, Failure> {
        Ok(MemoryStore::cold(self, ids))
    }

    fn cold_in(&mut self, buckets: &[u32]) -> Result<Vec<(MinionId, Version)>, Failure> {
        Ok(MemoryStore::cold_in(self, buckets))
    }

    fn compact(&mut self, before_ms: u64, max: usize) -> Result<Vec<(MinionId, Version)>, Failure> {
        Ok(MemoryStore::compact(self, before_ms, max))
    }

    fn set_afresh(&mut self, hlc: u64) -> Result<(), Failure> {
        self.afresh = hlc;
        Ok(())
    }

    fn reopen(&mut self) {}
}

#[cfg(test)]
mod contract {
    crate::store_contract_tests!(super::MemoryStore);
}
