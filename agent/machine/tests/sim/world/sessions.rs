//! Each node's link to each peer: the link machine the agent ships
//! (`keysync_machine::link`), driven as `net/peers.rs` drives it. The sim
//! only carries what it asks for: a Hello (the forgot exchange), Diff and
//! Fetch requests on the simulated network (a lost request or answer ends
//! the session at its timeout, as a failed gRPC call does), pushes, and
//! calls on the node's machine. Sessions connect, fail and reconnect with
//! backoff; a peer that stops or is partitioned away breaks them.

use std::collections::VecDeque;
use std::rc::Rc;

use keysync_machine::core::Decision;
use keysync_machine::link::{reached, Answer, Call, Input, Link, LinkSettings, Out};
use keysync_machine::node::{DiffAnswer, Summaries};
use keysync_machine::testkit::peer as named;
use keysync_machine::PeerName;

use super::*;

/// How long a link waits for an answer before the session fails.
const CALL_TIMEOUT_MS: u64 = 2_000;
/// A peer counts as fetching from a node this long after its last fetch.
const FETCHING_MS: u64 = 2_000;
const FIRST_BACKOFF_MS: u64 = 100;
const MAX_BACKOFF_MS: u64 = 2_000;
/// Batches a link misses because the node's outgoing channel overflowed.
const LAG_PCT: u64 = 2;

/// A batch of a node's outgoing decisions, as its links hold it, with the
/// peers whose links followed them when they were sent (as the agent's
/// `node/outgoing.rs` lists them).
pub(crate) type Batch = Rc<(Vec<Decision>, Vec<PeerName>)>;

pub(crate) struct SimLink {
    machine: Link<Batch>,
    /// Bumped at each connection and each start: connects of an older one are ignored.
    session: u64,
    /// Bumped at each request on the wire: a late or duplicated answer is ignored.
    req: u64,
    /// The request whose answer the link waits for.
    awaiting: Option<u64>,
    /// The rest of the Diff answer being read, chunk by chunk.
    diff_rest: VecDeque<(Vec<u32>, Summaries)>,
    /// Bumped at each rearm: older timers are ignored.
    timer: u64,
    backoff: u64,
    pump_scheduled: bool,
}

impl SimLink {
    /// A link as a node starts it, with bounds drawn small enough that a
    /// run of 30 ids chunks its comparisons and pushes and drops what it
    /// held back.
    pub(crate) fn new(rng: &mut Rng, session: u64) -> SimLink {
        let interval = Duration::from_millis(rng.between(4_000, 8_000));
        let settings = LinkSettings {
            compare_chunk: rng.between(1, 10) as usize,
            push_chunk: rng.between(1, 10) as usize,
            ..LinkSettings::new(interval, Duration::from_millis(FETCHING_MS)).with_phase(rng.between(0, 1 << 40))
        };
        SimLink {
            machine: Link::new(settings),
            session,
            req: 0,
            awaiting: None,
            diff_rest: VecDeque::new(),
            timer: 0,
            backoff: FIRST_BACKOFF_MS,
            pump_scheduled: false,
        }
    }

    pub(crate) fn session(&self) -> u64 {
        self.session
    }

    pub(crate) fn machine_is_up(&self) -> bool {
        self.machine.is_up()
    }
}

impl Sim {
    fn reachable(&self, a: usize, b: usize) -> bool {
        let same_side = self.partition.as_ref().is_none_or(|(_, side)| side[a] == side[b]);
        self.linked[a][b] && self.nodes[a].up() && self.nodes[b].up() && same_side
    }

    /// Whether `peer` fetched from `node` lately (in a round of its own).
    fn peer_fetching(&self, node: usize, peer: usize) -> bool {
        self.fetched_at.get(&(node, peer)).is_some_and(|&at| self.now < at + FETCHING_MS)
    }

    fn handle_link(&mut self, node: usize, peer: usize, input: Input<Batch>) {
        let fetching = self.peer_fetching(node, peer);
        self.nodes[node].links[peer].machine.handle(input, fetching);
    }

    /// A connection attempt of `node`'s link to `peer`.
    pub(crate) fn connect(&mut self, node: usize, peer: usize, session: u64) {
        if !self.nodes[node].up() || self.nodes[node].links[peer].session != session || !self.linked[node][peer] {
            return;
        }
        let reachable = self.reachable(node, peer);
        let link = &mut self.nodes[node].links[peer];
        if !reachable {
            let at = self.now + link.backoff;
            link.backoff = (link.backoff * 2).min(MAX_BACKOFF_MS);
            self.schedule(at, Event::Connect { node, peer, session });
            return;
        }
        link.session += 1;
        link.backoff = FIRST_BACKOFF_MS;
        trace!(self, "{} → {} connected", self.nodes[node].name, self.nodes[peer].name);
        self.handle_link(node, peer, Input::Connected);
        self.pump(node, peer);
    }

