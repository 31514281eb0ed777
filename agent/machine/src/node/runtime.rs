//! What the node machine asks of the world: the effects it needs carried
//! out, each answered at once with its result (corrosion's plum-foca shape).
//! The agent's executor (`salt-keysync`'s `node/`) implements it against the
//! real key folders, redb store, audit log and peer links; the simulation
//! implements it against a simulated world, which can fail or kill the node
//! at any of these calls.

use crate::PeerName;

use crate::core::merge::Conflict;
use crate::core::observe::{FileToken, Slot, Slots};
use crate::core::settle::FsChange;
use crate::core::{Decision, Entry, Folder, MinionId, PublicKey, Seen, Version};

use super::event::Event;

/// Why an effect failed, as the executor words it (an OS error, a store
/// error, and what it was doing): only logged and audited, never parsed. A
/// type of its own, so that no other text (an id, a peer's name, a path)
/// passes for one, and no failure for something else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure(String);

impl Failure {
    /// A failure worded as `why` displays.
    pub fn new(why: impl std::fmt::Display) -> Failure {
        Failure(why.to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What applying a decision to the key folders did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// A pending key that differed from the decided one and was discarded.
    pub discarded_pending: Option<PublicKey>,
    /// The changes made to the id's names in the watched folders, as the
    /// watcher reports them (their events are the agent's own echo).
    pub changes: Vec<(Folder, FsChange)>,
}

impl Applied {
    /// Whether the apply removed a key from `minions/`: a revocation the
    /// master must act on (`.dfn`).
    pub fn removed_accepted(&self) -> bool {
        self.changes.contains(&(Folder::Accepted, FsChange::Gone))
    }
}

/// What the store keeps with an id's decision besides it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    pub id: MinionId,
    /// The other decisions seen (claims among them), oldest first.
    pub seen: Vec<Seen>,
    /// This master's own claim, if it had one.
    pub mine: Option<crate::core::Version>,
}

impl Kept {
    pub fn of(id: &MinionId, entry: &crate::core::Entry) -> Kept {
        Kept { id: id.clone(), seen: entry.seen().to_vec(), mine: entry.mine().cloned() }
    }
}

/// One durable commit of the state store.
#[derive(Debug, Default)]
pub struct StoreWrite<'a> {
    /// Decisions whose files are durable: held from now on.
    pub decisions: &'a [Decision],
    /// Claims learnt and not held (another decision beats them): kept with
    /// their keys, as what a master shows may come to be one of them.
    pub claims: &'a [Decision],
    /// Per id whose entry changed (each id of `decisions` among them): what
    /// is kept with its decision besides (the other decisions seen, and this
    /// master's own claim).
    pub kept: &'a [Kept],
    /// Conflicts to tell, with the peer each came from: kept until told, so
    /// a stop between this commit and the audit write loses none.
    pub conflicts: &'a [(PeerName, Conflict)],
    /// Every conflict kept is told now (the audit log is flushed): forget them.
    pub conflicts_told: bool,
    /// Ids whose journal entries are finished.
    pub done: &'a [MinionId],
    /// The clock to resume from after a restart.
    pub clock: u64,
    /// Marks the store initialized: the next start is not a first start.
    pub initialize: bool,
    /// Peers' deletes the guard holds from now on.
    pub held: &'a [super::HeldDelete],
    /// Ids whose held delete is settled (released, reverted, superseded).
    pub unheld: &'a [MinionId],
    /// The last completed comparison with a peer (wall-clock ms), to keep.
    pub contact: Option<u64>,
    /// Replaces the list of keys put back whose files may not be written
    /// yet (see `put_back.rs`; empty: none).
    pub putting_back: Option<&'a [MinionId]>,
}

/// What [`Runtime::list`] found.
#[derive(Clone, Debug, Default)]
pub struct Listing {
    /// Every file in the folders listed.
    pub files: Vec<(Folder, String)>,
    /// Every folder was listed: none is refused (replaced by something the
    /// agent will not use). A scan reads each name only in the folders
    /// that list it when it is.
    pub complete: bool,
}

