//! Outbound replication: one task per configured peer keeps a connection,
//! pushes this node's decisions as they happen, and runs anti-entropy on
//! connect and periodically (pulling what the peer holds newer, pushing what
//! this node holds newer).

use std::sync::Arc;
use std::time::Duration;

use keysync_machine::node::{Compared, FETCH_CHUNK};
use keysync_proto::v1::{self, key_sync_client::KeySyncClient};
use keysync_proto::{MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};
use keysync_server::TlsSetup;
use prost::Message;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::MissedTickBehavior;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tracing::Instrument;

use crate::config::Peer;
use crate::core::digest::N_BUCKETS;
use crate::core::{Decision, MinionId};
use crate::disk::audit::{Action, Outcome, Via};
use crate::net::wire::{
    decision_from_wire, decision_to_wire, health_from_wire, health_to_wire, held_from_wire, held_to_wire,
};
use crate::node::{CoreHandle, Request};
use crate::ops::board::{AntiEntropyRun, Board, LinkState};

pub const MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Encoded bytes per pushed batch: half the message cap.
const PUSH_BATCH_BYTES: usize = MAX_MESSAGE_BYTES / 2;
/// Decisions per pushed batch (10,000 keys of ~450 bytes is ~5 MiB).
const PUSH_BATCH_DECISIONS: usize = 10_000;

