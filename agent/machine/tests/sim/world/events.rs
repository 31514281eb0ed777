//! What happens in a run: the messages links carry, the events of the
//! queue, ordered by virtual time then by scheduling, and each event's
//! signature for the trace hash.

use keysync_machine::core::settle::FsChange;
use keysync_machine::core::{Decision, Folder, MinionId};
use keysync_machine::node::{Fetch, Summaries, Whole};

use crate::model::Step;

#[derive(Clone, Debug)]
pub(crate) enum Msg {
    /// Decisions pushed as they are made or applied (the link's live stream).
    Push(Vec<Decision>),
    /// Anti-entropy on the sender's link to the receiver, as the agent's links run it.
    DiffReq {
        req: u64,
        digests: Vec<u64>,
        empty: Vec<u32>,
    },
    DiffResp {
        req: u64,
        buckets: Vec<u32>,
        summaries: Summaries,
        whole: Vec<Whole>,
        /// A bucket of `whole` sent with the answer, and its decisions.
        first: Option<(Whole, Vec<Decision>)>,
    },
    FetchReq {
        req: u64,
        fetch: Fetch,
    },
    FetchResp {
        req: u64,
        decisions: Vec<Decision>,
    },
}

/// Everything that happens, run in order of virtual time, then of scheduling.
#[derive(Debug)]
pub(crate) enum Event {
    Operator,
    Step {
        node: usize,
        id: MinionId,
        step: Step,
        last: bool,
    },
    /// inotify events reaching a node's watcher (an operator's or the node's own writes).
    Fs {
        node: usize,
        epoch: u64,
        events: Vec<(Folder, String, FsChange)>,
    },
    Tick {
        node: usize,
        epoch: u64,
    },
    Deliver {
        from: usize,
        to: usize,
        msg: Msg,
    },
    /// A link's connection attempt.
    Connect {
        node: usize,
        peer: usize,
        session: u64,
    },
    /// A link's round timer.
    Due {
        node: usize,
        peer: usize,
        timer: u64,
    },
    /// A link carries out what it was handed (the node's outgoing decisions).
    Pump {
        node: usize,
        peer: usize,
    },
    /// A link's connection breaks if its peer is still out of reach.
    Broken {
        node: usize,
        peer: usize,
        session: u64,
    },
    /// A link's push was lost: its stream, and the session, failed.
    PushLost {
        node: usize,
        peer: usize,
        session: u64,
    },
    Timeout {
        node: usize,
        peer: usize,
        req: u64,
    },
    /// The pushes in a node's inbox are handed to its machine, together.
    Arrive {
        node: usize,
        epoch: u64,
    },
    Fault,
    Restart {
        node: usize,
        epoch: u64,
    },
    Join {
        node: usize,
    },
    Heal {
        partition: u64,
    },
    DiskHeals {
        node: usize,
    },
    Calm,
    Final,
    FinalRound,
    /// The rest of a `salt-key -D` run.
    MassDelete {
        node: usize,
        ids: Vec<MinionId>,
    },
    /// After the final restart: operators release or revert what is held.
    Resolve {
        round: u32,
    },
}

pub(crate) struct Queued {
    pub(super) at: u64,
    pub(super) seq: u64,
    pub(super) event: Event,
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

/// A cheap signature of an event for the trace hash.
pub(super) fn event_kind(event: &Event) -> (u8, usize, usize) {
    match event {
        Event::Operator => (0, 0, 0),
        Event::Step { node, .. } => (1, *node, 0),
        Event::Fs { node, events, .. } => (2, *node, events.len()),
        Event::Tick { node, .. } => (3, *node, 0),
        Event::Deliver { from, to, msg } => (
            4 + match msg {
                Msg::Push(_) => 0,
                Msg::DiffReq { .. } => 1,
                Msg::DiffResp { .. } => 2,
                Msg::FetchReq { .. } => 3,
                Msg::FetchResp { .. } => 4,
            },
            *from,
            *to,
        ),
        Event::Connect { node, peer, .. } => (10, *node, *peer),
        Event::Timeout { node, peer, .. } => (11, *node, *peer),
        Event::Due { node, peer, .. } => (22, *node, *peer),
        Event::Pump { node, peer } => (23, *node, *peer),
        Event::Broken { node, peer, .. } => (24, *node, *peer),
        Event::Arrive { node, .. } => (25, *node, 0),
        Event::PushLost { node, peer, .. } => (26, *node, *peer),
        Event::Fault => (12, 0, 0),
        Event::Restart { node, .. } => (13, *node, 0),
        Event::Join { node } => (14, *node, 0),
        Event::Heal { .. } => (15, 0, 0),
        Event::DiskHeals { node } => (16, *node, 0),
        Event::Calm => (17, 0, 0),
        Event::Final => (18, 0, 0),
        Event::FinalRound => (19, 0, 0),
        Event::Resolve { round } => (20, *round as usize, 0),
        Event::MassDelete { node, ids } => (21, *node, ids.len()),
    }
}
