//! The agent's side of the gRPC service: validates what peers send and hands
//! it to the core task. Transport events become audit records here.

use std::sync::Arc;

use keysync_proto::v1;
use keysync_proto::PROTOCOL_VERSION;
use keysync_server::{Handler, Items, PeerName, TransportEvent};
use tonic::Status;

use crate::core::digest::N_BUCKETS;
use crate::core::MinionId;
use crate::disk::audit::{Action, Outcome, Via};
use crate::disk::audit::{AuditLog, Record};
use crate::net::wire::{
    decision_from_wire, decision_to_wire, health_from_wire, health_to_wire, held_from_wire, held_to_wire,
    summary_to_wire,
};
use crate::node::{CoreHandle, Request};

/// Most ids one Fetch may ask for.
pub const MAX_FETCH_IDS: usize = keysync_machine::node::MAX_FETCH;
/// Decisions per message of a Fetch or Push stream (~0.5 MB with RSA keys).
pub const DECISIONS_PER_BATCH: usize = 1000;
/// Summaries per Diff chunk. Each chunk is made as the stream sends it and
/// decoded whole by the peer, each summary as several allocations (id, node
/// name, fingerprint): 20,000 of them were a few MiB at once on each side,
/// 2,000 are a few hundred KiB, and a Diff answer of 100,000 is still only
/// 50 messages.
const SUMMARIES_PER_CHUNK: usize = 2000;

pub struct RpcHandler {
    pub node: String,
    /// Observe mode (said in Plan answers).
    pub observe: bool,
    pub core: CoreHandle,
    pub audit: Arc<AuditLog>,
    /// Peer contact times and their masters' health, for `status`.
    pub board: Arc<crate::ops::board::Board>,
}

fn core_gone(_: crate::node::CoreGone) -> Status {
    Status::unavailable("agent is shutting down")
}

#[tonic::async_trait]
impl Handler for RpcHandler {
    async fn hello(&self, peer: &PeerName, req: v1::HelloRequest) -> Result<v1::HelloResponse, Status> {
        self.board.contact(peer);
        self.board.peer_health(peer, health_from_wire(req.health));
        self.board.peer_holds(peer, held_from_wire(req.held));
        let hlc = self.core.ask(|reply| Request::Clock { reply }).await.map_err(core_gone)?;
        self.board.peer_clock(peer, crate::net::wire::clock_from_wire(req.clock), hlc);
        // Before the peer's Diff or pushes, which come after its Hello: a
        // stale node answers them with nothing.
        let (name, forgot_ms) = (peer.clone(), req.forgot_through_ms);
        self.core.tell(Request::PeerForgot { peer: name.clone(), forgot_ms }).await.map_err(core_gone)?;
        let n_decisions = self.core.ask(|reply| Request::Count { reply }).await.map_err(core_gone)?;
        let forgot_through_ms =
            self.core.ask(|reply| Request::ForgotThrough { peer: name, reply }).await.map_err(core_gone)?;
        let joining = self.core.ask(|reply| Request::Joining { reply }).await.map_err(core_gone)?;
        Ok(v1::HelloResponse {
            node: self.node.clone(),
            protocol_version: PROTOCOL_VERSION,
            n_decisions: n_decisions as u64,
            health: Some(health_to_wire(&self.board.hello_health(&self.core).await)),
            forgot_through_ms,
            held: held_to_wire(&crate::ops::held::held_counts(&self.core).await.map_err(core_gone)?),
            clock: Some(crate::net::wire::clock_to_wire(&self.board.clock_reading(hlc))),
            joining,
            push_streams: keysync_server::PUSH_STREAMS_PER_PEER as u32,
        })
    }

    async fn push(&self, peer: &PeerName, batch: v1::DecisionBatch) -> Result<v1::PushAck, Status> {
        self.board.contact(peer);
        let n_received = batch.decisions.len() as u32;
        let mut decisions = Vec::with_capacity(batch.decisions.len());
        for msg in batch.decisions {
            match decision_from_wire(msg) {
                Ok(decision) => decisions.push(decision),
                Err(e) => audit_refused(&self.audit, self.board.metrics(), peer, &e),
            }
        }
        let from = peer.clone();
        let n_applied = self.core.ask(|reply| Request::Remote { from, decisions, reply }).await.map_err(core_gone)?;
        Ok(v1::PushAck { n_received, n_applied })
    }