#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error(transparent)]
    Connect(#[from] keysync_server::ConnectError),
    #[error(transparent)]
    Rpc(#[from] tonic::Status),
    #[error("peer answered Hello as {0:?}")]
    WrongName(String),
    #[error("peer speaks protocol {0}, this agent needs {MIN_PROTOCOL_VERSION} or later: upgrade salt-keysync there")]
    OldProtocol(u32),
    #[error("peer closed the push stream")]
    PushClosed,
    #[error(transparent)]
    CoreGone(#[from] crate::node::CoreGone),
    #[error("refused the peer's answer: {0}")]
    BadAnswer(keysync_machine::node::BadAnswer),
    #[error("refused the peer's Fetch answer: {0}")]
    BadFetch(String),
}

pub struct PeerLink {
    pub peer: Peer,
    pub node: String,
    /// The current TLS material: each connection attempt takes the latest (a reload swaps it).
    pub tls: watch::Receiver<Arc<TlsSetup>>,
    pub core: CoreHandle,
    pub audit: Arc<crate::disk::audit::AuditLog>,
    pub anti_entropy_interval: Duration,
    pub reconnect_max: Duration,
    /// Link state, contact times and anti-entropy results, for `status`.
    pub board: Arc<Board>,
}

impl PeerLink {
    /// Keeps the link up until `shutdown`, reconnecting with backoff.
    pub async fn run(self, shutdown: CancellationToken) {
        let span = tracing::info_span!("peer", peer = %self.peer.name, address = %self.peer.address);
        async move {
            let mut backoff = FIRST_BACKOFF;
            let mut refused_name: Option<String> = None;
            // Audited once per distinct refusal, not at every reconnect.
            let mut last_refusal: Option<String> = None;
            loop {
                let (connected_tx, mut connected_rx) = mpsc::channel(1);
                let session = tokio::select! {
                    () = shutdown.cancelled() => return,
                    result = self.session(connected_tx, &shutdown) => result,
                };
                // Whatever this session planned to fetch is dropped, its claims released.
                let _ = self.core.tell(Request::Release { peer: self.peer.name.clone(), ids: None }).await;
                if connected_rx.try_recv().is_ok() {
                    backoff = FIRST_BACKOFF;
                    last_refusal = None;
                }
                match session {
                    Ok(()) => return,
                    Err(e) => {
                        // With its cause ("Connection refused", "master-b refused our
                        // certificate …"), as `status` shows it.
                        let cause = match &e {
                            // The status itself: its Display, which the transparent
                            // variant shows, carries its source's debug dump.
                            SessionError::Rpc(status) => {
                                crate::net::cause::describe(status, &self.peer.name, &self.node)
                            }
                            e => crate::net::cause::describe(e, &self.peer.name, &self.node),
                        };
                        tracing::warn!(error = %cause, retry_in = ?backoff, "sync failed");
                        self.board.set_state(&self.peer.name, LinkState::Down, Some(cause));
                        // A peer that answers as another node is refused; audited
                        // once per name presented, not on every retry.
                        if let SessionError::WrongName(name) = &e {
                            if refused_name.as_deref() != Some(name.as_str()) {
                                self.audit.record(crate::disk::audit::Record {
                                    peer: Some(name.clone()),
                                    remote: Some(self.peer.address.clone()),
                                    reason: Some(format!("{e}; expected {:?}", self.peer.name)),
                                    ..crate::disk::audit::Record::new(
                                        Action::Refuse,
                                        Via::Peer(&self.peer.name),
                                        Outcome::Refused,
                                    )
                                });
                                refused_name = Some(name.clone());
                            }
                        }
                        self.audit_tls_refusal(&e, &mut last_refusal);
                    }
                }
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(self.reconnect_max);
            }
        }
        .instrument(span)
        .await
    }

    /// A peer whose certificate this node refused (wrong name, another CA,
    /// expired) is audited with what it presented, as the listener does.
    fn audit_tls_refusal(&self, error: &SessionError, last: &mut Option<String>) {
        let SessionError::Connect(connect) = error else { return };
        let Some(refusal) = connect.tls_refusal() else { return };
        if last.as_deref() == Some(refusal.as_str()) {
            return;
        }
        self.audit.record(crate::disk::audit::Record {
            peer: Some(self.peer.name.clone()),
            remote: Some(self.peer.address.clone()),
            reason: Some(format!("refused the peer's certificate: {refusal}")),
            ..crate::disk::audit::Record::new(Action::Refuse, Via::Network, Outcome::Refused)
        });
        *last = Some(refusal);
    }

    async fn session(&self, connected: mpsc::Sender<()>, shutdown: &CancellationToken) -> Result<(), SessionError> {
        let tls = self.tls.borrow().clone();
        let mut client =
            keysync_server::connect(&self.peer.address, &self.peer.name, &tls, MAX_MESSAGE_BYTES, CONNECT_TIMEOUT)
                .await?;
        let hello = self.hello(&mut client).await?;
        // Subscribed before anti-entropy, so nothing decided meanwhile is missed.
        let mut outgoing = self.core.subscribe();
        // Two batches in flight: more would only queue small batches the peer
        // then applies one by one (see the coalescing below).
        let (push_tx, push_rx) = mpsc::channel::<v1::DecisionBatch>(2);
        let mut acks = client.push(ReceiverStream::new(push_rx)).await?.into_inner();
        let left = self.repair(&mut client, &push_tx, &mut outgoing, true).await?;
        let _ = connected.try_send(());
        self.board.set_state(&self.peer.name, LinkState::Up, None);
        tracing::info!(n_decisions = hello.n_decisions, "connected");

        let mut timer = tokio::time::interval(self.anti_entropy_interval);
        timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
        timer.tick().await;
        // A round left to the peer is compared again once the peer's round
        // is over (see anti_entropy), or at the next round if that is sooner.
        let again = crate::ops::board::FETCHING.min(self.anti_entropy_interval);
        if left {
            timer.reset_after(again);
        }
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                out = outgoing.recv() => match out {
                    Ok(out) if out.from.as_deref() == Some(self.peer.name.as_str()) => {}
                    Ok(out) => {
                        // Everything else already queued goes in the same push: while
                        // the peer is busy making the last batch durable, a burst
                        // (salt-key -A) accumulates here and is sent as one batch
                        // rather than as many small ones, each costing it its fsyncs.
                        let mut queued = vec![out];
                        while let Ok(more) = outgoing.try_recv() {
                            if more.from.as_deref() != Some(self.peer.name.as_str()) {
                                queued.push(more);
                            }
                        }
                        send_decisions(&push_tx, decisions_of(&queued)).await?;
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(n_batches = n, "fell behind; repairing by anti-entropy");
                        // Not left to the peer: its round cannot know what was dropped here.
                        self.repair(&mut client, &push_tx, &mut outgoing, false).await?;
                    }
                    Err(broadcast::error::RecvError::Closed) => return Ok(()),
                },
                ack = acks.message() => match ack? {
                    Some(ack) => {
                        self.board.contact(&self.peer.name);
                        tracing::trace!(n_received = ack.n_received, n_applied = ack.n_applied, "push acknowledged");
                    }
                    None => return Err(SessionError::PushClosed),
                },
                _ = timer.tick() => {
                    // Hello again: exchanges the masters' health, which may have changed.
                    self.hello(&mut client).await?;
                    if self.repair(&mut client, &push_tx, &mut outgoing, true).await? {
                        timer.reset_after(again);
                    }
                }
            }
        }
    }

    /// Names this node and its master's health; records the peer's.
    async fn hello(&self, client: &mut KeySyncClient<Channel>) -> Result<v1::HelloResponse, SessionError> {
        let health = Some(health_to_wire(&self.board.hello_health(&self.core).await));
        let peer = self.peer.name.to_string();
        let forgot_through_ms = self.core.ask(|reply| Request::ForgotThrough { peer, reply }).await?;
        let held = held_to_wire(&crate::ops::held::held_counts(&self.core).await?);
        let hlc = self.core.ask(|reply| Request::Clock { reply }).await?;
        let clock = Some(crate::net::wire::clock_to_wire(&self.board.clock_reading(hlc)));
        let request = |protocol_version| v1::HelloRequest {
            node: self.node.clone(),
            protocol_version,
            health: health.clone(),
            forgot_through_ms,
            held: held.clone(),
            clock,
        };
        let hello = match client.hello(request(PROTOCOL_VERSION)).await {
            Ok(answer) => answer.into_inner(),
            // An agent of an earlier release refuses a Hello newer than it
            // speaks, naming what it speaks: asked again in that protocol
            // (every message since protocol 1 carries what it needs), so a
            // rolling upgrade replicates both ways at full speed.
            Err(status) => match older_server(&status) {
                Some(theirs) => {
                    tracing::debug!(theirs, "the peer speaks an older protocol; speaking it");
                    client.hello(request(theirs)).await?.into_inner()
                }
                None => return Err(status.into()),
            },
        };
        if hello.node != self.peer.name {
            return Err(SessionError::WrongName(hello.node));
        }
        if hello.protocol_version < MIN_PROTOCOL_VERSION {
            return Err(SessionError::OldProtocol(hello.protocol_version));
        }
        self.board.contact(&self.peer.name);
        self.board.peer_health(&self.peer.name, health_from_wire(hello.health.clone()));
        self.board.peer_holds(&self.peer.name, held_from_wire(hello.held.clone()));
        self.board.peer_clock(&self.peer.name, crate::net::wire::clock_from_wire(hello.clock), hlc);
        let (peer, forgot_ms) = (self.peer.name.to_string(), hello.forgot_through_ms);
        self.core.tell(Request::PeerForgot { peer, forgot_ms }).await?;
        Ok(hello)
    }

    /// Anti-entropy rounds (see [`PeerLink::anti_entropy`]) that keep
    /// reading what this node sends its peers meanwhile, instead of leaving
    /// it queued: what came from this peer is dropped at once, the rest
    /// pushed once the round is over, as the live loop would have pushed it.
    /// A master joining two peers forwards to each every decision it fetches
    /// from the other: past [`MAX_HELD_BACK`] decisions (or a lag) they are
    /// dropped and another round follows, which finds by digest whatever they
    /// would have brought, as after a lag in the live loop.
    ///
    /// With `may_leave`, the first round may be left to the peer (see
    /// [`PeerLink::anti_entropy`]); returns whether it was, and the caller
    /// compares again [`FETCHING`](crate::ops::board::FETCHING) later (or
    /// at the next round, if sooner). A round that follows dropped
    /// decisions never is: the peer's round cannot know of them.
    async fn repair(
        &self,
        client: &mut KeySyncClient<Channel>,
        push_tx: &mpsc::Sender<v1::DecisionBatch>,
        outgoing: &mut broadcast::Receiver<Arc<crate::node::Outgoing>>,
        mut may_leave: bool,
    ) -> Result<bool, SessionError> {
        loop {
            let mut held = HeldBack::default();
            let left = {
                let round = self.anti_entropy(client, push_tx, may_leave);
                tokio::pin!(round);
                loop {
                    tokio::select! {
                        result = &mut round => break result?,
                        out = outgoing.recv(), if !held.closed => held.take(out, &self.peer.name),
                    }
                }
            };
            if !held.dropped {
                send_decisions(push_tx, decisions_of(&held.batches)).await?;
                return Ok(left);
            }
            tracing::info!("decisions to push piled up during anti-entropy; comparing digests again instead");
            may_leave = false;
        }
    }

    /// Digests first, then only what differs: fetch what the peer holds newer,
    /// push what this node holds newer. Returns whether the round was left
    /// to the peer, wholly or its push.
    async fn anti_entropy(
        &self,
        client: &mut KeySyncClient<Channel>,
        push_tx: &mpsc::Sender<v1::DecisionBatch>,
        may_leave: bool,
    ) -> Result<bool, SessionError> {
        // The peer is fetching from this master in a round of its own (a
        // joining master): that round brings it what this master holds
        // newer and pushes what it holds newer itself, so this one is left
        // to it and run once the peer's is over. Run now, it made the peer
        // answer a Diff with the summaries of all it held so far (10 MiB at
        // a joining master's peak), and pushed it again the keys it was
        // fetching.
        let leave = || may_leave && self.board.peer_fetching(&self.peer.name);
        if leave() {
            tracing::debug!("the peer is fetching from this master in a round of its own; this round waits for it");
            return Ok(true);
        }
        let Some(digests) = self.core.ask(|reply| Request::Digests { reply }).await? else {
            // Stale: out of contact for longer than tombstone_ttl, this
            // master offers nothing and asks for nothing until `rejoin`.
            return Ok(false);
        };
        let request = v1::DiffRequest { n_buckets: N_BUCKETS as u32, digests };
        let mut run = AntiEntropyRun { bytes_sent: request.encoded_len(), ..AntiEntropyRun::default() };
        let mut stream = client.diff(request).await?.into_inner();
        // Compared chunk by chunk as they come (the node keeps only its plan
        // and what it needs of the ids it holds): a peer's answer, however
        // large, is never held whole. The first chunk names the buckets.
        let mut n_buckets = None;
        let mut pending: keysync_machine::node::Summaries = Vec::new();
        let failed = loop {
            let chunk = match stream.message().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break None,
                Err(e) => break Some(SessionError::Rpc(e)),
            };
            run.bytes_received += chunk.encoded_len();
            if n_buckets.is_none() {
                n_buckets = Some(chunk.buckets.len());
                if chunk.buckets.is_empty() {
                    break None;
                }
                let (peer, buckets) = (self.peer.name.clone(), chunk.buckets);
                if let Err(e) = self.core.ask(|reply| Request::RepairBegin { peer, buckets, reply }).await? {
                    break Some(SessionError::BadAnswer(e));
                }
            } else if !chunk.buckets.is_empty() {
                break Some(SessionError::BadAnswer(keysync_machine::node::BadAnswer::BucketsLate));
            }
            // A malformed summary only means that id is not fetched. Handed
            // to the node COMPARE_CHUNK at a time: one ask per 2,000-summary
            // message kept a joining master's Diff waiting behind its fetches.
            pending.extend(chunk.entries.into_iter().filter_map(crate::net::wire::summary_from_wire));
            if pending.len() >= COMPARE_CHUNK {
                if let Err(e) = self.compare_chunk(std::mem::take(&mut pending)).await? {
                    break Some(SessionError::BadAnswer(e));
                }
            }
        };
        let failed = match failed {
            None if !pending.is_empty() => self.compare_chunk(pending).await?.err().map(SessionError::BadAnswer),
            failed => failed,
        };
        if let Some(e) = failed {
            let _ = self.core.tell(Request::RepairAbort { peer: self.peer.name.clone() }).await;
            return Err(e);
        }
        self.board.contact(&self.peer.name);
        let _ = self.core.tell(Request::Contact).await;
        let n_buckets = n_buckets.unwrap_or(0);
        if n_buckets == 0 {
            let _ = self.core.tell(Request::RepairAgreed { peer: self.peer.name.clone() }).await;
            run.at = crate::disk::audit::now_rfc3339();
            self.board.anti_entropy(&self.peer.name, run);
            return Ok(false);
        }
        let peer = self.peer.name.clone();
        let compared = match self.core.ask(|reply| Request::RepairEnd { peer, reply }).await? {
            Ok(compared) => compared,
            Err(e) => return Err(SessionError::BadAnswer(e)),
        };
        let Compared { n_newer_there, newer_here, full } = compared;
        // Loaded and pushed a chunk at a time: to a joining master that is
        // every decision held, 100,000 keys. Unless the peer started
        // fetching from this master meanwhile (both rounds began at once):
        // as above, its round brings it what differs, and this one is run
        // again once the peer's is over.
        let n_lacked = newer_here.len();
        let mut left = false;
        let mut n_pushed = 0;
        for ids in newer_here.chunks(FETCH_CHUNK) {
            if n_lacked > FETCH_CHUNK && leave() {
                tracing::debug!(
                    n_lacked,
                    n_pushed,
                    "the peer is fetching from this master in a round of its own; not pushing"
                );
                left = true;
                break;
            }
            let ids = ids.to_vec();
            let decisions = self.core.ask(|reply| Request::Fetch { ids, reply }).await?;
            n_pushed += decisions.len();
            run.bytes_sent += send_decisions(push_tx, &decisions).await?;
        }
        drop(newer_here);
        tracing::debug!(n_buckets, n_fetch = n_newer_there, n_push = n_pushed, "anti-entropy");
        run.differing_buckets = n_buckets;
        run.we_lacked = n_newer_there;
        run.peer_lacked = n_lacked;
        // What to fetch, chunk by chunk, is the node's choice (in a large
        // repair each chunk is cut to what is still missing and not being
        // fetched by another link); the next fetch travels while the last
        // one is applied.
        let mut n_applied = 0;
        let mut fetched = self.fetch_next(client).await;
        while let Some((ids, result)) = fetched.take() {
            let (decisions, sent, received) = match result {
                Ok(fetched) => fetched,
                Err(e) => {
                    self.release(ids).await;
                    return Err(e);
                }
            };
            run.bytes_sent += sent;
            run.bytes_received += received;
            let peer = self.peer.name.clone();
            let apply = self.core.ask(|reply| Request::RepairFetched { peer, ids, decisions, reply });
            let (applied, next) = tokio::join!(apply, self.fetch_next(client));
            n_applied += applied?;
            fetched = next;
        }
        if n_applied > 0 || n_pushed > 0 {
            tracing::info!(n_pulled = n_applied, n_pushed, "anti-entropy repaired differences");
        }
        run.applied = n_applied;
        run.at = crate::disk::audit::now_rfc3339();
        self.board.anti_entropy(&self.peer.name, run);
        if full {
            tracing::info!(n_applied, "more differs than one round fetches; comparing again soon");
        }
        Ok(left || full)
    }
}

