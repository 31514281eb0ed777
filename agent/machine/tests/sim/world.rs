//! The simulated cluster: masters whose agents are the real node machine,
//! a network that drops, duplicates and reorders, and one event queue in
//! virtual time (`events`: what it holds). `operators` runs `salt-key` on the folders, `network`
//! carries messages, `sessions` drives the agent's link machine on each link,
//! `faults` kills, restarts, partitions and fills disks, `guard` runs mass
//! deletes and releases or reverts them; `recorded` checks each decision as
//! a store records it, `checker` judges the end of a run (`audited` on the
//! audit records the agent makes of what each node told).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use keysync_machine::core::settle::{FsChange, SettleTimings};
use keysync_machine::core::{Decision, Folder, MinionId, Version};
use keysync_machine::node::{self, Fetch, FsEvent, Loaded, Node, Now, Settings, FETCH_CHUNK};

use crate::model::*;
use crate::runtime::{Outbox, SimRuntime, Store};
use crate::*;

mod audited;
mod checker;
mod events;
mod faults;
mod guard;
mod network;
mod operators;
mod recorded;
mod sessions;
mod trace;

pub(crate) use audited::Holds;
pub(crate) use checker::Verdicts;
use events::{event_kind, Queued};
pub(crate) use events::{Event, Msg};

/// One master: its folders, store and audit log, and its agent when running.
pub(crate) struct SimNode {
    pub(crate) name: String,
    salt: Salt,
    clock_offset_ms: u64,
    /// The agent, while it runs.
    pub(crate) machine: Option<Node>,
    joined: bool,
    /// Asks for and sends whole buckets (agents before 0.2 do neither).
    whole: bool,
    /// Bumped on every kill and start: timers of an older life are ignored.
    epoch: u64,
    pub(crate) disk: Disk,
    pub(crate) store: Store,
    pub(crate) audit: Vec<node::Event>,
    /// The audit records the agent makes of `audit`, as its log holds them.
    pub(crate) records: Vec<keysync_audit::Record>,
    /// The holds of deletes its guard made: each ends with a record.
    pub(crate) holds: Holds,
    next_tick: Option<u64>,
    /// Ids with operator steps still to come.
    in_flight: BTreeSet<MinionId>,
    /// Ids the operator changed that the agent has not decided on since.
    touched: BTreeMap<MinionId, Expect>,
    /// This node's link to each peer: the agent's link machine.
    links: Vec<sessions::SimLink>,
    /// Peers' pushes arrived and not yet handed to the machine: handed
    /// together, as the agent's core hands it the requests queued.
    inbox: Vec<(keysync_machine::PeerName, Vec<Decision>)>,
    /// Percentage of write effects failing (0: the disk is fine).
    disk_full: u64,
    /// Ids the operator changed since the agent last decided them: only
    /// these may become local decisions (anything else is the agent's own
    /// write taken for an operator's).
    undecided_changes: BTreeSet<MinionId>,
    /// Killed at the n-th effect of its next input.
    kill_after: Option<u32>,
    /// Ids recorded in an input the node was killed in: their audit records
    /// may have been buffered and lost with the process (the store commit
    /// comes before the audit write; conflicts alone are kept until told).
    pub(crate) audit_maybe_lost: BTreeSet<MinionId>,
    /// Every delete its guard ever held (id, version).
    pub(crate) ever_held: BTreeSet<(MinionId, Version)>,
    /// What its store held of each id it compacted, as it was then.
    pub(crate) compacted: Vec<(MinionId, keysync_machine::node::testing::Stored)>,
    /// Per id an operator's release or revert named, what the store held
    /// then (a failed write may delay its decision past later ones).
    pub(crate) commanded: BTreeMap<MinionId, keysync_machine::node::testing::Stored>,
    /// Ids an operator's command still retries (writes failed).
    pub(crate) command_retrying: BTreeSet<MinionId>,
}

impl SimNode {
    pub(crate) fn up(&self) -> bool {
        self.machine.is_some()
    }

    fn wall_ms(&self, now: u64) -> u64 {
        EPOCH_MS + now + self.clock_offset_ms
    }
}

/// A decision made durable on its origin, and when.
#[derive(Clone, Debug)]
pub(crate) struct Made {
    pub(crate) decision: Decision,
    pub(crate) at: u64,
}

