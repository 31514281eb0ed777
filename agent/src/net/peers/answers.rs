//! What a peer's answers bring, checked as they come: a Fetch's decisions
//! (and their keys written ahead), the Diff answer chunk by chunk and the
//! bucket it brings with it (see `peers.rs`), and the deadlines a Diff or
//! Fetch answer keeps.

use std::sync::Arc;
use std::time::Duration;

use keysync_machine::link::Input;
use keysync_machine::node::{Fetch, Whole, FIRST_BUCKET_MOST};
use keysync_proto::v1::{self, key_sync_client::KeySyncClient};
use prost::Message;
use tonic::transport::Channel;

use super::{during, Link, PeerLink, SessionError, SessionIo};
use crate::core::digest::{bucket_of, N_BUCKETS};
use crate::core::{Decision, MinionId};
use crate::disk::pki::prestage::Prestaged;
use crate::net::wire::decision_from_wire;

/// How long a peer may take over its whole answer to a round's Diff or
/// Fetch, from the call to its last message. HTTP/2 keep-alives show only
/// that the connection lives: a peer could take a Fetch and never answer
/// it, or answer it a message a minute, and the link would hold the ids it
/// claimed (which the other links leave to it) meanwhile. Generous: the
/// answer's opening waits for the peer's core, which a rescan of a million
/// keys keeps busy for up to a minute, and an honest peer cuts off an
/// answer not read whole two minutes after its opening. (A Hello has no
/// deadline: see `PeerLink::hello`.)
const ANSWER_DEADLINE: Duration = Duration::from_secs(300);
/// How long, once the answer began, the peer may take to its next message:
/// an honest peer's (at most 2,000 summaries or 1,000 decisions) comes as
/// fast as the network carries it.
const ANSWER_IDLE: Duration = Duration::from_secs(60);

/// The deadlines of a peer's answer to one of a round's calls (see
/// [`ANSWER_DEADLINE`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Answering {
    call: &'static str,
    whole: tokio::time::Instant,
    limit: Duration,
}

impl Answering {
    /// From now: the call goes out.
    pub(super) fn start(call: &'static str) -> Answering {
        let limit = crate::fault::answer_deadline().unwrap_or(ANSWER_DEADLINE);
        Answering { call, whole: tokio::time::Instant::now() + limit, limit }
    }

    /// The answer's opening, within the whole answer's deadline.
    pub(super) async fn opening<T, E: Into<SessionError>>(
        &self,
        opening: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, SessionError> {
        match tokio::time::timeout_at(self.whole, opening).await {
            Ok(answer) => answer.map_err(Into::into),
            Err(_) => Err(self.timed_out(format!("not begun within {} s", self.limit.as_secs()))),
        }
    }

    /// Its next message, within [`ANSWER_IDLE`] and the whole answer's deadline.
    pub(super) async fn message<T, E: Into<SessionError>>(
        &self,
        message: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, SessionError> {
        let idle = tokio::time::Instant::now() + ANSWER_IDLE;
        match tokio::time::timeout_at(idle.min(self.whole), message).await {
            Ok(answer) => answer.map_err(Into::into),
            Err(_) if idle < self.whole => Err(self.timed_out(format!("nothing more for {} s", ANSWER_IDLE.as_secs()))),
            Err(_) => Err(self.timed_out(format!("not whole within {} s", self.limit.as_secs()))),
        }
    }

    fn timed_out(&self, what: String) -> SessionError {
        SessionError::TimedOut { call: self.call, what }
    }
}

impl PeerLink {
    /// Fetches the decisions for `fetch`'s ids and whole buckets; returns
    /// them with the bytes sent and received. Invalid ones are audited and
    /// left out.
    pub(super) async fn fetch(
        &self,
        client: &mut KeySyncClient<Channel>,
        fetch: &Fetch,
    ) -> Result<(Vec<Decision>, usize, usize), SessionError> {
        let ids = &fetch.ids;
        let minions = ids.iter().map(ToString::to_string).collect();
        let request = v1::FetchRequest { minions, buckets: fetch.buckets.clone() };
        let sent = request.encoded_len();
        let mut received = 0;
        let answering = Answering::start("Fetch");
        let mut stream = answering.opening(client.fetch(request)).await?.into_inner();
        let mut decisions: Vec<Decision> = Vec::with_capacity(ids.len() + fetch.n_in_buckets);
        // Read as it comes, and refused as soon as it gives more than was
        // asked: an id neither asked for nor in a bucket asked for, or more
        // rows than the ids can have.
        let asked: std::collections::HashSet<&MinionId> = ids.iter().collect();
        let mut in_buckets = [false; N_BUCKETS];
        for &bucket in &fetch.buckets {
            if let Some(slot) = in_buckets.get_mut(bucket as usize) {
                *slot = true;
            }
        }
        let asked_for = |id: &MinionId| asked.contains(id) || in_buckets[bucket_of(id)];
        let most = fetch.most_rows();
        let mut n_rows = 0;
        while let Some(batch) = answering.message(stream.message()).await? {
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
                    Ok(decision) if !asked_for(&decision.id) => {
                        return Err(SessionError::BadFetch(format!("a decision for {:?}, not asked for", decision.id)));
                    }
                    Ok(decision) => decisions.push(decision),
                    Err(e) => crate::net::rpc::audit_refused(&self.audit, self.board.metrics(), &self.peer.name, &e),
                }
            }
        }
        Ok((decisions, sent, received))
    }

