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
//! A link that has sent too little to tell (fewer than [`RESENT_ONE_IN`]
//! segments since it connected, none resent) takes its path for one like
//! this master's others: while another link finds its own path lossy, it
//! copies too. A master behind a lossy uplink then copies from its links'
//! first push, not from the first push each link loses.
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

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use keysync_machine::PeerName;
use keysync_proto::v1::{self, key_sync_client::KeySyncClient};
use keysync_server::{ListenerControl, Sent, TcpProbe, RESENT_ONE_IN};
use tokio::sync::mpsc;
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

/// How many of this master's links find their own path lossy now.
pub type LossyLinks = std::sync::Arc<std::sync::atomic::AtomicUsize>;

/// A session's copies: its connections' probes, and the copy stream on the
/// rounds' connection once the path is found to lose packets.
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
    /// How many of this master's links find their own path lossy, this
    /// one among them while `counted`.
    lossy_links: LossyLinks,
    counted: bool,
    /// Whether the peer takes a second push stream of a session.
    takes_copies: bool,
    /// What the last look found, to log a change once.
    lossy: bool,
    rounds: KeySyncClient<Channel>,
    stream: Option<CopyStream>,
    /// When the last copy stream was opened.
    opened: Option<Instant>,
}

impl Drop for Copies {
    fn drop(&mut self) {
        if self.counted {
            self.lossy_links.fetch_sub(1, Ordering::Relaxed);
        }
    }
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
        lossy_links: LossyLinks,
        takes_copies: bool,
    ) -> Copies {
        let (lossy, counted, stream, opened) = (false, false, None, None);
        Copies { probes, inbound, peer, lossy_until, lossy_links, counted, takes_copies, lossy, rounds, stream, opened }
    }

    /// Whether live pushes go twice now (logged when that changes). Read
    /// at each live push and each round, so every connection's window of
    /// recent segments moves on, and a path lossy long ago is not counted
    /// among the master's lossy ones.
    pub(super) fn wanted(&mut self) -> bool {
        let probes: Vec<TcpProbe> = self.probes.iter().cloned().chain(self.inbound.probes(&self.peer)).collect();
        // Every probe is read, once, so each connection's window moves on.
        let looks: Vec<(Sent, bool)> = probes.iter().filter_map(TcpProbe::look).collect();
        let knob = crate::fault::lossy().iter().any(|name| name == self.peer.as_str());
        let found = knob || looks.iter().any(|&(_, lossy)| lossy);
        let own = held(&mut self.lossy_until.lock().unwrap_or_else(|e| e.into_inner()), found, Instant::now());
        if own != self.counted {
            self.counted = own;
            match own {
                true => self.lossy_links.fetch_add(1, Ordering::Relaxed),
                false => self.lossy_links.fetch_sub(1, Ordering::Relaxed),
            };
        }
        let sent = looks.iter().fold(0u32, |n, (sent, _)| n.saturating_add(sent.segments));
        let like_the_others = !own && sent < RESENT_ONE_IN && self.lossy_links.load(Ordering::Relaxed) > 0;
        let lossy = (own || like_the_others) && self.takes_copies;
        if lossy != self.lossy {
            self.lossy = lossy;
            match (own, lossy) {
                (true, _) => tracing::info!(
                    "the path to the peer loses packets (TCP resent 1 in {RESENT_ONE_IN} segments or more): each live push also goes on the rounds' connection"
                ),
                (false, true) => tracing::info!(
                    "the link has sent too little to tell whether its path loses packets, and another link of this master's does: each live push also goes on the rounds' connection"
                ),
                (false, false) => tracing::info!(
                    "live pushes go once: the link's connections resent fewer than 1 in {RESENT_ONE_IN} of their recent segments (for {} min, if they lost packets before)",
                    LOSSY_FOR.as_secs() / 60
                ),
            }
        }
        lossy
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
    fn only_a_peer_that_takes_four_push_streams_takes_copies() {
        let hello = |push_streams| v1::HelloResponse { push_streams, ..Default::default() };
        assert!(!takes_copies(&hello(0)), "0.1.0, and the builds before copies, say nothing");
        assert!(!takes_copies(&hello(3)));
        assert!(takes_copies(&hello(keysync_server::PUSH_STREAMS_PER_PEER as u32)));
    }
}