/// The effects of the node machine.
pub trait Runtime {
    /// Reads an id's file in one folder, trusting nothing.
    fn read_slot(&mut self, folder: Folder, id: &MinionId) -> Slot;
    /// [`Runtime::read_slot`], and the token of the file read when it is a
    /// key ([`FileToken`]; none where the runtime cannot tell a file from
    /// its successor, e.g. one changed within the clock's last tick).
    fn read_slot_token(&mut self, folder: Folder, id: &MinionId) -> (Slot, Option<FileToken>) {
        (self.read_slot(folder, id), None)
    }
    /// [`Runtime::read_slots`], and the token of the id's one key file
    /// ([`Slots::only_key`]).
    fn read_slots_token(&mut self, id: &MinionId) -> (Slots, Option<FileToken>) {
        let mut tokens = [None; 3];
        let slots = Slots::read(|folder| {
            let (slot, token) = self.read_slot_token(folder, id);
            tokens[folder.index()] = token;
            slot
        });
        let token = slots.only_key(|folder| tokens[folder.index()]);
        (slots, token)
    }
    /// Whether the id's file in the token's folder is still the file the
    /// token was taken of, unchanged; false whenever it cannot tell.
    fn unchanged(&mut self, _token: FileToken, _id: &MinionId) -> bool {
        false
    }
    /// Reads an id's file in each of the three folders.
    fn read_slots(&mut self, id: &MinionId) -> Slots {
        Slots::read(|folder| self.read_slot(folder, id))
    }
    /// The files a scan reads next, in the order it will: a hint, which the
    /// agent uses to have the kernel read them ahead where its reads find
    /// key files not in memory (after a reboot, or more keys than memory).
    fn read_soon(&mut self, _files: &[(Folder, &str)]) {}
    /// Every file in the three folders (dot files left out, as Salt does).
    fn list(&mut self) -> Result<Listing, Failure>;
    /// Makes the folders say each decision (staged, atomic); not durable
    /// until [`Runtime::sync_folders`]. One result per decision, in order.
    fn apply(&mut self, decisions: &[&Decision]) -> Vec<Result<Applied, Failure>>;
    /// Flushes the file system holding the key folders.
    fn sync_folders(&mut self) -> Result<(), Failure>;
    /// Drops `.dfn` so the master rotates its AES key; `Ok(false)` when one
    /// is there already.
    fn drop_dfn(&mut self) -> Result<bool, Failure>;
    /// Durably notes decisions about to be applied (finished at the next
    /// start if the node dies before recording them).
    fn journal(&mut self, decisions: &[Decision]) -> Result<(), Failure>;
    /// Durably records decisions (one transaction).
    fn record(&mut self, write: &StoreWrite<'_>) -> Result<(), Failure>;
    /// The full decisions (keys included) known for `ids`: the one held and
    /// every claim; unknown ids are skipped.
    fn load(&mut self, ids: &[MinionId]) -> Result<Vec<Decision>, Failure>;
    /// The plain tombstones (see [`crate::core::decision::is_plain_tombstone`])
    /// the store keeps for those of `ids` it holds, as entries: they are
    /// held in memory only while something is decided about them.
    fn load_cold(&mut self, ids: &[MinionId]) -> Result<Vec<(MinionId, Entry)>, Failure>;
    /// The plain tombstones the store keeps in the given digest buckets,
    /// with their versions (for a peer's Diff).
    fn cold_in(&mut self, buckets: &[u32]) -> Result<Vec<(MinionId, Version)>, Failure>;
    /// Forgets at most `max` plain tombstones issued before `before_ms`
    /// (wall-clock milliseconds), none with a journal entry or a held
    /// delete; returns their ids, each with its delete's version.
    fn compact(&mut self, before_ms: u64, max: usize) -> Result<Vec<(MinionId, Version)>, Failure>;
    /// Whether the audit log already tells `conflict` (asked at start-up for
    /// the conflicts the store kept).
    fn was_told(&mut self, conflict: &Conflict) -> bool;
    /// Something happened that the audit log, the log or the metrics want.
    fn audit(&mut self, event: Event);
    /// Makes the audit records so far durable (after a batch, off the
    /// replication path).
    fn flush_audit(&mut self);
    /// Sends decisions to every peer but `except` (the one they came from).
    fn send(&mut self, except: Option<&PeerName>, decisions: Vec<Decision>);
}
