//! One link to one peer, as a state machine (sans-IO): the agent's
//! `net/peers.rs` and the simulation both drive this very code, and only
//! carry what it asks for (a Hello, a Diff, a Fetch, pushes, calls on the
//! node).
//!
//! A session: [`Input::Connected`], the Hello exchange, then a round of
//! anti-entropy, then live pushes; the round timer ([`Input::Due`]: Hello
//! again, another round) and the node's stream of outgoing decisions
//! falling behind ([`Input::Lagged`]: a round at once) start more rounds,
//! beside the live pushes.
//!
//! A round: the node's digests out, the peer's Diff answer read chunk by
//! chunk (the bucket its first chunk may bring applied as a fetch of it)
//! and compared by the node [`LinkSettings::compare_chunk`] summaries at a
//! time, what is newer here loaded and pushed a chunk at a
//! time, then what the node plans to fetch, fetched and applied a chunk
//! at a time, the next chunk fetched while the last is applied. What the
//! node sends its peers meanwhile is pushed at once, from the session's
//! first Hello on (a driver awaiting an answer sends it
//! with [`Link::poll_push`]): a round never holds a live decision back,
//! and a live decision the peer's round planned to fetch from here is cut
//! from its plan by the node. (Rounds once held pushes back until they
//! were over; with each decision pushed once, by its origin, that delay
//! was the peer's whole delay.) When the node's outgoing stream falls
//! behind during a round, another round follows it, which finds by digest
//! whatever was dropped.
//!
//! What a session pushed, live or in a round, it does not push again (see
//! [`Link::push_live`]): a round finds what was pushed live and not applied
//! yet lacking on the peer, and what it pushes the node's outgoing stream
//! may bring too.
//!
//! Leaving a round to the peer: when the peer is fetching from this node
//! in a round of its own (a joining master), that round brings it what this
//! node holds newer and pushes what it holds newer itself. A round that may
//! be left (one the timer or the connection started) is then left, wholly
//! or its push, and the next round comes [`LinkSettings::again`] later.
//!
//! Every answer the driver hands in must be the one the last output that
//! wants an answer asked for (see [`Out::wants_answer`]); anything else is
//! a [`Fault`] that ends the session, as does a peer's answer no agent
//! would send.

use std::collections::VecDeque;
use std::time::Duration;

use crate::core::{Decision, MinionId};
use crate::node::{Asking, BadAnswer, Compared, Fetch, Summaries, Whole};
use crate::PeerName;

mod forward;
mod names;
mod round;
mod sent;
mod settings;
#[cfg(test)]
mod tests;

use round::{RoundState, Step};

pub use forward::{pushes_to, reached};
pub use sent::MAX_NOTED;
pub use settings::{LinkSettings, COMPARE_CHUNK};

/// What the link asks of its node.
#[derive(Debug, PartialEq, Eq)]
pub enum Call {
    /// [`Node::asking`](crate::node::Node::asking): [`Answer::Digests`].
    Digests,
    /// `repair_begin` with the buckets the Diff answer names, and those it
    /// sends whole: [`Answer::Checked`].
    Begin { buckets: Vec<u32>, whole: Vec<Whole> },
    /// `repair_chunk`: [`Answer::Checked`].
    Compare(Summaries),
    /// `repair_end`: [`Answer::Compared`].
    End,
    /// `repair_agreed` (no answer).
    Agreed,
    /// The peer answered: `on_contact` (no answer).
    Contact,
    /// `fetch` of ids to push: [`Answer::Loaded`].
    Load(Vec<MinionId>),
    /// `repair_next`: [`Answer::Next`].
    Next,
    /// `repair_fetched`: [`Answer::Applied`].
    Apply { fetch: Fetch, decisions: Vec<Decision> },
    /// `repair_brought`, for the bucket the Diff answer brought:
    /// [`Answer::Applied`].
    ApplyBrought { fetch: Fetch, decisions: Vec<Decision> },
    /// `link_down`: the session is over, its plan dropped and its claims
    /// released (no answer).
    LinkDown,
}

