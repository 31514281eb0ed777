//! Local side of the node: folder events and scans turned into decisions,
//! made durable, told and sent to the peers.

use crate::core::observe::{interpret, FileToken, Slot, Slots};
use crate::core::replica::{ObserveMode, Replica};
use crate::core::settle::looks_like_salt_tmp;
use crate::core::{Decision, Folder, MinionId};

use super::event::{Event, Found};
use super::runtime::{Kept, Runtime, StoreWrite};
use super::{Node, Now, Start};

mod names;

use names::{Cursor, InFolders, Names};

/// Names read and recorded per step of the start-up reconciliation: a first
/// start on 100,000 keys never holds them all (with their key bytes) at once.
pub(super) const RECONCILE_CHUNK: usize = 5000;

/// Names the agent's periodic rescan reads per turn of the node
/// ([`Node::on_tick`], [`super::Settings::rescan_step`]):
/// between two, the node takes its peers' decisions and the operators'
/// changes. Read in one turn, 1,000,000 names held the node for tens of
/// seconds every `rescan_interval`.
pub const RESCAN_STEP: usize = 5000;

/// The first periodic rescan this long or more after the files' tokens
/// were last forgotten forgets them all and reads every key file
/// ([`crate::core::observe::FileToken`]): a change that left a file's
/// times alone is found within this, one `rescan_interval` and the time
/// that rescan's steps take.
pub const FULL_READ_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

/// Settled names read at once from this many on are asked for ahead
/// ([`Runtime::read_soon`]).
const READ_AHEAD_FROM: usize = 256;

/// The periodic rescan under way: the names it reads, and how far it got.
#[derive(Debug)]
pub(super) struct Rescanning {
    names: Names,
    at: Cursor,
}

impl Node {
    /// Reads the names whose events have settled.
    pub(super) fn process_due(&mut self, now: Now, rt: &mut impl Runtime) {
        let due = self.settler.take_due(now.mono);
        if due.is_empty() {
            return;
        }
        // Many names at once (after lost events, `recheck_all`, every name):
        // each read in all three folders, the next chunk's asked for while
        // one is read, as a scan does. Fewer than `READ_AHEAD_FROM` are read
        // without asking: most often one, its file just written.
        let mut ahead = due.iter().map(|name| (name.as_str(), InFolders::ALL));
        let mut decisions: Vec<Decision> = Vec::new();
        for (at, name) in due.iter().enumerate() {
            if due.len() >= READ_AHEAD_FROM {
                read_soon_at(at, &mut ahead, &self.replica, rt);
            }
            decisions.extend(self.observe_name(name, None, ObserveMode::Live, now, rt));
        }
        self.record_local(decisions, None, now, rt);
        if self.pending.capacity() > 4 * self.pending.len() + 1024 {
            // A burst of pending keys was decided: hand the map's memory back.
            self.pending.shrink_to_fit();
        }
        // Not over a local change that could not be recorded: the retry finds it first.
        if !self.waiting.rescan_pending {
            self.apply_deferred(now, rt);
        }
    }

    /// Reads one name's files and returns the decision they amount to.
    /// `listed`: the folders a scan's listing named it in, where it is read
    /// ([`read_listed`]); `None` reads all three.
    fn observe_name(
        &mut self,
        name: &str,
        listed: Option<InFolders>,
        mode: ObserveMode,
        now: Now,
        rt: &mut impl Runtime,
    ) -> Option<Decision> {
        let id = match MinionId::parse(name) {
            Ok(id) => id,
            Err(e) => {
                self.refuse_once(Folder::Accepted, name, None, &e.to_string(), rt);
                return None;
            }
        };
        if mode == ObserveMode::Live && self.unchanged_since_read(&id, listed, rt) {
            return None;
        }
        let (mut slots, mut read, mut token) = match listed {
            Some(folders) => read_listed(&id, folders, rt),
            None => read_all(&id, rt),
        };
        if let Err(e) = self.warm([&id], rt) {
            self.note_slots(&id, &slots, read, rt);
            // Read again by the rescan that follows the backoff.
            self.retry_after_cold_failure(&e, now, rt);
            return None;
        }
        // The periodic rescan's listing may be minutes old by its last step,
        // older than what the node knows (an event's read recorded a file put
        // since in a folder the listing does not name): a live reading of
        // only the listed folders that would decide anything is made again
        // of all three. (A first start's reads follow its listing in the
        // same turn; each of its names is a claim, read once.)
        let mut reading = interpret(&slots);
        if mode == ObserveMode::Live && read != InFolders::ALL && self.replica.would_observe(&id, &reading) {
            (slots, read, token) = read_all(&id, rt);
            reading = interpret(&slots);
        }
        self.note_slots(&id, &slots, read, rt);
        // The file read is kept with the entry while reading it decides
        // nothing: kept before observing, so that an entry the observation
        // changes forgets it (`Entries::insert`), and forgotten when it
        // decides anything (a decision's recording can fail and be retried
        // by a scan, which must read the file again).
        self.replica.set_file_token(&id, token.filter(|_| mode == ObserveMode::Live));
        let decision = self.replica.observe(&id, reading, now.wall_ms, mode);
        if decision.is_some() {
            self.replica.set_file_token(&id, None);
        }
        let decision = decision?;
        // The agent's own write of a peer's decision whose recording failed is
        // not an operator's decision: the retry records it with its version.
        let own_write =
            self.retried(&decision.id).any(|d| d.verdict == decision.verdict || self.would_show(d, &decision))
                || (decision.verdict.kind() == crate::core::VerdictKind::Deleted && self.putting_back(&decision.id));
        (!own_write).then_some(decision)
    }