impl PeerLink {
    /// Hands the node summaries of the peer's Diff answer to compare.
    async fn compare_chunk(
        &self,
        summaries: keysync_machine::node::Summaries,
    ) -> Result<Result<(), keysync_machine::node::BadAnswer>, crate::node::CoreGone> {
        let peer = self.peer.name.clone();
        self.core.ask(|reply| Request::RepairChunk { peer, summaries, reply }).await
    }

    /// Asks the node for the next ids to fetch and fetches them; `None`
    /// when the plan is done (or the core is gone).
    async fn fetch_next(
        &self,
        client: &mut KeySyncClient<Channel>,
    ) -> Option<(Vec<MinionId>, Result<(Vec<Decision>, usize, usize), SessionError>)> {
        let peer = self.peer.name.clone();
        let ids = self.core.ask(|reply| Request::RepairNext { peer, reply }).await.ok()??;
        let result = self.fetch(client, &ids).await;
        Some((ids, result))
    }

    /// Gives ids claimed for a fetch that failed back to the other links.
    async fn release(&self, ids: Vec<MinionId>) {
        let _ = self.core.tell(Request::Release { peer: self.peer.name.clone(), ids: Some(ids) }).await;
    }

    /// Fetches the decisions for `ids`; returns them with the bytes sent and
    /// received. Invalid ones are audited and left out.
    async fn fetch(
        &self,
        client: &mut KeySyncClient<Channel>,
        ids: &[MinionId],
    ) -> Result<(Vec<Decision>, usize, usize), SessionError> {
        let request = v1::FetchRequest { minions: ids.iter().map(ToString::to_string).collect() };
        let sent = request.encoded_len();
        let mut received = 0;
        let mut stream = client.fetch(request).await?.into_inner();
        let mut decisions: Vec<Decision> = Vec::with_capacity(ids.len());
        // Read as it comes, and refused as soon as it gives more than was
        // asked: an id not asked for, or more rows than an id can have.
        let asked: std::collections::HashSet<&MinionId> = ids.iter().collect();
        let most = ids.len() * keysync_machine::node::MAX_ROWS_PER_ID;
        let mut n_rows = 0;
        while let Some(batch) = stream.message().await? {
            received += batch.encoded_len();
            n_rows += batch.decisions.len();
            if n_rows > most {
                return Err(SessionError::BadFetch(format!(
                    "more than {most} decisions for the {} ids asked for",
                    ids.len()
                )));
            }
            for msg in batch.decisions {
                match decision_from_wire(msg) {
                    Ok(decision) if !asked.contains(&decision.id) => {
                        return Err(SessionError::BadFetch(format!("a decision for {:?}, not asked for", decision.id)));
                    }
                    Ok(decision) => decisions.push(decision),
                    Err(e) => crate::net::rpc::audit_refused(&self.audit, self.board.metrics(), &self.peer.name, &e),
                }
            }
        }
        Ok((decisions, sent, received))
    }
}