    /// [`PeerLink::fetch`], its keys then written ahead
    /// (`disk/pki/prestage.rs`): asked while the node applies the chunk
    /// before.
    pub(super) async fn fetch_writing_ahead(
        &self,
        client: &mut KeySyncClient<Channel>,
        fetch: &Fetch,
    ) -> (Result<(Vec<Decision>, usize, usize), SessionError>, Option<Prestaged>) {
        let fetched = self.fetch(client, fetch).await;
        let staged = match &fetched {
            Ok((decisions, ..)) => self.core.prestage(decisions).await,
            Err(_) => None,
        };
        (fetched, staged)
    }

    /// The next chunk of the peer's Diff answer, for the link. Read as it
    /// comes: a peer's answer, however large, is never held whole.
    pub(super) async fn read_diff(
        &self,
        link: &mut Link,
        io: &mut SessionIo,
    ) -> Result<Input<Arc<crate::node::Outgoing>>, SessionError> {
        let Some((stream, answering)) = io.diff.as_mut() else {
            return Ok(Input::DiffEnd);
        };
        let Some(chunk) = during(answering.message(stream.message()), link, &mut io.push).await?? else {
            io.diff = None;
            return Ok(Input::DiffEnd);
        };
        io.run.bytes_received += chunk.encoded_len();
        let Some(whole) = crate::net::wire::buckets::whole_from_wire(&chunk.whole, &chunk.whole_counts) else {
            return Err(SessionError::BadDiff(format!(
                "{} bytes of whole buckets with {} sizes",
                chunk.whole.len(),
                chunk.whole_counts.len()
            )));
        };
        let first = self.first_bucket(chunk.first_bucket, chunk.first_decisions, &whole)?;
        if let Some((fetch, decisions)) = &first {
            tracing::debug!(
                bucket = fetch.buckets[0],
                n_decisions = decisions.len(),
                "the Diff answer brought a bucket"
            );
        }
        // A malformed summary only means that id is not fetched.
        let summaries = chunk.entries.into_iter().filter_map(crate::net::wire::summary_from_wire).collect();
        Ok(Input::DiffChunk { buckets: chunk.buckets, summaries, whole, first })
    }

    /// The bucket a Diff answer brings, as the answer to a fetch of it: one
    /// of the buckets it sends whole, and no decision outside it nor more
    /// than such a fetch may bring (a malformed decision is audited and
    /// left out, as in a fetch's answer).
    pub(super) fn first_bucket(
        &self,
        bucket: Option<u32>,
        wire: Vec<v1::Decision>,
        whole: &[Whole],
    ) -> Result<Option<(Fetch, Vec<Decision>)>, SessionError> {
        let Some(fetch) = brought(bucket, wire.len(), whole).map_err(SessionError::BadDiff)? else {
            return Ok(None);
        };
        let bucket = fetch.buckets[0];
        let mut decisions = Vec::with_capacity(wire.len());
        for msg in wire {
            match decision_from_wire(msg) {
                Ok(decision) if bucket_of(&decision.id) != bucket as usize => {
                    return Err(SessionError::BadDiff(format!("{:?} brought as in bucket {bucket}", decision.id)));
                }
                Ok(decision) => decisions.push(decision),
                Err(e) => crate::net::rpc::audit_refused(&self.audit, self.board.metrics(), &self.peer.name, &e),
            }
        }
        Ok(Some((fetch, decisions)))
    }
}

/// The fetch a Diff answer bringing `n_decisions` of `bucket` answers, if
/// it is one: the bucket must be one of those it sends `whole`, and the
/// decisions no more than a fetch of it may bring; decisions of no bucket
/// are refused. A bucket larger than [`FIRST_BUCKET_MOST`] is left to a
/// fetch, unread (a later release may bring larger ones).
pub(super) fn brought(bucket: Option<u32>, n_decisions: usize, whole: &[Whole]) -> Result<Option<Fetch>, String> {
    let Some(bucket) = bucket else {
        return match n_decisions {
            0 => Ok(None),
            n => Err(format!("{n} decisions of no bucket")),
        };
    };
    let Some(&(_, n)) = whole.iter().find(|&&(b, _)| b == bucket) else {
        return Err(format!("bucket {bucket} brought, not one sent whole"));
    };
    if n > FIRST_BUCKET_MOST {
        return Ok(None);
    }
    let fetch = Fetch { buckets: vec![bucket], n_in_buckets: n as usize, ..Fetch::default() };
    if n_decisions > fetch.most_rows() {
        return Err(format!("{n_decisions} decisions in bucket {bucket} of {n}"));
    }
    Ok(Some(fetch))
}