/// The node's answer to a [`Call`].
#[derive(Debug)]
pub enum Answer {
    Digests(Option<Asking>),
    Checked(Result<(), BadAnswer>),
    Compared(Result<Compared, BadAnswer>),
    Loaded(Vec<Decision>),
    Next(Option<Fetch>),
    Applied(u32),
}

/// What happens to a link. `B` is a batch of the node's outgoing
/// decisions, opaque to the link.
#[derive(Debug)]
pub enum Input<B> {
    /// A connection is up and the node's outgoing decisions are followed:
    /// a new session (whatever the last one did is forgotten).
    Connected,
    /// The Hello exchange went through.
    HelloDone,
    /// The round timer fired.
    Due,
    /// The node sent decisions to its peers; `from_peer`: they came from
    /// this link's peer (never pushed back to it).
    Outgoing {
        from_peer: bool,
        batch: B,
    },
    /// The node's outgoing decisions were dropped before the link read them.
    Lagged,
    Answer(Answer),
    /// A chunk of the peer's Diff answer (only the first names buckets, and
    /// those it sends whole, and may bring one of those with it: what a
    /// fetch of it would bring, applied as such).
    DiffChunk {
        buckets: Vec<u32>,
        summaries: Summaries,
        whole: Vec<Whole>,
        first: Option<(Fetch, Vec<Decision>)>,
    },
    /// The peer's Diff answer is over.
    DiffEnd,
    /// The peer's answer to the last [`Out::Fetch`] or [`Out::FetchApplying`].
    Fetched(Vec<Decision>),
    /// The session failed (connection, call, or an answer refused).
    Failed,
}

/// What the link asks its driver to do, in order.
#[derive(Debug)]
pub enum Out<B> {
    /// Exchange Hello with the peer: [`Input::HelloDone`] or [`Input::Failed`].
    Hello,
    /// Ask the node (see [`Call`]).
    Call(Call),
    /// Send a Diff with these digests, asking for the `empty` buckets (this
    /// node holds nothing in them) whole; hand in its first chunk.
    Diff { digests: Vec<u64>, empty: Vec<u32> },
    /// Hand in the next chunk of the Diff answer, or [`Input::DiffEnd`].
    ReadDiff,
    /// Fetch these ids and whole buckets from the peer: [`Input::Fetched`].
    Fetch(Fetch),
    /// Fetch `fetch` from the peer while the node applies what the last
    /// fetch brought ([`Call::Apply`] of `applying` and `decisions`), both
    /// at once: the node's writes and the peer's answer overlap. Hand in
    /// [`Answer::Applied`], then [`Input::Fetched`].
    FetchApplying { fetch: Fetch, applying: Fetch, decisions: Vec<Decision> },
    /// Push these batches of the node's outgoing decisions, in order.
    Push(Vec<B>),
    /// Push these decisions the node holds newer than the peer.
    PushLoaded(Vec<Decision>),
    /// The session's first round is over: the link is up.
    Up,
    /// What a round compared and moved.
    Report(Round),
    /// Fire [`Input::Due`] after this long (replacing any timer set before).
    Rearm(Duration),
    /// The session must end with this error ([`Call::LinkDown`] came before).
    Fault(Fault),
}

impl<B> Out<B> {
    /// The driver hands in an answer to this before anything but
    /// [`Input::Outgoing`], [`Input::Lagged`], [`Input::Due`] and
    /// [`Input::Failed`].
    pub fn wants_answer(&self) -> bool {
        match self {
            Out::Hello | Out::Diff { .. } | Out::ReadDiff | Out::Fetch(_) | Out::FetchApplying { .. } => true,
            Out::Call(call) => !matches!(call, Call::Agreed | Call::Contact | Call::LinkDown),
            Out::Push(_) | Out::PushLoaded(_) | Out::Up | Out::Report(_) | Out::Rearm(_) | Out::Fault(_) => false,
        }
    }
}

