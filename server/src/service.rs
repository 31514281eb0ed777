//! The KeySync gRPC service: binds every call to the caller's certificate name, checks Hello,
//! and hands the rest to the caller's [`Handler`].

use std::pin::Pin;
use std::sync::Arc;

use keysync_proto::v1::key_sync_server::KeySync;
use keysync_proto::v1::{
    DecisionBatch, DiffChunk, DiffRequest, FetchRequest, HelloRequest, HelloResponse, PlanRequest, PlanResponse,
    PushAck,
};
use keysync_proto::{MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Code, Request, Response, Status, Streaming};

use crate::events::{EventSink, TransportEvent};
use crate::identity::{PeerInfo, PeerName};
use crate::refusals::ReachedService;

/// What the agent does with the calls of an authenticated peer. `peer` is always the name from
/// the peer's certificate; Hello has already been checked against it.
#[tonic::async_trait]
pub trait Handler: Send + Sync + 'static {
    async fn hello(&self, peer: &PeerName, req: HelloRequest) -> Result<HelloResponse, Status>;
    /// Called once per batch of a Push stream; an error ends the stream with that status.
    async fn push(&self, peer: &PeerName, batch: DecisionBatch) -> Result<PushAck, Status>;
    async fn diff(&self, peer: &PeerName, req: DiffRequest) -> Result<Items<DiffChunk>, Status>;
    async fn fetch(&self, peer: &PeerName, req: FetchRequest) -> Result<Items<DecisionBatch>, Status>;
    async fn plan(&self, peer: &PeerName, req: PlanRequest) -> Result<PlanResponse, Status>;
}

/// The messages of a streamed answer, each made when the stream is ready to
/// send it: a Diff answer to a joining master is 100,000 summaries, which
/// as messages all made at once took twice the memory of the summaries.
pub type Items<T> = Box<dyn Iterator<Item = T> + Send>;

/// Acks buffered per Push stream before the handler waits for the client to read them.
const PUSH_ACK_BUFFER: usize = 16;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Adapts a [`Handler`] to the generated `KeySync` trait.
pub(crate) struct KeySyncService<H> {
    handler: Arc<H>,
    events: EventSink,
    budgets: crate::budget::Budgets,
    /// Longest a peer may take to read an answer whole.
    answer_deadline: std::time::Duration,
}

impl<H: Handler> KeySyncService<H> {
    pub(crate) fn new(handler: Arc<H>, events: EventSink, answer_deadline: std::time::Duration) -> Self {
        Self { handler, events, budgets: crate::budget::Budgets::new(), answer_deadline }
    }

    /// A place for an answer to `peer` (`what`: the call), or the refusal.
    fn answer_place(&self, peer: &PeerName, what: &str) -> Result<crate::budget::AnswerPlace, Status> {
        self.budgets.open_answer(peer).ok_or_else(|| {
            self.refuse(
                peer,
                Status::resource_exhausted(format!(
                    "{what}: {peer} has {} answers in flight already: this one is refused (an agent reads one at a \
                     time)",
                    crate::budget::ANSWERS_PER_PEER
                )),
            )
        })
    }

    /// Sends `items` as they are read, within the peer's answer budget: the
    /// place is held until the answer is read whole or cut off; a peer that
    /// has not read it all by the deadline is cut off (its stream ends with
    /// an error, told once) and the answer's memory given back.
    fn answer<T: Send + 'static>(
        &self,
        peer: PeerName,
        what: &'static str,
        items: Items<T>,
        place: crate::budget::AnswerPlace,
    ) -> BoxStream<T> {
        let (tx, rx) = mpsc::channel::<Result<T, Status>>(1);
        let deadline = tokio::time::Instant::now() + self.answer_deadline;
        let events = self.events.clone();
        tokio::spawn(async move {
            let mut items = items;
            for item in items.by_ref() {
                match tokio::time::timeout_at(deadline, tx.send(Ok(item))).await {
                    Ok(Ok(())) => {}
                    // The peer went away: nothing more to send.
                    Ok(Err(_)) => return,
                    Err(_) => {
                        // The answer's memory and the place are given back now; the
                        // reader, if it comes back, learns the answer was cut off.
                        drop(items);
                        drop(place);
                        let status = Status::deadline_exceeded(format!(
                            "{what}: the answer was not read whole within the answer deadline: cut off"
                        ));
                        events.emit(TransportEvent::RequestRefused { peer, reason: status.message().to_owned() });
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                }
            }
        });
        Box::pin(ReceiverStream::new(rx))
    }

    /// The caller's peer name; also tells the audit layer that the request got this far.
    fn peer_of<T>(&self, request: &Request<T>) -> Result<PeerName, Status> {
        if let Some(reached) = request.extensions().get::<ReachedService>() {
            reached.mark();
        }
        match request.extensions().get::<PeerInfo>() {
            Some(info) => Ok(info.peer.clone()),
            // Only reachable if the service were mounted on a listener other than ours.
            None => Err(Status::unauthenticated("connection carries no peer identity")),
        }
    }

    fn refuse(&self, peer: &PeerName, status: Status) -> Status {
        self.events.emit(TransportEvent::RequestRefused { peer: peer.clone(), reason: status.message().to_owned() });
        status
    }
}