    /// Whether `id`'s one key file is still the file a scan read and
    /// decided nothing on ([`crate::core::observe::FileToken`]), and its
    /// other folders hold nothing: as the listing says (`listed`; the same
    /// word a scan's reading of the listed folders takes), or as read. Then
    /// reading it would decide nothing again, and what the reading would
    /// note is noted (nothing refused in the folders looked at, no pending
    /// key when that folder was).
    fn unchanged_since_read(&mut self, id: &MinionId, listed: Option<InFolders>, rt: &mut impl Runtime) -> bool {
        let Some(token) = self.replica.file_token(id) else { return false };
        let folder = token.folder();
        let only = InFolders::NONE.with(folder);
        let others = match listed {
            Some(listed) if listed == only => InFolders::NONE,
            Some(_) => return false,
            None => Folder::ALL.into_iter().filter(|&other| other != folder).fold(InFolders::NONE, InFolders::with),
        };
        if !rt.unchanged(token, id) {
            return false;
        }
        for other in Folder::ALL.into_iter().filter(|&other| others.contains(other)) {
            if !matches!(rt.read_slot(other, id), Slot::Absent) {
                return false;
            }
        }
        let looked = others.with(folder);
        self.note_slots(id, &Slots::EMPTY, looked, rt);
        true
    }

    /// Whether committing `retried` makes the folders show what `read`
    /// says: a peer's claim that does not hold can still change what they
    /// show (first contact), and its write is then another verdict than its own.
    fn would_show(&self, retried: &Decision, read: &Decision) -> bool {
        match crate::core::claims::effective(&self.replica.after(retried)) {
            None => read.verdict.kind() == crate::core::VerdictKind::Deleted,
            Some(shows) => read.verdict.kind() == shows.kind && read.verdict.fingerprint() == shows.fingerprint,
        }
    }

    /// Tells refused files and new pending keys, each once; `read`: the
    /// folders read (what the others hold is left as known).
    fn note_slots(&mut self, id: &MinionId, slots: &Slots, read: InFolders, rt: &mut impl Runtime) {
        for folder in Folder::ALL.into_iter().filter(|&folder| read.contains(folder)) {
            match slots.get(folder) {
                Slot::Refused(reason) => self.refuse_once(folder, id.as_str(), Some(id), &reason.to_string(), rt),
                _ => {
                    self.refused.remove(&(folder, id.to_string()));
                }
            }
        }
        if !read.contains(Folder::Pending) {
            return;
        }
        match &slots.pending {
            Slot::Key(key) => {
                let known = self.pending.insert(id.clone(), key.fingerprint());
                if known != Some(key.fingerprint()) {
                    rt.audit(Event::PendingSeen { id: id.clone(), fingerprint: key.fingerprint() });
                }
            }
            _ => {
                self.pending.remove(id);
            }
        }
    }

    /// Tells a refused file once per reason (a rescan finds it again).
    fn refuse_once(&mut self, folder: Folder, name: &str, id: Option<&MinionId>, reason: &str, rt: &mut impl Runtime) {
        let key = (folder, name.to_string());
        if self.refused.get(&key).is_some_and(|seen| seen == reason) {
            return;
        }
        rt.audit(Event::Refused { folder, name: name.to_string(), id: id.cloned(), reason: reason.to_string() });
        self.refused.insert(key, reason.to_string());
    }

