//! The node state machine: everything one agent decides, as plain code
//! driven by inputs, with every effect asked of a [`Runtime`].
//!
//! Inputs: folder events ([`Node::on_fs`]), lost events ([`Node::on_lost`]),
//! the passing of time ([`Node::on_tick`] at [`Node::poll_at`]), peers'
//! decisions ([`Node::on_batches`]), peers' anti-entropy requests
//! (`repair.rs`) and links coming and going. Time comes in with the inputs
//! ([`Now`]); the machine reads no clock, no file and no socket. The agent's
//! executor and the simulation drive this same code.

mod cold;
pub mod event;
mod guard;
mod held;
mod inventory;
mod local;
mod plan;
mod put_back;
mod remote;
mod repair;
pub mod runtime;
mod stale;
#[cfg(any(test, feature = "testkit"))]
pub mod testing;
#[cfg(test)]
mod tests;
mod trouble;
mod waiting;

use crate::PeerName;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::core::echo::Echoes;
use crate::core::replica::Replica;
use crate::core::settle::{FsChange, SettleTimings, Settler};
use crate::core::version::Hlc;
use crate::core::{Decision, Entry, Fingerprint, Folder, MinionId, VerdictKind, Version};

pub use crate::core::observe::FileToken;
pub use event::{Event, Found, Settled};
pub use guard::{GuardSettings, HeldDelete};
pub use held::{OperatorAction, Outcome};
pub use inventory::Held;
pub use local::RESCAN_STEP;
pub use plan::{Holding, PlanRow};
pub use repair::{
    Asking, BadAnswer, Compared, DiffAnswer, Fetch, Summaries, Whole, FETCH_CHUNK, FIRST_BUCKET_MOST, FIRST_WHOLE,
    MAX_FETCH, MAX_PLANNED, MAX_ROWS_PER_ID, MAX_WHOLE_PER_BUCKET,
};
pub use runtime::{Applied, Failure, Kept, Listing, Runtime, StoreWrite};
pub use stale::Stale;
pub use waiting::{Due, Kind, Wait, Waits};

/// The node's settings, from the agent's config.
#[derive(Clone, Debug)]
pub struct Settings {
    /// This node's name (a DNS SAN of its certificate).
    pub node: Arc<str>,
    pub max_clock_skew: Duration,
    /// How often every name is compared with the store anyway.
    pub rescan_interval: Duration,
    /// Names that periodic rescan reads per turn ([`RESCAN_STEP`] in the
    /// agent; a few in the simulation, so that its steps meet everything
    /// else).
    pub rescan_step: usize,
    /// Most ids one Fetch of this node asks for ([`FETCH_CHUNK`] in the
    /// agent; a few in the simulation, so that its plans take several
    /// chunks, one fetched while the last is applied). Taken as 1 to
    /// [`MAX_FETCH`], what peers answer: [`Settings::ids_per_fetch`].
    pub fetch_chunk: usize,
    pub settle: SettleTimings,
    /// Observe mode: the executor writes nothing to the key folders (see
    /// `plan.rs`); the machine only needs to know it to say what they hold.
    pub observe: bool,
    /// The blast-radius guard (`guard.rs`).
    pub guard: GuardSettings,
    /// How long a plain tombstone is kept (`cold.rs`): longer than any
    /// master may be out of contact.
    pub tombstone_ttl: Duration,
    /// The site's masters: this node's configured peers (and masters retired
    /// from the site whose decisions still stand). A peer's decision whose
    /// origin is none of them nor this node is refused (`remote.rs`).
    pub masters: BTreeSet<Arc<str>>,
}

impl Settings {
    /// [`Settings::fetch_chunk`], within what a Fetch may ask for.
    pub(crate) fn ids_per_fetch(&self) -> usize {
        self.fetch_chunk.clamp(1, MAX_FETCH)
    }
}

/// The time an input happens at: monotonic for timers, wall-clock
/// milliseconds for versions.
#[derive(Clone, Copy, Debug)]
pub struct Now {
    pub mono: Instant,
    pub wall_ms: u64,
}

/// What the store held when the node started.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Every entry but the plain tombstones, which stay in the store.
    pub entries: Vec<(MinionId, Entry)>,
    /// The store's plain tombstones per digest bucket (empty: none).
    pub cold: Vec<u32>,
    /// Decisions journalled and not recorded: a stop interrupted their apply.
    pub journal: Vec<Decision>,
    pub clock: u64,
    /// False on the agent's very first start with this store.
    pub initialized: bool,
    /// Conflicts kept in the store that may not have been told (see [`StoreWrite::conflicts`]).
    pub untold: Vec<(PeerName, crate::core::merge::Conflict)>,
    /// Peers' deletes the guard held (see `guard.rs`).
    pub held: Vec<HeldDelete>,
    /// The last completed comparison with any peer (wall-clock ms; see
    /// `stale.rs`), if the store has one.
    pub last_contact_ms: Option<u64>,
    /// Per origin, when the newest delete this store forgot was made.
    pub forgot: Vec<(Arc<str>, u64)>,
    /// When this store started afresh (an hlc; 0: not known, a store of an
    /// earlier release): made by `recover --from-peers`, or new. A first
    /// start of a store that does not say starts afresh then.
    pub afresh: u64,
    /// Keys put back whose files may not be written yet (`put_back.rs`).
    pub putting_back: Vec<MinionId>,
}

