//! Outbound replication: one task per configured peer keeps a connection,
//! pushes this node's decisions as they happen, and runs anti-entropy on
//! connect and periodically (pulling what the peer holds newer, pushing what
//! this node holds newer).

use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use keysync_machine::link::{Answer, Call, Input, LinkSettings, Out, Round};
use keysync_machine::PeerName;
use keysync_proto::v1::{self, key_sync_client::KeySyncClient};
use keysync_proto::{MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};
use keysync_server::TlsSetup;
use prost::Message;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tracing::Instrument;

use answers::Answering;
use copies::Copies;
pub use copies::LossyUntil;
use error::SessionError;
use push::{during, send_decisions, Copying, PushIo, NO_ONE, PUSHES_IN_FLIGHT};

use crate::config::Peer;
use crate::core::digest::N_BUCKETS;
use crate::core::Decision;
use crate::disk::audit::{Action, Outcome, Via};
use crate::disk::pki::prestage::Prestaged;
use crate::net::wire::{health_from_wire, health_to_wire, held_from_wire, held_to_wire};
use crate::node::{CoreHandle, Request};
use crate::ops::board::{AntiEntropyRun, Board, LinkState};

pub const MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

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
    /// The listener: the peer's connections to it tell whether the path
    /// loses packets (`peers/copies.rs`).
    pub listener: keysync_server::ListenerControl,
    /// Until when the path is taken for one that loses packets, across sessions.
    pub lossy_until: LossyUntil,
    /// Cancelled once the link this one replaces (a reload restarted it,
    /// or removed it and added it again) has ended, its claims released.
    pub after: Option<CancellationToken>,
    /// Cancelled when this link's task ends.
    pub ended: CancellationToken,
}

impl PeerLink {
    /// Keeps the link up until `shutdown`, reconnecting with backoff.
    pub async fn run(self, shutdown: CancellationToken) {
        let span = tracing::info_span!("peer", peer = %self.peer.name, address = %self.peer.address);
        let _ended = self.ended.clone().drop_guard();
        async move {
            let mut backoff = FIRST_BACKOFF;
            let mut refused_name: Option<String> = None;
            // Audited once per distinct refusal, not at every reconnect.
            let mut last_refusal: Option<String> = None;
            // A phase of its own: this agent's links and its peers' run their
            // rounds at different times (see `LinkSettings::phase`).
            let random = std::collections::hash_map::RandomState::new().hash_one(self.peer.name.as_str());
            let settings =
                LinkSettings::new(self.anti_entropy_interval, crate::ops::board::FETCHING).with_phase(random);
            let mut link = Link::new(settings);
            // A link a reload restarted (or added again) waits until the one
            // it replaces let go of its claims: that one's release must not
            // drop this one's. Even when stopped meanwhile, since a link
            // started after this one waits for this one's end. (That one's
            // end comes soon: it was stopped, and only releases its claims.)
            if let Some(before) = &self.after {
                before.cancelled().await;
                if shutdown.is_cancelled() {
                    return;
                }
            }
            loop {
                let (connected_tx, mut connected_rx) = mpsc::channel(1);
                let session = tokio::select! {
                    () = shutdown.cancelled() => None,
                    result = self.session(&mut link, connected_tx, &shutdown) => Some(result),
                };
                // The session is over: the link drops whatever it planned to
                // fetch and releases its claims (a fault did already). Also
                // when a reload stopped the link while the core runs on:
                // the other links leave what this one claimed to it, so
                // those keys would never come. (At the agent's stop the core
                // has stopped first: the call fails at once.)
                link.handle(Input::Failed, false);
                while let Some(out) = link.poll() {
                    if let Out::Call(call) = out {
                        let _ = self.call(call, None).await;
                    }
                }
                let Some(session) = session else { return };
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
                        // A peer whose answer timed out is tried again after
                        // a round's interval: the other links' rounds take
                        // what this one let go of first (connected again at
                        // once, it would claim it again).
                        if e.timed_out() {
                            backoff = backoff.max(self.anti_entropy_interval);
                        }
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
            peer: Some(self.peer.name.to_string()),
            remote: Some(self.peer.address.clone()),
            reason: Some(format!("refused the peer's certificate: {refusal}")),
            ..crate::disk::audit::Record::new(Action::Refuse, Via::Network, Outcome::Refused)
        });
        *last = Some(refusal);
    }