    /// The session failed: the link drops its plan, and connects again after its backoff.
    pub(crate) fn fail_link(&mut self, node: usize, peer: usize) {
        if !self.nodes[node].up() || !self.nodes[node].links[peer].machine.is_up() {
            return;
        }
        trace!(self, "{} → {} session failed", self.nodes[node].name, self.nodes[peer].name);
        let link = &mut self.nodes[node].links[peer];
        link.awaiting = None;
        link.diff_rest.clear();
        let (session, at) = (link.session, self.now + link.backoff);
        self.handle_link(node, peer, Input::Failed);
        self.pump(node, peer);
        self.schedule(at, Event::Connect { node, peer, session });
    }

    /// A connection broken under a live session (the peer stopped, or a
    /// partition outlasted the keep-alive).
    pub(crate) fn broken(&mut self, node: usize, peer: usize, session: u64) {
        if self.nodes[node].links[peer].session == session && !self.reachable(node, peer) {
            self.fail_link(node, peer);
        }
    }

    /// A push of this session was lost: the session fails.
    pub(crate) fn push_lost(&mut self, node: usize, peer: usize, session: u64) {
        if self.nodes[node].links[peer].session == session {
            self.fail_link(node, peer);
        }
    }

    /// Every link of `node` whose session runs starts a round now.
    pub(crate) fn anti_entropy(&mut self, node: usize) {
        if !self.nodes[node].up() {
            return;
        }
        for peer in 0..self.nodes.len() {
            if peer != node && self.nodes[node].links[peer].machine.is_up() {
                self.handle_link(node, peer, Input::Due);
                self.pump(node, peer);
            }
        }
    }

    pub(crate) fn due(&mut self, node: usize, peer: usize, timer: u64) {
        if self.nodes[node].up() && self.nodes[node].links[peer].timer == timer {
            self.handle_link(node, peer, Input::Due);
            self.pump(node, peer);
        }
    }

    /// What a node sent its peers, handed to its links (pushed when they run next).
    pub(crate) fn outgoing(
        &mut self,
        node: usize,
        except: Option<keysync_machine::PeerName>,
        decisions: Vec<Decision>,
    ) {
        // Every link whose session runs gets the batch (or lags, and runs a
        // round), as every link following the agent's channel does.
        let following: Vec<usize> = (0..self.nodes.len())
            .filter(|&peer| peer != node && self.nodes[node].links[peer].machine.is_up())
            .collect();
        let pushing = following.iter().map(|&peer| named(&self.nodes[peer].name)).collect();
        let batch: Batch = Rc::new((decisions, pushing));
        for peer in following {
            let from_peer = except.as_deref() == Some(self.nodes[peer].name.as_str());
            if !self.reliable && self.rng.percent(LAG_PCT) {
                // The node's outgoing channel overflowed before the link read it.
                self.stats.lagged += 1;
                self.handle_link(node, peer, Input::Lagged);
            } else {
                self.handle_link(node, peer, Input::Outgoing { from_peer, batch: batch.clone() });
            }
            let link = &mut self.nodes[node].links[peer];
            if !link.pump_scheduled {
                link.pump_scheduled = true;
                self.schedule(self.now, Event::Pump { node, peer });
            }
        }
    }

    pub(crate) fn scheduled_pump(&mut self, node: usize, peer: usize) {
        self.nodes[node].links[peer].pump_scheduled = false;
        self.pump(node, peer);
    }