/// A file event in one of the three key folders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsEvent {
    pub folder: Folder,
    pub name: String,
    pub change: FsChange,
}

/// Where the start-up is: a first start is recorded in steps, and the
/// store is initialized only after the last step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Start {
    /// A restart, or a first start fully recorded.
    Done,
    /// A first start's steps are being recorded: not initialized yet.
    FirstInSteps,
    /// A first start's files could not all be recorded: rescans observe as a
    /// first start (bootstrap versions) until one records them.
    FirstUnrecorded,
}

/// A peer's decision waiting, and who brought it.
type FromPeer = (PeerName, Decision);

pub struct Node {
    settings: Settings,
    replica: Replica,
    settler: Settler,
    /// Changes the agent made in the watched folders, to be heard back.
    echoes: Echoes,
    /// Pending keys seen, to audit each new one once.
    pending: HashMap<MinionId, Fingerprint>,
    /// Refused files already audited, to audit each once per reason.
    refused: HashMap<(Folder, String), String>,
    /// What waits, and the timers (see [`Node::waits`]).
    waiting: waiting::Waiting,
    start: Start,
    trouble: trouble::WriteTrouble,
    /// Peers' versions already refused (clock skew, or claiming this node as
    /// origin): each is told once, however often it arrives again (bounded:
    /// see `remote.rs` `first_report`).
    reported: HashSet<(MinionId, Version)>,
    /// What a first start found, told once it is recorded.
    inventory: inventory::Inventory,
    /// The latest time an input came with (a retry with no backoff pending is due then).
    seen: Instant,
    repairs: repair::Repairs,
    guard: guard::Guard,
    /// The last contact with a peer, and whether it is too long ago (`stale.rs`).
    contact: stale::Contact,
    /// When this node's store started afresh (an hlc, see
    /// [`Loaded::afresh`]; 0: not known): a decision naming this node as
    /// its origin, older than that and unknown here, is its own forgotten
    /// past (`remote.rs`).
    afresh: u64,
}

impl Node {
    /// Loads what the store held, finishes decisions a stop interrupted,
    /// and reconciles the folders with the store.
    pub fn start(settings: Settings, loaded: Loaded, now: Now, rt: &mut impl Runtime) -> Node {
        let mut replica = Replica::new(&settings.node, Hlc::resume(loaded.clock));
        let afresh = match loaded.afresh {
            0 if !loaded.initialized => now.wall_ms << crate::core::version::LOGICAL_BITS,
            at => at,
        };
        // Whatever this node decides from now on is later than its past.
        replica.witness(afresh);
        replica.reserve(loaded.entries.len());
        for (id, entry) in loaded.entries {
            replica.load(id, entry);
        }
        replica.set_cold(loaded.cold);
        let mut node = Node {
            settler: Settler::new(settings.settle.clone()),
            guard: guard::Guard::new(settings.guard.clone()),
            waiting: waiting::Waiting::new(now.mono + settings.rescan_interval, now.mono, loaded.putting_back),
            seen: now.mono,
            settings,
            replica,
            echoes: Echoes::default(),
            pending: HashMap::new(),
            refused: HashMap::new(),
            start: Start::Done,
            trouble: trouble::WriteTrouble::default(),
            reported: HashSet::new(),
            inventory: inventory::Inventory::default(),
            repairs: repair::Repairs::default(),
            contact: stale::Contact::loaded(loaded.last_contact_ms, loaded.forgot),
            afresh,
        };
        for held in loaded.held {
            node.guard.load(held);
        }
        node.tell_untold(loaded.untold, now, rt);
        node.finish_journal(loaded.journal, now, rt);
        node.finish_put_back(now, rt);
        node.reconcile(loaded.initialized, now, rt);
        node.recheck_held(now, rt);
        node.cool();
        node
    }

    /// While writes fail (a full disk, a store that cannot commit): how long
    /// since the episode began, and the last error.
    pub fn write_trouble(&self, now: Instant) -> Option<(Duration, String)> {
        self.trouble.failing().map(|(since, error)| (now.saturating_duration_since(since), error.to_string()))
    }

    /// The site's masters changed (a reload): see [`Settings::masters`].
    pub fn set_masters(&mut self, masters: BTreeSet<Arc<str>>) {
        self.settings.masters = masters;
    }

    pub fn name(&self) -> &str {
        &self.settings.node
    }

    /// The hybrid clock: the millisecond part of the next decision this
    /// node makes is at least this one's, or the wall clock if later.
    pub fn clock(&self) -> u64 {
        self.replica.clock()
    }