    async fn diff(&self, peer: &PeerName, req: v1::DiffRequest) -> Result<Items<v1::DiffChunk>, Status> {
        self.board.contact(peer);
        if req.n_buckets as usize != N_BUCKETS || req.digests.len() != N_BUCKETS {
            return Err(Status::invalid_argument(format!(
                "expected {N_BUCKETS} bucket digests, got n_buckets={} with {} digests",
                req.n_buckets,
                req.digests.len()
            )));
        }
        let Some(empty) = crate::net::wire::buckets::from_bitmap(&req.empty) else {
            return Err(Status::invalid_argument(format!(
                "expected {} bytes of empty buckets, got {}",
                N_BUCKETS / 8,
                req.empty.len()
            )));
        };
        let theirs = req.digests;
        let answer = self.core.ask(|reply| Request::Diff { theirs, empty, reply }).await.map_err(core_gone)?;
        let keysync_machine::node::DiffAnswer { buckets, summaries, whole, first: first_bucket } = answer;
        if !whole.is_empty() {
            // The peer fetches those buckets from this node (a joining
            // master): this node's own round leaves them to it.
            self.board.peer_fetched(peer);
        }
        // Made one chunk at a time as the stream sends them; the first (there
        // is always one) names the buckets, and those sent whole, and brings
        // one of those.
        let mut first = Some((buckets, whole, first_bucket));
        let mut summaries = summaries.into_iter().peekable();
        Ok(Box::new(std::iter::from_fn(move || {
            if first.is_none() && summaries.peek().is_none() {
                return None;
            }
            let entries =
                summaries.by_ref().take(SUMMARIES_PER_CHUNK).map(|(id, s)| summary_to_wire(&id, &s)).collect();
            let (buckets, whole, first_bucket) = first.take().unwrap_or_default();
            let bitmap = crate::net::wire::buckets::to_bitmap(whole.iter().map(|&(b, _)| b));
            let whole_counts = whole.iter().map(|&(_, n)| n).collect();
            let (first_bucket, first_decisions) = match first_bucket {
                Some(((bucket, _), decisions)) => (Some(bucket), decisions.iter().map(decision_to_wire).collect()),
                None => (None, Vec::new()),
            };
            Some(v1::DiffChunk { buckets, entries, whole: bitmap, whole_counts, first_bucket, first_decisions })
        })))
    }

    async fn fetch(&self, peer: &PeerName, req: v1::FetchRequest) -> Result<Items<v1::DecisionBatch>, Status> {
        self.board.contact(peer);
        if req.minions.len() > MAX_FETCH_IDS {
            return Err(Status::invalid_argument(format!(
                "fetch of {} ids, more than {MAX_FETCH_IDS}",
                req.minions.len()
            )));
        }
        self.board.peer_fetched(peer);
        let delay = crate::fault::fetch_delay();
        if !delay.is_zero() {
            tracing::warn!(?delay, "test-only fault injection: holding a fetch's answer");
            tokio::time::sleep(delay).await;
        }
        let mut ids = Vec::with_capacity(req.minions.len());
        for raw in &req.minions {
            match MinionId::parse(raw) {
                Ok(id) => ids.push(id),
                Err(e) => {
                    self.audit.record(Record {
                        reason: Some(format!("fetch: {e}")),
                        ..Record::new(Action::Refuse, Via::Peer(peer), Outcome::Refused)
                    });
                }
            }
        }
        let decisions = if req.buckets.is_empty() {
            self.core.ask(|reply| Request::Fetch { ids, reply }).await.map_err(core_gone)?
        } else {
            let buckets = whole_buckets(&req.buckets)?;
            self.core.ask(|reply| Request::FetchWhole { ids, buckets, reply }).await.map_err(core_gone)?.ok_or_else(
                || {
                    Status::invalid_argument(format!(
                        "fetch of {} whole buckets holding more than {MAX_FETCH_IDS} ids: ask for fewer at once",
                        req.buckets.len()
                    ))
                },
            )?
        };
        // Made one batch at a time as the stream sends them (the keys are
        // copied into each message).
        let mut decisions = decisions.into_iter().peekable();
        Ok(Box::new(std::iter::from_fn(move || {
            decisions.peek()?;
            let batch = decisions.by_ref().take(DECISIONS_PER_BATCH).map(|d| decision_to_wire(&d)).collect();
            Some(v1::DecisionBatch { decisions: batch })
        })))
    }