    /// One session, on two connections (its rounds, its live pushes): the
    /// link machine's session, carried out. Returns `Ok` only at shutdown
    /// (or when the node is gone).
    async fn session(
        &self,
        link: &mut Link,
        connected: mpsc::Sender<()>,
        shutdown: &CancellationToken,
    ) -> Result<(), SessionError> {
        let tls = self.tls.borrow().clone();
        // Two connections, made at once: one for the rounds (Hello, Diff,
        // Fetch), one for the live pushes alone. On one connection a live
        // push went out behind whatever a round had sent before it (its
        // 8 KB of digests): with BBR's cwnd of 4 segments in PROBE_RTT,
        // that cost a round trip more at 300 ms RTT (a decision 404-476 ms
        // late, where one-way was 150 ms).
        // Neither is made again if lost: the session ends, and the next
        // connects with the TLS material of then.
        let connect = || {
            keysync_server::connect_once(&self.peer.address, &self.peer.name, &tls, MAX_MESSAGE_BYTES, CONNECT_TIMEOUT)
        };
        let ((mut client, rounds_probe), (mut push_client, push_probe)) = tokio::try_join!(connect(), connect())?;
        // Followed before the first round, so nothing decided meanwhile is
        // missed: it is pushed at once, rounds or not.
        let outgoing = self.core.follow(&self.peer.name);
        let (push_tx, push_rx) = mpsc::channel::<v1::DecisionBatch>(PUSHES_IN_FLIGHT);
        // The session's first Hello goes with the opening of its push
        // stream: one round trip, not two (a joining master's first key
        // came a round trip later). What the node sends meanwhile waits in
        // the link, which pushes it once the Hello is done.
        link.handle(Input::Connected, false);
        let first = link.poll();
        debug_assert!(matches!(first, Some(Out::Hello)), "a session begins with Hello");
        let open_push = async { Ok::<_, SessionError>(push_client.push(ReceiverStream::new(push_rx)).await?) };
        let first_diff = self.first_diff(client.clone());
        let (acks, hello, first_diff) = tokio::try_join!(open_push, self.hello(&mut client), first_diff)?;
        let acks = acks.into_inner();
        let probes = [rounds_probe, push_probe];
        let (listener, peer, lossy_until) = (self.listener.clone(), self.peer.name.clone(), self.lossy_until.clone());
        let takes_copies = copies::takes_copies(&hello);
        let copies = Copies::new(client.clone(), probes, listener, peer, lossy_until, takes_copies);
        let mut io = SessionIo {
            client,
            push: PushIo {
                tx: push_tx,
                unacked: 0,
                acks,
                waiting: Vec::new(),
                outgoing,
                board: self.board.clone(),
                peer: self.peer.name.clone(),
                copies,
            },
            timer: Box::pin(tokio::time::sleep(self.anti_entropy_interval)),
            timer_armed: false,
            diff: None,
            first_diff,
            run: AntiEntropyRun::default(),
            n_decisions: hello.n_decisions,
            connected,
            staged: None,
        };
        link.handle(Input::HelloDone, self.board.peer_fetching(&self.peer.name));
        loop {
            // What the link asks for, until it waits for something from outside.
            while let Some(out) = link.poll() {
                self.execute(out, link, &mut io).await?;
            }
            let SessionIo { push, timer, timer_armed, .. } = &mut io;
            let PushIo { outgoing, unacked, acks, copies, .. } = push;
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                out = outgoing.receiver.recv(), if *unacked < PUSHES_IN_FLIGHT => match out {
                    Ok(out) => push.take(link, out),
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(n_batches = n, "fell behind; repairing by anti-entropy");
                        link.handle(Input::Lagged, self.board.peer_fetching(&self.peer.name));
                    }
                    Err(broadcast::error::RecvError::Closed) => return Ok(()),
                },
                ack = acks.message() => {
                    push.acknowledged(ack)?;
                    push.flush(link).await?;
                }
                // The path told: copies stop on a clean one.
                found = copies.probes_ended() => push.copies.probes_found(found),
                () = timer.as_mut(), if *timer_armed => {
                    *timer_armed = false;
                    push.copies.wanted();
                    link.handle(Input::Due, self.board.peer_fetching(&self.peer.name));
                }
            }
        }
    }

    /// Carries out one thing the link asks for, and hands it the answer.
    async fn execute(
        &self,
        out: Out<Arc<crate::node::Outgoing>>,
        link: &mut Link,
        io: &mut SessionIo,
    ) -> Result<(), SessionError> {
        let input = match out {
            Out::Hello => {
                let hello = during(self.hello(&mut io.client), link, &mut io.push).await??;
                io.n_decisions = hello.n_decisions;
                Input::HelloDone
            }
            Out::Call(call) => {
                // The last chunk's keys were written ahead while the one before was applied.
                let staged = if matches!(call, Call::Apply { .. }) { io.staged.take() } else { None };
                let ask = self.call(call, staged);
                match during(ask, link, &mut io.push).await?? {
                    Some(answer) => Input::Answer(answer),
                    None => return Ok(()),
                }
            }
            Out::Diff { digests, empty } => {
                let stream = match io.first_diff.take() {
                    Some((stream, answering, bytes_sent)) => {
                        io.run = AntiEntropyRun { bytes_sent, ..AntiEntropyRun::default() };
                        (stream, answering)
                    }
                    None => {
                        let request = diff_request(digests, empty);
                        io.run = AntiEntropyRun { bytes_sent: request.encoded_len(), ..AntiEntropyRun::default() };
                        let answering = Answering::start("Diff");
                        let opening = answering.opening(io.client.diff(request));
                        (during(opening, link, &mut io.push).await??.into_inner(), answering)
                    }
                };
                io.diff = Some(stream);
                self.read_diff(link, io).await?
            }
            Out::ReadDiff => self.read_diff(link, io).await?,
            Out::Fetch(fetch) => {
                let fetched = during(self.fetch(&mut io.client, &fetch), link, &mut io.push).await??;
                let (decisions, sent, received) = fetched;
                io.run.bytes_sent += sent;
                io.run.bytes_received += received;
                Input::Fetched(decisions)
            }
            Out::FetchApplying { fetch, applying, decisions } => {
                // Both at once; the apply is handed in first, as the link asks.
                let apply = self.call(Call::Apply { fetch: applying, decisions }, io.staged.take());
                let both = async { tokio::join!(apply, self.fetch_writing_ahead(&mut io.client, &fetch)) };
                let (applied, (fetched, staged)) = during(both, link, &mut io.push).await?;
                io.staged = staged;
                if let Some(answer) = applied? {
                    link.handle(Input::Answer(answer), self.board.peer_fetching(&self.peer.name));
                }
                let (decisions, sent, received) = fetched?;
                io.run.bytes_sent += sent;
                io.run.bytes_received += received;
                Input::Fetched(decisions)
            }
            Out::Push(batches) => {
                io.push.waiting.extend(batches);
                io.push.flush(link).await?;
                return Ok(());
            }
            Out::PushLoaded(decisions) => {
                let decisions: Vec<(&Decision, &[PeerName])> = decisions.iter().map(|d| (d, NO_ONE)).collect();
                io.run.bytes_sent += send_decisions(&mut io.push, decisions, Copying::Never).await?;
                return Ok(());
            }
            Out::Up => {
                io.first_diff = None;
                let _ = io.connected.try_send(());
                self.board.set_state(&self.peer.name, LinkState::Up, None);
                tracing::info!(n_decisions = io.n_decisions, "connected");
                return Ok(());
            }
            Out::Report(round) => {
                io.first_diff = None;
                self.report(round, std::mem::take(&mut io.run));
                return Ok(());
            }
            Out::Rearm(after) => {
                io.timer.as_mut().reset(tokio::time::Instant::now() + after);
                io.timer_armed = true;
                return Ok(());
            }
            Out::Fault(fault) => return Err(SessionError::Fault(fault)),
        };
        link.handle(input, self.board.peer_fetching(&self.peer.name));
        Ok(())
    }

    /// The session's first round's Diff, sent with its first Hello when this
    /// node joins (it holds nothing at all): a round trip sooner (a joining
    /// master's first key comes four round trips after its connection, not
    /// five). A master holding something sends its Diff after the Hello:
    /// the peer may be the one joining, and this round is then left to the
    /// peer's fetches, its digests (8 KiB) never sent (sent with the Hello,
    /// they were 8 KiB of the 22 KB a joiner received from each peer it
    /// fetched 16 keys from). Only when this node forgot no delete the peer
    /// may not know of:
    /// its Hello could then make the peer stale, and the peer might answer
    /// the Diff before reading the Hello. The Hello may make this node
    /// stale too: its round then runs no Diff, and the answer is dropped
    /// unread. Any failure leaves the Diff to the round.
    async fn first_diff(
        &self,
        mut client: KeySyncClient<Channel>,
    ) -> Result<Option<(tonic::Streaming<v1::DiffChunk>, Answering, usize)>, SessionError> {
        let peer = self.peer.name.clone();
        if self.core.ask(|reply| Request::ForgotThrough { peer, reply }).await? != 0 {
            return Ok(None);
        }
        if !self.core.ask(|reply| Request::Joining { reply }).await? {
            return Ok(None);
        }
        let Some(asking) = self.core.ask(|reply| Request::Digests { reply }).await? else { return Ok(None) };
        let request = diff_request(asking.digests, asking.empty);
        let sent = request.encoded_len();
        // Its opening has no deadline: the peer answers it once its own
        // start is over, as the Hello. The rest of it has, from then on.
        Ok(client.diff(request).await.ok().map(|answer| (answer.into_inner(), Answering::start("Diff"), sent)))
    }

    /// Asks the node what the link asks of it (`staged`: the keys written
    /// ahead for a [`Call::Apply`]); `None` for calls that want no answer.
    async fn call(&self, call: Call, staged: Option<Prestaged>) -> Result<Option<Answer>, SessionError> {
        let peer = self.peer.name.clone();
        let core = &self.core;
        Ok(Some(match call {
            Call::Digests => Answer::Digests(core.ask(|reply| Request::Digests { reply }).await?),
            Call::Begin { buckets, whole } => {
                Answer::Checked(core.ask(|reply| Request::RepairBegin { peer, buckets, whole, reply }).await?)
            }
            Call::Compare(summaries) => {
                Answer::Checked(core.ask(|reply| Request::RepairChunk { peer, summaries, reply }).await?)
            }
            Call::End => Answer::Compared(core.ask(|reply| Request::RepairEnd { peer, reply }).await?),
            Call::Load(ids) => Answer::Loaded(core.ask(|reply| Request::Fetch { ids, reply }).await?),
            Call::Next => Answer::Next(core.ask(|reply| Request::RepairNext { peer, reply }).await?),
            Call::ApplyBrought { fetch, decisions } => {
                Answer::Applied(core.ask(|reply| Request::RepairBrought { peer, fetch, decisions, reply }).await?)
            }
            Call::Apply { fetch, decisions } => Answer::Applied(
                core.ask(|reply| Request::RepairFetched { peer, fetch, decisions, staged, reply }).await?,
            ),
            Call::Agreed => {
                core.tell(Request::RepairAgreed { peer }).await?;
                return Ok(None);
            }
            Call::Contact => {
                self.board.contact(&self.peer.name);
                core.tell(Request::Contact).await?;
                return Ok(None);
            }
            Call::LinkDown => {
                // Whatever the session planned to fetch is dropped, its claims released.
                core.tell(Request::LinkDown { peer }).await?;
                return Ok(None);
            }
        }))
    }

    /// What a round compared and moved, for `status` and the log.
    fn report(&self, round: Round, mut run: AntiEntropyRun) {
        let (n_fetch, n_push, n_applied) = (round.we_lacked, round.pushed, round.applied);
        tracing::debug!(n_buckets = round.differing_buckets, n_fetch, n_push, "anti-entropy");
        if n_applied > 0 || n_push > 0 {
            tracing::info!(n_pulled = n_applied, n_pushed = n_push, "anti-entropy repaired differences");
        }
        if round.full {
            tracing::info!(n_applied, "more differs than one round fetches; comparing again soon");
        }
        if round.left {
            tracing::debug!(
                n_lacked = round.peer_lacked,
                n_pushed = n_push,
                "the peer is fetching from this master in a round of its own; not pushing"
            );
        }
        run.differing_buckets = round.differing_buckets;
        run.we_lacked = round.we_lacked;
        run.peer_lacked = round.peer_lacked;
        run.applied = round.applied;
        run.at = crate::disk::audit::now_rfc3339();
        self.board.anti_entropy(&self.peer.name, run);
    }

    /// Names this node and its master's health; records the peer's.
    async fn hello(&self, client: &mut KeySyncClient<Channel>) -> Result<v1::HelloResponse, SessionError> {
        let health = Some(health_to_wire(&self.board.hello_health(&self.core).await));
        let peer = self.peer.name.clone();
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
        // No deadline: a peer answers its first Hello once its own start is
        // over (tens of seconds at a million keys), and a Hello holds
        // nothing of this node's.
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
        if hello.node != self.peer.name.as_str() {
            return Err(SessionError::WrongName(hello.node));
        }
        if hello.protocol_version < MIN_PROTOCOL_VERSION {
            return Err(SessionError::OldProtocol(hello.protocol_version));
        }
        self.board.contact(&self.peer.name);
        self.board.peer_health(&self.peer.name, health_from_wire(hello.health.clone()));
        self.board.peer_holds(&self.peer.name, held_from_wire(hello.held.clone()));
        self.board.peer_clock(&self.peer.name, crate::net::wire::clock_from_wire(hello.clock), hlc);
        let (peer, forgot_ms) = (self.peer.name.clone(), hello.forgot_through_ms);
        self.core.tell(Request::PeerForgot { peer, forgot_ms }).await?;
        if hello.joining && self.core.ask(|reply| Request::OffersSomething { reply }).await? {
            // Its own rounds fetch all this node holds whole: this link's
            // round is left to them, and no digests are sent. (Between two
            // masters holding nothing, rounds run: there is nothing to
            // leave, and `status` shows them.)
            self.board.peer_fetched(&self.peer.name);
        }
        Ok(hello)
    }
}