/// Why a link ends its session.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Fault {
    #[error("refused the peer's answer: {0}")]
    BadAnswer(#[from] BadAnswer),
    #[error("the link got {got} while {waiting} (a bug in its driver)")]
    Unexpected { got: &'static str, waiting: &'static str },
}

/// What one round compared and moved, for `status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Round {
    pub differing_buckets: usize,
    /// Ids the peer held newer.
    pub we_lacked: usize,
    /// Ids held newer here.
    pub peer_lacked: usize,
    pub pushed: usize,
    pub applied: u32,
    /// More differed than one round fetches: another round follows soon.
    pub full: bool,
    /// The round's push was left to the peer's own round.
    pub left: bool,
    /// Buckets the peer sent whole: another round follows soon when they
    /// brought something (what the peer decided meanwhile, or left to this
    /// node's fetch, is compared then).
    pub whole: usize,
}

/// One link's state.
#[derive(Debug)]
pub struct Link<B> {
    settings: LinkSettings,
    phase: Phase,
    /// The node's outgoing stream fell behind during a round: another
    /// follows it.
    lagged: bool,
    /// The timer fired during a round: another follows it.
    due: bool,
    /// What this session pushed (see `sent.rs`).
    sent: sent::Sent,
    out: VecDeque<Out<B>>,
}

#[derive(Debug)]
enum Phase {
    /// No session.
    Down,
    /// Waiting for the Hello exchange; a round follows.
    Hello {
        first: bool,
    },
    /// Between rounds: outgoing decisions are pushed as they come.
    Live,
    Round(RoundState),
}

impl<B> Link<B> {
    pub fn new(settings: LinkSettings) -> Link<B> {
        Link {
            settings,
            phase: Phase::Down,
            lagged: false,
            due: false,
            sent: sent::Sent::default(),
            out: VecDeque::new(),
        }
    }

    /// Whether the driver pushes `decision`, of a batch the link asked it to
    /// push ([`Out::Push`]), to the link's peer `peer`: not when the peer
    /// holds it or gets it from another master ([`pushes_to`]), nor when
    /// this session pushed it already (a round found the peer lacking it
    /// first). Call it as each is pushed: the link notes what it pushes,
    /// and a round leaves that out (see `sent.rs`). What another master
    /// pushes there is not noted: if that push was lost, a round here
    /// brings it sooner than that master's next session.
    pub fn push_live(&mut self, decision: &Decision, peer: &PeerName) -> bool {
        pushes_to(decision, peer) && self.sent.first(decision)
    }

    /// The next thing to do, if any.
    pub fn poll(&mut self) -> Option<Out<B>> {
        self.out.pop_front()
    }

    /// The next thing to do if it is a live push: what a driver awaiting
    /// an answer sends meanwhile (nothing else is queued then but pushes).
    pub fn poll_push(&mut self) -> Option<Vec<B>> {
        match self.out.front() {
            Some(Out::Push(_)) => match self.out.pop_front() {
                Some(Out::Push(batches)) => Some(batches),
                _ => None,
            },
            _ => None,
        }
    }

    /// Whether a session is running.
    pub fn is_up(&self) -> bool {
        !matches!(self.phase, Phase::Down)
    }

    /// Whether a round is running (or about to, after Hello).
    pub fn in_round(&self) -> bool {
        matches!(self.phase, Phase::Round(_) | Phase::Hello { .. })
    }