pub(crate) struct Sim {
    pub(crate) rng: Rng,
    pub(crate) now: u64,
    base: Instant,
    queue: BinaryHeap<Reverse<Queued>>,
    seq: u64,
    pub(crate) nodes: Vec<SimNode>,
    pub(crate) ids: Vec<MinionId>,
    chaos: bool,
    reliable: bool,
    /// The active partition: its number and each node's side.
    partition: Option<(u64, Vec<bool>)>,
    /// Which masters have each other as peers: all of them, or for some
    /// seeds a connected partial mesh (a ring and some chords), where a
    /// decision reaches most masters by forwarding.
    linked: Vec<Vec<bool>>,
    n_partitions: u64,
    final_at: Option<u64>,
    /// Every decision made durable on its origin, per id.
    pub(crate) made: BTreeMap<MinionId, Vec<Made>>,
    /// When each node first applied each version: (node, id, version) → time.
    pub(crate) applied_at: BTreeMap<(usize, MinionId, Version), u64>,
    /// Every version each node's machine was handed or made, per id: what
    /// its decisions may claim to know.
    pub(crate) delivered: Vec<BTreeMap<MinionId, BTreeSet<Version>>>,
    /// Ids some node held when the late joiner first started.
    held_at_join: BTreeMap<MinionId, Decision>,
    joiner: Option<usize>,
    /// When each node last answered a Fetch of each peer: (server, client) → time.
    fetched_at: BTreeMap<(usize, usize), u64>,
    pub(crate) stats: Stats,
    /// A hash of everything that happened, to compare two runs of one seed.
    trace_hash: std::collections::hash_map::DefaultHasher,
    /// Print every event (when one seed is rerun).
    pub(crate) trace: bool,
}

impl Sim {
    pub(crate) fn new(seed: u64, trace: bool) -> Sim {
        let mut rng = Rng(seed);
        let n_nodes = rng.between(3, 7) as usize;
        let ids: Vec<MinionId> = (0..N_IDS).map(|i| MinionId::parse(&format!("m{i:02}")).unwrap()).collect();
        let mut nodes = Vec::new();
        for idx in 0..n_nodes {
            let salt = if rng.percent(50) { Salt::V3006 } else { Salt::V3008 };
            // Some masters still run an earlier release (a rolling upgrade).
            let whole = !rng.percent(15);
            let mut disk = Disk::default();
            // The highest-named master may join late (below): it rejected more,
            // so its rejections meet live accepts of the very same keys.
            let rejects = if idx + 1 == n_nodes { 30 } else { 5 };
            for id in &ids[..N_PREEXISTING] {
                // Masters that were kept in step by hand, not quite perfectly.
                let (folder, variant) = match rng.below(100) {
                    r if r < 75 - rejects => (Folder::Accepted, 0),
                    r if r < 80 - rejects => (Folder::Accepted, 1),
                    r if r < 80 => (Folder::Rejected, 0),
                    85..=89 => (Folder::Pending, 2),
                    80..=84 => (Folder::Pending, 0),
                    _ => continue,
                };
                disk.change(&Change::Put(folder, id.to_string(), key_bytes(id.as_str(), variant)));
            }
            nodes.push(SimNode {
                name: format!("n{idx}"),
                salt,
                clock_offset_ms: rng.between(0, 1500),
                machine: None,
                joined: false,
                whole,
                epoch: 0,
                disk,
                store: Store::default(),
                audit: Vec::new(),
                records: Vec::new(),
                holds: Holds::default(),
                next_tick: None,
                in_flight: BTreeSet::new(),
                touched: BTreeMap::new(),
                links: (0..n_nodes).map(|_| sessions::SimLink::new(&mut rng, 0)).collect(),
                inbox: Vec::new(),
                disk_full: 0,
                undecided_changes: BTreeSet::new(),
                kill_after: None,
                audit_maybe_lost: BTreeSet::new(),
                ever_held: BTreeSet::new(),
                compacted: Vec::new(),
                commanded: BTreeMap::new(),
                command_retrying: BTreeSet::new(),
            });
        }
        // Sometimes the highest-named master joins late with the folders it had at the start.
        let joiner = (n_nodes >= 4 && rng.percent(50)).then_some(n_nodes - 1);
        // Some are new masters, their folders empty: they fetch everything whole.
        let empty_joiner = joiner.filter(|_| rng.percent(33));
        if let Some(j) = empty_joiner {
            nodes[j].disk = Disk::default();
        }
        let linked = mesh(&mut rng, n_nodes);
        let mut sim = Sim {
            rng,
            now: 0,
            base: Instant::now(),
            queue: BinaryHeap::new(),
            seq: 0,
            nodes,
            ids,
            chaos: true,
            reliable: false,
            partition: None,
            linked,
            n_partitions: 0,
            final_at: None,
            made: BTreeMap::new(),
            applied_at: BTreeMap::new(),
            held_at_join: BTreeMap::new(),
            delivered: vec![BTreeMap::new(); n_nodes],
            joiner,
            fetched_at: BTreeMap::new(),
            stats: Stats::default(),
            trace_hash: Default::default(),
            trace,
        };
        for node in 0..n_nodes {
            let at = if Some(node) == joiner { sim.rng.between(5_000, 20_000) } else { sim.rng.between(0, 50) };
            sim.schedule(at, Event::Join { node });
        }
        trace!(sim, "seed {seed}: {n_nodes} masters {:?}", sim.nodes.iter().map(|n| n.salt).collect::<Vec<_>>());
        sim.stats.earlier_release = sim.nodes.iter().filter(|n| !n.whole).count() as u64;
        sim.stats.empty_joiners = u64::from(empty_joiner.is_some());
        if sim.linked.iter().flatten().filter(|&&peers| !peers).count() > n_nodes {
            sim.stats.partial_meshes += 1;
            trace!(sim, "partial mesh: {:?}", sim.linked);
        }
        sim.schedule(100, Event::Operator);
        sim.schedule(1_000, Event::Fault);
        sim.schedule(CHAOS_MS, Event::Calm);
        sim
    }