/// A Diff asking for `empty` buckets whole.
fn diff_request(digests: Vec<u64>, empty: Vec<u32>) -> v1::DiffRequest {
    let empty = crate::net::wire::buckets::to_bitmap(empty);
    v1::DiffRequest { n_buckets: N_BUCKETS as u32, digests, empty }
}

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

/// The link to one peer, over the node's outgoing batches.
type Link = keysync_machine::link::Link<Arc<crate::node::Outgoing>>;

/// What one session carries its link's asks over.
struct SessionIo {
    client: KeySyncClient<Channel>,
    push: PushIo,
    /// The round timer, while armed (the link sets it).
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
    timer_armed: bool,
    /// The Diff answer being read.
    diff: Option<(tonic::Streaming<v1::DiffChunk>, Answering)>,
    /// The first round's Diff, sent with the session's first Hello, and
    /// the bytes of its request: used by that round only.
    first_diff: Option<(tonic::Streaming<v1::DiffChunk>, Answering, usize)>,
    /// The round's bytes on the wire, for `status`.
    run: AntiEntropyRun,
    /// What the peer said it holds, for the log.
    n_decisions: u64,
    connected: mpsc::Sender<()>,
    /// The keys of the chunk fetched last, written ahead until it is applied.
    staged: Option<Prestaged>,
}

mod answers;
mod copies;
mod error;
mod push;
#[cfg(test)]
mod tests;