/// Summaries of a peer's Diff answer handed to the node at once (a few MiB).
const COMPARE_CHUNK: usize = 20_000;

/// The protocol an agent of an earlier release speaks, from its refusal of
/// a newer Hello ("protocol version 2 is not supported (this server speaks
/// 1)"), if this agent speaks it too.
fn older_server(status: &tonic::Status) -> Option<u32> {
    if status.code() != tonic::Code::FailedPrecondition || !status.message().contains("is not supported") {
        return None;
    }
    let (_, speaks) = status.message().rsplit_once("this server speaks ")?;
    let theirs: u32 = speaks.trim_end_matches(')').parse().ok()?;
    (MIN_PROTOCOL_VERSION..PROTOCOL_VERSION).contains(&theirs).then_some(theirs)
}

/// Most decisions a link holds back for its peer during an anti-entropy
/// round (see [`PeerLink::repair`]). Held with their keys: a master joining
/// two peers forwards to each the decisions fetched from the other, and
/// each link held 10,000 of them (~7 MiB) before dropping them for another
/// round anyway; a burst larger than this during a round costs one more
/// comparison of digests.
const MAX_HELD_BACK: usize = 1000;

/// What this node sent its peers while a link was in an anti-entropy round.
#[derive(Default)]
struct HeldBack {
    /// For the peer, in order.
    batches: Vec<Arc<crate::node::Outgoing>>,
    n_decisions: usize,
    /// Some were dropped (too many, or the channel lagged): another round.
    dropped: bool,
    /// The core task is gone: nothing more comes.
    closed: bool,
}