    async fn plan(&self, peer: &PeerName, req: v1::PlanRequest) -> Result<v1::PlanResponse, Status> {
        self.board.contact(peer);
        let max = crate::ops::site_plan::MAX_PLAN_IDS;
        if req.minions.len() > max {
            return Err(Status::invalid_argument(format!("plan of {} ids, more than {max}", req.minions.len())));
        }
        crate::ops::site_plan::answer(&self.node, self.observe, &self.core, req.minions).await.map_err(core_gone)
    }
}

/// The buckets a Fetch asks for whole, checked: each one of the id space's,
/// none twice.
fn whole_buckets(buckets: &[u32]) -> Result<Vec<u32>, Status> {
    use crate::core::digest::{check_buckets, BadBuckets};
    check_buckets(buckets.iter().copied()).map_err(|bad| match bad {
        BadBuckets::NoSuchBucket(b) => Status::invalid_argument(format!("fetch of bucket {b}, of {N_BUCKETS}")),
        BadBuckets::Twice(b) => Status::invalid_argument(format!("fetch of bucket {b} twice")),
    })?;
    Ok(buckets.to_vec())
}

/// Audits a decision from `peer` that failed validation.
pub fn audit_refused(
    audit: &AuditLog,
    metrics: &crate::ops::metrics::Metrics,
    peer: &PeerName,
    error: &crate::net::wire::WireError,
) {
    metrics.count_refused(peer, crate::ops::refused::Cause::Other, 1);
    tracing::warn!(peer = peer.as_str(), error = %error, "refused decision from peer");
    audit.record(Record {
        minion: error.minion().map(|m| m.escape_debug().to_string()),
        reason: Some(error.to_string()),
        ..Record::new(Action::Refuse, Via::Peer(peer), Outcome::Refused)
    });
}

/// Audits what the transport reports: refused handshakes with the identity
/// they presented, refused requests, and peers connecting.
pub fn audit_transport(audit: Arc<AuditLog>) -> keysync_server::EventFn {
    Arc::new(move |event| {
        let record = match event {
            TransportEvent::HandshakeRefused { remote, presented, reason } => Record {
                peer: presented_names(&presented),
                remote: Some(remote.to_string()),
                reason: Some(format!("TLS handshake refused: {reason}")),
                ..Record::new(Action::Refuse, Via::Network, Outcome::Refused)
            },
            TransportEvent::UnknownPeer { remote, presented } => Record {
                peer: presented_names(&presented),
                remote: Some(remote.to_string()),
                reason: Some("certificate is valid but names no configured peer".into()),
                ..Record::new(Action::Refuse, Via::Network, Outcome::Refused)
            },
            TransportEvent::RequestRefused { peer, reason } => {
                Record { peer: Some(peer.to_string()), reason: Some(reason), ..Record::new(Action::Refuse, Via::Peer(&peer), Outcome::Refused) }
            }
            TransportEvent::RefusedAgain { source, presented, count, window, last_reason } => Record {
                peer: presented_names(&presented),
                remote: Some(source.to_string()),
                reason: Some(format!(
                    "{count} more connections refused from {source} in {}s (told once a minute per address; last: {last_reason})",
                    window.as_secs()
                )),
                ..Record::new(Action::Refuse, Via::Network, Outcome::Refused)
            },
            TransportEvent::Connected { remote, peer } => Record {
                peer: Some(peer.to_string()),
                remote: Some(remote.to_string()),
                ..Record::new(Action::Connect, Via::Peer(&peer), Outcome::Accepted)
            },
        };
        audit.record(record);
    })
}

/// The addresses `peers` connect from, as their configured addresses
/// resolve now: their handshakes keep a share strangers cannot use.
pub async fn peer_sources(peers: &[crate::config::Peer]) -> Vec<std::net::IpAddr> {
    let mut sources = Vec::new();
    for peer in peers {
        match tokio::time::timeout(std::time::Duration::from_secs(5), tokio::net::lookup_host(peer.address.as_str()))
            .await
        {
            Ok(Ok(addresses)) => sources.extend(addresses.map(|a| a.ip())),
            Ok(Err(e)) => {
                tracing::warn!(peer = %peer.name, address = %peer.address, error = %e, "cannot resolve a peer's address")
            }
            Err(_) => {
                tracing::warn!(peer = %peer.name, address = %peer.address, "resolving a peer's address took over 5 s")
            }
        }
    }
    sources.sort();
    sources.dedup();
    sources
}

fn presented_names(names: &[String]) -> Option<String> {
    if names.is_empty() {
        Some("(no certificate)".into())
    } else {
        Some(names.join(","))
    }
}