    /// Runs to quiescence and judges; returns the run's figures and its trace hash.
    pub(crate) fn run(mut self) -> (Stats, u64) {
        let mut n_events = 0u64;
        while let Some(Reverse(Queued { at, seq, event })) = self.queue.pop() {
            self.now = at;
            n_events += 1;
            if n_events > 3_000_000 || self.final_at.is_some_and(|t| at > t + 120_000) {
                self.fail(format!("no quiescence after {n_events} events"));
            }
            (at, seq, event_kind(&event)).hash(&mut self.trace_hash);
            self.handle(event);
        }
        self.judge();
        for n in &self.nodes {
            if let Some(machine) = &n.machine {
                let mut entries: Vec<_> =
                    machine.entries().map(|(id, e)| (id.to_string(), e.version.to_string())).collect();
                entries.sort();
                entries.hash(&mut self.trace_hash);
            }
            n.audit.len().hash(&mut self.trace_hash);
        }
        (self.stats, self.trace_hash.finish())
    }

    pub(crate) fn schedule(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.queue.push(Reverse(Queued { at, seq: self.seq, event }));
    }

    fn instant(&self, ms: u64) -> Instant {
        self.base + Duration::from_millis(ms)
    }

    fn ms_of(&self, instant: Instant) -> u64 {
        instant.saturating_duration_since(self.base).as_millis() as u64
    }

    pub(crate) fn settings(&self, node: usize) -> Settings {
        Settings {
            node: self.nodes[node].name.as_str().into(),
            max_clock_skew: Duration::from_millis(MAX_SKEW_MS),
            rescan_interval: Duration::from_millis(RESCAN_MS),
            // A few names per step: the periodic rescan takes several turns,
            // between which everything else goes on.
            rescan_step: 1 + node % 4,
            // A few ids per fetch but on the first node (the agent's): a
            // plan of the run's 30 ids takes several chunks, the next
            // fetched while the last is applied, its claims held meanwhile.
            fetch_chunk: [FETCH_CHUNK, 2, 5, 3, 7, 4, 6][node % 7],
            settle: SettleTimings::default(),
            observe: false,
            guard: guard::settings(),
            tombstone_ttl: Duration::from_millis(TOMBSTONE_TTL_MS),
            masters: self.nodes.iter().map(|n| n.name.as_str().into()).collect(),
        }
    }

