//! The simulated cluster: nodes, the event queue and the operator's side of the loop.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::{Duration, Instant};

use salt_keysync::core::merge::{Conflict, MergeOutcome};
use salt_keysync::core::observe::interpret;
use salt_keysync::core::replica::{ObserveMode, Replica};
use salt_keysync::core::settle::{looks_like_salt_tmp, FsChange, SettleTimings, Settler};
use salt_keysync::core::version::Hlc;
use salt_keysync::core::{Decision, Folder, MinionId, Verdict, Version};

use crate::model::*;
use crate::*;

mod faults;
mod replication;
mod verdict;

#[derive(Clone, Debug)]
pub(crate) enum Msg {
    /// A decision pushed on commit and forwarded on apply.
    Push(Decision),
    /// Anti-entropy, in order: the requester's digests, the peer's summaries of the differing
    /// buckets, the ids newer on the peer, and the peer's full decisions for them.
    Digests(Vec<u64>),
    Summaries(Vec<(MinionId, Version)>),
    Fetch(Vec<MinionId>),
    Decisions(Vec<Decision>),
}

/// Everything that happens, run in order of virtual time, then of scheduling.
#[derive(Debug)]
pub(crate) enum Event {
    Operator,
    Step { node: usize, id: MinionId, step: Step, last: bool },
    Settle { node: usize, epoch: u64 },
    Deliver { from: usize, to: usize, msg: Msg },
    Retry { node: usize, epoch: u64, from: usize, decision: Decision },
    AntiEntropy { node: usize, epoch: u64 },
    Fault,
    Restart { node: usize, epoch: u64 },
    Join { node: usize },
    Heal { partition: u64 },
    Calm,
    Final,
    FinalRound,
}