    /// Carries out what the link asks for, until it waits for something from outside.
    pub(crate) fn pump(&mut self, node: usize, peer: usize) {
        loop {
            if !self.nodes[node].up() {
                return;
            }
            let Some(out) = self.nodes[node].links[peer].machine.poll() else { return };
            match out {
                Out::Hello => {
                    if !self.reachable(node, peer) {
                        self.fail_link(node, peer);
                        return;
                    }
                    self.hello(node, peer);
                    if !self.nodes[node].up() {
                        return;
                    }
                    self.handle_link(node, peer, Input::HelloDone);
                }
                Out::Call(call) => {
                    let Some(answer) = self.call(node, peer, call) else { return };
                    if let Some(answer) = answer {
                        self.handle_link(node, peer, Input::Answer(answer));
                    }
                }
                Out::Diff { digests, mut empty } => {
                    if !self.nodes[node].whole {
                        // An agent of an earlier release asks for no bucket whole.
                        empty.clear();
                    }
                    let req = self.request(node, peer);
                    self.send(node, peer, Msg::DiffReq { req, digests, empty });
                }
                Out::ReadDiff => {
                    let input = match self.nodes[node].links[peer].diff_rest.pop_front() {
                        Some((buckets, summaries)) => {
                            Input::DiffChunk { buckets, summaries, whole: Vec::new(), first: None }
                        }
                        None => Input::DiffEnd,
                    };
                    self.handle_link(node, peer, input);
                }
                Out::Fetch(fetch) => {
                    let req = self.request(node, peer);
                    self.send(node, peer, Msg::FetchReq { req, fetch });
                }
                Out::FetchApplying { fetch, applying, decisions } => {
                    // The request leaves first; the node applies meanwhile
                    // (here at once: its answer is handed in before the
                    // fetch's, as the agent's driver does).
                    self.stats.overlapped += 1;
                    self.stats.overlapped_ids += u64::from(!fetch.ids.is_empty());
                    let req = self.request(node, peer);
                    self.send(node, peer, Msg::FetchReq { req, fetch });
                    let Some(answer) = self.call(node, peer, Call::Apply { fetch: applying, decisions }) else {
                        return;
                    };
                    if let Some(answer) = answer {
                        self.handle_link(node, peer, Input::Answer(answer));
                    }
                }
                Out::Push(batches) => {
                    let to = named(&self.nodes[peer].name);
                    let link = &mut self.nodes[node].links[peer].machine;
                    let all = batches.iter().flat_map(|b| b.0.iter().map(move |d| (d, &b.1)));
                    let decisions: Vec<Decision> = all
                        .filter(|(d, _)| link.push_live(d, &to))
                        .map(|(d, pushing)| Decision { reached: reached(d, pushing), ..d.clone() })
                        .collect();
                    self.stats.pushed += decisions.len() as u64;
                    if !decisions.is_empty() {
                        self.send(node, peer, Msg::Push(decisions));
                    }
                }
                Out::PushLoaded(decisions) => {
                    self.stats.round_pushed += decisions.len() as u64;
                    self.send(node, peer, Msg::Push(decisions));
                }
                Out::Up => {}
                Out::Report(_) => self.stats.rounds += 1,
                Out::Rearm(after) => {
                    let link = &mut self.nodes[node].links[peer];
                    link.timer += 1;
                    let (timer, at) = (link.timer, self.now + after.as_millis() as u64);
                    let until = self.final_at.map_or(u64::MAX, |t| t + FINAL_ROUNDS * 1_000);
                    if at < until {
                        self.schedule(at, Event::Due { node, peer, timer });
                    }
                }
                // Honest peers and a right driver never make a link refuse.
                Out::Fault(fault) => {
                    self.fail(format!("{} link to {}: {fault}", self.nodes[node].name, self.nodes[peer].name))
                }
            }
        }
    }

    /// A request on the wire: its answer is waited for until the timeout.
    fn request(&mut self, node: usize, peer: usize) -> u64 {
        let link = &mut self.nodes[node].links[peer];
        link.req += 1;
        link.awaiting = Some(link.req);
        let req = link.req;
        self.schedule(self.now + CALL_TIMEOUT_MS, Event::Timeout { node, peer, req });
        req
    }

    /// The answer to `req`, if the link still waits for it.
    fn answered(&mut self, node: usize, peer: usize, req: u64) -> bool {
        let up = self.nodes[node].up();
        let link = &mut self.nodes[node].links[peer];
        let waited = up && link.awaiting == Some(req);
        if waited {
            link.awaiting = None;
        }
        waited
    }

    /// Hello, both ways: each tells the other when the newest delete it
    /// forgot (not of the other's making) was made.
    fn hello(&mut self, node: usize, peer: usize) {
        let (name, peer_name) = (named(&self.nodes[node].name), named(&self.nodes[peer].name));
        let Some(theirs) = self.nodes[peer].machine.as_ref().map(|m| m.forgot_through(&name)) else { return };
        let Some(mine) = self.nodes[node].machine.as_ref().map(|m| m.forgot_through(&peer_name)) else { return };
        self.input(peer, |machine, rt, now| machine.on_peer_forgot(&name, mine, now, rt));
        self.input(node, |machine, rt, now| machine.on_peer_forgot(&peer_name, theirs, now, rt));
        // A peer that holds nothing at all says it joins: its own rounds
        // fetch everything whole, and this link's round is left to them
        // (when this node holds something to leave).
        if self.nodes[peer].whole
            && self.nodes[peer].machine.as_ref().is_some_and(|m| m.joining())
            && self.nodes[node].machine.as_ref().is_some_and(|m| m.offers_something())
        {
            self.fetched_at.insert((node, peer), self.now);
        }
    }