    /// Makes local decisions durable, holds them, tells and sends them.
    pub(super) fn record_local(
        &mut self,
        decisions: Vec<Decision>,
        found: Option<Found>,
        now: Now,
        rt: &mut impl Runtime,
    ) {
        if decisions.is_empty() {
            return;
        }
        // The files were written by salt-key, which does not fsync: flush
        // them first, or a crash could lose a file whose decision was sent.
        // On failure nothing is held or sent: a scan after the backoff finds
        // the same changes again.
        if let Err(e) = rt.sync_folders() {
            self.trouble.failed(rt, now.mono, "syncfs of the key folders", &e);
            self.waiting.rescan_pending = true;
            return;
        }
        let after: Vec<crate::core::Entry> = decisions
            .iter()
            .map(|d| {
                let mut after = self.replica.after(d);
                if d.version.is_claim() {
                    after = after.with_mine(Some(d.version.clone()));
                }
                after
            })
            .collect();
        let kept: Vec<Kept> = decisions.iter().zip(&after).map(|(d, after)| Kept::of(&d.id, after)).collect();
        // A claim below one already learnt from a peer is kept beside it.
        // Where none is (every decision of a first start), none is copied.
        let (held, claims): (std::borrow::Cow<[Decision]>, Vec<Decision>) =
            if decisions.iter().zip(&after).all(|(d, after)| after.version == d.version) {
                (std::borrow::Cow::Borrowed(&decisions), Vec::new())
            } else {
                let (mut held, mut claims) = (Vec::new(), Vec::new());
                for (d, after) in decisions.iter().zip(&after) {
                    if after.version == d.version { &mut held } else { &mut claims }.push(d.clone());
                }
                (std::borrow::Cow::Owned(held), claims)
            };
        let unheld: Vec<MinionId> = decisions
            .iter()
            .zip(&after)
            .filter(|(d, after)| self.settles_held(&d.id, after))
            .map(|(d, _)| d.id.clone())
            .collect();
        let write = StoreWrite {
            decisions: held.as_ref(),
            claims: &claims,
            kept: &kept,
            clock: self.replica.clock(),
            initialize: self.start != Start::FirstInSteps,
            unheld: &unheld,
            ..StoreWrite::default()
        };
        if let Err(e) = rt.record(&write) {
            self.trouble.failed(rt, now.mono, "state store", &e);
            self.waiting.rescan_pending = true;
            return;
        }
        if self.waiting.retry.is_empty() {
            self.trouble.succeeded(rt, now.mono);
        }
        let mut live = Vec::with_capacity(decisions.len());
        let mut n_deleted_accepted = 0;
        for (decision, after) in decisions.into_iter().zip(after) {
            if !decision.version.is_claim()
                && decision.verdict.kind() == crate::core::VerdictKind::Deleted
                && self.replica.effective(&decision.id).is_some_and(|s| s.kind == crate::core::VerdictKind::Accepted)
            {
                n_deleted_accepted += 1;
            }
            // Settles exactly the ids of `unheld` (see `apply_round`).
            self.settle_held(&decision, &after, true, rt);
            self.guard.forget_waiting(&decision.id, &after.version);
            self.replica.set(&decision.id, after);
            if decision.version.is_claim() {
                // Claims are told as one inventory at the end of the first
                // start, and not sent: anti-entropy compares them by digest,
                // so masters that agree exchange nothing. (A rescan's claims
                // after a failed step come out of id order, and no inventory
                // tells them.)
                if self.start == Start::FirstInSteps {
                    self.inventory.note(&decision);
                }
            } else {
                rt.audit(Event::Decided { decision: decision.clone(), found });
                live.push(decision);
            }
        }
        if !live.is_empty() {
            rt.send(None, live);
        }
        if n_deleted_accepted > 0 && self.guard.settings.enabled {
            let n_accepted = self.n_accepted();
            if let Some((n, limit)) = self.guard.local_deletes(n_deleted_accepted, n_accepted, now.mono) {
                rt.audit(Event::MassDeleteHere { n, limit });
            }
        }
        // Flushed after sending: the audit lines are written already, and
        // their fsync need not delay the peers (the store holds the decision).
        rt.flush_audit();
    }