    #[track_caller]
    pub(crate) fn fail(&self, msg: String) -> ! {
        panic!("at t={}ms: {msg}", self.now);
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Operator => self.operator(),
            Event::Step { node, id, step, last } => self.step(node, id, step, last),
            Event::Fs { node, epoch, events } => {
                if self.nodes[node].epoch == epoch && self.nodes[node].up() {
                    self.inotify(node, events);
                }
            }
            Event::Tick { node, epoch } => {
                if self.nodes[node].epoch == epoch && self.nodes[node].up() {
                    self.nodes[node].next_tick = None;
                    self.input(node, |machine, rt, now| machine.on_tick(now, rt));
                }
            }
            Event::Deliver { from, to, msg } => self.deliver(from, to, msg),
            Event::Connect { node, peer, session } => self.connect(node, peer, session),
            Event::Due { node, peer, timer } => self.due(node, peer, timer),
            Event::Pump { node, peer } => self.scheduled_pump(node, peer),
            Event::Broken { node, peer, session } => self.broken(node, peer, session),
            Event::PushLost { node, peer, session } => self.push_lost(node, peer, session),
            Event::Timeout { node, peer, req } => self.timeout(node, peer, req),
            Event::Arrive { node, epoch } => self.arrive(node, epoch),
            Event::Fault => self.fault(),
            Event::Restart { node, epoch } => {
                let n = &self.nodes[node];
                if n.up() || n.epoch != epoch {
                    return;
                }
                self.start(node);
            }
            Event::Join { node } => self.first_start(node),
            Event::Heal { partition } => {
                if self.partition.as_ref().is_some_and(|(p, _)| *p == partition) {
                    self.heal();
                }
            }
            Event::DiskHeals { node } => {
                trace!(self, "{} disk has room again", self.nodes[node].name);
                self.nodes[node].disk_full = 0;
            }
            Event::Calm => {
                self.chaos = false;
                self.schedule(self.now + CALM_MS, Event::Final);
            }
            Event::Final => self.final_restart(),
            Event::FinalRound => {
                for node in 0..self.nodes.len() {
                    self.anti_entropy(node);
                }
            }
            Event::Resolve { round } => self.resolve(round),
            Event::MassDelete { node, ids } => self.mass_delete_next(node, ids),
        }
    }

    // ---- inputs to a node's machine ----

    /// Runs one input on a running node's machine against its world, then
    /// carries what left the node: messages, the echoes of its writes, its death.
    pub(crate) fn input<T>(
        &mut self,
        node: usize,
        f: impl FnOnce(&mut Node, &mut SimRuntime<'_>, Now) -> T,
    ) -> Option<T> {
        let now = Now { mono: self.instant(self.now), wall_ms: self.nodes[node].wall_ms(self.now) };
        let n = &mut self.nodes[node];
        let mut machine = n.machine.take()?;
        let held_before = guard::held_versions(&n.store);
        let mut rt = runtime_of(n, &mut self.rng);
        let result = f(&mut machine, &mut rt, now);
        let out = rt.finish();
        if !out.killed {
            self.nodes[node].machine = Some(machine);
        }
        self.check_held(node, &held_before, out.killed);
        self.after_input(node, out);
        Some(result)
    }

    /// Starts a node's agent from its store (a first start when the store is new).
    pub(crate) fn boot(&mut self, node: usize) {
        let settings = self.settings(node);
        let now = Now { mono: self.instant(self.now), wall_ms: self.nodes[node].wall_ms(self.now) };
        let n = &mut self.nodes[node];
        n.epoch += 1;
        n.next_tick = None;
        let loaded: Loaded = n.store.loaded();
        let held_before = guard::held_versions(&n.store);
        let mut rt = runtime_of(n, &mut self.rng);
        let machine = Node::start(settings, loaded, now, &mut rt);
        let out = rt.finish();
        if !out.killed {
            self.nodes[node].machine = Some(machine);
        }
        self.check_held(node, &held_before, out.killed);
        self.after_input(node, out);
        // Whatever start-up did not decide needed no decision; a salt-key run
        // still going on is judged as it finishes.
        let n = &mut self.nodes[node];
        let in_flight = n.in_flight.clone();
        n.touched.retain(|id, _| in_flight.contains(id));
    }

    fn after_input(&mut self, node: usize, mut out: Outbox) {
        if self.trace {
            self.trace_told(node, out.audit_before);
        }
        if let Some(id) = out.wrote_into_runs.first() {
            self.fail(format!("{} wrote {id} while a salt-key run on it was in progress", self.nodes[node].name));
        }
        if out.killed {
            let ids = out.recorded.iter().map(|(d, _, _)| d.id.clone());
            self.nodes[node].audit_maybe_lost.extend(ids);
        }
        self.note_recorded(node, std::mem::take(&mut out.recorded));
        let n = &self.nodes[node];
        let name = n.name.clone();
        self.stats.dfn += u64::from(out.dfn_dropped);
        self.stats.cold_read += out.cold_read;
        self.stats.unchanged += out.unchanged;
        self.stats.compacted += out.compacted;
        self.nodes[node].compacted.append(&mut out.forgotten);
        if out.killed {
            trace!(self, "{name} killed mid-input");
            self.stats.kills_mid_input += 1;
            self.crash(node);
            return;
        }
        // Handed to the links (a node killed in the input pushed nothing).
        for (except, decisions) in out.sends {
            self.outgoing(node, except, decisions);
        }
        if !out.echoes.is_empty() {
            let at = self.now + self.rng.between(0, 2);
            let epoch = self.nodes[node].epoch;
            self.schedule(at, Event::Fs { node, epoch, events: out.echoes });
        }
        self.schedule_tick(node);
    }

    fn schedule_tick(&mut self, node: usize) {
        let Some(due) = self.nodes[node].machine.as_ref().and_then(Node::poll_at) else { return };
        let at = self.ms_of(due).max(self.now);
        // After the final rounds only what is due soon matters (the periodic rescan never ends).
        if self.final_at.is_some_and(|t| at > t + QUIET_AFTER_FINAL_MS) {
            return;
        }
        let n = &self.nodes[node];
        if n.next_tick.is_none_or(|t| at < t) {
            let epoch = n.epoch;
            self.nodes[node].next_tick = Some(at);
            self.schedule(at, Event::Tick { node, epoch });
        }
    }

    fn inotify(&mut self, node: usize, events: Vec<(Folder, String, FsChange)>) {
        // Sometimes the kernel queue overflows: the events are lost, the agent rescans.
        if !self.reliable && self.rng.percent(OVERFLOW_PCT) {
            trace!(self, "{} inotify overflow", self.nodes[node].name);
            self.stats.overflows += 1;
            self.input(node, |machine, rt, now| machine.on_lost("inotify queue overflow", now, rt));
            return;
        }
        self.input(node, |machine, _, now| {
            for (folder, name, change) in events {
                machine.on_fs(&FsEvent { folder, name, change }, now);
            }
        });
    }
}