/// Whether an error from an inbound stream is the peer sending something we refuse (as opposed
/// to the connection going away, which is not worth an audit record).
fn is_refusal(status: &Status) -> bool {
    matches!(status.code(), Code::OutOfRange | Code::ResourceExhausted | Code::Internal | Code::InvalidArgument)
}

#[tonic::async_trait]
impl<H: Handler> KeySync for KeySyncService<H> {
    async fn hello(&self, request: Request<HelloRequest>) -> Result<Response<HelloResponse>, Status> {
        let peer = self.peer_of(&request)?;
        let hello = request.into_inner();
        if hello.node != peer.as_str() {
            return Err(self.refuse(
                &peer,
                Status::permission_denied(format!(
                    "Hello names node {:?} but the client certificate is for {:?}",
                    hello.node, peer
                )),
            ));
        }
        // Any version from the oldest this build speaks up: a newer caller
        // reads this server's answer and speaks down to it.
        if hello.protocol_version < MIN_PROTOCOL_VERSION {
            return Err(self.refuse(
                &peer,
                Status::failed_precondition(format!(
                    "protocol version {} is too old (this server speaks {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION}); \
                     upgrade salt-keysync on {}",
                    hello.protocol_version, peer
                )),
            ));
        }
        let response = self.handler.hello(&peer, hello).await?;
        Ok(Response::new(response))
    }

    type PushStream = BoxStream<PushAck>;

    async fn push(&self, request: Request<Streaming<DecisionBatch>>) -> Result<Response<Self::PushStream>, Status> {
        let peer = self.peer_of(&request)?;
        let Some(place) = self.budgets.open_push(&peer) else {
            let status = Status::resource_exhausted(format!(
                "{peer} has {} push streams open already: this one is refused (an agent keeps one per link, two on a path that loses packets or while it probes its path)",
                crate::budget::PUSH_STREAMS_PER_PEER
            ));
            return Err(self.refuse(&peer, status));
        };
        let mut inbound = request.into_inner();
        let (ack_tx, ack_rx) = mpsc::channel(PUSH_ACK_BUFFER);
        let handler = self.handler.clone();
        let events = self.events.clone();
        let budgets = self.budgets.clone();
        tokio::spawn(async move {
            let _place = place;
            loop {
                // The next batch is read as it comes, and handled only within
                // the budgets (`budget.rs`): nothing more is read meanwhile.
                let ack = match inbound.message().await {
                    Ok(Some(batch)) => {
                        let _permits = budgets.acquire(&peer).await;
                        if batch.decisions.is_empty() {
                            // A probe of the path (an agent's link sends them
                            // at first, `copies.rs`): answered at once.
                            Ok(PushAck::default())
                        } else {
                            handler.push(&peer, batch).await
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        if is_refusal(&status) {
                            events.emit(TransportEvent::RequestRefused {
                                peer: peer.clone(),
                                reason: format!("Push: {}", status.message()),
                            });
                        } else {
                            tracing::debug!(peer = %peer, error = %status, "push stream ended");
                        }
                        Err(status)
                    }
                };
                let failed = ack.is_err();
                // A closed channel means the client went away: nothing left to acknowledge.
                if ack_tx.send(ack).await.is_err() || failed {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(ack_rx))))
    }

    type DiffStream = BoxStream<DiffChunk>;

    async fn diff(&self, request: Request<DiffRequest>) -> Result<Response<Self::DiffStream>, Status> {
        let peer = self.peer_of(&request)?;
        let place = self.answer_place(&peer, "Diff")?;
        let chunks = self.handler.diff(&peer, request.into_inner()).await?;
        Ok(Response::new(self.answer(peer, "Diff", chunks, place)))
    }

    type FetchStream = BoxStream<DecisionBatch>;

    async fn fetch(&self, request: Request<FetchRequest>) -> Result<Response<Self::FetchStream>, Status> {
        let peer = self.peer_of(&request)?;
        let place = self.answer_place(&peer, "Fetch")?;
        let batches = self.handler.fetch(&peer, request.into_inner()).await?;
        Ok(Response::new(self.answer(peer, "Fetch", batches, place)))
    }

    async fn plan(&self, request: Request<PlanRequest>) -> Result<Response<PlanResponse>, Status> {
        let peer = self.peer_of(&request)?;
        Ok(Response::new(self.handler.plan(&peer, request.into_inner()).await?))
    }
}