    /// Compares every name in the folders, and every id held, with the store.
    /// Ids whose events are still settling are left to the settler.
    pub(super) fn rescan(&mut self, why: &str, now: Now, rt: &mut impl Runtime) {
        let Some(all) = self.all_names(rt) else { return };
        // It reads every name: a periodic rescan under way has nothing left to do.
        self.waiting.rescanning = None;
        // Until a first start's files are recorded they stay claims: a stale
        // master must not turn them into live decisions.
        let mode = if self.start == Start::FirstUnrecorded { ObserveMode::FirstStart } else { ObserveMode::Live };
        // A salt-key run's temporary file is read once settled, never now.
        if all.listed.iter().any(|(_, name)| looks_like_salt_tmp(name) && !self.settler.is_unsettled(name)) {
            self.settler.note_listed(&all.listed, now.mono);
        }
        let mut decisions: Vec<Decision> = Vec::new();
        // It reads every key file, as a start does: the next chunk's files
        // are asked for while one is read (a name left to the settler too:
        // asking is only a hint).
        let mut ahead = all.iter_placed();
        for (at, (name, folders)) in all.iter_placed().enumerate() {
            read_soon_at(at, &mut ahead, &self.replica, rt);
            if self.settler.is_unsettled(name) {
                continue;
            }
            decisions.extend(self.observe_name(name, Some(folders), mode, now, rt));
        }
        drop(ahead);
        drop(all);
        if !decisions.is_empty() {
            rt.audit(Event::RescanFound { n: decisions.len(), why: why.to_string() });
        }
        let found = if mode == ObserveMode::FirstStart { Found::FirstStart } else { Found::Rescan };
        self.record_local(decisions, Some(found), now, rt);
        if !self.waiting.rescan_pending && self.start == Start::FirstUnrecorded && self.mark_initialized(now, rt) {
            self.start = Start::Done;
        }
    }

    /// The periodic rescan, the safety net for lost events: one step of
    /// [`super::Settings::rescan_step`] names, the first listing the
    /// folders; what it finds is recorded at each step ([`Node::rescan`]
    /// reads every name at once).
    pub(super) fn rescan_step(&mut self, now: Now, rt: &mut impl Runtime) {
        let mut rescanning = match self.waiting.rescanning.take() {
            Some(rescanning) => rescanning,
            None => {
                self.waiting.next_rescan = now.mono + self.settings.rescan_interval;
                if now.mono.saturating_duration_since(self.waiting.tokens_since) >= FULL_READ_EVERY {
                    self.replica.forget_file_tokens();
                    self.waiting.tokens_since = now.mono;
                }
                self.echoes.expire(now.mono);
                if self.start == Start::FirstUnrecorded {
                    // A first start's files not all recorded yet: recorded in one
                    // write that marks the store initialized. A step would mark
                    // it while later steps' files are unrecorded, and a restart
                    // would take those for live decisions.
                    self.rescan("periodic safety net", now, rt);
                    return;
                }
                let Some(names) = self.all_names(rt) else { return };
                if names.listed.iter().any(|(_, name)| looks_like_salt_tmp(name) && !self.settler.is_unsettled(name)) {
                    self.settler.note_listed(&names.listed, now.mono);
                }
                Rescanning { names, at: Cursor::default() }
            }
        };
        let step = self.settings.rescan_step.max(1);
        let mut ahead = rescanning.at;
        read_soon(std::iter::from_fn(|| rescanning.names.next_at(&mut ahead)).take(step), &self.replica, rt);
        let mut decisions: Vec<Decision> = Vec::new();
        for _ in 0..step {
            let Some((name, folders)) = rescanning.names.next_at(&mut rescanning.at) else { break };
            if !self.settler.is_unsettled(name) {
                decisions.extend(self.observe_name(name, Some(folders), ObserveMode::Live, now, rt));
            }
        }
        if !decisions.is_empty() {
            rt.audit(Event::RescanFound { n: decisions.len(), why: "periodic safety net".to_string() });
        }
        self.record_local(decisions, Some(Found::Rescan), now, rt);
        if rescanning.names.next_at(&mut rescanning.at.clone()).is_some() {
            self.waiting.rescanning = Some(rescanning);
        }
    }