pub(crate) struct Queued {
    at: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Queued {}

impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Queued {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

pub(crate) struct Node {
    name: String,
    salt: Salt,
    clock_offset_ms: u64,
    /// False until the agent's first start, and while it is down.
    up: bool,
    joined: bool,
    /// Bumped on every crash and restart: timers of an older life are ignored.
    epoch: u64,
    replica: Replica,
    /// The durable store: the full decision held per id, which survives restarts.
    store: BTreeMap<MinionId, Decision>,
    disk: Disk,
    settler: Settler,
    settle_at: Option<u64>,
    /// Ids with operator steps still to come.
    in_flight: BTreeSet<MinionId>,
    /// Ids the operator changed that the agent has not read since.
    touched: BTreeMap<MinionId, Expect>,
}

impl Node {
    fn wall_ms(&self, now: u64) -> u64 {
        EPOCH_MS + now + self.clock_offset_ms
    }

    fn busy(&self, id: &MinionId) -> bool {
        self.in_flight.contains(id) || self.touched.contains_key(id) || self.settler.is_unsettled(id.as_str())
    }
}

pub(crate) struct Sim {
    rng: Rng,
    now: u64,
    base: Instant,
    queue: BinaryHeap<Reverse<Queued>>,
    seq: u64,
    nodes: Vec<Node>,
    ids: Vec<MinionId>,
    chaos: bool,
    reliable: bool,
    /// The active partition: its number and each node's side.
    partition: Option<(u64, Vec<bool>)>,
    n_partitions: u64,
    final_at: Option<u64>,
    /// Every decision made anywhere, per id.
    decided: BTreeMap<MinionId, Vec<Decision>>,
    /// Ghost causality: the versions of an id each node has held, and each decision's history.
    known: Vec<BTreeMap<MinionId, BTreeSet<Version>>>,
    history: BTreeMap<(MinionId, Version), BTreeSet<Version>>,
    /// Conflicts reported: `(id, loser, winner, node)`.
    reported: BTreeSet<(MinionId, Version, Version, usize)>,
    /// Ids some node held when the late joiner first started.
    held_at_join: BTreeMap<MinionId, Decision>,
    joiner: Option<usize>,
    stats: Stats,
    /// Print every event (when one seed is rerun).
    trace: bool,
}

impl Sim {
    pub(crate) fn new(seed: u64) -> Sim {
        let mut rng = Rng(seed);
        let n_nodes = rng.between(3, 7) as usize;
        let ids: Vec<MinionId> = (0..N_IDS).map(|i| MinionId::parse(&format!("m{i:02}")).unwrap()).collect();
        let mut nodes = Vec::new();
        for idx in 0..n_nodes {
            let name = format!("n{idx}");
            let salt = if rng.percent(50) { Salt::V3006 } else { Salt::V3008 };
            let mut disk = Disk::default();
            for id in &ids[..N_PREEXISTING] {
                // Masters that were kept in step by hand, not quite perfectly.
                let (folder, variant) = match rng.below(100) {
                    0..=74 => (Folder::Accepted, 0),
                    75..=79 => (Folder::Accepted, 1),
                    80..=84 => (Folder::Rejected, 0),
                    85..=89 => (Folder::Pending, 2),
                    _ => continue,
                };
                disk.change(&Change::Put(folder, id.to_string(), key_bytes(id.as_str(), variant)));
            }
            nodes.push(Node {
                replica: Replica::new(&name, Hlc::default()),
                name,
                salt,
                clock_offset_ms: rng.between(0, 1500),
                up: false,
                joined: false,
                epoch: 0,
                store: BTreeMap::new(),
                disk,
                settler: Settler::new(SettleTimings::default()),
                settle_at: None,
                in_flight: BTreeSet::new(),
                touched: BTreeMap::new(),
            });
        }
        // Sometimes the highest-named master joins late with the folders it had at the start.
        let joiner = (n_nodes >= 4 && rng.percent(50)).then_some(n_nodes - 1);
        let mut sim = Sim {
            rng,
            now: 0,
            base: Instant::now(),
            queue: BinaryHeap::new(),
            seq: 0,
            known: vec![BTreeMap::new(); n_nodes],
            nodes,
            ids,
            chaos: true,
            reliable: false,
            partition: None,
            n_partitions: 0,
            final_at: None,
            decided: BTreeMap::new(),
            history: BTreeMap::new(),
            reported: BTreeSet::new(),
            held_at_join: BTreeMap::new(),
            joiner,
            stats: Stats::default(),
            trace: std::env::var("SIM_SEED").is_ok(),
        };
        for node in 0..n_nodes {
            let at = if Some(node) == joiner { sim.rng.between(5_000, 20_000) } else { sim.rng.between(0, 50) };
            sim.schedule(at, Event::Join { node });
        }
        trace!(sim, "seed {seed}: {n_nodes} masters {:?}", sim.nodes.iter().map(|n| n.salt).collect::<Vec<_>>());
        sim.schedule(100, Event::Operator);
        sim.schedule(1_000, Event::Fault);
        sim.schedule(CHAOS_MS, Event::Calm);
        sim
    }

    pub(crate) fn run(mut self) -> Stats {
        let mut n_events = 0u64;
        while let Some(Reverse(Queued { at, event, .. })) = self.queue.pop() {
            self.now = at;
            n_events += 1;
            if n_events > 2_000_000 || self.final_at.is_some_and(|t| at > t + 120_000) {
                self.fail(format!("no quiescence after {n_events} events"));
            }
            self.handle(event);
        }
        self.check_converged();
        self.count_unreported_overwrites();
        self.stats.distinct_conflicts = self.reported.len() as u64;
        self.stats
    }

    fn schedule(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.queue.push(Reverse(Queued { at, seq: self.seq, event }));
    }

    fn instant(&self, ms: u64) -> Instant {
        self.base + Duration::from_millis(ms)
    }

    #[track_caller]
    fn fail(&self, msg: String) -> ! {
        panic!("at t={}ms: {msg}", self.now);
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Operator => self.operator(),
            Event::Step { node, id, step, last } => self.step(node, id, step, last),
            Event::Settle { node, epoch } => {
                if self.nodes[node].up && self.nodes[node].epoch == epoch {
                    self.settle(node);
                }
            }
            Event::Deliver { from, to, msg } => self.deliver(from, to, msg),
            Event::Retry { node, epoch, from, decision } => {
                if self.nodes[node].up && self.nodes[node].epoch == epoch {
                    self.remote(node, from, decision);
                }
            }
            Event::AntiEntropy { node, epoch } => {
                if self.nodes[node].up && self.nodes[node].epoch == epoch {
                    self.anti_entropy(node);
                    let until = self.final_at.map_or(u64::MAX, |t| t + FINAL_ROUNDS * 1_000);
                    let next = self.now + self.rng.between(4_000, 8_000);
                    if next < until {
                        self.schedule(next, Event::AntiEntropy { node, epoch });
                    }
                }
            }
            Event::Fault => self.fault(),
            Event::Restart { node, epoch } => {
                let n = &self.nodes[node];
                if n.up || n.epoch != epoch {
                    return;
                }
                if !n.in_flight.is_empty() {
                    // A scan in the middle of a salt-key run would read its intermediate state;
                    // the real agent starts its watcher first and leaves unsettled ids alone.
                    self.schedule(self.now + 5, Event::Restart { node, epoch });
                } else {
                    self.restart(node);
                }
            }
            Event::Join { node } => self.first_start(node),
            Event::Heal { partition } => {
                if self.partition.as_ref().is_some_and(|(p, _)| *p == partition) {
                    self.heal();
                }
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
        }
    }

    // ---- operators and folders ----

    fn operator(&mut self) {
        if !self.chaos {
            return;
        }
        let next = self.now + self.rng.between(30, 400);
        self.schedule(next, Event::Operator);
        let up: Vec<usize> = (0..self.nodes.len()).filter(|&n| self.nodes[n].up).collect();
        let down: Vec<usize> = (0..self.nodes.len()).filter(|&n| !self.nodes[n].up && self.nodes[n].joined).collect();
        // Mostly on a running master; sometimes on one whose agent is down (found at its restart).
        let node = if !down.is_empty() && (up.is_empty() || self.rng.percent(15)) {
            down[self.rng.index(down.len())]
        } else if !up.is_empty() {
            up[self.rng.index(up.len())]
        } else {
            return;
        };
        let id = self.ids[self.rng.index(N_IDS)].clone();
        let n = &self.nodes[node];
        if n.in_flight.contains(&id) || (n.up && n.touched.contains_key(&id)) {
            return;
        }
        let salt = n.salt;
        let Some((what, steps, expect)) = plan_operator(&n.disk, id.as_str(), salt, &mut self.rng) else {
            return;
        };
        let running = if n.up { "" } else { " (agent down)" };
        trace!(self, "{} operator: {what} {id} ({salt:?}, {} steps){running}", n.name, steps.len());
        let n = &mut self.nodes[node];
        if !n.up {
            for change in steps.iter().flat_map(|s| &s.changes) {
                n.disk.change(change);
            }
            let expect = if n.touched.contains_key(&id) { Expect::Anything } else { expect };
            n.touched.insert(id, expect);
            return;
        }
        n.in_flight.insert(id.clone());
        n.touched.insert(id.clone(), expect);
        // The first system call happens now, the others as planned.
        let mut at = self.now;
        let n_steps = steps.len();
        for (i, step) in steps.into_iter().enumerate() {
            let last = i + 1 == n_steps;
            if i == 0 {
                self.step(node, id.clone(), step, last);
            } else {
                at += step.after_ms;
                self.schedule(at, Event::Step { node, id: id.clone(), step, last });
            }
        }
    }

    /// One system call on a master's folders, seen by its agent if it is running.
    fn step(&mut self, node: usize, id: MinionId, step: Step, last: bool) {
        let n = &mut self.nodes[node];
        for change in &step.changes {
            n.disk.change(change);
        }
        if last {
            n.in_flight.remove(&id);
        }
        if n.up {
            self.feed(node, &step.events);
        }
    }

    fn feed(&mut self, node: usize, events: &[(Folder, String, FsChange)]) {
        let now = self.instant(self.now);
        let n = &mut self.nodes[node];
        for (folder, name, change) in events {
            n.settler.on_event(*folder, name, *change, now);
        }
        self.schedule_settle(node);
    }

    fn schedule_settle(&mut self, node: usize) {
        let n = &self.nodes[node];
        let Some(due) = n.settler.next_due() else { return };
        let at = (due.duration_since(self.base).as_millis() as u64).max(self.now);
        if n.settle_at.is_none_or(|t| at < t || t < self.now) {
            let epoch = n.epoch;
            self.nodes[node].settle_at = Some(at);
            self.schedule(at, Event::Settle { node, epoch });
        }
    }

    /// Reads the ids whose events have settled, as the driver does on its settle timer.
    fn settle(&mut self, node: usize) {
        let now = self.instant(self.now);
        self.nodes[node].settle_at = None;
        let names = self.nodes[node].settler.take_due(now);
        for name in names {
            let id = MinionId::parse(&name).unwrap_or_else(|e| self.fail(format!("settler returned {name:?}: {e}")));
            if self.nodes[node].in_flight.contains(&id) {
                let n = &self.nodes[node];
                self.fail(format!("{} read {id} in the middle of a salt-key run: {:?}", n.name, n.disk.slots(&name)));
            }
            self.observe(node, &id, ObserveMode::Live);
        }
        self.schedule_settle(node);
    }

    /// Reads one id's folders and turns them into a local decision if they say something new.
    fn observe(&mut self, node: usize, id: &MinionId, mode: ObserveMode) {
        let n = &mut self.nodes[node];
        let slots = n.disk.slots(id.as_str());
        let wall = n.wall_ms(self.now);
        let decision = n.replica.observe(id, interpret(&slots), wall, mode);
        let expect = n.touched.remove(id);
        let name = n.name.clone();
        let Some(decision) = decision else { return };
        let verdict = &decision.verdict;
        match &expect {
            _ if !self.ids.contains(id) => {
                self.fail(format!("{name} decided {verdict:?} for a file that is no minion: {id}"))
            }
            _ if mode == ObserveMode::FirstStart => {}
            None => self
                .fail(format!("{name} decided {verdict:?} for {id} that no operator touched (echo?), slots {slots:?}")),
            Some(Expect::Nothing) => self.fail(format!("{name} decided {verdict:?} for {id} on a new pending key")),
            Some(Expect::AtMost(want)) if want != verdict => {
                self.fail(format!("{name} decided {verdict:?} for {id}, the operator's change was {want:?}"))
            }
            _ => {}
        }
        if decision.supersedes.as_ref().is_some_and(|sup| *sup >= decision.version) {
            self.fail(format!(
                "{name} issued {} for {id} superseding the newer {:?}",
                decision.version, decision.supersedes
            ));
        }
        trace!(self, "{name} decides {id} {verdict:?} {} (supersedes {:?})", decision.version, decision.supersedes);
        self.stats.decisions += 1;
        match mode {
            ObserveMode::Live if expect.is_some() => self.stats.operator_decisions += 1,
            _ => self.stats.startup_decisions += 1,
        }
        let mut history = self.known[node].get(id).cloned().unwrap_or_default();
        history.insert(decision.version.clone());
        self.history.insert((id.clone(), decision.version.clone()), history);
        self.decided.entry(id.clone()).or_default().push(decision.clone());
        self.commit(node, &decision);
        for peer in 0..self.nodes.len() {
            if peer != node {
                self.send(node, peer, Msg::Push(decision.clone()));
            }
        }
    }

    /// Holds a decision: in the store first (its files are already in place), then in memory.
    fn commit(&mut self, node: usize, decision: &Decision) {
        let n = &mut self.nodes[node];
        n.replica.commit(decision);
        n.store.insert(decision.id.clone(), decision.clone());
        let history = &self.history[&(decision.id.clone(), decision.version.clone())];
        self.known[node].entry(decision.id.clone()).or_default().extend(history.iter().cloned());
    }
}