/// The runtime one input of node `n` runs against: its folders, store and
/// audit log, with nothing told yet.
fn runtime_of<'a>(n: &'a mut SimNode, rng: &'a mut crate::model::Rng) -> SimRuntime<'a> {
    let audit_before = n.audit.len();
    n.holds.started(n.epoch, &n.store);
    SimRuntime {
        disk: &mut n.disk,
        store: &mut n.store,
        audit: &mut n.audit,
        records: &mut n.records,
        node: &n.name,
        holds: &mut n.holds,
        buffered: Vec::new(),
        out: Outbox { audit_before, ..Outbox::default() },
        kill_after: &mut n.kill_after,
        disk_full: n.disk_full,
        rng,
        in_flight: &n.in_flight,
    }
}

/// Which masters are peers of which: a full mesh, or for a third of the
/// seeds of four masters or more a ring with each chord kept at even odds.
fn mesh(rng: &mut Rng, n: usize) -> Vec<Vec<bool>> {
    let partial = n >= 4 && rng.percent(33);
    let mut linked = vec![vec![!partial; n]; n];
    if partial {
        let pairs = (0..n).flat_map(|a| (a + 1..n).map(move |b| (a, b)));
        for (a, b) in pairs {
            let ring = b == a + 1 || (a == 0 && b == n - 1);
            let kept = ring || rng.percent(50);
            (linked[a][b], linked[b][a]) = (kept, kept);
        }
    }
    linked
}
