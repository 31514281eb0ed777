//! The network between the agents: it drops, duplicates, reorders and
//! partitions; what arrives is handed to the receiving node's machine.

use super::*;
use keysync_machine::node::DiffAnswer;

/// How long after a lost push its session fails.
const PUSH_LOST_MS: u64 = 2_000;

impl Sim {
    pub(crate) fn send(&mut self, from: usize, to: usize, msg: Msg) {
        if self.partition.as_ref().is_some_and(|(_, side)| side[from] != side[to]) {
            self.stats.lost += 1;
            return;
        }
        if !self.reliable && self.rng.percent(DROP_PCT) {
            self.stats.dropped += 1;
            if matches!(msg, Msg::Push(_)) {
                // A push is never lost alone: its stream breaks, and the
                // session fails (at the keep-alive's timeout), as the
                // agent's would over a broken connection.
                let session = self.nodes[from].links[to].session();
                self.schedule(self.now + PUSH_LOST_MS, Event::PushLost { node: from, peer: to, session });
            }
            return;
        }
        let at = self.now + self.rng.between(1, 30);
        if !self.reliable && self.rng.percent(DUP_PCT) {
            self.stats.duplicated += 1;
            let again = at + self.rng.between(0, 200);
            self.schedule(again, Event::Deliver { from, to, msg: msg.clone() });
        }
        self.schedule(at, Event::Deliver { from, to, msg });
    }

    pub(super) fn deliver(&mut self, from: usize, to: usize, msg: Msg) {
        if !self.nodes[to].up() || self.partition.as_ref().is_some_and(|(_, side)| side[from] != side[to]) {
            self.stats.lost += 1;
            return;
        }
        let peer = keysync_machine::testkit::peer(&self.nodes[from].name);
        match &msg {
            Msg::FetchResp { decisions, .. } | Msg::DiffResp { first: Some((_, decisions)), .. } => {
                self.note_delivered(to, decisions)
            }
            _ => {}
        }
        match msg {
            Msg::Push(decisions) => {
                // Queued behind what the core is busy with: whatever else
                // arrives meanwhile is handed with it.
                if self.nodes[to].inbox.is_empty() {
                    let (at, epoch) = (self.now + self.rng.between(0, 3), self.nodes[to].epoch);
                    self.schedule(at, Event::Arrive { node: to, epoch });
                }
                self.nodes[to].inbox.push((peer, decisions));
            }
            Msg::DiffReq { req, digests, empty } => {
                // An agent of an earlier release ignores the ask, and sends summaries.
                let whole = self.nodes[to].whole;
                let answer = self.input(to, |machine, rt, _| match whole {
                    true => machine.diff_answer(&digests, &empty, rt),
                    false => {
                        let (buckets, summaries) = machine.diff(&digests, rt);
                        DiffAnswer { buckets, summaries, ..DiffAnswer::default() }
                    }
                });
                if let Some(DiffAnswer { buckets, summaries, whole, first }) = answer {
                    if !whole.is_empty() {
                        // The peer will fetch those buckets from this node, as the agent's Diff marks it.
                        self.fetched_at.insert((to, from), self.now);
                    }
                    self.stats.buckets_sent_first += u64::from(first.is_some());
                    self.send(to, from, Msg::DiffResp { req, buckets, summaries, whole, first });
                }
            }
            Msg::FetchReq { req, fetch } => {
                // The peer is fetching from this node: a round of its own.
                self.fetched_at.insert((to, from), self.now);
                self.stats.buckets_whole += fetch.buckets.len() as u64;
                let answer = self.input(to, |machine, rt, _| {
                    let mut decisions = machine.fetch(&fetch.ids, rt);
                    // Never more than a few ids: never refused as too many at once.
                    decisions.extend(machine.fetch_whole(&fetch.buckets, rt).unwrap_or_default());
                    decisions
                });
                if let Some(decisions) = answer {
                    self.send(to, from, Msg::FetchResp { req, decisions });
                }
            }
            Msg::DiffResp { req, buckets, summaries, whole, first } => {
                self.on_diff(to, from, req, DiffAnswer { buckets, summaries, whole, first })
            }
            Msg::FetchResp { req, decisions } => self.on_fetched(to, from, req, decisions),
        }
    }
}

impl Sim {
    /// Knowing a decision is knowing what it knew (its own origin's claims
    /// are checked there).
    fn note_delivered(&mut self, to: usize, decisions: &[Decision]) {
        for d in decisions {
            let known = self.delivered[to].entry(d.id.clone()).or_default();
            known.insert(d.version.clone());
            known.extend(d.context.iter().cloned());
        }
    }

    /// Hands the machine every push in the inbox, in one call, as the
    /// agent's core hands it the pushes queued (up to 64 requests).
    pub(super) fn arrive(&mut self, node: usize, epoch: u64) {
        if self.nodes[node].epoch != epoch || !self.nodes[node].up() {
            return;
        }
        let arrivals = std::mem::take(&mut self.nodes[node].inbox);
        if arrivals.len() > 1 {
            self.stats.grouped += 1;
        }
        for (_, decisions) in &arrivals {
            self.note_delivered(node, decisions);
        }
        self.input(node, |machine, rt, now| machine.on_batches(arrivals, now, rt));
    }
}
