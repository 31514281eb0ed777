//! The simulated world as the node machine sees it: a [`Runtime`] over one
//! master's folders, store and audit log, which can kill the node at any
//! effect (kill -9: what an effect completed stays, nothing after it runs)
//! or fail writes as a full disk does. What the node tells is written as
//! the agent writes it: each event, and the audit record the agent makes of
//! it (`keysync_audit::record`).

use keysync_machine::core::merge::Conflict;
use keysync_machine::core::{Decision, Entry, MinionId, Slot, Slots, Version};
use keysync_machine::node::{Applied, Event, Failure, FileToken, Listing, Runtime, StoreWrite};

use crate::model::{Change, Disk};
use keysync_machine::core::settle::FsChange;
use keysync_machine::core::Folder;

mod store;

/// A master's durable state store: the model, and for some seeds the
/// agent's redb store beside it (`store.rs`).
pub(crate) use store::{real_store_for, with_real_store, Store};

/// A decision the store recorded, with what it held for that id before,
/// and whether it is this master's own claim (found at its first start).
pub(crate) type Recorded = (Decision, Option<keysync_machine::node::testing::Stored>, bool);

/// What one input made the node do that leaves the node: messages, echoes
/// of its writes, and whether it died on the way.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    pub(crate) sends: Vec<(Option<keysync_machine::PeerName>, Vec<Decision>)>,
    /// The inotify events the node's own writes raise, in order.
    pub(crate) echoes: Vec<(Folder, String, FsChange)>,
    pub(crate) dfn_dropped: u32,
    /// Killed at an effect: the node is gone, whatever it did after.
    pub(crate) killed: bool,
    /// Decisions the store recorded, with what it held for their ids before.
    pub(crate) recorded: Vec<Recorded>,
    /// The audit log's length before the input (for tracing what it told).
    pub(crate) audit_before: usize,
    /// Plain tombstones read back from the store, and compacted.
    pub(crate) cold_read: u64,
    /// Key files a scan did not read again: unchanged since it last did.
    pub(crate) unchanged: u64,
    pub(crate) compacted: u64,
    /// What the store held of each id it compacted (the conflicts told
    /// about it are forgotten with it).
    pub(crate) forgotten: Vec<(MinionId, keysync_machine::node::testing::Stored)>,
    /// Ids written while a salt-key run on them was in progress (must stay empty).
    pub(crate) wrote_into_runs: Vec<MinionId>,
}

pub(crate) struct SimRuntime<'a> {
    pub(crate) disk: &'a mut Disk,
    pub(crate) store: &'a mut Store,
    /// The audit log as written (a kill loses only what was buffered):
    /// the events, and the records the agent makes of them.
    pub(crate) audit: &'a mut Vec<Event>,
    pub(crate) records: &'a mut Vec<keysync_audit::Record>,
    /// The node's name, which its records name.
    pub(crate) node: &'a str,
    /// The holds of deletes its guard made, as its store writes show them.
    pub(crate) holds: &'a mut crate::world::Holds,
    /// Events told in this input, written at its end or at a flush.
    pub(crate) buffered: Vec<Event>,
    pub(crate) out: Outbox,
    /// Effects left before the node is killed (`None`: no kill planned).
    pub(crate) kill_after: &'a mut Option<u32>,
    /// Writes fail as on a full disk: each write effect fails with this
    /// percentage (the disk fills and frees between two of them).
    pub(crate) disk_full: u64,
    /// Draws for the failures, from the run's seed.
    pub(crate) rng: &'a mut crate::model::Rng,
    /// Ids a salt-key run is still working on: the agent must not write them.
    pub(crate) in_flight: &'a std::collections::BTreeSet<MinionId>,
}

const KILLED: &str = "killed";