    /// Runs a call on the node's machine; `None` when the node died in it.
    fn call(&mut self, node: usize, peer: usize, call: Call) -> Option<Option<Answer>> {
        let peer_name = named(&self.nodes[peer].name);
        let p = &peer_name;
        let answer = self.input(node, |machine, rt, now| match call {
            Call::Digests => Some(Answer::Digests(machine.asking())),
            Call::Begin { buckets, whole } => Some(Answer::Checked(machine.repair_begin(p, &buckets, &whole))),
            Call::Compare(summaries) => Some(Answer::Checked(machine.repair_chunk(p, summaries, rt))),
            Call::End => Some(Answer::Compared(machine.repair_end(p))),
            Call::Agreed => {
                machine.repair_agreed(p);
                None
            }
            Call::Contact => {
                machine.on_contact(now, rt);
                None
            }
            Call::Load(ids) => Some(Answer::Loaded(machine.fetch(&ids, rt))),
            Call::Next => Some(Answer::Next(machine.repair_next(p))),
            Call::Apply { fetch, decisions } => {
                Some(Answer::Applied(machine.repair_fetched(p, &fetch, decisions, now, rt)))
            }
            Call::ApplyBrought { fetch, decisions } => {
                Some(Answer::Applied(machine.repair_brought(p, &fetch, decisions, now, rt)))
            }
            Call::LinkDown => {
                machine.link_down(p);
                None
            }
        })?;
        self.nodes[node].up().then_some(answer)
    }

    /// The peer's Diff answer, read by the link a chunk of a few summaries at a time.
    pub(crate) fn on_diff(
        &mut self,
        node: usize,
        peer: usize,
        req: u64,
        DiffAnswer { buckets, summaries, whole, first }: DiffAnswer,
    ) {
        if !self.answered(node, peer, req) {
            return;
        }
        // As the agent's driver hands it: the answer to a fetch of that bucket.
        let brought = first.map(|((bucket, n), decisions)| {
            (Fetch { buckets: vec![bucket], n_in_buckets: n as usize, ..Fetch::default() }, decisions)
        });
        let mut chunks = VecDeque::new();
        let mut rest = summaries.into_iter().peekable();
        let mut first = Some(buckets);
        while first.is_some() || rest.peek().is_some() {
            let n = self.rng.between(1, 6) as usize;
            chunks.push_back((first.take().unwrap_or_default(), rest.by_ref().take(n).collect()));
        }
        let (buckets, summaries) = chunks.pop_front().unwrap_or_default();
        self.nodes[node].links[peer].diff_rest = chunks;
        self.handle_link(node, peer, Input::DiffChunk { buckets, summaries, whole, first: brought });
        self.pump(node, peer);
    }

    pub(crate) fn on_fetched(&mut self, node: usize, peer: usize, req: u64, decisions: Vec<Decision>) {
        if !self.answered(node, peer, req) {
            return;
        }
        self.handle_link(node, peer, Input::Fetched(decisions));
        self.pump(node, peer);
    }

    pub(crate) fn timeout(&mut self, node: usize, peer: usize, req: u64) {
        if self.nodes[node].up() && self.nodes[node].links[peer].awaiting == Some(req) {
            self.stats.timeouts += 1;
            self.fail_link(node, peer);
        }
    }

    /// A node's links at its start: each connects (its first round follows).
    pub(crate) fn start_links(&mut self, node: usize) {
        for peer in 0..self.nodes.len() {
            let old = &self.nodes[node].links[peer];
            let (session, req, timer) = (old.session + 1, old.req, old.timer);
            // Numbered on from the last life: an answer to a request of
            // that life, still on the wire, is not taken for one of this.
            self.nodes[node].links[peer] = SimLink { req, timer, ..SimLink::new(&mut self.rng, session) };
            if peer != node {
                let at = self.now + self.rng.between(0, 50);
                self.schedule(at, Event::Connect { node, peer, session });
            }
        }
    }

    /// The links of every other node to `node` break (it stopped, or a
    /// partition cut it off): each notices a little later.
    pub(crate) fn break_links_to(&mut self, node: usize) {
        for peer in 0..self.nodes.len() {
            if peer != node && self.nodes[peer].up() && self.nodes[peer].links[node].machine.is_up() {
                let session = self.nodes[peer].links[node].session;
                let at = self.now + self.rng.between(0, 500);
                self.schedule(at, Event::Broken { node: peer, peer: node, session });
            }
        }
    }
}