impl HeldBack {
    fn take(&mut self, out: Result<Arc<crate::node::Outgoing>, broadcast::error::RecvError>, peer: &str) {
        match out {
            Ok(out) if out.from.as_deref() == Some(peer) => {}
            Ok(out) => {
                self.n_decisions += out.decisions.len();
                if self.dropped || self.n_decisions > MAX_HELD_BACK {
                    self.drop_all();
                } else {
                    self.batches.push(out);
                }
            }
            Err(broadcast::error::RecvError::Lagged(_)) => self.drop_all(),
            Err(broadcast::error::RecvError::Closed) => self.closed = true,
        }
    }

    fn drop_all(&mut self) {
        self.dropped = true;
        self.batches = Vec::new();
    }
}

/// The decisions of `batches`, in order (a list of references: an iterator
/// chaining the batches could not be held across the pushes' awaits).
fn decisions_of(batches: &[Arc<crate::node::Outgoing>]) -> Vec<&Decision> {
    batches.iter().flat_map(|o| &o.decisions).collect()
}

/// Pushes decisions in batches of at most [`PUSH_BATCH_BYTES`] (well under
/// the message cap) and [`PUSH_BATCH_DECISIONS`]: the peer makes each batch
/// durable with one syncfs and one store commit, so a burst (salt-key -A)
/// costs a few of those, not one per thousand keys. Returns the bytes sent.
async fn send_decisions<'a>(
    push_tx: &mpsc::Sender<v1::DecisionBatch>,
    decisions: impl IntoIterator<Item = &'a Decision>,
) -> Result<usize, SessionError> {
    let mut n_bytes = 0;
    let mut batch = v1::DecisionBatch::default();
    let mut batch_bytes = 0;
    for decision in decisions {
        let wire = decision_to_wire(decision);
        let len = wire_size(decision);
        if !batch.decisions.is_empty()
            && (batch_bytes + len > PUSH_BATCH_BYTES || batch.decisions.len() >= PUSH_BATCH_DECISIONS)
        {
            n_bytes += batch.encoded_len();
            push_tx.send(std::mem::take(&mut batch)).await.map_err(|_| SessionError::PushClosed)?;
            batch_bytes = 0;
        }
        batch_bytes += len;
        batch.decisions.push(wire);
    }
    if !batch.decisions.is_empty() {
        n_bytes += batch.encoded_len();
        push_tx.send(batch).await.map_err(|_| SessionError::PushClosed)?;
    }
    Ok(n_bytes)
}

/// An upper bound of a decision's encoded size: its key, id and two
/// versions, plus generous room for tags and lengths.
fn wire_size(decision: &Decision) -> usize {
    let key = decision.verdict.key().map_or(0, |key| key.bytes().len());
    let versions = decision.version.node.len() + decision.context.iter().map(|v| v.node.len() + 12).sum::<usize>();
    key + decision.id.as_str().len() + versions + 64
}

#[cfg(test)]
mod tests;
