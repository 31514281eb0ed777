//! Second copies of a link's live pushes, while the path to the peer loses
//! packets.
//!
//! A live push is one or two TCP segments. When one is lost, TCP sends it
//! again only after a tail-loss probe or a retransmission timeout: two
//! round trips or more, so under 2 % loss the slowest percent of decisions
//! came 135–765 ms late where one-way was 5–150 ms. A second copy on the
//! session's other connection (the rounds') is late too only when both are
//! lost (0.04 % at 2 % loss), or each waits behind an earlier lost segment
//! of its own connection; otherwise the decision comes one-way late however
//! TCP recovers. The copy that arrives second changes nothing on the peer (the
//! same version is held already).
//!
//! Only where TCP says the path loses packets: on a clean path the copies
//! would double a decision's bytes for nothing. Every connection between
//! the two masters that carries data this way tells it (this link's two,
//! and the peer's two to this master's listener, which carry this side's
//! answers and acknowledgements): one that resent at least 1 in
//! [`RESENT_ONE_IN`] of its recent segments loses enough for a percent of
//! pushes to wait for TCP's recovery.
//!
//! A link whose path has not told yet copies too (its connections have
//! sent fewer than [`TOLD_AFTER`] segments together, or one is being sent
//! again): a path's first lost push came seconds late at 300 ms, and every
//! link is new after a restart or an upgrade. It tells soon: each session
//! probes its path, sending empty push batches on the copy stream every
//! [`PROBE_EVERY`] until its own connections find it lossy or have sent
//! [`TOLD_AFTER`] segments with none being resent (at most
//! [`PROBES_AT_MOST`]; the peer answers each without its core, and its
//! answers tell the peer's links of the path the same way). What the
//! probes found is what the path told; if they could not tell (the copy
//! stream refused, the connections starved), the path is taken for a clean
//! one, as before probes: no copies without a loss. On a clean path that
//! takes a second or two at 300 ms and about a hundred kilobytes, after
//! which pushes go once; a master that decides in that time copies its
//! first few decisions.
//!
//! Only small batches are copied, a few segments: a lone decision or a few,
//! whose tail segment TCP recovers late. A burst's batch of megabytes goes
//! once: TCP recovers a segment lost inside a flow within a round trip, and
//! a copy of it would hold the rounds' connection behind it.
//!
//! Only to a peer that says in its Hello it takes four push streams a peer
//! (`push_streams`, since 0.2.0): an older one takes two, and a copy stream
//! left open by a session lost without a word would have it refuse the
//! next session's pushes until its keep-alive ended the old connection.
//!
//! A copy is best effort: if its stream is refused or falls behind, the
//! push goes alone, as on a clean path.

use std::time::{Duration, Instant};

use keysync_machine::PeerName;
use keysync_proto::v1::{self, key_sync_client::KeySyncClient};
use keysync_server::{ListenerControl, Sent, TcpProbe, RESENT_ONE_IN};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::task::AbortOnDropHandle;
use tonic::transport::Channel;
use tracing::Instrument;

/// Copies the copy stream may hold unsent: past that, a push goes alone.
const COPIES_QUEUED: usize = 4;
/// Encoded bytes of the largest batch copied: about ten segments.
pub(super) const COPY_UP_TO_BYTES: usize = 16 * 1024;
/// How long after opening a copy stream the link opens another, if that
/// one was refused or ended.
const REOPEN_AFTER: Duration = Duration::from_secs(60);
/// How long a path found to lose packets is taken for one, whatever the
/// connections say meanwhile: loss comes and goes, and a link on the edge
/// would otherwise switch (and log) at every push.
const LOSSY_FOR: Duration = Duration::from_secs(600);
/// How often a session probes its path while it has sent too little to
/// tell whether it loses packets: each probe a segment of its own (TCP
/// coalesces them only while its window is full, at a path's first round
/// trips).
pub(super) const PROBE_EVERY: Duration = Duration::from_millis(5);
/// Probes a session sends at most, however few segments they make.
pub(super) const PROBES_AT_MOST: u32 = 5 * RESENT_ONE_IN;
/// Times a session's probing looks at its connections at most (30 s), as
/// a copy stream that takes no probe (its queue full) sends none.
const PROBE_LOOKS_AT_MOST: u32 = 6_000;
/// Segments a link's connections send, none resent, before it takes its
/// path for a clean one: twice [`RESENT_ONE_IN`], as at 2 % loss 200
/// segments go without a loss 1.8 % of the time (a mesh of 7 masters has
/// 42 links), 400 0.03 %.
pub(super) const TOLD_AFTER: u32 = 2 * RESENT_ONE_IN;