impl SimRuntime<'_> {
    /// Counts one effect; true if the node is dead by now (the effect does nothing).
    fn dead(&mut self) -> bool {
        if self.out.killed {
            return true;
        }
        match self.kill_after {
            Some(0) => {
                *self.kill_after = None;
                self.out.killed = true;
                self.holds.killed(&self.buffered);
                self.buffered.clear();
                true
            }
            Some(n) => {
                *n -= 1;
                false
            }
            None => false,
        }
    }

    fn full(&mut self) -> bool {
        self.disk_full > 0 && self.rng.percent(self.disk_full)
    }

    /// The end of the input: what was told is written (a write(), no fsync, survives a kill).
    pub(crate) fn finish(mut self) -> Outbox {
        if !self.out.killed {
            self.write_told();
        }
        self.out
    }

    /// Writes what was told to the audit log: each event, and its record
    /// as the agent makes it (events that are only logged have none).
    fn write_told(&mut self) {
        let node = self.node;
        self.records.extend(self.buffered.iter().filter_map(|event| keysync_audit::record(event, node)));
        self.holds.written(&self.buffered);
        self.audit.append(&mut self.buffered);
    }
}

impl Runtime for SimRuntime<'_> {
    /// One effect, as a read of one folder is (a kill counts effects).
    fn read_slots(&mut self, id: &MinionId) -> Slots {
        if self.dead() {
            return Slots::EMPTY;
        }
        self.disk.slots(id.as_str())
    }

    fn read_slot(&mut self, folder: Folder, id: &MinionId) -> Slot {
        if self.dead() {
            return Slot::Absent;
        }
        self.disk.slot(folder, id.as_str())
    }

    fn read_slot_token(&mut self, folder: Folder, id: &MinionId) -> (Slot, Option<FileToken>) {
        if self.dead() {
            return (Slot::Absent, None);
        }
        (self.disk.slot(folder, id.as_str()), self.disk.token(folder, id.as_str()))
    }

    /// One effect, as [`SimRuntime::read_slots`].
    fn read_slots_token(&mut self, id: &MinionId) -> (Slots, Option<FileToken>) {
        if self.dead() {
            return (Slots::EMPTY, None);
        }
        self.disk.slots_token(id.as_str())
    }

    fn unchanged(&mut self, token: FileToken, id: &MinionId) -> bool {
        if self.dead() {
            return false;
        }
        let unchanged = self.disk.token(token.folder(), id.as_str()) == Some(token);
        self.out.unchanged += u64::from(unchanged);
        unchanged
    }

    fn list(&mut self) -> Result<Listing, Failure> {
        if self.dead() {
            return Err(Failure::new(KILLED));
        }
        let files = self.disk.files.keys().map(|(name, folder)| (*folder, name.clone())).collect();
        Ok(Listing { files, complete: true })
    }

    fn apply(&mut self, decisions: &[&Decision]) -> Vec<Result<Applied, Failure>> {
        decisions
            .iter()
            .map(|decision| {
                if self.dead() {
                    return Err(Failure::new(KILLED));
                }
                if self.full() {
                    return Err(Failure::new("No space left on device"));
                }
                if self.in_flight.contains(&decision.id) {
                    self.out.wrote_into_runs.push(decision.id.clone());
                }
                let applied = self.disk.apply(decision);
                for (folder, change) in &applied.changes {
                    self.out.echoes.push((*folder, decision.id.to_string(), *change));
                }
                Ok(applied)
            })
            .collect()
    }

    fn sync_folders(&mut self) -> Result<(), Failure> {
        if self.dead() {
            return Err(Failure::new(KILLED));
        }
        if self.full() {
            return Err(Failure::new("syncfs: Input/output error"));
        }
        Ok(())
    }

    fn drop_dfn(&mut self) -> Result<bool, Failure> {
        if self.dead() {
            return Err(Failure::new(KILLED));
        }
        self.out.dfn_dropped += 1;
        Ok(true)
    }

    fn journal(&mut self, decisions: &[Decision]) -> Result<(), Failure> {
        if self.dead() {
            return Err(Failure::new(KILLED));
        }
        if self.full() {
            return Err(Failure::new("journal: No space left on device"));
        }
        self.store.journal(decisions);
        Ok(())
    }

    fn was_told(&mut self, conflict: &Conflict) -> bool {
        // As the agent answers it: from the records in its audit log.
        !self.dead() && self.records.iter().any(|record| keysync_audit::tells(record, conflict))
    }

    fn record(&mut self, write: &StoreWrite<'_>) -> Result<(), Failure> {
        if self.dead() {
            return Err(Failure::new(KILLED));
        }
        if self.full() {
            self.holds.write(self.store, write, false);
            return Err(Failure::new("store: No space left on device"));
        }
        for d in write.decisions.iter().chain(write.claims) {
            let mine = write.kept.iter().any(|k| k.id == d.id && k.mine.as_ref() == Some(&d.version));
            self.out.recorded.push((d.clone(), self.store.decisions.get(&d.id).cloned(), mine));
        }
        self.holds.write(self.store, write, true);
        self.store.record(write);
        Ok(())
    }

    fn load(&mut self, ids: &[MinionId]) -> Result<Vec<Decision>, Failure> {
        if self.dead() {
            return Err(Failure::new(KILLED));
        }
        Ok(self.store.get(ids))
    }

    fn load_cold(&mut self, ids: &[MinionId]) -> Result<Vec<(MinionId, Entry)>, Failure> {
        if self.dead() {
            return Err(Failure::new(KILLED));
        }
        let found = self.store.cold(ids);
        self.out.cold_read += found.len() as u64;
        Ok(found)
    }

    fn cold_in(&mut self, buckets: &[u32]) -> Result<Vec<(MinionId, Version)>, Failure> {
        if self.dead() {
            return Err(Failure::new(KILLED));
        }
        Ok(self.store.cold_in(buckets))
    }

    fn compact(
        &mut self,
        before_ms: u64,
        max: usize,
    ) -> Result<Vec<(MinionId, keysync_machine::core::Version)>, Failure> {
        if self.dead() {
            return Err(Failure::new(KILLED));
        }
        if self.full() {
            return Err(Failure::new("store: No space left on device"));
        }
        let before = self.store.decisions.clone();
        let compacted = self.store.compact(before_ms, max);
        self.out.compacted += compacted.len() as u64;
        self.out.forgotten.extend(compacted.iter().map(|(id, _)| (id.clone(), before[id].clone())));
        Ok(compacted)
    }

    fn audit(&mut self, event: Event) {
        if self.dead() {
            // Told by a process killed already: never written.
            self.holds.killed(std::slice::from_ref(&event));
        } else {
            self.buffered.push(event);
        }
    }

    fn flush_audit(&mut self) {
        if !self.dead() {
            self.write_told();
        }
    }

    fn send(&mut self, except: Option<&keysync_machine::PeerName>, decisions: Vec<Decision>) {
        if !self.dead() {
            self.out.sends.push((except.cloned(), decisions));
        }
    }
}

/// The agent's apply on the simulated folders, as `disk::pki` does it: the
/// pending file holding the key moved into place, or the key written;
/// the id removed from the other folders.
impl Disk {
    pub(crate) fn apply(&mut self, decision: &Decision) -> Applied {
        let mut folders = keysync_machine::node::testing::Folders::default();
        for folder in Folder::ALL {
            if let Some(bytes) = self.get(folder, decision.id.as_str()) {
                folders.put(folder, decision.id.as_str(), bytes);
            }
        }
        let applied = folders.apply(decision);
        for folder in Folder::ALL {
            let name = decision.id.as_str();
            match folders.get(folder, name) {
                Some(bytes) => self.change(&Change::Put(folder, name.to_string(), bytes.clone())),
                None => self.change(&Change::Remove(folder, name.to_string())),
            }
        }
        applied
    }
}