    /// Takes one input. `peer_fetching`: the peer fetched from this node
    /// lately, in a round of its own (read when a round may be left).
    pub fn handle(&mut self, input: Input<B>, peer_fetching: bool) {
        match input {
            Input::Connected => {
                self.lagged = false;
                self.due = false;
                self.sent.clear();
                self.phase = Phase::Hello { first: true };
                self.out.push_back(Out::Hello);
            }
            Input::Failed => self.down(),
            Input::Outgoing { from_peer: true, .. } => {}
            Input::Outgoing { from_peer: false, batch } => match &self.phase {
                Phase::Down => {}
                Phase::Live | Phase::Hello { .. } | Phase::Round(_) => match self.out.back_mut() {
                    // Everything queued goes in one push.
                    Some(Out::Push(batches)) => batches.push(batch),
                    _ => self.out.push_back(Out::Push(vec![batch])),
                },
            },
            Input::Lagged => match self.phase {
                Phase::Down => {}
                // Not left to the peer: its round cannot know what was dropped here.
                Phase::Live => self.start_round(false, false, false, peer_fetching),
                Phase::Hello { .. } | Phase::Round(_) => self.lagged = true,
            },
            Input::Due => match self.phase {
                Phase::Down => {}
                Phase::Live => {
                    // Hello again: it exchanges the masters' health, which may have changed.
                    self.phase = Phase::Hello { first: false };
                    self.out.push_back(Out::Hello);
                }
                Phase::Hello { .. } | Phase::Round(_) => self.due = true,
            },
            Input::HelloDone => match self.phase {
                Phase::Hello { first } => self.start_round(true, true, first, peer_fetching),
                Phase::Down => {}
                _ => self.fault(Fault::Unexpected { got: "HelloDone", waiting: self.waiting() }),
            },
            input => self.step(input, peer_fetching),
        }
    }

    fn waiting(&self) -> &'static str {
        match &self.phase {
            Phase::Down => "down",
            Phase::Hello { .. } => "waiting for Hello",
            Phase::Live => "live",
            Phase::Round(round) => round.step.name(),
        }
    }

    fn down(&mut self) {
        if matches!(self.phase, Phase::Down) {
            return;
        }
        self.phase = Phase::Down;
        self.lagged = false;
        self.due = false;
        self.sent.clear();
        self.out.clear();
        self.out.push_back(Out::Call(Call::LinkDown));
    }

    fn fault(&mut self, fault: Fault) {
        self.down();
        self.out.push_back(Out::Fault(fault));
    }

    fn start_round(&mut self, may_leave: bool, timed: bool, first: bool, peer_fetching: bool) {
        // What was dropped before this round's digests is found by them.
        self.lagged = false;
        self.phase =
            Phase::Round(RoundState { may_leave, timed, first, step: Step::Digests, report: Round::default() });
        if may_leave && peer_fetching {
            // The peer's own round brings it what this one would: run again
            // once it is over. (What the session pushed stays noted: a round
            // left every few seconds would forget it.)
            self.end_round(true, None);
            return;
        }
        self.sent.round();
        self.out.push_back(Out::Call(Call::Digests));
    }

    /// The round is over (`left`: to the peer, or more to do soon).
    fn end_round(&mut self, left: bool, report: Option<Round>) {
        let Phase::Round(round) = std::mem::replace(&mut self.phase, Phase::Live) else { return };
        if let Some(report) = report {
            self.out.push_back(Out::Report(report));
        }
        if std::mem::take(&mut self.lagged) {
            // What was dropped is found by comparing digests again, in a
            // round the peer's cannot stand in for.
            self.sent.round();
            self.phase =
                Phase::Round(RoundState { may_leave: false, step: Step::Digests, report: Round::default(), ..round });
            self.out.push_back(Out::Call(Call::Digests));
            return;
        }
        if round.first {
            self.out.push_back(Out::Up);
        }
        if round.timed {
            let next = match (left, round.first) {
                (true, _) => self.settings.again.min(self.settings.interval),
                (false, true) => self.settings.after_first(),
                (false, false) => self.settings.interval,
            };
            self.out.push_back(Out::Rearm(next));
        }
        if std::mem::take(&mut self.due) {
            self.phase = Phase::Hello { first: false };
            self.out.push_back(Out::Hello);
        }
    }
}