/// What a session's probes found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Probed {
    Lossy,
    Clean,
    /// Nothing: the copy stream was refused or closed, the connections
    /// closed, or the probes ran out first.
    GaveUp,
}

/// What a link takes its path for, from its connections' looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// It loses packets (found now, or within [`LOSSY_FOR`]): copies.
    Lossy,
    /// Its connections have sent too little to tell: copies, and probes.
    Untold,
    /// They sent enough, and resent too few to matter (or cannot be read,
    /// before Linux 4.19: no copies, as before they existed).
    Clean,
}

/// What the path is taken for: lossy if `held` says so; else clean once
/// it `told` so; else untold while the connections read (`looks`) have
/// sent fewer than [`TOLD_AFTER`] segments together, or one of them is
/// sending one again (a loss not counted until it is acknowledged).
fn path_of(held: bool, told: bool, looks: &[Sent]) -> Path {
    let sent = looks.iter().fold(0u32, |n, sent| n.saturating_add(sent.segments));
    let resending = looks.iter().any(|sent| sent.resending > 0);
    match held {
        true => Path::Lossy,
        false if !told && !looks.is_empty() && (sent < TOLD_AFTER || resending) => Path::Untold,
        false => Path::Clean,
    }
}

/// Whether the path is taken for one that loses packets at `now`, when
/// the connections `found` it did or not: for [`LOSSY_FOR`] after the last
/// time they did.
fn held(until: &mut Option<Instant>, found: bool, now: Instant) -> bool {
    if found {
        *until = Some(now + LOSSY_FOR);
    }
    until.is_some_and(|until| now < until)
}

/// Whether the peer that answered `hello` takes a session's second push
/// stream: one that says it takes four push streams a peer (0.1.0, and the
/// builds before copies, say nothing and take two).
pub(super) fn takes_copies(hello: &v1::HelloResponse) -> bool {
    hello.push_streams >= 4
}

/// Until when a link takes its path for one that loses packets.
pub type LossyUntil = std::sync::Arc<std::sync::Mutex<Option<Instant>>>;

/// A session's copies: its connections' probes, and the copy stream on the
/// rounds' connection, opened with the session where the peer takes one.
pub(super) struct Copies {
    /// The rounds' connection and the pushes' one.
    probes: [TcpProbe; 2],
    /// The peer's connections to this master's listener.
    inbound: ListenerControl,
    peer: PeerName,
    /// Until when the path is taken for one that loses packets: the link's,
    /// kept from one session to the next (a reconnect does not make the
    /// path clean).
    lossy_until: LossyUntil,
    /// Whether the peer takes a second push stream of a session.
    takes_copies: bool,
    /// What the last look found, to log a change once.
    path: Path,
    /// The path told whether it loses packets (once told, a segment being
    /// resent no longer makes it untold: it is lost or it is not).
    told: bool,
    rounds: KeySyncClient<Channel>,
    stream: Option<CopyStream>,
    /// When the last copy stream was opened.
    opened: Option<Instant>,
    /// The session's probes of its path, sent while it has sent too little
    /// to tell; they end with the session.
    _probing: Option<AbortOnDropHandle<()>>,
    /// Told what the probes found when they end.
    probed: Option<oneshot::Receiver<Probed>>,
}

/// The push stream of the copies: fed without waiting, its acknowledgements
/// read (and dropped) by a task of its own, which ends with the session.
struct CopyStream {
    tx: mpsc::Sender<v1::DecisionBatch>,
    _acks: AbortOnDropHandle<()>,
}

impl Copies {
    pub(super) fn new(
        rounds: KeySyncClient<Channel>,
        probes: [TcpProbe; 2],
        inbound: ListenerControl,
        peer: PeerName,
        lossy_until: LossyUntil,
        takes_copies: bool,
    ) -> Copies {
        let (path, told, stream, opened) = (Path::Untold, false, None, None);
        let (_probing, probed) = (None, None);
        let mut copies = Copies {
            probes,
            inbound,
            peer,
            lossy_until,
            takes_copies,
            path,
            told,
            rounds,
            stream,
            opened,
            _probing,
            probed,
        };
        if takes_copies {
            tracing::info!(
                "the link has sent too little to tell whether its path loses packets: each live push also goes on the rounds' connection until it has sent {TOLD_AFTER} segments (it probes the path meanwhile)"
            );
        }
        if takes_copies && crate::fault::probes() {
            copies.open();
            if let Some(stream) = &copies.stream {
                let (done, probed) = oneshot::channel();
                let probing = probe(stream.tx.clone(), copies.probes.clone(), done);
                copies._probing = Some(AbortOnDropHandle::new(tokio::spawn(probing.in_current_span())));
                copies.probed = Some(probed);
            }
        }
        copies
    }