    /// Marks the store initialized: the next start is not a first start.
    /// False (told, retried by a rescan) when the store cannot commit.
    fn mark_initialized(&mut self, now: Now, rt: &mut impl Runtime) -> bool {
        let write = StoreWrite { clock: self.replica.clock(), initialize: true, ..StoreWrite::default() };
        match rt.record(&write) {
            Ok(()) => true,
            Err(e) => {
                self.trouble.failed(rt, now.mono, "state store", &e);
                self.waiting.rescan_pending = true;
                false
            }
        }
    }

    /// Every file in the three folders, and every id held in none of them
    /// ([`Names`]); `None` when the folders cannot be listed (told).
    fn all_names(&self, rt: &mut impl Runtime) -> Option<Names> {
        match rt.list() {
            Ok(listing) => Some(Names::new(listing, self.replica.entries().map(|(id, _)| id))),
            Err(error) => {
                rt.audit(Event::ListFailed { error });
                None
            }
        }
    }

    /// Events were lost: every name is read again once it has settled (see
    /// [`crate::core::settle::Settler::recheck`]), not at once.
    pub(super) fn recheck_all(&mut self, why: &str, now: Now, rt: &mut impl Runtime) {
        let Some(all) = self.all_names(rt) else { return };
        rt.audit(Event::EventsLost { why: why.to_string(), n_names: all.len() });
        self.settler.recheck(&all.listed, all.iter(), now.mono);
    }

    /// Start-up: finds what changed while the agent was stopped. On the very
    /// first start, what the folders hold gets the bootstrap version.
    pub(super) fn reconcile(&mut self, initialized: bool, now: Now, rt: &mut impl Runtime) {
        let (mode, found) = if initialized {
            (ObserveMode::Live, Found::WhileStopped)
        } else {
            (ObserveMode::FirstStart, Found::FirstStart)
        };
        let all = self.all_names(rt).unwrap_or_default();
        // A salt-key run caught half-way at start-up (a Salt 3008 tmp file in
        // a folder): an id held but in no folder may be between its removal
        // and its rename into place; it is read once settled, like a
        // disappearance heard, never taken for a delete now.
        // The run's temporary file itself is no minion: the settler reads it
        // once the run is over (by then it is normally gone).
        let in_flight = all.listed.iter().any(|(_, n)| looks_like_salt_tmp(n));
        let later = |name: &str, listed: InFolders| in_flight && (listed.is_empty() || looks_like_salt_tmp(name));
        if in_flight {
            let recheck: Vec<&str> =
                all.iter_placed().filter(|&(name, listed)| later(name, listed)).map(|(n, _)| n).collect();
            self.settler.recheck(&all.listed, recheck, now.mono);
        }
        // Keys in minions/ and minions_rejected/ not held yet are held once
        // recorded (on a first start, every one): room for them at once.
        let decided = |folder: &Folder| matches!(folder, Folder::Accepted | Folder::Rejected);
        self.replica.reserve(all.listed.iter().filter(|(f, name)| decided(f) && !self.replica.holds(name)).count());
        // Read now: every name but those left to the settler, moved out of
        // the listing (25 bytes a name here, where the listing takes 32 and
        // is dropped now, before the entries grow), each with its folders.
        let (names, folders): (Vec<String>, Vec<InFolders>) =
            all.into_placed().filter(|(name, listed)| !later(name, *listed)).unzip();
        // A first start recorded in steps leaves the store uninitialized until
        // every step is recorded: a stop in between is a first start again,
        // never a restart whose unrecorded files would be taken as live decisions.
        if !initialized {
            self.start = Start::FirstInSteps;
        }
        let mut n_found = 0;
        // Each name is dropped once read: 100,000 of them are 4 MiB.
        let mut names = names.into_iter().zip(folders);
        let mut chunk: Vec<(String, InFolders)> = names.by_ref().take(RECONCILE_CHUNK).collect();
        read_soon(chunk.iter().map(|(name, folders)| (name.as_str(), *folders)), &self.replica, rt);
        while !chunk.is_empty() {
            // The next chunk's files are asked for while this one is read.
            let next: Vec<(String, InFolders)> = names.by_ref().take(RECONCILE_CHUNK).collect();
            read_soon(next.iter().map(|(name, folders)| (name.as_str(), *folders)), &self.replica, rt);
            // Room for a decision per name (a first start finds one each):
            // grown by doubling, the vector was copied and its fresh pages
            // faulted in again at each step.
            let mut decisions: Vec<Decision> = Vec::with_capacity(chunk.len());
            decisions.extend(
                chunk.iter().filter_map(|(name, folders)| self.observe_name(name, Some(*folders), mode, now, rt)),
            );
            n_found += decisions.len();
            self.record_local(decisions, Some(found), now, rt);
            chunk = next;
        }
        rt.audit(Event::Reconciled { n_held: self.replica.len(), n_found, found });
        if !initialized {
            rt.audit(Event::Inventory { held: self.inventory.take(self.pending.len()) });
        }
        self.start = Start::Done;
        // When a step failed, the retry's rescan records the rest and marks it.
        if !initialized && (self.waiting.rescan_pending || !self.mark_initialized(now, rt)) {
            self.start = Start::FirstUnrecorded;
        }
    }
}

