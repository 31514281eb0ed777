//! A session's live pushes: what the node sends its peers, carried to the
//! peer's push stream in batches under the push window, during rounds and
//! between them (see `peers.rs`).

use std::sync::Arc;

use keysync_machine::link::{reached, Input};
use keysync_machine::PeerName;
use keysync_proto::v1;
use prost::Message;
use tokio::sync::{broadcast, mpsc};

use super::{Link, SessionError, MAX_MESSAGE_BYTES};
use crate::core::Decision;
use crate::net::wire::decision_to_wire;
use crate::ops::board::Board;

/// Encoded bytes per pushed batch: half the message cap.
pub(super) const PUSH_BATCH_BYTES: usize = MAX_MESSAGE_BYTES / 2;
/// Decisions per pushed batch (10,000 keys of ~450 bytes is ~5 MiB).
pub(super) const PUSH_BATCH_DECISIONS: usize = 10_000;
/// Push batches the peer has not acknowledged yet, at most. While that many
/// are unacknowledged, what the node sends meanwhile waits in its outgoing
/// channel and goes out as one batch at the next acknowledgement: the peer
/// makes each batch durable (a syncfs, a store commit), so a burst of
/// single decisions (Salt 3008's `salt-key -A` writes one key at a time)
/// must not reach it as thousands of one-decision batches.
pub(super) const PUSHES_IN_FLIGHT: usize = 2;
/// How long a peer may leave a push batch untaken: it makes each durable
/// before it takes the next, which a busy core (a rescan of a million keys)
/// can delay by a minute.
const PUSH_TAKEN_WITHIN: std::time::Duration = std::time::Duration::from_secs(300);

/// The session's live pushes: what the node sends, and the push stream.
pub(super) struct PushIo {
    pub(super) outgoing: crate::node::Following,
    pub(super) tx: mpsc::Sender<v1::DecisionBatch>,
    /// Push batches sent and not yet acknowledged (acknowledgements come
    /// one per batch, in order).
    pub(super) unacked: usize,
    pub(super) acks: tonic::Streaming<v1::PushAck>,
    /// What the link pushes while two batches are unacknowledged: sent
    /// together at the next acknowledgement.
    pub(super) waiting: Vec<Arc<crate::node::Outgoing>>,
    pub(super) board: Arc<Board>,
    pub(super) peer: PeerName,
    /// Second copies of live pushes, while the path loses packets.
    pub(super) copies: super::copies::Copies,
}

impl PushIo {
    pub(super) fn acknowledged(&mut self, ack: Result<Option<v1::PushAck>, tonic::Status>) -> Result<(), SessionError> {
        let Some(ack) = ack? else { return Err(SessionError::PushClosed) };
        self.unacked = self.unacked.saturating_sub(1);
        self.board.contact(&self.peer);
        tracing::trace!(n_received = ack.n_received, n_applied = ack.n_applied, "push acknowledged");
        Ok(())
    }

    /// Hands `batch` to the push stream, once the peer takes what went
    /// before it, and a copy of it first to the copy stream if `copy`. A
    /// peer that takes nothing for [`PUSH_TAKEN_WITHIN`] ends the session:
    /// this would otherwise wait here for as long as the connection lives,
    /// and so would the round it runs in, holding the link's claims.
    async fn send(&mut self, batch: v1::DecisionBatch, copy: bool) -> Result<(), SessionError> {
        if copy && self.copies.send(&batch) {
            self.board.metrics().copied(self.peer.as_str(), batch.decisions.len());
        }
        match tokio::time::timeout(PUSH_TAKEN_WITHIN, self.tx.send(batch)).await {
            Ok(sent) => sent.map_err(|_| SessionError::PushClosed)?,
            Err(_) => return Err(SessionError::PushTimedOut(PUSH_TAKEN_WITHIN)),
        }
        self.unacked += 1;
        Ok(())
    }

    /// Hands the link a batch the node sent its peers, and every other
    /// already queued: while the peer is busy making the last batch
    /// durable, a burst (salt-key -A) accumulates in the channel and goes
    /// out as one push rather than as many small ones, each costing the
    /// peer its fsyncs.
    pub(super) fn take(&mut self, link: &mut Link, first: Arc<crate::node::Outgoing>) {
        let mut out = Some(first);
        while let Some(batch) = out {
            let from_peer = batch.from.as_ref() == Some(&self.peer);
            link.handle(Input::Outgoing { from_peer, batch }, false);
            out = self.outgoing.receiver.try_recv().ok();
        }
    }