    /// What the session's probes of its path found, once they have ended
    /// (never, if it sends none, or after it resolved once).
    pub(super) async fn probes_ended(&mut self) -> Probed {
        match &mut self.probed {
            Some(probed) => {
                let found = probed.await.unwrap_or(Probed::GaveUp);
                self.probed = None;
                found
            }
            None => std::future::pending().await,
        }
    }

    /// The probes ended, having `found` that: the path has told (a path
    /// they could not tell is taken for a clean one, as before probes),
    /// and the copies follow it (the copy stream closes on a clean path).
    pub(super) fn probes_found(&mut self, found: Probed) {
        self.told = true;
        if found == Probed::Lossy {
            held(&mut self.lossy_until.lock().unwrap_or_else(|e| e.into_inner()), true, Instant::now());
        }
        self.wanted();
    }

    /// Whether live pushes go twice now (logged when that changes). Read
    /// at each live push and each round, so every connection's window of
    /// recent segments moves on.
    pub(super) fn wanted(&mut self) -> bool {
        let probes: Vec<TcpProbe> = self.probes.iter().cloned().chain(self.inbound.probes(&self.peer)).collect();
        // Every probe is read, once, so each connection's window moves on.
        let looks: Vec<(Sent, bool)> = probes.iter().filter_map(TcpProbe::look).collect();
        let knob = crate::fault::lossy().iter().any(|name| name == self.peer.as_str());
        let found = knob || looks.iter().any(|&(_, lossy)| lossy);
        let lossy = held(&mut self.lossy_until.lock().unwrap_or_else(|e| e.into_inner()), found, Instant::now());
        let path = path_of(lossy, self.told, &looks.iter().map(|&(sent, _)| sent).collect::<Vec<_>>());
        // A hold from an earlier session is not this session's telling.
        self.told |= path == Path::Clean;
        if path != self.path && self.takes_copies {
            match path {
                Path::Lossy => tracing::info!(
                    "the path to the peer loses packets (TCP resent 1 in {RESENT_ONE_IN} segments or more): each live push also goes on the rounds' connection"
                ),
                Path::Untold => tracing::info!(
                    "the link has sent too little to tell whether its path loses packets: each live push also goes on the rounds' connection until it has sent {TOLD_AFTER} segments"
                ),
                Path::Clean => tracing::info!(
                    "live pushes go once: the link's connections resent fewer than 1 in {RESENT_ONE_IN} of their recent segments (for {} min, if they lost packets before)",
                    LOSSY_FOR.as_secs() / 60
                ),
            }
        }
        self.path = path;
        // Not while probing: the probes go on it (and end soon).
        if path == Path::Clean && self.probed.is_none() && self.stream.take().is_some() {
            // Closed, so that it holds none of the peer's four push streams
            // (a lost session's may still hold some there); opened again
            // at the next copy, whenever that is.
            self.opened = None;
        }
        path != Path::Clean && self.takes_copies
    }

    /// Hands a copy of `batch` to the copy stream, opening it first if
    /// needed; whether it took it (it does not when it is behind or gone,
    /// nor a batch over [`COPY_UP_TO_BYTES`]).
    pub(super) fn send(&mut self, batch: &v1::DecisionBatch) -> bool {
        if prost::Message::encoded_len(batch) > COPY_UP_TO_BYTES {
            return false;
        }
        if self.stream.is_none() && self.opened.is_none_or(|at| at.elapsed() >= REOPEN_AFTER) {
            self.open();
        }
        let Some(stream) = &self.stream else { return false };
        match stream.tx.try_send(batch.clone()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => false,
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.stream = None;
                false
            }
        }
    }

    /// Opens the copy stream. Its first copy goes with the opening, not a
    /// round trip after: the request's messages are sent as they come.
    fn open(&mut self) {
        self.opened = Some(Instant::now());
        let (tx, rx) = mpsc::channel(COPIES_QUEUED);
        let mut client = self.rounds.clone();
        let acks = tokio::spawn(
            async move {
                let mut acks = match client.push(ReceiverStream::new(rx)).await {
                    Ok(acks) => acks.into_inner(),
                    Err(status) => {
                        tracing::info!(error = %status, "the peer refused the stream of copies: live pushes go once");
                        return;
                    }
                };
                while let Ok(Some(_)) = acks.message().await {}
            }
            .in_current_span(),
        );
        self.stream = Some(CopyStream { tx, _acks: AbortOnDropHandle::new(acks) });
    }
}