/// Tells the runtime which files a scan reads next ([`Runtime::read_soon`]):
/// each name in the folders its listing names it in (a name listed in none
/// is read in all three, but it is held and its files gone: none to ask for).
/// Names whose file a scan read and found unchanged since are left out:
/// it will not be read ([`Node::unchanged_since_read`]).
fn read_soon<'a>(names: impl Iterator<Item = (&'a str, InFolders)>, replica: &Replica, rt: &mut impl Runtime) {
    let files: Vec<(Folder, &str)> = names
        .filter(|(name, _)| replica.file_token(*name).is_none())
        .flat_map(|(name, listed)| {
            Folder::ALL.into_iter().filter(move |&folder| listed.contains(folder)).map(move |folder| (folder, name))
        })
        .collect();
    if !files.is_empty() {
        rt.read_soon(&files);
    }
}

/// At name `at` of a scan reading the names `ahead` yields, in order: at
/// the first, asks for the first two chunks of [`RECONCILE_CHUNK`] names
/// (in one call: the runtime decides at each call by what reads found
/// since the last, and a second call before any read would find nothing),
/// and at each chunk's first name after, for the chunk after it.
fn read_soon_at<'a>(
    at: usize,
    ahead: &mut impl Iterator<Item = (&'a str, InFolders)>,
    replica: &Replica,
    rt: &mut impl Runtime,
) {
    if at.is_multiple_of(RECONCILE_CHUNK) {
        let first = if at == 0 { RECONCILE_CHUNK } else { 0 };
        read_soon(ahead.take(first + RECONCILE_CHUNK), replica, rt);
    }
}

/// An id's files as a scan reads them, and the folders read: only those
/// its listing named (one file, not three, for nearly every key), the
/// others taken as absent. When a file the listing named is gone (moved or
/// deleted since), all three are read; an id the listing named in no folder
/// (held, its files gone) is read in all three, and every name when a
/// folder could not be listed ([`Names`]). A live reading of the listed
/// folders that would decide anything is made again of all three
/// ([`Node::observe_name`]): a scan decides nothing on its listing's word.
///
/// With them, the token of the id's one key file when it is the only file
/// read and is in `minions/` or `minions_rejected/`
/// ([`crate::core::observe::FileToken`]).
fn read_listed(id: &MinionId, listed: InFolders, rt: &mut impl Runtime) -> (Slots, InFolders, Option<FileToken>) {
    read_folders(id, listed, rt).unwrap_or_else(|| read_all(id, rt))
}

/// An id's files in all three folders, as [`read_listed`] gives them.
fn read_all(id: &MinionId, rt: &mut impl Runtime) -> (Slots, InFolders, Option<FileToken>) {
    let (slots, token) = rt.read_slots_token(id);
    (slots, InFolders::ALL, token)
}

/// An id's files in `folders`, the others taken as absent; `None` when one
/// of them is absent.
fn read_folders(
    id: &MinionId,
    folders: InFolders,
    rt: &mut impl Runtime,
) -> Option<(Slots, InFolders, Option<FileToken>)> {
    if folders.is_empty() || folders == InFolders::ALL {
        return Some(read_all(id, rt));
    }
    let (mut slots, mut tokens) = (Slots::EMPTY, [None; 3]);
    for folder in Folder::ALL.into_iter().filter(|&folder| folders.contains(folder)) {
        let (slot, token) = rt.read_slot_token(folder, id);
        if matches!(slot, Slot::Absent) {
            return None;
        }
        *slots.get_mut(folder) = slot;
        tokens[folder.index()] = token;
    }
    let token = slots.only_key(|folder| tokens[folder.index()]);
    Some((slots, folders, token))
}
