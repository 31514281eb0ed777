//! Anti-entropy on each node's link to each peer, in the order the agent's
//! links run it (`net/peers.rs`): digests out, the peer's Diff back, push
//! what the node holds newer, then fetch chunk by chunk what the node says
//! to fetch. A request or answer lost on the way ends the session at its
//! timeout, as a failed gRPC call does, and its claims are released.

use keysync_machine::core::{Decision, MinionId};
use keysync_machine::node::Summaries;

use super::*;

/// How long a link waits for an answer before the session fails.
const CALL_TIMEOUT_MS: u64 = 2_000;

#[derive(Clone, Debug, Default)]
pub(crate) struct Link {
    session: u64,
    state: State,
}

#[derive(Clone, Debug, Default)]
enum State {
    #[default]
    Idle,
    AwaitDiff,
    /// Fetching these ids.
    Fetching(Vec<MinionId>),
}

impl Sim {
    /// Starts a round on every idle link of `node`.
    pub(crate) fn anti_entropy(&mut self, node: usize) {
        if !self.nodes[node].up() {
            return;
        }
        for peer in 0..self.nodes.len() {
            if peer == node || !matches!(self.nodes[node].links[peer].state, State::Idle) {
                continue;
            }
            // Hello, both ways: each tells the other when the newest delete
            // it forgot (not of the other's making) was made.
            let (name, peer_name) = (self.nodes[node].name.clone(), self.nodes[peer].name.clone());
            let Some(theirs) = self.nodes[peer].machine.as_ref().map(|m| m.forgot_through(&name)) else { continue };
            let Some(mine) = self.nodes[node].machine.as_ref().map(|m| m.forgot_through(&peer_name)) else { return };
            self.input(peer, |machine, rt, now| machine.on_peer_forgot(&name, mine, now, rt));
            self.input(node, |machine, rt, now| machine.on_peer_forgot(&peer_name, theirs, now, rt));
            let Some(Some(digests)) = self.input(node, |machine, _, _| machine.digests()) else { return };
            let link = &mut self.nodes[node].links[peer];
            link.session += 1;
            link.state = State::AwaitDiff;
            let session = link.session;
            self.send(node, peer, Msg::DiffReq { session, digests });
            self.schedule(self.now + CALL_TIMEOUT_MS, Event::Timeout { node, peer, session });
        }
    }

    pub(crate) fn on_diff(&mut self, node: usize, peer: usize, session: u64, buckets: Vec<u32>, summaries: Summaries) {
        let link = &self.nodes[node].links[peer];
        if link.session != session || !matches!(link.state, State::AwaitDiff) {
            return;
        }
        let peer_name = self.nodes[peer].name.clone();
        let Some((_, newer_here)) = self.input(node, |machine, rt, now| {
            let compared = machine.repair_compare(&peer_name, &buckets, summaries, rt);
            machine.on_contact(now, rt);
            compared
        }) else {
            return;
        };
        if !newer_here.is_empty() {
            self.send(node, peer, Msg::Push(newer_here));
        }
        self.fetch_next(node, peer);
    }

    fn fetch_next(&mut self, node: usize, peer: usize) {
        let peer_name = self.nodes[peer].name.clone();
        let next = self.input(node, |machine, _, _| machine.repair_next(&peer_name)).flatten();
        let link = &mut self.nodes[node].links[peer];
        match next {
            Some(ids) => {
                link.state = State::Fetching(ids.clone());
                let session = link.session;
                self.send(node, peer, Msg::FetchReq { session, ids });
                self.schedule(self.now + CALL_TIMEOUT_MS, Event::Timeout { node, peer, session });
            }
            None => link.state = State::Idle,
        }
    }

    pub(crate) fn on_fetched(
        &mut self,
        node: usize,
        peer: usize,
        session: u64,
        ids: Vec<MinionId>,
        decisions: Vec<Decision>,
    ) {
        let link = &self.nodes[node].links[peer];
        if link.session != session || !matches!(&link.state, State::Fetching(asked) if *asked == ids) {
            return;
        }
        let peer_name = self.nodes[peer].name.clone();
        if self.input(node, |machine, rt, now| machine.repair_fetched(&peer_name, &ids, decisions, now, rt)).is_none() {
            return;
        }
        if self.nodes[node].up() {
            self.fetch_next(node, peer);
        }
    }

    pub(crate) fn timeout(&mut self, node: usize, peer: usize, session: u64) {
        let link = &self.nodes[node].links[peer];
        if link.session != session || !self.nodes[node].up() {
            return;
        }
        let state = std::mem::take(&mut self.nodes[node].links[peer].state);
        let peer_name = self.nodes[peer].name.clone();
        match state {
            State::Idle => {}
            // The session failed: its plan is dropped and its claims released, as a link going down does.
            State::AwaitDiff | State::Fetching(_) => {
                self.stats.timeouts += 1;
                self.input(node, |machine, _, _| machine.link_down(&peer_name));
            }
        }
    }
}