/// Probes the path while the session's connections (`probes`) have sent
/// too little to tell whether it loses packets: an empty push batch on the
/// copy stream (`tx`) every [`PROBE_EVERY`], leaving room there for a copy,
/// until they find it lossy or have sent [`TOLD_AFTER`] segments with none
/// being resent, or [`PROBES_AT_MOST`] went ([`PROBE_LOOKS_AT_MOST`]
/// looks). Says what they found, in the log and on `done`.
async fn probe(tx: mpsc::Sender<v1::DecisionBatch>, probes: [TcpProbe; 2], done: oneshot::Sender<Probed>) {
    let mut every = tokio::time::interval(PROBE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut n_probes, mut n_looks) = (0u32, 0u32);
    let (found, segments, resent) = loop {
        every.tick().await;
        n_looks += 1;
        let looks: Vec<(Sent, bool)> = probes.iter().filter_map(TcpProbe::look).collect();
        let sent: Vec<Sent> = looks.iter().map(|&(sent, _)| sent).collect();
        let segments = sent.iter().fold(0u32, |n, sent| n.saturating_add(sent.segments));
        let resent = sent.iter().fold(0u32, |n, sent| n.saturating_add(sent.retransmitted));
        // Closed (or a kernel that does not tell, before 4.19).
        if looks.is_empty() {
            break (Probed::GaveUp, segments, resent);
        }
        // The link's own rule, on these connections alone.
        match path_of(looks.iter().any(|&(_, lossy)| lossy), false, &sent) {
            Path::Lossy => break (Probed::Lossy, segments, resent),
            Path::Clean => break (Probed::Clean, segments, resent),
            Path::Untold if n_probes >= PROBES_AT_MOST || n_looks >= PROBE_LOOKS_AT_MOST => {
                break (Probed::GaveUp, segments, resent)
            }
            Path::Untold => {}
        }
        if tx.capacity() > 1 {
            match tx.try_send(v1::DecisionBatch::default()) {
                Ok(()) => n_probes += 1,
                Err(mpsc::error::TrySendError::Full(_)) => {}
                Err(mpsc::error::TrySendError::Closed(_)) => break (Probed::GaveUp, segments, resent),
            }
        }
    };
    tracing::info!(?found, n_probes, segments, resent, "the link probed its path");
    let _ = done.send(found);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lossy_path_is_held_for_ten_minutes_after_the_last_loss_found() {
        let (mut until, start) = (None, Instant::now());
        assert!(!held(&mut until, false, start), "nothing found yet");
        assert!(held(&mut until, true, start));
        let minute = Duration::from_secs(60);
        assert!(held(&mut until, false, start + 9 * minute), "clean readings for nine minutes");
        assert!(held(&mut until, true, start + 9 * minute), "found again");
        assert!(held(&mut until, false, start + 18 * minute));
        assert!(!held(&mut until, false, start + 19 * minute), "ten minutes after it was last found");
    }

    #[test]
    fn a_path_is_untold_until_its_connections_sent_enough_to_tell() {
        let sent = |segments| Sent { segments, retransmitted: 0, resending: 0 };
        assert_eq!(path_of(false, false, &[sent(0), sent(0)]), Path::Untold, "a new session");
        assert_eq!(path_of(false, false, &[sent(320), sent(79)]), Path::Untold, "399 together");
        assert_eq!(path_of(false, false, &[sent(320), sent(80)]), Path::Clean);
        let resending = Sent { resending: 1, ..sent(500) };
        assert_eq!(path_of(false, false, &[resending, sent(80)]), Path::Untold, "a loss not acknowledged yet");
        assert_eq!(path_of(false, true, &[resending, sent(80)]), Path::Clean, "told clean before it");
        assert_eq!(path_of(false, true, &[sent(3)]), Path::Clean, "told (a reading of fewer connections)");
        assert_eq!(path_of(true, false, &[sent(320), sent(80)]), Path::Lossy);
        assert_eq!(path_of(true, false, &[sent(3)]), Path::Lossy, "lossy before it told (the knob, or a hold)");
        assert_eq!(path_of(false, false, &[]), Path::Clean, "nothing read: no copies, as before Linux 4.19");
    }

    #[test]
    fn only_a_peer_that_takes_four_push_streams_takes_copies() {
        let hello = |push_streams| v1::HelloResponse { push_streams, ..Default::default() };
        assert!(!takes_copies(&hello(0)), "0.1.0, and the builds before copies, say nothing");
        assert!(!takes_copies(&hello(3)));
        assert!(takes_copies(&hello(keysync_server::PUSH_STREAMS_PER_PEER as u32)));
    }
}