    /// Sends what waits, as one push (split under the message cap), if
    /// fewer than [`PUSHES_IN_FLIGHT`] batches are unacknowledged.
    pub(super) async fn flush(&mut self, link: &mut Link) -> Result<(), SessionError> {
        if self.unacked >= PUSHES_IN_FLIGHT || self.waiting.is_empty() {
            return Ok(());
        }
        let batches = std::mem::take(&mut self.waiting);
        let peer = self.peer.clone();
        send_decisions(self, decisions_of(&batches, &peer, link), Copying::IfLossy).await?;
        Ok(())
    }
}

/// Awaits `fut` while handing the link what the node sends its peers
/// meanwhile, and pushing what the link pushes, so a round never holds a
/// live push back. Pushes keep to the push window, as between rounds: what
/// the node sends while two batches are unacknowledged waits in its
/// outgoing channel and goes as one batch at the next acknowledgement.
pub(super) async fn during<F: std::future::Future>(
    fut: F,
    link: &mut Link,
    push: &mut PushIo,
) -> Result<F::Output, SessionError> {
    tokio::pin!(fut);
    let mut open = true;
    loop {
        tokio::select! {
            result = &mut fut => return Ok(result),
            out = push.outgoing.receiver.recv(), if open && push.unacked < PUSHES_IN_FLIGHT => match out {
                Ok(out) => push.take(link, out),
                Err(broadcast::error::RecvError::Lagged(_)) => link.handle(Input::Lagged, false),
                Err(broadcast::error::RecvError::Closed) => open = false,
            },
            ack = push.acks.message(), if push.unacked > 0 => push.acknowledged(ack)?,
            // As between rounds (`peers.rs`): copies stop once a path tells clean.
            found = push.copies.probes_ended() => push.copies.probes_found(found),
        }
        while let Some(batches) = link.poll_push() {
            push.waiting.extend(batches);
        }
        push.flush(link).await?;
    }
}

/// The decisions of `batches` to push to `peer` (not its own, nor one that
/// passed through it or was pushed to it already, nor one this session
/// pushed: [`Link::push_live`]), each with the peers the node pushes it
/// to, in order (a list of references: an iterator chaining the batches
/// could not be held across the pushes' awaits).
pub(super) fn decisions_of<'a>(
    batches: &'a [Arc<crate::node::Outgoing>],
    peer: &PeerName,
    link: &mut Link,
) -> Vec<(&'a Decision, &'a [PeerName])> {
    let all = batches.iter().flat_map(|o| o.decisions.iter().map(|d| (d, &*o.pushing)));
    all.filter(|(d, _)| link.push_live(d, peer)).collect()
}

/// No peer: a round's pushes name none in `reached` (the peer lacked them
/// by its own summaries; nobody else is told to leave it out).
pub(super) const NO_ONE: &[PeerName] = &[];

/// Whether pushed batches also go to the copy stream.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Copying {
    /// Live pushes: while the path loses packets (`copies.rs`).
    IfLossy,
    /// A round's pushes, of what the peer lacked for a while already.
    Never,
}

/// Pushes decisions in batches of at most [`PUSH_BATCH_BYTES`] (well under
/// the message cap) and [`PUSH_BATCH_DECISIONS`]: the peer makes each batch
/// durable with one syncfs and one store commit, so a burst (salt-key -A)
/// costs a few of those, not one per thousand keys. Returns the bytes sent
/// (copies not counted).
pub(super) async fn send_decisions<'a>(
    io: &mut PushIo,
    decisions: impl IntoIterator<Item = (&'a Decision, &'a [PeerName])>,
    copy: Copying,
) -> Result<usize, SessionError> {
    let copy = copy == Copying::IfLossy && io.copies.wanted();
    let mut n_bytes = 0;
    let mut batch = v1::DecisionBatch::default();
    let mut batch_bytes = 0;
    for (decision, pushing) in decisions {
        let mut wire = decision_to_wire(decision);
        wire.reached = reached(decision, pushing).iter().map(str::to_string).collect();
        // Its size in the batch: the message and its field's tag and length.
        let len = wire.encoded_len() + 8;
        if !batch.decisions.is_empty()
            && (batch_bytes + len > PUSH_BATCH_BYTES || batch.decisions.len() >= PUSH_BATCH_DECISIONS)
        {
            n_bytes += batch.encoded_len();
            io.send(std::mem::take(&mut batch), copy).await?;
            batch_bytes = 0;
        }
        batch_bytes += len;
        batch.decisions.push(wire);
    }
    if !batch.decisions.is_empty() {
        n_bytes += batch.encoded_len();
        io.send(batch, copy).await?;
    }
    Ok(n_bytes)
}