    /// Folder events, as inotify reported them: the agent's own echoes are
    /// dropped, the others collected until their id settles. Read at the
    /// next [`Node::on_tick`] (call it when [`Node::poll_at`] says).
    pub fn on_fs(&mut self, event: &FsEvent, now: Now) {
        self.seen = now.mono;
        if self.is_stale() {
            return;
        }
        if !self.echoes.is_echo(event.folder, &event.name, event.change, now.mono) {
            // A change heard is read in full once settled, whatever the
            // file's token says: a file's times can lag its bytes (a write
            // through a shared mapping, a write whose copy stalled).
            self.replica.set_file_token(event.name.as_str(), None);
            self.settler.on_event(event.folder, &event.name, event.change, now.mono);
        }
    }

    /// Events were lost, and are lost again later in the same burst of
    /// events, where [`Node::on_lost`] lists and reads every name: only
    /// what it does at once, nothing listed as an echo awaited any more
    /// (the events that follow are not taken for the agent's own writes).
    pub fn on_lost_again_later(&mut self, now: Now) {
        self.seen = now.mono;
        if self.is_stale() {
            return;
        }
        self.echoes.clear();
    }

    /// Events were lost (a queue overflow): nothing listed as an echo is
    /// awaited any more, and every name is read again once it has settled.
    pub fn on_lost(&mut self, why: &str, now: Now, rt: &mut impl Runtime) {
        self.seen = now.mono;
        if self.is_stale() {
            return;
        }
        self.echoes.clear();
        self.recheck_all(why, now, rt);
        self.cool();
    }

    /// Does what is due at `now` ([`Node::waits`]): reads settled names,
    /// retries failed writes once the backoff allows, merges deferred
    /// decisions, the guard's timers, the periodic rescan and compaction.
    pub fn on_tick(&mut self, now: Now, rt: &mut impl Runtime) {
        self.seen = now.mono;
        if self.is_stale() {
            return;
        }
        // In `Wait::ALL`'s order, each asked again when its turn comes (what
        // ran before may have failed and set a backoff, or made it due).
        for what in Wait::ALL {
            if self.is_due(what, now.mono) {
                self.run(what, now, rt);
            }
        }
        self.cool();
    }

    /// When [`Node::on_tick`] next has something to do: the soonest of
    /// [`Node::waits`]. None once stale: nothing runs until `rejoin`.
    pub fn poll_at(&self) -> Option<Instant> {
        if self.is_stale() {
            return None;
        }
        self.waits().filter_map(|waits| waits.due.at()).min()
    }

    /// Number of decisions held.
    pub fn len(&self) -> usize {
        self.replica.len()
    }

    /// Ids the map of held decisions has room for.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.replica.capacity()
    }

    pub fn is_empty(&self) -> bool {
        self.replica.is_empty()
    }

    /// Decisions held per verdict: (accepted, rejected, deleted).
    pub fn counts(&self) -> (usize, usize, usize) {
        let mut counts = (0, 0, 0);
        for (_, entry) in self.replica.entries() {
            match entry.kind {
                VerdictKind::Accepted => counts.0 += 1,
                VerdictKind::Rejected => counts.1 += 1,
                VerdictKind::Deleted => counts.2 += 1,
            }
        }
        counts.2 += self.replica.n_cold();
        counts
    }

    /// The entry held for `id`.
    pub fn entry(&self, id: &MinionId) -> Option<&Entry> {
        self.replica.entry(id)
    }

    /// Every entry held in memory (for checks and `status`): plain
    /// tombstones stay in the store (`cold.rs`).
    pub fn entries(&self) -> impl Iterator<Item = (&MinionId, &Entry)> {
        self.replica.entries()
    }

    /// Whether writes are failing right now.
    pub fn is_failing(&self) -> bool {
        self.trouble.is_failing()
    }

    /// Whether no work waits ([`Kind::Work`]): the periodic rescan and
    /// compaction are always due, and never make the node busy.
    pub fn is_quiet(&self) -> bool {
        self.waits().all(|waits| waits.kind == Kind::Housekeeping)
    }

    /// Peers' deletes the guard holds, by id.
    pub fn held(&self) -> impl Iterator<Item = &HeldDelete> {
        self.guard.held()
    }

    /// See [`guard::Guard::held_changes`]: unchanged, so are the held deletes.
    pub fn held_changes(&self) -> u64 {
        self.guard.held_changes()
    }

    /// Peers' decisions for `id` whose write waits for a retry (`retry`,
    /// `retry_settling`, the journal not finished yet): one per id in flight.
    fn retried<'a>(&'a self, id: &'a MinionId) -> impl Iterator<Item = &'a Decision> + 'a {
        let waiting = &self.waiting;
        let journal = waiting.journal.iter();
        waiting.retry.iter().chain(&waiting.retry_settling).map(|(_, d)| d).chain(journal).filter(move |d| d.id == *id)
    }

    /// Keys accepted here (what the folders show).
    fn n_accepted(&self) -> usize {
        self.replica.n_accepted()
    }
}
